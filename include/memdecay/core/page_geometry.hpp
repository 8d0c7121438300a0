// SPDX-License-Identifier: Apache-2.0
// memdecay: the page size, as a compile-time constant (the hot path divides by a shift the compiler knows) or
// chosen at run time (page_geometry<dynamic_page_size>).
#ifndef MEMDECAY_CORE_PAGE_GEOMETRY_HPP
#define MEMDECAY_CORE_PAGE_GEOMETRY_HPP

#include <bit>
#include <cstddef>
#include <cstdint>

#include "memdecay/detail/error.hpp"

namespace memdecay {

/// Selects a page size chosen at run time.
inline constexpr std::size_t dynamic_page_size = 0;

/// Page arithmetic for a compile-time page size.
template <std::size_t PageSize>
class page_geometry {
  static_assert(std::has_single_bit(PageSize), "the page size must be a power of two");

 public:
  /// Accepts the run-time page size only when it equals PageSize (a config may carry the same number).
  constexpr explicit page_geometry(std::size_t page_size = PageSize) {
    if (page_size != PageSize)
      detail::raise_config("page_size = " + detail::to_text(page_size) + " but this type is compiled for " +
                           detail::to_text(PageSize));
  }
  [[nodiscard]] static constexpr std::size_t size() noexcept { return PageSize; }
  [[nodiscard]] static constexpr unsigned shift() noexcept { return static_cast<unsigned>(std::countr_zero(PageSize)); }
  [[nodiscard]] static constexpr std::size_t page_of(std::size_t token) noexcept { return token >> shift(); }
  [[nodiscard]] static constexpr std::size_t pages_for(std::size_t tokens) noexcept {
    return (tokens + PageSize - 1) >> shift();
  }
};

/// Page arithmetic for a page size chosen at run time (a power of two).
template <>
class page_geometry<dynamic_page_size> {
 public:
  constexpr explicit page_geometry(std::size_t page_size = 16) : size_(page_size) {
    if (page_size == 0 || !std::has_single_bit(page_size))
      detail::raise_config("page_size = " + detail::to_text(page_size) + " (must be a power of two)");
    shift_ = static_cast<unsigned>(std::countr_zero(page_size));
  }
  [[nodiscard]] constexpr std::size_t size() const noexcept { return size_; }
  [[nodiscard]] constexpr unsigned shift() const noexcept { return shift_; }
  [[nodiscard]] constexpr std::size_t page_of(std::size_t token) const noexcept { return token >> shift_; }
  [[nodiscard]] constexpr std::size_t pages_for(std::size_t tokens) const noexcept {
    return (tokens + size_ - 1) >> shift_;
  }

 private:
  std::size_t size_;
  unsigned shift_ = 0;
};

}  // namespace memdecay

#endif  // MEMDECAY_CORE_PAGE_GEOMETRY_HPP
