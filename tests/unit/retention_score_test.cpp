// Tests for retention_score.hpp: hand-computed examples of s = b * exp(-lambda * dt) + alpha * a.
#include <gtest/gtest.h>

#include <memdecay/core/retention_score.hpp>

#include <cmath>

namespace md = memdecay;

TEST(RetentionScore, HandComputedExamples) {
  // A fresh token (dt = 0) scores its base priority plus the attention term.
  EXPECT_DOUBLE_EQ(md::retention_score(0.8, 0.1, 0.0, 2.0, 0.25), 0.8 + 0.5);
  // One half-life later the decay term has halved: lambda = ln2/10, dt = 10.
  EXPECT_NEAR(md::retention_score(0.8, std::log(2.0) / 10.0, 10.0, 0.0, 0.0), 0.4, 1e-15);
  // Three half-lives: 1/8 of b.
  EXPECT_NEAR(md::decay_term(1.0, std::log(2.0) / 15.0, 45.0), 0.125, 1e-15);
  // b = 0.5, lambda = 0.2, dt = 5: 0.5 * e^-1 = 0.18393972058572117; plus 1.5 * 0.1.
  EXPECT_NEAR(md::retention_score(0.5, 0.2, 5.0, 1.5, 0.1), 0.18393972058572117 + 0.15, 1e-15);
  // No decay (lambda = 0) keeps b forever.
  EXPECT_DOUBLE_EQ(md::decay_term(0.7, 0.0, 1e9), 0.7);
  // The float instantiation agrees with the double one to float precision.
  EXPECT_NEAR(md::retention_score(0.5f, 0.2f, 5.0f, 1.5f, 0.1f), 0.33393972058572117, 1e-7);
}

TEST(RetentionScore, TermsFromTheRegionTable) {
  const auto table = md::default_region_table();
  const double h = table[md::regions::scratchpad].half_life();
  const auto at_half_life =
      md::token_score_terms<double>(table, md::regions::scratchpad, 100, static_cast<md::step_t>(100 + h), 3.0, 0.5);
  // dt is an integer number of steps: compare with the exact integer age.
  const double age = static_cast<double>(static_cast<md::step_t>(100 + h) - 100);
  EXPECT_NEAR(at_half_life.decay, 0.3 * std::exp(-table.decay_rate(md::regions::scratchpad) * age), 1e-15);
  EXPECT_DOUBLE_EQ(at_half_life.attention, 1.5);
  EXPECT_DOUBLE_EQ(at_half_life.total(), at_half_life.decay + 1.5);
  // The system prompt decays ~10x slower than the scratchpad.
  const auto sys = md::token_score_terms<double>(table, md::regions::system, 0, 50, 0.0, 0.0);
  const auto pad = md::token_score_terms<double>(table, md::regions::scratchpad, 0, 50, 0.0, 0.0);
  EXPECT_GT(sys.decay / 1.0, 0.8);
  EXPECT_LT(pad.decay / 0.3, 0.11);
}

TEST(RetentionScore, MonotoneInAgeAndAttention) {
  double previous = 2.0;
  for (int dt = 0; dt < 200; dt += 7) {
    const double s = md::retention_score(1.0, 0.05, static_cast<double>(dt), 1.0, 0.0);
    EXPECT_LT(s, previous);
    previous = s;
  }
  EXPECT_LT(md::retention_score(1.0, 0.05, 10.0, 1.0, 0.1), md::retention_score(1.0, 0.05, 10.0, 1.0, 0.2));
}
