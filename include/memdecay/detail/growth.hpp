// SPDX-License-Identifier: Apache-2.0
// memdecay internals: capacity growth for the per-token columns.
//
// Engines append one token per decode step. std::vector::reserve(n) allocates exactly n, so reserving
// "size + extra" before each append would reallocate and copy the whole column every step (quadratic in the
// sequence length). reserve_for_append grows geometrically instead, as push_back does, while keeping the strong
// guarantee the two-phase appends rely on: it is the only step that may throw, and nothing changes when it does.
#ifndef MEMDECAY_DETAIL_GROWTH_HPP
#define MEMDECAY_DETAIL_GROWTH_HPP

#include <algorithm>
#include <cstddef>
#include <vector>

namespace memdecay::detail {

/// Ensures capacity for `needed` elements: at least double the current capacity when it has to grow.
template <class T, class Alloc>
void reserve_for_append(std::vector<T, Alloc>& column, std::size_t needed) {
  if (needed <= column.capacity()) return;
  const std::size_t doubled = column.capacity() > column.max_size() / 2 ? column.max_size() : 2 * column.capacity();
  column.reserve(std::max(needed, doubled));
}

}  // namespace memdecay::detail

#endif  // MEMDECAY_DETAIL_GROWTH_HPP
