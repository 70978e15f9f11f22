#include <unistd.h>

#include "commands.h"
#include "opforge/core/python_runtime.h"
#include "sandbox.h"

namespace opforge::cli {

void add_worker(CLI::App& app, Runner& run) {
  auto* cmd = app.add_subcommand("worker",
                                 "Internal: a worker process of the pool. Embeds Python, imports torch, answers "
                                 "JSON-line requests from stdin on --protocol-fd. Started by other subcommands.");
  auto fd = std::make_shared<int>(1);
  cmd->add_option("--protocol-fd", *fd, "File descriptor replies are written to")->capture_default_str();
  cmd->callback([&run, fd] {
    run = [fd] {
      // Evaluator workers ask for no network and a read-only harness; entered while this process
      // is still single-threaded (before the interpreter starts).
      evaluator::enter_sandbox_from_env();
      return serve_worker(*fd);
    };
  });
}

}  // namespace opforge::cli
