#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <iostream>

#include "commands.h"
#include "evaluator.h"
#include "opforge/core/worker_pool.h"
#include "realism.h"

namespace opforge::cli {

namespace {

std::string pct(const nlohmann::json& v) { return v.is_null() ? "-" : fmt::format("{:.1f}%", v.get<double>()); }

void print_figures(const std::vector<std::pair<std::string, nlohmann::json>>& rows) {
  std::cout << fmt::format("{:<40} {:>7} {:>9} {:>9} {:>8} {:>8} {:>8} {:>7}\n", "tasks", "count", "untraced",
                           "multi-op", "heavy", "vocab", "pairs", "ops");
  for (const auto& [name, f] : rows)
    std::cout << fmt::format("{:<40} {:>7} {:>9} {:>9} {:>8} {:>8} {:>8} {:>7}\n", name, f["tasks"].get<long>(),
                             f["untraced"].get<long>(), f["multi_op"].get<long>(), pct(f["heavy_share"]),
                             pct(f["vocab_share"]), pct(f["pair_share"]),
                             f["median_ops"].is_null() ? "-" : f["median_ops"].dump());
  std::cout << "\nheavy: multi-op tasks with a GEMM, convolution or attention; vocab: op occurrences real models use;\n"
               "pairs: adjacent op pairs real models contain; ops: median ops per task (docs/realism.md)\n";
}

}  // namespace

void add_realism(CLI::App& app, Runner& run) {
  auto* cmd = app.add_subcommand(
      "realism",
      "How much tasks look like the compute of real models: per source, the share of multi-op tasks with a GEMM, "
      "convolution or attention, of op occurrences real models use and of adjacent op pairs real models contain, "
      "traced on the meta device against data/real_models/stats.json. Several --tasks print side by side.");
  struct Opts {
    std::vector<std::string> tasks;
    std::string stats;
    int workers = 2;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("--tasks", o->tasks,
                  "Tasks to measure: shards or their folder, a workspace, a folder of .py files (e.g. a KernelBench "
                  "checkout's KernelBench/level2) or one .py file; repeatable")
      ->required();
  cmd->add_option("--stats", o->stats, "Real-model table to measure against (default data/real_models/stats.json)");
  cmd->add_option("--workers", o->workers, "Tracing workers")->check(CLI::Range(1, 256))->capture_default_str();
  cmd->add_flag("--json", o->json, "One JSON object on stdout (source -> figures) instead of the table");
  cmd->callback([&run, o] {
    run = [o] {
      WorkerPoolOptions popts;
      popts.workers = o->workers;
      WorkerPool pool(popts);
      std::filesystem::path stats = o->stats.empty() ? realism::default_stats() : std::filesystem::path(o->stats);
      std::vector<std::pair<std::string, nlohmann::json>> rows;
      nlohmann::json all = nlohmann::json::object();
      for (const auto& src : o->tasks) {
        std::vector<std::string> codes;
        for (auto& t : evaluator::load_tasks(src)) codes.push_back(std::move(t.code));
        rows.emplace_back(src, realism::measure(pool, codes, stats, src));
        all[src] = rows.back().second;
      }
      if (o->json)
        std::cout << all.dump(2) << "\n";
      else
        print_figures(rows);
      return 0;
    };
  });
}

void add_model_stats(CLI::App& app, Runner& run) {
  auto* cmd = app.add_subcommand(
      "model-stats",
      "Regenerate the real-model table (data/real_models/stats.json): trace the forward of every family in "
      "data/real_models/families.json on the meta device (default configs, so real widths) and record the op "
      "vocabulary with counts, adjacent pairs, dataflow edges and the layouts each op sees, with provenance.");
  auto o = std::make_shared<realism::ModelStatsOptions>();
  cmd->add_option("--families", o->families, "Families to trace (default data/real_models/families.json)");
  cmd->add_option("--out", o->out, "Table to write (default data/real_models/stats.json; replaced atomically)");
  cmd->add_option("--workers", o->workers, "Tracing workers")->check(CLI::Range(1, 256))->capture_default_str();
  cmd->add_option("--timeout", o->timeout_s, "Seconds one family may take")->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->callback([&run, o] {
    run = [o] {
      auto s = realism::model_stats(*o);
      for (const auto& [name, why] : s.failed) spdlog::warn("model-stats: {} not traced: {}", name, why);
      spdlog::info("model-stats done in {:.1f}s: {} families traced, {} failed; {} ops, {} pairs, {} edges", s.seconds,
                   s.traced, s.failed.size(), s.ops, s.pairs, s.edges);
      return 0;
    };
  });
}

}  // namespace opforge::cli
