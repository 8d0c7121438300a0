// SPDX-License-Identifier: Apache-2.0
// memdecay: a 64-bit FNV-1a digest of byte ranges, so that tensor-parallel ranks can all-gather one number and
// check that their states (and so their decisions) agree. Not cryptographic; collisions only hide a divergence.
#ifndef MEMDECAY_DETAIL_DIGEST_HPP
#define MEMDECAY_DETAIL_DIGEST_HPP

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>

namespace memdecay::detail {

class fnv1a64 {
 public:
  template <class T>
  requires std::is_trivially_copyable_v<T> fnv1a64& add(std::span<const T> values) noexcept {
    const auto* bytes = reinterpret_cast<const unsigned char*>(values.data());
    for (std::size_t i = 0; i < values.size_bytes(); ++i) state_ = (state_ ^ bytes[i]) * prime;
    return *this;
  }
  template <class T>
  requires std::is_trivially_copyable_v<T> fnv1a64& add(const T& value) noexcept {
    return add(std::span<const T>(&value, 1));
  }
  [[nodiscard]] std::uint64_t value() const noexcept { return state_; }

 private:
  static constexpr std::uint64_t prime = 0x100000001b3ULL;
  std::uint64_t state_ = 0xcbf29ce484222325ULL;
};

}  // namespace memdecay::detail

#endif  // MEMDECAY_DETAIL_DIGEST_HPP
