// opforge realism: how much a set of tasks looks like the compute of real models, and the
// real-model tables (data/real_models/stats.json) it is measured against.
//
// A task is traced on the meta device in a worker (python/opforge/realism.py): ops after alias
// normalisation, views and metadata left out. Its figures: the share of multi-op tasks holding a
// GEMM, convolution or attention ("heavy"), the share of op occurrences that real models use
// ("vocabulary"), the share of adjacent op pairs that real models contain ("pairs"), and the
// layouts its ops see. docs/realism.md has the definitions and the calibration on KernelBench.
//
// Errors: throws opforge::Error when the table is missing or the workers cannot trace at all; a
// task that cannot be traced is a counted fact ("untraced"), never an exception.
#pragma once
#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "opforge/core/worker_pool.h"

namespace opforge::realism {

// data/real_models/stats.json, the table `opforge model-stats` writes.
std::filesystem::path default_stats();

// The figures of `codes` against `stats` ({"tasks", "untraced", "multi_op", "heavy_share",
// "vocab_share", "pair_share", "layouts", "median_ops", ...}; shares in percent, null when
// nothing was counted). `what` names the tasks in progress and errors.
nlohmann::json measure(WorkerPool& pool, const std::vector<std::string>& codes, const std::filesystem::path& stats,
                       const std::string& what);

struct ModelStatsOptions {
  std::filesystem::path families;  // empty: data/real_models/families.json
  std::filesystem::path out;       // empty: data/real_models/stats.json
  int workers = 2;
  double timeout_s = 300;  // per family
};

struct ModelStatsSummary {
  long traced = 0;
  std::map<std::string, std::string> failed;  // family -> why
  long ops = 0, pairs = 0, edges = 0;
  double seconds = 0;
};

// Traces every family of `families` (one worker request each, so a crash or hang costs that
// family only) and writes the merged table with its provenance to `out`.
ModelStatsSummary model_stats(const ModelStatsOptions& opts);

}  // namespace opforge::realism
