#include <spdlog/spdlog.h>

#include "commands.h"
#include "dedup.h"
#include "opforge/core/store.h"

namespace opforge::cli {

void add_dedup(CLI::App& app, Runner& run) {
  auto* cmd = app.add_subcommand(
      "dedup",
      "Over accepted tasks: drop exact duplicates (same normal form: comments, names and sizes do not count), near "
      "duplicates (cosine of structural features >= --within-threshold to an earlier kept task), tasks whose op "
      "sequence spells a KernelBench level-2 problem, and tasks with cosine >= --threshold to a --reference file. "
      "Recomputed from scratch each run; see `opforge status` for the similarity histogram.");
  struct Opts {
    std::string workspace = "workspace";
    std::vector<std::string> references;
    dedup::DedupOptions d;
    bool no_kernelbench_names = false;
  };
  auto o = std::make_shared<Opts>();
  add_workspace_option(*cmd, o->workspace);
  cmd->add_option("--reference", o->references,
                  "Folder of KernelBench-format .py files to decontaminate against (recursive; e.g. a KernelBench "
                  "checkout's KernelBench/ folder); repeatable");
  cmd->add_option("--threshold", o->d.threshold, "Cosine to the nearest reference at or above which a task is dropped")
      ->check(CLI::Range(-1.0, 1.0))
      ->capture_default_str();
  cmd->add_option("--within-threshold", o->d.within_threshold,
                  "Cosine to an earlier kept task at or above which a task is dropped as a near duplicate")
      ->check(CLI::Range(-1.0, 1.0))
      ->capture_default_str();
  cmd->add_flag("--no-kernelbench-names", o->no_kernelbench_names,
                "Skip the check of op sequences against KernelBench's level-2 problem names (data/kernelbench_ops.json)");
  cmd->add_option("--dims", o->d.dims, "Width of the hashed feature vectors")->check(CLI::Range(16, 1 << 16))
      ->capture_default_str();
  cmd->add_option("--exact-up-to", o->d.exact_up_to,
                  "Search exactly up to this many distinct tasks (or references); above, an inverted file (faiss "
                  "IVF), whose recall of near duplicates bench/dedup_scale measures")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("-j,--workers", o->d.workers, "Worker processes computing features")->capture_default_str();
  cmd->callback([&run, o] {
    run = [o] {
      o->d.kernelbench_names = !o->no_kernelbench_names;
      o->d.references.assign(o->references.begin(), o->references.end());
      Workspace ws(o->workspace);
      auto s = dedup::dedup(ws, o->d);
      spdlog::info("dedup done in {:.1f}s (features {:.1f}s, search {:.2f}s): {} accepted, {} kept, {} dropped, {} "
                   "reference files",
                   s.seconds, s.features_seconds, s.search_seconds, s.accepted, s.kept, s.dropped, s.references);
      for (auto& [r, n] : s.reasons) spdlog::info("  dropped {:<20} {:>6}", r, n);
      return 0;
    };
  });
}

}  // namespace opforge::cli
