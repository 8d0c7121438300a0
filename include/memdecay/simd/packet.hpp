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
// One header per isa (simd/isa/<isa>.hpp) holds that isa's specialisations; this header includes them all (each
// compiles only where arch.hpp enables its isa) and asserts that every enabled packet models simd_packet, the
// named set of operations the kernels use.
//
// Table lookups: per-region constants live in 256-entry tables (any u8 id is in bounds). When the region set is
// small enough to sit in one register (table_lanes: 16 floats / 8 doubles on AVX-512, 8 floats on AVX2) a lookup
// is one in-register permute; otherwise a gather (AVX2/AVX-512) or a 4-/2-lane scalar load (SSE).
#ifndef MEMDECAY_SIMD_PACKET_HPP
#define MEMDECAY_SIMD_PACKET_HPP

#include <concepts>
#include <cstddef>
#include <cstdint>

#include "memdecay/core/region.hpp"
#include "memdecay/core/retention_score.hpp"
#include "memdecay/simd/arch.hpp"
#include "memdecay/simd/isa/avx2.hpp"
#include "memdecay/simd/isa/avx512.hpp"
#include "memdecay/simd/isa/neon.hpp"
#include "memdecay/simd/isa/scalar.hpp"
#include "memdecay/simd/isa/sse.hpp"
#include "memdecay/simd/packet_traits.hpp"

namespace memdecay::simd {

/// The operations a packet provides to the kernels (score_kernel.hpp, expfree.hpp, exp.hpp): lane arithmetic, the
/// exponential's bit tricks, the u32 clocks beside each lane, masks, masked stores and the per-region lookups.
template <class P>
concept simd_packet = std::floating_point<typename P::value_type> && requires {
  typename P::reg;
  typename P::ureg;
  typename P::mask;
  typename P::table;
  { P::lanes } -> std::convertible_to<std::size_t>;
  { P::table_lanes } -> std::convertible_to<std::size_t>;
} &&
    requires(typename P::value_type* fp, const typename P::value_type* cfp, std::uint32_t* up, const std::uint32_t* cup,
             typename P::reg a, typename P::ureg u, typename P::mask m, typename P::value_type v, std::uint32_t now,
             step_t t, const region_id* r, const typename P::table& table) {
  { P::set1(v) } -> std::same_as<typename P::reg>;
  { P::zero() } -> std::same_as<typename P::reg>;
  { P::load(cfp) } -> std::same_as<typename P::reg>;
  P::store(fp, a);
  { P::add(a, a) } -> std::same_as<typename P::reg>;
  { P::sub(a, a) } -> std::same_as<typename P::reg>;
  { P::mul(a, a) } -> std::same_as<typename P::reg>;
  { P::fma(a, a, a) } -> std::same_as<typename P::reg>;
  { P::min(a, a) } -> std::same_as<typename P::reg>;
  { P::max(a, a) } -> std::same_as<typename P::reg>;
  { P::pow2_shifted(a) } -> std::same_as<typename P::reg>;
  { P::zero_below(a, a, a) } -> std::same_as<typename P::reg>;
  { P::reduce_add(a) } -> std::convertible_to<typename P::value_type>;
  { P::load_u32(cup) } -> std::same_as<typename P::ureg>;
  P::store_u32(up, u);
  { P::age(u, t) } -> std::same_as<typename P::reg>;
  { P::gt(a, a) } -> std::same_as<typename P::mask>;
  { P::blend_u32(u, now, m) } -> std::same_as<typename P::ureg>;
  { P::blend(a, a, m) } -> std::same_as<typename P::reg>;
  { P::eq_u32(u, now) } -> std::same_as<typename P::mask>;
  { P::popcount(m) } -> std::convertible_to<unsigned>;
  { P::make_table(cfp) } -> std::same_as<typename P::table>;
  { P::template lookup<true>(table, r) } -> std::same_as<typename P::reg>;
  { P::template lookup<false>(table, r) } -> std::same_as<typename P::reg>;
} &&(std::same_as<typename P::value_type, float> || requires(float* f32, typename P::reg a) {
  P::store_float(f32, a);  // double packets: the exp-free factors are computed in double, kept in float
});

/// A packet with masked stores (only the lanes that change are written); the exp-free kernels use them where the
/// isa has them and blend-and-store elsewhere.
template <class P>
concept masked_store_packet = simd_packet<P> &&
    requires(typename P::value_type* fp, std::uint32_t* up, typename P::reg a, typename P::mask m, std::uint32_t v) {
  P::masked_store(fp, m, a);
  P::masked_store_u32(up, m, v);
};

static_assert(masked_store_packet<packet<float, isa::scalar>> && masked_store_packet<packet<double, isa::scalar>>);
#if defined(MEMDECAY_SIMD_ENABLE_SSE)
static_assert(simd_packet<packet<float, isa::sse>> && simd_packet<packet<double, isa::sse>>);
#endif
#if defined(MEMDECAY_SIMD_ENABLE_NEON)
static_assert(simd_packet<packet<float, isa::neon>> && simd_packet<packet<double, isa::neon>>);
#endif
#if defined(MEMDECAY_SIMD_ENABLE_AVX2)
static_assert(simd_packet<packet<float, isa::avx2>> && simd_packet<packet<double, isa::avx2>>);
#endif
#if defined(MEMDECAY_SIMD_ENABLE_AVX512)
static_assert(masked_store_packet<packet<float, isa::avx512>> && masked_store_packet<packet<double, isa::avx512>>);
#endif

}  // namespace memdecay::simd

#endif  // MEMDECAY_SIMD_PACKET_HPP
