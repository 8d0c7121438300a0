// One engine step for a batch of sequences through the manager, on T threads (core/executor.hpp):
//   manager/step/<S>x<T>/<threads>     advance_to(step, exec) + observe_batch (every sequence's attention, exp-free
//                                      MemDecay, uniform normalisation) + select_global(0, exec) under a global
//                                      budget 32 pages below the resident pages (the global choice evicts 32 pages
//                                      every step); no commit, so every iteration sees the same state. threads = 1 is the
//                                      inline executor, more a thread_pool of that size (the caller included).
//   manager/step_sleeping/<S>x<T>/<threads>  the same step on a pool whose threads sleep as soon as they wait
//                                      (spin 0): every parallel phase pays a thread's wake-up.
//   manager/roofline/<S>x<T>/<threads> the memory floor of the step on the same executor: per sequence, the
//                                      `fused/expfree_roofline` loop (the exp-free fused pass's loads and stores,
//                                      its per-token math reduced to adds; bench/expfree_roofline.hpp) over a
//                                      state of T tokens. Its speed-up over threads is what the memory system
//                                      allows the step's.
//   manager/dispatch/<threads>/<spin>  one thread_pool call of 64 empty tasks, its threads spinning up to <spin>
//                                      microseconds before they sleep (0: at once; 100: the default): the hand-out
//                                      and the wait that each of the step's five parallel phases pays.
//   manager/observe_one/<T>            one sequence's advance_to + observe_tokens: the per-sequence cost the
//                                      scaling model in docs/performance.md multiplies.
//   manager/scorer/<kernel>/<S>x<T>    the step above on one thread with every sequence on one kernel: `expfree`
//                                      (the default) or `polynomial` (chosen by the manager's scorer rule,
//                                      manager_config::scorer, with a threshold below the batch): the measurement
//                                      behind the rule's threshold (docs/performance.md).
// Items are resident tokens per step.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <memory>
#include <random>
#include <vector>

#include <memdecay/core/executor.hpp>
#include <memdecay/core/manager.hpp>
#include <memdecay/detail/column_vector.hpp>

#include "expfree_roofline.hpp"

namespace md = memdecay;

namespace {

struct batch_world {
  std::unique_ptr<md::manager> mgr;
  std::vector<std::vector<float>> masses;
  std::vector<md::manager::observation> batch;
  md::step_t step = 0;

  batch_world(std::size_t sequences, std::size_t tokens, std::uint64_t polynomial_above = 0) {
    const std::size_t pages = sequences * tokens / 16;
    mgr = std::make_unique<md::manager>(md::manager_config{.page_size = 16,
                                                           .global = md::global_budget::pages(pages - 32),
                                                           .scorer = {.polynomial_above_tokens = polynomial_above}});
    std::mt19937_64 rng(42);
    for (std::uint64_t id = 0; id < sequences; ++id) {
      auto& s = mgr->open(id, md::config{.page_size = 16, .normalization = md::attention_normalization::uniform});
      std::vector<md::region_id> labels(tokens);
      for (auto& l : labels) l = static_cast<md::region_id>(1 + rng() % 6);
      labels[0] = md::regions::system;
      s.append_tokens(labels);
      auto& m = masses.emplace_back(tokens);
      for (auto& x : m) x = static_cast<float>(rng() % 1000) / (500.0f * static_cast<float>(tokens));
    }
    for (std::uint64_t id = 0; id < sequences; ++id) batch.push_back({id, masses[id]});
  }
};

batch_world& world_of(std::size_t sequences, std::size_t tokens, std::uint64_t polynomial_above = 0) {
  static std::map<std::tuple<std::size_t, std::size_t, std::uint64_t>, std::unique_ptr<batch_world>> built;
  auto& w = built[{sequences, tokens, polynomial_above}];
  if (!w) w = std::make_unique<batch_world>(sequences, tokens, polynomial_above);
  return *w;
}

template <class Exec>
void step_loop(benchmark::State& st, batch_world& w, Exec& exec, std::size_t tokens) {
  for (auto _ : st) {
    w.mgr->advance_to(++w.step, exec);
    benchmark::DoNotOptimize(w.mgr->observe_batch(w.batch, exec).data());
    const auto plan = w.mgr->select_global(0, exec);
    benchmark::DoNotOptimize(plan.victims.data());
  }
  st.SetItemsProcessed(st.iterations() * static_cast<std::int64_t>(tokens));
}

// Calls run(exec) with the executor of a row's thread count: the inline executor for 1, else a thread_pool of that
// size (the caller included) whose waiting threads spin for `spin`.
template <class Run>
void with_executor(std::size_t threads, std::chrono::microseconds spin, Run&& run) {
  if (threads == 1) {
    md::inline_executor exec;
    run(exec);
  } else {
    md::thread_pool pool(threads, spin);
    run(pool);
  }
}

void step(benchmark::State& st, std::size_t sequences, std::size_t tokens,
          std::chrono::microseconds spin = md::thread_pool::default_spin) {
  auto& w = world_of(sequences, tokens);
  with_executor(static_cast<std::size_t>(st.range(0)), spin,
                [&](auto& exec) { step_loop(st, w, exec, sequences * tokens); });
}

// The exp-free fused pass's memory floor (expfree_roofline.hpp, the `fused/expfree_roofline` row's loop) over one
// state per sequence, so that the batch's footprint is the step's: the manager's masses and observation (uniform
// normalisation: scale = tokens, tau 1, beta 0.9), the columns laid out as a sequence's (detail/column_vector.hpp:
// labels and page scores slot 0, clocks 1, weights 2, EWMA 3; the mass a plain vector, as the engine's).
struct roofline_world {
  struct arrays {
    md::detail::column_vector<md::region_id> region;
    md::detail::column_vector<md::step_t, 1> clock;
    md::detail::column_vector<float, 2> w;
    md::detail::column_vector<float, 3> ewma;
    md::detail::column_vector<float> out;
    std::vector<float> mass;
  };
  md::region_table table = md::default_region_table();
  md::simd::region_lut<float> lut{table};
  std::vector<arrays> seqs;
  std::vector<std::size_t> refreshed;
  md::step_t step = 0;

  roofline_world(std::size_t sequences, std::size_t tokens) : refreshed(sequences) {
    std::mt19937_64 rng(42);
    for (std::size_t s = 0; s < sequences; ++s) {
      auto& a = seqs.emplace_back();
      a.region.resize(tokens);
      a.w.resize(tokens);
      a.ewma.resize(tokens);
      a.mass.resize(tokens);
      a.clock.resize(tokens);
      a.out.resize(tokens / 16);
      for (std::size_t i = 0; i < tokens; ++i) {
        a.region[i] = static_cast<md::region_id>(1 + rng() % 6);
        a.w[i] = static_cast<float>(rng() % 1000) / 1000.0f;
        a.mass[i] = static_cast<float>(rng() % 1000) / (500.0f * static_cast<float>(tokens));
      }
    }
  }

  void pass(std::size_t s) {
    auto& a = seqs[s];
    const md::observation_params<float> obs{0.9f, 1.0f, static_cast<float>(a.mass.size())};
    refreshed[s] =
        bench_rooflines::fused_expfree_roofline<16>(a.region.data(), a.clock.data(), a.w.data(), a.ewma.data(),
                                                    a.mass.data(), a.mass.size(), lut, obs, step, a.out.data());
  }
};

void roofline(benchmark::State& st, std::size_t sequences, std::size_t tokens) {
  static std::map<std::pair<std::size_t, std::size_t>, std::unique_ptr<roofline_world>> built;
  auto& w = built[{sequences, tokens}];
  if (!w) w = std::make_unique<roofline_world>(sequences, tokens);
  with_executor(static_cast<std::size_t>(st.range(0)), md::thread_pool::default_spin, [&](auto& exec) {
    for (auto _ : st) {
      ++w->step;
      exec(sequences, [&](std::size_t s) { w->pass(s); });
      benchmark::DoNotOptimize(w->refreshed.data());
      benchmark::ClobberMemory();
    }
  });
  st.SetItemsProcessed(st.iterations() * static_cast<std::int64_t>(sequences * tokens));
}

// One thread, every sequence on the exp-free kernel (the rule off) or on the polynomial one (the rule on, its
// threshold one token: the first advance_to switches them).
void scorer_step(benchmark::State& st, bool polynomial, std::size_t sequences, std::size_t tokens) {
  auto& w = world_of(sequences, tokens, polynomial ? 1 : 0);
  md::inline_executor exec;
  step_loop(st, w, exec, sequences * tokens);
  if (w.mgr->at(0).expfree_scores() == polynomial) st.SkipWithError("the sequences are not on the kernel asked for");
}

// One executor call of 64 tasks that do nothing: what each of the step's parallel phases pays to hand out work
// and wait for it (the step makes five such calls).
void dispatch(benchmark::State& st) {
  const auto threads = static_cast<std::size_t>(st.range(0));
  md::thread_pool pool(threads, std::chrono::microseconds{st.range(1)});
  const std::function<void(std::size_t)> nothing = [](std::size_t i) { benchmark::DoNotOptimize(i); };
  for (auto _ : st) pool(64, nothing);
}

void observe_one(benchmark::State& st) {
  const auto tokens = static_cast<std::size_t>(st.range(0));
  auto& w = world_of(1, tokens);
  auto& seq = w.mgr->at(0);
  for (auto _ : st) {
    w.mgr->advance_to(++w.step);
    benchmark::DoNotOptimize(seq.observe_tokens(w.masses[0]));
  }
  st.SetItemsProcessed(st.iterations() * static_cast<std::int64_t>(tokens));
}

const int registered = [] {
  for (auto [s, t] : {std::pair<std::size_t, std::size_t>{64, 16384}, {256, 4096}}) {
    const std::string name = "manager/step/" + std::to_string(s) + "x" + std::to_string(t);
    benchmark::RegisterBenchmark(name.c_str(), [s = s, t = t](benchmark::State& st) { step(st, s, t); })
        ->Arg(1)
        ->Arg(2)
        ->Arg(4)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
    const std::string sleeping = "manager/step_sleeping/" + std::to_string(s) + "x" + std::to_string(t);
    benchmark::RegisterBenchmark(sleeping.c_str(),
                                 [s = s, t = t](benchmark::State& st) { step(st, s, t, std::chrono::microseconds{0}); })
        ->Arg(2)
        ->Arg(4)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
    const std::string floor = "manager/roofline/" + std::to_string(s) + "x" + std::to_string(t);
    benchmark::RegisterBenchmark(floor.c_str(), [s = s, t = t](benchmark::State& st) { roofline(st, s, t); })
        ->Arg(1)
        ->Arg(2)
        ->Arg(4)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
  }
  for (bool polynomial : {false, true})
    for (auto [s, t] : {std::pair<std::size_t, std::size_t>{64, 2048}, {64, 16384}, {64, 131072}}) {
      const std::string name = std::string("manager/scorer/") + (polynomial ? "polynomial/" : "expfree/") +
                               std::to_string(s) + "x" + std::to_string(t);
      benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) { scorer_step(st, polynomial, s, t); })
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
    }
  benchmark::RegisterBenchmark("manager/dispatch", dispatch)
      ->ArgsProduct({{1, 2, 4}, {0, md::thread_pool::default_spin.count()}})
      ->UseRealTime();
  benchmark::RegisterBenchmark("manager/observe_one", observe_one)->Arg(4096)->Arg(16384)->Unit(benchmark::kMicrosecond);
  return 0;
}();

}  // namespace
