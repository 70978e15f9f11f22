#include "filter.h"

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <functional>
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
)sql"});
}

json config_of(const FilterOptions& o, const std::string& device) {
  // Everything that changes a verdict; not the workers, limits or timeouts, which only decide
  // whether a verdict is reached (and an environment failure is retried alone).
  json c = {{"filter", kFilterVersion}, {"device", device}, {"min_ms", o.min_ms},  {"max_ms", o.max_ms},
            {"calibrate", o.calibrate}, {"rtol", o.rtol},    {"atol", o.atol},      {"trials", o.trials}};
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

void record(Db& db, const std::string& id, const Verdict& v, const std::string& device, const std::string& config) {
  db.transaction([&] {
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
  });
}

// Candidates to judge: those without a verdict, and the stored verdicts --rejudge names.
std::vector<Job> select_jobs(Db& db, const FilterOptions& opts, const std::string& config) {
  std::vector<Job> jobs;
  json reasons = opts.rejudge;
  auto st = db.prepare(
      "SELECT t.id, t.code, json_extract(t.provenance, '$.free_sizes') FROM tasks t LEFT JOIN filter_results f "
      "ON f.task_id = t.id WHERE f.task_id IS NULL "
      "OR (f.verdict = 'rejected' AND (f.reason IN (SELECT value FROM json_each(?1)) "
      "    OR EXISTS (SELECT 1 FROM json_each(?1) WHERE value = 'all'))) "
      "OR (?2 AND f.config IS NOT ?3) ORDER BY t.created_at, t.id");
  st.bind(1, reasons.dump()).bind(2, static_cast<std::int64_t>(opts.rejudge_stale)).bind(3, config);
  while (st.step()) {
    json fs = st.is_null(2) ? json::array({"batch_size"}) : json::parse(st.text(2));
    jobs.push_back({st.text(0), st.text(1), fs});
    if (opts.limit > 0 && static_cast<int>(jobs.size()) >= opts.limit) break;
  }
  return jobs;
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

// Reasons that may be the environment's rather than the task's: the worker's memory share, or a
// worker another task broke. Such a task is judged again alone before it is rejected.
// A library that fails to allocate says so in its own words (cuBLAS, cuDNN, Triton), under another reason.
bool environment_reason(const Verdict& v) {
  if (v.reason == "out_of_memory" || v.reason == "worker_crash") return true;
  if (v.reason != "eager_error" && v.reason != "compile_error") return false;
  std::string d = v.detail;
  std::transform(d.begin(), d.end(), d.begin(), [](unsigned char c) { return std::tolower(c); });
  return d.find("out of memory") != std::string::npos || d.find("alloc_failed") != std::string::npos;
}

json attempt_of(const Verdict& v, const char* how) {
  return {{"how", how}, {"verdict", v.verdict}, {"reason", v.reason.empty() ? json(nullptr) : json(v.reason)}};
}

using Retry = std::vector<std::pair<std::size_t, Verdict>>;  // (job index, the verdict made with the workers)

// Tasks that failed for an environment reason, judged again by one worker with the memory every
// worker had (on a GPU: the whole first GPU, the other workers gone); both attempts are recorded.
void judge_alone(Workspace& ws, const FilterOptions& opts, const std::string& device,
                 const std::vector<std::string>& gpu_ids, int shared_by, const std::vector<Job>& jobs,
                 const Retry& again, const std::string& config, const std::function<void(const Verdict&)>& count) {
  FilterOptions alone = opts;
  alone.memory_limit_mb = opts.memory_limit_mb * static_cast<std::size_t>(shared_by);
  std::vector<std::string> one_gpu;
  if (!gpu_ids.empty()) one_gpu.push_back(gpu_ids[0]);
  spdlog::info("{} candidates failed for a reason that may be the environment's (out_of_memory under a worker's "
               "share, worker_crash); judging them again alone", again.size());
  std::vector<json> reqs;
  for (auto& [i, v] : again) reqs.push_back(judge_request(jobs[i], opts, device));
  WorkerPool pool(pool_options(alone, device, one_gpu, 1, ws));
  Progress progress("filter alone", reqs.size());
  pool.run(reqs, [&](WorkerResult&& r) {
    const auto& [i, first] = again[r.index];
    with_context(fmt::format("while recording the verdict of task {}", jobs[i].id), [&] {
      Verdict v = verdict_of(r, jobs[i]);
      if (!v.metrics.is_object()) v.metrics = json::object();
      v.metrics["attempts"] = json::array({attempt_of(first, "shared"), attempt_of(v, "alone")});
      record(ws.db(), jobs[i].id, v, device, config);
      count(v);
    });
    progress.tick(1, "");
  });
  progress.finish();
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

  std::vector<Job> jobs = select_jobs(db, opts, config);
  if (jobs.empty()) {
    spdlog::info("nothing to filter: every candidate has a verdict");
    return sum;
  }
  workers = std::min<int>(workers, static_cast<int>(jobs.size()));
  std::vector<json> reqs;
  for (auto& j : jobs) reqs.push_back(judge_request(j, opts, device));
  spdlog::info("filtering {} candidates on {} with {} workers{}", jobs.size(), device, workers,
               device == "cuda" ? fmt::format(" over {} GPU(s)", gpus) : "");
  auto count = [&](const Verdict& v) {
    ++sum.judged;
    v.verdict == "accepted" ? ++sum.accepted : ++sum.rejected;
    if (v.verdict != "accepted") ++sum.reasons[v.reason];
  };
  std::vector<std::pair<std::size_t, Verdict>> again;  // environment failures, judged again alone
  {
    WorkerPool pool(pool_options(opts, device, gpu_ids, workers, ws));
    Progress progress("filter", jobs.size());
    pool.run(reqs, [&](WorkerResult&& r) {
      const Job& job = jobs[r.index];
      with_context(fmt::format("while recording the verdict of task {}", job.id), [&] {
        Verdict v = verdict_of(r, job);
        if (environment_reason(v) && workers > 1) {
          again.emplace_back(r.index, std::move(v));
          return;
        }
        record(db, job.id, v, device, config);
        count(v);
      });
      progress.tick(1, fmt::format("{} accepted, {} rejected", sum.accepted, sum.rejected));
    });
    progress.finish();
  }
  if (!again.empty()) judge_alone(ws, opts, device, gpu_ids, workers, jobs, again, config, count);
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
  // Verdicts by the configuration they were made under (more than one: see `filter --rejudge-stale`).
  out["configs"] = json::object();
  auto cf = db.prepare("SELECT coalesce(config, 'unrecorded'), count(*) FROM filter_results GROUP BY 1 ORDER BY 1");
  while (cf.step()) out["configs"][cf.text(0)] = cf.int64(1);
  return out;
}

}  // namespace opforge::filter
