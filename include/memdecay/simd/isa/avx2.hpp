// SPDX-License-Identifier: Apache-2.0
// memdecay: packet<Float, isa::avx2>: AVX2 (+ FMA where targeted). The operations every packet provides are the simd_packet
// concept (simd/packet.hpp, which includes this header and asserts the concept for every isa the build enables).
#ifndef MEMDECAY_SIMD_ISA_AVX2_HPP
#define MEMDECAY_SIMD_ISA_AVX2_HPP

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

#if defined(MEMDECAY_SIMD_ENABLE_AVX2)
// ---------------------------------------------------------------------------------------------------------------
// avx2: 256-bit registers, gathers, in-register permutes for up to 8 float regions.
template <>
struct packet<float, isa::avx2> {
  using value_type = float;
  using reg = __m256;
  using ureg = __m256i;
  using mask = __m256;
  static constexpr std::size_t lanes = 8;
  static constexpr std::size_t table_lanes = 8;
  static constexpr bool has_transpose_sum = true;
  struct table {
    const float* ptr;
    __m256 vec;
  };

  static MEMDECAY_SIMD_INLINE reg set1(float v) noexcept { return _mm256_set1_ps(v); }
  static MEMDECAY_SIMD_INLINE reg zero() noexcept { return _mm256_setzero_ps(); }
  static MEMDECAY_SIMD_INLINE reg load(const float* p) noexcept { return _mm256_loadu_ps(p); }
  static MEMDECAY_SIMD_INLINE void store(float* p, reg v) noexcept { _mm256_storeu_ps(p, v); }
  static MEMDECAY_SIMD_INLINE reg add(reg a, reg b) noexcept { return _mm256_add_ps(a, b); }
  static MEMDECAY_SIMD_INLINE reg sub(reg a, reg b) noexcept { return _mm256_sub_ps(a, b); }
  static MEMDECAY_SIMD_INLINE reg mul(reg a, reg b) noexcept { return _mm256_mul_ps(a, b); }
  static MEMDECAY_SIMD_INLINE reg fma(reg a, reg b, reg c) noexcept {
#if MEMDECAY_SIMD_HAS_FMA
    return _mm256_fmadd_ps(a, b, c);
#else
    return _mm256_add_ps(_mm256_mul_ps(a, b), c);
#endif
  }
  static MEMDECAY_SIMD_INLINE reg min(reg a, reg b) noexcept { return _mm256_min_ps(a, b); }
  static MEMDECAY_SIMD_INLINE reg max(reg a, reg b) noexcept { return _mm256_max_ps(a, b); }
  static MEMDECAY_SIMD_INLINE reg pow2_shifted(reg k) noexcept {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_castps_si256(k), _mm256_set1_epi32(127)), 23));
  }
  static MEMDECAY_SIMD_INLINE reg zero_below(reg x, reg lo, reg y) noexcept {
    return _mm256_and_ps(_mm256_cmp_ps(x, lo, _CMP_GE_OQ), y);
  }
  static MEMDECAY_SIMD_INLINE float reduce_add(reg v) noexcept {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)));
  }
  /// Lane j of the result is the sum of the lanes of v[j] (8 registers in): the classic hadd transpose.
  static MEMDECAY_SIMD_INLINE reg transpose_sum(const reg* v) noexcept {
    const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
    const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
  }
  /// The bit patterns of `lanes` floats, and their lane-wise unsigned maximum (mass_check.hpp's range check).
  static MEMDECAY_SIMD_INLINE ureg load_bits(const float* p) noexcept { return _mm256_castps_si256(_mm256_loadu_ps(p)); }
  static MEMDECAY_SIMD_INLINE ureg max_u32(ureg a, ureg b) noexcept { return _mm256_max_epu32(a, b); }
  static MEMDECAY_SIMD_INLINE ureg load_u32(const std::uint32_t* p) noexcept {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
  static MEMDECAY_SIMD_INLINE void store_u32(std::uint32_t* p, ureg v) noexcept {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
  }
  static MEMDECAY_SIMD_INLINE reg age(ureg lr, step_t now) noexcept {
    const __m256i d = _mm256_sub_epi32(_mm256_set1_epi32(static_cast<int>(now)), lr);
    const __m256 hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(d, 16));
    const __m256 lo = _mm256_cvtepi32_ps(_mm256_and_si256(d, _mm256_set1_epi32(0xffff)));
    return fma(hi, _mm256_set1_ps(65536.0f), lo);  // hi * 2^16 is exact: one rounding either way
  }
  static MEMDECAY_SIMD_INLINE mask gt(reg a, reg b) noexcept { return _mm256_cmp_ps(a, b, _CMP_GT_OQ); }
  static MEMDECAY_SIMD_INLINE ureg blend_u32(ureg a, std::uint32_t b, mask m) noexcept {
    return _mm256_blendv_epi8(a, _mm256_set1_epi32(static_cast<int>(b)), _mm256_castps_si256(m));
  }
  static MEMDECAY_SIMD_INLINE reg blend(reg a, reg b, mask m) noexcept { return _mm256_blendv_ps(a, b, m); }
  static MEMDECAY_SIMD_INLINE mask eq_u32(ureg a, std::uint32_t now) noexcept {
    return _mm256_castsi256_ps(_mm256_cmpeq_epi32(a, _mm256_set1_epi32(static_cast<int>(now))));
  }
  static MEMDECAY_SIMD_INLINE unsigned popcount(mask m) noexcept {
    return static_cast<unsigned>(std::popcount(static_cast<unsigned>(_mm256_movemask_ps(m))));
  }
  static MEMDECAY_SIMD_INLINE table make_table(const float* t256) noexcept { return {t256, _mm256_loadu_ps(t256)}; }
  template <bool Small>
  static MEMDECAY_SIMD_INLINE reg lookup(const table& t, const region_id* r) noexcept {
    const __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(r)));
    if constexpr (Small)
      return _mm256_permutevar8x32_ps(t.vec, idx);
    else
      return _mm256_i32gather_ps(t.ptr, idx, 4);
  }
};

template <>
struct packet<double, isa::avx2> {
  using value_type = double;
  using reg = __m256d;
  using ureg = __m128i;
  using mask = __m256d;
  static constexpr std::size_t lanes = 4;
  static constexpr std::size_t table_lanes = 0;
  struct table {
    const double* ptr;
  };

  static MEMDECAY_SIMD_INLINE reg set1(double v) noexcept { return _mm256_set1_pd(v); }
  static MEMDECAY_SIMD_INLINE reg zero() noexcept { return _mm256_setzero_pd(); }
  static MEMDECAY_SIMD_INLINE reg load(const double* p) noexcept { return _mm256_loadu_pd(p); }
  static MEMDECAY_SIMD_INLINE void store(double* p, reg v) noexcept { _mm256_storeu_pd(p, v); }
  static MEMDECAY_SIMD_INLINE void store_float(float* p, reg v) noexcept { _mm_storeu_ps(p, _mm256_cvtpd_ps(v)); }
  static MEMDECAY_SIMD_INLINE reg add(reg a, reg b) noexcept { return _mm256_add_pd(a, b); }
  static MEMDECAY_SIMD_INLINE reg sub(reg a, reg b) noexcept { return _mm256_sub_pd(a, b); }
  static MEMDECAY_SIMD_INLINE reg mul(reg a, reg b) noexcept { return _mm256_mul_pd(a, b); }
  static MEMDECAY_SIMD_INLINE reg fma(reg a, reg b, reg c) noexcept {
#if MEMDECAY_SIMD_HAS_FMA
    return _mm256_fmadd_pd(a, b, c);
#else
    return _mm256_add_pd(_mm256_mul_pd(a, b), c);
#endif
  }
  static MEMDECAY_SIMD_INLINE reg min(reg a, reg b) noexcept { return _mm256_min_pd(a, b); }
  static MEMDECAY_SIMD_INLINE reg max(reg a, reg b) noexcept { return _mm256_max_pd(a, b); }
  static MEMDECAY_SIMD_INLINE reg pow2_shifted(reg k) noexcept {
    return _mm256_castsi256_pd(
        _mm256_slli_epi64(_mm256_add_epi64(_mm256_castpd_si256(k), _mm256_set1_epi64x(1023)), 52));
  }
  static MEMDECAY_SIMD_INLINE reg zero_below(reg x, reg lo, reg y) noexcept {
    return _mm256_and_pd(_mm256_cmp_pd(x, lo, _CMP_GE_OQ), y);
  }
  static MEMDECAY_SIMD_INLINE double reduce_add(reg v) noexcept {
    const __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
  }
  static MEMDECAY_SIMD_INLINE ureg load_u32(const std::uint32_t* p) noexcept {
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  }
  static MEMDECAY_SIMD_INLINE void store_u32(std::uint32_t* p, ureg v) noexcept {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), v);
  }
  static MEMDECAY_SIMD_INLINE reg age(ureg lr, step_t now) noexcept {
    const __m128i d = _mm_sub_epi32(_mm_set1_epi32(static_cast<int>(now)), lr);
    const __m128i s = _mm_xor_si128(d, _mm_set1_epi32(static_cast<int>(0x80000000u)));
    return _mm256_add_pd(_mm256_cvtepi32_pd(s), _mm256_set1_pd(2147483648.0));
  }
  static MEMDECAY_SIMD_INLINE mask gt(reg a, reg b) noexcept { return _mm256_cmp_pd(a, b, _CMP_GT_OQ); }
  static MEMDECAY_SIMD_INLINE ureg blend_u32(ureg a, std::uint32_t b, mask m) noexcept {
    const __m256i packed =
        _mm256_permutevar8x32_epi32(_mm256_castpd_si256(m), _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6));
    return _mm_blendv_epi8(a, _mm_set1_epi32(static_cast<int>(b)), _mm256_castsi256_si128(packed));
  }
  static MEMDECAY_SIMD_INLINE reg blend(reg a, reg b, mask m) noexcept { return _mm256_blendv_pd(a, b, m); }
  static MEMDECAY_SIMD_INLINE mask eq_u32(ureg a, std::uint32_t now) noexcept {
    const __m128i e = _mm_cmpeq_epi32(a, _mm_set1_epi32(static_cast<int>(now)));
    return _mm256_castsi256_pd(_mm256_cvtepi32_epi64(e));  // sign-extends: all-ones 64-bit lanes
  }
  static MEMDECAY_SIMD_INLINE unsigned popcount(mask m) noexcept {
    return static_cast<unsigned>(std::popcount(static_cast<unsigned>(_mm256_movemask_pd(m))));
  }
  static MEMDECAY_SIMD_INLINE table make_table(const double* t256) noexcept { return {t256}; }
  template <bool Small>
  static MEMDECAY_SIMD_INLINE reg lookup(const table& t, const region_id* r) noexcept {
    std::uint32_t four;
    std::memcpy(&four, r, 4);
    const __m128i idx = _mm_cvtepu8_epi32(_mm_cvtsi32_si128(static_cast<int>(four)));
    return _mm256_i32gather_pd(t.ptr, idx, 8);
  }
};
#endif  // MEMDECAY_SIMD_ENABLE_AVX2

}  // namespace memdecay::simd
MEMDECAY_SIMD_END

#endif  // MEMDECAY_SIMD_ISA_AVX2_HPP
