// SPDX-License-Identifier: Apache-2.0
// memdecay: how the manager runs independent per-sequence work on the engine's threads.
//
// An executor is anything callable as exec(n, task) that calls task(i) exactly once for every i in [0, n), on
// whatever threads it likes, and returns when every call has returned. The manager's tasks never throw into it
// (each task keeps its own exception, and the manager rethrows the one of the lowest task), so an executor needs
// no error handling, and the outcome, errors included, is the same for every executor and thread count.
//
// The library never starts a thread by itself: inline_executor (the default) runs the tasks in order on the
// caller's thread; thread_pool is a small fixed pool an engine may create, own and pass; or the engine adapts its
// own (a TBB arena, an OpenMP parallel for, folly's executor) in a few lines:
//
//   auto omp = [](std::size_t n, const std::function<void(std::size_t)>& task) {
//   #pragma omp parallel for schedule(dynamic)
//     for (std::size_t i = 0; i < n; ++i) task(i);
//   };
//   manager.observe_batch(batch, omp);
#ifndef MEMDECAY_CORE_EXECUTOR_HPP
#define MEMDECAY_CORE_EXECUTOR_HPP

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "memdecay/detail/error.hpp"

namespace memdecay {

/// Runs task(i) for every i in [0, n) and returns when all have returned (see the top of this header).
template <class E>
concept executor = requires(E& exec, std::size_t n, const std::function<void(std::size_t)>& task) { exec(n, task); };

/// The default executor: the tasks in order, on the caller's thread.
struct inline_executor {
  void operator()(std::size_t n, const std::function<void(std::size_t)>& task) const {
    for (std::size_t i = 0; i < n; ++i) task(i);
  }
};

/// A fixed pool of `threads - 1` worker threads plus the calling thread, which takes part in every call. Tasks are
/// handed out one index at a time (an atomic counter), so sequences of different lengths balance. One call at a
/// time: a second caller waits for the first to finish. Destruction joins the workers. A task that throws
/// terminates the program (std::thread's rule): the manager's tasks never throw (see the top of this header).
class thread_pool {
 public:
  /// config_error for 0 threads. May throw std::system_error when a thread cannot start (none is left running).
  explicit thread_pool(std::size_t threads) {
    if (threads == 0) detail::raise_config("thread_pool threads = 0 (at least 1: the caller)");
    workers_.reserve(threads - 1);
#if MEMDECAY_HAS_EXCEPTIONS
    try {
#endif
      for (std::size_t t = 1; t < threads; ++t) workers_.emplace_back([this] { work(); });
#if MEMDECAY_HAS_EXCEPTIONS
    } catch (...) {
      stop();
      throw;
    }
#endif
  }
  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;
  ~thread_pool() { stop(); }

  /// Threads that run tasks: the workers and the caller.
  [[nodiscard]] std::size_t size() const noexcept { return workers_.size() + 1; }

  void operator()(std::size_t n, const std::function<void(std::size_t)>& task) {
    if (n == 0) return;
    std::unique_lock call(call_mutex_);  // one call at a time
    {
      std::lock_guard lock(mutex_);
      task_ = &task;
      tasks_ = n;
      next_.store(0, std::memory_order_relaxed);
      busy_ = workers_.size();
      ++round_;
    }
    wake_.notify_all();
    run_tasks(task, n);
    std::unique_lock lock(mutex_);
    done_.wait(lock, [this] { return busy_ == 0; });
    task_ = nullptr;
  }

 private:
  void run_tasks(const std::function<void(std::size_t)>& task, std::size_t n) {
    for (std::size_t i = next_.fetch_add(1, std::memory_order_relaxed); i < n;
         i = next_.fetch_add(1, std::memory_order_relaxed))
      task(i);
  }
  void work() {
    std::uint64_t seen = 0;
    for (;;) {
      const std::function<void(std::size_t)>* task = nullptr;
      std::size_t n = 0;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return stopping_ || round_ != seen; });
        if (stopping_) return;
        seen = round_;
        task = task_;
        n = tasks_;
      }
      run_tasks(*task, n);
      {
        std::lock_guard lock(mutex_);
        --busy_;
      }
      done_.notify_one();
    }
  }
  void stop() noexcept {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (auto& w : workers_)
      if (w.joinable()) w.join();
    workers_.clear();
  }

  std::vector<std::thread> workers_;
  std::mutex call_mutex_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(std::size_t)>* task_ = nullptr;
  std::size_t tasks_ = 0;
  std::size_t busy_ = 0;
  std::uint64_t round_ = 0;
  bool stopping_ = false;
  std::atomic<std::size_t> next_{0};
};

namespace detail {

/// Runs task(i) for i in [0, n) on `exec`, each task's exception kept apart, then rethrows the one of the lowest
/// index: the same error whatever the executor and its scheduling. Without exceptions, just runs them.
template <class Exec, class Task>
void run_all(Exec& exec, std::size_t n, Task&& task) {
#if MEMDECAY_HAS_EXCEPTIONS
  std::vector<std::exception_ptr> errors(n);
  const std::function<void(std::size_t)> guarded = [&](std::size_t i) {
    try {
      task(i);
    } catch (...) {
      errors[i] = std::current_exception();
    }
  };
  exec(n, guarded);
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
#else
  const std::function<void(std::size_t)> plain = [&](std::size_t i) { task(i); };
  exec(n, plain);
#endif
}

}  // namespace detail
}  // namespace memdecay

#endif  // MEMDECAY_CORE_EXECUTOR_HPP
