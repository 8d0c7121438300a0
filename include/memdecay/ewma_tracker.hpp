// SPDX-License-Identifier: Apache-2.0
// memdecay: the attention tracker: EWMA update and refresh, scalar reference.
//
// For every resident token i, with x_i its normalised mass in this observation:
//     a_i <- beta * a_i + (1 - beta) * x_i
//     if x_i > tau:  last_refresh_i <- now      (the decay clock restarts: dt_i = 0)
// Observations may be sparse in time: the EWMA moves once per observation, while the decay term follows the
// logical clock whatever the cadence. This file is the specification the fused SIMD kernel is tested against.
#ifndef MEMDECAY_EWMA_TRACKER_HPP
#define MEMDECAY_EWMA_TRACKER_HPP

#include <concepts>
#include <cstddef>
#include <span>

#include "memdecay/config.hpp"
#include "memdecay/retention_score.hpp"

namespace memdecay {

/// The per-observation constants.
template <std::floating_point Float>
struct observation_params {
  Float beta;   ///< EWMA factor in [0, 1)
  Float tau;    ///< refresh threshold on x_i
  Float scale;  ///< x_i = scale * m_i (1, or the resident count under uniform normalisation)
};

/// Applies one validated per-token observation (`mass.size() == ewma.size()`). Returns the number of tokens it
/// refreshed.
template <std::floating_point Float>
std::size_t observe_tokens_reference(std::span<Float> ewma, std::span<step_t> last_refresh,
                                     std::span<const Float> mass, step_t now,
                                     const observation_params<Float>& p) noexcept {
  std::size_t refreshed = 0;
  for (std::size_t i = 0; i < ewma.size(); ++i) {
    const Float x = p.scale * mass[i];
    ewma[i] = p.beta * ewma[i] + (Float{1} - p.beta) * x;
    if (x > p.tau) {
      last_refresh[i] = now;
      ++refreshed;
    }
  }
  return refreshed;
}

}  // namespace memdecay

#endif  // MEMDECAY_EWMA_TRACKER_HPP
