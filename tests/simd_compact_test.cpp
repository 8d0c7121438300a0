// The compact state layout (simd/compact_state.hpp): fp16 conversions (scalar fallback against F16C, bit for
// bit), the epoch/rebasing rule of the 16-bit stamps, and the compact scores and fused pass against the scalar
// reference on the full-precision state, within the documented bound (docs/simd.md, "Compact state layout").
#include "simd_kernel_checks.hpp"

#include <memdecay/simd/compact_state.hpp>

#include <cmath>
#include <cstdio>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define HAVE_F16C_CHECK 1
#else
#define HAVE_F16C_CHECK 0
#endif

namespace md = memdecay;
namespace ms = memdecay::simd;

namespace {

#if HAVE_F16C_CHECK
__attribute__((target("f16c"))) std::uint16_t hw_to_half(float f) {
  return static_cast<std::uint16_t>(_mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(f), 0), 0));
}
__attribute__((target("f16c"))) float hw_from_half(std::uint16_t h) {
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}
bool cpu_has_f16c() {  // CPUID.1:ECX bit 29 (clang 14's __builtin_cpu_supports does not know "f16c")
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29)) != 0;
}
#endif

bool is_nan_bits(std::uint32_t u) { return (u & 0x7fffffffu) > 0x7f800000u; }

}  // namespace

TEST(SimdCompact, HalfRoundTripIsExactForEveryHalf) {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const auto hb = static_cast<std::uint16_t>(h);
    if ((hb & 0x7c00u) == 0x7c00u && (hb & 0x3ffu)) continue;  // NaN
    const float f = ms::half_bits_to_float(hb);
    ASSERT_EQ(ms::float_to_half_bits(f), hb) << h;
#if HAVE_F16C_CHECK
    if (cpu_has_f16c()) {
      ASSERT_EQ(std::bit_cast<std::uint32_t>(hw_from_half(hb)), std::bit_cast<std::uint32_t>(f)) << h;
    }
#endif
  }
}

TEST(SimdCompact, ScalarFloatToHalfMatchesF16cBitForBit) {
#if HAVE_F16C_CHECK
  if (!cpu_has_f16c()) GTEST_SKIP() << "CPU without f16c";
  std::size_t checked = 0;
  auto check = [&](std::uint32_t u) {
    if (is_nan_bits(u)) return;
    const float f = std::bit_cast<float>(u);
    ASSERT_EQ(ms::float_to_half_bits(f), hw_to_half(f)) << u;
    ++checked;
  };
  // Every 97th float bit pattern (44 M inputs), and every tie and its neighbours (rounding to nearest even).
  for (std::uint64_t u = 0; u <= 0xffffffffu; u += 97) check(static_cast<std::uint32_t>(u));
  for (std::uint32_t h = 0; h < 0x7c00u; ++h) {
    const float lo = ms::half_bits_to_float(static_cast<std::uint16_t>(h));
    const float hi = ms::half_bits_to_float(static_cast<std::uint16_t>(h + 1));
    const auto mid = std::bit_cast<std::uint32_t>((lo + hi) / 2);  // exact: one more bit than fp16 has
    for (std::uint32_t d : {0u, 1u, 2u}) {
      check(mid + d);
      check(mid - d);
      check((mid + d) | 0x80000000u);
    }
    if (::testing::Test::HasFatalFailure()) return;
  }
  std::printf("[compact] float->half scalar == f16c on %zu inputs\n", checked);
#else
  GTEST_SKIP() << "x86-64 only";
#endif
}

TEST(SimdCompact, FloatToHalfRelativeErrorIsAtMostTwoToMinusEleven) {
  // Normal fp16 range: |fp16(x) - x| <= 2^-11 |x|; subnormal range: <= 2^-25 absolute.
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> e(-30.0f, 16.0f);
  double worst_rel = 0;
  for (int i = 0; i < 1'000'000; ++i) {
    const float x = std::min(std::exp2(e(rng)), ms::half_max);
    const float y = ms::half_bits_to_float(ms::compact_state<>::encode(x));
    const double err = std::fabs(static_cast<double>(y) - x);
    ASSERT_LE(err, 0x1p-11 * x + 0x1p-25) << x;
    if (x >= 0x1p-14f) worst_rel = std::max(worst_rel, err / x);
  }
  EXPECT_EQ(ms::compact_state<>::encode(1e9f), ms::float_to_half_bits(ms::half_max));  // saturates, never inf
  std::printf("[compact] fp16 worst relative error (normal range) %.4g (bound 2^-11 = %.4g)\n", worst_rel, 0x1p-11);
}

TEST(SimdCompact, AgesAreExactUpToSaturationAcrossRebases) {
  // A true u32 clock per token next to the compact state; random steps (small, large, huge), random refreshes
  // through the fused pass; after every step age(i) == min(now - last_refresh_i, max_age).
  std::mt19937_64 rng(11);
  md::sequence_state<float, 16> full(16);
  std::vector<md::region_span> spans{{1, 1000}, {2, 37}};
  full.append(spans);
  full.advance_to(100);
  ms::compact_state<16> c(full);
  std::vector<md::step_t> truth(full.last_refresh().begin(), full.last_refresh().end());
  const ms::region_lut<float> lut(md::default_region_table());
  std::vector<float> out(c.num_pages()), mass(c.kv_len());
  md::step_t now = 100;
  std::size_t rebases = 0;
  for (int step = 0; step < 3000; ++step) {
    const std::uint64_t kind = rng() % 10;
    const md::step_t dt = kind < 6 ? 1 + rng() % 50 : kind < 9 ? 1 + rng() % 20000 : 50000 + rng() % 3'000'000;
    now += dt;
    const md::step_t before = c.epoch();
    c.advance_to(now);
    rebases += c.epoch() != before;
    for (auto& m : mass) m = rng() % 50 == 0 ? 1.0f : 0.0f;
    const md::observation_params<float> obs{0.9f, 0.5f, 1.0f};
    std::size_t expected = 0;
    for (std::size_t i = 0; i < truth.size(); ++i)
      if (mass[i] > 0.5f) {
        truth[i] = now;
        ++expected;
      }
    ASSERT_EQ(ms::compact_observe_and_score(c, std::span<const float>(mass), obs, lut, 1.0f, std::span<float>(out)),
              expected);
    ASSERT_LE(c.now() - c.epoch(), ms::compact_state<16>::max_span);
    for (std::size_t i = 0; i < truth.size(); ++i)
      ASSERT_EQ(c.age(i), std::min<md::step_t>(now - truth[i], ms::compact_state<16>::max_age))
          << "step " << step << " token " << i;
  }
  EXPECT_GT(rebases, 10u);
  EXPECT_THROW(c.advance_to(now - 1), md::input_error);
}

namespace {

/// The documented bound of a compact page score against the reference on the full state (float).
struct page_bound {
  double quant = 0;       ///< mean over the page of alpha * (2^-11 a + 2^-25) + saturation terms
  double saturated = 0;   ///< the saturation part alone
};

template <ms::isa A, std::size_t PageSize>
void check_compact_state(std::size_t tokens, std::size_t page_size, const md::region_table& table, md::step_t now,
                         std::uint64_t seed, double& worst_rel, double& worst_vs_bound) {
  std::mt19937_64 rng(seed);
  auto full = simd_checks::random_state<float, PageSize>(tokens, page_size, table.size(), now, rng);
  const ms::region_lut<float> lut(table);
  const float alpha = 0.7f;
  const std::size_t pages = full.num_pages();
  const std::string where = "tokens=" + std::to_string(tokens) + " page=" + std::to_string(page_size) +
                            " regions=" + std::to_string(table.size()) + " now=" + std::to_string(now);
  ms::compact_state<PageSize> c(full);
  ASSERT_EQ(c.num_pages(), pages);

  bool any_saturated = false;
  auto bound_of = [&](const md::sequence_state<float, PageSize>& s, std::size_t p) {
    double sum = 0;
    any_saturated = false;
    const std::size_t first = p * s.page_size(), n = s.tokens_in_page(p);
    for (std::size_t i = first; i < first + n; ++i) {
      sum += alpha * (0x1p-11 * s.ewma()[i] + 0x1p-25);
      const md::step_t age = s.now() - s.last_refresh()[i];
      if (age > ms::compact_state<PageSize>::max_age) {
        any_saturated = true;
        const md::region_id r = s.regions()[i];
        sum += table.base_priority(r) * std::exp(-table.decay_rate(r) * ms::compact_state<PageSize>::max_age);
      }
    }
    return sum / static_cast<double>(n);
  };

  std::vector<float> ref(pages), got(pages), scalar(pages), decoded_ref(pages);
  md::page_scores_reference(full, table, alpha, std::span<float>(ref));
  ms::compact_page_scores<A>(c, lut, alpha, std::span<float>(got));
  ms::compact_page_scores<ms::isa::scalar>(c, lut, alpha, std::span<float>(scalar));
  const auto decoded = c.template to_sequence_state<float>();
  md::page_scores_reference(decoded, table, alpha, std::span<float>(decoded_ref));
  for (std::size_t p = 0; p < pages; ++p) {
    const std::size_t n = full.tokens_in_page(p);
    // (1) the only differences from the reference on the decoded state are the scorer's own (docs/simd.md).
    EXPECT_NEAR(got[p], decoded_ref[p], simd_checks::score_tolerance(decoded_ref[p], n)) << where << " page " << p;
    EXPECT_NEAR(scalar[p], decoded_ref[p], simd_checks::score_tolerance(decoded_ref[p], n)) << where << " page " << p;
    // (2) against the full-precision state: the documented quantisation bound plus the scorer's tolerance.
    const double b = bound_of(full, p);
    const double diff = std::fabs(static_cast<double>(got[p]) - ref[p]);
    EXPECT_LE(diff, b + simd_checks::score_tolerance(ref[p], n)) << where << " page " << p;
    if (!any_saturated && ref[p] > 1e-30f) worst_rel = std::max(worst_rel, diff / ref[p]);
    if (b > 0) worst_vs_bound = std::max(worst_vs_bound, std::max(0.0, diff - simd_checks::score_tolerance(ref[p], n)) / b);
  }

  // Fused pass: against observe_tokens_reference applied to the decoded state.
  std::vector<float> mass(tokens);
  std::uniform_real_distribution<float> m(0.0f, 2.0f / static_cast<float>(std::max<std::size_t>(tokens, 1)));
  for (auto& x : mass) x = rng() % 3 == 0 ? 0.0f : m(rng);
  const md::observation_params<float> obs{0.9f, 0.01f, static_cast<float>(tokens)};
  auto expected = decoded;
  const std::size_t ref_refreshed = md::observe_tokens_reference<float>(
      expected.ewma_mut(), expected.last_refresh_mut(), std::span<const float>(mass), now, obs);
  auto c_scalar = c;
  std::vector<float> fused(pages), fused_scalar(pages), again(pages);
  EXPECT_EQ(ms::compact_observe_and_score<A>(c, std::span<const float>(mass), obs, lut, alpha, std::span<float>(fused)),
            ref_refreshed)
      << where;
  EXPECT_EQ(ms::compact_observe_and_score<ms::isa::scalar>(c_scalar, std::span<const float>(mass), obs, lut, alpha,
                                                             std::span<float>(fused_scalar)),
            ref_refreshed)
      << where;
  for (std::size_t i = 0; i < tokens; ++i) {
    ASSERT_EQ(c.age(i), std::min<md::step_t>(now - expected.last_refresh()[i], ms::compact_state<PageSize>::max_age))
        << where << " token " << i;
    const float e = expected.ewma()[i];
    ASSERT_LE(std::fabs(c.ewma(i) - e), 0x1p-11 * e + 0x1p-25) << where << " token " << i;
    // The vector and scalar kernels store the same bits unless the reference-style update itself differs by an
    // ulp (an FMA contraction) right at an fp16 rounding tie: allow one fp16 step.
    ASSERT_LE(std::abs(int{c.ewma_bits()[i]} - int{c_scalar.ewma_bits()[i]}), 1) << where << " token " << i;
    ASSERT_EQ(c.stamps()[i], c_scalar.stamps()[i]) << where << " token " << i;
  }
  ms::compact_page_scores<A>(c, lut, alpha, std::span<float>(again));
  for (std::size_t p = 0; p < pages; ++p) ASSERT_EQ(again[p], fused[p]) << where << " page " << p;
}

}  // namespace

namespace {
template <ms::isa A>
void check_many_shapes() {
  std::mt19937_64 rng(7);
  const md::region_table small = md::default_region_table();
  const md::region_table mid = simd_checks::random_regions(12, rng);
  const md::region_table large = simd_checks::random_regions(40, rng);
  const std::size_t lengths[] = {0, 1, 3, 15, 16, 17, 31, 63, 64, 65, 127, 200, 257, 1000, 1023, 4099};
  // Clocks below, around and far past the saturation age and the rebase span (ages up to 4e9).
  const md::step_t nows[] = {0, 77, 32768, 40000, 70000, 100000, 4'000'000'000u};
  double worst_rel = 0, worst_vs_bound = 0;
  std::uint64_t seed = 1;
  for (const md::region_table* table : {&small, &mid, &large})
    for (std::size_t ps : {1, 2, 4, 8, 16, 32, 64, 128})
      for (std::size_t n : lengths)
        for (md::step_t now : nows) {
          check_compact_state<A, md::dynamic_page_size>(n, ps, *table, now, ++seed, worst_rel, worst_vs_bound);
          if (::testing::Test::HasFatalFailure()) return;
        }
  for (std::size_t n : lengths) {
    check_compact_state<A, 16>(n, 16, small, 50000, ++seed, worst_rel, worst_vs_bound);
    check_compact_state<A, 16>(n, 16, large, 5000, ++seed, worst_rel, worst_vs_bound);
    check_compact_state<A, 4>(n, 4, mid, 100000, ++seed, worst_rel, worst_vs_bound);
    if (::testing::Test::HasFatalFailure()) return;
  }
  std::printf("[compact %s] worst relative page-score difference from the full-state reference (pages without saturated ages) %.3g; "
              "worst (difference - scorer tolerance) / documented bound %.3g\n",
              ms::to_string(ms::compact_isa(A)), worst_rel, worst_vs_bound);
}

}  // namespace

// The native isa's compact kernel (AVX-512 or AVX2+F16C under -march=native; the 1-lane kernel otherwise).
TEST(SimdCompact, PageScoresWithinTheDocumentedBoundOfTheReference) { check_many_shapes<ms::native_isa>(); }
TEST(SimdCompact, Avx2KernelWithinTheDocumentedBound) {
  if constexpr (ms::compact_isa(ms::isa::avx2) != ms::isa::avx2 || ms::native_isa == ms::isa::avx2) {
    GTEST_SKIP() << "no separate avx2 + f16c compact kernel in this build";
  } else {
    check_many_shapes<ms::isa::avx2>();
  }
}
TEST(SimdCompact, ScalarKernelWithinTheDocumentedBound) { check_many_shapes<ms::isa::scalar>(); }

TEST(SimdCompact, RoundTripIsExactForRepresentableStates) {
  md::sequence_state<float, md::dynamic_page_size> s(8);
  std::vector<md::region_span> spans{{0, 5}, {3, 30}, {6, 2}};
  s.append(spans);
  s.advance_to(90000);
  auto lr = s.last_refresh_mut();
  auto ew = s.ewma_mut();
  for (std::size_t i = 0; i < s.kv_len(); ++i) {
    lr[i] = 90000 - static_cast<md::step_t>(i * 900);  // ages 0 .. 32400 <= max_age
    ew[i] = static_cast<float>(i) * 0.125f;            // exact in fp16
  }
  const ms::compact_state<> c(s);
  const auto back = c.to_sequence_state<float>();
  EXPECT_TRUE(std::equal(back.regions().begin(), back.regions().end(), s.regions().begin(), s.regions().end()));
  EXPECT_TRUE(std::equal(back.last_refresh().begin(), back.last_refresh().end(), s.last_refresh().begin()));
  EXPECT_TRUE(std::equal(back.ewma().begin(), back.ewma().end(), s.ewma().begin()));
  EXPECT_EQ(back.now(), s.now());
  EXPECT_EQ(c.num_pages(), s.num_pages());
}
