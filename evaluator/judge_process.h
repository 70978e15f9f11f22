// The evaluator's client of `opforge serve`, run as a child of the command that needs a judge (the
// agent's run and its SFT set's re-judging, the trainer) on a free loopback port, until the command
// ends; it dies with the command even when that is killed. The binary is opforge_executable().
//
// Errors: a judge that does not start throws opforge::Error with the end of its log.
#pragma once
#include <sys/types.h>

#include <filesystem>
#include <string>
#include <vector>

namespace opforge::evaluator {

class JudgeProcess {
 public:
  // opforge serve --tasks TASKS --port 0 --device DEVICE --state-dir DIR/state EXTRA..., stderr in DIR/serve.log.
  JudgeProcess(const std::filesystem::path& tasks, const std::string& device, const std::vector<std::string>& extra,
               const std::filesystem::path& dir);
  ~JudgeProcess();
  JudgeProcess(const JudgeProcess&) = delete;
  JudgeProcess& operator=(const JudgeProcess&) = delete;
  const std::string& url() const { return url_; }

 private:
  void start(const std::vector<std::string>& args, const std::filesystem::path& log);
  std::string wait_for_url(const std::filesystem::path& log);

  pid_t pid_ = -1;
  int out_ = -1;
  std::string url_;
};

}  // namespace opforge::evaluator
