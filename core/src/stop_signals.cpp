#include "opforge/core/stop_signals.h"

#include <pthread.h>

#include "opforge/core/log.h"

namespace opforge {

StopOnSignals::StopOnSignals() {
  sigemptyset(&signals_);
  sigaddset(&signals_, SIGINT);
  sigaddset(&signals_, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals_, nullptr);
}

void StopOnSignals::start(std::function<void()> stop) {
  waiter_ = std::thread([this, stop = std::move(stop)] {
    int sig = 0;
    sigwait(&signals_, &sig);
    if (signaled_.exchange(true)) return;  // the destructor's wake-up, not a user's signal
    spdlog::info("signal {}: stopping", sig);
    stop();
  });
}

StopOnSignals::~StopOnSignals() {
  if (!waiter_.joinable()) return;
  if (!signaled_.exchange(true)) pthread_kill(waiter_.native_handle(), SIGTERM);  // stopped for another reason
  waiter_.join();
}

}  // namespace opforge
