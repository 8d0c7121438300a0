// SPDX-License-Identifier: Apache-2.0
// memdecay: std::vector storage laid out for the per-token arrays the SIMD kernels stream side by side.
//
// Two things cost the fused observation in cache (AMD EPYC, AVX-512; docs/performance.md, 2026-12-06):
//   * Misalignment. glibc's malloc returns 16-byte alignment (an mmap'd block, which every array above 128 KB
//     is, starts 16 bytes into its page), so every 64-byte AVX-512 load of a plain std::vector<float> straddles
//     two cache lines: 1.15-1.25x slower at 4K-64K tokens than on arrays that start on a line.
//   * All arrays at the same offset within a page. Aligned the same way, the kernel's stores to one column and
//     its loads of the next packets of another share their low 12 address bits (4K aliasing: the load waits for
//     the store) and the same cache sets: up to 1.3x slower at 1M tokens than with the columns 1 KB apart.
// So a column of at least 64 KiB starts `Slot` KiB into a page (columns read together take different slots), a
// smaller one on a cache line (page alignment would waste up to 4 KiB per small column).
#ifndef MEMDECAY_DETAIL_COLUMN_VECTOR_HPP
#define MEMDECAY_DETAIL_COLUMN_VECTOR_HPP

#include <cstddef>
#include <cstdlib>
#include <new>
#include <vector>

#include "memdecay/detail/error.hpp"

namespace memdecay::detail {

/// A std::allocator for a kernel's column: every block on a cache line; a block of at least 64 KiB `Slot` KiB
/// past a page boundary (Slot 0-3).
template <class T, std::size_t Slot = 0>
struct column_allocator {
  static_assert(Slot < 4 && alignof(T) <= 64);
  static constexpr std::size_t line = 64, page = 4096, large = 64 * 1024, offset = Slot * 1024;
  using value_type = T;
  template <class U>
  struct rebind {
    using other = column_allocator<U, Slot>;
  };
  column_allocator() noexcept = default;
  template <class U>
  column_allocator(const column_allocator<U, Slot>&) noexcept {}  // NOLINT(google-explicit-constructor)

  [[nodiscard]] T* allocate(std::size_t n) {
    if (n > max_size()) {
#if MEMDECAY_HAS_EXCEPTIONS
      throw std::bad_array_new_length();
#else
      std::abort();
#endif
    }
    const std::size_t bytes = n * sizeof(T);
    if (bytes < large) return static_cast<T*>(::operator new(bytes, std::align_val_t{line}));
    auto* block = static_cast<std::byte*>(::operator new(bytes + offset, std::align_val_t{page}));
    return reinterpret_cast<T*>(block + offset);
  }
  // The standard passes deallocate the n that allocate got, so the block's kind follows from it.
  void deallocate(T* p, std::size_t n) noexcept {
    if (n * sizeof(T) < large) {
      ::operator delete(p, std::align_val_t{line});
      return;
    }
    ::operator delete(reinterpret_cast<std::byte*>(p) - offset, std::align_val_t{page});
  }
  [[nodiscard]] static constexpr std::size_t max_size() noexcept {
    return (static_cast<std::size_t>(-1) - offset) / sizeof(T);
  }

  template <class U>
  friend bool operator==(const column_allocator&, const column_allocator<U, Slot>&) noexcept {
    return true;
  }
};

/// A std::vector laid out as a kernel's column (see the top of this header).
template <class T, std::size_t Slot = 0>
using column_vector = std::vector<T, column_allocator<T, Slot>>;

}  // namespace memdecay::detail

#endif  // MEMDECAY_DETAIL_COLUMN_VECTOR_HPP
