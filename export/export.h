// opforge export: the tasks dedup kept become a dataset others can load and run.
//
// Reads the workspace only (tasks, filter_results, dedup_results, seeds); owns no table. Writes
// into --out: JSONL shards (optionally gzip) with the Ops-6K fields `ops`, `data_source`, `code`
// plus `id`, `num_ops`, `metrics`, `provenance`, `decontamination`, `split`; `manifest.json`
// (counts, xxh3 of every shard and stats file, config, versions, device); a dataset card
// `README.md` that Hugging Face `datasets` reads; and `stats/` (JSON, plus PNG plots drawn by
// python/opforge/plots.py in a worker). With format "kernelbench" the records become
// `level_opforge/<N>_<Name>.py` files instead of shards.
//
// Determinism: records are in id order, JSON keys sorted, no timestamps, gzip with mtime 0 and no
// file name; the same workspace gives the same bytes (the PNGs excepted).
// Errors: a workspace without dedup results for its accepted tasks, or an unwritable --out,
// throws opforge::Error saying what to run or fix.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <string>

#include "opforge/core/store.h"

namespace opforge::exporter {

struct ExportOptions {
  std::filesystem::path out;
  long shard_size = 1000;      // records per shard
  bool gzip = false;           // .jsonl.gz shards
  std::string format = "jsonl";  // jsonl | kernelbench
  std::uint64_t split_seed = 0;
  double test_fraction = 0.0;  // share of records marked split "test", chosen by xxh3(id, split_seed)
  bool plots = true;           // PNGs of the stats (needs matplotlib in the venv)
  // stats/realism.json and the card's realism figures (realism/realism.h): the corpus traced on
  // the meta device, beside each reference folder (e.g. a KernelBench checkout's level2).
  bool realism = true;
  std::vector<std::filesystem::path> realism_references;
};

struct ExportSummary {
  long records = 0, train = 0, test = 0, files = 0;
  double seconds = 0;
};

ExportSummary export_dataset(Workspace& ws, const ExportOptions& opts);

// "train" or "test": xxh3 of the id with split_seed, as a fraction of 2^64, below test_fraction.
std::string split_of(const std::string& id, std::uint64_t split_seed, double test_fraction);
// A KernelBench file name stem from traced ops: last name parts joined with '_', anything but
// [A-Za-z0-9_] replaced, at most 80 characters ("Linear_tanh").
std::string kernelbench_name(const nlohmann::json& ops);
// Deterministic gzip (mtime 0, no file name) of data. Exposed for tests.
std::string gzip_bytes(const std::string& data);

}  // namespace opforge::exporter
