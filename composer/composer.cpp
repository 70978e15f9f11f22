#include "composer.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>

#include "opforge/core/error.h"
#include "opforge/core/hash.h"
#include "opforge/core/paths.h"
#include "opforge/core/progress.h"
#include "opforge/core/tasks.h"
#include "opforge/core/worker_pool.h"

namespace opforge::composer {

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
    OPFORGE_CHECK(torch_bucket || bucket == "transformers",
                  "bad --mix bucket '{}': use 1-5 (ops fused from torch) or transformers", bucket);
    OPFORGE_CHECK(p >= 0, "bad --mix entry '{}': negative percent", part);
    if (torch_bucket && bucket[0] - '0' > max_ops) continue;
    out.emplace_back(bucket, p);
    total += p;
  }
  OPFORGE_CHECK(total > 0, "--mix '{}' leaves nothing to compose with --max-ops {}", spec, max_ops);
  for (auto& [b, p] : out) p /= total;
  return out;
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
  auto has = db.prepare("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'seeds'");
  if (!has.step() || has.int64(0) == 0) return seeds;  // never crawled
  auto st = db.prepare(
      "SELECT id, name, source, category, spec, outputs, inputs, probe_ms, code FROM seeds "
      "WHERE status = 'runnable' AND source IN ('torch', 'transformers') ORDER BY name");
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

long next_index(Db& db, const std::string& backend, std::uint64_t seed) {
  auto st = db.prepare(
      "SELECT max(i) FROM (SELECT json_extract(provenance, '$.index') AS i FROM tasks WHERE backend = ?1 AND "
      "json_extract(provenance, '$.rng_seed') = ?2 UNION ALL SELECT idx FROM compose_failures WHERE backend = ?1 "
      "AND rng_seed = ?2)");
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

ComposeSummary compose_template(Workspace& ws, const ComposeOptions& opts,
                                const std::vector<std::pair<std::string, double>>& mix) {
  Db& db = ws.db();
  ComposeSummary sum;
  json seeds = load_seeds(db);
  OPFORGE_CHECK(!seeds.empty(), "no runnable seeds in {}: run `opforge crawl --workspace {}` first",
                ws.root().string(), ws.root().string());
  std::string seeds_key = xxh3_hex(seeds.dump());
  json sizes = torch_sizes();
  json mix_json = json::array();
  for (auto& [b, p] : mix) mix_json.push_back({b, p});

  WorkerPoolOptions popts;
  popts.workers = opts.workers;
  popts.timeout_s = 600;
  popts.log_file = ws.logs_dir() / "workers.log";
  WorkerPool pool(popts);

  // Per-bucket quotas of this run (largest remainder), so the mix holds over the tasks actually
  // added even where one bucket loses more candidates to duplicates than another.
  std::map<std::string, long> quota, added_in;
  {
    long given = 0;
    std::vector<std::pair<double, std::string>> rem;
    for (auto& [b, p] : mix) {
      double exact = p * opts.count;
      quota[b] = static_cast<long>(exact);
      given += quota[b];
      rem.emplace_back(exact - quota[b], b);
    }
    std::sort(rem.begin(), rem.end(), [](auto& a, auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
    for (std::size_t i = 0; given < opts.count; ++i, ++given) quota[rem[i % rem.size()].second]++;
  }
  long idx = next_index(db, "template", opts.seed);
  spdlog::info("composing {} template candidates (seed {}, starting at index {}) from {} seeds", opts.count,
               opts.seed, idx, seeds.size());
  Progress progress("compose", static_cast<std::size_t>(opts.count));
  int barren_rounds = 0;
  while (sum.added < opts.count) {
    // One round: `workers` fixed blocks of indices, one request each (see compose.py).
    constexpr long kBlock = 64;
    std::vector<json> reqs;
    long round_start = idx;
    for (int w = 0; w < opts.workers; ++w) {
      long block_start = (idx / kBlock) * kBlock;
      reqs.push_back({{"op", "compose_template"},
                      {"args",
                       {{"seeds", seeds},
                        {"sizes", sizes},
                        {"seed", opts.seed},
                        {"block", {block_start, block_start + kBlock}},
                        {"start", idx},
                        {"mix", mix_json},
                        {"target_ms", opts.target_ms},
                        {"seeds_key", seeds_key}}}});
      idx = block_start + kBlock;
    }
    (void)round_start;
    std::vector<json> records;
    pool.run(reqs, [&](WorkerResult&& r) {
      OPFORGE_CHECK(r.outcome == Outcome::ok, "a composer worker failed: {} {}\n{}", outcome_name(r.outcome),
                    r.reason, r.log_tail);
      OPFORGE_CHECK(r.reply.value("ok", false), "the composer failed: {}: {}\n{}", r.reply.value("error", ""),
                    r.reply.value("message", ""), r.reply.value("traceback", ""));
      for (auto& rec : r.reply["result"]) records.push_back(std::move(rec));
    });
    // Commit in index order so the outcome does not depend on which worker finished first.
    std::sort(records.begin(), records.end(),
              [](const json& a, const json& b) { return a["index"].get<long>() < b["index"].get<long>(); });
    long added_before = sum.added;
    for (auto& rec : records) {
      if (sum.added >= opts.count) break;
      long i = rec["index"];
      std::string bucket = rec["bucket"];
      if (added_in[bucket] >= quota[bucket]) {
        record_failure(db, "template", opts.seed, i, bucket, "over_quota", "bucket already full in this run");
        continue;
      }
      if (!rec.value("ok", false)) {
        record_failure(db, "template", opts.seed, i, bucket, rec.value("reason", "unknown"), rec.value("message", ""));
        ++sum.failed;
        ++sum.failures[rec.value("reason", "unknown")];
        continue;
      }
      tasks::NewTask t;
      t.id = xxh3_hex(rec["normalized"].get<std::string>());
      t.code = rec["code"];
      t.source = rec["source"];
      t.backend = "template";
      t.num_ops = rec["num_ops"];
      t.ops = rec["ops"];
      t.seed_ids = rec["seed_ids"];
      t.provenance = {{"backend", "template"},      {"rng_seed", opts.seed},
                      {"index", i},                 {"bucket", bucket},
                      {"free_sizes", rec["free_sizes"]}, {"estimated_ms", rec["estimated_ms"]},
                      {"batch_size", rec["batch_size"]}, {"target_ms", opts.target_ms},
                      {"seed_names", rec["ops"]}};
      bool added = false;
      db.transaction([&] { added = tasks::insert(db, t); });
      if (!added) {
        record_failure(db, "template", opts.seed, i, bucket, "duplicate", "same normalised code as task " + t.id);
        ++sum.duplicates;
        continue;
      }
      ++sum.added;
      ++sum.by_bucket[bucket];
      ++added_in[bucket];
      progress.tick(1, fmt::format("{} failed, {} duplicates", sum.failed, sum.duplicates));
    }
    barren_rounds = sum.added == added_before ? barren_rounds + 1 : 0;
    OPFORGE_CHECK(barren_rounds < 8,
                  "the template composer produced no new candidate in 8 rounds (last failures: {}); the seeds may "
                  "be too few for --count {}",
                  json(sum.failures).dump(), opts.count);
  }
  progress.finish();
  return sum;
}

}  // namespace

ComposeSummary compose(Workspace& ws, const ComposeOptions& opts) {
  auto t0 = std::chrono::steady_clock::now();
  OPFORGE_CHECK(opts.count >= 1, "--count must be at least 1");
  auto mix = parse_mix(opts.mix, opts.max_ops);
  migrate(ws.db());
  ComposeSummary sum;
  if (opts.backend == "template") {
    sum = compose_template(ws, opts, mix);
  } else {
    throw Error(fmt::format("unknown --backend '{}': use template or llm", opts.backend));
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
