// Checks of the exp-free scorer (simd/expfree.hpp), instantiated per isa by tests/simd/simd_expfree_test.cpp (native
// isa and the 1-lane fallback) and tests/simd_expfree_isa_test.cpp (AVX2 / AVX-512 under #pragma GCC target).
//
// Include order matters for the forced-isa tests: every header but the memdecay/simd ones must already be
// included before this file, so that only the SIMD code is compiled for the forced target.
#ifndef MEMDECAY_TESTS_SIMD_EXPFREE_CHECKS_HPP
#define MEMDECAY_TESTS_SIMD_EXPFREE_CHECKS_HPP

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <memdecay/core/eviction.hpp>
#include <memdecay/core/ewma_tracker.hpp>
#include <memdecay/core/region.hpp>
#include <memdecay/core/sequence_state.hpp>

#include <memdecay/simd/expfree.hpp>
#include <memdecay/simd/score_kernel.hpp>

namespace expfree_checks {

namespace md = memdecay;
namespace ms = memdecay::simd;

/// The decay term b_r * exp(-lambda_r * age), evaluated in long double with the Float-rounded b and lambda the
/// kernels use (the "exact" value both the kernel and the reference approximate).
template <class Float>
long double exact_decay(const ms::region_lut<Float>& lut, md::region_id r, md::step_t age) {
  return static_cast<long double>(lut.base()[r]) *
         std::exp(static_cast<long double>(lut.neg_rate()[r]) * static_cast<long double>(age));
}

/// Per page: the exact mean score, and the bound |kernel - exact|, |kernel - reference| must satisfy.
template <class Float>
struct page_truth {
  long double exact = 0;      ///< mean of exact decay + alpha * ewma
  long double arg_slack = 0;  ///< mean over tokens of decay * (lambda * age + 2) * eps: the reference's own error
};

template <class Float, std::size_t PageSize>
std::vector<page_truth<Float>> truth(const md::token_state<Float, PageSize>& s, const ms::region_lut<Float>& lut,
                                     Float alpha) {
  std::vector<page_truth<Float>> out(s.num_pages());
  const long double eps = std::numeric_limits<Float>::epsilon();
  for (std::size_t p = 0; p < s.num_pages(); ++p) {
    const std::size_t n = s.tokens_in_page(p);
    for (std::size_t i = p * s.page_size(); i < p * s.page_size() + n; ++i) {
      const md::region_id r = s.regions()[i];
      const md::step_t age = s.now() - s.last_refresh()[i];
      const long double d = exact_decay(lut, r, age);
      out[p].exact += d + static_cast<long double>(alpha) * static_cast<long double>(s.ewma()[i]);
      // double: f_r and g_r carry exponents up to L rounded to double, which cancel for tokens refreshed after
      // the epoch: 2 L eps more (float computes them in double: negligible).
      const long double cancel = std::same_as<Float, double> ? 2 * ms::expfree_limits<Float>::max_exponent : 0.0;
      out[p].arg_slack += d * (-static_cast<long double>(lut.neg_rate()[r]) * age + 2 + cancel) * eps;
    }
    out[p].exact /= static_cast<long double>(n);
    out[p].arg_slack /= static_cast<long double>(n);
  }
  return out;
}

/// Absolute floor: decay terms below the float range (flushed weights, subnormal products), per token.
template <class Float>
constexpr long double abs_floor() {
  return std::same_as<Float, float> ? 1e-36L : 1e-300L;
}

/// |kernel - exact| <= (4 + n) eps |exact| + floor (1.5 ulp for f * w, 1 for the fma, n for the page sum).
template <class Float>
long double exact_tolerance(long double exact, std::size_t n) {
  return static_cast<long double>(4 + n) * std::numeric_limits<Float>::epsilon() * std::fabs(exact) +
         abs_floor<Float>();
}

/// The fastest decay rate inside the domain: span() == min_span.
template <class Float>
double expfree_fastest() {
  return ms::expfree_limits<Float>::max_exponent / static_cast<double>(ms::expfree_limits<Float>::min_span);
}

struct worst_seen {
  double vs_exact = 0;
  double vs_reference = 0;
};

/// Compares the exp-free pages of `s` (weights `w`, clock at s.now()) with the exact values and the reference.
template <ms::isa A, std::size_t PageSize, class Float>
void check_scores(const md::token_state<Float, PageSize>& s, const std::vector<Float>& got,
                  const md::region_table& table, const ms::region_lut<Float>& lut, Float alpha,
                  const std::string& where, worst_seen& worst) {
  const auto t = truth(s, lut, alpha);
  std::vector<Float> ref(s.num_pages());
  md::page_scores_reference(s, table, alpha, std::span<Float>(ref));
  for (std::size_t p = 0; p < s.num_pages(); ++p) {
    const std::size_t n = s.tokens_in_page(p);
    const long double g = got[p];
    // Double computes f_r and w_i from exponents rounded to double: the same argument error as the reference's.
    const long double tol =
        exact_tolerance<Float>(t[p].exact, n) + (std::same_as<Float, double> ? t[p].arg_slack : 0.0L);
    ASSERT_LE(std::fabs(g - t[p].exact), tol) << where << " page " << p << " exact " << static_cast<double>(t[p].exact);
    // The reference's error is its own (exponent argument rounded to Float) plus the same rounding as ours.
    const long double ref_tol = 2 * tol + t[p].arg_slack;
    ASSERT_LE(std::fabs(g - static_cast<long double>(ref[p])), ref_tol) << where << " page " << p;
    if (t[p].exact > 1e-30L) {
      worst.vs_exact = std::max(worst.vs_exact, static_cast<double>(std::fabs(g - t[p].exact) / t[p].exact));
      worst.vs_reference = std::max(worst.vs_reference, static_cast<double>(std::fabs(g - ref[p]) / t[p].exact));
    }
  }
}

/// Every stored weight is 0 or a finite normal number (no overflow, no subnormal, no NaN).
template <class Float>
void check_weights_normal(const std::vector<Float>& w, const std::string& where) {
  for (std::size_t i = 0; i < w.size(); ++i)
    ASSERT_TRUE(w[i] == 0 || (std::isfinite(w[i]) && w[i] >= std::numeric_limits<Float>::min()))
        << where << " token " << i << " w = " << w[i];
}

/// A state of `tokens` random tokens, clocks at or before `now`.
template <class Float, std::size_t PageSize>
md::token_state<Float, PageSize> random_state(std::size_t tokens, std::size_t page_size, std::size_t regions,
                                              md::step_t now, std::mt19937_64& rng) {
  md::token_state<Float, PageSize> s(page_size);
  std::vector<md::region_span> spans;
  for (std::size_t done = 0; done < tokens;) {
    const std::size_t run = std::min<std::size_t>(tokens - done, rng() % 3 == 0 ? 1 : 1 + rng() % 40);
    spans.push_back({static_cast<md::region_id>(rng() % regions), run});
    done += run;
  }
  s.append(spans);
  s.advance_to(now);
  auto lr = s.last_refresh_mut();
  auto ew = s.ewma_mut();
  std::uniform_real_distribution<Float> ewma(Float{0}, Float{3});
  for (std::size_t i = 0; i < tokens; ++i) {
    switch (rng() % 4) {
      case 0: lr[i] = now; break;
      case 1: lr[i] = now - static_cast<md::step_t>(rng() % std::min<std::uint64_t>(64, now + 1ull)); break;
      case 2: lr[i] = now - static_cast<md::step_t>(rng() % std::min<std::uint64_t>(5000, now + 1ull)); break;
      default: lr[i] = static_cast<md::step_t>(rng() % (static_cast<std::uint64_t>(now) + 1)); break;
    }
    ew[i] = rng() % 5 == 0 ? Float{0} : ewma(rng);
  }
  return s;
}

/// One random state: rebase at `now0`, score at now0 + d (d <= span), a fused observation there (against the
/// reference observation and against the sync pass basic_sequence runs), then scores d2 steps later.
template <ms::isa A, std::size_t PageSize, class Float>
void check_one(std::size_t tokens, std::size_t page_size, const md::region_table& table, md::step_t now0,
               std::uint64_t seed, worst_seen& worst) {
  std::mt19937_64 rng(seed);
  auto s = random_state<Float, PageSize>(tokens, page_size, table.size(), now0, rng);
  const ms::region_lut<Float> lut(table);
  ms::expfree_clock<Float> clock(lut);
  ASSERT_TRUE(clock.usable());
  const Float alpha = static_cast<Float>(0.7);
  const std::string where = std::string(ms::to_string(A)) + " tokens=" + std::to_string(tokens) +
                            " page=" + std::to_string(page_size) + " regions=" + std::to_string(table.size()) +
                            " now=" + std::to_string(now0);
  std::vector<Float> w(tokens), got(s.num_pages());
  ms::reset_expfree<A>(s, clock, std::span<Float>(w));
  check_weights_normal(w, where);
  ms::page_scores_expfree<A>(s, std::span<const Float>(w), clock, alpha, std::span<Float>(got));
  check_scores<A>(s, got, table, lut, alpha, where + " at epoch", worst);
  if (::testing::Test::HasFatalFailure()) return;

  // Later in the same epoch (clock may not pass u32 max).
  const md::step_t room = std::numeric_limits<md::step_t>::max() - now0;
  const md::step_t d = static_cast<md::step_t>(std::min<std::uint64_t>(rng() % (clock.span() + 1ull), room));
  s.advance_to(now0 + d);
  ASSERT_FALSE(ms::advance_expfree<A>(s, clock, std::span<Float>(w)));
  ms::page_scores_expfree<A>(s, std::span<const Float>(w), clock, alpha, std::span<Float>(got));
  check_scores<A>(s, got, table, lut, alpha, where + " +" + std::to_string(d), worst);
  if (::testing::Test::HasFatalFailure()) return;

  // Fused observation at now0 + d.
  std::vector<Float> mass(tokens);
  std::uniform_real_distribution<Float> m(Float{0}, Float{2} / static_cast<Float>(std::max<std::size_t>(tokens, 1)));
  for (auto& x : mass) x = rng() % 3 == 0 ? Float{0} : m(rng);
  const md::observation_params<Float> obs{Float(0.9), Float(0.01), static_cast<Float>(tokens)};
  auto expected = s;  // reference observation
  const std::size_t ref_refreshed = md::observe_tokens_reference<Float>(
      expected.ewma_mut(), expected.last_refresh_mut(), std::span<const Float>(mass), s.now(), obs);
  auto synced = expected;  // reference observation + the sync pass (what basic_sequence runs)
  std::vector<Float> w_sync = w, got_sync(s.num_pages());
  ms::sync_and_score_expfree<A, PageSize>(synced.regions().data(), synced.last_refresh().data(), w_sync.data(),
                                          synced.ewma().data(), tokens, page_size, clock, alpha, got_sync.data());
  const std::size_t refreshed = ms::observe_and_score_expfree<A>(s, std::span<Float>(w), std::span<const Float>(mass),
                                                                 obs, clock, alpha, std::span<Float>(got));
  EXPECT_EQ(refreshed, ref_refreshed) << where;
  for (std::size_t i = 0; i < tokens; ++i) {
    ASSERT_EQ(s.last_refresh()[i], expected.last_refresh()[i]) << where << " token " << i;
    // Where the isa fuses multiply-adds the fused EWMA is the reference's ewma_step bit for bit (what lets the
    // sequences run the fused pass); elsewhere the unfused sum is within 2 ulp of it.
    if constexpr (ms::fused_observation_exact)
      ASSERT_EQ(s.ewma()[i], expected.ewma()[i]) << where << " token " << i;
    else
      ASSERT_NEAR(s.ewma()[i], expected.ewma()[i], 2 * std::numeric_limits<Float>::epsilon() * expected.ewma()[i])
          << where << " token " << i;
    ASSERT_EQ(w[i], w_sync[i]) << where << " token " << i;  // the same weights either way
  }
  check_weights_normal(w, where);
  check_scores<A>(s, got, table, lut, alpha, where + " fused", worst);
  check_scores<A>(synced, got_sync, table, lut, alpha, where + " sync", worst);
  if (::testing::Test::HasFatalFailure()) return;
  // The fused scores are exactly those of a score-only pass over the updated state.
  std::vector<Float> again(s.num_pages());
  ms::page_scores_expfree<A>(s, std::span<const Float>(w), clock, alpha, std::span<Float>(again));
  for (std::size_t p = 0; p < again.size(); ++p) ASSERT_EQ(again[p], got[p]) << where << " page " << p;

  // d2 more steps: refreshed tokens (w = g at now0 + d) and old ones age together; past span() it rebases.
  const md::step_t room2 = std::numeric_limits<md::step_t>::max() - s.now();
  const md::step_t d2 = static_cast<md::step_t>(std::min<std::uint64_t>(rng() % (2ull * clock.span() + 2), room2));
  s.advance_to(s.now() + d2);
  ms::advance_expfree<A>(s, clock, std::span<Float>(w));
  check_weights_normal(w, where);
  ms::page_scores_expfree<A>(s, std::span<const Float>(w), clock, alpha, std::span<Float>(got));
  check_scores<A>(s, got, table, lut, alpha, where + " later +" + std::to_string(d2), worst);
}

/// A region table of `count` regions with random parameters (some without decay, some with b = 0), half-lives
/// from 0.2 to 2000 steps (lambda up to 3.5: inside the float domain, span >= 11).
inline md::region_table random_regions(std::size_t count, std::mt19937_64& rng) {
  std::vector<md::region_params> params;
  std::uniform_real_distribution<double> base(0.0, 2.0), log_half_life(std::log(0.2), std::log(2000.0));
  for (std::size_t r = 0; r < count; ++r) {
    md::region_params p{std::string("r").append(std::to_string(r)), base(rng),
                        md::decay_rate_from_half_life(std::exp(log_half_life(rng))), false};
    if (r % 7 == 3) p.decay_rate = 0.0;
    if (r % 11 == 5) p.base_priority = 0.0;
    params.push_back(p);
  }
  return md::region_table(std::move(params));
}

/// Many shapes: odd lengths, partial last pages, page sizes below, at and above the lane count, small
/// (permute) and large (gather) region tables, clocks from 0 to near the u32 limit.
template <ms::isa A, class Float>
void check_many_shapes() {
  std::mt19937_64 rng(11);
  const md::region_table small = md::default_region_table();
  const md::region_table mid = random_regions(12, rng);
  const md::region_table large = random_regions(40, rng);
  const std::size_t lengths[] = {0, 1, 3, 15, 16, 17, 31, 64, 65, 127, 257, 1000, 4099};
  const md::step_t nows[] = {0, 77, 100000, 4'000'000'000u, 4'294'967'000u};
  worst_seen worst;
  std::uint64_t seed = 1;
  for (const md::region_table* table : {&small, &mid, &large})
    for (std::size_t ps : {1, 4, 8, 16, 64})
      for (std::size_t n : lengths)
        for (md::step_t now : nows) {
          check_one<A, md::dynamic_page_size, Float>(n, ps, *table, now, ++seed, worst);
          if (::testing::Test::HasFatalFailure()) return;
        }
  for (std::size_t n : lengths) {
    check_one<A, 16, Float>(n, 16, small, 5000, ++seed, worst);
    check_one<A, 16, Float>(n, 16, large, 5000, ++seed, worst);
    check_one<A, 1, Float>(n, 1, mid, 5000, ++seed, worst);
    if (::testing::Test::HasFatalFailure()) return;
  }
  std::printf("[expfree %s %s] worst relative difference: from exact %.3g, from the scalar reference %.3g\n",
              ms::to_string(A), std::same_as<Float, float> ? "float" : "double", worst.vs_exact, worst.vs_reference);
}

/// 10^6 steps of random observations on every kind of region (no decay, tiny, moderate, fast, the fastest the
/// domain allows), rebasing whenever the clock asks, with occasional jumps of the clock; per token (page size 1,
/// alpha = 0, so a page score is one token's decay term) the relative error against the exact value, per block
/// of steps. Returns the worst relative error; prints it per block (it must not grow with the step count).
template <ms::isa A, class Float>
double long_run(md::step_t start, std::size_t steps, std::uint64_t seed, const char* label, bool jumps = true) {
  const double fastest = expfree_fastest<Float>();
  md::region_table table({{"none", 1.0, 0.0, false},
                          {"tiny", 0.5, 1e-7, false},
                          {"slow", 0.8, std::log(2.0) / 2000.0, false},
                          {"mid", 0.3, std::log(2.0) / 15.0, false},
                          {"fast", 2.0, std::log(2.0), false},
                          {"fastest", 0.7, fastest, false},
                          {"small_b", 1e-6, std::log(2.0) / 40.0, false}});
  const ms::region_lut<Float> lut(table);
  ms::expfree_clock<Float> clock(lut);
  EXPECT_TRUE(clock.usable());
  EXPECT_EQ(clock.span(), ms::expfree_limits<Float>::min_span) << "the fastest region sets the span";
  constexpr std::size_t tokens = 21;  // three per region
#if defined(NDEBUG)
  constexpr std::size_t check_stride = 1;  // every step checked
#else
  constexpr std::size_t check_stride = 8;  // -O0 builds: every 8th step checked (every step still computed)
#endif
  md::token_state<Float, md::dynamic_page_size> s(1);
  std::vector<md::region_id> labels(tokens);
  for (std::size_t i = 0; i < tokens; ++i) labels[i] = static_cast<md::region_id>(i % table.size());
  s.append(std::span<const md::region_id>(labels));
  s.advance_to(start);
  std::vector<Float> w(tokens), out(tokens), mass(tokens);
  ms::reset_expfree<A>(s, clock, std::span<Float>(w));
  std::mt19937_64 rng(seed);
  const md::observation_params<Float> obs{Float(0.9), Float(0.5), Float(1)};
  const std::size_t blocks = 10, per_block = steps / blocks;
  double worst = 0;
  std::size_t rebases = 0, flushed = 0, checked = 0;
  for (std::size_t b = 0; b < blocks; ++b) {
    double block_worst = 0;
    for (std::size_t k = 0; k < per_block; ++k) {
      // The clock: usually one step, sometimes none, rarely a jump (never past the u32 limit).
      const md::step_t room = std::numeric_limits<md::step_t>::max() - s.now();
      const std::uint64_t u = rng() % 1000;
      const std::uint64_t step = u < 100 ? 0 : u < 998 || !jumps ? 1 : u < 999 ? rng() % 100 : rng() % (1u << 20);
      s.advance_to(s.now() + static_cast<md::step_t>(std::min<std::uint64_t>(step, room)));
      rebases += ms::advance_expfree<A>(s, clock, std::span<Float>(w)) ? 1 : 0;
      // Sparse refreshes: each token attended above tau with probability 1/16 (1/200 for some).
      for (std::size_t i = 0; i < tokens; ++i)
        mass[i] = rng() % (i % 3 == 0 ? 200 : 16) == 0 ? Float(0.75) : Float(0.25) * static_cast<Float>(rng() % 2);
      ms::observe_and_score_expfree<A>(s, std::span<Float>(w), std::span<const Float>(mass), obs, clock, Float{0},
                                       std::span<Float>(out));
      for (std::size_t i = 0; i < tokens && k % check_stride == 0; ++i) {
        const long double e = exact_decay(lut, s.regions()[i], s.now() - s.last_refresh()[i]);
        const long double g = out[i];
        // Flushed: weights below exp(lo) (decay < b_r * exp(lo)) and subnormal products (decay < FLT_MIN).
        const long double flush =
            std::max(static_cast<long double>(std::numeric_limits<Float>::min()),
                     lut.base()[s.regions()[i]] * std::exp(static_cast<long double>(ms::exp_constants<Float>::lo))) *
            (1 + 1e-6L);
        if (e >= flush) {
          const double rel = static_cast<double>(std::fabs(g - e) / e);
          // float: three roundings (f, w, the product) of exps computed in double; double: those plus the
          // rounding of the exponents to double (lambda * age * eps), as in the reference.
          const long double age_term =
              std::same_as<Float, double>
                  ? -static_cast<long double>(lut.neg_rate()[s.regions()[i]]) * (s.now() - s.last_refresh()[i]) +
                        2 * ms::expfree_limits<Float>::max_exponent
                  : 0.0L;
          EXPECT_LE(rel, (2 + age_term) * std::numeric_limits<Float>::epsilon())
              << label << " token " << i << " step " << s.now();
          block_worst = std::max(block_worst, rel);
          ++checked;
        } else {
          ++flushed;
          EXPECT_LE(std::fabs(g - e), abs_floor<Float>()) << label << " token " << i << " step " << s.now();
        }
      }
    }
    for (std::size_t i = 0; i < tokens; ++i)
      EXPECT_TRUE(w[i] == 0 || (std::isfinite(w[i]) && w[i] >= std::numeric_limits<Float>::min()))
          << label << " token " << i << " w = " << w[i];
    std::printf("[expfree long run %s %s %s] steps %zu-%zu: max relative error %.3g\n", label, ms::to_string(A),
                std::same_as<Float, float> ? "float" : "double", b * per_block, (b + 1) * per_block, block_worst);
    worst = std::max(worst, block_worst);
  }
  std::printf(
      "[expfree long run %s %s] %zu steps, clock %u -> %u, %zu rebases, %zu token checks (+%zu below the "
      "normal range), max relative error %.3g\n",
      label, ms::to_string(A), steps, start, s.now(), rebases, checked, flushed, worst);
  EXPECT_GT(rebases, steps / 20);  // span 8: a rebase every 9 clock steps at least
  return worst;
}

}  // namespace expfree_checks

#endif  // MEMDECAY_TESTS_SIMD_EXPFREE_CHECKS_HPP
