// SPDX-License-Identifier: Apache-2.0
// memdecay: region priors as TensorRT-LLM token-range retention entries.
//
// TensorRT-LLM cannot evict pages from the middle of a running request, but it ranks the blocks of finished
// requests for reuse and offload by a retention priority (executor.h, KvCacheRetentionConfig):
//   TokenRangeRetentionConfig(tokenStart, tokenEnd /* exclusive; none = to the end */, priority /* 0..100 */,
//                             durationMs /* optional: then back to the default priority, 35 */)
// "Higher priorities are less likely to be evicted or offloaded". memdecay's region priors map onto that today:
//   pinned region                -> 100, no duration (kept as long as anything is);
//   other region r               -> round(99 * b_r / max_b), where max_b is the largest base priority in the table;
//   decaying region, with a step -> duration = the region's half-life in steps x milliseconds per step.
// An engine builds one entry list per request and passes it with the request (setKvCacheRetentionConfig).
#ifndef MEMDECAY_EXPORTS_TENSORRT_LLM_HPP
#define MEMDECAY_EXPORTS_TENSORRT_LLM_HPP

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "memdecay/detail/error.hpp"
#include "memdecay/core/region.hpp"
#include "memdecay/core/config.hpp"
#include "memdecay/core/sequence_like.hpp"
#include "memdecay/core/sequence_state.hpp"

namespace memdecay {

/// One TokenRangeRetentionConfig: tokens [token_start, token_end) of the request.
struct token_range_retention {
  std::int64_t token_start;
  std::int64_t token_end;
  int priority;                             ///< 0..100
  std::optional<std::int64_t> duration_ms;  ///< after this, the range drops to TensorRT-LLM's default priority
  friend bool operator==(const token_range_retention&, const token_range_retention&) = default;
};

/// How region priors become retention entries.
struct retention_options {
  /// Wall-clock milliseconds of one memdecay step, to turn half-lives into durations; 0 gives no durations.
  double milliseconds_per_step = 0.0;

  void validate() const {
    if (!std::isfinite(milliseconds_per_step) || milliseconds_per_step < 0.0)
      detail::raise_config("retention milliseconds_per_step = " + detail::to_text(milliseconds_per_step) +
                           " (must be finite and >= 0)");
  }
};

/// The retention priority (0..100) of region `r`: 100 when pinned, else 99 * b_r / (largest b in the table).
/// input_error for a region the table does not have.
[[nodiscard]] inline int retention_priority(const region_table& table, region_id r) {
  const auto& params = table.at(r);
  if (params.pinned) return 100;
  double max_base = 0.0;
  for (const auto& p : table.params()) max_base = std::max(max_base, p.base_priority);
  if (max_base <= 0.0) return 0;
  return static_cast<int>(std::lround(99.0 * params.base_priority / max_base));
}

/// The retention duration of region `r`: its half-life in steps times options.milliseconds_per_step, rounded;
/// none for pinned or non-decaying regions or when milliseconds_per_step is 0.
[[nodiscard]] inline std::optional<std::int64_t> retention_duration_ms(const region_table& table, region_id r,
                                                                       const retention_options& options) {
  const auto& params = table.at(r);
  if (params.pinned || params.decay_rate == 0.0 || options.milliseconds_per_step == 0.0) return std::nullopt;
  return static_cast<std::int64_t>(std::llround(params.half_life() * options.milliseconds_per_step));
}

namespace detail {
inline void push_retention(std::vector<token_range_retention>& out, std::int64_t begin, std::int64_t end, int priority,
                           std::optional<std::int64_t> duration) {
  if (!out.empty() && out.back().token_end == begin && out.back().priority == priority &&
      out.back().duration_ms == duration) {
    out.back().token_end = end;
  } else {
    out.push_back({begin, end, priority, duration});
  }
}
}  // namespace detail

/// Retention entries for a request whose tokens, from position 0, are the run-length `spans`: one entry per run
/// of equal priority and duration, ascending. config_error for invalid options; input_error for an unknown region.
[[nodiscard]] inline std::vector<token_range_retention> tensorrt_llm_retention(const region_table& table,
                                                                               std::span<const region_span> spans,
                                                                               const retention_options& options = {}) {
  options.validate();
  std::vector<token_range_retention> out;
  std::int64_t position = 0;
  for (const auto& s : spans) {
    const int priority = retention_priority(table, s.region);
    const auto duration = retention_duration_ms(table, s.region, options);
    if (s.count == 0) continue;
    detail::push_retention(out, position, position + static_cast<std::int64_t>(s.count), priority, duration);
    position += static_cast<std::int64_t>(s.count);
  }
  return out;
}

/// Retention entries for a request labelled with `spans` under `cfg`: its effective region table
/// (config.regions with config.region_overrides applied, as every sequence uses). config_error for invalid
/// options; input_error for an unknown region.
[[nodiscard]] inline std::vector<token_range_retention> tensorrt_llm_retention(const config& cfg,
                                                                               std::span<const region_span> spans,
                                                                               const retention_options& options = {}) {
  return tensorrt_llm_retention(cfg.effective_regions(), spans, options);
}

/// Retention entries for the resident tokens of `seq`, at their absolute positions (evicted ranges are left out,
/// so the blocks still held are ranked by what they hold), by the sequence's effective region table.
template <sequence_like Sequence>
[[nodiscard]] std::vector<token_range_retention> tensorrt_llm_retention(const Sequence& seq,
                                                                        const retention_options& options = {}) {
  options.validate();
  std::vector<token_range_retention> out;
  const auto regions = seq.state().regions();
  for (std::size_t i = 0; i < regions.size(); ++i) {
    const auto position = static_cast<std::int64_t>(seq.position_of(i));
    detail::push_retention(out, position, position + 1, retention_priority(seq.regions(), regions[i]),
                           retention_duration_ms(seq.regions(), regions[i], options));
  }
  return out;
}

}  // namespace memdecay

#endif  // MEMDECAY_EXPORTS_TENSORRT_LLM_HPP
