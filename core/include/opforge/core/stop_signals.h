// SIGINT and SIGTERM end a long-running server (`opforge serve`, `opforge generate --serve`).
// The constructor blocks them in the calling thread, and so in every thread it starts afterwards
// (libtorch's, the interpreter's, an HTTP pool's): construct it before any of them. `start`
// leaves one waiter thread in sigwait, which logs the signal and calls `stop`; the destructor ends
// that waiter when the server stopped for another reason.
#pragma once
#include <signal.h>

#include <atomic>
#include <functional>
#include <thread>

namespace opforge {

class StopOnSignals {
 public:
  StopOnSignals();
  ~StopOnSignals();
  StopOnSignals(const StopOnSignals&) = delete;
  StopOnSignals& operator=(const StopOnSignals&) = delete;
  void start(std::function<void()> stop);

 private:
  sigset_t signals_;
  std::thread waiter_;
  std::atomic<bool> signaled_{false};
};

}  // namespace opforge
