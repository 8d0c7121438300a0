// SPDX-License-Identifier: Apache-2.0
// memdecay: what the evictor needs from an engine's page table.
//
// memdecay never touches K/V memory. It decides which logical pages of a sequence to evict; the engine's page
// table removes them (compacting its per-sequence list) and releases their blocks. Any type with these members
// can be passed to basic_sequence::commit(plan, table, seq) and to basic_manager::commit: the owning block_pool
// shipped here, or one of the non-owning adapters in memdecay/page_tables/ over an engine's own arrays.
//
// Two refinements are optional, and used when present:
//   checked_page_table: check_remove_pages(seq, pages) throws exactly what remove_pages would, changing nothing.
//                       The manager checks every sequence's table first, so a batch commit is all or nothing.
//   shared_page_table:  ref_count(page_id) says how many sequences hold a physical page. A page held more than
//                       once (prefix sharing, beam forks) frees no memory when one holder evicts it.
//
// Error tiers (detail/error.hpp): an index list that is out of range, unsorted or repeated, or a sequence the
// table does not hold, is a usage_error (the caller misused the plan); arrays that contradict themselves (a
// non-monotone indptr, a page id outside the pool) are an input_error. Either way the table is unchanged.
#ifndef MEMDECAY_PAGE_TABLE_HPP
#define MEMDECAY_PAGE_TABLE_HPP

#include <concepts>
#include <cstddef>
#include <span>
#include <vector>

#include "memdecay/detail/error.hpp"

namespace memdecay {

/// A page table maps (sequence, logical page index) to a physical page id and can remove pages.
///  - page_size(): tokens per page, equal to the sequence's;
///  - num_pages(seq): pages the sequence holds now;
///  - page_at(seq, i): the physical id of logical page i;
///  - remove_pages(seq, pages): removes the strictly ascending logical pages, shifts the later ones down and
///    releases the removed blocks (or returns them to the caller, who owns the allocator); throws (changing
///    nothing) when the indices are invalid. The return value is the table's own (freed ids, slot ranges...).
template <class T>
concept page_table = requires(T& table, const T& const_table, const typename T::sequence_id& seq, std::size_t index,
                              std::span<const std::size_t> pages) {
  typename T::sequence_id;
  typename T::page_id;
  { const_table.page_size() } -> std::convertible_to<std::size_t>;
  { const_table.num_pages(seq) } -> std::convertible_to<std::size_t>;
  { const_table.page_at(seq, index) } -> std::convertible_to<typename T::page_id>;
  {table.remove_pages(seq, pages)};
};

/// A page table that can check a removal without doing it: check_remove_pages(seq, pages) throws the error that
/// remove_pages(seq, pages) would throw, and returns normally exactly when remove_pages would succeed.
template <class T>
concept checked_page_table = page_table<T> &&
    requires(const T& table, const typename T::sequence_id& seq, std::span<const std::size_t> pages) {
  {table.check_remove_pages(seq, pages)};
};

/// A page table that knows how many holders each physical page has (1: private to one sequence).
template <class T>
concept shared_page_table = page_table<T> && requires(const T& table, const typename T::page_id& id) {
  { table.ref_count(id) } -> std::convertible_to<std::size_t>;
};

/// A shared_page_table that counts every page's holders in one pass: ref_counts()[id] == ref_count(id). The manager
/// uses it to re-flag shared pages in O(table) instead of O(pages x table) (mark_shared_from).
template <class T>
concept bulk_counted_page_table = shared_page_table<T> && requires(const T& table) {
  { table.ref_counts() } -> std::convertible_to<std::vector<std::size_t>>;
};

/// Throws usage_error unless `pages` are strictly ascending logical indices below `num_pages`. Every table in
/// this library checks its removal lists with it, so the messages read the same everywhere.
inline void check_page_list(std::span<const std::size_t> pages, std::size_t num_pages) {
  for (std::size_t k = 0; k < pages.size(); ++k) {
    if (pages[k] >= num_pages)
      detail::raise_usage("remove_pages: logical page " + detail::to_text(pages[k]) + " out of range (sequence has " +
                          detail::to_text(num_pages) + " pages)");
    if (k > 0 && pages[k] == pages[k - 1])
      detail::raise_usage("remove_pages: logical page " + detail::to_text(pages[k]) + " is named twice");
    if (k > 0 && pages[k] < pages[k - 1])
      detail::raise_usage("remove_pages: pages must be strictly ascending (page " + detail::to_text(pages[k]) +
                          " after " + detail::to_text(pages[k - 1]) + ")");
  }
}

/// Compacts `entries` in place by dropping the logical pages `pages` (strictly ascending, already checked), each
/// `stride` entries wide, keeping the order of the rest. Returns the new number of entries. Entries past it keep
/// whatever they held. Shared by the adapters, whose arrays differ only in what one page's entries are.
template <class T>
std::size_t compact_pages(std::span<T> entries, std::size_t stride, std::span<const std::size_t> pages) noexcept {
  if (pages.empty()) return entries.size();
  std::size_t write = pages.front() * stride, next = 0;
  const std::size_t num_pages = (entries.size() + stride - 1) / stride;
  for (std::size_t page = pages.front(); page < num_pages; ++page) {
    if (next < pages.size() && pages[next] == page) {
      ++next;
      continue;
    }
    const std::size_t begin = page * stride, end = begin + stride < entries.size() ? begin + stride : entries.size();
    for (std::size_t i = begin; i < end; ++i) entries[write++] = entries[i];
  }
  return write;
}

}  // namespace memdecay

#endif  // MEMDECAY_PAGE_TABLE_HPP
