// SPDX-License-Identifier: Apache-2.0
// memdecay: CRC-32C (Castagnoli: reflected polynomial 0x82F63B78, initial value and final xor 0xFFFFFFFF), the
// checksum of state snapshots (io/snapshot.hpp). A byte-at-a-time table implementation: a snapshot is written and
// read once per preemption, so the simple form is enough; tests/unit/crc32c_test.cpp checks it against the
// published test vectors (RFC 3720 appendix B.4 and the "123456789" check value 0xE3069283).
#ifndef MEMDECAY_DETAIL_CRC32C_HPP
#define MEMDECAY_DETAIL_CRC32C_HPP

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

namespace memdecay::detail {

inline constexpr std::array<std::uint32_t, 256> crc32c_table = [] {
  std::array<std::uint32_t, 256> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}();

/// Extends a running CRC-32C (start from 0) by `bytes`.
[[nodiscard]] constexpr std::uint32_t crc32c_extend(std::uint32_t crc, std::span<const std::byte> bytes) noexcept {
  std::uint32_t c = ~crc;
  for (std::byte b : bytes) c = crc32c_table[(c ^ static_cast<std::uint32_t>(b)) & 0xFFu] ^ (c >> 8);
  return ~c;
}

/// The CRC-32C of `bytes`.
[[nodiscard]] constexpr std::uint32_t crc32c(std::span<const std::byte> bytes) noexcept {
  return crc32c_extend(0, bytes);
}

}  // namespace memdecay::detail

#endif  // MEMDECAY_DETAIL_CRC32C_HPP
