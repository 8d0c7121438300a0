// Tests for manager.hpp: many sequences, per-sequence and global budgets, the deterministic total order of global
// selection, shared pages, per-step protection, all-or-nothing commits and the prefix-cache boundary.
#include <gtest/gtest.h>

#include <memdecay/page_tables/block_pool.hpp>
#include <memdecay/core/manager.hpp>
#include <memdecay/page_tables/flashinfer_csr.hpp>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <tuple>
#include <vector>

namespace md = memdecay;

namespace {

constexpr std::size_t P = 16;

md::config unlimited_config() { return md::config{.page_size = P}; }

// A sequence of `pages` full pages whose regions cycle so that scores differ between pages and sequences.
void fill(md::sequence& seq, std::size_t pages, std::size_t salt) {
  static constexpr md::region_id cycle[] = {md::regions::scratchpad, md::regions::tool_out, md::regions::user,
                                            md::regions::retrieval, md::regions::tool_in};
  for (std::size_t p = 0; p < pages; ++p) seq.append(cycle[(p + salt) % 5], P);
}

std::vector<std::int32_t> pool_snapshot(const md::block_pool<>& pool, const std::vector<std::uint64_t>& ids) {
  std::vector<std::int32_t> out{static_cast<std::int32_t>(pool.free_blocks())};
  for (auto id : ids) {
    const auto t = pool.block_table(id);
    out.push_back(static_cast<std::int32_t>(pool.num_tokens(id)));
    out.insert(out.end(), t.begin(), t.end());
  }
  return out;
}

struct fixture {
  md::manager mgr;
  md::block_pool<> pool{256, P};
  explicit fixture(md::global_budget budget = {}) : mgr({.page_size = P, .global = budget}) {}
  md::sequence& open(std::uint64_t id, std::size_t pages, std::size_t salt, md::config cfg = unlimited_config()) {
    auto& seq = mgr.open(id, cfg);
    pool.open(id);
    fill(seq, pages, salt);
    pool.append_tokens(id, seq.kv_len());
    return seq;
  }
};

TEST(ManagerConfig, RejectsInvalidPageSizesAndBudgets) {
  EXPECT_THROW(md::manager({.page_size = 0}), md::config_error);
  EXPECT_THROW(md::manager({.page_size = 24}), md::config_error);
  EXPECT_THROW(md::manager({.page_size = 16, .global = {.high = 10, .low = 11}}), md::config_error);
  EXPECT_NO_THROW(md::manager({.page_size = 16, .global = md::global_budget::pages(10, 8)}));
  EXPECT_THROW((md::basic_manager<md::basic_sequence<md::policies::memdecay, float, 16>>({.page_size = 32})),
               md::config_error);
}

TEST(ManagerSequences, OpenCloseAndLookUpByIdInAscendingOrder) {
  md::manager mgr({.page_size = P});
  for (std::uint64_t id : {42u, 7u, 19u}) mgr.open(id, unlimited_config());
  EXPECT_EQ(mgr.ids(), (std::vector<std::uint64_t>{7, 19, 42}));
  EXPECT_TRUE(mgr.contains(19));
  mgr.close(19);
  EXPECT_FALSE(mgr.contains(19));
  EXPECT_EQ(mgr.size(), 2u);
}

TEST(ManagerSequences, RejectsDuplicateUnknownAndMismatchedSequencesChangingNothing) {
  md::manager mgr({.page_size = P});
  auto& seq = mgr.open(1, unlimited_config());
  seq.append(md::regions::user, 20);
  const auto digest = mgr.digest();
  EXPECT_THROW(mgr.open(1, unlimited_config()), md::usage_error);
  EXPECT_THROW(mgr.open(2, md::config{.page_size = 32}), md::config_error);
  EXPECT_THROW(mgr.open(3, md::config{.alpha = -1.0, .page_size = P}), md::config_error);
  EXPECT_THROW(mgr.close(9), md::usage_error);
  EXPECT_THROW((void)mgr.at(9), md::usage_error);
  EXPECT_THROW((void)mgr.select(9), md::usage_error);
  EXPECT_THROW(mgr.protect_pages(9, std::vector<std::size_t>{0}), md::usage_error);
  EXPECT_EQ(mgr.ids(), std::vector<std::uint64_t>{1});
  EXPECT_EQ(mgr.at(1).kv_len(), 20u);
  EXPECT_EQ(mgr.digest(), digest);
}

TEST(ManagerSequences, ReferencesStayValidWhileOtherSequencesOpenAndClose) {
  md::manager mgr({.page_size = P});
  auto& first = mgr.open(5, unlimited_config());
  for (std::uint64_t id = 0; id < 50; ++id)
    if (id != 5) mgr.open(id, unlimited_config());
  for (std::uint64_t id = 0; id < 50; id += 2) mgr.close(id);
  first.append(md::regions::user, 3);
  EXPECT_EQ(mgr.at(5).kv_len(), 3u);
}

TEST(ManagerClock, AdvancesEverySequenceOrNone) {
  md::manager mgr({.page_size = P});
  mgr.open(1, unlimited_config());
  mgr.open(2, unlimited_config());
  mgr.advance_to(10);
  mgr.at(2).advance_to(20);  // a sequence's own clock may run ahead
  EXPECT_THROW(mgr.advance_to(15), md::input_error);
  EXPECT_EQ(mgr.at(1).now(), 10u);
  EXPECT_EQ(mgr.at(2).now(), 20u);
  mgr.advance_to(20);
  EXPECT_EQ(mgr.at(1).now(), 20u);
}

TEST(ManagerSelection, PerSequenceBudgetsMatchEachSequencesOwnSelection) {
  fixture f;
  auto& a = f.open(1, 10, 0, md::config{.page_size = P, .budget = md::budget_config::pages(6)});
  auto& b = f.open(2, 10, 3, md::config{.page_size = P, .budget = md::budget_config::pages(8)});
  f.open(3, 10, 1);  // no budget of its own
  f.mgr.advance_to(40);
  const auto plan = f.mgr.select_global();
  ASSERT_EQ(plan.plans.size(), 2u);
  EXPECT_EQ(plan.plans.at(1).pages, a.select_for_budget().pages);
  EXPECT_EQ(plan.plans.at(2).pages, b.select_for_budget().pages);
  EXPECT_EQ(plan.pages_freed, 4u + 2u);
  for (const auto& v : plan.victims) EXPECT_EQ(v.reason, md::eviction_reason::sequence_budget);
  EXPECT_EQ(f.mgr.select(1).pages, a.select_for_budget().pages);
}

// The reference for the global pass: every evictable page of every sequence, sorted by (score, tie hash, id,
// page), the tie hash being splitmix64(splitmix64(id) ^ original page) (manager.hpp). Returns (score, id, page).
std::vector<std::tuple<float, std::uint64_t, std::size_t>> ranked_pages(const md::manager& mgr) {
  using md::policy_support::splitmix64;
  std::vector<std::tuple<float, std::uint64_t, std::uint64_t, std::size_t>> all;
  for (auto id : mgr.ids()) {
    const auto scores = mgr.at(id).page_scores();
    const auto status = mgr.at(id).page_statuses(mgr.protected_pages(id));
    const auto shared = mgr.shared_pages(id);
    const auto origins = mgr.at(id).state().page_origins();
    for (std::size_t p = 0; p < scores.size(); ++p)
      if (status[p] == md::page_status::evictable && !std::binary_search(shared.begin(), shared.end(), p))
        all.emplace_back(scores[p], splitmix64(splitmix64(id) ^ origins[p]), id, p);
  }
  std::sort(all.begin(), all.end());
  std::vector<std::tuple<float, std::uint64_t, std::size_t>> out;
  for (const auto& [score, tie, id, page] : all) out.emplace_back(score, id, page);
  return out;
}

TEST(ManagerSelection, GlobalBudgetTakesTheLowestPagesOfAllSequencesInTotalOrder) {
  fixture f(md::global_budget::pages(24, 20));
  f.open(3, 9, 0);
  f.open(1, 9, 2);
  f.open(2, 9, 4);
  f.mgr.advance_to(25);
  f.mgr.at(2).observe_pages(std::vector<float>(9, 0.02f));
  EXPECT_EQ(f.mgr.reclaimable_pages(), 27u);
  const auto plan = f.mgr.select_global();
  ASSERT_EQ(plan.victims.size(), 7u);  // 27 pages > 24: down to 20
  const auto ranked = ranked_pages(f.mgr);
  for (std::size_t k = 0; k < plan.victims.size(); ++k) {
    EXPECT_EQ(plan.victims[k].sequence, std::get<1>(ranked[k])) << k;
    EXPECT_EQ(plan.victims[k].page, std::get<2>(ranked[k])) << k;
    EXPECT_EQ(plan.victims[k].score, std::get<0>(ranked[k])) << k;
    EXPECT_EQ(plan.victims[k].reason, md::eviction_reason::global_budget);
  }
  EXPECT_EQ(plan.pages_freed, 7u);
  EXPECT_EQ(plan.pages_short, 0u);
}

TEST(ManagerSelection, NothingIsSelectedWithinTheHighWatermark) {
  fixture f(md::global_budget::pages(27, 10));
  f.open(1, 9, 0);
  f.open(2, 9, 1);
  f.open(3, 9, 2);
  f.mgr.advance_to(25);
  EXPECT_TRUE(f.mgr.select_global().empty());
}

TEST(ManagerSelection, TiesGoToTheLowerSequenceIdThenTheLowerPage) {
  fixture f(md::global_budget::pages(11, 9));
  f.open(9, 4, 0);  // identical sequences: every score ties across them
  f.open(4, 4, 0);
  f.open(6, 4, 0);
  f.mgr.advance_to(30);
  const auto plan = f.mgr.select_global();
  ASSERT_EQ(plan.victims.size(), 3u);
  // Page 0 (scratchpad) is the lowest in each; equal scores, so sequence order decides.
  EXPECT_EQ(plan.victims[0].sequence, 4u);
  EXPECT_EQ(plan.victims[1].sequence, 6u);
  EXPECT_EQ(plan.victims[2].sequence, 9u);
  for (const auto& v : plan.victims) EXPECT_EQ(v.page, 0u);
}

// Builds the same scenario with the sequences opened in the given order.
md::manager scenario(const std::vector<std::uint64_t>& open_order, double alpha_of_2 = 1.0) {
  md::manager mgr({.page_size = P, .global = md::global_budget::pages(30, 22)});
  for (auto id : open_order) {
    md::config cfg = unlimited_config();
    if (id == 2) cfg.alpha = alpha_of_2;
    fill(mgr.open(id, cfg), 8 + id % 3, id);
  }
  mgr.advance_to(17);
  for (auto id : open_order) {
    auto& seq = mgr.at(id);
    std::vector<float> mass(seq.num_pages());
    for (std::size_t p = 0; p < mass.size(); ++p) mass[p] = static_cast<float>((p * 7 + id) % 5) * 0.01f;
    seq.observe_pages(mass);
  }
  return mgr;
}

TEST(ManagerDeterminism, SelectionDoesNotDependOnTheOrderSequencesWereOpened) {
  const auto a = scenario({11, 3, 8, 20});
  const auto b = scenario({20, 8, 3, 11});
  const auto pa = a.select_global(), pb = b.select_global();
  ASSERT_FALSE(pa.empty());
  EXPECT_EQ(pa.victims, pb.victims);
  EXPECT_EQ(pa.digest(), pb.digest());
  EXPECT_EQ(a.digest(), b.digest());
}

TEST(ManagerDeterminism, DigestsChangeWithAnythingSelectionDependsOn) {
  auto base = scenario({1, 2, 3});
  const auto d0 = base.digest();
  auto protect = scenario({1, 2, 3});
  protect.protect_pages(2, std::vector<std::size_t>{1});
  auto shared = scenario({1, 2, 3});
  shared.set_shared(3, std::vector<std::size_t>{0});
  auto other_config = scenario({1, 2, 3}, 2.0);
  EXPECT_NE(protect.digest(), d0);
  EXPECT_NE(shared.digest(), d0);
  EXPECT_NE(other_config.digest(), d0);
  EXPECT_EQ(scenario({3, 1, 2}).digest(), d0);
}

TEST(ManagerProtection, ProtectedPagesAreNeverSelectedUntilTheNextStep) {
  fixture f(md::global_budget::pages(0));
  f.open(1, 6, 0);
  f.mgr.advance_to(30);
  f.mgr.protect_pages(1, std::vector<std::size_t>{0, 2});
  f.mgr.protect_tail_tokens(1, 20);  // the last 20 tokens live in pages 4 and 5
  EXPECT_EQ(f.mgr.protected_pages(1), (std::vector<std::size_t>{0, 2, 4, 5}));
  auto plan = f.mgr.select_global();
  ASSERT_EQ(plan.plans.size(), 1u);
  EXPECT_EQ(plan.plans.at(1).pages, (std::vector<std::size_t>{1, 3}));
  EXPECT_EQ(plan.pages_short, 4u);  // the budget of 0 pages cannot be met
  EXPECT_EQ(f.mgr.select(1, 6).pages, (std::vector<std::size_t>{1, 3}));

  f.mgr.advance_to(31);
  EXPECT_TRUE(f.mgr.protected_pages(1).empty());
  EXPECT_EQ(f.mgr.select_global().pages_freed, 6u);
}

TEST(ManagerProtection, ProtectionFollowsItsPageThroughCompaction) {
  fixture f;
  f.open(1, 8, 0);
  f.mgr.advance_to(30);
  f.mgr.protect_pages(1, std::vector<std::size_t>{5});
  const auto plan = f.mgr.select(1, 2);
  ASSERT_EQ(plan.pages, (std::vector<std::size_t>{0, 1}));  // scratchpad, then the first tool output
  f.mgr.commit(1, plan, f.pool, md::identity_id{});
  EXPECT_EQ(f.mgr.protected_pages(1), std::vector<std::size_t>{3});
}

TEST(ManagerProtection, RejectsPagesThatDoNotExistChangingNothing) {
  fixture f;
  f.open(1, 3, 0);
  f.mgr.protect_pages(1, std::vector<std::size_t>{1});
  EXPECT_THROW(f.mgr.protect_pages(1, std::vector<std::size_t>{0, 3}), md::input_error);
  EXPECT_THROW(f.mgr.set_shared(1, std::vector<std::size_t>{7}), md::input_error);
  EXPECT_EQ(f.mgr.protected_pages(1), std::vector<std::size_t>{1});
  EXPECT_TRUE(f.mgr.shared_pages(1).empty());
}

TEST(ManagerShared, SharedPagesAreNotReclaimableAndTheGlobalPassSkipsThem) {
  fixture f(md::global_budget::pages(12, 8));
  f.open(1, 6, 0);
  f.open(2, 6, 0);
  f.mgr.advance_to(30);
  f.mgr.set_shared(1, std::vector<std::size_t>{0, 1});
  EXPECT_EQ(f.mgr.resident_pages(), 12u);
  EXPECT_EQ(f.mgr.reclaimable_pages(), 10u);
  EXPECT_EQ(f.mgr.physical_pages(), 12u) << "a block shared with holders outside the manager is still a block";
  EXPECT_TRUE(f.mgr.select_global().empty());  // 12 blocks: within the budget

  f.mgr.open(3, unlimited_config()).append(md::regions::tool_out, P);
  const auto plan = f.mgr.select_global();  // 13 > 12: down to 8, from the 11 private pages
  ASSERT_EQ(plan.victims.size(), 5u);
  for (const auto& v : plan.victims) EXPECT_FALSE(v.sequence == 1 && v.page <= 1) << "a shared page was picked";
  f.mgr.set_shared(1, std::vector<std::size_t>{1}, false);
  EXPECT_EQ(f.mgr.shared_pages(1), std::vector<std::size_t>{0});
  EXPECT_EQ(f.mgr.physical_pages(), 13u);
}

TEST(ManagerShared, ASequenceBudgetMayEvictSharedPagesButTheyFreeNothing) {
  fixture f;
  f.open(1, 6, 0);
  auto& b = f.open(2, 0, 0, md::config{.page_size = P, .budget = md::budget_config::pages(4)});
  f.pool.share_prefix(1, 2, 4);  // sequence 2 starts from sequence 1's first four pages
  fill(b, 4, 0);
  fill(b, 2, 2);
  f.pool.append_tokens(2, 2 * P);
  f.mgr.advance_to(30);
  f.mgr.mark_shared_from(f.pool, md::identity_id{});
  EXPECT_EQ(f.mgr.shared_pages(1), (std::vector<std::size_t>{0, 1, 2, 3}));
  EXPECT_EQ(f.mgr.shared_pages(2), (std::vector<std::size_t>{0, 1, 2, 3}));

  const auto plan = f.mgr.select_global();
  ASSERT_EQ(plan.plans.count(2), 1u);
  std::size_t shared_victims = 0;
  for (const auto& v : plan.victims) shared_victims += v.shared;
  EXPECT_GT(shared_victims, 0u);
  EXPECT_EQ(plan.pages_freed, plan.victims.size() - shared_victims);

  const std::size_t free_before = f.pool.free_blocks();
  const auto released = f.mgr.commit(plan, f.pool, md::identity_id{});
  EXPECT_EQ(f.pool.free_blocks() - free_before, plan.pages_freed);
  EXPECT_EQ(released.at(2).freed->size(), plan.pages_freed);
  EXPECT_EQ(released.at(2).removed.size(), plan.victims.size()) << "shared victims are removed, not freed";
  EXPECT_TRUE(f.pool.consistent());
  EXPECT_EQ(f.mgr.at(2).num_pages(), 4u);
}

TEST(ManagerShared, MarkSharedFromRejectsATableThatDisagreesChangingNothing) {
  fixture f;
  f.open(1, 3, 0);
  f.mgr.set_shared(1, std::vector<std::size_t>{2});
  f.pool.append_tokens(1, P);  // the pool now holds one page more than the sequence
  EXPECT_THROW(f.mgr.mark_shared_from(f.pool, md::identity_id{}), md::usage_error);
  EXPECT_EQ(f.mgr.shared_pages(1), std::vector<std::size_t>{2});
}

TEST(ManagerSelection, ACallerRequestFreesPagesOnTopOfTheBudgets) {
  fixture f;
  f.open(1, 5, 0);
  f.open(2, 5, 1);
  f.mgr.advance_to(30);
  const auto plan = f.mgr.select_global(3);
  EXPECT_EQ(plan.pages_freed, 3u);
  for (const auto& v : plan.victims) EXPECT_EQ(v.reason, md::eviction_reason::requested);
  const auto too_much = f.mgr.select_global(25);
  EXPECT_EQ(too_much.pages_freed, 10u);
  EXPECT_EQ(too_much.pages_short, 15u);
}

TEST(ManagerSelection, PinnedPagesAreNeverSelectedAndAnUnreachableBudgetIsReported) {
  fixture f(md::global_budget::pages(2));
  auto& seq = f.mgr.open(1, unlimited_config());
  f.pool.open(1);
  seq.append(md::regions::system, 4 * P);  // pinned
  seq.append(md::regions::scratchpad, 2 * P);
  f.pool.append_tokens(1, seq.kv_len());
  f.mgr.advance_to(5);
  const auto plan = f.mgr.select_global();
  EXPECT_EQ(plan.plans.at(1).pages, (std::vector<std::size_t>{4, 5}));
  EXPECT_EQ(plan.pages_short, 2u);
}

TEST(ManagerCommit, AppliesEveryPlanAndReturnsTheFreedBlocks) {
  fixture f(md::global_budget::pages(12, 9));
  f.open(1, 5, 0);
  f.open(2, 5, 1);
  f.open(3, 5, 2);
  f.mgr.advance_to(30);
  const auto plan = f.mgr.select_global();
  ASSERT_EQ(plan.pages_freed, 6u);
  std::map<std::uint64_t, std::vector<std::int32_t>> expected;
  for (const auto& [id, p] : plan.plans)
    for (std::size_t page : p.pages) expected[id].push_back(f.pool.page_at(id, page));
  const auto released = f.mgr.commit(plan, f.pool, md::identity_id{});
  ASSERT_EQ(released.size(), expected.size());
  for (const auto& [id, removal] : released) {
    EXPECT_EQ(removal.removed, expected.at(id)) << "sequence " << id;
    EXPECT_EQ(removal.freed, expected.at(id)) << "sequence " << id << ": nothing is shared";
  }
  EXPECT_EQ(f.mgr.resident_pages(), 9u);
  for (auto id : f.mgr.ids()) EXPECT_EQ(f.pool.num_pages(id), f.mgr.at(id).num_pages());
  EXPECT_TRUE(f.pool.consistent());
  EXPECT_THROW(f.mgr.commit(plan, f.pool, md::identity_id{}), md::usage_error) << "a plan commits once";
}

TEST(ManagerCommit, IsAllOrNothingAcrossSequences) {
  fixture f(md::global_budget::pages(8, 6));
  f.open(1, 5, 0);
  f.open(2, 5, 1);
  f.mgr.advance_to(30);
  const auto plan = f.mgr.select_global();
  ASSERT_EQ(plan.plans.size(), 2u);
  f.mgr.at(2).append(md::regions::user, 1);  // sequence 2 moves on: its plan is stale; sequence 1's is not
  f.pool.append_tokens(2, 1);
  const auto digest = f.mgr.digest();
  const auto pool_before = pool_snapshot(f.pool, {1, 2});
  EXPECT_THROW(f.mgr.commit(plan, f.pool, md::identity_id{}), md::usage_error);
  EXPECT_EQ(f.mgr.digest(), digest);
  EXPECT_EQ(pool_snapshot(f.pool, {1, 2}), pool_before);
  EXPECT_THROW(f.mgr.commit(plan), md::usage_error);
  EXPECT_EQ(f.mgr.digest(), digest);
}

TEST(ManagerCommit, ATableThatRefusesOneSequenceChangesNoSequence) {
  fixture f(md::global_budget::pages(8, 6));
  f.open(1, 5, 0);
  f.open(2, 5, 1);
  f.mgr.advance_to(30);
  const auto plan = f.mgr.select_global();
  ASSERT_EQ(plan.plans.size(), 2u);
  f.pool.close(2);  // the engine lost sequence 2
  f.pool.open(2);
  const auto digest = f.mgr.digest();
  const auto pool_before = pool_snapshot(f.pool, {1, 2});
  EXPECT_THROW(f.mgr.commit(plan, f.pool, md::identity_id{}), md::usage_error);
  EXPECT_EQ(f.mgr.digest(), digest);
  EXPECT_EQ(pool_snapshot(f.pool, {1, 2}), pool_before);
}

TEST(ManagerCommit, MapsManagerIdsToTheRowsOfABatchTable) {
  md::manager mgr({.page_size = P, .global = md::global_budget::pages(5, 4)});
  fill(mgr.open(700, unlimited_config()), 3, 0);
  fill(mgr.open(500, unlimited_config()), 3, 1);
  mgr.advance_to(30);
  // Batch rows: request 500 is row 0, request 700 row 1.
  std::vector<std::int32_t> indptr{0, 3, 6}, indices{10, 11, 12, 20, 21, 22}, last{P, P};
  md::flashinfer_csr csr(indptr, indices, last, P, 64);
  const auto row_of = [](std::uint64_t id) { return id == 500 ? std::size_t{0} : std::size_t{1}; };
  const auto plan = mgr.select_global();
  ASSERT_EQ(plan.pages_freed, 2u);
  const auto removed = mgr.commit(plan, csr, row_of);
  std::size_t total = 0;
  for (const auto& [id, removal] : removed) total += removal.removed.size();
  EXPECT_EQ(total, 2u);
  EXPECT_EQ(csr.num_pages(0), mgr.at(500).num_pages());
  EXPECT_EQ(csr.num_pages(1), mgr.at(700).num_pages());
  EXPECT_EQ(indptr.back(), 4);
}

TEST(ManagerPrefixCache, BoundaryIsTheFirstEvictedOriginalPage) {
  fixture f;
  f.open(1, 6, 0);
  f.mgr.advance_to(30);
  EXPECT_FALSE(f.mgr.prefix_cache_boundary(1));
  EXPECT_EQ(f.mgr.prefix_cacheable_tokens(1), 6 * P);
  const std::size_t victims[] = {2, 4};
  md::eviction_plan<float> plan = f.mgr.select(1, 0);
  plan.pages.assign(std::begin(victims), std::end(victims));
  f.mgr.commit(1, plan, f.pool, md::identity_id{});
  EXPECT_EQ(f.mgr.prefix_cache_boundary(1), 2u);
  EXPECT_EQ(f.mgr.prefix_cacheable_tokens(1), 2 * P);
  EXPECT_THROW((void)f.mgr.prefix_cache_boundary(2), md::usage_error);
}

}  // namespace

namespace {

// A brute-force oracle for select_global on random scenarios: pass 1 is each sequence's own select_for_budget with
// its protections; pass 2 ranks every other evictable, unshared page of every sequence by (score, tie hash, id,
// page), while the physical blocks (private pages and each shared block once) exceed the global budget.
TEST(ManagerSelection, MatchesABruteForceOracleOnRandomScenarios) {
  std::uint64_t state = 12345;
  const auto next = [&state](std::uint64_t n) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (state >> 33) % n;
  };
  std::size_t total_victims = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const std::size_t high = 8 + next(16);
    md::manager mgr({.page_size = P, .global = md::global_budget::pages(high, high - next(8))});
    md::block_pool<> pool(1024, P);
    const std::size_t num_sequences = 1 + next(5);
    for (std::size_t s = 0; s < num_sequences; ++s) {
      const std::uint64_t id = next(1000);
      if (mgr.contains(id)) continue;
      md::config cfg{.page_size = P, .protection = {.sink_pages = next(2), .recent_tokens = next(3) * 8}};
      if (next(3) == 0) cfg.budget = md::budget_config::tokens(static_cast<double>(40 + next(100)));
      auto& seq = mgr.open(id, cfg);
      pool.open(id);
      const std::size_t segments = 1 + next(6);
      for (std::size_t k = 0; k < segments; ++k) seq.append(static_cast<md::region_id>(next(7)), 1 + next(40));
      pool.append_tokens(id, seq.kv_len());
    }
    mgr.advance_to(static_cast<md::step_t>(next(80)));
    for (auto id : mgr.ids()) {
      auto& seq = mgr.at(id);
      std::vector<float> mass(seq.kv_len());
      for (auto& m : mass) m = static_cast<float>(next(4)) * 0.01f;  // coarse values: many exact ties
      seq.observe_tokens(mass);
      if (next(2)) mgr.protect_pages(id, std::vector<std::size_t>{next(seq.num_pages())});
      if (next(2)) mgr.set_shared(id, std::vector<std::size_t>{next(seq.num_pages())});
      if (next(3) == 0) mgr.protect_tail_tokens(id, next(20));
    }

    using md::policy_support::splitmix64;
    const auto tie = [&](std::uint64_t id, std::size_t p) {
      return splitmix64(splitmix64(id) ^ mgr.at(id).state().page_origins()[p]);
    };
    std::vector<md::global_victim<float, std::uint64_t>> expected;
    std::vector<std::tuple<float, std::uint64_t, std::uint64_t, std::size_t>> rest;
    std::size_t reclaimable = 0, freed = 0, shared_blocks = 0;
    for (auto id : mgr.ids()) {
      const auto& seq = mgr.at(id);
      const auto shared = mgr.shared_pages(id);
      const auto is_shared = [&](std::size_t p) { return std::binary_search(shared.begin(), shared.end(), p); };
      shared_blocks += shared.size();  // set_shared: each flagged page its own block
      const auto own = seq.select_for_budget(mgr.protected_pages(id));
      for (std::size_t k = 0; k < own.pages.size(); ++k) {
        expected.push_back(
            {id, own.pages[k], own.scores[k], is_shared(own.pages[k]), md::eviction_reason::sequence_budget});
        freed += !is_shared(own.pages[k]);
      }
      const auto scores = seq.page_scores();
      const auto status = seq.page_statuses(mgr.protected_pages(id));
      for (std::size_t p = 0; p < scores.size(); ++p) {
        reclaimable += !is_shared(p);
        if (status[p] == md::page_status::evictable && !is_shared(p) &&
            !std::binary_search(own.pages.begin(), own.pages.end(), p))
          rest.emplace_back(scores[p], tie(id, p), id, p);
      }
    }
    std::sort(rest.begin(), rest.end());
    const std::size_t after = reclaimable + shared_blocks - freed;
    const std::size_t need = after > mgr.get_config().global.high ? after - mgr.get_config().global.low : 0;
    for (std::size_t k = 0; k < std::min(need, rest.size()); ++k)
      expected.push_back({std::get<2>(rest[k]), std::get<3>(rest[k]), std::get<0>(rest[k]), false,
                          md::eviction_reason::global_budget});
    std::sort(expected.begin(), expected.end(), [&](const auto& a, const auto& b) {
      return std::tuple(a.score, tie(a.sequence, a.page), a.sequence, a.page) <
             std::tuple(b.score, tie(b.sequence, b.page), b.sequence, b.page);
    });

    const auto plan = mgr.select_global();
    ASSERT_EQ(plan.victims, expected) << "trial " << trial;
    EXPECT_EQ(plan.pages_short, need - std::min(need, rest.size())) << "trial " << trial;
    total_victims += plan.victims.size();

    const std::size_t resident = mgr.resident_pages();
    mgr.commit(plan, pool, md::identity_id{});
    EXPECT_EQ(mgr.resident_pages(), resident - plan.victims.size());
    EXPECT_TRUE(pool.consistent());
    for (auto id : mgr.ids()) EXPECT_EQ(pool.num_pages(id), mgr.at(id).num_pages()) << "trial " << trial;
  }
  EXPECT_GT(total_victims, 100u) << "the scenarios must evict";
}

}  // namespace

// --- hazards an integrator hit, each fixed --------------------------------------------------------------------

template <class Manager, class Plan, class Table>
concept commits_without_a_map = requires(Manager& m, const Plan& p, Table& t) {
  m.commit(p, t);
};
template <class Manager, class Table>
concept marks_without_a_map = requires(Manager& m, Table& t) {
  m.mark_shared_from(t);
};

TEST(ManagerHazards, EveryTableCommitNamesItsIdMap) {
  // The default identity map let commit remove another request's block when the counts happened to agree.
  static_assert(!commits_without_a_map<md::manager, md::manager::global_plan_type, md::block_pool<>>);
  static_assert(!marks_without_a_map<md::manager, md::block_pool<>>);
  static_assert(commits_without_a_map<md::manager, md::manager::global_plan_type, md::block_pool<>> == false);
}

TEST(ManagerHazards, ASequenceOpenedMidRunStartsAtTheManagersClock) {
  md::manager mgr({.page_size = P});
  mgr.advance_to(500);
  auto& late = mgr.open(7, unlimited_config());
  EXPECT_EQ(late.now(), 500u);
  EXPECT_EQ(mgr.now(), 500u);
  late.append(md::regions::scratchpad, 2 * P);
  for (md::step_t t : late.policy().last_refresh()) EXPECT_EQ(t, 500u) << "a new token looked stale";
  EXPECT_THROW(mgr.advance_to(499), md::input_error);
}

TEST(ManagerHazards, AManagedSequenceCannotCommitAroundTheManager) {
  fixture f;
  auto& seq = f.open(1, 6, 0);
  f.mgr.protect_pages(1, std::vector<std::size_t>{2});
  auto plan = seq.select(0);
  plan.pages = {2};
  EXPECT_TRUE(seq.managed());
  EXPECT_THROW(seq.commit(plan), md::usage_error) << "mgr.at(id).commit bypassed the per-step protection";
  EXPECT_THROW(seq.commit(plan, f.pool, 1), md::usage_error);
  const std::string message = [&] {
    try {
      f.mgr.commit(1, plan, f.pool, md::identity_id{});
    } catch (const md::usage_error& e) {
      return std::string(e.what());
    }
    return std::string();
  }();
  EXPECT_NE(message.find("commit: sequence 1"), std::string::npos) << message;
  EXPECT_NE(message.find("protected"), std::string::npos) << message;
  EXPECT_EQ(seq.num_pages(), 6u);
  auto copy = seq;  // a copy is the caller's own
  EXPECT_FALSE(copy.managed());
  EXPECT_NO_THROW(copy.commit(plan));
}

TEST(ManagerHazards, ErrorsNameTheCallAndTheRequest) {
  fixture f;
  auto& seq = f.open(42, 6, 0);
  auto plan = f.mgr.select(42, 2);
  seq.append(md::regions::user, 1);  // the plan is stale now
  f.pool.append_tokens(42, 1);
  try {
    f.mgr.commit(42, plan, f.pool, md::identity_id{});
    FAIL() << "a stale plan was committed";
  } catch (const md::usage_error& e) {
    EXPECT_NE(std::string(e.what()).find("commit: sequence 42: stale plan"), std::string::npos) << e.what();
  }
  try {
    f.mgr.protect_pages(9, std::vector<std::size_t>{0});
    FAIL();
  } catch (const md::usage_error& e) {
    EXPECT_NE(std::string(e.what()).find("protect_pages: sequence 9 is not open"), std::string::npos) << e.what();
  }
}

TEST(ManagerHazards, EqualScoresSpreadOverTheSequences) {
  // Identical, unobserved sequences tie everywhere; the order (score, id, page) took all 64 victims from the
  // lowest id. The tie hash spreads them, and the spread is the same on every rank.
  auto victims_per_sequence = [] {
    md::manager mgr({.page_size = P, .global = md::global_budget::pages(4 * 40 - 64)});
    for (std::uint64_t id = 0; id < 4; ++id) mgr.open(id, unlimited_config()).append(md::regions::tool_out, 40 * P);
    const auto plan = mgr.select_global();
    std::vector<std::size_t> count(4, 0);
    for (const auto& v : plan.victims) ++count[v.sequence];
    EXPECT_EQ(plan.victims.size(), 64u);
    return count;
  };
  const auto count = victims_per_sequence();
  for (std::size_t c : count) {
    EXPECT_GT(c, 4u) << "ties still go to one sequence";
    EXPECT_LT(c, 40u);
  }
  EXPECT_EQ(count, victims_per_sequence());
}

TEST(ManagerFork, TheChildInheritsLayoutHolesAndPolicyState) {
  fixture f;
  auto& parent = f.open(1, 8, 0);
  parent.append(md::regions::user, 5);  // a partial last page
  f.pool.append_tokens(1, 5);
  f.mgr.advance_to(20);
  parent.observe_tokens(std::vector<float>(parent.kv_len(), 0.01f));
  f.mgr.commit(1, f.mgr.select(1, 2), f.pool, md::identity_id{});  // holes
  auto& child = f.mgr.fork(1, 2, f.pool, md::identity_id{});
  EXPECT_TRUE(child.managed());
  EXPECT_EQ(child.digest(), parent.digest());
  EXPECT_EQ(child.positions(), parent.positions());
  EXPECT_EQ(f.pool.num_pages(2), child.num_pages());
  // Full pages are shared, block for block; the partial page is the child's own.
  for (std::size_t p = 0; p + 1 < child.num_pages(); ++p) {
    EXPECT_EQ(f.pool.page_at(2, p), f.pool.page_at(1, p));
    EXPECT_EQ(f.pool.ref_count(f.pool.page_at(1, p)), 2u);
  }
  EXPECT_NE(f.pool.page_at(2, child.num_pages() - 1), f.pool.page_at(1, parent.num_pages() - 1));
  EXPECT_EQ(f.mgr.shared_pages(2).size(), child.num_pages() - 1);
  EXPECT_EQ(f.mgr.physical_pages(), f.pool.used_blocks());
  EXPECT_EQ(f.mgr.resident_pages(), 2 * parent.num_pages());
  EXPECT_THROW(f.mgr.fork(1, 2), md::usage_error) << "the child is open already";
  EXPECT_THROW(f.mgr.fork(3, 4), md::usage_error) << "no such parent";
  // From here the same calls give the same victims.
  f.mgr.advance_to(40);
  for (auto* s : {&parent, &child}) s->observe_tokens(std::vector<float>(s->kv_len(), 0.02f));
  EXPECT_EQ(f.mgr.select(1, 3).pages, f.mgr.select(2, 3).pages);
}

TEST(ManagerFork, TheGlobalBudgetCountsASharedBlockOnce) {
  // Before, shared pages were simply not counted: during a fork the physical blocks went over `high` unnoticed.
  fixture f(md::global_budget::pages(14, 12));
  f.open(1, 10, 0);
  f.mgr.fork(1, 2, f.pool, md::identity_id{});
  auto& child = f.mgr.at(2);
  child.append(md::regions::scratchpad, 6 * P);  // six pages of the child's own
  f.pool.append_tokens(2, 6 * P);
  EXPECT_EQ(f.mgr.physical_pages(), 16u);
  EXPECT_EQ(f.mgr.physical_pages(), f.pool.used_blocks());
  EXPECT_EQ(f.mgr.reclaimable_pages(), 6u);
  const auto plan = f.mgr.select_global();
  EXPECT_EQ(plan.pages_freed, 4u) << "from 16 blocks down to the low watermark, 12";
  for (const auto& v : plan.victims) {
    EXPECT_EQ(v.sequence, 2u) << "only the child's own pages free memory";
    EXPECT_FALSE(v.shared);
  }
  f.mgr.commit(plan, f.pool, md::identity_id{});
  EXPECT_EQ(f.mgr.physical_pages(), 12u);
  EXPECT_EQ(f.pool.used_blocks(), 12u);
  // Closing the parent leaves the child the only holder: its pages are its own again.
  f.mgr.close(1);
  f.pool.close(1);
  EXPECT_TRUE(f.mgr.shared_pages(2).empty());
  EXPECT_EQ(f.mgr.physical_pages(), f.pool.used_blocks());
}
