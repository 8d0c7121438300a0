// Tests for the excess-decay calibration estimator (memdecay/calibration/calibration.hpp, estimator_method::excess_decay; the
// refresh-interval estimator, the default, is tested in calibration_intervals_test.cpp): half-lives recovered from synthetic traces
// generated with known, non-default half-lives (within 10%, with per-layer fits on a multi-layer trace); an exact
// hand-built trace; too few samples or episodes give "uncalibrated" and keep the default; input and option errors.
#include <gtest/gtest.h>

#include <memdecay/calibration/calibration.hpp>
#include <memdecay/io/trace_generator.hpp>

#include <array>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace md = memdecay;
namespace tr = memdecay::trace;
namespace cal = memdecay::calibration;

namespace {

// Half-lives unlike the defaults (170 120 80 30 40 100 15) and in another order, so a fit that returned the
// default table could not pass.
constexpr std::array<double, 7> chosen{60.0, 150.0, 45.0, 20.0, 70.0, 35.0, 10.0};

// The generator's h_r is the fading of excess attention, which is what the excess-decay estimator measures.
cal::estimator_options decay() {
  cal::estimator_options o;
  o.method = cal::estimator_method::excess_decay;
  return o;
}

tr::trace_file generated(std::uint32_t tokens, std::size_t episodes, std::uint32_t layers,
                         const std::array<double, 7>& half_lives) {
  auto c = tr::tier_config(tokens, /*seed=*/3);
  c.layers = layers;
  for (std::size_t r = 0; r < half_lives.size(); ++r) c.attention[r].half_life = half_lives[r];
  tr::trace_file f;
  f.label = "tier-" + std::to_string(tokens);
  f.layers = layers;
  f.region_names = tr::default_region_names();
  for (std::size_t k = 0; k < episodes; ++k)
    f.episodes.push_back(tr::generate_episode(c, tr::episode_seed(c, k), f.label + "/" + std::to_string(k)));
  return f;
}

void expect_recovered(const cal::curve_fit& f, double truth, const std::string& what) {
  ASSERT_EQ(f.status, cal::fit_status::calibrated) << what << ": " << f.reason;
  ASSERT_TRUE(f.half_life && f.half_life_ci && f.floor && f.amplitude) << what;
  const double error = *f.half_life / truth - 1.0;
  std::printf("%-26s true %6.1f  fitted %7.2f  error %+5.1f%%  95%% interval [%.1f, %.1f]  samples %llu\n",
              what.c_str(), truth, *f.half_life, 100.0 * error, f.half_life_ci->lower, f.half_life_ci->upper,
              static_cast<unsigned long long>(f.samples));
  EXPECT_LT(std::abs(error), 0.10) << what;
  EXPECT_LE(f.half_life_ci->lower, *f.half_life) << what;
  EXPECT_GE(f.half_life_ci->upper, *f.half_life) << what;
  EXPECT_GT(*f.amplitude, 0.0) << what;
}

TEST(Calibration, RecoversChosenHalfLivesWithinTenPercent) {
  const std::vector<tr::trace_file> traces{generated(450, 40, 1, chosen), generated(1700, 24, 1, chosen)};
  const auto c = cal::estimate(traces, decay());
  ASSERT_EQ(c.regions.size(), 7u);
  const auto defaults = md::default_region_table();
  for (std::size_t r = 0; r < 7; ++r) {
    const auto& reg = c.regions[r];
    EXPECT_EQ(reg.name, defaults[static_cast<md::region_id>(r)].name);
    EXPECT_EQ(reg.base_priority, defaults[static_cast<md::region_id>(r)].base_priority);
    expect_recovered(reg.fit, chosen[r], reg.name);
    EXPECT_DOUBLE_EQ(reg.decay_rate, std::numbers::ln2 / *reg.fit.half_life);
    EXPECT_TRUE(reg.layers.empty());  // one layer: no per-layer fits
    EXPECT_GE(reg.fit.episodes, 40u);
  }
  EXPECT_EQ(c.source.traces.size(), 2u);
  EXPECT_EQ(c.source.traces[1].label, "tier-1700");
  EXPECT_FALSE(c.check().has_value());
}

TEST(Calibration, PerLayerFitsOnAMultiLayerTrace) {
  // Three layers with different amplitudes (0.5, 1, 1.5 x A_r) and sink weights, the same half-lives.
  const std::array<double, 7> half_lives{50.0, 70.0, 40.0, 20.0, 45.0, 30.0, 12.0};
  const std::vector<tr::trace_file> traces{generated(1700, 10, 3, half_lives)};
  cal::estimator_options o = decay();
  o.passes = 8;  // keeps the debug build's test short; the fits have settled by then on this trace
  const auto c = cal::estimate(traces, o);
  for (std::size_t r = 0; r < 7; ++r) {
    const auto& reg = c.regions[r];
    ASSERT_EQ(reg.layers.size(), 3u) << reg.name;
    expect_recovered(reg.fit, half_lives[r], reg.name + " (layer mean)");
    // The weakest layer (amplitude 0.5 x A_r) carries the least signal; every layer that is calibrated must be
    // within 10%, and the strong layers must be calibrated.
    for (std::size_t l = 0; l < 3; ++l) {
      const auto& f = reg.layers[l];
      if (l == 0 && f.status == cal::fit_status::uncalibrated) continue;
      expect_recovered(f, half_lives[r], reg.name + " layer " + std::to_string(l));
    }
  }
}

// A trace built by hand with exactly exponential excess attention: region 0 (half-life 8) and region 1
// (half-life 30) arrive a few tokens per step, so every row holds many ages; rows are normalised; no noise.
TEST(Calibration, ExactExponentialTraceIsFittedClosely) {
  tr::trace_file f;
  f.label = "exact";
  f.region_names = {"a", "b"};
  const double h[2] = {8.0, 30.0}, amp[2] = {4.0, 2.0}, floor[2] = {1.0, 0.5};
  for (int e = 0; e < 6; ++e) {
    tr::episode ep;
    ep.name = "exact/" + std::to_string(e);
    std::vector<md::region_id> label;
    std::vector<md::step_t> arrival;
    for (md::step_t t = 0; t < 160; ++t) {
      for (md::region_id r = 0; r < 2; ++r) {
        const std::uint32_t n = 3 + static_cast<std::uint32_t>((t * 7 + e + r) % 4);
        ep.events.emplace_back(tr::segment{t, r, n});
        label.insert(label.end(), n, r);
        arrival.insert(arrival.end(), n, t);
      }
      std::vector<float> row(label.size());
      double sum = 0;
      for (std::size_t j = 0; j < row.size(); ++j) {
        const double w =
            floor[label[j]] + amp[label[j]] * std::exp2(-static_cast<double>(t - arrival[j]) / h[label[j]]);
        row[j] = static_cast<float>(w);
        sum += w;
      }
      for (auto& m : row) m = static_cast<float>(m / sum);
      ep.events.emplace_back(
          tr::attention{t, static_cast<std::uint32_t>(row.size()), {tr::attention_row{false, {}, row}}});
    }
    f.episodes.push_back(std::move(ep));
  }
  md::region_table base({{"a", 0.5, 0.1, false}, {"b", 0.7, 0.01, false}});
  cal::estimator_options o = decay();
  o.sink_positions = 0;
  o.recent_positions = 0;
  const auto c = cal::estimate(std::vector{f}, o, base);
  for (int r = 0; r < 2; ++r) {
    const auto& fit = c.regions[r].fit;
    ASSERT_EQ(fit.status, cal::fit_status::calibrated) << fit.reason;
    EXPECT_NEAR(*fit.half_life / h[r], 1.0, 0.02) << c.regions[r].name;
    // The floor-to-amplitude ratio is scale-free, so it is recovered too.
    EXPECT_NEAR(*fit.floor / *fit.amplitude, floor[r] / amp[r], 0.02 * floor[r] / amp[r] + 0.01);
    EXPECT_EQ(c.regions[r].base_priority, base[static_cast<md::region_id>(r)].base_priority);
  }
}

TEST(Calibration, TooFewSamplesOrEpisodesIsUncalibratedAndKeepsTheDefault) {
  const std::vector<tr::trace_file> traces{generated(450, 3, 1, chosen)};
  const auto defaults = md::default_region_table();
  {
    const auto c = cal::estimate(traces, decay());  // 3 episodes < min_episodes 4
    for (std::size_t r = 0; r < 7; ++r) {
      const auto& reg = c.regions[r];
      EXPECT_EQ(reg.fit.status, cal::fit_status::uncalibrated) << reg.name;
      EXPECT_NE(reg.fit.reason.find("too few episodes ("), std::string::npos) << reg.fit.reason;
      EXPECT_NE(reg.fit.reason.find(", the minimum is 4)"), std::string::npos) << reg.fit.reason;
      EXPECT_LE(reg.fit.episodes, 3u);
      EXPECT_FALSE(reg.fit.half_life_ci.has_value());
      EXPECT_EQ(reg.decay_rate, defaults[static_cast<md::region_id>(r)].decay_rate) << reg.name;
    }
    // Applied to the defaults, an all-uncalibrated calibration changes no decay rate.
    const auto applied = c.apply(defaults);
    for (std::size_t r = 0; r < 7; ++r)
      EXPECT_EQ(applied.decay_rate(static_cast<md::region_id>(r)), defaults.decay_rate(static_cast<md::region_id>(r)));
  }
  {
    cal::estimator_options o = decay();
    o.min_episodes = 2;
    o.min_samples = 1'000'000'000;
    o.passes = 2;
    const auto c = cal::estimate(traces, o);
    for (const auto& reg : c.regions) {
      EXPECT_FALSE(reg.calibrated());
      EXPECT_NE(reg.fit.reason.find("too few samples"), std::string::npos) << reg.fit.reason;
      EXPECT_GT(reg.fit.samples, 0u);
    }
  }
}

TEST(Calibration, RegionWithoutTokensIsUncalibrated) {
  // Only region 1 ever appears; region 0 has no samples at all.
  tr::trace_file f;
  f.label = "one-region";
  f.region_names = {"x", "y"};
  for (int e = 0; e < 4; ++e) {
    tr::episode ep;
    ep.name = "e" + std::to_string(e);
    ep.events.emplace_back(tr::segment{0, 1, 64});
    ep.events.emplace_back(tr::attention{1, 64, {tr::attention_row{false, {}, std::vector<float>(64, 1.0f / 64)}}});
    f.episodes.push_back(std::move(ep));
  }
  md::region_table base({{"x", 0.5, 0.1, false}, {"y", 0.5, 0.2, false}});
  const auto c = cal::estimate(std::vector{f}, decay(), base);
  EXPECT_EQ(c.regions[0].fit.samples, 0u);
  EXPECT_EQ(c.regions[0].fit.status, cal::fit_status::uncalibrated);
  EXPECT_NE(c.regions[0].fit.reason.find("too few samples (0"), std::string::npos) << c.regions[0].fit.reason;
  EXPECT_EQ(c.regions[0].decay_rate, 0.1);
  EXPECT_EQ(c.regions[1].fit.status, cal::fit_status::uncalibrated);  // flat, few: never fitted to noise
  EXPECT_EQ(c.regions[1].decay_rate, 0.2);
}

TEST(Calibration, InputAndOptionErrors) {
  const auto good = generated(450, 2, 1, chosen);
  EXPECT_THROW((void)cal::estimate(std::vector<tr::trace_file>{}), md::input_error);
  auto renamed = good;
  renamed.region_names[3] = "tools";
  try {
    (void)cal::estimate(std::vector{good, renamed});
    FAIL() << "different region names accepted";
  } catch (const md::input_error& e) {
    EXPECT_NE(std::string(e.what()).find("lists other region names"), std::string::npos) << e.what();
  }
  try {
    (void)cal::estimate(std::vector{renamed});
    FAIL() << "region missing from the base table accepted";
  } catch (const md::input_error& e) {
    EXPECT_NE(std::string(e.what()).find("trace region 'tools' is not in the base region table"), std::string::npos)
        << e.what();
  }
  auto expect_option_error = [&](cal::estimator_options o, const std::string& text) {
    try {
      (void)cal::estimate(std::vector{good}, o);
      FAIL() << "accepted: " << text;
    } catch (const md::config_error& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  expect_option_error({.min_episodes = 1}, "min_episodes = 1");
  expect_option_error({.max_ci_ratio = 1.0}, "max_ci_ratio = 1");
  expect_option_error({.refresh_ratio = std::nan("")}, "refresh_ratio = nan");
  expect_option_error({.min_half_life = 10, .max_half_life = 20}, "half-life search range [10, 20]");
  expect_option_error({.passes = 0}, "passes = 0");
  expect_option_error({.jackknife_groups = 1}, "jackknife_groups = 1");
  expect_option_error({.max_age_bins = 2}, "max_age_bins = 2");
  EXPECT_THROW((void)cal::estimate(std::vector{good}, {}, md::default_region_table(), {.alpha = -1.0}),
               md::config_error);
  // A valid trace whose run-length segment claims billions of tokens is refused before anything is expanded.
  tr::trace_file huge;
  huge.label = "huge";
  huge.region_names = tr::default_region_names();
  huge.episodes.push_back({"huge/0", 0, {tr::segment{0, 0, 4'000'000'000u}}});
  ASSERT_FALSE(tr::check(huge).has_value());
  try {
    (void)cal::estimate(std::vector{huge});
    FAIL();
  } catch (const md::input_error& e) {
    EXPECT_NE(std::string(e.what()).find("episode 'huge/0' of 'huge' holds 4000000000 tokens"), std::string::npos)
        << e.what();
  }
}

}  // namespace
