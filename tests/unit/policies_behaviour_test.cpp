// Hand-built episodes that show each policy's signature, and the MemDecay normalisation modes' formulas:
// StreamingLLM keeps exactly the sinks and the window; H2O keeps the heaviest hitters; TOVA follows the last
// observation; Scissorhands keeps persistently important tokens over one-off spikes; NORM_SUM ranks by attention
// per observation of lifetime; SnapKV only counts its window and keeps the neighbours of a hit; priority LRU
// empties the lowest priority first, least recently used first; random is seeded and even; MemDecay with
// `uniform` keeps an old but repeatedly attended user fact that `none` loses.
#include <gtest/gtest.h>

#include <memdecay/policies/all.hpp>
#include <memdecay/core/sequence.hpp>

#include <Eigen/Core>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

namespace md = memdecay;
namespace pol = memdecay::policies;

namespace {

std::vector<std::uint64_t> iota_positions(std::uint64_t from, std::uint64_t to) {
  std::vector<std::uint64_t> out(to - from);
  std::iota(out.begin(), out.end(), from);
  return out;
}

template <class Seq>
void evict_to_budget(Seq& seq) {
  seq.commit(seq.select_for_budget());
}

}  // namespace

// ---- StreamingLLM -------------------------------------------------------------------------------------------

TEST(StreamingLlm, KeepsExactlyTheSinksAndTheRecentWindow) {
  for (std::size_t P : {1u, 4u}) {
    SCOPED_TRACE(P);
    // StartRecentKVCache(start_size = 4, recent_size = 8).
    md::policy_sequence<pol::streaming_llm> seq(md::config{.page_size = P, .budget = md::budget_config::tokens(12)},
                                                {.sink_tokens = 4});
    for (md::step_t step = 1; step <= 40; ++step) {
      seq.append(md::regions::user);
      seq.advance_to(step);
      std::vector<float> mass(seq.kv_len(), 0.0f);
      mass[seq.kv_len() / 2] = 1.0f;  // attention is ignored: a hot middle token does not survive for it
      seq.observe_tokens(mass);
      evict_to_budget(seq);
      EXPECT_LE(seq.kv_len(), 12u);
      // Always the sinks, then one contiguous window that ends at the newest token.
      const auto pos = seq.positions();
      const std::uint64_t sinks = std::min<std::uint64_t>(4, seq.logical_len());
      for (std::uint64_t i = 0; i < sinks; ++i) EXPECT_EQ(pos[i], i);
      for (std::size_t i = sinks; i < pos.size(); ++i) EXPECT_EQ(pos[i], seq.logical_len() - (pos.size() - i));
    }
    auto expected = iota_positions(0, 4);
    for (auto p : iota_positions(32, 40)) expected.push_back(p);
    EXPECT_EQ(seq.positions(), expected);
  }
}

// ---- H2O ----------------------------------------------------------------------------------------------------

TEST(H2o, DefaultSplitsTheBudgetHalfHeavyHittersHalfRecentAsTheSourceRunsIt) {
  // FMInference/H2O's runs: heavy_ratio = recent_ratio, so a budget of 8 tokens keeps the 4 most recent and the 4
  // heaviest hitters of the rest.
  md::policy_sequence<pol::h2o> seq(md::config{.page_size = 1, .budget = md::budget_config::tokens(8)});
  seq.append(md::regions::tool_out, 20);
  std::vector<float> mass(20, 0.01f);
  for (int heavy : {2, 5, 9, 11, 13}) mass[static_cast<std::size_t>(heavy)] = 0.05f + 0.01f * static_cast<float>(heavy);
  mass[18] = 0.0f;  // a recent token with no mass stays: the window is positional
  seq.observe_tokens(mass);
  EXPECT_EQ(seq.policy().recent_window(1, 20), 4u);
  evict_to_budget(seq);
  EXPECT_EQ(seq.positions(), (std::vector<std::uint64_t>{5, 9, 11, 13, 16, 17, 18, 19}));
}

TEST(H2o, RecentWindowFollowsTheBudgetAndKeepsAFixedFloor) {
  const pol::h2o<float> ratio({}, md::config{.budget = md::budget_config::ratio(0.25)}, md::default_region_table());
  EXPECT_EQ(ratio.recent_window(1, 400), 50u);  // half of 25% of 400
  EXPECT_EQ(ratio.recent_window(1, 800), 100u);
  const pol::h2o<float> floor({.recent_tokens = 64}, md::config{.budget = md::budget_config::tokens(64)},
                              md::default_region_table());
  EXPECT_EQ(floor.recent_window(1, 1000), 64u);  // max(64, 32)
  const pol::h2o<float> unlimited({.recent_tokens = 7}, md::config{}, md::default_region_table());
  EXPECT_EQ(unlimited.recent_window(1, 1000), 7u);
  const pol::h2o<float> saturated({}, md::config{.budget = md::budget_config::tokens(1e300)},
                                  md::default_region_table());
  EXPECT_GT(saturated.recent_window(1, 10), 10u);
}

TEST(H2o, RejectsARecentFractionOutsideZeroToOne) {
  for (double bad : {-0.1, 1.5, std::nan("")})
    EXPECT_THROW((md::policy_sequence<pol::h2o>(md::config{}, {.recent_fraction = bad})), md::config_error) << bad;
}

TEST(H2o, KeepsTheHeaviestHittersAndTheRecentWindow) {
  md::policy_sequence<pol::h2o> seq(md::config{.page_size = 1, .budget = md::budget_config::tokens(5)},
                                    {.recent_tokens = 2});
  seq.append(md::regions::tool_out, 12);
  for (int obs = 0; obs < 3; ++obs) {
    std::vector<float> mass(12, 0.01f);
    mass[3] = 0.2f;
    mass[7] = 0.15f;
    mass[9] = 0.1f + 0.05f * static_cast<float>(obs);  // cumulative 0.45 > 0.03 of the others
    seq.observe_tokens(mass);
  }
  EXPECT_FLOAT_EQ(seq.policy().cumulative()[3], 0.6f);
  evict_to_budget(seq);
  EXPECT_EQ(seq.positions(), (std::vector<std::uint64_t>{3, 7, 9, 10, 11}));
}

TEST(H2o, PageGranularityUsesThePageMean) {
  md::policy_sequence<pol::h2o> seq(md::config{.page_size = 4}, {.recent_tokens = 0, .recent_fraction = 0});
  seq.append(md::regions::tool_out, 16);
  std::vector<float> mass(16, 0.0f);
  mass[1] = 0.4f;                                // page 0: mean 0.1
  mass[13] = 0.8f;                               // page 3: mean 0.2
  for (int i = 8; i < 12; ++i) mass[i] = 0.05f;  // page 2: mean 0.05
  seq.observe_tokens(mass);
  EXPECT_EQ(seq.select(2).pages, (std::vector<std::size_t>{1, 2}));
  EXPECT_EQ(seq.select(3).pages, (std::vector<std::size_t>{0, 1, 2}));
}

TEST(H2o, RejectsAnObservationThatWouldOverflowItsSums) {
  md::policy_sequence<pol::h2o> seq(md::config{.page_size = 1}, {.recent_tokens = 0, .recent_fraction = 0});
  seq.append(md::regions::user, 2);
  const std::vector<float> huge{std::numeric_limits<float>::max(), 0.0f};
  seq.observe_tokens(huge);
  const auto digest = seq.digest();
  EXPECT_THROW(seq.observe_tokens(huge), md::input_error);
  EXPECT_EQ(seq.digest(), digest);
  EXPECT_EQ(seq.policy().cumulative()[0], std::numeric_limits<float>::max());
}

// ---- TOVA ---------------------------------------------------------------------------------------------------

TEST(Tova, FollowsTheLastObservationWhereH2oRemembers) {
  const md::config cfg{.page_size = 1};
  md::policy_sequence<pol::tova> tova(cfg);
  md::policy_sequence<pol::h2o> h2o(cfg, {.recent_tokens = 0, .recent_fraction = 0});
  tova.append(md::regions::user, 8);
  h2o.append(md::regions::user, 8);
  EXPECT_TRUE(std::isinf(tova.page_scores()[0])) << "unobserved tokens are kept";
  std::vector<float> first(8, 0.0f), second(8, 0.0f);
  for (int i = 0; i < 4; ++i) first[i] = 0.2f;   // the first query reads tokens 0..3 hard
  for (int i = 4; i < 8; ++i) second[i] = 0.1f;  // the latest reads 4..7
  for (const auto& m : {first, second}) {
    tova.observe_tokens(m);
    h2o.observe_tokens(m);
  }
  EXPECT_EQ(tova.select(4).pages, (std::vector<std::size_t>{0, 1, 2, 3}));
  EXPECT_EQ(h2o.select(4).pages, (std::vector<std::size_t>{4, 5, 6, 7}));
  // A new token has no signal until the next observation, then competes on it alone.
  tova.append(md::regions::user);
  EXPECT_TRUE(std::isinf(tova.page_scores()[8]));
  Eigen::MatrixXf heads = Eigen::MatrixXf::Zero(2, 9);
  heads(0, 0) = 0.5f;  // mean over heads: token 0 gets 0.25, the new token 8 gets 0
  tova.observe_heads(heads, md::head_reduction::mean);
  EXPECT_FLOAT_EQ(tova.page_scores()[0], 0.25f);
  EXPECT_EQ(tova.select(1).pages, (std::vector<std::size_t>{1}));
}

// ---- Scissorhands -------------------------------------------------------------------------------------------

TEST(Scissorhands, KeepsPersistentlyImportantTokensOverOneOffSpikes) {
  const md::config cfg{.page_size = 1};
  md::policy_sequence<pol::scissorhands> sh(cfg, {.history_window = 8});
  md::policy_sequence<pol::h2o> h2o(cfg, {.recent_tokens = 0, .recent_fraction = 0});
  sh.append(md::regions::user, 8);
  h2o.append(md::regions::user, 8);
  for (int obs = 0; obs < 6; ++obs) {
    std::vector<float> mass(8, 0.1f);  // below the uniform level 1/8
    mass[2] = 0.2f;                    // above it every time
    if (obs == 0) mass[5] = 3.0f;      // one spike
    EXPECT_EQ(sh.observe_tokens(mass), obs == 0 ? 2u : 1u);
    h2o.observe_tokens(mass);
  }
  EXPECT_FLOAT_EQ(sh.policy().importance(2), 1.0f);
  EXPECT_FLOAT_EQ(sh.policy().importance(5), 1.0f / 6.0f);
  EXPECT_FLOAT_EQ(sh.policy().importance(0), 0.0f);
  // Keep one: Scissorhands keeps the persistent token 2, H2O the spike 5.
  auto keep_one = [](auto& seq) {
    seq.commit(seq.select(7));
    return seq.positions();
  };
  EXPECT_EQ(keep_one(sh), (std::vector<std::uint64_t>{2}));
  EXPECT_EQ(keep_one(h2o), (std::vector<std::uint64_t>{5}));
}

TEST(Scissorhands, ForgetsOutsideTheHistoryWindow) {
  md::policy_sequence<pol::scissorhands> sh(md::config{.page_size = 1}, {.history_window = 2});
  sh.append(md::regions::user, 4);
  sh.observe_tokens(std::vector<float>{1.0f, 0.0f, 0.0f, 0.0f});
  for (int i = 0; i < 2; ++i) sh.observe_tokens(std::vector<float>{0.0f, 1.0f, 0.0f, 0.0f});
  EXPECT_FLOAT_EQ(sh.policy().importance(0), 0.0f);  // its hit fell out of the 2-observation window
  EXPECT_FLOAT_EQ(sh.policy().importance(1), 1.0f);
}

// ---- NORM_SUM -----------------------------------------------------------------------------------------------

TEST(NormSum, RanksByAttentionPerObservationOfLifetime) {
  const md::config cfg{.page_size = 1};
  md::policy_sequence<pol::norm_sum> ns(cfg);
  md::policy_sequence<pol::h2o> h2o(cfg, {.recent_tokens = 0, .recent_fraction = 0});
  auto both = [&](auto&& f) {
    f(ns);
    f(h2o);
  };
  both([](auto& s) { s.append(md::regions::user); });  // A: old, read at 0.1 per observation
  for (int i = 0; i < 8; ++i) both([](auto& s) { s.observe_tokens(std::vector<float>{0.1f}); });
  both([](auto& s) { s.append(md::regions::tool_out); });  // B: new, read at 0.3 per observation
  EXPECT_TRUE(std::isinf(ns.page_scores()[1])) << "not observed yet: kept";
  for (int i = 0; i < 2; ++i) both([](auto& s) { s.observe_tokens(std::vector<float>{0.1f, 0.3f}); });
  EXPECT_NEAR(ns.page_scores()[0], 0.1f, 1e-6);
  EXPECT_NEAR(ns.page_scores()[1], 0.3f, 1e-6);
  EXPECT_EQ(ns.select(1).pages, (std::vector<std::size_t>{0}));   // A's sum (1.0) is larger, its rate is not
  EXPECT_EQ(h2o.select(1).pages, (std::vector<std::size_t>{1}));  // H2O favours the early token
}

// ---- SnapKV -------------------------------------------------------------------------------------------------

TEST(SnapKv, OnlyTheObservationWindowVotes) {
  const md::config cfg{.page_size = 1};
  md::policy_sequence<pol::snapkv> snap(cfg, {.window = 2, .kernel_size = 1});
  md::policy_sequence<pol::h2o> h2o(cfg, {.recent_tokens = 0, .recent_fraction = 0});
  snap.append(md::regions::retrieval, 6);
  h2o.append(md::regions::retrieval, 6);
  std::vector<float> early(6, 0.01f), late(6, 0.01f);
  early[0] = 1.0f;
  late[3] = 0.5f;
  for (const auto& m : {early, late, late}) {
    snap.observe_tokens(m);
    h2o.observe_tokens(m);
  }
  EXPECT_FLOAT_EQ(snap.policy().vote(0), 0.02f);  // the early hit left the 2-observation window
  EXPECT_FLOAT_EQ(snap.policy().vote(3), 1.0f);
  EXPECT_EQ(snap.select(3).pages, (std::vector<std::size_t>{0, 1, 2}));
  EXPECT_EQ(h2o.select(3).pages, (std::vector<std::size_t>{1, 2, 4}));
}

TEST(SnapKv, PoolingKeepsTheNeighboursOfAHit) {
  for (auto pool : {pol::snapkv<float>::pooling::max, pol::snapkv<float>::pooling::avg}) {
    md::policy_sequence<pol::snapkv> snap(md::config{.page_size = 1}, {.window = 4, .kernel_size = 3, .pool = pool});
    snap.append(md::regions::retrieval, 8);
    std::vector<float> mass(8, 0.01f);
    mass[4] = 0.9f;
    snap.observe_tokens(mass);
    snap.commit(snap.select(5));
    EXPECT_EQ(snap.positions(), (std::vector<std::uint64_t>{3, 4, 5}));
  }
}

// ---- priority LRU -------------------------------------------------------------------------------------------

TEST(PriorityLru, EmptiesTheLowestPriorityFirstLeastRecentlyUsedFirst) {
  // Default priorities: round(100 b_r): user 80, tool_out 40, scratchpad 30.
  md::policy_sequence<pol::priority_lru> seq(md::config{.page_size = 2});
  seq.append(md::regions::user, 2);        // page 0, step 0
  seq.append(md::regions::scratchpad, 2);  // page 1, step 0
  seq.advance_to(1);
  seq.append(md::regions::tool_out, 2);    // page 2, step 1
  seq.append(md::regions::scratchpad, 2);  // page 3, step 1
  seq.advance_to(2);
  seq.append(md::regions::scratchpad, 2);  // page 4, step 2
  seq.append(md::regions::tool_out, 2);    // page 5, step 2
  seq.append(md::regions::user, 2);        // page 6, step 2
  seq.append(md::regions::user, 1);        // page 7, partial
  seq.advance_to(3);
  std::vector<float> mass(seq.kv_len(), 0.0f);
  mass[2] = mass[3] = 0.3f;  // page 1 is read at 0.3 * 15 >= 1x uniform: used at step 3
  EXPECT_EQ(seq.observe_tokens(mass), 2u);
  EXPECT_EQ(seq.select(2).pages, (std::vector<std::size_t>{3, 4}));        // scratchpad, used longest ago
  EXPECT_EQ(seq.select(3).pages, (std::vector<std::size_t>{1, 3, 4}));     // all of scratchpad first
  EXPECT_EQ(seq.select(4).pages, (std::vector<std::size_t>{1, 2, 3, 4}));  // then the older tool_out page
  EXPECT_EQ(seq.select(6).pages, (std::vector<std::size_t>{0, 1, 2, 3, 4, 5}));
  // Explicit priorities reorder the regions: scratchpad above everything.
  md::policy_sequence<pol::priority_lru> custom(md::config{.page_size = 2},
                                                {.region_priority = {100, 90, 50, 50, 50, 50, 99}});
  custom.append(md::regions::scratchpad, 2);
  custom.append(md::regions::user, 2);
  custom.append(md::regions::tool_out, 2);
  custom.append(md::regions::user, 1);
  EXPECT_EQ(custom.select(1).pages, (std::vector<std::size_t>{1}));
}

TEST(PriorityLru, MixedPagesTakeTheirHighestPriority) {
  md::policy_sequence<pol::priority_lru> seq(md::config{.page_size = 4});
  seq.append(md::regions::scratchpad, 3);
  seq.append(md::regions::user, 1);  // page 0: scratchpad + one user token: priority 80
  seq.append(md::regions::tool_out, 4);
  seq.append(md::regions::tool_out, 1);
  EXPECT_EQ(seq.select(1).pages, (std::vector<std::size_t>{1}));
}

// ---- random -------------------------------------------------------------------------------------------------

TEST(Random, SeededEvenAndIndependentOfTheLayout) {
  auto victims = [](std::uint64_t seed, std::size_t k) {
    md::policy_sequence<pol::random> seq(md::config{.page_size = 2}, {.seed = seed});
    seq.append(md::regions::tool_out, 16);
    return seq.select(k).pages;
  };
  EXPECT_EQ(victims(7, 3), victims(7, 3));
  std::vector<int> hits(8, 0);
  int differs = 0;
  for (std::uint64_t seed = 0; seed < 400; ++seed) {
    const auto v = victims(seed, 1);
    ++hits[v[0]];
    differs += v != victims(seed + 1, 1);
  }
  for (int h : hits) {
    EXPECT_GT(h, 25);  // 50 expected per page
    EXPECT_LT(h, 80);
  }
  EXPECT_GT(differs, 300);
  // A page keeps its key after others leave: the order of the survivors does not change.
  md::policy_sequence<pol::random> seq(md::config{.page_size = 2}, {.seed = 3});
  seq.append(md::regions::tool_out, 16);
  const auto before = seq.page_scores();
  const auto plan = seq.select(2);
  seq.commit(plan);
  std::vector<float> survivors;
  for (std::size_t p = 0; p < before.size(); ++p)
    if (p != plan.pages[0] && p != plan.pages[1]) survivors.push_back(before[p]);
  EXPECT_EQ(seq.page_scores(), survivors);
}

// ---- MemDecay and its normalisation modes --------------------------------------------------------------------

namespace {

// An agent episode: a pinned system prompt, one user fact, then a tool output page every step. The fact gets 3x
// the uniform share of every observation. Same config for both modes but the normalisation; tau = 2 is "twice
// uniform" under uniform, and a raw share no token reaches under none, whose x = 3/n is also far below b_r.
bool fact_survives(md::attention_normalization mode) {
  md::policy_sequence<pol::memdecay> seq(md::config{.alpha = 1.0,
                                                    .ewma_beta = 0.5,
                                                    .tau = 2.0,
                                                    .page_size = 4,
                                                    .normalization = mode,
                                                    .budget = md::budget_config::tokens(64)});
  seq.append(md::regions::system, 4);
  seq.append(md::regions::user, 4);  // the fact: positions 4..7
  for (md::step_t step = 1; step <= 200; ++step) {
    seq.append(md::regions::tool_out, 4);
    seq.advance_to(step);
    const std::size_t n = seq.kv_len();
    std::vector<float> mass(n, 0.0f);
    for (std::size_t i = 0; i < n; ++i) {
      const auto pos = seq.position_of(i);
      mass[i] = (pos >= 4 && pos < 8 ? 3.0f : 1.0f) / static_cast<float>(n);
    }
    seq.observe_tokens(mass);
    evict_to_budget(seq);
  }
  const auto pos = seq.positions();
  return std::find(pos.begin(), pos.end(), std::uint64_t{4}) != pos.end();
}

}  // namespace

TEST(MemDecay, UniformKeepsAnOldRepeatedlyAttendedUserFactThatNoneLoses) {
  EXPECT_TRUE(fact_survives(md::attention_normalization::uniform));
  EXPECT_FALSE(fact_survives(md::attention_normalization::none));
  EXPECT_TRUE(fact_survives(md::attention_normalization::lifetime));
}

TEST(MemDecayNormalisation, HelpersFollowTheirFormulas) {
  EXPECT_STREQ(md::to_string(md::attention_normalization::lifetime), "lifetime");
  EXPECT_STREQ(md::to_string(md::attention_normalization::zscore), "zscore");
  EXPECT_THROW(md::config{.normalization = static_cast<md::attention_normalization>(4)}.validate(), md::config_error);
  EXPECT_EQ(md::normalization_scale<float>(md::attention_normalization::lifetime, 300), 300.0f);
  EXPECT_EQ(md::normalization_scale<float>(md::attention_normalization::zscore, 300), 1.0f);
  const std::vector<double> mass{0.1, 0.1, 0.1, 0.5};  // mean 0.2, std sqrt(0.03)
  std::vector<double> z(4);
  md::zscore_normalize<double>(mass, z);
  EXPECT_NEAR(z[0], -0.1 / std::sqrt(0.03), 1e-12);
  EXPECT_NEAR(z[3], 0.3 / std::sqrt(0.03), 1e-12);
  md::zscore_normalize<double>(std::vector<double>(3, 0.25), z);
  EXPECT_EQ(z[0], 0.0);                                         // no spread: no information
  EXPECT_DOUBLE_EQ(md::lifetime_normalize(0.5, 0.5, 1), 1.0);   // 0.5 / (1 - 0.5)
  EXPECT_DOUBLE_EQ(md::lifetime_normalize(0.75, 0.5, 2), 1.0);  // 0.75 / (1 - 0.25)
  EXPECT_DOUBLE_EQ(md::lifetime_normalize(0.0, 0.5, 0), 0.0);
  EXPECT_DOUBLE_EQ(md::lifetime_normalize(0.3, 0.0, 5), 0.3);  // beta = 0: the EWMA is the last x already
}

TEST(MemDecayNormalisation, LifetimeDividesTheEwmaByItsWeightOverTheTokensLife) {
  md::basic_sequence<pol::memdecay, double> seq(md::config{.alpha = 1.0,
                                                           .ewma_beta = 0.5,
                                                           .tau = 10.0,
                                                           .page_size = 1,
                                                           .normalization = md::attention_normalization::lifetime});
  seq.append(md::regions::user, 4);
  seq.observe_tokens(std::vector<double>{0.5, 0.25, 0.25, 0.0});  // x = 4m = {2, 1, 1, 0}
  EXPECT_DOUBLE_EQ(seq.policy().ewma()[0], 1.0);
  EXPECT_DOUBLE_EQ(seq.policy().token_terms(seq.view(), 0).attention, 2.0);  // 1 / (1 - 0.5)
  seq.append(md::regions::user);
  seq.observe_tokens(std::vector<double>{0.4, 0.0, 0.0, 0.0, 0.4});  // x = 5m = {2, 0, 0, 0, 2}
  // Token 0 seen twice at x = 2: EWMA 1.5, weight 0.75: 2. Token 4 seen once at x = 2: EWMA 1, weight 0.5: 2.
  EXPECT_DOUBLE_EQ(seq.policy().token_terms(seq.view(), 0).attention, 2.0);
  EXPECT_DOUBLE_EQ(seq.policy().token_terms(seq.view(), 4).attention, 2.0);
  EXPECT_DOUBLE_EQ(seq.policy().token_terms(seq.view(), 1).attention, 0.25 / 0.75);  // x = 1, then 0
}

TEST(MemDecayNormalisation, LifetimeLetsANewlyArrivedTokenCompeteAtOnce) {
  // Two tokens read at the same rate (4x uniform); B arrived after A had been read 10 times.
  auto attention_gap = [](md::attention_normalization mode) {
    md::basic_sequence<pol::memdecay, double> seq(
        md::config{.alpha = 1.0, .ewma_beta = 0.8, .tau = 100.0, .page_size = 1, .normalization = mode});
    seq.append(md::regions::tool_out, 2);                                            // A (token 0) and a filler
    for (int i = 0; i < 10; ++i) seq.observe_tokens(std::vector<double>{2.0, 0.0});  // x = 4
    seq.append(md::regions::tool_out);                                               // B (token 2)
    seq.observe_tokens(std::vector<double>{4.0 / 3, 0.0, 4.0 / 3});                  // x = 4 for both
    const auto v = seq.view();
    return seq.policy().token_terms(v, 0).attention - seq.policy().token_terms(v, 2).attention;
  };
  EXPECT_GT(attention_gap(md::attention_normalization::uniform), 2.0);  // B looks far less attended
  EXPECT_LT(std::abs(attention_gap(md::attention_normalization::lifetime)), 0.1);
}

TEST(MemDecayNormalisation, ZscoreCountsStandardDeviationsAboveTheMean) {
  md::basic_sequence<pol::memdecay, double> seq(md::config{.alpha = 1.0,
                                                           .ewma_beta = 0.5,
                                                           .tau = 1.0,
                                                           .page_size = 1,
                                                           .normalization = md::attention_normalization::zscore});
  seq.append(md::regions::tool_out, 4);
  seq.advance_to(9);
  EXPECT_EQ(seq.observe_tokens(std::vector<double>{0.1, 0.1, 0.1, 0.5}), 1u);  // z = {-0.58 x3, 1.73}
  EXPECT_NEAR(seq.policy().ewma()[0], -0.5 * 0.1 / std::sqrt(0.03), 1e-12);
  EXPECT_NEAR(seq.policy().ewma()[3], 0.5 * 0.3 / std::sqrt(0.03), 1e-12);
  EXPECT_EQ(seq.policy().last_refresh()[3], 9u);
  EXPECT_EQ(seq.policy().last_refresh()[0], 0u);
  EXPECT_EQ(seq.select(1).pages, (std::vector<std::size_t>{0}));
}

TEST(MemDecayNormalisation, ZscoreIsScaleFreeWhereUniformIsNot) {
  // The same attention reduced by sum over 32 heads or by mean: zscore decides identically, uniform does not.
  auto run = [](md::attention_normalization mode, float scale) {
    md::policy_sequence<pol::memdecay> seq(
        md::config{.alpha = 1.0, .ewma_beta = 0.5, .tau = 1.5, .page_size = 1, .normalization = mode});
    seq.append(md::regions::tool_out, 16);
    std::size_t refreshed = 0;
    for (md::step_t step = 1; step < 6; ++step) {
      seq.advance_to(step);
      std::vector<float> mass(16);
      for (std::size_t i = 0; i < 16; ++i) mass[i] = scale * static_cast<float>((i * 7 + step) % 16) / 120.0f;
      refreshed += seq.observe_tokens(mass);
    }
    return std::pair{refreshed, seq.select(8).pages};
  };
  EXPECT_EQ(run(md::attention_normalization::zscore, 1.0f), run(md::attention_normalization::zscore, 32.0f));
  EXPECT_NE(run(md::attention_normalization::uniform, 1.0f).first,
            run(md::attention_normalization::uniform, 32.0f).first);
}

// ---- MemDecay's page aggregation ------------------------------------------------------------------------------------

TEST(MemdecayPageAggregation, MaxKeepsThePageOfOneHotFactWhereTheMeanDropsIt) {
  // Three 8-token pages of one region: page 0 holds one token with a strong EWMA among idle ones, pages 1 and 2
  // eight tokens of mild attention each. The mean ranks page 0 lowest; the max keeps it and drops page 2.
  using policy = pol::memdecay<float>;
  md::config cfg{.alpha = 1.0, .tau = 1e6, .page_size = 8, .normalization = md::attention_normalization::uniform};
  cfg.protection = {.sink_pages = 0, .recent_tokens = 0};
  md::policy_sequence<pol::memdecay> mean(cfg), max(cfg, {.aggregation = policy::page_aggregation::max});
  for (auto* s : {&mean, &max}) {
    s->append(md::regions::tool_out, 24);
    std::vector<float> m(24, 0.0f);
    m[2] = 0.2f;                                                           // one hot token in page 0
    for (int i = 8; i < 16; ++i) m[static_cast<std::size_t>(i)] = 0.05f;   // mild attention over page 1 ...
    for (int i = 16; i < 24; ++i) m[static_cast<std::size_t>(i)] = 0.04f;  // ... and a little less over page 2
    s->observe_tokens(m);
    s->advance_to(1);
  }
  EXPECT_EQ(mean.select(1).pages, (std::vector<std::size_t>{0}));
  EXPECT_EQ(max.select(1).pages, (std::vector<std::size_t>{2}));
  // The max is the best token's reference score, whatever path the mean takes.
  const auto view = max.view();
  const auto plan = max.select(3);
  for (std::size_t k = 0; k < plan.pages.size(); ++k) {
    float best = -1;
    for (std::size_t i = plan.pages[k] * 8; i < plan.pages[k] * 8 + 8; ++i)
      best = std::max(best, max.policy().token_terms(view, i).total());
    EXPECT_FLOAT_EQ(plan.scores[k], best);
  }
  EXPECT_NE(mean.digest(), max.digest());
}
