#include "opforge/core/worker_pool.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <thread>
#include <utility>

#include "opforge/core/error.h"
#include "opforge/core/paths.h"

extern char** environ;

namespace opforge {

using Clock = std::chrono::steady_clock;

const char* outcome_name(Outcome o) {
  switch (o) {
    case Outcome::ok: return "ok";
    case Outcome::timeout: return "timeout";
    case Outcome::worker_crash: return "worker_crash";
    case Outcome::out_of_memory: return "out_of_memory";
  }
  return "unknown";
}

struct WorkerPool::Worker {
  enum class State { starting, idle, busy, dead };
  int slot = 0;
  pid_t pid = -1;
  int in_fd = -1, out_fd = -1, err_fd = -1;
  State state = State::dead;
  std::string out_buf, err_buf, err_tail;
  bool err_skip = false;  // dropping the rest of a log line cut at kMaxLogLine
  Clock::time_point started, deadline;
  std::size_t job = 0;
  double job_timeout = 0;
  bool killed_by_us = false;
  std::string kill_reason;
  Outcome kill_outcome = Outcome::worker_crash;
};

namespace {

constexpr std::size_t kTailBytes = 4000;
constexpr std::size_t kMaxLogLine = 64 * 1024;

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

std::size_t rss_mib(pid_t pid) {
  std::FILE* f = std::fopen(fmt::format("/proc/{}/statm", pid).c_str(), "r");
  if (!f) return 0;
  unsigned long size = 0, resident = 0;
  int n = std::fscanf(f, "%lu %lu", &size, &resident);
  std::fclose(f);
  if (n != 2) return 0;
  return resident * static_cast<std::size_t>(sysconf(_SC_PAGESIZE)) / (1024 * 1024);
}

bool write_all(int fd, const std::string& s) {
  std::size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::write(fd, s.data() + off, s.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    off += static_cast<std::size_t>(n);
  }
  return true;
}

std::string describe_status(int status) {
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    return fmt::format("killed by signal {} ({})", sig, strsignal(sig));
  }
  if (WIFEXITED(status)) return fmt::format("exited with status {}", WEXITSTATUS(status));
  return "ended";
}

}  // namespace

WorkerPool::WorkerPool(WorkerPoolOptions options) : opts_(std::move(options)) {
  OPFORGE_CHECK(opts_.workers >= 1, "--workers must be at least 1 (got {})", opts_.workers);
  // A worker that dies mid-write must not kill the supervisor.
  ::signal(SIGPIPE, SIG_IGN);
  if (!opts_.log_file.empty()) log_ = std::fopen(opts_.log_file.c_str(), "a");
  for (int i = 0; i < opts_.workers; ++i) {
    workers_.push_back(std::make_unique<Worker>());
    workers_.back()->slot = i;
  }
}

WorkerPool::~WorkerPool() {
  for (auto& w : workers_) {
    if (w->state == Worker::State::dead) continue;
    close_fd(w->in_fd);  // a polite worker exits on EOF; we do not wait for it
    ::kill(-w->pid, SIGKILL);
    ::waitpid(w->pid, nullptr, 0);
    close_fd(w->out_fd);
    close_fd(w->err_fd);
  }
  if (log_) std::fclose(log_);
}

void WorkerPool::spawn(int slot) {
  Worker& w = *workers_[slot];
  int in[2], out[2], err[2];
  OPFORGE_CHECK(pipe2(in, O_CLOEXEC) == 0 && pipe2(out, O_CLOEXEC) == 0 && pipe2(err, O_CLOEXEC) == 0,
                "cannot create pipes for a worker: {}", std::strerror(errno));

  // Build argv and envp before fork: only async-signal-safe calls may follow it.
  std::string exe = (opts_.worker_exe.empty() ? self_executable() : opts_.worker_exe).string();
  std::vector<std::string> args = {exe, "worker", "--protocol-fd", "3"};
  std::map<std::string, std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    auto eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (auto& [k, v] : opts_.env) env[k] = v;
  if (!opts_.slot_env.empty())
    for (auto& [k, v] : opts_.slot_env[slot % opts_.slot_env.size()]) env[k] = v;
  env["PYTHONUNBUFFERED"] = "1";
  // Workers share the cores: oversubscribed OpenMP pools spin and turn microsecond ops into
  // scheduler-tick milliseconds, which would poison every CPU timing.
  if (!env.count("OMP_NUM_THREADS")) {
    unsigned hw = usable_cpus();
    env["OMP_NUM_THREADS"] = std::to_string(std::max(1u, hw / static_cast<unsigned>(workers_.size())));
  }
  std::vector<std::string> env_strings;
  for (auto& [k, v] : env) env_strings.push_back(k + "=" + v);
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t parent = getpid();

  pid_t pid = fork();
  OPFORGE_CHECK(pid >= 0, "cannot fork a worker: {}", std::strerror(errno));
  if (pid == 0) {
    // Own process group: killing -pid also kills what the task spawned (inductor compile workers).
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // a SIGKILLed supervisor takes its workers with it
    if (getppid() != parent) _exit(127);
    dup2(in[0], 0);
    dup2(err[1], 1);
    dup2(err[1], 2);
    dup2(out[1], 3);
    execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  setpgid(pid, pid);
  ::close(in[0]);
  ::close(out[1]);
  ::close(err[1]);
  w = Worker{};
  w.slot = slot;
  w.pid = pid;
  w.in_fd = in[1];
  w.out_fd = out[0];
  w.err_fd = err[0];
  w.state = Worker::State::starting;
  w.started = Clock::now();
  w.deadline = w.started + std::chrono::duration_cast<Clock::duration>(
                               std::chrono::duration<double>(opts_.startup_timeout_s));
  spdlog::debug("started worker {} (pid {})", slot, pid);
}

void WorkerPool::reap(Worker& w, const std::string& why_if_alive) {
  // Give a dying worker a moment to be reaped with its real status (segfault, abort) before we
  // kill it ourselves.
  int status = 0;
  pid_t r = 0;
  for (int i = 0; i < 100 && r == 0; ++i) {
    r = ::waitpid(w.pid, &status, WNOHANG);
    if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (r == 0) {
    ::kill(-w.pid, SIGKILL);
    ::waitpid(w.pid, &status, 0);
    if (!w.killed_by_us) {
      w.killed_by_us = true;
      w.kill_reason = why_if_alive;
      w.kill_outcome = Outcome::worker_crash;
    }
  } else {
    ::kill(-w.pid, SIGKILL);  // leftovers of its process group
  }
  if (!w.killed_by_us) {
    w.kill_reason = describe_status(status);
    w.kill_outcome = Outcome::worker_crash;
    // SIGKILL that we did not send: the kernel's OOM killer is the usual sender.
    if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) {
      w.kill_outcome = Outcome::out_of_memory;
      w.kill_reason += " (not by opforge: most likely the kernel's OOM killer)";
    }
  }
  close_fd(w.in_fd);
  close_fd(w.out_fd);
  close_fd(w.err_fd);
  w.state = Worker::State::dead;
}

void WorkerPool::run(const std::vector<nlohmann::json>& requests,
                     const std::function<void(WorkerResult&&)>& on_result) {
  bool given = false;
  run_fed([&] { return std::exchange(given, true) ? std::vector<nlohmann::json>{} : requests; }, on_result);
}

namespace {

void kill_worker(WorkerPool::Worker& w, Outcome outcome, std::string reason) {
  w.killed_by_us = true;
  w.kill_outcome = outcome;
  w.kill_reason = std::move(reason);
  ::kill(-w.pid, SIGKILL);
}

// What every answer to a busy worker's request starts from: the request, the slot, its seconds.
WorkerResult result_of(const WorkerPool::Worker& w) {
  WorkerResult r;
  r.index = w.job;
  r.slot = w.slot;
  r.seconds = std::chrono::duration<double>(Clock::now() - w.started).count();
  return r;
}

}  // namespace

struct WorkerPool::Feed {
  const std::function<void(WorkerResult&&)>& on_result;
  std::vector<nlohmann::json> requests;  // by index; a sent one is reset to null
  std::deque<std::size_t> pending;       // indices not yet sent
  std::size_t done = 0;                  // results handed to on_result
  bool ask = true;                       // ask `more` again: at the start, and after each result

  void deliver(WorkerResult&& r) {
    ++done;
    ask = true;
    on_result(std::move(r));
  }
};

void WorkerPool::run_fed(const std::function<std::vector<nlohmann::json>()>& more,
                         const std::function<void(WorkerResult&&)>& on_result, bool poll_more) {
  Feed f{on_result, {}, {}};
  for (;;) {
    if (f.pending.empty() && (f.ask || poll_more)) {
      f.ask = false;
      for (auto& req : more()) {
        f.pending.push_back(f.requests.size());
        f.requests.push_back(std::move(req));
      }
    }
    if (f.done == f.requests.size()) break;  // nothing in flight, and `more` had nothing
    dispatch(f);
    poll_io(f);
    enforce_limits();
  }
}

// Keeps the pool full while there is work, and hands work to idle workers.
void WorkerPool::dispatch(Feed& f) {
  for (auto& wp : workers_) {
    Worker& w = *wp;
    if (w.state == Worker::State::dead && !f.pending.empty()) spawn(w.slot);
    if (w.state != Worker::State::idle || f.pending.empty()) continue;
    std::size_t i = f.pending.front();
    f.pending.pop_front();
    const auto& req = f.requests[i];
    double timeout = req.contains("timeout_s") ? req["timeout_s"].get<double>() : opts_.timeout_s;
    w.job = i;
    w.job_timeout = timeout;
    w.started = Clock::now();
    w.deadline = w.started + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout));
    w.state = Worker::State::busy;
    w.err_tail.clear();
    bool sent = write_all(w.in_fd, req.dump() + "\n");
    f.requests[i] = nullptr;  // sent: a long-fed run (opforge serve) keeps only its count
    if (!sent) kill_worker(w, Outcome::worker_crash, fmt::format("could not send the request: {}", std::strerror(errno)));
  }
}

// Up to 100 ms for the workers' pipes: replies, log lines, and pipes that closed.
void WorkerPool::poll_io(Feed& f) {
  std::vector<pollfd> fds;
  std::vector<std::pair<Worker*, bool>> owners;  // (worker, is_err)
  for (auto& wp : workers_) {
    if (wp->state == Worker::State::dead) continue;
    if (wp->out_fd >= 0) {
      fds.push_back({wp->out_fd, POLLIN, 0});
      owners.push_back({wp.get(), false});
    }
    if (wp->err_fd >= 0) {
      fds.push_back({wp->err_fd, POLLIN, 0});
      owners.push_back({wp.get(), true});
    }
  }
  int rc = ::poll(fds.data(), fds.size(), 100);
  OPFORGE_CHECK(rc >= 0 || errno == EINTR, "poll on workers failed: {}", std::strerror(errno));
  for (std::size_t k = 0; k < fds.size(); ++k) {
    if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    auto [w, is_err] = owners[k];
    if (w->state == Worker::State::dead) continue;
    int& fd = is_err ? w->err_fd : w->out_fd;
    if (fd < 0) continue;
    if (drain(*w, fd, is_err ? w->err_buf : w->out_buf, is_err, f)) continue;
    if (is_err) close_fd(w->err_fd);  // stderr closed; the protocol pipe decides life or death
    else finish_dead(*w, f);
  }
}

// Reads what a pipe has; complete lines go to the log (stderr) or to handle_line (protocol).
// False at EOF: the worker is gone (or closed that pipe).
bool WorkerPool::drain(Worker& w, int& fd, std::string& buf, bool is_err, Feed& f) {
  char chunk[65536];
  ssize_t n = ::read(fd, chunk, sizeof chunk);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
  if (n <= 0) return false;
  // Only the new bytes are searched for a newline: a worker (or code it runs) writing one endless
  // line must not make each read scan everything buffered before it.
  std::size_t pos, from = buf.size();
  buf.append(chunk, static_cast<std::size_t>(n));
  if (is_err && w.err_skip) {  // the rest of a log line already cut: dropped up to its newline
    if ((pos = buf.find('\n', from)) == std::string::npos) {
      buf.clear();
      return true;
    }
    buf.erase(0, pos + 1);
    w.err_skip = false;
    from = 0;
  }
  std::size_t start = 0;  // the lines are taken off the front once, after the last: not one shift each
  while ((pos = buf.find('\n', from)) != std::string::npos) {
    std::string line = buf.substr(start, pos - start);
    start = from = pos + 1;
    if (is_err) log_line(w, line);
    else handle_line(w, line, f);
  }
  buf.erase(0, start);
  // A log line is kept to kMaxLogLine bytes, so its buffer cannot grow without bound; protocol
  // replies may be large and are whole JSON, so they are never cut.
  if (is_err && buf.size() > kMaxLogLine) {
    log_line(w, buf.substr(0, kMaxLogLine) + " [... line cut at " + std::to_string(kMaxLogLine) + " bytes]");
    buf.clear();
    w.err_skip = true;
  }
  return true;
}

// One line a worker wrote on stdout or stderr: to the workers' log, and the tail kept for its result.
void WorkerPool::log_line(Worker& w, const std::string& line) {
  if (log_) {
    std::fprintf(log_, "[worker %d pid %d] %s\n", w.slot, w.pid, line.c_str());
    std::fflush(log_);
  } else {
    spdlog::debug("[worker {}] {}", w.slot, line);
  }
  w.err_tail += line + "\n";
  if (w.err_tail.size() > kTailBytes) w.err_tail.erase(0, w.err_tail.size() - kTailBytes);
}

// One protocol line: a starting worker's ready message, or a busy worker's reply.
void WorkerPool::handle_line(Worker& w, const std::string& line, Feed& f) {
  nlohmann::json msg;
  try {
    msg = nlohmann::json::parse(line);
  } catch (const std::exception& e) {
    kill_worker(w, Outcome::worker_crash, fmt::format("protocol error: unparsable reply ({})", e.what()));
    return;
  }
  if (w.state == Worker::State::starting) {
    if (info_.is_null()) info_ = msg;
    w.state = Worker::State::idle;
    spdlog::debug("worker {} ready in {:.1f}s", w.slot, std::chrono::duration<double>(Clock::now() - w.started).count());
    return;
  }
  if (w.state != Worker::State::busy) return;
  WorkerResult r = result_of(w);
  r.reply = std::move(msg);
  w.state = Worker::State::idle;
  w.err_tail.clear();
  f.deliver(std::move(r));
}

// A worker whose protocol pipe closed: reaped, and its request (if any) answered with why it died.
void WorkerPool::finish_dead(Worker& w, Feed& f) {
  bool was_busy = w.state == Worker::State::busy;
  bool was_starting = w.state == Worker::State::starting;
  reap(w, "closed its protocol pipe");
  if (was_starting) {
    ++startup_failures_;
    spdlog::warn("worker {} failed to start: {}", w.slot, w.kill_reason);
    OPFORGE_CHECK(startup_failures_ < 3 || !info_.is_null(),
                  "workers cannot start ({}); the last one wrote:\n{}\nCheck the venv (`make setup`) "
                  "or OPFORGE_PYTHON",
                  w.kill_reason, w.err_tail);
  }
  if (!was_busy) return;
  WorkerResult r = result_of(w);
  r.outcome = w.kill_outcome;
  r.reason = w.kill_reason;
  r.log_tail = w.err_tail;
  spdlog::debug("worker {} request {}: {} ({})", w.slot, w.job, outcome_name(r.outcome), r.reason);
  f.deliver(std::move(r));
}

// Deadlines (a request's, or a start's) and the memory limit: a worker past one is killed, and
// its pipe's closing answers its request.
void WorkerPool::enforce_limits() {
  const std::size_t limit_mb = opts_.memory_limit_mb;
  auto now = Clock::now();
  for (auto& wp : workers_) {
    Worker& w = *wp;
    if (w.state == Worker::State::dead || w.killed_by_us) continue;
    if (now > w.deadline) {
      if (w.state == Worker::State::busy)
        kill_worker(w, Outcome::timeout, fmt::format("no answer within {:.0f} s; killed", w.job_timeout));
      else if (w.state == Worker::State::starting)
        kill_worker(w, Outcome::timeout, fmt::format("did not start within {:.0f} s", opts_.startup_timeout_s));
    } else if (limit_mb > 0 && w.state == Worker::State::busy) {
      std::size_t rss = rss_mib(w.pid);
      if (rss > limit_mb)
        kill_worker(w, Outcome::out_of_memory,
                    fmt::format("resident memory {} MiB exceeded the limit of {} MiB; killed", rss, limit_mb));
    }
  }
}

WorkerResult WorkerPool::call(const nlohmann::json& request) {
  WorkerResult out;
  run({request}, [&](WorkerResult&& r) { out = std::move(r); });
  return out;
}

unsigned usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) return static_cast<unsigned>(CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

}  // namespace opforge
