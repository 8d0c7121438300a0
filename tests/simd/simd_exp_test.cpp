// The vectorised exp against std::exp: bit-pattern sweeps of the decay range, the contract's edges, for the
// native isa and the scalar fallback (AVX2 and AVX-512 run the same checks in simd_isa_*_test.cpp).
#include "simd_kernel_checks.hpp"

namespace ms = memdecay::simd;

TEST(SimdExp, FloatNativeIsaWithinTwoTenthsOfAMicroOverTheDecayRange) {
  simd_checks::check_exp_float<ms::native_isa>();
}
TEST(SimdExp, FloatScalarFallback) { simd_checks::check_exp_float<ms::isa::scalar>(); }
TEST(SimdExp, DoubleNativeIsa) { simd_checks::check_exp_double<ms::native_isa>(); }
TEST(SimdExp, DoubleScalarFallback) { simd_checks::check_exp_double<ms::isa::scalar>(); }

TEST(SimdExp, TailLanesMatchFullLanes) {
  // Lengths that are not a multiple of the lane count: the tail runs the scalar packet and must give the same
  // values as the vector lanes for the same inputs (same polynomial and steps; FMA on both or on neither).
  std::vector<float> in(37);
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = -0.37f * static_cast<float>(i * i % 53);
  std::vector<float> all(in.size()), one(1);
  ms::exp<ms::native_isa, float>(in, all);
  for (std::size_t i = 0; i < in.size(); ++i) {
    ms::exp<ms::native_isa, float>(std::span<const float>(&in[i], 1), std::span<float>(one));
    EXPECT_NEAR(one[0], all[i], 1e-7f * all[i]) << i;
  }
}

TEST(SimdExp, DecayIsMonotoneInAge) {
  // exp(-lambda * dt) must not increase with dt, or older tokens could outscore newer ones of the same region.
  std::vector<float> in, out;
  for (int dt = 0; dt < 20000; ++dt) in.push_back(-0.00407f * static_cast<float>(dt));
  out.resize(in.size());
  ms::exp<ms::native_isa, float>(in, out);
  for (std::size_t i = 1; i < out.size(); ++i) ASSERT_LE(out[i], out[i - 1]) << "dt " << i;
}
