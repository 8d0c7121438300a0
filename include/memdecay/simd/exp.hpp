// SPDX-License-Identifier: Apache-2.0
// memdecay: the vectorised exponential used by the decay term.
//
// exp(x) = 2^n * exp(r),  n = round(x / ln 2),  r = x - n ln 2 in [-ln2/2, ln2/2]
//
//   1. Clamp x to [lo, hi] (the range where 2^n is a normal number and does not overflow).
//   2. k = x * log2(e) + S with S = 1.5 * 2^m (m = 23 for float, 52 for double): adding S rounds x/ln2 to the
//      nearest integer n and leaves n in the low mantissa bits of k (k's bits = bits(S) + n).
//   3. n = k - S (exact). r = x - n*ln2_hi - n*ln2_lo (Cody-Waite: ln2_hi has trailing zero bits, so n*ln2_hi
//      is exact and the reduction loses nothing for |n| < 2^9 / 2^11).
//   4. exp(r): float 1 + r + r^2 P5(r) with Cephes' minimax P5; double the degree-13 Taylor polynomial (its
//      truncation error on |r| <= ln2/2 is below 2e-17). Horner with FMA where the isa has it.
//   5. 2^n from k's bits: (bits(k) + bias) << m. The bits of S shift out of the word; what is left is the biased
//      exponent n + bias in the exponent field (n + bias in [1, 254] / [1, 2046] after the clamp).
//   6. Inputs below lo return exactly 0.
//
// Contract (per lane, float / double):
//   Valid range   float [-87.3, 88.3], double [-708.3, 709.0]; x < lo -> 0 (|error| < 1.2e-38 / 2.3e-308);
//                 x > hi -> exp(hi) (saturates, never inf). NaN input: unspecified.
//   Max error     measured by tests/simd/simd_exp_test.cpp against std::exp in long double, see docs/simd.md:
//                 float <= 2e-7 relative (about 1 ulp), double <= 4e-16 relative over the valid range.
//   Decay range   the scorer only calls it with x = -lambda * dt <= 0.
#ifndef MEMDECAY_SIMD_EXP_HPP
#define MEMDECAY_SIMD_EXP_HPP

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <span>

#include "memdecay/simd/arch.hpp"
#include "memdecay/simd/packet.hpp"

MEMDECAY_SIMD_BEGIN
namespace memdecay::simd {

/// The constants of exp for one float type.
template <std::floating_point Float>
struct exp_constants;

template <>
struct exp_constants<float> {
  static constexpr float lo = -87.3f;  ///< exp(lo) ~ 1.2e-38 >= FLT_MIN: 2^n stays normal
  static constexpr float hi = 88.3f;   ///< n <= 127
  static constexpr float log2e = 1.44269504088896341f;
  static constexpr float shifter = 12582912.0f;  ///< 1.5 * 2^23
  static constexpr float ln2_hi = 0.693359375f;  ///< 9 significant bits: n * ln2_hi is exact
  static constexpr float ln2_lo = -2.12194440e-4f;
};

template <>
struct exp_constants<double> {
  static constexpr double lo = -708.3;  ///< exp(lo) ~ 2.4e-308 >= DBL_MIN
  static constexpr double hi = 709.0;   ///< n <= 1023
  static constexpr double log2e = 1.4426950408889634074;
  static constexpr double shifter = 6755399441055744.0;  ///< 1.5 * 2^52
  static constexpr double ln2_hi = 6.93145751953125E-1;  ///< 32 significant bits
  static constexpr double ln2_lo = 1.42860682030941723212E-6;
};

namespace detail {
/// The body of exp. Clamp: false skips the clamp to [lo, hi] (two instructions), which is valid for x <= hi:
/// below lo the intermediate values are garbage (possibly inf or NaN) and the final mask replaces them by 0.
template <class P, bool Clamp>
[[nodiscard]] MEMDECAY_SIMD_INLINE typename P::reg exp_body(typename P::reg x) noexcept {
  using Float = typename P::value_type;
  using C = exp_constants<Float>;
  using reg = typename P::reg;
  const reg lo = P::set1(C::lo);
  reg xc = x;
  if constexpr (Clamp) xc = P::min(P::max(x, lo), P::set1(C::hi));
  const reg k = P::fma(xc, P::set1(C::log2e), P::set1(C::shifter));
  const reg n = P::sub(k, P::set1(C::shifter));
  reg r = P::fma(n, P::set1(-C::ln2_hi), xc);
  r = P::fma(n, P::set1(-C::ln2_lo), r);
  reg y;
  if constexpr (std::same_as<Float, float>) {
    // Cephes expf: exp(r) = 1 + r + r^2 * P(r), |r| <= ln2/2.
    reg p = P::set1(1.9875691500E-4f);
    p = P::fma(p, r, P::set1(1.3981999507E-3f));
    p = P::fma(p, r, P::set1(8.3334519073E-3f));
    p = P::fma(p, r, P::set1(4.1665795894E-2f));
    p = P::fma(p, r, P::set1(1.6666665459E-1f));
    p = P::fma(p, r, P::set1(5.0000001201E-1f));
    y = P::add(P::fma(p, P::mul(r, r), r), P::set1(1.0f));
  } else {
    // Taylor to r^13 (1/k!), Horner from the top.
    reg p = P::set1(1.0 / 6227020800.0);           // 1/13!
    p = P::fma(p, r, P::set1(1.0 / 479001600.0));  // 1/12!
    p = P::fma(p, r, P::set1(1.0 / 39916800.0));   // 1/11!
    p = P::fma(p, r, P::set1(1.0 / 3628800.0));    // 1/10!
    p = P::fma(p, r, P::set1(1.0 / 362880.0));     // 1/9!
    p = P::fma(p, r, P::set1(1.0 / 40320.0));      // 1/8!
    p = P::fma(p, r, P::set1(1.0 / 5040.0));       // 1/7!
    p = P::fma(p, r, P::set1(1.0 / 720.0));        // 1/6!
    p = P::fma(p, r, P::set1(1.0 / 120.0));        // 1/5!
    p = P::fma(p, r, P::set1(1.0 / 24.0));         // 1/4!
    p = P::fma(p, r, P::set1(1.0 / 6.0));          // 1/3!
    p = P::fma(p, r, P::set1(0.5));                // 1/2!
    y = P::add(P::fma(p, P::mul(r, r), r), P::set1(1.0));
  }
  return P::zero_below(x, lo, P::mul(y, P::pow2_shifted(k)));
}
}  // namespace detail

/// exp of every lane of `x` (see the contract above). P is a packet<Float, isa>.
template <class P>
[[nodiscard]] MEMDECAY_SIMD_INLINE typename P::reg exp(typename P::reg x) noexcept {
  return detail::exp_body<P, true>(x);
}

/// exp for x <= hi only (the decay's arguments are <= 0): the same values as exp() there, two instructions
/// fewer. x > hi gives an unspecified value.
template <class P>
[[nodiscard]] MEMDECAY_SIMD_INLINE typename P::reg exp_bounded_above(typename P::reg x) noexcept {
  return detail::exp_body<P, false>(x);
}

/// out[i] = exp(in[i]) for every i, with the isa `A` (the native one by default). Lengths must match.
template <isa A = native_isa, std::floating_point Float>
void exp(std::span<const Float> in, std::span<Float> out) noexcept {
  using P = packet<Float, A>;
  using S = packet<Float, isa::scalar>;
  const std::size_t n = std::min(in.size(), out.size());
  std::size_t i = 0;
  for (; i + P::lanes <= n; i += P::lanes) P::store(out.data() + i, exp<P>(P::load(in.data() + i)));
  for (; i < n; ++i) out[i] = exp<S>(in[i]);
}

}  // namespace memdecay::simd
MEMDECAY_SIMD_END

#endif  // MEMDECAY_SIMD_EXP_HPP
