// opforge compose: new candidate tasks fused from crawled seeds, into the `tasks` table.
//
// Backends: `template` (deterministic, offline, python/opforge/compose.py run in workers) and
// `llm` (any OpenAI-compatible endpoint, llm_client.h). Candidate i of RNG seed S depends only
// on (S, i, seeds, mix); a run continues at the next index of its seed, so a killed run resumes
// and two fresh workspaces with the same seed get the same candidates. Failed candidates are
// stored in `compose_failures` with their reason.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "opforge/core/shard.h"
#include "opforge/core/store.h"

namespace opforge::composer {

struct ComposeOptions {
  int count = 100;
  int max_ops = 5;
  // bucket:percent list; buckets 1..5 (torch#K) and a seed source's name (one of its whole
  // modules per task: transformers#1, local#1, a registered source's). Ops-6K's mix.
  std::string mix = "1:3.4,2:83.8,3:7.6,4:2.8,5:1.2,transformers:1.2";
  // graph (real-model chains, docs/realism.md), template (uniform over the crawled seeds) or llm.
  std::string backend = "graph";
  std::uint64_t seed = 0;
  double target_ms = 10;  // eager time the template sizes aim at (geometric middle of 1-100 ms)
  int workers = 2;
  // The offline backends compose in fixed blocks of this many indices; a candidate depends on its
  // block (duplicates are redrawn within it), so runs meant to agree use the same size.
  int block_size = 64;
  // A fixed-count run of the offline backends (issue #16, an array job's part): indices
  // [0, count) of --seed, only the blocks b with b % shard.count == shard.index, every index
  // ending as a task or a failure (no per-run quotas, which would need the other shards' tasks).
  // Its N shards hold exactly the candidates of the run with shard 0/1. Empty: the usual run,
  // which adds --count tasks from the next index on.
  std::optional<Shard> shard;
  // graph backend: the real-model table (empty: data/real_models/stats.json), the device its
  // cost model sizes for (cpu | cuda; never measured, so any machine composes the same tasks),
  // the share of multi-op chains anchored on a GEMM/convolution/attention, and of chains given
  // one crawled op real models do not use; edge_smoothing is the weight of an op after another
  // that no real model has (a real edge weighs the number of families that have it): 0 walks
  // real edges only, more gives more distinct structures and fewer real pairs (docs/realism.md).
  std::string stats, device = "cpu";
  double anchor_share = 0.95, exotic_share = 0.05, edge_smoothing = 0.5;
  // llm backend
  std::string llm_url, llm_model, llm_key_env = "OPENAI_API_KEY";
  int llm_concurrency = 8;
  double llm_timeout_s = 120;
};

struct ComposeSummary {
  long added = 0, failed = 0, duplicates = 0;
  long prompt_tokens = 0, completion_tokens = 0, cached = 0;
  std::map<std::string, long> by_bucket, failures;
  double seconds = 0;
  bool already_done = false;  // a shard whose completion marker says these arguments finished
};

// Parses "1:3.4,2:83.8,...,transformers:1.2" into normalised probabilities, dropping buckets
// above max_ops. Throws opforge::Error naming the bad part.
std::vector<std::pair<std::string, double>> parse_mix(const std::string& spec, int max_ops);

// What one bucket of a run has given so far: candidates drawn, tasks kept after dedup.
struct BucketYield {
  long drawn = 0, kept = 0;
};
// Per bucket of `backend`'s candidates in the workspace (tasks' provenance bucket, dedup's kept).
std::map<std::string, BucketYield> bucket_yields(Db& db, const std::string& backend);

// The mix of the next round of `run --kept want`: per bucket of `mix`, what is missing of its
// quota of want (whole tasks, largest remainder, as a run's first round), divided by the bucket's
// own yield so far ((kept + 1) / (drawn + 2), at least 1/50; a tenth more), as candidate counts
// ("3:412,4:180"); `count` gets their sum. Buckets yield very differently (two-op chains of real
// models repeat: a quarter of them survive dedup, against four in five of 3-5-op chains), so
// topping up with the preset's mix would drift the kept mix away from it. Empty: nothing missing.
std::string deficit_mix(const std::vector<std::pair<std::string, double>>& mix,
                        const std::map<std::string, BucketYield>& yields, long want, long& count);

void migrate(Db& db);
// A sharded run writes <workspace>/done/compose.shard-I-of-N.json when it finishes (its arguments
// and summary); started again with the same arguments it does nothing.
std::filesystem::path shard_marker(const Workspace& ws, Shard shard);
ComposeSummary compose(Workspace& ws, const ComposeOptions& opts);
// The "candidates" section of `opforge status --json`.
nlohmann::json status(Db& db);

}  // namespace opforge::composer
