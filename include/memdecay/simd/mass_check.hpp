// SPDX-License-Identifier: Apache-2.0
// memdecay: the vectorised fast path of attention-mass validation.
//
// Every observation is validated before it touches the state (finite, >= 0, and finite once normalised), which
// as two scalar loops with a branch per token cost more than the fused observe + score kernel itself (64K tokens:
// 47 us of validation against 20 us of kernel, AVX-512). This pass answers "is all of it valid?" with no branch
// per token: x - x is 0 for a finite x and NaN for an infinite or NaN one, so a running sum of (s m - s m) is NaN
// exactly when some m or s m is not finite, and a running minimum of m is < 0 exactly when some m is negative
// (-0.0 is not). When it answers no, the scalar checks run to find and name the first bad entry, so errors and
// their messages are unchanged.
#ifndef MEMDECAY_SIMD_MASS_CHECK_HPP
#define MEMDECAY_SIMD_MASS_CHECK_HPP

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>

#include "memdecay/simd/arch.hpp"
#include "memdecay/simd/packet.hpp"

MEMDECAY_SIMD_BEGIN
namespace memdecay::simd {

/// Whether every mass[i] (n entries) is finite and >= 0 and scale * mass[i] is finite.
template <isa A = native_isa, std::floating_point Float>
[[nodiscard]] bool mass_is_valid(const Float* mass, std::size_t n, Float scale) noexcept {
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

}  // namespace memdecay::simd
MEMDECAY_SIMD_END

#endif  // MEMDECAY_SIMD_MASS_CHECK_HPP
