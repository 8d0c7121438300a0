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
#include <chrono>
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

namespace detail {
/// Tells the core that this is a spin-wait loop (x86 `pause`, AArch64 `yield`): less power, and the sibling
/// hyper-thread gets the pipeline meanwhile.
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}
}  // namespace detail

/// A fixed pool of `threads - 1` worker threads plus the calling thread, which takes part in every call. Tasks are
/// handed out one index at a time (an atomic counter), so sequences of different lengths balance. One call at a
/// time: a second caller waits for the first to finish. Destruction joins the workers. A task that throws
/// terminates the program (std::thread's rule): the manager's tasks never throw (see the top of this header).
///
/// Waiting: a worker that has finished a call, and a caller whose own tasks are done, spin for up to `spin`
/// (checking the pool's atomics, with the core's pause hint) before they sleep on a condition variable. An engine
/// step makes several calls a few microseconds apart (advance_to, observe_batch's check and observation,
/// select_global's two passes), and waking a sleeping thread costs tens of microseconds on a virtual machine
/// (`manager/dispatch` in bench/manager_bench.cpp: ~40 us per call on the 2-core VM with no spin): the spin
/// keeps the workers awake within a step, and they sleep in the gap between steps (the GPU's milliseconds), having
/// burnt at most `spin` of a core each. spin = 0 sleeps at once (every call pays the wake-up); a longer spin
/// suits pools that are called back to back. Neither changes what the tasks compute.
class thread_pool {
 public:
  static constexpr std::chrono::microseconds default_spin{100};

  /// config_error for 0 threads or a negative spin. May throw std::system_error when a thread cannot start (none
  /// is left running).
  explicit thread_pool(std::size_t threads, std::chrono::microseconds spin = default_spin) : spin_(spin) {
    if (threads == 0) detail::raise_config("thread_pool threads = 0 (at least 1: the caller)");
    if (spin.count() < 0) detail::raise_config("thread_pool spin < 0 (microseconds a waiting thread spins)");
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
  /// How long a waiting thread spins before it sleeps.
  [[nodiscard]] std::chrono::microseconds spin() const noexcept { return spin_; }

  void operator()(std::size_t n, const std::function<void(std::size_t)>& task) {
    if (n == 0) return;
    std::unique_lock call(call_mutex_);  // one call at a time
    {
      // Under the mutex, so that a worker about to sleep sees either the new round or the notification.
      std::lock_guard lock(mutex_);
      task_ = &task;
      tasks_ = n;
      next_.store(0, std::memory_order_relaxed);
      busy_.store(workers_.size(), std::memory_order_relaxed);
      round_.fetch_add(1, std::memory_order_release);  // publishes task_ and tasks_ to spinning workers
    }
    wake_.notify_all();
    run_tasks(task, n);
    const auto all_done = [this] { return busy_.load(std::memory_order_acquire) == 0; };
    if (!spin_until(all_done)) {
      std::unique_lock lock(mutex_);
      done_.wait(lock, all_done);
    }
    task_ = nullptr;
  }

 private:
  void run_tasks(const std::function<void(std::size_t)>& task, std::size_t n) {
    for (std::size_t i = next_.fetch_add(1, std::memory_order_relaxed); i < n;
         i = next_.fetch_add(1, std::memory_order_relaxed))
      task(i);
  }
  /// Spins until ready() or `spin_` has passed; returns ready()'s last answer.
  template <class Ready>
  bool spin_until(Ready&& ready) const {
    if (ready()) return true;
    if (spin_.count() == 0) return false;
    const auto until = std::chrono::steady_clock::now() + spin_;
    for (unsigned k = 1;; ++k) {
      detail::cpu_relax();
      if (ready()) return true;
      // The clock every 64 pauses (a few hundred nanoseconds); a yield too, for pools larger than the cores.
      if (k % 64 == 0) {
        if (std::chrono::steady_clock::now() >= until) return ready();
        std::this_thread::yield();
      }
    }
  }
  void work() {
    std::uint64_t seen = 0;
    const auto ready = [&] {
      return stopping_.load(std::memory_order_acquire) || round_.load(std::memory_order_acquire) != seen;
    };
    for (;;) {
      if (!spin_until(ready)) {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, ready);
      }
      if (stopping_.load(std::memory_order_acquire)) return;
      seen = round_.load(std::memory_order_acquire);
      run_tasks(*task_, tasks_);
      // The last worker out wakes the caller; under the mutex, so that the caller is either asleep or has not
      // yet checked busy_.
      if (busy_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard lock(mutex_);
        done_.notify_one();
      }
    }
  }
  void stop() noexcept {
    {
      std::lock_guard lock(mutex_);
      stopping_.store(true, std::memory_order_release);
    }
    wake_.notify_all();
    for (auto& w : workers_)
      if (w.joinable()) w.join();
    workers_.clear();
  }

  std::chrono::microseconds spin_;
  std::vector<std::thread> workers_;
  std::mutex call_mutex_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  // Written by the caller before the release increment of round_, read by the workers after they see it.
  const std::function<void(std::size_t)>* task_ = nullptr;
  std::size_t tasks_ = 0;
  std::atomic<std::size_t> busy_{0};
  std::atomic<std::uint64_t> round_{0};
  std::atomic<bool> stopping_{false};
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
