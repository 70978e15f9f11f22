// The opforge binary: subcommand wiring only; the work lives in the stage libraries.
#include <spdlog/spdlog.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include <iostream>

#include "commands.h"
#include "opforge/core/error.h"
#include "opforge/core/log.h"
#include "opforge/core/paths.h"
#include "opforge/core/worker_pool.h"

namespace opforge::cli {

void add_workspace_option(CLI::App& cmd, std::string& workspace) {
  cmd.add_option("-w,--workspace", workspace, "Workspace folder (holds opforge.db and logs/); created if missing")
      ->capture_default_str();
}

int default_workers() {
  unsigned n = usable_cpus();
  return static_cast<int>(std::max(1u, std::min(n, 8u)));
}

std::size_t default_memory_limit_mb(int workers) {
  struct sysinfo si {};
  if (sysinfo(&si) != 0) return 8192;
  std::size_t total_mb = static_cast<std::size_t>(si.totalram) * si.mem_unit / (1024 * 1024);
  return std::max<std::size_t>(1024, total_mb * 6 / 10 / static_cast<std::size_t>(std::max(1, workers)));
}

}  // namespace opforge::cli

int main(int argc, char** argv) {
  CLI::App app{"opforge: builds GPU-kernel training tasks (crawl → compose → filter → dedup → export)"};
  app.set_version_flag("--version", std::string(opforge::version()));
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace, debug, info, warn or error (logs go to stderr)")
      ->capture_default_str();
  app.require_subcommand(1);
  opforge::cli::Runner run;
  opforge::cli::add_crawl(app, run);
  opforge::cli::add_compose(app, run);
  opforge::cli::add_import(app, run);
  opforge::cli::add_filter(app, run);
  opforge::cli::add_tasks(app, run);
  opforge::cli::add_dedup(app, run);
  opforge::cli::add_export(app, run);
  opforge::cli::add_run(app, run);
  opforge::cli::add_slurm(app, run);
  opforge::cli::add_ray(app, run);
  opforge::cli::add_status(app, run);
  opforge::cli::add_merge(app, run);
  opforge::cli::add_eval(app, run);
  opforge::cli::add_serve(app, run);
  opforge::cli::add_env(app, run);
  opforge::cli::add_agent(app, run);
  opforge::cli::add_realism(app, run);
  opforge::cli::add_model_stats(app, run);
  opforge::cli::add_trainer(app, run);
  opforge::cli::add_worker(app, run);
  opforge::cli::add_sandbox_exec(app, run);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    opforge::init_logging(log_level);
    return run ? run() : 0;
  } catch (const std::exception& e) {
    std::cerr << "opforge: error: " << opforge::describe(e) << "\n";
    return 1;
  }
}
