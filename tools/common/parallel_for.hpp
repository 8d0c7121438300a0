// SPDX-License-Identifier: Apache-2.0
// The tools' one parallel loop: items in index order on a fixed number of threads, the first failure (by index)
// rethrown after every thread has stopped, so a run's outcome never depends on the thread count.
#ifndef MEMDECAY_TOOLS_COMMON_PARALLEL_FOR_HPP
#define MEMDECAY_TOOLS_COMMON_PARALLEL_FOR_HPP

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace memdecay_tools {

/// Runs fn(0..count-1) on `threads` threads (items are taken in order; the first exception, by item index, is
/// rethrown after every thread has stopped).
inline void parallel_for(std::size_t count, std::size_t threads, const std::function<void(std::size_t)>& fn) {
  threads = std::max<std::size_t>(1, std::min(threads, count));
  if (threads == 1) {
    for (std::size_t i = 0; i < count; ++i) fn(i);
    return;
  }
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex m;
  std::size_t failed_at = count;
  std::exception_ptr error;
  auto worker = [&] {
    for (;;) {
      const std::size_t i = next.fetch_add(1);
      if (i >= count || failed.load()) return;
      try {
        fn(i);
      } catch (...) {
        std::lock_guard lock(m);
        if (i < failed_at) {
          failed_at = i;
          error = std::current_exception();
        }
        failed.store(true);
      }
    }
  };
  std::vector<std::thread> pool;
  for (std::size_t t = 0; t < threads; ++t) pool.emplace_back(worker);
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace memdecay_tools

#endif  // MEMDECAY_TOOLS_COMMON_PARALLEL_FOR_HPP
