#include <spdlog/spdlog.h>

#include "commands.h"
#include "composer.h"
#include "opforge/core/store.h"

namespace opforge::cli {

void add_compose(CLI::App& app, Runner& run) {
  auto* cmd = app.add_subcommand(
      "compose",
      "Add candidate tasks that fuse 1-5 ops. graph backend (default): chains along the dataflow of real models "
      "(data/real_models/stats.json), anchored on a GEMM, convolution or attention, in real layouts; template: "
      "uniform over the crawled seeds; both deterministic and offline. llm: any OpenAI-compatible endpoint. Needs a "
      "crawled workspace. A re-run with the same --seed continues where the last stopped. --shard I/N: one part of "
      "a fixed-count run split over machines (docs/architecture.md, Past one machine).");
  struct Opts {
    std::string workspace = "workspace";
    composer::ComposeOptions c;
    std::string shard;  // parsed when the command runs, so a bad one is an opforge error like any
  };
  auto o = std::make_shared<Opts>();
  o->c.workers = default_workers();
  add_workspace_option(*cmd, o->workspace);
  cmd->add_option("-n,--count", o->c.count, "Candidates to add")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--max-ops", o->c.max_ops, "Most seed ops fused into one task (1-5)")
      ->check(CLI::Range(1, 5))
      ->capture_default_str();
  cmd->add_option("--mix", o->c.mix,
                  "Share of tasks per number of fused torch ops (1-5) and of single transformers modules, in "
                  "percent; default: Ops-6K's mix")
      ->capture_default_str();
  cmd->add_option("--backend", o->c.backend,
                  "graph, template, llm, or a backend registered as an 'opforge.composers' entry point "
                  "(docs/sources.md)")
      ->capture_default_str();
  cmd->add_option("--seed", o->c.seed, "RNG seed: same seed, same candidates")->capture_default_str();
  cmd->add_option("--target-ms", o->c.target_ms, "Eager time the graph and template backends size tasks for")
      ->capture_default_str();
  cmd->add_option("--device", o->c.device,
                  "graph: the device its cost model sizes tasks for (cpu or cuda); nothing is measured, so every "
                  "machine composes the same tasks")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--stats", o->c.stats, "graph: the real-model table (default data/real_models/stats.json)");
  cmd->add_option("--anchor-share", o->c.anchor_share,
                  "graph: share of multi-op tasks built around a GEMM, convolution or attention")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  cmd->add_option("--edge-smoothing", o->c.edge_smoothing,
                  "graph: weight of a next op no real model has after the current one (a real edge weighs the number "
                  "of model families with it); 0 walks real edges only, more gives more distinct tasks")
      ->check(CLI::Range(0.0, 100.0))
      ->capture_default_str();
  cmd->add_option("--exotic-share", o->c.exotic_share,
                  "graph: share of multi-op tasks given one crawled op real models do not use (diversity)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  cmd->add_option("--block-size", o->c.block_size,
                  "graph, template: indices per block; a candidate depends on its block (duplicates are redrawn "
                  "within it), so runs meant to agree, such as the shards of one run, use the same size")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--shard", o->shard,
         "I/N: this part of a fixed-count run split over N machines (graph, template): indices 0..count-1 of "
         "--seed, only the blocks b with b % N == I, each index a task or a failure (no per-bucket quotas). The N "
         "shards hold exactly the candidates of the run with --shard 0/1; `opforge merge` joins them. A finished "
         "shard writes <workspace>/done/compose.shard-I-of-N.json, and the same command again does nothing")
      ->type_name("I/N");
  cmd->add_option("-j,--workers", o->c.workers, "Worker processes")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--llm-url", o->c.llm_url, "OpenAI-compatible endpoint, e.g. http://localhost:8000/v1");
  cmd->add_option("--llm-model", o->c.llm_model, "Model name sent to the endpoint");
  cmd->add_option("--llm-key-env", o->c.llm_key_env, "Environment variable holding the API key (never logged)")
      ->capture_default_str();
  cmd->add_option("--llm-concurrency", o->c.llm_concurrency, "Requests in flight")->capture_default_str();
  cmd->add_option("--llm-timeout-s", o->c.llm_timeout_s, "Per-request time limit")->capture_default_str();
  cmd->callback([&run, o] {
    run = [o] {
      if (!o->shard.empty()) o->c.shard = parse_shard(o->shard);
      Workspace ws(o->workspace);
      auto s = composer::compose(ws, o->c);
      if (s.already_done) {
        spdlog::info("compose shard {}/{} already done with these arguments ({}): nothing to do", o->c.shard->index,
                     o->c.shard->count, composer::shard_marker(ws, *o->c.shard).string());
        return 0;
      }
      spdlog::info("compose done in {:.1f}s: {} added, {} failed, {} duplicates", s.seconds, s.added, s.failed,
                   s.duplicates);
      for (auto& [b, n] : s.by_bucket) spdlog::info("  bucket {:<13} {:>6}", b, n);
      for (auto& [r, n] : s.failures) spdlog::info("  failed {:<24} {:>6}", r, n);
      if (o->c.backend == "llm")
        spdlog::info("  tokens: {} prompt, {} completion spent by this run; {} answers from the cache", s.prompt_tokens,
                     s.completion_tokens, s.cached);
      return 0;
    };
  });
}

}  // namespace opforge::cli
