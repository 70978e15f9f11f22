#include "evaluator.h"

#include <spdlog/spdlog.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include "opforge/core/gpus.h"
#include "opforge/core/error.h"
#include "opforge/core/files.h"
#include "opforge/core/hash.h"
#include "opforge/core/paths.h"
#include "opforge/core/progress.h"
#include "opforge/core/store.h"
#include "opforge/core/worker_pool.h"

namespace opforge::evaluator {

namespace fs = std::filesystem;
using nlohmann::json;

// ----------------------------------------------------------------------------------------------
// Tasks

namespace {

std::string read_gzip(const fs::path& p) {
  gzFile f = gzopen(p.c_str(), "rb");
  OPFORGE_CHECK(f != nullptr, "cannot open {}", p.string());
  std::string out;
  char buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof buf)) > 0) out.append(buf, static_cast<std::size_t>(n));
  int err = 0;
  const char* msg = gzerror(f, &err);
  std::string why = err < 0 ? msg : "";
  gzclose(f);
  OPFORGE_CHECK(n == 0 && why.empty(), "{} is not a readable gzip file: {}", p.string(), why);
  return out;
}

bool is_shard(const fs::path& p) {
  std::string n = p.filename().string();
  auto ends = [&](const std::string& s) { return n.size() >= s.size() && n.compare(n.size() - s.size(), s.size(), s) == 0; };
  return ends(".jsonl") || ends(".jsonl.gz");
}

void read_shard(const fs::path& p, std::vector<EvalTask>& out) {
  std::string text = p.extension() == ".gz" ? read_gzip(p) : read_text(p);
  std::stringstream ss(text);
  long line_no = 0;
  for (std::string line; std::getline(ss, line);) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j;
    try {
      j = json::parse(line);
    } catch (const std::exception& e) {
      throw Error(fmt::format("{} line {}: not JSON ({})", p.string(), line_no, e.what()));
    }
    OPFORGE_CHECK(j.is_object() && j.contains("code") && j["code"].is_string(),
                  "{} line {}: a task record needs a string \"code\" (as `opforge export` writes)", p.string(), line_no);
    std::string code = j["code"];
    std::string id = j.contains("id") && j["id"].is_string() ? j["id"].get<std::string>() : xxh3_hex(code);
    out.push_back({id, id, code});
  }
}

bool has_table(Db& db, const std::string& name) {
  auto st = db.prepare("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?");
  st.bind(1, name);
  return st.step();
}

void read_workspace(const fs::path& dir, std::vector<EvalTask>& out) {
  Db db(dir / "opforge.db");
  OPFORGE_CHECK(has_table(db, "tasks"), "{} has no tasks table: compose or import tasks first", dir.string());
  std::string sql = "SELECT t.id, t.code FROM tasks t ORDER BY t.id";
  bool filtered = false;
  if (has_table(db, "filter_results")) {
    auto st = db.prepare("SELECT 1 FROM filter_results LIMIT 1");
    filtered = st.step();
  }
  if (filtered) {
    // The filter's code is the calibrated one it timed: what export would ship.
    sql = "SELECT t.id, coalesce(f.code, t.code) FROM tasks t JOIN filter_results f ON f.task_id = t.id "
          "WHERE f.verdict = 'accepted'";
    if (has_table(db, "dedup_results"))
      sql += " AND (NOT EXISTS (SELECT 1 FROM dedup_results) OR t.id IN (SELECT task_id FROM dedup_results WHERE kept = 1))";
    sql += " ORDER BY t.id";
  }
  auto st = db.prepare(sql);
  while (st.step()) out.push_back({st.text(0), st.text(0), st.text(1)});
}

}  // namespace

std::vector<EvalTask> load_tasks(const fs::path& src) {
  OPFORGE_CHECK(fs::exists(src), "--tasks {} does not exist (give shards, a workspace or a folder of .py tasks)",
                src.string());
  std::vector<EvalTask> out;
  if (fs::is_regular_file(src)) {
    if (is_shard(src)) {
      read_shard(src, out);
    } else {
      std::string code = read_text(src);
      out.push_back({xxh3_hex(code), src.stem().string(), code});
    }
    return out;
  }
  if (fs::exists(src / "opforge.db")) {
    read_workspace(src, out);
    return out;
  }
  std::vector<fs::path> shards;
  for (auto& e : fs::directory_iterator(src))
    if (e.is_regular_file() && is_shard(e.path())) shards.push_back(e.path());
  if (!shards.empty()) {
    std::sort(shards.begin(), shards.end());
    for (auto& s : shards) read_shard(s, out);
    return out;
  }
  for (auto& f : python_files_under(src)) {
    std::string code = read_text(f);
    out.push_back({xxh3_hex(code), f.stem().string(), code});
  }
  return out;
}

std::vector<SolutionEntry> find_solutions(const fs::path& dir) {
  OPFORGE_CHECK(fs::is_directory(dir), "--solutions {} is not a folder (one <task>.py or <task>/ per solution)",
                dir.string());
  std::vector<SolutionEntry> out;
  for (auto& e : fs::directory_iterator(dir)) {
    std::string name = e.path().filename().string();
    if (name.empty() || name[0] == '.' || name == "__pycache__") continue;
    if (e.is_directory())
      out.push_back({name, e.path(), true});
    else if (e.is_regular_file() && e.path().extension() == ".py")
      out.push_back({e.path().stem().string(), e.path(), false});
  }
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.key < b.key; });
  return out;
}

int reward(bool correct, std::optional<double> se, std::optional<double> sc, double margin) {
  if (!correct) return -1;
  bool eager = se && *se > 1.0 + margin;
  bool comp = sc && *sc > 1.0 + margin;
  if (eager && comp) return 3;
  if (eager) return 2;
  return 1;
}

// ----------------------------------------------------------------------------------------------
// Evaluation

namespace {

std::string cpu_device_name() {
  // The spelling python/opforge/evaluate.py:device_name uses for the baseline cache key.
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("model name", 0) == 0) {
      auto colon = line.find(':');
      std::string v = line.substr(colon + 1);
      v.erase(0, v.find_first_not_of(" \t"));
      v.erase(v.find_last_not_of(" \t\r") + 1);
      return "cpu: " + v;
    }
  }
  return "cpu";
}

fs::path default_cache_dir() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return fs::path(x) / "opforge" / "eval";
  if (const char* h = std::getenv("HOME"); h && *h) return fs::path(h) / ".cache" / "opforge" / "eval";
  return fs::temp_directory_path() / "opforge-eval-cache";
}

void migrate_cache(Db& db) {
  db.migrate("eval_baselines", {R"sql(
CREATE TABLE eval_baselines (
  code_hash   TEXT NOT NULL,   -- xxh3 hex of the task's code as evaluated
  device_name TEXT NOT NULL,   -- torch.cuda.get_device_name, or "cpu: <model name>"
  torch       TEXT NOT NULL,
  eager       TEXT NOT NULL,   -- opforge.timing.time_fn stats (JSON)
  compile     TEXT,            -- NULL when torch.compile failed on the reference
  note        TEXT,
  measured_at TEXT NOT NULL DEFAULT (datetime('now')),
  PRIMARY KEY (code_hash, device_name, torch)
);
)sql"});
}

std::optional<double> num(const json& j, const char* k) {
  if (j.is_object() && j.contains(k) && j[k].is_number()) return j[k].get<double>();
  return std::nullopt;
}

json opt(std::optional<double> v) { return v ? json(*v) : json(nullptr); }

std::string tail(const std::string& s, std::size_t n) { return s.size() <= n ? s : "…" + s.substr(s.size() - n); }

void copy_solution(const SolutionEntry& s, const fs::path& dst) {
  // Only the solution's own files: it never sees the task, the harness or other solutions.
  fs::remove_all(dst);
  fs::create_directories(dst);
  if (s.folder)
    fs::copy(s.path, dst, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  else
    fs::copy_file(s.path, dst / s.path.filename(), fs::copy_options::overwrite_existing);
}

json summarize(const json& results, double margin) {
  long n = 0, compiled = 0, correct = 0, faster_eager = 0, faster_compile = 0;
  double log_se = 0, log_sc = 0;
  long n_se = 0, n_sc = 0;
  json hist = {{"-1", 0}, {"1", 0}, {"2", 0}, {"3", 0}};
  std::map<std::string, long> reasons;
  double reward_sum = 0;
  for (auto& r : results) {
    ++n;
    compiled += r["compiled"].get<bool>();
    bool ok = r["correct"].get<bool>();
    correct += ok;
    int rw = r["reward"].get<int>();
    reward_sum += rw;
    hist[std::to_string(rw)] = hist[std::to_string(rw)].get<long>() + 1;
    if (!r["reason"].is_null()) ++reasons[r["reason"].get<std::string>()];
    auto se = num(r, "speedup_eager"), sc = num(r, "speedup_compile");
    if (ok && se) {
      faster_eager += *se > 1.0 + margin;
      log_se += std::log(*se);
      ++n_se;
    }
    if (ok && sc) {
      faster_compile += *sc > 1.0 + margin;
      log_sc += std::log(*sc);
      ++n_sc;
    }
  }
  auto rate = [&](long k) { return n ? json(static_cast<double>(k) / n) : json(nullptr); };
  return {{"evaluated", n},
          {"compiled", compiled},
          {"correct", correct},
          {"pass_rate", rate(correct)},
          {"faster_than_eager_rate", rate(faster_eager)},
          {"faster_than_compile_rate", rate(faster_compile)},
          {"geomean_speedup_eager", n_se ? json(std::exp(log_se / n_se)) : json(nullptr)},
          {"geomean_speedup_compile", n_sc ? json(std::exp(log_sc / n_sc)) : json(nullptr)},
          {"mean_reward", n ? json(reward_sum / n) : json(nullptr)},
          {"reward_histogram", hist},
          {"reasons", reasons}};
}

}  // namespace

json evaluate(const EvalOptions& o) {
  auto t0 = std::chrono::steady_clock::now();
  OPFORGE_CHECK(o.policy == "strict" || o.policy == "torch-allowed", "--policy must be strict or torch-allowed, not {}",
                o.policy);
  std::vector<EvalTask> tasks = with_context("while reading --tasks", [&] { return load_tasks(o.tasks); });
  OPFORGE_CHECK(!tasks.empty(), "--tasks {} holds no task", o.tasks.string());
  std::vector<SolutionEntry> sols = find_solutions(o.solutions);

  // Match by name first (a file stem says which file it answers), then by id.
  std::map<std::string, std::size_t> by_name, by_id;
  for (std::size_t i = 0; i < tasks.size(); ++i) {
    if (!by_name.emplace(tasks[i].name, i).second)
      spdlog::warn("two tasks are named {}: solutions match the first", tasks[i].name);
    by_id.emplace(tasks[i].id, i);
  }
  struct Job {
    std::size_t task;
    SolutionEntry sol;
    fs::path work;
    std::string entry;
    json row;
    bool done = false;
  };
  std::vector<Job> jobs;
  json unmatched = json::array();
  std::set<std::size_t> solved;
  for (auto& s : sols) {
    auto it = by_name.find(s.key);
    if (it == by_name.end()) it = by_id.find(s.key);
    if (it == by_id.end()) {
      unmatched.push_back(s.key);
      continue;
    }
    if (!solved.insert(it->second).second) {
      spdlog::warn("task {} has more than one solution; {} is evaluated as well", tasks[it->second].name, s.key);
    }
    jobs.push_back({it->second, s, {}, s.folder ? "model_new.py" : s.path.filename().string(), json::object()});
  }
  if (!unmatched.empty())
    spdlog::warn("{} solution(s) match no task by name or id: {}", unmatched.size(), tail(unmatched.dump(), 300));
  long without = static_cast<long>(tasks.size() - solved.size());

  fs::path out = o.out;
  with_context(fmt::format("while preparing --out {}", out.string()), [&] {
    fs::create_directories(out);
    fs::remove_all(out / "work");
  });
  fs::path cache = o.cache_dir.empty() ? default_cache_dir() : o.cache_dir;
  fs::create_directories(cache / "locks");
  Db db(cache / "baselines.db");
  migrate_cache(db);

  std::string device = o.device;
  const std::vector<std::string> gpu_ids = device == "cpu" ? std::vector<std::string>{} : visible_gpus();
  const int gpus = static_cast<int>(gpu_ids.size());
  if (device == "auto") device = gpus > 0 ? "cuda" : "cpu";
  OPFORGE_CHECK(device != "cuda" || gpus > 0, "--device cuda, but no NVIDIA GPU is visible (no /dev/nvidia*, or CUDA_VISIBLE_DEVICES hides them)");
  std::uint64_t seed = o.seed ? *o.seed : std::random_device{}() % 1000000007ULL;

  unsigned hw = usable_cpus();
  std::map<std::string, std::string> env;
  if (o.sandbox) {
    // Read-only for the solution: our Python and data, the venv, where the tasks come from.
    std::string ro = (project_root() / "python").string() + ":" + (project_root() / "data").string() + ":" +
                     fs::weakly_canonical(python_executable()).parent_path().parent_path().string() + ":" +
                     fs::absolute(o.tasks).string();
    env["OPFORGE_SANDBOX"] = "1";
    env["OPFORGE_SANDBOX_RO"] = ro;
  }
  auto finish_row = [&](Job& j, json row) {
    const EvalTask& t = tasks[j.task];
    row["task"] = t.name;
    row["task_id"] = t.id;
    row["solution"] = j.sol.key;
    row["layout"] = j.sol.folder ? "folder" : "file";
    j.row = std::move(row);
    j.done = true;
  };
  auto failed_row = [](const std::string& reason, const std::string& detail, bool compiled) {
    return json{{"compiled", compiled}, {"correct", false}, {"reason", reason}, {"detail", detail},
                {"max_error", nullptr}, {"flags", json::array()}};
  };

  // Phase 1: build every solution, in parallel over the cores.
  for (auto& j : jobs) {
    j.work = fs::absolute(out / "work" / j.sol.key);
    copy_solution(j.sol, j.work);
    if (j.sol.folder && !fs::exists(j.work / "model_new.py"))
      finish_row(j, failed_row("no_model_new", "the solution folder has no model_new.py", false));
  }
  std::vector<std::size_t> to_build;
  for (std::size_t i = 0; i < jobs.size(); ++i)
    if (!jobs[i].done) to_build.push_back(i);
  fs::create_directories(out / "logs");
  if (!to_build.empty()) {
    WorkerPoolOptions p;
    int n = o.compile_workers > 0 ? o.compile_workers : static_cast<int>(hw);
    p.workers = std::max(1, std::min<int>(n, static_cast<int>(to_build.size())));
    p.timeout_s = o.compile_timeout_s;
    p.memory_limit_mb = o.memory_limit_mb ? o.memory_limit_mb : 0;
    p.log_file = out / "logs" / "workers.log";
    p.env = env;
    // torch's ninja builds take MAX_JOBS cores each: the cores shared out between the builds.
    p.env["MAX_JOBS"] = std::to_string(std::max(1u, hw / static_cast<unsigned>(p.workers)));
    // Pinned like the evaluation workers (builds import torch, and a CUDA extension may touch its GPU).
    p.slot_env = gpu_slot_env(device == "cuda" ? gpu_ids : std::vector<std::string>{}, p.workers,
                              fs::absolute(cache) / "locks");
    WorkerPool pool(p);
    std::vector<json> reqs;
    for (auto i : to_build)
      reqs.push_back({{"op", "eval_compile"},
                      {"timeout_s", o.compile_timeout_s},
                      {"args",
                       {{"solution_dir", jobs[i].work.string()},
                        {"entry", jobs[i].entry},
                        {"layout", jobs[i].sol.folder ? "folder" : "file"},
                        {"cache_dir", fs::absolute(cache).string()}}}});
    spdlog::info("building {} solution(s) with {} worker(s)", reqs.size(), p.workers);
    Progress progress("build", reqs.size());
    long failed = 0;
    pool.run(reqs, [&](WorkerResult&& r) {
      Job& j = jobs[to_build[r.index]];
      if (r.outcome == Outcome::timeout) {
        finish_row(j, failed_row("compile_timeout", fmt::format("no build within --compile-timeout-s {}", o.compile_timeout_s), false));
      } else if (r.outcome != Outcome::ok) {
        finish_row(j, failed_row(outcome_name(r.outcome), r.reason + "\n" + tail(r.log_tail, 2000), false));
      } else if (!r.reply.value("ok", false)) {
        finish_row(j, failed_row("eval_error", r.reply.value("message", "") + "\n" + tail(r.reply.value("traceback", ""), 2000), false));
      } else if (!r.reply["result"]["ok"].get<bool>()) {
        auto& res = r.reply["result"];
        finish_row(j, failed_row(res["reason"], res["detail"], false));
      } else {
        j.row["compile_seconds"] = r.reply["result"]["seconds"];
      }
      failed += j.done;
      progress.tick(1, fmt::format("{} failed", failed));
    });
    progress.finish();
  }

  // Phase 2: check and time what built.
  std::vector<std::size_t> to_eval;
  for (std::size_t i = 0; i < jobs.size(); ++i)
    if (!jobs[i].done) to_eval.push_back(i);
  json worker_info = json::object();
  std::string devname = device == "cpu" ? cpu_device_name() : "";
  std::optional<WorkerPool> pool;
  int eval_workers = 1;
  {
    WorkerPoolOptions p;
    p.workers = o.workers > 0 ? o.workers : (device == "cuda" ? gpus : 1);
    p.workers = std::max(1, std::min<int>(p.workers, std::max<int>(1, static_cast<int>(to_eval.size()))));
    p.timeout_s = o.timeout_s;
    p.memory_limit_mb = o.memory_limit_mb;
    p.log_file = out / "logs" / "workers.log";
    p.env = env;
    // The side-stream check reads the whole device as idle or busy: it holds only when the
    // worker is its GPU's one evaluator (OPFORGE_WORKERS_ON_GPU, read by evaluate.py).
    p.slot_env = gpu_slot_env(device == "cuda" ? gpu_ids : std::vector<std::string>{}, p.workers,
                              fs::absolute(cache) / "locks");
    if (device != "cuda")
      for (auto& e : p.slot_env) e["TORCHINDUCTOR_COMPILE_THREADS"] = "1";
    eval_workers = p.workers;
    pool.emplace(p);
  }
  if (!to_eval.empty() || o.plots) {
    WorkerResult ping = pool->call({{"op", "ping"}});
    OPFORGE_CHECK(ping.outcome == Outcome::ok, "an evaluation worker did not start: {}", ping.reason);
    worker_info = pool->worker_info();
  }
  std::string torch_version = worker_info.value("torch", "");
  if (device == "cuda") devname = worker_info.value("device_name", "cuda");

  auto cached = [&](const std::string& hash) -> std::optional<json> {
    auto st = db.prepare("SELECT eager, compile, note FROM eval_baselines WHERE code_hash = ? AND device_name = ? AND torch = ?");
    st.bind(1, hash).bind(2, devname).bind(3, torch_version);
    if (!st.step()) return std::nullopt;
    return json{{"eager", json::parse(st.text(0))},
                {"compile", st.is_null(1) ? json(nullptr) : json::parse(st.text(1))},
                {"note", st.is_null(2) ? "" : st.text(2)},
                {"cached", true}};
  };
  auto store_baselines = [&](const std::string& hash, const json& res) {
    with_context("while caching baselines", [&] {
      db.transaction([&] {
        auto st = db.prepare("INSERT OR REPLACE INTO eval_baselines(code_hash, device_name, torch, eager, compile, note) "
                             "VALUES(?, ?, ?, ?, ?, ?)");
        st.bind(1, hash).bind(2, res["device_name"].get<std::string>()).bind(3, res["torch"].get<std::string>());
        st.bind(4, res["eager"].dump());
        if (res["compile"].is_null()) st.bind_null(5); else st.bind(5, res["compile"].dump());
        st.bind(6, res.value("detail", ""));
        st.run();
      });
    });
  };
  // Baselines of the task codes with a correct solution, by xxh3 of the code: eager, compile, note
  // and cached (true when an earlier run measured them).
  std::map<std::string, json> base;
  if (!to_eval.empty()) {
    std::vector<json> reqs;
    for (auto i : to_eval) {
      const EvalTask& t = tasks[jobs[i].task];
      reqs.push_back({{"op", "eval_solution"},
                      {"timeout_s", o.timeout_s},
                      {"args",
                       {{"task_code", t.code},
                        {"solution_dir", jobs[i].work.string()},
                        {"entry", jobs[i].entry},
                        {"layout", jobs[i].sol.folder ? "folder" : "file"},
                        {"cache_dir", fs::absolute(cache).string()},
                        {"device", device},
                        {"policy", o.policy},
                        {"atol", o.atol},
                        {"rtol", o.rtol},
                        {"correct_trials", o.correct_trials},
                        {"trials", o.trials},
                        {"budget_s", o.budget_s},
                        {"seed", seed}}}});
    }
    spdlog::info("evaluating {} solution(s) on {} ({}) with {} worker(s), policy {}, seed {}", reqs.size(), device,
                 devname, eval_workers, o.policy, seed);
    Progress progress("eval", reqs.size());
    long correct = 0;
    pool->run(reqs, [&](WorkerResult&& r) {
      Job& j = jobs[to_eval[r.index]];
      json compile_s = j.row.value("compile_seconds", json(nullptr));
      if (r.outcome != Outcome::ok) {
        finish_row(j, failed_row(outcome_name(r.outcome), r.reason + "\n" + tail(r.log_tail, 2000), true));
      } else if (!r.reply.value("ok", false)) {
        finish_row(j, failed_row("eval_error", r.reply.value("message", "") + "\n" + tail(r.reply.value("traceback", ""), 2000), true));
      } else {
        json res = r.reply["result"];
        res["compile_seconds"] = compile_s;
        finish_row(j, res);
      }
      correct += j.row["correct"].get<bool>();
      progress.tick(1, fmt::format("{} correct", correct));
    });
    progress.finish();

    // Baselines once per task code that has a correct solution and none cached, each in a request
    // of its own: timed after the solutions, no failing (or crashing) solution of the same code
    // can take a correct one's speed-up away.
    std::map<std::string, std::string> missing;  // code hash -> code
    for (auto i : to_eval) {
      if (!jobs[i].row.value("correct", false)) continue;
      const std::string& code = tasks[jobs[i].task].code;
      std::string h = xxh3_hex(code);
      if (base.count(h) || missing.count(h)) continue;
      if (auto c = cached(h)) base[h] = std::move(*c); else missing.emplace(h, code);
    }
    if (!missing.empty()) {
      std::vector<json> breqs;
      std::vector<std::string> bhashes;
      for (auto& [h, code] : missing) {
        bhashes.push_back(h);
        breqs.push_back({{"op", "eval_baselines"},
                         {"timeout_s", o.timeout_s},
                         {"args", {{"task_code", code}, {"device", device}, {"trials", o.trials},
                                   {"budget_s", o.budget_s}, {"seed", seed}}}});
      }
      spdlog::info("timing eager and torch.compile baselines of {} task(s)", breqs.size());
      pool->run(breqs, [&](WorkerResult&& r) {
        if (r.outcome != Outcome::ok || !r.reply.value("ok", false)) {
          spdlog::warn("baselines of a task could not be measured ({}): {}", outcome_name(r.outcome),
                       r.outcome != Outcome::ok ? r.reason : r.reply.value("message", ""));
          return;
        }
        const json& res = r.reply["result"];
        store_baselines(bhashes[r.index], res);
        base[bhashes[r.index]] = {{"eager", res["eager"]}, {"compile", res["compile"]},
                                  {"note", res.value("detail", "")}, {"cached", false}};
      });
    }
  }

  // Figures and reward, one place.
  long reused = 0;
  json results = json::array();
  for (auto& j : jobs) {
    json& r = j.row;
    if (r.value("correct", false)) {
      if (auto b = base.find(xxh3_hex(tasks[j.task].code)); b != base.end()) {
        r["eager"] = b->second["eager"];
        r["compile"] = b->second["compile"];
        if (!b->second["note"].get<std::string>().empty()) r["detail"] = b->second["note"];
        r["baseline_cached"] = b->second["cached"];
        reused += b->second["cached"].get<bool>();
      }
    }
    auto cand = num(r.value("candidate", json()), "median_ms");
    auto eager = num(r.value("eager", json()), "median_ms");
    auto comp = num(r.value("compile", json()), "median_ms");
    std::optional<double> se, sc;
    if (cand && *cand > 0 && eager) se = *eager / *cand;
    if (cand && *cand > 0 && comp) sc = *comp / *cand;
    bool ok = r.value("correct", false);
    json row = {{"task", r["task"]},
                {"task_id", r["task_id"]},
                {"solution", r["solution"]},
                {"layout", r["layout"]},
                {"compiled", r.value("compiled", false)},
                {"correct", ok},
                {"reason", r.value("reason", json(nullptr))},
                {"detail", tail(r.value("detail", std::string()), 4000)},
                {"max_error", r.value("max_error", json(nullptr))},
                {"flags", r.value("flags", json::array())},
                {"candidate_ms", opt(ok ? cand : std::nullopt)},
                {"eager_ms", opt(eager)},
                {"compile_ms", opt(comp)},
                {"speedup_eager", opt(ok ? se : std::nullopt)},
                {"speedup_compile", opt(ok ? sc : std::nullopt)},
                {"reward", reward(ok, se, sc, o.speedup_margin)},
                {"timing", {{"candidate", r.value("candidate", json(nullptr))}, {"eager", r.value("eager", json(nullptr))},
                            {"compile", r.value("compile", json(nullptr))}}},
                {"baseline_cached", r.value("baseline_cached", json(nullptr))},
                {"compile_seconds", r.value("compile_seconds", json(nullptr))},
                {"extension_calls", r.value("extension_calls", json(nullptr))},
                {"sandbox", r.value("sandbox", json(nullptr))}};
    results.push_back(row);
  }
  std::sort(results.begin(), results.end(), [](const json& a, const json& b) {
    return std::make_pair(a["task"].get<std::string>(), a["solution"].get<std::string>()) <
           std::make_pair(b["task"].get<std::string>(), b["solution"].get<std::string>());
  });
  json summary = summarize(results, o.speedup_margin);
  summary["tasks"] = static_cast<long>(tasks.size());
  summary["tasks_without_solution"] = without;
  summary["unmatched_solutions"] = unmatched;
  summary["baselines_reused"] = reused;
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  json report = {{"summary", summary},
                 {"results", results},
                 {"options",
                  {{"tasks", fs::absolute(o.tasks).string()},
                   {"solutions", fs::absolute(o.solutions).string()},
                   {"device", device},
                   {"device_name", devname},
                   {"torch", torch_version},
                   {"policy", o.policy},
                   {"trials", o.trials},
                   {"correct_trials", o.correct_trials},
                   {"atol", o.atol},
                   {"rtol", o.rtol},
                   {"speedup_margin", o.speedup_margin},
                   {"seed", seed},
                   {"sandbox", o.sandbox},
                   {"cache_dir", fs::absolute(cache).string()}}},
                 {"seconds", secs},
                 {"version", version()}};
  with_context(fmt::format("while writing the report into {}", out.string()), [&] {
    std::ofstream(out / "report.json") << report.dump(2) << "\n";
    std::ofstream(out / "report.md") << report_markdown(report);
  });
  if (o.plots) {
    WorkerResult r = pool->call({{"op", "eval_plots"}, {"args", {{"report", report}, {"out_path", fs::absolute(out / "report.png").string()}}}});
    if (r.outcome != Outcome::ok || !r.reply.value("ok", false))
      spdlog::warn("the plot was not drawn (matplotlib missing?): {}{}", r.reason, r.reply.value("message", ""));
  }
  return report;
}

std::string report_markdown(const json& report) {
  const json& s = report["summary"];
  auto pct = [](const json& v) { return v.is_number() ? fmt::format("{:.1f}%", 100 * v.get<double>()) : std::string("-"); };
  auto x = [](const json& v) { return v.is_number() ? fmt::format("{:.3f}x", v.get<double>()) : std::string("-"); };
  auto ms = [](const json& v) { return v.is_number() ? fmt::format("{:.4g}", v.get<double>()) : std::string("-"); };
  std::string md = "# opforge eval report\n\n";
  const json& o = report["options"];
  md += fmt::format("Device `{}` ({}), torch {}, policy `{}`, {} correctness sets, atol=rtol={:g}/{:g}, margin {:g}, "
                    "seed {}.\n\n",
                    o["device"].get<std::string>(), o["device_name"].get<std::string>(), o["torch"].get<std::string>(),
                    o["policy"].get<std::string>(), o["correct_trials"].get<int>(), o["atol"].get<double>(),
                    o["rtol"].get<double>(), o["speedup_margin"].get<double>(), o["seed"].get<std::uint64_t>());
  md += "| metric | value |\n| --- | --- |\n";
  md += fmt::format("| solutions evaluated | {} |\n", s["evaluated"].get<long>());
  md += fmt::format("| compiled | {} |\n", s["compiled"].get<long>());
  md += fmt::format("| pass rate | {} |\n", pct(s["pass_rate"]));
  md += fmt::format("| faster than eager | {} |\n", pct(s["faster_than_eager_rate"]));
  md += fmt::format("| faster than torch.compile | {} |\n", pct(s["faster_than_compile_rate"]));
  md += fmt::format("| geomean speed-up vs eager (correct) | {} |\n", x(s["geomean_speedup_eager"]));
  md += fmt::format("| geomean speed-up vs compile (correct) | {} |\n", x(s["geomean_speedup_compile"]));
  md += fmt::format("| mean reward | {} |\n", s["mean_reward"].is_number() ? fmt::format("{:.3f}", s["mean_reward"].get<double>()) : "-");
  const json& h = s["reward_histogram"];
  md += fmt::format("| reward histogram (-1 / 1 / 2 / 3) | {} / {} / {} / {} |\n", h["-1"].get<long>(), h["1"].get<long>(),
                    h["2"].get<long>(), h["3"].get<long>());
  md += fmt::format("| tasks without a solution | {} |\n", s["tasks_without_solution"].get<long>());
  md += "\n| task | solution | compiled | correct | max error | candidate ms | eager ms | compile ms | vs eager | vs compile | reward | reason |\n";
  md += "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n";
  for (auto& r : report["results"]) {
    std::string reason = r["reason"].is_null() ? "" : "`" + r["reason"].get<std::string>() + "`";
    for (auto& f : r["flags"]) reason += (reason.empty() ? "" : " ") + std::string("flag `") + f.get<std::string>() + "`";
    md += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n", r["task"].get<std::string>(),
                      r["solution"].get<std::string>(), r["compiled"].get<bool>() ? "yes" : "no",
                      r["correct"].get<bool>() ? "yes" : "no",
                      r["max_error"].is_number() ? fmt::format("{:.2g}", r["max_error"].get<double>()) : "-",
                      ms(r["candidate_ms"]), ms(r["eager_ms"]), ms(r["compile_ms"]), x(r["speedup_eager"]),
                      x(r["speedup_compile"]), r["reward"].get<int>(), reason);
  }
  return md;
}

}  // namespace opforge::evaluator
