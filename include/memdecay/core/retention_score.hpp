// SPDX-License-Identifier: Apache-2.0
// memdecay: the retention score, scalar reference.
//
//     s_i(t) = b_r * exp(-lambda_r * dt_i(t)) + alpha * a_i(t)
//
//   b_r       base priority of the token's region r
//   lambda_r  decay rate of region r, per step (lambda_r = ln 2 / half-life)
//   dt_i(t)   steps since token i was last refreshed (appended, or attended above tau)
//   alpha     weight of the attention term
//   a_i(t)    EWMA of the (normalised) attention mass token i received
//
// A page scores the mean of its resident tokens' scores. This file is the readable specification: every fast
// path (the SIMD scorer) is tested against these functions, so they favour clarity over speed.
#ifndef MEMDECAY_CORE_RETENTION_SCORE_HPP
#define MEMDECAY_CORE_RETENTION_SCORE_HPP

#include <cmath>
#include <concepts>
#include <cstdint>

#include "memdecay/core/region.hpp"

namespace memdecay {

/// The logical clock: one tick per engine step (decode step or scheduler iteration). Never wall-clock time, so
/// decisions replay identically and agree across tensor-parallel ranks.
using step_t = std::uint32_t;

/// The two terms of a token's (or a page's mean) score.
template <std::floating_point Float>
struct score_terms {
  Float decay = 0;      ///< b_r * exp(-lambda_r * dt)
  Float attention = 0;  ///< alpha * a
  [[nodiscard]] Float total() const noexcept { return decay + attention; }
};

/// The decay term b * exp(-lambda * dt).
template <std::floating_point Float>
[[nodiscard]] inline Float decay_term(Float base_priority, Float decay_rate, Float age_steps) noexcept {
  return base_priority * std::exp(-decay_rate * age_steps);
}

/// s = b * exp(-lambda * dt) + alpha * a.
template <std::floating_point Float>
[[nodiscard]] inline Float retention_score(Float base_priority, Float decay_rate, Float age_steps, Float alpha,
                                           Float ewma) noexcept {
  return decay_term(base_priority, decay_rate, age_steps) + alpha * ewma;
}

/// The score terms of one token of region `r`, last refreshed at `last_refresh`, at time `now`.
template <std::floating_point Float, region_table_like Regions>
[[nodiscard]] inline score_terms<Float> token_score_terms(const Regions& table, region_id r, step_t last_refresh,
                                                          step_t now, Float alpha, Float ewma) noexcept {
  const Float age = static_cast<Float>(now - last_refresh);
  return {decay_term(static_cast<Float>(table.base_priority(r)), static_cast<Float>(table.decay_rate(r)), age),
          alpha * ewma};
}

}  // namespace memdecay

#endif  // MEMDECAY_CORE_RETENTION_SCORE_HPP
