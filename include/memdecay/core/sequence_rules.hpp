// SPDX-License-Identifier: Apache-2.0
// memdecay: the checks and budget arithmetic every sequence type shares (basic_sequence, basic_manager, the exports), so
// that their rules and error messages cannot drift apart. Each check throws before anything changes.
#ifndef MEMDECAY_CORE_SEQUENCE_RULES_HPP
#define MEMDECAY_CORE_SEQUENCE_RULES_HPP

#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "memdecay/core/config.hpp"
#include "memdecay/detail/error.hpp"
#include "memdecay/core/eviction.hpp"
#include "memdecay/page_tables/page_table.hpp"
#include "memdecay/core/region.hpp"
#include "memdecay/core/sequence_state.hpp"
#include "memdecay/simd/mass_check.hpp"
#include "memdecay/simd/select.hpp"

namespace memdecay::detail {

/// config_error unless the numbers the score multiplies fit the score type: a value finite as a double but not as
/// Float (alpha = 1e39 with float scores) would make scores inf * 0 = NaN and selection undefined.
template <std::floating_point Float>
void check_fits_score_type(const config& cfg) {
  auto fits = [](const std::string& field, double v) {
    if (!std::isfinite(static_cast<Float>(v)))
      raise_config(field + " = " + to_text(v) + " (does not fit the score type: at most " +
                   to_text(std::numeric_limits<Float>::max()) + ")");
  };
  fits("alpha", cfg.alpha);
  const region_table effective = cfg.effective_regions();
  for (std::size_t r = 0; r < effective.size(); ++r) {
    const auto& p = effective[static_cast<region_id>(r)];
    fits("region '" + p.name + "' base_priority", p.base_priority);
    fits("region '" + p.name + "' decay_rate", p.decay_rate);
  }
}

/// input_error unless `r` is a region of `table`. `what` and `k` name the offending span or label.
template <region_table_like Regions>
void check_region_id(const Regions& table, region_id r, const char* what, std::size_t k) {
  if (r >= table.size())
    raise_input(std::string(what) + " " + to_text(k) + ": unknown region id " + to_text(int{r}) + " (table has " +
                to_text(table.size()) + " regions)");
}

/// input_error unless every label of `spans` is a region of `table`.
template <region_table_like Regions>
void check_region_spans(const Regions& table, std::span<const region_span> spans) {
  for (std::size_t k = 0; k < spans.size(); ++k) check_region_id(table, spans[k].region, "span", k);
}
/// input_error unless every label is a region of `table`.
template <region_table_like Regions>
void check_region_labels(const Regions& table, std::span<const region_id> labels) {
  for (std::size_t k = 0; k < labels.size(); ++k) check_region_id(table, labels[k], "label", k);
}

/// input_error unless scale * mass[i] is finite for every i (a finite mass can overflow once normalised).
template <std::floating_point Float>
void check_scaled_finite(std::span<const Float> mass, Float scale) {
  if (simd::mass_is_valid(mass.data(), mass.size(), scale)) return;  // one branch-free pass (mass_check.hpp)
  for (std::size_t i = 0; i < mass.size(); ++i)
    if (!std::isfinite(scale * mass[i]))
      raise_input("attention[" + to_text(i) + "] = " + to_text(mass[i]) + " overflows once normalised");
}

/// Spreads per-page mass evenly over each page's resident tokens (the mass must be validated already).
template <std::floating_point Float, std::size_t PageSize>
[[nodiscard]] std::vector<Float> spread_page_mass(const sequence_state<PageSize>& state,
                                                  std::span<const Float> page_mass) {
  std::vector<Float> per_token(state.kv_len());
  for (std::size_t p = 0; p < state.num_pages(); ++p) {
    const std::size_t n = state.tokens_in_page(p);
    std::fill_n(per_token.begin() + static_cast<std::ptrdiff_t>(p * state.page_size()), n,
                page_mass[p] / static_cast<Float>(n));
  }
  return per_token;
}

/// How many pages the budget asks to evict: none while kv_len is within the high watermark, otherwise enough to
/// reach the low watermark (rounded up to whole pages).
[[nodiscard]] inline std::size_t pages_wanted_by_budget(const budget_config& budget, std::size_t page_size,
                                                        std::uint64_t logical_len, std::uint64_t kv_len) noexcept {
  const auto marks = budget.in_tokens(page_size, logical_len);
  if (kv_len <= marks.high) return 0;
  return static_cast<std::size_t>((kv_len - marks.low + page_size - 1) / page_size);
}

/// Pages by which `resident_after` tokens still exceed the high watermark.
[[nodiscard]] inline std::size_t pages_over_high(const budget_config& budget, std::size_t page_size,
                                                 std::uint64_t logical_len, std::uint64_t resident_after) noexcept {
  const auto marks = budget.in_tokens(page_size, logical_len);
  if (resident_after <= marks.high) return 0;
  return static_cast<std::size_t>((resident_after - marks.high + page_size - 1) / page_size);
}

/// The plan that evicts `pages` (ascending, chosen by the caller), `requested` being what was asked for.
/// `resident` is what the budget counts (the device tokens: all of kv_len() without a host tier).
template <std::floating_point Float, std::size_t PageSize>
[[nodiscard]] eviction_plan<Float> plan_for_pages(const sequence_state<PageSize>& state, const budget_config& budget,
                                                  std::span<const Float> scores, std::vector<std::size_t> pages,
                                                  std::size_t requested, std::optional<std::uint64_t> resident = {}) {
  eviction_plan<Float> plan;
  plan.requested = requested;
  plan.page_size = state.page_size();
  plan.generation = state.generation();
  plan.pages = std::move(pages);
  plan.scores.reserve(plan.pages.size());
  for (std::size_t p : plan.pages) plan.scores.push_back(scores[p]);
  plan.pages_over_budget = pages_over_high(budget, state.page_size(), state.logical_len(),
                                           resident.value_or(state.kv_len()) - plan.tokens());
  return plan;
}

/// The plan that evicts the k lowest-scoring evictable pages (ties to the lower index).
template <std::floating_point Float, std::size_t PageSize>
[[nodiscard]] eviction_plan<Float> make_plan(const sequence_state<PageSize>& state, const budget_config& budget,
                                             std::span<const Float> scores, std::span<const page_status> status,
                                             std::size_t k, std::optional<std::uint64_t> resident = {}) {
  return plan_for_pages<Float>(state, budget, scores, simd::select_lowest_pages_fast<Float>(scores, status, k), k,
                               resident);
}

/// "<where>: " when the caller names itself (the manager: "commit: sequence 7"), nothing otherwise.
[[nodiscard]] inline std::string context_prefix(std::string_view where) {
  return where.empty() ? std::string{} : std::string(where) + ": ";
}

/// usage_error unless a plan (eviction or recall) made at `generation` for `page_size` fits the state now.
template <std::size_t PageSize>
void check_plan_made_for(std::uint64_t generation, std::size_t page_size, const sequence_state<PageSize>& state,
                         std::string_view where = {}) {
  if (generation != state.generation())
    raise_usage(context_prefix(where) + "stale plan: selected at generation " + to_text(generation) +
                ", the sequence is at generation " + to_text(state.generation()));
  if (page_size != state.page_size())
    raise_usage(context_prefix(where) + "plan was made for page size " + to_text(page_size));
}

/// usage_error unless every page of `pages` has status evictable.
inline void check_plan_statuses(std::span<const std::size_t> pages, std::span<const page_status> status,
                                std::string_view where = {}) {
  for (std::size_t p : pages)
    if (status[p] != page_status::evictable)
      raise_usage(context_prefix(where) + "plan names page " + to_text(p) + ", which is " + to_string(status[p]));
}

/// usage_error unless `pages` is strictly ascending. `what` names the list.
inline void check_ascending(std::span<const std::size_t> pages, const char* what, std::string_view where = {}) {
  for (std::size_t k = 1; k < pages.size(); ++k)
    if (pages[k] <= pages[k - 1])
      raise_usage(context_prefix(where) + what + " must be strictly ascending (page " + to_text(pages[k]) + " after " +
                  to_text(pages[k - 1]) + ")");
}

/// usage_error unless `plan` was made at the state's current generation, for its page size, and names only
/// resident, full pages whose `status` (the sequence's page_statuses under the protections in effect) is
/// evictable, in strictly ascending order. `where` prefixes the message (the call and the request).
template <std::floating_point Float, std::size_t PageSize>
void check_plan(const eviction_plan<Float>& plan, const sequence_state<PageSize>& state,
                std::span<const page_status> status, std::string_view where = {}) {
  check_plan_made_for(plan.generation, plan.page_size, state, where);
  if (!plan.demoted.empty() || !plan.host_dropped.empty())
    raise_usage(context_prefix(where) + "plan moves pages to or from a host tier, and this sequence has none");
  if (auto problem = state.removal_problem(plan.pages); !problem.empty()) raise_usage(context_prefix(where) + problem);
  check_plan_statuses(plan.pages, status, where);
}

/// usage_error unless `table` agrees with a sequence of `num_pages` pages of `page_size` tokens. `where`
/// prefixes the message.
template <page_table Table>
void check_page_table(const Table& table, const typename Table::sequence_id& seq, std::size_t page_size,
                      std::size_t num_pages, std::string_view where = {}) {
  if (static_cast<std::size_t>(table.page_size()) != page_size)
    raise_usage(context_prefix(where) + "page table has page size " + to_text(table.page_size()) + ", sequence has " +
                to_text(page_size));
  if (static_cast<std::size_t>(table.num_pages(seq)) != num_pages)
    raise_usage(context_prefix(where) + "page table holds " + to_text(table.num_pages(seq)) +
                " pages for this sequence, the sequence has " + to_text(num_pages));
}

/// Throws usage_error, before the state follows, if a table's removal does not name every page it was asked to
/// remove (a broken adapter: the state is then left as it was, and the table must be re-synchronised).
template <class Removal>
void check_removal_answer(const Removal& removal, std::size_t asked) {
  if (removal.removed.size() != asked)
    raise_usage("commit: the page table reports " + to_text(removal.removed.size()) + " removed pages, " +
                to_text(asked) + " were asked (a broken page table; the state is unchanged)");
}

}  // namespace memdecay::detail

#endif  // MEMDECAY_CORE_SEQUENCE_RULES_HPP
