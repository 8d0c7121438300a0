// SPDX-License-Identifier: Apache-2.0
// The fuzzers' bridge between tier_model.hpp (the naive model of the host tier) and the library: the model's rules as
// a host_tier_config, and the recall decision's one number per page from the per-head bounds, restated. Shared by
// api_fuzzer.cpp (one sequence) and adapter_fuzzer.cpp (the manager).
#ifndef MEMDECAY_FUZZ_TIER_BRIDGE_HPP
#define MEMDECAY_FUZZ_TIER_BRIDGE_HPP

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <memdecay/tiers/host_tier.hpp>

#include "common.hpp"
#include "tier_model.hpp"

namespace memdecay_fuzz {

/// The model's host tier rules as the library's.
inline memdecay::host_tier_config tier_to_library(const model_tier_config& c) {
  return {.host_budget = {static_cast<memdecay::budget_unit>(c.unit), c.high, std::nullopt},
          .min_host_priority = c.min_host_priority,
          .hysteresis = c.hysteresis,
          .min_device_steps = c.min_device_steps,
          .max_recall_pages = c.max_recall_pages,
          .displace_lowest = c.displace_lowest};
}

/// What differs between the fuzzers' drawn host tiers (the byte meaning of the rest is shared).
struct tier_draw_tables {
  std::span<const double> token_highs;  ///< host budgets in tokens (the sequence fuzzer's episodes are longer)
  std::span<const double> priorities;   ///< min_host_priority values (around each fuzzer's retention scores)
  /// displace_lowest from a byte of its own (0, 0, 1, 2), or from min_device_steps % 3 without a byte (the API
  /// fuzzer's committed inputs predate the field: a byte more would shift every one of them).
  bool displace_from_own_byte = true;
};

/// A drawn host tier: the model's rules, the library's, and whether the unit was forged invalid.
struct drawn_tier {
  model_tier_config model;
  memdecay::host_tier_config library;
  bool bad_unit = false;
  [[nodiscard]] bool valid() const { return model_tier_config_valid(model) && !bad_unit; }
  [[nodiscard]] std::string describe() const {
    return "unit " + std::to_string(static_cast<int>(library.host_budget.unit)) + " high " +
           memdecay::detail::to_text(model.high) + ", min_host_priority " +
           memdecay::detail::to_text(model.min_host_priority) + ", hysteresis " +
           memdecay::detail::to_text(model.hysteresis) + ", steps " + std::to_string(model.min_device_steps) +
           ", max_recall " + std::to_string(model.max_recall_pages) + ", displace_lowest " +
           std::to_string(model.displace_lowest);
  }
};

/// Draws a host tier's rules: the budget in any unit, the region rule, hysteresis, minimum stay, promotions per
/// plan and displacement; one input in eight may be invalid (a bad watermark, priority, hysteresis, promotion count
/// or unit), for the config_error path.
inline drawn_tier draw_tier(reader& in, const tier_draw_tables& tables) {
  drawn_tier d;
  model_tier_config& c = d.model;
  const bool allow_bad = (in.u8() & 7) == 0;
  c.unit = static_cast<model_budget_unit>(in.u8() % 4);
  switch (c.unit) {
    case model_budget_unit::unlimited: break;
    case model_budget_unit::tokens: c.high = in.pick(tables.token_highs); break;
    case model_budget_unit::pages: {
      static const double highs[] = {0, 1, 2, 3, 4, 8, 2.5};
      c.high = in.pick(highs);
      break;
    }
    case model_budget_unit::ratio: {
      static const double highs[] = {0.1, 0.25, 0.5, 1.0, 2.0};
      c.high = in.pick(highs);
      break;
    }
  }
  static const double bad_highs[] = {-1.0, nan_d, inf_d};
  if (allow_bad && in.flip(3)) c.high = in.pick(bad_highs);
  static const double bad_priorities[] = {nan_d, inf_d, -inf_d};
  c.min_host_priority = allow_bad && in.flip(4) ? in.pick(bad_priorities) : in.pick(tables.priorities);
  static const double hystereses[] = {0.0, 0.0, 0.25, 1.0, 8.0};
  static const double bad_hystereses[] = {-0.5, nan_d, inf_d};
  c.hysteresis = allow_bad && in.flip(4) ? in.pick(bad_hystereses) : in.pick(hystereses);
  static const std::uint32_t steps[] = {0, 1, 2, 4, 64};
  c.min_device_steps = in.pick(steps);
  static const std::size_t recalls[] = {1, 2, 3, std::numeric_limits<std::size_t>::max()};
  c.max_recall_pages = allow_bad && in.flip(8) ? 0 : in.pick(recalls);
  static const std::size_t displace[] = {0, 0, 1, 2};
  c.displace_lowest = tables.displace_from_own_byte ? in.pick(displace) : c.min_device_steps % 3;
  d.library = tier_to_library(c);
  d.bad_unit = allow_bad && in.flip(16);
  if (d.bad_unit) d.library.host_budget.unit = static_cast<memdecay::budget_unit>(9);
  return d;
}

/// A page's one number for the recall decision from its per-head bounds (head j of page p at j * n + p), as
/// select_recall's head_bounds rules specify it: the best head's (a NaN head is passed over); the mean over heads
/// in double; the log of the mean over heads of each head's softmax over the pages (an unknown bound, +inf or NaN,
/// taking the head's largest finite one). With the last two a NaN head bound leaves the page NaN: unjudged.
inline std::vector<float> combined_bounds(const std::vector<float>& bounds, std::size_t heads, std::size_t n,
                                          memdecay::head_bounds rule) {
  std::vector<float> out(n, -std::numeric_limits<float>::infinity());
  if (rule == memdecay::head_bounds::max) {
    for (std::size_t j = 0; j < heads; ++j)
      for (std::size_t p = 0; p < n; ++p) out[p] = std::max(out[p], bounds[j * n + p]);
    return out;
  }
  std::vector<double> acc(n, 0.0);
  for (std::size_t j = 0; j < heads; ++j) {
    const float* b = bounds.data() + j * n;
    if (rule == memdecay::head_bounds::mean) {
      for (std::size_t p = 0; p < n; ++p) acc[p] += b[p];
      continue;
    }
    double top = -std::numeric_limits<double>::infinity();
    for (std::size_t p = 0; p < n; ++p)
      if (std::isfinite(b[p])) top = std::max(top, static_cast<double>(b[p]));
    if (!std::isfinite(top)) top = 0;
    std::vector<double> w(n);
    double sum = 0;
    for (std::size_t p = 0; p < n; ++p) {
      const bool unknown = !std::isfinite(b[p]) && !(b[p] < 0);
      w[p] = std::exp((unknown ? top : static_cast<double>(b[p])) - top);
      sum += w[p];
    }
    for (std::size_t p = 0; p < n; ++p) acc[p] += sum > 0 ? w[p] / sum : 1.0 / static_cast<double>(n);
  }
  for (std::size_t p = 0; p < n; ++p) {
    const double mean = acc[p] / static_cast<double>(heads);
    out[p] = static_cast<float>(rule == memdecay::head_bounds::mean ? mean : std::log(mean));
    for (std::size_t j = 0; j < heads; ++j)
      if (std::isnan(bounds[j * n + p])) out[p] = std::numeric_limits<float>::quiet_NaN();
  }
  return out;
}

}  // namespace memdecay_fuzz

#endif  // MEMDECAY_FUZZ_TIER_BRIDGE_HPP
