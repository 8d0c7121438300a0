// Tests for memdecay-replay's engine (tools/replay/replay.hpp): a tiny trace whose evictions, probe survival,
// attention loss and logged scores are worked out by hand below, under MemDecay with both normalisation modes;
// budget and region checks; and a generated tier replayed from a file gives the numbers of the in-memory run.
#include <gtest/gtest.h>

#include <memdecay/io/trace.hpp>
#include <memdecay/io/trace_generator.hpp>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include "../../tools/replay/replay.hpp"

namespace md = memdecay;
namespace tr = memdecay::trace;
namespace rp = memdecay::replay;

namespace {

// 16 tokens, 4-token pages, budget 50% = 8 tokens, no recent-token protection.
//
//   step 0  system   x4  positions 0-3    page 0 (pinned)
//   step 1  tool_out x8  positions 4-11   pages 1, 2: 12 resident > 8, evict 1 page. Both tool_out pages score
//                                         b = 0.4 (fresh, no attention): the tie goes to the lower page, 1 =
//                                         positions 4-7.
//   step 2  attention    0.1 on each of 0-3 and 8-11, 0.05 on each of 4-7: 0.2 of 1.0 falls on evicted tokens.
//                        The 8 resident tokens observe 0.1 / 0.8 = 0.125 each.
//   step 3  probe 0 tool_out [5, 7): lost.  probe 1 tool_out [8, 10): alive.  probe 2 system [0, 4): alive.
//   step 4  user     x4  positions 12-15  12 resident > 8, evict 1 page of: page 1 (positions 8-11, tool_out)
//                                         and page 2 (user, fresh, 0.8). Page 1 goes (scores below).
//   step 5  probe 3 tool_out [8, 10): lost.  probe 4 user [12, 16): alive.
//   step 5  attention    0.0625 on each of 8-11 (0.25, evicted) and 0.75 / 4 on each of 12-15.
//
// Survival 3 / 5; attention loss (0.2 + 0.25) / 2.0 = 0.225, all of it tool_out; 2 pages, 8 tool_out tokens.
//
// The second victim's score at step 4 (tool_out: b = 0.4, half-life 40):
//   none    (alpha 1, tau 0.01, beta 0.9): x = 0.125 > tau refreshes at step 2, EWMA 0.1 * 0.125 = 0.0125:
//           0.4 * 2^(-2/40) + 0.0125 = 0.398875...
//   uniform (alpha 1, tau 2, beta 0.9):    x = 0.125 * 8 = 1 <= tau, no refresh, EWMA 0.1:
//           0.4 * 2^(-3/40) + 0.1 = 0.479737...
tr::trace_file tiny() {
  tr::trace_file f;
  f.label = "tiny";
  f.region_names = tr::default_region_names();
  tr::episode e;
  e.name = "tiny/0";
  using md::regions::system, md::regions::tool_out, md::regions::user;
  e.events.emplace_back(tr::segment{0, system, 4});
  e.events.emplace_back(tr::segment{1, tool_out, 8});
  std::vector<float> row(12, 0.1f);
  for (int j = 4; j < 8; ++j) row[j] = 0.05f;
  e.events.emplace_back(tr::attention{2, 12, {tr::attention_row{false, {}, row}}});
  e.events.emplace_back(tr::probe{3, 0, tool_out, 5, 2});
  e.events.emplace_back(tr::probe{3, 1, tool_out, 8, 2});
  e.events.emplace_back(tr::probe{3, 2, system, 0, 4});
  e.events.emplace_back(tr::segment{4, user, 4});
  e.events.emplace_back(tr::probe{5, 3, tool_out, 8, 2});
  e.events.emplace_back(tr::probe{5, 4, user, 12, 4});
  // The second observation as a sparse row: positions 0-7 get nothing.
  tr::attention_row sparse{true, {8, 9, 10, 11, 12, 13, 14, 15}, {}};
  for (int j = 0; j < 4; ++j) sparse.mass.push_back(0.0625f);
  for (int j = 0; j < 4; ++j) sparse.mass.push_back(0.1875f);
  e.events.emplace_back(tr::attention{5, 16, {sparse}});
  f.episodes.push_back(e);
  return f;
}

rp::replay_settings tiny_settings() {
  rp::replay_settings s;
  s.page_size = 4;
  s.protection = {.sink_pages = 0, .recent_tokens = 0};
  return s;
}

struct logged {
  md::step_t step;
  rp::eviction_record record;
};

}  // namespace

TEST(Replay, TinyTraceMatchesTheHandComputation) {
  const auto f = tiny();
  ASSERT_FALSE(tr::check(f).has_value()) << tr::check(f)->message;
  for (auto mode : {md::attention_normalization::none, md::attention_normalization::uniform}) {
    std::vector<logged> log;
    const auto cell = rp::replay_tier(f, rp::memdecay_policy(mode), 0.5, tiny_settings(),
                                      [&](const rp::eviction_context& ctx, const rp::eviction_record& e) {
                                        EXPECT_EQ(*ctx.tier, "tiny");
                                        EXPECT_EQ(ctx.episode, 0u);
                                        log.push_back({ctx.step, e});
                                      });
    SCOPED_TRACE(md::to_string(mode));
    EXPECT_EQ(cell.policy, std::string("memdecay-") + md::to_string(mode));
    EXPECT_EQ(cell.episodes, 1u);
    EXPECT_EQ(cell.probes, 5u);
    EXPECT_EQ(cell.survived, 3u);
    EXPECT_DOUBLE_EQ(cell.survival(), 0.6);
    EXPECT_NEAR(cell.total_mass, 2.0, 1e-6);
    EXPECT_NEAR(cell.lost_mass, 0.45, 1e-6);
    EXPECT_NEAR(cell.attention_loss(), 0.225, 1e-6);
    EXPECT_EQ(cell.evicted_pages, 2u);
    EXPECT_EQ(cell.evicted_tokens, 8u);
    EXPECT_EQ(cell.over_budget, 0u);
    const auto& tool_out = cell.regions[md::regions::tool_out];
    EXPECT_EQ(tool_out.probes, 3u);
    EXPECT_EQ(tool_out.survived, 1u);
    EXPECT_EQ(tool_out.evicted_tokens, 8u);
    EXPECT_NEAR(tool_out.lost_mass, 0.45, 1e-6);
    EXPECT_EQ(cell.regions[md::regions::system].survived, 1u);
    EXPECT_EQ(cell.regions[md::regions::user].survived, 1u);
    EXPECT_EQ(cell.regions[md::regions::user].evicted_tokens, 0u);

    ASSERT_EQ(log.size(), 2u);
    EXPECT_EQ(log[0].step, 1u);
    EXPECT_EQ(log[0].record.page, 1u);
    EXPECT_EQ(log[0].record.first_position, 4u);
    EXPECT_NEAR(log[0].record.score, 0.4, 1e-6);
    EXPECT_EQ(log[1].step, 4u);
    EXPECT_EQ(log[1].record.page, 1u);
    EXPECT_EQ(log[1].record.first_position, 8u);
    ASSERT_TRUE(log[1].record.has_terms);
    const bool uniform = mode == md::attention_normalization::uniform;
    const double decay = 0.4 * std::exp2((uniform ? -3.0 : -2.0) / 40.0), attention = uniform ? 0.1 : 0.0125;
    EXPECT_NEAR(log[1].record.decay, decay, 1e-6);
    EXPECT_NEAR(log[1].record.attention, attention, 1e-6);
    EXPECT_NEAR(log[1].record.score, decay + attention, 1e-6);
    ASSERT_EQ(log[1].record.regions.size(), 1u);
    EXPECT_EQ(log[1].record.regions[0], (std::pair<md::region_id, std::size_t>{md::regions::tool_out, 4}));
  }
}

TEST(Replay, ReferenceEventsChangeNothing) {
  // References (version 2) are the workload's re-reads, for calibration; replay scores by attention alone.
  auto with = tiny();
  auto& ev = with.episodes[0].events;
  ev.insert(ev.begin() + 3, tr::event{tr::reference{2, 5, 2}});
  ev.insert(ev.begin() + 8, tr::event{tr::reference{4, 8, 4}});
  ASSERT_FALSE(tr::check(with).has_value()) << tr::check(with)->message;
  for (auto mode : {md::attention_normalization::none, md::attention_normalization::uniform}) {
    const auto a = rp::replay_tier(tiny(), rp::memdecay_policy(mode), 0.5, tiny_settings());
    const auto b = rp::replay_tier(with, rp::memdecay_policy(mode), 0.5, tiny_settings());
    EXPECT_EQ(a.survived, b.survived);
    EXPECT_EQ(a.probes, b.probes);
    EXPECT_EQ(a.evicted_pages, b.evicted_pages);
    EXPECT_EQ(a.lost_mass, b.lost_mass);
  }
}

TEST(Replay, FullBudgetEvictsNothing) {
  const auto cell =
      rp::replay_tier(tiny(), rp::memdecay_policy(md::attention_normalization::none), 1.0, tiny_settings());
  EXPECT_EQ(cell.survived, 5u);
  EXPECT_EQ(cell.evicted_pages, 0u);
  EXPECT_EQ(cell.lost_mass, 0.0);
}

TEST(Replay, BudgetChecks) {
  const auto f = tiny();
  const auto s = tiny_settings();
  EXPECT_NO_THROW(rp::check_budget(s, 0.25, f));  // 4 tokens: exactly the pinned system page
  EXPECT_THROW(rp::check_budget(s, 0.0, f), md::input_error);
  EXPECT_THROW(rp::check_budget(s, 1.01, f), md::input_error);
  EXPECT_THROW(rp::check_budget(s, std::nan(""), f), md::input_error);
  try {
    rp::check_budget(s, 0.2, f);  // 3 tokens < 4 pinned
    FAIL();
  } catch (const md::input_error& e) {
    EXPECT_NE(std::string(e.what()).find("below its pinned set of 4 tokens (1 pinned pages of 4)"), std::string::npos)
        << e.what();
  }
  auto pinned_plan = s;
  pinned_plan.region_overrides.push_back({.region = "user", .pinned = true});
  EXPECT_THROW(rp::check_budget(pinned_plan, 0.25, f), md::input_error);  // system + user pages = 8 tokens
}

TEST(Replay, RegionNamesMustMatchThePolicyTable) {
  auto f = tiny();
  EXPECT_NO_THROW(rp::check_regions(f, md::default_region_table()));
  f.region_names[2] = "customer";
  EXPECT_THROW(rp::check_regions(f, md::default_region_table()), md::input_error);
  f.region_names = tr::default_region_names();
  f.region_names.push_back("extra");
  EXPECT_THROW(rp::check_regions(f, md::default_region_table()), md::input_error);
}

TEST(Replay, FileRoundTripGivesTheSameNumbers) {
  const auto generated = tr::generate_tier(tr::tier_config(450, 2), 40);
  const auto path =
      std::filesystem::temp_directory_path() / ("memdecay_replay_test_" + std::to_string(::getpid()) + ".mdtrace");
  tr::write_file(path, generated);
  const auto read = tr::read_file(path);
  std::filesystem::remove(path);
  rp::replay_settings s;
  const auto policy = rp::memdecay_policy(md::attention_normalization::uniform);
  const auto a = rp::replay_tier(generated, policy, 0.5, s), b = rp::replay_tier(read, policy, 0.5, s);
  EXPECT_GE(a.probes, 40u);
  EXPECT_EQ(a.probes, b.probes);
  EXPECT_EQ(a.survived, b.survived);
  EXPECT_EQ(a.evicted_pages, b.evicted_pages);
  EXPECT_EQ(a.lost_mass, b.lost_mass);
  // Half the budget evicts something and loses something, but not everything.
  EXPECT_GT(a.evicted_pages, 0u);
  EXPECT_GT(a.attention_loss(), 0.0);
  EXPECT_LT(a.attention_loss(), 0.5);
  EXPECT_GT(a.survived, 0u);
  EXPECT_LT(a.survived, a.probes);
  EXPECT_EQ(a.regions[md::regions::system].survived, a.regions[md::regions::system].probes);  // pinned
}

TEST(Replay, EveryPolicyKeepsEverythingAtFullBudgetAndThePinnedSetAlways) {
  const auto tier = tr::generate_tier(tr::tier_config(450, 8), 30);
  rp::replay_settings s;
  const auto policies = rp::all_policies({}, s.protection);
  std::vector<std::string> names;
  for (const auto& p : policies) names.push_back(p.name);
  EXPECT_EQ(names, (std::vector<std::string>{"memdecay-none", "memdecay-uniform", "memdecay-lifetime",
                                             "memdecay-zscore", "random", "streaming_llm", "h2o", "tova",
                                             "scissorhands", "norm_sum", "priority_lru", "snapkv"}));
  for (const auto& p : policies) {
    SCOPED_TRACE(p.name);
    const auto full = rp::replay_tier(tier, p, 1.0, s);
    EXPECT_EQ(full.survived, full.probes);
    EXPECT_EQ(full.evicted_pages, 0u);
    EXPECT_EQ(full.lost_mass, 0.0);
    const auto half = rp::replay_tier(tier, p, 0.5, s);
    EXPECT_EQ(half.probes, full.probes);
    EXPECT_GT(half.evicted_pages, 0u);
    EXPECT_LT(half.survived, half.probes);
    EXPECT_EQ(half.over_budget, 0u);
    EXPECT_EQ(half.regions[md::regions::system].survived, half.regions[md::regions::system].probes);
    EXPECT_EQ(half.regions[md::regions::system].evicted_tokens, 0u);
    // Same inputs, same numbers (random included: its randomness is seeded and counter-based).
    const auto again = rp::replay_tier(tier, p, 0.5, s);
    EXPECT_EQ(again.survived, half.survived);
    EXPECT_EQ(again.evicted_pages, half.evicted_pages);
    EXPECT_EQ(again.lost_mass, half.lost_mass);
  }
}

TEST(Replay, StreamingLlmEvictsTheOldestUnpinnedPagesOfTheTinyTrace) {
  // With sinks inside the pinned system page, StreamingLLM keeps the newest pages: the same victims as MemDecay
  // on the tiny trace (positions 4-7 at step 1, 8-11 at step 4), scored by their original page index.
  std::vector<logged> log;
  const auto streaming = rp::all_policies({}, tiny_settings().protection)[5];
  ASSERT_EQ(streaming.name, "streaming_llm");
  const auto cell = rp::replay_tier(tiny(), streaming, 0.5, tiny_settings(),
                                    [&](const rp::eviction_context& ctx, const rp::eviction_record& e) {
                                      log.push_back({ctx.step, e});
                                    });
  EXPECT_EQ(cell.survived, 3u);
  EXPECT_NEAR(cell.attention_loss(), 0.225, 1e-6);
  ASSERT_EQ(log.size(), 2u);
  EXPECT_EQ(log[0].record.first_position, 4u);
  EXPECT_EQ(log[1].record.first_position, 8u);
  EXPECT_FALSE(log[1].record.has_terms);
}

TEST(Replay, MemDecayBehindThePolicyInterfaceLogsItsTerms) {
  // lifetime runs policies::memdecay in basic_policy_sequence; its log carries the page-mean terms. On the tiny
  // trace the first victim is the same (positions 4-7). At step 2 the 8 resident tokens observe x = 0.125 * 8 = 1
  // (<= tau = 2: no refresh), EWMA 0.1, which the lifetime divisor 1 - 0.9^1 = 0.1 turns into an attention term of
  // 1: at step 4 the tool_out page (positions 8-11) scores 0.4 * 2^(-3/40) + 1 = 1.3797, above the fresh user page
  // (0.8 + 0: never observed), so the user page goes. Survival is still 3 of 5 (probe 3 lives, probe 4 is lost);
  // the step-5 row then loses its 0.75 on positions 12-15: attention loss (0.2 + 0.75) / 2 = 0.475.
  std::vector<logged> log;
  const auto cell =
      rp::replay_tier(tiny(), rp::memdecay_policy(md::attention_normalization::lifetime), 0.5, tiny_settings(),
                      [&](const rp::eviction_context& ctx, const rp::eviction_record& e) {
                        log.push_back({ctx.step, e});
                      });
  EXPECT_EQ(cell.survived, 3u);
  EXPECT_EQ(cell.regions[md::regions::tool_out].survived, 2u);
  EXPECT_EQ(cell.regions[md::regions::user].survived, 0u);
  EXPECT_NEAR(cell.attention_loss(), 0.475, 1e-6);
  EXPECT_EQ(cell.regions[md::regions::user].evicted_tokens, 4u);
  ASSERT_EQ(log.size(), 2u);
  EXPECT_EQ(log[0].record.first_position, 4u);
  EXPECT_EQ(log[1].record.first_position, 12u);
  ASSERT_TRUE(log[1].record.has_terms);
  EXPECT_NEAR(log[1].record.decay, 0.8, 1e-6);
  EXPECT_NEAR(log[1].record.attention, 0.0, 1e-9);
  EXPECT_NEAR(log[1].record.score, 0.8, 1e-4);
}
