// opforge serve as a child (judge_process.h).
#include "judge_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <regex>

#include "opforge/core/error.h"
#include "opforge/core/files.h"
#include "opforge/core/paths.h"

namespace fs = std::filesystem;

namespace opforge::evaluator {

JudgeProcess::JudgeProcess(const fs::path& tasks, const std::string& device, const std::vector<std::string>& extra,
                         const fs::path& dir) {
  fs::create_directories(dir);
  std::vector<std::string> args = {opforge_executable().string(), "serve", "--tasks", fs::absolute(tasks).string(),
                                   "--port", "0", "--device", device, "--state-dir", (dir / "state").string()};
  args.insert(args.end(), extra.begin(), extra.end());
  start(args, dir / "serve.log");
  url_ = wait_for_url(dir / "serve.log");
}

JudgeProcess::~JudgeProcess() {
  if (pid_ > 0) {
    ::kill(pid_, SIGTERM);
    ::waitpid(pid_, nullptr, 0);
  }
  if (out_ >= 0) ::close(out_);
}

// fork + exec rather than posix_spawn: the judge must die with this command (PR_SET_PDEATHSIG), even
// when it is killed, or its workers would hold the port and the GPU.
void JudgeProcess::start(const std::vector<std::string>& args, const fs::path& log) {
  int p[2];
  OPFORGE_CHECK(::pipe2(p, O_CLOEXEC) == 0, "cannot make a pipe for the judge");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::string log_path = log.string();
  pid_t parent = ::getpid();
  pid_ = ::fork();
  OPFORGE_CHECK(pid_ >= 0, "cannot start the judge (opforge serve): {}", std::strerror(errno));
  if (pid_ == 0) {  // only async-signal-safe calls until exec
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(127);  // the command died before the signal was armed
    int err = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    ::dup2(p[1], 1);
    if (err >= 0) ::dup2(err, 2);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(p[1]);
  out_ = p[0];
}

// "listening on http://HOST:PORT" once its workers are warm (they import torch first).
std::string JudgeProcess::wait_for_url(const fs::path& log) {
  std::string text;
  char buf[4096];
  ssize_t n;
  std::smatch m;
  static const std::regex re("listening on (http://[^ \\n]+)");
  while ((n = ::read(out_, buf, sizeof buf)) > 0) {
    text.append(buf, static_cast<std::size_t>(n));
    if (std::regex_search(text, m, re)) return m[1].str();
  }
  ::waitpid(pid_, nullptr, 0);
  pid_ = -1;
  std::string tail = fs::exists(log) ? read_text(log) : "";
  throw Error(fmt::format("the judge (opforge serve) did not start; its log {} ends:\n{}", log.string(),
                          tail.size() > 3000 ? tail.substr(tail.size() - 3000) : tail));
}

}  // namespace opforge::evaluator
