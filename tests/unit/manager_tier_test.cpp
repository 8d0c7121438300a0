// SPDX-License-Identifier: Apache-2.0
// basic_manager with host tiers (core/manager.hpp, tiers/host_tier.hpp): the global pass's victims split by each
// tier's rules, the host pool shared by every tier (the lowest-scoring pages of the pool dropped when it would
// overfill, checked against a brute-force ranking), commits through a block pool and a host store carrying every
// page's K/V, recall through the manager (never a protected or shared page displaced), observe_batch over device
// tokens, the same victims on every thread count, snapshots, and bad input changing nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <memdecay/core/attention_rows.hpp>
#include <memdecay/core/executor.hpp>
#include <memdecay/core/manager.hpp>
#include <memdecay/io/manager_snapshot.hpp>
#include <memdecay/page_tables/block_pool.hpp>
#include <memdecay/tiers/host_store.hpp>

#include "support/int_memory.hpp"

namespace md = memdecay;
namespace r = memdecay::regions;

namespace {

constexpr std::size_t P = 4;

md::config seq_config(double budget_pages) {
  return md::config{.alpha = 1.0,
                    .page_size = P,
                    .protection = {.sink_pages = 0, .recent_tokens = P},
                    .budget = md::budget_config::pages(budget_pages)};
}

// 256 device blocks and 64 host slots (support/int_memory.hpp), -1 where nothing was written.
struct memory : test_memory::int_memory {
  memory() : int_memory(256, 64, -1) {}
};
using copier = test_memory::int_copier;
using store_t = test_memory::int_store;

// A manager of `sequences` tiered sequences (ids 1, 2, ...), each a system page then `pages` pages of mixed
// regions, one page per step, mirrored in a block pool whose blocks hold 1000 * id + origin.
struct engine {
  md::manager mgr;
  md::block_pool<> pool{256, P};
  memory m;
  store_t store{64, copier{&m}};

  engine(md::manager_config cfg, std::size_t sequences, std::size_t pages, md::host_tier_config tier = {},
         double budget_pages = 1000)
      : mgr(cfg) {
    for (std::uint64_t id = 1; id <= sequences; ++id) {
      auto& s = mgr.open(id, seq_config(budget_pages));
      pool.open(id);
      add_page(id, r::system);
      s.enable_host_tier(tier);
    }
    for (std::size_t p = 0; p < pages; ++p) {
      mgr.advance_to(static_cast<md::step_t>(p + 1));
      for (std::uint64_t id = 1; id <= sequences; ++id)
        add_page(id, static_cast<md::region_id>(1 + (p * 3 + id) % 6));
    }
  }
  void add_page(std::uint64_t id, md::region_id region) {
    auto& s = mgr.at(id);
    s.append(region, P);
    pool.append_tokens(id, P);
    m.device[static_cast<std::size_t>(pool.block_table(id).back())] =
        static_cast<int>(1000 * id + s.state().page_origins().back());
  }
  // Every held page's K/V is where its residency says, and the store holds exactly the host pages.
  void expect_kv_follows() const {
    std::size_t hosted = 0;
    for (std::uint64_t id : mgr.ids()) {
      const auto& s = mgr.at(id);
      ASSERT_EQ(pool.block_table(id).size(), s.device_pages()) << "sequence " << id;
      for (std::size_t p = 0; p < s.num_pages(); ++p) {
        const auto origin = s.state().page_origins()[p];
        const int kv = s.residency(p) == md::page_residency::device
                           ? m.device[static_cast<std::size_t>(pool.block_table(id)[s.device_index(p)])]
                           : m.host[*store.slot_of(id, origin)];
        EXPECT_EQ(kv, static_cast<int>(1000 * id + origin)) << "sequence " << id << " page " << p;
      }
      hosted += s.host_pages();
    }
    EXPECT_EQ(store.used_slots(), hosted);
    EXPECT_EQ(mgr.host_pages(), hosted);
  }
  std::vector<std::vector<std::int32_t>> tables() const {
    std::vector<std::vector<std::int32_t>> out;
    for (std::uint64_t id : mgr.ids()) out.emplace_back(pool.block_table(id).begin(), pool.block_table(id).end());
    return out;
  }
};

// Every page's score by sequence, at selection time.
std::map<std::uint64_t, std::vector<float>> scores_of(const md::manager& mgr) {
  std::map<std::uint64_t, std::vector<float>> out;
  for (std::uint64_t id : mgr.ids()) out[id] = mgr.at(id).page_scores();
  return out;
}

}  // namespace

TEST(ManagerTier, GlobalVictimsSplitIntoDemotedAndDroppedByEachTiersRules) {
  // Sequence 1 keeps only pages with a region of base priority >= 0.5 (scratchpad and tool pages are dropped);
  // sequence 2 has no tier: its victims are all dropped.
  md::manager mgr({.page_size = P, .global = md::global_budget::pages(12, 10)});
  for (std::uint64_t id : {1u, 2u}) {
    auto& s = mgr.open(id, seq_config(1000));
    s.append(r::system, P);
    for (std::size_t p = 0; p < 8; ++p) {
      s.advance_to(static_cast<md::step_t>(p + 1));
      s.append(static_cast<md::region_id>(1 + p % 6), P);
    }
  }
  mgr.at(1).enable_host_tier({.min_host_priority = 0.5});
  mgr.advance_to(9);
  const auto plan = mgr.select_global();
  ASSERT_EQ(plan.pages_freed, 18u - 10u);
  ASSERT_TRUE(plan.plans.contains(1) && plan.plans.contains(2));
  const auto& one = plan.plans.at(1);
  const auto& regions = mgr.at(1).regions();
  for (std::size_t p : one.pages) {
    const auto region = mgr.at(1).state().regions()[p * P];
    const bool worthy = regions.base_priority(region) >= 0.5;
    EXPECT_EQ(std::binary_search(one.demoted.begin(), one.demoted.end(), p), worthy) << "page " << p;
  }
  EXPECT_FALSE(one.demoted.empty());
  EXPECT_TRUE(plan.plans.at(2).demoted.empty()) << "no tier: every victim is dropped";
  const std::size_t held_before = mgr.at(1).num_pages();
  mgr.commit(plan);
  EXPECT_EQ(mgr.at(1).num_pages(), held_before - (one.pages.size() - one.demoted.size()));
  EXPECT_EQ(mgr.host_pages(), one.demoted.size());
  EXPECT_EQ(mgr.resident_pages(), 10u) << "the global budget counts device pages";
  EXPECT_EQ(mgr.physical_pages(), 10u);
  EXPECT_TRUE(mgr.select_global().empty()) << "host pages do not count toward the global budget";
}

TEST(ManagerTier, TheHostPoolKeepsTheHighestScoringPagesOfEveryTier) {
  // Three tiers without their own limit share a pool of 5 pages; every step the global budget pushes pages out.
  md::manager_config cfg{.page_size = P, .global = md::global_budget::pages(18, 15), .host_pool = 5};
  engine e(cfg, 3, 4);
  std::mt19937_64 rng(7);
  std::size_t checked = 0;
  for (md::step_t step = 5; step < 25; ++step) {
    e.mgr.advance_to(step);
    for (std::uint64_t id : e.mgr.ids()) {
      e.add_page(id, static_cast<md::region_id>(1 + rng() % 6));
      std::vector<float> mass(e.mgr.at(id).device_len());
      for (auto& x : mass) x = static_cast<float>(rng() % 100) / 400.0f;
      (void)e.mgr.at(id).observe_tokens(mass);
    }
    const auto scores = scores_of(e.mgr);
    // Before the plan: what could be on the host after it (the host pages and every victim; all regions qualify).
    const auto plan = e.mgr.select_global();
    float lowest_kept = std::numeric_limits<float>::infinity(), highest_dropped = -lowest_kept;
    std::size_t kept = 0;
    for (const auto& [id, s] : scores) {
      const auto& seq = e.mgr.at(id);
      const auto found = plan.plans.find(id);
      const md::eviction_plan<float>* p = found == plan.plans.end() ? nullptr : &found->second;
      auto in = [](const std::vector<std::size_t>& v, std::size_t x) {
        return std::binary_search(v.begin(), v.end(), x);
      };
      for (std::size_t page = 0; page < seq.num_pages(); ++page) {
        const bool host = seq.residency(page) == md::page_residency::host;
        const bool victim = p && in(p->pages, page);
        if (!host && !victim) continue;
        const bool stays = host ? !(p && in(p->host_dropped, page)) : in(p->demoted, page);
        (stays ? lowest_kept : highest_dropped) =
            stays ? std::min(lowest_kept, s[page]) : std::max(highest_dropped, s[page]);
        kept += stays ? 1 : 0;
      }
    }
    EXPECT_LE(kept, 5u) << "step " << step;
    if (kept == 5 && highest_dropped > -std::numeric_limits<float>::infinity()) {
      EXPECT_LE(highest_dropped, lowest_kept) << "step " << step << ": the pool keeps its highest scores";
      ++checked;
    }
    (void)e.mgr.commit(plan, e.pool, md::identity_id{}, e.store);
    EXPECT_LE(e.mgr.host_pages(), 5u);
    e.expect_kv_follows();
  }
  EXPECT_GT(checked, 5u) << "the pool should have been full and cut on most steps";
}

TEST(ManagerTier, RecallThroughTheManagerCarriesTheKvAndSparesProtectedAndSharedPages) {
  // Each sequence's own budget keeps 8 device pages, so a recall must swap.
  engine e({.page_size = P}, 2, 10, {.min_device_steps = 0}, 8);
  e.mgr.advance_to(11);
  (void)e.mgr.commit(e.mgr.select_global(), e.pool, md::identity_id{}, e.store);
  e.expect_kv_follows();
  ASSERT_GT(e.mgr.host_pages(), 0u);
  // The query wants every host page; the device pages' bounds rise with the index, so the lowest are the first
  // ones, of which we protect one and share another.
  auto& s = e.mgr.at(1);
  ASSERT_EQ(s.device_pages(), 8u);
  std::vector<float> bounds(s.num_pages());
  std::vector<std::size_t> device;
  for (std::size_t p = 0; p < s.num_pages(); ++p) {
    const bool host = s.residency(p) == md::page_residency::host;
    bounds[p] = host ? 100.0f : static_cast<float>(p);
    if (!host && s.page_statuses()[p] == md::page_status::evictable) device.push_back(p);
  }
  ASSERT_GE(device.size(), 3u);
  const std::size_t shielded[] = {device[0]};
  e.mgr.protect_pages(1, shielded);
  const std::size_t shared[] = {device[1]};
  e.mgr.set_shared(1, shared);
  const auto plan = e.mgr.select_recall_for_bounds(1, bounds);
  ASSERT_FALSE(plan.promote.empty());
  for (const auto* list : {&plan.demote, &plan.drop}) {
    EXPECT_FALSE(std::binary_search(list->begin(), list->end(), device[0])) << "protected for this step";
    EXPECT_FALSE(std::binary_search(list->begin(), list->end(), device[1])) << "shared";
  }
  // The sequence's own plan ignores the manager's protection: the manager refuses it, and the sequence's own commit
  // refuses a managed sequence.
  const auto own = s.select_recall_for_bounds(bounds);
  ASSERT_TRUE(std::binary_search(own.demote.begin(), own.demote.end(), device[0]) ||
              std::binary_search(own.drop.begin(), own.drop.end(), device[0]));
  const auto digest = e.mgr.digest();
  const auto tables = e.tables();
  EXPECT_THROW(e.mgr.commit_recall(1, own, e.pool, md::identity_id{}, e.store), md::usage_error);
  EXPECT_THROW(s.commit_recall(plan, e.pool, 1, e.store), md::usage_error) << "commit through the manager";
  EXPECT_EQ(e.mgr.digest(), digest);
  EXPECT_EQ(e.tables(), tables);
  const auto positions = s.positions();
  (void)e.mgr.commit_recall(1, plan, e.pool, md::identity_id{}, e.store);
  EXPECT_EQ(s.positions(), positions) << "recalled pages return to their place";
  e.expect_kv_follows();
  EXPECT_FALSE(e.mgr.protected_pages(1).empty()) << "the protected page stayed on the device";
}

// A page on the host holds no device block: it can be neither protected nor shared. protect_pages and set_shared
// name it with an input_error and change nothing; protect_tail_tokens passes over it. (Found by the adapter
// fuzzer's host-tier path: a shared host page lowered reclaimable_pages and made a manager snapshot that did not
// load.)
TEST(ManagerTier, AHostPageIsNeitherProtectedNorShared) {
  engine e({.page_size = P}, 2, 10, {.min_device_steps = 0}, 8);
  e.mgr.advance_to(11);
  (void)e.mgr.commit(e.mgr.select_global(), e.pool, md::identity_id{}, e.store);
  auto& s = e.mgr.at(1);
  std::size_t host = s.num_pages();
  for (std::size_t p = 0; p < s.num_pages(); ++p)
    if (s.residency(p) == md::page_residency::host) host = p;
  ASSERT_LT(host, s.num_pages());
  const auto digest = e.mgr.digest();
  const auto reclaimable = e.mgr.reclaimable_pages();
  const std::size_t named[] = {host};
  for (bool share : {true, false}) {
    try {
      e.mgr.set_shared(1, named, share);
      FAIL() << "set_shared accepted a host page";
    } catch (const md::input_error& err) {
      EXPECT_NE(std::string(err.what()).find("page " + std::to_string(host) + " is on the host"), std::string::npos)
          << err.what();
    }
  }
  EXPECT_THROW(e.mgr.protect_pages(1, named), md::input_error);
  EXPECT_EQ(e.mgr.digest(), digest);
  EXPECT_EQ(e.mgr.reclaimable_pages(), reclaimable);
  EXPECT_TRUE(e.mgr.shared_pages(1).empty());
  EXPECT_TRUE(e.mgr.protected_pages(1).empty());
  // A tail that reaches back over host pages protects only its device pages.
  e.mgr.protect_tail_tokens(1, s.kv_len());
  const auto kept = e.mgr.protected_pages(1);
  EXPECT_EQ(kept.size(), s.device_pages());
  for (std::size_t p : kept) EXPECT_EQ(s.residency(p), md::page_residency::device) << "page " << p;
}

TEST(ManagerTier, AFailingStoreAndAnOverfullPoolChangeNothing) {
  engine e({.page_size = P, .global = md::global_budget::pages(14, 10), .host_pool = 6}, 2, 8);
  e.mgr.advance_to(9);
  const auto plan = e.mgr.select_global();
  std::size_t demoted = 0;
  for (const auto& [id, p] : plan.plans) demoted += p.demoted.size();
  ASSERT_GE(demoted, 4u);
  const auto digest = e.mgr.digest();
  const auto tables = e.tables();
  for (int fail_at : {0, 1, static_cast<int>(demoted) - 1}) {
    e.m.copies = 0;
    e.m.fail_at = fail_at;
    EXPECT_THROW((void)e.mgr.commit(plan, e.pool, md::identity_id{}, e.store), std::runtime_error) << fail_at;
    EXPECT_EQ(e.mgr.digest(), digest);
    EXPECT_EQ(e.tables(), tables);
    EXPECT_EQ(e.store.used_slots(), 0u) << "the copies made are released";
  }
  e.m.fail_at = -1;

  // Two plans, each within the pool alone, together over it: the second commit is refused.
  md::manager_config cfg{.page_size = P, .host_pool = 3};
  md::manager mgr(cfg);
  for (std::uint64_t id : {1u, 2u}) {
    auto& s = mgr.open(id, seq_config(4));
    s.append(r::system, P);
    s.append(r::retrieval, 6 * P);
    s.enable_host_tier({});
  }
  const auto one = mgr.select(1), two = mgr.select(2);
  ASSERT_EQ(one.demoted.size(), 3u) << "a single sequence's plan fits the pool alone";
  ASSERT_EQ(two.demoted.size(), 3u);
  mgr.commit(1, one);
  const auto before = mgr.digest();
  try {
    mgr.commit(2, two);
    FAIL() << "the pool holds 3 pages";
  } catch (const md::usage_error& err) {
    EXPECT_NE(std::string(err.what()).find("host pool of 3"), std::string::npos) << err.what();
  }
  EXPECT_EQ(mgr.digest(), before);
  // A plan selected now drops sequence 2's victims instead, and cannot touch sequence 1's host pages.
  const auto again = mgr.select(2);
  EXPECT_TRUE(again.demoted.empty());
  EXPECT_TRUE(again.host_dropped.empty());
  mgr.commit(2, again);
  EXPECT_EQ(mgr.host_pages(), 3u);
}

TEST(ManagerTier, ObserveBatchOverDeviceTokensEqualsObserveTokens) {
  md::manager_config cfg{.page_size = P, .global = md::global_budget::pages(14, 10)};
  engine a(cfg, 3, 8), b(cfg, 3, 8);
  for (auto* e : {&a, &b}) {
    e->mgr.advance_to(9);
    e->mgr.commit(e->mgr.select_global());
  }
  ASSERT_GT(a.mgr.host_pages(), 0u);
  std::mt19937_64 rng(3);
  std::vector<std::vector<float>> masses;
  std::vector<md::manager::observation> batch;
  for (std::uint64_t id : a.mgr.ids()) {
    auto& m = masses.emplace_back(a.mgr.at(id).device_len());
    for (auto& x : m) x = static_cast<float>(rng() % 100) / 100.0f;
  }
  for (std::size_t k = 0; k < masses.size(); ++k) batch.push_back({a.mgr.ids()[k], masses[k]});
  const auto refreshed = a.mgr.observe_batch(std::span<const md::manager::observation>(batch));
  for (std::size_t k = 0; k < batch.size(); ++k)
    EXPECT_EQ(b.mgr.at(batch[k].id).observe_tokens(masses[k]), refreshed[k]);
  EXPECT_EQ(a.mgr.digest(), b.mgr.digest());

  // Rows: two fp32 rows per sequence (reduced), one row (in place).
  std::vector<std::vector<float>> rows(batch.size());
  std::vector<md::manager::rows_observation> row_batch;
  for (std::size_t k = 0; k < batch.size(); ++k) {
    const std::size_t n = masses[k].size(), heads = k == 0 ? 1 : 2;
    for (std::size_t h = 0; h < heads; ++h) rows[k].insert(rows[k].end(), masses[k].begin(), masses[k].end());
    row_batch.push_back({batch[k].id, md::attention_rows(std::span<const float>(rows[k]), heads, n)});
  }
  a.mgr.advance_to(10);
  b.mgr.advance_to(10);
  (void)a.mgr.observe_batch(std::span<const md::manager::rows_observation>(row_batch));
  for (std::size_t k = 0; k < batch.size(); ++k) (void)b.mgr.at(batch[k].id).observe_rows(row_batch[k].rows);
  EXPECT_EQ(a.mgr.digest(), b.mgr.digest());

  // A mass over the held tokens (host pages included) is the wrong length: an error naming the sequence.
  const auto digest = a.mgr.digest();
  std::vector<float> held(a.mgr.at(batch[1].id).kv_len(), 0.1f);
  ASSERT_NE(held.size(), masses[1].size());
  auto bad = batch;
  bad[1].mass = held;
  try {
    (void)a.mgr.observe_batch(std::span<const md::manager::observation>(bad));
    FAIL() << "a held-length mass was accepted";
  } catch (const md::input_error& err) {
    EXPECT_NE(std::string(err.what()).find("sequence " + std::to_string(batch[1].id)), std::string::npos)
        << err.what();
  }
  EXPECT_EQ(a.mgr.digest(), digest);
}

TEST(ManagerTier, SameVictimsOnEveryThreadCount) {
  const auto run = [](std::size_t threads) {
    md::thread_pool exec(threads);
    engine e({.page_size = P, .global = md::global_budget::pages(40, 32), .host_pool = 9}, 6, 3,
             {.min_host_priority = 0.3, .min_device_steps = 1});
    std::vector<std::uint64_t> digests;
    std::mt19937_64 rng(21);
    for (md::step_t step = 4; step < 20; ++step) {
      e.mgr.advance_to(step, exec);
      std::vector<std::vector<float>> masses;
      std::vector<md::manager::observation> batch;
      for (std::uint64_t id : e.mgr.ids()) {
        e.add_page(id, static_cast<md::region_id>(1 + rng() % 6));
        auto& m = masses.emplace_back(e.mgr.at(id).device_len());
        for (auto& x : m) x = static_cast<float>(rng() % 100) / 300.0f;
      }
      for (std::size_t k = 0; k < masses.size(); ++k) batch.push_back({e.mgr.ids()[k], masses[k]});
      (void)e.mgr.observe_batch(std::span<const md::manager::observation>(batch), exec);
      const auto plan = e.mgr.select_global(step % 2, exec);
      digests.push_back(plan.digest());
      for (const auto& [id, p] : plan.plans) {
        digests.push_back(p.demoted.size());
        digests.push_back(p.host_dropped.size());
      }
      (void)e.mgr.commit(plan, e.pool, md::identity_id{}, e.store);
      digests.push_back(e.mgr.digest());
    }
    e.expect_kv_follows();
    EXPECT_GT(e.mgr.host_pages(), 0u);
    return digests;
  };
  const auto expected = run(1);
  for (std::size_t threads : {2u, 3u}) EXPECT_EQ(run(threads), expected) << threads << " threads";
}

TEST(ManagerTier, ForkSnapshotsAndSizesKnowTheTiers) {
  engine e({.page_size = P, .global = md::global_budget::pages(14, 10), .host_pool = 8}, 2, 8);
  e.mgr.advance_to(9);
  e.mgr.commit(e.mgr.select_global());
  ASSERT_GT(e.mgr.at(1).host_pages(), 0u);
  EXPECT_THROW((void)e.mgr.fork(1, 7), md::usage_error) << "a host store keeps one copy per sequence";
  EXPECT_FALSE(e.mgr.contains(7));

  const auto saved = md::snapshot::save(e.mgr);
  md::manager back({.page_size = P, .global = md::global_budget::pages(14, 10), .host_pool = 8});
  md::snapshot::load(back, saved, seq_config(1000));
  EXPECT_EQ(back.digest(), e.mgr.digest());
  EXPECT_EQ(back.host_pages(), e.mgr.host_pages());
  EXPECT_EQ(back.select_global(3).digest(), e.mgr.select_global(3).digest());

  md::manager small({.page_size = P, .global = md::global_budget::pages(14, 10), .host_pool = 1});
  const auto before = small.digest();
  try {
    md::snapshot::load(small, saved, seq_config(1000));
    FAIL() << "more host pages than the target's pool";
  } catch (const md::input_error& err) {
    EXPECT_NE(std::string(err.what()).find("host pool"), std::string::npos) << err.what();
  }
  EXPECT_EQ(small.digest(), before);
}

// docs/tiers.md's manager sketch, verbatim between the markers, over a block pool and a host store.
TEST(ManagerTier, TheDocsSketchRuns) {
  memory m;
  store_t host_store(64, copier{&m});
  md::block_pool<> block_table(8192, 16);
  const std::uint64_t request_id = 42;
  md::config cfg{.page_size = 16,
                 .protection = {.sink_pages = 0, .recent_tokens = 16},
                 .budget = md::budget_config::pages(8)};
  const std::vector<float> query(8 * 128, 0.5f);
  block_table.open(request_id);
  // --- docs/tiers.md
  memdecay::manager mgr({.page_size = 16,
                         .global = memdecay::global_budget::pages(4096, 3840),  // device blocks
                         .host_pool = 16384});                                  // host pages over every tier
  auto& seq = mgr.open(request_id, cfg);
  seq.enable_digests({.kv_heads = 8, .head_dim = 128});  // set_page_digest as pages fill: recall reads them
  seq.enable_host_tier({.min_host_priority = 0.5});
  auto plan = mgr.select_global();                           // victims split into demoted / dropped per sequence
  mgr.commit(plan, block_table, memdecay::identity_id{}, host_store);  // copies, table, states: all or nothing
  auto recall = mgr.select_recall(request_id, query);        // never displaces a protected or shared page
  mgr.commit_recall(request_id, recall, block_table, memdecay::identity_id{}, host_store);
  // --- end
  EXPECT_TRUE(plan.empty()) << "nothing to evict yet";
  EXPECT_TRUE(recall.empty());
  seq.append(md::regions::retrieval, 16 * 12);
  block_table.append_tokens(request_id, 16 * 12);
  const auto second = mgr.select_global();
  ASSERT_EQ(second.plans.at(request_id).demoted.size(), 4u);
  (void)mgr.commit(second, block_table, memdecay::identity_id{}, host_store);
  EXPECT_EQ(mgr.host_pages(), 4u);
  EXPECT_EQ(host_store.used_slots(), 4u);
}
