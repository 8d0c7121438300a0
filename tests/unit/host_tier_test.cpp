// tiers/host_tier.hpp through basic_sequence: demotion plans, the region rule, the host budget, observations over
// device tokens, the device page table, recall plans with room, swaps and hysteresis, and every bad input.
#include <gtest/gtest.h>

#include <memdecay/core/sequence.hpp>
#include <memdecay/exports/llama_cpp.hpp>
#include <memdecay/io/snapshot.hpp>
#include <memdecay/page_tables/block_pool.hpp>
#include <memdecay/tiers/host_tier.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

namespace md = memdecay;
namespace r = memdecay::regions;

namespace {

constexpr std::size_t P = 4;

md::config tier_config(double budget_pages) {
  return md::config{.alpha = 1.0,
                    .page_size = P,
                    .protection = {.sink_pages = 0, .recent_tokens = P},
                    .budget = md::budget_config::pages(budget_pages)};
}

// A sequence of one system page, then `pages` pages of `region`, one page per step.
md::sequence filled(double budget_pages, std::size_t pages, md::region_id region = r::user) {
  md::sequence seq(tier_config(budget_pages));
  seq.append(r::system, P);
  for (std::size_t p = 0; p < pages; ++p) {
    seq.advance_to(static_cast<md::step_t>(p + 1));
    seq.append(region, P);
  }
  return seq;
}

template <class Error>
void expect_unchanged(md::sequence& seq, const std::function<void()>& call, const char* what) {
  const auto digest = seq.digest();
  const auto generation = seq.generation();
  EXPECT_THROW(call(), Error) << what;
  EXPECT_EQ(seq.digest(), digest) << what;
  EXPECT_EQ(seq.generation(), generation) << what;
}

// One key per token, kv_heads = 1, head_dim = 2: page p's keys all equal (x, y), so its min/max digest is exact.
void set_page_key(md::sequence& seq, std::size_t page, float x, float y) {
  std::vector<float> keys;
  for (std::size_t t = 0; t < P; ++t) keys.insert(keys.end(), {x, y});
  seq.set_page_keys(page, keys);
}

}  // namespace

TEST(HostTier, ConfigErrorsNameTheFieldAndChangeNothing) {
  auto seq = filled(100, 3);
  auto bad = [&](md::host_tier_config c, const char* field) {
    try {
      seq.enable_host_tier(c);
      ADD_FAILURE() << field;
    } catch (const md::config_error& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
    EXPECT_FALSE(seq.has_host_tier());
  };
  bad({.host_budget = md::budget_config::tokens(-1)}, "host_budget.high");
  bad({.host_budget = md::budget_config::pages(std::numeric_limits<double>::infinity())}, "host_budget.high");
  bad({.min_host_priority = std::nan("")}, "min_host_priority");
  bad({.hysteresis = -0.5}, "hysteresis");
  bad({.max_recall_pages = 0}, "max_recall_pages");
}

TEST(HostTier, WithoutATierEveryPageIsOnTheDeviceAndPlansMoveNothing) {
  auto seq = filled(3, 6);
  EXPECT_EQ(seq.device_len(), seq.kv_len());
  EXPECT_EQ(seq.device_pages(), seq.num_pages());
  EXPECT_EQ(seq.residency(2), md::page_residency::device);
  EXPECT_EQ(seq.device_index(2), 2u);
  auto plan = seq.select_for_budget();
  EXPECT_FALSE(plan.pages.empty());
  EXPECT_TRUE(plan.demoted.empty());
  EXPECT_TRUE(plan.host_dropped.empty());
  auto forged = plan;
  forged.demoted = {plan.pages.front()};
  expect_unchanged<md::usage_error>(
      seq, [&] { seq.commit(forged); }, "a demotion without a tier");
  EXPECT_THROW((void)seq.host_tier(), md::usage_error);
  EXPECT_THROW((void)seq.residency(99), md::input_error);
}

TEST(HostTier, VictimsGoToHostKeepTheirPlaceAndLeaveTheObservation) {
  auto seq = filled(4, 8);  // 9 pages held, budget 4
  seq.enable_host_tier({});
  const auto positions = seq.positions();
  const auto plan = seq.select_for_budget();
  ASSERT_EQ(plan.pages.size(), 5u);
  EXPECT_EQ(plan.demoted, plan.pages) << "an unlimited host tier keeps every victim";
  EXPECT_TRUE(plan.host_dropped.empty());
  seq.commit(plan);
  EXPECT_EQ(seq.host_pages(), 5u);
  EXPECT_EQ(seq.num_pages(), 9u);
  EXPECT_EQ(seq.device_pages(), 4u);
  EXPECT_EQ(seq.device_len(), 4 * P);
  EXPECT_EQ(seq.positions(), positions) << "host pages keep their place in the layout";
  EXPECT_EQ(seq.evicted_tokens(), 0u) << "nothing was dropped";
  for (std::size_t p : plan.pages) {
    EXPECT_EQ(seq.residency(p), md::page_residency::host);
    EXPECT_EQ(seq.page_statuses()[p], md::page_status::host);
    EXPECT_THROW((void)seq.device_index(p), md::input_error);
  }
  EXPECT_EQ(seq.pages_wanted_by_budget(), 0u) << "the device is within its budget now";
  EXPECT_EQ(*seq.prefix_cache_boundary(), plan.pages.front());

  // Observations cover the device tokens; host tokens receive nothing.
  std::vector<float> held_mass(seq.kv_len()), wrong(seq.kv_len(), 0.01f);
  expect_unchanged<md::input_error>(
      seq, [&] { seq.observe_tokens(wrong); }, "held-length mass");
  std::vector<float> mass(seq.device_len(), 0.05f);
  const auto ewma_before = std::vector<float>(seq.policy().ewma().begin(), seq.policy().ewma().end());
  seq.observe_tokens(mass);
  const auto ewma = seq.policy().ewma();
  for (std::size_t i = 0; i < seq.kv_len(); ++i) {
    if (seq.residency(i / P) == md::page_residency::host)
      EXPECT_LE(ewma[i], ewma_before[i]) << "host token " << i << " was attended";
    else
      EXPECT_GT(ewma[i], 0.0f) << "device token " << i << " missed its attention";
  }
  std::vector<float> page_mass(seq.device_pages(), 0.1f);
  EXPECT_NO_THROW(seq.observe_pages(page_mass));
  std::vector<float> held_pages(seq.num_pages(), 0.1f);
  expect_unchanged<md::input_error>(
      seq, [&] { seq.observe_pages(held_pages); }, "held-length page mass");
}

TEST(HostTier, TheRegionRuleDropsWhatIsNotWorthTheHost) {
  md::sequence seq(tier_config(2));
  seq.append(r::system, P);
  for (int p = 0; p < 6; ++p) seq.append(p % 2 ? r::scratchpad : r::retrieval, P);
  seq.append(r::user, P);
  seq.enable_host_tier({.min_host_priority = 0.5});  // retrieval 0.6 goes to host, scratchpad 0.3 does not
  const auto plan = seq.select_for_budget();
  ASSERT_FALSE(plan.pages.empty());
  for (std::size_t p : plan.pages) {
    const bool retrieval = seq.state().regions()[p * P] == r::retrieval;
    EXPECT_EQ(std::binary_search(plan.demoted.begin(), plan.demoted.end(), p), retrieval) << "page " << p;
  }
  const std::size_t dropped = plan.pages.size() - plan.demoted.size();
  EXPECT_GT(dropped, 0u);
  seq.commit(plan);
  EXPECT_EQ(seq.host_pages(), plan.demoted.size());
  EXPECT_EQ(seq.evicted_tokens(), dropped * P);
}

TEST(HostTier, AFullHostTierDropsItsLowestScoringPages) {
  auto seq = filled(6, 10);
  seq.enable_host_tier({.host_budget = md::budget_config::pages(2)});
  auto first = seq.select_for_budget();
  ASSERT_EQ(first.pages.size(), 5u);
  EXPECT_EQ(first.demoted.size(), 2u);
  const auto scores = seq.page_scores();
  // The two kept are the two best-scoring victims.
  std::vector<std::size_t> by_score = first.pages;
  std::sort(by_score.begin(), by_score.end(),
            [&](std::size_t a, std::size_t b) { return scores[a] > scores[b] || (scores[a] == scores[b] && a > b); });
  std::vector<std::size_t> best{by_score[0], by_score[1]};
  std::sort(best.begin(), best.end());
  EXPECT_EQ(first.demoted, best);
  seq.commit(first);
  EXPECT_EQ(seq.host_pages(), 2u);
  // Newer, better pages push the older host pages out.
  for (int p = 0; p < 3; ++p) {
    seq.advance_to(seq.now() + 1);
    seq.append(r::user, P);
  }
  seq.advance_to(seq.now() + 200);
  auto second = seq.select_for_budget();
  ASSERT_FALSE(second.pages.empty());
  EXPECT_FALSE(second.host_dropped.empty()) << "the old host pages score below the new victims";
  EXPECT_EQ(seq.host_pages() - second.host_dropped.size() + second.demoted.size(), 2u);
  const auto host_before = seq.host_pages();
  seq.commit(second);
  EXPECT_EQ(seq.host_pages(), std::min<std::size_t>(2, host_before + second.demoted.size()));
}

TEST(HostTier, ForgedAndStalePlansAreRejected) {
  auto seq = filled(4, 8);
  seq.enable_host_tier({});
  auto plan = seq.select_for_budget();
  auto bad = plan;
  bad.demoted = {0};  // the pinned system page: not a victim
  expect_unchanged<md::usage_error>(
      seq, [&] { seq.commit(bad); }, "demotes a page it keeps");
  bad = plan;
  bad.host_dropped = {plan.pages.front()};
  expect_unchanged<md::usage_error>(
      seq, [&] { seq.commit(bad); }, "drops a device page from the host");
  bad = plan;
  bad.demoted = {plan.pages[1], plan.pages[0]};
  expect_unchanged<md::usage_error>(
      seq, [&] { seq.commit(bad); }, "descending demotions");
  seq.advance_to(seq.now() + 1);
  expect_unchanged<md::usage_error>(
      seq, [&] { seq.commit(plan); }, "stale plan");
  seq.commit(seq.select_for_budget());
  auto again = seq.select(1);
  for (std::size_t p : again.pages) EXPECT_EQ(seq.residency(p), md::page_residency::device);
}

// The host budget holds at every commit: a plan that would leave more pages on the host than its budget is refused,
// and so is a host budget shrunk below the pages already there (no plan could then keep the tier within it: a
// recall plan selected right after such a shrink was refused by its own commit; the API fuzzer found it).
TEST(HostTier, TheHostBudgetCannotBeExceededByAPlanOrShrunkBelowTheHostPages) {
  auto seq = filled(4, 8);
  seq.enable_host_tier({.host_budget = md::budget_config::pages(3)});
  const auto plan = seq.select_for_budget();
  ASSERT_EQ(plan.demoted.size(), 3u);
  ASSERT_GT(plan.pages.size(), 3u);
  auto bad = plan;
  bad.demoted = plan.pages;  // every victim to a host tier of 3
  expect_unchanged<md::usage_error>(
      seq, [&] { seq.commit(bad); }, "a plan over the host budget");
  try {
    seq.check_commit(bad);
  } catch (const md::usage_error& e) {
    EXPECT_NE(std::string(e.what()).find("leaves " + std::to_string(plan.pages.size()) + " pages on a host tier of 3"),
              std::string::npos)
        << e.what();
  }
  seq.commit(plan);
  ASSERT_EQ(seq.host_pages(), 3u);
  expect_unchanged<md::config_error>(
      seq, [&] { seq.enable_host_tier({.host_budget = md::budget_config::pages(2)}); }, "a shrink below the host pages");
  try {
    seq.enable_host_tier({.host_budget = md::budget_config::pages(1)});
  } catch (const md::config_error& e) {
    EXPECT_NE(std::string(e.what()).find("host_tier.host_budget.high = 1 holds 1 pages, fewer than the 3"),
              std::string::npos)
        << e.what();
  }
  // To exactly the host pages: allowed, and a recall plan selected then commits (a swap keeps the tier full).
  seq.enable_host_tier({.host_budget = md::budget_config::pages(3)});
  seq.enable_digests({.kv_heads = 1, .head_dim = 2});
  for (std::size_t p = 0; p < seq.num_pages(); ++p) set_page_key(seq, p, seq.residency(p) == md::page_residency::host ? 9.0f : 0.1f, 0.0f);
  const std::vector<float> query{1.0f, 0.0f};
  const auto recall = seq.select_recall(query);
  ASSERT_FALSE(recall.promote.empty());
  EXPECT_NO_THROW(seq.commit_recall(recall));
  EXPECT_LE(seq.host_pages(), 3u);
}

TEST(HostTier, TheDevicePageTableLosesDemotedAndDroppedPagesOnly) {
  auto seq = filled(4, 8);
  seq.enable_host_tier({.host_budget = md::budget_config::pages(3)});
  md::block_pool<> pool(64, P);
  pool.open(0);
  pool.append_tokens(0, seq.kv_len());
  auto plan = seq.select_for_budget();
  const auto removal = seq.commit(plan, pool, 0);
  EXPECT_EQ(removal.removed.size(), plan.pages.size());
  EXPECT_EQ(pool.num_pages(0), seq.device_pages());
  // A second round: the table indices are device indices now.
  for (int p = 0; p < 3; ++p) {
    seq.advance_to(seq.now() + 1);
    seq.append(r::user, P);
    pool.append_tokens(0, P);
  }
  auto next = seq.select_for_budget();
  ASSERT_FALSE(next.pages.empty());
  seq.commit(next, pool, 0);
  EXPECT_EQ(pool.num_pages(0), seq.device_pages());
  EXPECT_TRUE(pool.consistent());
  md::block_pool<> stale(64, P);
  stale.open(0);
  stale.append_tokens(0, seq.kv_len());  // holds the host pages too: disagrees with the device
  seq.advance_to(seq.now() + 1);
  seq.append(r::user, 2 * P);
  stale.append_tokens(0, 2 * P);
  const auto plan3 = seq.select_for_budget();
  expect_unchanged<md::usage_error>(
      seq, [&] { seq.commit(plan3, stale, 0); }, "a table holding host pages");
}

TEST(HostTier, RecallSwapsAPageTheQueryWantsForTheWeakestDevicePageBeyondTheHysteresis) {
  auto seq = filled(6, 8);  // 9 pages; the budget keeps 6
  seq.enable_digests({.kv_heads = 1, .head_dim = 2});
  for (std::size_t p = 0; p < seq.num_pages(); ++p) set_page_key(seq, p, 0.1f * static_cast<float>(p), 0.0f);
  seq.enable_host_tier({.hysteresis = 0.5, .min_device_steps = 3});
  seq.commit(seq.select_for_budget());
  ASSERT_EQ(seq.host_pages(), 3u);
  std::vector<std::size_t> host;
  for (std::size_t p = 0; p < seq.num_pages(); ++p)
    if (seq.residency(p) == md::page_residency::host) host.push_back(p);

  // A query along y: every page bounds 0, no host page beats a device page by the hysteresis.
  const std::vector<float> flat{0.0f, 1.0f};
  EXPECT_TRUE(seq.select_recall(flat).empty());

  // Make one host page the query's: its key points along y.
  set_page_key(seq, host[1], 0.0f, 10.0f);
  auto recall = seq.select_recall(flat);
  ASSERT_EQ(recall.promote, std::vector<std::size_t>{host[1]});
  EXPECT_EQ(recall.promote_bounds.size(), 1u);
  EXPECT_NEAR(recall.promote_bounds[0], 10.0f / std::sqrt(2.0f), 1e-4);
  ASSERT_EQ(recall.demote.size() + recall.drop.size(), 1u) << "the device is full: a swap";
  const std::size_t displaced = recall.demote.empty() ? recall.drop[0] : recall.demote[0];
  EXPECT_EQ(seq.residency(displaced), md::page_residency::device);
  EXPECT_EQ(seq.page_statuses()[displaced], md::page_status::evictable);
  const auto positions = seq.positions();
  seq.commit_recall(recall);
  EXPECT_EQ(seq.residency(host[1]), md::page_residency::device);
  EXPECT_EQ(seq.residency(displaced), md::page_residency::host);
  EXPECT_EQ(seq.positions(), positions) << "a recalled page returns to its place";
  EXPECT_EQ(seq.device_pages(), 6u);
  // The recalled page stays for min_device_steps steps, then may go again.
  EXPECT_EQ(seq.page_statuses()[host[1]], md::page_status::recalled);
  seq.advance_to(seq.now() + 2);
  EXPECT_EQ(seq.page_statuses()[host[1]], md::page_status::recalled);
  seq.advance_to(seq.now() + 1);
  EXPECT_NE(seq.page_statuses()[host[1]], md::page_status::recalled);
  EXPECT_TRUE(seq.select_recall(flat).empty()) << "the same query asks for nothing more";
}

TEST(HostTier, RecallFillsFreeRoomWithoutDisplacingAnything) {
  // Watermarks 6 and 4 pages: eviction goes down to 4, recall may fill up to 6.
  md::sequence seq(md::config{.alpha = 1.0,
                              .page_size = P,
                              .protection = {.sink_pages = 0, .recent_tokens = P},
                              .budget = md::budget_config::pages(6, 4)});
  seq.append(r::system, P);
  for (std::size_t p = 0; p < 8; ++p) {
    seq.advance_to(static_cast<md::step_t>(p + 1));
    seq.append(r::user, P);
  }
  seq.enable_digests({.kv_heads = 1, .head_dim = 2});
  for (std::size_t p = 0; p < seq.num_pages(); ++p) set_page_key(seq, p, 1.0f, static_cast<float>(p));
  seq.enable_host_tier({.max_recall_pages = 1});
  seq.commit(seq.select_for_budget());
  ASSERT_EQ(seq.host_pages(), 5u);  // pages 1..5 (the oldest); 6 and 7 evictable on the device, 8 recent
  const std::vector<float> q{0.0f, 1.0f};
  EXPECT_TRUE(seq.select_recall(q).empty()) << "no host page beats the weakest device page";
  set_page_key(seq, 3, 1.0f, 20.0f);
  set_page_key(seq, 4, 1.0f, 30.0f);
  auto recall = seq.select_recall(q);
  EXPECT_EQ(recall.promote, std::vector<std::size_t>{4}) << "the best first, max_recall_pages = 1";
  EXPECT_TRUE(recall.demote.empty());
  EXPECT_TRUE(recall.drop.empty());
  seq.commit_recall(recall);
  EXPECT_EQ(seq.device_pages(), 5u);
  seq.enable_host_tier({});
  recall = seq.select_recall(q);
  EXPECT_EQ(recall.promote, std::vector<std::size_t>{3}) << "one page of room left";
  EXPECT_TRUE(recall.demote.empty());
  seq.commit_recall(recall);
  EXPECT_EQ(seq.device_pages(), 6u);
  EXPECT_EQ(seq.pages_wanted_by_budget(), 0u) << "recall stays within the high watermark";
}

TEST(HostTier, RecallErrorsChangeNothing) {
  auto seq = filled(4, 8);
  const std::vector<float> q{0.0f, 1.0f};
  EXPECT_THROW((void)seq.select_recall(q), md::usage_error) << "no tier";
  seq.enable_host_tier({});
  EXPECT_THROW((void)seq.select_recall(q), md::usage_error) << "no digests";
  seq.enable_digests({.kv_heads = 1, .head_dim = 2});
  for (std::size_t p = 0; p < seq.num_pages(); ++p) set_page_key(seq, p, 0.0f, static_cast<float>(p % 3));
  seq.commit(seq.select_for_budget());
  EXPECT_THROW((void)seq.select_recall(std::vector<float>{1.0f}), md::input_error) << "short query";
  EXPECT_THROW((void)seq.select_recall(std::vector<float>{1.0f, std::nanf("")}), md::input_error) << "NaN query";
  std::size_t host = 0, device = 0;
  for (std::size_t p = 0; p < seq.num_pages(); ++p) (seq.residency(p) == md::page_residency::host ? host : device) = p;
  md::recall_plan plan = seq.select_recall(q);
  plan.promote = {device};
  plan.promote_bounds = {1.0f};
  expect_unchanged<md::usage_error>(
      seq, [&] { seq.commit_recall(plan); }, "promotes a device page");
  plan = seq.select_recall(q);
  plan.demote = {0};
  expect_unchanged<md::usage_error>(
      seq, [&] { seq.commit_recall(plan); }, "demotes the pinned page");
  plan = seq.select_recall(q);
  plan.drop = {host};
  expect_unchanged<md::usage_error>(
      seq, [&] { seq.commit_recall(plan); }, "drops a host page from the device");
  plan = seq.select_recall(q);
  seq.advance_to(seq.now() + 1);
  plan.promote = {host};
  plan.promote_bounds = {0.0f};
  expect_unchanged<md::usage_error>(
      seq, [&] { seq.commit_recall(plan); }, "stale");
  expect_unchanged<md::usage_error>(
      seq, [&] { seq.disable_host_tier(); }, "host pages would be lost");
}

TEST(HostTier, TheQueryEstimateCoversTheDevicePagesOnly) {
  auto seq = filled(4, 8);
  seq.enable_digests({.kv_heads = 1, .head_dim = 2});
  for (std::size_t p = 0; p < seq.num_pages(); ++p) set_page_key(seq, p, 1.0f, 0.0f);
  seq.enable_host_tier({});
  seq.commit(seq.select_for_budget());
  const std::vector<float> q{1.0f, 0.0f};
  const auto mass = seq.estimate_query_attention(q);
  ASSERT_EQ(mass.size(), seq.device_pages());
  double total = 0;
  for (float m : mass) total += m;
  EXPECT_NEAR(total, 1.0, 1e-5);
  EXPECT_NO_THROW(seq.observe_query(q));
}

TEST(HostTier, SameCallsSameDecisions) {
  auto run = [] {
    auto seq = filled(5, 12);
    seq.enable_digests({.kv_heads = 1, .head_dim = 2});
    for (std::size_t p = 0; p < seq.num_pages(); ++p)
      set_page_key(seq, p, std::sin(static_cast<float>(p)), std::cos(static_cast<float>(p)));
    seq.enable_host_tier({.host_budget = md::budget_config::pages(4), .min_device_steps = 0});
    std::vector<std::vector<std::size_t>> trail;
    for (int round = 0; round < 6; ++round) {
      auto plan = seq.select_for_budget();
      trail.push_back(plan.pages), trail.push_back(plan.demoted), trail.push_back(plan.host_dropped);
      seq.commit(plan);
      const std::vector<float> q{std::cos(static_cast<float>(round)), std::sin(static_cast<float>(round))};
      auto recall = seq.select_recall(q);
      trail.push_back(recall.promote), trail.push_back(recall.demote);
      seq.commit_recall(recall);
      seq.advance_to(seq.now() + 3);
      seq.append(r::tool_out, P);
      set_page_key(seq, seq.num_pages() - 1, 0.5f, 0.5f);
    }
    trail.push_back({static_cast<std::size_t>(seq.digest())});
    return trail;
  };
  EXPECT_EQ(run(), run());
}

TEST(HostTierSnapshot, ATieredSequenceRoundTripsAndDecidesAlike) {
  auto seq = filled(4, 8);
  seq.enable_digests({.kv_heads = 1, .head_dim = 2});
  for (std::size_t p = 0; p < seq.num_pages(); ++p) set_page_key(seq, p, 1.0f, static_cast<float>(p % 3));
  seq.enable_host_tier({.host_budget = md::budget_config::pages(3), .hysteresis = 0.1, .min_device_steps = 2});
  seq.commit(seq.select_for_budget());
  set_page_key(seq, 2, 1.0f, 9.0f);
  const std::vector<float> q{0.0f, 1.0f};
  seq.commit_recall(seq.select_recall(q));
  ASSERT_GT(seq.host_pages(), 0u);
  const auto bytes = md::snapshot::save(seq);
  md::sequence loaded(seq.get_config());
  md::snapshot::load(loaded, bytes);
  EXPECT_EQ(loaded.digest(), seq.digest());
  EXPECT_EQ(loaded.host_pages(), seq.host_pages());
  EXPECT_EQ(loaded.page_statuses(), seq.page_statuses());
  for (md::sequence* s : {&seq, &loaded}) {
    s->advance_to(s->now() + 1);
    s->append(r::tool_out, 3 * P);
  }
  EXPECT_EQ(loaded.select_for_budget().demoted, seq.select_for_budget().demoted);
  EXPECT_EQ(loaded.select_recall(q).promote, seq.select_recall(q).promote);
}

TEST(HostTierSnapshot, CraftedResidenciesAreRejectedByOffsetAndAVersionTwoSnapshotLoadsWithoutATier) {
  auto seq = filled(4, 8);
  seq.enable_host_tier({});
  seq.commit(seq.select_for_budget());
  seq.append(r::user, 1);  // a partial last page
  const auto bytes = md::snapshot::save(seq);
  const std::size_t pages = seq.num_pages();
  // The section ends with the host flags (a byte per page) and the recall steps (4 bytes per page).
  const std::size_t flags_at = bytes.size() - pages * 5;
  auto expect_rejected = [&](std::vector<std::byte> b, const std::string& needle) {
    md::detail::seal_snapshot(b);
    md::sequence target(seq.get_config());
    const auto before = target.digest();
    try {
      md::snapshot::load(target, b);
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const md::input_error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("offset"), std::string::npos) << e.what();
    }
    EXPECT_EQ(target.digest(), before);
  };
  auto b = bytes;
  b[flags_at] = std::byte{1};  // the pinned system page on the host
  expect_rejected(b, "holds a pinned token");
  b = bytes;
  b[flags_at + pages - 1] = std::byte{1};  // the last page: partial
  expect_rejected(b, "not full");
  b = bytes;
  b[flags_at + 2] = std::byte{2};
  expect_rejected(b, "host flag 2");
  b = bytes;
  b[flags_at + pages + 4 * 3] = std::byte{0};  // page 3 (on the host) recalled at step 0
  b[flags_at + pages + 4 * 3 + 1] = std::byte{0};
  b[flags_at + pages + 4 * 3 + 2] = std::byte{0};
  b[flags_at + pages + 4 * 3 + 3] = std::byte{0};
  expect_rejected(b, "on the host and recalled");
  // More host pages than the tier's budget holds: every full unpinned page on the host, under a budget of 1 page.
  {
    md::sequence small = filled(4, 8);
    small.enable_host_tier({.host_budget = md::budget_config::pages(1)});
    small.commit(small.select_for_budget());
    ASSERT_EQ(small.host_pages(), 1u);
    auto c = md::snapshot::save(small);
    const std::size_t small_flags = c.size() - small.num_pages() * 5;
    for (std::size_t p = 1; p + 1 < small.num_pages(); ++p)
      if (c[small_flags + p] == std::byte{0} && small.residency(p) == md::page_residency::device) {
        c[small_flags + p] = std::byte{1};
        break;
      }
    md::detail::seal_snapshot(c);
    md::sequence target(small.get_config());
    const auto before = target.digest();
    try {
      md::snapshot::load(target, c);
      ADD_FAILURE() << "accepted a host tier over its budget";
    } catch (const md::input_error& e) {
      EXPECT_NE(std::string(e.what()).find("2 pages on the host, more than its budget holds (1)"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("offset"), std::string::npos) << e.what();
    }
    EXPECT_EQ(target.digest(), before);
  }

  // Version 2: no host-tier section.
  md::sequence plain = filled(4, 8);
  auto v2 = md::snapshot::save(plain);
  ASSERT_EQ(v2.back(), std::byte{0});
  v2.pop_back();
  v2[8] = std::byte{2};
  md::detail::seal_snapshot(v2);
  md::sequence target(plain.get_config());
  target.enable_host_tier({});
  md::snapshot::load(target, v2);
  EXPECT_FALSE(target.has_host_tier());
  EXPECT_EQ(target.digest(), plain.digest());
}

TEST(HostTier, DisplaceLowestLetsOnlyTheLowestScoringDevicePagesMakeRoom) {
  auto seq = filled(6, 8);  // 9 pages; the budget keeps 6, so every promotion must displace a page
  seq.enable_host_tier({.min_device_steps = 0});
  seq.commit(seq.select_for_budget());
  ASSERT_EQ(seq.host_pages(), 3u);
  const std::size_t n = seq.num_pages();
  // The query wants the host pages back; the device pages' bounds fall with the index (the newest bound lowest),
  // while their scores rise with it (the oldest decayed most).
  std::vector<float> bounds(n);
  for (std::size_t p = 0; p < n; ++p)
    bounds[p] = seq.residency(p) == md::page_residency::host ? 9.0f : static_cast<float>(n - p);
  const auto scores = seq.page_scores();
  const auto status = seq.page_statuses();
  std::vector<std::size_t> evictable;
  for (std::size_t p = 0; p < n; ++p)
    if (status[p] == md::page_status::evictable) evictable.push_back(p);
  std::stable_sort(evictable.begin(), evictable.end(),
                   [&](std::size_t a, std::size_t b) { return scores[a] < scores[b]; });
  ASSERT_GE(evictable.size(), 4u);
  const std::vector<std::size_t> lowest(evictable.begin(), evictable.begin() + 2);
  auto displaced = [](const md::recall_plan& plan) {
    std::vector<std::size_t> out;
    std::merge(plan.demote.begin(), plan.demote.end(), plan.drop.begin(), plan.drop.end(), std::back_inserter(out));
    return out;
  };
  const auto any = displaced(seq.select_recall_for_bounds(bounds));
  ASSERT_FALSE(any.empty());
  EXPECT_TRUE(std::any_of(any.begin(), any.end(), [&](std::size_t p) {
    return std::find(lowest.begin(), lowest.end(), p) == lowest.end();
  })) << "without the rule the query's lowest bounds go, not the lowest scores";
  seq.enable_host_tier({.min_device_steps = 0, .displace_lowest = 2});
  const auto ruled = seq.select_recall_for_bounds(bounds);
  ASSERT_EQ(displaced(ruled).size(), 2u) << "two pages may make room, and both are worse than every host page";
  for (std::size_t p : displaced(ruled))
    EXPECT_NE(std::find(lowest.begin(), lowest.end(), p), lowest.end()) << "page " << p << " is not among the 2 lowest";
  EXPECT_EQ(ruled.promote.size(), 2u);
  seq.commit_recall(ruled);
  EXPECT_EQ(seq.device_pages(), 6u);
}

TEST(HostTierSnapshot, TheDisplaceLowestRuleRoundTripsAndAVersionThreeSnapshotLoadsWithoutIt) {
  auto seq = filled(4, 8);
  seq.enable_host_tier({.displace_lowest = 3});
  seq.commit(seq.select_for_budget());
  const auto bytes = md::snapshot::save(seq);
  md::sequence back(seq.get_config());
  md::snapshot::load(back, bytes);
  EXPECT_EQ(back.host_tier().config().displace_lowest, 3u);
  EXPECT_EQ(back.digest(), seq.digest());
  // Version 3: the same section without the rule's 8 bytes (before the page count, the flags and recall steps).
  auto v3 = bytes;
  const std::size_t rule_at = v3.size() - seq.num_pages() * 5 - 16;
  v3.erase(v3.begin() + static_cast<std::ptrdiff_t>(rule_at), v3.begin() + static_cast<std::ptrdiff_t>(rule_at + 8));
  v3[8] = std::byte{3};
  md::detail::seal_snapshot(v3);
  md::sequence old(seq.get_config());
  md::snapshot::load(old, v3);
  EXPECT_EQ(old.host_tier().config().displace_lowest, 0u);
  EXPECT_EQ(old.host_pages(), seq.host_pages());
  seq.enable_host_tier({.displace_lowest = 0});
  EXPECT_EQ(old.digest(), seq.digest());
}

namespace {
// A tiered sequence whose pages have two query heads' digests that rank the pages differently, half on the host.
md::sequence two_head_tier() {
  auto seq = filled(4, 10);
  seq.enable_digests({.kv_heads = 1, .head_dim = 2, .query_heads = 2});
  for (std::size_t p = 0; p < seq.num_pages(); ++p)
    set_page_key(seq, p, std::sin(static_cast<float>(3 * p)), std::cos(static_cast<float>(5 * p)));
  seq.enable_host_tier({.hysteresis = 0.05});
  seq.commit(seq.select_for_budget());
  return seq;
}
// Two recall plans are the same decision: the same promotions (and their bounds), demotions and drops.
void expect_same_plan(const md::recall_plan& got, const md::recall_plan& want) {
  EXPECT_EQ(got.promote, want.promote);
  EXPECT_EQ(got.promote_bounds, want.promote_bounds);
  EXPECT_EQ(got.demote, want.demote);
  EXPECT_EQ(got.drop, want.drop);
}
}  // namespace

TEST(HostTier, RecallFromTheEnginesBoundsEqualsRecallFromTheQuery) {
  auto seq = two_head_tier();
  const std::vector<float> q{1.0f, 0.2f, -0.3f, 0.9f};  // two query heads
  std::vector<float> per_head(2 * seq.num_pages()), best(seq.num_pages());
  seq.query_page_bounds(q, per_head);
  for (std::size_t p = 0; p < best.size(); ++p) best[p] = std::max(per_head[p], per_head[seq.num_pages() + p]);
  const auto from_query = seq.select_recall(q);
  const auto from_bounds = seq.select_recall_for_bounds(best);
  EXPECT_FALSE(from_query.empty());
  expect_same_plan(from_bounds, from_query);
  best.pop_back();
  EXPECT_THROW((void)seq.select_recall_for_bounds(best), md::input_error);
  best.push_back(std::nanf(""));
  EXPECT_THROW((void)seq.select_recall_for_bounds(best), md::input_error);
}

// head_bounds::mean ranks pages by the mean of their query heads' bounds: the plan is the one the engine's own
// per-page means give, and it differs from the best-head rule where one head alone favours a page.
TEST(HostTier, RecallByTheMeanOverHeadsEqualsRecallFromTheMeanBounds) {
  auto seq = two_head_tier();
  const std::vector<float> q{1.0f, 0.2f, -0.3f, 0.9f};  // two query heads
  const std::size_t n = seq.num_pages();
  std::vector<float> per_head(2 * n), mean(n), best(n);
  seq.query_page_bounds(q, per_head);
  for (std::size_t p = 0; p < n; ++p) {
    mean[p] = static_cast<float>((static_cast<double>(per_head[p]) + per_head[n + p]) / 2.0);
    best[p] = std::max(per_head[p], per_head[n + p]);
  }
  const auto by_mean = seq.select_recall(q, {}, md::head_bounds::mean);
  const auto from_means = seq.select_recall_for_bounds(mean);
  EXPECT_FALSE(by_mean.empty());
  expect_same_plan(by_mean, from_means);
  EXPECT_EQ(seq.select_recall(q, {}, md::head_bounds::max).promote, seq.select_recall_for_bounds(best).promote);
  // The two rules rank these pages differently, so the test above tells them apart.
  std::vector<std::size_t> order_mean(n), order_best(n);
  for (std::size_t p = 0; p < n; ++p) order_mean[p] = order_best[p] = p;
  std::stable_sort(order_mean.begin(), order_mean.end(), [&](auto a, auto b) { return mean[a] > mean[b]; });
  std::stable_sort(order_best.begin(), order_best.end(), [&](auto a, auto b) { return best[a] > best[b]; });
  EXPECT_NE(order_mean, order_best);
}

// head_bounds::attention ranks pages by the log of their estimated attention mass (each head's softmax over the
// pages' bounds, averaged over the heads: query_signal.hpp's bound_softmax): the plan is the one those log masses
// give, and a head whose bounds are all alike weighs less than one that singles out a page.
TEST(HostTier, RecallByEstimatedAttentionEqualsRecallFromTheLogMass) {
  auto seq = two_head_tier();
  const std::vector<float> q{1.0f, 0.2f, -0.3f, 0.9f};  // two query heads
  const std::size_t n = seq.num_pages();
  std::vector<float> per_head(2 * n), log_mass(n), best(n);
  seq.query_page_bounds(q, per_head);
  std::vector<double> mass(n);
  md::estimate_page_attention<double>(per_head, 2, std::vector<std::uint32_t>(n, 1), md::query_signal::bound_softmax,
                                      1.0, mass);
  for (std::size_t p = 0; p < n; ++p) {
    log_mass[p] = static_cast<float>(std::log(mass[p]));
    best[p] = std::max(per_head[p], per_head[n + p]);
  }
  const auto by_attention = seq.select_recall(q, {}, md::head_bounds::attention);
  const auto from_mass = seq.select_recall_for_bounds(log_mass);
  EXPECT_FALSE(by_attention.empty());
  expect_same_plan(by_attention, from_mass);
  for (float b : by_attention.promote_bounds) EXPECT_LE(b, 0.0f);  // log of a mass <= 1

  // Two heads, four pages: head 0 bounds every page alike but page 0 by a little; head 1 singles out page 3. The
  // best-head rule prefers page 0 (its bound is the largest anywhere); the attention mass prefers page 3.
  const std::vector<float> bounds{10.0f, 9.9f, 9.9f, 9.9f, 0.0f, 0.0f, 0.0f, 6.0f};
  std::vector<double> m(4);
  md::estimate_page_attention<double>(bounds, 2, std::vector<std::uint32_t>(4, 1), md::query_signal::bound_softmax,
                                      1.0, m);
  EXPECT_GT(m[3], m[0]);
  EXPECT_GT(std::max(bounds[0], bounds[4]), std::max(bounds[3], bounds[7]));
}

TEST(HostTier, ARecallWithTheDeviceTableInsertsThePromotedPagesAtTheirPlace) {
  auto seq = filled(6, 8);
  seq.enable_digests({.kv_heads = 1, .head_dim = 2});
  for (std::size_t p = 0; p < seq.num_pages(); ++p) set_page_key(seq, p, 0.1f * static_cast<float>(p), 0.0f);
  seq.enable_host_tier({});
  md::block_pool<> pool(seq.num_pages() + 1, P);
  pool.open(0);
  pool.append_tokens(0, seq.kv_len());
  seq.commit(seq.select_for_budget(), pool, 0);
  ASSERT_EQ(seq.host_pages(), 3u);
  std::vector<std::size_t> host;
  for (std::size_t p = 0; p < seq.num_pages(); ++p)
    if (seq.residency(p) == md::page_residency::host) host.push_back(p);
  set_page_key(seq, host[0], 0.0f, 10.0f);
  set_page_key(seq, host[2], 0.0f, 8.0f);
  const std::vector<float> q{0.0f, 1.0f};
  const auto recall = seq.select_recall(q);
  ASSERT_EQ(recall.promote, (std::vector<std::size_t>{host[0], host[2]}));
  ASSERT_EQ(recall.demote.size(), 2u);
  const auto before = std::vector<std::int32_t>(pool.block_table(0).begin(), pool.block_table(0).end());
  std::vector<std::int32_t> kept;  // the device pages that stay, in order
  for (std::size_t p = 0, d = 0; p < seq.num_pages(); ++p) {
    if (seq.residency(p) == md::page_residency::host) continue;
    if (!std::binary_search(recall.demote.begin(), recall.demote.end(), p)) kept.push_back(before[d]);
    ++d;
  }
  const auto done = seq.commit_recall(recall, pool, 0);
  ASSERT_EQ(done.inserted.size(), 2u);
  EXPECT_EQ(done.removed.removed.size(), 2u);
  EXPECT_EQ(pool.num_pages(0), seq.device_pages());
  EXPECT_TRUE(pool.consistent());
  EXPECT_EQ(pool.block_table(0)[seq.device_index(host[0])], done.inserted[0]);
  EXPECT_EQ(pool.block_table(0)[seq.device_index(host[2])], done.inserted[1]);
  std::vector<std::int32_t> others;
  for (std::size_t p = 0; p < seq.num_pages(); ++p)
    if (seq.residency(p) == md::page_residency::device && p != host[0] && p != host[2])
      others.push_back(pool.block_table(0)[seq.device_index(p)]);
  EXPECT_EQ(others, kept) << "the other device pages keep their blocks and order";

  // A full table swaps: the removal makes the room.
  set_page_key(seq, host[1], 0.0f, 20.0f);
  md::block_pool<> full(seq.device_pages(), P);
  full.open(0);
  full.append_tokens(0, seq.device_len());
  auto swap = seq.select_recall(q);
  ASSERT_EQ(swap.promote, std::vector<std::size_t>{host[1]});
  ASSERT_EQ(swap.demote.size() + swap.drop.size(), 1u);
  // A promotion without a displacement does not fit it: nothing changes, in the sequence or the table.
  auto forged = swap;
  forged.demote.clear();
  forged.drop.clear();
  const auto table_before = std::vector<std::int32_t>(full.block_table(0).begin(), full.block_table(0).end());
  expect_unchanged<md::input_error>(
      seq, [&] { (void)seq.commit_recall(forged, full, 0); }, "no free block");
  EXPECT_EQ(std::vector<std::int32_t>(full.block_table(0).begin(), full.block_table(0).end()), table_before);
  const auto done2 = seq.commit_recall(swap, full, 0);
  EXPECT_EQ(done2.inserted.size(), 1u);
  EXPECT_EQ(full.num_pages(0), seq.device_pages());
  EXPECT_EQ(full.free_blocks(), 0u);
  EXPECT_TRUE(full.consistent());
}

TEST(HostTier, LlamaCppSeesHostPagesAsHoles) {
  auto seq = filled(4, 8);
  seq.enable_host_tier({});
  const auto plan = seq.select_for_budget();
  const auto ranges = md::llama_position_ranges(seq, plan);  // what leaves llama.cpp's cache: every victim
  seq.commit(plan);
  ASSERT_EQ(seq.host_pages(), plan.pages.size());
  EXPECT_EQ(md::llama_evicted_ranges(seq), ranges) << "host pages are not in the device cache";
}
