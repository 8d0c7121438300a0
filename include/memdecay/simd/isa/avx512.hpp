// SPDX-License-Identifier: Apache-2.0
// memdecay: packet<Float, isa::avx512>: AVX-512F. The operations every packet provides are the simd_packet
// concept (simd/packet.hpp, which includes this header and asserts the concept for every isa the build enables).
#ifndef MEMDECAY_SIMD_ISA_AVX512_HPP
#define MEMDECAY_SIMD_ISA_AVX512_HPP

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

#if defined(MEMDECAY_SIMD_ENABLE_AVX512)
// ---------------------------------------------------------------------------------------------------------------
// avx512 (F, VL, DQ, BW): 512-bit registers, mask registers, in-register permutes for up to 16/8 regions.
template <>
struct packet<float, isa::avx512> {
  using value_type = float;
  using reg = __m512;
  using ureg = __m512i;
  using mask = __mmask16;
  static constexpr std::size_t lanes = 16;
  static constexpr std::size_t table_lanes = 16;
  static constexpr bool has_transpose_sum = true;
  struct table {
    const float* ptr;
    __m512 vec;
  };

  static MEMDECAY_SIMD_INLINE reg set1(float v) noexcept { return _mm512_set1_ps(v); }
  static MEMDECAY_SIMD_INLINE reg zero() noexcept { return _mm512_setzero_ps(); }
  static MEMDECAY_SIMD_INLINE reg load(const float* p) noexcept { return _mm512_loadu_ps(p); }
  static MEMDECAY_SIMD_INLINE void store(float* p, reg v) noexcept { _mm512_storeu_ps(p, v); }
  static MEMDECAY_SIMD_INLINE reg add(reg a, reg b) noexcept { return _mm512_add_ps(a, b); }
  static MEMDECAY_SIMD_INLINE reg sub(reg a, reg b) noexcept { return _mm512_sub_ps(a, b); }
  static MEMDECAY_SIMD_INLINE reg mul(reg a, reg b) noexcept { return _mm512_mul_ps(a, b); }
  static MEMDECAY_SIMD_INLINE reg fma(reg a, reg b, reg c) noexcept { return _mm512_fmadd_ps(a, b, c); }
  static MEMDECAY_SIMD_INLINE reg min(reg a, reg b) noexcept { return _mm512_min_ps(a, b); }
  static MEMDECAY_SIMD_INLINE reg max(reg a, reg b) noexcept { return _mm512_max_ps(a, b); }
  static MEMDECAY_SIMD_INLINE reg pow2_shifted(reg k) noexcept {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_castps_si512(k), _mm512_set1_epi32(127)), 23));
  }
  static MEMDECAY_SIMD_INLINE reg zero_below(reg x, reg lo, reg y) noexcept {
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ), y);
  }
  static MEMDECAY_SIMD_INLINE float reduce_add(reg v) noexcept { return _mm512_reduce_add_ps(v); }
  /// Lane j of the result is the sum of the lanes of v[j] (16 registers in, one out): four levels of pairwise
  /// two-source permutes and adds, 45 instructions for 16 horizontal sums instead of 16 reductions of 8.
  static MEMDECAY_SIMD_INLINE reg transpose_sum(const reg* v) noexcept {
    reg a[8], b[4], c[2];
    for (int i = 0; i < 8; ++i) a[i] = transpose_level<16>(v[2 * i], v[2 * i + 1]);
    for (int i = 0; i < 4; ++i) b[i] = transpose_level<8>(a[2 * i], a[2 * i + 1]);
    for (int i = 0; i < 2; ++i) c[i] = transpose_level<4>(b[2 * i], b[2 * i + 1]);
    return transpose_level<2>(c[0], c[1]);
  }

 private:
  /// One level: x and y hold segments of M lanes; the result holds x's segments halved, then y's.
  template <int M>
  static MEMDECAY_SIMD_INLINE reg transpose_level(reg x, reg y) noexcept {
    constexpr int h = M / 2;
    const __m512i lo = _mm512_setr_epi32(0 / h * M + 0 % h, 1 / h * M + 1 % h, 2 / h * M + 2 % h, 3 / h * M + 3 % h,
                                         4 / h * M + 4 % h, 5 / h * M + 5 % h, 6 / h * M + 6 % h, 7 / h * M + 7 % h,
                                         16 + 0 / h * M + 0 % h, 16 + 1 / h * M + 1 % h, 16 + 2 / h * M + 2 % h,
                                         16 + 3 / h * M + 3 % h, 16 + 4 / h * M + 4 % h, 16 + 5 / h * M + 5 % h,
                                         16 + 6 / h * M + 6 % h, 16 + 7 / h * M + 7 % h);
    const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(h));
    return _mm512_add_ps(_mm512_permutex2var_ps(x, lo, y), _mm512_permutex2var_ps(x, hi, y));
  }

 public:
  /// The bit patterns of `lanes` floats, and their lane-wise unsigned maximum (mass_check.hpp's range check).
  static MEMDECAY_SIMD_INLINE ureg load_bits(const float* p) noexcept { return _mm512_castps_si512(_mm512_loadu_ps(p)); }
  static MEMDECAY_SIMD_INLINE ureg max_u32(ureg a, ureg b) noexcept { return _mm512_max_epu32(a, b); }
  static MEMDECAY_SIMD_INLINE ureg load_u32(const std::uint32_t* p) noexcept { return _mm512_loadu_si512(p); }
  static MEMDECAY_SIMD_INLINE void store_u32(std::uint32_t* p, ureg v) noexcept { _mm512_storeu_si512(p, v); }
  static MEMDECAY_SIMD_INLINE reg age(ureg lr, step_t now) noexcept {
    return _mm512_cvtepu32_ps(_mm512_sub_epi32(_mm512_set1_epi32(static_cast<int>(now)), lr));
  }
  static MEMDECAY_SIMD_INLINE mask gt(reg a, reg b) noexcept { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
  static MEMDECAY_SIMD_INLINE ureg blend_u32(ureg a, std::uint32_t b, mask m) noexcept {
    return _mm512_mask_mov_epi32(a, m, _mm512_set1_epi32(static_cast<int>(b)));
  }
  static MEMDECAY_SIMD_INLINE reg blend(reg a, reg b, mask m) noexcept { return _mm512_mask_mov_ps(a, m, b); }
  static MEMDECAY_SIMD_INLINE mask eq_u32(ureg a, std::uint32_t now) noexcept {
    return _mm512_cmpeq_epi32_mask(a, _mm512_set1_epi32(static_cast<int>(now)));
  }
  static MEMDECAY_SIMD_INLINE void masked_store(float* p, mask m, reg v) noexcept { _mm512_mask_storeu_ps(p, m, v); }
  static MEMDECAY_SIMD_INLINE void masked_store_u32(std::uint32_t* p, mask m, std::uint32_t v) noexcept {
    _mm512_mask_storeu_epi32(p, m, _mm512_set1_epi32(static_cast<int>(v)));
  }
  static MEMDECAY_SIMD_INLINE unsigned popcount(mask m) noexcept {
    return static_cast<unsigned>(std::popcount(static_cast<unsigned>(m)));
  }
  static MEMDECAY_SIMD_INLINE table make_table(const float* t256) noexcept { return {t256, _mm512_loadu_ps(t256)}; }
  template <bool Small>
  static MEMDECAY_SIMD_INLINE reg lookup(const table& t, const region_id* r) noexcept {
    const __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r)));
    if constexpr (Small)
      return _mm512_permutexvar_ps(idx, t.vec);
    else
      return _mm512_i32gather_ps(idx, t.ptr, 4);
  }
};

template <>
struct packet<double, isa::avx512> {
  using value_type = double;
  using reg = __m512d;
  using ureg = __m256i;
  using mask = __mmask8;
  static constexpr std::size_t lanes = 8;
  static constexpr std::size_t table_lanes = 8;
  static constexpr bool has_transpose_sum = true;
  struct table {
    const double* ptr;
    __m512d vec;
  };

  static MEMDECAY_SIMD_INLINE reg set1(double v) noexcept { return _mm512_set1_pd(v); }
  static MEMDECAY_SIMD_INLINE reg zero() noexcept { return _mm512_setzero_pd(); }
  static MEMDECAY_SIMD_INLINE reg load(const double* p) noexcept { return _mm512_loadu_pd(p); }
  static MEMDECAY_SIMD_INLINE void store(double* p, reg v) noexcept { _mm512_storeu_pd(p, v); }
  static MEMDECAY_SIMD_INLINE void store_float(float* p, reg v) noexcept { _mm256_storeu_ps(p, _mm512_cvtpd_ps(v)); }
  static MEMDECAY_SIMD_INLINE reg add(reg a, reg b) noexcept { return _mm512_add_pd(a, b); }
  static MEMDECAY_SIMD_INLINE reg sub(reg a, reg b) noexcept { return _mm512_sub_pd(a, b); }
  static MEMDECAY_SIMD_INLINE reg mul(reg a, reg b) noexcept { return _mm512_mul_pd(a, b); }
  static MEMDECAY_SIMD_INLINE reg fma(reg a, reg b, reg c) noexcept { return _mm512_fmadd_pd(a, b, c); }
  static MEMDECAY_SIMD_INLINE reg min(reg a, reg b) noexcept { return _mm512_min_pd(a, b); }
  static MEMDECAY_SIMD_INLINE reg max(reg a, reg b) noexcept { return _mm512_max_pd(a, b); }
  static MEMDECAY_SIMD_INLINE reg pow2_shifted(reg k) noexcept {
    return _mm512_castsi512_pd(
        _mm512_slli_epi64(_mm512_add_epi64(_mm512_castpd_si512(k), _mm512_set1_epi64(1023)), 52));
  }
  static MEMDECAY_SIMD_INLINE reg zero_below(reg x, reg lo, reg y) noexcept {
    return _mm512_maskz_mov_pd(_mm512_cmp_pd_mask(x, lo, _CMP_GE_OQ), y);
  }
  static MEMDECAY_SIMD_INLINE double reduce_add(reg v) noexcept { return _mm512_reduce_add_pd(v); }
  /// Lane j of the result is the sum of the lanes of v[j] (8 registers in).
  static MEMDECAY_SIMD_INLINE reg transpose_sum(const reg* v) noexcept {
    reg a[4], b[2];
    for (int i = 0; i < 4; ++i) a[i] = transpose_level<8>(v[2 * i], v[2 * i + 1]);
    for (int i = 0; i < 2; ++i) b[i] = transpose_level<4>(a[2 * i], a[2 * i + 1]);
    return transpose_level<2>(b[0], b[1]);
  }

 private:
  template <int M>
  static MEMDECAY_SIMD_INLINE reg transpose_level(reg x, reg y) noexcept {
    constexpr int h = M / 2;
    const __m512i lo =
        _mm512_setr_epi64(0 / h * M + 0 % h, 1 / h * M + 1 % h, 2 / h * M + 2 % h, 3 / h * M + 3 % h,
                          8 + 0 / h * M + 0 % h, 8 + 1 / h * M + 1 % h, 8 + 2 / h * M + 2 % h, 8 + 3 / h * M + 3 % h);
    const __m512i hi = _mm512_add_epi64(lo, _mm512_set1_epi64(h));
    return _mm512_add_pd(_mm512_permutex2var_pd(x, lo, y), _mm512_permutex2var_pd(x, hi, y));
  }

 public:
  static MEMDECAY_SIMD_INLINE ureg load_u32(const std::uint32_t* p) noexcept {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
  static MEMDECAY_SIMD_INLINE void store_u32(std::uint32_t* p, ureg v) noexcept {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
  }
  static MEMDECAY_SIMD_INLINE reg age(ureg lr, step_t now) noexcept {
    return _mm512_cvtepu32_pd(_mm256_sub_epi32(_mm256_set1_epi32(static_cast<int>(now)), lr));
  }
  static MEMDECAY_SIMD_INLINE mask gt(reg a, reg b) noexcept { return _mm512_cmp_pd_mask(a, b, _CMP_GT_OQ); }
  static MEMDECAY_SIMD_INLINE ureg blend_u32(ureg a, std::uint32_t b, mask m) noexcept {
    return _mm256_mask_mov_epi32(a, m, _mm256_set1_epi32(static_cast<int>(b)));
  }
  static MEMDECAY_SIMD_INLINE reg blend(reg a, reg b, mask m) noexcept { return _mm512_mask_mov_pd(a, m, b); }
  static MEMDECAY_SIMD_INLINE mask eq_u32(ureg a, std::uint32_t now) noexcept {
    return _mm256_cmpeq_epi32_mask(a, _mm256_set1_epi32(static_cast<int>(now)));
  }
  static MEMDECAY_SIMD_INLINE void masked_store(double* p, mask m, reg v) noexcept { _mm512_mask_storeu_pd(p, m, v); }
  static MEMDECAY_SIMD_INLINE void masked_store_u32(std::uint32_t* p, mask m, std::uint32_t v) noexcept {
    _mm256_mask_storeu_epi32(p, m, _mm256_set1_epi32(static_cast<int>(v)));
  }
  static MEMDECAY_SIMD_INLINE unsigned popcount(mask m) noexcept {
    return static_cast<unsigned>(std::popcount(static_cast<unsigned>(m)));
  }
  static MEMDECAY_SIMD_INLINE table make_table(const double* t256) noexcept { return {t256, _mm512_loadu_pd(t256)}; }
  template <bool Small>
  static MEMDECAY_SIMD_INLINE reg lookup(const table& t, const region_id* r) noexcept {
    const __m512i idx = _mm512_cvtepu8_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(r)));
    if constexpr (Small)
      return _mm512_permutexvar_pd(idx, t.vec);
    else
      return _mm512_i64gather_pd(idx, t.ptr, 8);
  }
};
#endif  // MEMDECAY_SIMD_ENABLE_AVX512

}  // namespace memdecay::simd
MEMDECAY_SIMD_END

#endif  // MEMDECAY_SIMD_ISA_AVX512_HPP
