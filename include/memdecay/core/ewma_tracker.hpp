// SPDX-License-Identifier: Apache-2.0
// memdecay: the attention tracker: EWMA update and refresh, scalar reference.
//
// For every resident token i, with x_i its normalised mass in this observation:
//     a_i <- beta * a_i + (1 - beta) * x_i
//     if x_i > tau:  last_refresh_i <- now      (the decay clock restarts: dt_i = 0)
// Observations may be sparse in time: the EWMA moves once per observation, while the decay term follows the
// logical clock whatever the cadence. This file is the specification the fused SIMD kernel is tested against.
//
// The update is written with one explicit fused multiply-add, a <- fma(beta, a, (1 - beta) * x), so its bits do
// not depend on how a compiler contracts beta * a + (1 - beta) * x (-ffp-contract, -march): every build, every
// rank of a tensor-parallel group and the SIMD kernels (which use the isa's FMA instruction) compute the same
// value. On a target compiled without FMA instructions std::fma is a libm call (exact, slower): the sequences
// then run this loop, not the fused kernels (simd::fused_observation_exact).
#ifndef MEMDECAY_CORE_EWMA_TRACKER_HPP
#define MEMDECAY_CORE_EWMA_TRACKER_HPP

#include <cmath>
#include <concepts>
#include <cstddef>
#include <span>

#include "memdecay/core/config.hpp"
#include "memdecay/core/retention_score.hpp"

namespace memdecay {

/// The per-observation constants.
template <std::floating_point Float>
struct observation_params {
  Float beta;   ///< EWMA factor in [0, 1)
  Float tau;    ///< refresh threshold on x_i
  Float scale;  ///< x_i = scale * m_i (1, or the resident count under uniform normalisation)
};

/// One EWMA step: beta * a + (1 - beta) * x with a single rounding of the sum (see the header comment).
template <std::floating_point Float>
[[nodiscard]] inline Float ewma_step(Float a, Float x, Float beta) noexcept {
  return std::fma(beta, a, (Float{1} - beta) * x);
}

/// Applies one validated per-token observation (`mass.size() == ewma.size()`). Returns the number of tokens it
/// refreshed.
template <std::floating_point Float>
std::size_t observe_tokens_reference(std::span<Float> ewma, std::span<step_t> last_refresh, std::span<const Float> mass,
                                     step_t now, const observation_params<Float>& p) noexcept {
  std::size_t refreshed = 0;
  for (std::size_t i = 0; i < ewma.size(); ++i) {
    const Float x = p.scale * mass[i];
    ewma[i] = ewma_step(ewma[i], x, p.beta);
    if (x > p.tau) {
      last_refresh[i] = now;
      ++refreshed;
    }
  }
  return refreshed;
}

}  // namespace memdecay

#endif  // MEMDECAY_CORE_EWMA_TRACKER_HPP
