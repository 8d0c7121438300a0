// SPDX-License-Identifier: Apache-2.0
// memdecay: what every isa's packet header needs first: the IEEE layout of the score types and the packet template
// that simd/isa/<isa>.hpp specialise.
#ifndef MEMDECAY_SIMD_PACKET_TRAITS_HPP
#define MEMDECAY_SIMD_PACKET_TRAITS_HPP

#include <concepts>
#include <cstdint>

#include "memdecay/simd/arch.hpp"

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

}  // namespace memdecay::simd

#endif  // MEMDECAY_SIMD_PACKET_TRAITS_HPP
