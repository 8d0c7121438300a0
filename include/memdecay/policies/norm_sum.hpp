// SPDX-License-Identifier: Apache-2.0
// norm_sum policy: cumulative attention divided by the token's lifetime in the cache (OpenVINO NORM_SUM).
//
// Source: OpenVINO GenAI cache eviction, src/cpp/include/openvino/genai/cache_eviction.hpp
// (CacheEvictionConfig(start_size=32, recent_size=128, max_cache_size=672, aggregation_mode=NORM_SUM)) and
// docs kvcache-eviction-algorithm.md; NORM_SUM divides the accumulated importance of each token by its lifetime
// in generated tokens, so early tokens are not favoured for having been scored more often (H2O's bias).
//
// Here lifetime counts the observations since the token was appended (with one observation per generated
// token, exactly the source's lifetime; with sparse observations, what the token could have collected).
// Tokens not yet observed are kept. OpenVINO's start and recent areas are config.protection (sink_pages,
// recent_tokens); its budget is config.budget. Page score: the mean over its tokens.
//
// State per token: the cumulative mass (Float) and the observation count at append (u32). Cost: O(n) per
// observation, O(n) per score.
#ifndef MEMDECAY_POLICIES_NORM_SUM_HPP
#define MEMDECAY_POLICIES_NORM_SUM_HPP

#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "memdecay/core/config.hpp"
#include "memdecay/detail/digest.hpp"
#include "memdecay/detail/error.hpp"
#include "memdecay/detail/growth.hpp"
#include "memdecay/core/policy.hpp"

namespace memdecay::policies {

template <class Float = float>
class norm_sum {
  static_assert(std::floating_point<Float>, "policies score in float or double");

 public:
  using float_type = Float;
  struct params_type {};
  static constexpr std::string_view name = "norm_sum";

  norm_sum(const params_type&, const config&, const region_table&) {}

  /// Cumulative mass of resident token i divided by its lifetime in observations (keep_score if none yet).
  [[nodiscard]] Float normalized(std::size_t i) const noexcept {
    const std::uint32_t lifetime = observations_ - appended_at_[i];
    return lifetime == 0 ? policy_support::keep_score<Float> : sum_[i] / static_cast<Float>(lifetime);
  }

  void reserve(std::size_t tokens) {
    detail::reserve_for_append(sum_, tokens);
    detail::reserve_for_append(appended_at_, tokens);
  }
  void on_append(const sequence_view& view, std::size_t) noexcept {
    sum_.resize(view.kv_len(), Float{0});
    appended_at_.resize(view.kv_len(), observations_);
  }
  void check_observation(const sequence_view&, std::span<const Float> mass) const {
    policy_support::check_sum_stays_finite<Float>(sum_, mass, "the cumulative attention");
  }
  std::size_t on_observe(const sequence_view&, std::span<const Float> mass) noexcept {
    ++observations_;
    for (std::size_t i = 0; i < mass.size(); ++i) sum_[i] += mass[i];
    return 0;
  }
  void on_remove(const sequence_view& view, std::span<const std::size_t> pages) noexcept {
    policy_support::compact_token_column(sum_, pages, view.page_size);
    policy_support::compact_token_column(appended_at_, pages, view.page_size);
  }
  void page_scores(const sequence_view& view, std::span<Float> out) const noexcept {
    policy_support::page_means<Float>(view, out, [&](std::size_t i) { return normalized(i); });
  }
  [[nodiscard]] std::uint64_t digest() const noexcept {
    detail::fnv1a64 h;
    h.add(std::span<const Float>(sum_)).add(std::span<const std::uint32_t>(appended_at_)).add(observations_);
    return h.value();
  }

  /// The snapshot's fields (io/snapshot.hpp): parameters (checked against the target's on load), then state.
  template <class Fields>
  void snapshot_fields(Fields& f) {
    f.column("sum", sum_, f.kv_len());
    f.column("appended_at", appended_at_, f.kv_len());
    f.value("observations", observations_);
  }

 private:
  std::vector<Float> sum_;
  std::vector<std::uint32_t> appended_at_;
  std::uint32_t observations_ = 0;
};

static_assert(eviction_policy<norm_sum<float>> && eviction_policy<norm_sum<double>>);

}  // namespace memdecay::policies

#endif  // MEMDECAY_POLICIES_NORM_SUM_HPP
