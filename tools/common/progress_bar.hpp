// SPDX-License-Identifier: Apache-2.0
// The command-line tools' progress bar (memdecay-replay, memdecay-eval): one line on stderr, redrawn in place.
// Drawn only when enabled (the tools enable it when stderr is a terminal, or with --progress) and once the run has
// lasted a second, so short runs and logs stay clean; at most every 0.1 s, and always for the last unit.
#ifndef MEMDECAY_TOOLS_PROGRESS_BAR_HPP
#define MEMDECAY_TOOLS_PROGRESS_BAR_HPP

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <string>
#include <utility>

namespace memdecay_tools {

class progress_bar {
 public:
  /// `unit` names what is counted ("episode runs"); `total` may be given here (for tick()) or to update().
  progress_bar(std::string unit, bool enabled, std::size_t total = 0)
      : unit_(std::move(unit)), total_(total), enabled_(enabled), start_(clock::now()) {}
  progress_bar(const progress_bar&) = delete;
  progress_bar& operator=(const progress_bar&) = delete;
  ~progress_bar() {
    if (drawn_) std::fprintf(stderr, "\n");
  }

  /// One more unit done (of the total given to the constructor).
  void tick() { update(done_ + 1, total_); }

  /// `done` of `total` units are done.
  void update(std::size_t done, std::size_t total) {
    done_ = done;
    total_ = total;
    if (!enabled_ || total == 0) return;
    const auto now = clock::now();
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    if (elapsed < 1.0 || (done != total && std::chrono::duration<double>(now - last_).count() < 0.1)) return;
    last_ = now;
    drawn_ = true;
    const double fraction = static_cast<double>(done) / static_cast<double>(total);
    const int filled = static_cast<int>(static_cast<double>(width) * fraction);
    const double left = done > 0 ? elapsed * static_cast<double>(total - done) / static_cast<double>(done) : 0.0;
    std::fprintf(stderr, "\r[%s%s] %3d%%  %zu/%zu %s  %.0f s, ~%.0f s left ", std::string(filled, '#').c_str(),
                 std::string(width - filled, '.').c_str(), static_cast<int>(100.0 * fraction), done, total,
                 unit_.c_str(), elapsed, left);
    std::fflush(stderr);
  }

 private:
  using clock = std::chrono::steady_clock;
  static constexpr int width = 40;
  std::string unit_;
  std::size_t total_, done_ = 0;
  bool enabled_, drawn_ = false;
  clock::time_point start_, last_{};
};

}  // namespace memdecay_tools

#endif  // MEMDECAY_TOOLS_PROGRESS_BAR_HPP
