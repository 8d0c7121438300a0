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
  auto not_finite = P::zero(), lowest = P::zero();
  std::size_t i = 0;
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
