// Progress of long work on stderr: a redrawn bar with rate and ETA on a terminal, a log line
// every 10% otherwise (CI logs stay short). Never writes to stdout.
#pragma once
#include <chrono>
#include <cstddef>
#include <string>

namespace opforge {

class Progress {
 public:
  Progress(std::string label, std::size_t total);
  ~Progress();
  // Counts n more items done; note is shown at the end of the line (e.g. "12 failed").
  void tick(std::size_t n = 1, const std::string& note = {});
  void finish();

 private:
  void draw(bool final);
  std::string label_;
  std::size_t total_, done_ = 0;
  std::string note_;
  bool tty_, finished_ = false;
  int last_decile_ = -1;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace opforge
