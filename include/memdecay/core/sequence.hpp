// SPDX-License-Identifier: Apache-2.0
// memdecay: the one evictor. A sequence under an eviction policy (policy.hpp; MemDecay by default): labels,
// clock, attention, scores, selection and commit.
//
//   memdecay::sequence seq(cfg);                 // MemDecay; validates cfg (config_error)
//   seq.append(memdecay::regions::system, 120);  // label tokens as they enter the KV cache
//   seq.advance_to(step);                        // the engine's logical clock
//   seq.observe_tokens(mass);                    // optional: attention per resident token (or per page, or heads)
//   auto plan = seq.select_for_budget();         // phase 1: pure, changes nothing
//   /* the engine applies plan.pages to its KV cache */
//   seq.commit(plan, table, id);                 // phase 2: page table, layout and policy state together
//
//   memdecay::policy_sequence<memdecay::policies::h2o> h2o(cfg, {.recent_fraction = 0.5});  // any other policy
//
// Engines that never materialise attention enable page digests (digests/page_digests.hpp) and observe the query
// instead: seq.enable_digests({.kv_heads = 8, .head_dim = 128, .query_heads = 32}); seq.set_page_keys(page, keys)
// as each page fills; seq.observe_query(query) (digests/query_signal.hpp). Engines with host memory to spare
// demote pages instead of dropping them and recall them by query: seq.enable_host_tier(...) (tiers/host_tier.hpp).
//
// The layout (labels, clock, page origins, positions, generation) is a sequence_state; the policy keeps its own
// per-token signal in the same page order. Budgets with watermarks, config protections, caller-protected pages,
// the page-table checks and the error tiers are this class's, the same for every policy (their rules live in
// detail/sequence_rules.hpp, which the manager and the exports share). Every call validates its input first and
// either fully applies or throws and changes nothing.
#ifndef MEMDECAY_CORE_SEQUENCE_HPP
#define MEMDECAY_CORE_SEQUENCE_HPP

#include <algorithm>
#include <array>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <ranges>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <Eigen/Core>

#include "memdecay/core/attention.hpp"
#include "memdecay/core/attention_rows.hpp"
#include "memdecay/core/config.hpp"
#include "memdecay/core/executor.hpp"
#include "memdecay/detail/digest.hpp"
#include "memdecay/digests/key_norm_signal.hpp"
#include "memdecay/digests/page_digests.hpp"
#include "memdecay/digests/query_signal.hpp"
#include "memdecay/detail/error.hpp"
#include "memdecay/core/sequence_rules.hpp"
#include "memdecay/core/eviction.hpp"
#include "memdecay/page_tables/page_table.hpp"
#include "memdecay/policies/memdecay.hpp"
#include "memdecay/core/policy.hpp"
#include "memdecay/core/region.hpp"
#include "memdecay/core/sequence_state.hpp"
#include "memdecay/simd/recall_select.hpp"
#include "memdecay/simd/reduce_rows.hpp"
#include "memdecay/simd/select.hpp"
#include "memdecay/detail/undo.hpp"
#include "memdecay/tiers/host_store.hpp"
#include "memdecay/tiers/host_tier.hpp"
#include "memdecay/core/token_state.hpp"

namespace memdecay {

template <class Sequence, std::integral SequenceId>
class basic_manager;

namespace detail {
/// Set while a manager owns the sequence (the manager must see every commit: its per-step protections and shared
/// pages depend on it). A copy is never owned: a fork or a caller's copy starts free.
struct manager_mark {
  bool owned = false;
  manager_mark() = default;
  manager_mark(const manager_mark&) noexcept {}
  manager_mark& operator=(const manager_mark&) noexcept { return *this; }
};
}  // namespace detail

/// A sequence whose victims are chosen by Policy<Float>. Float is the score and mass type (float or double);
/// PageSize a compile-time page size, or dynamic_page_size to take config::page_size at run time.
template <template <class> class Policy = policies::memdecay, std::floating_point Float = float,
          std::size_t PageSize = dynamic_page_size>
requires eviction_policy<Policy<Float>> && std::same_as<typename Policy<Float>::float_type, Float>
class basic_sequence {
 public:
  using float_type = Float;
  using policy_type = Policy<Float>;
  using params_type = typename policy_type::params_type;
  using state_type = sequence_state<PageSize>;
  using plan_type = eviction_plan<Float>;
  static constexpr std::size_t static_page_size = PageSize;

  /// Validates `cfg` and `params` (config_error naming the field) and starts an empty sequence at step 0.
  explicit basic_sequence(config cfg, const params_type& params = {})
      : config_(validated(std::move(cfg))),
        regions_(config_.effective_regions()),
        state_(config_.page_size),
        policy_(params, config_, regions_),
        pinned_(regions_) {}

  // --- read-only views ---------------------------------------------------------------------------------------
  [[nodiscard]] const config& get_config() const noexcept { return config_; }
  /// The region table in effect (config.regions with config.region_overrides applied).
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
  /// The first original page that is not on the device (dropped, or on the host tier): later blocks must not be
  /// hashed or reused. Empty while every page ever appended is on the device.
  [[nodiscard]] std::optional<std::uint64_t> prefix_cache_boundary() const noexcept {
    if (!hosting()) return state_.prefix_cache_boundary();
    const auto origins = state_.page_origins();
    for (std::size_t i = 0; i < origins.size(); ++i)
      if (origins[i] != i || tier_->on_host(i)) return i;
    return origins.size();
  }
  /// A digest of the layout and the policy's state: equal digests on two ranks mean equal decisions.
  [[nodiscard]] std::uint64_t digest() const noexcept {
    detail::fnv1a64 h;
    h.add(state_.digest()).add(policy_.digest());
    if (digests_) h.add(digests_->digest());
    if (tier_) h.add(tier_->digest());
    return h.value();
  }
  /// A digest of the configuration decisions depend on (alpha, EWMA factor, tau, page size, normalisation,
  /// protections, budget, the effective region table): ranks and snapshots (io/snapshot.hpp) compare it.
  [[nodiscard]] std::uint64_t config_digest() const noexcept {
    detail::fnv1a64 h;
    const config& c = config_;
    h.add(c.alpha).add(c.effective_beta()).add(c.tau).add(static_cast<std::uint64_t>(c.page_size));
    h.add(static_cast<std::uint8_t>(c.normalization));
    h.add(static_cast<std::uint64_t>(c.protection.sink_pages))
        .add(static_cast<std::uint64_t>(c.protection.recent_tokens));
    h.add(c.protection.recent_fraction);
    h.add(static_cast<std::uint8_t>(c.budget.unit)).add(c.budget.high).add(c.budget.low.value_or(c.budget.high));
    for (const auto& r : regions_.params())
      h.add(r.base_priority).add(r.decay_rate).add(static_cast<std::uint8_t>(r.pinned));
    return h.value();
  }
  /// Whether a manager owns this sequence (then commit goes through the manager).
  [[nodiscard]] bool managed() const noexcept { return mark_.owned; }

  // --- residency (tiers/host_tier.hpp) ------------------------------------------------------------------------
  // Without a host tier every held page is on the device: kv_len() == device_len(), num_pages() == device_pages().
  /// Tokens on the device (the engine's device KV length): what observations cover.
  [[nodiscard]] std::size_t device_len() const noexcept { return kv_len() - host_tokens(); }
  [[nodiscard]] std::size_t device_pages() const noexcept { return num_pages() - host_pages(); }
  [[nodiscard]] std::size_t host_pages() const noexcept { return tier_ ? tier_->host_pages() : 0; }
  [[nodiscard]] std::size_t host_tokens() const noexcept { return host_pages() * page_size(); }
  /// Where held page `page` lives (input_error for a page that does not exist).
  [[nodiscard]] page_residency residency(std::size_t page) const {
    check_page(page, "residency");
    return tier_ && tier_->on_host(page) ? page_residency::host : page_residency::device;
  }
  /// The index of device page `page` in the engine's device page table (device pages in page order).
  /// input_error for a page that does not exist or is on the host.
  [[nodiscard]] std::size_t device_index(std::size_t page) const {
    check_page(page, "device_index");
    if (!tier_) return page;
    if (tier_->on_host(page)) detail::raise_input("device_index: page " + detail::to_text(page) + " is on the host");
    return tier_->device_index(page);
  }

  // --- host tier (tiers/host_tier.hpp) ------------------------------------------------------------------------
  /// Demotes to a host tier from now on (config_error naming the field, changing nothing, for an invalid config).
  /// Enabling again changes the rules and keeps every page where it is; a host budget that holds fewer pages than
  /// the host tier holds now is a config_error (no plan could then keep the tier within its budget: recall them
  /// first). A managed sequence's host pages also count toward its manager's host pool (manager_config::host_pool).
  void enable_host_tier(const host_tier_config& cfg) {
    cfg.validate();
    if (tier_) {
      if (const std::size_t holds = cfg.host_capacity_pages(page_size(), logical_len()); holds < host_pages())
        detail::raise_config("host_tier.host_budget.high = " + detail::to_text(cfg.host_budget.high) + " holds " +
                             detail::to_text(holds) + " pages, fewer than the " + detail::to_text(host_pages()) +
                             " on the host tier now (recall them first)");
      tier_->reconfigure(cfg);
    } else {
      page_residencies next(cfg);
      next.resize(num_pages());  // may throw bad_alloc: nothing has changed yet
      tier_ = std::move(next);
    }
    state_.touch();
  }
  /// Stops demoting. usage_error, changing nothing, while pages are on the host (recall or drop them first: they
  /// would be lost silently).
  void disable_host_tier() {
    if (!tier_) return;
    if (tier_->host_pages() != 0)
      detail::raise_usage("disable_host_tier: " + detail::to_text(tier_->host_pages()) +
                          " pages are on the host; recall or drop them first");
    tier_.reset();
    state_.touch();
  }
  [[nodiscard]] bool has_host_tier() const noexcept { return tier_.has_value(); }
  /// The tier's rules and residencies. usage_error without a host tier.
  [[nodiscard]] const page_residencies& host_tier() const {
    check_tier("host_tier");
    return *tier_;
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
  /// Decay follows the clock, observed or not.
  void advance_to(step_t step) {
    const std::uint64_t before = state_.generation();
    state_.advance_to(step);
    bool columns_changed = false;
    if constexpr (advancing_policy<policy_type>) {
      if constexpr (std::same_as<decltype(policy_.on_advance(view())), bool>) {
        columns_changed = policy_.on_advance(view());
        // A policy that names the columns its hook rewrites (advance_columns) keeps them out of the content.
        if constexpr (requires { policy_type::advance_columns; }) {
          if (columns_changed) advance_columns_at_ = state_.generation();
          columns_changed = false;
        }
      } else {
        policy_.on_advance(view());
        columns_changed = true;  // a hook that does not say may have changed anything
      }
    }
    note_clock_move(before, columns_changed);
  }
  /// The generation of the last advance_to whose hook rewrote the policy's advance_columns (0 if none): an
  /// incremental manager snapshot then saves those columns with the scalars.
  [[nodiscard]] std::uint64_t advance_columns_generation() const noexcept { return advance_columns_at_; }
  /// The generation of the last change other than a move of the clock that left every per-token column as it was
  /// (an advance_to without an exp-free rebase). Equal content generations and different generations mean that
  /// only the clock and the policy's scalars moved: an incremental manager snapshot (io/manager_snapshot.hpp) then
  /// saves a few scalars instead of the sequence.
  [[nodiscard]] std::uint64_t content_generation() const noexcept {
    return state_.generation() == clock_moved_at_ ? content_before_clock_ : state_.generation();
  }

  // --- attention ---------------------------------------------------------------------------------------------
  /// Observes per-token mass over the resident tokens, in page order. Returns what the policy's on_observe
  /// returns (MemDecay: the tokens refreshed). input_error (changing nothing) on a wrong length, a NaN, infinite
  /// or negative mass, or a mass the policy cannot take.
  std::size_t observe_tokens(std::span<const Float> mass) {
    if (hosting()) {
      validate_mass(mass, device_len(), "per-token attention");
      return observe_held(expand_device(mass));
    }
    check_observe_tokens(mass);
    return apply(mass);
  }
  /// Throws what observe_tokens(mass) would throw, and changes nothing (basic_manager::observe_batch checks a whole
  /// batch before it applies any of it).
  void check_observe_tokens(std::span<const Float> mass) const {
    if (hosting()) {
      validate_mass(mass, device_len(), "per-token attention");
      policy_.check_observation(view(), std::span<const Float>(expand_device(mass)));
      return;
    }
    const auto v = view();
    bool valid = false;
    if constexpr (prevalidating_policy<policy_type>)
      valid = mass.size() == kv_len() && policy_.observation_is_valid(v, mass);  // one branch-free pass
    if (!valid) {
      validate_mass(mass, kv_len(), "per-token attention");
      policy_.check_observation(v, mass);
    }
  }
  /// Observes attention as the engine's kernel wrote it (core/attention_rows.hpp: float32, fp16 or bf16 rows,
  /// heads x tokens with a leading dimension), reduced over the rows: the same as
  /// observe_tokens(reduce_rows<Float>(rows)), bit for bit. How it reads them (measured, docs/performance.md):
  /// one float32 row is observed in place; one fp16/bf16 row is widened a block at a time into the L1 cache,
  /// checked in a first sweep and observed in a second (MemDecay, every normalisation but zscore), never as a
  /// whole float copy; several rows are summed once, row by row, into one float vector (reading them twice would
  /// cost more than that vector), checked in the same sweep, then observed. input_error, changing nothing, for a
  /// token count other than the resident (device) tokens, an element that is not finite and >= 0 (naming its row
  /// and token), or a reduced mass the policy cannot take.
  std::size_t observe_rows(const attention_rows& rows) {
    check_rows_shape(rows);
    switch (path_of(rows)) {
      case rows_path::in_place:
        return observe_tokens(in_place_mass(rows));
      case rows_path::blocks:
        check_rows_in_blocks(rows);
        return apply_rows(rows);
      case rows_path::reduced:
        break;
    }
    std::vector<Float> mass(rows.tokens());
    if (observes_rows_in_blocks()) {  // the same check as check_observe_tokens, in the reduction's sweep
      reduce_checked(rows, 0, rows.tokens(), mass.data(), observation_scale());
      return apply(mass);
    }
    reduce_checked(rows, 0, rows.tokens(), mass.data(), Float{1});
    return observe_tokens(std::span<const Float>(mass));
  }
  /// Throws what observe_rows(rows) would throw, and changes nothing.
  void check_observe_rows(const attention_rows& rows) const { (void)check_rows_for_batch(rows); }
  /// Observes per-page mass (length num_pages()); each page's mass is shared evenly among its resident tokens.
  std::size_t observe_pages(std::span<const Float> page_mass) {
    validate_mass(page_mass, device_pages(), "per-page attention");
    if (hosting()) {
      std::vector<Float> held(num_pages(), Float{0});
      std::size_t d = 0;
      for (std::size_t p = 0; p < held.size(); ++p)
        if (!tier_->on_host(p)) held[p] = page_mass[d++];
      return observe_held(detail::spread_page_mass<Float>(state_, std::span<const Float>(held)));
    }
    return observe_held(detail::spread_page_mass<Float>(state_, page_mass));
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

  // --- page digests and the attention-free signal (digests/) -------------------------------------------------
  /// Keeps a key digest per page from now on (config_error for an invalid layout; nothing changes then). Every
  /// existing page starts without a digest; enabling again with another layout forgets the digests held. Every
  /// change of the digests is a new generation (plans made before are stale; an incremental manager snapshot saves
  /// the sequence again), and snapshots hold them (io/snapshot.hpp, format 2).
  void enable_digests(const digest_layout& layout) {
    page_digests d(layout);
    d.resize(num_pages());
    digests_ = std::move(d);
    state_.touch();
  }
  /// Stops keeping digests (and forgets them).
  void disable_digests() noexcept {
    if (!digests_) return;
    digests_.reset();
    state_.touch();
  }
  [[nodiscard]] bool has_digests() const noexcept { return digests_.has_value(); }
  /// The digests, in page order. usage_error unless enable_digests was called.
  [[nodiscard]] const page_digests& digests() const {
    check_digests("digests");
    return *digests_;
  }
  /// Page `page`'s min/max digest (kv_heads x head_dim each). input_error, changing nothing, on a wrong length, a
  /// non-finite value, lo > hi, or a page that does not exist; usage_error without digests or for mean-key ones.
  void set_page_digest(std::size_t page, std::span<const float> lo, std::span<const float> hi) {
    check_digests("set_page_digest");
    digests_->set_min_max(page, lo, hi);
    state_.touch();
  }
  /// Page `page`'s mean-key digest (kv_heads x head_dim).
  void set_page_mean_key(std::size_t page, std::span<const float> mean) {
    check_digests("set_page_mean_key");
    digests_->set_mean_key(page, mean);
    state_.touch();
  }
  /// Computes page `page`'s digest from its keys (tokens x kv_heads x head_dim). Appending tokens to a page that
  /// has a digest forgets it (the new keys are not in it); send it again when the page is full.
  void set_page_keys(std::size_t page, std::span<const float> keys) {
    check_digests("set_page_keys");
    digests_->set_from_keys(page, keys);
    state_.touch();
  }
  /// Query head j's logit bound on page p into out[j * num_pages() + p] (page_digests::bounds: Quest's upper bound
  /// for min/max digests; +inf for a page without a digest). input_error for a query of the wrong length or a
  /// non-finite value; usage_error without digests. `exec` (core/executor.hpp) splits the pages over its threads
  /// (digests/digest_bounds_on.hpp), here and in observe_query, estimate_query_attention and select_recall: the
  /// same bounds bit for bit, so the same observation and plan, for every executor and thread count.
  template <executor Exec = inline_executor>
  void query_page_bounds(std::span<const float> query, std::span<float> out, Exec&& exec = Exec{}) const {
    check_digests("query_page_bounds");
    digests_->bounds(query, out, exec);
  }
  /// Observes the attention estimated from `query` (query_heads x head_dim) and the page digests instead of
  /// measured attention: per-page mass by `how` (digests/query_signal.hpp), summing to `total` (1 matches a mean
  /// head reduction; the number of heads a sum), shared among each page's tokens as observe_pages does. Returns
  /// what observe_pages returns. Errors as query_page_bounds, changing nothing.
  template <executor Exec = inline_executor>
  std::size_t observe_query(std::span<const float> query, query_signal how = query_signal::bound_softmax,
                            double total = 1.0, Exec&& exec = Exec{}) {
    check_digests("observe_query");
    const auto mass = estimate_query_attention(query, how, total, exec);
    return observe_pages(std::span<const Float>(mass));
  }
  /// Observes the attention estimated from the resident tokens' key norms (KnormPress: a low norm, a high share;
  /// digests/key_norm_signal.hpp), summing to `total`, for engines that see neither attention nor want digests.
  /// input_error, changing nothing, for a wrong length or a negative or non-finite norm.
  std::size_t observe_key_norms(std::span<const float> norms, double total = 1.0) {
    if (norms.size() != device_len())
      detail::raise_input("key norms have " + detail::to_text(norms.size()) + " entries, expected " +
                          detail::to_text(device_len()));
    std::vector<Float> mass(norms.size());
    key_norm_attention<Float>(norms, total, std::span<Float>(mass));
    return observe_tokens(std::span<const Float>(mass));
  }
  /// The per-page mass observe_query would observe, without observing it (one entry per device page).
  template <executor Exec = inline_executor>
  [[nodiscard]] std::vector<Float> estimate_query_attention(std::span<const float> query,
                                                            query_signal how = query_signal::bound_softmax,
                                                            double total = 1.0, Exec&& exec = Exec{}) const {
    check_digests("estimate_query_attention");
    const std::size_t heads = digests_->layout().effective_query_heads();
    std::vector<float> bounds(heads * num_pages());
    digests_->bounds(query, std::span<float>(bounds), exec);
    if (hosting()) bounds = device_columns(bounds, heads);  // attention covers the device pages only
    std::vector<std::uint32_t> tokens;
    tokens.reserve(device_pages());
    for (std::size_t p = 0; p < num_pages(); ++p)
      if (!hosting() || !tier_->on_host(p)) tokens.push_back(static_cast<std::uint32_t>(state_.tokens_in_page(p)));
    std::vector<Float> mass(tokens.size());
    estimate_page_attention<Float>(bounds, heads, tokens, how, total, std::span<Float>(mass), exec);
    return mass;
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
  /// The page scores without a copy when the policy keeps them for the state now (MemDecay after a fused
  /// observation: policies::memdecay::cached_page_scores), else computed into `buffer`. Valid until the next change.
  [[nodiscard]] std::span<const Float> current_page_scores(std::vector<Float>& buffer) const {
    if constexpr (requires(const policy_type& p, const sequence_view& v) {
                    { p.cached_page_scores(v) } -> std::convertible_to<std::span<const Float>>;
                  }) {
      const std::span<const Float> cached = policy_.cached_page_scores(view());
      if (cached.size() == num_pages() && num_pages() != 0) return cached;
    }
    buffer = page_scores();
    return buffer;
  }
  /// Every page's status under the config's protections and the caller's protected pages.
  [[nodiscard]] std::vector<page_status> page_statuses(std::span<const std::size_t> caller_protected = {}) const {
    std::vector<page_status> out(num_pages());
    memdecay::page_statuses(state_, pinned_.flags(), protection(), caller_protected, std::span<page_status>(out));
    if (tier_) {
      for (std::size_t p = 0; p < out.size(); ++p) {
        if (tier_->on_host(p))
          out[p] = page_status::host;
        else if (out[p] == page_status::evictable && tier_->recently_recalled(p, now()))
          out[p] = page_status::recalled;
      }
    }
    return out;
  }
  /// The protections in effect now (config.protection with its budget-relative window resolved).
  [[nodiscard]] protection_config protection() const noexcept {
    return config_.effective_protection(state_.page_size(), state_.logical_len());
  }
  /// The score of page `page` broken down by term and region (policies that explain themselves: MemDecay).
  /// input_error for a page that does not exist.
  [[nodiscard]] auto explain_page(std::size_t page) const requires
      requires(const policy_type& p, const sequence_view& v) {
    p.explain_page(v, std::size_t{}, page_status{});
  }
  {
    if (page >= num_pages())
      detail::raise_input("page " + detail::to_text(page) + " does not exist (" + detail::to_text(num_pages()) +
                          " pages)");
    return policy_.explain_page(view(), page, page_statuses()[page]);
  }
  /// The score terms of resident token `index` by the scalar reference formula (MemDecay).
  [[nodiscard]] auto token_terms(std::size_t index) const noexcept requires
      requires(const policy_type& p, const sequence_view& v) {
    p.token_terms(v, index);
  }
  { return policy_.token_terms(view(), index); }
  /// Chooses the policy's scorer (MemDecay: the exp-free kernel or the polynomial-exp one; policies/memdecay.hpp).
  /// Returns whether the exp-free kernel is now in use. Strong guarantee.
  bool use_expfree_scores(bool on = true) requires requires(policy_type& p, const sequence_view& v) {
    p.use_expfree_scores(v, on);
  }
  {
    const bool now_on = policy_.use_expfree_scores(view(), on);
    state_.touch();  // the scores come from another kernel now: plans made before are stale
    return now_on;
  }
  [[nodiscard]] bool expfree_scores() const noexcept requires requires(const policy_type& p) { p.expfree_scores(); }
  { return policy_.expfree_scores(); }
  /// Whether use_expfree_scores(true) would take the exp-free kernel (the region table is in its domain).
  [[nodiscard]] bool expfree_available() const noexcept requires requires(const policy_type& p) {
    p.expfree_available();
  }
  { return policy_.expfree_available(); }

  // --- selection (phase 1: changes nothing) --------------------------------------------------------------------
  /// The `k` lowest-scoring evictable pages (fewer if fewer are evictable); never pinned, protected, partial or
  /// caller-protected pages. Ties go to the lower page index.
  /// With a host tier the victims are device pages only, and the plan says which of them go to host (demoted)
  /// and which host pages are dropped to make room (host_dropped).
  [[nodiscard]] plan_type select(std::size_t k, std::span<const std::size_t> caller_protected = {}) const {
    // Nothing to choose (select_for_budget within the budget, every step of most engines): no scores, no statuses.
    if (k == 0) return detail::make_plan<Float>(state_, config_.budget, {}, {}, 0, device_len());
    std::vector<Float> computed;
    const auto scores = current_page_scores(computed);
    const auto status = page_statuses(caller_protected);
    auto plan = detail::make_plan<Float>(state_, config_.budget, scores, status, k, device_len());
    if (tier_) split_for_host(plan, scores);
    return plan;
  }
  /// What the budget asks for: nothing while the resident size is within the high watermark; otherwise enough of
  /// the lowest-scoring evictable pages to reach the low watermark. When pinned and protected pages alone exceed
  /// the budget, the plan evicts what it may and pages_over_budget says by how much the high watermark is still
  /// exceeded.
  [[nodiscard]] plan_type select_for_budget(std::span<const std::size_t> caller_protected = {}) const {
    return select(pages_wanted_by_budget(), caller_protected);
  }
  /// Pages the budget asks to evict now (0 within the high watermark).
  [[nodiscard]] std::size_t pages_wanted_by_budget() const noexcept {
    return detail::pages_wanted_by_budget(config_.budget, page_size(), logical_len(), device_len());
  }

  // --- commit (phase 2) ----------------------------------------------------------------------------------------
  /// Throws what commit(plan) would throw (usage_error for a stale plan or a page that is not evictable), and
  /// changes nothing.
  void check_commit(const plan_type& plan) const {
    if (tier_)
      check_tiered_plan(plan);
    else
      detail::check_plan(plan, state_, std::span<const page_status>(page_statuses()));
  }
  /// Compacts the layout and the policy state by the plan's pages. usage_error, changing nothing, if the plan is
  /// stale or names pages that are not evictable, or if a manager owns this sequence (commit through it).
  void commit(const plan_type& plan) {
    check_unmanaged();
    check_commit(plan);
    apply_plan(plan);
  }
  /// Removes the plan's pages from the engine's page table and compacts the state, together. usage_error,
  /// changing neither, if the plan is stale, the table disagrees with the state (page size, page count) or a
  /// manager owns this sequence. Returns the table's page_removal (the removed pages, the memory that freed, their
  /// slots).
  template <page_table Table>
  page_removal<typename Table::page_id> commit(const plan_type& plan, Table& table,
                                               const typename Table::sequence_id& seq) {
    check_unmanaged();
    check_commit(plan);
    detail::check_page_table(table, seq, page_size(), device_pages());
    return remove_from(plan, table, seq);
  }
  /// commit with the engine's host store (tiers/host_store.hpp) doing the copies: the demoted pages' K/V is copied
  /// to the host first, then the table removes every page leaving the device, then the host copies of the dropped
  /// host pages are released. A store that throws or copies fewer pages than asked (input_error), or a table that
  /// fails, leaves the sequence, the table and the store as they were: the copies made are released again.
  template <page_table Table, class Store>
    requires host_store<Store, typename Table::sequence_id, typename Table::page_id>
  page_removal<typename Table::page_id> commit(const plan_type& plan, Table& table,
                                               const typename Table::sequence_id& seq, Store& store) {
    check_unmanaged();
    check_commit(plan);
    detail::check_page_table(table, seq, page_size(), device_pages());
    return remove_with_store(plan, table, seq, store);
  }

  // --- recall (tiers/host_tier.hpp; phase 1 changes nothing) ---------------------------------------------------
  /// Which host pages `query` (query_heads x head_dim, as observe_query) wants back, and which device pages make
  /// room: best bound first, each while it beats the evictable device page of the lowest bound still kept by more
  /// than the hysteresis, into free room under the budget's high watermark first, then by displacing that page;
  /// at most max_recall_pages promotions; with displace_lowest = k, only the k lowest-scoring evictable device pages
  /// may be displaced. Host pages without a digest are never recalled, device pages without one never displaced.
  /// A page's bound is its best query head's (head_bounds::max) or the mean over the heads (head_bounds::mean; a
  /// NaN head bound then leaves the page unjudged). usage_error without a host tier or digests; input_error for a
  /// bad query. `exec` splits the bounds over its threads (query_page_bounds).
  template <executor Exec = inline_executor>
  [[nodiscard]] recall_plan select_recall(std::span<const float> query,
                                          std::span<const std::size_t> caller_protected = {},
                                          head_bounds over_heads = head_bounds::max, Exec&& exec = Exec{}) const {
    check_tier("select_recall");
    check_digests("select_recall");
    const std::size_t heads = digests_->layout().effective_query_heads(), n = num_pages();
    std::vector<float> bounds(heads * n);
    std::vector<float> page_bound(n);
    if (over_heads == head_bounds::attention) {
      // The log of the page's estimated attention mass (query_signal.hpp's bound_softmax: each head's softmax over
      // the held pages' bounds, averaged over the heads); a NaN head bound leaves the page unjudged.
      digests_->bounds(query, std::span<float>(bounds), exec);
      std::vector<double> mass(n);
      const std::vector<std::uint32_t> one_per_page(n, 1);
      estimate_page_attention<double>(bounds, heads, one_per_page, query_signal::bound_softmax, 1.0, mass, exec);
      for (std::size_t p = 0; p < n; ++p) page_bound[p] = static_cast<float>(std::log(mass[p]));
      for (std::size_t j = 0; j < heads; ++j)
        for (std::size_t p = 0; p < n; ++p)
          if (std::isnan(bounds[j * n + p])) page_bound[p] = std::numeric_limits<float>::quiet_NaN();
      return recall_for_bounds(page_bound, caller_protected);
    }
    // The reductions over the heads read each page's bounds together (page-major), in head order as before.
    digests_->bounds_by_page(query, std::span<float>(bounds), exec);
    for (std::size_t p = 0; p < n; ++p) {
      const float* b = bounds.data() + p * heads;
      if (over_heads == head_bounds::mean) {
        double sum = 0.0;  // double: the mean of many heads' bounds keeps the float ones' ordering
        for (std::size_t j = 0; j < heads; ++j) sum += b[j];
        page_bound[p] = static_cast<float>(sum / static_cast<double>(heads));
      } else {
        float best = -std::numeric_limits<float>::infinity();
        for (std::size_t j = 0; j < heads; ++j) best = std::max(best, b[j]);
        page_bound[p] = best;
      }
    }
    return recall_for_bounds(page_bound, caller_protected);
  }
  /// select_recall from bounds the engine computed itself (Quest's kernel on the GPU, say): one per held page (the
  /// best query head's; host and device pages alike), no digests needed. With digests, pages without one are left
  /// out as in select_recall. input_error for a wrong length or a NaN; usage_error without a host tier.
  [[nodiscard]] recall_plan select_recall_for_bounds(std::span<const float> page_bounds,
                                                     std::span<const std::size_t> caller_protected = {}) const {
    check_tier("select_recall_for_bounds");
    if (page_bounds.size() != num_pages())
      detail::raise_input("page bounds have " + detail::to_text(page_bounds.size()) + " entries, expected " +
                          detail::to_text(num_pages()));
    auto candidates = recall_candidates_for(page_bounds, caller_protected);
    if (candidates.saw_nan)  // the sweep saw one; name the first
      for (std::size_t p = 0; p < page_bounds.size(); ++p)
        if (std::isnan(page_bounds[p])) detail::raise_input("page bounds[" + detail::to_text(p) + "] is NaN");
    return recall_from(std::move(candidates));
  }
  /// Throws what commit_recall(plan) would throw, and changes nothing.
  void check_recall(const recall_plan& plan) const {
    check_tier("commit_recall");
    detail::check_plan_made_for(plan.generation, plan.page_size, state_, "commit_recall");
    if (plan.promote_bounds.size() != plan.promote.size())
      detail::raise_usage("commit_recall: promote_bounds has " + detail::to_text(plan.promote_bounds.size()) +
                          " entries, promote " + detail::to_text(plan.promote.size()));
    detail::check_ascending(plan.promote, "promote", "commit_recall");
    detail::check_ascending(plan.demote, "demote", "commit_recall");
    detail::check_ascending(plan.drop, "drop", "commit_recall");
    for (std::size_t p : plan.promote) {
      check_page(p, "commit_recall: promote");
      if (!tier_->on_host(p))
        detail::raise_usage("commit_recall: promotes page " + detail::to_text(p) + ", which is on the device");
    }
    const auto status = page_statuses();
    std::vector<std::size_t> leaving;
    std::merge(plan.demote.begin(), plan.demote.end(), plan.drop.begin(), plan.drop.end(), std::back_inserter(leaving));
    if (auto problem = state_.removal_problem(leaving); !problem.empty())
      detail::raise_usage("commit_recall: " + problem);
    detail::check_plan_statuses(leaving, status, "commit_recall");
    check_host_budget(host_pages() - plan.promote.size() + plan.demote.size(), "commit_recall: the plan");
  }
  /// commit_recall together with the engine's device page table, which inserts the promoted pages at their place
  /// in fresh blocks (returned in page order: the engine copies their K/V from the host into them) and removes the
  /// displaced ones (the demoted ones' K/V copied to the host before). usage_error, changing neither, for what
  /// commit_recall rejects or a table that disagrees with the device pages; input_error, changing neither, when the
  /// table has no room for the promoted pages even after the removal. With free blocks for the promotions the
  /// insertion comes first, and a removal the table then refuses takes the inserted pages out again. A full table
  /// swaps: the removal makes the room, and an insertion the table then refuses puts the removed pages back (a
  /// table that hands out the blocks it freed last first, as block_pool does, gets the same blocks back, whose K/V
  /// nobody has touched; usage_error if it hands out others). Either way a failure changes nothing.
  template <inserting_page_table Table>
  recall_commit<typename Table::page_id> commit_recall(const recall_plan& plan, Table& table,
                                                       const typename Table::sequence_id& seq) {
    check_unmanaged();
    return recall_into(plan, table, seq);
  }
  /// commit_recall with the engine's host store (tiers/host_store.hpp) doing the copies, so that the K/V follows
  /// the plan within the call: the promoted pages' host copies go into the blocks the table inserts for them (and
  /// are released), the demoted pages' K/V goes to the host before the table removes them. A store that throws or
  /// copies fewer pages than asked (input_error), or a table that fails, leaves the sequence, the table and the
  /// store as they were, K/V included. A full table swaps, and the promoted pages may land in the blocks the
  /// displaced ones leave, so there every displaced page is copied to the host first (a dropped one only until
  /// the commit succeeds): whatever fails, the displaced pages go back with their K/V.
  template <inserting_page_table Table, class Store>
    requires host_store<Store, typename Table::sequence_id, typename Table::page_id>
  recall_commit<typename Table::page_id> commit_recall(const recall_plan& plan, Table& table,
                                                       const typename Table::sequence_id& seq, Store& store) {
    check_unmanaged();
    return recall_into(plan, table, seq, store);
  }
  /// Applies a recall plan: promoted pages return to the device (at their place in the layout), demoted pages go
  /// to host, dropped pages leave. usage_error, changing nothing, for a stale plan, a page in the wrong tier or one
  /// that may not leave the device, or a managed sequence.
  void commit_recall(const recall_plan& plan) {
    check_unmanaged();
    check_recall(plan);
    apply_recall(plan);
  }

 private:
  friend struct detail::snapshot_access;
  friend struct detail::manager_snapshot_access;
  template <class Sequence, std::integral SequenceId>
  friend class basic_manager;

  static config validated(config cfg) {
    cfg.validate();
    // A number that is finite as a double but not as Float (alpha = 1e39 with float scores) would make every
    // score inf * 0 = NaN, and selection undefined (found by tests/fuzz; docs/reliability.md).
    detail::check_fits_score_type<Float>(cfg);
    return cfg;
  }
  void check_unmanaged() const {
    if (mark_.owned)
      detail::raise_usage(
          "commit: this sequence is owned by a manager; commit through basic_manager::commit, "
          "which applies its per-step protections and shared pages");
  }
  // Keeps content_generation(): a run of clock moves that changed no per-token column remembers the generation
  // before it.
  void note_clock_move(std::uint64_t before, bool columns_changed) noexcept {
    if (state_.generation() == before || columns_changed) return;
    if (before != clock_moved_at_) content_before_clock_ = before;
    clock_moved_at_ = state_.generation();
  }
  void check_digests(const char* call) const {
    if (!digests_) detail::raise_usage(std::string(call) + ": this sequence keeps no page digests (enable_digests)");
  }
  void check_tier(const char* call) const {
    if (!tier_) detail::raise_usage(std::string(call) + ": this sequence has no host tier (enable_host_tier)");
  }
  void check_page(std::size_t page, const char* call) const {
    if (page >= num_pages())
      detail::raise_input(std::string(call) + ": page " + detail::to_text(page) + " does not exist (" +
                          detail::to_text(num_pages()) + " pages)");
  }
  // The original page index of each of `pages` (a host store's key).
  [[nodiscard]] std::vector<std::uint64_t> origins_of(std::span<const std::size_t> pages) const {
    std::vector<std::uint64_t> out;
    out.reserve(pages.size());
    for (std::size_t p : pages) out.push_back(state_.page_origins()[p]);
    return out;
  }
  // A store's copy of every page or none: a short count releases what it copied and raises.
  template <class Store, class SequenceId, class Block>
  static void copy_all_to_host(Store& store, const SequenceId& seq, std::span<const std::uint64_t> origins,
                               const std::vector<Block>& blocks, const char* call) {
    const std::size_t copied = store.copy_to_host(seq, origins, std::span<const Block>(blocks));
    if (copied == origins.size()) return;
    store.release(seq, origins.first(std::min(copied, origins.size())));
    detail::raise_input(std::string(call) + ": the host store copied " + detail::to_text(copied) + " of " +
                        detail::to_text(origins.size()) + " pages to the host (nothing changed)");
  }
  template <class Store, class SequenceId, class Block>
  static void copy_all_to_device(Store& store, const SequenceId& seq, std::span<const std::uint64_t> origins,
                                 const std::vector<Block>& blocks, const char* call) {
    const std::size_t copied = store.copy_to_device(seq, origins, std::span<const Block>(blocks));
    if (copied != origins.size())
      detail::raise_input(std::string(call) + ": the host store copied " + detail::to_text(copied) + " of " +
                          detail::to_text(origins.size()) + " pages to the device (nothing changed)");
  }
  // Where a recall plan's pages are in the device table: the displaced pages' indices now (remove_now) and once
  // the insertion is done (remove_at), and the promoted pages' final indices (insert_at), each in the table as the
  // other step leaves it: the device pages before a page (staying ones only, for an insertion after the removal)
  // plus the promoted before it. `leaving` holds the displaced pages' held indices.
  struct recall_table_positions {
    std::vector<std::size_t> remove_now, remove_at, insert_at, leaving;
  };
  [[nodiscard]] recall_table_positions recall_positions(const recall_plan& plan, bool insert_first) const {
    recall_table_positions at;
    const std::size_t displaced = plan.demote.size() + plan.drop.size();
    at.remove_now.reserve(displaced);
    at.remove_at.reserve(displaced);
    at.leaving.reserve(displaced);
    at.insert_at.reserve(plan.promote.size());
    std::size_t device_before = 0, staying_before = 0;
    for (std::size_t p = 0, a = 0, b = 0, c = 0; p < num_pages(); ++p) {
      if (a < plan.promote.size() && plan.promote[a] == p) {
        at.insert_at.push_back((insert_first ? device_before : staying_before) + a++);
        continue;
      }
      if (tier_->on_host(p)) continue;
      const bool demoted = b < plan.demote.size() && plan.demote[b] == p;
      const bool dropped = c < plan.drop.size() && plan.drop[c] == p;
      b += demoted, c += dropped;
      if (demoted || dropped) {
        at.remove_now.push_back(device_before);
        at.remove_at.push_back(device_before + (insert_first ? a : 0));
        at.leaving.push_back(p);
      } else {
        ++staying_before;
      }
      ++device_before;
    }
    return at;
  }
  template <class Table>
  static void check_room_after_removal(const Table& table, const typename Table::sequence_id& seq,
                                       const recall_table_positions& at) {
    std::size_t freed = 0;
    for (std::size_t i : at.remove_now) freed += table.ref_count(table.page_at(seq, i)) == 1 ? 1 : 0;
    if (table.free_blocks() + freed < at.insert_at.size())
      detail::raise_input("commit_recall: the device table has " + detail::to_text(table.free_blocks()) +
                          " free blocks (" + detail::to_text(table.free_blocks() + freed) +
                          " after the removal), the recall needs " + detail::to_text(at.insert_at.size()));
  }
  // A table removal whose answer names every page asked for (a broken table raises before the state follows).
  template <class Table>
  static page_removal<typename Table::page_id> remove_checked(Table& table, const typename Table::sequence_id& seq,
                                                              std::span<const std::size_t> pages) {
    auto removal = table.remove_pages(seq, pages);
    detail::check_removal_answer(removal, pages.size());
    return removal;
  }
  // Undoes a swap's removal: the removed pages go back to their places, in the blocks they left.
  template <class Table>
  static void put_back(Table& table, const typename Table::sequence_id& seq, std::span<const std::size_t> at,
                       const std::vector<typename Table::page_id>& removed) {
    if (table.insert_pages(seq, at) != removed)
      detail::raise_usage(
          "commit_recall: the device table put the displaced pages back into other blocks than it freed; their "
          "K/V is still in the freed blocks (a table that reuses the last freed blocks first, as block_pool, or a "
          "host store, keeps a failed swap exact)");
  }
  // Whether any page is on the host: only then do device and held indices differ.
  [[nodiscard]] bool hosting() const noexcept { return tier_ && tier_->host_pages() != 0; }
  // A device-token column as a held-token one (host tokens receive no attention).
  [[nodiscard]] std::vector<Float> expand_device(std::span<const Float> device) const {
    std::vector<Float> held(kv_len());
    detail::expand_device_tokens<Float>(device, *tier_, page_size(), std::span<Float>(held));
    return held;
  }
  // The device pages' columns of a heads x held-pages matrix.
  [[nodiscard]] std::vector<float> device_columns(std::span<const float> held, std::size_t heads) const {
    const std::size_t n = num_pages(), d = device_pages();
    std::vector<float> out;
    out.reserve(heads * d);
    for (std::size_t j = 0; j < heads; ++j)
      for (std::size_t p = 0; p < n; ++p)
        if (!tier_->on_host(p)) out.push_back(held[j * n + p]);
    return out;
  }
  // A validated held-token observation through the policy's own check.
  std::size_t observe_held(const std::vector<Float>& held) {
    policy_.check_observation(view(), std::span<const Float>(held));
    return apply(held);
  }
  // Whether page `page` may go to host under the tier's region rule.
  [[nodiscard]] bool worthy_of_host(std::size_t page) const noexcept {
    return detail::host_worthy(state_.regions().subspan(page * page_size(), page_size()), regions_,
                               tier_->config().min_host_priority);
  }
  // Which of the plan's victims go to host and which host pages are dropped for them (detail::split_demotion).
  void split_for_host(plan_type& plan, std::span<const Float> scores) const {
    std::vector<std::uint8_t> worthy(plan.pages.size());
    for (std::size_t v = 0; v < plan.pages.size(); ++v) worthy[v] = worthy_of_host(plan.pages[v]);
    auto split = detail::split_demotion<Float>(plan.pages, worthy, *tier_, scores, host_capacity());
    plan.demoted = std::move(split.demoted);
    plan.host_dropped = std::move(split.host_dropped);
  }
  void check_tiered_plan(const plan_type& plan, std::string_view where = {}) const {
    const std::string prefix = detail::context_prefix(where);
    detail::check_plan_made_for(plan.generation, plan.page_size, state_, where);
    if (auto problem = state_.removal_problem(plan.pages); !problem.empty()) detail::raise_usage(prefix + problem);
    detail::check_plan_statuses(plan.pages, page_statuses(), where);
    detail::check_ascending(plan.demoted, "demoted", where);
    for (std::size_t p : plan.demoted)
      if (!std::binary_search(plan.pages.begin(), plan.pages.end(), p))
        detail::raise_usage(prefix + "plan demotes page " + detail::to_text(p) +
                            ", which it does not take off the device");
    detail::check_ascending(plan.host_dropped, "host_dropped", where);
    for (std::size_t p : plan.host_dropped)
      if (p >= num_pages() || !tier_->on_host(p))
        detail::raise_usage(prefix + "plan drops page " + detail::to_text(p) +
                            " from the host tier, and it is not there");
    check_host_budget(host_pages() - plan.host_dropped.size() + plan.demoted.size(), prefix + "plan");
  }
  // The host tier's capacity in pages now (a ratio budget follows the logical length).
  [[nodiscard]] std::size_t host_capacity() const {
    return tier_->config().host_capacity_pages(page_size(), logical_len());
  }
  // usage_error, "<what> leaves N pages on a host tier of M", unless `after` host pages fit the host budget: every
  // commit, eviction or recall, keeps the tier within it.
  void check_host_budget(std::size_t after, std::string_view what) const {
    if (const std::size_t capacity = host_capacity(); after > capacity)
      detail::raise_usage(std::string(what) + " leaves " + detail::to_text(after) + " pages on a host tier of " +
                          detail::to_text(capacity));
  }
  void apply_recall(const recall_plan& plan) {
    if (plan.promote.empty() && plan.demote.empty() && plan.drop.empty()) return;
    tier_->promote(plan.promote, now());
    tier_->demote(plan.demote);
    state_.touch();
    remove(plan.drop);
  }
  // Demotes, then drops what leaves the sequence (the victims not demoted and the host pages dropped), together.
  void apply_plan(const plan_type& plan) {
    if (!tier_) return remove(plan.pages);
    std::vector<std::size_t> leaving;
    leaving.reserve(plan.pages.size() - plan.demoted.size() + plan.host_dropped.size());
    std::set_difference(plan.pages.begin(), plan.pages.end(), plan.demoted.begin(), plan.demoted.end(),
                        std::back_inserter(leaving));
    const std::size_t victims = leaving.size();
    leaving.insert(leaving.end(), plan.host_dropped.begin(), plan.host_dropped.end());
    std::inplace_merge(leaving.begin(), leaving.begin() + static_cast<std::ptrdiff_t>(victims), leaving.end());
    tier_->demote(plan.demoted);
    if (!plan.demoted.empty()) state_.touch();
    remove(leaving);
  }
  // The host tier's displace_lowest rule: of the evictable device pages, only the k lowest-scoring (the evictor's
  // own order: score, then page) may make room for a recall; the others are kept as if protected.
  void keep_all_but_lowest(std::vector<page_status>& status, std::size_t k) const {
    std::vector<Float> computed;
    const auto scores = current_page_scores(computed);
    const auto lowest = simd::select_lowest_pages_fast<Float>(scores, status, k);
    std::vector<std::uint8_t> displaceable(status.size(), 0);
    for (std::size_t p : lowest) displaceable[p] = 1;
    for (std::size_t p = 0; p < status.size(); ++p)
      if (status[p] == page_status::evictable && !displaceable[p]) status[p] = page_status::protected_;
  }
  // The k best host pages and the k weakest displaceable device pages by bound (k = max_recall_pages), from one
  // sweep over the bounds and the host and pinned flags (simd/recall_select.hpp); the other page rules are asked
  // of the pages the sweep offers only. Pages without a bound to judge them by (no digest, or a NaN bound) are
  // nobody's candidate.
  [[nodiscard]] simd::recall_candidates recall_candidates_for(std::span<const float> best,
                                                               std::span<const std::size_t> caller_protected) const {
    const auto& rules = tier_->config();
    const auto judged = [this](std::size_t p) { return !digests_ || digests_->has_digest(p); };
    if (const std::size_t k = rules.displace_lowest; k != 0) {
      // The evictor's k lowest-scoring evictable pages are the only displaceable ones: that needs every status.
      auto status = page_statuses(caller_protected);
      keep_all_but_lowest(status, k);
      return simd::select_recall_candidates(
          best, tier_->host_flags(), pinned_.flags(), rules.max_recall_pages, judged,
          [&](std::size_t p) { return status[p] == page_status::evictable && judged(p); });
    }
    const auto place = detail::place_ranges_of(state_, protection());
    std::vector<std::size_t> guarded(caller_protected.begin(), caller_protected.end());
    std::sort(guarded.begin(), guarded.end());
    const step_t now_step = now();
    return simd::select_recall_candidates(
        best, tier_->host_flags(), pinned_.flags(), rules.max_recall_pages, judged, [&](std::size_t p) {
          return place.evictable(p) && !tier_->recently_recalled(p, now_step) &&
                 !std::binary_search(guarded.begin(), guarded.end(), p) && judged(p);
        });
  }
  [[nodiscard]] recall_plan recall_for_bounds(std::span<const float> best,
                                              std::span<const std::size_t> caller_protected) const {
    return recall_from(recall_candidates_for(best, caller_protected));
  }
  [[nodiscard]] recall_plan recall_from(simd::recall_candidates candidates) const {
    recall_plan plan;
    plan.page_size = page_size();
    plan.generation = generation();
    const auto& rules = tier_->config();
    auto& host = candidates.host;
    auto& device = candidates.device;
    if (device.size() > host.size()) device.resize(host.size());  // a plan displaces at most what it promotes
    const auto marks = config_.budget.in_tokens(page_size(), logical_len());
    std::size_t room =
        marks.high > device_len() ? static_cast<std::size_t>((marks.high - device_len()) / page_size()) : 0;
    // A host page must beat the weakest device page still kept by the hysteresis, with room or without: room
    // between the watermarks is not a reason to bring back what the device would not keep.
    std::size_t promoted = 0, displaced = 0;
    for (; promoted < host.size(); ++promoted) {
      const bool has_weakest = displaced < device.size();
      if (has_weakest &&
          !(static_cast<double>(host[promoted].first) > static_cast<double>(device[displaced].first) + rules.hysteresis))
        break;
      if (room > 0)
        --room;
      else if (has_weakest)
        ++displaced;
      else
        break;
    }
    // The plan lists pages in ascending order (sized once: a plan is built on every decode step).
    std::sort(host.begin(), host.begin() + static_cast<std::ptrdiff_t>(promoted),
              [](const simd::bounded_page& a, const simd::bounded_page& b) { return a.second < b.second; });
    plan.promote.reserve(promoted);
    plan.promote_bounds.reserve(promoted);
    for (std::size_t j = 0; j < promoted; ++j)
      plan.promote.push_back(host[j].second), plan.promote_bounds.push_back(host[j].first);
    // The displaced pages worth the host first (the region rule asked once per page), then the rest.
    const auto leaving = device.begin() + static_cast<std::ptrdiff_t>(displaced);
    const auto unworthy = std::partition(device.begin(), leaving,
                                         [this](const simd::bounded_page& d) { return worthy_of_host(d.second); });
    plan.demote.reserve(static_cast<std::size_t>(unworthy - device.begin()));
    plan.drop.reserve(static_cast<std::size_t>(leaving - unworthy));
    for (auto d = device.begin(); d != leaving; ++d) (d < unworthy ? plan.demote : plan.drop).push_back(d->second);
    std::sort(plan.demote.begin(), plan.demote.end());
    std::sort(plan.drop.begin(), plan.drop.end());
    return plan;
  }
  template <class AppendToState>
  void grow(std::size_t tokens, AppendToState&& append_to_state) {
    if (tokens == 0) return;
    const std::size_t first = kv_len();
    const std::size_t pages_before = num_pages();
    policy_.reserve(first + tokens);  // may throw bad_alloc; the policy is unchanged when it does
    if (digests_) digests_->reserve(tokens / page_size() + 1);
    if (tier_) tier_->reserve(pages_before + tokens / page_size() + 1);
    pinned_.reserve(pages_before + tokens / page_size() + 1);
    append_to_state();  // strong guarantee
    pinned_.appended(state_, first);  // within the capacity reserved above
    policy_.on_append(view(), first);
    if (digests_) {  // cannot allocate: reserved above
      if (first % page_size() != 0 && digests_->has_digest(pages_before - 1))
        digests_->clear(pages_before - 1);  // the partial page grew: its digest no longer covers its keys
      digests_->resize(num_pages());
    }
    if (tier_) tier_->resize(num_pages());  // within the capacity reserved above
  }
  // How observe_rows reads the rows (measured: docs/performance.md): one float32 row in place, one row a block at a
  // time into the policy (MemDecay but zscore, no tier), else reduced once into a float vector.
  enum class rows_path : std::uint8_t { in_place, blocks, reduced };
  [[nodiscard]] rows_path path_of(const attention_rows& rows) const noexcept {
    if constexpr (std::same_as<Float, float>)
      if (rows.rows() == 1 && rows.format() == mass_format::f32) return rows_path::in_place;
    return observes_rows_in_blocks() && rows.rows() == 1 ? rows_path::blocks : rows_path::reduced;
  }
  // The one float32 row of rows_path::in_place, as the score type's span (only float scores take that path).
  [[nodiscard]] static std::span<const Float> in_place_mass(const attention_rows& rows) noexcept {
    if constexpr (std::same_as<Float, float>)
      return {rows.f32_row(0), rows.tokens()};
    else
      return {};
  }
  [[nodiscard]] Float observation_scale() const noexcept {
    if constexpr (requires { policy_.observation_scale(view()); })
      return policy_.observation_scale(view());
    else
      return Float{1};
  }
  // check_observe_rows, keeping the reduced mass when the observation reads one (rows_path::reduced; empty
  // otherwise), so that basic_manager::observe_batch applies it with nothing left that can fail.
  [[nodiscard]] std::vector<Float> check_rows_for_batch(const attention_rows& rows) const {
    check_rows_shape(rows);
    switch (path_of(rows)) {
      case rows_path::in_place:
        return check_tokens_for_batch(in_place_mass(rows));
      case rows_path::blocks:
        check_rows_in_blocks(rows);
        return {};
      case rows_path::reduced:
        break;
    }
    std::vector<Float> mass(rows.tokens());
    if (observes_rows_in_blocks()) {
      reduce_checked(rows, 0, rows.tokens(), mass.data(), observation_scale());
      return mass;
    }
    reduce_checked(rows, 0, rows.tokens(), mass.data(), Float{1});
    auto held = check_tokens_for_batch(std::span<const Float>(mass));
    return hosting() ? held : mass;
  }
  // check_observe_tokens, keeping the held-token mass (zeros on the host pages) of a sequence with pages on the
  // host, empty otherwise: what observe_checked applies, with nothing left that can fail.
  [[nodiscard]] std::vector<Float> check_tokens_for_batch(std::span<const Float> mass) const {
    if (!hosting()) {
      check_observe_tokens(mass);
      return {};
    }
    validate_mass(mass, device_len(), "per-token attention");
    auto held = expand_device(mass);
    policy_.check_observation(view(), std::span<const Float>(held));
    return held;
  }
  // basic_manager::observe_batch of rows: check_rows_for_batch passed and gave `prepared` (the reduced mass, or the
  // held-token mass of a sequence with pages on the host). Cannot fail.
  std::size_t observe_rows_checked(const attention_rows& rows, std::span<const Float> prepared) {
    if (hosting()) return apply(prepared);
    switch (path_of(rows)) {
      case rows_path::in_place:
        return apply(in_place_mass(rows));
      case rows_path::blocks:
        return apply_rows(rows);
      case rows_path::reduced:
        break;
    }
    return apply(prepared);
  }
  // observe_rows: whether the policy takes rows a block at a time and checks masses at one scale (MemDecay, not
  // zscore, no host tier).
  [[nodiscard]] bool observes_rows_in_blocks() const noexcept {
    if constexpr (requires { policy_.observes_in_blocks(view()); })
      return !hosting() && policy_.observes_in_blocks(view());
    else
      return false;
  }
  void check_rows_shape(const attention_rows& rows) const {
    if (rows.tokens() != device_len())
      detail::raise_input(std::string("attention rows (") + to_string(rows.format()) + ") have " +
                          detail::to_text(rows.tokens()) + " tokens, expected " + detail::to_text(device_len()));
  }
  // Tokens [begin, begin + count) of `rows`, reduced, into out; if any is bad, the input_error of the whole rows
  // (raise_rows_error), so that the message does not depend on how the rows were cut.
  static void reduce_checked(const attention_rows& rows, std::size_t begin, std::size_t count, Float* out,
                             Float scale) {
    if constexpr (std::same_as<Float, float>) {
      if (simd::reduce_rows_checked(rows, begin, count, out, scale)) return;
    } else {
      reduce_rows_reference<Float>(rows, begin, count, out);
      if (!first_bad_element(rows, begin, count) &&
          std::all_of(out, out + count, [scale](Float m) { return std::isfinite(scale * m); }))
        return;
    }
    raise_rows_error(rows, scale);
  }
  // The error of bad rows: the first element (in token order, then row order) that is not finite and >= 0; if
  // there is none, the first token whose reduced mass times `scale` is not finite.
  [[noreturn]] static void raise_rows_error(const attention_rows& rows, Float scale) {
    check_row_elements(rows, 0, rows.tokens());
    Float m{};
    for (std::size_t t = 0; t < rows.tokens(); ++t) {
      reduce_rows_reference<Float>(rows, t, 1, &m);
      if (!std::isfinite(scale * m))
        detail::raise_input(std::string("attention rows (") + to_string(rows.format()) + "): token " +
                            detail::to_text(t) + " reduces to " + detail::to_text(m) +
                            ", which is not finite once normalised (x " + detail::to_text(scale) + ")");
    }
    detail::raise_usage("attention rows: the check failed, but no element or reduced mass is bad");
  }
  // observe_rows's first sweep over one row, a block at a time into the cache (nothing is kept).
  void check_rows_in_blocks(const attention_rows& rows) const {
    if constexpr (requires { policy_type::observe_block_tokens; }) {
      const Float scale = policy_.observation_scale(view());
      alignas(64) std::array<Float, policy_type::observe_block_tokens> block;
      for (std::size_t begin = 0; begin < rows.tokens(); begin += block.size())
        reduce_checked(rows, begin, std::min(block.size(), rows.tokens() - begin), block.data(), scale);
    }
  }
  // observe_rows of one row after check_rows_in_blocks passed: the policy takes it a block at a time.
  std::size_t apply_rows(const attention_rows& rows) {
    std::size_t refreshed = 0;
    if constexpr (requires { policy_type::observe_block_tokens; }) {
      refreshed = policy_.on_observe_blocks(view(), [&rows](std::size_t begin, std::size_t count, Float* out) {
        if constexpr (std::same_as<Float, float>)
          simd::reduce_rows(rows, begin, count, out);
        else
          reduce_rows_reference<Float>(rows, begin, count, out);
      });
      state_.touch();
    }
    return refreshed;
  }
  // basic_manager::observe_batch: an observation check_tokens_for_batch has passed and gave `held`. Cannot fail.
  std::size_t observe_checked(std::span<const Float> mass, std::span<const Float> held) {
    return apply(hosting() ? held : mass);
  }
  std::size_t apply(std::span<const Float> mass) {
    const std::size_t refreshed = policy_.on_observe(view(), mass);
    state_.touch();
    return refreshed;
  }
  void remove(std::span<const std::size_t> pages) {
    if (pages.empty()) return;
    policy_.on_remove(view(), pages);
    if (digests_) digests_->remove_pages(pages);  // cannot fail either: the same indices
    if (tier_) tier_->remove_pages(pages);
    pinned_.remove_pages(pages);
    state_.remove_pages(pages);  // cannot fail: check_plan validated the same indices
  }
  // commit_recall(plan, table, seq) without the ownership check (basic_manager checks its own rules first).
  template <class Table>
  recall_commit<typename Table::page_id> recall_into(const recall_plan& plan, Table& table,
                                                     const typename Table::sequence_id& seq) {
    check_recall(plan);
    detail::check_page_table(table, seq, page_size(), device_pages(), "commit_recall");
    const bool insert_first = table.free_blocks() >= plan.promote.size();
    const auto at = recall_positions(plan, insert_first);
    table.check_remove_pages(seq, at.remove_now);
    recall_commit<typename Table::page_id> out;
    if (insert_first) {
      out.inserted = table.insert_pages(seq, at.insert_at);
      out.removed = detail::or_undo([&] { return remove_checked(table, seq, at.remove_at); },
                                    [&] { (void)table.remove_pages(seq, at.insert_at); });
    } else {
      check_room_after_removal(table, seq, at);
      out.removed = remove_checked(table, seq, at.remove_now);
      out.inserted = detail::or_undo([&] { return table.insert_pages(seq, at.insert_at); },
                                     [&] { put_back(table, seq, at.remove_now, out.removed.removed); });
    }
    apply_recall(plan);
    return out;
  }
  // commit_recall(plan, table, seq, store) without the ownership check.
  template <class Table, class Store>
  recall_commit<typename Table::page_id> recall_into(const recall_plan& plan, Table& table,
                                                     const typename Table::sequence_id& seq, Store& store) {
    using block = typename Table::page_id;
    check_recall(plan);
    detail::check_page_table(table, seq, page_size(), device_pages(), "commit_recall");
    const bool insert_first = table.free_blocks() >= plan.promote.size();
    const auto at = recall_positions(plan, insert_first);
    table.check_remove_pages(seq, at.remove_now);
    if (!insert_first) check_room_after_removal(table, seq, at);
    const auto promoted = origins_of(plan.promote), demoted = origins_of(plan.demote), dropped = origins_of(plan.drop);
    // Displaced pages in page order (demoted and dropped merged), their origins and blocks; the demoted ones' too.
    std::vector<std::uint64_t> displaced;
    std::vector<block> displaced_blocks, demoted_blocks;
    displaced.reserve(at.remove_now.size());
    displaced_blocks.reserve(at.remove_now.size());
    demoted_blocks.reserve(plan.demote.size());
    for (std::size_t k = 0, d = 0; k < at.leaving.size(); ++k) {
      displaced.push_back(state_.page_origins()[at.leaving[k]]);
      displaced_blocks.push_back(table.page_at(seq, at.remove_now[k]));
      if (d < plan.demote.size() && plan.demote[d] == at.leaving[k])
        demoted_blocks.push_back(displaced_blocks.back()), ++d;
    }
    recall_commit<block> out;
    if (insert_first) {
      copy_all_to_host(store, seq, demoted, demoted_blocks, "commit_recall");
      detail::or_undo(
          [&] {
            out.inserted = table.insert_pages(seq, at.insert_at);
            detail::or_undo(
                [&] {
                  copy_all_to_device(store, seq, promoted, out.inserted, "commit_recall");
                  out.removed = remove_checked(table, seq, at.remove_at);
                },
                [&] { (void)table.remove_pages(seq, at.insert_at); });
          },
          [&] { store.release(seq, demoted); });
    } else {
      copy_all_to_host(store, seq, displaced, displaced_blocks, "commit_recall");
      detail::or_undo(
          [&] {
            out.removed = remove_checked(table, seq, at.remove_now);
            bool inserted = false;
            detail::or_undo(
                [&] {
                  out.inserted = table.insert_pages(seq, at.insert_at);
                  inserted = true;
                  copy_all_to_device(store, seq, promoted, out.inserted, "commit_recall");
                },
                [&] {
                  if (inserted) (void)table.remove_pages(seq, at.insert_at);
                  const auto back = table.insert_pages(seq, at.remove_now);
                  // The promotions may have written into the blocks the displaced pages get back.
                  if (inserted || back != out.removed.removed)
                    copy_all_to_device(store, seq, displaced, back, "commit_recall");
                });
          },
          [&] { store.release(seq, displaced); });
      store.release(seq, dropped);
    }
    store.release(seq, promoted);
    apply_recall(plan);
    return out;
  }
  // commit(plan, table, seq, store) after its checks: the demoted pages' K/V to the host, the table's removal, the
  // dropped host copies released, then the state (basic_manager commits a managed sequence's plan through it).
  template <class Table, class Store>
  page_removal<typename Table::page_id> remove_with_store(const plan_type& plan, Table& table,
                                                          const typename Table::sequence_id& seq, Store& store) {
    if (!tier_) return remove_from(plan, table, seq);
    const auto device_indices = tier_->device_indices(plan.pages);
    if constexpr (checked_page_table<Table>) table.check_remove_pages(seq, device_indices);
    const auto demoted = origins_of(plan.demoted);
    const auto host_dropped = origins_of(plan.host_dropped);
    std::vector<typename Table::page_id> blocks;
    blocks.reserve(plan.demoted.size());
    for (std::size_t p : plan.demoted) blocks.push_back(table.page_at(seq, tier_->device_index(p)));
    copy_all_to_host(store, seq, demoted, blocks, "commit");
    auto removal = detail::or_undo(
        [&] {
          auto r = table.remove_pages(seq, device_indices);
          detail::check_removal_answer(r, device_indices.size());
          return r;
        },
        [&] { store.release(seq, demoted); });
    store.release(seq, host_dropped);
    apply_plan(plan);
    return removal;
  }
  // The table first (it may throw, and nothing here has changed yet), then the state.
  template <class Table>
  page_removal<typename Table::page_id> remove_from(const plan_type& plan, Table& table,
                                                    const typename Table::sequence_id& seq) {
    // The table holds the device pages only: it removes every page leaving the device, demoted or dropped (the
    // engine copied the demoted ones to host before committing).
    std::vector<std::size_t> device_indices;
    if (hosting()) device_indices = tier_->device_indices(plan.pages);
    auto removal = table.remove_pages(
        seq, hosting() ? std::span<const std::size_t>(device_indices) : std::span<const std::size_t>(plan.pages));
    detail::check_removal_answer(removal, plan.pages.size());
    apply_plan(plan);
    return removal;
  }

  config config_;
  region_table regions_;
  state_type state_;
  policy_type policy_;
  detail::manager_mark mark_;
  std::uint64_t clock_moved_at_ = std::numeric_limits<std::uint64_t>::max();  // the generation of the last clock move
  std::uint64_t content_before_clock_ = 0;  // the generation before the run of clock moves that ends there
  std::uint64_t advance_columns_at_ = 0;    // advance_columns_generation()
  pinned_pages pinned_;                     // which pages hold a pinned region's token (statuses read it)
  std::optional<page_digests> digests_;     // enable_digests
  std::optional<page_residencies> tier_;    // enable_host_tier
};

/// The layout of a MemDecay sequence with its policy's clocks and EWMA beside it: the form the scalar reference
/// (page_scores_reference) and the kernels' convenience overloads take.
template <std::floating_point Float, std::size_t PageSize>
[[nodiscard]] token_state<Float, PageSize> token_state_of(
    const basic_sequence<policies::memdecay, Float, PageSize>& seq) {
  return {seq.state(), seq.policy().last_refresh(), seq.policy().ewma()};
}

/// MemDecay, float scores, page size chosen at run time: the common case.
using sequence = basic_sequence<>;

/// Any policy, float scores, page size chosen at run time.
template <template <class> class Policy>
using policy_sequence = basic_sequence<Policy, float, dynamic_page_size>;

}  // namespace memdecay

#endif  // MEMDECAY_CORE_SEQUENCE_HPP
