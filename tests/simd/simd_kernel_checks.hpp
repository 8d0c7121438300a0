// Shared checks of the SIMD layer, instantiated per isa by tests/simd_*_test.cpp (the native isa, the scalar
// fallback, and AVX2 / AVX-512 compiled under #pragma GCC target in their own executables).
//
// Include order matters for the forced-isa tests: every header but the memdecay/simd ones must already be
// included before this file, so that only the SIMD code is compiled for the forced target.
#ifndef MEMDECAY_TESTS_SIMD_KERNEL_CHECKS_HPP
#define MEMDECAY_TESTS_SIMD_KERNEL_CHECKS_HPP

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <memdecay/core/eviction.hpp>
#include <memdecay/core/ewma_tracker.hpp>
#include <memdecay/core/region.hpp>
#include <memdecay/core/sequence_state.hpp>

#include <memdecay/simd/exp.hpp>
#include <memdecay/simd/score_kernel.hpp>

namespace simd_checks {

namespace md = memdecay;
namespace ms = memdecay::simd;

/// Worst relative error of ms::exp<A> against std::exp (in long double) over `inputs`.
template <ms::isa A, class Float>
long double exp_max_rel_error(const std::vector<Float>& inputs, Float* worst_at = nullptr) {
  std::vector<Float> out(inputs.size());
  ms::exp<A, Float>(inputs, out);
  long double worst = 0;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const long double ref = std::exp(static_cast<long double>(inputs[i]));
    const long double err = std::fabs((static_cast<long double>(out[i]) - ref) / ref);
    if (!(err <= worst)) {
      worst = err;
      if (worst_at) *worst_at = inputs[i];
    }
  }
  return worst;
}

/// Every `stride`-th float bit pattern in [lo, hi] (both of one sign), plus the ends.
inline std::vector<float> float_bit_sweep(float from, float to, std::uint32_t stride) {
  std::uint32_t a, b;
  std::memcpy(&a, &from, 4);
  std::memcpy(&b, &to, 4);
  if (a > b) std::swap(a, b);
  std::vector<float> v;
  for (std::uint64_t bits = a; bits <= b; bits += stride) {
    float f;
    const auto u = static_cast<std::uint32_t>(bits);
    std::memcpy(&f, &u, 4);
    v.push_back(f);
  }
  v.push_back(from);
  v.push_back(to);
  return v;
}

template <ms::isa A>
void check_exp_float() {
  // The decay range [lo, 0]: every 97th bit pattern (about 11.6 million inputs), and [0, hi].
  float worst_at = 0;
  const auto neg = float_bit_sweep(-0.0f, ms::exp_constants<float>::lo, 97);
  const long double e_neg = exp_max_rel_error<A>(neg, &worst_at);
  EXPECT_LE(e_neg, 2e-7L) << ms::to_string(A) << " worst at x = " << worst_at;
  const auto pos = float_bit_sweep(0.0f, ms::exp_constants<float>::hi, 389);
  const long double e_pos = exp_max_rel_error<A>(pos, &worst_at);
  EXPECT_LE(e_pos, 2e-7L) << ms::to_string(A) << " worst at x = " << worst_at;
  // Exact points and the edges of the contract.
  std::vector<float> edge = {0.0f,    -0.0f,   -87.31f,
                             -100.0f, -1e30f,  -std::numeric_limits<float>::infinity(),
                             88.3f,   1000.0f, std::numeric_limits<float>::infinity()};
  std::vector<float> out(edge.size());
  ms::exp<A, float>(edge, out);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], 1.0f);
  EXPECT_EQ(out[2], 0.0f);
  EXPECT_EQ(out[3], 0.0f);
  EXPECT_EQ(out[4], 0.0f);
  EXPECT_EQ(out[5], 0.0f);
  EXPECT_TRUE(std::isfinite(out[6]));
  EXPECT_EQ(out[7], out[6]);  // saturates at exp(hi), never inf
  EXPECT_EQ(out[8], out[6]);
  std::printf("[exp float %s] max rel error: decay range %.3Lg, positive range %.3Lg\n", ms::to_string(A), e_neg,
              e_pos);
}

template <ms::isa A>
void check_exp_double() {
  std::mt19937_64 rng(42);
  std::vector<double> in;
  std::uniform_real_distribution<double> wide(ms::exp_constants<double>::lo, ms::exp_constants<double>::hi);
  std::uniform_real_distribution<double> decay(-30.0, 0.0);
  for (int i = 0; i < 1'000'000; ++i) in.push_back(wide(rng));
  for (int i = 0; i < 1'000'000; ++i) in.push_back(decay(rng));
  double worst_at = 0;
  const long double e = exp_max_rel_error<A>(in, &worst_at);
  EXPECT_LE(e, 4e-16L) << ms::to_string(A) << " worst at x = " << worst_at;
  std::vector<double> edge = {0.0, -708.31, -1e300, 709.0, 1e300}, out(edge.size());
  ms::exp<A, double>(edge, out);
  EXPECT_EQ(out[0], 1.0);
  EXPECT_EQ(out[1], 0.0);
  EXPECT_EQ(out[2], 0.0);
  EXPECT_TRUE(std::isfinite(out[3]));
  EXPECT_EQ(out[4], out[3]);
  std::printf("[exp double %s] max rel error %.3Lg\n", ms::to_string(A), e);
}

/// A region table of `count` regions with random parameters (some without decay, some with b = 0).
inline md::region_table random_regions(std::size_t count, std::mt19937_64& rng) {
  std::vector<md::region_params> params;
  std::uniform_real_distribution<double> base(0.0, 1.0), half_life(1.0, 2000.0);
  for (std::size_t r = 0; r < count; ++r) {
    md::region_params p{std::string("r").append(std::to_string(r)), base(rng),
                        md::decay_rate_from_half_life(half_life(rng)), false};
    if (r % 7 == 3) p.decay_rate = 0.0;
    if (r % 11 == 5) p.base_priority = 0.0;
    params.push_back(p);
  }
  return md::region_table(std::move(params));
}

/// A state of `tokens` tokens with random regions (runs and singles), clocks and EWMA, at step `now`.
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
      case 0: lr[i] = now; break;                                                                      // just refreshed
      case 1: lr[i] = now - static_cast<md::step_t>(rng() % 64); break;                                // recent
      case 2: lr[i] = now - static_cast<md::step_t>(rng() % 5000); break;                              // old
      default: lr[i] = static_cast<md::step_t>(rng() % (static_cast<std::uint64_t>(now) + 1)); break;  // any
    }
    ew[i] = rng() % 5 == 0 ? Float{0} : ewma(rng);
  }
  return s;
}

/// The tolerance of a page score: (8 + tokens) ulps of the score (exp <= 2 ulp, fma/products 2, the sum one per
/// token), plus an absolute floor for decay terms below exp's range that the kernel flushes to 0.
template <class Float>
Float score_tolerance(Float ref, std::size_t tokens) {
  const Float floor = std::same_as<Float, float> ? Float(1e-36) : Float(1e-300);
  return static_cast<Float>(8 + tokens) * std::numeric_limits<Float>::epsilon() * std::fabs(ref) + floor;
}

/// Below this a page score is made of decay terms the exp flushes to 0 (documented), so the reported relative
/// difference skips it (the tolerance still checks it, in absolute terms).
template <class Float>
constexpr Float relative_floor() {
  return std::same_as<Float, float> ? Float(1e-30) : Float(1e-290);
}

/// Compares the kernels with the references on one random state; raises `worst` to the worst |simd - ref| / |ref|.
template <ms::isa A, std::size_t PageSize, class Float>
void check_one_state(std::size_t tokens, std::size_t page_size, const md::region_table& table, md::step_t now,
                     std::uint64_t seed, double& worst) {
  std::mt19937_64 rng(seed);
  auto state = random_state<Float, PageSize>(tokens, page_size, table.size(), now, rng);
  const ms::region_lut<Float> lut(table);
  const Float alpha = static_cast<Float>(0.7);
  const std::size_t pages = state.num_pages();
  const std::string where = std::string(ms::to_string(A)) + " tokens=" + std::to_string(tokens) +
                            " page=" + std::to_string(page_size) + " regions=" + std::to_string(table.size()) +
                            " now=" + std::to_string(now);

  // Score-only pass.
  std::vector<Float> ref(pages), got(pages);
  md::page_scores_reference(state, table, alpha, std::span<Float>(ref));
  ms::page_scores<A>(state, lut, alpha, std::span<Float>(got));
  for (std::size_t p = 0; p < pages; ++p) {
    EXPECT_NEAR(got[p], ref[p], score_tolerance(ref[p], state.tokens_in_page(p))) << where << " page " << p;
    if (ref[p] > relative_floor<Float>())
      worst = std::max(worst, static_cast<double>(std::fabs((got[p] - ref[p]) / ref[p])));
  }

  // Fused pass against reference observe + reference scores on a copy.
  std::vector<Float> mass(tokens);
  std::uniform_real_distribution<Float> m(Float{0}, Float{2} / static_cast<Float>(std::max<std::size_t>(tokens, 1)));
  for (auto& x : mass) x = rng() % 3 == 0 ? Float{0} : m(rng);
  const md::observation_params<Float> obs{Float(0.9), Float(0.01), static_cast<Float>(tokens)};
  auto expected = state;
  auto ref_lr = std::vector<md::step_t>(expected.last_refresh().begin(), expected.last_refresh().end());
  auto ref_ew = std::vector<Float>(expected.ewma().begin(), expected.ewma().end());
  const std::size_t ref_refreshed = md::observe_tokens_reference<Float>(
      expected.ewma_mut(), expected.last_refresh_mut(), std::span<const Float>(mass), now, obs);
  md::page_scores_reference(expected, table, alpha, std::span<Float>(ref));
  const std::size_t refreshed =
      ms::observe_and_score<A>(state, std::span<const Float>(mass), obs, lut, alpha, std::span<Float>(got));
  EXPECT_EQ(refreshed, ref_refreshed) << where;
  for (std::size_t i = 0; i < tokens; ++i) {
    ASSERT_EQ(state.last_refresh()[i], expected.last_refresh()[i]) << where << " token " << i;
    // Where the isa fuses multiply-adds the fused EWMA is the reference's ewma_step bit for bit (what lets the
    // sequences run the fused pass); elsewhere the unfused sum is within 2 ulp of it.
    if constexpr (ms::fused_observation_exact)
      ASSERT_EQ(state.ewma()[i], expected.ewma()[i]) << where << " token " << i;
    else
      ASSERT_NEAR(state.ewma()[i], expected.ewma()[i], 2 * std::numeric_limits<Float>::epsilon() * expected.ewma()[i])
          << where << " token " << i;
  }
  for (std::size_t p = 0; p < pages; ++p) {
    EXPECT_NEAR(got[p], ref[p], score_tolerance(ref[p], state.tokens_in_page(p))) << where << " fused page " << p;
    if (ref[p] > relative_floor<Float>())
      worst = std::max(worst, static_cast<double>(std::fabs((got[p] - ref[p]) / ref[p])));
  }
  // The fused scores are exactly those of a score-only pass over the updated state.
  std::vector<Float> again(pages);
  ms::page_scores<A>(state, lut, alpha, std::span<Float>(again));
  for (std::size_t p = 0; p < pages; ++p) ASSERT_EQ(again[p], got[p]) << where << " page " << p;

  // Observation alone.
  auto lr2 = std::span<md::step_t>(ref_lr);
  auto ew2 = std::span<Float>(ref_ew);
  auto lr3 = ref_lr;
  auto ew3 = ref_ew;
  const std::size_t r2 = md::observe_tokens_reference<Float>(ew2, lr2, std::span<const Float>(mass), now, obs);
  const std::size_t r3 = ms::observe<A, Float>(lr3.data(), ew3.data(), mass.data(), tokens, now, obs);
  EXPECT_EQ(r3, r2) << where;
  for (std::size_t i = 0; i < tokens; ++i) {
    ASSERT_EQ(lr3[i], ref_lr[i]) << where << " token " << i;
    ASSERT_NEAR(ew3[i], ref_ew[i], 2 * std::numeric_limits<Float>::epsilon() * ref_ew[i]) << where << " token " << i;
  }
}

/// Many shapes: odd lengths, partial last pages, every page-size regime (below, at and above the lane count),
/// small (permute) and large (gather) region tables, young and very old clocks.
template <ms::isa A, class Float>
void check_scores_many_shapes() {
  std::mt19937_64 rng(7);
  const md::region_table small = md::default_region_table();
  const md::region_table large = random_regions(40, rng);
  const md::region_table mid = random_regions(12, rng);
  const std::size_t lengths[] = {0, 1, 3, 15, 16, 17, 31, 63, 64, 65, 127, 200, 257, 1000, 1023, 4099};
  const md::step_t nows[] = {0, 77, 100000, 4'000'000'000u};
  double worst = 0;
  std::uint64_t seed = 1;
  for (const md::region_table* table : {&small, &mid, &large})
    for (std::size_t ps : {1, 2, 4, 8, 16, 32, 64, 128})
      for (std::size_t n : lengths)
        for (md::step_t now : nows) {
          check_one_state<A, md::dynamic_page_size, Float>(n, ps, *table, now, ++seed, worst);
          if (::testing::Test::HasFatalFailure()) return;
        }
  // Compile-time page sizes.
  for (std::size_t n : lengths) {
    check_one_state<A, 1, Float>(n, 1, small, 5000, ++seed, worst);
    check_one_state<A, 4, Float>(n, 4, large, 5000, ++seed, worst);
    check_one_state<A, 16, Float>(n, 16, small, 5000, ++seed, worst);
    check_one_state<A, 16, Float>(n, 16, large, 5000, ++seed, worst);
    check_one_state<A, 64, Float>(n, 64, mid, 5000, ++seed, worst);
    if (::testing::Test::HasFatalFailure()) return;
  }
  std::printf("[scores %s %s] worst relative difference from the scalar reference: %.3g\n", ms::to_string(A),
              std::same_as<Float, float> ? "float" : "double", worst);
}

}  // namespace simd_checks

#endif  // MEMDECAY_TESTS_SIMD_KERNEL_CHECKS_HPP
