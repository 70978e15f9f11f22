// opforge eval, the judge's supervisor: matches solutions to tasks, then runs the phases in pools of
// trusted judge workers (python/opforge/judge.py), which start one sandboxed child per solution and
// never run solution code themselves (docs/architecture.md, "The judge").
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <random>
#include <set>

#include "evaluator.h"
#include "internal.h"
#include "run.h"
#include "opforge/core/error.h"
#include "opforge/core/gpus.h"
#include "opforge/core/hash.h"
#include "opforge/core/paths.h"
#include "opforge/core/progress.h"
#include "opforge/core/worker_pool.h"

namespace opforge::evaluator {

namespace {

std::string tail(const std::string& s, std::size_t n) { return s.size() <= n ? s : "…" + s.substr(s.size() - n); }

json failed_row(const std::string& reason, const std::string& detail, bool compiled) {
  return {{"compiled", compiled}, {"correct", false}, {"reason", reason}, {"detail", detail},
          {"max_error", nullptr}, {"flags", json::array()}};
}

void copy_solution(const SolutionEntry& s, const fs::path& dst) {
  // Only the solution's own files; links are copied as links, so the judge refuses them instead
  // of following one to a file outside.
  fs::remove_all(dst);
  fs::create_directories(dst);
  if (s.folder)
    fs::copy(s.path, dst, fs::copy_options::recursive | fs::copy_options::copy_symlinks);
  else
    fs::copy_file(s.path, dst / s.path.filename(), fs::copy_options::overwrite_existing);
}

// A worker's answer as a row: a dead or failing judge worker is the environment's failure, said so.
std::optional<json> pool_failure(const WorkerResult& r, bool compiled) {
  if (r.outcome != Outcome::ok)
    return failed_row(r.outcome == Outcome::timeout ? "judge_timeout" : "judge_" + std::string(outcome_name(r.outcome)),
                      "the judge's worker failed (not the solution's verdict): " + r.reason + "\n" + tail(r.log_tail, 2000),
                      compiled);
  if (!r.reply.value("ok", false))
    return failed_row("judge_error", r.reply.value("message", "") + "\n" + tail(r.reply.value("traceback", ""), 2000),
                      compiled);
  return std::nullopt;
}

}  // namespace

fs::path default_cache_dir() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return fs::path(x) / "opforge" / "eval";
  if (const char* h = std::getenv("HOME"); h && *h) return fs::path(h) / ".cache" / "opforge" / "eval";
  return fs::temp_directory_path() / "opforge-eval-cache";
}

// ----------------------------------------------------------------------------------------------
// The run


void Run::match() {
  std::map<std::string, std::size_t> by_name, by_id;
  for (std::size_t i = 0; i < tasks.size(); ++i) {
    if (!by_name.emplace(tasks[i].name, i).second) spdlog::warn("two tasks are named {}: solutions match the first", tasks[i].name);
    by_id.emplace(tasks[i].id, i);
  }
  std::set<std::size_t> solved;
  for (auto& s : find_solutions(o.solutions)) {
    auto it = by_name.find(s.key);  // a file stem says which file it answers; then ids
    if (it == by_name.end()) it = by_id.find(s.key);
    if (it == by_id.end()) {
      unmatched.push_back(s.key);
      continue;
    }
    if (!solved.insert(it->second).second)
      spdlog::warn("task {} has more than one solution; {} is evaluated as well", tasks[it->second].name, s.key);
    jobs.push_back({it->second, s, {}, s.folder ? "model_new.py" : s.path.filename().string()});
  }
  if (!unmatched.empty())
    spdlog::warn("{} solution(s) match no task by name or id: {}", unmatched.size(), tail(unmatched.dump(), 300));
  without = static_cast<long>(tasks.size() - solved.size());
}

void Run::resume(Journal& jr) {
  journal = &jr;
  for (auto& j : jobs) {
    j.digest = solution_digest(tasks[j.task].code, j.sol, jr.digest_key());
    if (const json* row = jr.find(j.digest)) {
      j.row = *row;
      j.done = true;
      ++resumed;
    }
  }
}

void Run::record(const Job& j) {
  // A judge's own failure (judge_timeout, judge_worker_crash, ...) is the environment's, never a
  // verdict to keep: the next run judges that solution again.
  if (j.row.value("reason", json(nullptr)).is_string() && j.row["reason"].get<std::string>().rfind("judge_", 0) == 0)
    return;
  if (journal && !j.digest.empty()) journal->add(j.digest, j.sol.key, j.row);
}

WorkerPoolOptions Run::pool_options(int workers, double timeout_s) const {
  WorkerPoolOptions p;
  p.workers = std::max(1, workers);
  p.timeout_s = timeout_s;
  p.memory_limit_mb = o.memory_limit_mb;
  p.log_file = out / "logs" / "workers.log";
  p.slot_env = gpu_slot_env(device == "cuda" ? gpu_ids : std::vector<std::string>{}, p.workers, fs::absolute(cache) / "locks");
  if (device != "cuda")
    for (auto& e : p.slot_env) e["TORCHINDUCTOR_COMPILE_THREADS"] = "1";
  return p;
}

Measure Run::measure() const {
  Measure m;
  m.device = device;
  m.launch = launch.spec;
  m.trials = o.trials;
  m.correct_trials = o.correct_trials;
  m.budget_s = o.budget_s;
  m.timeout_s = o.timeout_s;
  m.seed = seed;
  m.log_path = fs::absolute(out / "logs" / "solutions.log").string();
  return m;
}

WorkerPoolOptions Run::build_pool_options(int workers) const {
  WorkerPoolOptions p = pool_options(workers, o.compile_timeout_s);
  // torch's ninja builds take MAX_JOBS cores each: the cores shared out between the builds.
  p.env["MAX_JOBS"] = std::to_string(std::max(1u, usable_cpus() / static_cast<unsigned>(p.workers)));
  return p;
}

// Phase 1: static checks and sandboxed builds, in parallel over the cores.
void Run::build(WorkerPool* shared) {
  std::vector<std::size_t> todo;
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    Job& j = jobs[i];
    if (j.done) continue;  // resumed from the journal
    j.work = fs::absolute(out / "work" / j.sol.key);
    copy_solution(j.sol, j.work);
    if (j.sol.folder && !fs::exists(j.work / "model_new.py")) {
      j.row = failed_row("no_model_new", "the solution folder has no model_new.py", false);
      j.done = true;
      record(j);
    } else {
      todo.push_back(i);
    }
  }
  if (todo.empty()) return;
  std::optional<WorkerPool> own;
  if (!shared) {
    int n = std::min<int>(o.compile_workers > 0 ? o.compile_workers : static_cast<int>(usable_cpus()),
                          static_cast<int>(todo.size()));
    own.emplace(build_pool_options(n));
  }
  WorkerPool& pool = shared ? *shared : *own;
  std::vector<json> reqs;
  for (auto i : todo) {
    CompileRequest c{jobs[i].work.string(), jobs[i].entry, jobs[i].sol.folder ? "folder" : "file",
                     fs::absolute(cache).string(), o.policy, fs::absolute(out / "logs" / "builds.log").string(),
                     launch.spec, o.compile_timeout_s};
    reqs.push_back(request("eval_compile", c, o.compile_timeout_s));
  }
  spdlog::info("building {} solution(s), each in a sandboxed child", reqs.size());
  mark("build", reqs.size());
  Progress progress("build", reqs.size());
  long failed = 0;
  pool.run(reqs, [&](WorkerResult&& r) {
    Job& j = jobs[todo[r.index]];
    if (auto f = pool_failure(r, false)) {
      j.row = *f;
      j.done = true;
    } else {
      const json& res = r.reply["result"];
      j.row = {{"compile_seconds", res["seconds"]}, {"artifacts", res["artifacts"]}, {"findings", res["findings"]}};
      if (!res["ok"].get<bool>()) {
        json row = failed_row(res["reason"], res["detail"], false);
        row["findings"] = res["findings"];
        j.row = row;
        j.done = true;
      }
    }
    if (j.done) record(j);
    failed += j.done;
    progress.tick(1, fmt::format("{} failed", failed));
  });
  progress.finish();
}

// On a GPU each judge worker starts its first spare child now, so that it has imported torch and
// made its CUDA context while the solutions build: the first solution's dispatch then costs what
// every later one does (docs/architecture.md, "The judge"). One request per worker: each blocks
// until its spare is up, so an idle worker takes the next. A spare that fails to start is only
// logged: the solution then starts a child of its own, as before.
void Run::prestart(WorkerPool& pool, int workers) {
  if (device == "cpu") return;
  PrestartRequest p{device, fs::absolute(out / "logs" / "solutions.log").string(), launch.spec, o.timeout_s, !o.untimed};
  std::vector<json> reqs(static_cast<std::size_t>(workers), request("eval_prestart", p, o.timeout_s));
  pool.run(reqs, [&](WorkerResult&& r) {
    if (r.outcome != Outcome::ok || !r.reply.value("ok", false))
      spdlog::warn("a judge worker's spare child did not start ahead: {}{}", r.reason, r.reply.value("message", ""));
  });
}

// Static findings become the row's verdict (symbols of aten compute: stopped) or its flags.
static void apply_findings(json& row, const json& findings) {
  std::set<std::string> flags;
  for (auto& f : row.value("flags", json::array())) flags.insert(f.get<std::string>());
  for (auto& f : findings) {
    std::string kind = f["kind"];
    if (kind == "forbidden_op" && row.value("correct", false)) {
      row["correct"] = false;
      row["reason"] = "forbidden_op";
      row["detail"] = fmt::format("the built extension {} (--policy strict allows only allocation, views and the "
                                  "solution's own kernels)", f.value("what", std::string()));
    } else if (kind != "forbidden_op") {
      flags.insert(kind);
    }
  }
  row["flags"] = json(std::vector<std::string>(flags.begin(), flags.end()));
  row["findings"] = findings;
}

// A worker's answer to eval_solution as the job's row, keeping what the build phase found.
json Run::judged_row(const Job& j, const WorkerResult& r) const {
  json findings = j.row.value("findings", json::array());
  json compile_s = j.row.value("compile_seconds", json(nullptr));
  json row = pool_failure(r, true).value_or(r.outcome == Outcome::ok ? r.reply.value("result", json::object())
                                                                       : json::object());
  row["compile_seconds"] = compile_s;
  row["artifacts"] = j.row.value("artifacts", json(nullptr));  // the build's, for a second attempt
  apply_findings(row, findings);
  if (!launch.sandboxed) row["flags"].push_back("sandbox_off");
  return row;
}

bool memory_verdict(const json& row) {
  json reason = row.value("reason", json());
  return reason == "out_of_memory" || reason == "judge_out_of_memory";
}

namespace {

std::string verdict_name(const json& row) {
  json reason = row.value("reason", json());
  return reason.is_string() ? reason.get<std::string>() : row.value("correct", false) ? "correct" : "no reason";
}

json attempt(const json& row, const char* how) {
  return {{"how", how}, {"correct", row.value("correct", false)}, {"reason", row.value("reason", json(nullptr))}};
}

}  // namespace

json Run::solution_request(const Job& j, std::uint64_t input_seed) const {
  Measure m = measure();
  m.seed = input_seed;
  SolutionRequest s{tasks[j.task].code, j.work.string(), j.entry, j.sol.folder ? "folder" : "file", o.policy,
                    j.row.value("artifacts", json(nullptr)), o.atol, o.rtol, !o.untimed, m};
  return request("eval_solution", s, o.timeout_s);
}

// Phase 2: each built solution checked (and timed) by a judge worker; `judges` of them share the
// devices. A verdict of memory made while they shared one is the neighbours' as much as the
// solution's, so it is judged again alone before it stands (judge_alone).
void Run::evaluate(WorkerPool& pool, int judges) {
  std::vector<std::size_t> todo;
  std::vector<json> reqs;
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    if (jobs[i].done) continue;
    todo.push_back(i);
    reqs.push_back(solution_request(jobs[i], seed));
  }
  if (reqs.empty()) return;
  spdlog::info("evaluating {} solution(s) on {} ({}), policy {}{}, seed {}, sandbox: {}", reqs.size(), device,
               worker_info.value("device_name", device), o.policy, o.untimed ? ", untimed (checks only)" : "", seed,
               launch.profile);
  mark("evaluate", reqs.size());
  // Sharing: more solutions in flight than devices (a batch of one in serve shares nothing).
  int in_flight = std::min<int>(judges, static_cast<int>(reqs.size()));
  bool sharing = in_flight > std::max<int>(1, device == "cuda" ? static_cast<int>(gpu_ids.size()) : 1);
  std::vector<std::size_t> again;
  auto t0 = std::chrono::steady_clock::now();
  Progress progress("eval", reqs.size());
  long correct = 0;
  pool.run(reqs, [&](WorkerResult&& r) {
    Job& j = jobs[todo[r.index]];
    j.row = judged_row(j, r);
    j.done = true;
    if (sharing && memory_verdict(j.row))
      again.push_back(todo[r.index]);  // recorded once judged alone
    else
      record(j);
    correct += j.row.value("correct", false);
    progress.tick(1, fmt::format("{} correct", correct));
  });
  progress.finish();
  // The alone pass may take as long as the shared one (60 s at least), so a batch of answers that
  // run out of memory on purpose, slowly, at most doubles its batch's time.
  double shared_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  judge_alone(pool, again, in_flight, std::max(60.0, shared_s));
}

// One request at a time, so no other solution is on any device: the caller's thread alone drives
// the pool (eval's main thread, serve's dispatcher), and an idle worker holds no cached memory
// (judge.py empties its cache after each solution). On inputs of another seed: nothing the first
// attempt saw is an answer key for the second. Both verdicts are kept in "attempts". Past
// budget_s the rest keep the verdict they had (serial attempts are a solution's lever on the
// judge's time; no reward is gained by that).
void Run::judge_alone(WorkerPool& pool, const std::vector<std::size_t>& again, int judges, double budget_s) {
  if (again.empty()) return;
  spdlog::warn("{} solution(s) ran out of memory while {} judge workers shared the {}: judging each again alone",
               again.size(), judges, device == "cuda" ? "GPUs" : "machine");
  auto t0 = std::chrono::steady_clock::now();
  long kept = 0;
  for (std::size_t i : again) {
    bool in_budget = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < budget_s;
    kept += !judge_again_alone(pool, jobs[i], in_budget, budget_s);
    record(jobs[i]);
  }
  if (kept) spdlog::warn("{} solution(s) keep their shared verdict: the alone pass spent its {:.0f} s", kept, budget_s);
}

bool Run::judge_again_alone(WorkerPool& pool, Job& j, bool in_budget, double budget_s) const {
  json first = attempt(j.row, "shared");
  if (!in_budget) {
    j.row["attempts"] = json::array({first});
    j.row["detail"] = fmt::format("{} (not judged again alone: the alone pass had spent its {:.0f} s)",
                                  j.row.value("detail", std::string()), budget_s);
    return false;
  }
  j.row = judged_row(j, pool.call(solution_request(j, (seed + 0x9e3779b97f4a7c15ULL) % 1000000007ULL)));
  j.row["attempts"] = json::array({first, attempt(j.row, "alone")});
  spdlog::info("  {}: {} alone (was {} shared)", j.sol.key, verdict_name(j.row), verdict_name(first));
  return true;
}

// Baselines once per task code that has a correct solution and none cached, each in a request of
// its own after the solutions: no failing solution of the same code can take a correct one's
// speed-up away.
void Run::baselines(WorkerPool& pool) {
  if (o.untimed) return;  // nothing to compare a speed with
  BaselineCache db(cache / "baselines.db");
  std::map<std::string, std::string> missing;  // code hash -> code
  for (auto& j : jobs) {
    if (!j.row.value("correct", false)) continue;
    const std::string& code = tasks[j.task].code;
    std::string h = xxh3_hex(code);
    if (base.count(h) || missing.count(h)) continue;
    if (auto c = db.get(h, device_key)) base[h] = std::move(*c); else missing.emplace(h, code);
  }
  if (missing.empty()) return;
  std::vector<json> reqs;
  std::vector<std::string> hashes;
  for (auto& [h, code] : missing) {
    hashes.push_back(h);
    reqs.push_back(baseline_request(code));
  }
  spdlog::info("timing eager and torch.compile baselines of {} task(s), each in its own child", reqs.size());
  mark("baselines", reqs.size());
  pool.run(reqs, [&](WorkerResult&& r) {
    if (auto b = baseline_entry(r, db, hashes[r.index])) base[hashes[r.index]] = std::move(*b);
  });
}

json Run::baseline_request(const std::string& code) const {
  return request("eval_baselines", BaselineRequest{code, fs::absolute(cache).string(), measure()}, o.timeout_s);
}

std::optional<json> Run::baseline_entry(const WorkerResult& r, BaselineCache& db, const std::string& hash) const {
  if (auto f = pool_failure(r, true)) {
    spdlog::warn("baselines of a task could not be measured: {}", (*f)["detail"].get<std::string>());
    return std::nullopt;
  }
  const json& res = r.reply["result"];
  if (res["eager"].is_null()) {
    spdlog::warn("baselines of a task could not be measured: {}", res.value("detail", ""));
    return std::nullopt;
  }
  db.put(hash, device_key, res);
  return json{{"eager", res["eager"]}, {"compile", res["compile"]}, {"note", res.value("detail", "")}, {"cached", false}};
}

json Run::rows() {
  json results = json::array();
  for (auto& j : jobs) results.push_back(row(j));
  std::sort(results.begin(), results.end(), [](const json& a, const json& b) {
    return std::make_pair(a["task"].get<std::string>(), a["solution"].get<std::string>()) <
           std::make_pair(b["task"].get<std::string>(), b["solution"].get<std::string>());
  });
  return results;
}

json Run::row(Job& j) {
  json& r = j.row;
  const EvalTask& t = tasks[j.task];
  r["task"] = t.name;
  r["task_id"] = t.id;
  r["solution"] = j.sol.key;
  r["layout"] = j.sol.folder ? "folder" : "file";
  r["sandbox"] = launch.profile;
  if (r.value("correct", false) && !o.untimed) {  // untimed takes no baselines: none is missing
    if (auto b = base.find(xxh3_hex(t.code)); b != base.end()) {
      r["eager"] = b->second["eager"];
      r["compile"] = b->second["compile"];
      if (!b->second["note"].get<std::string>().empty()) r["detail"] = b->second["note"];
      r["baseline_cached"] = b->second["cached"];
    } else {
      r["flags"].push_back("no_baseline");
    }
  }
  return make_row(r, o.speedup_margin);
}

json Run::report(double secs) {
  json results = rows();
  long reused = 0;
  for (auto& r : results) reused += r.value("baseline_cached", json(false)).is_boolean() && r["baseline_cached"].get<bool>();
  json summary = summarize(results, o.speedup_margin);
  summary["tasks"] = static_cast<long>(tasks.size());
  summary["tasks_without_solution"] = without;
  summary["unmatched_solutions"] = unmatched;
  summary["baselines_reused"] = reused;
  summary["resumed"] = resumed;
  json options = {{"tasks", fs::absolute(o.tasks).string()}, {"solutions", fs::absolute(o.solutions).string()},
                  {"device", device}, {"device_name", worker_info.value("device_name", device)},
                  {"torch", worker_info.value("torch", "")}, {"policy", o.policy}, {"trials", o.trials},
                  {"correct_trials", o.correct_trials}, {"atol", o.atol}, {"rtol", o.rtol},
                  {"speedup_margin", o.speedup_margin}, {"seed", seed}, {"sandbox", launch.sandboxed},
                  {"sandbox_profile", launch.profile}, {"judge", kJudgeVersion}, {"baseline_key", device_key},
                  {"cache_dir", fs::absolute(cache).string()}, {"untimed", o.untimed}};
  return {{"summary", summary}, {"results", results}, {"options", options}, {"seconds", secs}, {"version", version()}};
}

namespace {

std::string cpu_device_name() {
  // The spelling python/opforge/judge.py:device_name uses.
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("model name", 0) != 0) continue;
    std::string v = line.substr(line.find(':') + 1);
    v.erase(0, v.find_first_not_of(" \t"));
    v.erase(v.find_last_not_of(" \t\r") + 1);
    return "cpu: " + v;
  }
  return "cpu";
}

void write_report(const json& report, const fs::path& out) {
  with_context(fmt::format("while writing the report into {}", out.string()), [&] {
    std::ofstream(out / "report.json") << report.dump(2) << "\n";
    std::ofstream(out / "report.md") << report_markdown(report);
  });
}

}  // namespace

std::string baseline_key(const json& info, const std::string& device, const EvalOptions& o) {
  std::string dev = device == "cuda" ? info.value("device_name", "cuda") + " " + info.value("device_uuid", "") +
                                           " cuda " + info.value("cuda", "")
                                     : cpu_device_name();
  return fmt::format("{} | torch {} | {} | trials {} budget {:g}", dev, info.value("torch", ""), kJudgeVersion,
                     o.trials, o.budget_s);
}

namespace {

// Everything a journal row depends on besides its task and files (journal.h).
std::string fingerprint(const Run& r) {
  const EvalOptions& o = r.o;
  // The sandbox's profile without its parenthesised details: they name this process's cgroup,
  // which differs between two runs on one machine (on the H200 a resumed run judged all anew).
  std::string sandbox = r.launch.profile.substr(0, r.launch.profile.find(" ("));
  json f = {{"judge", kJudgeVersion}, {"device_key", r.device_key}, {"sandbox", sandbox},
            {"policy", o.policy}, {"correct_trials", o.correct_trials}, {"atol", o.atol}, {"rtol", o.rtol},
            {"timeout_s", o.timeout_s}, {"compile_timeout_s", o.compile_timeout_s},
            {"child_memory_mb", o.child_memory_mb}, {"memory_limit_mb", o.memory_limit_mb},
            {"workers", o.workers},  // workers: the children's thread count follows it (launch.cpp)
            {"untimed", o.untimed}};
  return xxh3_hex(f.dump());
}

// Tasks, solutions, --out, the cache, the device and the sandbox: what every phase needs.
void prepare(Run& run) {
  const EvalOptions& o = run.o;
  run.tasks = with_context("while reading --tasks", [&] { return load_tasks(o.tasks); });
  OPFORGE_CHECK(!run.tasks.empty(), "--tasks {} holds no task", o.tasks.string());
  run.match();
  run.out = o.out;
  with_context(fmt::format("while preparing --out {}", run.out.string()), [&] {
    fs::create_directories(run.out / "logs");
    fs::remove_all(run.out / "work");
  });
  run.cache = o.cache_dir.empty() ? default_cache_dir() : o.cache_dir;
  fs::create_directories(run.cache / "locks");
  run.device = o.device;
  run.gpu_ids = run.device == "cpu" ? std::vector<std::string>{} : visible_gpus();
  if (run.device == "auto") run.device = run.gpu_ids.empty() ? "cpu" : "cuda";
  OPFORGE_CHECK(run.device != "cuda" || !run.gpu_ids.empty(),
                "--device cuda, but no NVIDIA GPU is visible (no /dev/nvidia*, or CUDA_VISIBLE_DEVICES hides them)");
  run.launch = choose_launch(o, run.device);
}

void draw_plot(WorkerPool& pool, const json& report, const fs::path& out) {
  WorkerResult r = pool.call({{"op", "eval_plots"}, {"args", {{"report", report}, {"out_path", fs::absolute(out / "report.png").string()}}}});
  if (r.outcome != Outcome::ok || !r.reply.value("ok", false))
    spdlog::warn("the plot was not drawn (matplotlib missing?): {}{}", r.reason, r.reply.value("message", ""));
}

}  // namespace

void check_options(const EvalOptions& o) {
  OPFORGE_CHECK(o.policy == "strict" || o.policy == "torch-allowed", "--policy must be strict or torch-allowed, not {}",
                o.policy);
  // Under strict, the profile pass that catches torch compute kernels the import guard misses
  // runs with the timing: a strict judge without it would let such a fallback earn 1.
  OPFORGE_CHECK(!o.untimed || o.policy == "torch-allowed",
                "--untimed needs --policy torch-allowed: under strict the profile pass that catches torch fallback "
                "kernels runs with the timing, so drop --untimed or add --policy torch-allowed");
}

json evaluate(const EvalOptions& o) {
  auto t0 = std::chrono::steady_clock::now();
  check_options(o);
  Run run(o);
  prepare(run);
  // The judge workers start first: the device they report is part of what a journal row is
  // reused under, and resuming decides what still has to be built.
  int n = o.workers > 0 ? o.workers : (run.device == "cuda" ? static_cast<int>(run.gpu_ids.size()) : 1);
  n = std::min<int>(n, std::max<int>(1, static_cast<int>(run.jobs.size())));
  WorkerPool pool(run.pool_options(n, o.timeout_s));
  WorkerResult ping = pool.call({{"op", "ping"}});
  OPFORGE_CHECK(ping.outcome == Outcome::ok, "a judge worker did not start: {}", ping.reason);
  run.worker_info = pool.worker_info();
  run.device_key = baseline_key(run.worker_info, run.device, o);
  Journal journal(run.out, fingerprint(run), o.seed, std::random_device{}() % 1000000007ULL, o.fresh);
  run.seed = journal.seed();
  run.resume(journal);
  if (std::any_of(run.jobs.begin(), run.jobs.end(), [](const Job& j) { return !j.done; })) run.prestart(pool, n);
  run.build();
  run.evaluate(pool, n);
  run.baselines(pool);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  json report = run.report(secs);
  json session = {{"seconds", secs}, {"judged", static_cast<long>(run.jobs.size()) - run.resumed},
                  {"resumed", run.resumed}};
  journal.end_session(session);
  report["sessions"] = journal.sessions();
  report["sessions"].push_back(session);
  write_report(report, run.out);
  if (o.plots) draw_plot(pool, report, run.out);
  return report;
}

}  // namespace opforge::evaluator
