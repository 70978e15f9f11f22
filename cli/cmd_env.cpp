// opforge env: the agent's working folders (agent/env.h).
#include <iostream>

#include "commands.h"
#include "env.h"
#include "opforge/core/error.h"
#include "opforge/core/paths.h"

namespace opforge::cli {

namespace {

void add_env_export(CLI::App* env, Runner& run) {
  auto* cmd = env->add_subcommand(
      "export",
      "One working folder per task in CUDA Agent's layout: model.py (the task), SKILL.md (workflow, reward, policy), a "
      "starting model_new.py, binding.cpp and binding_registry.h, kernels/, and utils/ (compile.sh, verification.py, "
      "profiling.py, which ask opforge serve at $OPFORGE_SERVE_URL). Protected files are read-only, with copies in "
      "OUT/.protected/ for `opforge env check`. Prints OUT/manifest.json.");
  auto o = std::make_shared<agent::EnvExportOptions>();
  cmd->add_option("--tasks", o->tasks, "Shards, a workspace or a folder of .py tasks (as eval)")->required();
  cmd->add_option("-o,--out", o->out, "Folder to write the working folders into")->required();
  cmd->callback([&run, o] {
    run = [o] {
      o->data_dir = data_dir();
      auto r = agent::export_envs(*o);
      std::cerr << "env export: " << r.tasks << " working folder(s) in " << o->out.string() << "\n";
      std::cout << r.manifest.string() << "\n";
      return 0;
    };
  });
}

void add_env_check(CLI::App* env, Runner& run) {
  auto* cmd = env->add_subcommand(
      "check", "Whether the protected files of exported working folders are as export wrote them: prints each changed "
               "file as TASK/PATH; exit status 1 when any changed.");
  auto out = std::make_shared<std::string>();
  auto tasks = std::make_shared<std::vector<std::string>>();
  cmd->add_option("-o,--out", *out, "The folder env export wrote")->required();
  cmd->add_option("tasks", *tasks, "Working folders to check (default: all of the manifest)");
  cmd->callback([&run, out, tasks] {
    run = [out, tasks] {
      auto names = *tasks;
      if (names.empty()) names = agent::exported_folders(*out);
      int changed = 0;
      for (auto& t : names)
        for (auto& rel : agent::changed_protected(*out, t)) {
          std::cout << t << "/" << rel << "\n";
          ++changed;
        }
      std::cerr << "env check: " << names.size() << " folder(s), " << changed << " protected file(s) changed\n";
      return changed ? 1 : 0;
    };
  });
}

}  // namespace

void add_env(CLI::App& app, Runner& run) {
  auto* env = app.add_subcommand("env", "The agent's environment: working folders per task (export) and their check");
  env->require_subcommand(1);
  add_env_export(env, run);
  add_env_check(env, run);
}

}  // namespace opforge::cli
