// SPDX-License-Identifier: Apache-2.0
// memdecay: a non-owning page table over SGLang-style req_to_token rows.
//
// SGLang maps (request pool row, logical token) to a KV slot with an int32 matrix
// req_to_token [rows, max_context_len] (python/sglang/srt/mem_cache/memory_pool.py); each row's length is the
// request's seq_len. memdecay's page is `page_size` consecutive logical tokens of a row, so removing a page shifts
// the row's later tokens left by whole pages, lowers seq_len by page_size per page, and returns the KV slots the
// removed tokens held as merged half-open ranges, ready for the token allocator's free(). The engine then uses
// decode positions seq_len + evicted_tokens - 1 (docs/integration.md). A page's id here is the slot of its
// first token.
//
// seq_lens[r] is the length of pool row r (gather it from the batch's seq_lens through req_pool_indices).
// The view validates its arrays before every removal: a length outside [0, max_context_len], a slot outside
// [0, num_slots) or a slot listed twice in one row is an input_error; a row outside the matrix, a bad page list or
// the partial last page is a usage_error. Either way nothing is written. Row entries past the new length keep
// their old values (SGLang never reads them).
#ifndef MEMDECAY_PAGE_TABLES_SGLANG_REQ_TO_TOKEN_HPP
#define MEMDECAY_PAGE_TABLES_SGLANG_REQ_TO_TOKEN_HPP

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "memdecay/detail/error.hpp"
#include "memdecay/page_tables/page_table.hpp"

namespace memdecay {

class sglang_req_to_token {
 public:
  using sequence_id = std::size_t;  ///< the request's row in the pool
  using page_id = std::int32_t;     ///< the KV slot of the page's first token

  /// A view of `seq_lens.size()` rows of `max_context_len` int32 slots each (row-major in `req_to_token`), over a
  /// KV pool of `num_slots` slots. config_error for a page size that is not a power of two; input_error for
  /// inconsistent arrays.
  sglang_req_to_token(std::span<std::int32_t> req_to_token, std::span<std::int64_t> seq_lens,
                      std::size_t max_context_len, std::size_t page_size, std::size_t num_slots)
      : slots_(req_to_token), lens_(seq_lens), stride_(max_context_len), page_size_(page_size), num_slots_(num_slots) {
    if (page_size == 0 || !std::has_single_bit(page_size))
      detail::raise_config("sglang_req_to_token page_size = " + detail::to_text(page_size) +
                           " (must be a power of two)");
    validate();
  }

  /// A view of one row and its length (the request is sequence 0).
  static sglang_req_to_token row(std::span<std::int32_t> row, std::int64_t& seq_len, std::size_t page_size,
                                 std::size_t num_slots) {
    return sglang_req_to_token(row, std::span<std::int64_t>(&seq_len, 1), row.size(), page_size, num_slots);
  }

  [[nodiscard]] std::size_t page_size() const noexcept { return page_size_; }
  [[nodiscard]] std::size_t num_rows() const noexcept { return lens_.size(); }
  [[nodiscard]] std::size_t seq_len(sequence_id r) const {
    check_row(r);
    return static_cast<std::size_t>(lens_[r]);
  }
  [[nodiscard]] std::size_t num_pages(sequence_id r) const { return (seq_len(r) + page_size_ - 1) / page_size_; }
  [[nodiscard]] page_id page_at(sequence_id r, std::size_t index) const {
    const std::size_t n = num_pages(r);
    if (index >= n)
      detail::raise_usage("logical page " + detail::to_text(index) + " out of range (row " + detail::to_text(r) +
                          " has " + detail::to_text(n) + " pages)");
    return slots_[r * stride_ + index * page_size_];
  }
  /// The slots of row r's tokens.
  [[nodiscard]] std::span<const std::int32_t> row_slots(sequence_id r) const {
    return std::span<const std::int32_t>(slots_).subspan(r * stride_, seq_len(r));
  }

  /// Throws input_error naming the first inconsistency of the arrays.
  void validate() const {
    if (slots_.size() != num_rows() * stride_)
      detail::raise_input("sglang_req_to_token: req_to_token has " + detail::to_text(slots_.size()) +
                          " entries, expected rows x max_context_len = " + detail::to_text(num_rows()) + " x " +
                          detail::to_text(stride_));
    std::vector<std::int32_t> sorted;
    for (std::size_t r = 0; r < num_rows(); ++r) {
      if (lens_[r] < 0 || static_cast<std::uint64_t>(lens_[r]) > stride_)
        detail::raise_input("sglang_req_to_token: seq_lens[" + detail::to_text(r) + "] = " + detail::to_text(lens_[r]) +
                            " (must be in [0, " + detail::to_text(stride_) + "])");
      const auto row = slots_.subspan(r * stride_, static_cast<std::size_t>(lens_[r]));
      for (std::size_t k = 0; k < row.size(); ++k)
        if (row[k] < 0 || static_cast<std::size_t>(row[k]) >= num_slots_)
          detail::raise_input("sglang_req_to_token: row " + detail::to_text(r) + " token " + detail::to_text(k) +
                              " = slot " + detail::to_text(row[k]) + ", not a slot of the pool (" +
                              detail::to_text(num_slots_) + " slots)");
      sorted.assign(row.begin(), row.end());
      std::sort(sorted.begin(), sorted.end());
      if (auto dup = std::adjacent_find(sorted.begin(), sorted.end()); dup != sorted.end())
        detail::raise_input("sglang_req_to_token: row " + detail::to_text(r) + " lists slot " + detail::to_text(*dup) +
                            " twice");
    }
  }

  /// Throws what remove_pages(r, pages) would throw, changing nothing.
  void check_remove_pages(sequence_id r, std::span<const std::size_t> pages) const {
    validate();
    check_page_list_of(r, pages);
  }
  /// Throws what remove_pages_of(batch) would throw, changing nothing (the table is validated once).
  void check_remove_pages_of(std::span<const sequence_pages<sequence_id>> batch) const {
    validate();
    for (const auto& b : batch) check_page_list_of(b.seq, b.pages);
    check_batch_names_each_once(batch);
  }

  /// Removes the strictly ascending logical pages of row r: shifts the later tokens left by whole pages and lowers
  /// seq_len. Returns each removed page's first slot (removed) and all its slots as merged, ascending ranges
  /// (slots), for the engine's token_to_kv_pool allocator; freed is nullopt (the radix cache may still hold the
  /// slots). Throws, writing nothing, when check_remove_pages() does.
  page_removal<page_id> remove_pages(sequence_id r, std::span<const std::size_t> pages) {
    check_remove_pages(r, pages);
    auto out = removal_of(r, pages);
    apply_removal(r, pages);
    return out;
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
  void check_page_list_of(sequence_id r, std::span<const std::size_t> pages) const {
    check_page_list(pages, num_pages(r));
    for (std::size_t p : pages)
      if ((p + 1) * page_size_ > seq_len(r))
        detail::raise_usage("remove_pages: logical page " + detail::to_text(p) + " of row " + detail::to_text(r) +
                            " is the partial last page");
  }
  // What removing the checked `pages` from row r removes, read before the row changes.
  page_removal<page_id> removal_of(sequence_id r, std::span<const std::size_t> pages) const {
    const auto row = slots_.subspan(r * stride_, static_cast<std::size_t>(lens_[r]));
    page_removal<page_id> out;
    out.removed.reserve(pages.size());
    std::vector<std::int64_t> slots;
    slots.reserve(pages.size() * page_size_);
    for (std::size_t p : pages) {
      out.removed.push_back(row[p * page_size_]);
      slots.insert(slots.end(), row.begin() + static_cast<std::ptrdiff_t>(p * page_size_),
                   row.begin() + static_cast<std::ptrdiff_t>((p + 1) * page_size_));
    }
    out.slots = merge_slots(std::move(slots));
    return out;
  }
  void apply_removal(sequence_id r, std::span<const std::size_t> pages) noexcept {
    const auto row = slots_.subspan(r * stride_, static_cast<std::size_t>(lens_[r]));
    lens_[r] = static_cast<std::int64_t>(compact_pages(row, page_size_, pages));
  }

  // Also checks the row's length in O(1), so a length the engine broke since the last validation is reported,
  // never read past the row.
  void check_row(sequence_id r) const {
    if (r >= num_rows())
      detail::raise_usage("row " + detail::to_text(r) + " is not in req_to_token (" + detail::to_text(num_rows()) +
                          " rows)");
    if (lens_[r] < 0 || static_cast<std::uint64_t>(lens_[r]) > stride_) {
      validate();  // names the inconsistency
      detail::raise_input("sglang_req_to_token: the length of row " + detail::to_text(r) + " is inconsistent");
    }
  }

  std::span<std::int32_t> slots_;
  std::span<std::int64_t> lens_;
  std::size_t stride_;
  std::size_t page_size_;
  std::size_t num_slots_;
};

static_assert(page_table<sglang_req_to_token>);
static_assert(checked_page_table<sglang_req_to_token>);
static_assert(batch_page_table<sglang_req_to_token>);

}  // namespace memdecay

#endif  // MEMDECAY_PAGE_TABLES_SGLANG_REQ_TO_TOKEN_HPP
