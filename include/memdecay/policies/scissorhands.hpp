// SPDX-License-Identifier: Apache-2.0
// scissorhands policy: the persistence of importance over a history window.
//
// Source: Z. Liu et al., "Scissorhands: Exploiting the Persistence of Importance Hypothesis for LLM KV Cache
// Compression at Test Time", NeurIPS 2023. No official code; this follows the Cold Compress reimplementation
// (AnswerDotAI/cold-compress, cache.py, KVCacheScissorhands: attn_history_num / attn_history_denom over
// history_window_size observations, with attn_thresholding recording attn >= 1/n).
//
// An observation marks token i important when m_i >= 1/n (n = resident tokens; the uniform level). A token's
// signal is the fraction of its last min(observations, history_window) observations in which it was important;
// tokens not yet observed are kept. Pages holding one of the last `recent_tokens` tokens are kept. Page score:
// the mean fraction over its tokens.
//
// State per token: a 64-bit history mask and a saturating observation count (9 bytes). Cost: O(n) per
// observation, O(n) popcounts per score.
#ifndef MEMDECAY_POLICIES_SCISSORHANDS_HPP
#define MEMDECAY_POLICIES_SCISSORHANDS_HPP

#include <bit>
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
class scissorhands {
  static_assert(std::floating_point<Float>, "policies score in float or double");

 public:
  using float_type = Float;
  struct params_type {
    std::size_t history_window = 32;  ///< observations remembered per token, 1..64
    std::size_t recent_tokens = 0;    ///< pages holding one of the last recent_tokens tokens are kept
  };
  static constexpr std::string_view name = "scissorhands";

  scissorhands(const params_type& params, const config&, const region_table&)
      : window_(params.history_window), recent_tokens_(params.recent_tokens) {
    if (window_ == 0 || window_ > 64)
      detail::raise_config("scissorhands.history_window = " + detail::to_text(window_) + " (must be in [1, 64])");
    mask_ = window_ == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << window_) - 1;
  }

  /// The fraction of resident token i's remembered observations in which it was important (keep_score if none).
  [[nodiscard]] Float importance(std::size_t i) const noexcept {
    if (seen_[i] == 0) return policy_support::keep_score<Float>;
    return static_cast<Float>(std::popcount(history_[i] & mask_)) / static_cast<Float>(seen_[i]);
  }

  void reserve(std::size_t tokens) {
    detail::reserve_for_append(history_, tokens);
    detail::reserve_for_append(seen_, tokens);
  }
  void on_append(const sequence_view& view, std::size_t) noexcept {
    history_.resize(view.kv_len(), 0);
    seen_.resize(view.kv_len(), 0);
  }
  void check_observation(const sequence_view&, std::span<const Float>) const noexcept {}
  std::size_t on_observe(const sequence_view& view, std::span<const Float> mass) noexcept {
    const Float n = static_cast<Float>(view.kv_len());
    std::size_t important = 0;
    for (std::size_t i = 0; i < mass.size(); ++i) {
      const bool hit = mass[i] * n >= Float{1};  // m_i >= 1/n, without dividing
      history_[i] = (history_[i] << 1) | static_cast<std::uint64_t>(hit);
      if (seen_[i] < window_) ++seen_[i];
      important += hit;
    }
    return important;
  }
  void on_remove(const sequence_view& view, std::span<const std::size_t> pages) noexcept {
    policy_support::compact_token_column(history_, pages, view.page_size);
    policy_support::compact_token_column(seen_, pages, view.page_size);
  }
  void page_scores(const sequence_view& view, std::span<Float> out) const noexcept {
    policy_support::page_means<Float>(view, out, [&](std::size_t i) { return importance(i); });
    for (std::size_t p = policy_support::first_recent_page(view, recent_tokens_); p < view.num_pages(); ++p)
      out[p] = policy_support::keep_score<Float>;
  }
  [[nodiscard]] std::uint64_t digest() const noexcept {
    detail::fnv1a64 h;
    h.add(std::span<const std::uint64_t>(history_)).add(std::span<const std::uint8_t>(seen_));
    h.add(static_cast<std::uint64_t>(window_)).add(static_cast<std::uint64_t>(recent_tokens_));
    return h.value();
  }

  /// The snapshot's fields (io/snapshot.hpp): parameters (checked against the target's on load), then state.
  template <class Fields>
  void snapshot_fields(Fields& f) {
    f.param("history_window", window_);
    f.param("recent_tokens", recent_tokens_);
    f.column("history", history_, f.kv_len());
    f.column("seen", seen_, f.kv_len());
  }

 private:
  std::size_t window_;
  std::size_t recent_tokens_;
  std::uint64_t mask_ = 0;
  std::vector<std::uint64_t> history_;  ///< bit k: important k observations ago
  std::vector<std::uint8_t> seen_;      ///< observations remembered, up to window_
};

static_assert(eviction_policy<scissorhands<float>> && eviction_policy<scissorhands<double>>);

}  // namespace memdecay::policies

#endif  // MEMDECAY_POLICIES_SCISSORHANDS_HPP
