// Tests for ewma_tracker.hpp: the EWMA update and the refresh rule, by hand.
#include <gtest/gtest.h>

#include <memdecay/core/ewma_tracker.hpp>

#include <cmath>
#include <random>
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

TEST(EwmaTracker, UpdateIsOneFusedMultiplyAddWhateverTheBuildFlags) {
  // ewma_step = beta * a + rounded((1 - beta) * x) with a single rounding of the sum: the correctly rounded value
  // of that expression (computed here in long double, exact for float operands up to a double rounding that is
  // negligibly rare), on every build. observe_tokens_reference applies exactly it. Also counts how often the
  // unfused float sum would differ, to show the difference is real.
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<float> u(0.0f, 4.0f), b(0.0f, 0.999f);
  int differs_from_unfused = 0;
  for (int k = 0; k < 100000; ++k) {
    const float a = u(rng), x = u(rng), beta = b(rng);
    const float omb_x = (1.0f - beta) * x;
    const float exact = static_cast<float>(static_cast<long double>(beta) * a + static_cast<long double>(omb_x));
    const float got = md::ewma_step(a, x, beta);
    ASSERT_EQ(got, exact) << a << " " << x << " " << beta;
    volatile float product = beta * a;  // volatile: no contraction into an FMA
    if (product + omb_x != got) ++differs_from_unfused;
    std::vector<float> ewma{a};
    std::vector<md::step_t> clocks{0};
    const std::vector<float> mass{x};
    md::observe_tokens_reference<float>(ewma, clocks, mass, 1, {.beta = beta, .tau = 10.0f, .scale = 1.0f});
    ASSERT_EQ(ewma[0], got);
  }
  EXPECT_GT(differs_from_unfused, 1000);
}
