// SPDX-License-Identifier: Apache-2.0
// The fuzzers' bridge between tier_model.hpp (the naive model of the host tier) and the library: the model's rules as
// a host_tier_config, and the recall decision's one number per page from the per-head bounds, restated. Shared by
// api_fuzzer.cpp (one sequence) and adapter_fuzzer.cpp (the manager).
#ifndef MEMDECAY_FUZZ_TIER_BRIDGE_HPP
#define MEMDECAY_FUZZ_TIER_BRIDGE_HPP

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <optional>
#include <vector>

#include <memdecay/tiers/host_tier.hpp>

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
