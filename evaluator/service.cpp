// opforge serve (service.h): requests are validated and answered from the result cache on the
// HTTP threads; what must be judged waits in a bounded queue. The builder thread alone drives the
// compile pool and the judge thread alone drives the judge pool (a pool is driven from one thread,
// core/worker_pool.h); each solution goes through the requests and rows of `opforge eval` (run.h)
// and is answered as soon as its verdict stands.
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
#include <list>
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

// A group of submissions taken from the queue together and built together (one Run: one seed, one
// trial count). Its answers leave one by one as each is judged: nothing waits for the group's
// slowest (docs/architecture.md, "The judge": opforge serve).
struct Batch {
  EvalOptions eo;  // the Run refers to it
  std::unique_ptr<Run> run;
  std::vector<std::shared_ptr<Pending>> subs;  // subs[i] is run->jobs[i]
  std::vector<bool> answered;
  std::size_t open = 0;
  bool handed = false;   // its jobs went to the judge thread
  bool retired = false;  // all answered; freed by reap()
  std::uint64_t n = 0;
  Clock::time_point t0, built;
  std::map<std::string, json> rows;  // answered rows by solution key, for the batch's log line
  std::map<std::string, double> worker_s, answered_s;  // a judge worker's seconds on it; when it left
};

// One solution handed to the judge pool.
struct Work {
  Batch* b = nullptr;
  std::size_t job = 0;
  std::size_t in_flight = 0;  // solutions in flight when it was handed out, itself included
};

constexpr std::size_t kMaxFeed = 100000;

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
  std::vector<std::shared_ptr<Pending>> next_batch();
  // The builder thread (drives compile_): queue -> batches, built, handed to the judge thread.
  void build_loop();
  std::unique_ptr<Batch> make_batch(std::vector<std::shared_ptr<Pending>> subs, std::uint64_t n);
  // The judge thread (drives judge_): every built solution and needed baseline, fed to the
  // workers as they free up; answers each job the moment its verdict stands.
  void judge_loop();
  std::vector<json> take_work(std::vector<Work>& feed);
  void judged(const Work& w, WorkerResult&& r);
  void judged_safely(const Work& w, WorkerResult&& r);
  void settle(Batch* b, std::size_t job);
  void complete(Batch* b, std::size_t job, std::optional<json> failure = std::nullopt);
  void fail_job(Batch* b, std::size_t job, const std::string& why);
  void fail_handed_out(const std::string& why);
  void reap();
  void run_alone();
  void run_baselines();
  json answer(const json& row, const Submission& s) const;
  void finish(const std::shared_ptr<Pending>& p, json a);

  const ServeOptions& o_;
  TaskIndex ti_;
  Run base_;  // the run every batch copies its device, launch, cache and worker info from
  std::unique_ptr<WorkerPool> compile_, judge_;
  std::mutex m_;
  std::condition_variable cv_;        // the queue (builder thread)
  std::condition_variable cv_built_;  // built batches (judge thread)
  std::deque<std::shared_ptr<Pending>> queue_;
  std::unordered_map<std::string, std::shared_future<json>> inflight_;
  std::unordered_map<std::string, json> cache_;
  std::list<std::unique_ptr<Batch>> batches_;  // taken from the queue, not yet all answered
  std::deque<Batch*> built_;                   // built, not yet handed to the judge thread
  std::size_t running_ = 0;                    // submissions taken from the queue, not yet answered
  int judges_ = 1;  // judge workers sharing the devices (a verdict of memory is judged again alone)
  int devices_ = 1;
  bool stopping_ = false;
  std::thread builder_, judger_;
  std::mt19937_64 rng_{std::random_device{}()};
  // The judge thread's own.
  std::unique_ptr<BaselineCache> db_;
  std::map<std::string, std::vector<std::pair<Batch*, std::size_t>>> waiting_;  // jobs waiting for those
  std::vector<std::pair<Batch*, std::size_t>> alone_;  // verdicts of memory, to judge again alone
  std::size_t in_flight_ = 0;
  Clock::time_point shared_since_ = Clock::now();  // the alone pass may take as long as the judging before it
};

Engine::Engine(const ServeOptions& o, TaskIndex ti) : o_(o), ti_(std::move(ti)), base_(o.eval) {
  base_.out = o.state_dir;
  base_.cache = o.eval.cache_dir.empty() ? default_cache_dir() : o.eval.cache_dir;
  fs::create_directories(base_.cache / "locks");
  fs::create_directories(base_.out / "logs");
  fs::remove_all(base_.out / "batch" / "work");  // a stopped service's leftovers
  fs::remove_all(base_.out / "submissions");
  base_.device = o.eval.device;
  base_.gpu_ids = base_.device == "cpu" ? std::vector<std::string>{} : visible_gpus();
  if (base_.device == "auto") base_.device = base_.gpu_ids.empty() ? "cpu" : "cuda";
  OPFORGE_CHECK(base_.device != "cuda" || !base_.gpu_ids.empty(), "--device cuda, but no NVIDIA GPU is visible");
  base_.launch = choose_launch(o.eval, base_.device);
  int judges = o.eval.workers > 0 ? o.eval.workers
                                  : (base_.device == "cuda" ? static_cast<int>(base_.gpu_ids.size()) : 1);
  int builders = o.eval.compile_workers > 0 ? o.eval.compile_workers : std::max(1, static_cast<int>(usable_cpus()) / 2);
  judges_ = judges;
  devices_ = std::max(1, base_.device == "cuda" ? static_cast<int>(base_.gpu_ids.size()) : 1);
  judge_ = std::make_unique<WorkerPool>(base_.pool_options(judges, o.eval.timeout_s));
  compile_ = std::make_unique<WorkerPool>(base_.build_pool_options(builders));
  WorkerResult ping = judge_->call({{"op", "ping"}});
  OPFORGE_CHECK(ping.outcome == Outcome::ok, "a judge worker did not start: {}", ping.reason);
  OPFORGE_CHECK(compile_->call({{"op", "ping"}}).outcome == Outcome::ok, "a compiler worker did not start");
  base_.worker_info = judge_->worker_info();
  base_.prestart(*judge_, judges);
  db_ = std::make_unique<BaselineCache>(base_.cache / "baselines.db");
  builder_ = std::thread([this] { build_loop(); });
  judger_ = std::thread([this] { judge_loop(); });
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

// The threads end after what they hold (a build under way, the judging in flight); whatever is
// still queued, built or waiting then is answered service_stopping (retryable).
void Engine::stop() {
  {
    std::lock_guard<std::mutex> l(m_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.notify_all();
  cv_built_.notify_all();
  if (builder_.joinable()) builder_.join();
  if (judger_.joinable()) judger_.join();
  for (auto& p : queue_) p->done.set_value(environment_failure("service_stopping", "the service stopped first"));
  queue_.clear();
  std::vector<Batch*> left;
  for (auto& b : batches_) left.push_back(b.get());
  for (Batch* b : left)
    for (std::size_t i = 0; i < b->subs.size(); ++i)
      if (!b->answered[i]) complete(b, i, environment_failure("service_stopping", "the service stopped first"));
  reap();
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
  running_ += batch.size();
  return batch;
}

void write_submission(const Submission& s, const fs::path& dir) {
  fs::remove_all(dir);
  for (auto& [path, text] : s.files) {
    fs::create_directories((dir / path).parent_path());
    std::ofstream(dir / path, std::ios::binary) << text;
  }
}

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// A batch's jobs are keyed b<batch>s<i>: batches in flight together never share a folder.
std::unique_ptr<Batch> Engine::make_batch(std::vector<std::shared_ptr<Pending>> subs, std::uint64_t n) {
  auto b = std::make_unique<Batch>();
  b->eo = o_.eval;
  b->eo.trials = subs.front()->sub.trials;
  b->run = std::make_unique<Run>(b->eo);
  Run& r = *b->run;
  r.out = base_.out / "batch";
  fs::create_directories(r.out / "logs");
  r.cache = base_.cache;
  r.device = base_.device;
  r.gpu_ids = base_.gpu_ids;
  r.launch = base_.launch;
  r.worker_info = base_.worker_info;
  r.device_key = baseline_key(r.worker_info, r.device, b->eo);
  r.seed = rng_() % 1000000007ULL;
  std::map<std::size_t, std::size_t> task_at;
  for (std::size_t i = 0; i < subs.size(); ++i) {
    const Submission& s = subs[i]->sub;
    auto [it, fresh] = task_at.emplace(s.task, r.tasks.size());
    if (fresh) r.tasks.push_back(ti_.tasks[s.task]);
    std::string key = fmt::format("b{}s{}", n, i);
    fs::path dir = base_.out / "submissions" / key;
    write_submission(s, s.folder ? dir / key : dir);
    SolutionEntry e{key, s.folder ? dir / key : dir / (key + ".py"), s.folder};
    if (!s.folder) fs::rename(dir / "solution.py", e.path);
    r.jobs.push_back({it->second, e, {}, s.folder ? "model_new.py" : key + ".py"});
  }
  b->subs = std::move(subs);
  b->answered.assign(b->subs.size(), false);
  b->open = b->subs.size();
  b->n = n;
  return b;
}

void Engine::build_loop() {
  for (std::uint64_t n = 0;; ++n) {
    auto subs = next_batch();
    if (subs.empty()) return;
    std::unique_ptr<Batch> b;
    try {
      b = make_batch(subs, n);
      b->t0 = Clock::now();
      b->run->build(compile_.get());
      b->built = Clock::now();
    } catch (const std::exception& e) {
      spdlog::error("a batch of {} evaluation(s) failed in the service: {}", subs.size(), e.what());
      for (auto& p : subs) finish(p, environment_failure("judge_error", e.what()));
      continue;
    }
    {
      std::lock_guard<std::mutex> l(m_);
      built_.push_back(b.get());
      batches_.push_back(std::move(b));
    }
    cv_built_.notify_one();
  }
}

void Engine::judge_loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> l(m_);
      cv_built_.wait(l, [&] { return stopping_ || !built_.empty() || !waiting_.empty() || !alone_.empty(); });
      if (stopping_) return;
    }
    std::vector<Work> feed;
    try {
      judge_->run_fed([&] { return take_work(feed); },
                      [&](WorkerResult&& r) { judged_safely(feed[r.index], std::move(r)); }, true);
    } catch (const std::exception& e) {
      // The pool itself failed (its workers cannot start): what it held is the environment's.
      spdlog::error("the judge pool failed: {}", e.what());
      fail_handed_out(e.what());
    }
    run_alone();
    run_baselines();
    reap();
  }
}

void Engine::fail_handed_out(const std::string& why) {
  std::vector<Batch*> handed;
  {
    std::lock_guard<std::mutex> l(m_);
    for (auto& b : batches_)
      if (b->handed && !b->retired) handed.push_back(b.get());
  }
  for (Batch* b : handed)
    for (std::size_t i = 0; i < b->subs.size(); ++i)
      fail_job(b, i, why);
  waiting_.clear();
  alone_.clear();
  in_flight_ = 0;
}

// Batches whose every answer has left. Only the judge thread (or stop(), once it has ended) frees
// them: the works it holds point into them until their answers are given.
void Engine::reap() {
  std::lock_guard<std::mutex> l(m_);
  batches_.remove_if([](const std::unique_ptr<Batch>& b) { return b->retired; });
}

// Called by the pool at every turn while nothing waits in it (100 ms at most): jobs of built
// batches (those that failed their build are answered here, at once). Nothing while a verdict of
// memory waits to be judged alone or an answer waits for its task's baselines: the pool drains,
// and run_alone / run_baselines have the devices to themselves.
std::vector<json> Engine::take_work(std::vector<Work>& feed) {
  std::vector<json> reqs;
  // A long stretch of work without a pause would grow the feed without end: past this many
  // requests the pool drains and the next run_fed starts a new one.
  if (!alone_.empty() || !waiting_.empty() || feed.size() >= kMaxFeed) return reqs;
  reap();
  std::deque<Batch*> got;
  {
    std::lock_guard<std::mutex> l(m_);
    if (stopping_) return reqs;
    got.swap(built_);
    for (Batch* b : got) b->handed = true;
  }
  for (Batch* b : got)
    for (std::size_t i = 0; i < b->run->jobs.size(); ++i) {
      Job& j = b->run->jobs[i];
      if (j.done) {  // its build failed: answered now
        complete(b, i);
        continue;
      }
      feed.push_back({b, i, ++in_flight_});
      reqs.push_back(b->run->solution_request(j, b->run->seed));
    }
  return reqs;
}

// A job the judge could not finish (its error, not the solution's): answered judge_error, retryable,
// unless it was answered already.
void Engine::fail_job(Batch* b, std::size_t job, const std::string& why) {
  if (!b->answered[job]) complete(b, job, environment_failure("judge_error", why));
}

// An error while a result is taken in (a row the judge could not make) is that job's
// environment failure: it must not leave run_fed with workers still busy on its requests.
void Engine::judged_safely(const Work& w, WorkerResult&& r) {
  try {
    judged(w, std::move(r));
  } catch (const std::exception& e) {
    spdlog::error("a judged answer could not be taken in: {}", e.what());
    fail_job(w.b, w.job, e.what());
  }
}

void Engine::judged(const Work& w, WorkerResult&& r) {
  std::size_t was_in_flight = in_flight_--;
  Job& j = w.b->run->jobs[w.job];
  w.b->worker_s[j.sol.key] = r.seconds;
  j.row = w.b->run->judged_row(j, r);
  j.done = true;
  bool sharing = std::max(w.in_flight, was_in_flight) > static_cast<std::size_t>(devices_);
  if (sharing && memory_verdict(j.row)) {
    alone_.push_back({w.b, w.job});
    return;
  }
  settle(w.b, w.job);
}

// A judged job's answer, once the baselines of its task are known when it needs them (timed and
// correct): from this service's memory, the baseline cache, or a request every such job waits for.
void Engine::settle(Batch* b, std::size_t job) {
  Run& r = *b->run;
  const Job& j = r.jobs[job];
  if (r.o.untimed || !j.row.value("correct", false)) return complete(b, job);
  std::string code_hash = xxh3_hex(r.tasks[j.task].code), key = code_hash + "|" + r.device_key;
  if (auto c = db_->get(code_hash, r.device_key)) {  // measured before (the cache eval shares)
    r.base[code_hash] = std::move(*c);
    return complete(b, job);
  }
  waiting_[key].push_back({b, job});
}

// The baselines that answers wait for, timed once the pool has drained (take_work gave nothing
// while any answer waited): no solution's child is alive beside them, as when batches ran one at
// a time. A solution alive then (loading, or left running by its import) could load the device
// while eager and torch.compile are timed, and the inflated times, cached for the task code,
// would raise every later answer of that task to 2 or 3. The task codes' baselines run side by
// side with each other, as eval's baselines phase does. One measured goes into the baseline cache
// (baseline_entry); one that failed is measured again for the task's next correct answer.
void Engine::run_baselines() {
  if (waiting_.empty()) return;
  {
    std::lock_guard<std::mutex> l(m_);
    if (stopping_) return;  // stop() answers them service_stopping
  }
  auto todo = std::move(waiting_);
  waiting_.clear();
  std::vector<json> reqs;
  std::vector<const std::string*> keys;
  for (auto& [key, waiters] : todo) {
    const Run& r = *waiters.front().first->run;  // the first answer that waits: its batch, its task's code
    reqs.push_back(r.baseline_request(r.tasks[r.jobs[waiters.front().second].task].code));
    keys.push_back(&key);
  }
  spdlog::info("timing the baselines of {} task code(s) with no solution in flight", reqs.size());
  judge_->run(reqs, [&](WorkerResult&& res) {
    const std::string& key = *keys[res.index];
    auto& waiters = todo[key];
    std::string code_hash = key.substr(0, key.find('|'));
    auto entry = waiters.front().first->run->baseline_entry(res, *db_, code_hash);
    for (auto& [b, job] : waiters) {
      if (entry) b->run->base[code_hash] = *entry;
      try {
        complete(b, job);
      } catch (const std::exception& e) {
        fail_job(b, job, e.what());
      }
    }
  });
}

void log_batch(const Batch& b);

void Engine::complete(Batch* b, std::size_t job, std::optional<json> failure) {
  Job& j = b->run->jobs[job];
  json row = failure ? *failure : b->run->row(j);
  if (failure) row["solution"] = j.sol.key;
  b->rows[j.sol.key] = row;
  b->answered_s[j.sol.key] = seconds(Clock::now() - b->built);
  b->answered[job] = true;
  finish(b->subs[job], failure ? *failure : answer(row, b->subs[job]->sub));
  if (--b->open) return;
  try {
    log_batch(*b);
  } catch (const std::exception& e) {  // a log line is no reason to keep a batch
    spdlog::warn("the line of batch {} could not be written: {}", b->n, e.what());
  }
  std::error_code ec;  // a folder left behind is only litter
  for (auto& jb : b->run->jobs) {
    if (!jb.work.empty()) fs::remove_all(jb.work, ec);
    fs::remove_all(base_.out / "submissions" / jb.sol.key, ec);
  }
  std::lock_guard<std::mutex> l(m_);
  b->retired = true;
}

// Verdicts of memory made while judge workers shared a device, judged again one at a time with
// nothing else on any device (the pool has drained: take_work gave nothing while they waited).
// Bounded like eval's: as long as the shared judging since the last such pass (60 s at least).
void Engine::run_alone() {
  if (alone_.empty()) return;
  {
    std::lock_guard<std::mutex> l(m_);
    if (stopping_) return;  // stop() answers them service_stopping
  }
  double budget_s = std::max(60.0, seconds(Clock::now() - shared_since_));
  spdlog::warn("{} solution(s) ran out of memory while {} judge workers shared the {}: judging each again alone",
               alone_.size(), judges_, base_.device == "cuda" ? "GPUs" : "machine");
  auto t0 = Clock::now();
  auto again = std::move(alone_);
  alone_.clear();
  for (auto& [b, job] : again) {
    try {
      b->run->judge_again_alone(*judge_, b->run->jobs[job], seconds(Clock::now() - t0) < budget_s, budget_s);
    } catch (const std::exception& e) {
      fail_job(b, job, e.what());
      continue;
    }
    settle(b, job);
  }
  shared_since_ = Clock::now();
}

// Where a batch's time went, one line on stderr once its last answer has left: the build, the
// time to its last answer, and the answers a judge worker spent longest on, split into the
// worker's reference, the child's dispatch (ready, solution loaded) and checks, the worker's
// clean-up, and when each left (after the build).
void log_batch(const Batch& b) {
  std::vector<std::pair<double, std::string>> slow;
  double last_s = 0;
  auto num = [](const json& o, const char* k) {  // a figure the row may lack or hold as null
    json v = o.is_object() ? o.value(k, json()) : json();
    return v.is_number() ? v.get<double>() : 0.0;
  };
  for (auto& [key, row] : b.rows) {
    json ph = row.value("phase_s", json::object());
    auto part = [&](const char* k) { return num(ph, k); };
    double d = num(row, "dispatch_s");
    double w = b.worker_s.count(key) ? b.worker_s.at(key) : 0.0, at = b.answered_s.at(key);
    last_s = std::max(last_s, at);
    std::string reason = row.value("reason", json()).is_string() ? row["reason"].get<std::string>() : "correct";
    slow.emplace_back(w, fmt::format("{} {} (worker {:.1f} s: reference {:.1f}, dispatch {:.1f}, checks {:.1f}, "
                                     "clean-up {:.1f}; left at {:.1f} s)",
                                     key, reason, w, part("reference"), d, part("checks"), part("cleanup"), at));
  }
  std::sort(slow.rbegin(), slow.rend());
  std::string top;
  for (std::size_t i = 0; i < std::min<std::size_t>(3, slow.size()); ++i) top += (i ? "; " : "") + slow[i].second;
  spdlog::info("batch of {} answer(s) over {} task(s): build {:.1f} s, last answer {:.1f} s after it; longest: {}",
               b.rows.size(), b.run->tasks.size(), seconds(b.built - b.t0), last_s, top);
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
    if (running_ > 0) --running_;
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
