// SPDX-License-Identifier: Apache-2.0
// memdecay: the attention-free signal: per-page attention estimated from the query and the page digests, for
// engines whose kernels (FlashAttention, FlashInfer) never materialise attention probabilities.
//
// Query head j's bound b_jp of page p (page_digests::bounds) is the largest logit the query can give one of the
// page's tokens (min_max digests; mean_key: the logit of the mean key). Exact attention gives the page
// sum_{i in p} e^{s_ji} / Z_j. The estimates:
//
//   bound_softmax         m_p = mean_j  e^{b_jp} / sum_q e^{b_jq}            (one token per page at its bound)
//   bound_softmax_tokens  m_p = mean_j  n_p e^{b_jp} / sum_q n_q e^{b_jq}    (every token of the page at the bound)
//
// The first is right when one token dominates its page (a fact among filler), the second when a page's keys are
// alike; both sum to 1 over the pages, like the mean over heads of exact attention rows, and the caller scales
// them to its head reduction (observe_query's `total`). A page without a digest (the partial page filling now)
// takes its head's largest bound: it is the newest, and nothing is known against it. docs/tiers.md measures each
// estimate against the exact attention of the bundled models.
#ifndef MEMDECAY_DIGESTS_QUERY_SIGNAL_HPP
#define MEMDECAY_DIGESTS_QUERY_SIGNAL_HPP

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "memdecay/detail/error.hpp"

namespace memdecay {

/// How observe_query turns page bounds into per-page attention (see the header comment).
enum class query_signal : std::uint8_t { bound_softmax, bound_softmax_tokens };

[[nodiscard]] constexpr const char* to_string(query_signal s) noexcept {
  return s == query_signal::bound_softmax ? "bound_softmax" : "bound_softmax_tokens";
}

/// Per-page attention estimated from bounds[j * pages + p] (query_heads x pages; +inf for a page without a
/// digest) and each page's resident tokens, into `out` (pages entries), summing to `total`. Computed in double,
/// in page order for every head, so the result does not depend on the isa or the thread.
template <std::floating_point Float>
void estimate_page_attention(std::span<const float> bounds, std::size_t query_heads,
                             std::span<const std::uint32_t> tokens_per_page, query_signal how, double total,
                             std::span<Float> out) {
  const std::size_t pages = tokens_per_page.size();
  if (query_heads == 0 || bounds.size() != query_heads * pages || out.size() != pages)
    detail::raise_input("estimate_page_attention: " + detail::to_text(bounds.size()) + " bounds for " +
                        detail::to_text(query_heads) + " heads x " + detail::to_text(pages) + " pages, " +
                        detail::to_text(out.size()) + " outputs");
  if (!std::isfinite(total) || total < 0)
    detail::raise_input("estimate_page_attention: total = " + detail::to_text(total) + " (must be finite and >= 0)");
  if (how != query_signal::bound_softmax && how != query_signal::bound_softmax_tokens)
    detail::raise_input("query_signal = " + detail::to_text(static_cast<int>(how)) + " is not a signal");
  std::fill(out.begin(), out.end(), Float{0});
  if (pages == 0) return;
  std::vector<double> acc(pages, 0.0), w(pages);
  for (std::size_t j = 0; j < query_heads; ++j) {
    const float* b = bounds.data() + j * pages;
    double top = -std::numeric_limits<double>::infinity();
    for (std::size_t p = 0; p < pages; ++p)
      if (std::isfinite(b[p])) top = std::max(top, static_cast<double>(b[p]));
    if (!std::isfinite(top)) top = 0;  // no page has a digest: every page alike
    double sum = 0;
    for (std::size_t p = 0; p < pages; ++p) {
      // +inf (no digest) and NaN (a bound that overflowed both ways) are unknown: the head's best; -inf is none.
      const bool unknown = !std::isfinite(b[p]) && !(b[p] < 0);
      const double bp = unknown ? top : static_cast<double>(b[p]);
      const double count = how == query_signal::bound_softmax_tokens ? static_cast<double>(tokens_per_page[p]) : 1.0;
      w[p] = count * std::exp(bp - top);
      sum += w[p];
    }
    if (sum > 0) {
      for (std::size_t p = 0; p < pages; ++p) acc[p] += w[p] / sum;
    } else {  // every bound -inf (overflowed below): nothing tells the pages apart
      for (std::size_t p = 0; p < pages; ++p) acc[p] += 1.0 / static_cast<double>(pages);
    }
  }
  for (std::size_t p = 0; p < pages; ++p)
    out[p] = static_cast<Float>(total * acc[p] / static_cast<double>(query_heads));
}

}  // namespace memdecay

#endif  // MEMDECAY_DIGESTS_QUERY_SIGNAL_HPP
