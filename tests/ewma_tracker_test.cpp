// Tests for ewma_tracker.hpp: the EWMA update and the refresh rule, by hand.
#include <gtest/gtest.h>

#include <memdecay/ewma_tracker.hpp>

#include <vector>

namespace md = memdecay;

TEST(EwmaTracker, UpdatesEveryTokenAndRefreshesAboveTau) {
  std::vector<double> ewma{0.0, 1.0, 0.5};
  std::vector<md::step_t> refreshed{0, 0, 0};
  const std::vector<double> mass{0.2, 0.0, 0.05};
  const md::observation_params<double> p{.beta = 0.75, .tau = 0.1, .scale = 1.0};
  const std::size_t n = md::observe_tokens_reference<double>(ewma, refreshed, mass, 9, p);
  EXPECT_EQ(n, 1u);
  EXPECT_DOUBLE_EQ(ewma[0], 0.25 * 0.2);
  EXPECT_DOUBLE_EQ(ewma[1], 0.75);
  EXPECT_DOUBLE_EQ(ewma[2], 0.75 * 0.5 + 0.25 * 0.05);
  EXPECT_EQ(refreshed, (std::vector<md::step_t>{9, 0, 0}));
}

TEST(EwmaTracker, ThresholdIsStrictAndAppliesToTheNormalisedMass) {
  std::vector<float> ewma(3, 0.0f);
  std::vector<md::step_t> refreshed(3, 0);
  const std::vector<float> mass{0.5f / 3, 1.0f / 3, 1.5f / 3};  // x = 0.5, 1, 1.5 times uniform
  const md::observation_params<float> p{.beta = 0.0f, .tau = 1.0f, .scale = 3.0f};
  EXPECT_EQ(md::observe_tokens_reference<float>(ewma, refreshed, mass, 4, p), 1u);
  EXPECT_EQ(refreshed, (std::vector<md::step_t>{0, 0, 4}));  // exactly tau does not refresh
  EXPECT_FLOAT_EQ(ewma[2], 1.5f);                            // beta = 0: the EWMA is the last observation
}

TEST(EwmaTracker, ConvergesToAConstantObservation) {
  std::vector<double> ewma{0.0};
  std::vector<md::step_t> refreshed{0};
  const std::vector<double> mass{0.4};
  const md::observation_params<double> p{.beta = 0.9, .tau = 1.0, .scale = 1.0};
  for (int i = 0; i < 400; ++i) md::observe_tokens_reference<double>(ewma, refreshed, mass, 1, p);
  EXPECT_NEAR(ewma[0], 0.4, 1e-12);
}
