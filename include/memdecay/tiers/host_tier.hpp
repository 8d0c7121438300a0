// SPDX-License-Identifier: Apache-2.0
// memdecay: the host tier. A page the device budget pushes out is demoted to host memory instead of dropped when
// the tier has room and the page is worth keeping, and comes back (is recalled) when a query says it is needed.
//
//   seq.enable_host_tier({.host_budget = memdecay::budget_config::ratio(0.5), .min_host_priority = 0.5});
//   auto plan = seq.select_for_budget();      // plan.pages leave the device; plan.demoted of them go to host,
//                                             // the rest are dropped; plan.host_dropped leave the host tier
//   /* engine: copy plan.demoted's KV to host, free the rest */
//   seq.commit(plan);
//   auto recall = seq.select_recall(query);   // needs page digests (digests/page_digests.hpp)
//   /* engine: copy recall.promote back to the device, recall.demote to host, free recall.drop */
//   seq.commit_recall(recall);
//
// A page is on the device or on the host; a dropped page is gone from the sequence (as an evicted page always
// was). Host pages stay in the sequence's layout at their original position, with their labels and the policy's
// state, so a recalled page returns exactly where it was (same RoPE positions, same order) and its score keeps
// following the clock while it is away: a host page receives no attention, so it ages as an unread device page
// would. Page indices (plans, scores, statuses, digests) count every held page, device and host, in original
// order; observations count device tokens only (the attention the engine computed covers the device).
//
// The region rule for the host tier (TensorRT-LLM's secondary_offload_min_priority, applied to regions): a page
// goes to host only if one of its tokens belongs to a region whose base priority is at least min_host_priority;
// a scratchpad page (low priority, short-lived) is dropped at once, a retrieved document kept. The host tier is
// bounded by host_budget (its high watermark; the low one is unused) and, when full, drops its lowest-scoring
// pages by the same page score as the device, ties to the lower index.
//
// Recall compares each host page's query bound (the best head's Quest bound, page_digests::bounds) with the
// device's evictable pages': host pages are promoted, best first, into free device room under the budget's high
// watermark, and beyond it only by swapping with a device page whose bound is lower by more than `hysteresis`
// (logits); a recalled page is protected from demotion for min_device_steps steps. Both keep a page from moving
// back and forth between steps. With displace_lowest = k, only the k lowest-scoring evictable device pages may be
// displaced: the retention score decides what may leave, the query's bound what comes back (memdecay-eval's
// "-lowest<k>" rows: a third of the bytes moved, docs/tiers.md). Recall plans are two-phase, like eviction plans,
// and rejected when stale.
#ifndef MEMDECAY_TIERS_HOST_TIER_HPP
#define MEMDECAY_TIERS_HOST_TIER_HPP

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "memdecay/core/config.hpp"
#include "memdecay/core/region.hpp"
#include "memdecay/core/retention_score.hpp"
#include "memdecay/detail/digest.hpp"
#include "memdecay/detail/error.hpp"
#include "memdecay/page_tables/page_table.hpp"

namespace memdecay {

/// Where a held page's KV lives.
enum class page_residency : std::uint8_t {
  device,  ///< in the device KV cache: attention reads it
  host,    ///< demoted to host memory: kept, not attended, recallable
};

[[nodiscard]] inline const char* to_string(page_residency r) noexcept {
  return r == page_residency::device ? "device" : "host";
}

/// The host tier's budget and rules (see the top of this header).
struct host_tier_config {
  budget_config host_budget{};     ///< the host tier's size (its high watermark); unlimited by default
  double min_host_priority = 0.0;  ///< a page goes to host only if a token's region has b_r >= this
  double hysteresis = 0.0;         ///< logits a host page's bound must beat a device page's by to swap
  step_t min_device_steps = 4;     ///< a recalled page is not demoted again before this many steps
  std::size_t max_recall_pages = std::numeric_limits<std::size_t>::max();  ///< promotions per recall plan
  /// > 0: a recall may displace only this many device pages, the evictor's lowest-scoring evictable ones (the
  /// score decides what may leave, the query what returns); 0: any evictable device page the query bounds lower.
  std::size_t displace_lowest = 0;

  /// config_error naming the field.
  void validate() const {
    if (const std::string why = problem(); !why.empty()) detail::raise_config(why);
  }
  /// What validate() would say, or an empty string (the snapshot reader names an offset instead).
  [[nodiscard]] std::string problem() const {
    if (static_cast<std::uint8_t>(host_budget.unit) > static_cast<std::uint8_t>(budget_unit::ratio))
      return "host_tier.host_budget.unit = " + detail::to_text(static_cast<int>(host_budget.unit));
    if (host_budget.unit != budget_unit::unlimited && (!std::isfinite(host_budget.high) || host_budget.high < 0))
      return "host_tier.host_budget.high = " + detail::to_text(host_budget.high) + " (must be finite and >= 0)";
    if (!std::isfinite(min_host_priority))
      return "host_tier.min_host_priority = " + detail::to_text(min_host_priority) + " (must be finite)";
    if (!std::isfinite(hysteresis) || hysteresis < 0)
      return "host_tier.hysteresis = " + detail::to_text(hysteresis) + " (must be finite and >= 0)";
    if (max_recall_pages == 0) return "host_tier.max_recall_pages = 0 (at least 1)";
    return {};
  }

  /// The host tier's capacity in pages for a sequence of `logical_len` tokens.
  [[nodiscard]] std::size_t host_capacity_pages(std::size_t page_size, std::uint64_t logical_len) const noexcept {
    const std::uint64_t tokens = host_budget.in_tokens(page_size, logical_len).high;
    const std::uint64_t pages = tokens / page_size;
    return pages > std::numeric_limits<std::size_t>::max() ? std::numeric_limits<std::size_t>::max()
                                                           : static_cast<std::size_t>(pages);
  }

  [[nodiscard]] std::uint64_t digest() const noexcept {
    detail::fnv1a64 h;
    h.add(static_cast<std::uint8_t>(host_budget.unit)).add(host_budget.high).add(min_host_priority).add(hysteresis);
    h.add(static_cast<std::uint64_t>(min_device_steps)).add(static_cast<std::uint64_t>(max_recall_pages));
    if (displace_lowest != 0) h.add(static_cast<std::uint64_t>(displace_lowest));  // older digests stay as they were
    return h.value();
  }
};

/// How select_recall combines a page's bounds over the query heads into the one number its decision ranks pages by
/// (a recall moves a page for every head at once).
enum class head_bounds : std::uint8_t {
  max,   ///< the best head's bound: a page is as wanted as its most aligned head (Quest's per-head criterion)
  mean,  ///< the mean over heads: every head's evidence counts (more recall for fewer bytes on the bundled models:
         ///< docs/tiers.md, "Measured: the host tier")
  /// the page's estimated attention mass, in log units: each head's softmax over the held pages' bounds, averaged
  /// over the heads (the attention-free signal's bound_softmax, digests/query_signal.hpp), so a head whose bounds
  /// single out one page counts more than a head that bounds every page alike; hysteresis is then in nats of mass
  attention,
};

/// A recall decision: host pages to bring back, device pages to make room for them. Indices are held pages (the
/// sequence's page order, device and host), each list strictly ascending.
struct recall_plan {
  std::vector<std::size_t> promote;   ///< host pages that return to the device
  std::vector<float> promote_bounds;  ///< each promoted page's query bound, aligned with `promote`
  std::vector<std::size_t> demote;    ///< device pages that go to host to make room
  std::vector<std::size_t> drop;      ///< device pages that make room but are not worth the host (the region rule)
  std::size_t page_size = 0;
  std::uint64_t generation = 0;  ///< the sequence's generation when selected; commit_recall rejects any other

  [[nodiscard]] bool empty() const noexcept { return promote.empty(); }
  /// Pages copied between tiers if committed (each promotion and each demotion moves one page).
  [[nodiscard]] std::size_t pages_moved() const noexcept { return promote.size() + demote.size(); }
};

/// What commit_recall with a page table did: the fresh blocks of the promoted pages (in page order: the engine
/// copies their K/V from the host into them) and the table's removal of the displaced pages.
template <class PageId>
struct recall_commit {
  std::vector<PageId> inserted;
  page_removal<PageId> removed;
};

/// The residency of every held page and when each was last recalled, in page order, beside the layout.
class page_residencies {
 public:
  static constexpr step_t never = std::numeric_limits<step_t>::max();

  page_residencies() = default;
  explicit page_residencies(host_tier_config cfg) : config_(cfg) {}

  [[nodiscard]] const host_tier_config& config() const noexcept { return config_; }
  [[nodiscard]] std::size_t size() const noexcept { return on_host_.size(); }
  [[nodiscard]] std::size_t host_pages() const noexcept { return host_pages_; }
  [[nodiscard]] std::size_t device_pages() const noexcept { return on_host_.size() - host_pages_; }
  [[nodiscard]] bool on_host(std::size_t page) const noexcept { return on_host_[page] != 0; }
  [[nodiscard]] page_residency of(std::size_t page) const noexcept {
    return on_host(page) ? page_residency::host : page_residency::device;
  }
  [[nodiscard]] std::span<const std::uint8_t> host_flags() const noexcept { return on_host_; }
  [[nodiscard]] std::span<const step_t> recalled_at() const noexcept { return recalled_at_; }
  /// Whether `page` came back from the host fewer than min_device_steps steps before `now`.
  [[nodiscard]] bool recently_recalled(std::size_t page, step_t now) const noexcept {
    const step_t at = recalled_at_[page];
    return at != never && now - at < config_.min_device_steps;
  }

  /// New rules for the pages where they are.
  void reconfigure(const host_tier_config& cfg) noexcept { config_ = cfg; }
  /// Capacity for `pages` held pages (may throw bad_alloc; nothing changes then).
  void reserve(std::size_t pages) {
    on_host_.reserve(pages);
    recalled_at_.reserve(pages);
  }
  /// New pages enter on the device (reserve first: this cannot throw then).
  void resize(std::size_t pages) {
    on_host_.resize(pages, 0);
    recalled_at_.resize(pages, never);
  }
  /// Moves device pages to the host (ascending, on the device: checked by the caller).
  void demote(std::span<const std::size_t> pages) noexcept {
    for (std::size_t p : pages) on_host_[p] = 1, recalled_at_[p] = never;
    host_pages_ += pages.size();
  }
  /// Brings host pages back to the device at `now` (ascending, on the host: checked by the caller).
  void promote(std::span<const std::size_t> pages, step_t now) noexcept {
    for (std::size_t p : pages) on_host_[p] = 0, recalled_at_[p] = now;
    host_pages_ -= pages.size();
  }
  /// Held pages leave (strictly ascending, in range): compacts both columns.
  void remove_pages(std::span<const std::size_t> pages) noexcept {
    for (std::size_t p : pages) host_pages_ -= on_host_[p];
    on_host_.resize(compact_pages(std::span<std::uint8_t>(on_host_), 1, pages));
    recalled_at_.resize(compact_pages(std::span<step_t>(recalled_at_), 1, pages));
  }
  /// Restores columns read from a snapshot (validated by the reader).
  void restore(std::vector<std::uint8_t> on_host, std::vector<step_t> recalled_at) {
    on_host_ = std::move(on_host);
    recalled_at_ = std::move(recalled_at);
    host_pages_ = static_cast<std::size_t>(std::count(on_host_.begin(), on_host_.end(), std::uint8_t{1}));
  }

  /// The index of held page `page` among the device pages (the engine's device page table), for a device page.
  [[nodiscard]] std::size_t device_index(std::size_t page) const noexcept {
    return page - static_cast<std::size_t>(std::count(
                      on_host_.begin(), on_host_.begin() + static_cast<std::ptrdiff_t>(page), std::uint8_t{1}));
  }
  /// device_index of each of `pages` (ascending device pages), in one pass.
  [[nodiscard]] std::vector<std::size_t> device_indices(std::span<const std::size_t> pages) const {
    std::vector<std::size_t> out;
    out.reserve(pages.size());
    std::size_t p = 0, hosted = 0;
    for (std::size_t page : pages) {
      for (; p < page; ++p) hosted += on_host_[p];
      out.push_back(page - hosted);
    }
    return out;
  }
  /// The held index of every device page, in page order.
  [[nodiscard]] std::vector<std::size_t> device_page_list() const {
    std::vector<std::size_t> out;
    out.reserve(device_pages());
    for (std::size_t p = 0; p < on_host_.size(); ++p)
      if (!on_host_[p]) out.push_back(p);
    return out;
  }

  [[nodiscard]] std::uint64_t digest() const noexcept {
    detail::fnv1a64 h;
    h.add(config_.digest()).add(std::span<const std::uint8_t>(on_host_)).add(std::span<const step_t>(recalled_at_));
    return h.value();
  }

 private:
  host_tier_config config_{};
  std::vector<std::uint8_t> on_host_;  // 1 for a host page
  std::vector<step_t> recalled_at_;    // the step a page last returned to the device; never if it did not
  std::size_t host_pages_ = 0;
};

namespace detail {

/// Writes device-token values into a held-token column: host pages (always full) get zeros. `device` has one entry
/// per device token, in page order; `held` one per held token.
template <class T>
void expand_device_tokens(std::span<const T> device, const page_residencies& tier, std::size_t page_size,
                          std::span<T> held) noexcept {
  std::size_t from = 0;
  for (std::size_t p = 0, at = 0; p < tier.size(); ++p, at += page_size) {
    const std::size_t n = std::min(page_size, held.size() - at);
    if (tier.on_host(p)) {
      std::fill_n(held.begin() + static_cast<std::ptrdiff_t>(at), n, T{});
    } else {
      std::copy_n(device.begin() + static_cast<std::ptrdiff_t>(from), n,
                  held.begin() + static_cast<std::ptrdiff_t>(at));
      from += n;
    }
  }
}

/// Whether a page with these labels may go to host under the region rule.
template <region_table_like Regions>
[[nodiscard]] bool host_worthy(std::span<const region_id> labels, const Regions& table,
                               double min_host_priority) noexcept {
  for (region_id r : labels)
    if (table.base_priority(r) >= min_host_priority) return true;
  return false;
}

/// How the device's victims and the host's pages split after a demotion: of the pool (host pages + the victims
/// worthy of the host), the lowest-scoring beyond `capacity` are dropped (score, then lower index first).
struct demotion_split {
  std::vector<std::size_t> demoted;       ///< victims that go to host, ascending
  std::vector<std::size_t> host_dropped;  ///< host pages dropped to make room, ascending
};

template <class Float>
[[nodiscard]] demotion_split split_demotion(std::span<const std::size_t> victims, std::span<const std::uint8_t> worthy,
                                            const page_residencies& tier, std::span<const Float> scores,
                                            std::size_t capacity) {
  std::vector<std::size_t> pool;
  pool.reserve(tier.host_pages() + victims.size());
  for (std::size_t p = 0; p < tier.size(); ++p)
    if (tier.on_host(p)) pool.push_back(p);
  for (std::size_t k = 0; k < victims.size(); ++k)
    if (worthy[k]) pool.push_back(victims[k]);
  std::vector<std::uint8_t> dropped(tier.size(), 0);
  if (pool.size() > capacity) {
    const auto cut = static_cast<std::ptrdiff_t>(pool.size() - capacity);
    std::nth_element(pool.begin(), pool.begin() + cut - 1, pool.end(), [&](std::size_t a, std::size_t b) {
      return scores[a] < scores[b] || (scores[a] == scores[b] && a < b);
    });
    for (auto it = pool.begin(); it != pool.begin() + cut; ++it) dropped[*it] = 1;
  }
  demotion_split out;
  for (std::size_t k = 0; k < victims.size(); ++k)
    if (worthy[k] && !dropped[victims[k]]) out.demoted.push_back(victims[k]);
  for (std::size_t p = 0; p < tier.size(); ++p)
    if (tier.on_host(p) && dropped[p]) out.host_dropped.push_back(p);
  return out;
}

}  // namespace detail
}  // namespace memdecay

#endif  // MEMDECAY_TIERS_HOST_TIER_HPP
