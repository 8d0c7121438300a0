// SPDX-License-Identifier: Apache-2.0
// memdecay policy: the paper's method behind the policy interface.
//
// Source: V. Matam and K. Kim, "MemDecay: Region-aware KV cache eviction for efficient LLM agent inference",
// arXiv:2607.10582, 2026; no public reference implementation (this header is this library's). It is the default
// policy of memdecay::basic_sequence, so memdecay::sequence is this policy under the one evictor.
//
//     s_i = b_r * exp(-lambda_r * dt_i) + alpha * a_i,   a_i <- beta * a_i + (1 - beta) * x_i,
//     dt_i restarts when x_i > tau;   page score = mean of its tokens' scores.
//
// x_i is the observation normalised by config.normalization (config.hpp): none (x = m), uniform (x = n m),
// lifetime (x = n m, and a_i / (1 - beta^k_i) in the score) or zscore (x = (m - mean) / std). The scalar
// specification is observe_tokens_reference (ewma_tracker.hpp) and page_scores_reference (eviction.hpp) over a
// token_state; the SIMD kernels match it within the tolerance stated in docs/simd.md (tests sweep both).
//
// Observation: where the isa fuses multiply-adds (simd::fused_observation_exact), one sweep applies it (EWMA by
// ewma_step's single rounding, refresh clocks, the refreshed tokens' exp-free weights) and writes the page scores
// of the new state, which select() then reuses; its EWMA and clocks are bitwise the reference's, so ranks that
// replay the reference agree bit for bit. Elsewhere the reference loop runs, then a score pass.
//
// Scorer: the exp-free kernel (simd/expfree.hpp: a decay term is a per-step region factor times a per-token
// weight; no exponential per token except at a rebase every floor(40 / max lambda_r) steps) by default when the
// region table is in its domain, else the polynomial-exp kernel (params_type::exp_free_scores = false, or
// use_expfree_scores(false), forces the latter). The exp-free weights follow the clock through the optional
// on_advance hook (policy.hpp), which basic_sequence calls on every advance_to; a driver that does not call it
// gets the polynomial kernel's scores whenever the clock has moved.
//
// State per token: last_refresh (u32), EWMA (Float), the observation count at append (u32), the exp-free weight
// (Float). Cost: O(n) per observation (one fused sweep that also leaves the page scores for select), O(n)
// multiply-adds per score, one exp per token every floor(40 / max lambda_r) steps.
#ifndef MEMDECAY_POLICIES_MEMDECAY_HPP
#define MEMDECAY_POLICIES_MEMDECAY_HPP

#include <algorithm>
#include <array>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "memdecay/detail/column_vector.hpp"
#include "memdecay/core/attention.hpp"
#include "memdecay/core/config.hpp"
#include "memdecay/detail/digest.hpp"
#include "memdecay/detail/growth.hpp"
#include "memdecay/core/sequence_rules.hpp"
#include "memdecay/core/eviction.hpp"
#include "memdecay/core/ewma_tracker.hpp"
#include "memdecay/core/policy.hpp"
#include "memdecay/core/retention_score.hpp"
#include "memdecay/simd/expfree.hpp"
#include "memdecay/simd/mass_check.hpp"
#include "memdecay/simd/score_kernel.hpp"

namespace memdecay {

/// One region's share of a page's score: the sums over its tokens divided by the page's token count, so the
/// shares of all regions add up to the page score.
template <std::floating_point Float>
struct region_contribution {
  region_id region;
  std::size_t tokens;
  score_terms<Float> terms;
};

/// Why a page scores what it scores under policies::memdecay (for logs and the demo; not on the hot path).
template <std::floating_point Float>
struct page_explanation {
  std::size_t page;              ///< logical index in the resident layout
  std::uint64_t first_position;  ///< absolute position of its first token
  std::size_t tokens;
  page_status status;
  score_terms<Float> terms;  ///< mean decay and attention terms; terms.total() is the page score
  std::vector<region_contribution<Float>> by_region;  ///< ascending region id
};

}  // namespace memdecay

namespace memdecay::policies {

template <class Float = float>
class memdecay {
  static_assert(std::floating_point<Float>, "policies score in float or double");

 public:
  using float_type = Float;
  /// Everything else comes from the config (alpha, ewma_beta / ewma_half_life, tau, normalization, regions).
  /// How a page's score comes from its tokens' scores.
  enum class page_aggregation : std::uint8_t {
    mean,  ///< the paper's rule: the mean of its tokens (the SIMD scorer's fused path)
    max,   ///< its best token: a page goes only when none of its tokens is worth keeping; a fact of two tokens
           ///< among fourteen idle ones keeps its page (scalar reference path, one exp per token per selection)
  };
  struct params_type {
    /// Score with the exp-free kernel when the region table allows it (use_expfree_scores).
    bool exp_free_scores = true;
    page_aggregation aggregation = page_aggregation::mean;
  };
  static constexpr std::string_view name = "memdecay";

  memdecay(const params_type& params, const config& cfg, const region_table& table)
      : mode_(cfg.normalization),
        alpha_(static_cast<Float>(cfg.alpha)),
        params_{static_cast<Float>(cfg.effective_beta()), static_cast<Float>(cfg.tau), Float{1}},
        lut_(table),
        clock_(lut_),
        aggregation_(params.aggregation) {
    clock_.set(0, 0);
    expfree_ = params.exp_free_scores && clock_.usable();
  }

  [[nodiscard]] attention_normalization normalization() const noexcept { return mode_; }
  [[nodiscard]] std::span<const step_t> last_refresh() const noexcept { return last_refresh_; }
  [[nodiscard]] std::span<const Float> ewma() const noexcept { return ewma_; }
  /// Observations so far.
  [[nodiscard]] std::uint32_t observations() const noexcept { return observations_; }
  /// Whether scores come from the exp-free kernel (params_type::exp_free_scores and the region table's domain).
  [[nodiscard]] bool expfree_scores() const noexcept { return expfree_; }
  /// Whether the exp-free kernel can score this region table at all (use_expfree_scores(true) would take it).
  [[nodiscard]] bool expfree_available() const noexcept { return clock_.usable(); }

  void reserve(std::size_t tokens) {
    detail::reserve_for_append(last_refresh_, tokens);
    detail::reserve_for_append(ewma_, tokens);
    detail::reserve_for_append(appended_at_, tokens);
    if (expfree_) detail::reserve_for_append(weights_, tokens);
    // The fused observation writes the page scores here; a page holds at least one token.
    detail::reserve_for_append(scores_, tokens);
  }
  void on_append(const sequence_view& view, std::size_t first) noexcept {
    for (std::size_t i = first; i < view.kv_len(); ++i) {
      last_refresh_.push_back(view.now);
      ewma_.push_back(Float{0});
      appended_at_.push_back(observations_);
    }
    if (expfree_) {
      weights_.resize(view.kv_len());  // within the reserved capacity
      simd::refresh_weights(view.labels.data(), first, view.kv_len(), clock_, weights_.data());
    }
    scores_valid_ = false;
  }
  /// The clock moved to view.now (basic_sequence::advance_to): the exp-free factors follow, rebasing the
  /// weights when the clock has run floor(40 / max lambda_r) steps past the epoch.
  /// The only column on_advance rewrites (on a rebase): an incremental manager snapshot saves it with the scalars.
  static constexpr std::array<std::string_view, 1> advance_columns = {"weights"};
  /// Returns whether a per-token column changed (the exp-free weights, on a rebase); otherwise only scalars did.
  bool on_advance(const sequence_view& view) noexcept {
    scores_valid_ = false;
    if (!expfree_) return false;
    return simd::advance_expfree(view.labels.data(), last_refresh_.data(), view.kv_len(), view.now, clock_,
                                 weights_.data());
  }
  /// Chooses the scorer (see the top of this file): on, the exp-free kernel whenever the region table is inside
  /// its domain; off, the polynomial-exp kernel. Returns whether the exp-free kernel is now in use. The two agree
  /// to within the scorer's tolerance (docs/simd.md), not bit for bit. Strong guarantee (the weights allocate).
  bool use_expfree_scores(const sequence_view& view, bool on) {
    if (on && clock_.usable()) {
      detail::column_vector<Float, 2> w(view.kv_len());
      simd::reset_expfree(view.labels.data(), last_refresh_.data(), view.kv_len(), view.now, clock_, w.data());
      weights_ = std::move(w);
      expfree_ = true;
    } else {
      expfree_ = false;
      weights_ = {};
    }
    scores_valid_ = false;  // cached scores came from the other kernel
    return expfree_;
  }
  /// The evictor's fast path: true when `mass` (one entry per resident token) is finite, non-negative and stays
  /// finite once normalised, checked in one branch-free pass; false sends the evictor to the checks that name the
  /// bad entry (validate_mass, then check_observation).
  [[nodiscard]] bool observation_is_valid(const sequence_view& view, std::span<const Float> mass) const noexcept {
    return mode_ != attention_normalization::zscore &&
           simd::mass_is_valid(mass.data(), mass.size(), normalization_scale<Float>(mode_, view.kv_len()));
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
    scores_valid_ = false;
    const bool expfree = expfree_ && clock_.now() == view.now;
    if (mode_ == attention_normalization::zscore) {
      std::size_t refreshed = 0;
      const auto moments = moments_of(mass);
      for (std::size_t i = 0; i < mass.size(); ++i) {
        const Float x = zscore_of(mass[i], moments);
        ewma_[i] = ewma_step(ewma_[i], x, params_.beta);
        if (x > params_.tau) {
          last_refresh_[i] = view.now;
          ++refreshed;
        }
      }
      if (expfree) simd::sync_weights(view.labels.data(), last_refresh_.data(), view.kv_len(), clock_, weights_.data());
      return refreshed;
    }
    params_.scale = normalization_scale<Float>(mode_, view.kv_len());
    const bool fused = fuses_scores(view);
    const std::size_t refreshed = observe_range(view, 0, view.kv_len(), mass.data(), expfree, fused);
    if (fused) keep_scores(view);
    return refreshed;
  }

  /// Tokens per block of on_observe_blocks: a buffer of this many masses stays in the L1 cache.
  static constexpr std::size_t observe_block_tokens = 2048;
  /// Whether on_observe_blocks takes an observation of `view`: every normalisation but zscore (whose moments need
  /// the whole observation first), pages of at most observe_block_tokens.
  [[nodiscard]] bool observes_in_blocks(const sequence_view& view) const noexcept {
    return mode_ != attention_normalization::zscore && view.page_size <= observe_block_tokens;
  }
  /// The factor an observation is checked at (observation_is_valid): every mass times it must stay finite.
  [[nodiscard]] Float observation_scale(const sequence_view& view) const noexcept {
    return normalization_scale<Float>(mode_, view.kv_len());
  }
  /// on_observe(view, mass) with the mass handed over a block at a time: fill(begin, count, out) writes the masses
  /// of tokens [begin, begin + count) to out (count <= observe_block_tokens; begin a multiple of the page size),
  /// and the observation runs on them while they are in the cache. The same state, bit for bit, as on_observe of
  /// the whole mass (every token's update is its own; a block ends on a page boundary, so each page score is one
  /// block's). Only when observes_in_blocks(view); `fill` must not throw.
  template <class Fill>
  std::size_t on_observe_blocks(const sequence_view& view, Fill&& fill) noexcept {
    ++observations_;
    scores_valid_ = false;
    const bool expfree = expfree_ && clock_.now() == view.now;
    params_.scale = normalization_scale<Float>(mode_, view.kv_len());
    const bool fused = fuses_scores(view);
    const std::size_t n = view.kv_len();
    const std::size_t block = observe_block_tokens / view.page_size * view.page_size;
    alignas(64) std::array<Float, observe_block_tokens> buffer;
    std::size_t refreshed = 0;
    for (std::size_t begin = 0; begin < n; begin += block) {
      const std::size_t count = std::min(block, n - begin);
      fill(begin, count, buffer.data());
      refreshed += observe_range(view, begin, count, buffer.data(), expfree, fused);
    }
    if (fused) keep_scores(view);
    return refreshed;
  }
  void on_remove(const sequence_view& view, std::span<const std::size_t> pages) noexcept {
    policy_support::compact_token_column(last_refresh_, pages, view.page_size);
    policy_support::compact_token_column(ewma_, pages, view.page_size);
    policy_support::compact_token_column(appended_at_, pages, view.page_size);
    if (expfree_) policy_support::compact_token_column(weights_, pages, view.page_size);
    scores_valid_ = false;
  }

  /// The score terms of resident token `index` (the attention term after lifetime normalisation, if any), by
  /// the scalar reference formula: page_scores() uses the SIMD scorer, equal to within its documented error.
  [[nodiscard]] score_terms<Float> token_terms(const sequence_view& view, std::size_t index) const noexcept {
    return token_score_terms(*view.regions, view.labels[index], last_refresh_[index], view.now, alpha_,
                             attention(index));
  }
  /// The score of page `page` (status as the evictor computed it) broken down by term and region, by the scalar
  /// reference formula.
  [[nodiscard]] page_explanation<Float> explain_page(const sequence_view& view, std::size_t page,
                                                     page_status status) const {
    page_explanation<Float> e{page, view.position_of(view.page_begin(page)), view.tokens_in_page(page), status, {}, {}};
    std::vector<region_contribution<Float>> acc(view.regions->size());
    for (std::size_t r = 0; r < acc.size(); ++r) acc[r].region = static_cast<region_id>(r);
    const Float inv_n = Float{1} / static_cast<Float>(e.tokens);
    for (std::size_t i = view.page_begin(page); i < view.page_begin(page) + e.tokens; ++i) {
      const auto t = token_terms(view, i);
      auto& a = acc[view.labels[i]];
      ++a.tokens;
      a.terms.decay += t.decay * inv_n;
      a.terms.attention += t.attention * inv_n;
      e.terms.decay += t.decay * inv_n;
      e.terms.attention += t.attention * inv_n;
    }
    for (const auto& a : acc)
      if (a.tokens) e.by_region.push_back(a);
    return e;
  }
  /// The page scores the fused observation left, if nothing moved since (the hooks clear scores_valid_; the step
  /// and the token count also guard a copy of the policy that a driver keeps while the original moves on); empty
  /// otherwise. A selection reads them in place.
  [[nodiscard]] std::span<const Float> cached_page_scores(const sequence_view& view) const noexcept {
    if (scores_valid_ && scores_step_ == view.now && scores_tokens_ == view.kv_len() &&
        scores_.size() == view.num_pages())
      return scores_;
    return {};
  }
  void page_scores(const sequence_view& view, std::span<Float> out) const {
    if (const auto cached = cached_page_scores(view); !cached.empty() && cached.size() == out.size()) {
      std::copy(cached.begin(), cached.end(), out.begin());
      return;
    }
    if (aggregation_ == page_aggregation::max) {
      for (std::size_t p = 0; p < view.num_pages(); ++p) {
        Float best = -std::numeric_limits<Float>::infinity();
        for (std::size_t i = view.page_begin(p); i < view.page_begin(p) + view.tokens_in_page(p); ++i)
          best = std::max(best, token_terms(view, i).total());
        out[p] = best;
      }
      return;
    }
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
        .add(observations_)
        .add(static_cast<std::uint8_t>(aggregation_));
    return h.value();
  }

  /// The snapshot's fields (io/snapshot.hpp): parameters (checked against the target's on load), then state.
  /// The exp-free weights, the clock's epoch and the page-score cache are saved too, so that a loaded sequence
  /// scores bit for bit as the saved one (recomputing them would agree only to within the scorer's tolerance).
  template <class Fields>
  void snapshot_fields(Fields& f) {
    f.param("aggregation", aggregation_);
    f.value("expfree", expfree_);
    if constexpr (Fields::loading)
      if (expfree_ && !clock_.usable()) f.fail("expfree", "set, but the region table is outside the exp-free domain");
    step_t epoch = clock_.epoch(), now = clock_.now();
    f.value("clock_epoch", epoch);
    f.value("clock_now", now);
    if constexpr (Fields::loading) {
      if (now < epoch || now - epoch > clock_.span())
        f.fail("clock_now", detail::to_text(now) + " with epoch " + detail::to_text(epoch) +
                                " (must be within the clock's span after the epoch)");
      clock_.set(epoch, now);
    }
    f.value("scale", params_.scale);
    f.column("last_refresh", last_refresh_, f.kv_len());
    f.column("ewma", ewma_, f.kv_len());
    f.column("appended_at", appended_at_, f.kv_len());
    f.value("observations", observations_);
    f.column("weights", weights_, expfree_ ? f.kv_len() : 0);
    f.value("scores_valid", scores_valid_);
    f.value("scores_step", scores_step_);
    f.value("scores_tokens", scores_tokens_);
    detail::column_vector<Float> cached;  // the cache only while it is valid (a stale one is never read)
    if constexpr (!Fields::loading)
      if (scores_valid_) cached = scores_;
    f.column_with_infinities("scores", cached, scores_valid_ ? f.num_pages() : 0);
    if constexpr (Fields::loading) scores_ = std::move(cached);
  }

 private:
  // Whether an observation also leaves the page scores (one sweep of the fused kernels): where the isa fuses
  // multiply-adds, not for lifetime (its attention term needs the observation count) nor max pages, and only
  // within the cache's capacity (a copy of the policy may hold less than reserve() left: then nothing allocates).
  [[nodiscard]] bool fuses_scores([[maybe_unused]] const sequence_view& view) noexcept {
    if constexpr (simd::fused_observation_exact) {
      if (mode_ != attention_normalization::lifetime && aggregation_ == page_aggregation::mean &&
          scores_.capacity() >= view.num_pages()) {
        scores_.resize(view.num_pages());  // within the capacity: cannot throw
        return true;
      }
    }
    return false;
  }
  void keep_scores(const sequence_view& view) noexcept {
    scores_valid_ = true;
    scores_step_ = view.now;
    scores_tokens_ = view.kv_len();
  }
  // The observation of tokens [begin, begin + count) (begin on a page boundary), params_.scale already set.
  std::size_t observe_range(const sequence_view& view, std::size_t begin, std::size_t count, const Float* mass,
                            bool expfree, [[maybe_unused]] bool fused) noexcept {
    if constexpr (simd::fused_observation_exact) {
      if (fused) {
        Float* scores = scores_.data() + begin / view.page_size;
        return expfree ? simd::observe_and_score_expfree(view.labels.data() + begin, last_refresh_.data() + begin,
                                                         weights_.data() + begin, ewma_.data() + begin, mass, count,
                                                         view.page_size, clock_, params_, alpha_, scores)
                       : simd::observe_and_score(view.labels.data() + begin, last_refresh_.data() + begin,
                                                 ewma_.data() + begin, mass, count, view.page_size, view.now,
                                                 params_, lut_, alpha_, scores);
      }
    }
    const std::size_t refreshed = observe_tokens_reference<Float>(std::span<Float>(ewma_).subspan(begin, count),
                                                                  std::span<step_t>(last_refresh_).subspan(begin, count),
                                                                  std::span<const Float>(mass, count), view.now, params_);
    if (expfree)
      simd::sync_weights(view.labels.data() + begin, last_refresh_.data() + begin, count, clock_,
                         weights_.data() + begin);
    return refreshed;
  }

  /// out[p] = mean over page p of b_r exp(-lambda_r dt) + alpha a, with a from `attended` (per token): the
  /// exp-free kernel while its clock is at view.now, else the polynomial one.
  void score(const sequence_view& view, const Float* attended, std::span<Float> out) const noexcept {
    if (expfree_ && clock_.now() == view.now)
      simd::score_pages_expfree(view.labels.data(), weights_.data(), attended, view.kv_len(), view.page_size, clock_,
                                alpha_, out.data());
    else
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
  simd::region_lut<Float> lut_;       ///< the region table in the SIMD scorer's layout
  simd::expfree_clock<Float> clock_;  ///< exp-free factors at the last on_advance step
  bool expfree_ = false;              ///< scores from the exp-free kernel
  detail::column_vector<Float, 2> weights_;  ///< exp-free w_i, one per resident token
  page_aggregation aggregation_;
  detail::column_vector<Float> scores_;  ///< page scores left by the last fused observation ...
  bool scores_valid_ = false;  ///< ... valid until the next hook, for this step and token count
  step_t scores_step_ = 0;
  std::size_t scores_tokens_ = 0;
  detail::column_vector<step_t, 1> last_refresh_;
  detail::column_vector<Float, 3> ewma_;
  std::vector<std::uint32_t> appended_at_;  ///< observations_ when the token was appended
  std::uint32_t observations_ = 0;
};

static_assert(eviction_policy<memdecay<float>> && eviction_policy<memdecay<double>>);

}  // namespace memdecay::policies

#endif  // MEMDECAY_POLICIES_MEMDECAY_HPP
