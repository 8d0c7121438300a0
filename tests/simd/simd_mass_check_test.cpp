// Tests for simd/mass_check.hpp: the vectorised validity pass must say "valid" exactly when the scalar definition
// does (every m finite and >= 0, every scale * m finite), for every bad value at every position (vector body and
// tail), float and double, the native isa and the 1-lane fallback. The sequences rely on it to skip the scalar
// loops, which still name the first bad entry when it says no (their messages: sequence_test.cpp).
#include <gtest/gtest.h>

#include <memdecay/core/attention.hpp>
#include <memdecay/simd/mass_check.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace md = memdecay;
namespace ms = memdecay::simd;

namespace {

template <class Float>
bool scalar_definition(const std::vector<Float>& mass, Float scale) {
  for (Float m : mass)
    if (!std::isfinite(m) || m < Float{0} || !std::isfinite(scale * m)) return false;
  return true;
}

template <ms::isa A, class Float>
void sweep() {
  using lim = std::numeric_limits<Float>;
  const std::vector<Float> bad = {
      lim::quiet_NaN(),   lim::infinity(), -lim::infinity(), Float(-1),
      -lim::denorm_min(), -lim::min(),     lim::max()};  // lim::max() is bad only once scaled by > 1
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<Float> u(Float{0}, Float{1});
  for (std::size_t n : {0u, 1u, 3u, 15u, 16u, 17u, 33u, 64u, 100u, 129u, 257u}) {  // every unrolled-loop remainder
    std::vector<Float> mass(n);
    for (auto& m : mass) m = u(rng) / static_cast<Float>(n + 1);
    if (n > 1) mass[n / 2] = Float(-0.0);  // negative zero is valid, as in the reference (m < 0 is false)
    for (Float scale : {Float{1}, static_cast<Float>(n + 1)}) {
      ASSERT_TRUE(ms::mass_is_valid<A>(mass.data(), n, scale)) << n;
      for (std::size_t at = 0; at < n; ++at)
        for (Float b : bad) {
          auto broken = mass;
          broken[at] = b;
          EXPECT_EQ(ms::mass_is_valid<A>(broken.data(), n, scale), scalar_definition(broken, scale))
              << "n " << n << " at " << at << " value " << b << " scale " << scale;
        }
    }
  }
}

// Float with a finite scale >= 0 is checked by the bit patterns' unsigned maximum against the largest m whose
// product with the scale is finite: the values at that boundary (the limit itself and the next float up), -0.0
// (above the range, valid) and each bad value, at every position of the unrolled body and the tail.
template <ms::isa A>
void boundary_sweep() {
  using lim = std::numeric_limits<float>;
  for (float scale : {0.0f, 1e-30f, 0.5f, 1.0f, 1.5f, 3.0f, 4096.0f, 1048576.0f, 1e20f, lim::max()}) {
    const std::uint32_t bits = ms::detail::finite_product_limit_bits(scale);
    float limit;
    std::memcpy(&limit, &bits, sizeof limit);
    const float above = std::nextafter(limit, lim::infinity());
    ASSERT_TRUE(std::isfinite(scale * limit)) << scale;
    ASSERT_TRUE(!(above <= lim::max()) || !std::isfinite(scale * above)) << scale;
    for (std::size_t n : {1u, 16u, 37u, 64u, 129u}) {
      std::vector<float> mass(n, 1e-3f);
      for (std::size_t at = 0; at < n; ++at)
        for (float v : {limit, above, -0.0f, 0.0f, -lim::denorm_min(), lim::quiet_NaN(), lim::infinity(),
                        -lim::infinity(), lim::max()}) {
          auto probe = mass;
          probe[at] = v;
          EXPECT_EQ(ms::mass_is_valid<A>(probe.data(), n, scale), scalar_definition(probe, scale))
              << "n " << n << " at " << at << " value " << v << " scale " << scale;
        }
    }
  }
}

}  // namespace

TEST(SimdMassCheck, FloatBitRangeCheckAgreesWithTheDefinitionAtTheBoundary) {
  boundary_sweep<ms::native_isa>();
  boundary_sweep<ms::isa::scalar>();
}
TEST(SimdMassCheck, FloatNativeIsaAgreesWithTheDefinition) { sweep<ms::native_isa, float>(); }
TEST(SimdMassCheck, DoubleNativeIsaAgreesWithTheDefinition) { sweep<ms::native_isa, double>(); }
TEST(SimdMassCheck, FloatScalarFallbackAgreesWithTheDefinition) { sweep<ms::isa::scalar, float>(); }
TEST(SimdMassCheck, DoubleScalarFallbackAgreesWithTheDefinition) { sweep<ms::isa::scalar, double>(); }

TEST(SimdMassCheck, ValidationStillNamesTheFirstBadEntry) {
  // The fast path only answers yes or no; the message comes from the scalar loop, unchanged.
  std::vector<float> mass(40, 0.01f);
  mass[21] = -2.0f;
  mass[33] = std::numeric_limits<float>::quiet_NaN();
  try {
    md::validate_mass<float>(mass, 40, "per-token attention");
    FAIL() << "accepted a negative mass";
  } catch (const md::input_error& e) {
    EXPECT_STREQ(e.what(), "invalid input: per-token attention[21] = -2 (attention mass must be finite and >= 0)");
  }
}
