// SPDX-License-Identifier: Apache-2.0
// memdecay: the eviction-policy concept. One evictor (basic_sequence, sequence.hpp) runs every
// policy under the same budgets, protections, page tables and two-phase commit; a policy only keeps its
// per-token signal and turns it into page scores (lower = evicted first, ties to the lower page index).
//
// A policy P<Float> (a class template over the score type, float or double, declared `template <class Float>`
// so that it binds to basic_sequence's template template parameter on every compiler) provides:
//
//   P::params_type                    an aggregate of the policy's parameters, defaults = the source's defaults
//   P::name                           static constexpr std::string_view, e.g. "h2o"
//   P(params, cfg, table)             validates params against the sequence's config (config_error)
//   p.reserve(n)                      capacity for n resident tokens; the only hook that may throw (bad_alloc),
//                                     and when it does the policy is unchanged
//   p.on_append(view, first)          noexcept: tokens [first, view.kv_len()) were appended at view.now
//   p.check_observation(view, mass)   const: input_error if this policy cannot take `mass` (e.g. overflow);
//                                     mass is already validated (one finite, >= 0 entry per resident token)
//   p.on_observe(view, mass)          noexcept: one observation at view.now; returns the tokens it "refreshed"
//                                     (crossed the policy's threshold; 0 for policies without one)
//   p.on_remove(view, pages)          noexcept: whole pages (strictly ascending, full, resident in `view`, the
//                                     layout before the removal) leave; compact the per-token state likewise
//   p.page_scores(view, out)          const: one score per resident page (may allocate scratch)
//   p.digest()                        const noexcept: a digest of the policy's state (for tensor-parallel checks)
// and optionally
//   p.on_advance(view)                noexcept: the clock moved to view.now (called by advance_to; a policy
//                                     whose scores cache something per step, like policies::memdecay's
//                                     exp-free factors, follows the clock here); may return bool: whether a
//                                     per-token column changed (false lets an incremental manager snapshot save
//                                     the policy's scalars only; a void hook counts as true). A policy may
//                                     also name the columns its hook rewrites (static advance_columns, field
//                                     names): a true answer then saves only those columns with the scalars
//   p.observation_is_valid(view, mass) const noexcept -> bool: a fast check of the whole observation (length
//                                     already checked); true promises that validate_mass and check_observation
//                                     would both pass, false sends the evictor to them (to name the bad entry)
//   p.explain_page(view, page, status) const: why a page scores what it scores (basic_sequence::explain_page)
//   p.token_terms(view, index)        const noexcept: a token's score terms (basic_sequence::token_terms)
//   p.use_expfree_scores(view, on)    chooses a scorer (basic_sequence::use_expfree_scores)
//
// Per-token state is kept in page order, exactly like sequence_state, so compaction is compact_token_column().
// A policy with no per-token state (random, streaming_llm) derives its hooks from stateless_hooks.
// Policies never see K/V memory, never read a wall clock, and draw randomness only from a seeded counter-based
// hash, so decisions are a pure function of the calls.
#ifndef MEMDECAY_CORE_POLICY_HPP
#define MEMDECAY_CORE_POLICY_HPP

#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string_view>
#include <vector>

#include "memdecay/core/config.hpp"
#include "memdecay/detail/error.hpp"
#include "memdecay/page_tables/page_table.hpp"
#include "memdecay/core/region.hpp"
#include "memdecay/core/retention_score.hpp"

namespace memdecay {

/// What a policy sees of a sequence: its resident layout, labels and clock, read-only. Cheap to copy.
struct sequence_view {
  std::span<const region_id> labels;            ///< one per resident token, page order
  std::span<const std::uint64_t> page_origins;  ///< each resident page's original index in the sequence
  std::size_t page_size = 1;
  step_t now = 0;
  const region_table* regions = nullptr;  ///< the region table in effect (overrides applied)

  [[nodiscard]] std::size_t kv_len() const noexcept { return labels.size(); }
  [[nodiscard]] std::size_t num_pages() const noexcept { return page_origins.size(); }
  [[nodiscard]] std::size_t page_begin(std::size_t page) const noexcept { return page * page_size; }
  [[nodiscard]] std::size_t tokens_in_page(std::size_t page) const noexcept {
    const std::size_t first = page * page_size;
    return kv_len() - first < page_size ? kv_len() - first : page_size;
  }
  /// The absolute (RoPE) position of resident token `index`.
  [[nodiscard]] std::uint64_t position_of(std::size_t index) const noexcept {
    return page_origins[index / page_size] * page_size + index % page_size;
  }
};

/// The requirements listed at the top of this header.
template <class P>
concept eviction_policy = std::floating_point<typename P::float_type> && std::copy_constructible<P> &&
    std::default_initializable<typename P::params_type> &&
    std::constructible_from<P, const typename P::params_type&, const config&, const region_table&> &&
    requires(P& p, const P& cp, const sequence_view& view, std::size_t n, std::span<const typename P::float_type> mass,
             std::span<const std::size_t> pages, std::span<typename P::float_type> out) {
  { P::name } -> std::convertible_to<std::string_view>;
  p.reserve(n);
  { p.on_append(view, n) }
  noexcept;
  cp.check_observation(view, mass);
  { p.on_observe(view, mass) }
  noexcept->std::same_as<std::size_t>;
  { p.on_remove(view, pages) }
  noexcept;
  cp.page_scores(view, out);
  { cp.digest() }
  noexcept->std::same_as<std::uint64_t>;
};

/// Whether P has the optional on_advance hook (see above); when it does, it must be noexcept.
template <class P>
concept advancing_policy = requires(P& p, const sequence_view& view) {
  { p.on_advance(view) }
  noexcept;
};

/// Whether P has the optional fast validity check of an observation (see above).
template <class P>
concept prevalidating_policy = requires(const P& p, const sequence_view& view,
                                        std::span<const typename P::float_type> mass) {
  { p.observation_is_valid(view, mass) }
  noexcept->std::same_as<bool>;
};

namespace policy_support {

/// The score a policy gives a page it wants to keep as long as anything else can go (evicted last, in page
/// order, when the budget demands it). Hard guarantees come from config.protection, not from scores.
template <std::floating_point Float>
inline constexpr Float keep_score = std::numeric_limits<Float>::infinity();

/// The hooks of a policy that keeps no per-token state (its scores follow from the layout alone): derive from it
/// and write page_scores() and digest().
template <std::floating_point Float>
struct stateless_hooks {
  void reserve(std::size_t) noexcept {}
  void on_append(const sequence_view&, std::size_t) noexcept {}
  void check_observation(const sequence_view&, std::span<const Float>) const noexcept {}
  std::size_t on_observe(const sequence_view&, std::span<const Float>) noexcept { return 0; }
  void on_remove(const sequence_view&, std::span<const std::size_t>) noexcept {}
};

/// Compacts one per-token column (page order) by removing whole `pages` (strictly ascending, full).
template <class T, class Alloc>
void compact_token_column(std::vector<T, Alloc>& column, std::span<const std::size_t> pages,
                          std::size_t page_size) noexcept {
  column.resize(compact_pages(std::span<T>(column), page_size, pages));
}

/// out[p] = mean over page p's resident tokens of token_score(i).
template <std::floating_point Float, class TokenScore>
void page_means(const sequence_view& view, std::span<Float> out, TokenScore&& token_score) noexcept {
  for (std::size_t p = 0; p < view.num_pages(); ++p) {
    const std::size_t first = view.page_begin(p), n = view.tokens_in_page(p);
    Float sum = 0;
    for (std::size_t i = first; i < first + n; ++i) sum += token_score(i);
    out[p] = sum / static_cast<Float>(n);
  }
}

/// The first page holding one of the last `recent_tokens` resident tokens (num_pages() when recent_tokens = 0).
[[nodiscard]] inline std::size_t first_recent_page(const sequence_view& view, std::size_t recent_tokens) noexcept {
  if (recent_tokens == 0 || view.kv_len() == 0) return view.num_pages();
  if (recent_tokens >= view.kv_len()) return 0;
  return (view.kv_len() - recent_tokens) / view.page_size;
}

/// input_error unless acc[i] + mass[i] stays finite for every i: a running sum the observation would overflow.
template <std::floating_point Float>
void check_sum_stays_finite(std::span<const Float> acc, std::span<const Float> mass, const char* what) {
  for (std::size_t i = 0; i < mass.size(); ++i)
    if (!std::isfinite(acc[i] + mass[i]))
      detail::raise_input("attention[" + detail::to_text(i) + "] = " + detail::to_text(mass[i]) + " overflows " + what);
}

/// splitmix64: the counter-based mixer behind seeded, reproducible randomness.
[[nodiscard]] constexpr std::uint64_t splitmix64(std::uint64_t x) noexcept {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace policy_support
}  // namespace memdecay

#endif  // MEMDECAY_CORE_POLICY_HPP
