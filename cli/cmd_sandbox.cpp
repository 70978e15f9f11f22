#include <sys/prctl.h>

#include <signal.h>

#include <cstdio>
#include <iostream>

#include "commands.h"
#include "opforge/core/error.h"
#include "opforge/core/files.h"
#include "opforge/core/sandbox.h"

namespace opforge::cli {

namespace {

struct SandboxExecOpts {
  std::string spec, spec_file;
  bool probe = false, gpu = false;
  std::vector<std::string> command;
};

SandboxSpec load_spec(const SandboxExecOpts& o) {
  std::string text = o.spec;
  std::string from = "--spec";
  if (!o.spec_file.empty()) {
    text = read_text(o.spec_file);
    from = o.spec_file;
  }
  if (text.empty()) return {};
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(fmt::format("sandbox spec ({}): not valid JSON: {}", from, e.what()));
  }
  return j.get<SandboxSpec>();
}

// Exit codes: the command's own; 137 when it ran out of memory (or was killed); 125 when the
// sandbox could not be set up (bad spec, no bwrap), so the judge can tell its own failures apart.
int sandbox_exec(const SandboxExecOpts& o) {
  if (o.probe) {
    auto r = probe_sandbox(o.gpu);
    std::cout << r.dump() << std::endl;
    return r["ok"].get<bool>() ? 0 : 1;
  }
  try {
    // A judge that dies (even SIGKILLed) still gets its sandbox killed and its cgroup removed.
    // PDEATHSIG follows the parent *thread* that spawned us: the judge must spawn from one that lives.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    SandboxSpec spec = load_spec(o);
    OPFORGE_CHECK(!o.command.empty(), "sandbox-exec: no command; usage: opforge sandbox-exec --spec JSON -- COMMAND...");
    SandboxRun run = run_sandbox(spec, o.command);
    for (auto& note : run.notes) std::fprintf(stderr, "[sandbox] %s\n", note.c_str());
    return run.exit_code;
  } catch (const std::exception& e) {
    std::cerr << "opforge: error: " << describe(e) << "\n";
    return 125;
  }
}

}  // namespace

void add_sandbox_exec(CLI::App& app, Runner& run) {
  auto* cmd = app.add_subcommand(
      "sandbox-exec",
      "Internal: runs COMMAND in a fresh bubblewrap sandbox (read-only system root, no network, own pid/ipc/uts/user "
      "namespaces, uid nobody, no capabilities, only the spec's paths and environment) with the spec's memory and "
      "process limits in a cgroup of its own. Exits with COMMAND's status: 137 and an '[sandbox] out_of_memory' line "
      "on stderr when it ran out of memory, 125 when the sandbox could not be set up. SIGTERM/SIGINT kill the whole "
      "sandbox. Spec format: core/include/opforge/core/sandbox.h. Started by the judge.");
  auto o = std::make_shared<SandboxExecOpts>();
  auto* spec = cmd->add_option("--spec", o->spec, "The sandbox spec, a JSON object (default: {})");
  cmd->add_option("--spec-file", o->spec_file, "Read the spec from this JSON file instead")->excludes(spec);
  auto* probe = cmd->add_flag("--probe",
                              o->probe,
                              "Run `true` in the default profile and print {\"ok\", \"bwrap\", \"version\", \"profile\", "
                              "\"limits\", \"why\"} as JSON on stdout; exit 0 when ok");
  cmd->add_flag("--gpu", o->gpu, "With --probe: the profile with the NVIDIA devices")->needs(probe);
  cmd->add_option("command", o->command, "The command and its arguments, after --");
  cmd->callback([&run, o] { run = [o] { return sandbox_exec(*o); }; });
}

}  // namespace opforge::cli
