// SPDX-License-Identifier: Apache-2.0
// memdecay: the layout of one sequence, in page order: what every policy shares.
//
// For every resident token: its region (1 byte). Per resident page: the page's original index in the sequence, so
// the absolute position of every resident token is known after eviction (keys keep their RoPE positions; engines
// compact KV slots, not positions). The clock is logical and supplied by the engine. A policy's own per-token
// signal (MemDecay's clocks and EWMA, H2O's sums, ...) lives in the policy, in the same page order.
//
// This class keeps the invariants of the layout (pages are full except the last; only whole pages leave) and
// validates what it can check alone. Region ids and attention are validated by basic_sequence, which knows the
// region table and the config.
#ifndef MEMDECAY_CORE_SEQUENCE_STATE_HPP
#define MEMDECAY_CORE_SEQUENCE_STATE_HPP

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "memdecay/detail/column_vector.hpp"
#include "memdecay/detail/digest.hpp"
#include "memdecay/detail/error.hpp"
#include "memdecay/detail/growth.hpp"
#include "memdecay/core/page_geometry.hpp"
#include "memdecay/core/region.hpp"
#include "memdecay/core/retention_score.hpp"

namespace memdecay {

namespace detail {
struct snapshot_access;          // io/snapshot.hpp: writes and restores the layout
struct manager_snapshot_access;  // io/manager_snapshot.hpp: moves sequences between managers
}  // namespace detail

/// A run of `count` consecutive tokens of one region (the run-length form of labels).
struct region_span {
  region_id region;
  std::size_t count;
};

template <std::size_t PageSize = dynamic_page_size>
class sequence_state {
 public:
  using geometry_type = page_geometry<PageSize>;

  explicit sequence_state(std::size_t page_size = PageSize == dynamic_page_size ? 16 : PageSize)
      : geometry_(page_size) {}

  // --- sizes ---------------------------------------------------------------------------------------------
  [[nodiscard]] std::size_t page_size() const noexcept { return geometry_.size(); }
  [[nodiscard]] const geometry_type& geometry() const noexcept { return geometry_; }
  /// Resident tokens (the engine's compacted KV length).
  [[nodiscard]] std::size_t kv_len() const noexcept { return region_.size(); }
  /// Resident pages; every page but the last is full.
  [[nodiscard]] std::size_t num_pages() const noexcept { return page_origin_.size(); }
  /// Every token ever appended (the next token's absolute position).
  [[nodiscard]] std::uint64_t logical_len() const noexcept { return logical_len_; }
  /// Tokens evicted so far; always a multiple of the page size.
  [[nodiscard]] std::uint64_t evicted_tokens() const noexcept { return logical_len_ - kv_len(); }
  /// Resident tokens of page `page` (the page size, or fewer for the last page).
  [[nodiscard]] std::size_t tokens_in_page(std::size_t page) const noexcept {
    return std::min(page_size(), kv_len() - page * page_size());
  }
  /// The current logical step.
  [[nodiscard]] step_t now() const noexcept { return now_; }
  /// Bumped by every mutation; a selection made at one generation cannot be committed at another.
  [[nodiscard]] std::uint64_t generation() const noexcept { return generation_; }

  // --- per-token data, in page order -----------------------------------------------------------------------
  [[nodiscard]] std::span<const region_id> regions() const noexcept { return region_; }
  /// The original page index of each resident page.
  [[nodiscard]] std::span<const std::uint64_t> page_origins() const noexcept { return page_origin_; }

  /// The absolute (RoPE) position of resident token `index`.
  [[nodiscard]] std::uint64_t position_of(std::size_t index) const noexcept {
    return page_origin_[geometry_.page_of(index)] * page_size() + (index & (page_size() - 1));
  }
  /// The absolute positions of all resident tokens, in page order.
  [[nodiscard]] std::vector<std::uint64_t> positions() const {
    std::vector<std::uint64_t> out(kv_len());
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = position_of(i);
    return out;
  }
  /// The first original page that is no longer resident: the engine must not hash or reuse (prefix-cache) blocks
  /// at or after it, because later KV depends on what was evicted. Empty while nothing was evicted.
  [[nodiscard]] std::optional<std::uint64_t> prefix_cache_boundary() const noexcept {
    if (evicted_tokens() == 0) return std::nullopt;
    for (std::size_t i = 0; i < page_origin_.size(); ++i)
      if (page_origin_[i] != i) return i;
    return page_origin_.size();
  }

  // --- mutation ----------------------------------------------------------------------------------------------
  /// Moves the clock to `step`; throws input_error when it would go backwards.
  void advance_to(step_t step) {
    if (step < now_)
      detail::raise_input("clock goes backwards: advance_to(" + detail::to_text(step) + ") at step " +
                          detail::to_text(now_));
    if (step != now_) ++generation_;
    now_ = step;
  }

  /// Appends the spans' tokens. Region ids are not checked here. Strong guarantee.
  void append(std::span<const region_span> spans) {
    std::size_t total = 0;
    for (const auto& s : spans) total += s.count;
    reserve_for(total);  // the only step that may throw; nothing below allocates
    for (const auto& s : spans)
      for (std::size_t k = 0; k < s.count; ++k) push_token(s.region);
    if (total) ++generation_;
  }
  /// Appends one token per label. Strong guarantee.
  void append(std::span<const region_id> labels) {
    reserve_for(labels.size());
    for (region_id r : labels) push_token(r);
    if (!labels.empty()) ++generation_;
  }

  /// Bumps the generation: the owner changed per-token state kept beside the layout (an observation), so plans
  /// selected before are stale.
  void touch() noexcept { ++generation_; }

  /// Checks that `pages` are strictly ascending, resident and full; throws usage_error otherwise.
  void check_removable(std::span<const std::size_t> pages) const {
    if (auto problem = removal_problem(pages); !problem.empty()) detail::raise_usage(problem);
  }
  /// What check_removable() would say, or an empty string when `pages` can be removed.
  [[nodiscard]] std::string removal_problem(std::span<const std::size_t> pages) const {
    for (std::size_t k = 0; k < pages.size(); ++k) {
      const std::size_t p = pages[k];
      if (p >= num_pages())
        return "page " + detail::to_text(p) + " does not exist (sequence has " + detail::to_text(num_pages()) +
               " pages)";
      if (k > 0 && p <= pages[k - 1])
        return "pages to remove must be strictly ascending (page " + detail::to_text(p) + " after " +
               detail::to_text(pages[k - 1]) + ")";
      if (tokens_in_page(p) != page_size())
        return "page " + detail::to_text(p) + " is the partial last page and cannot be removed";
    }
    return {};
  }

  /// Removes whole pages (strictly ascending logical indices) and compacts the state. Throws usage_error, changing
  /// nothing, when check_removable() fails.
  void remove_pages(std::span<const std::size_t> pages) {
    check_removable(pages);
    if (pages.empty()) return;
    const std::size_t P = page_size();
    std::size_t write_page = pages.front();
    std::size_t next_victim = 0;
    for (std::size_t read_page = pages.front(); read_page < num_pages(); ++read_page) {
      if (next_victim < pages.size() && pages[next_victim] == read_page) {
        ++next_victim;
        continue;
      }
      const std::size_t n = tokens_in_page(read_page);
      const std::size_t from = read_page * P, to = write_page * P;
      std::copy_n(region_.begin() + from, n, region_.begin() + to);
      page_origin_[write_page] = page_origin_[read_page];
      ++write_page;
    }
    const std::size_t removed_tokens = pages.size() * P;
    region_.resize(region_.size() - removed_tokens);
    page_origin_.resize(page_origin_.size() - pages.size());
    ++generation_;
  }

  /// A digest of the layout (labels, positions, the clock): with the policy's digest, equal digests on two ranks
  /// mean they will select the same victims.
  [[nodiscard]] std::uint64_t digest() const noexcept {
    detail::fnv1a64 h;
    h.add(std::span<const region_id>(region_))
        .add(std::span<const std::uint64_t>(page_origin_))
        .add(now_)
        .add(logical_len_)
        .add(static_cast<std::uint64_t>(page_size()));
    return h.value();
  }

 private:
  friend struct detail::snapshot_access;
  void reserve_for(std::size_t extra) {
    const std::size_t n = kv_len() + extra;
    detail::reserve_for_append(region_, n);  // geometric: one decode token per append stays O(1) amortised
    detail::reserve_for_append(page_origin_, geometry_.pages_for(n));
  }
  void push_token(region_id r) noexcept {
    // A token that starts a page opens a new one, whose original index follows from the logical length
    // (evictions remove whole pages, so logical_len and kv_len agree modulo the page size).
    if ((kv_len() & (page_size() - 1)) == 0) page_origin_.push_back(logical_len_ / page_size());
    region_.push_back(r);
    ++logical_len_;
  }

  geometry_type geometry_;
  detail::column_vector<region_id> region_;
  std::vector<std::uint64_t> page_origin_;
  step_t now_ = 0;
  std::uint64_t logical_len_ = 0;
  std::uint64_t generation_ = 0;
};

}  // namespace memdecay

#endif  // MEMDECAY_CORE_SEQUENCE_STATE_HPP
