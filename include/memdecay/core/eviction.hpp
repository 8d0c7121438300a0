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

/// The status of every page, given the config's protections and an optional caller-protected set (sorted or
/// not; indices past the end are ignored).
template <std::size_t PageSize, region_table_like Regions>
void page_statuses(const sequence_state<PageSize>& state, const Regions& table, const protection_config& protection,
                   std::span<const std::size_t> caller_protected, std::span<page_status> out) noexcept {
  const std::size_t pages = state.num_pages(), P = state.page_size(), n = state.kv_len();
  const std::size_t recent_from =
      protection.recent_tokens >= n ? 0 : state.geometry().page_of(n - protection.recent_tokens);
  const bool has_recent = protection.recent_tokens > 0 && n > 0;
  const auto regions = state.regions();
  // A byte per region id, OR-ed over each page without a branch per token: this scan runs on every selection
  // and reads every resident label (a branch and a region_params lookup per token cost ~1 ns each).
  std::array<std::uint8_t, 256> pinned{};
  for (std::size_t r = 0; r < table.size() && r < pinned.size(); ++r)
    pinned[r] = table.pinned(static_cast<region_id>(r)) ? 1 : 0;
  for (std::size_t p = 0; p < pages; ++p) {
    page_status s = page_status::evictable;
    const std::size_t first = p * P, count = state.tokens_in_page(p);
    std::uint8_t any_pinned = 0;
    for (std::size_t i = first; i < first + count; ++i) any_pinned |= pinned[regions[i]];
    if (any_pinned) s = page_status::pinned;
    if (s == page_status::evictable) {
      if (p < protection.sink_pages)
        s = page_status::sink;
      else if (has_recent && p >= recent_from)
        s = page_status::recent;
      else if (count < P)
        s = page_status::partial;
    }
    out[p] = s;
  }
  for (std::size_t p : caller_protected)
    if (p < pages && out[p] == page_status::evictable) out[p] = page_status::protected_;
}

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
