// SPDX-License-Identifier: Apache-2.0
// Fault injection (tests/support/faulty_table.hpp), for every policy: a page table that throws (the engine's error,
// out of memory, a refusal) or reports a short removal at each of its calls in turn, during a sequence's commit, a
// manager's global commit and a fork; and an engine configure callback that throws during a manager load. After
// each failed call the sequence, the manager and the table are exactly as before it, and the same call then
// succeeds with the result an unfaulted call has. A table without a batch removal (a user's own) commits sequence
// by sequence: a failure there leaves every sequence's table and state agreeing, and the next selection commits.
#include <gtest/gtest.h>

#include <cstdint>
#include <new>
#include <optional>
#include <random>
#include <stdexcept>
#include <vector>

#include <memdecay/core/manager.hpp>
#include <memdecay/io/manager_snapshot.hpp>
#include <memdecay/page_tables/block_pool.hpp>

#include "support/faulty_table.hpp"
#include "support/policy_cases.hpp"

namespace md = memdecay;
using fault_injection::fault_mode;
using fault_injection::faulty_table;
using policy_cases::all_policies;
using policy_cases::sequence_of;

namespace {

constexpr std::size_t page = 4;

// Everything observable of a block pool: each sequence's block table, every block's reference count, the free count.
struct pool_fingerprint {
  std::vector<std::vector<std::int32_t>> tables;
  std::vector<std::size_t> refs;
  std::size_t free = 0;
  friend bool operator==(const pool_fingerprint&, const pool_fingerprint&) = default;
};
pool_fingerprint fingerprint(const md::block_pool<>& pool, const std::vector<std::uint64_t>& ids) {
  pool_fingerprint f;
  for (std::uint64_t id : ids) {
    const auto t = pool.block_table(id);
    f.tables.emplace_back(t.begin(), t.end());
  }
  for (std::size_t b = 0; b < pool.capacity(); ++b) f.refs.push_back(pool.ref_count(static_cast<std::int32_t>(b)));
  f.free = pool.free_blocks();
  return f;
}

template <class Case>
md::config config_of() {
  md::config cfg{.page_size = page, .normalization = Case::normalization};
  cfg.region_overrides = {{.region = "plan", .pinned = true}};
  return cfg;
}

// Three sequences with history over one pool, over their global budget: the same world for the same seed.
template <class Case>
struct world {
  using seq_t = sequence_of<Case, float>;
  md::basic_manager<seq_t> mgr{{.page_size = page, .global = md::global_budget::pages(20, 14)}};
  md::block_pool<> pool{256, page};

  explicit world(std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    for (std::uint64_t id = 1; id <= 3; ++id) {
      mgr.open(id, config_of<Case>(), Case::template params<float>()).append(md::regions::plan, page);
      pool.open(id);
      pool.append_tokens(id, page);
    }
    for (md::step_t step = 1; step <= 6; ++step) {
      mgr.advance_to(step);
      for (std::uint64_t id = 1; id <= 3; ++id) {
        auto& s = mgr.at(id);
        const std::size_t count = 2 + rng() % 5;
        s.append(static_cast<md::region_id>(2 + rng() % 5), count);
        pool.append_tokens(id, count);
        std::vector<float> mass(s.kv_len());
        for (auto& m : mass) m = static_cast<float>(rng() % 100) / static_cast<float>(100 * mass.size());
        s.observe_tokens(mass);
      }
    }
  }
  [[nodiscard]] pool_fingerprint table() const { return fingerprint(pool, {1, 2, 3}); }
};

}  // namespace

template <class Case>
class FaultInjection : public ::testing::Test {};
TYPED_TEST_SUITE(FaultInjection, all_policies);

TYPED_TEST(FaultInjection, AManagerCommitThatFailsAtAnyTableCallChangesNothing) {
  // The reference: the same world, committed without a fault.
  world<TypeParam> ref(5);
  const auto plan = ref.mgr.select_global();
  ASSERT_GE(plan.plans.size(), 2u) << "the plan should span sequences: the batch is what is tested";
  faulty_table counting(ref.pool);
  counting.fail(std::nullopt, fault_mode::engine_error);
  ref.mgr.commit(plan, counting, md::identity_id{});
  const std::size_t calls = counting.calls();
  const auto digest_after = ref.mgr.digest();
  const auto table_after = ref.table();
  ASSERT_GT(calls, 0u);

  std::size_t fired = 0;
  for (fault_mode mode : fault_injection::all_modes)
    for (std::size_t k = 0; k < calls; ++k) {
      SCOPED_TRACE(testing::Message() << to_string(mode) << " at call " << k << " of " << calls);
      world<TypeParam> w(5);
      const auto digest = w.mgr.digest();
      const auto table = w.table();
      const auto p = w.mgr.select_global();
      ASSERT_EQ(p.digest(), plan.digest());
      faulty_table ft(w.pool);
      ft.fail(k, mode);
      bool threw = false;
      try {
        w.mgr.commit(p, ft, md::identity_id{});
      } catch (const std::exception&) {
        threw = true;
      }
      ASSERT_EQ(threw, ft.fired());
      if (!threw) continue;  // a short report armed at a call that is not a removal
      ++fired;
      ASSERT_EQ(w.mgr.digest(), digest) << "the manager changed";
      ASSERT_EQ(w.table(), table) << "the table changed";
      ASSERT_TRUE(w.pool.consistent());
      ft.fail(std::nullopt, mode);
      w.mgr.commit(p, ft, md::identity_id{});  // the same plan is still good, and now commits
      ASSERT_EQ(w.mgr.digest(), digest_after);
      ASSERT_EQ(w.table(), table_after);
    }
  EXPECT_GE(fired, 3 * calls) << "every call should have failed in each throwing mode";
}

TYPED_TEST(FaultInjection, ASequenceCommitThatFailsAtAnyTableCallChangesNothing) {
  using seq_t = sequence_of<TypeParam, float>;
  auto build = [](seq_t& seq, md::block_pool<>& pool) {
    std::mt19937_64 rng(9);
    pool.open(0);
    for (md::step_t step = 1; step <= 8; ++step) {
      const std::size_t count = 3 + rng() % 6;
      seq.append(static_cast<md::region_id>(2 + rng() % 5), count);
      pool.append_tokens(0, count);
      seq.advance_to(step);
      std::vector<float> mass(seq.kv_len());
      for (auto& m : mass) m = static_cast<float>(rng() % 100) / static_cast<float>(100 * mass.size());
      seq.observe_tokens(mass);
    }
  };
  md::config cfg = config_of<TypeParam>();
  cfg.budget = md::budget_config::tokens(16, 12);
  seq_t ref(cfg, TypeParam::template params<float>());
  md::block_pool<> ref_pool(128, page);
  build(ref, ref_pool);
  const auto plan = ref.select_for_budget();
  ASSERT_FALSE(plan.pages.empty());
  faulty_table counting(ref_pool);
  counting.fail(std::nullopt, fault_mode::engine_error);
  (void)ref.commit(plan, counting, 0);
  const std::size_t calls = counting.calls();
  const auto after = ref.digest();
  const auto table_after = fingerprint(ref_pool, {0});
  for (fault_mode mode : fault_injection::all_modes)
    for (std::size_t k = 0; k < calls; ++k) {
      SCOPED_TRACE(testing::Message() << to_string(mode) << " at call " << k << " of " << calls);
      seq_t seq(cfg, TypeParam::template params<float>());
      md::block_pool<> pool(128, page);
      build(seq, pool);
      const auto digest = seq.digest();
      const auto table = fingerprint(pool, {0});
      faulty_table ft(pool);
      ft.fail(k, mode);
      bool threw = false;
      try {
        (void)seq.commit(plan, ft, 0);
      } catch (const std::exception&) {
        threw = true;
      }
      ASSERT_EQ(threw, ft.fired());
      if (!threw) continue;
      ASSERT_EQ(seq.digest(), digest);
      ASSERT_EQ(fingerprint(pool, {0}), table);
      ft.fail(std::nullopt, mode);
      (void)seq.commit(plan, ft, 0);
      ASSERT_EQ(seq.digest(), after);
      ASSERT_EQ(fingerprint(pool, {0}), table_after);
    }
}

// A host tier's recall into the device table (tiers/host_tier.hpp): with free blocks for the promotions, a fault
// at any table call (the checks, the insertion, the removal, a short report) leaves the sequence and the table as
// they were, and the same plan then commits.
TYPED_TEST(FaultInjection, ARecallCommitThatFailsAtAnyTableCallChangesNothing) {
  using seq_t = sequence_of<TypeParam, float>;
  auto build = [](seq_t& seq, md::block_pool<>& pool) {
    pool.open(0);
    seq.append(md::regions::system, page);
    pool.append_tokens(0, page);
    for (md::step_t step = 1; step <= 10; ++step) {
      seq.append(md::regions::retrieval, page);
      pool.append_tokens(0, page);
      seq.advance_to(step);
    }
    seq.enable_digests({.kv_heads = 1, .head_dim = 2});
    for (std::size_t p = 0; p < seq.num_pages(); ++p) {
      const std::vector<float> keys(2 * page, 0.1f * static_cast<float>(p));
      seq.set_page_keys(p, keys);
    }
    seq.enable_host_tier({.max_recall_pages = 2});
    (void)seq.commit(seq.select_for_budget(), pool, 0);
    for (std::size_t p = 0, n = 0; p < seq.num_pages() && n < 2; ++p)
      if (seq.residency(p) == md::page_residency::host) {
        const std::vector<float> keys(2 * page, 20.0f + static_cast<float>(n++));
        seq.set_page_keys(p, keys);  // the query's pages, on the host
      }
  };
  md::config cfg = config_of<TypeParam>();
  cfg.budget = md::budget_config::pages(6);
  const std::vector<float> query{1.0f, 1.0f};
  seq_t ref(cfg, TypeParam::template params<float>());
  md::block_pool<> ref_pool(64, page);
  build(ref, ref_pool);
  const auto plan = ref.select_recall(query);
  ASSERT_EQ(plan.promote.size(), 2u);
  ASSERT_EQ(plan.demote.size() + plan.drop.size(), 2u) << "a swap: the device is at its budget";
  faulty_table counting(ref_pool);
  counting.fail(std::nullopt, fault_mode::engine_error);
  (void)ref.commit_recall(plan, counting, 0);
  const std::size_t calls = counting.calls();
  const auto after = ref.digest();
  const auto table_after = fingerprint(ref_pool, {0});
  std::size_t fired = 0;
  for (fault_mode mode : fault_injection::all_modes)
    for (std::size_t k = 0; k < calls; ++k) {
      SCOPED_TRACE(testing::Message() << to_string(mode) << " at call " << k << " of " << calls);
      seq_t seq(cfg, TypeParam::template params<float>());
      md::block_pool<> pool(64, page);
      build(seq, pool);
      const auto digest = seq.digest();
      const auto table = fingerprint(pool, {0});
      faulty_table ft(pool);
      ft.fail(k, mode);
      bool threw = false;
      try {
        (void)seq.commit_recall(plan, ft, 0);
      } catch (const std::exception&) {
        threw = true;
      }
      ASSERT_EQ(threw, ft.fired());
      if (!threw) continue;
      ++fired;
      ASSERT_EQ(seq.digest(), digest);
      ASSERT_EQ(fingerprint(pool, {0}), table);
      ASSERT_TRUE(pool.consistent());
      ft.fail(std::nullopt, mode);
      (void)seq.commit_recall(plan, ft, 0);
      ASSERT_EQ(seq.digest(), after);
      ASSERT_EQ(fingerprint(pool, {0}), table_after);
    }
  EXPECT_GE(fired, 3 * calls) << "every call should have failed in each throwing mode";
}

TYPED_TEST(FaultInjection, AForkThatFailsAtAnyTableCallChangesNothing) {
  world<TypeParam> ref(7);
  faulty_table counting(ref.pool);
  counting.fail(std::nullopt, fault_mode::engine_error);
  ref.mgr.fork(2, 9, counting, md::identity_id{});
  const std::size_t calls = counting.calls();
  const auto digest_after = ref.mgr.digest();
  const auto table_after = fingerprint(ref.pool, {1, 2, 3, 9});
  for (fault_mode mode : {fault_mode::engine_error, fault_mode::out_of_memory, fault_mode::refusal})
    for (std::size_t k = 0; k < calls; ++k) {
      SCOPED_TRACE(testing::Message() << to_string(mode) << " at call " << k << " of " << calls);
      world<TypeParam> w(7);
      const auto digest = w.mgr.digest();
      const auto table = w.table();
      faulty_table ft(w.pool);
      ft.fail(k, mode);
      EXPECT_ANY_THROW(w.mgr.fork(2, 9, ft, md::identity_id{}));
      ASSERT_FALSE(w.mgr.contains(9));
      ASSERT_EQ(w.mgr.digest(), digest);
      ASSERT_EQ(w.table(), table);
      ft.fail(std::nullopt, mode);
      w.mgr.fork(2, 9, ft, md::identity_id{});
      ASSERT_EQ(w.mgr.digest(), digest_after);
      ASSERT_EQ(fingerprint(w.pool, {1, 2, 3, 9}), table_after);
    }
}

TYPED_TEST(FaultInjection, ALoadWhoseConfigureFailsAtAnySequenceChangesNothing) {
  world<TypeParam> source(11);
  source.mgr.fork(1, 4);
  const auto bytes = md::snapshot::save(source.mgr);
  using params_t = typename sequence_of<TypeParam, float>::params_type;
  for (int mode = 0; mode < 2; ++mode)
    for (std::size_t k = 0; k < source.mgr.size(); ++k) {
      SCOPED_TRACE(testing::Message() << (mode ? "bad_alloc" : "engine error") << " at sequence " << k);
      world<TypeParam> target(12);
      const auto digest = target.mgr.digest();
      std::size_t asked = 0;
      auto configure = [&](std::uint64_t) {
        if (asked++ == k) {
          if (mode) throw std::bad_alloc();
          throw std::runtime_error("injected: the engine lost the request's config");
        }
        return std::pair<md::config, params_t>(config_of<TypeParam>(), TypeParam::template params<float>());
      };
      EXPECT_ANY_THROW(md::snapshot::load(target.mgr, bytes, configure));
      ASSERT_EQ(target.mgr.digest(), digest);
      ASSERT_EQ(target.mgr.ids(), (std::vector<std::uint64_t>{1, 2, 3}));
      asked = source.mgr.size() + 1;  // no more faults
      md::snapshot::load(target.mgr, bytes, configure);
      ASSERT_EQ(target.mgr.digest(), source.mgr.digest());
    }
}

TYPED_TEST(FaultInjection, AnUnbatchedTableFailingMidCommitLeavesEverySequenceAgreeingWithIt) {
  world<TypeParam> ref(5);
  fault_injection::unbatched_table<md::block_pool<>> plain_ref(ref.pool);
  faulty_table counting(plain_ref);
  counting.fail(std::nullopt, fault_mode::engine_error);
  ref.mgr.commit(ref.mgr.select_global(), counting, md::identity_id{});
  const std::size_t calls = counting.calls();
  for (std::size_t k = 0; k < calls; ++k) {
    SCOPED_TRACE(testing::Message() << "engine error at call " << k << " of " << calls);
    world<TypeParam> w(5);
    fault_injection::unbatched_table<md::block_pool<>> plain(w.pool);
    faulty_table ft(plain);
    ft.fail(k, fault_mode::engine_error);
    EXPECT_ANY_THROW(w.mgr.commit(w.mgr.select_global(), ft, md::identity_id{}));
    for (std::uint64_t id = 1; id <= 3; ++id)
      ASSERT_EQ(w.pool.num_pages(id), w.mgr.at(id).num_pages()) << "sequence " << id << " disagrees with the table";
    ASSERT_TRUE(w.pool.consistent());
    ft.fail(std::nullopt, fault_mode::engine_error);
    w.mgr.commit(w.mgr.select_global(), ft, md::identity_id{});  // a fresh selection commits
    ASSERT_LE(w.mgr.physical_pages(), 20u);
  }
}
