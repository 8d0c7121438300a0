// SPDX-License-Identifier: Apache-2.0
// memdecay policy: the paper's method behind the policy interface.
//
// Source: V. Matam and K. Kim, "MemDecay: Region-aware KV cache eviction for efficient LLM agent inference",
// arXiv:2607.10582, 2026; no public reference implementation (memdecay::basic_sequence is this library's).
//
//     s_i = b_r * exp(-lambda_r * dt_i) + alpha * a_i,   a_i <- beta * a_i + (1 - beta) * x_i,
//     dt_i restarts when x_i > tau;   page score = mean of its tokens' scores.
//
// x_i is the observation normalised by config.normalization (config.hpp): none (x = m), uniform (x = n m),
// lifetime (x = n m, and a_i / (1 - beta^k_i) in the score) or zscore (x = (m - mean) / std). For none and
// uniform the observation is observe_tokens_reference and the scores come from the SIMD scorer that
// basic_sequence uses (simd::score_pages, bitwise equal to its fused pass), so this policy evicts exactly what
// memdecay::basic_sequence evicts on the same calls (tests/policy_sequence_test.cpp).
//
// State per token: last_refresh (u32), EWMA (Float), the observation count at append (u32). Cost: O(n) per
// observation, O(n) exp per score (vectorised).
#ifndef MEMDECAY_POLICIES_MEMDECAY_HPP
#define MEMDECAY_POLICIES_MEMDECAY_HPP

#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "memdecay/attention.hpp"
#include "memdecay/config.hpp"
#include "memdecay/detail/digest.hpp"
#include "memdecay/detail/sequence_rules.hpp"
#include "memdecay/ewma_tracker.hpp"
#include "memdecay/policy.hpp"
#include "memdecay/retention_score.hpp"
#include "memdecay/simd/score_kernel.hpp"

namespace memdecay::policies {

template <class Float = float>
class memdecay {
  static_assert(std::floating_point<Float>, "policies score in float or double");

 public:
  using float_type = Float;
  /// Everything comes from the config (alpha, ewma_beta / ewma_half_life, tau, normalization, regions).
  struct params_type {};
  static constexpr std::string_view name = "memdecay";

  memdecay(const params_type&, const config& cfg, const region_table& table)
      : mode_(cfg.normalization),
        alpha_(static_cast<Float>(cfg.alpha)),
        params_{static_cast<Float>(cfg.effective_beta()), static_cast<Float>(cfg.tau), Float{1}},
        lut_(table) {}

  [[nodiscard]] attention_normalization normalization() const noexcept { return mode_; }
  [[nodiscard]] std::span<const step_t> last_refresh() const noexcept { return last_refresh_; }
  [[nodiscard]] std::span<const Float> ewma() const noexcept { return ewma_; }
  /// Observations so far.
  [[nodiscard]] std::uint32_t observations() const noexcept { return observations_; }

  void reserve(std::size_t tokens) {
    last_refresh_.reserve(tokens);
    ewma_.reserve(tokens);
    appended_at_.reserve(tokens);
  }
  void on_append(const sequence_view& view, std::size_t first) noexcept {
    for (std::size_t i = first; i < view.kv_len(); ++i) {
      last_refresh_.push_back(view.now);
      ewma_.push_back(Float{0});
      appended_at_.push_back(observations_);
    }
  }
  void check_observation(const sequence_view& view, std::span<const Float> mass) const {
    if (mode_ != attention_normalization::zscore) {
      detail::check_scaled_finite(mass, normalization_scale<Float>(mode_, view.kv_len()));
    } else {
      const auto mo = moments_of(mass);
      if (!std::isfinite(mo.mean) || !std::isfinite(mo.stddev))
        detail::raise_input("attention overflows its z-score moments (mean " + detail::to_text(mo.mean) + ")");
    }
  }
  std::size_t on_observe(const sequence_view& view, std::span<const Float> mass) noexcept {
    ++observations_;
    if (mode_ == attention_normalization::zscore) {
      std::size_t refreshed = 0;
      const Float beta = params_.beta;
      const auto moments = moments_of(mass);
      for (std::size_t i = 0; i < mass.size(); ++i) {
        const Float x = zscore_of(mass[i], moments);
        ewma_[i] = beta * ewma_[i] + (Float{1} - beta) * x;
        if (x > params_.tau) {
          last_refresh_[i] = view.now;
          ++refreshed;
        }
      }
      return refreshed;
    }
    params_.scale = normalization_scale<Float>(mode_, view.kv_len());
    return observe_tokens_reference<Float>(std::span<Float>(ewma_), std::span<step_t>(last_refresh_), mass, view.now,
                                           params_);
  }
  void on_remove(const sequence_view& view, std::span<const std::size_t> pages) noexcept {
    policy_support::compact_token_column(last_refresh_, pages, view.page_size);
    policy_support::compact_token_column(ewma_, pages, view.page_size);
    policy_support::compact_token_column(appended_at_, pages, view.page_size);
  }

  /// The score terms of resident token `index` (the attention term after lifetime normalisation, if any), by
  /// the scalar reference formula: page_scores() uses the SIMD scorer, equal to within its documented error.
  [[nodiscard]] score_terms<Float> token_terms(const sequence_view& view, std::size_t index) const noexcept {
    return token_score_terms(*view.regions, view.labels[index], last_refresh_[index], view.now, alpha_,
                             attention(index));
  }
  void page_scores(const sequence_view& view, std::span<Float> out) const {
    if (mode_ != attention_normalization::lifetime) {
      score(view, ewma_.data(), out);
      return;
    }
    std::vector<Float> attended(ewma_.size());
    for (std::size_t i = 0; i < attended.size(); ++i) attended[i] = attention(i);
    score(view, attended.data(), out);
  }
  [[nodiscard]] std::uint64_t digest() const noexcept {
    detail::fnv1a64 h;
    h.add(std::span<const step_t>(last_refresh_))
        .add(std::span<const Float>(ewma_))
        .add(std::span<const std::uint32_t>(appended_at_))
        .add(observations_);
    return h.value();
  }

 private:
  /// out[p] = mean over page p of b_r exp(-lambda_r dt) + alpha a, with a from `attended` (per token).
  void score(const sequence_view& view, const Float* attended, std::span<Float> out) const noexcept {
    simd::score_pages(view.labels.data(), last_refresh_.data(), attended, view.kv_len(), view.page_size, view.now,
                      lut_, alpha_, out.data());
  }
  [[nodiscard]] Float attention(std::size_t i) const noexcept {
    if (mode_ != attention_normalization::lifetime) return ewma_[i];
    return lifetime_normalize(ewma_[i], params_.beta, observations_ - appended_at_[i]);
  }

  attention_normalization mode_;
  Float alpha_;
  observation_params<Float> params_;
  simd::region_lut<Float> lut_;  ///< the region table in the SIMD scorer's layout
  std::vector<step_t> last_refresh_;
  std::vector<Float> ewma_;
  std::vector<std::uint32_t> appended_at_;  ///< observations_ when the token was appended
  std::uint32_t observations_ = 0;
};

static_assert(eviction_policy<memdecay<float>> && eviction_policy<memdecay<double>>);

}  // namespace memdecay::policies

#endif  // MEMDECAY_POLICIES_MEMDECAY_HPP
