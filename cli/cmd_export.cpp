#include <spdlog/spdlog.h>

#include "commands.h"
#include "export.h"
#include "opforge/core/store.h"

namespace opforge::cli {

void add_export(CLI::App& app, Runner& run) {
  auto* cmd = app.add_subcommand(
      "export",
      "Write the tasks dedup kept as a dataset: JSONL shards (Ops-6K fields ops, data_source, code plus id, num_ops, "
      "metrics, provenance, decontamination, split), manifest.json with checksums, a Hugging Face dataset card "
      "README.md and stats/ (JSON and PNG). The same workspace gives the same bytes. Needs `opforge dedup` first.");
  struct Opts {
    std::string workspace = "workspace";
    std::string out;
    exporter::ExportOptions e;
    bool no_plots = false, no_realism = false;
  };
  auto o = std::make_shared<Opts>();
  add_workspace_option(*cmd, o->workspace);
  cmd->add_option("-o,--out", o->out, "Folder to write the dataset into (created; earlier shards in it are replaced)")
      ->required();
  cmd->add_option("--shard-size", o->e.shard_size, "Records per shard")->check(CLI::Range(1L, 1L << 40))
      ->capture_default_str();
  cmd->add_flag("--gzip", o->e.gzip, "Write .jsonl.gz shards (deterministic gzip: no mtime, no file name)");
  cmd->add_option("--format", o->e.format,
                  "jsonl: shards plus dataset card; kernelbench: level_opforge/<N>_<Name>.py files other harnesses run "
                  "unchanged; verl: train.parquet and test.parquet with the rows verl's RL dataset reads (data_source, "
                  "prompt, ability, reward_model, extra_info)")
      ->check(CLI::IsMember({"jsonl", "kernelbench", "verl"}))
      ->capture_default_str();
  cmd->add_option("--split-seed", o->e.split_seed, "Seed of the hash that assigns records to train or test")
      ->capture_default_str();
  cmd->add_option("--test-fraction", o->e.test_fraction, "Share of records marked split \"test\" (by hash of the id)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  cmd->add_flag("--no-plots", o->no_plots, "Skip the PNG plots in stats/ (they need matplotlib in the venv)");
  cmd->add_flag("--no-realism", o->no_realism,
                "Skip stats/realism.json and the card's realism figures (tracing every record on the meta device)");
  cmd->add_option("--realism-reference", o->e.realism_references,
                  "Tasks whose realism figures go beside the corpus's (a KernelBench checkout's level2, shards, a "
                  "workspace); repeatable");
  cmd->callback([&run, o] {
    run = [o] {
      o->e.out = o->out;
      o->e.plots = !o->no_plots;
      o->e.realism = !o->no_realism;
      Workspace ws(o->workspace);
      auto s = exporter::export_dataset(ws, o->e);
      spdlog::info("export done in {:.1f}s: {} records ({} train, {} test) in {} files under {}", s.seconds, s.records,
                   s.train, s.test, s.files, o->out);
      return 0;
    };
  });
}

}  // namespace opforge::cli
