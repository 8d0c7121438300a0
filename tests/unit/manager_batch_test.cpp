// SPDX-License-Identifier: Apache-2.0
// basic_manager's batch step on an executor (core/executor.hpp): advance_to(step, exec), observe_batch and
// select_global(pages_to_free, exec) give the same states, plans and errors for every executor and thread count,
// and the same as the one-sequence-at-a-time calls; a bad observation anywhere in a batch changes nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <tuple>
#include <string>
#include <functional>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include <memdecay/core/attention_rows.hpp>
#include <memdecay/core/executor.hpp>
#include <memdecay/core/manager.hpp>
#include <memdecay/io/manager_snapshot.hpp>

namespace md = memdecay;

namespace {

struct episode {
  md::manager mgr{{.page_size = 16, .global = md::global_budget::pages(300, 260)}};
  std::vector<std::vector<float>> masses;
  std::vector<md::manager::observation> batch;
  std::vector<std::size_t> order;  // batch entry k observes masses[order[k]]

  explicit episode(std::uint64_t seed, std::size_t sequences = 24) {
    std::mt19937_64 rng(seed);
    for (std::uint64_t id = 0; id < sequences; ++id) {
      md::config cfg{.page_size = 16, .normalization = md::attention_normalization::uniform};
      cfg.budget = md::budget_config::tokens(200 + 16 * (rng() % 20));
      auto& s = mgr.open(id * 7 + 3, cfg);  // ids with gaps, not in batch order
      s.append(md::regions::system, 16);
      for (int k = 0; k < 20; ++k) s.append(static_cast<md::region_id>(1 + rng() % 6), 1 + rng() % 40);
    }
    if (sequences > 2) mgr.fork(3, 1000);  // shared pages in the global budget
    masses.resize(mgr.size());
  }
  // One step's observations, each sequence's mass drawn from the step's seed.
  void draw(std::uint64_t step) {
    std::mt19937_64 rng(step);
    batch.clear();
    const auto ids = mgr.ids();
    order.assign(ids.size(), 0);
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::shuffle(order.begin(), order.end(), rng);  // batch order differs from id order
    for (std::size_t j : order) {
      auto& m = masses[j];
      m.assign(mgr.at(ids[j]).kv_len(), 0.0f);
      for (auto& x : m) x = static_cast<float>(rng() % 1000) / (1000.0f * static_cast<float>(m.size()));
      batch.push_back({ids[j], m});
    }
  }
};

// Runs `steps` engine steps (advance, observe, global selection, commit) with `exec`; returns every plan's digest.
template <class Exec>
std::vector<std::uint64_t> run(episode& ep, int steps, Exec& exec) {
  std::vector<std::uint64_t> digests;
  for (int step = 1; step <= steps; ++step) {
    ep.mgr.advance_to(static_cast<md::step_t>(step), exec);
    ep.draw(static_cast<std::uint64_t>(step));
    (void)ep.mgr.observe_batch(ep.batch, exec);
    const auto plan = ep.mgr.select_global(static_cast<std::size_t>(step % 3), exec);
    digests.push_back(plan.digest());
    digests.push_back(ep.mgr.digest());
    ep.mgr.commit(plan);
  }
  return digests;
}

}  // namespace

TEST(ManagerBatch, SameResultForEveryThreadCount) {
  md::inline_executor one;
  episode ref(11);
  const auto expected = run(ref, 12, one);
  for (std::size_t threads : {1u, 2u, 3u, 8u}) {
    SCOPED_TRACE(testing::Message() << threads << " threads");
    md::thread_pool pool(threads);
    episode ep(11);
    EXPECT_EQ(run(ep, 12, pool), expected);
  }
}

TEST(ManagerBatch, EqualsTheOneSequenceAtATimeCalls) {
  md::inline_executor one;
  episode batched(5), plain(5);
  for (int step = 1; step <= 8; ++step) {
    batched.mgr.advance_to(static_cast<md::step_t>(step), one);
    plain.mgr.advance_to(static_cast<md::step_t>(step));
    batched.draw(static_cast<std::uint64_t>(step));
    plain.draw(static_cast<std::uint64_t>(step));
    const auto refreshed = batched.mgr.observe_batch(batched.batch);
    for (std::size_t k = 0; k < plain.batch.size(); ++k)
      EXPECT_EQ(plain.mgr.at(plain.batch[k].id).observe_tokens(plain.batch[k].mass), refreshed[k]);
    ASSERT_EQ(batched.mgr.digest(), plain.mgr.digest());
    const auto a = batched.mgr.select_global(4, one);
    const auto b = plain.mgr.select_global(4);
    ASSERT_EQ(a.digest(), b.digest());
    ASSERT_GT(a.victims.size(), 0u) << "the global budget should be evicting";
    batched.mgr.commit(a);
    plain.mgr.commit(b);
  }
}

TEST(ManagerBatch, ABadObservationAnywhereChangesNothingAndNamesTheFirst) {
  md::thread_pool pool(3);
  episode ep(9);
  ep.mgr.advance_to(1, pool);
  ep.draw(1);
  const auto digest = ep.mgr.digest();
  ep.masses[ep.order[4]][2] = std::numeric_limits<float>::quiet_NaN();  // batch entries 4 and 9 are bad
  ep.masses[ep.order[9]][0] = -1.0f;
  const std::string first = "sequence " + std::to_string(ep.batch[4].id) + ":";
  for (int attempt = 0; attempt < 20; ++attempt) {  // whatever the scheduling, the same error
    try {
      (void)ep.mgr.observe_batch(ep.batch, pool);
      FAIL() << "a NaN mass was accepted";
    } catch (const md::input_error& e) {
      EXPECT_NE(std::string(e.what()).find(first), std::string::npos) << e.what();
    }
    ASSERT_EQ(ep.mgr.digest(), digest);
  }
  auto twice = ep.batch;
  twice.push_back(twice.front());
  EXPECT_THROW((void)ep.mgr.observe_batch(twice, pool), md::usage_error);
  auto unknown = ep.batch;
  unknown[0].id = 999999;
  EXPECT_THROW((void)ep.mgr.observe_batch(unknown, pool), md::usage_error);
  ASSERT_EQ(ep.mgr.digest(), digest);
}

// The batch of attention rows (rows_observation): fp16 and bf16 rows, one or several per sequence, with a leading
// dimension, give what observe_rows one sequence at a time gives, on any thread count; a bad element anywhere
// changes nothing and the error names the sequence, then the row and token.
TEST(ManagerBatch, RowsGiveWhatObserveRowsGivesAndABadOneChangesNothing) {
  for (std::size_t threads : {1u, 3u}) {
    SCOPED_TRACE(testing::Message() << threads << " threads");
    md::thread_pool pool(threads);
    episode batched(21), plain(21);
    batched.mgr.advance_to(1, pool);
    plain.mgr.advance_to(1);
    const auto ids = batched.mgr.ids();
    std::vector<std::vector<std::uint16_t>> buffers(ids.size());
    std::vector<md::manager::rows_observation> batch;
    std::mt19937_64 rng(threads);
    for (std::size_t j = 0; j < ids.size(); ++j) {
      const std::size_t n = batched.mgr.at(ids[j]).kv_len(), rows = 1 + j % 3, stride = n + j % 4;
      const auto format = j % 2 ? md::half_format::bf16 : md::half_format::f16;
      auto& b = buffers[j];
      b.resize(rows * stride);
      for (auto& x : b) x = md::simd::float_to_half(static_cast<float>(rng() % 1000) / (1000.0f * n), format);
      batch.push_back({ids[j], md::attention_rows(std::span<const std::uint16_t>(b), format, rows, n, stride,
                                                  j % 5 == 0 ? md::head_reduction::mean : md::head_reduction::sum)});
    }
    const auto refreshed = batched.mgr.observe_batch(std::span<const md::manager::rows_observation>(batch), pool);
    for (std::size_t j = 0; j < batch.size(); ++j)
      EXPECT_EQ(plain.mgr.at(batch[j].id).observe_rows(batch[j].rows), refreshed[j]);
    ASSERT_EQ(batched.mgr.digest(), plain.mgr.digest());

    batched.mgr.advance_to(2, pool);
    const auto digest = batched.mgr.digest();
    buffers[7][1] = 0xfe00;  // sequence 7 (bf16): a negative in its first row (in f16 bits it would be a NaN)
    buffers[12][2] = 0x8001;  // a negative in a later entry
    try {
      (void)batched.mgr.observe_batch(std::span<const md::manager::rows_observation>(batch), pool);
      FAIL() << "a NaN row was accepted";
    } catch (const md::input_error& e) {
      const std::string why = e.what();
      EXPECT_NE(why.find("sequence " + std::to_string(ids[7]) + ": attention rows"), std::string::npos) << why;
      EXPECT_NE(why.find("row 0, token 1"), std::string::npos) << why;
    }
    ASSERT_EQ(batched.mgr.digest(), digest);
  }
}

TEST(ThreadPool, RunsEveryTaskOnceAndTakesPartItself) {
  EXPECT_THROW(md::thread_pool(0), md::config_error);
  md::thread_pool pool(4);
  EXPECT_EQ(pool.size(), 4u);
  for (std::size_t n : {0u, 1u, 3u, 1000u}) {
    std::vector<std::atomic<int>> hits(n);
    pool(n, [&](std::size_t i) { hits[i].fetch_add(1); });
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << i;
  }
  static_assert(md::executor<md::thread_pool> && md::executor<md::inline_executor>);
}

TEST(ThreadPool, SpinIsAConfigAndChangesNothingTheTasksSee) {
  EXPECT_EQ(md::thread_pool(2).spin(), md::thread_pool::default_spin);
  EXPECT_EQ(md::thread_pool(2, std::chrono::microseconds{0}).spin().count(), 0);
  try {
    md::thread_pool bad(2, std::chrono::microseconds{-1});
    FAIL() << "a negative spin was accepted";
  } catch (const md::config_error& e) {
    EXPECT_NE(std::string(e.what()).find("spin"), std::string::npos) << e.what();
  }
  // Calls back to back (the workers still spinning) with every task count from 0 to 70, for a pool that sleeps at
  // once, one that spins for a microsecond (mostly asleep between calls) and the default.
  for (const auto spin : {std::chrono::microseconds{0}, std::chrono::microseconds{1}, md::thread_pool::default_spin}) {
    md::thread_pool pool(3, spin);
    for (int round = 0; round < 3; ++round)
      for (std::size_t n = 0; n <= 70; ++n) {
        std::vector<std::atomic<int>> hits(n);
        pool(n, [&](std::size_t i) { hits[i].fetch_add(1); });
        for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "spin " << spin.count() << ", n " << n;
      }
  }
}

// Two tasks that each wait for the other to start can only finish if a worker takes one while the caller runs the
// other: the worker must wake for the call, whether it was still spinning (no pause) or had gone to sleep (a pause
// longer than the spin).
TEST(ThreadPool, WorkersTakePartInACallWhetherSpinningOrAsleep) {
  for (const auto spin : {std::chrono::microseconds{0}, md::thread_pool::default_spin}) {
    md::thread_pool pool(2, spin);
    for (const auto pause : {std::chrono::microseconds{0}, std::chrono::microseconds{5000}}) {
      for (int round = 0; round < 20; ++round) {
        std::this_thread::sleep_for(pause);
        std::atomic<int> started{0};
        std::atomic<bool> timed_out{false};
        pool(2, [&](std::size_t) {
          started.fetch_add(1);
          const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
          while (started.load() < 2)
            if (std::chrono::steady_clock::now() > give_up) {
              timed_out = true;
              return;
            }
        });
        ASSERT_FALSE(timed_out.load()) << "no worker took the second task: spin " << spin.count() << " us, pause "
                                       << pause.count() << " us";
      }
    }
  }
}

TEST(RunAll, RethrowsTheLowestTasksErrorAfterEveryTaskRan) {
  md::thread_pool pool(3);
  std::vector<std::atomic<int>> ran(64);
  try {
    md::detail::run_all(pool, 64, [&](std::size_t i) {
      ran[i] = 1;
      if (i == 40 || i == 17) throw std::runtime_error("task " + std::to_string(i));
    });
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "task 17");
  }
  for (auto& r : ran) EXPECT_EQ(r.load(), 1);
}

// --- the scorer rule (manager_config::scorer) -------------------------------------------------------------------

namespace {

md::manager_config scorer_rule_config(std::uint64_t above, double back_below) {
  return {.page_size = 16, .scorer = {.polynomial_above_tokens = above, .back_below = back_below}};
}
md::config uniform_config() { return {.page_size = 16, .normalization = md::attention_normalization::uniform}; }
std::vector<bool> kernels(const md::manager& mgr) {
  std::vector<bool> out;
  for (std::uint64_t id : mgr.ids()) out.push_back(mgr.at(id).expfree_scores());
  return out;
}

}  // namespace

// Above the threshold every MemDecay sequence scores with the polynomial kernel, back below back_below of it with
// the exp-free one; in the gap the batch keeps its kernel, and a sequence opened then follows the others.
TEST(ManagerScorerRule, SwitchesEverySequenceAtTheThresholdAndBackBelowTheGap) {
  md::manager mgr(scorer_rule_config(1000, 0.5));
  mgr.open(1, uniform_config()).append(md::regions::user, 400);
  mgr.open(2, uniform_config()).append(md::regions::tool_out, 400);
  mgr.advance_to(1);
  EXPECT_EQ(kernels(mgr), (std::vector<bool>{true, true}));  // 800 tokens
  mgr.at(1).append(md::regions::user, 300);
  mgr.advance_to(2);
  EXPECT_EQ(kernels(mgr), (std::vector<bool>{false, false}));  // 1,100 > 1,000
  mgr.open(3, uniform_config()).append(md::regions::scratchpad, 100);
  EXPECT_FALSE(mgr.at(3).expfree_scores()) << "a sequence opened meanwhile follows the batch";
  mgr.close(1);  // 500 tokens: not below 500
  mgr.advance_to(3);
  EXPECT_EQ(kernels(mgr), (std::vector<bool>{false, false}));
  mgr.close(3);  // 400 < 500
  md::thread_pool pool(2);
  mgr.advance_to(4, pool);
  EXPECT_EQ(kernels(mgr), (std::vector<bool>{true}));
  mgr.open(4, uniform_config()).append(md::regions::user, 16);
  EXPECT_TRUE(mgr.at(4).expfree_scores());
  // Rule off (the default): the manager never touches a sequence's own choice.
  md::manager plain({.page_size = 16});
  plain.open(1, uniform_config()).append(md::regions::user, 5000);
  plain.at(1).use_expfree_scores(false);
  plain.open(2, uniform_config()).append(md::regions::user, 16);
  plain.advance_to(1);
  EXPECT_EQ(kernels(plain), (std::vector<bool>{false, true}));
}

TEST(ManagerScorerRule, RejectsAGapOutsideZeroToOneAndEntersTheDigest) {
  for (double bad : {0.0, -0.5, 1.5, std::numeric_limits<double>::quiet_NaN()}) {
    try {
      md::manager mgr(scorer_rule_config(1000, bad));
      ADD_FAILURE() << bad << " accepted";
    } catch (const md::config_error& e) {
      EXPECT_NE(std::string(e.what()).find("scorer.back_below"), std::string::npos) << e.what();
    }
  }
  md::manager a(scorer_rule_config(1000, 0.5)), b({.page_size = 16});
  EXPECT_NE(a.digest(), b.digest());
  a.open(1, uniform_config()).append(md::regions::user, 2000);
  const auto before = a.digest();
  a.advance_to(0);  // the same step: the rule switches the kernel, which the digest sees
  EXPECT_FALSE(a.at(1).expfree_scores());
  EXPECT_NE(a.digest(), before);
}

// The rule reads only token counts: the same kernels and victims for every thread count, and a manager restored
// from a snapshot (which saves each sequence's kernel) is the saved one, on the saved kernel.
TEST(ManagerScorerRule, SameVictimsForEveryThreadCountAndAcrossASnapshot) {
  const md::manager_config cfg{.page_size = 16,
                               .global = md::global_budget::pages(150, 140),
                               .scorer = {.polynomial_above_tokens = 1500, .back_below = 0.75}};
  md::manager restored(cfg);
  std::uint64_t digest_at_copy = 0;
  auto run = [&](std::size_t threads, bool copy) {
    md::manager mgr(cfg);
    std::mt19937_64 rng(7);
    md::thread_pool pool(threads);
    std::vector<std::uint64_t> digests;
    std::vector<bool> polynomial;
    for (md::step_t step = 1; step <= 8; ++step) {
      for (std::uint64_t id = 0; id < 6; ++id) {
        if (!mgr.contains(id)) mgr.open(id, uniform_config()).append(md::regions::system, 16);
        mgr.at(id).append(static_cast<md::region_id>(1 + rng() % 6), 20 + rng() % 60);
      }
      mgr.advance_to(step, pool);
      polynomial.push_back(!mgr.at(0).expfree_scores());
      std::vector<std::vector<float>> masses;
      for (std::uint64_t id : mgr.ids()) {
        std::vector<float> m(mgr.at(id).device_len());
        for (auto& x : m) x = static_cast<float>(rng() % 1000) / 1000.0f / static_cast<float>(m.size());
        masses.push_back(std::move(m));
      }
      std::vector<md::manager::observation> batch;
      std::size_t k = 0;
      for (std::uint64_t id : mgr.ids()) batch.push_back({id, masses[k++]});
      mgr.observe_batch(std::span<const md::manager::observation>(batch), pool);
      const auto plan = mgr.select_global(0, pool);
      digests.push_back(plan.digest());
      mgr.commit(plan);
      if (copy && step == 6) {
        md::snapshot::load(restored, md::snapshot::save(mgr), uniform_config());
        digest_at_copy = mgr.digest();
      }
    }
    return std::make_tuple(digests, polynomial, mgr.digest());
  };
  const auto one = run(1, true);
  EXPECT_EQ(run(2, false), one);
  EXPECT_EQ(run(3, false), one);
  const auto& polynomial = std::get<1>(one);
  EXPECT_FALSE(polynomial.front()) << "the first step's batch is small";
  EXPECT_TRUE(polynomial.back()) << "the global budget keeps the batch above 1,500 tokens at the end";
  EXPECT_EQ(restored.digest(), digest_at_copy);
  for (std::uint64_t id : restored.ids()) EXPECT_FALSE(restored.at(id).expfree_scores()) << id;
}

// The switch back to the exp-free kernel allocates each sequence's weights: a failure part-way (here the engine's
// executor giving up after the first sequence) switches the ones already switched back, and advance_to changes
// nothing, the clocks included.
TEST(ManagerScorerRule, ASwitchThatFailsPartWayChangesNothing) {
  md::manager mgr(scorer_rule_config(1000, 0.5));
  for (std::uint64_t id = 1; id <= 3; ++id) mgr.open(id, uniform_config()).append(md::regions::user, 400);
  mgr.advance_to(1);
  ASSERT_EQ(kernels(mgr), (std::vector<bool>{false, false, false}));  // 1,200 tokens
  mgr.close(1);
  mgr.close(2);  // 400 < 500: the next advance switches back
  mgr.open(2, uniform_config()).append(md::regions::user, 50);
  ASSERT_EQ(kernels(mgr), (std::vector<bool>{false, false}));
  const auto before = mgr.digest();
  struct gives_up_after_one {
    void operator()(std::size_t n, const std::function<void(std::size_t)>& task) const {
      if (n > 0) task(0);
      throw std::runtime_error("executor gave up");
    }
  } failing;
  EXPECT_THROW(mgr.advance_to(2, failing), std::runtime_error);
  EXPECT_EQ(kernels(mgr), (std::vector<bool>{false, false}));
  EXPECT_EQ(mgr.now(), 1u);
  EXPECT_EQ(mgr.digest(), before);
  mgr.advance_to(2);
  EXPECT_EQ(kernels(mgr), (std::vector<bool>{true, true}));
}
