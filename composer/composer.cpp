#include "composer.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <fstream>
#include <sstream>

#include "opforge/core/error.h"
#include "opforge/core/files.h"
#include "opforge/core/hash.h"
#include "opforge/core/paths.h"
#include "opforge/core/progress.h"
#include "opforge/core/tasks.h"
#include "opforge/core/worker_pool.h"
#include "code_extract.h"
#include "opforge/core/llm_client.h"
#include "prompt.h"

#include <random>

namespace opforge::composer {

using llm::LlmClient;
using llm::LlmOptions;
using llm::LlmRequest;
using llm::LlmResponse;

using nlohmann::json;

std::vector<std::pair<std::string, double>> parse_mix(const std::string& spec, int max_ops) {
  OPFORGE_CHECK(max_ops >= 1 && max_ops <= 5, "--max-ops must be between 1 and 5 (got {})", max_ops);
  std::vector<std::pair<std::string, double>> out;
  std::stringstream ss(spec);
  double total = 0;
  for (std::string part; std::getline(ss, part, ',');) {
    auto colon = part.find(':');
    OPFORGE_CHECK(colon != std::string::npos, "bad --mix entry '{}': write BUCKET:PERCENT, e.g. 2:83.8", part);
    std::string bucket = part.substr(0, colon);
    double p = 0;
    try {
      p = std::stod(part.substr(colon + 1));
    } catch (const std::exception&) {
      throw Error(fmt::format("bad --mix entry '{}': the percent is not a number", part));
    }
    bool torch_bucket = bucket.size() == 1 && bucket[0] >= '1' && bucket[0] <= '5';
    bool source_bucket = !bucket.empty() && std::islower(static_cast<unsigned char>(bucket[0])) &&
                         std::all_of(bucket.begin(), bucket.end(), [](char c) {
                           return std::islower(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)) || c == '_';
                         });
    OPFORGE_CHECK(torch_bucket || source_bucket,
                  "bad --mix bucket '{}': use 1-5 (ops fused from torch) or a seed source's name (transformers, local, "
                  "a registered source: one of its modules per task)", bucket);
    OPFORGE_CHECK(p >= 0, "bad --mix entry '{}': negative percent", part);
    if (torch_bucket && bucket[0] - '0' > max_ops) continue;
    out.emplace_back(bucket, p);
    total += p;
  }
  OPFORGE_CHECK(total > 0, "--mix '{}' leaves nothing to compose with --max-ops {}", spec, max_ops);
  for (auto& [b, p] : out) p /= total;
  return out;
}

std::map<std::string, BucketYield> bucket_yields(Db& db, const std::string& backend) {
  std::map<std::string, BucketYield> out;
  bool dedup = db.has_table("dedup_results");
  auto st = db.prepare(fmt::format(
      "SELECT coalesce(json_extract(t.provenance, '$.bucket'), ''), count(*), {} FROM tasks t {} WHERE t.backend = ? "
      "GROUP BY 1", dedup ? "sum(coalesce(d.kept, 0))" : "0",
      dedup ? "LEFT JOIN dedup_results d ON d.task_id = t.id" : ""));
  st.bind(1, backend);
  while (st.step()) out[st.text(0)] = {st.int64(1), st.int64(2)};
  return out;
}

namespace {

// Per-bucket quotas of this run (largest remainder), so the mix holds over the tasks actually
// added even where one bucket loses more candidates to duplicates than another.
std::map<std::string, long> bucket_quotas(const std::vector<std::pair<std::string, double>>& mix, long count) {
  std::map<std::string, long> quota;
  long given = 0;
  std::vector<std::pair<double, std::string>> rem;
  for (auto& [b, p] : mix) {
    double exact = p * static_cast<double>(count);
    quota[b] = static_cast<long>(exact);
    given += quota[b];
    rem.emplace_back(exact - static_cast<double>(quota[b]), b);
  }
  std::sort(rem.begin(), rem.end(), [](auto& a, auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
  for (std::size_t i = 0; given < count; ++i, ++given) quota[rem[i % rem.size()].second]++;
  return quota;
}

}  // namespace

std::string deficit_mix(const std::vector<std::pair<std::string, double>>& mix,
                        const std::map<std::string, BucketYield>& yields, long want, long& count) {
  // A bucket's yield is (kept + 1) / (drawn + 2), the mean of its survival rate under a uniform
  // prior, so a bucket that kept 0 of 1 is not taken for one that keeps none (asked 55 candidates
  // for 1 task); at least 1 in 50, so one that kept 0 of 400 is still asked a bounded number.
  constexpr double kFloor = 0.02;
  // Whole tasks per bucket, as the first round's quotas: a bucket whose share of `want` rounds to
  // none (transformers:1.2 of 8) is not asked for one, so a run that never crawled it can go on.
  auto target = bucket_quotas(mix, want);
  std::vector<std::string> parts;
  count = 0;
  for (auto& [b, p] : mix) {
    auto it = yields.find(b);
    BucketYield y = it == yields.end() ? BucketYield{} : it->second;
    double missing = static_cast<double>(target[b] - y.kept);
    if (missing <= 0) continue;
    double yield = y.drawn > 0 ? std::max(kFloor, static_cast<double>(y.kept + 1) / static_cast<double>(y.drawn + 2))
                               : 1.0;
    long n = static_cast<long>(std::ceil(missing / yield * 1.1 - 1e-9));  // 1.1 is not exact in binary
    parts.push_back(fmt::format("{}:{}", b, n));
    count += n;
  }
  return fmt::format("{}", fmt::join(parts, ","));
}

void migrate(Db& db) {
  tasks::migrate(db);
  db.migrate("composer", {R"sql(
CREATE TABLE compose_failures (
  backend     TEXT NOT NULL,
  rng_seed    INTEGER NOT NULL,
  idx         INTEGER NOT NULL,
  bucket      TEXT,
  reason      TEXT NOT NULL,   -- no_compatible_op, duplicate, no_code_block, http_429, ...
  detail      TEXT,
  created_at  TEXT NOT NULL DEFAULT (datetime('now')),
  PRIMARY KEY (backend, rng_seed, idx)
);
)sql"});
}

namespace {

json load_seeds(Db& db) {
  json seeds = json::array();
  if (!db.has_table("seeds")) return seeds;  // never crawled
  auto st = db.prepare(
      "SELECT id, name, source, category, spec, outputs, inputs, probe_ms, code FROM seeds "
      "WHERE status = 'runnable' ORDER BY name");
  while (st.step()) {
    seeds.push_back({{"id", st.text(0)},
                     {"name", st.text(1)},
                     {"source", st.text(2)},
                     {"category", st.text(3)},
                     {"spec", st.is_null(4) ? json(nullptr) : json::parse(st.text(4))},
                     {"outputs", json::parse(st.text(5))},
                     {"inputs", json::parse(st.text(6))},
                     {"probe_ms", st.real(7)},
                     {"code", st.text(8)}});
  }
  return seeds;
}

// The indices of (backend ?1, rng seed ?2) already committed, each as a task or a failure: i.
constexpr const char* kCommitted =
    "SELECT json_extract(provenance, '$.index') AS i FROM tasks WHERE backend = ?1 AND json_extract(provenance, "
    "'$.rng_seed') = ?2 UNION ALL SELECT idx FROM compose_failures WHERE backend = ?1 AND rng_seed = ?2";

long next_index(Db& db, const std::string& backend, std::uint64_t seed) {
  auto st = db.prepare(fmt::format("SELECT max(i) FROM ({})", kCommitted));
  st.bind(1, backend).bind(2, static_cast<std::int64_t>(seed));
  return st.step() && !st.is_null(0) ? st.int64(0) + 1 : 0;
}

void record_failure(Db& db, const std::string& backend, std::uint64_t seed, long idx, const std::string& bucket,
                    const std::string& reason, const std::string& detail) {
  db.transaction([&] {
    db.prepare(
          "INSERT OR REPLACE INTO compose_failures(backend, rng_seed, idx, bucket, reason, detail) VALUES(?, ?, ?, "
          "?, ?, ?)")
        .bind(1, backend)
        .bind(2, static_cast<std::int64_t>(seed))
        .bind(3, static_cast<std::int64_t>(idx))
        .bind(4, bucket)
        .bind(5, reason)
        .bind(6, detail)
        .run();
  });
}

json torch_sizes() {
  std::ifstream f(data_dir() / "crawl" / "torch.json");
  OPFORGE_CHECK(f.good(), "cannot read {}", (data_dir() / "crawl" / "torch.json").string());
  return json::parse(f)["sizes"];
}

// A bucket named after a source that this run is to fill needs runnable seeds of that source:
// said before composing, not after eight barren rounds. (A bucket whose quota rounds to 0, such
// as transformers:1.2 of 6 candidates, needs none.)
void check_module_buckets(const std::map<std::string, long>& quota, const json& seeds, const Workspace& ws) {
  for (auto& [bucket, n] : quota) {
    if (std::isdigit(static_cast<unsigned char>(bucket[0])) || n == 0) continue;
    bool any = std::any_of(seeds.begin(), seeds.end(), [&](const json& s) { return s["source"] == bucket; });
    OPFORGE_CHECK(any, "--mix names the bucket '{}' but {} has no runnable seed of source '{}': crawl it (`opforge "
                  "crawl --sources ...,{}`, or `--add DIR` for source local) or drop it from the mix", bucket,
                  ws.root().string(), bucket, bucket);
  }
}

// The arguments every block request of an offline backend carries; the graph backend adds its
// real-model table and the cost model's device and shares.
json backend_args(const ComposeOptions& opts, const json& seeds, const json& mix_json) {
  json args = {{"seeds", seeds},         {"sizes", torch_sizes()}, {"seed", opts.seed},
               {"mix", mix_json},        {"target_ms", opts.target_ms}, {"seeds_key", xxh3_hex(seeds.dump())}};
  if (opts.backend == "graph") {
    std::filesystem::path stats = opts.stats.empty() ? data_dir() / "real_models" / "stats.json" : std::filesystem::path(opts.stats);
    OPFORGE_CHECK(std::filesystem::is_regular_file(stats), "the graph backend needs the real-model table {}: "
                  "regenerate it with `opforge model-stats` or pass --stats FILE", stats.string());
    args.update({{"stats_path", stats.string()}, {"device", opts.device}, {"anchor_share", opts.anchor_share},
                 {"exotic_share", opts.exotic_share}, {"edge_smoothing", opts.edge_smoothing}});
  }
  return args;
}

struct OfflineRun {
  Db& db;
  const ComposeOptions& opts;
  std::map<std::string, long> quota, added_in;
  ComposeSummary sum;

  void fail(long i, const std::string& bucket, const std::string& reason, const std::string& detail) {
    record_failure(db, opts.backend, opts.seed, i, bucket, reason, detail);
  }

  // One candidate record of a block, in index order: a task, or a failure with its reason.
  void commit(const json& rec, Progress& progress) {
    long i = rec["index"];
    if (!rec.contains("bucket")) {  // an index that killed its worker (replay_block)
      fail(i, "", rec["reason"], rec["message"]);
      ++sum.failed;
      ++sum.failures[rec["reason"].get<std::string>()];
      return;
    }
    std::string bucket = rec["bucket"];
    // No quotas in a sharded run: they would need the other shards' tasks.
    if (!opts.shard && added_in[bucket] >= quota[bucket])
      return fail(i, bucket, "over_quota", "bucket already full in this run");
    if (!rec.value("ok", false)) {
      fail(i, bucket, rec.value("reason", "unknown"), rec.value("message", ""));
      ++sum.failed;
      ++sum.failures[rec.value("reason", "unknown")];
      return;
    }
    tasks::NewTask t;
    t.id = xxh3_hex(rec["normalized"].get<std::string>());
    t.code = rec["code"];
    t.source = rec["source"];
    t.backend = opts.backend;
    t.num_ops = rec["num_ops"];
    t.ops = rec["ops"];
    t.seed_ids = rec["seed_ids"];
    t.provenance = {{"backend", opts.backend},    {"rng_seed", opts.seed},   {"index", i},
                    {"bucket", bucket},           {"free_sizes", rec["free_sizes"]},
                    {"estimated_ms", rec["estimated_ms"]}, {"batch_size", rec["batch_size"]},
                    {"target_ms", opts.target_ms}, {"seed_names", rec["ops"]}};
    if (opts.backend == "graph") t.provenance["device"] = opts.device;
    bool added = false;
    db.transaction([&] { added = tasks::insert(db, t); });
    if (!added) {
      fail(i, bucket, "duplicate", "same normalised code as task " + t.id);
      ++sum.duplicates;
      return;
    }
    ++sum.added;
    ++sum.by_bucket[bucket];
    ++added_in[bucket];
    progress.tick(1, fmt::format("{} failed, {} duplicates", sum.failed, sum.duplicates));
  }
};

// A block whose worker died (a seed op that segfaults, hangs or eats memory inside the composer)
// is composed again one index per request, skipping the indices that killed a worker: each of
// those becomes a failure with the pool's reason, the rest of the block is composed as before.
void replay_block(WorkerPool& pool, const json& request, std::vector<json>& records) {
  const json& a = request["args"];
  long first = a["start"], end = a.contains("end") ? a["end"].get<long>() : a["block"][1].get<long>();
  json crashed = json::array();
  for (long i = first; i < end; ++i) {
    json req = request;
    req["args"].update({{"start", i}, {"end", i + 1}, {"crashed", crashed}});
    WorkerResult r = pool.call(req);
    if (r.outcome == Outcome::ok && r.reply.value("ok", false)) {
      for (auto& rec : r.reply["result"]) records.push_back(std::move(rec));
      continue;
    }
    OPFORGE_CHECK(r.outcome != Outcome::ok, "the composer failed: {}: {}\n{}", r.reply.value("error", ""),
                  r.reply.value("message", ""), r.reply.value("traceback", ""));
    spdlog::warn("compose: index {} killed its worker ({}: {}); recorded, the block goes on", i, outcome_name(r.outcome),
                 r.reason);
    crashed.push_back(i);
    records.push_back({{"index", i}, {"ok", false}, {"reason", outcome_name(r.outcome)}, {"message", r.reason}});
  }
}

// What every offline run needs: the seeds (checked against the mix) and each block request's
// arguments.
json offline_args(Workspace& ws, const ComposeOptions& opts, const std::vector<std::pair<std::string, double>>& mix,
                  const std::map<std::string, long>& quota) {
  json seeds = load_seeds(ws.db());
  OPFORGE_CHECK(!seeds.empty(), "no runnable seeds in {}: run `opforge crawl --workspace {}` first",
                ws.root().string(), ws.root().string());
  json mix_json = json::array();
  for (auto& [b, p] : mix) mix_json.push_back({b, p});
  check_module_buckets(quota, seeds, ws);
  json args = backend_args(opts, seeds, mix_json);
  args["backend"] = opts.backend;
  return args;
}

WorkerPoolOptions offline_pool(Workspace& ws, const ComposeOptions& opts) {
  WorkerPoolOptions popts;
  popts.workers = opts.workers;
  popts.timeout_s = 600;
  popts.log_file = ws.logs_dir() / "workers.log";
  return popts;
}

// One block request: indices start..end-1 of the fixed block [first, first + block_size).
json block_request(const json& args, long first, long start, long end, long block_size) {
  json a = args;
  a.update({{"block", {first, first + block_size}}, {"start", start}});
  if (end < first + block_size) a["end"] = end;
  return {{"op", "compose_offline"}, {"args", std::move(a)}};
}

// Sends the requests (one per worker) and returns their candidate records in index order, so the
// outcome does not depend on which worker finished first.
std::vector<json> run_round(WorkerPool& pool, const std::vector<json>& reqs) {
  std::vector<json> records;
  std::vector<std::size_t> died;
  pool.run(reqs, [&](WorkerResult&& r) {
    if (r.outcome != Outcome::ok) return died.push_back(r.index);
    OPFORGE_CHECK(r.reply.value("ok", false), "the composer failed: {}: {}\n{}", r.reply.value("error", ""),
                  r.reply.value("message", ""), r.reply.value("traceback", ""));
    for (auto& rec : r.reply["result"]) records.push_back(std::move(rec));
  });
  for (std::size_t k : died) replay_block(pool, reqs[k], records);
  std::sort(records.begin(), records.end(),
            [](const json& a, const json& b) { return a["index"].get<long>() < b["index"].get<long>(); });
  return records;
}

// The offline backends (template, graph): rounds of fixed blocks (--block-size, 64), one request
// per worker (python/opforge/compose.py: compose_block), committed in index order until --count
// tasks are added.
ComposeSummary compose_offline(Workspace& ws, const ComposeOptions& opts,
                               const std::vector<std::pair<std::string, double>>& mix) {
  auto quota = bucket_quotas(mix, opts.count);
  json args = offline_args(ws, opts, mix, quota);
  WorkerPool pool(offline_pool(ws, opts));
  OfflineRun run{ws.db(), opts, quota, {}, {}};
  const long block = opts.block_size;
  long idx = next_index(ws.db(), opts.backend, opts.seed);
  spdlog::info("composing {} {} candidates (seed {}, starting at index {}) from {} seeds", opts.count, opts.backend,
               opts.seed, idx, args["seeds"].size());
  Progress progress("compose", static_cast<std::size_t>(opts.count));
  for (int barren_rounds = 0; run.sum.added < opts.count;) {
    std::vector<json> reqs;
    for (int w = 0; w < opts.workers; ++w) {
      long first = (idx / block) * block;
      reqs.push_back(block_request(args, first, idx, first + block, block));
      idx = first + block;
    }
    long added_before = run.sum.added;
    for (auto& rec : run_round(pool, reqs))
      if (run.sum.added < opts.count) run.commit(rec, progress);
    barren_rounds = run.sum.added == added_before ? barren_rounds + 1 : 0;
    OPFORGE_CHECK(barren_rounds < 8,
                  "the {} composer produced no new candidate in 8 rounds (last failures: {}); the seeds may be too "
                  "few for --count {}",
                  opts.backend, json(run.sum.failures).dump(), opts.count);
  }
  progress.finish();
  return run.sum;
}

// The highest index already committed (a task or a failure) in each block of [0, count) that has
// one, by block: one pass over the run's tasks, not one per block.
std::map<long, long> last_committed(Db& db, const ComposeOptions& opts) {
  auto st = db.prepare(fmt::format("SELECT i / ?3, max(i) FROM ({}) WHERE i >= 0 AND i < ?4 GROUP BY 1", kCommitted));
  st.bind(1, opts.backend).bind(2, static_cast<std::int64_t>(opts.seed));
  st.bind(3, static_cast<std::int64_t>(opts.block_size)).bind(4, static_cast<std::int64_t>(opts.count));
  std::map<long, long> last;
  while (st.step()) last[st.int64(0)] = st.int64(1);
  return last;
}

// A fixed-count run's part (--shard I/N): the blocks b % N == I of indices [0, count), each
// resumed after its last committed index (a killed shard started again redoes nothing).
ComposeSummary compose_shard(Workspace& ws, const ComposeOptions& opts,
                             const std::vector<std::pair<std::string, double>>& mix) {
  const Shard shard = *opts.shard;
  const long block = opts.block_size, count = opts.count;
  std::vector<json> todo;  // {first, start, end} of each block left
  long indices = 0;
  auto last = last_committed(ws.db(), opts);
  for (long b = shard.index; b * block < count; b += shard.count) {
    long first = b * block, end = std::min(first + block, count);
    indices += end - first;
    auto it = last.find(b);
    long start = it == last.end() ? first : it->second + 1;
    if (start < end) todo.push_back({first, start, end});
  }
  spdlog::info("compose shard {}/{}: {} of the {} {} indices of seed {} (blocks of {}), {} blocks left",
               shard.index, shard.count, indices, count, opts.backend, opts.seed, block, todo.size());
  OfflineRun run{ws.db(), opts, {}, {}, {}};
  if (todo.empty()) return run.sum;
  json args = offline_args(ws, opts, mix, bucket_quotas(mix, count));
  WorkerPool pool(offline_pool(ws, opts));
  Progress progress("compose", static_cast<std::size_t>(indices));
  for (std::size_t k = 0; k < todo.size();) {
    std::vector<json> reqs;
    for (int w = 0; w < opts.workers && k < todo.size(); ++w, ++k)
      reqs.push_back(block_request(args, todo[k][0], todo[k][1], todo[k][2], block));
    auto records = run_round(pool, reqs);
    long added_before = run.sum.added;
    for (auto& rec : records) run.commit(rec, progress);
    // commit ticks the tasks added; the progress of a shard counts every index it ends
    progress.tick(records.size() - static_cast<std::size_t>(run.sum.added - added_before),
                  fmt::format("{} failed, {} duplicates", run.sum.failed, run.sum.duplicates));
  }
  progress.finish();
  return run.sum;
}

// The runnable torch seeds the llm backend fuses: names and code for the prompt, ids for provenance.
struct LlmSeedPool {
  std::vector<PromptSeed> seeds;
  std::vector<std::string> ids;
};

LlmSeedPool torch_seed_pool(Workspace& ws) {
  LlmSeedPool p;
  for (auto& s : load_seeds(ws.db()))
    if (s["source"] == "torch") {
      p.seeds.push_back({s["name"], s["code"]});
      p.ids.push_back(s["id"]);
    }
  OPFORGE_CHECK(!p.seeds.empty(), "no runnable torch seeds in {}: run `opforge crawl --workspace {}` first",
                ws.root().string(), ws.root().string());
  return p;
}

// Indices whose request failed for a passing reason (rate limit, server error, timeout,
// network) were never answered, so nothing is cached for them: they are asked again first,
// then --count new ones.
std::vector<long> llm_indices(Db& db, const ComposeOptions& opts) {
  std::vector<long> indices;
  auto st = db.prepare(
      "SELECT idx FROM compose_failures WHERE backend = 'llm' AND rng_seed = ? AND (reason IN ('timeout', "
      "'network', 'http_429') OR reason LIKE 'http_5%') ORDER BY idx");
  st.bind(1, static_cast<std::int64_t>(opts.seed));
  while (st.step()) indices.push_back(st.int64(0));
  if (!indices.empty()) spdlog::info("asking again {} requests that failed for a passing reason", indices.size());
  long first = next_index(db, "llm", opts.seed);
  for (long i = first; i < first + opts.count; ++i) indices.push_back(i);
  return indices;
}

struct LlmJob {
  long index;
  std::string bucket;
  std::vector<std::size_t> seeds;  // positions in LlmSeedPool
  ComposePrompt prompt;
};

// Index i's bucket and distinct seeds, drawn from (seed, i) alone: the same prompt on every rerun.
LlmJob plan_llm_job(long i, const std::vector<std::pair<std::string, double>>& mix, double total,
                    const LlmSeedPool& pool, std::uint64_t seed) {
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ULL + static_cast<std::uint64_t>(i));
  double u = std::uniform_real_distribution<double>(0, total)(rng), acc = 0;
  std::string bucket = mix.back().first;
  for (auto& [b, p] : mix)
    if ((acc += p) > u) {
      bucket = b;
      break;
    }
  LlmJob job{i, bucket, {}, {}};
  std::vector<PromptSeed> picked;
  int k_ops = std::min<int>(std::stoi(bucket), static_cast<int>(pool.seeds.size()));
  while (static_cast<int>(job.seeds.size()) < k_ops) {  // distinct ops: the prompt says each once
    std::size_t s = std::uniform_int_distribution<std::size_t>(0, pool.seeds.size() - 1)(rng);
    if (std::find(job.seeds.begin(), job.seeds.end(), s) != job.seeds.end()) continue;
    job.seeds.push_back(s);
    picked.push_back(pool.seeds[s]);
  }
  job.prompt = build_compose_prompt(picked);
  return job;
}

// One answer into the workspace: a new task, or a compose failure with its reason.
void commit_llm_answer(Db& db, WorkerPool& normalizer, const LlmJob& job, const LlmResponse& r,
                       const LlmSeedPool& pool, const ComposeOptions& opts, ComposeSummary& sum) {
  auto fail = [&](const std::string& reason, const std::string& detail) {
    record_failure(db, "llm", opts.seed, job.index, job.bucket, reason, detail);
    ++sum.failed;
    ++sum.failures[reason];
  };
  if (!r.ok) return fail(r.reason, r.detail);
  if (r.finish_reason == "length") return fail("truncated", r.content.substr(0, 2000));  // half a program
  ExtractedCode code = extract_model_code(r.content);
  if (!code.ok) return fail(code.reason, r.content.substr(0, 2000));
  WorkerResult nr = normalizer.call({{"op", "normalize"}, {"args", {{"codes", {code.code}}}}});
  OPFORGE_CHECK(nr.outcome == Outcome::ok && nr.reply.value("ok", false), "normalising an answer failed: {}",
                nr.reason);
  tasks::NewTask t;
  t.id = xxh3_hex(nr.reply["result"][0].get<std::string>());
  t.code = code.code;
  t.source = "torch";
  t.backend = "llm";
  t.num_ops = std::stoi(job.bucket);
  json names = json::array(), ids = json::array();
  for (auto s : job.seeds) {
    names.push_back(pool.seeds[s].name);
    ids.push_back(pool.ids[s]);
  }
  t.ops = names;
  t.seed_ids = ids;
  t.provenance = {{"backend", "llm"},          {"rng_seed", opts.seed},          {"index", job.index},
                  {"bucket", job.bucket},      {"model", opts.llm_model},        {"prompt_hash", job.prompt.hash},
                  {"prompt_tokens", r.prompt_tokens}, {"completion_tokens", r.completion_tokens},
                  {"finish_reason", r.finish_reason}, {"seed_names", names}};
  bool added = false;
  db.transaction([&] { added = tasks::insert(db, t); });
  if (!added) {
    record_failure(db, "llm", opts.seed, job.index, job.bucket, "duplicate", "same normalised code as task " + t.id);
    ++sum.duplicates;
    return;
  }
  ++sum.added;
  ++sum.by_bucket[job.bucket];
}

// The llm backend: one prompt per index, built from 1-5 sampled torch seeds; answers are cached
// in the workspace, so a resumed or repeated run spends no tokens twice.
ComposeSummary compose_llm(Workspace& ws, const ComposeOptions& opts,
                           std::vector<std::pair<std::string, double>> mix) {
  Db& db = ws.db();
  ComposeSummary sum;
  // Whole-module sources enter only as single-module tasks (offline backends); the LLM fuses torch ops.
  std::erase_if(mix, [](auto& b) { return !std::isdigit(static_cast<unsigned char>(b.first[0])); });
  OPFORGE_CHECK(!mix.empty(), "the llm backend composes torch ops: --mix has no bucket 1-5");
  double total = 0;
  for (auto& [b, p] : mix) total += p;
  const LlmSeedPool pool = torch_seed_pool(ws);

  LlmOptions lo;
  lo.url = opts.llm_url;
  lo.model = opts.llm_model;
  lo.key_env = opts.llm_key_env;
  lo.concurrency = opts.llm_concurrency;
  lo.timeout_s = opts.llm_timeout_s;
  LlmClient client(lo, &db);

  std::vector<LlmJob> jobs;
  std::vector<LlmRequest> reqs;
  for (long i : llm_indices(db, opts)) {
    jobs.push_back(plan_llm_job(i, mix, total, pool, opts.seed));
    reqs.push_back({jobs.back().prompt.prompt, jobs.back().prompt.system, static_cast<int>(i)});
  }
  spdlog::info("asking {} ({}) for {} candidates, {} in flight", opts.llm_model, opts.llm_url, reqs.size(),
               opts.llm_concurrency);

  // Answers are checked and normalised in a worker (ast, the one normal form of the project).
  WorkerPoolOptions popts;
  popts.workers = 1;
  popts.log_file = ws.logs_dir() / "workers.log";
  WorkerPool normalizer(popts);
  Progress progress("llm", reqs.size());
  std::vector<LlmResponse> answers(reqs.size());
  client.complete(reqs, [&](std::size_t k, const LlmResponse& r) {
    answers[k] = r;
    // Tokens spent by this run: a cached answer cost nothing now.
    if (!r.from_cache) {
      sum.prompt_tokens += r.prompt_tokens;
      sum.completion_tokens += r.completion_tokens;
    }
    sum.cached += r.from_cache;
    progress.tick(1, fmt::format("{} prompt + {} completion tokens", sum.prompt_tokens, sum.completion_tokens));
  });
  progress.finish();

  // Commit in index order: deterministic given the same answers.
  for (std::size_t k = 0; k < jobs.size(); ++k) commit_llm_answer(db, normalizer, jobs[k], answers[k], pool, opts, sum);
  return sum;
}

// What a shard's candidates depend on: the marker of a finished shard holds them, and a rerun
// with the same ones has nothing to do.
json shard_arguments(const ComposeOptions& o) {
  json a = {{"backend", o.backend},         {"seed", o.seed},         {"count", o.count},
            {"block_size", o.block_size},   {"mix", o.mix},           {"max_ops", o.max_ops},
            {"target_ms", o.target_ms},     {"shard", {o.shard->index, o.shard->count}}};
  if (o.backend == "graph")
    a.update({{"device", o.device}, {"stats", o.stats}, {"anchor_share", o.anchor_share},
              {"exotic_share", o.exotic_share}, {"edge_smoothing", o.edge_smoothing}});
  return a;
}

bool marker_says_done(const std::filesystem::path& marker, const json& args) {
  if (!std::filesystem::exists(marker)) return false;
  try {
    return json::parse(read_text(marker)).at("arguments") == args;
  } catch (const std::exception& e) {  // a torn or foreign file: compose (resuming) and rewrite it
    spdlog::warn("ignoring unreadable marker {}: {}", marker.string(), e.what());
    return false;
  }
}

// Written whole or not at all (write_text_atomic), as the filter's marker.
void write_marker(const std::filesystem::path& marker, const json& args, const ComposeSummary& s) {
  json m = {{"stage", "compose"},
            {"arguments", args},
            {"summary", {{"added", s.added}, {"failed", s.failed}, {"duplicates", s.duplicates},
                         {"by_bucket", s.by_bucket}, {"failures", s.failures}}},
            {"finished_at", std::chrono::duration_cast<std::chrono::seconds>(
                                std::chrono::system_clock::now().time_since_epoch()).count()}};
  with_context(fmt::format("while writing the marker {}", marker.string()),
               [&] { write_text_atomic(marker, m.dump(2) + "\n"); });
}

ComposeSummary compose_sharded(Workspace& ws, const ComposeOptions& opts,
                               const std::vector<std::pair<std::string, double>>& mix) {
  OPFORGE_CHECK(opts.backend != "llm", "--shard is for the offline backends (graph, template, registered ones): the "
                "llm backend's answers are not reproducible, so its shards could not be checked against one run");
  json args = shard_arguments(opts);
  auto marker = shard_marker(ws, *opts.shard);
  if (marker_says_done(marker, args)) {
    ComposeSummary done;
    done.already_done = true;
    return done;
  }
  ComposeSummary sum = compose_shard(ws, opts, mix);
  write_marker(marker, args, sum);
  return sum;
}

}  // namespace

std::filesystem::path shard_marker(const Workspace& ws, Shard shard) {
  return opforge::shard_marker(ws.root(), "compose", shard);
}

ComposeSummary compose(Workspace& ws, const ComposeOptions& opts) {
  auto t0 = std::chrono::steady_clock::now();
  OPFORGE_CHECK(opts.count >= 1, "--count must be at least 1");
  OPFORGE_CHECK(opts.block_size >= 1, "--block-size must be at least 1 (got {})", opts.block_size);
  auto mix = parse_mix(opts.mix, opts.max_ops);
  migrate(ws.db());
  ComposeSummary sum;
  if (opts.shard) {
    sum = compose_sharded(ws, opts, mix);
  } else if (opts.backend == "llm") {
    OPFORGE_CHECK(!opts.llm_url.empty() && !opts.llm_model.empty(),
                  "--backend llm needs --llm-url (an OpenAI-compatible endpoint) and --llm-model");
    sum = compose_llm(ws, opts, mix);
  } else {
    // graph, template, or a backend registered in Python (python/opforge/composers.py), which
    // names the registered ones when this one is unknown.
    sum = compose_offline(ws, opts, mix);
  }
  sum.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return sum;
}

json status(Db& db) {
  migrate(db);
  json out = {{"total", tasks::count(db)}, {"by_backend", json::object()}, {"by_num_ops", json::object()},
              {"failures", json::object()}};
  auto st = db.prepare("SELECT backend, source, num_ops, count(*) FROM tasks GROUP BY backend, source, num_ops");
  while (st.step()) {
    std::string backend = st.text(0);
    std::string key = st.text(1) + "#" + std::to_string(st.int64(2));
    out["by_backend"][backend] = out["by_backend"].value(backend, 0L) + st.int64(3);
    out["by_num_ops"][key] = out["by_num_ops"].value(key, 0L) + st.int64(3);
  }
  auto fs = db.prepare("SELECT backend, reason, count(*) FROM compose_failures GROUP BY backend, reason");
  while (fs.step()) out["failures"][fs.text(0)][fs.text(1)] = fs.int64(2);
  return out;
}

}  // namespace opforge::composer
