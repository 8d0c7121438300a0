// SPDX-License-Identifier: Apache-2.0
// memdecay-eval's statistics: 95% bootstrap intervals over episodes for a recall (a ratio of sums) and for the
// difference of two recalls measured on the same episodes (paired).
//
// Episodes are the unit of resampling: probes within an episode share its eviction history, so they are not
// independent. Resampling is stratified by tier (each tier's episodes are drawn with replacement from that tier),
// so pooled numbers keep the tiers' weights. The interval is the percentile interval of `resamples` replicates; the
// generator is the library's fixed-seed splitmix64 (trace_generator.hpp), so the same counts and seed give the same interval on every machine.
#ifndef MEMDECAY_TOOLS_EVAL_BOOTSTRAP_HPP
#define MEMDECAY_TOOLS_EVAL_BOOTSTRAP_HPP

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include <memdecay/io/trace_generator.hpp>  // trace::splitmix64, the library's seeded generator

namespace memdecay_eval::stats {

/// One episode's probes and how many of them a configuration recalled.
struct counts {
  std::uint64_t hits = 0;
  std::uint64_t trials = 0;
};

/// Episodes grouped by stratum (tier); for a paired difference both sides list the same episodes in the same order.
using strata = std::vector<std::vector<counts>>;

struct interval {
  double estimate = 0.0;  ///< on the data itself
  double lower = 0.0, upper = 0.0;
  /// A difference whose interval contains 0 is a tie.
  [[nodiscard]] bool contains_zero() const noexcept { return lower <= 0.0 && upper >= 0.0; }
};

struct bootstrap_options {
  std::size_t resamples = 2000;
  std::uint64_t seed = 0x6d656d6465636179ULL;  // "memdecay"
  double level = 0.95;
};

namespace detail {

inline double ratio(std::uint64_t hits, std::uint64_t trials) noexcept {
  return trials == 0 ? 0.0 : static_cast<double>(hits) / static_cast<double>(trials);
}

inline double quantile(std::vector<double>& v, double q) {
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(pos));
  const std::size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (pos - static_cast<double>(lo)) * (v[hi] - v[lo]);
}

inline void check_paired(const strata& a, const strata& b) {
  if (a.size() != b.size()) throw std::invalid_argument("bootstrap: the two sides have different strata");
  for (std::size_t s = 0; s < a.size(); ++s)
    if (a[s].size() != b[s].size()) throw std::invalid_argument("bootstrap: the two sides have different episodes");
}

}  // namespace detail

/// The recall of b minus the recall of a (pooled over strata), with its paired bootstrap interval; with `a` empty,
/// the interval of b's recall alone. Episodes without probes are left out of the resampling: they say nothing of a
/// recall, and a replicate drawn from them alone would count as a recall of 0 (an interval pulled towards 0 by
/// episodes that asked nothing).
inline interval bootstrap(const strata& b, const strata* a = nullptr, const bootstrap_options& o = {}) {
  if (a) detail::check_paired(*a, b);
  std::vector<std::vector<std::size_t>> asked(b.size());  // per stratum, the episodes with probes
  for (std::size_t s = 0; s < b.size(); ++s)
    for (std::size_t k = 0; k < b[s].size(); ++k)
      if (b[s][k].trials > 0 || (a && (*a)[s][k].trials > 0)) asked[s].push_back(k);
  auto statistic = [&](const auto& pick) {
    std::uint64_t hb = 0, tb = 0, ha = 0, ta = 0;
    for (std::size_t s = 0; s < b.size(); ++s)
      for (std::size_t k = 0; k < asked[s].size(); ++k) {
        const std::size_t e = pick(s, k);
        hb += b[s][e].hits;
        tb += b[s][e].trials;
        if (a) {
          ha += (*a)[s][e].hits;
          ta += (*a)[s][e].trials;
        }
      }
    return detail::ratio(hb, tb) - (a ? detail::ratio(ha, ta) : 0.0);
  };
  interval out;
  out.estimate = statistic([&](std::size_t s, std::size_t k) { return asked[s][k]; });
  memdecay::trace::splitmix64 rng(o.seed);
  std::vector<double> reps;
  reps.reserve(o.resamples);
  for (std::size_t r = 0; r < o.resamples; ++r)
    // Uniform in [0, n) by modulo (the bias, below n / 2^64, is nil for episode counts).
    reps.push_back(
        statistic([&](std::size_t s, std::size_t) { return asked[s][rng.next() % asked[s].size()]; }));
  if (reps.empty()) {
    out.lower = out.upper = out.estimate;
    return out;
  }
  const double tail = (1.0 - o.level) / 2.0;
  out.lower = detail::quantile(reps, tail);
  out.upper = detail::quantile(reps, 1.0 - tail);
  return out;
}

}  // namespace memdecay_eval::stats

#endif  // MEMDECAY_TOOLS_EVAL_BOOTSTRAP_HPP
