// SPDX-License-Identifier: Apache-2.0
// memdecay: what the evictor needs from an engine's page table.
//
// memdecay never touches K/V memory. It decides which logical pages of a sequence to evict; the engine's page
// table removes them (compacting its per-sequence list) and releases their blocks. Any type with these members
// can be passed to basic_sequence::commit(plan, table, seq): the owning block_pool shipped here, or a thin
// adapter over an engine's own arrays.
#ifndef MEMDECAY_PAGE_TABLE_HPP
#define MEMDECAY_PAGE_TABLE_HPP

#include <concepts>
#include <cstddef>
#include <span>

namespace memdecay {

/// A page table maps (sequence, logical page index) to a physical page id and can remove pages.
///  - page_size(): tokens per page, equal to the sequence's;
///  - num_pages(seq): pages the sequence holds now;
///  - page_at(seq, i): the physical id of logical page i;
///  - remove_pages(seq, pages): removes the strictly ascending logical pages, shifts the later ones down and
///    releases the removed blocks; throws (changing nothing) when the indices are invalid.
template <class T>
concept page_table = requires(T& table, const T& const_table, const typename T::sequence_id& seq, std::size_t index,
                              std::span<const std::size_t> pages) {
  typename T::sequence_id;
  typename T::page_id;
  { const_table.page_size() } -> std::convertible_to<std::size_t>;
  { const_table.num_pages(seq) } -> std::convertible_to<std::size_t>;
  { const_table.page_at(seq, index) } -> std::convertible_to<typename T::page_id>;
  { table.remove_pages(seq, pages) };
};

}  // namespace memdecay

#endif  // MEMDECAY_PAGE_TABLE_HPP
