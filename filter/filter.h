// opforge filter: execute every candidate task in the worker pool and keep what passes.
//
// Owns the `filter_results` table (one row per judged task). Checks and reasons:
// python/opforge/filter.py and docs/reasons.md. Each verdict is committed on its own, so a killed
// run resumes with the tasks that have none. Also owns `opforge import` (KernelBench files made
// elsewhere become candidates) and the per-task listing of `opforge tasks`.
#pragma once
#include <nlohmann/json.hpp>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "opforge/core/shard.h"
#include "opforge/core/store.h"

namespace opforge::filter {

struct FilterOptions {
  std::string device = "auto";  // auto | cpu | cuda
  int workers = 0;              // 0: one per GPU x workers_per_gpu, or 2 on CPU
  int workers_per_gpu = 2;
  double min_ms = 1, max_ms = 100;
  double timeout_s = 600;
  bool calibrate = true;
  double rtol = 1e-2, atol = 1e-2;
  int trials = 20;
  std::size_t memory_limit_mb = 0;
  int limit = 0;                // judge at most N tasks (0: all)
  std::vector<std::string> rejudge;  // stored rejections with these reasons are judged again ("all": every one)
  bool rejudge_stale = false;        // and verdicts made under another configuration
  // Checks switched off for this run (kChecks names them). Part of the configuration, so verdicts
  // made with another set show as stale and --rejudge-stale applies this set to them.
  std::vector<std::string> skip_checks;
  // Checks of installed packages (entry point group "opforge.checks") to run after the built-in
  // eager checks; part of the configuration too.
  std::vector<std::string> extra_checks;
  // Only the tasks of this shard (core/shard.h); a finished shard leaves done/filter.shard-I-of-N.json.
  // Empty: every task, and no marker (as compose).
  std::optional<Shard> shard;
  // Judge every twin (tasks of one normal form, features.py) instead of the first of each until one
  // is accepted; the rest are recorded exact_duplicate without running, as dedup would drop them.
  bool judge_twins = false;
  // A filter on another host (or PID namespace) whose heartbeat is older than this is gone, and
  // its leases are taken over; on this host a gone PID says so at once.
  double lease_stale_s = 300;
};

// The checks a run may switch off, in the order they run (python/opforge/filter.py: CHECKS).
inline const std::vector<std::string> kChecks = {"finite",       "deterministic",
                                                 "non_constant", "input_sensitive",
                                                 "judge_distinguishable", "time_window",
                                                 "conditioning", "compile"};

// The filter's own version, part of every verdict's configuration hash: raise it when a check
// changes what it accepts, so verdicts of the old checks show as stale.
inline constexpr const char* kFilterVersion = "filter-9";
// What a verdict depends on (its xxh3 is stored with the verdict as `config`).
nlohmann::json config_of(const FilterOptions& o, const std::string& device);

struct FilterSummary {
  long judged = 0, accepted = 0, rejected = 0;
  long twins = 0;  // recorded exact_duplicate of an accepted twin without running
  std::map<std::string, long> reasons;
  double seconds = 0;
};

void migrate(Db& db);
// Judges the candidates without a verdict (and those --rejudge names). A task rejected for
// out_of_memory or worker_crash while sharing the machine is judged again alone before its
// rejection stands (metrics.attempts records both).
//
// Safe to run in several processes on one workspace: each claims a few tasks at a time under a
// lease (leases.h), so no task is judged twice and together they judge every one. Twins (one
// normal form) are judged in id order until one is accepted; the later ones are then recorded
// exact_duplicate naming it, which leaves dedup's kept set as if all had been judged.
FilterSummary filter(Workspace& ws, const FilterOptions& opts);

struct ImportSummary {
  long added = 0, duplicates = 0;
};
// Adds every .py file under paths (files or folders, recursive) as a candidate with backend
// "import" and the path in provenance. Throws opforge::Error for a path that does not exist.
ImportSummary import_tasks(Workspace& ws, const std::vector<std::filesystem::path>& paths);

// Every candidate with its origin, verdict, reason and key metrics; verdict filter: "", accepted,
// rejected, pending.
std::vector<nlohmann::json> list_tasks(Db& db, const std::string& verdict);
// The "filter" section of `opforge status --json`.
nlohmann::json status(Db& db);

}  // namespace opforge::filter
