#include "filter.h"

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <ctime>
#include <fmt/chrono.h>
#include <functional>
#include <optional>
#include <thread>
#include <fstream>
#include <regex>
#include <sstream>

#include "opforge/core/gpus.h"
#include "opforge/core/error.h"
#include "opforge/core/files.h"
#include "opforge/core/hash.h"
#include "opforge/core/progress.h"
#include "opforge/core/tasks.h"
#include "opforge/core/worker_pool.h"
#include "leases.h"

namespace opforge::filter {

using nlohmann::json;

void migrate(Db& db) {
  tasks::migrate(db);
  db.migrate("filter", {R"sql(
CREATE TABLE filter_results (
  task_id        TEXT PRIMARY KEY REFERENCES tasks(id),
  verdict        TEXT NOT NULL CHECK (verdict IN ('accepted', 'rejected')),
  reason         TEXT,            -- a fixed code (docs/reasons.md) when rejected
  detail         TEXT,
  metrics        TEXT NOT NULL DEFAULT '{}',  -- eager/compile ms and spread, speed-up, compile wall, peak memory, device
  ops            TEXT,            -- traced from running the task (JSON list)
  code           TEXT,            -- the judged code: calibrated when calibration rescaled it
  calibration    TEXT,            -- JSON list of {size, from, to, eager_ms}
  device         TEXT,
  judged_at      TEXT NOT NULL DEFAULT (datetime('now'))
);
CREATE INDEX filter_results_verdict ON filter_results(verdict, reason);
)sql",
                          // config: the hash of the filter configuration the verdict was made under (NULL:
                          // before it was recorded); history: the verdicts it replaced (--rejudge).
                          R"sql(
ALTER TABLE filter_results ADD COLUMN config TEXT;
ALTER TABLE filter_results ADD COLUMN history TEXT NOT NULL DEFAULT '[]';
CREATE TABLE filter_configs (hash TEXT PRIMARY KEY, config TEXT NOT NULL);  -- what each hash stands for
)sql",
                          // Several filters on one workspace (leases.h), and the twins' key.
                          R"sql(
CREATE TABLE filter_holders (
  holder     TEXT PRIMARY KEY,  -- host/boot id/PID namespace/PID
  host       TEXT NOT NULL,
  boot       TEXT NOT NULL,     -- /proc/sys/kernel/random/boot_id
  pidns      TEXT NOT NULL,
  pid        INTEGER NOT NULL,
  pid_start  TEXT NOT NULL,     -- the process's start time, so a reused PID is not taken for it
  shard      TEXT NOT NULL,
  started_at REAL NOT NULL,     -- unix seconds
  heartbeat  REAL NOT NULL      -- unix seconds, refreshed while the holder runs
);
CREATE TABLE filter_leases (
  task_id   TEXT PRIMARY KEY,   -- being judged by holder
  holder    TEXT NOT NULL,
  leased_at REAL NOT NULL
);
CREATE INDEX filter_leases_holder ON filter_leases(holder);
CREATE TABLE task_keys (
  task_id     TEXT PRIMARY KEY,
  normal_hash TEXT NOT NULL     -- xxh3 of features.py's normal form, as dedup_results.normal_hash
);
CREATE INDEX task_keys_normal ON task_keys(normal_hash, task_id);
)sql"});
}

json config_of(const FilterOptions& o, const std::string& device) {
  // Everything that changes a verdict; not the workers, limits or timeouts, which only decide
  // whether a verdict is reached (and an environment failure is retried alone).
  json c = {{"filter", kFilterVersion}, {"device", device}, {"min_ms", o.min_ms},  {"max_ms", o.max_ms},
            {"calibrate", o.calibrate}, {"rtol", o.rtol},    {"atol", o.atol},      {"trials", o.trials}};
  // The GPU model too: timings (the 1-100 ms window, speed-ups) are the model's, so verdicts of an
  // H200 are stale to a run on an H100 and a release stays one model's (docs/release.md).
  if (device != "cpu") c["gpus"] = gpu_models();
  // Only when some are off, so the hash of the full filter stays what verdicts already carry.
  if (!o.skip_checks.empty()) {
    std::vector<std::string> off = o.skip_checks;
    std::sort(off.begin(), off.end());
    off.erase(std::unique(off.begin(), off.end()), off.end());
    c["skip_checks"] = off;
  }
  if (!o.extra_checks.empty()) {
    std::vector<std::string> on = o.extra_checks;
    std::sort(on.begin(), on.end());
    on.erase(std::unique(on.begin(), on.end()), on.end());
    c["checks"] = on;
  }
  return c;
}

namespace {

struct Job {
  std::string id, code;
  json free_sizes;
};

struct Verdict {
  std::string verdict, reason, detail, code;
  json metrics = json::object(), ops = nullptr, calibration = json::array();
};

// Writes the verdict row; the caller holds the transaction.
void write_verdict(Db& db, const std::string& id, const Verdict& v, const std::string& device,
                   const std::string& config) {
  {
    // The verdict this one replaces (a re-judged task) goes into its history, not away.
    json history = json::array();
    auto old = db.prepare(
        "SELECT history, verdict, reason, config, judged_at FROM filter_results WHERE task_id = ?");
    old.bind(1, id);
    if (old.step()) {
      history = json::parse(old.text(0));
      history.push_back({{"verdict", old.text(1)},
                         {"reason", old.is_null(2) ? json(nullptr) : json(old.text(2))},
                         {"config", old.is_null(3) ? json(nullptr) : json(old.text(3))},
                         {"judged_at", old.text(4)}});
    }
    auto st = db.prepare(
        "INSERT OR REPLACE INTO filter_results(task_id, verdict, reason, detail, metrics, ops, code, calibration, "
        "device, config, history) VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
    st.bind(1, id).bind(2, v.verdict);
    if (v.reason.empty()) st.bind_null(3); else st.bind(3, v.reason);
    st.bind(4, v.detail).bind(5, v.metrics.dump());
    if (v.ops.is_null()) st.bind_null(6); else st.bind(6, v.ops.dump());
    st.bind(7, v.code).bind(8, v.calibration.dump()).bind(9, device).bind(10, config).bind(11, history.dump());
    st.run();
  }
  db.prepare("INSERT OR IGNORE INTO temp.filter_done_here(task_id) VALUES(?)").bind(1, id).run();
}

// One transaction per verdict, which also ends the task's lease.
void record(Db& db, LeaseHolder& leases, const std::string& id, const Verdict& v, const std::string& device,
            const std::string& config) {
  db.transaction([&] {
    write_verdict(db, id, v, device, config);
    leases.release(id);
  });
}

// Which stored rows are to be judged (again) by this run: the SQL condition on a filter_results row
// `f` (NULL: no verdict yet), with ?1 the --rejudge reasons, ?2 --rejudge-stale, ?3 this
// configuration, ?4 whether twins are skipped, ?6 when this run started. A rejection judged again
// may well keep its reason: it is not a job again, for this run (temp.filter_done_here) nor for a
// filter started after it was made. An exact_duplicate whose twin is no longer accepted (rejudged
// since) is judged too.
std::string is_job(const std::string& f) {
  return fmt::format(
      "({0}.task_id IS NULL "
      "OR ({0}.verdict = 'rejected' AND {0}.judged_at <= ?6 "
      "    AND {0}.task_id NOT IN (SELECT task_id FROM temp.filter_done_here) "
      "    AND ({0}.reason IN (SELECT value FROM json_each(?1)) "
      "    OR EXISTS (SELECT 1 FROM json_each(?1) WHERE value = 'all'))) "
      "OR (?2 AND {0}.config IS NOT ?3) "
      "OR (?4 AND {0}.reason = 'exact_duplicate' AND NOT EXISTS (SELECT 1 FROM filter_results a "
      "    WHERE a.task_id = json_extract({0}.metrics, '$.duplicate_of') AND a.verdict = 'accepted')))",
      f);
}

struct Selection {
  json reasons;
  bool stale = false, twins = true;
  std::string config, since;  // since: datetime('now') at the run's start, judged_at's format
  Stmt& bind(Stmt& st) const {
    return st.bind(1, reasons.dump()).bind(2, static_cast<std::int64_t>(stale)).bind(3, config)
        .bind(4, static_cast<std::int64_t>(twins)).bind(6, since);
  }
};

// The shard as a SQL function, opforge_in_shard(task_id), on this connection.
void register_shard(Db& db, Shard shard) {
  auto fn = [](sqlite3_context* ctx, int, sqlite3_value** argv) {
    const auto* s = static_cast<const Shard*>(sqlite3_user_data(ctx));
    const auto* id = reinterpret_cast<const char*>(sqlite3_value_text(argv[0]));
    sqlite3_result_int(ctx, id && in_shard(id, *s) ? 1 : 0);
  };
  int rc = sqlite3_create_function_v2(db.raw(), "opforge_in_shard", 1, SQLITE_UTF8 | SQLITE_DETERMINISTIC,
                                      new Shard(shard), fn, nullptr, nullptr,
                                      [](void* p) { delete static_cast<Shard*>(p); });
  OPFORGE_CHECK(rc == SQLITE_OK, "registering the shard function failed: {}", sqlite3_errmsg(db.raw()));
}

// Tasks of the shard that are to be judged; with_leased: also those another filter holds now.
long count_jobs(Db& db, const Selection& sel, bool with_leased) {
  auto st = db.prepare(fmt::format(
      "SELECT count(*) FROM tasks t LEFT JOIN filter_results f ON f.task_id = t.id WHERE {} AND opforge_in_shard(t.id) "
      "AND (?5 OR NOT EXISTS (SELECT 1 FROM filter_leases l WHERE l.task_id = t.id))",
      is_job("f")));
  sel.bind(st).bind(5, static_cast<std::int64_t>(with_leased));
  st.step();
  return static_cast<long>(st.int64(0));
}

struct Twin {
  std::string id, code, of;  // of: the accepted earlier twin
};

struct Claim {
  std::vector<Job> jobs;     // leased to this process, to judge
  std::vector<Twin> twins;   // recorded exact_duplicate
  long waiting = 0;          // wait for an earlier twin's verdict (counted in full when jobs is empty)
};

// The shard's unleased tasks to judge, in order, each with the accepted earlier twin that makes it a
// duplicate (NULL: none) and whether it waits: an earlier twin has no final verdict yet and is
// being judged (leased), or will be by this shard.
std::string claim_sql() {
  return fmt::format(
      "SELECT t.id, t.code, json_extract(t.provenance, '$.free_sizes'), "
      "  CASE WHEN ?4 AND k.normal_hash IS NOT NULL THEN (SELECT min(s.task_id) FROM task_keys s "
      "    JOIN filter_results a ON a.task_id = s.task_id WHERE s.normal_hash = k.normal_hash AND s.task_id < t.id "
      "    AND a.verdict = 'accepted' AND NOT (?2 AND a.config IS NOT ?3)) END, "
      "  ?4 AND k.normal_hash IS NOT NULL AND EXISTS (SELECT 1 FROM task_keys s LEFT JOIN filter_results b "
      "    ON b.task_id = s.task_id WHERE s.normal_hash = k.normal_hash AND s.task_id < t.id AND {} "
      "    AND (opforge_in_shard(s.task_id) OR EXISTS (SELECT 1 FROM filter_leases l WHERE l.task_id = s.task_id))) "
      "FROM tasks t LEFT JOIN filter_results f ON f.task_id = t.id LEFT JOIN task_keys k ON k.task_id = t.id "
      "WHERE {} AND opforge_in_shard(t.id) AND NOT EXISTS (SELECT 1 FROM filter_leases l WHERE l.task_id = t.id) "
      "ORDER BY t.created_at, t.id",
      is_job("b"), is_job("f"));
}

// Inside one BEGIN IMMEDIATE: takes over the leases of filters that are gone, records the twins
// of accepted tasks, and leases up to `want` tasks to this process.
Claim claim(Db& db, LeaseHolder& leases, const Selection& sel, std::size_t want, const std::string& device) {
  Claim c;
  db.transaction([&] {
    leases.expire_dead();
    {
      auto st = db.prepare(claim_sql());
      sel.bind(st);
      while (c.jobs.size() < want && st.step()) {
        if (!st.is_null(3)) {
          c.twins.push_back({st.text(0), st.text(1), st.text(3)});
        } else if (st.int64(4) != 0) {
          ++c.waiting;
        } else {
          json fs = st.is_null(2) ? json::array({"batch_size"}) : json::parse(st.text(2));
          c.jobs.push_back({st.text(0), st.text(1), fs});
        }
      }
    }
    for (auto& t : c.twins) {
      Verdict v{"rejected", "exact_duplicate",
                fmt::format("same normal form (python/opforge/features.py) as the accepted task {}; not run, as "
                            "dedup would drop it",
                            t.of),
                t.code};
      v.metrics = {{"duplicate_of", t.of}};
      write_verdict(db, t.id, v, device, sel.config);
    }
    for (auto& j : c.jobs) leases.lease(j.id);
  });
  return c;
}

// The twins' key (features.py's normal form; no task code runs) of every task that has none, in
// batches in the pool. Every task, not only this shard's: an earlier twin may be in another one.
void compute_keys(WorkerPool& pool, Db& db) {
  std::vector<std::pair<std::string, std::string>> todo;
  {
    auto st = db.prepare(
        "SELECT t.id, t.code FROM tasks t WHERE NOT EXISTS (SELECT 1 FROM task_keys k WHERE k.task_id = t.id) "
        "ORDER BY t.id");
    while (st.step()) todo.emplace_back(st.text(0), st.text(1));
  }
  if (todo.empty()) return;
  constexpr std::size_t kBatch = 256;
  std::vector<json> reqs;
  for (std::size_t b = 0; b < todo.size(); b += kBatch) {
    json items = json::array();
    // ops given (empty): the key needs no op sequence read from the AST.
    for (std::size_t i = b; i < std::min(todo.size(), b + kBatch); ++i)
      items.push_back({{"code", todo[i].second}, {"ops", json::array()}});
    reqs.push_back({{"op", "features"}, {"args", {{"items", items}}}});
  }
  Progress progress("filter keys", todo.size());
  pool.run(reqs, [&](WorkerResult&& r) {
    // Pure ast: a failure is a broken installation, not a bad task.
    OPFORGE_CHECK(r.outcome == Outcome::ok && r.reply.value("ok", false),
                  "computing the normal forms of tasks failed ({} {}: {}); see the workers' log, or run with "
                  "--judge-twins", outcome_name(r.outcome), r.reason, r.reply.value("message", ""));
    const json& res = r.reply["result"];
    db.transaction([&] {
      auto st = db.prepare("INSERT OR IGNORE INTO task_keys(task_id, normal_hash) VALUES(?, ?)");
      for (std::size_t k = 0; k < res.size(); ++k) {
        st.reset();
        st.bind(1, todo[r.index * kBatch + k].first).bind(2, fmt::format("{:016x}", xxh3_64(res[k]["normal"].get<std::string>())));
        st.run();
      }
    });
    progress.tick(res.size());
  });
  progress.finish();
}

void warn_stale(Db& db, const std::string& config) {
  auto st = db.prepare("SELECT count(*) FROM filter_results WHERE config IS NOT ?");
  st.bind(1, config);
  st.step();
  if (long n = st.int64(0); n > 0)
    spdlog::warn("{} stored verdicts were made under another filter configuration (or before configurations were "
                 "recorded) and are kept as they are; `opforge filter --rejudge-stale` judges them again", n);
}

// A worker's cap on its GPU's memory. Not 1/n: most tasks use a few GiB and few peak at once, so a
// fair share of 1/8 rejected 56 of KernelBench's 100 level-1 problems out_of_memory with most of
// the GPU free. Each may use kGpuOvercommit/n (at most 90%); when neighbours do peak together the
// task fails out_of_memory and is judged again alone (judge_alone), so the overcommit loses nothing.
constexpr double kGpuOvercommit = 4.0;

double gpu_memory_share(int workers_on_gpu) {
  return 0.9 * std::min(1.0, kGpuOvercommit / std::max(1, workers_on_gpu));
}

WorkerPoolOptions pool_options(const FilterOptions& opts, const std::string& device,
                               const std::vector<std::string>& gpu_ids, int workers, Workspace& ws) {
  WorkerPoolOptions popts;
  popts.workers = workers;
  popts.timeout_s = opts.timeout_s;
  popts.memory_limit_mb = opts.memory_limit_mb;
  popts.log_file = ws.logs_dir() / "workers.log";
  popts.slot_env = gpu_slot_env(device == "cuda" ? gpu_ids : std::vector<std::string>{}, popts.workers,
                               ws.root() / "locks");
  for (auto& env : popts.slot_env) {
    if (device == "cuda") {
      env["OPFORGE_GPU_MEM_FRACTION"] = fmt::format("{:.3f}", gpu_memory_share(std::stoi(env["OPFORGE_WORKERS_ON_GPU"])));
      // Inductor's compile pool per worker: the cores shared out, so launches are not starved.
      unsigned hw = usable_cpus();
      env["TORCHINDUCTOR_COMPILE_THREADS"] = std::to_string(std::max(1u, hw / static_cast<unsigned>(popts.workers)));
    } else {
      env.erase("CUDA_VISIBLE_DEVICES");  // on CPU the filter leaves the user's setting alone
      // On a few cores inductor's pool of compile subprocesses costs more than it saves.
      env["TORCHINDUCTOR_COMPILE_THREADS"] = "1";
    }
  }
  return popts;
}

json judge_request(const Job& j, const FilterOptions& opts, const std::string& device) {
  return {{"op", "judge"},
          {"args",
           {{"code", j.code},
            {"device", device},
            {"min_ms", opts.min_ms},
            {"max_ms", opts.max_ms},
            {"calibrate", opts.calibrate},
            {"free_sizes", j.free_sizes},
            {"rtol", opts.rtol},
            {"atol", opts.atol},
            {"trials", opts.trials},
            {"skip_checks", opts.skip_checks},
            {"extra_checks", opts.extra_checks},
            {"timing_lock", nullptr}}}};
}

Verdict verdict_of(WorkerResult& r, const Job& job) {
  Verdict v{"rejected", "", "", job.code};
  if (r.outcome != Outcome::ok) {
    v.reason = outcome_name(r.outcome);
    v.detail = r.reason + (r.log_tail.empty() ? "" : "\n--- worker log tail ---\n" + r.log_tail);
  } else if (!r.reply.value("ok", false)) {
    // The judge request itself failed: recorded with its traceback, and the run goes on.
    v.reason = "judge_error";
    v.detail = r.reply.value("error", "") + ": " + r.reply.value("message", "") + "\n" + r.reply.value("traceback", "");
  } else {
    const json& x = r.reply["result"];
    v = {x["verdict"], x["reason"].is_null() ? "" : x["reason"].get<std::string>(), x.value("detail", ""), x["code"],
         x["metrics"], x["ops"], x["calibration"]};
  }
  return v;
}

// Reasons that may be the environment's rather than the task's: the worker's memory share, a
// worker another task broke, or a device lock held past timing's limit by a process that hung.
// Such a task is judged again alone before it is rejected.
// A library that fails to allocate says so in its own words (cuBLAS, cuDNN, Triton), under another reason.
bool environment_reason(const Verdict& v) {
  if (v.reason == "out_of_memory" || v.reason == "worker_crash" || v.reason == "lock_timeout") return true;
  if (v.reason != "eager_error" && v.reason != "compile_error") return false;
  std::string d = v.detail;
  std::transform(d.begin(), d.end(), d.begin(), [](unsigned char c) { return std::tolower(c); });
  return d.find("out of memory") != std::string::npos || d.find("alloc_failed") != std::string::npos;
}

json attempt_of(const Verdict& v, const char* how) {
  return {{"how", how}, {"verdict", v.verdict}, {"reason", v.reason.empty() ? json(nullptr) : json(v.reason)}};
}

using Retry = std::vector<std::pair<Job, Verdict>>;  // (the task, the verdict made with the workers)

// Tasks that failed for an environment reason, judged again by one worker with the memory every
// worker had (on a GPU: the whole first GPU, the other workers gone); both attempts are recorded.
// Their leases were kept until now.
void judge_alone(Workspace& ws, LeaseHolder& leases, const FilterOptions& opts, const std::string& device,
                 const std::vector<std::string>& gpu_ids, int shared_by, const Retry& again, const std::string& config,
                 const std::function<void(const Verdict&)>& count) {
  FilterOptions alone = opts;
  alone.memory_limit_mb = opts.memory_limit_mb * static_cast<std::size_t>(shared_by);
  std::vector<std::string> one_gpu;
  if (!gpu_ids.empty()) one_gpu.push_back(gpu_ids[0]);
  spdlog::info("{} candidates failed for a reason that may be the environment's (out_of_memory under a worker's "
               "share, worker_crash); judging them again alone", again.size());
  std::vector<json> reqs;
  for (auto& [job, v] : again) reqs.push_back(judge_request(job, opts, device));
  WorkerPool pool(pool_options(alone, device, one_gpu, 1, ws));
  Progress progress("filter alone", reqs.size());
  pool.run(reqs, [&](WorkerResult&& r) {
    const auto& [job, first] = again[r.index];
    with_context(fmt::format("while recording the verdict of task {}", job.id), [&] {
      Verdict v = verdict_of(r, job);
      if (!v.metrics.is_object()) v.metrics = json::object();
      v.metrics["attempts"] = json::array({attempt_of(first, "shared"), attempt_of(v, "alone")});
      record(ws.db(), leases, job.id, v, device, config);
      count(v);
    });
    progress.tick(1, "");
  });
  progress.finish();
}

std::string shard_text(Shard s) { return fmt::format("{}/{}", s.index, s.count); }

std::filesystem::path done_marker(const Workspace& ws, Shard s) { return shard_marker(ws.root(), "filter", s); }

// When nothing of the shard is left to judge (by any filter), writes its completion marker, so an
// array job submitted again can see the shard finished; otherwise removes a marker left from
// before new tasks came. Written whole (rename), as another shard's job may be reading it.
void mark_shard(Workspace& ws, Shard shard, const Selection& sel, const FilterSummary& sum) {
  Db& db = ws.db();
  auto marker = done_marker(ws, shard);
  std::error_code ec;
  if (long left = count_jobs(db, sel, true); left > 0) {
    if (std::filesystem::remove(marker, ec))
      spdlog::info("shard {} is not finished ({} tasks left): removed {}", shard_text(shard), left, marker.string());
    return;
  }
  auto st = db.prepare(
      "SELECT count(*), coalesce(sum(f.verdict = 'accepted'), 0), coalesce(sum(f.verdict = 'rejected'), 0), "
      "coalesce(sum(f.reason = 'exact_duplicate'), 0) FROM tasks t LEFT JOIN filter_results f ON f.task_id = t.id "
      "WHERE opforge_in_shard(t.id)");
  st.step();
  json totals = {{"tasks", st.int64(0)}, {"accepted", st.int64(1)}, {"rejected", st.int64(2)}, {"exact_duplicate", st.int64(3)}};
  json m = {{"stage", "filter"},
            {"shard", shard_text(shard)},
            {"config", sel.config},
            {"finished_at", fmt::format("{:%Y-%m-%dT%H:%M:%SZ}", fmt::gmtime(std::time(nullptr)))},
            {"shard_verdicts", totals},
            {"this_run", {{"judged", sum.judged}, {"accepted", sum.accepted}, {"rejected", sum.rejected},
                          {"twins", sum.twins}}}};
  write_text_atomic(marker, m.dump(2) + "\n");
  spdlog::info("shard {} finished: {} tasks, {} accepted, {} rejected ({} exact duplicates); marker {}",
               shard_text(shard), totals["tasks"].get<long>(), totals["accepted"].get<long>(),
               totals["rejected"].get<long>(), totals["exact_duplicate"].get<long>(), marker.string());
}

}  // namespace

namespace {

// --check names must be registered: said before anything is judged, not as a verdict per task.
void check_registered(const std::vector<std::string>& names, const Workspace& ws) {
  WorkerPoolOptions popts;
  popts.workers = 1;
  popts.log_file = ws.logs_dir() / "workers.log";
  WorkerPool pool(popts);
  WorkerResult r = pool.call({{"op", "filter_checks"}, {"args", json::object()}});
  OPFORGE_CHECK(r.outcome == Outcome::ok && r.reply.value("ok", false), "listing the registered filter checks failed "
                "({} {}: {})", outcome_name(r.outcome), r.reason, r.reply.value("message", ""));
  std::vector<std::string> known = r.reply["result"];
  for (auto& n : names)
    OPFORGE_CHECK(std::find(known.begin(), known.end(), n) != known.end(), "--check {}: no such registered check "
                  "(registered: {}); a check is an 'opforge.checks' entry point of an installed package "
                  "(docs/sources.md)", n, known.empty() ? std::string("none") : fmt::format("{}", fmt::join(known, ", ")));
}

}  // namespace

namespace {

// What this run judges (is_job's parameters); starts the connection's record of its verdicts.
Selection selection_of(Db& db, const FilterOptions& opts, const std::string& config) {
  // This connection's record of what this run judged (write_verdict), so --rejudge judges it once.
  db.exec("CREATE TEMP TABLE IF NOT EXISTS filter_done_here (task_id TEXT PRIMARY KEY)");
  db.exec("DELETE FROM temp.filter_done_here");
  auto now = db.prepare("SELECT datetime('now')");
  now.step();
  return {opts.rejudge, opts.rejudge_stale, !opts.judge_twins, config, now.text(0)};
}

// A run that finds nothing to claim says why; a finished shard gets its marker.
void nothing_to_filter(Workspace& ws, const FilterOptions& opts, const Selection& sel, const FilterSummary& sum) {
  const Shard shard = opts.shard.value_or(Shard{});
  const std::string where = opts.shard ? fmt::format(" of shard {}", shard_text(shard)) : "";
  if (long leased = count_jobs(ws.db(), sel, true); leased > 0) {
    spdlog::info("nothing to filter here: the {} candidates{} left are being judged by another filter", leased, where);
  } else if (opts.shard && std::filesystem::exists(done_marker(ws, shard))) {
    spdlog::info("nothing to filter: every candidate{} has a verdict (finished before: {})", where,
                 done_marker(ws, shard).string());
  } else {
    spdlog::info("nothing to filter: every candidate{} has a verdict", where);
    if (opts.shard) mark_shard(ws, shard, sel, sum);
  }
}

struct Run {
  Workspace& ws;
  LeaseHolder& leases;
  const FilterOptions& opts;
  const Selection& sel;
  std::string device;
  std::vector<std::string> gpu_ids;
  int workers;
};

// Claims tasks as workers free up and judges them until none is left to this process: the
// environment failures again alone at the end of each pass, and while twins wait for a verdict
// another filter is making, polls for it.
void judge_claimed(const Run& run, long todo, FilterSummary& sum) {
  const auto& [ws, leases, opts, sel, device, gpu_ids, workers] = run;
  Db& db = ws.db();
  auto count = [&](const Verdict& v) {
    ++sum.judged;
    v.verdict == "accepted" ? ++sum.accepted : ++sum.rejected;
    if (v.verdict != "accepted") ++sum.reasons[v.reason];
  };
  std::optional<WorkerPool> pool;
  auto ensure_pool = [&]() -> WorkerPool& {
    if (!pool) pool.emplace(pool_options(opts, device, gpu_ids, workers, ws));
    return *pool;
  };
  if (sel.twins) compute_keys(ensure_pool(), db);
  Progress progress("filter", static_cast<std::size_t>(todo));
  Retry again;               // environment failures, judged again alone
  std::vector<Job> running;  // by request index of the current pool run
  long claimed = 0, waiting = 0;
  // One task per worker at a time: enough to keep the pool fed (more are claimed as soon as the
  // queue is empty), few enough that filters sharing the workspace split the work evenly.
  auto feed = [&]() -> std::vector<json> {
    long want = opts.limit > 0 ? std::min<long>(workers, opts.limit - claimed) : workers;
    if (want <= 0) return {};
    Claim c = claim(db, leases, sel, static_cast<std::size_t>(want), device);
    claimed += static_cast<long>(c.jobs.size());
    waiting = c.waiting;
    sum.twins += static_cast<long>(c.twins.size());
    if (!c.twins.empty()) progress.tick(c.twins.size(), "");
    std::vector<json> reqs;
    for (auto& j : c.jobs) {
      reqs.push_back(judge_request(j, opts, device));
      running.push_back(std::move(j));
    }
    return reqs;
  };
  auto on_result = [&](WorkerResult&& r) {
    const Job& job = running[r.index];
    with_context(fmt::format("while recording the verdict of task {}", job.id), [&] {
      Verdict v = verdict_of(r, job);
      if (environment_reason(v) && workers > 1) {
        again.emplace_back(job, std::move(v));  // its lease is kept until then
        return;
      }
      record(db, leases, job.id, v, device, sel.config);
      count(v);
    });
    progress.tick(1, fmt::format("{} accepted, {} rejected, {} twins", sum.accepted, sum.rejected, sum.twins));
  };
  for (bool said_waiting = false;;) {
    running.clear();
    if (std::vector<json> first = feed(); !first.empty()) {
      ensure_pool().run_fed([&] { return first.empty() ? feed() : std::exchange(first, {}); }, on_result);
    } else if (!again.empty()) {
      pool.reset();  // alone means alone: the shared workers go first
      judge_alone(ws, leases, opts, device, gpu_ids, workers, again, sel.config, count);
      again.clear();
    } else if (waiting == 0 || (opts.limit > 0 && claimed >= opts.limit)) {
      break;
    } else {
      // Twins whose earlier twin another filter is judging: its verdict decides whether they run.
      if (!std::exchange(said_waiting, true))
        spdlog::info("{} candidates wait for the verdict of an earlier twin another filter is judging", waiting);
      std::this_thread::sleep_for(std::chrono::seconds(1));
    }
  }
  progress.finish();
}

}  // namespace

FilterSummary filter(Workspace& ws, const FilterOptions& opts) {
  auto t0 = std::chrono::steady_clock::now();
  Db& db = ws.db();
  migrate(db);
  FilterSummary sum;

  std::string device = opts.device;
  const std::vector<std::string> gpu_ids = device == "cpu" ? std::vector<std::string>{} : visible_gpus();
  const int gpus = static_cast<int>(gpu_ids.size());
  if (device == "auto") device = gpus > 0 ? "cuda" : "cpu";
  OPFORGE_CHECK(device != "cuda" || gpus > 0, "--device cuda, but no NVIDIA GPU is visible (no /dev/nvidia*, or CUDA_VISIBLE_DEVICES hides them)");
  int workers = opts.workers > 0 ? opts.workers : (device == "cuda" ? gpus * opts.workers_per_gpu : 2);
  if (!opts.extra_checks.empty()) check_registered(opts.extra_checks, ws);
  const json config_json = config_of(opts, device);
  const std::string config = xxh3_hex(config_json.dump());
  spdlog::info("filter configuration {}: {}", config, config_json.dump());
  db.transaction([&] {
    auto st = db.prepare("INSERT OR IGNORE INTO filter_configs(hash, config) VALUES(?, ?)");
    st.bind(1, config).bind(2, config_json.dump());
    st.run();
  });
  if (!opts.rejudge_stale) warn_stale(db, config);

  const Shard shard = opts.shard.value_or(Shard{});
  register_shard(db, shard);
  const Selection sel = selection_of(db, opts, config);
  LeaseHolder leases(db, opts.lease_stale_s, shard_text(shard));
  db.transaction([&] { leases.expire_dead(); });  // what a filter that is gone held is to do again
  const long todo = count_jobs(db, sel, false);
  if (todo == 0) {
    nothing_to_filter(ws, opts, sel, sum);
    return sum;
  }
  workers = std::min<int>(workers, static_cast<int>(todo));
  spdlog::info("filtering {} candidates{} on {} with {} workers{}", todo,
               opts.shard ? fmt::format(" of shard {}", shard_text(shard)) : "", device, workers,
               device == "cuda" ? fmt::format(" over {} GPU(s)", gpus) : "");
  judge_claimed({ws, leases, opts, sel, device, gpu_ids, workers}, todo, sum);
  if (sum.twins > 0)
    spdlog::info("{} twins of accepted tasks recorded exact_duplicate without running (--judge-twins runs them)",
                 sum.twins);
  if (opts.shard) mark_shard(ws, shard, sel, sum);
  sum.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return sum;
}

ImportSummary import_tasks(Workspace& ws, const std::vector<std::filesystem::path>& paths) {
  Db& db = ws.db();
  migrate(db);
  std::vector<std::filesystem::path> files;
  for (auto& p : paths) {
    OPFORGE_CHECK(std::filesystem::exists(p), "{} does not exist (give KernelBench-format .py files or folders)",
                  p.string());
    if (std::filesystem::is_directory(p)) {
      auto under = python_files_under(p);
      files.insert(files.end(), under.begin(), under.end());
    } else {
      files.push_back(p);
    }
  }
  std::sort(files.begin(), files.end());
  ImportSummary sum;
  if (files.empty()) return sum;
  json codes = json::array();
  for (auto& f : files) codes.push_back(read_text(f));
  WorkerPoolOptions popts;
  popts.workers = 1;
  popts.log_file = ws.logs_dir() / "workers.log";
  WorkerPool pool(popts);
  WorkerResult r = pool.call({{"op", "normalize"}, {"args", {{"codes", codes}}}});
  OPFORGE_CHECK(r.outcome == Outcome::ok && r.reply.value("ok", false), "normalising the imported files failed: {}",
                r.reason);
  for (std::size_t i = 0; i < files.size(); ++i) {
    tasks::NewTask t;
    t.id = xxh3_hex(r.reply["result"][i].get<std::string>());
    t.code = codes[i];
    t.source = "imported";
    t.backend = "import";
    t.provenance = {{"backend", "import"}, {"path", std::filesystem::absolute(files[i]).string()},
                    {"free_sizes", {"batch_size"}}};
    bool added = false;
    db.transaction([&] { added = tasks::insert(db, t); });
    added ? ++sum.added : ++sum.duplicates;
  }
  return sum;
}

std::vector<json> list_tasks(Db& db, const std::string& verdict) {
  migrate(db);
  std::vector<json> out;
  auto st = db.prepare(
      "SELECT t.id, t.backend, t.source, t.num_ops, t.seed_ids, json_extract(t.provenance, '$.path'), "
      "coalesce(f.verdict, 'pending'), f.reason, f.detail, f.metrics, f.ops FROM tasks t LEFT JOIN filter_results f "
      "ON f.task_id = t.id ORDER BY t.created_at, t.id");
  while (st.step()) {
    std::string v = st.text(6);
    if (!verdict.empty() && v != verdict) continue;
    json origin = st.is_null(5) ? json{{"seed_ids", json::parse(st.text(4))}} : json{{"path", st.text(5)}};
    json m = st.is_null(9) ? json::object() : json::parse(st.text(9));
    json key = json::object();
    for (auto* k : {"eager_ms", "compile_ms", "compile_speedup", "compile_wall_s", "peak_mem_mb", "device"})
      if (m.contains(k)) key[k] = m[k];
    out.push_back({{"id", st.text(0)},
                   {"backend", st.text(1)},
                   {"source", st.text(2)},
                   {"num_ops", st.int64(3)},
                   {"origin", origin},
                   {"verdict", v},
                   {"reason", st.is_null(7) ? json(nullptr) : json(st.text(7))},
                   {"detail", st.is_null(8) ? json(nullptr) : json(st.text(8).substr(0, 300))},
                   {"metrics", key},
                   {"ops", st.is_null(10) ? json(nullptr) : json::parse(st.text(10))}});
  }
  return out;
}

json status(Db& db) {
  migrate(db);
  json out = {{"judged", 0}, {"accepted", 0}, {"rejected", 0}, {"pending", 0}, {"reasons", json::object()}};
  auto st = db.prepare("SELECT verdict, coalesce(reason, ''), count(*) FROM filter_results GROUP BY verdict, reason");
  while (st.step()) {
    out[st.text(0)] = out[st.text(0)].get<long>() + st.int64(2);
    out["judged"] = out["judged"].get<long>() + st.int64(2);
    if (st.text(0) == "rejected") out["reasons"][st.text(1)] = st.int64(2);
  }
  out["pending"] = tasks::count(db) - out["judged"].get<long>();
  // Of those, being judged now by some filter (leases.h; a gone filter's until the next claim).
  auto le = db.prepare("SELECT count(*) FROM filter_leases");
  le.step();
  out["leased"] = le.int64(0);
  // Verdicts by the configuration they were made under (more than one: see `filter --rejudge-stale`).
  out["configs"] = json::object();
  auto cf = db.prepare("SELECT coalesce(config, 'unrecorded'), count(*) FROM filter_results GROUP BY 1 ORDER BY 1");
  while (cf.step()) out["configs"][cf.text(0)] = cf.int64(1);
  return out;
}

}  // namespace opforge::filter
