// The phases of one evaluation over a set of jobs (build, evaluate, baselines, rows), shared by
// `opforge eval` (evaluator.cpp: one run over a folder of solutions) and `opforge serve`
// (service.cpp: one run per batch of requests, with pools kept warm between them). Internal.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "evaluator.h"
#include "internal.h"
#include "journal.h"
#include "opforge/core/worker_pool.h"

namespace opforge::evaluator {

namespace fs = std::filesystem;
using nlohmann::json;

// Requests across the C++/Python seam, one struct each (python/opforge/judge.py has the handlers).
struct CompileRequest {
  std::string solution_dir, entry, layout, cache_dir, policy, log_path;
  json launch;
  double timeout_s = 600;
};
inline void to_json(json& j, const CompileRequest& r) {
  j = {{"solution_dir", r.solution_dir}, {"entry", r.entry}, {"layout", r.layout}, {"cache_dir", r.cache_dir},
       {"launch", r.launch}, {"policy", r.policy}, {"timeout_s", r.timeout_s}, {"log_path", r.log_path}};
}

struct Measure {  // what eval_solution and eval_baselines share
  std::string device, timing_lock, log_path;
  json launch;
  int trials = 100, correct_trials = 5;
  double budget_s = 10, timeout_s = 600;
  std::uint64_t seed = 0;
};
inline void put_measure(json& j, const Measure& m) {
  j.update({{"device", m.device}, {"launch", m.launch}, {"trials", m.trials}, {"correct_trials", m.correct_trials},
            {"budget_s", m.budget_s}, {"timeout_s", m.timeout_s}, {"seed", m.seed}, {"log_path", m.log_path}});
}

struct SolutionRequest {
  std::string task_code, solution_dir, entry, layout, policy;
  json artifacts;
  double atol = 1e-2, rtol = 1e-2;
  bool timed = true;  // false: checks only (EvalOptions::untimed)
  Measure m;
};
inline void to_json(json& j, const SolutionRequest& r) {
  j = {{"task_code", r.task_code}, {"solution_dir", r.solution_dir}, {"entry", r.entry}, {"layout", r.layout},
       {"artifacts", r.artifacts}, {"policy", r.policy}, {"atol", r.atol}, {"rtol", r.rtol}, {"timed", r.timed}};
  put_measure(j, r.m);
}

struct BaselineRequest {
  std::string task_code, cache_dir;
  Measure m;
};
inline void to_json(json& j, const BaselineRequest& r) {
  j = {{"task_code", r.task_code}, {"cache_dir", r.cache_dir}};
  put_measure(j, r.m);
}

// A judge worker's first spare child, started while the solutions build (judge.eval_prestart).
struct PrestartRequest {
  std::string device, log_path;
  json launch;
  double timeout_s = 600;
  bool timed = true;  // the spares also start the profiler: strict's checks and every timed profile pass run under it
};
inline void to_json(json& j, const PrestartRequest& r) {
  j = {{"device", r.device}, {"launch", r.launch}, {"timeout_s", r.timeout_s}, {"log_path", r.log_path},
       {"timed", r.timed}};
}

inline json request(const char* op, const json& args, double timeout_s) {
  // The pool's limit is the judge worker's; the judge bounds every wait on a child itself, so this
  // one only fires when the judge itself hangs.
  return {{"op", op}, {"timeout_s", timeout_s * 3 + 120}, {"args", args}};
}

struct Job {
  std::size_t task;
  SolutionEntry sol;
  fs::path work;
  std::string entry;
  json row = json::object();
  bool done = false;
  std::string digest;  // journal key (journal.h); empty when the run keeps no journal
};

struct Run {
  const EvalOptions& o;
  std::vector<EvalTask> tasks;
  std::vector<Job> jobs;
  json unmatched = json::array();
  long without = 0;
  fs::path out, cache;
  std::string device;
  std::vector<std::string> gpu_ids;
  std::uint64_t seed = 0;
  Launch launch;
  json worker_info = json::object();
  std::string device_key;
  std::map<std::string, json> base;  // baselines by xxh3 of the task code
  Journal* journal = nullptr;         // opforge eval's; serve keeps none
  long resumed = 0;                   // jobs whose verdict came from the journal

  explicit Run(const EvalOptions& opts) : o(opts) {}
  void match();
  // Jobs with a verdict in the journal are done with it; the rest are keyed for it.
  void resume(Journal& j);
  void record(const Job& j);  // into the journal, when there is one
  void mark(const char* phase, std::size_t jobs) {
    if (journal) journal->mark(phase, jobs);
  }
  WorkerPoolOptions pool_options(int workers, double timeout_s) const;
  // Phase 1 in `pool` (compile workers), or in a pool of its own sized to the jobs when null.
  void build(WorkerPool* pool = nullptr);
  void prestart(WorkerPool& pool, int workers);
  WorkerPoolOptions build_pool_options(int workers) const;
  // Phase 2 on `judges` workers; a verdict of memory made while they shared a device is judged
  // again alone (one request at a time) before it stands.
  void evaluate(WorkerPool& pool, int judges);
  void judge_alone(WorkerPool& pool, const std::vector<std::size_t>& again, int judges, double budget_s);
  // One solution of judge_alone (the caller's thread alone drives the pool): judged again on
  // inputs of another seed when in_budget, else its shared verdict kept with the reason; both
  // verdicts in the row's "attempts". False when it was not judged again.
  bool judge_again_alone(WorkerPool& pool, Job& j, bool in_budget, double budget_s) const;
  json solution_request(const Job& j, std::uint64_t input_seed) const;
  json judged_row(const Job& j, const WorkerResult& r) const;
  void baselines(WorkerPool& pool);
  json baseline_request(const std::string& task_code) const;
  // A baseline worker's answer as a `base` entry (stored in db), or nullopt when it measured none.
  std::optional<json> baseline_entry(const WorkerResult& r, BaselineCache& db, const std::string& hash) const;
  json rows();  // one report row per job, sorted by task and solution
  json row(Job& j);  // the report row of one judged job, with its task's baselines when there are
  json report(double secs);
  Measure measure() const;
};

// A verdict of memory (the solution's out_of_memory or the judge's own judge_out_of_memory): made
// while judge workers shared a device, it is judged again alone before it stands.
bool memory_verdict(const json& row);

fs::path default_cache_dir();
// Everything a cached baseline depends on besides the task code.
std::string baseline_key(const json& info, const std::string& device, const EvalOptions& o);

}  // namespace opforge::evaluator
