// SPDX-License-Identifier: Apache-2.0
// memdecay: packet<Float, isa::neon>: AArch64 NEON. The operations every packet provides are the simd_packet
// concept (simd/packet.hpp, which includes this header and asserts the concept for every isa the build enables).
#ifndef MEMDECAY_SIMD_ISA_NEON_HPP
#define MEMDECAY_SIMD_ISA_NEON_HPP

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
  /// The bit patterns of `lanes` floats, and their lane-wise unsigned maximum (mass_check.hpp's range check).
  static MEMDECAY_SIMD_INLINE ureg load_bits(const float* p) noexcept { return vreinterpretq_u32_f32(vld1q_f32(p)); }
  static MEMDECAY_SIMD_INLINE ureg max_u32(ureg a, ureg b) noexcept { return vmaxq_u32(a, b); }
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

}  // namespace memdecay::simd
MEMDECAY_SIMD_END

#endif  // MEMDECAY_SIMD_ISA_NEON_HPP
