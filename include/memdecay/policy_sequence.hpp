// SPDX-License-Identifier: Apache-2.0
// memdecay: one sequence under any eviction policy (policy.hpp), with exactly basic_sequence's contract.
//
//   memdecay::policy_sequence<memdecay::policies::h2o> seq(cfg, {.recent_tokens = 64});
//   seq.append(memdecay::regions::user, 120);  // labels, clock, observations: as for memdecay::sequence
//   seq.advance_to(step);
//   seq.observe_tokens(mass);
//   auto plan = seq.select_for_budget();       // phase 1: pure
//   seq.commit(plan, table, id);               // phase 2: page table, layout and policy state together
//
// The layout (labels, clock, page origins, positions, generation) is a sequence_state; its EWMA and last-refresh
// columns are left as appended and unused (8 bytes per token), the policy keeps its own signal. Budgets with
// watermarks, config protections, caller-protected pages, the page-table checks and the error tiers are shared
// with basic_sequence (detail/sequence_rules.hpp). Every call validates first; a rejected call changes nothing.
// policies::memdecay under this evictor gives exactly basic_sequence's victims for `none` and `uniform`.
#ifndef MEMDECAY_POLICY_SEQUENCE_HPP
#define MEMDECAY_POLICY_SEQUENCE_HPP

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <ranges>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include <Eigen/Core>

#include "memdecay/attention.hpp"
#include "memdecay/config.hpp"
#include "memdecay/detail/digest.hpp"
#include "memdecay/detail/error.hpp"
#include "memdecay/detail/sequence_rules.hpp"
#include "memdecay/eviction.hpp"
#include "memdecay/page_table.hpp"
#include "memdecay/policy.hpp"
#include "memdecay/region.hpp"
#include "memdecay/sequence_state.hpp"

namespace memdecay {

/// A sequence whose victims are chosen by Policy<Float>. Float is the score and mass type; PageSize a
/// compile-time page size, or dynamic_page_size to take config::page_size at run time.
template <template <class> class Policy, std::floating_point Float = float,
          std::size_t PageSize = dynamic_page_size>
  requires eviction_policy<Policy<Float>> && std::same_as<typename Policy<Float>::float_type, Float>
class basic_policy_sequence {
 public:
  using float_type = Float;
  using policy_type = Policy<Float>;
  using params_type = typename policy_type::params_type;
  using state_type = sequence_state<Float, PageSize>;
  using plan_type = eviction_plan<Float>;

  /// Validates `cfg` and `params` (config_error naming the field) and starts an empty sequence at step 0.
  explicit basic_policy_sequence(config cfg, const params_type& params = {})
      : config_(validated(std::move(cfg))), regions_(config_.effective_regions()), state_(config_.page_size),
        policy_(params, config_, regions_) {}

  // --- read-only views ---------------------------------------------------------------------------------------
  [[nodiscard]] const config& get_config() const noexcept { return config_; }
  [[nodiscard]] const region_table& regions() const noexcept { return regions_; }
  [[nodiscard]] const state_type& state() const noexcept { return state_; }
  [[nodiscard]] const policy_type& policy() const noexcept { return policy_; }
  [[nodiscard]] sequence_view view() const noexcept {
    return {state_.regions(), state_.page_origins(), state_.page_size(), state_.now(), &regions_};
  }
  [[nodiscard]] std::size_t page_size() const noexcept { return state_.page_size(); }
  [[nodiscard]] std::size_t kv_len() const noexcept { return state_.kv_len(); }
  [[nodiscard]] std::size_t num_pages() const noexcept { return state_.num_pages(); }
  [[nodiscard]] std::uint64_t logical_len() const noexcept { return state_.logical_len(); }
  [[nodiscard]] std::uint64_t evicted_tokens() const noexcept { return state_.evicted_tokens(); }
  [[nodiscard]] step_t now() const noexcept { return state_.now(); }
  [[nodiscard]] std::uint64_t generation() const noexcept { return state_.generation(); }
  [[nodiscard]] std::uint64_t position_of(std::size_t index) const noexcept { return state_.position_of(index); }
  [[nodiscard]] std::vector<std::uint64_t> positions() const { return state_.positions(); }
  [[nodiscard]] std::optional<std::uint64_t> prefix_cache_boundary() const noexcept {
    return state_.prefix_cache_boundary();
  }
  /// A digest of the layout and the policy's state: equal digests on two ranks mean equal decisions.
  [[nodiscard]] std::uint64_t digest() const noexcept {
    detail::fnv1a64 h;
    h.add(state_.digest()).add(policy_.digest());
    return h.value();
  }

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
    grow(total, [&] { state_.append(spans); });
  }
  /// Appends one token per label. input_error (appending nothing) if any label is an unknown region.
  void append_tokens(std::span<const region_id> labels) {
    detail::check_region_labels(regions_, labels);
    grow(labels.size(), [&] { state_.append(labels); });
  }

  // --- clock -------------------------------------------------------------------------------------------------
  /// Moves the logical clock forward (input_error if backwards), and tells the policy (on_advance, if it has one).
  void advance_to(step_t step) {
    state_.advance_to(step);
    if constexpr (advancing_policy<policy_type>) policy_.on_advance(view());
  }

  // --- attention ---------------------------------------------------------------------------------------------
  /// Observes per-token mass over the resident tokens, in page order. Returns what the policy's on_observe
  /// returns. input_error (changing nothing) on a wrong length, a NaN, infinite or negative mass, or a mass the
  /// policy cannot take.
  std::size_t observe_tokens(std::span<const Float> mass) {
    validate_mass(mass, kv_len(), "per-token attention");
    return apply(mass);
  }
  /// Observes per-page mass (length num_pages()); each page's mass is shared evenly among its resident tokens.
  std::size_t observe_pages(std::span<const Float> page_mass) {
    validate_mass(page_mass, num_pages(), "per-page attention");
    const auto per_token = detail::spread_page_mass(state_, page_mass);
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
  /// Writes every page's score into `out` (length num_pages(); input_error otherwise).
  void page_scores(std::span<Float> out) const {
    if (out.size() != num_pages())
      detail::raise_input("page_scores output has " + detail::to_text(out.size()) + " entries, expected " +
                          detail::to_text(num_pages()));
    policy_.page_scores(view(), out);
  }
  [[nodiscard]] std::vector<Float> page_scores() const {
    std::vector<Float> out(num_pages());
    policy_.page_scores(view(), std::span<Float>(out));
    return out;
  }
  /// Every page's status under the config's protections and the caller's protected pages.
  [[nodiscard]] std::vector<page_status> page_statuses(std::span<const std::size_t> caller_protected = {}) const {
    std::vector<page_status> out(num_pages());
    memdecay::page_statuses(state_, regions_, config_.effective_protection(state_.page_size(), state_.logical_len()), caller_protected, std::span<page_status>(out));
    return out;
  }

  // --- selection (phase 1: changes nothing) --------------------------------------------------------------------
  /// The `k` lowest-scoring evictable pages (fewer if fewer are evictable); never pinned, protected, partial or
  /// caller-protected pages.
  [[nodiscard]] plan_type select(std::size_t k, std::span<const std::size_t> caller_protected = {}) const {
    if (k == 0) return detail::make_plan<Float>(state_, config_.budget, {}, {}, 0);  // no scores, no statuses
    const auto scores = page_scores();
    const auto status = page_statuses(caller_protected);
    return detail::make_plan<Float>(state_, config_.budget, scores, status, k);
  }
  /// What the budget asks for: nothing within the high watermark, otherwise enough of the lowest-scoring
  /// evictable pages to reach the low watermark; pages_over_budget reports a shortfall.
  [[nodiscard]] plan_type select_for_budget(std::span<const std::size_t> caller_protected = {}) const {
    return select(detail::pages_wanted_by_budget(config_.budget, page_size(), logical_len(), kv_len()),
                  caller_protected);
  }

  // --- commit (phase 2) ----------------------------------------------------------------------------------------
  /// Compacts the layout and the policy state by the plan's pages. usage_error, changing nothing, if the plan is
  /// stale or names pages that are not evictable.
  void commit(const plan_type& plan) {
    detail::check_plan(plan, state_, regions_, config_.effective_protection(state_.page_size(), state_.logical_len()));
    remove(plan.pages);
  }
  /// Removes the plan's pages from the engine's page table and compacts the state, together. usage_error,
  /// changing neither, if the plan is stale or the table disagrees with the state. Returns what the table's
  /// remove_pages returns (the freed block ids, or slot ranges, for the allocator).
  template <page_table Table>
  auto commit(const plan_type& plan, Table& table, const typename Table::sequence_id& seq) {
    detail::check_plan(plan, state_, regions_, config_.effective_protection(state_.page_size(), state_.logical_len()));
    detail::check_page_table(table, seq, page_size(), num_pages());
    if constexpr (std::is_void_v<decltype(table.remove_pages(seq, plan.pages))>) {
      table.remove_pages(seq, plan.pages);  // may throw: nothing here has changed yet
      remove(plan.pages);                   // cannot fail: check_plan validated the same indices
    } else {
      auto released = table.remove_pages(seq, plan.pages);
      remove(plan.pages);
      return released;
    }
  }

 private:
  static config validated(config cfg) {
    cfg.validate();
    detail::check_fits_score_type<Float>(cfg);
    return cfg;
  }
  template <class AppendToState>
  void grow(std::size_t tokens, AppendToState&& append_to_state) {
    if (tokens == 0) return;
    const std::size_t first = kv_len();
    policy_.reserve(first + tokens);  // may throw bad_alloc; the policy is unchanged when it does
    append_to_state();                // strong guarantee
    policy_.on_append(view(), first);
  }
  std::size_t apply(std::span<const Float> mass) {
    const auto v = view();
    policy_.check_observation(v, mass);
    const std::size_t refreshed = policy_.on_observe(v, mass);
    state_.touch();
    return refreshed;
  }
  void remove(std::span<const std::size_t> pages) {
    if (pages.empty()) return;
    policy_.on_remove(view(), pages);
    state_.remove_pages(pages);
  }

  config config_;
  region_table regions_;
  state_type state_;
  policy_type policy_;
};

/// The common case: float scores, page size chosen at run time.
template <template <class> class Policy>
using policy_sequence = basic_policy_sequence<Policy, float, dynamic_page_size>;

}  // namespace memdecay

#endif  // MEMDECAY_POLICY_SEQUENCE_HPP
