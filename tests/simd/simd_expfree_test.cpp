// The exp-free scorer (simd/expfree.hpp): against exact values and the scalar reference on random states of many
// shapes, a 10^6-step accuracy run crossing thousands of rebases, the clock's domain and rebasing rules, and
// basic_sequence's use of it (docs/simd.md, "Exp-free formulation").
#include "simd_expfree_checks.hpp"

#include <memdecay/memdecay.hpp>

namespace md = memdecay;
namespace ms = memdecay::simd;

TEST(SimdExpfree, FloatNativeIsaManyShapes) { expfree_checks::check_many_shapes<ms::native_isa, float>(); }
TEST(SimdExpfree, DoubleNativeIsaManyShapes) { expfree_checks::check_many_shapes<ms::native_isa, double>(); }
TEST(SimdExpfree, FloatScalarFallbackManyShapes) { expfree_checks::check_many_shapes<ms::isa::scalar, float>(); }
TEST(SimdExpfree, DoubleScalarFallbackManyShapes) { expfree_checks::check_many_shapes<ms::isa::scalar, double>(); }

// 10^6 steps (about 1 s optimised, 12 s at -O0); under AddressSanitizer, which looks for memory errors rather than
// accuracy, 10^5.
#if defined(__SANITIZE_ADDRESS__)
constexpr std::size_t kLongRunSteps = 100'000;
#else
constexpr std::size_t kLongRunSteps = 1'000'000;
#endif

TEST(SimdExpfree, MillionStepsFloatErrorStaysBounded) {
  const double worst = expfree_checks::long_run<ms::native_isa, float>(1000, kLongRunSteps, 1, "from 1000");
  EXPECT_LE(worst, 2 * std::numeric_limits<float>::epsilon());
}
TEST(SimdExpfree, StepsNearTheClockLimitFloat) {
  // 200K steps (0 or 1 clock step each, no jumps) ending just below 2^32 - 1: epochs, refresh clocks and ages
  // near the top of the u32 range.
  expfree_checks::long_run<ms::native_isa, float>(4'294'967'295u - 185'000u, 200'000, 2, "near u32 max", false);
}
TEST(SimdExpfree, LongRunDoubleAndScalarFallback) {
  expfree_checks::long_run<ms::native_isa, double>(1000, 100'000, 3, "double");
  expfree_checks::long_run<ms::isa::scalar, float>(1000, 100'000, 4, "scalar isa");
}

TEST(SimdExpfree, ClockDomainAndSpan) {
  using L = ms::expfree_limits<float>;
  auto clock_for = [](double base, double rate) {
    md::region_table t({{"a", 1.0, std::log(2.0) / 15.0, false}, {"b", base, rate, false}});
    return ms::expfree_clock<float>(ms::region_lut<float>(t));
  };
  // The default table: span = floor(40 / (ln 2 / 15)) = 865 steps.
  const ms::expfree_clock<float> def{ms::region_lut<float>(md::default_region_table())};
  EXPECT_TRUE(def.usable());
  EXPECT_EQ(def.span(), 865u);
  EXPECT_TRUE(clock_for(1.0, 5.0).usable());  // span 8
  EXPECT_EQ(clock_for(1.0, 5.0).span(), 8u);
  EXPECT_FALSE(clock_for(1.0, 5.5).usable());    // span 7 < min_span
  EXPECT_FALSE(clock_for(1e-25, 0.1).usable());  // f would be subnormal
  EXPECT_TRUE(clock_for(0.0, 0.1).usable());     // b = 0: no decay term at all
  EXPECT_TRUE(clock_for(L::min_base() * 1.01, 0.1).usable());
  // No decay anywhere: the epoch never needs to move.
  md::region_table flat({{"a", 1.0, 0.0, false}});
  const ms::expfree_clock<float> still{ms::region_lut<float>(flat)};
  EXPECT_TRUE(still.usable());
  EXPECT_EQ(still.span(), std::numeric_limits<md::step_t>::max());
  // needs_rebase is u32 arithmetic: a clock before the epoch (impossible through the API) also asks for one.
  ms::expfree_clock<float> c = def;
  c.set(1000, 1000);
  EXPECT_FALSE(c.needs_rebase(1000 + 865));
  EXPECT_TRUE(c.needs_rebase(1000 + 866));
  EXPECT_TRUE(c.needs_rebase(999));
  // f * g = b (to rounding), g >= 1, f <= b.
  c.set(1000, 1000 + 865);
  for (std::size_t r = 0; r < c.size(); ++r) {
    const double b = ms::region_lut<float>(md::default_region_table()).base()[r];
    EXPECT_NEAR(static_cast<double>(c.factor()[r]) * c.refresh_weight()[r], b, 4e-7 * b) << r;
    EXPECT_GE(c.refresh_weight()[r], 1.0f);
    EXPECT_LE(c.refresh_weight()[r], std::exp(40.0f));
  }
}

TEST(SimdExpfree, SequenceScoresWithTheExpfreeKernelAcrossRebasesAndEvictions) {
  // basic_sequence keeps one weight per token: after appends, clock moves (rebasing every 865 steps with the
  // default table), observations and evictions its scores match the reference within the documented bound, and a
  // fresh rebase of the same state gives the same scores.
  md::sequence seq(md::config{.page_size = 16, .normalization = md::attention_normalization::uniform});
  EXPECT_TRUE(seq.expfree_scores());  // on by default (the default table is inside the domain)
  EXPECT_FALSE(seq.use_expfree_scores(false));
  seq.append(md::regions::system, 5);
  EXPECT_TRUE(seq.use_expfree_scores());
  EXPECT_TRUE(seq.expfree_scores());
  std::mt19937_64 rng(5);
  md::step_t now = 0;
  for (int round = 0; round < 60; ++round) {
    for (int k = 0; k < 8; ++k) seq.append(static_cast<md::region_id>(1 + rng() % 6), 1 + rng() % 30);
    now += static_cast<md::step_t>(rng() % 300);
    seq.advance_to(now);
    std::vector<float> mass(seq.kv_len());
    for (auto& m : mass) m = rng() % 4 == 0 ? 2.0f / static_cast<float>(seq.kv_len()) : 0.0f;
    if (round % 3 != 2) seq.observe_tokens(mass);
    if (round % 5 == 4) seq.commit(seq.select(seq.num_pages() / 4));
    const auto got = seq.page_scores();
    std::vector<float> ref(seq.num_pages());
    md::page_scores_reference(md::token_state_of(seq), seq.regions(), 1.0f, std::span<float>(ref));
    const ms::region_lut<float> lut(seq.regions());
    const auto truth = expfree_checks::truth(md::token_state_of(seq), lut, 1.0f);
    for (std::size_t p = 0; p < ref.size(); ++p) {
      const long double tol = expfree_checks::exact_tolerance<float>(truth[p].exact, seq.state().tokens_in_page(p));
      ASSERT_LE(std::fabs(got[p] - truth[p].exact), tol) << "round " << round << " page " << p;
      ASSERT_LE(std::fabs(static_cast<long double>(got[p]) - ref[p]), 2 * tol + truth[p].arg_slack)
          << "round " << round << " page " << p;
    }
    // A fresh epoch at now over the same state: the same scores to rounding.
    ms::expfree_clock<float> clock(lut);
    std::vector<float> w(seq.kv_len()), fresh(seq.num_pages());
    ms::reset_expfree(md::token_state_of(seq), clock, std::span<float>(w));
    ms::page_scores_expfree(md::token_state_of(seq), std::span<const float>(w), clock, 1.0f, std::span<float>(fresh));
    for (std::size_t p = 0; p < ref.size(); ++p)
      ASSERT_NEAR(fresh[p], got[p], 2 * expfree_checks::exact_tolerance<float>(truth[p].exact, 16)) << p;
    // select() sees the cached scores.
    const auto status = seq.page_statuses();
    EXPECT_EQ(seq.select(3).pages, md::select_lowest_pages<float>(got, status, 3));
  }
  EXPECT_GT(now, 5u * 865u);  // several rebases crossed
  // Off again: the polynomial kernel's scores, bit for bit.
  EXPECT_FALSE(seq.use_expfree_scores(false));
  std::vector<float> poly(seq.num_pages());
  ms::page_scores(md::token_state_of(seq), ms::region_lut<float>(seq.regions()), 1.0f, std::span<float>(poly));
  EXPECT_EQ(seq.page_scores(), poly);
}

TEST(SimdExpfree, ExpfreeSequenceTracksAPolynomialOneWithinTolerance) {
  // Twin sequences on the same calls, one on the polynomial kernel: EWMA, clocks and layout stay identical (the
  // observation is the reference's in both), scores within the documented tolerance, for float and double.
  for (int twin_seed = 0; twin_seed < 4; ++twin_seed) {
    std::mt19937_64 rng(100 + twin_seed);
    md::config cfg{.page_size = std::size_t{1} << (rng() % 6)};
    md::basic_sequence<md::policies::memdecay, double> plain(cfg), fast(cfg);
    ASSERT_FALSE(plain.use_expfree_scores(false));
    ASSERT_TRUE(fast.expfree_scores());
    md::step_t now = 0;
    for (int round = 0; round < 80; ++round) {
      const auto r = static_cast<md::region_id>(rng() % 7);
      const std::size_t count = 1 + rng() % 40;
      plain.append(r, count);
      fast.append(r, count);
      now += static_cast<md::step_t>(rng() % 40);
      plain.advance_to(now);
      fast.advance_to(now);
      std::vector<double> mass(plain.kv_len());
      for (auto& m : mass) m = rng() % 5 == 0 ? 0.05 : 0.0;
      plain.observe_tokens(mass);
      fast.observe_tokens(mass);
      if (round % 7 == 6) {
        const auto plan = plain.select(plain.num_pages() / 5);
        plain.commit(plan);
        fast.commit(fast.select(plan.pages.size()));
        ASSERT_EQ(plain.digest(), fast.digest()) << "round " << round;  // same victims on this data
      }
      const auto a = plain.page_scores(), b = fast.page_scores();
      const ms::region_lut<double> lut(plain.regions());
      const auto truth = expfree_checks::truth(md::token_state_of(plain), lut, static_cast<double>(cfg.alpha));
      for (std::size_t p = 0; p < a.size(); ++p)
        ASSERT_NEAR(a[p], b[p], 4 * expfree_checks::exact_tolerance<double>(truth[p].exact, 64) + truth[p].arg_slack)
            << "round " << round << " page " << p;
    }
  }
}

TEST(SimdExpfree, SequenceOutsideTheDomainUsesThePolynomialKernel) {
  // A region decaying with half-life 0.1 steps (lambda = 6.9 > 5) is outside the float domain: the opt-in is
  // refused and the sequence scores with the exp kernel, bit for bit.
  md::config cfg;
  cfg.region_overrides.push_back({.region = "scratchpad", .half_life = 0.1});
  md::sequence seq(cfg);
  EXPECT_FALSE(seq.use_expfree_scores());
  for (int k = 0; k < 40; ++k) seq.append(static_cast<md::region_id>(k % 7), 1 + k % 13);
  seq.advance_to(37);
  std::vector<float> expected(seq.num_pages());
  ms::page_scores(md::token_state_of(seq), ms::region_lut<float>(seq.regions()), static_cast<float>(cfg.alpha),
                  std::span<float>(expected));
  EXPECT_EQ(seq.page_scores(), expected);
}
