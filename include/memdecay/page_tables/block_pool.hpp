// SPDX-License-Identifier: Apache-2.0
// memdecay: an owning KV block pool with a free list, reference counts and per-sequence block tables.
//
// The reference page table: the default for the examples, tests and tools, and a model of what engines keep
// (vLLM's BlockPool + req_to_blocks, SGLang's paged allocator). It tracks ids only; the engine owns the memory.
//   - The free list is a stack (last freed, first reused; ids 0, 1, 2, ... on a fresh pool), so the ids a run
//     gets are a pure function of its calls.
//   - Sequences live in an ordered map, so iteration never depends on hashing.
//   - Blocks are reference counted: share_prefix() lets a new sequence start from another's full pages (prefix
//     caching, parallel sampling), and a shared block returns to the free list only when its last holder drops
//     it. remove_pages() therefore says which blocks it actually freed.
#ifndef MEMDECAY_PAGE_TABLES_BLOCK_POOL_HPP
#define MEMDECAY_PAGE_TABLES_BLOCK_POOL_HPP

#include <algorithm>
#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <span>
#include <utility>
#include <vector>

#include "memdecay/detail/error.hpp"
#include "memdecay/detail/growth.hpp"
#include "memdecay/page_tables/page_table.hpp"

namespace memdecay {

template <std::integral PageId = std::int32_t, std::totally_ordered SequenceId = std::uint64_t>
class block_pool {
 public:
  using page_id = PageId;
  using sequence_id = SequenceId;

  /// A pool of `num_blocks` blocks of `page_size` tokens each. config_error unless the page size is a power of
  /// two and every block id fits PageId.
  block_pool(std::size_t num_blocks, std::size_t page_size) : page_size_(page_size), refs_(num_blocks, 0) {
    if (page_size == 0 || !std::has_single_bit(page_size))
      detail::raise_config("block_pool page_size = " + detail::to_text(page_size) + " (must be a power of two)");
    if (num_blocks > 0 && !fits_page_id(num_blocks - 1))
      detail::raise_config("block_pool num_blocks = " + detail::to_text(num_blocks) +
                           " (ids do not fit the page id type)");
    free_.reserve(num_blocks);
    for (std::size_t i = num_blocks; i-- > 0;) free_.push_back(static_cast<PageId>(i));  // pop_back gives 0 first
  }

  [[nodiscard]] std::size_t page_size() const noexcept { return page_size_; }
  [[nodiscard]] std::size_t capacity() const noexcept { return refs_.size(); }
  [[nodiscard]] std::size_t free_blocks() const noexcept { return free_.size(); }
  [[nodiscard]] std::size_t used_blocks() const noexcept { return capacity() - free_.size(); }
  [[nodiscard]] bool contains(const SequenceId& seq) const noexcept { return seqs_.contains(seq); }
  [[nodiscard]] std::size_t num_sequences() const noexcept { return seqs_.size(); }

  /// How many sequences hold block `id` (0: free). input_error for an id outside the pool.
  [[nodiscard]] std::size_t ref_count(PageId id) const {
    if (id < 0 || static_cast<std::size_t>(id) >= capacity())
      detail::raise_input("block id " + detail::to_text(id) + " is not in the pool (" + detail::to_text(capacity()) +
                          " blocks)");
    return refs_[static_cast<std::size_t>(id)];
  }

  /// Opens an empty sequence; usage_error if it is already open.
  void open(const SequenceId& seq) {
    if (seqs_.contains(seq)) detail::raise_usage("sequence is already open in the block pool");
    seqs_.emplace(seq, entry{});
  }
  /// Drops every block of the sequence (freeing those it held alone) and forgets it; usage_error if it is not
  /// open. Blocks are released last page first, so the head of a sequence stays cached longest (vLLM frees in
  /// reverse for the same reason).
  void close(const SequenceId& seq) {
    auto& e = find(seq);
    for (auto it = e.blocks.rbegin(); it != e.blocks.rend(); ++it) release(*it);
    seqs_.erase(seq);
  }

  /// Grows the sequence by `tokens`, allocating blocks as pages fill. Throws input_error (allocating nothing) when
  /// the pool has too few free blocks.
  void append_tokens(const SequenceId& seq, std::size_t tokens) {
    auto& e = find(seq);
    // A count so large that tokens + e.tokens (+ page_size - 1 in pages_for) wraps can never fit; unchecked, it
    // wrapped to a small size and was accepted with no blocks (found by tests/fuzz; docs/reliability.md).
    if (tokens > std::numeric_limits<std::size_t>::max() - (page_size_ - 1) - e.tokens)
      detail::raise_input("block pool exhausted: " + detail::to_text(tokens) + " more tokens overflow the token count");
    const std::size_t needed = pages_for(e.tokens + tokens) - e.blocks.size();
    if (needed > free_.size())
      detail::raise_input("block pool exhausted: " + detail::to_text(needed) + " blocks needed, " +
                          detail::to_text(free_.size()) + " free");
    detail::reserve_for_append(e.blocks, e.blocks.size() + needed);
    for (std::size_t i = 0; i < needed; ++i) {
      e.blocks.push_back(free_.back());
      refs_[static_cast<std::size_t>(free_.back())] = 1;
      free_.pop_back();
    }
    e.tokens += tokens;
  }

  /// Opens `to` as a fork of `from` (parallel sampling, beam search, an agent branch): it shares every full page
  /// of `from` (reference counts up by one) and gets a fresh block for the partial last page, whose K/V the
  /// engine copies (copy on write). usage_error if `from` is not open or `to` is; input_error if no block is free
  /// for the partial page. Changes nothing on error.
  void fork(const SequenceId& from, const SequenceId& to) {
    const auto& source = find(from);
    if (seqs_.contains(to)) detail::raise_usage("fork: the target sequence is already open in the block pool");
    const std::size_t full = source.tokens / page_size_;
    const bool partial = source.tokens % page_size_ != 0;
    if (partial && free_.empty()) detail::raise_input("block pool exhausted: fork needs a block for the partial page");
    entry e;
    e.blocks.reserve(source.blocks.size());
    e.blocks.assign(source.blocks.begin(), source.blocks.begin() + static_cast<std::ptrdiff_t>(full));
    auto& target = seqs_.emplace(to, std::move(e)).first->second;  // may throw: nothing counted yet
    for (PageId id : target.blocks) ++refs_[static_cast<std::size_t>(id)];
    if (partial) {
      target.blocks.push_back(free_.back());  // within the reserved capacity
      refs_[static_cast<std::size_t>(free_.back())] = 1;
      free_.pop_back();
    }
    target.tokens = source.tokens;
  }

  /// Starts the open, empty sequence `to` with the first `pages` full pages of `from`, sharing their blocks
  /// (each block's reference count goes up by one). usage_error, changing nothing, when either sequence is not
  /// open, `to` already holds tokens, or `from` has fewer than `pages` full pages. Only full pages can be shared:
  /// the partial last page is still being written.
  void share_prefix(const SequenceId& from, const SequenceId& to, std::size_t pages) {
    const auto& source = find(from);
    auto& target = find(to);
    if (from == to) detail::raise_usage("share_prefix: a sequence cannot share with itself");
    if (target.tokens != 0) detail::raise_usage("share_prefix: the target sequence is not empty");
    if (pages > source.tokens / page_size_)
      detail::raise_usage("share_prefix: " + detail::to_text(pages) + " pages asked, the source has " +
                          detail::to_text(source.tokens / page_size_) + " full pages");
    target.blocks.assign(source.blocks.begin(), source.blocks.begin() + static_cast<std::ptrdiff_t>(pages));
    for (PageId id : target.blocks) ++refs_[static_cast<std::size_t>(id)];
    target.tokens = pages * page_size_;
  }

  [[nodiscard]] std::size_t num_tokens(const SequenceId& seq) const { return find(seq).tokens; }
  [[nodiscard]] std::size_t num_pages(const SequenceId& seq) const { return find(seq).blocks.size(); }
  [[nodiscard]] PageId page_at(const SequenceId& seq, std::size_t index) const {
    const auto& e = find(seq);
    if (index >= e.blocks.size())
      detail::raise_usage("logical page " + detail::to_text(index) + " out of range (sequence has " +
                          detail::to_text(e.blocks.size()) + " pages)");
    return e.blocks[index];
  }
  /// The sequence's block table (physical ids in logical order).
  [[nodiscard]] std::span<const PageId> block_table(const SequenceId& seq) const { return find(seq).blocks; }

  /// Throws what remove_pages(seq, pages) would throw, changing nothing: usage_error for a sequence that is not
  /// open, a page list that is out of range, unsorted or repeated, or a page that is not full.
  void check_remove_pages(const SequenceId& seq, std::span<const std::size_t> pages) const {
    const auto& e = find(seq);
    check_page_list(pages, e.blocks.size());
    for (std::size_t p : pages)
      if ((p + 1) * page_size_ > e.tokens)
        detail::raise_usage("remove_pages: logical page " + detail::to_text(p) + " is not full");
  }

  /// Removes the strictly ascending logical pages, compacts the block table and drops one reference to each
  /// removed block. Returns every removed block (removed), those that became free because no other sequence
  /// holds them (freed), both in logical order, and the removed blocks' slots. Throws usage_error, changing
  /// nothing, when check_remove_pages() does.
  page_removal<PageId> remove_pages(const SequenceId& seq, std::span<const std::size_t> pages) {
    const sequence_pages<SequenceId> one{seq, pages};
    return std::move(remove_pages_of(std::span<const sequence_pages<SequenceId>>(&one, 1)).front());
  }

  /// Throws what remove_pages_of(batch) would throw, changing nothing: what check_remove_pages rejects for any
  /// entry, or a sequence named twice.
  void check_remove_pages_of(std::span<const sequence_pages<SequenceId>> batch) const {
    for (const auto& b : batch) check_remove_pages(b.seq, b.pages);
    check_batch_names_each_once(batch);
  }
  /// remove_pages for every entry, all or nothing: every result is built first (the only step that allocates; a
  /// block two entries drop is freed by the later one, as consecutive remove_pages calls would say), then the
  /// blocks are released (free_ already has room for every block) and the tables compacted.
  std::vector<page_removal<PageId>> remove_pages_of(std::span<const sequence_pages<SequenceId>> batch) {
    check_remove_pages_of(batch);
    std::vector<page_removal<PageId>> out(batch.size());
    std::vector<entry*> entries;
    entries.reserve(batch.size());
    std::map<PageId, std::size_t> dropped;  // references this batch drops, per shared block it touches
    for (std::size_t b = 0; b < batch.size(); ++b) {
      entry& e = find(batch[b].seq);
      entries.push_back(&e);
      auto& o = out[b];
      o.removed.reserve(batch[b].pages.size());
      o.freed.emplace().reserve(batch[b].pages.size());
      for (std::size_t p : batch[b].pages) {
        const PageId id = e.blocks[p];
        o.removed.push_back(id);
        // A private block (the common case) is freed by its one holder; only a shared one needs the count.
        const std::size_t refs = refs_[static_cast<std::size_t>(id)];
        if (refs == 1 || refs == ++dropped[id]) o.freed->push_back(id);
      }
      o.slots = block_slots(std::span<const PageId>(o.removed), page_size_);
    }
    for (std::size_t b = 0; b < batch.size(); ++b) {
      entry& e = *entries[b];
      for (std::size_t p : batch[b].pages) release(e.blocks[p]);
      e.blocks.resize(compact_pages(std::span<PageId>(e.blocks), 1, batch[b].pages));
      e.tokens -= batch[b].pages.size() * page_size_;
    }
    return out;
  }

  /// Throws what insert_pages(seq, positions) would throw, changing nothing: usage_error for a sequence that is not
  /// open or positions that are not strictly ascending final indices of full pages (a page cannot go after the
  /// partial last page), input_error when too few blocks are free.
  void check_insert_pages(const SequenceId& seq, std::span<const std::size_t> positions) const {
    const auto& e = find(seq);
    const std::size_t after = e.blocks.size() + positions.size();
    const bool partial = e.tokens % page_size_ != 0;
    for (std::size_t k = 0; k < positions.size(); ++k) {
      if (k > 0 && positions[k] <= positions[k - 1])
        detail::raise_usage("insert_pages: positions must be strictly ascending (position " +
                            detail::to_text(positions[k]) + " after " + detail::to_text(positions[k - 1]) + ")");
      if (positions[k] >= after || (partial && positions[k] == after - 1))
        detail::raise_usage("insert_pages: position " + detail::to_text(positions[k]) + " is not a full page's (" +
                            detail::to_text(after) + " pages after the insertion" +
                            (partial ? ", the last one partial)" : ")"));
    }
    if (positions.size() > free_.size())
      detail::raise_input("block pool exhausted: " + detail::to_text(positions.size()) + " blocks needed, " +
                          detail::to_text(free_.size()) + " free");
  }
  /// Inserts full pages (a host tier's recall, tiers/host_tier.hpp) so that they end at the strictly ascending
  /// `positions` of the block table, each in a fresh block, and returns the blocks in position order: the engine
  /// copies the pages' K/V into them. Throws, changing nothing, what check_insert_pages() throws.
  std::vector<PageId> insert_pages(const SequenceId& seq, std::span<const std::size_t> positions) {
    check_insert_pages(seq, positions);
    auto& e = find(seq);
    std::vector<PageId> blocks;
    blocks.reserve(positions.size());
    std::vector<PageId> table;
    table.reserve(e.blocks.size() + positions.size());  // both allocations before anything changes
    // Position k takes the k-th of the last n free blocks: removing the inserted pages again (ascending) pushes
    // them back in the same order, so an undone insertion leaves the free list exactly as it was.
    const std::size_t n = positions.size();
    for (std::size_t i = 0, k = 0, old = 0; i < e.blocks.size() + n; ++i) {
      if (k < n && positions[k] == i) {
        blocks.push_back(free_[free_.size() - n + k]);
        table.push_back(blocks.back());
        ++k;
      } else {
        table.push_back(e.blocks[old++]);
      }
    }
    for (PageId id : blocks) {
      refs_[static_cast<std::size_t>(id)] = 1;
      free_.pop_back();
    }
    e.blocks = std::move(table);
    e.tokens += positions.size() * page_size_;
    return blocks;
  }

  /// Checks the pool's invariants: a block is free exactly when no sequence holds it, its reference count is the
  /// number of times sequences hold it, no sequence holds a block twice, and each sequence holds exactly the
  /// blocks its token count needs. Returns false on any violation.
  [[nodiscard]] bool consistent() const {
    std::vector<std::size_t> held(capacity(), 0), freed(capacity(), 0);
    for (PageId id : free_) {
      if (id < 0 || static_cast<std::size_t>(id) >= capacity()) return false;
      ++freed[static_cast<std::size_t>(id)];
    }
    for (const auto& [seq, e] : seqs_) {
      if (e.blocks.size() != pages_for(e.tokens)) return false;
      std::vector<PageId> sorted = e.blocks;
      std::sort(sorted.begin(), sorted.end());
      if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) return false;
      for (PageId id : e.blocks) {
        if (id < 0 || static_cast<std::size_t>(id) >= capacity()) return false;
        ++held[static_cast<std::size_t>(id)];
      }
    }
    for (std::size_t id = 0; id < capacity(); ++id)
      if (held[id] != refs_[id] || freed[id] != (held[id] == 0 ? 1u : 0u)) return false;
    return true;
  }

 private:
  struct entry {
    std::vector<PageId> blocks;
    std::size_t tokens = 0;
  };
  [[nodiscard]] static bool fits_page_id(std::size_t id) noexcept { return std::in_range<PageId>(id); }
  [[nodiscard]] std::size_t pages_for(std::size_t tokens) const noexcept {
    return (tokens + page_size_ - 1) / page_size_;
  }
  // Drops one reference; the last one returns the block to the free list. Never allocates: free_ was reserved
  // for every block at construction.
  void release(PageId id) noexcept {
    if (--refs_[static_cast<std::size_t>(id)] == 0) free_.push_back(id);
  }
  entry& find(const SequenceId& seq) {
    auto it = seqs_.find(seq);
    if (it == seqs_.end()) detail::raise_usage("sequence is not open in the block pool");
    return it->second;
  }
  const entry& find(const SequenceId& seq) const {
    auto it = seqs_.find(seq);
    if (it == seqs_.end()) detail::raise_usage("sequence is not open in the block pool");
    return it->second;
  }

  std::size_t page_size_;
  std::vector<std::size_t> refs_;
  std::vector<PageId> free_;
  std::map<SequenceId, entry> seqs_;
};

static_assert(page_table<block_pool<>>);
static_assert(checked_page_table<block_pool<>>);
static_assert(shared_page_table<block_pool<>>);
static_assert(batch_page_table<block_pool<>>);
static_assert(inserting_page_table<block_pool<>>);

}  // namespace memdecay

#endif  // MEMDECAY_PAGE_TABLES_BLOCK_POOL_HPP
