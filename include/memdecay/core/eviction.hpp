// SPDX-License-Identifier: Apache-2.0
// memdecay: page scores, page eligibility and victim selection (scalar reference).
//
// A page scores the mean of its resident tokens' retention scores. The victims of a selection are the k
// lowest-scoring eligible pages in the total order (score, logical page index): ties go to the lower index, so
// the result is a pure function of the state and identical on every tensor-parallel rank. A page is not eligible
// when it holds any token of a pinned region, is one of the sink pages, holds one of the most recent tokens, is
// the partial last page, or was protected by the caller.
#ifndef MEMDECAY_CORE_EVICTION_HPP
#define MEMDECAY_CORE_EVICTION_HPP

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <utility>
#include <vector>

#include "memdecay/core/config.hpp"
#include "memdecay/core/region.hpp"
#include "memdecay/core/retention_score.hpp"
#include "memdecay/core/sequence_state.hpp"
#include "memdecay/core/token_state.hpp"

namespace memdecay {

/// Why a page may or may not be evicted. Listed in the order the checks run; the first that applies wins.
enum class page_status : std::uint8_t {
  evictable,   ///< may be selected
  pinned,      ///< holds a token of a pinned region
  sink,        ///< one of protection.sink_pages
  recent,      ///< holds one of the last protection.recent_tokens tokens
  partial,     ///< the partial last page (the next token is written into it)
  protected_,  ///< protected by the caller for this selection (in-flight or speculative reads)
  host,        ///< on the host tier (tiers/host_tier.hpp): not on the device, so not a device victim
  recalled,    ///< came back from the host tier fewer than host_tier_config::min_device_steps steps ago
};

[[nodiscard]] inline const char* to_string(page_status s) noexcept {
  switch (s) {
    case page_status::evictable: return "evictable";
    case page_status::pinned: return "pinned";
    case page_status::sink: return "sink";
    case page_status::recent: return "recent";
    case page_status::partial: return "partial";
    case page_status::protected_: return "protected";
    case page_status::host: return "host";
    case page_status::recalled: return "recalled";
  }
  return "?";
}

/// Per-page scores: out[p] = mean over the page's tokens of b_r * exp(-lambda_r * dt) + alpha * a.
template <std::floating_point Float, std::size_t PageSize, region_table_like Regions>
void page_scores_reference(const token_state<Float, PageSize>& state, const Regions& table, Float alpha,
                           std::span<Float> out) noexcept {
  const auto regions = state.regions();
  const auto refreshed = state.last_refresh();
  const auto ewma = state.ewma();
  for (std::size_t p = 0; p < state.num_pages(); ++p) {
    const std::size_t first = p * state.page_size(), n = state.tokens_in_page(p);
    Float sum = 0;
    for (std::size_t i = first; i < first + n; ++i)
      sum += token_score_terms(table, regions[i], refreshed[i], state.now(), alpha, ewma[i]).total();
    out[p] = sum / static_cast<Float>(n);
  }
}

namespace detail {

/// Where the place rules of a sequence fall: sink pages [0, sink_end), the recent window [recent_from, pages) and
/// the partial last page (partial_page, or pages when the last page is full). Computed once, asked per page.
struct place_ranges {
  std::size_t sink_end = 0, recent_from = 0, partial_page = 0;
  /// Whether the page's place allows its eviction (pins and the caller's protections aside).
  [[nodiscard]] bool evictable(std::size_t page) const noexcept {
    return page >= sink_end && page < recent_from && page != partial_page;
  }
};

template <std::size_t PageSize>
[[nodiscard]] place_ranges place_ranges_of(const sequence_state<PageSize>& state,
                                           const protection_config& protection) noexcept {
  const std::size_t pages = state.num_pages(), n = state.kv_len();
  place_ranges r;
  r.sink_end = std::min<std::size_t>(protection.sink_pages, pages);
  r.recent_from = pages;
  if (protection.recent_tokens > 0 && n > 0)
    r.recent_from = protection.recent_tokens >= n ? 0 : state.geometry().page_of(n - protection.recent_tokens);
  r.partial_page = pages > 0 && state.tokens_in_page(pages - 1) < state.page_size() ? pages - 1 : pages;
  return r;
}

/// The statuses that follow from a page's place (sink, recent, partial) and the caller's protections, over `out`
/// holding pinned or evictable for every page (pinned wins, then sink, recent, partial, caller-protected). Touches
/// only the sink pages, the recent window, the last page and the caller's pages.
template <std::size_t PageSize>
void place_statuses(const sequence_state<PageSize>& state, const protection_config& protection,
                    std::span<const std::size_t> caller_protected, std::span<page_status> out) noexcept {
  const std::size_t pages = state.num_pages();
  const place_ranges place = place_ranges_of(state, protection);
  for (std::size_t p = 0; p < place.sink_end; ++p)
    if (out[p] == page_status::evictable) out[p] = page_status::sink;
  for (std::size_t p = std::max(place.recent_from, place.sink_end); p < pages; ++p)
    if (out[p] == page_status::evictable) out[p] = page_status::recent;
  if (place.partial_page < pages && out[place.partial_page] == page_status::evictable)
    out[place.partial_page] = page_status::partial;
  for (std::size_t p : caller_protected)
    if (p < pages && out[p] == page_status::evictable) out[p] = page_status::protected_;
}

}  // namespace detail

/// The status of every page, given the config's protections and an optional caller-protected set (sorted or
/// not; indices past the end are ignored). The reference: it reads every resident label.
template <std::size_t PageSize, region_table_like Regions>
void page_statuses(const sequence_state<PageSize>& state, const Regions& table, const protection_config& protection,
                   std::span<const std::size_t> caller_protected, std::span<page_status> out) noexcept {
  const auto regions = state.regions();
  for (std::size_t p = 0; p < state.num_pages(); ++p) {
    bool pinned = false;
    for (std::size_t i = p * state.page_size(); i < p * state.page_size() + state.tokens_in_page(p); ++i)
      pinned = pinned || table.pinned(regions[i]);
    out[p] = pinned ? page_status::pinned : page_status::evictable;
  }
  detail::place_statuses(state, protection, caller_protected, out);
}

/// page_statuses from per-page pinned flags (pinned_pages: 1 for a page holding a pinned region's token): one
/// byte per page instead of every label. Equal to the reference for flags that match the labels.
template <std::size_t PageSize>
void page_statuses(const sequence_state<PageSize>& state, std::span<const std::uint8_t> pinned_flags,
                   const protection_config& protection, std::span<const std::size_t> caller_protected,
                   std::span<page_status> out) noexcept {
  static_assert(static_cast<std::uint8_t>(page_status::evictable) == 0 &&
                static_cast<std::uint8_t>(page_status::pinned) == 1);
  if (state.num_pages() != 0)
    std::memcpy(out.data(), pinned_flags.data(), state.num_pages());  // 0 = evictable, 1 = pinned
  detail::place_statuses(state, protection, caller_protected, out);
}

/// Which resident pages hold a token of a pinned region, one byte per page, kept as tokens arrive and pages
/// leave: a selection reads a byte per page instead of every label. The region table is fixed per sequence.
class pinned_pages {
 public:
  pinned_pages() = default;
  template <region_table_like Regions>
  explicit pinned_pages(const Regions& table) {
    for (std::size_t r = 0; r < table.size() && r < pinned_.size(); ++r)
      pinned_[r] = table.pinned(static_cast<region_id>(r)) ? 1 : 0;
  }
  [[nodiscard]] std::span<const std::uint8_t> flags() const noexcept { return flags_; }
  /// Room for `pages` pages (may throw bad_alloc; nothing changes then).
  void reserve(std::size_t pages) { flags_.reserve(pages); }
  /// After tokens were appended from resident token `first`: the flags of the pages they touched. Within the
  /// capacity reserved for the new page count, this cannot throw.
  template <std::size_t PageSize>
  void appended(const sequence_state<PageSize>& state, std::size_t first) noexcept {
    flags_.resize(state.num_pages(), 0);
    mark(state, first, std::span<std::uint8_t>(flags_));
  }
  /// Pages leave (strictly ascending, resident): compacts.
  void remove_pages(std::span<const std::size_t> pages) noexcept {
    if (pages.empty()) return;
    std::size_t write = pages.front(), next = 0;
    for (std::size_t p = pages.front(); p < flags_.size(); ++p) {
      if (next < pages.size() && pages[next] == p) {
        ++next;
        continue;
      }
      flags_[write++] = flags_[p];
    }
    flags_.resize(write);
  }
  /// The flags of a whole layout (a loaded snapshot). May throw bad_alloc; nothing changes then.
  template <std::size_t PageSize>
  void rebuild(const sequence_state<PageSize>& state) {
    std::vector<std::uint8_t> fresh(state.num_pages(), 0);
    mark(state, 0, std::span<std::uint8_t>(fresh));
    flags_ = std::move(fresh);
  }

 private:
  // ORs into `flags` whether the tokens from resident token `first` on hold a pinned region.
  template <std::size_t PageSize>
  void mark(const sequence_state<PageSize>& state, std::size_t first, std::span<std::uint8_t> flags) const noexcept {
    const auto regions = state.regions();
    for (std::size_t p = state.geometry().page_of(first); p < state.num_pages(); ++p) {
      std::uint8_t any = 0;
      const std::size_t end = p * state.page_size() + state.tokens_in_page(p);
      for (std::size_t i = std::max(p * state.page_size(), first); i < end; ++i) any |= pinned_[regions[i]];
      flags[p] = static_cast<std::uint8_t>(flags[p] | any);  // a byte OR per token, no branch
    }
  }

  std::array<std::uint8_t, 256> pinned_{};  // 1 for a pinned region id
  std::vector<std::uint8_t> flags_;
};

/// The k lowest-scoring pages among those with status evictable, in ascending page order. Fewer when fewer are
/// eligible. Order: (score, page index), so ties go to the lower index.
template <std::floating_point Float>
[[nodiscard]] std::vector<std::size_t> select_lowest_pages(std::span<const Float> scores,
                                                           std::span<const page_status> status, std::size_t k) {
  std::vector<std::pair<Float, std::size_t>> candidates;
  for (std::size_t p = 0; p < scores.size(); ++p)
    if (status[p] == page_status::evictable) candidates.emplace_back(scores[p], p);
  if (k < candidates.size()) {
    std::nth_element(candidates.begin(), candidates.begin() + static_cast<std::ptrdiff_t>(k), candidates.end());
    candidates.resize(k);
  }
  std::vector<std::size_t> pages;
  pages.reserve(candidates.size());
  for (const auto& c : candidates) pages.push_back(c.second);
  std::sort(pages.begin(), pages.end());
  return pages;
}

/// The result of a selection: which pages to evict, and the context needed to commit it safely.
template <std::floating_point Float>
struct eviction_plan {
  std::vector<std::size_t> pages;  ///< logical page indices (in the current resident layout), ascending
  std::vector<Float> scores;       ///< each victim's page score, aligned with `pages`
  /// With a host tier (tiers/host_tier.hpp): the victims that go to host instead of being dropped (a subset of
  /// `pages`, ascending), and the host pages dropped to make room for them (ascending). Empty without a tier.
  std::vector<std::size_t> demoted;
  std::vector<std::size_t> host_dropped;
  std::size_t requested = 0;          ///< pages the budget (or the caller) asked for
  std::size_t pages_over_budget = 0;  ///< pages by which the high watermark is still exceeded after this plan
  std::size_t page_size = 0;
  std::uint64_t generation = 0;  ///< state generation the plan was made at; commit rejects any other

  [[nodiscard]] bool empty() const noexcept { return pages.empty(); }
  [[nodiscard]] std::size_t tokens() const noexcept { return pages.size() * page_size; }
};

}  // namespace memdecay

#endif  // MEMDECAY_CORE_EVICTION_HPP
