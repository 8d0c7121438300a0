// SPDX-License-Identifier: Apache-2.0
// Fault injection (tests/support/faulty_table.hpp), for every policy: a page table that throws (the engine's error,
// out of memory, a refusal) or reports a short removal at each of its calls in turn, during a sequence's commit, a
// manager's global commit and a fork; and an engine configure callback that throws during a manager load. After
// each failed call the sequence, the manager and the table are exactly as before it, and the same call then
// succeeds with the result an unfaulted call has. A table without a batch removal (a user's own) commits sequence
// by sequence: a failure there leaves every sequence's table and state agreeing, and the next selection commits.
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <random>
#include <stdexcept>
#include <vector>

#include <memdecay/core/manager.hpp>
#include <memdecay/io/manager_snapshot.hpp>
#include <memdecay/page_tables/block_pool.hpp>
#include <memdecay/tiers/host_store.hpp>

#include "support/faulty_store.hpp"
#include "support/faulty_table.hpp"
#include "support/policy_cases.hpp"

namespace md = memdecay;
using fault_injection::fault_mode;
using fault_injection::fault_schedule;
using fault_injection::faulty_store;
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

// An engine with K/V memory: each device block and host slot holds the tag of the page it carries (origin + 1; 0
// is garbage), moved by a host_block_store's copies. After any commit, failed or not, every held page's tag must
// be where the sequence, the table and the store say the page is.
struct kv_memory {
  std::vector<std::int64_t> device, host;
};
struct kv_copy {
  kv_memory* memory;
  void operator()(md::copy_direction dir, const std::int32_t& block, std::size_t slot) const {
    auto& d = memory->device[static_cast<std::size_t>(block)];
    auto& h = memory->host[slot];
    if (dir == md::copy_direction::to_host)
      h = d;
    else
      d = h;
  }
};
using kv_store = md::host_block_store<std::uint64_t, std::int32_t, kv_copy>;

struct store_fingerprint {
  std::map<std::pair<std::uint64_t, std::uint64_t>, std::size_t> entries;
  std::vector<std::size_t> free;
  friend bool operator==(const store_fingerprint&, const store_fingerprint&) = default;
};
store_fingerprint fingerprint(const kv_store& store) {
  return {store.entries(), {store.free_list().begin(), store.free_list().end()}};
}

// Sequence 0 of a pool with K/V tags, a host tier and a store; `fill` takes every free block for sequence 1, so
// that a recall must swap. The pages are a pinned system page and retrieval pages whose keys put the query's two
// pages on the host after the first commit.
template <class Seq>
struct tiered_engine {
  Seq seq;
  md::block_pool<> pool{24, page};
  std::unique_ptr<kv_memory> memory = std::make_unique<kv_memory>();
  kv_store store{16, kv_copy{memory.get()}};

  tiered_engine(const md::config& cfg, const typename Seq::params_type& params, const md::host_tier_config& tier)
      : seq(cfg, params) {
    memory->device.assign(pool.capacity(), 0);
    memory->host.assign(store.capacity(), 0);
    pool.open(0);
    append(md::regions::system);
    for (md::step_t step = 1; step <= 10; ++step) {
      append(step % 3 == 0 ? md::regions::scratchpad : md::regions::retrieval);
      seq.advance_to(step);
    }
    seq.enable_digests({.kv_heads = 1, .head_dim = 2});
    for (std::size_t p = 0; p < seq.num_pages(); ++p) {
      const std::vector<float> keys(2 * page, 0.1f * static_cast<float>(p));
      seq.set_page_keys(p, keys);
    }
    seq.enable_host_tier(tier);
  }
  void append(md::region_id region) {
    seq.append(region, page);
    pool.append_tokens(0, page);
    memory->device[static_cast<std::size_t>(pool.block_table(0).back())] =
        static_cast<std::int64_t>(seq.state().page_origins().back()) + 1;
  }
  // The query's pages: the first two host pages get keys a query of ones prefers.
  void mark_query_pages() {
    for (std::size_t p = 0, n = 0; p < seq.num_pages() && n < 2; ++p)
      if (seq.residency(p) == md::page_residency::host) {
        const std::vector<float> keys(2 * page, 20.0f + static_cast<float>(n++));
        seq.set_page_keys(p, keys);
      }
  }
  void fill_table() {
    pool.open(1);
    pool.append_tokens(1, pool.free_blocks() * page);
    filled = true;
  }
  [[nodiscard]] pool_fingerprint table() const { return filled ? fingerprint(pool, {0, 1}) : fingerprint(pool, {0}); }
  bool filled = false;
  // Where every held page's K/V is: its tag in its device block or its host slot, and nothing else on the host.
  [[nodiscard]] testing::AssertionResult kv_follows() const {
    const auto blocks = pool.block_table(0);
    for (std::size_t p = 0; p < seq.num_pages(); ++p) {
      const auto tag = static_cast<std::int64_t>(seq.state().page_origins()[p]) + 1;
      if (seq.residency(p) == md::page_residency::device) {
        const auto held = memory->device[static_cast<std::size_t>(blocks[seq.device_index(p)])];
        if (held != tag) return testing::AssertionFailure() << "device page " << p << " holds " << held;
      } else {
        const auto slot = store.slot_of(0, seq.state().page_origins()[p]);
        if (!slot) return testing::AssertionFailure() << "host page " << p << " has no host copy";
        if (memory->host[*slot] != tag) return testing::AssertionFailure() << "host page " << p << " holds garbage";
      }
    }
    if (store.used_slots() != seq.host_pages())
      return testing::AssertionFailure() << store.used_slots() << " host copies for " << seq.host_pages() << " pages";
    return testing::AssertionSuccess();
  }
};

// One sequence's table call (`call(seq, table)`: a commit or a recall commit) on a fresh world (`build(seq, pool)`,
// sequence 0 of a pool of `blocks` blocks) with the table failing at its k-th call, for every k and every fault
// mode: a call that throws leaves the sequence and the table (and the pool's own accounting) as they were, and the
// same call then succeeds and leaves what the fault-free run left. Returns how many runs threw.
template <class Seq, class Build, class Call>
std::size_t expect_every_table_fault_changes_nothing(const md::config& cfg, const typename Seq::params_type& params,
                                                     std::size_t blocks, Build build, Call call) {
  Seq ref(cfg, params);
  md::block_pool<> ref_pool(blocks, page);
  build(ref, ref_pool);
  faulty_table counting(ref_pool);
  counting.fail(std::nullopt, fault_mode::engine_error);
  call(ref, counting);
  const std::size_t calls = counting.calls();
  const auto after = ref.digest();
  const auto table_after = fingerprint(ref_pool, {0});
  std::size_t fired = 0;
  for (fault_mode mode : fault_injection::all_modes)
    for (std::size_t k = 0; k < calls; ++k) {
      SCOPED_TRACE(testing::Message() << to_string(mode) << " at call " << k << " of " << calls);
      Seq seq(cfg, params);
      md::block_pool<> pool(blocks, page);
      build(seq, pool);
      const auto digest = seq.digest();
      const auto table = fingerprint(pool, {0});
      faulty_table ft(pool);
      ft.fail(k, mode);
      bool threw = false;
      try {
        call(seq, ft);
      } catch (const std::exception&) {
        threw = true;
      }
      EXPECT_EQ(threw, ft.fired());
      if (!threw) continue;
      ++fired;
      EXPECT_EQ(seq.digest(), digest);
      EXPECT_EQ(fingerprint(pool, {0}), table);
      EXPECT_TRUE(pool.consistent());
      ft.fail(std::nullopt, mode);
      call(seq, ft);
      EXPECT_EQ(seq.digest(), after);
      EXPECT_EQ(fingerprint(pool, {0}), table_after);
    }
  return fired;
}

// A commit through a table and a host store that share one fault schedule (`commit(world, table, store)`, on a fresh
// world from `build()`: a tiered_engine or a tiered_world) with the k-th call failing, for every k and every fault
// mode: a commit that throws leaves the state (`digest(world)`), the table, the store and the K/V the pages carry as
// they were, and the same commit then succeeds and leaves what the fault-free run left (K/V included when
// `kv_after_commit`: without a store the library copies nothing). Returns how many runs threw and the calls counted.
template <class Build, class Digest, class Commit>
std::pair<std::size_t, std::size_t> expect_every_store_fault_changes_nothing(Build build, Digest digest_of,
                                                                             Commit commit,
                                                                             bool kv_after_commit = true) {
  auto ref = build();
  fault_schedule counting;
  faulty_table ct(ref->pool, counting);
  faulty_store cs(ref->store, counting);
  commit(*ref, ct, cs);
  if (kv_after_commit) {
    EXPECT_TRUE(ref->kv_follows());
  }
  const std::size_t calls = counting.calls();
  const auto after = digest_of(*ref);
  const auto table_after = ref->table();
  const auto store_after = fingerprint(ref->store);
  std::size_t fired = 0;
  for (fault_mode mode : fault_injection::all_modes)
    for (std::size_t k = 0; k < calls; ++k) {
      SCOPED_TRACE(testing::Message() << to_string(mode) << " at call " << k << " of " << calls);
      auto w = build();
      const auto digest = digest_of(*w);
      const auto table = w->table();
      const auto store = fingerprint(w->store);
      fault_schedule schedule;
      faulty_table ft(w->pool, schedule);
      faulty_store fs(w->store, schedule);
      schedule.fail(k, mode);
      bool threw = false;
      try {
        commit(*w, ft, fs);
      } catch (const std::exception&) {
        threw = true;
      }
      EXPECT_EQ(threw, schedule.fired());
      if (!threw) continue;
      ++fired;
      EXPECT_EQ(digest_of(*w), digest) << "the state changed";
      EXPECT_EQ(w->table(), table) << "the table changed";
      EXPECT_TRUE(w->pool.consistent());
      EXPECT_EQ(fingerprint(w->store), store) << "the store changed";
      EXPECT_TRUE(w->kv_follows());
      schedule.fail(std::nullopt, mode);
      commit(*w, ft, fs);
      EXPECT_EQ(digest_of(*w), after);
      EXPECT_EQ(w->table(), table_after);
      if (kv_after_commit) {
        EXPECT_EQ(fingerprint(w->store), store_after);
        EXPECT_TRUE(w->kv_follows());
      }
    }
  return {fired, calls};
}

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
  std::optional<typename seq_t::plan_type> plan;  // the plan of the reference, committed by every run
  auto commit = [&plan](seq_t& seq, faulty_table<md::block_pool<>>& table) {
    if (!plan) {
      plan = seq.select_for_budget();
      ASSERT_FALSE(plan->pages.empty());
    }
    (void)seq.commit(*plan, table, 0);
  };
  const std::size_t fired = expect_every_table_fault_changes_nothing<seq_t>(
      cfg, TypeParam::template params<float>(), 128, build, commit);
  EXPECT_GT(fired, 0u);
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
  std::optional<md::recall_plan> plan;  // the reference's, committed by every run
  std::size_t calls = 0;
  auto recall = [&](seq_t& seq, faulty_table<md::block_pool<>>& table) {
    if (!plan) {
      plan = seq.select_recall(query);
      ASSERT_EQ(plan->promote.size(), 2u);
      ASSERT_EQ(plan->demote.size() + plan->drop.size(), 2u) << "a swap: the device is at its budget";
    }
    (void)seq.commit_recall(*plan, table, 0);
    if (calls == 0) calls = table.calls();
  };
  const std::size_t fired = expect_every_table_fault_changes_nothing<seq_t>(
      cfg, TypeParam::template params<float>(), 64, build, recall);
  EXPECT_GE(fired, 3 * calls) << "every call should have failed in each throwing mode";
}

// A tiered commit through the table and a host store (tiers/host_store.hpp): a fault at any call of either (the
// checks, the copies to the host, the removal; thrown, or a short copy or removal) leaves the sequence, the table,
// the store and every page's K/V as they were, and the same plan then commits.
TYPED_TEST(FaultInjection, ATieredCommitWithAStoreThatFailsAtAnyCallChangesNothing) {
  using seq_t = sequence_of<TypeParam, float>;
  md::config cfg = config_of<TypeParam>();
  cfg.budget = md::budget_config::pages(5);
  const md::host_tier_config tier{.host_budget = md::budget_config::pages(2), .min_host_priority = 0.4};
  auto build = [&] {
    auto e = std::make_unique<tiered_engine<seq_t>>(cfg, TypeParam::template params<float>(), tier);
    e->seq.enable_host_tier({.host_budget = tier.host_budget});  // fill the host tier first, whatever the regions
    (void)e->seq.commit(e->seq.select(3), e->pool, 0, e->store);
    e->seq.enable_host_tier(tier);
    e->seq.advance_to(11);
    return e;
  };
  auto ref = build();
  const auto plan = ref->seq.select_for_budget();
  ASSERT_FALSE(plan.demoted.empty());
  ASSERT_EQ(ref->seq.host_pages(), 2u) << "the host tier should be full";

  const auto [fired, calls] = expect_every_store_fault_changes_nothing(
      build, [](const auto& e) { return e.seq.digest(); },
      [&](auto& e, auto& table, auto& store) { (void)e.seq.commit(plan, table, 0, store); });
  EXPECT_GE(fired, 3 * (calls - 2)) << "every call but the releases should have failed in each throwing mode";
}

namespace {

// The world above with host tiers on every sequence (a host pool of 4 pages over the three) and K/V tags: each
// device block and host slot holds 1000 * id + origin + 1 of the page it carries.
template <class Case>
struct tiered_world : world<Case> {
  std::unique_ptr<kv_memory> memory = std::make_unique<kv_memory>();
  kv_store store{32, kv_copy{memory.get()}};

  tiered_world() : world<Case>(5) {
    memory->device.assign(this->pool.capacity(), 0);
    memory->host.assign(store.capacity(), 0);
    for (std::uint64_t id = 1; id <= 3; ++id) {
      auto& s = this->mgr.at(id);
      const auto blocks = this->pool.block_table(id);
      for (std::size_t p = 0; p < s.num_pages(); ++p)
        memory->device[static_cast<std::size_t>(blocks[p])] = tag(id, s.state().page_origins()[p]);
      s.enable_host_tier({.min_host_priority = id == 2 ? 0.45 : 0.0});
    }
  }
  static std::int64_t tag(std::uint64_t id, std::uint64_t origin) {
    return static_cast<std::int64_t>(1000 * id + origin + 1);
  }
  [[nodiscard]] testing::AssertionResult kv_follows() const {
    std::size_t hosted = 0;
    for (std::uint64_t id = 1; id <= 3; ++id) {
      const auto& s = this->mgr.at(id);
      const auto blocks = this->pool.block_table(id);
      for (std::size_t p = 0; p < s.num_pages(); ++p) {
        const auto origin = s.state().page_origins()[p];
        std::int64_t held = 0;
        if (s.residency(p) == md::page_residency::device) {
          held = memory->device[static_cast<std::size_t>(blocks[s.device_index(p)])];
        } else {
          const auto slot = store.slot_of(id, origin);
          if (!slot) return testing::AssertionFailure() << "sequence " << id << " host page " << p << " has no copy";
          held = memory->host[*slot];
        }
        if (held != tag(id, origin))
          return testing::AssertionFailure() << "sequence " << id << " page " << p << " holds " << held;
      }
      hosted += s.host_pages();
    }
    if (store.used_slots() != hosted)
      return testing::AssertionFailure() << store.used_slots() << " host copies for " << hosted << " pages";
    return testing::AssertionSuccess();
  }
};

}  // namespace

// The manager's global commit with host tiers and a host store (core/manager.hpp): every sequence's demotions are
// copied to the host, then the batch removal, then the dropped host copies released. A fault at any table or store
// call leaves the manager, the table and the store as they were, K/V included; the plan then commits.
TYPED_TEST(FaultInjection, ATieredManagerCommitWithAStoreThatFailsAtAnyCallChangesNothing) {
  auto build = [] {
    auto w = std::make_unique<tiered_world<TypeParam>>();
    (void)w->mgr.commit(w->mgr.select_global(), w->pool, md::identity_id{}, w->store);  // pages on the host first
    w->mgr.advance_to(7);
    for (std::uint64_t id = 1; id <= 3; ++id) {
      auto& s = w->mgr.at(id);
      s.append(md::regions::retrieval, 4 * page);
      w->pool.append_tokens(id, 4 * page);
      const auto blocks = w->pool.block_table(id);
      for (std::size_t p = s.num_pages() - 4; p < s.num_pages(); ++p)
        w->memory->device[static_cast<std::size_t>(blocks[s.device_index(p)])] =
            tiered_world<TypeParam>::tag(id, s.state().page_origins()[p]);
    }
    return w;
  };
  auto ref = build();
  ASSERT_GT(ref->mgr.host_pages(), 0u);
  const auto plan = ref->mgr.select_global();
  std::size_t demoted = 0, tiered = 0;
  for (const auto& [id, p] : plan.plans) demoted += p.demoted.size(), tiered += p.demoted.empty() ? 0 : 1;
  ASSERT_GE(tiered, 2u) << "the demotions should span sequences: the batch is what is tested (" << plan.victims.size()
                        << " victims, " << demoted << " demoted)";
  const auto [fired, calls] = expect_every_store_fault_changes_nothing(
      build, [](const auto& w) { return w.mgr.digest(); },
      [&](auto& w, auto& table, auto& store) {
        EXPECT_EQ(w.mgr.select_global().digest(), plan.digest());  // the same plan from the same state
        (void)w.mgr.commit(plan, table, md::identity_id{}, store);
      });
  EXPECT_GE(fired, 3 * (calls - tiered)) << "every call but the releases should have failed in each throwing mode";
}

namespace {

// A recall (two promotions, two displaced pages) committed through a faulty table, and a faulty store if
// `with_store`, after a fault at each call in turn: nothing changes, K/V included, and the plan then commits.
// `full_table` leaves the device table no free block, so the recall swaps (removal first).
template <class Case>
void sweep_recall_faults(bool with_store, bool full_table) {
  using seq_t = sequence_of<Case, float>;
  md::config cfg = config_of<Case>();
  cfg.budget = md::budget_config::pages(6);
  const md::host_tier_config tier{.min_host_priority = 0.4, .max_recall_pages = 2};
  auto build = [&] {
    auto e = std::make_unique<tiered_engine<seq_t>>(cfg, Case::template params<float>(), tier);
    (void)e->seq.commit(e->seq.select_for_budget(), e->pool, 0, e->store);
    e->mark_query_pages();
    if (full_table) e->fill_table();
    return e;
  };
  const std::vector<float> query{1.0f, 1.0f};
  auto ref = build();
  const auto plan = ref->seq.select_recall(query);
  ASSERT_EQ(plan.promote.size(), 2u);
  ASSERT_EQ(plan.demote.size() + plan.drop.size(), 2u) << "a swap: the device is at its budget";
  ASSERT_EQ(ref->pool.free_blocks() == 0, full_table);
  const auto [fired, calls] = expect_every_store_fault_changes_nothing(
      build, [](const auto& e) { return e.seq.digest(); },
      [&](auto& e, auto& table, auto& store) {
        if (with_store)
          (void)e.seq.commit_recall(plan, table, 0, store);
        else
          (void)e.seq.commit_recall(plan, table, 0);
      },
      /*kv_after_commit=*/with_store);
  const std::size_t releases = with_store ? 3 : 0;
  EXPECT_GE(fired, 3 * (calls - releases)) << "every call but the releases should have failed in each throwing mode";
}

}  // namespace

TYPED_TEST(FaultInjection, ARecallWithAStoreThatFailsAtAnyCallChangesNothing) {
  sweep_recall_faults<TypeParam>(/*with_store=*/true, /*full_table=*/false);
}
TYPED_TEST(FaultInjection, ARecallSwapWithAStoreThatFailsAtAnyCallChangesNothingKvIncluded) {
  sweep_recall_faults<TypeParam>(/*with_store=*/true, /*full_table=*/true);
}
TYPED_TEST(FaultInjection, ARecallSwapThroughAFullTableThatFailsAtAnyTableCallChangesNothing) {
  sweep_recall_faults<TypeParam>(/*with_store=*/false, /*full_table=*/true);
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
