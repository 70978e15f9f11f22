#include "crawler.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <map>
#include <set>

#include "opforge/core/error.h"
#include "opforge/core/hash.h"
#include "opforge/core/paths.h"
#include "opforge/core/progress.h"
#include "opforge/core/worker_pool.h"

namespace opforge::crawler {

using nlohmann::json;

void migrate(Db& db) {
  db.migrate("crawler", {
                            R"sql(
CREATE TABLE seeds (
  name        TEXT PRIMARY KEY,   -- qualified operator name: torch.nn.Conv2d, torch.cumsum, transformers.models....
  id          TEXT UNIQUE,        -- xxh3 of the normalised code, once runnable
  source      TEXT NOT NULL,      -- torch | transformers | local
  category    TEXT NOT NULL,
  status      TEXT NOT NULL CHECK (status IN ('pending', 'runnable', 'skipped')),
  reason      TEXT,               -- why skipped: a fixed code (docs/reasons.md)
  detail      TEXT,               -- the error text or rule that decided it
  candidates  TEXT NOT NULL DEFAULT '[]',  -- JSON list of candidate codes, first that runs wins
  code        TEXT,               -- the runnable seed task
  ops         TEXT,               -- JSON list, traced from running the code
  inputs      TEXT,               -- JSON: shapes and dtypes
  outputs     TEXT,
  probe_ms    REAL,
  device      TEXT,
  versions    TEXT,               -- JSON: python, torch, transformers
  path        TEXT,               -- for local seeds: the file
  crawled_at  TEXT NOT NULL DEFAULT (datetime('now')),
  probed_at   TEXT
);
CREATE INDEX seeds_status ON seeds(status, source);
)sql",
                            // v2: how each candidate is reused as one line of a composed forward.
                            R"sql(
ALTER TABLE seeds ADD COLUMN specs TEXT NOT NULL DEFAULT '[]';  -- JSON list parallel to candidates
ALTER TABLE seeds ADD COLUMN spec TEXT;                         -- the runnable candidate's spec
)sql",
                        });
}

namespace {

void record_failure(Db& db, const std::string& name, const std::string& reason, const std::string& detail) {
  db.transaction([&] {
    db.prepare("UPDATE seeds SET status = 'skipped', reason = ?, detail = ?, probed_at = datetime('now') WHERE name = ?")
        .bind(1, reason)
        .bind(2, detail)
        .bind(3, name)
        .run();
  });
}

// What the worker enumerated, and the versions (python, torch, transformers) it enumerated with.
struct Enumeration {
  json items;
  std::string versions;
};

// Deterministic: same torch/transformers, same rules -> same items.
Enumeration enumerate(WorkerPool& pool, const CrawlOptions& opts) {
  json files = json::array();
  for (auto& f : opts.files) {
    OPFORGE_CHECK(std::filesystem::exists(f), "seed path {} does not exist (given with --add)", f.string());
    files.push_back(std::filesystem::absolute(f).string());
  }
  json req = {{"op", "enumerate"},
              {"timeout_s", 900},
              {"args",
               {{"data_dir", data_dir().string()},
                {"sources", opts.sources},
                {"files", files},
                {"match", opts.match.empty() ? json(nullptr) : json(opts.match)},
                {"limit", opts.limit}}}};
  spdlog::info("enumerating operators of {}", opts.sources.empty() ? "no library" : fmt::format("{}", fmt::join(opts.sources, ", ")));
  WorkerResult er = pool.call(req);
  OPFORGE_CHECK(er.outcome == Outcome::ok, "enumeration failed in the worker: {} {}\n{}", outcome_name(er.outcome),
                er.reason, er.log_tail);
  OPFORGE_CHECK(er.reply.value("ok", false), "enumeration failed: {}: {}\n{}", er.reply.value("error", ""),
                er.reply.value("message", ""), er.reply.value("traceback", ""));
  const json& info = pool.worker_info();
  return {er.reply["result"], json{{"python", info.value("python", "")},
                                   {"torch", info.value("torch", "")},
                                   {"transformers", info.value("transformers", json(nullptr))}}
                                  .dump()};
}

// Every enumerated item gets a row; existing rows are left as they are (a re-run adds nothing).
// Returns the names enumerated, which bound what this run probes.
std::set<std::string> record_items(Db& db, const Enumeration& en, CrawlSummary& sum) {
  std::set<std::string> names;
  db.transaction([&] {
    auto ins = db.prepare(
        "INSERT INTO seeds(name, source, category, status, reason, detail, candidates, path, versions, specs) "
        "VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(name) DO NOTHING");
    // Rows crawled before schema v2 get their specs (same enumeration, same candidates).
    auto fill_specs = db.prepare("UPDATE seeds SET specs = ? WHERE name = ? AND specs = '[]' AND candidates = ?");
    for (const auto& it : en.items) {
      std::string name = it.at("name");
      names.insert(name);
      bool skip = it.contains("skip");
      std::string candidates = it.value("candidates", json::array()).dump();
      std::string specs = it.value("specs", json::array()).dump();
      ins.reset();
      ins.bind(1, name)
          .bind(2, it.at("source").get<std::string>())
          .bind(3, it.at("category").get<std::string>())
          .bind(4, skip ? "skipped" : "pending");
      if (skip) ins.bind(5, it["skip"].get<std::string>()).bind(6, it.value("detail", ""));
      else ins.bind_null(5).bind_null(6);
      ins.bind(7, candidates);
      if (it.contains("path")) ins.bind(8, it["path"].get<std::string>());
      else ins.bind_null(8);
      ins.bind(9, en.versions).bind(10, specs).run();
      auto added = static_cast<std::size_t>(sqlite3_changes(db.raw()));
      sum.added += added;
      if (!added && !skip) {
        fill_specs.reset();
        fill_specs.bind(1, specs).bind(2, name).bind(3, candidates).run();
      }
    }
  });
  return names;
}

// Runnable rows of a v1 workspace: their spec is the one of the candidate that is their code.
void backfill_specs(Db& db) {
  db.transaction([&] {
    auto st = db.prepare(
        "SELECT name, candidates, specs, code FROM seeds WHERE status = 'runnable' AND spec IS NULL AND specs != '[]'");
    auto set = db.prepare("UPDATE seeds SET spec = ? WHERE name = ?");
    while (st.step()) {
      json cands = json::parse(st.text(1)), specs = json::parse(st.text(2));
      for (std::size_t i = 0; i < cands.size() && i < specs.size(); ++i)
        if (cands[i] == st.text(3)) {
          set.reset();
          set.bind(1, specs[i].dump()).bind(2, st.text(0)).run();
        }
    }
  });
}

// --retry-failed: failures the environment may have caused go back to pending; verdicts on the
// seed itself (no candidate, unsupported, duplicate) stay.
void reopen_failures(Db& db) {
  db.transaction([&] {
    db.exec("UPDATE seeds SET status = 'pending', reason = NULL, detail = NULL WHERE status = 'skipped' AND "
            "candidates != '[]' AND reason IN ('timeout', 'worker_crash', 'out_of_memory', 'probe_error', "
            "'forward_error', 'init_error', 'load_error', 'import_error', 'input_error', 'no_tensor_output')");
  });
}

// The seeds without a verdict that this run enumerated, as probe requests.
struct Probes {
  std::vector<std::string> names;
  std::vector<json> requests;
  std::vector<json> specs;  // per seed, parallel to its candidates
};

Probes pending_probes(Db& db, const std::set<std::string>& enumerated, const std::string& device) {
  Probes p;
  auto st = db.prepare("SELECT name, candidates, specs FROM seeds WHERE status = 'pending' ORDER BY name");
  while (st.step()) {
    std::string name = st.text(0);
    if (!enumerated.count(name)) continue;  // outside this run's --match/--limit/--sources
    p.names.push_back(name);
    p.specs.push_back(json::parse(st.text(2)));
    p.requests.push_back({{"op", "probe"}, {"args", {{"candidates", json::parse(st.text(1))}, {"device", device}}}});
  }
  return p;
}

// One probe's result into its row: runnable with its code, ops and shapes, or skipped with the reason.
class ProbeRecorder {
 public:
  ProbeRecorder(Db& db, const Probes& probes, const std::string& versions, const std::string& device)
      : db_(db),
        probes_(probes),
        versions_(versions),
        device_(device),
        upd_(db.prepare("UPDATE seeds SET status = 'runnable', id = ?, code = ?, ops = ?, inputs = ?, outputs = ?, "
                        "probe_ms = ?, device = ?, versions = ?, reason = NULL, detail = ?, spec = ?, "
                        "probed_at = datetime('now') WHERE name = ?")),
        dup_(db.prepare("SELECT name FROM seeds WHERE id = ? AND name != ?")) {}

  // True when the seed became runnable.
  bool record(const WorkerResult& r) {
    const std::string& name = probes_.names[r.index];
    if (r.outcome != Outcome::ok) {
      std::string detail = r.reason;
      if (!r.log_tail.empty()) detail += "\n--- worker log tail ---\n" + r.log_tail;
      return fail(name, outcome_name(r.outcome), detail);
    }
    if (!r.reply.value("ok", false))
      return fail(name, "probe_error", r.reply.value("error", "") + ": " + r.reply.value("message", ""));
    const json& res = r.reply["result"];
    if (!res.value("ok", false)) return fail(name, res.value("reason", "probe_error"), res.value("message", ""));
    int cand = res.value("candidate", 0);
    std::string code = probes_.requests[r.index]["args"]["candidates"].at(cand);
    std::string id = xxh3_hex(res.at("normalized").get<std::string>());
    dup_.reset();
    dup_.bind(1, id).bind(2, name);
    if (dup_.step()) return fail(name, "duplicate", "same normalised code as " + dup_.text(0));
    db_.transaction([&] {
      upd_.reset();
      upd_.bind(1, id)
          .bind(2, code)
          .bind(3, res.at("ops").dump())
          .bind(4, res.at("inputs").dump())
          .bind(5, res.at("outputs").dump())
          .bind(6, res.value("probe_ms", 0.0))
          .bind(7, res.value("device", device_))
          .bind(8, versions_)
          .bind(9, res.value("errors", json::array()).empty() ? std::string() : res["errors"].dump())
          .bind(11, name);
      const json& specs = probes_.specs[r.index];
      if (cand < static_cast<int>(specs.size()) && !specs[cand].is_null()) upd_.bind(10, specs[cand].dump());
      else upd_.bind_null(10);
      upd_.run();
    });
    return true;
  }

 private:
  bool fail(const std::string& name, const std::string& reason, const std::string& detail) {
    record_failure(db_, name, reason, detail);
    return false;
  }

  Db& db_;
  const Probes& probes_;
  const std::string& versions_;
  const std::string& device_;
  Stmt upd_, dup_;
};

}  // namespace

CrawlSummary crawl(Workspace& ws, const CrawlOptions& opts) {
  auto t0 = std::chrono::steady_clock::now();
  Db& db = ws.db();
  migrate(db);
  CrawlSummary sum;

  WorkerPoolOptions popts;
  popts.workers = opts.workers;
  popts.timeout_s = opts.timeout_s;
  popts.memory_limit_mb = opts.memory_limit_mb;
  popts.log_file = ws.logs_dir() / "workers.log";
  WorkerPool pool(popts);

  const Enumeration en = enumerate(pool, opts);
  sum.enumerated = en.items.size();
  const std::set<std::string> names = record_items(db, en, sum);
  spdlog::info("{} operators enumerated, {} new", sum.enumerated, sum.added);
  backfill_specs(db);
  if (opts.retry_failed) reopen_failures(db);

  // Probe what has no verdict yet, one transaction per result.
  const Probes probes = pending_probes(db, names, opts.device);
  if (probes.requests.empty()) spdlog::info("nothing to probe");
  else spdlog::info("probing {} seeds on {} with {} workers", probes.requests.size(), opts.device, opts.workers);
  Progress progress("probe", probes.requests.size());
  ProbeRecorder recorder(db, probes, en.versions, opts.device);
  pool.run(probes.requests, [&](WorkerResult&& r) {
    ++sum.probed;
    with_context(fmt::format("while recording the probe of {}", probes.names[r.index]), [&] {
      if (recorder.record(r)) ++sum.runnable;
      else ++sum.failed;
    });
    progress.tick(1, fmt::format("{} runnable, {} failed", sum.runnable, sum.failed));
  });
  progress.finish();
  sum.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return sum;
}

json status(Db& db) {
  migrate(db);
  json out = {{"total", 0}, {"runnable", 0}, {"skipped", 0}, {"pending", 0}, {"by_source", json::object()},
              {"by_category", json::object()}, {"top_skip_reasons", json::array()}};
  auto st = db.prepare("SELECT source, category, status, count(*) FROM seeds GROUP BY source, category, status");
  while (st.step()) {
    std::string source = st.text(0), category = st.text(1), status = st.text(2);
    auto n = st.int64(3);
    for (json* bucket : {&out["by_source"][source], &out["by_category"][source][category]}) {
      if (bucket->is_null()) *bucket = {{"runnable", 0}, {"skipped", 0}, {"pending", 0}};
      (*bucket)[status] = (*bucket)[status].get<std::int64_t>() + n;
    }
    out[status] = out[status].get<std::int64_t>() + n;
    out["total"] = out["total"].get<std::int64_t>() + n;
  }
  auto rs = db.prepare(
      "SELECT source, reason, count(*) AS n FROM seeds WHERE status = 'skipped' GROUP BY source, reason "
      "ORDER BY n DESC, source, reason LIMIT 12");
  while (rs.step()) out["top_skip_reasons"].push_back({{"source", rs.text(0)}, {"reason", rs.text(1)}, {"count", rs.int64(2)}});
  return out;
}

}  // namespace opforge::crawler
