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
#ifndef MEMDECAY_PAGE_TABLES_PAGE_TABLE_HPP
#define MEMDECAY_PAGE_TABLES_PAGE_TABLE_HPP

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "memdecay/detail/error.hpp"

namespace memdecay {

/// A half-open range [begin, end) of KV slots (token positions in the engine's KV pool).
struct slot_range {
  std::int64_t begin;
  std::int64_t end;
  friend bool operator==(const slot_range&, const slot_range&) = default;
};

/// What one remove_pages call did, the same type for every table, so generic engine code cannot mistake removed
/// pages for freed memory (a shared block is removed from one sequence but stays in use by the others):
///  - removed: the physical id of every removed page, in logical order. The sequence no longer holds them; an
///    engine whose allocator counts references drops one reference to each (vLLM's free_blocks does exactly that).
///  - freed:   the removed pages that no holder keeps any more, in logical order: memory the allocator may reuse
///    now. Only a table that owns the reference counts knows it (block_pool); a view over an engine's arrays
///    (vLLM, FlashInfer, SGLang) leaves it std::nullopt, because the engine's allocator decides.
///  - slots:   the KV slots of the removed pages as merged, ascending ranges (a block b of a block table holds
///    slots [b * page_size, (b + 1) * page_size), vLLM's slot_mapping and FlashInfer's paged layout; an SGLang
///    page holds whatever slots its row lists).
template <class PageId>
struct page_removal {
  std::vector<PageId> removed;
  std::optional<std::vector<PageId>> freed;
  std::vector<slot_range> slots;
  friend bool operator==(const page_removal&, const page_removal&) = default;
};

/// One sequence's pages in a batch removal (batch_page_table).
template <class SequenceId>
struct sequence_pages {
  SequenceId seq;
  std::span<const std::size_t> pages;  ///< strictly ascending logical pages
};

/// Runs of `width` slots starting at `starts`, sorted and merged into ascending half-open ranges.
inline std::vector<slot_range> merge_runs(std::vector<std::int64_t> starts, std::int64_t width) {
  std::sort(starts.begin(), starts.end());
  std::vector<slot_range> ranges;
  for (std::int64_t start : starts) {
    if (!ranges.empty() && ranges.back().end == start)
      ranges.back().end += width;
    else
      ranges.push_back({start, start + width});
  }
  return ranges;
}

/// Sorts `slots` and merges them into ascending half-open ranges.
inline std::vector<slot_range> merge_slots(std::vector<std::int64_t> slots) { return merge_runs(std::move(slots), 1); }

/// The slots of whole blocks of `page_size` tokens (block b holds [b * page_size, (b + 1) * page_size)) as merged,
/// ascending ranges.
template <class PageId>
std::vector<slot_range> block_slots(std::span<const PageId> blocks, std::size_t page_size) {
  const auto width = static_cast<std::int64_t>(page_size);
  std::vector<std::int64_t> starts;
  starts.reserve(blocks.size());
  for (PageId b : blocks) starts.push_back(static_cast<std::int64_t>(b) * width);
  return merge_runs(std::move(starts), width);
}

/// A page table maps (sequence, logical page index) to a physical page id and can remove pages.
///  - page_size(): tokens per page, equal to the sequence's;
///  - num_pages(seq): pages the sequence holds now;
///  - page_at(seq, i): the physical id of logical page i;
///  - remove_pages(seq, pages): removes the strictly ascending logical pages, shifts the later ones down and
///    returns a page_removal saying what left and what memory that frees; throws (changing nothing) when the
///    indices are invalid.
template <class T>
concept page_table = requires(T& table, const T& const_table, const typename T::sequence_id& seq, std::size_t index,
                              std::span<const std::size_t> pages) {
  typename T::sequence_id;
  typename T::page_id;
  { const_table.page_size() } -> std::convertible_to<std::size_t>;
  { const_table.num_pages(seq) } -> std::convertible_to<std::size_t>;
  { const_table.page_at(seq, index) } -> std::convertible_to<typename T::page_id>;
  { table.remove_pages(seq, pages) } -> std::same_as<page_removal<typename T::page_id>>;
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

/// A checked_page_table that removes the pages of many sequences in one call, cheaper than one call each (a CSR
/// moves every later entry on each removal). remove_pages_of(batch) returns what remove_pages would for each entry,
/// in order; check_remove_pages_of(batch) throws what it would throw, changing nothing. The manager's batch commit
/// uses it.
template <class T>
concept batch_page_table = checked_page_table<T> &&
    requires(T& table, const T& const_table, std::span<const sequence_pages<typename T::sequence_id>> batch) {
  { table.remove_pages_of(batch) } -> std::same_as<std::vector<page_removal<typename T::page_id>>>;
  {const_table.check_remove_pages_of(batch)};
};

/// A page table that can take pages back (a host tier's recall, tiers/host_tier.hpp) and owns its blocks:
/// insert_pages(seq, positions) inserts full pages so that they end at the strictly ascending logical `positions`,
/// each in a fresh block, and returns the blocks in position order; check_insert_pages(seq, positions) throws what
/// it would, changing nothing; free_blocks() and ref_count(id) say whether a removal makes room for an insertion.
template <class T>
concept inserting_page_table = checked_page_table<T> && shared_page_table<T> &&
    requires(T& table, const T& const_table, const typename T::sequence_id& seq, std::span<const std::size_t> at) {
  { table.insert_pages(seq, at) } -> std::same_as<std::vector<typename T::page_id>>;
  {const_table.check_insert_pages(seq, at)};
  { const_table.free_blocks() } -> std::convertible_to<std::size_t>;
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

/// Throws usage_error if a batch names one sequence twice (a batch removal would otherwise read a row it already
/// changed). SequenceId must be ordered.
template <class SequenceId>
void check_batch_names_each_once(std::span<const sequence_pages<SequenceId>> batch) {
  std::vector<SequenceId> seen;
  seen.reserve(batch.size());
  for (const auto& b : batch) seen.push_back(b.seq);
  std::sort(seen.begin(), seen.end());
  if (auto dup = std::adjacent_find(seen.begin(), seen.end()); dup != seen.end())
    detail::raise_usage("remove_pages_of: sequence " + detail::to_text(*dup) + " is named twice");
}

/// remove_pages_of for a table whose removal splits into reading its result (`removal_of(seq, pages)`: may
/// allocate, changes nothing) and applying it (`apply(seq, pages)`: cannot fail): every entry's result first, then
/// every change, so a batch is all or nothing. The batch is already checked.
template <class Removal, class SequenceId, class RemovalOf, class Apply>
std::vector<Removal> remove_pages_in_two_phases(std::span<const sequence_pages<SequenceId>> batch,
                                                RemovalOf&& removal_of, Apply&& apply) {
  std::vector<Removal> out;
  out.reserve(batch.size());
  for (const auto& b : batch) out.push_back(removal_of(b.seq, b.pages));
  for (const auto& b : batch) apply(b.seq, b.pages);
  return out;
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

#endif  // MEMDECAY_PAGE_TABLES_PAGE_TABLE_HPP
