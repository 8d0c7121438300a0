// SPDX-License-Identifier: Apache-2.0
// The one catalogue of policies that memdecay-eval and memdecay-replay compare: each policy's name, a
// description that states its parameters beside its source, and how to build its sequence from a run's config.
//
// Every baseline runs with the parameters its source runs it with (docs/policies.md has the table, with each
// source and every place the evaluation departs from it). `policy_catalogue(options, wrap)` calls
//
//   wrap(name, description, construct)   // construct(const memdecay::config&) -> a policy_sequence<...>
//
// once per policy, in table order, and returns what `wrap` returns: both tools wrap with
// memdecay_tools::erasing_wrapper (any_sequence.hpp), into their own entry type.
#ifndef MEMDECAY_TOOLS_COMMON_POLICY_CATALOGUE_HPP
#define MEMDECAY_TOOLS_COMMON_POLICY_CATALOGUE_HPP

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <memdecay/core/config.hpp>
#include <memdecay/detail/error.hpp>
#include <memdecay/policies/h2o.hpp>
#include <memdecay/policies/memdecay.hpp>
#include <memdecay/policies/norm_sum.hpp>
#include <memdecay/policies/priority_lru.hpp>
#include <memdecay/policies/random.hpp>
#include <memdecay/policies/scissorhands.hpp>
#include <memdecay/policies/snapkv.hpp>
#include <memdecay/policies/streaming_llm.hpp>
#include <memdecay/policies/tova.hpp>
#include <memdecay/core/sequence.hpp>

namespace memdecay_tools {

/// MemDecay's parameters (unset: the per-mode defaults: none alpha 1, tau 0.01, the paper's raw shares; uniform
/// and lifetime alpha 1, tau 2 times the uniform share; zscore alpha 0.5, tau 2 standard deviations; EWMA beta
/// 0.9), and the baselines' tunable parameters (unset: their sources' values).
struct catalogue_options {
  std::optional<double> alpha, tau, ewma_beta;
  bool memdecay_page_max = false;                   ///< MemDecay pages score their best token (default: the mean)
  std::optional<double> h2o_recent_fraction;        ///< source: 0.5 (heavy_ratio = recent_ratio)
  std::optional<std::size_t> snapkv_window;         ///< source: 64 (window_size)
  std::optional<std::size_t> scissorhands_history;  ///< source: 400 (m); at most 64 here

  /// MemDecay's parameters only (the baselines at their sources' values).
  static catalogue_options memdecay(std::optional<double> alpha, std::optional<double> tau,
                                    std::optional<double> ewma_beta) {
    catalogue_options o;
    o.alpha = alpha;
    o.tau = tau;
    o.ewma_beta = ewma_beta;
    return o;
  }
};

/// The sources' parameters, in one place (docs/policies.md states each beside its source).
namespace source_params {
inline constexpr std::size_t streaming_llm_sink_tokens = 4;  ///< StartRecentKVCache(start_size=4)
inline constexpr double h2o_recent_fraction = 0.5;           ///< --heavy_ratio = --recent_ratio
inline constexpr std::size_t scissorhands_history = 64;      ///< the paper's m = 400, capped at the 64-bit history
inline constexpr std::size_t scissorhands_recent = 10;       ///< the paper's r = 10 (Cold Compress --recent_window)
inline constexpr std::size_t snapkv_window = 64;             ///< SnapKVCluster(window_size=64)
inline constexpr std::size_t snapkv_kernel = 5;              ///< kernel_size=5, pooling='avgpool'
// ArkVale (Chen et al., NeurIPS 2024; pku-liang/ArkVale source/arkvale/infer_state.py): InferState's defaults.
inline constexpr std::size_t arkvale_sink_pages = 2;    ///< n_sink_pages=2
inline constexpr std::size_t arkvale_window_pages = 2;  ///< n_win_pages=2 (the page being filled and the one before)
inline constexpr std::size_t arkvale_page_size = 32;    ///< adapter.enable_arkvale(page_size=32)
}  // namespace source_params

/// MemDecay in one normalisation mode (memdecay::sequence: the one evictor with policies::memdecay).
template <class Wrap>
auto memdecay_entry(memdecay::attention_normalization mode, const catalogue_options& o, Wrap& wrap) {
  namespace md = memdecay;
  const bool zscore = mode == md::attention_normalization::zscore;
  const double a = o.alpha.value_or(zscore ? 0.5 : 1.0);
  const double t = o.tau.value_or(mode == md::attention_normalization::none ? 0.01 : 2.0);
  const double b = o.ewma_beta.value_or(0.9);
  std::string description = "MemDecay, " + std::string(md::to_string(mode)) + " normalisation (alpha " +
                            md::detail::to_text(a) + ", tau " + md::detail::to_text(t) + ", ewma beta " +
                            md::detail::to_text(b) + ")";
  using policy = md::policies::memdecay<float>;
  const auto aggregation = o.memdecay_page_max ? policy::page_aggregation::max : policy::page_aggregation::mean;
  if (o.memdecay_page_max) description += ", pages score their best token";
  return wrap(std::string("memdecay-") + md::to_string(mode), std::move(description),
              [mode, a, t, b, aggregation](const md::config& base) {
                md::config cfg = base;
                cfg.normalization = mode;
                cfg.alpha = a;
                cfg.tau = t;
                cfg.ewma_beta = b;
                return md::policy_sequence<md::policies::memdecay>(std::move(cfg), {.aggregation = aggregation});
              });
}

/// A baseline behind the policy interface: the same evictor, budgets, protections and two-phase commit as
/// MemDecay; only the page scores differ.
template <template <class> class Policy, class Wrap>
auto baseline_entry(std::string description, typename Policy<float>::params_type params, Wrap& wrap) {
  return wrap(std::string(Policy<float>::name), std::move(description),
              [params](const memdecay::config& cfg) { return memdecay::policy_sequence<Policy>(cfg, params); });
}

/// Every policy, in table order: MemDecay's four modes, then the baselines with their sources' parameters.
template <class Wrap>
auto policy_catalogue(const catalogue_options& o, Wrap wrap) {
  namespace md = memdecay;
  namespace sp = source_params;
  using entry = decltype(baseline_entry<md::policies::tova>("", {}, wrap));
  std::vector<entry> all;
  for (auto mode : {md::attention_normalization::none, md::attention_normalization::uniform,
                    md::attention_normalization::lifetime, md::attention_normalization::zscore})
    all.push_back(memdecay_entry(mode, o, wrap));
  const double h2o_fraction = o.h2o_recent_fraction.value_or(sp::h2o_recent_fraction);
  const std::size_t history = o.scissorhands_history.value_or(sp::scissorhands_history);
  const std::size_t window = o.snapkv_window.value_or(sp::snapkv_window);
  all.push_back(baseline_entry<md::policies::random>("uniformly random pages (seed 0)", {}, wrap));
  all.push_back(baseline_entry<md::policies::streaming_llm>(
      "StreamingLLM: " + std::to_string(sp::streaming_llm_sink_tokens) + " sink tokens + the most recent pages",
      {.sink_tokens = sp::streaming_llm_sink_tokens}, wrap));
  all.push_back(baseline_entry<md::policies::h2o>("H2O: cumulative attention; recent window " +
                                                      md::detail::to_text(h2o_fraction) +
                                                      " of the budget, heavy hitters the rest",
                                                  {.recent_tokens = 0, .recent_fraction = h2o_fraction}, wrap));
  all.push_back(baseline_entry<md::policies::tova>("TOVA: the latest observation's attention", {}, wrap));
  all.push_back(baseline_entry<md::policies::scissorhands>(
      "Scissorhands: share of the last " + std::to_string(history) + " observations at >= uniform attention, recent " +
          std::to_string(sp::scissorhands_recent) + " tokens kept",
      {.history_window = history, .recent_tokens = sp::scissorhands_recent}, wrap));
  all.push_back(baseline_entry<md::policies::norm_sum>("OpenVINO NORM_SUM: cumulative attention / lifetime", {}, wrap));
  all.push_back(baseline_entry<md::policies::priority_lru>(
      "TensorRT-LLM prioritized LRU: priority round(100 b_r) per region, LRU within (refresh at >= uniform)", {},
      wrap));
  all.push_back(baseline_entry<md::policies::snapkv>(
      "SnapKV: votes of the last " + std::to_string(window) + " observations, avg-pooled over " +
          std::to_string(sp::snapkv_kernel) + " tokens",
      {.window = window, .kernel_size = sp::snapkv_kernel, .pool = md::policies::snapkv<float>::pooling::avg}, wrap));
  return all;
}

}  // namespace memdecay_tools

#endif  // MEMDECAY_TOOLS_COMMON_POLICY_CATALOGUE_HPP
