// simd/half.hpp: the fp16 / bf16 conversions against an independent reference (every finite value of the format,
// sorted, searched), and F16C's hardware rounding where the build has it.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include <memdecay/simd/half.hpp>

namespace {

using namespace memdecay;

// Every finite value of the format with its bits, ascending (-0 and +0 both, -0 first).
std::vector<std::pair<double, std::uint16_t>> finite_values(half_format f) {
  std::vector<std::pair<double, std::uint16_t>> v;
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const float x = simd::half_to_float(static_cast<std::uint16_t>(b), f);
    if (std::isfinite(x)) v.emplace_back(x, static_cast<std::uint16_t>(b));
  }
  std::stable_sort(v.begin(), v.end(), [](auto& a, auto& b) {
    return a.first < b.first || (a.first == b.first && (a.second & 0x8000) > (b.second & 0x8000));
  });
  return v;
}

// The reference value of narrowing x: the neighbours below and above, chosen by the rounding rule.
double reference(double x, half_format f, half_rounding r, const std::vector<std::pair<double, std::uint16_t>>& all) {
  const double top = all.back().first;
  auto up = std::lower_bound(all.begin(), all.end(), x, [](auto& e, double v) { return e.first < v; });
  if (up != all.end() && up->first == x) return x;
  const double above = up == all.end() ? std::numeric_limits<double>::infinity() : up->first;
  const double below = up == all.begin() ? -std::numeric_limits<double>::infinity() : std::prev(up)->first;
  if (r == half_rounding::toward_plus) return above;
  if (r == half_rounding::toward_minus) return below;
  // Nearest-even; beyond the largest finite value IEEE rounds to inf from half an ulp past it.
  const double ulp_top = f == half_format::f16 ? 32.0 : std::ldexp(1.0, 127 - 7);
  if (x >= top + ulp_top / 2) return std::numeric_limits<double>::infinity();
  if (x <= -top - ulp_top / 2) return -std::numeric_limits<double>::infinity();
  if (!std::isfinite(above)) return below;
  if (!std::isfinite(below)) return above;
  if (x - below < above - x) return below;
  if (above - x < x - below) return above;
  const auto bits_below = std::prev(up)->second;
  return (bits_below & 1u) == 0 ? below : above;
}

TEST(Half, WideningThenNarrowingIsTheIdentityOnEveryValue) {
  for (half_format f : {half_format::f16, half_format::bf16})
    for (std::uint32_t b = 0; b < 65536; ++b) {
      const auto h = static_cast<std::uint16_t>(b);
      const float x = simd::half_to_float(h, f);
      if (std::isnan(x)) {
        EXPECT_TRUE(std::isnan(simd::half_to_float(simd::float_to_half(x, f), f)));
        continue;
      }
      for (half_rounding r : {half_rounding::nearest_even, half_rounding::toward_plus, half_rounding::toward_minus})
        EXPECT_EQ(simd::float_to_half(x, f, r), h) << b;
    }
}

TEST(Half, NarrowingRoundsAsTheReferenceDoes) {
  std::mt19937 rng(11);
  for (half_format f : {half_format::f16, half_format::bf16}) {
    const auto all = finite_values(f);
    std::vector<float> xs = {0.0f,
                             -0.0f,
                             1e-8f,
                             -1e-8f,
                             65504.0f,
                             65519.0f,
                             65520.0f,
                             65536.0f,
                             -65520.0f,
                             5.9604645e-8f,
                             2.98e-8f,
                             3.0e-8f,
                             6.1035156e-5f,
                             3.0e38f,
                             -3.4e38f,
                             std::numeric_limits<float>::max(),
                             std::numeric_limits<float>::denorm_min()};
    std::uniform_int_distribution<std::uint32_t> bits;
    for (int i = 0; i < 20000; ++i) {
      float x = std::bit_cast<float>(bits(rng));
      if (!std::isfinite(x)) continue;
      if (f == half_format::f16 && i % 2 == 0) x = std::ldexp(std::fmod(x, 1.0f), static_cast<int>(i % 40) - 25);
      xs.push_back(x);
    }
    for (float x : xs)
      for (half_rounding r : {half_rounding::nearest_even, half_rounding::toward_plus, half_rounding::toward_minus}) {
        const double want = reference(x, f, r, all);
        const double got = simd::half_to_float(simd::float_to_half(x, f, r), f);
        ASSERT_EQ(got, want) << "x = " << x << " rounding " << static_cast<int>(r) << " format " << static_cast<int>(f);
      }
  }
}

TEST(Half, DirectedRoundingBracketsTheValue) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 100.0f);
  for (half_format f : {half_format::f16, half_format::bf16})
    for (int i = 0; i < 10000; ++i) {
      const float x = normal(rng);
      EXPECT_LE(simd::half_to_float(simd::float_to_half(x, f, half_rounding::toward_minus), f), x);
      EXPECT_GE(simd::half_to_float(simd::float_to_half(x, f, half_rounding::toward_plus), f), x);
    }
}

TEST(Half, InfinityAndNanSurvive) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(simd::float_to_half(inf, half_format::f16), 0x7c00);
  EXPECT_EQ(simd::float_to_half(-inf, half_format::f16), 0xfc00);
  EXPECT_EQ(simd::float_to_half(inf, half_format::bf16), 0x7f80);
  EXPECT_TRUE(std::isnan(simd::f16_to_float(simd::float_to_half(std::nanf(""), half_format::f16))));
  EXPECT_TRUE(std::isnan(simd::bf16_to_float(simd::float_to_half(std::nanf(""), half_format::bf16))));
  EXPECT_EQ(simd::f16_to_float(0x3c00), 1.0f);
  EXPECT_EQ(simd::f16_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(simd::bf16_to_float(0x3f80), 1.0f);
}

#if defined(__F16C__)
TEST(Half, NearestEvenIsF16cBitForBit) {
  std::mt19937 rng(9);
  std::uniform_int_distribution<std::uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    const float x = std::bit_cast<float>(bits(rng));
    if (std::isnan(x)) continue;
    const auto hw = static_cast<std::uint16_t>(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT));
    ASSERT_EQ(simd::float_to_half(x, half_format::f16), hw) << x;
  }
}
#endif

}  // namespace
