// SPDX-License-Identifier: Apache-2.0
// memdecay: what the manager and the exports need from a sequence. basic_sequence<Policy, Float, PageSize>
// models it for every policy, so one manager and one set of exports serve MemDecay and every baseline.
#ifndef MEMDECAY_CORE_SEQUENCE_LIKE_HPP
#define MEMDECAY_CORE_SEQUENCE_LIKE_HPP

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "memdecay/core/config.hpp"
#include "memdecay/core/eviction.hpp"
#include "memdecay/core/policy.hpp"
#include "memdecay/core/region.hpp"
#include "memdecay/core/retention_score.hpp"

namespace memdecay {

/// A sequence with a layout (state(): labels, page origins, generation), a config and region table, scores and
/// statuses per page, two-phase selection and commit, a clock and a digest; copyable (fork).
template <class S>
concept sequence_like = std::floating_point<typename S::float_type> && std::copy_constructible<S> &&
    std::same_as<typename S::plan_type, eviction_plan<typename S::float_type>> &&
    std::constructible_from<S, config, const typename S::params_type&> &&
    requires(S& s, const S& cs, const typename S::plan_type& plan, std::span<const std::size_t> pages, step_t t) {
  { S::static_page_size } -> std::convertible_to<std::size_t>;
  { cs.get_config() } -> std::same_as<const config&>;
  { cs.regions() } -> std::same_as<const region_table&>;
  { cs.state().page_origins() } -> std::same_as<std::span<const std::uint64_t>>;
  { cs.state().regions() } -> std::same_as<std::span<const region_id>>;
  { cs.generation() } -> std::same_as<std::uint64_t>;
  { cs.page_size() } -> std::same_as<std::size_t>;
  { cs.kv_len() } -> std::same_as<std::size_t>;
  { cs.num_pages() } -> std::same_as<std::size_t>;
  { cs.logical_len() } -> std::same_as<std::uint64_t>;
  { cs.now() } -> std::same_as<step_t>;
  { cs.position_of(std::size_t{}) } -> std::same_as<std::uint64_t>;
  { cs.prefix_cache_boundary() } -> std::same_as<std::optional<std::uint64_t>>;
  { cs.page_scores() } -> std::same_as<std::vector<typename S::float_type>>;
  { cs.page_statuses(pages) } -> std::same_as<std::vector<page_status>>;
  { cs.select_for_budget(pages) } -> std::same_as<typename S::plan_type>;
  { cs.select(std::size_t{}, pages) } -> std::same_as<typename S::plan_type>;
  { cs.protection() } -> std::same_as<protection_config>;
  cs.check_commit(plan);
  s.advance_to(t);
  { cs.digest() }
  noexcept->std::same_as<std::uint64_t>;
};

}  // namespace memdecay

#endif  // MEMDECAY_CORE_SEQUENCE_LIKE_HPP
