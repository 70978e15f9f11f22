// opforge dedup: drop exact and near duplicates among accepted tasks, and tasks too close to
// KernelBench (a reference folder, or the op sequences spelled by KernelBench's level-2 names).
//
// Owns the `dedup_results` table: one row per accepted task, kept or dropped with a reason
// (docs/reasons.md), plus its nearest reference and nearest other task with their cosines, so the
// thresholds are visible choices. Dedup is cheap next to the filter, so every run recomputes all
// rows from scratch in one transaction: a rerun gives the same rows, a killed run leaves the
// previous ones. Features come from python/opforge/features.py in the worker pool; vectors are
// feature-hashed (xxh3) and searched with faiss (exact inner product over unit vectors).
#pragma once
#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "opforge/core/store.h"

namespace opforge::dedup {

// Up to this many vectors dedup searches exactly; above, an inverted file (dedup/index.h).
constexpr long kExactUpTo = 5000;

struct DedupOptions {
  std::vector<std::filesystem::path> references;  // folders of KernelBench-format .py files
  double threshold = 0.95;         // cosine to a reference at or above which a task is dropped
  double within_threshold = 0.98;  // cosine to an earlier kept task at or above which it is dropped
  bool kernelbench_names = true;   // the op-sequence check against data/kernelbench_ops.json
  int dims = 1024;                 // width of the hashed feature vectors
  double ops_weight = 0.5;         // share of the op tokens in a vector (the rest: AST n-grams)
  int workers = 2;                 // feature workers
  long exact_up_to = kExactUpTo;
};

struct DedupSummary {
  long accepted = 0, kept = 0, dropped = 0, references = 0;
  std::map<std::string, long> reasons;
  double seconds = 0, features_seconds = 0, search_seconds = 0;
};

void migrate(Db& db);
DedupSummary dedup(Workspace& ws, const DedupOptions& opts);

// Feature hashing: each token's xxh3 with 4 seeds picks 4 (dimension, sign) places; weights are 1 + log(count)
// (so frequent node types do not drown the rest); the AST and the op tokens are normalised
// apart and mixed by ops_weight, then the vector is L2-normalised. Exposed for tests.
std::vector<float> hashed_vector(const nlohmann::json& tokens, int dims, double ops_weight);
// KernelBench's problems as op tokens (data/kernelbench_ops.json): a task is KernelBench's when it
// is a single op that is a level-1 problem ("kernelbench_level1"), or when a level-2 problem's
// sequence occurs in its op sequence in order, other ops allowed in between ("kernelbench_ops").
class KernelBenchOps {
 public:
  KernelBenchOps() = default;
  explicit KernelBenchOps(const nlohmann::json& table);
  // (reason, problem name) of the first rule the sequence meets, or nothing.
  std::optional<std::pair<std::string, std::string>> match(const std::vector<std::string>& seq) const;

 private:
  std::vector<std::pair<std::string, std::vector<std::string>>> level2_;  // in name order
  std::map<std::string, std::string> level1_;                             // token -> first problem name
};

// A traced op sequence in KernelBench's vocabulary (table: data/kernelbench_ops.json);
// layout-only ops are left out.
std::vector<std::string> op_tokens(const nlohmann::json& ops, const nlohmann::json& table);

// The "dedup" section of `opforge status --json`.
nlohmann::json status(Db& db);

}  // namespace opforge::dedup
