#include "subprocess.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>

#include <cstring>

#include "opforge/core/error.h"
#include "opforge/core/files.h"

extern char** environ;

namespace opforge::trainer {
namespace fs = std::filesystem;

pid_t spawn_logged(const std::vector<std::string>& args, const fs::path& log) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  fs::create_directories(log.parent_path());
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = -1;
  int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  OPFORGE_CHECK(rc == 0, "cannot start {}: {}", args[0], std::strerror(rc));
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
