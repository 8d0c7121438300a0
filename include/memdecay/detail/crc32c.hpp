// SPDX-License-Identifier: Apache-2.0
// memdecay: CRC-32C (Castagnoli: reflected polynomial 0x82F63B78, initial value and final xor 0xFFFFFFFF), the
// checksum of state snapshots (io/snapshot.hpp). crc32c_reference is the byte-at-a-time table form (the
// specification); crc32c uses the SSE4.2 crc32 instruction, 8 bytes at a time, where the build has it (about
// twenty times faster), and the table elsewhere. tests/unit/snapshot_test.cpp checks both against the published
// test vectors (RFC 3720 appendix B.4 and the "123456789" check value 0xE3069283) and against each other.
#ifndef MEMDECAY_DETAIL_CRC32C_HPP
#define MEMDECAY_DETAIL_CRC32C_HPP

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#if defined(__SSE4_2__)
#include <nmmintrin.h>
#endif

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

/// Extends a running CRC-32C (start from 0) by `bytes`, one byte at a time through the table.
[[nodiscard]] constexpr std::uint32_t crc32c_reference_extend(std::uint32_t crc,
                                                              std::span<const std::byte> bytes) noexcept {
  std::uint32_t c = ~crc;
  for (std::byte b : bytes) c = crc32c_table[(c ^ static_cast<std::uint32_t>(b)) & 0xFFu] ^ (c >> 8);
  return ~c;
}

/// Extends a running CRC-32C (start from 0) by `bytes`: the same value as crc32c_reference_extend.
[[nodiscard]] inline std::uint32_t crc32c_extend(std::uint32_t crc, std::span<const std::byte> bytes) noexcept {
#if defined(__SSE4_2__) && defined(__x86_64__)
  std::uint64_t c = ~crc;
  const std::byte* p = bytes.data();
  std::size_t n = bytes.size();
  for (; n >= 8; n -= 8, p += 8) {
    std::uint64_t word;
    std::memcpy(&word, p, 8);  // little-endian: the instruction consumes the low byte first, as the table does
    c = _mm_crc32_u64(c, word);
  }
  auto c32 = static_cast<std::uint32_t>(c);
  for (; n > 0; --n, ++p) c32 = _mm_crc32_u8(c32, static_cast<std::uint8_t>(*p));
  return ~c32;
#else
  return crc32c_reference_extend(crc, bytes);
#endif
}

/// The CRC-32C of `bytes`.
[[nodiscard]] inline std::uint32_t crc32c(std::span<const std::byte> bytes) noexcept { return crc32c_extend(0, bytes); }
[[nodiscard]] constexpr std::uint32_t crc32c_reference(std::span<const std::byte> bytes) noexcept {
  return crc32c_reference_extend(0, bytes);
}

}  // namespace memdecay::detail

#endif  // MEMDECAY_DETAIL_CRC32C_HPP
