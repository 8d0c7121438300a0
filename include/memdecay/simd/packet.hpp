// SPDX-License-Identifier: Apache-2.0
// memdecay: packets, the thin per-ISA layer the kernels are written against.
//
// packet<Float, isa> wraps one register of Float lanes and exactly the operations the scorer needs: arithmetic,
// the u32 refresh clocks that ride along each float lane (ureg), the per-region table lookups and the two bit
// tricks of the exponential. Everything is a static, always-inlined function, so a kernel written once against
// `P = packet<Float, A>` compiles to straight-line intrinsics for every isa (Highway's width-agnostic style with
// xsimd's per-arch specialisations). packet<Float, isa::scalar> is the 1-lane version every kernel uses for its
// tail, so the tail computes exactly what a full-width lane would (same polynomial, same rounding steps).
//
// Table lookups: per-region constants live in 256-entry tables (any u8 id is in bounds). When the region set is
// small enough to sit in one register (table_lanes: 16 floats / 8 doubles on AVX-512, 8 floats on AVX2) a lookup
// is one in-register permute; otherwise a gather (AVX2/AVX-512) or a 4-/2-lane scalar load (SSE).
#ifndef MEMDECAY_SIMD_PACKET_HPP
#define MEMDECAY_SIMD_PACKET_HPP

#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "memdecay/core/region.hpp"
#include "memdecay/core/retention_score.hpp"
#include "memdecay/simd/arch.hpp"

MEMDECAY_SIMD_BEGIN
namespace memdecay::simd {

/// The unsigned integer of the same width as Float, and the IEEE layout constants the exp needs.
template <std::floating_point Float>
struct float_bits;
template <>
struct float_bits<float> {
  using uint = std::uint32_t;
  static constexpr int mantissa_bits = 23;
  static constexpr uint exponent_bias = 127;
};
template <>
struct float_bits<double> {
  using uint = std::uint64_t;
  static constexpr int mantissa_bits = 52;
  static constexpr uint exponent_bias = 1023;
};

template <std::floating_point Float, isa A>
struct packet;

// ---------------------------------------------------------------------------------------------------------------
// scalar: one lane; also the tail of every kernel.
template <std::floating_point Float>
struct packet<Float, isa::scalar> {
  using value_type = Float;
  using reg = Float;
  using ureg = std::uint32_t;
  using mask = bool;
  static constexpr std::size_t lanes = 1;
  static constexpr std::size_t table_lanes = 0;
  struct table {
    const Float* ptr;
  };

  static MEMDECAY_SIMD_INLINE reg set1(Float v) noexcept { return v; }
  static MEMDECAY_SIMD_INLINE reg zero() noexcept { return Float{0}; }
  static MEMDECAY_SIMD_INLINE reg load(const Float* p) noexcept { return *p; }
  static MEMDECAY_SIMD_INLINE void store(Float* p, reg v) noexcept { *p = v; }
  /// Stores the lane rounded to float.
  static MEMDECAY_SIMD_INLINE void store_float(float* p, reg v) noexcept { *p = static_cast<float>(v); }
  static MEMDECAY_SIMD_INLINE reg add(reg a, reg b) noexcept { return a + b; }
  static MEMDECAY_SIMD_INLINE reg sub(reg a, reg b) noexcept { return a - b; }
  static MEMDECAY_SIMD_INLINE reg mul(reg a, reg b) noexcept { return a * b; }
  /// a * b + c (fused where the vector isas fuse; std::fma is exact on every target, so the tail matches them).
  static MEMDECAY_SIMD_INLINE reg fma(reg a, reg b, reg c) noexcept {
#if MEMDECAY_SIMD_HAS_FMA
    if constexpr (std::same_as<Float, float>)
      return __builtin_fmaf(a, b, c);
    else
      return __builtin_fma(a, b, c);
#else
    return a * b + c;
#endif
  }
  static MEMDECAY_SIMD_INLINE reg min(reg a, reg b) noexcept { return b < a ? b : a; }
  static MEMDECAY_SIMD_INLINE reg max(reg a, reg b) noexcept { return a < b ? b : a; }
  /// The float whose bits are (bits(k) + bias) << mantissa_bits: 2^n when k = n + 1.5 * 2^mantissa_bits.
  static MEMDECAY_SIMD_INLINE reg pow2_shifted(reg k) noexcept {
    using U = typename float_bits<Float>::uint;
    const U bits =
        static_cast<U>((std::bit_cast<U>(k) + float_bits<Float>::exponent_bias) << float_bits<Float>::mantissa_bits);
    return std::bit_cast<Float>(bits);
  }
  /// y where x >= lo, else 0.
  static MEMDECAY_SIMD_INLINE reg zero_below(reg x, reg lo, reg y) noexcept { return x >= lo ? y : Float{0}; }
  static MEMDECAY_SIMD_INLINE Float reduce_add(reg v) noexcept { return v; }
  static MEMDECAY_SIMD_INLINE ureg load_u32(const std::uint32_t* p) noexcept { return *p; }
  static MEMDECAY_SIMD_INLINE void store_u32(std::uint32_t* p, ureg v) noexcept { *p = v; }
  /// Float(now - lr), the age in steps (unsigned, exact below 2^24 for float).
  static MEMDECAY_SIMD_INLINE reg age(ureg lr, step_t now) noexcept { return static_cast<Float>(now - lr); }
  static MEMDECAY_SIMD_INLINE mask gt(reg a, reg b) noexcept { return a > b; }
  static MEMDECAY_SIMD_INLINE ureg blend_u32(ureg a, std::uint32_t b, mask m) noexcept { return m ? b : a; }
  /// b where m, else a (the exp-free kernels' refresh blend).
  static MEMDECAY_SIMD_INLINE reg blend(reg a, reg b, mask m) noexcept { return m ? b : a; }
  /// The lanes whose clock equals `now`.
  static MEMDECAY_SIMD_INLINE mask eq_u32(ureg a, std::uint32_t now) noexcept { return a == now; }
  /// Stores v where m (masked stores: only lanes that change are written).
  static MEMDECAY_SIMD_INLINE void masked_store(Float* p, mask m, reg v) noexcept {
    if (m) *p = v;
  }
  static MEMDECAY_SIMD_INLINE void masked_store_u32(std::uint32_t* p, mask m, std::uint32_t v) noexcept {
    if (m) *p = v;
  }
  static MEMDECAY_SIMD_INLINE unsigned popcount(mask m) noexcept { return m ? 1u : 0u; }
  static MEMDECAY_SIMD_INLINE table make_table(const Float* t256) noexcept { return {t256}; }
  template <bool Small>
  static MEMDECAY_SIMD_INLINE reg lookup(const table& t, const region_id* r) noexcept {
    return t.ptr[*r];
  }
};

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

#if defined(MEMDECAY_SIMD_ENABLE_NEON)
// ---------------------------------------------------------------------------------------------------------------
// neon: AArch64 Advanced SIMD, 128-bit registers; FMA is part of the base isa (vfmaq is fused). Region lookups are
// scalar loads (as sse). Tested under qemu-aarch64 (tools/check-neon, docs/simd.md).
template <>
struct packet<float, isa::neon> {
  using value_type = float;
  using reg = float32x4_t;
  using ureg = uint32x4_t;
  using mask = uint32x4_t;
  static constexpr std::size_t lanes = 4;
  static constexpr std::size_t table_lanes = 0;
  struct table {
    const float* ptr;
  };

  static MEMDECAY_SIMD_INLINE reg set1(float v) noexcept { return vdupq_n_f32(v); }
  static MEMDECAY_SIMD_INLINE reg zero() noexcept { return vdupq_n_f32(0.0f); }
  static MEMDECAY_SIMD_INLINE reg load(const float* p) noexcept { return vld1q_f32(p); }
  static MEMDECAY_SIMD_INLINE void store(float* p, reg v) noexcept { vst1q_f32(p, v); }
  static MEMDECAY_SIMD_INLINE reg add(reg a, reg b) noexcept { return vaddq_f32(a, b); }
  static MEMDECAY_SIMD_INLINE reg sub(reg a, reg b) noexcept { return vsubq_f32(a, b); }
  static MEMDECAY_SIMD_INLINE reg mul(reg a, reg b) noexcept { return vmulq_f32(a, b); }
  static MEMDECAY_SIMD_INLINE reg fma(reg a, reg b, reg c) noexcept { return vfmaq_f32(c, a, b); }
  static MEMDECAY_SIMD_INLINE reg min(reg a, reg b) noexcept { return vminq_f32(a, b); }
  static MEMDECAY_SIMD_INLINE reg max(reg a, reg b) noexcept { return vmaxq_f32(a, b); }
  static MEMDECAY_SIMD_INLINE reg pow2_shifted(reg k) noexcept {
    return vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vreinterpretq_s32_f32(k), vdupq_n_s32(127)), 23));
  }
  static MEMDECAY_SIMD_INLINE reg zero_below(reg x, reg lo, reg y) noexcept {
    return vreinterpretq_f32_u32(vandq_u32(vcgeq_f32(x, lo), vreinterpretq_u32_f32(y)));
  }
  static MEMDECAY_SIMD_INLINE float reduce_add(reg v) noexcept { return vaddvq_f32(v); }
  static MEMDECAY_SIMD_INLINE ureg load_u32(const std::uint32_t* p) noexcept { return vld1q_u32(p); }
  static MEMDECAY_SIMD_INLINE void store_u32(std::uint32_t* p, ureg v) noexcept { vst1q_u32(p, v); }
  /// Unsigned u32 -> float, correctly rounded (vcvtq rounds to nearest, as static_cast does).
  static MEMDECAY_SIMD_INLINE reg age(ureg lr, step_t now) noexcept {
    return vcvtq_f32_u32(vsubq_u32(vdupq_n_u32(now), lr));
  }
  static MEMDECAY_SIMD_INLINE mask gt(reg a, reg b) noexcept { return vcgtq_f32(a, b); }
  static MEMDECAY_SIMD_INLINE ureg blend_u32(ureg a, std::uint32_t b, mask m) noexcept {
    return vbslq_u32(m, vdupq_n_u32(b), a);
  }
  static MEMDECAY_SIMD_INLINE reg blend(reg a, reg b, mask m) noexcept { return vbslq_f32(m, b, a); }
  static MEMDECAY_SIMD_INLINE mask eq_u32(ureg a, std::uint32_t now) noexcept { return vceqq_u32(a, vdupq_n_u32(now)); }
  static MEMDECAY_SIMD_INLINE unsigned popcount(mask m) noexcept { return vaddvq_u32(vshrq_n_u32(m, 31)); }
  static MEMDECAY_SIMD_INLINE table make_table(const float* t256) noexcept { return {t256}; }
  template <bool Small>
  static MEMDECAY_SIMD_INLINE reg lookup(const table& t, const region_id* r) noexcept {
    const float* p = t.ptr;
    const float v[4] = {p[r[0]], p[r[1]], p[r[2]], p[r[3]]};
    return vld1q_f32(v);
  }
};

template <>
struct packet<double, isa::neon> {
  using value_type = double;
  using reg = float64x2_t;
  using ureg = uint32x2_t;  // two u32
  using mask = uint64x2_t;
  static constexpr std::size_t lanes = 2;
  static constexpr std::size_t table_lanes = 0;
  struct table {
    const double* ptr;
  };

  static MEMDECAY_SIMD_INLINE reg set1(double v) noexcept { return vdupq_n_f64(v); }
  static MEMDECAY_SIMD_INLINE reg zero() noexcept { return vdupq_n_f64(0.0); }
  static MEMDECAY_SIMD_INLINE reg load(const double* p) noexcept { return vld1q_f64(p); }
  static MEMDECAY_SIMD_INLINE void store(double* p, reg v) noexcept { vst1q_f64(p, v); }
  /// Stores the lanes rounded to float (lanes floats at p).
  static MEMDECAY_SIMD_INLINE void store_float(float* p, reg v) noexcept { vst1_f32(p, vcvt_f32_f64(v)); }
  static MEMDECAY_SIMD_INLINE reg add(reg a, reg b) noexcept { return vaddq_f64(a, b); }
  static MEMDECAY_SIMD_INLINE reg sub(reg a, reg b) noexcept { return vsubq_f64(a, b); }
  static MEMDECAY_SIMD_INLINE reg mul(reg a, reg b) noexcept { return vmulq_f64(a, b); }
  static MEMDECAY_SIMD_INLINE reg fma(reg a, reg b, reg c) noexcept { return vfmaq_f64(c, a, b); }
  static MEMDECAY_SIMD_INLINE reg min(reg a, reg b) noexcept { return vminq_f64(a, b); }
  static MEMDECAY_SIMD_INLINE reg max(reg a, reg b) noexcept { return vmaxq_f64(a, b); }
  static MEMDECAY_SIMD_INLINE reg pow2_shifted(reg k) noexcept {
    return vreinterpretq_f64_s64(vshlq_n_s64(vaddq_s64(vreinterpretq_s64_f64(k), vdupq_n_s64(1023)), 52));
  }
  static MEMDECAY_SIMD_INLINE reg zero_below(reg x, reg lo, reg y) noexcept {
    return vreinterpretq_f64_u64(vandq_u64(vcgeq_f64(x, lo), vreinterpretq_u64_f64(y)));
  }
  static MEMDECAY_SIMD_INLINE double reduce_add(reg v) noexcept { return vaddvq_f64(v); }
  static MEMDECAY_SIMD_INLINE ureg load_u32(const std::uint32_t* p) noexcept { return vld1_u32(p); }
  static MEMDECAY_SIMD_INLINE void store_u32(std::uint32_t* p, ureg v) noexcept { vst1_u32(p, v); }
  /// Unsigned u32 -> double, exact.
  static MEMDECAY_SIMD_INLINE reg age(ureg lr, step_t now) noexcept {
    return vcvtq_f64_u64(vmovl_u32(vsub_u32(vdup_n_u32(now), lr)));
  }
  static MEMDECAY_SIMD_INLINE mask gt(reg a, reg b) noexcept { return vcgtq_f64(a, b); }
  static MEMDECAY_SIMD_INLINE ureg blend_u32(ureg a, std::uint32_t b, mask m) noexcept {
    return vbsl_u32(vmovn_u64(m), vdup_n_u32(b), a);
  }
  static MEMDECAY_SIMD_INLINE reg blend(reg a, reg b, mask m) noexcept { return vbslq_f64(m, b, a); }
  static MEMDECAY_SIMD_INLINE mask eq_u32(ureg a, std::uint32_t now) noexcept {
    // 32-bit all-ones lanes sign-extend to 64-bit all-ones lanes.
    return vreinterpretq_u64_s64(vmovl_s32(vreinterpret_s32_u32(vceq_u32(a, vdup_n_u32(now)))));
  }
  static MEMDECAY_SIMD_INLINE unsigned popcount(mask m) noexcept {
    return static_cast<unsigned>((vgetq_lane_u64(m, 0) >> 63) + (vgetq_lane_u64(m, 1) >> 63));
  }
  static MEMDECAY_SIMD_INLINE table make_table(const double* t256) noexcept { return {t256}; }
  template <bool Small>
  static MEMDECAY_SIMD_INLINE reg lookup(const table& t, const region_id* r) noexcept {
    const double v[2] = {t.ptr[r[0]], t.ptr[r[1]]};
    return vld1q_f64(v);
  }
};
#endif  // MEMDECAY_SIMD_ENABLE_NEON

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

#endif  // MEMDECAY_SIMD_PACKET_HPP
