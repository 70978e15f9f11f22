#include "commands.h"
#include "opforge/core/python_runtime.h"

namespace opforge::cli {

void add_worker(CLI::App& app, Runner& run) {
  auto* cmd = app.add_subcommand("worker",
                                 "Internal: a worker process of the pool. Embeds Python, imports torch, answers "
                                 "JSON-line requests from stdin on --protocol-fd. Started by other subcommands.");
  auto fd = std::make_shared<int>(1);
  auto candidate = std::make_shared<bool>(false);
  cmd->add_option("--protocol-fd", *fd, "File descriptor replies are written to (with --candidate: the socket "
                                        "shared with the judge)")->capture_default_str();
  cmd->add_flag("--candidate", *candidate,
                "Run as the judge's single-use solution child (python/opforge/candidate.py), started by "
                "`opforge eval` inside its sandbox");
  cmd->callback([&run, fd, candidate] {
    run = [fd, candidate] { return *candidate ? serve_candidate(*fd) : serve_worker(*fd); };
  });
}

}  // namespace opforge::cli
