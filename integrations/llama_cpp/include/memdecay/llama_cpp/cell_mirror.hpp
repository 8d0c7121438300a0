// SPDX-License-Identifier: Apache-2.0
// memdecay + llama.cpp: which KV cell holds which position of one sequence, learnt from the attention mask.
//
// llama.cpp's eval callback hands attention over cells ([n_kv cells, n_tokens, n_head, n_stream]) and exposes no
// map from cells to positions: after llama_memory_seq_rm frees cells, later tokens reuse them, so cell order and
// position order come apart. The mirror learns the map from the mask llama.cpp builds for each ubatch (the
// soft_max's src[1]: 0 where a query token may see a cell, -inf elsewhere): a cell the sequence did not hold
// before becomes visible from the batch token whose position it now holds on. Every later mask is checked against
// the mirror (a cell of position q is visible to exactly the batch tokens at positions >= q), so a llama.cpp that
// allocates, moves or masks cells in a way the mirror does not expect is a clear error, never a misattribution.
// Removal and shifts (llama_memory_seq_rm / seq_add) are applied to the mirror by the caller as they are to
// llama.cpp.
#ifndef MEMDECAY_LLAMA_CPP_CELL_MIRROR_HPP
#define MEMDECAY_LLAMA_CPP_CELL_MIRROR_HPP

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "memdecay/detail/error.hpp"

namespace memdecay::llama_cpp {

/// The visibility of cells to one ubatch's tokens: visible(t, c) for token t < tokens and cell c < cells.
struct mask_view {
  std::size_t cells = 0;
  std::size_t tokens = 0;
  std::vector<std::uint8_t> bits;  ///< tokens x cells, row-major: 1 = the token may attend to the cell
  [[nodiscard]] bool visible(std::size_t t, std::size_t c) const noexcept { return bits[t * cells + c] != 0; }
};

/// Cells -> positions of one sequence (see the file comment). Positions are llama.cpp's (int32).
class cell_mirror {
 public:
  static constexpr std::int32_t free_cell = -1;

  /// Learns the cells of `batch_positions` (the ubatch's tokens, strictly increasing, all of this sequence) and
  /// checks every known cell against `mask`. usage_error naming the cell and token when they disagree; the
  /// mirror is unchanged then.
  void observe(const mask_view& mask, std::span<const std::int32_t> batch_positions) {
    if (mask.tokens < batch_positions.size())
      detail::raise_usage("llama.cpp mask has " + std::to_string(mask.tokens) + " rows for a ubatch of " +
                          std::to_string(batch_positions.size()) + " tokens");
    for (std::size_t i = 1; i < batch_positions.size(); ++i)
      if (batch_positions[i] <= batch_positions[i - 1])
        detail::raise_usage("cell_mirror::observe: batch positions must increase (token " + std::to_string(i) + ")");
    for (std::size_t c = mask.cells; c < pos_.size(); ++c)
      if (pos_[c] != free_cell)
        mismatch("cell " + std::to_string(c) + " (position " + std::to_string(pos_[c]) +
                 ") lies outside the mask's " + std::to_string(mask.cells) + " cells");
    std::vector<std::int32_t> next(pos_);
    if (next.size() < mask.cells) next.resize(mask.cells, free_cell);
    std::vector<std::uint8_t> placed(batch_positions.size(), 0);
    const std::size_t T = batch_positions.size();
    for (std::size_t c = 0; c < mask.cells; ++c) {
      if (next[c] != free_cell) {
        for (std::size_t t = 0; t < T; ++t)
          if (mask.visible(t, c) != (next[c] <= batch_positions[t]))
            mismatch("cell " + std::to_string(c) + " holds position " + std::to_string(next[c]) + " in the mirror, but "
                     "the mask " + (mask.visible(t, c) ? "shows" : "hides") + " it to the token at position " +
                     std::to_string(batch_positions[t]));
        continue;
      }
      std::size_t first = T;
      for (std::size_t t = 0; t < T && first == T; ++t)
        if (mask.visible(t, c)) first = t;
      if (first == T) continue;  // free, or another sequence's
      for (std::size_t t = first; t < T; ++t)
        if (!mask.visible(t, c))
          mismatch("cell " + std::to_string(c) + " is visible to the token at position " +
                   std::to_string(batch_positions[first]) + " but not to the later one at " +
                   std::to_string(batch_positions[t]));
      if (placed[first] != 0)
        mismatch("two new cells are visible from the token at position " + std::to_string(batch_positions[first]) +
                 " (cell " + std::to_string(c) + ")");
      placed[first] = 1;
      next[c] = batch_positions[first];
    }
    for (std::size_t t = 0; t < T; ++t)
      if (placed[t] == 0)
        mismatch("no new cell holds the batch token at position " + std::to_string(batch_positions[t]));
    pos_ = std::move(next);
  }

  /// llama_memory_seq_rm(seq, p0, p1) as applied to the mirror: [p0, p1) leaves (p1 < 0: to the end).
  void remove(std::int32_t p0, std::int32_t p1) noexcept {
    for (auto& p : pos_)
      if (p != free_cell && p >= p0 && (p1 < 0 || p < p1)) p = free_cell;
  }
  /// llama_memory_seq_add(seq, p0, p1, delta) as applied to the mirror.
  void shift(std::int32_t p0, std::int32_t p1, std::int32_t delta) noexcept {
    for (auto& p : pos_)
      if (p != free_cell && p >= p0 && (p1 < 0 || p < p1)) p += delta;
  }
  void clear() noexcept { pos_.clear(); }

  /// The position cell `c` holds for the sequence, or free_cell.
  [[nodiscard]] std::int32_t position(std::size_t c) const noexcept { return c < pos_.size() ? pos_[c] : free_cell; }
  [[nodiscard]] std::size_t cells() const noexcept { return pos_.size(); }
  [[nodiscard]] std::size_t held() const noexcept {
    std::size_t n = 0;
    for (auto p : pos_) n += p != free_cell ? 1 : 0;
    return n;
  }

 private:
  [[noreturn]] static void mismatch(const std::string& what) {
    detail::raise_usage("llama.cpp's attention mask disagrees with memdecay's cell mirror: " + what +
                        " (a llama.cpp whose KV cache allocates or moves cells differently; attention is not "
                        "attributed)");
  }
  std::vector<std::int32_t> pos_;
};

}  // namespace memdecay::llama_cpp

#endif  // MEMDECAY_LLAMA_CPP_CELL_MIRROR_HPP
