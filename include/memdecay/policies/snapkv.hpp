// SPDX-License-Identifier: Apache-2.0
// snapkv policy: votes from an observation window, pooled over neighbouring tokens.
//
// Source: Y. Li et al., "SnapKV: LLM Knows What You are Looking for Before Generation", NeurIPS 2024; reference
// implementation FasterDecoding/SnapKV, snapkv/monkeypatch/snapkv_utils.py (SnapKVCluster(window_size=64,
// max_capacity_prompt=256+64, kernel_size=5, pooling='avgpool')); OpenVINO GenAI seeds its scores the same way
// with snapkv_window_size=8.
//
// A token's vote is the sum of the mass it received in the last `window` observations (the reference sums the
// attention of the last window_size queries of the prompt). Votes are then pooled along the resident tokens with
// a centred kernel of `kernel_size` (avg: sum over the kernel / kernel_size, zero-padded like avg_pool1d; max),
// so the neighbours of a hit survive with it. Tokens appended since the last observation are kept (the
// reference keeps the observation window itself). Page score: the mean pooled vote. Meant for compression at the
// end of a prefill (observe the last queries, then select), and usable at decode.
//
// State per token: `window` masses (Float) and the observation count at append (u32). Cost: O(n) per
// observation, O(n * (window + kernel_size)) per score.
#ifndef MEMDECAY_POLICIES_SNAPKV_HPP
#define MEMDECAY_POLICIES_SNAPKV_HPP

#include <algorithm>
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
class snapkv {
  static_assert(std::floating_point<Float>, "policies score in float or double");

 public:
  using float_type = Float;
  enum class pooling : std::uint8_t { avg, max };
  struct params_type {
    std::size_t window = 8;       ///< observations that vote, >= 1
    std::size_t kernel_size = 5;  ///< odd; 1 disables pooling
    pooling pool = pooling::avg;
  };
  static constexpr std::string_view name = "snapkv";

  snapkv(const params_type& params, const config&, const region_table&)
      : window_(params.window), kernel_(params.kernel_size), pool_(params.pool) {
    if (window_ == 0 || window_ > 4096)
      detail::raise_config("snapkv.window = " + detail::to_text(window_) + " (must be in [1, 4096])");
    if (kernel_ % 2 == 0 || kernel_ > 4095)
      detail::raise_config("snapkv.kernel_size = " + detail::to_text(kernel_) + " (must be odd, at most 4095)");
    if (pool_ != pooling::avg && pool_ != pooling::max)
      detail::raise_config("snapkv.pool = " + detail::to_text(static_cast<int>(pool_)) + " (unknown pooling)");
  }

  /// The sum of resident token i's mass over the last `window` observations.
  [[nodiscard]] Float vote(std::size_t i) const noexcept {
    Float v = 0;
    for (std::size_t s = 0; s < window_; ++s) v += ring_[i * window_ + s];
    return v;
  }

  void reserve(std::size_t tokens) {
    detail::reserve_for_append(ring_, tokens * window_);
    detail::reserve_for_append(appended_at_, tokens);
  }
  void on_append(const sequence_view& view, std::size_t) noexcept {
    ring_.resize(view.kv_len() * window_, Float{0});
    appended_at_.resize(view.kv_len(), observations_);
  }
  void check_observation(const sequence_view&, std::span<const Float> mass) const {
    const std::size_t slot = observations_ % window_;
    for (std::size_t i = 0; i < mass.size(); ++i)
      if (!std::isfinite(vote(i) - ring_[i * window_ + slot] + mass[i]))
        detail::raise_input("attention[" + detail::to_text(i) + "] = " + detail::to_text(mass[i]) +
                            " overflows the window's vote");
  }
  std::size_t on_observe(const sequence_view&, std::span<const Float> mass) noexcept {
    const std::size_t slot = observations_ % window_;
    for (std::size_t i = 0; i < mass.size(); ++i) ring_[i * window_ + slot] = mass[i];
    ++observations_;
    return 0;
  }
  void on_remove(const sequence_view& view, std::span<const std::size_t> pages) noexcept {
    policy_support::compact_token_column(ring_, pages, view.page_size * window_);
    policy_support::compact_token_column(appended_at_, pages, view.page_size);
  }
  void page_scores(const sequence_view& view, std::span<Float> out) const {
    const std::size_t n = view.kv_len(), half = kernel_ / 2;
    std::vector<Float> votes(n), pooled(n);
    for (std::size_t i = 0; i < n; ++i) votes[i] = vote(i);
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t lo = i >= half ? i - half : 0, hi = std::min(n, i + half + 1);
      Float acc = pool_ == pooling::max ? votes[lo] : Float{0};
      for (std::size_t j = lo; j < hi; ++j) acc = pool_ == pooling::max ? std::max(acc, votes[j]) : acc + votes[j];
      pooled[i] = pool_ == pooling::max ? acc : acc / static_cast<Float>(kernel_);
      if (appended_at_[i] == observations_) pooled[i] = policy_support::keep_score<Float>;
    }
    policy_support::page_means<Float>(view, out, [&](std::size_t i) { return pooled[i]; });
  }
  [[nodiscard]] std::uint64_t digest() const noexcept {
    detail::fnv1a64 h;
    h.add(std::span<const Float>(ring_)).add(std::span<const std::uint32_t>(appended_at_)).add(observations_);
    h.add(static_cast<std::uint64_t>(window_)).add(static_cast<std::uint64_t>(kernel_)).add(pool_);
    return h.value();
  }

  /// The snapshot's fields (io/snapshot.hpp): parameters (checked against the target's on load), then state.
  template <class Fields>
  void snapshot_fields(Fields& f) {
    f.param("window", window_);
    f.param("kernel_size", kernel_);
    f.param("pooling", pool_);
    f.column("ring", ring_, f.kv_len() * window_);
    f.column("appended_at", appended_at_, f.kv_len());
    f.value("observations", observations_);
  }

 private:
  std::size_t window_, kernel_;
  pooling pool_;
  std::vector<Float> ring_;  ///< token-major: ring_[i * window_ + s], slot s = observation % window_
  std::vector<std::uint32_t> appended_at_;
  std::uint32_t observations_ = 0;
};

static_assert(eviction_policy<snapkv<float>> && eviction_policy<snapkv<double>>);

}  // namespace memdecay::policies

#endif  // MEMDECAY_POLICIES_SNAPKV_HPP
