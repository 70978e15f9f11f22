// opforge serve (service.h): requests are validated and answered from the result cache on the
// HTTP threads; what must be judged waits in a bounded queue for the dispatcher thread, which
// alone drives the worker pools (a pool is driven from one thread, core/worker_pool.h) and judges
// each batch through the same phases as `opforge eval` (run.h).
#include "service.h"

#include <httplib.h>
#include <openssl/evp.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <fstream>
#include <future>
#include <iostream>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>

#include "internal.h"
#include "opforge/core/error.h"
#include "opforge/core/stop_signals.h"
#include "opforge/core/gpus.h"
#include "opforge/core/hash.h"
#include "run.h"

namespace opforge::evaluator {

namespace {

using Clock = std::chrono::steady_clock;

// ----------------------------------------------------------------------------------------------
// Requests

struct Submission {
  std::size_t task = 0;                       // index into the service's tasks
  std::map<std::string, std::string> files;   // relative path -> content
  bool folder = false;                        // "files" (CUDA Agent layout) rather than "solution_code"
  int trials = 0;
  std::string hash;                           // SHA-256 of the files (sha256_hex)
  std::string key;                            // the result cache's: task, hash, judge, policy, trials
};

struct Parsed {
  std::optional<Submission> sub;
  int status = 200;  // 400 bad request; 404 unknown task (retryable: the service's tasks, not the solution)
  json error;
};

Parsed bad(int status, const std::string& field, const std::string& why) {
  Parsed p;
  p.status = status;
  p.error = {{"error", why}, {"field", field}, {"reward", nullptr}, {"retryable", status == 404}};
  if (status == 404) p.error["reason"] = "unknown_task";
  return p;
}

// A path inside the solution's folder: relative, no "..", no empty part, printable.
bool safe_path(const std::string& p) {
  if (p.empty() || p.size() > 255 || p.front() == '/' || p.find('\0') != std::string::npos) return false;
  for (const auto& part : fs::path(p)) {
    std::string s = part.string();
    if (s.empty() || s == ".." || s == ".") return false;
  }
  return true;
}

// The result cache's key of a submission's files. SHA-256, not xxh3: a solution that shares a
// cache key with an honest one gets the honest one's verdict, and xxh3 is no defence against
// collisions crafted on purpose (2^32 work for a 64-bit birthday pair).
std::string sha256_hex(const std::string& data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  OPFORGE_CHECK(EVP_Digest(data.data(), data.size(), md, &n, EVP_sha256(), nullptr) == 1, "SHA-256 failed");
  std::string hex;
  for (unsigned int i = 0; i < n; ++i) hex += fmt::format("{:02x}", md[i]);
  return hex;
}

// A path that is also the folder of another ("a" and "a/b") cannot be written: refused up front,
// since a failure while writing the batch would fail its other solutions too.
std::optional<std::string> path_clash(const json& files) {
  for (auto& [path, _] : files.items()) {
    for (fs::path p = fs::path(path).parent_path(); !p.empty(); p = p.parent_path())
      if (files.contains(p.string())) return "\"" + p.string() + "\" is a file and the folder of \"" + path + "\"";
  }
  return std::nullopt;
}

std::optional<std::string> files_error(const json& files, std::size_t cap, std::size_t& total) {
  if (!files.is_object() || files.empty()) return "must be an object of relative path -> UTF-8 text";
  if (files.size() > 256) return "at most 256 files";
  for (auto& [path, text] : files.items()) {
    if (!safe_path(path)) return "\"" + path + "\" is not a relative path inside the solution folder";
    if (!text.is_string()) return "\"" + path + "\" must be a string";
    total += text.get_ref<const std::string&>().size();
  }
  if (!files.contains("model_new.py")) return "the CUDA Agent layout needs model_new.py";
  if (auto clash = path_clash(files)) return clash;
  if (total > cap) return fmt::format("{} bytes in all, more than the {} allowed", total, cap);
  return std::nullopt;
}

struct TaskIndex {
  std::vector<EvalTask> tasks;
  std::map<std::string, std::size_t> by_name, by_id;
  std::optional<std::size_t> find(const std::string& key) const {
    if (auto it = by_name.find(key); it != by_name.end()) return it->second;  // file stem, then id: as eval
    if (auto it = by_id.find(key); it != by_id.end()) return it->second;
    return std::nullopt;
  }
};

// The solution of a request, one of: `solution_code` (one file), `files` (the CUDA Agent layout),
// or `response` (a model's whole answer, whose last fenced code block is the file: the one
// extractor of every adapter, as /openrlhf uses it).
std::optional<Parsed> parse_solution(const json& r, const ServeOptions& o, Submission& s) {
  if (r.contains("solution_code") + r.contains("files") + r.contains("response") != 1)
    return bad(400, "solution_code", "give one of solution_code, files or response");
  if (r.contains("files")) {
    std::size_t total = 0;
    if (auto e = files_error(r["files"], o.max_files_bytes, total)) return bad(400, "files", *e);
    for (auto& [path, text] : r["files"].items()) s.files[path] = text.get<std::string>();
    s.folder = true;
    return std::nullopt;
  }
  const char* field = r.contains("response") ? "response" : "solution_code";
  if (!r[field].is_string()) return bad(400, field, fmt::format("{} must be a string", field));
  const std::string& text = r[field].get_ref<const std::string&>();
  if (text.size() > o.max_files_bytes)
    return bad(400, field, fmt::format("more than the {} bytes allowed", o.max_files_bytes));
  s.files["solution.py"] = r.contains("response") ? last_code_block(text) : text;
  return std::nullopt;
}

Parsed parse_submission(const json& r, const TaskIndex& ti, const ServeOptions& o) {
  if (!r.is_object()) return bad(400, "", "a request must be a JSON object");
  if (!r.contains("task_id") || !r["task_id"].is_string()) return bad(400, "task_id", "task_id must be a string");
  auto task = ti.find(r["task_id"].get<std::string>());
  if (!task) return bad(404, "task_id", "no task \"" + r["task_id"].get<std::string>() + "\" in --tasks");
  if (r.contains("task_code")) return bad(400, "task_code", "a client's task_code is not accepted by this service");
  Submission s;
  s.task = *task;
  if (auto err = parse_solution(r, o, s)) return *err;
  s.trials = o.eval.trials;
  if (r.contains("trials")) {
    if (!r["trials"].is_number_integer() || r["trials"].get<long>() < 3 || r["trials"].get<long>() > 1000)
      return bad(400, "trials", "trials must be an integer from 3 to 1000");
    s.trials = r["trials"].get<int>();
  }
  std::string all;
  for (auto& [p, t] : s.files) all += p + '\0' + t + '\0';
  s.hash = sha256_hex(all);
  s.key = fmt::format("{}|{}|{}|{}|{}|{}|{}", ti.tasks[s.task].id, s.hash, kJudgeVersion, o.eval.policy, s.trials,
                      s.folder, o.eval.untimed);
  Parsed p;
  p.sub = std::move(s);
  return p;
}

// ----------------------------------------------------------------------------------------------
// Metrics

class Metrics {
 public:
  void count(const std::string& what, long n = 1) {
    std::lock_guard<std::mutex> l(m_);
    counts_[what] += n;
  }
  void verdict(const json& answer, double seconds) {
    std::lock_guard<std::mutex> l(m_);
    reasons_[answer["reason"].is_string() ? answer["reason"].get<std::string>() : "correct"] += 1;
    latencies_.push_back(seconds);
    if (latencies_.size() > 2000) latencies_.pop_front();
  }
  json snapshot() {
    std::lock_guard<std::mutex> l(m_);
    std::vector<double> l2(latencies_.begin(), latencies_.end());
    std::sort(l2.begin(), l2.end());
    auto q = [&](double f) { return l2.empty() ? json(nullptr) : json(l2[static_cast<std::size_t>(f * (l2.size() - 1))]); };
    return {{"counts", counts_}, {"reasons", reasons_}, {"latency_p50_s", q(0.5)}, {"latency_p95_s", q(0.95)}};
  }

 private:
  std::mutex m_;
  std::map<std::string, long> counts_, reasons_;
  std::deque<double> latencies_;
};

// ----------------------------------------------------------------------------------------------
// The engine: queue, result cache and the dispatcher that owns the pools

struct Pending {
  Submission sub;
  std::promise<json> done;
  std::shared_future<json> fut;
  Clock::time_point queued = Clock::now();
};

json environment_failure(const std::string& reason, const std::string& detail) {
  return {{"reward", nullptr}, {"retryable", true}, {"reason", reason}, {"detail", detail}, {"judge", kJudgeVersion}};
}

class Engine {
 public:
  Engine(const ServeOptions& o, TaskIndex ti);
  ~Engine() { stop(); }
  // The verdicts to wait for, each from the cache, from an identical evaluation in flight, or
  // queued; all or none, under one lock: nullopt when the queue has no room for every one (so no
  // other client's request can fill it between the check and the queueing).
  std::optional<std::vector<std::shared_future<json>>> submit_all(std::vector<Submission> subs);
  void stop();
  json health() const;
  json metrics();
  const TaskIndex& tasks() const { return ti_; }
  Metrics stats;

 private:
  std::shared_future<json> submit_locked(Submission s);  // under m_, with room checked
  void loop();
  std::vector<std::shared_ptr<Pending>> next_batch();
  void run_batch(const std::vector<std::shared_ptr<Pending>>& batch);
  json answer(const json& row, const Submission& s) const;
  void finish(const std::shared_ptr<Pending>& p, json a);

  const ServeOptions& o_;
  TaskIndex ti_;
  Run base_;  // the run every batch copies its device, launch, cache and worker info from
  std::unique_ptr<WorkerPool> compile_, judge_;
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Pending>> queue_;
  std::unordered_map<std::string, std::shared_future<json>> inflight_;
  std::unordered_map<std::string, json> cache_;
  std::size_t running_ = 0;
  int judges_ = 1;  // judge workers sharing the devices (Run::evaluate judges a verdict of memory again alone)
  bool stopping_ = false;
  std::thread thread_;
  std::mt19937_64 rng_{std::random_device{}()};
};

Engine::Engine(const ServeOptions& o, TaskIndex ti) : o_(o), ti_(std::move(ti)), base_(o.eval) {
  base_.out = o.state_dir;
  base_.cache = o.eval.cache_dir.empty() ? default_cache_dir() : o.eval.cache_dir;
  fs::create_directories(base_.cache / "locks");
  fs::create_directories(base_.out / "logs");
  base_.device = o.eval.device;
  base_.gpu_ids = base_.device == "cpu" ? std::vector<std::string>{} : visible_gpus();
  if (base_.device == "auto") base_.device = base_.gpu_ids.empty() ? "cpu" : "cuda";
  OPFORGE_CHECK(base_.device != "cuda" || !base_.gpu_ids.empty(), "--device cuda, but no NVIDIA GPU is visible");
  base_.launch = choose_launch(o.eval, base_.device);
  int judges = o.eval.workers > 0 ? o.eval.workers
                                  : (base_.device == "cuda" ? static_cast<int>(base_.gpu_ids.size()) : 1);
  int builders = o.eval.compile_workers > 0 ? o.eval.compile_workers : std::max(1, static_cast<int>(usable_cpus()) / 2);
  judges_ = judges;
  judge_ = std::make_unique<WorkerPool>(base_.pool_options(judges, o.eval.timeout_s));
  compile_ = std::make_unique<WorkerPool>(base_.build_pool_options(builders));
  WorkerResult ping = judge_->call({{"op", "ping"}});
  OPFORGE_CHECK(ping.outcome == Outcome::ok, "a judge worker did not start: {}", ping.reason);
  OPFORGE_CHECK(compile_->call({{"op", "ping"}}).outcome == Outcome::ok, "a compiler worker did not start");
  base_.worker_info = judge_->worker_info();
  base_.prestart(*judge_, judges);
  thread_ = std::thread([this] { loop(); });
}

std::optional<std::vector<std::shared_future<json>>> Engine::submit_all(std::vector<Submission> subs) {
  std::lock_guard<std::mutex> l(m_);
  if (queue_.size() + running_ + subs.size() > o_.queue_max) return std::nullopt;
  std::vector<std::shared_future<json>> futs;
  for (auto& s : subs) futs.push_back(submit_locked(std::move(s)));
  return futs;
}

std::shared_future<json> Engine::submit_locked(Submission s) {
  if (stopping_) {
    std::promise<json> p;
    p.set_value(environment_failure("service_stopping", "the service is shutting down; send it again"));
    return p.get_future().share();
  }
  if (auto c = cache_.find(s.key); c != cache_.end()) {
    stats.count("cache_hits");
    std::promise<json> p;
    json a = c->second;
    a["cached"] = true;
    p.set_value(a);
    return p.get_future().share();
  }
  if (auto f = inflight_.find(s.key); f != inflight_.end()) {
    stats.count("joined_in_flight");  // a GRPO group's identical completions: judged once
    return f->second;
  }
  auto p = std::make_shared<Pending>();
  p->sub = std::move(s);
  p->fut = p->done.get_future().share();
  inflight_[p->sub.key] = p->fut;
  queue_.push_back(p);
  cv_.notify_one();
  return p->fut;
}

void Engine::stop() {
  {
    std::lock_guard<std::mutex> l(m_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (auto& p : queue_) p->done.set_value(environment_failure("service_stopping", "the service stopped first"));
  queue_.clear();
}

// What is queued with the head's trial count, up to max_batch (one Run per trial count).
std::vector<std::shared_ptr<Pending>> Engine::next_batch() {
  std::unique_lock<std::mutex> l(m_);
  cv_.wait(l, [&] { return stopping_ || !queue_.empty(); });
  std::vector<std::shared_ptr<Pending>> batch;
  if (stopping_) return batch;
  int trials = queue_.front()->sub.trials;
  for (auto it = queue_.begin(); it != queue_.end() && batch.size() < o_.max_batch;) {
    if ((*it)->sub.trials == trials) {
      batch.push_back(*it);
      it = queue_.erase(it);
    } else {
      ++it;
    }
  }
  running_ = batch.size();
  return batch;
}

void Engine::loop() {
  for (;;) {
    auto batch = next_batch();
    if (batch.empty()) return;
    try {
      run_batch(batch);
    } catch (const std::exception& e) {
      spdlog::error("a batch of {} evaluation(s) failed in the service: {}", batch.size(), e.what());
      for (auto& p : batch) finish(p, environment_failure("judge_error", e.what()));
    }
    std::lock_guard<std::mutex> l(m_);
    running_ = 0;
  }
}

void write_submission(const Submission& s, const fs::path& dir) {
  fs::remove_all(dir);
  for (auto& [path, text] : s.files) {
    fs::create_directories((dir / path).parent_path());
    std::ofstream(dir / path, std::ios::binary) << text;
  }
}

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Where a batch's time went, one line on stderr: a batch answers when its slowest answer is done,
// so the slowest answers' own figures (child ready, load, checks) say what held it.
void log_batch(const std::map<std::string, json>& rows, std::size_t tasks, std::array<double, 3> phase_s) {
  std::vector<std::pair<double, std::string>> slow;
  for (auto& [key, row] : rows) {
    double d = row.value("dispatch_s", json(0.0)).is_number() ? row["dispatch_s"].get<double>() : 0.0;
    double c = row.contains("phase_s") && row["phase_s"].is_object() ? row["phase_s"].value("checks", 0.0) : 0.0;
    std::string reason = row["reason"].is_string() ? row["reason"].get<std::string>() : "correct";
    slow.emplace_back(d + c, fmt::format("{} {} (dispatch {:.1f} s, checks {:.1f} s)", key, reason, d, c));
  }
  std::sort(slow.rbegin(), slow.rend());
  std::string top;
  for (std::size_t i = 0; i < std::min<std::size_t>(3, slow.size()); ++i) top += (i ? "; " : "") + slow[i].second;
  spdlog::info("batch of {} answer(s) over {} task(s): build {:.1f} s, judging {:.1f} s, baselines {:.1f} s; "
               "slowest: {}", rows.size(), tasks, phase_s[0], phase_s[1], phase_s[2], top);
}

void Engine::run_batch(const std::vector<std::shared_ptr<Pending>>& batch) {
  EvalOptions eo = o_.eval;
  eo.trials = batch.front()->sub.trials;
  Run r(eo);
  r.out = base_.out / "batch";
  fs::remove_all(r.out / "work");
  fs::create_directories(r.out / "logs");
  r.cache = base_.cache;
  r.device = base_.device;
  r.gpu_ids = base_.gpu_ids;
  r.launch = base_.launch;
  r.worker_info = base_.worker_info;
  r.device_key = baseline_key(r.worker_info, r.device, eo);
  r.seed = rng_() % 1000000007ULL;
  std::map<std::size_t, std::size_t> task_at;
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const Submission& s = batch[i]->sub;
    auto [it, fresh] = task_at.emplace(s.task, r.tasks.size());
    if (fresh) r.tasks.push_back(ti_.tasks[s.task]);
    std::string key = fmt::format("s{}", i);
    fs::path dir = base_.out / "submissions" / key;
    write_submission(s, s.folder ? dir / key : dir);
    SolutionEntry e{key, s.folder ? dir / key : dir / (key + ".py"), s.folder};
    if (!s.folder) fs::rename(dir / "solution.py", e.path);
    r.jobs.push_back({it->second, e, {}, s.folder ? "model_new.py" : key + ".py"});
  }
  auto t0 = Clock::now();
  r.build(compile_.get());
  auto t1 = Clock::now();
  r.evaluate(*judge_, judges_);
  auto t2 = Clock::now();
  r.baselines(*judge_);
  std::map<std::string, json> by_key;
  for (auto& row : r.rows()) by_key[row["solution"].get<std::string>()] = row;
  log_batch(by_key, r.tasks.size(), {seconds(t1 - t0), seconds(t2 - t1), seconds(Clock::now() - t2)});
  for (std::size_t i = 0; i < batch.size(); ++i) finish(batch[i], answer(by_key.at(fmt::format("s{}", i)), batch[i]->sub));
}

json Engine::answer(const json& row, const Submission& s) const {
  json a = row;
  a.erase("solution");
  a.erase("task");
  a["task_id"] = ti_.tasks[s.task].id;
  a["task_name"] = ti_.tasks[s.task].name;
  a["task_hash"] = xxh3_hex(ti_.tasks[s.task].code);
  a["solution_hash"] = s.hash;
  a["policy"] = o_.eval.policy;
  a["judge"] = kJudgeVersion;
  std::string reason = row["reason"].is_string() ? row["reason"].get<std::string>() : "";
  a["retryable"] = reason.rfind("judge_", 0) == 0;  // the judge's own worker failed (docs/reasons.md)
  if (a["retryable"].get<bool>()) a["reward"] = nullptr;
  return a;
}

void Engine::finish(const std::shared_ptr<Pending>& p, json a) {
  double secs = std::chrono::duration<double>(Clock::now() - p->queued).count();
  stats.verdict(a, secs);
  stats.count("evaluated");
  {
    std::lock_guard<std::mutex> l(m_);
    inflight_.erase(p->sub.key);
    if (!a.value("retryable", false)) {
      if (cache_.size() >= o_.result_cache) cache_.clear();  // a bound, not an LRU: verdicts are cheap to redo
      cache_[p->sub.key] = a;
    }
  }
  p->done.set_value(std::move(a));
}

json Engine::health() const {
  return {{"ok", true}, {"judge", kJudgeVersion}, {"tasks", ti_.tasks.size()}, {"device", base_.device},
          {"policy", o_.eval.policy}, {"untimed", o_.eval.untimed}, {"sandbox", base_.launch.profile}};
}

json Engine::metrics() {
  json m = stats.snapshot();
  std::lock_guard<std::mutex> l(m_);
  m["queue_depth"] = queue_.size();
  m["in_flight"] = running_;
  m["queue_max"] = o_.queue_max;
  m["cached_verdicts"] = cache_.size();
  return m;
}

}  // namespace

// ----------------------------------------------------------------------------------------------
// HTTP

std::string last_code_block(const std::string& text) {
  std::vector<std::size_t> fences;  // offsets of lines that start with ```
  for (std::size_t pos = 0; pos <= text.size();) {
    std::size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    std::size_t start = text.find_first_not_of(" \t", pos);
    if (start != std::string::npos && start < eol && text.compare(start, 3, "```") == 0) fences.push_back(pos);
    pos = eol + 1;
  }
  if (fences.size() < 2) return "";
  std::size_t open = fences[fences.size() - 2 - (fences.size() % 2)], close = fences[fences.size() - 1 - (fences.size() % 2)];
  std::size_t body = text.find('\n', open);
  return body == std::string::npos || body >= close ? "" : text.substr(body + 1, close - body - 1);
}

namespace {

void reply(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump(), "application/json");
}

std::optional<json> body_json(const httplib::Request& req, httplib::Response& res, Engine& e) {
  json j = json::parse(req.body, nullptr, false);
  if (j.is_discarded()) {
    e.stats.count("bad_requests");
    reply(res, 400, {{"error", "the body is not JSON"}, {"field", ""}});
    return std::nullopt;
  }
  return j;
}

void too_busy(httplib::Response& res, Engine& e) {
  e.stats.count("rejected_queue_full");
  res.set_header("Retry-After", "5");
  reply(res, 429, {{"error", "the queue is full; retry after 5 s"}, {"reward", nullptr}, {"retryable", true},
                   {"reason", "queue_full"}});
}

// Validates and queues each request; answers in order (a bad one answers its error in place).
std::optional<std::vector<json>> judge_all(const std::vector<json>& reqs, Engine& e, const ServeOptions& o,
                                           httplib::Response& res) {
  std::vector<Parsed> parsed;
  for (auto& r : reqs) parsed.push_back(parse_submission(r, e.tasks(), o));
  std::vector<Submission> valid;
  for (auto& p : parsed)
    if (p.sub) valid.push_back(*p.sub);
  auto futs = e.submit_all(std::move(valid));
  if (!futs) {
    too_busy(res, e);
    return std::nullopt;
  }
  std::vector<json> out;
  std::size_t k = 0;
  for (auto& p : parsed) {
    if (p.sub) {
      out.push_back((*futs)[k++].get());
      continue;
    }
    e.stats.count(p.status == 404 ? "unknown_task" : "bad_requests");
    json err = p.error;
    err["status"] = p.status;
    out.push_back(err);
  }
  return out;
}

void on_evaluate(const httplib::Request& req, httplib::Response& res, Engine& e, const ServeOptions& o) {
  e.stats.count("requests_evaluate");
  auto body = body_json(req, res, e);
  if (!body) return;
  auto out = judge_all({*body}, e, o, res);
  if (!out) return;
  json a = (*out)[0];
  int status = a.value("status", 200);
  a.erase("status");
  reply(res, status, a);
}

void on_batch(const httplib::Request& req, httplib::Response& res, Engine& e, const ServeOptions& o) {
  e.stats.count("requests_batch");
  auto body = body_json(req, res, e);
  if (!body) return;
  if (!body->contains("requests") || !(*body)["requests"].is_array() || (*body)["requests"].size() > o.queue_max) {
    e.stats.count("bad_requests");
    return reply(res, 400, {{"error", fmt::format("requests must be an array of at most {} requests", o.queue_max)},
                            {"field", "requests"}});
  }
  if (auto out = judge_all((*body)["requests"].get<std::vector<json>>(), e, o, res)) reply(res, 200, {{"results", *out}});
}

// OpenRLHF's remote reward: {"query": [...], "prompts": [...], "labels": [...]} -> rewards, scores
// ((reward + 1) / 4) and extra_logs. The solution is the last fenced block of the response part of
// each query; labels are task ids. An environment failure fails the whole request with 503 (its
// client retries), since a trainer's reward list cannot hold "retry this one".
void on_openrlhf(const httplib::Request& req, httplib::Response& res, Engine& e, const ServeOptions& o) {
  e.stats.count("requests_openrlhf");
  auto body = body_json(req, res, e);
  if (!body) return;
  const json& q = (*body)["query"];
  const json& labels = (*body)["labels"];
  const json prompts = body->value("prompts", json::array());
  if (!q.is_array() || !labels.is_array() || labels.size() != q.size() || q.size() > o.queue_max)
    return reply(res, 400, {{"error", "query and labels must be arrays of the same length"}, {"field", "labels"}});
  std::vector<json> reqs;
  for (std::size_t i = 0; i < q.size(); ++i) {
    std::string text = q[i].is_string() ? q[i].get<std::string>() : "";
    std::string prompt = i < prompts.size() && prompts[i].is_string() ? prompts[i].get<std::string>() : "";
    if (!prompt.empty() && text.rfind(prompt, 0) == 0) text = text.substr(prompt.size());
    reqs.push_back({{"task_id", labels[i]}, {"solution_code", last_code_block(text)}});
  }
  auto out = judge_all(reqs, e, o, res);
  if (!out) return;
  json rewards = json::array(), scores = json::array(), reasons = json::array();
  for (auto& a : *out) {
    if (a.value("retryable", false) || !a["reward"].is_number()) {
      res.set_header("Retry-After", "5");
      return reply(res, 503, {{"error", "the environment failed: " + a.value("reason", std::string("?"))}, {"retryable", true}});
    }
    double r = a["reward"].get<double>();
    rewards.push_back(r);
    scores.push_back((r + 1) / 4);
    reasons.push_back(a["reason"].is_string() ? a["reason"] : json("correct"));
  }
  reply(res, 200, {{"rewards", rewards}, {"scores", scores}, {"extra_logs", {{"reason", reasons}}}});
}

// cpp-httplib 0.11 (Debian's, a compiled library) listens with a backlog of 5: a burst of clients
// (a GRPO group's completions at once) on a busy host overflows it, and with SYN cookies the
// overflow is answered by connection resets (seen in CI's load test). Its socket is private, so
// the listening socket bound to `port` is found among the process's descriptors and given the
// system's backlog; listen() on a listening socket only changes that.
void widen_backlog(int port) {
  for (int fd = 0; fd < 1024; ++fd) {
    sockaddr_storage a{};
    socklen_t n = sizeof a;
    int listening = 0;
    socklen_t ln = sizeof listening;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n) != 0 ||
        getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &ln) != 0 || !listening)
      continue;
    int p = a.ss_family == AF_INET    ? ntohs(reinterpret_cast<sockaddr_in*>(&a)->sin_port)
            : a.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&a)->sin6_port)
                                      : -1;
    if (p == port && ::listen(fd, SOMAXCONN) != 0) spdlog::warn("could not widen the listen backlog of port {}", port);
  }
}

void routes(httplib::Server& svr, Engine& e, const ServeOptions& o) {
  svr.set_pre_routing_handler([&o](const httplib::Request& req, httplib::Response& res) {
    if (o.token.empty() || req.path == "/healthz" || req.get_header_value("Authorization") == "Bearer " + o.token)
      return httplib::Server::HandlerResponse::Unhandled;
    reply(res, 401, {{"error", "missing or wrong bearer token (Authorization: Bearer ...)"}});
    return httplib::Server::HandlerResponse::Handled;
  });
  svr.Get("/healthz", [&e](const httplib::Request&, httplib::Response& res) { reply(res, 200, e.health()); });
  svr.Get("/metrics", [&e](const httplib::Request&, httplib::Response& res) { reply(res, 200, e.metrics()); });
  svr.Post("/v1/evaluate", [&](const httplib::Request& q, httplib::Response& r) { on_evaluate(q, r, e, o); });
  svr.Post("/v1/evaluate_batch", [&](const httplib::Request& q, httplib::Response& r) { on_batch(q, r, e, o); });
  svr.Post("/openrlhf", [&](const httplib::Request& q, httplib::Response& r) { on_openrlhf(q, r, e, o); });
}

TaskIndex index_tasks(const fs::path& src) {
  TaskIndex ti;
  ti.tasks = with_context("while reading --tasks", [&] { return load_tasks(src); });
  OPFORGE_CHECK(!ti.tasks.empty(), "--tasks {} holds no task", src.string());
  for (std::size_t i = 0; i < ti.tasks.size(); ++i) {
    ti.by_name.emplace(ti.tasks[i].name, i);
    ti.by_id.emplace(ti.tasks[i].id, i);
  }
  return ti;
}

}  // namespace

int serve(const ServeOptions& opts) {
  ServeOptions o = opts;
  check_options(o.eval);
  if (o.state_dir.empty()) o.state_dir = (o.eval.cache_dir.empty() ? default_cache_dir() : o.eval.cache_dir) / "serve";
  StopOnSignals stop_signals;  // before the engine's and the HTTP pool's threads start
  Engine engine(o, index_tasks(o.eval.tasks));
  httplib::Server svr;
  // Each connection's thread waits for its verdict, so a batch only fills with the answers whose
  // connections are being served: room for one batch judged and the next one gathering.
  std::size_t threads = std::max<std::size_t>(static_cast<std::size_t>(o.http_threads), 2 * o.max_batch);
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  svr.set_payload_max_length(o.max_files_bytes * 2 + (1 << 20) * std::min<std::size_t>(o.queue_max, 64));
  routes(svr, engine, o);
  int port = o.port == 0 ? svr.bind_to_any_port(o.host) : (svr.bind_to_port(o.host, o.port) ? o.port : -1);
  OPFORGE_CHECK(port > 0, "cannot listen on {}:{} (in use, or not an address of this machine)", o.host, o.port);
  widen_backlog(port);
  stop_signals.start([&svr] { svr.stop(); });
  std::cout << "listening on http://" << o.host << ":" << port << std::endl;
  spdlog::info("serving {} task(s) on http://{}:{} (device {}, policy {}, sandbox: {})", engine.tasks().tasks.size(),
               o.host, port, engine.health()["device"].get<std::string>(), o.eval.policy,
               engine.health()["sandbox"].get<std::string>());
  svr.listen_after_bind();
  engine.stop();
  return 0;
}

}  // namespace opforge::evaluator
