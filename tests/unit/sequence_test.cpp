// Tests for sequence.hpp: the MemDecay policy end to end (labels, clock, observations, scores, budgets, two-phase
// commit with a page table) and every bad input, each of which must leave the state exactly as it was.
#include <gtest/gtest.h>

#include <memdecay/page_tables/block_pool.hpp>
#include <memdecay/core/sequence.hpp>

#include <Eigen/Core>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

namespace md = memdecay;

namespace {

md::config small_config() { return md::config{.alpha = 1.0, .ewma_beta = 0.5, .tau = 0.3, .page_size = 4}; }

// Runs `call`, expects it to throw `Error`, and checks that the sequence's state is bit-identical afterwards.
template <class Error, class Sequence>
void expect_rejected_unchanged(Sequence& seq, const std::function<void()>& call) {
  const auto digest = seq.digest();
  const auto generation = seq.state().generation();
  const auto kv = seq.kv_len();
  EXPECT_THROW(call(), Error);
  EXPECT_EQ(seq.digest(), digest);
  EXPECT_EQ(seq.state().generation(), generation);
  EXPECT_EQ(seq.kv_len(), kv);
}

}  // namespace

TEST(Sequence, RejectsInvalidConfigOnConstruction) {
  EXPECT_THROW(md::sequence(md::config{.alpha = -1}), md::config_error);
  EXPECT_THROW(md::sequence(md::config{.page_size = 3}), md::config_error);
  EXPECT_THROW((md::basic_sequence<md::policies::memdecay, float, 16>(md::config{.page_size = 32})), md::config_error);
  EXPECT_NO_THROW((md::basic_sequence<md::policies::memdecay, float, 16>(md::config{.page_size = 16})));
}

TEST(Sequence, ScoresFollowTheFormula) {
  md::basic_sequence<md::policies::memdecay, double> seq(small_config());
  seq.append(md::regions::user, 4);
  seq.append(md::regions::scratchpad, 4);
  seq.advance_to(20);
  const auto& t = seq.regions();
  const double user = 0.8 * std::exp(-t.decay_rate(md::regions::user) * 20);
  const double pad = 0.3 * std::exp(-t.decay_rate(md::regions::scratchpad) * 20);
  const auto scores = seq.page_scores();
  ASSERT_EQ(scores.size(), 2u);
  EXPECT_NEAR(scores[0], user, 1e-15);
  EXPECT_NEAR(scores[1], pad, 1e-15);
  EXPECT_NEAR(seq.token_terms(5).decay, pad, 1e-15);
}

TEST(Sequence, ObservationUpdatesEwmaAndRefreshes) {
  md::basic_sequence<md::policies::memdecay, double> seq(small_config());
  seq.append(md::regions::tool_out, 8);
  seq.advance_to(30);
  std::vector<double> mass(8, 0.0);
  mass[2] = 0.6;  // above tau = 0.3: refreshed
  mass[5] = 0.2;  // below: only the EWMA moves
  EXPECT_EQ(seq.observe_tokens(mass), 1u);
  EXPECT_EQ(seq.policy().last_refresh()[2], 30u);
  EXPECT_EQ(seq.policy().last_refresh()[5], 0u);
  EXPECT_DOUBLE_EQ(seq.policy().ewma()[2], 0.3);
  EXPECT_DOUBLE_EQ(seq.policy().ewma()[5], 0.1);
  EXPECT_DOUBLE_EQ(seq.token_terms(2).decay, 0.4);  // dt = 0 again: the full base priority
  // Decay follows the clock between observations.
  seq.advance_to(70);
  EXPECT_NEAR(seq.token_terms(2).decay, 0.4 * std::exp(-seq.regions().decay_rate(md::regions::tool_out) * 40), 1e-15);
}

TEST(Sequence, UniformNormalisationScalesByResidentTokens) {
  auto cfg = small_config();
  cfg.normalization = md::attention_normalization::uniform;
  cfg.tau = 1.5;
  md::basic_sequence<md::policies::memdecay, double> seq(cfg);
  seq.append(md::regions::user, 8);
  std::vector<double> mass(8, 1.0 / 8);
  mass[0] = 2.0 / 8;
  mass[1] = 0.0;
  EXPECT_EQ(seq.observe_tokens(mass), 1u);        // only token 0 got more than 1.5x uniform
  EXPECT_DOUBLE_EQ(seq.policy().ewma()[0], 1.0);  // 0.5 * (2/8 * 8)
  EXPECT_DOUBLE_EQ(seq.policy().ewma()[3], 0.5);  // uniform attention: x = 1
}

TEST(Sequence, PageObservationsShareMassEvenly) {
  md::basic_sequence<md::policies::memdecay, double> seq(small_config());
  seq.append(md::regions::user, 6);  // pages of 4 and 2
  const std::vector<double> page_mass{0.4, 1.0};
  EXPECT_EQ(seq.observe_pages(page_mass), 2u);  // 1.0 / 2 = 0.5 > tau; 0.4 / 4 = 0.1 is not
  EXPECT_DOUBLE_EQ(seq.policy().ewma()[0], 0.05);
  EXPECT_DOUBLE_EQ(seq.policy().ewma()[5], 0.25);
}

TEST(Sequence, HeadAndLayerObservationsReduceWithEigen) {
  md::basic_sequence<md::policies::memdecay, float> a(small_config()), b(small_config());
  a.append(md::regions::user, 3);
  b.append(md::regions::user, 3);
  Eigen::MatrixXf heads(2, 3);
  heads << 0.2f, 0.8f, 0.0f, 0.6f, 0.2f, 0.2f;
  a.observe_heads(heads, md::head_reduction::mean);
  const std::vector<float> mean{0.4f, 0.5f, 0.1f};
  b.observe_tokens(mean);
  EXPECT_EQ(a.digest(), b.digest());
  std::vector<Eigen::MatrixXf> layers{heads, heads};
  a.observe_layers(layers, md::head_reduction::mean);
  b.observe_tokens(mean);
  EXPECT_EQ(a.digest(), b.digest());
}

TEST(Sequence, BudgetEvictsDownToTheLowWatermark) {
  auto cfg = small_config();
  cfg.budget = md::budget_config::tokens(20, 12);
  md::sequence seq(cfg);
  seq.append(md::regions::user, 20);
  EXPECT_TRUE(seq.select_for_budget().empty());  // at the high watermark: nothing to do
  seq.append(md::regions::user, 1);
  const auto plan = seq.select_for_budget();
  EXPECT_EQ(plan.pages.size(), 3u);  // 21 -> 12 needs 9 tokens: 3 pages of 4
  EXPECT_EQ(plan.pages_over_budget, 0u);
  seq.commit(plan);
  EXPECT_EQ(seq.kv_len(), 9u);
  EXPECT_EQ(seq.evicted_tokens(), 12u);
}

TEST(Sequence, RatioAndPageBudgets) {
  auto cfg = small_config();
  cfg.budget = md::budget_config::ratio(0.5);
  md::sequence seq(cfg);
  seq.append(md::regions::tool_out, 32);
  seq.commit(seq.select_for_budget());
  EXPECT_EQ(seq.kv_len(), 16u);
  cfg.budget = md::budget_config::pages(3);
  md::sequence pages(cfg);
  pages.append(md::regions::tool_out, 17);  // 5 pages
  pages.commit(pages.select_for_budget());
  EXPECT_EQ(pages.num_pages(), 3u);
}

TEST(Sequence, PinnedPagesSurviveAndTheShortfallIsReported) {
  auto cfg = small_config();
  cfg.budget = md::budget_config::tokens(8);
  md::sequence seq(cfg);
  seq.append(md::regions::system, 12);  // 3 pinned pages
  seq.append(md::regions::scratchpad, 8);
  seq.advance_to(100);
  const auto plan = seq.select_for_budget();
  EXPECT_EQ(plan.pages, (std::vector<std::size_t>{3, 4}));
  EXPECT_EQ(plan.pages_over_budget, 1u);  // 12 pinned tokens left against a budget of 8
  seq.commit(plan);
  EXPECT_EQ(seq.kv_len(), 12u);
  for (md::region_id r : seq.state().regions()) EXPECT_EQ(r, md::regions::system);
}

TEST(Sequence, PlanCanBePinnedByConfig) {
  auto cfg = small_config();
  cfg.region_overrides = {{.region = "plan", .pinned = true}};
  md::sequence seq(cfg);
  seq.append(md::regions::plan, 8);
  seq.append(md::regions::user, 8);
  EXPECT_EQ(seq.select(4).pages, (std::vector<std::size_t>{2, 3}));
}

TEST(Sequence, ProtectionsKeepSinksRecentAndPartialPages) {
  auto cfg = small_config();
  cfg.protection = {.sink_pages = 1, .recent_tokens = 6};
  md::sequence seq(cfg);
  seq.append(md::regions::scratchpad, 26);  // pages 0..6; page 6 holds 2 tokens; last 6 tokens span pages 5-6
  seq.advance_to(50);
  const auto plan = seq.select(100);
  EXPECT_EQ(plan.pages, (std::vector<std::size_t>{1, 2, 3, 4}));
  const std::size_t in_flight[] = {2};
  EXPECT_EQ(seq.select(100, in_flight).pages, (std::vector<std::size_t>{1, 3, 4}));
}

TEST(Sequence, CommitWithAPageTableCompactsBoth) {
  md::sequence seq(small_config());
  md::block_pool<> pool(16, 4);
  pool.open(1);
  seq.append(md::regions::tool_out, 14);
  pool.append_tokens(1, 14);
  seq.advance_to(5);
  std::vector<float> mass(14, 0.0f);
  mass[0] = 1.0f;  // page 0 is attended
  seq.observe_tokens(mass);
  const auto plan = seq.select(2);
  EXPECT_EQ(plan.pages, (std::vector<std::size_t>{1, 2}));
  const std::vector<std::int32_t> before(pool.block_table(1).begin(), pool.block_table(1).end());
  seq.commit(plan, pool, 1);
  EXPECT_EQ(pool.num_pages(1), seq.num_pages());
  EXPECT_EQ(std::vector<std::int32_t>(pool.block_table(1).begin(), pool.block_table(1).end()),
            (std::vector<std::int32_t>{before[0], before[3]}));
  EXPECT_EQ(pool.free_blocks(), 14u);
  EXPECT_TRUE(pool.consistent());
  EXPECT_EQ(seq.positions(), (std::vector<std::uint64_t>{0, 1, 2, 3, 12, 13}));
}

TEST(Sequence, ExplainPageBreaksTheScoreDownByRegion) {
  md::basic_sequence<md::policies::memdecay, double> seq(small_config());
  seq.append(md::regions::user, 1);
  seq.append(md::regions::scratchpad, 3);
  seq.advance_to(12);
  const auto e = seq.explain_page(0);
  ASSERT_EQ(e.by_region.size(), 2u);
  EXPECT_EQ(e.by_region[0].region, md::regions::user);
  EXPECT_EQ(e.by_region[1].tokens, 3u);
  EXPECT_NEAR(e.terms.total(), seq.page_scores()[0], 1e-15);
  EXPECT_NEAR(e.by_region[0].terms.total() + e.by_region[1].terms.total(), e.terms.total(), 1e-15);
  EXPECT_EQ(e.status, md::page_status::evictable);  // 4 tokens fill the page
  EXPECT_THROW((void)seq.explain_page(1), md::input_error);
}

TEST(Sequence, SameInputsSameVictimsAndDigest) {
  auto run = [] {
    md::sequence seq(md::config{.page_size = 8, .budget = md::budget_config::tokens(64, 48)});
    std::vector<std::size_t> victims;
    for (md::step_t step = 1; step < 60; ++step) {
      seq.append(static_cast<md::region_id>(step % 7), 3);
      seq.advance_to(step);
      std::vector<float> mass(seq.kv_len());
      for (std::size_t i = 0; i < mass.size(); ++i) mass[i] = static_cast<float>((i * 7 + step) % 11) / 100.0f;
      seq.observe_tokens(mass);
      const auto plan = seq.select_for_budget();
      victims.insert(victims.end(), plan.pages.begin(), plan.pages.end());
      seq.commit(plan);
    }
    return std::pair{victims, seq.digest()};
  };
  EXPECT_EQ(run(), run());
}

// ---- bad input: each is rejected with a clear error and changes nothing -------------------------------------

TEST(SequenceBadInput, UnknownRegionIds) {
  md::sequence seq(small_config());
  seq.append(md::regions::user, 5);
  expect_rejected_unchanged<md::input_error>(seq, [&] { seq.append(7, 3); });
  const md::region_span spans[] = {{md::regions::user, 2}, {200, 1}};
  expect_rejected_unchanged<md::input_error>(seq, [&] { seq.append(spans); });
  const md::region_id labels[] = {0, 1, 9};
  expect_rejected_unchanged<md::input_error>(seq, [&] { seq.append_tokens(labels); });
}

TEST(SequenceBadInput, WrongLengthsAndBadMass) {
  md::sequence seq(small_config());
  seq.append(md::regions::user, 6);
  seq.observe_tokens(std::vector<float>(6, 0.1f));
  expect_rejected_unchanged<md::input_error>(seq, [&] { seq.observe_tokens(std::vector<float>(5, 0.1f)); });
  expect_rejected_unchanged<md::input_error>(seq, [&] { seq.observe_tokens(std::vector<float>(7, 0.1f)); });
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(), -0.5f}) {
    std::vector<float> mass(6, 0.1f);
    mass[4] = bad;
    expect_rejected_unchanged<md::input_error>(seq, [&] { seq.observe_tokens(mass); });
  }
  expect_rejected_unchanged<md::input_error>(seq, [&] { seq.observe_pages(std::vector<float>(3, 0.1f)); });
  expect_rejected_unchanged<md::input_error>(seq, [&] { seq.observe_pages(std::vector<float>{0.1f, NAN}); });
  Eigen::MatrixXf heads = Eigen::MatrixXf::Constant(2, 5, 0.1f);
  expect_rejected_unchanged<md::input_error>(seq, [&] { seq.observe_heads(heads, md::head_reduction::sum); });
  std::vector<float> out(1);
  EXPECT_THROW(seq.page_scores(out), md::input_error);
}

TEST(SequenceBadInput, MassThatOverflowsOnceNormalised) {
  auto cfg = small_config();
  cfg.normalization = md::attention_normalization::uniform;
  md::sequence seq(cfg);
  seq.append(md::regions::user, 8);
  std::vector<float> mass(8, 0.0f);
  mass[3] = std::numeric_limits<float>::max();  // finite, but x = 8 * max overflows
  expect_rejected_unchanged<md::input_error>(seq, [&] { seq.observe_tokens(mass); });
}

TEST(SequenceBadInput, ClockGoingBackwards) {
  md::sequence seq(small_config());
  seq.append(md::regions::user, 4);
  seq.advance_to(10);
  expect_rejected_unchanged<md::input_error>(seq, [&] { seq.advance_to(9); });
}

TEST(SequenceBadInput, StaleForgedAndDuplicatePlans) {
  md::sequence seq(small_config());
  seq.append(md::regions::system, 4);
  seq.append(md::regions::user, 14);
  const auto plan = seq.select(2);
  ASSERT_EQ(plan.pages.size(), 2u);

  auto forged = plan;
  forged.pages = {0};  // the pinned system page
  forged.scores = {0.0f};
  expect_rejected_unchanged<md::usage_error>(seq, [&] { seq.commit(forged); });
  forged.pages = {4};  // the partial last page
  expect_rejected_unchanged<md::usage_error>(seq, [&] { seq.commit(forged); });
  forged.pages = {9};  // no such page
  expect_rejected_unchanged<md::usage_error>(seq, [&] { seq.commit(forged); });
  forged.pages = {1, 1};  // duplicate
  expect_rejected_unchanged<md::usage_error>(seq, [&] { seq.commit(forged); });
  forged = plan;
  forged.page_size = 8;
  expect_rejected_unchanged<md::usage_error>(seq, [&] { seq.commit(forged); });

  seq.commit(plan);
  // Committing the same plan twice: the sequence changed, the plan is stale.
  expect_rejected_unchanged<md::usage_error>(seq, [&] { seq.commit(plan); });
  // A plan made before an append or an observation is stale too.
  const auto before_append = seq.select(1);
  seq.append(md::regions::user, 1);
  expect_rejected_unchanged<md::usage_error>(seq, [&] { seq.commit(before_append); });
  const auto before_observe = seq.select(1);
  seq.observe_tokens(std::vector<float>(seq.kv_len(), 0.0f));
  expect_rejected_unchanged<md::usage_error>(seq, [&] { seq.commit(before_observe); });
}

TEST(SequenceBadInput, InconsistentPageTables) {
  md::sequence seq(small_config());
  seq.append(md::regions::user, 12);
  md::block_pool<> pool(8, 4), wrong_size(8, 8);
  pool.open(1);
  pool.append_tokens(1, 8);  // two pages, the sequence has three
  wrong_size.open(1);
  wrong_size.append_tokens(1, 12);
  const auto plan = seq.select(1);
  expect_rejected_unchanged<md::usage_error>(seq, [&] { seq.commit(plan, pool, 1); });
  EXPECT_EQ(pool.num_pages(1), 2u);
  expect_rejected_unchanged<md::usage_error>(seq, [&] { seq.commit(plan, wrong_size, 1); });
  expect_rejected_unchanged<md::usage_error>(seq, [&] { seq.commit(plan, pool, 2); });  // unknown sequence
  EXPECT_TRUE(pool.consistent());
}
