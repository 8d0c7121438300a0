// SPDX-License-Identifier: Apache-2.0
// memdecay: one sequence under the MemDecay policy: labels, clock, attention, scores, selection and commit.
//
//   memdecay::sequence seq(cfg);                 // validates cfg (config_error)
//   seq.append(memdecay::regions::system, 120);  // label tokens as they enter the KV cache
//   seq.advance_to(step);                        // the engine's logical clock
//   seq.observe_tokens(mass);                    // optional: attention per resident token (or per page, or heads)
//   auto plan = seq.select_for_budget();         // phase 1: pure, changes nothing
//   /* the engine applies plan.pages to its KV cache */
//   seq.commit(plan, table, id);                 // phase 2: page table and state compact together
//
// Every call validates its input first and either fully applies or throws and changes nothing.
#ifndef MEMDECAY_SEQUENCE_HPP
#define MEMDECAY_SEQUENCE_HPP

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <Eigen/Core>

#include "memdecay/attention.hpp"
#include "memdecay/config.hpp"
#include "memdecay/detail/error.hpp"
#include "memdecay/detail/growth.hpp"
#include "memdecay/detail/sequence_rules.hpp"
#include "memdecay/eviction.hpp"
#include "memdecay/ewma_tracker.hpp"
#include "memdecay/page_table.hpp"
#include "memdecay/region.hpp"
#include "memdecay/retention_score.hpp"
#include "memdecay/sequence_state.hpp"
#include "memdecay/simd/expfree.hpp"
#include "memdecay/simd/score_kernel.hpp"
#include "memdecay/simd/select.hpp"

namespace memdecay {

/// One region's share of a page's score: the sums over its tokens divided by the page's token count, so the
/// shares of all regions add up to the page score.
template <std::floating_point Float>
struct region_contribution {
  region_id region;
  std::size_t tokens;
  score_terms<Float> terms;
};

/// Why a page scores what it scores (for logs and the demo; not on the hot path).
template <std::floating_point Float>
struct page_explanation {
  std::size_t page;                 ///< logical index in the resident layout
  std::uint64_t first_position;     ///< absolute position of its first token
  std::size_t tokens;
  page_status status;
  score_terms<Float> terms;         ///< mean decay and attention terms; terms.total() is the page score
  std::vector<region_contribution<Float>> by_region;  ///< ascending region id
};

/// A sequence under the MemDecay policy. Float is the score type (float or double); PageSize a compile-time page
/// size, or dynamic_page_size to take config::page_size at run time.
template <std::floating_point Float = float, std::size_t PageSize = dynamic_page_size>
class basic_sequence {
 public:
  using float_type = Float;
  using state_type = sequence_state<Float, PageSize>;
  using plan_type = eviction_plan<Float>;

  /// Validates `cfg` (config_error naming the field) and starts an empty sequence at step 0.
  explicit basic_sequence(config cfg) : config_(validated(std::move(cfg))), regions_(config_.effective_regions()),
                                        state_(config_.page_size), lut_(regions_), clock_(lut_) {
    alpha_ = static_cast<Float>(config_.alpha);
    params_.beta = static_cast<Float>(config_.effective_beta());
    params_.tau = static_cast<Float>(config_.tau);
    clock_.set(0, 0);
    expfree_ = clock_.usable();  // the exp-free scorer by default, inside its domain (use_expfree_scores)
  }

  // --- read-only views ---------------------------------------------------------------------------------------
  [[nodiscard]] const config& get_config() const noexcept { return config_; }
  /// The region table in effect (config.regions with config.region_overrides applied).
  [[nodiscard]] const region_table& regions() const noexcept { return regions_; }
  [[nodiscard]] const state_type& state() const noexcept { return state_; }
  [[nodiscard]] std::size_t page_size() const noexcept { return state_.page_size(); }
  [[nodiscard]] std::size_t kv_len() const noexcept { return state_.kv_len(); }
  [[nodiscard]] std::size_t num_pages() const noexcept { return state_.num_pages(); }
  [[nodiscard]] std::uint64_t logical_len() const noexcept { return state_.logical_len(); }
  [[nodiscard]] std::uint64_t evicted_tokens() const noexcept { return state_.evicted_tokens(); }
  [[nodiscard]] step_t now() const noexcept { return state_.now(); }
  [[nodiscard]] std::uint64_t position_of(std::size_t index) const noexcept { return state_.position_of(index); }
  [[nodiscard]] std::vector<std::uint64_t> positions() const { return state_.positions(); }
  [[nodiscard]] std::optional<std::uint64_t> prefix_cache_boundary() const noexcept {
    return state_.prefix_cache_boundary();
  }
  [[nodiscard]] std::uint64_t digest() const noexcept { return state_.digest(); }

  // --- labels ------------------------------------------------------------------------------------------------
  /// Appends `count` tokens of region `r`. input_error for an unknown region.
  void append(region_id r, std::size_t count = 1) {
    const region_span span{r, count};
    append(std::span<const region_span>(&span, 1));
  }
  /// Appends run-length spans. input_error (appending nothing) if any span names an unknown region.
  void append(std::span<const region_span> spans) {
    detail::check_region_spans(regions_, spans);
    std::size_t total = 0;
    for (const auto& s : spans) total += s.count;
    reserve_weights(total);  // may throw: nothing changed so far
    state_.append(spans);
    append_weights();
  }
  /// Appends one token per label. input_error (appending nothing) if any label is an unknown region.
  void append_tokens(std::span<const region_id> labels) {
    detail::check_region_labels(regions_, labels);
    reserve_weights(labels.size());
    state_.append(labels);
    append_weights();
  }

  // --- clock -------------------------------------------------------------------------------------------------
  /// Moves the logical clock forward (input_error if backwards). Decay follows the clock, observed or not.
  void advance_to(step_t step) {
    state_.advance_to(step);
    if (expfree_) simd::advance_expfree(state_, clock_, std::span<Float>(weights_));
  }

  // --- attention ---------------------------------------------------------------------------------------------
  /// Observes per-token mass over the resident tokens, in page order. Returns how many tokens were refreshed.
  /// input_error (changing nothing) on a wrong length or a NaN, infinite or negative mass.
  std::size_t observe_tokens(std::span<const Float> mass) {
    // One branch-free pass with the normalisation scale answers both checks when all is valid; otherwise the two
    // scalar checks run, in this order, to name the first bad entry.
    if (mass.size() != kv_len() ||
        !simd::mass_is_valid(mass.data(), mass.size(), normalization_scale<Float>(config_.normalization, kv_len()))) {
      validate_mass(mass, kv_len(), "per-token attention");
      check_normalised_finite(mass);
    }
    return apply(mass);
  }
  /// Observes per-page mass (length num_pages()); each page's mass is shared evenly among its resident tokens.
  std::size_t observe_pages(std::span<const Float> page_mass) {
    validate_mass(page_mass, num_pages(), "per-page attention");
    const auto per_token = detail::spread_page_mass(state_, page_mass);
    check_normalised_finite(per_token);
    return apply(per_token);
  }
  /// Observes a heads x tokens matrix, reduced by sum or mean over heads.
  template <class Derived>
  std::size_t observe_heads(const Eigen::MatrixBase<Derived>& heads_by_tokens, head_reduction how) {
    static_assert(std::is_same_v<typename Derived::Scalar, Float>, "matrix scalar must match the score type");
    const auto mass = reduce_heads(heads_by_tokens, how);
    return observe_tokens(mass);
  }
  /// Observes layers x heads x tokens (a range of heads x tokens matrices), reduced by sum or mean.
  template <std::ranges::forward_range Layers>
  std::size_t observe_layers(const Layers& layers, head_reduction how) {
    const auto mass = reduce_layers(layers, how);
    return observe_tokens(std::span<const Float>(mass));
  }

  // --- scores ------------------------------------------------------------------------------------------------
  /// Chooses the scorer. On (the default): the exp-free kernel (simd/expfree.hpp: a decay term is a per-step
  /// region factor times a per-token weight kept beside the state; no exponential per token except at a rebase
  /// every floor(40 / max lambda_r) steps), whenever the region table is inside the exp-free domain
  /// (expfree_clock::usable()); off: the polynomial-exp kernel (simd/score_kernel.hpp). Returns whether the
  /// exp-free kernel is now in use. Exp-free decay terms are within 1.5 ulp of their exact value (float;
  /// docs/simd.md), the polynomial kernel's within 2 ulp: the two agree to within the scorer's tolerance, not bit
  /// for bit, so switching may change a victim where two pages' scores are that close.
  /// policy_sequence<policies::memdecay> makes the same choice (params_type::exp_free_scores) and then evicts
  /// exactly what this class evicts. Costs one Float per resident token. Strong guarantee.
  bool use_expfree_scores(bool on = true) {
    if (on && clock_.usable()) {
      weights_.resize(kv_len());
      simd::reset_expfree(state_, clock_, std::span<Float>(weights_));
      expfree_ = true;
    } else {
      expfree_ = false;
      weights_ = {};
    }
    scores_generation_ = ~std::uint64_t{0};  // cached scores came from the other kernel
    return expfree_;
  }
  /// Whether page scores come from the exp-free kernel (use_expfree_scores()).
  [[nodiscard]] bool expfree_scores() const noexcept { return expfree_; }
  /// The score terms of resident token `index`.
  [[nodiscard]] score_terms<Float> token_terms(std::size_t index) const noexcept {
    return token_score_terms(regions_, state_.regions()[index], state_.last_refresh()[index], now(), alpha_,
                             state_.ewma()[index]);
  }
  /// Writes every page's score into `out` (length num_pages(); input_error otherwise).
  void page_scores(std::span<Float> out) const {
    if (out.size() != num_pages())
      detail::raise_input("page_scores output has " + detail::to_text(out.size()) + " entries, expected " +
                          detail::to_text(num_pages()));
    fill_page_scores(out);
  }
  [[nodiscard]] std::vector<Float> page_scores() const {
    std::vector<Float> out(num_pages());
    fill_page_scores(std::span<Float>(out));
    return out;
  }
  /// Every page's status under the config's protections and the caller's protected pages.
  [[nodiscard]] std::vector<page_status> page_statuses(std::span<const std::size_t> caller_protected = {}) const {
    std::vector<page_status> out(num_pages());
    memdecay::page_statuses(state_, regions_, config_.effective_protection(state_.page_size(), state_.logical_len()), caller_protected, std::span<page_status>(out));
    return out;
  }
  /// The score of page `page` broken down by term and region.
  [[nodiscard]] page_explanation<Float> explain_page(std::size_t page) const {
    if (page >= num_pages())
      detail::raise_input("page " + detail::to_text(page) + " does not exist (" + detail::to_text(num_pages()) +
                          " pages)");
    page_explanation<Float> e{page, state_.position_of(page * page_size()), state_.tokens_in_page(page),
                              page_statuses()[page], {}, {}};
    std::vector<region_contribution<Float>> acc(regions_.size());
    for (std::size_t r = 0; r < acc.size(); ++r) acc[r].region = static_cast<region_id>(r);
    const Float inv_n = Float{1} / static_cast<Float>(e.tokens);
    for (std::size_t i = page * page_size(); i < page * page_size() + e.tokens; ++i) {
      const auto t = token_terms(i);
      auto& a = acc[state_.regions()[i]];
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

  // --- selection (phase 1: changes nothing) --------------------------------------------------------------------
  /// The `k` lowest-scoring evictable pages (fewer if fewer are evictable), never touching pinned or protected
  /// pages. `caller_protected`: pages that in-flight or speculative tokens still read.
  [[nodiscard]] plan_type select(std::size_t k, std::span<const std::size_t> caller_protected = {}) const {
    // Nothing to choose (select_for_budget within the budget, every step of most engines): no scores, no statuses.
    if (k == 0) return detail::make_plan<Float>(state_, config_.budget, {}, {}, 0);
    const auto scores = page_scores();
    const auto status = page_statuses(caller_protected);
    plan_type plan;
    plan.requested = k;
    plan.page_size = page_size();
    plan.generation = state_.generation();
    plan.pages = simd::select_lowest_pages_fast<Float>(scores, status, k);  // == select_lowest_pages
    for (std::size_t p : plan.pages) plan.scores.push_back(scores[p]);
    plan.pages_over_budget =
        detail::pages_over_high(config_.budget, page_size(), logical_len(), kv_len() - plan.tokens());
    return plan;
  }
  /// What the budget asks for: nothing while the resident size is within the high watermark; otherwise enough of
  /// the lowest-scoring evictable pages to reach the low watermark. When pinned and protected pages alone exceed
  /// the budget, the plan evicts what it may and pages_over_budget says by how much the high watermark is still
  /// exceeded.
  [[nodiscard]] plan_type select_for_budget(std::span<const std::size_t> caller_protected = {}) const {
    return select(detail::pages_wanted_by_budget(config_.budget, page_size(), logical_len(), kv_len()),
                  caller_protected);
  }

  // --- commit (phase 2) ----------------------------------------------------------------------------------------
  /// Compacts the state by the plan's pages. usage_error, changing nothing, if the plan is stale (the sequence
  /// changed since it was selected) or names pages that are not evictable.
  void commit(const plan_type& plan) {
    check_plan(plan);
    state_.remove_pages(plan.pages);
    remove_weight_pages(plan.pages);
  }
  /// Removes the plan's pages from the engine's page table and compacts the state, together. usage_error,
  /// changing neither, if the plan is stale or the table disagrees with the state (page size, page count).
  /// Returns what the table's remove_pages returns (the freed block ids, or slot ranges, for the allocator).
  template <page_table Table>
  auto commit(const plan_type& plan, Table& table, const typename Table::sequence_id& seq) {
    check_plan(plan);
    detail::check_page_table(table, seq, page_size(), num_pages());
    if constexpr (std::is_void_v<decltype(table.remove_pages(seq, plan.pages))>) {
      table.remove_pages(seq, plan.pages);  // may throw: the state is untouched so far
      state_.remove_pages(plan.pages);      // cannot fail: check_plan validated the same indices
      remove_weight_pages(plan.pages);
    } else {
      auto released = table.remove_pages(seq, plan.pages);
      state_.remove_pages(plan.pages);
      remove_weight_pages(plan.pages);
      return released;
    }
  }

 private:
  static config validated(config cfg) {
    cfg.validate();
    if (cfg.normalization != attention_normalization::none && cfg.normalization != attention_normalization::uniform)
      detail::raise_config(std::string("normalization = ") + to_string(cfg.normalization) +
                           " (basic_sequence supports none and uniform; lifetime and zscore run in "
                           "policy_sequence<policies::memdecay>, policy_sequence.hpp)");
    // A number that is finite as a double but not as Float (alpha = 1e39 with float scores) would make every
    // score inf * 0 = NaN, and selection undefined (found by tests/fuzz; docs/reliability.md).
    detail::check_fits_score_type<Float>(cfg);
    return cfg;
  }
  void check_normalised_finite(std::span<const Float> mass) const {
    detail::check_scaled_finite(mass, normalization_scale<Float>(config_.normalization, kv_len()));
  }
  // One sweep where the isa fuses multiply-adds (simd::fused_observation_exact): the fused kernel applies the
  // observation (EWMA by ewma_step's single rounding, refresh clocks, the refreshed tokens' exp-free weights) and
  // writes the page scores of the new state; its EWMA and clocks are then bitwise observe_tokens_reference's, so
  // policies and ranks that replay the reference agree bit for bit. Elsewhere the reference loop runs, then a
  // score pass. The scores are kept in scores_, which page_scores() and select() reuse until the next mutation
  // (any mutation bumps the generation).
  std::size_t apply(std::span<const Float> mass) {
    scores_.resize(num_pages());  // the only step that may throw: the state is untouched so far
    params_.scale = normalization_scale<Float>(config_.normalization, kv_len());
    const auto out = std::span<Float>(scores_);
    std::size_t refreshed = 0;
    if constexpr (simd::fused_observation_exact) {
      if (expfree_)
        refreshed = simd::observe_and_score_expfree(state_, std::span<Float>(weights_), mass, params_, clock_, alpha_,
                                                    out);
      else
        refreshed = simd::observe_and_score(state_, mass, params_, lut_, alpha_, out);
    } else {
      refreshed = observe_tokens_reference<Float>(state_.ewma_mut(), state_.last_refresh_mut(), mass, now(), params_);
      if (expfree_)
        simd::sync_and_score_expfree<simd::native_isa, PageSize>(
            state_.regions().data(), state_.last_refresh().data(), weights_.data(), state_.ewma().data(), kv_len(),
            page_size(), clock_, alpha_, scores_.data());
      else
        simd::page_scores(state_, lut_, alpha_, out);
    }
    state_.touch();
    scores_generation_ = state_.generation();
    return refreshed;
  }
  /// Page scores by the SIMD kernel, or the ones the last fused observation left when nothing changed since.
  void fill_page_scores(std::span<Float> out) const noexcept {
    if (scores_generation_ == state_.generation() && scores_.size() == out.size())
      std::copy(scores_.begin(), scores_.end(), out.begin());
    else if (expfree_)
      simd::page_scores_expfree(state_, std::span<const Float>(weights_), clock_, alpha_, out);
    else
      simd::page_scores(state_, lut_, alpha_, out);
  }
  // The exp-free weights (one per resident token, in page order) follow every change of the token arrays: new
  // tokens are refreshed now (w = g_r(now)), evicted pages leave with their tokens, the clock rebases them.
  void reserve_weights(std::size_t extra) {
    if (expfree_) detail::reserve_for_append(weights_, kv_len() + extra);
  }
  void append_weights() noexcept {
    if (!expfree_) return;
    const std::size_t first = weights_.size();
    weights_.resize(kv_len());  // within the reserved capacity: cannot throw
    simd::refresh_weights(state_.regions().data(), first, kv_len(), clock_, weights_.data());
  }
  void remove_weight_pages(std::span<const std::size_t> pages) noexcept {
    if (!expfree_) return;
    weights_.resize(compact_pages(std::span<Float>(weights_), page_size(), pages));  // as state_.remove_pages
  }
  void check_plan(const plan_type& plan) const { detail::check_plan(plan, state_, regions_, config_.effective_protection(state_.page_size(), state_.logical_len())); }

  config config_;
  region_table regions_;
  state_type state_;
  Float alpha_{};
  observation_params<Float> params_{};
  simd::region_lut<Float> lut_;                 ///< regions_ in the SIMD kernel's layout
  simd::expfree_clock<Float> clock_;            ///< exp-free factors f_r, g_r at now() and the epoch
  bool expfree_ = false;                        ///< scores from the exp-free kernel (use_expfree_scores)
  std::vector<Float> weights_;                  ///< exp-free w_i, one per resident token
  std::vector<Float> scores_;                   ///< page scores left by the last fused observation ...
  std::uint64_t scores_generation_ = ~std::uint64_t{0};  ///< ... valid while the state is at this generation
};

/// The common case: float scores, page size chosen at run time.
using sequence = basic_sequence<float, dynamic_page_size>;

}  // namespace memdecay

#endif  // MEMDECAY_SEQUENCE_HPP
