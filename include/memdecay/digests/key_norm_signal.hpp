// SPDX-License-Identifier: Apache-2.0
// memdecay: the cheapest attention-free signal: key norms (KnormPress; Devoto et al., "A Simple and Effective L2
// Norm-Based Strategy for KV Cache Compression", EMNLP 2024; kvpress's KnormPress keeps the keys of lowest norm).
//
// The observation behind it: a key of low L2 norm tends to receive high attention. Turned into the per-token mass
// MemDecay's EWMA and refresh consume, a token's share falls exponentially with its norm measured in standard
// deviations of the resident norms:
//
//     m_i = total x e^{-(n_i - n_min) / s} / sum_j e^{-(n_j - n_min) / s},   s = stddev(n) (1 when every norm is equal)
//
// It needs no query and no digest: the engine computes ||k_i|| (the mean over heads, and layers if it likes) once
// when it writes the key, and sends the resident tokens' norms each step. It sees no query, so it cannot follow what
// the model looks for now; docs/tiers.md measures how far it is from the measured attention and what it costs
// MemDecay on the bundled models.
#ifndef MEMDECAY_DIGESTS_KEY_NORM_SIGNAL_HPP
#define MEMDECAY_DIGESTS_KEY_NORM_SIGNAL_HPP

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <span>
#include <string>

#include "memdecay/detail/error.hpp"

namespace memdecay {

/// Per-token mass from key norms into `out` (same length), summing to `total` (see the header comment). input_error
/// naming the index for a norm that is negative or not finite, or for mismatched lengths; in double, in order.
template <std::floating_point Float>
void key_norm_attention(std::span<const float> norms, double total, std::span<Float> out) {
  if (out.size() != norms.size())
    detail::raise_input("key_norm_attention: " + detail::to_text(norms.size()) + " norms, " +
                        detail::to_text(out.size()) + " outputs");
  if (!std::isfinite(total) || total < 0)
    detail::raise_input("key_norm_attention: total = " + detail::to_text(total) + " (must be finite and >= 0)");
  for (std::size_t i = 0; i < norms.size(); ++i)
    if (!std::isfinite(norms[i]) || norms[i] < 0)
      detail::raise_input("key norms[" + detail::to_text(i) + "] = " + detail::to_text(norms[i]) +
                          " (a norm must be finite and >= 0)");
  const std::size_t n = norms.size();
  if (n == 0) return;
  double mean = 0, lowest = norms[0];
  for (float v : norms) {
    mean += v;
    lowest = std::min(lowest, static_cast<double>(v));
  }
  mean /= static_cast<double>(n);
  double var = 0;
  for (float v : norms) var += (v - mean) * (v - mean);
  const double s = var > 0 ? std::sqrt(var / static_cast<double>(n)) : 1.0;
  double sum = 0;
  for (float v : norms) sum += std::exp(-(v - lowest) / s);
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<Float>(total * std::exp(-(norms[i] - lowest) / s) / sum);
}

}  // namespace memdecay

#endif  // MEMDECAY_DIGESTS_KEY_NORM_SIGNAL_HPP
