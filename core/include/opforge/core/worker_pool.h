// A pool of `opforge worker` child processes that run task code so the supervisor never does.
//
// Each worker embeds CPython, imports torch once and answers JSON-line requests. The pool (the
// supervisor) enforces a per-request timeout and a resident-memory limit, and replaces a worker
// that hangs, crashes (segfault, abort, CUDA error) or is OOM-killed. Such a request comes back
// as a WorkerResult with a non-ok outcome and a reason: an expected failure, not an exception.
//
// Thread safety: a pool is driven from one thread; callbacks run on that thread.
// Errors: throws opforge::Error only when workers cannot start at all (bad venv, missing torch).
#pragma once
#include <nlohmann/json.hpp>

#include <cstddef>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace opforge {

struct WorkerPoolOptions {
  int workers = 2;
  // Default per-request limit; a request may carry its own "timeout_s".
  double timeout_s = 120;
  // Importing torch (and transformers) in a fresh worker; not counted against a request.
  double startup_timeout_s = 600;
  // Resident set size limit per worker, MiB; 0 means none. RSS, not RLIMIT_AS: a CUDA context
  // reserves far more address space than memory (docs/architecture.md, "Process model").
  std::size_t memory_limit_mb = 0;
  // Workers' stdout/stderr are appended here (with a worker prefix); empty: stderr of the pool.
  std::filesystem::path log_file;
  // Extra environment for the worker in slot i (i mod size), e.g. CUDA_VISIBLE_DEVICES.
  std::vector<std::map<std::string, std::string>> slot_env;
  // The binary started as `EXE worker --protocol-fd 3`; empty: this binary (/proc/self/exe).
  std::filesystem::path worker_exe;
  // Extra environment for every worker.
  std::map<std::string, std::string> env;
};

enum class Outcome { ok, timeout, worker_crash, out_of_memory };
const char* outcome_name(Outcome o);

struct WorkerResult {
  std::size_t index = 0;  // position in the request vector
  Outcome outcome = Outcome::ok;
  nlohmann::json reply;   // the worker's reply, when outcome == ok
  std::string reason;     // why it failed, when outcome != ok ("killed by signal 11 (Segmentation fault)")
  std::string log_tail;   // the last lines the worker wrote to stderr, when it failed
  double seconds = 0;
  int slot = -1;          // which worker slot ran it
};

class WorkerPool {
 public:
  explicit WorkerPool(WorkerPoolOptions options);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Runs every request on some worker; on_result is called once per request as it finishes
  // (completion order). Workers persist across calls.
  void run(const std::vector<nlohmann::json>& requests, const std::function<void(WorkerResult&&)>& on_result);
  // The same for work handed out as it is claimed (the filter's leases): `more` is asked for
  // requests at the start and whenever a result leaves none waiting; their indices continue those
  // handed out before. Returns when `more` gives none and no request is in flight.
  // poll_more: `more` is also asked at every turn of the loop (at most every 100 ms) while no
  // request waits, so work that arrives from another thread (`opforge serve`'s submissions) is
  // taken at once and starts on the first idle worker, not after a request in flight has
  // finished; `more` must then not block.
  void run_fed(const std::function<std::vector<nlohmann::json>()>& more,
               const std::function<void(WorkerResult&&)>& on_result, bool poll_more = false);
  // One request, synchronously.
  WorkerResult call(const nlohmann::json& request);

  // The ready message of the first worker that started (versions of python, torch, ...).
  const nlohmann::json& worker_info() const { return info_; }

  struct Worker;

 private:
  struct Feed;  // one run_fed's requests, queue and count of results
  void spawn(int slot);
  void reap(Worker& w, const std::string& why_if_alive);
  void dispatch(Feed& f);
  void poll_io(Feed& f);
  bool drain(Worker& w, int& fd, std::string& buf, bool is_err, Feed& f);
  void handle_line(Worker& w, const std::string& line, Feed& f);
  void log_line(Worker& w, const std::string& line);
  void finish_dead(Worker& w, Feed& f);
  void enforce_limits();
  WorkerPoolOptions opts_;
  std::vector<std::unique_ptr<Worker>> workers_;
  nlohmann::json info_;
  std::FILE* log_ = nullptr;
  int startup_failures_ = 0;
};

// The cores this process may run on (its CPU affinity, as `nproc` counts them), at least 1: what
// workers share out. std::thread::hardware_concurrency counts the machine's cores instead, which
// oversubscribes a process pinned to a part of it (taskset, a container's cpuset).
unsigned usable_cpus();

}  // namespace opforge
