// SPDX-License-Identifier: Apache-2.0
// memdecay: the vectorised reduction of attention rows (core/attention_rows.hpp) over a block of tokens.
//
// Row 0's values (widened from fp16/bf16 in the load: F16C, AVX-512 or a shift), plus each further row's, in row
// order, then times 1 / rows for a mean. Per token this is the reference's arithmetic in the same order, so the
// result is the same bits (tests/unit/attention_rows_test.cpp sweeps formats, strides, rows
// and tails). With Check, the pass also answers whether every element it read is finite and >= 0 and every sum
// finite once normalised, with mass_check.hpp's branch-free trick (x - x is NaN exactly for a non-finite x; a
// running minimum for the sign).
#ifndef MEMDECAY_SIMD_REDUCE_ROWS_HPP
#define MEMDECAY_SIMD_REDUCE_ROWS_HPP

#include <algorithm>
#include <array>
#include <utility>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "memdecay/core/attention_rows.hpp"
#include "memdecay/simd/arch.hpp"
#include "memdecay/simd/half.hpp"
#include "memdecay/simd/packet.hpp"

MEMDECAY_SIMD_BEGIN
namespace memdecay::simd {
namespace detail {

template <mass_format F>
using element_of = std::conditional_t<F == mass_format::f32, float, std::uint16_t>;

template <mass_format F>
[[nodiscard]] const element_of<F>* row_of(const attention_rows& rows, std::size_t r) noexcept {
  if constexpr (F == mass_format::f32)
    return rows.f32_row(r);
  else
    return rows.half_row(r);
}

template <isa A, mass_format F>
[[nodiscard]] MEMDECAY_SIMD_INLINE typename packet<float, A>::reg load_elements(const element_of<F>* p) noexcept {
  if constexpr (F == mass_format::f32)
    return packet<float, A>::load(p);
  else
    return load_widened<A, F == mass_format::f16 ? half_format::f16 : half_format::bf16>(p);
}

template <mass_format F>
[[nodiscard]] float widen(element_of<F> v) noexcept {
  if constexpr (F == mass_format::f32)
    return v;
  else if constexpr (F == mass_format::f16)
    return f16_to_float(v);
  else
    return bf16_to_float(v);
}

// A packet of tokens at a time, every row of a group of up to 8 loaded and added in row order and stored once
// (Eigen's colwise sum does the same; adding one row at a time into the output stores every packet once per row
// and ran at half of Eigen's speed). More than 8 rows are taken 8 at a time over a tile of tokens that stays in
// the L1 cache, each group adding to the last one's sums, so the number of streams stays small.
inline constexpr std::size_t reduce_group_rows = 8;
inline constexpr std::size_t reduce_tile_tokens = 1024;

// The checks' state of one pass. Two accumulators of each (alternate packets), so that no packet waits for the
// last one's check. An element needs only the sign check: an infinite or NaN element makes its token's sum
// infinite or NaN, which the check of the sums catches (so does -inf, with its sign).
template <isa A>
struct reduce_checks {
  using P = packet<float, A>;
  typename P::reg not_finite[2] = {P::zero(), P::zero()};
  typename P::reg lowest[2] = {P::zero(), P::zero()};
  float tail_not_finite = 0.0f, tail_lowest = 0.0f;

  [[nodiscard]] bool passed() const noexcept {
    constexpr std::size_t W = P::lanes;
    alignas(64) float lanes[W];
    P::store(lanes, P::min(lowest[0], lowest[1]));
    float low = tail_lowest;
    for (std::size_t k = 0; k < W; ++k) low = std::min(low, lanes[k]);
    return !std::isnan(P::reduce_add(P::add(not_finite[0], not_finite[1])) + tail_not_finite) && !(low < 0.0f);
  }
};

// Rows [g, g + G) over tokens [t0, t0 + m) of the block: added in row order to acc (or starting it, g = 0); on the
// last group, times 1 / rows for a mean, and the sums checked. G is a constant, so the row pointers stay in
// registers and the adds are unrolled.
template <isa A, mass_format F, bool Check, std::size_t G>
MEMDECAY_SIMD_INLINE void reduce_group(const attention_rows& rows, std::size_t g, std::size_t first, std::size_t m,
                                       float* acc, bool last, float scale, reduce_checks<A>& c) noexcept {
  using P = packet<float, A>;
  using reg = typename P::reg;
  constexpr std::size_t W = P::lanes;
  const bool mean = last && rows.reduction() == head_reduction::mean && rows.rows() > 1;
  const float inv_rows = 1.0f / static_cast<float>(rows.rows());
  const auto inv = P::set1(inv_rows);
  const auto s = P::set1(scale);
  std::array<const element_of<F>*, G> row;
  for (std::size_t r = 0; r < G; ++r) row[r] = row_of<F>(rows, g + r) + first;
  // The checks in local registers (an indexed array of them stays in memory), two of each for alternate packets.
  reg low0 = c.lowest[0], low1 = c.lowest[1], nf0 = c.not_finite[0], nf1 = c.not_finite[1];
  auto one_packet = [&](std::size_t t, reg& lowest, reg& not_finite) __attribute__((always_inline)) {
    reg x = load_elements<A, F>(row[0] + t);
    reg sum = g == 0 ? x : P::add(P::load(acc + t), x);
    [[maybe_unused]] reg low = x;
#pragma GCC unroll 8
    for (std::size_t r = 1; r < G; ++r) {
      x = load_elements<A, F>(row[r] + t);
      if constexpr (Check) in_register(x);
      sum = P::add(sum, x);
      if constexpr (Check) low = P::min(low, x);
    }
    if constexpr (Check) lowest = P::min(lowest, low);
    if (last) {
      if (mean) sum = P::mul(sum, inv);
      if constexpr (Check) {
        const auto scaled = P::mul(s, sum);
        not_finite = P::add(not_finite, P::sub(scaled, scaled));
      }
    }
    P::store(acc + t, sum);
  };
  std::size_t t = 0;
  for (; t + 2 * W <= m; t += 2 * W) {
    one_packet(t, low0, nf0);
    one_packet(t + W, low1, nf1);
  }
  for (; t + W <= m; t += W) one_packet(t, low0, nf0);
  c.lowest[0] = low0;
  c.lowest[1] = low1;
  c.not_finite[0] = nf0;
  c.not_finite[1] = nf1;
  for (; t < m; ++t) {
    float sum = 0.0f;
    for (std::size_t r = 0; r < G; ++r) {
      const float x = widen<F>(row[r][t]);
      sum = r == 0 && g == 0 ? x : (r == 0 ? acc[t] + x : sum + x);
      if constexpr (Check) c.tail_lowest = std::min(c.tail_lowest, x);
    }
    if (mean) sum *= inv_rows;
    if constexpr (Check) {
      if (last) {
        const float scaled = scale * sum;
        c.tail_not_finite += scaled - scaled;
      }
    }
    acc[t] = sum;
  }
}

template <isa A, mass_format F, bool Check>
bool reduce_rows_impl(const attention_rows& rows, std::size_t begin, std::size_t count, float* out,
                      float scale) noexcept {
  reduce_checks<A> c;
  const std::size_t n_rows = rows.rows();
  const std::size_t tile = n_rows > reduce_group_rows ? reduce_tile_tokens : count;
  for (std::size_t t0 = 0; t0 < count; t0 += tile) {
    const std::size_t m = std::min(tile, count - t0);
    for (std::size_t g = 0; g < n_rows; g += reduce_group_rows) {
      const std::size_t group = std::min(reduce_group_rows, n_rows - g);
      const bool last = g + group == n_rows;
      const std::size_t first = begin + t0;
      float* acc = out + t0;
      switch (group) {
        case 1: reduce_group<A, F, Check, 1>(rows, g, first, m, acc, last, scale, c); break;
        case 2: reduce_group<A, F, Check, 2>(rows, g, first, m, acc, last, scale, c); break;
        case 3: reduce_group<A, F, Check, 3>(rows, g, first, m, acc, last, scale, c); break;
        case 4: reduce_group<A, F, Check, 4>(rows, g, first, m, acc, last, scale, c); break;
        case 5: reduce_group<A, F, Check, 5>(rows, g, first, m, acc, last, scale, c); break;
        case 6: reduce_group<A, F, Check, 6>(rows, g, first, m, acc, last, scale, c); break;
        case 7: reduce_group<A, F, Check, 7>(rows, g, first, m, acc, last, scale, c); break;
        default: reduce_group<A, F, Check, 8>(rows, g, first, m, acc, last, scale, c); break;
      }
    }
  }
  if constexpr (Check)
    return c.passed();
  else
    return true;
}

template <isa A, bool Check>
bool reduce_rows_dispatch(const attention_rows& rows, std::size_t begin, std::size_t count, float* out,
                          float scale) noexcept {
  switch (rows.format()) {
    case mass_format::f32: return reduce_rows_impl<A, mass_format::f32, Check>(rows, begin, count, out, scale);
    case mass_format::f16: return reduce_rows_impl<A, mass_format::f16, Check>(rows, begin, count, out, scale);
    case mass_format::bf16: return reduce_rows_impl<A, mass_format::bf16, Check>(rows, begin, count, out, scale);
  }
  return false;
}

}  // namespace detail

/// out[0, count) = the reduced mass of tokens [begin, begin + count) (core/attention_rows.hpp's specification, the
/// same bits). The caller keeps the range inside rows.tokens().
template <isa A = native_isa>
void reduce_rows(const attention_rows& rows, std::size_t begin, std::size_t count, float* out) noexcept {
  detail::reduce_rows_dispatch<A, false>(rows, begin, count, out, 1.0f);
}
/// reduce_rows, and whether every element read was finite and >= 0 and every reduced mass stays finite times
/// `scale` (> 0; the policy's normalisation: mass_check.hpp's question about the reduced observation).
template <isa A = native_isa>
[[nodiscard]] bool reduce_rows_checked(const attention_rows& rows, std::size_t begin, std::size_t count, float* out,
                                       float scale = 1.0f) noexcept {
  return detail::reduce_rows_dispatch<A, true>(rows, begin, count, out, scale);
}

}  // namespace memdecay::simd
MEMDECAY_SIMD_END

#endif  // MEMDECAY_SIMD_REDUCE_ROWS_HPP
