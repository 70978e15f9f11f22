// opforge eval: score candidate ModelNew solutions against their tasks (KernelBench protocol,
// CUDA Agent reward), hardened against reward hacking.
//
// Phases: tasks and solutions are matched (evaluator/README.md has the layouts); every solution
// is built in parallel on the CPU cores (judge workers, each build in a sandboxed compiler child,
// extensions cached by a hash of their build arguments); then each built solution is checked and
// timed by a judge worker (python/opforge/judge.py) in a fresh sandboxed child of its own, with
// eager and torch.compile baselines timed the same way and cached in <cache>/baselines.db by task
// code and everything that changes them. The judge's processes never run solution code
// (docs/architecture.md, "The judge"). Results are values with reasons (docs/reasons.md), never
// exceptions.
//
// Writes into `out`: report.json, report.md, report.png (unless plots are off), work/<key>/ (the
// copy of each solution's own files it ran from) and journal.jsonl, each verdict as it comes: run
// again on the same `out`, it judges only what is missing or changed (evaluator/journal.h).
// Errors: a missing --tasks or --solutions, no task at all, or an unwritable --out throws
// opforge::Error saying what to fix. Thread safety: one evaluation per call; not reentrant.
#pragma once
#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace opforge::evaluator {

struct EvalTask {
  std::string id;    // record or task id; for a .py file the xxh3 hex of its code
  std::string name;  // the file stem for .py files, else the id
  std::string code;
  std::string split;  // a shard record's "split" (train / test, as `opforge export` draws it); else empty
};

// Tasks of SRC: a .jsonl/.jsonl.gz shard or a folder of them, a workspace (folder with
// opforge.db: filter-accepted tasks that dedup kept, all tasks of a workspace never filtered), a
// folder of KernelBench .py files (recursive) or one .py file. Throws opforge::Error for a
// missing path or a malformed record (naming file and line).
std::vector<EvalTask> load_tasks(const std::filesystem::path& src);

struct SolutionEntry {
  std::string key;               // file stem or folder name
  std::filesystem::path path;    // the .py file or the folder
  bool folder = false;           // CUDA Agent layout: model_new.py + kernels/
};
// Every <key>.py file and every folder of DIR (not recursive), sorted by key.
std::vector<SolutionEntry> find_solutions(const std::filesystem::path& dir);

struct EvalOptions {
  std::filesystem::path tasks, solutions;
  std::filesystem::path out = "eval_report";
  std::filesystem::path cache_dir;  // empty: $XDG_CACHE_HOME/opforge/eval or ~/.cache/opforge/eval
  std::string device = "auto";      // auto | cpu | cuda
  std::string policy = "strict";    // strict | torch-allowed
  int trials = 100;                 // timed runs per measurement (median), within budget_s
  double budget_s = 10;             // time budget per measurement
  int correct_trials = 5;           // fresh input sets for correctness
  double speedup_margin = 0.05;
  double atol = 1e-2, rtol = 1e-2;
  double compile_timeout_s = 600, timeout_s = 600;
  int compile_workers = 0;          // 0: one per core
  int workers = 0;                  // 0: one per GPU, 1 on the CPU
  std::size_t memory_limit_mb = 0;  // RSS per worker; 0: 60% of RAM shared by the workers
  std::optional<std::uint64_t> seed;  // of the input sets; empty: drawn per run (recorded)
  bool sandbox = true;              // each solution's child under bubblewrap (core/sandbox.h)
  bool require_sandbox = false;     // fail instead of running solutions unsandboxed
  std::size_t child_memory_mb = 0;  // memory limit of one solution's sandbox (cgroup); 0: none
  bool plots = true;
  bool fresh = false;               // judge every solution, ignoring <out>/journal.jsonl
  // Correctness only: no timing of the solution, no baselines, reward -1 or 1. For runs that
  // measure whether answers are right, not how fast (a learning run under torch-allowed, where a
  // copy's speed-up is timing noise and the baselines of 100 tasks took minutes on an H200).
  bool untimed = false;
};

// CUDA Agent reward: -1 not correct; 1 correct; 2 more than `margin` faster than eager only;
// 3 more than `margin` faster than eager and torch.compile. A missing speed-up counts as not
// faster.
int reward(bool correct, std::optional<double> speedup_eager, std::optional<double> speedup_compile, double margin);

// Throws, naming the option, on options no judge may run with (eval's and serve's one check):
// an unknown --policy, or --untimed under strict (see evaluator/README.md).
void check_options(const EvalOptions& opts);

// Runs every phase and writes the report; returns report.json's content.
nlohmann::json evaluate(const EvalOptions& opts);

// The report as Markdown (summary, then one table row per solution).
std::string report_markdown(const nlohmann::json& report);

}  // namespace opforge::evaluator
