// SPDX-License-Identifier: Apache-2.0
// memdecay: the vectorised fast path of attention-mass validation.
//
// Every observation is validated before it touches the state (finite, >= 0, and finite once normalised), which
// as two scalar loops with a branch per token cost more than the fused observe + score kernel itself (64K tokens:
// 47 us of validation against 20 us of kernel, AVX-512). This pass answers "is all of it valid?" with no branch
// per token. Float mass with a finite scale >= 0 (every normalisation's): the valid values are exactly the floats
// whose bit patterns, read as unsigned integers, lie in [bits(+0), bits(largest m with scale m finite)], so one
// running unsigned maximum of the patterns answers (-0.0, valid but above the range, falls through to the
// arithmetic check). Otherwise (double, any other scale): x - x is 0 for a finite x and NaN for an infinite or
// NaN one, so a running sum of (s m - s m) is NaN exactly when some m or s m is not finite, and a running minimum
// of m is < 0 exactly when some m is negative (-0.0 is not). When it answers no, the scalar checks run to find
// and name the first bad entry, so errors and their messages are unchanged.
#ifndef MEMDECAY_SIMD_MASS_CHECK_HPP
#define MEMDECAY_SIMD_MASS_CHECK_HPP

#include <algorithm>
#include <bit>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "memdecay/simd/arch.hpp"
#include "memdecay/simd/packet.hpp"

MEMDECAY_SIMD_BEGIN
namespace memdecay::simd {

namespace detail {

/// Whether every mass[i] is finite and >= 0 and scale * mass[i] is finite: arithmetic on the values (any scale).
template <isa A, std::floating_point Float>
[[nodiscard]] bool mass_is_valid_arithmetic(const Float* mass, std::size_t n, Float scale) noexcept {
  using P = packet<Float, A>;
  constexpr std::size_t W = P::lanes;
  const auto s = P::set1(scale);
  // Four independent accumulators of each: with one, every packet waited for the previous add's latency, and the
  // check cost a fifth of an observation at 64K tokens (bench: library/validate/simd).
  auto nf0 = P::zero(), nf1 = P::zero(), nf2 = P::zero(), nf3 = P::zero();
  auto lo0 = P::zero(), lo1 = P::zero(), lo2 = P::zero(), lo3 = P::zero();
  std::size_t i = 0;
  for (; i + 4 * W <= n; i += 4 * W) {
    const auto m0 = P::load(mass + i), m1 = P::load(mass + i + W), m2 = P::load(mass + i + 2 * W),
               m3 = P::load(mass + i + 3 * W);
    const auto x0 = P::mul(s, m0), x1 = P::mul(s, m1), x2 = P::mul(s, m2), x3 = P::mul(s, m3);
    nf0 = P::add(nf0, P::sub(x0, x0));
    nf1 = P::add(nf1, P::sub(x1, x1));
    nf2 = P::add(nf2, P::sub(x2, x2));
    nf3 = P::add(nf3, P::sub(x3, x3));
    lo0 = P::min(lo0, m0);
    lo1 = P::min(lo1, m1);
    lo2 = P::min(lo2, m2);
    lo3 = P::min(lo3, m3);
  }
  auto not_finite = P::add(P::add(nf0, nf1), P::add(nf2, nf3));
  auto lowest = P::min(P::min(lo0, lo1), P::min(lo2, lo3));
  for (; i + W <= n; i += W) {
    const auto m = P::load(mass + i);
    const auto x = P::mul(s, m);
    not_finite = P::add(not_finite, P::sub(x, x));
    lowest = P::min(lowest, m);
  }
  Float tail_not_finite = Float{0}, tail_lowest = Float{0};
  for (; i < n; ++i) {
    const Float x = scale * mass[i];
    tail_not_finite += x - x;
    tail_lowest = std::min(tail_lowest, mass[i]);
  }
  alignas(64) Float lanes[W];
  P::store(lanes, lowest);
  for (std::size_t k = 0; k < W; ++k) tail_lowest = std::min(tail_lowest, lanes[k]);
  // (A NaN mass also lands in not_finite, whatever min made of it.)
  return !std::isnan(P::reduce_add(not_finite) + tail_not_finite) && !(tail_lowest < Float{0});
}

/// The bit pattern of the largest float m for which scale * m is finite (scale finite and >= 0). The bit patterns
/// of +0 ... FLT_MAX order as the values do, and every other float (-0, the negatives, the infinities, the NaNs)
/// has a pattern above FLT_MAX's, so "m >= 0, finite, and scale * m finite" is "bits(m) <= this", -0 excepted.
[[nodiscard]] inline std::uint32_t finite_product_limit_bits(float scale) noexcept {
  constexpr float most = std::numeric_limits<float>::max();
  constexpr float inf = std::numeric_limits<float>::infinity();
  float m = most;  // scale <= 1: scale * m <= m is finite for every finite m
  if (scale > 1.0f) {
    m = most / scale;  // within an ulp or two of the boundary: step to it
    while (!std::isfinite(scale * m)) m = std::nextafter(m, 0.0f);
    for (float up = std::nextafter(m, inf); up <= most && std::isfinite(scale * up); up = std::nextafter(up, inf)) m = up;
  }
  return std::bit_cast<std::uint32_t>(m);
}

/// The float check as one unsigned maximum of the bit patterns (a load and a max per packet, against a load, a
/// multiply, a subtract, an add and a min): exact for finite scale >= 0, except that a -0 entry (valid, as in the
/// reference) lands above the limit; then, and for any entry that is really bad, the arithmetic check decides.
template <isa A>
[[nodiscard]] bool mass_is_valid_by_bits(const float* mass, std::size_t n, float scale) noexcept {
  using P = packet<float, A>;
  constexpr std::size_t W = P::lanes;
  const std::uint32_t limit = finite_product_limit_bits(scale);
  // Four independent maxima: one would chain every packet on the previous max's latency.
  alignas(64) static constexpr std::uint32_t zeros[W] = {};
  auto hi0 = P::load_u32(zeros), hi1 = hi0, hi2 = hi0, hi3 = hi0;
  std::size_t i = 0;
  for (; i + 4 * W <= n; i += 4 * W) {
    hi0 = P::max_u32(hi0, P::load_bits(mass + i));
    hi1 = P::max_u32(hi1, P::load_bits(mass + i + W));
    hi2 = P::max_u32(hi2, P::load_bits(mass + i + 2 * W));
    hi3 = P::max_u32(hi3, P::load_bits(mass + i + 3 * W));
  }
  auto hi = P::max_u32(P::max_u32(hi0, hi1), P::max_u32(hi2, hi3));
  for (; i + W <= n; i += W) hi = P::max_u32(hi, P::load_bits(mass + i));
  alignas(64) std::uint32_t lanes[W];
  P::store_u32(lanes, hi);
  std::uint32_t highest = 0;
  for (std::size_t k = 0; k < W; ++k) highest = std::max(highest, lanes[k]);
  for (; i < n; ++i) highest = std::max(highest, std::bit_cast<std::uint32_t>(mass[i]));
  return highest <= limit || mass_is_valid_arithmetic<A>(mass, n, scale);
}

}  // namespace detail

/// Whether every mass[i] (n entries) is finite and >= 0 and scale * mass[i] is finite.
template <isa A = native_isa, std::floating_point Float>
[[nodiscard]] bool mass_is_valid(const Float* mass, std::size_t n, Float scale) noexcept {
  if constexpr (std::same_as<Float, float>)
    if (std::isfinite(scale) && scale >= 0.0f) return detail::mass_is_valid_by_bits<A>(mass, n, scale);
  return detail::mass_is_valid_arithmetic<A>(mass, n, scale);
}

}  // namespace memdecay::simd
MEMDECAY_SIMD_END

#endif  // MEMDECAY_SIMD_MASS_CHECK_HPP
