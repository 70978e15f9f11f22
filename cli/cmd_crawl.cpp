#include <spdlog/spdlog.h>

#include <iostream>
#include <sstream>

#include "commands.h"
#include "crawler.h"
#include "opforge/core/error.h"
#include "opforge/core/store.h"

namespace opforge::cli {

void add_crawl(CLI::App& app, Runner& run) {
  auto* cmd = app.add_subcommand(
      "crawl",
      "Enumerate operators of torch and transformers, write a KernelBench-format seed task for each and probe it "
      "in a worker. Resumable and idempotent: run it again to finish a killed crawl; a complete one adds nothing.");
  struct Opts {
    std::string workspace = "workspace";
    std::string sources = "torch,transformers";
    crawler::CrawlOptions c;
    std::vector<std::string> add;
  };
  auto o = std::make_shared<Opts>();
  o->c.workers = default_workers();
  add_workspace_option(*cmd, o->workspace);
  cmd->add_option("--sources", o->sources, "Comma-separated seed sources to crawl: torch, transformers, a registered source (data/sources/NAME.json "
                  "or an 'opforge.sources' entry point; docs/sources.md), or none")
      ->capture_default_str();
  cmd->add_option("--add", o->add, "Extra seed files or folders of KernelBench-format .py files (source 'local')");
  cmd->add_option("--match", o->c.match, "Only operators whose name matches this regex (e.g. 'nn\\.Conv')");
  cmd->add_option("--limit", o->c.limit, "Only the first N enumerated operators (0: all)")->capture_default_str();
  cmd->add_option("--device", o->c.device, "Where probes run: cpu, cuda or auto")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}))
      ->capture_default_str();
  cmd->add_option("-j,--workers", o->c.workers, "Worker processes")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--timeout-s", o->c.timeout_s, "Per-seed probe time limit in seconds; a seed past it is killed")
      ->capture_default_str();
  cmd->add_option("--memory-limit-mb", o->c.memory_limit_mb,
                  "Resident memory limit per worker in MiB (default: 60% of RAM shared by the workers)");
  cmd->add_flag("--retry-failed", o->c.retry_failed, "Probe again the seeds whose probe failed before");
  cmd->callback([&run, o] {
    run = [o] {
      auto& c = o->c;
      c.sources.clear();
      std::stringstream ss(o->sources);
      for (std::string s; std::getline(ss, s, ',');) {
        if (s.empty() || s == "none") continue;
        c.sources.push_back(s);
      }
      for (auto& a : o->add) c.files.emplace_back(a);
      if (c.memory_limit_mb == 0) c.memory_limit_mb = default_memory_limit_mb(c.workers);
      Workspace ws(o->workspace);
      auto s = crawler::crawl(ws, c);
      spdlog::info("crawl done in {:.1f}s: {} enumerated, {} new, {} probed ({} runnable, {} failed)", s.seconds,
                   s.enumerated, s.added, s.probed, s.runnable, s.failed);
      return 0;
    };
  });
}

}  // namespace opforge::cli
