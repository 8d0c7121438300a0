// SPDX-License-Identifier: Apache-2.0
// memdecay: 16-bit floats (IEEE binary16 "fp16" and bfloat16 "bf16"), the forms engines keep keys and attention in.
//
// Scalar conversions are the readable specification: widening is exact for both formats; narrowing rounds to
// nearest-even, or towards +inf / -inf when a caller needs a bound to stay a bound (a page digest's channel minimum
// is rounded down and its maximum up, so the q.k upper bound computed from the narrowed digest is still an upper
// bound: digests/page_digests.hpp). NaN stays NaN (quiet), infinities stay infinities.
//
// load_widened<isa, format>(p) loads packet<float, isa>::lanes 16-bit values and widens them to one float packet:
// F16C's vcvtph2ps for fp16 where the build has it (AVX-512F always, AVX2 with __F16C__), a 16-bit shift for bf16
// (its bits are the top half of a float's), and the scalar conversion lane by lane elsewhere. Every path gives the
// same floats bit for bit (widening is exact), which tests/simd/simd_digest_bound_test.cpp checks.
#ifndef MEMDECAY_SIMD_HALF_HPP
#define MEMDECAY_SIMD_HALF_HPP

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "memdecay/simd/arch.hpp"
#include "memdecay/simd/packet.hpp"

namespace memdecay {

/// The 16-bit float formats.
enum class half_format : std::uint8_t {
  f16,   ///< IEEE 754 binary16: 1 sign, 5 exponent, 10 mantissa bits (largest finite 65504)
  bf16,  ///< bfloat16: the top 16 bits of a binary32 (8 exponent bits: the range of float, 8 bits of precision)
};

/// How a narrowing conversion rounds.
enum class half_rounding : std::uint8_t {
  nearest_even,  ///< the closest value, ties to the even mantissa (IEEE's default)
  toward_plus,   ///< the smallest value >= x (a maximum stays an upper bound)
  toward_minus,  ///< the largest value <= x (a minimum stays a lower bound)
};

namespace simd {

/// Exact widening of an fp16 value.
[[nodiscard]] inline float f16_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu;
  const std::uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa x 2^-24, exact in float
    const float v = std::ldexp(static_cast<float>(mantissa), -24);
    return sign != 0 ? -v : v;
  }
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));  // inf, NaN
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

/// Exact widening of a bf16 value.
[[nodiscard]] inline float bf16_to_float(std::uint16_t h) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16);
}

[[nodiscard]] inline float half_to_float(std::uint16_t h, half_format f) noexcept {
  return f == half_format::f16 ? f16_to_float(h) : bf16_to_float(h);
}

namespace detail {
inline std::uint16_t f16_nearest_even(float x) noexcept {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
  const auto sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const std::uint32_t ax = bits & 0x7fffffffu;
  if (ax > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);   // NaN (quiet)
  if (ax >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (ax < 0x38800000u) {  // below 2^-14: an fp16 subnormal (or zero); x 2^24 is exact and below 2^10
    const float scaled = std::bit_cast<float>(ax) * 16777216.0f;
    return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(std::nearbyint(scaled)));
  }
  std::uint32_t h = (ax - 0x38000000u) >> 13;  // rebias the exponent (127 - 15), keep 10 mantissa bits
  const std::uint32_t rest = ax & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u) != 0)) ++h;  // a carry moves into the exponent correctly
  return static_cast<std::uint16_t>(sign | h);
}
inline std::uint16_t bf16_nearest_even(float x) noexcept {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x40u);  // quiet NaN
  return static_cast<std::uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}
// The next representable value above / below h. Both formats are sign-magnitude, so a step is +-1 on the bits.
inline std::uint16_t half_next_up(std::uint16_t h) noexcept {
  if (h == 0x8000u) return 0x0001u;  // -0 -> smallest positive
  return (h & 0x8000u) != 0 ? static_cast<std::uint16_t>(h - 1) : static_cast<std::uint16_t>(h + 1);
}
inline std::uint16_t half_next_down(std::uint16_t h) noexcept {
  if (h == 0x0000u) return 0x8001u;  // +0 -> smallest negative
  return (h & 0x8000u) != 0 ? static_cast<std::uint16_t>(h + 1) : static_cast<std::uint16_t>(h - 1);
}
}  // namespace detail

/// Narrows x to `f`, rounded as `r`. A finite x beyond the format's range becomes its largest finite value when
/// rounding towards it, infinity otherwise (IEEE's rule).
[[nodiscard]] inline std::uint16_t float_to_half(float x, half_format f,
                                                 half_rounding r = half_rounding::nearest_even) noexcept {
  std::uint16_t h = f == half_format::f16 ? detail::f16_nearest_even(x) : detail::bf16_nearest_even(x);
  if (r == half_rounding::nearest_even || std::isnan(x)) return h;
  const float back = half_to_float(h, f);
  if (r == half_rounding::toward_plus && back < x) h = detail::half_next_up(h);
  if (r == half_rounding::toward_minus && back > x) h = detail::half_next_down(h);
  return h;
}

MEMDECAY_SIMD_BEGIN

/// Loads packet<float, A>::lanes 16-bit values of format F from `p` (unaligned) as one float packet.
template <isa A, half_format F>
[[nodiscard]] MEMDECAY_SIMD_INLINE typename packet<float, A>::reg load_widened(const std::uint16_t* p) noexcept {
  using P = packet<float, A>;
#if defined(MEMDECAY_SIMD_ENABLE_AVX512)
  if constexpr (A == isa::avx512) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    if constexpr (F == half_format::f16)
      return _mm512_cvtph_ps(h);
    else
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
#endif
#if defined(MEMDECAY_SIMD_ENABLE_AVX2)
  if constexpr (A == isa::avx2) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    if constexpr (F == half_format::bf16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
#if defined(__F16C__) || defined(MEMDECAY_SIMD_ENABLE_AVX512)
    if constexpr (F == half_format::f16) return _mm256_cvtph_ps(h);
#endif
  }
#endif
#if defined(MEMDECAY_SIMD_ENABLE_SSE)
  if constexpr (A == isa::sse && F == half_format::bf16) {  // interleaving zeros below each value shifts it up 16
    const __m128i h = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return _mm_castsi128_ps(_mm_unpacklo_epi16(_mm_setzero_si128(), h));
  }
#endif
  alignas(64) float widened[P::lanes];
  for (std::size_t i = 0; i < P::lanes; ++i) widened[i] = half_to_float(p[i], F);
  return P::load(widened);
}

MEMDECAY_SIMD_END

}  // namespace simd
}  // namespace memdecay

#endif  // MEMDECAY_SIMD_HALF_HPP
