// Pieces of opforge eval shared between its files; not part of the library's interface.
//   judge side (trusted): evaluator.cpp runs the phases, baseline_cache.cpp keeps the eager and
//     torch.compile times, launch.cpp chooses the sandbox every solution's child starts in;
//   candidate side: python/opforge/candidate.py, started by python/opforge/judge.py;
//   report: report.cpp turns the judge's figures into rows, the reward and the summary.
#pragma once
#include <nlohmann/json.hpp>

#include <filesystem>
#include <optional>
#include <string>

#include "evaluator.h"
#include "opforge/core/store.h"

namespace opforge::evaluator {

// Bumped whenever the way solutions are checked or timed changes: cached baselines and report
// rows of another judge version are never mixed with this one's.
inline constexpr const char* kJudgeVersion = "judge-15";

// ---- launch.cpp
struct Launch {
  nlohmann::json spec;  // what python/opforge/judge.py's Child takes: mode, exe, sandbox_exec, spec, profile
  std::string profile;  // the report rows' `sandbox`: the bwrap profile and limits, or "off: <why>"
  bool sandboxed = false;
};
// Probes bubblewrap once (`opforge sandbox-exec --probe`); without it the solutions run unsandboxed
// with a flag, or, under opts.require_sandbox, the command fails saying what to install.
Launch choose_launch(const EvalOptions& opts, const std::string& device);

// ---- baseline_cache.cpp
// Eager and torch.compile times per task code, keyed by everything that changes them.
class BaselineCache {
 public:
  explicit BaselineCache(const std::filesystem::path& file);
  // key: device (name, uuid, CUDA), torch, judge version and trials, as one string.
  std::optional<nlohmann::json> get(const std::string& code_hash, const std::string& key);
  void put(const std::string& code_hash, const std::string& key, const nlohmann::json& baselines);

 private:
  Db db_;
};

// ---- report.cpp
std::optional<double> number(const nlohmann::json& j, const char* key);
// One report row from the judge's result, the baselines and the static findings.
nlohmann::json make_row(const nlohmann::json& r, double margin);
nlohmann::json summarize(const nlohmann::json& results, double margin);
// Flags that cap a correct solution's reward at 1 (suspicion of a hack, or a check not run).
bool caps_reward(const std::string& flag);

}  // namespace opforge::evaluator
