#include "subprocess.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <unistd.h>
#include <sys/wait.h>

#include <cerrno>
#include <csignal>
#include <cstring>

#include "opforge/core/error.h"
#include "opforge/core/files.h"

namespace opforge::trainer {
namespace fs = std::filesystem;

// fork + exec rather than posix_spawn: a child must die with the trainer (PR_SET_PDEATHSIG), or a
// killed run leaves its agent runs talking to a policy server that is gone, and a rerun finds them.
// PDEATHSIG follows the thread that forked: the stages spawn from the main thread, which lives.
pid_t spawn_logged(const std::vector<std::string>& args, const fs::path& log) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  fs::create_directories(log.parent_path());
  // Opened here, not in the child: only async-signal-safe calls may run between fork and exec.
  int out = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  OPFORGE_CHECK(out >= 0, "cannot open {} for the log of {}: {}", log.string(), args[0], std::strerror(errno));
  int in = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  int ready[2];  // closed by exec: a read of 0 bytes means the exec happened, 4 bytes carry its errno
  OPFORGE_CHECK(in >= 0 && ::pipe2(ready, O_CLOEXEC) == 0, "cannot start {}: {}", args[0], std::strerror(errno));
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(127);  // the trainer died before the signal was armed
    ::dup2(in, 0);
    ::dup2(out, 1);
    ::dup2(out, 2);
    ::execv(argv[0], argv.data());
    int e = errno;
    [[maybe_unused]] auto n = ::write(ready[1], &e, sizeof e);
    ::_exit(127);
  }
  int fork_errno = errno;
  ::close(out);
  ::close(in);
  ::close(ready[1]);
  int e = 0;
  ssize_t n = pid < 0 ? 0 : ::read(ready[0], &e, sizeof e);
  ::close(ready[0]);
  OPFORGE_CHECK(pid >= 0, "cannot start {}: {}", args[0], std::strerror(fork_errno));
  if (n == static_cast<ssize_t>(sizeof e)) {
    ::waitpid(pid, nullptr, 0);
    throw Error(fmt::format("cannot start {}: {}", args[0], std::strerror(e)));
  }
  return pid;
}

std::string wait_logged(pid_t pid, const std::string& what, const fs::path& log) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return "";
  std::string text = fs::exists(log) ? read_text(log) : "";
  if (text.size() > 2000) text = text.substr(text.size() - 2000);
  return fmt::format("{} failed ({}; log {}):\n{}", what,
                     WIFEXITED(status) ? fmt::format("exit {}", WEXITSTATUS(status))
                                       : fmt::format("signal {}", WTERMSIG(status)),
                     log.string(), text);
}

void run_logged(const std::vector<std::string>& args, const std::string& what, const fs::path& log) {
  std::string failed = wait_logged(spawn_logged(args, log), what, log);
  OPFORGE_CHECK(failed.empty(), "{}", failed);
}

}  // namespace opforge::trainer
