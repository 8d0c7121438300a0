// Tests for the reference estimator of memdecay/calibration/calibration.hpp (estimator_method::references): the
// intervals it reads from trace reference events are the hand-computed ones (arrival as the first reference,
// step-censored, truncated at the episode's last step, probes outside the clock); attention does not move it; its
// bias and 95%-interval coverage on the self-test traces, whose re-references are logged as reference events; a
// trace without reference events is refused naming the method; the calibration file records the method.
#include <gtest/gtest.h>

#include <memdecay/calibration/calibration.hpp>
#include <memdecay/calibration/file.hpp>
#include <memdecay/calibration/selftest.hpp>

#include "support/calibration_cases.hpp"

#include <cmath>
#include <cstdio>
#include <numbers>
#include <string>
#include <tuple>
#include <vector>

namespace md = memdecay;
namespace tr = memdecay::trace;
namespace cal = memdecay::calibration;
namespace st = memdecay::calibration::selftest;
namespace iv = memdecay::calibration::intervals;

namespace {

cal::estimator_options references_method() {
  cal::estimator_options o;
  o.method = cal::estimator_method::references;
  return o;
}

md::region_table two_regions() {
  return md::region_table(std::vector<md::region_params>{{"a", 0.5, 0.01, false}, {"b", 0.5, 0.01, false}});
}

// Episode e of a hand-built trace (k = e % 5): region a's token 0 arrives at step 0 and is referenced at steps 1
// (twice), 3 + k and 9 + k; region b's tokens 1-2 arrive at step 1 and are referenced together at step 5 + k, token
// 3 arrives at step 2 and is referenced with token 2 at step 7 + k (the span's clock starts at its latest
// reference, 5 + k); a probe at step 40 and an attention row at step 20 + k set the window's end to 20 + k, not 40.
tr::trace_file hand_built(std::size_t episodes) {
  tr::trace_file f;
  f.label = "hand";
  f.region_names = {"a", "b"};
  for (std::size_t e = 0; e < episodes; ++e) {
    const auto k = static_cast<md::step_t>(e % 5);
    tr::episode ep;
    ep.name = "hand/" + std::to_string(e);
    ep.events.emplace_back(tr::segment{0, 0, 1});
    ep.events.emplace_back(tr::segment{1, 1, 2});
    ep.events.emplace_back(tr::reference{1, 0, 1});  // the step after arrival: an interval of (0, 1]
    ep.events.emplace_back(tr::reference{1, 0, 1});  // the same step again: no interval
    ep.events.emplace_back(tr::segment{2, 1, 1});
    ep.events.emplace_back(tr::reference{static_cast<md::step_t>(3 + k), 0, 1});
    ep.events.emplace_back(tr::reference{static_cast<md::step_t>(5 + k), 1, 2});
    ep.events.emplace_back(tr::reference{static_cast<md::step_t>(7 + k), 2, 2});
    ep.events.emplace_back(tr::reference{static_cast<md::step_t>(9 + k), 0, 1});
    tr::attention a{static_cast<md::step_t>(20 + k), 4, {tr::attention_row{false, {}, {0.7f, 0.1f, 0.1f, 0.1f}}}};
    ep.events.emplace_back(a);
    ep.events.emplace_back(tr::probe{40, 0, 0, 0, 1});
    f.episodes.push_back(std::move(ep));
  }
  return f;
}

using calibration_cases::small_config;
using calibration_cases::table_for;

}  // namespace

TEST(CalibrationReferences, FitsTheIntervalsBetweenLoggedReferences) {
  const std::vector<tr::trace_file> traces{hand_built(10)};
  auto o = references_method();
  o.min_intervals = 2;
  const auto c = cal::estimate(traces, o, two_regions());
  // The same fit from the samples written out by hand: (to_prev, to_end, window) per interval, one group per
  // episode (10 episodes, 10 jackknife groups).
  std::vector<std::vector<iv::sample>> a(10), b(10);
  for (std::size_t e = 0; e < 10; ++e) {
    const double k = static_cast<double>(e % 5), end = 20 + k;
    a[e] = {{0, 1, end}, {1 + k, 2 + k, end - 1}, {5, 6, end - 3 - k}};
    b[e] = {{3 + k, 4 + k, end - 1}, {1, 2, end - 5 - k}};  // one interval per reference, not per token
  }
  for (auto [name, groups, count] : {std::tuple{"a", &a, 30u}, std::tuple{"b", &b, 20u}}) {
    const auto* r = c.find(name);
    ASSERT_NE(r, nullptr);
    EXPECT_EQ(r->fit.samples, count) << name;
    EXPECT_EQ(r->fit.episodes, 10u) << name;
    const auto want = iv::fit_rate(*groups, groups->size(), o.min_half_life, o.max_half_life);
    ASSERT_EQ(want.outcome, iv::rate_outcome::ok);
    ASSERT_TRUE(r->fit.half_life.has_value()) << name << ": " << r->fit.reason;
    EXPECT_NEAR(*r->fit.half_life, std::numbers::ln2 / want.lambda, 1e-9 * *r->fit.half_life) << name;
  }
  for (const auto& r : c.regions) EXPECT_TRUE(r.layers.empty()) << r.name;  // references carry no layers
  EXPECT_EQ(c.estimator.method, cal::estimator_method::references);
}

TEST(CalibrationReferences, AttentionDoesNotMoveIt) {
  // The self-test traces carry both: attention with bursts at the re-references, and the references themselves.
  // Without the attention rows (an engine that never sees attention) the reference fit is the same.
  const auto c = small_config();
  const std::vector<tr::trace_file> with{st::build(c, 7)};
  auto without = with;
  for (auto& ep : without[0].episodes)
    std::erase_if(ep.events, [](const tr::event& e) { return std::holds_alternative<tr::attention>(e); });
  const md::region_table base = table_for(c);
  const auto x = cal::estimate(with, references_method(), base);
  const auto y = cal::estimate(without, references_method(), base);
  ASSERT_EQ(x.regions.size(), y.regions.size());
  for (std::size_t r = 0; r < x.regions.size(); ++r) {
    EXPECT_EQ(x.regions[r].fit, y.regions[r].fit) << x.regions[r].name;
    EXPECT_TRUE(x.regions[r].calibrated()) << x.regions[r].name << ": " << x.regions[r].fit.reason;
  }
}

// The measurement docs/calibration.md reports (there with memdecay-calibrate --self-test and more replicates):
// the reference estimator on the same traces as the refresh-interval estimator, with the truth the generator's
// refresh half-life. Its bias must be small and its 95% intervals must hold the truth in about 95% of the replicates.
TEST(CalibrationReferences, BiasAndCoverageOverReplicates) {
  const auto c = small_config();
  const std::size_t replicates = 40;
  const auto r = st::measure(c, references_method(), replicates, /*seed=*/1000);  // the refresh test's replicates
  for (const auto& rr : r.regions) {
    std::printf("%-6s true %5.1f  calibrated %zu/%zu  mean %6.2f  bias %+5.1f%%  rmse %4.1f%%  coverage %.3f\n",
                rr.name.c_str(), rr.truth, rr.calibrated, replicates, rr.mean_half_life, 100 * rr.bias, 100 * rr.rmse,
                rr.coverage);
    EXPECT_EQ(rr.calibrated, replicates) << rr.name;
    EXPECT_LT(std::abs(rr.bias), 0.05) << rr.name;
  }
  std::printf("coverage over every region and replicate: %.3f (%zu of %zu)\n", r.coverage(), r.covered, r.calibrated);
  EXPECT_GE(r.coverage(), 0.85);
  EXPECT_LE(r.coverage(), 0.99);
}

TEST(CalibrationReferences, TracesWithoutReferencesAreRefusedNamingTheMethod) {
  auto f = hand_built(4);
  for (auto& ep : f.episodes)
    std::erase_if(ep.events, [](const tr::event& e) { return std::holds_alternative<tr::reference>(e); });
  const std::vector<tr::trace_file> traces{f};
  try {
    (void)cal::estimate(traces, references_method(), two_regions());
    FAIL() << "accepted a trace without reference events";
  } catch (const md::input_error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("reference-interval-mle-jackknife"), std::string::npos) << m;
    EXPECT_NE(m.find("no reference events"), std::string::npos) << m;
  }
}

TEST(CalibrationReferences, TooFewIntervalsSayWhichIntervals) {
  const std::vector<tr::trace_file> traces{hand_built(4)};
  const auto c = cal::estimate(traces, references_method(), two_regions());  // min_intervals 50
  for (const auto& r : c.regions) {
    EXPECT_FALSE(r.calibrated());
    EXPECT_NE(r.fit.reason.find("too few reference intervals"), std::string::npos) << r.fit.reason;
  }
}

TEST(CalibrationReferences, FileRecordsTheMethod) {
  const std::vector<tr::trace_file> traces{hand_built(10)};
  auto o = references_method();
  o.min_intervals = 2;
  const auto fitted = cal::estimate(traces, o, two_regions());
  const std::string text = cal::to_json(fitted);
  EXPECT_NE(text.find("\"method\": \"reference-interval-mle-jackknife\""), std::string::npos) << text;
  const auto back = cal::parse_or_throw(text, "x.json");
  EXPECT_EQ(back, fitted);
  EXPECT_EQ(cal::estimator_method_from_string("references"), cal::estimator_method::references);
}
