#include "filter.h"

#include <spdlog/spdlog.h>

#include <chrono>
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
)sql"});
}

namespace {

void record(Db& db, const std::string& id, const std::string& verdict, const std::string& reason,
            const std::string& detail, const json& metrics, const json& ops, const std::string& code,
            const json& calibration, const std::string& device) {
  db.transaction([&] {
    auto st = db.prepare(
        "INSERT OR REPLACE INTO filter_results(task_id, verdict, reason, detail, metrics, ops, code, calibration, "
        "device) VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?)");
    st.bind(1, id).bind(2, verdict);
    if (reason.empty()) st.bind_null(3); else st.bind(3, reason);
    st.bind(4, detail).bind(5, metrics.dump());
    if (ops.is_null()) st.bind_null(6); else st.bind(6, ops.dump());
    st.bind(7, code).bind(8, calibration.dump()).bind(9, device);
    st.run();
  });
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

  struct Job {
    std::string id, code;
    json free_sizes;
  };
  std::vector<Job> jobs;
  {
    auto st = db.prepare(
        "SELECT t.id, t.code, json_extract(t.provenance, '$.free_sizes') FROM tasks t LEFT JOIN filter_results f "
        "ON f.task_id = t.id WHERE f.task_id IS NULL ORDER BY t.created_at, t.id");
    while (st.step()) {
      json fs = st.is_null(2) ? json::array({"batch_size"}) : json::parse(st.text(2));
      jobs.push_back({st.text(0), st.text(1), fs});
      if (opts.limit > 0 && static_cast<int>(jobs.size()) >= opts.limit) break;
    }
  }
  if (jobs.empty()) {
    spdlog::info("nothing to filter: every candidate has a verdict");
    return sum;
  }

  WorkerPoolOptions popts;
  popts.workers = std::min<int>(workers, static_cast<int>(jobs.size()));
  popts.timeout_s = opts.timeout_s;
  popts.memory_limit_mb = opts.memory_limit_mb;
  popts.log_file = ws.logs_dir() / "workers.log";
  popts.slot_env = gpu_slot_env(device == "cuda" ? gpu_ids : std::vector<std::string>{}, popts.workers,
                               ws.root() / "locks");
  for (auto& env : popts.slot_env) {
    if (device == "cuda") {
      env["OPFORGE_GPU_MEM_FRACTION"] = fmt::format("{:.3f}", 0.9 / std::max(1, std::stoi(env["OPFORGE_WORKERS_ON_GPU"])));
      // Inductor's compile pool per worker: the cores shared out, so launches are not starved.
      unsigned hw = usable_cpus();
      env["TORCHINDUCTOR_COMPILE_THREADS"] = std::to_string(std::max(1u, hw / static_cast<unsigned>(popts.workers)));
    } else {
      env.erase("CUDA_VISIBLE_DEVICES");  // on CPU the filter leaves the user's setting alone
      // On a few cores inductor's pool of compile subprocesses costs more than it saves.
      env["TORCHINDUCTOR_COMPILE_THREADS"] = "1";
    }
  }
  WorkerPool pool(popts);

  std::vector<json> reqs;
  for (auto& j : jobs) {
    reqs.push_back({{"op", "judge"},
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
                      {"timing_lock", nullptr}}}});
  }
  spdlog::info("filtering {} candidates on {} with {} workers{}", jobs.size(), device, popts.workers,
               device == "cuda" ? fmt::format(" over {} GPU(s)", gpus) : "");
  Progress progress("filter", jobs.size());
  pool.run(reqs, [&](WorkerResult&& r) {
    const Job& job = jobs[r.index];
    with_context(fmt::format("while recording the verdict of task {}", job.id), [&] {
      ++sum.judged;
      if (r.outcome != Outcome::ok) {
        std::string detail = r.reason;
        if (!r.log_tail.empty()) detail += "\n--- worker log tail ---\n" + r.log_tail;
        record(db, job.id, "rejected", outcome_name(r.outcome), detail, json::object(), nullptr, job.code,
               json::array(), device);
        ++sum.rejected;
        ++sum.reasons[outcome_name(r.outcome)];
      } else if (!r.reply.value("ok", false)) {
        // The judge request itself failed: recorded with its traceback, and the run goes on.
        std::string detail = r.reply.value("error", "") + ": " + r.reply.value("message", "") + "\n" +
                             r.reply.value("traceback", "");
        record(db, job.id, "rejected", "judge_error", detail, json::object(), nullptr, job.code, json::array(), device);
        ++sum.rejected;
        ++sum.reasons["judge_error"];
      } else {
        const json& v = r.reply["result"];
        std::string verdict = v["verdict"];
        std::string reason = v["reason"].is_null() ? "" : v["reason"].get<std::string>();
        record(db, job.id, verdict, reason, v.value("detail", ""), v["metrics"], v["ops"], v["code"],
               v["calibration"], device);
        if (verdict == "accepted") {
          ++sum.accepted;
        } else {
          ++sum.rejected;
          ++sum.reasons[reason];
        }
      }
    });
    progress.tick(1, fmt::format("{} accepted, {} rejected", sum.accepted, sum.rejected));
  });
  progress.finish();
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
  return out;
}

}  // namespace opforge::filter
