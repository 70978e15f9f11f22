#include "opforge/core/progress.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdio>

namespace opforge {

Progress::Progress(std::string label, std::size_t total)
    : label_(std::move(label)), total_(total), tty_(::isatty(STDERR_FILENO) == 1),
      start_(std::chrono::steady_clock::now()), last_draw_(start_) {}

Progress::~Progress() { finish(); }

void Progress::tick(std::size_t n, const std::string& note) {
  done_ += n;
  if (!note.empty()) note_ = note;
  auto now = std::chrono::steady_clock::now();
  if (tty_) {
    if (now - last_draw_ > std::chrono::milliseconds(100) || done_ == total_) draw(false);
  } else if (total_ > 0) {
    int decile = static_cast<int>(10 * done_ / total_);
    if (decile != last_decile_) {
      last_decile_ = decile;
      draw(false);
    }
  }
}

void Progress::draw(bool final) {
  last_draw_ = std::chrono::steady_clock::now();
  double elapsed = std::chrono::duration<double>(last_draw_ - start_).count();
  double rate = elapsed > 0 ? done_ / elapsed : 0;
  double eta = rate > 0 && total_ > done_ ? (total_ - done_) / rate : 0;
  double frac = total_ ? static_cast<double>(done_) / total_ : 1.0;
  if (tty_) {
    constexpr int width = 30;
    int filled = static_cast<int>(frac * width);
    std::string bar = std::string(filled, '#') + std::string(width - filled, '.');
    std::fprintf(stderr, "\r\033[K%s [%s] %zu/%zu %.1f/s ETA %.0fs %s%s", label_.c_str(), bar.c_str(), done_,
                 total_, rate, eta, note_.c_str(), final ? "\n" : "");
    std::fflush(stderr);
  } else {
    spdlog::info("{}: {}/{} ({:.0f}%) {:.1f}/s, ETA {:.0f}s {}", label_, done_, total_, 100 * frac, rate, eta, note_);
  }
}

void Progress::finish() {
  if (finished_) return;
  finished_ = true;
  if (tty_) draw(true);
}

}  // namespace opforge
