// The journal of an `opforge eval` run (<out>/journal.jsonl): each solution's verdict is appended
// as soon as it is known, so a run that is killed, or cut by a machine's time limit, resumes where
// it stopped when it is started again on the same --out. Internal to the evaluator.
//
// Lines: a header {"journal": 1, "fingerprint", "seed", "digest_key"}; {"phase", "at", "jobs"} when a phase
// (build, evaluate, baselines) starts; one {"key", "solution", "at", "row"} per judged solution (the
// judge's row before baselines are joined); one {"session": {...}} per run that ended. `at` is Unix
// time in seconds: a killed run's rate is still known from its lines (bench/eval_gpu_report.py).
// A row is reused only under the same fingerprint (judge version, policy, limits, tolerances,
// device and sandbox) and the same key (task code and every byte of the solution's own files).
#pragma once
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "evaluator.h"

namespace opforge::evaluator {

class Journal {
 public:
  // Opens <out>/journal.jsonl. Its rows are kept when its fingerprint is `fingerprint` and (when
  // `seed` is set) its seed is *seed; otherwise, or with `fresh`, it starts anew. A line cut short
  // by a kill is skipped with a warning.
  Journal(const std::filesystem::path& out, const std::string& fingerprint, std::optional<std::uint64_t> seed,
          std::uint64_t drawn_seed, bool fresh);
  std::uint64_t seed() const { return seed_; }
  // The key of solution_digest: drawn with the journal, so a solution cannot be made, ahead of
  // time, to collide with another's digest (XXH3 is fast, not collision resistant).
  std::uint64_t digest_key() const { return digest_key_; }
  // The stored row for `key`, or null.
  const nlohmann::json* find(const std::string& key) const;
  void add(const std::string& key, const std::string& solution, const nlohmann::json& row);
  void mark(const std::string& phase, std::size_t jobs);  // a phase starts with `jobs` to do
  void end_session(const nlohmann::json& session);
  const nlohmann::json& sessions() const { return sessions_; }  // the ended runs before this one
  std::size_t size() const { return rows_.size(); }

 private:
  bool load(const std::filesystem::path& file, const std::string& fingerprint, std::optional<std::uint64_t> seed);
  std::map<std::string, nlohmann::json> rows_;
  std::vector<std::string> good_;  // the lines read that parsed, written back at the start
  nlohmann::json sessions_ = nlohmann::json::array();
  std::uint64_t seed_ = 0, digest_key_ = 0;
  std::ofstream f_;
};

// What a journal row is keyed by: the task's code, the entry file and every file of the solution
// (relative path, link target or bytes), in path order.
std::string solution_digest(const std::string& task_code, const SolutionEntry& s, std::uint64_t key);

}  // namespace opforge::evaluator
