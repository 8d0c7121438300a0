// SPDX-License-Identifier: Apache-2.0
// memdecay: an owning KV block pool with a free list and per-sequence block tables.
//
// The reference page table: the default for the examples, tests and tools, and a model of what engines keep
// (vLLM's BlockPool + req_to_blocks, SGLang's paged allocator). It tracks ids only; the engine owns the memory.
// The free list is a stack (last freed, first reused; ids 0, 1, 2, ... on a fresh pool), so the ids a run gets
// are a pure function of its calls. Sequences live in an ordered map, so iteration never depends on hashing.
#ifndef MEMDECAY_BLOCK_POOL_HPP
#define MEMDECAY_BLOCK_POOL_HPP

#include <algorithm>
#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <vector>

#include "memdecay/detail/error.hpp"
#include "memdecay/page_table.hpp"

namespace memdecay {

template <std::integral PageId = std::int32_t, std::totally_ordered SequenceId = std::uint64_t>
class block_pool {
 public:
  using page_id = PageId;
  using sequence_id = SequenceId;

  /// A pool of `num_blocks` blocks of `page_size` tokens each.
  block_pool(std::size_t num_blocks, std::size_t page_size) : page_size_(page_size) {
    if (page_size == 0 || !std::has_single_bit(page_size))
      detail::raise_config("block_pool page_size = " + detail::to_text(page_size) + " (must be a power of two)");
    free_.reserve(num_blocks);
    for (std::size_t i = num_blocks; i-- > 0;) free_.push_back(static_cast<PageId>(i));  // pop_back gives 0 first
    capacity_ = num_blocks;
  }

  [[nodiscard]] std::size_t page_size() const noexcept { return page_size_; }
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  [[nodiscard]] std::size_t free_blocks() const noexcept { return free_.size(); }
  [[nodiscard]] std::size_t used_blocks() const noexcept { return capacity_ - free_.size(); }
  [[nodiscard]] bool contains(const SequenceId& seq) const noexcept { return seqs_.contains(seq); }
  [[nodiscard]] std::size_t num_sequences() const noexcept { return seqs_.size(); }

  /// Opens an empty sequence; usage_error if it is already open.
  void open(const SequenceId& seq) {
    if (seqs_.contains(seq)) detail::raise_usage("sequence is already open in the block pool");
    seqs_.emplace(seq, entry{});
  }
  /// Releases every block of the sequence and forgets it; usage_error if it is not open.
  void close(const SequenceId& seq) {
    auto& e = find(seq);
    for (auto it = e.blocks.rbegin(); it != e.blocks.rend(); ++it) free_.push_back(*it);
    seqs_.erase(seq);
  }

  /// Grows the sequence by `tokens`, allocating blocks as pages fill. Throws input_error (allocating nothing) when
  /// the pool has too few free blocks.
  void append_tokens(const SequenceId& seq, std::size_t tokens) {
    auto& e = find(seq);
    const std::size_t needed = pages_for(e.tokens + tokens) - e.blocks.size();
    if (needed > free_.size())
      detail::raise_input("block pool exhausted: " + detail::to_text(needed) + " blocks needed, " +
                          detail::to_text(free_.size()) + " free");
    e.blocks.reserve(e.blocks.size() + needed);
    for (std::size_t i = 0; i < needed; ++i) {
      e.blocks.push_back(free_.back());
      free_.pop_back();
    }
    e.tokens += tokens;
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

  /// Removes the strictly ascending logical pages, compacts the block table and frees the blocks. Only full
  /// pages may be removed. Throws usage_error, changing nothing, when an index is invalid.
  void remove_pages(const SequenceId& seq, std::span<const std::size_t> pages) {
    auto& e = find(seq);
    for (std::size_t k = 0; k < pages.size(); ++k) {
      if (pages[k] >= e.blocks.size())
        detail::raise_usage("remove_pages: logical page " + detail::to_text(pages[k]) + " out of range (" +
                            detail::to_text(e.blocks.size()) + " pages)");
      if (k > 0 && pages[k] <= pages[k - 1])
        detail::raise_usage("remove_pages: pages must be strictly ascending");
      if ((pages[k] + 1) * page_size_ > e.tokens)
        detail::raise_usage("remove_pages: logical page " + detail::to_text(pages[k]) + " is not full");
    }
    free_.reserve(free_.size() + pages.size());  // capacity is `capacity_` already; keeps the no-throw claim honest
    std::size_t write = 0, next = 0;
    for (std::size_t read = 0; read < e.blocks.size(); ++read) {
      if (next < pages.size() && pages[next] == read) {
        free_.push_back(e.blocks[read]);
        ++next;
      } else {
        e.blocks[write++] = e.blocks[read];
      }
    }
    e.blocks.resize(write);
    e.tokens -= pages.size() * page_size_;
  }

  /// Checks the pool's invariants: every block is either free or owned by exactly one sequence, and each sequence
  /// holds exactly the blocks its token count needs. Returns false on any violation.
  [[nodiscard]] bool consistent() const {
    std::vector<int> owners(capacity_, 0);
    for (PageId id : free_) {
      if (id < 0 || static_cast<std::size_t>(id) >= capacity_) return false;
      ++owners[static_cast<std::size_t>(id)];
    }
    for (const auto& [seq, e] : seqs_) {
      if (e.blocks.size() != pages_for(e.tokens)) return false;
      for (PageId id : e.blocks) {
        if (id < 0 || static_cast<std::size_t>(id) >= capacity_) return false;
        ++owners[static_cast<std::size_t>(id)];
      }
    }
    return std::all_of(owners.begin(), owners.end(), [](int n) { return n == 1; });
  }

 private:
  struct entry {
    std::vector<PageId> blocks;
    std::size_t tokens = 0;
  };
  [[nodiscard]] std::size_t pages_for(std::size_t tokens) const noexcept { return (tokens + page_size_ - 1) / page_size_; }
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
  std::size_t capacity_ = 0;
  std::vector<PageId> free_;
  std::map<SequenceId, entry> seqs_;
};

static_assert(page_table<block_pool<>>);

}  // namespace memdecay

#endif  // MEMDECAY_BLOCK_POOL_HPP
