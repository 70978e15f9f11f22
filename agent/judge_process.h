// `opforge serve` as a child of an agent command (the run, the SFT set's re-judging), on a free
// loopback port, until the command ends; it dies with the command even when that is killed.
//
// Errors: a judge that does not start throws opforge::Error with the end of its log.
#pragma once
#include <sys/types.h>

#include <filesystem>
#include <string>
#include <vector>

namespace opforge::agent {

class JudgeProcess {
 public:
  // serve --tasks TASKS --port 0 --device DEVICE --state-dir DIR/state EXTRA..., stderr in DIR/serve.log.
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

}  // namespace opforge::agent
