// SPDX-License-Identifier: Apache-2.0
// memdecay: packet<Float, isa::scalar>: one lane: the tail of every kernel, and the isa of builds without vector instructions. The operations every packet provides are the simd_packet
// concept (simd/packet.hpp, which includes this header and asserts the concept for every isa the build enables).
#ifndef MEMDECAY_SIMD_ISA_SCALAR_HPP
#define MEMDECAY_SIMD_ISA_SCALAR_HPP

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
  /// The bit pattern of a float, and the unsigned maximum (mass_check.hpp's range check; float packets only).
  static MEMDECAY_SIMD_INLINE ureg load_bits(const float* p) noexcept
    requires std::same_as<Float, float>
  {
    return std::bit_cast<std::uint32_t>(*p);
  }
  static MEMDECAY_SIMD_INLINE ureg max_u32(ureg a, ureg b) noexcept { return a > b ? a : b; }
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

}  // namespace memdecay::simd
MEMDECAY_SIMD_END

#endif  // MEMDECAY_SIMD_ISA_SCALAR_HPP
