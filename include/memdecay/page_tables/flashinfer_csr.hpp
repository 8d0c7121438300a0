// SPDX-License-Identifier: Apache-2.0
// memdecay: a non-owning page table over FlashInfer's paged-KV CSR for a batch of requests.
//
// FlashInfer describes a batch's pages with three int32 arrays (docs/tutorials/kv_layout.rst):
//   indptr        [batch + 1]  request r owns indices[indptr[r] .. indptr[r+1])
//   indices       [nnz]        physical page ids, nnz = indptr[batch] (the buffer may be longer)
//   last_page_len [batch]      tokens in each request's last page, 0 < last_page_len <= page_size
// so request r holds kv_len = page_size * (pages - 1) + last_page_len tokens and every page but the last is
// full. Removing pages of one request compacts `indices` (later requests' entries move down), lowers every
// later `indptr` entry by the number removed, and keeps `last_page_len`: whole pages leave, and the last page
// stays where it is unless it is full and removed, in which case the new last page is full too. The arrays must
// be int32 (FlashInfer fails on int64), which the types here enforce.
//
// The view validates the arrays on construction and again before every removal (the engine writes them between
// steps): a non-monotone indptr, a page id outside the pool, a page listed twice in one request or a
// last_page_len out of range is an input_error; a request outside the batch or a bad page list is a usage_error.
// Either way nothing is written. Entries of `indices` past the new nnz keep their old values (FlashInfer never
// reads them).
#ifndef MEMDECAY_PAGE_TABLES_FLASHINFER_CSR_HPP
#define MEMDECAY_PAGE_TABLES_FLASHINFER_CSR_HPP

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "memdecay/detail/error.hpp"
#include "memdecay/page_tables/page_table.hpp"

namespace memdecay {

class flashinfer_csr {
 public:
  using sequence_id = std::size_t;  ///< the request's row in the batch
  using page_id = std::int32_t;

  /// A view of a batch's CSR arrays over a pool of `num_pool_pages` pages of `page_size` tokens. config_error
  /// for a page size that is not a power of two (or does not fit int32); input_error for inconsistent arrays.
  flashinfer_csr(std::span<std::int32_t> indptr, std::span<std::int32_t> indices,
                 std::span<const std::int32_t> last_page_len, std::size_t page_size, std::size_t num_pool_pages)
      : indptr_(indptr),
        indices_(indices),
        last_page_len_(last_page_len),
        page_size_(page_size),
        num_pool_pages_(num_pool_pages) {
    if (page_size == 0 || !std::has_single_bit(page_size) || !std::in_range<std::int32_t>(page_size))
      detail::raise_config("flashinfer_csr page_size = " + detail::to_text(page_size) +
                           " (must be a power of two that fits int32)");
    validate();
  }

  [[nodiscard]] std::size_t page_size() const noexcept { return page_size_; }
  [[nodiscard]] std::size_t batch_size() const noexcept { return last_page_len_.size(); }
  /// Page entries in use: indptr[batch].
  [[nodiscard]] std::size_t nnz() const noexcept { return static_cast<std::size_t>(indptr_.back()); }
  [[nodiscard]] std::size_t num_pages(sequence_id r) const {
    check_request(r);
    return static_cast<std::size_t>(indptr_[r + 1] - indptr_[r]);
  }
  // (The readers check the one request they read in O(1), so arrays the engine broke since the last full
  // validation are reported, never read out of bounds.)
  [[nodiscard]] page_id page_at(sequence_id r, std::size_t index) const {
    const std::size_t n = num_pages(r);
    if (index >= n)
      detail::raise_usage("logical page " + detail::to_text(index) + " out of range (request " + detail::to_text(r) +
                          " has " + detail::to_text(n) + " pages)");
    return indices_[static_cast<std::size_t>(indptr_[r]) + index];
  }
  /// Tokens of request r: page_size * (pages - 1) + last_page_len.
  [[nodiscard]] std::size_t kv_len(sequence_id r) const {
    const std::size_t n = num_pages(r);
    return page_size_ * (n - 1) + static_cast<std::size_t>(last_page_len_[r]);
  }
  /// How many entries of this batch name page `id` (requests sharing a prefix list the same page). A lower bound
  /// of the engine's own count: a prefix cache may hold the page too.
  [[nodiscard]] std::size_t ref_count(page_id id) const {
    if (indptr_.back() < 0 || static_cast<std::size_t>(indptr_.back()) > indices_.size()) validate();
    return static_cast<std::size_t>(std::count(indices_.begin(), indices_.begin() + indptr_.back(), id));
  }
  /// ref_count() of every page of the pool at once (index = page id), in one pass: O(nnz + pool pages), where
  /// asking ref_count() per page costs O(nnz) each.
  [[nodiscard]] std::vector<std::size_t> ref_counts() const {
    validate();
    std::vector<std::size_t> counts(num_pool_pages_, 0);
    for (std::size_t k = 0; k < nnz(); ++k) ++counts[static_cast<std::size_t>(indices_[k])];
    return counts;
  }

  /// Throws input_error naming the first inconsistency of the arrays; returns when they are a valid CSR.
  /// O(nnz log(longest request)).
  void validate() const {
    validate_shape();
    for (std::size_t r = 0; r < batch_size(); ++r) validate_request(r);
  }
  /// The O(batch) part of validate(): indptr's length, start, monotonicity and end, at least one page per
  /// request, and every last_page_len in range. Every request's extent is then inside `indices`.
  void validate_shape() const {
    if (indptr_.size() != last_page_len_.size() + 1)
      detail::raise_input("flashinfer_csr: indptr has " + detail::to_text(indptr_.size()) +
                          " entries, expected batch + 1 = " + detail::to_text(last_page_len_.size() + 1));
    if (indptr_[0] != 0)
      detail::raise_input("flashinfer_csr: indptr[0] = " + detail::to_text(indptr_[0]) + " (must be 0)");
    for (std::size_t r = 0; r < batch_size(); ++r) {
      if (indptr_[r + 1] < indptr_[r])
        detail::raise_input("flashinfer_csr: indptr is not monotone (indptr[" + detail::to_text(r + 1) +
                            "] = " + detail::to_text(indptr_[r + 1]) + " < indptr[" + detail::to_text(r) +
                            "] = " + detail::to_text(indptr_[r]) + ")");
      if (indptr_[r + 1] == indptr_[r])
        detail::raise_input("flashinfer_csr: request " + detail::to_text(r) +
                            " has no pages (FlashInfer needs 0 < last_page_len, so at least one page)");
      if (last_page_len_[r] <= 0 || static_cast<std::size_t>(last_page_len_[r]) > page_size_)
        detail::raise_input("flashinfer_csr: last_page_len[" + detail::to_text(r) +
                            "] = " + detail::to_text(last_page_len_[r]) + " (must be in [1, " +
                            detail::to_text(page_size_) + "])");
    }
    if (static_cast<std::size_t>(indptr_.back()) > indices_.size())
      detail::raise_input("flashinfer_csr: indptr[batch] = " + detail::to_text(indptr_.back()) + " but indices holds " +
                          detail::to_text(indices_.size()) + " entries");
  }
  /// The per-request part of validate() (after validate_shape()): request r's entries are pages of the pool and
  /// none is listed twice. O(its pages x log).
  void validate_request(sequence_id r) const {
    std::vector<std::int32_t> sorted(indices_.begin() + indptr_[r], indices_.begin() + indptr_[r + 1]);
    for (std::size_t k = 0; k < sorted.size(); ++k)
      if (sorted[k] < 0 || static_cast<std::size_t>(sorted[k]) >= num_pool_pages_)
        detail::raise_input("flashinfer_csr: indices[" + detail::to_text(static_cast<std::size_t>(indptr_[r]) + k) +
                            "] = " + detail::to_text(sorted[k]) + " is not a page of the pool (" +
                            detail::to_text(num_pool_pages_) + " pages)");
    std::sort(sorted.begin(), sorted.end());
    if (auto dup = std::adjacent_find(sorted.begin(), sorted.end()); dup != sorted.end())
      detail::raise_input("flashinfer_csr: request " + detail::to_text(r) + " lists page " + detail::to_text(*dup) +
                          " twice");
  }

  /// Throws what remove_pages(r, pages) would throw, changing nothing. Validates the whole batch (the removal
  /// moves every later request's entries, so it costs O(nnz) anyway).
  void check_remove_pages(sequence_id r, std::span<const std::size_t> pages) const {
    validate();
    check_page_list_of(r, pages);
  }

  /// Throws what remove_pages_of(batch) would throw, changing nothing: input_error for inconsistent arrays (the
  /// batch is validated once, O(nnz)), usage_error for a request named twice or for what check_remove_pages
  /// rejects in any request's page list.
  void check_remove_pages_of(std::span<const sequence_pages<sequence_id>> batch) const {
    validate();
    std::vector<sequence_id> seen;
    seen.reserve(batch.size());
    for (const auto& b : batch) {
      check_page_list_of(b.seq, b.pages);
      seen.push_back(b.seq);
    }
    std::sort(seen.begin(), seen.end());
    if (auto dup = std::adjacent_find(seen.begin(), seen.end()); dup != seen.end())
      detail::raise_usage("remove_pages_of: request " + detail::to_text(*dup) + " is named twice");
  }

 private:
  // The page-list rules of a removal from request r of valid arrays.
  void check_page_list_of(sequence_id r, std::span<const std::size_t> pages) const {
    const std::size_t n = num_pages(r);
    check_page_list(pages, n);
    if (!pages.empty() && pages.size() == n)
      detail::raise_usage("remove_pages: cannot remove every page of request " + detail::to_text(r) +
                          " (FlashInfer needs at least one page, with 0 < last_page_len)");
    if (!pages.empty() && pages.back() == n - 1 && static_cast<std::size_t>(last_page_len_[r]) != page_size_)
      detail::raise_usage("remove_pages: logical page " + detail::to_text(n - 1) + " of request " + detail::to_text(r) +
                          " is the partial last page");
  }

 public:
  /// Removes the strictly ascending logical pages of request r: compacts `indices`, lowers the later `indptr`
  /// entries, keeps `last_page_len`. Returns the removed page ids in logical order and their slots; freed is
  /// nullopt: the engine's allocator frees a page only when no other holder is left (ref_count()). Throws,
  /// writing nothing, when check_remove_pages() does.
  page_removal<page_id> remove_pages(sequence_id r, std::span<const std::size_t> pages) {
    check_remove_pages(r, pages);
    auto out = removal_of(r, pages);
    if (pages.empty()) return out;
    const std::size_t begin = static_cast<std::size_t>(indptr_[r]), end = static_cast<std::size_t>(indptr_[r + 1]);
    compact_pages(indices_.subspan(begin, end - begin), 1, pages);
    const std::size_t k = pages.size(), total = nnz();
    std::copy(indices_.begin() + static_cast<std::ptrdiff_t>(end),
              indices_.begin() + static_cast<std::ptrdiff_t>(total),
              indices_.begin() + static_cast<std::ptrdiff_t>(end - k));
    for (std::size_t j = r + 1; j < indptr_.size(); ++j) indptr_[j] -= static_cast<std::int32_t>(k);
    return out;
  }

  /// Removes the pages of several requests in one pass over `indices` (O(nnz + batch) after the checks), where
  /// one remove_pages per request moves every later entry each time (O(requests x nnz)). The result is what
  /// remove_pages would return for each entry, in the batch's order, and the arrays end exactly as those calls in
  /// any order would leave them. Throws, writing nothing, when check_remove_pages_of() does.
  std::vector<page_removal<page_id>> remove_pages_of(std::span<const sequence_pages<sequence_id>> batch) {
    check_remove_pages_of(batch);
    std::vector<page_removal<page_id>> out(batch.size());
    std::vector<std::span<const std::size_t>> removed_of(batch_size());  // per request: its pages to remove
    for (std::size_t b = 0; b < batch.size(); ++b) {
      out[b] = removal_of(batch[b].seq, batch[b].pages);
      removed_of[batch[b].seq] = batch[b].pages;
    }
    // One forward pass: entries only move down, so each is read before anything overwrites it.
    std::size_t write = 0;
    std::int32_t dropped = 0;
    for (std::size_t r = 0; r < batch_size(); ++r) {
      const std::size_t begin = static_cast<std::size_t>(indptr_[r]), end = static_cast<std::size_t>(indptr_[r + 1]);
      const auto pages = removed_of[r];
      std::size_t next = 0;
      for (std::size_t i = begin; i < end; ++i) {
        if (next < pages.size() && pages[next] == i - begin) {
          ++next;
          continue;
        }
        indices_[write++] = indices_[i];
      }
      indptr_[r] -= dropped;
      dropped += static_cast<std::int32_t>(pages.size());
    }
    indptr_.back() -= dropped;
    return out;
  }

 private:
  // What removing `pages` (checked) from request r removes, read before the arrays change.
  page_removal<page_id> removal_of(sequence_id r, std::span<const std::size_t> pages) const {
    page_removal<page_id> out;
    out.removed.reserve(pages.size());
    const auto begin = static_cast<std::size_t>(indptr_[r]);
    for (std::size_t p : pages) out.removed.push_back(indices_[begin + p]);
    out.slots = block_slots(std::span<const page_id>(out.removed), page_size_);
    return out;
  }
  void check_request(sequence_id r) const {
    if (r >= batch_size())
      detail::raise_usage("request " + detail::to_text(r) + " is not in the batch (batch size " +
                          detail::to_text(batch_size()) + ")");
    // At least one page: kv_len() of an empty request would wrap (page_size * (0 - 1)), page_at() would call a
    // corruption a misuse (found by tests/fuzz/adapter_fuzzer.cpp; docs/reliability.md).
    if (indptr_[r] < 0 || indptr_[r + 1] <= indptr_[r] || static_cast<std::size_t>(indptr_[r + 1]) > indices_.size() ||
        last_page_len_[r] <= 0 || static_cast<std::size_t>(last_page_len_[r]) > page_size_) {
      validate();  // names the inconsistency
      detail::raise_input("flashinfer_csr: the entries of request " + detail::to_text(r) + " are inconsistent");
    }
  }

  std::span<std::int32_t> indptr_;
  std::span<std::int32_t> indices_;
  std::span<const std::int32_t> last_page_len_;
  std::size_t page_size_;
  std::size_t num_pool_pages_;
};

static_assert(page_table<flashinfer_csr>);
static_assert(checked_page_table<flashinfer_csr>);
static_assert(shared_page_table<flashinfer_csr>);
static_assert(batch_page_table<flashinfer_csr>);

}  // namespace memdecay

#endif  // MEMDECAY_PAGE_TABLES_FLASHINFER_CSR_HPP
