#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <iostream>
#include <optional>

#include "commands.h"
#include "filter.h"
#include "opforge/core/error.h"
#include "opforge/core/files.h"
#include "opforge/core/hash.h"
#include "opforge/core/shard.h"
#include "opforge/core/store.h"
#include "opforge/core/worker_pool.h"

namespace opforge::cli {

void add_filter(CLI::App& app, Runner& run) {
  auto* cmd = app.add_subcommand(
      "filter",
      "Judge every candidate without a verdict: it must run in eager and under torch.compile and agree, be "
      "deterministic, depend on its input, not be constant or non-finite, and take min-ms..max-ms in eager "
      "(scalable sizes are calibrated into the window). Resumable: a killed run continues with the rest. Several "
      "filters may share a workspace (or split it with --shard): each leases the tasks it judges, so none is "
      "judged twice. Of twins (one normal form, numbers ignored) only the first is judged until one is accepted; "
      "the others are recorded exact_duplicate, as dedup would drop them.");
  struct Opts {
    std::string workspace = "workspace";
    filter::FilterOptions f;
    bool no_calibrate = false;
    std::string shard;
  };
  auto o = std::make_shared<Opts>();
  add_workspace_option(*cmd, o->workspace);
  cmd->add_option("--device", o->f.device, "auto, cpu or cuda (auto: cuda when a GPU is visible)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_option("-j,--workers", o->f.workers, "Worker processes (default: --workers-per-gpu per GPU, 2 on CPU)");
  cmd->add_option("--workers-per-gpu", o->f.workers_per_gpu, "Workers per GPU when --workers is not given")
      ->capture_default_str();
  cmd->add_option("--min-ms", o->f.min_ms, "Shortest accepted eager time")->capture_default_str();
  cmd->add_option("--max-ms", o->f.max_ms, "Longest accepted eager time")->capture_default_str();
  cmd->add_option("--timeout-s", o->f.timeout_s, "Per-task limit (compile included); a task past it is killed")
      ->capture_default_str();
  cmd->add_flag("--no-calibrate", o->no_calibrate, "Do not rescale too fast or too slow tasks into the window");
  cmd->add_option("--rtol", o->f.rtol, "Relative tolerance of compiled vs eager")->capture_default_str();
  cmd->add_option("--atol", o->f.atol, "Absolute tolerance of compiled vs eager")->capture_default_str();
  cmd->add_option("--trials", o->f.trials, "Timed runs per measurement (median)")->capture_default_str();
  cmd->add_option("--memory-limit-mb", o->f.memory_limit_mb, "Resident memory limit per worker (default: 60% of RAM "
                                                             "shared by the workers)");
  cmd->add_option("--limit", o->f.limit, "Judge at most N candidates this run (0: all)")->capture_default_str();
  cmd->add_option("--rejudge", o->f.rejudge,
                  "Judge stored rejections with these reasons again (docs/reasons.md; `all` for every rejection); the "
                  "verdicts they replace are kept in the row's history");
  cmd->add_flag("--rejudge-stale", o->f.rejudge_stale,
                "Judge again the verdicts made under another filter configuration (device, window, tolerances, trials, "
                "calibration, filter version)");
  cmd->add_option("--skip-check", o->f.skip_checks,
                  "Switch a check off for this run: finite, deterministic, non_constant, input_sensitive, "
                  "judge_distinguishable, time_window, "
                  "conditioning (float32 vs float64) or compile; repeatable. Recorded in the configuration, so `--rejudge-stale` applies the new set to "
                  "tasks already judged")
      ->check(CLI::IsMember(filter::kChecks));
  cmd->add_option("--check", o->f.extra_checks,
                  "Also run a check an installed package registers (entry point group opforge.checks; "
                  "docs/sources.md) after the built-in eager checks; repeatable, recorded in the configuration");
  cmd->add_option("--shard", o->shard,
                  "Judge only shard I of N (I/N, e.g. 0/4): the tasks whose id hashes to I modulo N, for array jobs on "
                  "one workspace; a finished shard leaves done/filter.shard-I-of-N.json");
  cmd->add_flag("--judge-twins", o->f.judge_twins,
                "Judge every twin too (tasks that differ only in numbers and names): by default a twin of an accepted "
                "task is recorded exact_duplicate without running");
  cmd->add_option("--lease-stale-s", o->f.lease_stale_s,
                  "A filter on another host sharing the workspace is taken for gone when its heartbeat is older than "
                  "this, and its tasks are judged by others (on this host a gone PID says so at once)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->callback([&run, o] {
    run = [o] {
      o->f.calibrate = !o->no_calibrate;
      if (!o->shard.empty()) o->f.shard = parse_shard(o->shard);
      if (o->f.memory_limit_mb == 0) o->f.memory_limit_mb = default_memory_limit_mb(std::max(2, o->f.workers));
      Workspace ws(o->workspace);
      auto s = filter::filter(ws, o->f);
      spdlog::info("filter done in {:.1f}s: {} judged, {} accepted, {} rejected, {} twins not run", s.seconds, s.judged,
                   s.accepted, s.rejected, s.twins);
      for (auto& [r, n] : s.reasons) spdlog::info("  rejected {:<20} {:>6}", r, n);
      return 0;
    };
  });
}

namespace {

// import --shard: the files of `paths` whose task id is in the shard. The id is the xxh3 of the
// normal form, which only the worker computes, so the files are normalised here once to choose
// and again by import_tasks to add (an ast pass each, cheap next to judging them).
std::vector<std::filesystem::path> files_in_shard(const std::vector<std::filesystem::path>& paths, Shard shard,
                                                  const std::filesystem::path& log_file) {
  std::vector<std::filesystem::path> files;
  for (auto& p : paths) {
    OPFORGE_CHECK(std::filesystem::exists(p), "{} does not exist (give KernelBench-format .py files or folders)",
                  p.string());
    auto under = std::filesystem::is_directory(p) ? python_files_under(p) : std::vector<std::filesystem::path>{p};
    files.insert(files.end(), under.begin(), under.end());
  }
  if (files.empty()) return files;
  nlohmann::json codes = nlohmann::json::array();
  for (auto& f : files) codes.push_back(read_text(f));
  WorkerPoolOptions popts;
  popts.workers = 1;
  popts.log_file = log_file;
  WorkerPool pool(popts);
  WorkerResult r = pool.call({{"op", "normalize"}, {"args", {{"codes", codes}}}});
  OPFORGE_CHECK(r.outcome == Outcome::ok && r.reply.value("ok", false), "normalising the files to import failed: {}",
                r.reason);
  std::vector<std::filesystem::path> kept;
  for (std::size_t i = 0; i < files.size(); ++i)
    if (in_shard(xxh3_hex(r.reply["result"][i].get<std::string>()), shard)) kept.push_back(files[i]);
  return kept;
}

}  // namespace

void add_import(CLI::App& app, Runner& run) {
  auto* cmd = app.add_subcommand("import", "Add KernelBench-format .py files (or folders of them) as candidates, with "
                                           "their path in provenance, so `opforge filter` judges them");
  auto workspace = std::make_shared<std::string>("workspace");
  auto paths = std::make_shared<std::vector<std::string>>();
  auto shard = std::make_shared<std::string>();
  add_workspace_option(*cmd, *workspace);
  cmd->add_option("paths", *paths, "Files or folders")->required();
  cmd->add_option("--shard", *shard,
         "I/N: import only the files whose task id hashes to I modulo N (core/shard.h), so N shards of an array "
         "job import one folder disjointly")
      ->type_name("I/N");
  cmd->callback([&run, workspace, paths, shard] {
    run = [workspace, paths, shard] {
      std::optional<Shard> sh;
      if (!shard->empty()) sh = parse_shard(*shard);
      Workspace ws(*workspace);
      std::vector<std::filesystem::path> ps(paths->begin(), paths->end());
      if (sh) {
        ps = files_in_shard(ps, *sh, ws.logs_dir() / "workers.log");
        spdlog::info("import --shard {}/{}: {} files of this shard", sh->index, sh->count, ps.size());
        if (ps.empty()) return 0;
      }
      auto s = filter::import_tasks(ws, ps);
      spdlog::info("imported {} candidates ({} already present)", s.added, s.duplicates);
      return 0;
    };
  });
}

void add_tasks(CLI::App& app, Runner& run) {
  auto* cmd = app.add_subcommand("tasks", "List candidates with id, origin, verdict, reason and key metrics");
  auto workspace = std::make_shared<std::string>("workspace");
  auto verdict = std::make_shared<std::string>();
  auto as_json = std::make_shared<bool>(false);
  add_workspace_option(*cmd, *workspace);
  cmd->add_option("--verdict", *verdict, "Only accepted, rejected or pending")
      ->check(CLI::IsMember({"accepted", "rejected", "pending"}));
  cmd->add_flag("--json", *as_json, "One JSON object per line");
  cmd->callback([&run, workspace, verdict, as_json] {
    run = [workspace, verdict, as_json] {
      Workspace ws(*workspace);
      auto rows = filter::list_tasks(ws.db(), *verdict);
      if (*as_json) {
        for (auto& r : rows) std::cout << r.dump() << "\n";
        return 0;
      }
      std::cout << fmt::format("{:<16} {:<9} {:<12} {:>4} {:<9} {:<20} {:>9} {:>9}\n", "id", "backend", "source", "ops",
                               "verdict", "reason", "eager_ms", "comp_ms");
      for (auto& r : rows) {
        auto num = [&](const char* k) {
          return r["metrics"].contains(k) && r["metrics"][k].is_number() ? fmt::format("{:.3f}", r["metrics"][k].get<double>())
                                                                          : std::string("-");
        };
        std::cout << fmt::format("{:<16} {:<9} {:<12} {:>4} {:<9} {:<20} {:>9} {:>9}\n", r["id"].get<std::string>(),
                                 r["backend"].get<std::string>(), r["source"].get<std::string>(), r["num_ops"].get<long>(),
                                 r["verdict"].get<std::string>(), r["reason"].is_null() ? "" : r["reason"].get<std::string>(),
                                 num("eager_ms"), num("compile_ms"));
      }
      return 0;
    };
  });
}

}  // namespace opforge::cli
