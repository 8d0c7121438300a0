// SPDX-License-Identifier: Apache-2.0
// memdecay: packet<Float, isa::sse>: SSE2 (every x86-64), with SSE4.1 / FMA instructions where the compiler targets them. The operations every packet provides are the simd_packet
// concept (simd/packet.hpp, which includes this header and asserts the concept for every isa the build enables).
#ifndef MEMDECAY_SIMD_ISA_SSE_HPP
#define MEMDECAY_SIMD_ISA_SSE_HPP

#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "memdecay/core/region.hpp"
#include "memdecay/core/retention_score.hpp"
#include "memdecay/simd/arch.hpp"
#include "memdecay/simd/packet_traits.hpp"

MEMDECAY_SIMD_BEGIN
namespace memdecay::simd {

#if defined(MEMDECAY_SIMD_ENABLE_SSE)
// ---------------------------------------------------------------------------------------------------------------
// sse: SSE2 (every x86-64) with SSE4.1/FMA instructions where the compiler targets them.
namespace detail {
MEMDECAY_SIMD_INLINE __m128i sse_blend(__m128i a, __m128i b, __m128i m) noexcept {
  return _mm_or_si128(_mm_and_si128(m, b), _mm_andnot_si128(m, a));
}
}  // namespace detail

template <>
struct packet<float, isa::sse> {
  using value_type = float;
  using reg = __m128;
  using ureg = __m128i;
  using mask = __m128;
  static constexpr std::size_t lanes = 4;
  static constexpr std::size_t table_lanes = 0;
  struct table {
    const float* ptr;
  };

  static MEMDECAY_SIMD_INLINE reg set1(float v) noexcept { return _mm_set1_ps(v); }
  static MEMDECAY_SIMD_INLINE reg zero() noexcept { return _mm_setzero_ps(); }
  static MEMDECAY_SIMD_INLINE reg load(const float* p) noexcept { return _mm_loadu_ps(p); }
  static MEMDECAY_SIMD_INLINE void store(float* p, reg v) noexcept { _mm_storeu_ps(p, v); }
  static MEMDECAY_SIMD_INLINE reg add(reg a, reg b) noexcept { return _mm_add_ps(a, b); }
  static MEMDECAY_SIMD_INLINE reg sub(reg a, reg b) noexcept { return _mm_sub_ps(a, b); }
  static MEMDECAY_SIMD_INLINE reg mul(reg a, reg b) noexcept { return _mm_mul_ps(a, b); }
  static MEMDECAY_SIMD_INLINE reg fma(reg a, reg b, reg c) noexcept {
#if MEMDECAY_SIMD_HAS_FMA
    return _mm_fmadd_ps(a, b, c);
#else
    return _mm_add_ps(_mm_mul_ps(a, b), c);
#endif
  }
  static MEMDECAY_SIMD_INLINE reg min(reg a, reg b) noexcept { return _mm_min_ps(a, b); }
  static MEMDECAY_SIMD_INLINE reg max(reg a, reg b) noexcept { return _mm_max_ps(a, b); }
  static MEMDECAY_SIMD_INLINE reg pow2_shifted(reg k) noexcept {
    return _mm_castsi128_ps(_mm_slli_epi32(_mm_add_epi32(_mm_castps_si128(k), _mm_set1_epi32(127)), 23));
  }
  static MEMDECAY_SIMD_INLINE reg zero_below(reg x, reg lo, reg y) noexcept {
    return _mm_and_ps(_mm_cmpge_ps(x, lo), y);
  }
  static MEMDECAY_SIMD_INLINE float reduce_add(reg v) noexcept {
    const __m128 s = _mm_add_ps(v, _mm_movehl_ps(v, v));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)));
  }
  /// The bit patterns of `lanes` floats, and their lane-wise unsigned maximum (mass_check.hpp's range check).
  static MEMDECAY_SIMD_INLINE ureg load_bits(const float* p) noexcept { return _mm_castps_si128(_mm_loadu_ps(p)); }
  static MEMDECAY_SIMD_INLINE ureg max_u32(ureg a, ureg b) noexcept {
#if defined(__SSE4_1__)
    return _mm_max_epu32(a, b);
#else
    // SSE2 compares signed only: flipping the sign bits maps unsigned order onto signed order.
    const __m128i flip = _mm_set1_epi32(static_cast<int>(0x80000000u));
    const __m128i a_above = _mm_cmpgt_epi32(_mm_xor_si128(a, flip), _mm_xor_si128(b, flip));
    return _mm_or_si128(_mm_and_si128(a_above, a), _mm_andnot_si128(a_above, b));
#endif
  }
  static MEMDECAY_SIMD_INLINE ureg load_u32(const std::uint32_t* p) noexcept {
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  }
  static MEMDECAY_SIMD_INLINE void store_u32(std::uint32_t* p, ureg v) noexcept {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), v);
  }
  static MEMDECAY_SIMD_INLINE reg age(ureg lr, step_t now) noexcept {
    // Unsigned u32 -> float, correctly rounded: the two 16-bit halves convert exactly, one rounding in the add.
    const __m128i d = _mm_sub_epi32(_mm_set1_epi32(static_cast<int>(now)), lr);
    const __m128 hi = _mm_cvtepi32_ps(_mm_srli_epi32(d, 16));
    const __m128 lo = _mm_cvtepi32_ps(_mm_and_si128(d, _mm_set1_epi32(0xffff)));
    return _mm_add_ps(_mm_mul_ps(hi, _mm_set1_ps(65536.0f)), lo);
  }
  static MEMDECAY_SIMD_INLINE mask gt(reg a, reg b) noexcept { return _mm_cmpgt_ps(a, b); }
  static MEMDECAY_SIMD_INLINE ureg blend_u32(ureg a, std::uint32_t b, mask m) noexcept {
    return detail::sse_blend(a, _mm_set1_epi32(static_cast<int>(b)), _mm_castps_si128(m));
  }
  static MEMDECAY_SIMD_INLINE reg blend(reg a, reg b, mask m) noexcept {
    return _mm_or_ps(_mm_and_ps(m, b), _mm_andnot_ps(m, a));
  }
  static MEMDECAY_SIMD_INLINE mask eq_u32(ureg a, std::uint32_t now) noexcept {
    return _mm_castsi128_ps(_mm_cmpeq_epi32(a, _mm_set1_epi32(static_cast<int>(now))));
  }
  static MEMDECAY_SIMD_INLINE unsigned popcount(mask m) noexcept {
    return static_cast<unsigned>(std::popcount(static_cast<unsigned>(_mm_movemask_ps(m))));
  }
  static MEMDECAY_SIMD_INLINE table make_table(const float* t256) noexcept { return {t256}; }
  template <bool Small>
  static MEMDECAY_SIMD_INLINE reg lookup(const table& t, const region_id* r) noexcept {
    const float* p = t.ptr;
    return _mm_setr_ps(p[r[0]], p[r[1]], p[r[2]], p[r[3]]);
  }
};

template <>
struct packet<double, isa::sse> {
  using value_type = double;
  using reg = __m128d;
  using ureg = __m128i;  // two u32 in the low half
  using mask = __m128d;
  static constexpr std::size_t lanes = 2;
  static constexpr std::size_t table_lanes = 0;
  struct table {
    const double* ptr;
  };

  static MEMDECAY_SIMD_INLINE reg set1(double v) noexcept { return _mm_set1_pd(v); }
  static MEMDECAY_SIMD_INLINE reg zero() noexcept { return _mm_setzero_pd(); }
  static MEMDECAY_SIMD_INLINE reg load(const double* p) noexcept { return _mm_loadu_pd(p); }
  static MEMDECAY_SIMD_INLINE void store(double* p, reg v) noexcept { _mm_storeu_pd(p, v); }
  /// Stores the lanes rounded to float (lanes floats at p).
  static MEMDECAY_SIMD_INLINE void store_float(float* p, reg v) noexcept {
    _mm_storel_pi(reinterpret_cast<__m64*>(p), _mm_cvtpd_ps(v));
  }
  static MEMDECAY_SIMD_INLINE reg add(reg a, reg b) noexcept { return _mm_add_pd(a, b); }
  static MEMDECAY_SIMD_INLINE reg sub(reg a, reg b) noexcept { return _mm_sub_pd(a, b); }
  static MEMDECAY_SIMD_INLINE reg mul(reg a, reg b) noexcept { return _mm_mul_pd(a, b); }
  static MEMDECAY_SIMD_INLINE reg fma(reg a, reg b, reg c) noexcept {
#if MEMDECAY_SIMD_HAS_FMA
    return _mm_fmadd_pd(a, b, c);
#else
    return _mm_add_pd(_mm_mul_pd(a, b), c);
#endif
  }
  static MEMDECAY_SIMD_INLINE reg min(reg a, reg b) noexcept { return _mm_min_pd(a, b); }
  static MEMDECAY_SIMD_INLINE reg max(reg a, reg b) noexcept { return _mm_max_pd(a, b); }
  static MEMDECAY_SIMD_INLINE reg pow2_shifted(reg k) noexcept {
    return _mm_castsi128_pd(_mm_slli_epi64(_mm_add_epi64(_mm_castpd_si128(k), _mm_set1_epi64x(1023)), 52));
  }
  static MEMDECAY_SIMD_INLINE reg zero_below(reg x, reg lo, reg y) noexcept {
    return _mm_and_pd(_mm_cmpge_pd(x, lo), y);
  }
  static MEMDECAY_SIMD_INLINE double reduce_add(reg v) noexcept {
    return _mm_cvtsd_f64(_mm_add_sd(v, _mm_unpackhi_pd(v, v)));
  }
  static MEMDECAY_SIMD_INLINE ureg load_u32(const std::uint32_t* p) noexcept {
    return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  }
  static MEMDECAY_SIMD_INLINE void store_u32(std::uint32_t* p, ureg v) noexcept {
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p), v);
  }
  static MEMDECAY_SIMD_INLINE reg age(ureg lr, step_t now) noexcept {
    // Unsigned u32 -> double, exact: flip the sign bit, convert signed, add 2^31 back.
    const __m128i d = _mm_sub_epi32(_mm_set1_epi32(static_cast<int>(now)), lr);
    const __m128i s = _mm_xor_si128(d, _mm_set1_epi32(static_cast<int>(0x80000000u)));
    return _mm_add_pd(_mm_cvtepi32_pd(s), _mm_set1_pd(2147483648.0));
  }
  static MEMDECAY_SIMD_INLINE mask gt(reg a, reg b) noexcept { return _mm_cmpgt_pd(a, b); }
  static MEMDECAY_SIMD_INLINE ureg blend_u32(ureg a, std::uint32_t b, mask m) noexcept {
    const __m128i m32 = _mm_shuffle_epi32(_mm_castpd_si128(m), _MM_SHUFFLE(3, 3, 2, 0));  // 64-bit -> 32-bit lanes
    return detail::sse_blend(a, _mm_set1_epi32(static_cast<int>(b)), m32);
  }
  static MEMDECAY_SIMD_INLINE reg blend(reg a, reg b, mask m) noexcept {
    return _mm_or_pd(_mm_and_pd(m, b), _mm_andnot_pd(m, a));
  }
  static MEMDECAY_SIMD_INLINE mask eq_u32(ureg a, std::uint32_t now) noexcept {
    const __m128i e = _mm_cmpeq_epi32(a, _mm_set1_epi32(static_cast<int>(now)));
    return _mm_castsi128_pd(_mm_unpacklo_epi32(e, e));  // 32-bit lanes 0, 1 -> 64-bit lanes
  }
  static MEMDECAY_SIMD_INLINE unsigned popcount(mask m) noexcept {
    return static_cast<unsigned>(std::popcount(static_cast<unsigned>(_mm_movemask_pd(m))));
  }
  static MEMDECAY_SIMD_INLINE table make_table(const double* t256) noexcept { return {t256}; }
  template <bool Small>
  static MEMDECAY_SIMD_INLINE reg lookup(const table& t, const region_id* r) noexcept {
    const double* p = t.ptr;
    return _mm_setr_pd(p[r[0]], p[r[1]]);
  }
};
#endif  // MEMDECAY_SIMD_ENABLE_SSE

}  // namespace memdecay::simd
MEMDECAY_SIMD_END

#endif  // MEMDECAY_SIMD_ISA_SSE_HPP
