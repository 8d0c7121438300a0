// SPDX-License-Identifier: Apache-2.0
// h2o policy: heavy hitters (cumulative attention) plus a recent window.
//
// Source: Z. Zhang et al., "H2O: Heavy-Hitter Oracle for Efficient Generative Inference of Large Language
// Models", NeurIPS 2023; reference implementation FMInference/H2O, h2o_hf/utils_real_drop/modify_llama.py
// (H2OKVCache_LayerWise: _update_hh_score sums attention into hh_score). hh_size=4, recent_size=512 are only that
// class's defaults: the published runs size both from the budget (`--heavy_ratio 0.1 --recent_ratio 0.1` in the
// repository's scripts and in every follow-up that reruns H2O), i.e. half the budget heavy hitters, half recent.
//
// Every observation adds the raw mass to each token's running sum (no decay, no normalisation, as in the
// reference: tokens that arrived early have had more chances to collect mass). A page scores the mean sum of its
// tokens; pages holding one of the last R tokens are kept, R = max(recent_tokens, floor(recent_fraction x B)) under
// a budget of B tokens (the config's upper watermark; recent_tokens alone when the budget is unlimited). The
// default, recent_fraction 0.5 and recent_tokens 0, is the source's heavy_ratio = recent_ratio: the recent half
// stays and the other half goes to the heaviest hitters. A fixed small window instead (recent_fraction 0) turns
// H2O into pure cumulative attention, which is known to be weak; a fixed large one into pure recency whenever the
// budget is below it.
//
// State per token: the cumulative mass (Float). Cost: O(n) per observation, O(n) per score.
#ifndef MEMDECAY_POLICIES_H2O_HPP
#define MEMDECAY_POLICIES_H2O_HPP

#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "memdecay/core/config.hpp"
#include "memdecay/detail/digest.hpp"
#include "memdecay/detail/growth.hpp"
#include "memdecay/detail/error.hpp"
#include "memdecay/core/policy.hpp"

namespace memdecay::policies {

template <class Float = float>
class h2o {
  static_assert(std::floating_point<Float>, "policies score in float or double");

 public:
  using float_type = Float;
  struct params_type {
    std::size_t recent_tokens = 0;  ///< a fixed recent window (recent_size), in tokens
    double recent_fraction =
        0.5;  ///< the recent window as a share of the token budget (recent_ratio / (heavy + recent))
  };
  static constexpr std::string_view name = "h2o";

  h2o(const params_type& params, const config& cfg, const region_table&)
      : recent_tokens_(params.recent_tokens), recent_fraction_(params.recent_fraction), budget_(cfg.budget) {
    if (!(recent_fraction_ >= 0.0 && recent_fraction_ <= 1.0))
      detail::raise_config("h2o.recent_fraction = " + detail::to_text(recent_fraction_) + " (must be in [0, 1])");
  }

  /// The recent window in tokens for a sequence whose logical length is `logical_len`.
  [[nodiscard]] std::size_t recent_window(std::size_t page_size, std::uint64_t logical_len) const noexcept {
    if (budget_.unit == budget_unit::unlimited || recent_fraction_ == 0.0) return recent_tokens_;
    const double b = static_cast<double>(budget_.in_tokens(page_size, logical_len).high);
    const double r = std::floor(recent_fraction_ * b);
    const std::size_t from_budget = r >= 1e18 ? std::size_t{1} << 60 : static_cast<std::size_t>(r);
    return from_budget > recent_tokens_ ? from_budget : recent_tokens_;
  }

  [[nodiscard]] std::span<const Float> cumulative() const noexcept { return sum_; }

  void reserve(std::size_t tokens) { detail::reserve_for_append(sum_, tokens); }
  void on_append(const sequence_view& view, std::size_t) noexcept { sum_.resize(view.kv_len(), Float{0}); }
  void check_observation(const sequence_view&, std::span<const Float> mass) const {
    policy_support::check_sum_stays_finite<Float>(sum_, mass, "the cumulative attention");
  }
  std::size_t on_observe(const sequence_view&, std::span<const Float> mass) noexcept {
    for (std::size_t i = 0; i < mass.size(); ++i) sum_[i] += mass[i];
    return 0;
  }
  void on_remove(const sequence_view& view, std::span<const std::size_t> pages) noexcept {
    policy_support::compact_token_column(sum_, pages, view.page_size);
  }
  void page_scores(const sequence_view& view, std::span<Float> out) const noexcept {
    policy_support::page_means<Float>(view, out, [&](std::size_t i) { return sum_[i]; });
    const std::uint64_t logical_len = view.kv_len() == 0 ? 0 : view.position_of(view.kv_len() - 1) + 1;
    const std::size_t recent = recent_window(view.page_size, logical_len);
    for (std::size_t p = policy_support::first_recent_page(view, recent); p < view.num_pages(); ++p)
      out[p] = policy_support::keep_score<Float>;
  }
  [[nodiscard]] std::uint64_t digest() const noexcept {
    detail::fnv1a64 h;
    h.add(std::span<const Float>(sum_)).add(static_cast<std::uint64_t>(recent_tokens_)).add(recent_fraction_);
    return h.value();
  }

  /// The snapshot's fields (io/snapshot.hpp): parameters (checked against the target's on load), then state.
  template <class Fields>
  void snapshot_fields(Fields& f) {
    f.param("recent_tokens", recent_tokens_);
    f.param("recent_fraction", recent_fraction_);
    f.column("sum", sum_, f.kv_len());
  }

 private:
  std::size_t recent_tokens_;
  double recent_fraction_;
  budget_config budget_;
  std::vector<Float> sum_;
};

static_assert(eviction_policy<h2o<float>> && eviction_policy<h2o<double>>);

}  // namespace memdecay::policies

#endif  // MEMDECAY_POLICIES_H2O_HPP
