// The bash tool (shell.h): a sandboxed command, its output capped, its time limited, and the
// judge's socket relayed while it runs.
#include "shell.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>

#include "opforge/core/error.h"
#include "opforge/core/paths.h"

extern char** environ;

namespace fs = std::filesystem;
using nlohmann::json;

namespace opforge::agent {

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::size_t kMaxJudgeLine = 8u << 20;  // a submission is capped at 1 MiB by serve
constexpr double kKillGraceS = 5;                // SIGTERM to sandbox-exec, then SIGKILL

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::vector<std::string> command_argv(const ShellRequest& r) {
  if (r.no_sandbox) return {"/bin/bash", "-c", r.command};
  std::string path = "/usr/local/bin:/usr/bin:/bin";
  if (auto p = r.env.find("PATH"); p != r.env.end()) path = p->second;
  json env = {{"HOME", "/home"}, {"LANG", "C.UTF-8"}, {"TMPDIR", "/tmp"}, {"OPFORGE_JUDGE_FD", "3"}};
  for (auto& [k, v] : r.env) env[k] = v;
  env["PATH"] = path;
  json spec = {{"work", fs::absolute(r.folder).string()}, {"ro", r.ro},       {"env", env},
               {"memory_mb", r.memory_mb},                 {"max_pids", 512}, {"cwd", "/work"},
               {"keep_fds", {3}}};
  return {self_executable().string(), "sandbox-exec", "--spec", spec.dump(), "--", "/bin/bash", "-c", r.command};
}

// The command with stdout and stderr on `out`, fd 3 on `sock`, stdin /dev/null.
pid_t spawn(const ShellRequest& r, int out, int sock) {
  auto args = command_argv(r);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> envs;
  std::vector<char*> envp;
  for (char** e = environ; *e; ++e) envs.emplace_back(*e);
  if (r.no_sandbox) {
    envs.push_back("OPFORGE_JUDGE_FD=3");
    for (auto& [k, v] : r.env) envs.push_back(k + "=" + v);
  }
  for (auto& e : envs) envp.push_back(e.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, out, 1);
  posix_spawn_file_actions_adddup2(&fa, out, 2);
  posix_spawn_file_actions_adddup2(&fa, sock, 3);
  if (r.no_sandbox) posix_spawn_file_actions_addchdir_np(&fa, r.folder.c_str());
  pid_t pid = 0;
  int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  OPFORGE_CHECK(rc == 0, "cannot start the bash tool's sandbox ({}): {}", argv[0], std::strerror(rc));
  return pid;
}

// Output kept as head and tail of at most cap characters in all.
struct Capped {
  std::size_t cap, total = 0;
  std::string head, tail;
  void add(const char* p, std::size_t n) {
    total += n;
    std::size_t room = cap / 2 > head.size() ? cap / 2 - head.size() : 0;
    std::size_t h = std::min(room, n);
    head.append(p, h);
    tail.append(p + h, n - h);
    if (tail.size() > cap - cap / 2) tail.erase(0, tail.size() - (cap - cap / 2));
  }
  std::string text() const {
    std::size_t dropped = total - head.size() - tail.size();
    if (dropped == 0) return head + tail;
    return head + fmt::format("\n[... {} bytes of output left out ...]\n", dropped) + tail;
  }
};

void send_all(int fd, const std::string& s) {
  std::size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the command closed its end: nobody is waiting for the answer
    off += static_cast<std::size_t>(n);
  }
}

// The lines that came on the judge's socket, each answered in turn.
void relay(const ShellRequest& req, std::string& buf, int sock, ShellResult& res) {
  std::size_t nl;
  while ((nl = buf.find('\n')) != std::string::npos) {
    std::string line = buf.substr(0, nl);
    buf.erase(0, nl + 1);
    auto t0 = Clock::now();
    std::string answer = req.judge ? req.judge(line) : json{{"error", "no judge in this run"}}.dump();
    res.judge_seconds += since(t0);
    ++res.judge_requests;
    send_all(sock, answer + "\n");
  }
  if (buf.size() > kMaxJudgeLine) {
    buf.clear();
    send_all(sock, json{{"error", "the request to the judge is larger than 8 MiB"}}.dump() + "\n");
  }
}

struct Loop {
  const ShellRequest& req;
  pid_t pid;
  int out, sock;
  ShellResult res;
  Capped cap{std::max<std::size_t>(req.output_cap, 64)};
  std::string line;
  Clock::time_point start = Clock::now(), killed_at;
  bool killed = false;
  int status = 0;

  bool read_into(int& fd, bool is_out) {
    char buf[65536];
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
    if (n <= 0) {
      ::close(fd);
      fd = -1;
      return false;
    }
    if (is_out) cap.add(buf, static_cast<std::size_t>(n)); else line.append(buf, static_cast<std::size_t>(n));
    if (!is_out) relay(req, line, sock, res);
    return true;
  }

  // After the command exited: what is left in the pipe (non-blocking), then the pipe is closed.
  void drain() {
    char buf[65536];
    ssize_t n;
    while ((n = ::read(out, buf, sizeof buf)) > 0) cap.add(buf, static_cast<std::size_t>(n));
    ::close(out);
    out = -1;
  }

  void enforce_limit() {
    double own = since(start) - res.judge_seconds;
    if (!killed && own > req.timeout_s) {
      ::kill(pid, SIGTERM);  // sandbox-exec SIGKILLs the whole sandbox
      killed = true;
      res.timed_out = true;
      killed_at = Clock::now();
    } else if (killed && since(killed_at) > kKillGraceS) {
      ::kill(pid, SIGKILL);
    }
  }

  void run() {
    bool exited = false;
    while (!exited || out >= 0) {
      enforce_limit();
      pollfd fds[2];
      int n = 0;
      if (out >= 0) fds[n++] = {out, POLLIN, 0};
      if (sock >= 0) fds[n++] = {sock, POLLIN, 0};
      if (n > 0) ::poll(fds, n, 100); else ::usleep(100000);
      for (int i = 0; i < n; ++i)
        if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) read_into(fds[i].fd == out ? out : sock, fds[i].fd == out);
      if (!exited && ::waitpid(pid, &status, WNOHANG) == pid) {
        exited = true;
        if (sock >= 0) { ::close(sock); sock = -1; }
        // Whatever is still in the pipe comes within a moment; a leftover writer does not hold us.
        if (out >= 0) fcntl(out, F_SETFL, O_NONBLOCK);
      }
      if (exited && out >= 0) drain();
    }
    res.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    res.seconds = since(start) - res.judge_seconds;
    res.output = cap.text();
    res.output_bytes = cap.total;
  }
};

}  // namespace

ShellResult run_shell(const ShellRequest& req) {
  int out[2], sv[2];
  OPFORGE_CHECK(::pipe2(out, O_CLOEXEC) == 0, "bash tool: cannot make a pipe: {}", std::strerror(errno));
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    ::close(out[0]);
    ::close(out[1]);
    throw Error(fmt::format("bash tool: cannot make the judge's socket: {}", std::strerror(errno)));
  }
  pid_t pid = 0;
  try {
    pid = spawn(req, out[1], sv[1]);
  } catch (...) {
    for (int fd : {out[0], out[1], sv[0], sv[1]}) ::close(fd);
    throw;
  }
  ::close(out[1]);
  ::close(sv[1]);
  Loop loop{req, pid, out[0], sv[0], {}};
  loop.run();
  return loop.res;
}

std::string shell_report(const ShellResult& r, double timeout_s) {
  std::string s = r.output;
  if (!s.empty() && s.back() != '\n') s += "\n";
  if (r.timed_out)
    return s + fmt::format("[killed after {:g} s: the command's time limit; the judge's answers do not count]", timeout_s);
  return s + fmt::format("[exit {}]", r.exit_code);
}

}  // namespace opforge::agent
