// SPDX-License-Identifier: Apache-2.0
// memdecay: a non-owning page table over vLLM-style block-table rows.
//
// vLLM's worker keeps an int32 block table [max_num_reqs, max_num_blocks_per_req] (row-major, each row padded)
// plus num_blocks_per_row (vllm/v1/worker/block_table.py). Removing pages of a row moves its later block ids
// down, lowers its block count, and returns the removed ids: the scheduler drops one reference to each in its
// BlockPool (a block shared through the prefix cache stays allocated) and sends the row to the workers. The
// engine then attends with seq_len_kv = seq_len - evicted_tokens and keeps absolute positions, with
// slot_mapping computed from pos - evicted_tokens (docs/integration.md).
//
// A row does not record how many tokens its last block holds, so this view cannot tell a full last block from a
// partial one; basic_sequence::commit refuses the partial last page before the table is touched.
//
// The view validates its arrays before every removal: a block count outside [0, max_blocks_per_row], a block id
// outside the pool or a block listed twice in one row is an input_error; a row outside the table or a bad page
// list is a usage_error. Either way nothing is written. Row entries past the new block count keep their old
// values (vLLM never reads them).
#ifndef MEMDECAY_PAGE_TABLES_VLLM_BLOCK_TABLE_HPP
#define MEMDECAY_PAGE_TABLES_VLLM_BLOCK_TABLE_HPP

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "memdecay/detail/error.hpp"
#include "memdecay/page_tables/page_table.hpp"

namespace memdecay {

class vllm_block_table {
 public:
  using sequence_id = std::size_t;  ///< the request's row
  using page_id = std::int32_t;

  /// A view of `num_blocks_per_row.size()` rows of `max_blocks_per_row` int32 block ids each (row-major in
  /// `block_ids`), over a pool of `num_pool_blocks` blocks of `page_size` tokens. config_error for a page size
  /// that is not a power of two; input_error for inconsistent arrays.
  vllm_block_table(std::span<std::int32_t> block_ids, std::span<std::int32_t> num_blocks_per_row,
                   std::size_t max_blocks_per_row, std::size_t page_size, std::size_t num_pool_blocks)
      : block_ids_(block_ids),
        num_blocks_(num_blocks_per_row),
        stride_(max_blocks_per_row),
        page_size_(page_size),
        num_pool_blocks_(num_pool_blocks) {
    if (page_size == 0 || !std::has_single_bit(page_size))
      detail::raise_config("vllm_block_table page_size = " + detail::to_text(page_size) + " (must be a power of two)");
    validate();
  }

  /// A view of one padded row and its block count (the request is sequence 0).
  static vllm_block_table row(std::span<std::int32_t> row, std::int32_t& num_blocks, std::size_t page_size,
                              std::size_t num_pool_blocks) {
    return vllm_block_table(row, std::span<std::int32_t>(&num_blocks, 1), row.size(), page_size, num_pool_blocks);
  }

  [[nodiscard]] std::size_t page_size() const noexcept { return page_size_; }
  [[nodiscard]] std::size_t num_rows() const noexcept { return num_blocks_.size(); }
  [[nodiscard]] std::size_t max_blocks_per_row() const noexcept { return stride_; }
  [[nodiscard]] std::size_t num_pages(sequence_id r) const {
    check_row(r);
    return static_cast<std::size_t>(num_blocks_[r]);
  }
  [[nodiscard]] page_id page_at(sequence_id r, std::size_t index) const {
    const std::size_t n = num_pages(r);
    if (index >= n)
      detail::raise_usage("logical page " + detail::to_text(index) + " out of range (row " + detail::to_text(r) +
                          " has " + detail::to_text(n) + " blocks)");
    return block_ids_[r * stride_ + index];
  }
  /// The valid part of row r.
  [[nodiscard]] std::span<const std::int32_t> row_blocks(sequence_id r) const {
    return std::span<const std::int32_t>(block_ids_).subspan(r * stride_, num_pages(r));
  }
  /// How many valid entries of the table name block `id` (rows that share a prefix list the same block). A lower
  /// bound of the scheduler's reference count: the prefix cache may hold the block too.
  [[nodiscard]] std::size_t ref_count(page_id id) const {
    std::size_t count = 0;
    for (std::size_t r = 0; r < num_rows(); ++r) {
      const auto row = row_blocks(r);
      count += static_cast<std::size_t>(std::count(row.begin(), row.end(), id));
    }
    return count;
  }
  /// ref_count() of every block of the pool at once (index = block id), in one pass over the valid entries:
  /// O(rows + entries + pool blocks), where asking ref_count() per page costs O(rows x max_blocks_per_row) each.
  [[nodiscard]] std::vector<std::size_t> ref_counts() const {
    std::vector<std::size_t> counts(num_pool_blocks_, 0);
    for (std::size_t r = 0; r < num_rows(); ++r) {
      check_row(r);
      for (std::int32_t id : row_blocks(r)) {
        if (id < 0 || static_cast<std::size_t>(id) >= num_pool_blocks_) validate();  // names the bad entry
        ++counts[static_cast<std::size_t>(id)];
      }
    }
    return counts;
  }

  /// Throws input_error naming the first inconsistency of the arrays.
  void validate() const {
    if (block_ids_.size() != num_rows() * stride_)
      detail::raise_input("vllm_block_table: block_ids has " + detail::to_text(block_ids_.size()) +
                          " entries, expected rows x max_blocks_per_row = " + detail::to_text(num_rows()) + " x " +
                          detail::to_text(stride_));
    for (std::size_t r = 0; r < num_rows(); ++r) validate_row(r);
  }
  /// Throws input_error naming the first inconsistency of row r (its count, its ids, a block listed twice).
  void validate_row(sequence_id r) const {
    if (num_blocks_[r] < 0 || static_cast<std::size_t>(num_blocks_[r]) > stride_)
      detail::raise_input("vllm_block_table: num_blocks_per_row[" + detail::to_text(r) + "] = " +
                          detail::to_text(num_blocks_[r]) + " (must be in [0, " + detail::to_text(stride_) + "])");
    const auto row = block_ids_.subspan(r * stride_, static_cast<std::size_t>(num_blocks_[r]));
    for (std::size_t k = 0; k < row.size(); ++k)
      if (row[k] < 0 || static_cast<std::size_t>(row[k]) >= num_pool_blocks_)
        detail::raise_input("vllm_block_table: row " + detail::to_text(r) + " block " + detail::to_text(k) + " = " +
                            detail::to_text(row[k]) + " is not a block of the pool (" +
                            detail::to_text(num_pool_blocks_) + " blocks)");
    std::vector<std::int32_t> sorted(row.begin(), row.end());
    std::sort(sorted.begin(), sorted.end());
    if (auto dup = std::adjacent_find(sorted.begin(), sorted.end()); dup != sorted.end())
      detail::raise_input("vllm_block_table: row " + detail::to_text(r) + " lists block " + detail::to_text(*dup) +
                          " twice");
  }

  /// Throws what remove_pages(r, pages) would throw, changing nothing. Checks the row it touches (O(its blocks x
  /// log)), not the whole table: a commit of a 128-row batch no longer costs rows x blocks per row.
  void check_remove_pages(sequence_id r, std::span<const std::size_t> pages) const {
    check_row(r);
    validate_row(r);
    check_page_list(pages, num_pages(r));
  }

  /// Removes the strictly ascending logical pages of row r, moves its later blocks down and lowers its block
  /// count. Returns the removed block ids in logical order and their slots; freed is nullopt: the scheduler's
  /// block pool owns the reference counts and drops one per removed block (free_blocks). Throws, writing nothing,
  /// when check_remove_pages() does.
  page_removal<page_id> remove_pages(sequence_id r, std::span<const std::size_t> pages) {
    check_remove_pages(r, pages);
    auto out = removal_of(r, pages);
    apply_removal(r, pages);
    return out;
  }

  /// Throws what remove_pages_of(batch) would throw, changing nothing: what check_remove_pages rejects for any
  /// entry, or a row named twice.
  void check_remove_pages_of(std::span<const sequence_pages<sequence_id>> batch) const {
    for (const auto& b : batch) check_remove_pages(b.seq, b.pages);
    check_batch_names_each_once(batch);
  }
  /// remove_pages for every entry, all or nothing: every result is built (the only step that allocates) before
  /// the first row changes.
  std::vector<page_removal<page_id>> remove_pages_of(std::span<const sequence_pages<sequence_id>> batch) {
    check_remove_pages_of(batch);
    return remove_pages_in_two_phases<page_removal<page_id>>(
        batch, [this](sequence_id r, std::span<const std::size_t> pages) { return removal_of(r, pages); },
        [this](sequence_id r, std::span<const std::size_t> pages) noexcept { apply_removal(r, pages); });
  }

 private:
  // What removing the checked `pages` from row r removes, read before the row changes.
  page_removal<page_id> removal_of(sequence_id r, std::span<const std::size_t> pages) const {
    page_removal<page_id> out;
    out.removed.reserve(pages.size());
    const auto row = block_ids_.subspan(r * stride_, static_cast<std::size_t>(num_blocks_[r]));
    for (std::size_t p : pages) out.removed.push_back(row[p]);
    out.slots = block_slots(std::span<const page_id>(out.removed), page_size_);
    return out;
  }
  void apply_removal(sequence_id r, std::span<const std::size_t> pages) noexcept {
    const auto row = block_ids_.subspan(r * stride_, static_cast<std::size_t>(num_blocks_[r]));
    num_blocks_[r] = static_cast<std::int32_t>(compact_pages(row, 1, pages));
  }

  // Also checks the row's count in O(1), so a count the engine broke since the last validation is reported,
  // never read past the row.
  void check_row(sequence_id r) const {
    if (r >= num_rows())
      detail::raise_usage("row " + detail::to_text(r) + " is not in the block table (" + detail::to_text(num_rows()) +
                          " rows)");
    if (num_blocks_[r] < 0 || static_cast<std::size_t>(num_blocks_[r]) > stride_) {
      validate();  // names the inconsistency
      detail::raise_input("vllm_block_table: the block count of row " + detail::to_text(r) + " is inconsistent");
    }
  }

  std::span<std::int32_t> block_ids_;
  std::span<std::int32_t> num_blocks_;
  std::size_t stride_;
  std::size_t page_size_;
  std::size_t num_pool_blocks_;
};

static_assert(page_table<vllm_block_table>);
static_assert(checked_page_table<vllm_block_table>);
static_assert(shared_page_table<vllm_block_table>);
static_assert(batch_page_table<vllm_block_table>);

}  // namespace memdecay

#endif  // MEMDECAY_PAGE_TABLES_VLLM_BLOCK_TABLE_HPP
