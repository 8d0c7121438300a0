// SPDX-License-Identifier: Apache-2.0
// priority_lru policy: a retention priority per region, least recently refreshed first within a priority.
//
// Source: TensorRT-LLM KV-cache retention, docs/source/features/kvcache.md ("prioritized LRU" over priorities
// 0-100: every block of the lowest priority goes before any block of the next) and
// cpp/include/tensorrt_llm/batch_manager/evictionPolicy.h (LRUEvictionPolicy: one free queue per priority);
// the priority model of cpp/include/tensorrt_llm/executor/executor.h (KvCacheRetentionConfig,
// kMinRetentionPriority = 0, kMaxRetentionPriority = 100, kDefaultRetentionPriority = 35).
//
// Each region has a priority in [0, 100]; a page takes the highest priority among its tokens. A token is
// refreshed when it is appended and whenever an observation gives it at least `refresh_threshold` times the
// uniform share (m_i * n >= refresh_threshold; infinity: insertion order only); a page was used when its most
// recently refreshed token was. Victims: the lowest priority first, and within it the page used longest ago,
// then the lower index. Scores are the pages' ranks in that order (exact in float up to 2^24 distinct keys).
// Unlike TensorRT-LLM this runs inside a live sequence; there is no duration (priorities do not expire).
//
// State per token: last refresh step (u32). Cost: O(n) per observation, O(n + pages log pages) per score.
#ifndef MEMDECAY_POLICIES_PRIORITY_LRU_HPP
#define MEMDECAY_POLICIES_PRIORITY_LRU_HPP

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "memdecay/core/config.hpp"
#include "memdecay/detail/digest.hpp"
#include "memdecay/detail/growth.hpp"
#include "memdecay/detail/error.hpp"
#include "memdecay/core/policy.hpp"

namespace memdecay::policies {

template <class Float = float>
class priority_lru {
  static_assert(std::floating_point<Float>, "policies score in float or double");

 public:
  using float_type = Float;
  struct params_type {
    /// Priority of each region id, 0..100. Empty: round(100 * b_r) of the config's region table, clamped.
    std::vector<int> region_priority{};
    /// A token is used when m_i * n >= refresh_threshold (1: at least uniform attention); inf: never.
    double refresh_threshold = 1.0;
  };
  static constexpr std::string_view name = "priority_lru";
  static constexpr int min_priority = 0, max_priority = 100;

  priority_lru(const params_type& params, const config&, const region_table& table)
      : priority_(params.region_priority), threshold_(params.refresh_threshold) {
    if (priority_.empty()) {
      for (const auto& r : table.params())
        priority_.push_back(
            std::clamp(static_cast<int>(std::lround(100.0 * r.base_priority)), min_priority, max_priority));
    }
    if (priority_.size() != table.size())
      detail::raise_config("priority_lru.region_priority has " + detail::to_text(priority_.size()) +
                           " entries, the region table has " + detail::to_text(table.size()));
    for (std::size_t r = 0; r < priority_.size(); ++r)
      if (priority_[r] < min_priority || priority_[r] > max_priority)
        detail::raise_config("priority_lru.region_priority[" + detail::to_text(r) +
                             "] = " + detail::to_text(priority_[r]) + " (must be in [0, 100])");
    if (std::isnan(threshold_) || threshold_ < 0.0)
      detail::raise_config("priority_lru.refresh_threshold = " + detail::to_text(threshold_) + " (must be >= 0)");
  }

  [[nodiscard]] int priority(region_id r) const noexcept { return priority_[r]; }
  [[nodiscard]] std::span<const step_t> last_refresh() const noexcept { return last_refresh_; }

  void reserve(std::size_t tokens) { detail::reserve_for_append(last_refresh_, tokens); }
  void on_append(const sequence_view& view, std::size_t) noexcept { last_refresh_.resize(view.kv_len(), view.now); }
  void check_observation(const sequence_view&, std::span<const Float>) const noexcept {}
  std::size_t on_observe(const sequence_view& view, std::span<const Float> mass) noexcept {
    const double n = static_cast<double>(view.kv_len());
    std::size_t refreshed = 0;
    for (std::size_t i = 0; i < mass.size(); ++i)
      if (static_cast<double>(mass[i]) * n >= threshold_) {
        last_refresh_[i] = view.now;
        ++refreshed;
      }
    return refreshed;
  }
  void on_remove(const sequence_view& view, std::span<const std::size_t> pages) noexcept {
    policy_support::compact_token_column(last_refresh_, pages, view.page_size);
  }
  /// out[p] = the rank of (priority, last use) of page p among the distinct keys of all pages.
  void page_scores(const sequence_view& view, std::span<Float> out) const {
    std::vector<std::uint64_t> keys(view.num_pages());
    for (std::size_t p = 0; p < view.num_pages(); ++p) {
      const std::size_t first = view.page_begin(p), n = view.tokens_in_page(p);
      int prio = min_priority;
      step_t used = 0;
      for (std::size_t i = first; i < first + n; ++i) {
        prio = std::max(prio, priority_[view.labels[i]]);
        used = std::max(used, last_refresh_[i]);
      }
      keys[p] = (static_cast<std::uint64_t>(prio) << 32) | used;
    }
    std::vector<std::uint64_t> sorted = keys;
    std::sort(sorted.begin(), sorted.end());
    sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
    for (std::size_t p = 0; p < keys.size(); ++p)
      out[p] = static_cast<Float>(std::lower_bound(sorted.begin(), sorted.end(), keys[p]) - sorted.begin());
  }
  [[nodiscard]] std::uint64_t digest() const noexcept {
    detail::fnv1a64 h;
    h.add(std::span<const step_t>(last_refresh_)).add(std::span<const int>(priority_)).add(threshold_);
    return h.value();
  }

  /// The snapshot's fields (io/snapshot.hpp): parameters (checked against the target's on load), then state.
  template <class Fields>
  void snapshot_fields(Fields& f) {
    f.param_list("priority", priority_);
    f.param("refresh_threshold", threshold_);
    f.column("last_refresh", last_refresh_, f.kv_len());
  }

 private:
  std::vector<int> priority_;
  double threshold_;
  std::vector<step_t> last_refresh_;
};

static_assert(eviction_policy<priority_lru<float>> && eviction_policy<priority_lru<double>>);

}  // namespace memdecay::policies

#endif  // MEMDECAY_POLICIES_PRIORITY_LRU_HPP
