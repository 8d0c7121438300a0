// SPDX-License-Identifier: Apache-2.0
// h2o policy: heavy hitters (cumulative attention) plus a recent window.
//
// Source: Z. Zhang et al., "H2O: Heavy-Hitter Oracle for Efficient Generative Inference of Large Language
// Models", NeurIPS 2023; reference implementation FMInference/H2O, h2o_hf/utils_real_drop/modify_llama.py
// (H2OKVCache_LayerWise(hh_size=4, recent_size=512): _update_hh_score sums attention into hh_score).
//
// Every observation adds the raw mass to each token's running sum (no decay, no normalisation, as in the
// reference: tokens that arrived early have had more chances to collect mass). A page scores the mean sum of its
// tokens; pages holding one of the last `recent_tokens` tokens are kept. Under a budget of B tokens the recent
// window stays and the rest goes to the heaviest hitters.
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

#include "memdecay/config.hpp"
#include "memdecay/detail/digest.hpp"
#include "memdecay/detail/growth.hpp"
#include "memdecay/detail/error.hpp"
#include "memdecay/policy.hpp"

namespace memdecay::policies {

template <class Float = float>
class h2o {
  static_assert(std::floating_point<Float>, "policies score in float or double");

 public:
  using float_type = Float;
  struct params_type {
    std::size_t recent_tokens = 512;  ///< recent_size: pages holding one of the last recent_tokens are kept
  };
  static constexpr std::string_view name = "h2o";

  h2o(const params_type& params, const config&, const region_table&) : recent_tokens_(params.recent_tokens) {}

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
    for (std::size_t p = policy_support::first_recent_page(view, recent_tokens_); p < view.num_pages(); ++p)
      out[p] = policy_support::keep_score<Float>;
  }
  [[nodiscard]] std::uint64_t digest() const noexcept {
    detail::fnv1a64 h;
    h.add(std::span<const Float>(sum_)).add(static_cast<std::uint64_t>(recent_tokens_));
    return h.value();
  }

 private:
  std::size_t recent_tokens_;
  std::vector<Float> sum_;
};

static_assert(eviction_policy<h2o<float>> && eviction_policy<h2o<double>>);

}  // namespace memdecay::policies

#endif  // MEMDECAY_POLICIES_H2O_HPP
