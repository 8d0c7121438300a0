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
#include <type_traits>
#include <vector>

#include "memdecay/core/executor.hpp"
#include "memdecay/detail/error.hpp"

namespace memdecay {

/// How observe_query turns page bounds into per-page attention (see the header comment).
enum class query_signal : std::uint8_t { bound_softmax, bound_softmax_tokens };

[[nodiscard]] constexpr const char* to_string(query_signal s) noexcept {
  return s == query_signal::bound_softmax ? "bound_softmax" : "bound_softmax_tokens";
}

namespace detail {
// input_error, naming the argument, unless the lengths agree, `how` is a signal and `total` is finite and >= 0.
inline void check_estimate(std::size_t bounds, std::size_t query_heads, std::size_t pages, std::size_t outputs,
                           query_signal how, double total) {
  if (query_heads == 0 || bounds != query_heads * pages || outputs != pages)
    raise_input("estimate_page_attention: " + to_text(bounds) + " bounds for " + to_text(query_heads) + " heads x " +
                to_text(pages) + " pages, " + to_text(outputs) + " outputs");
  if (!std::isfinite(total) || total < 0)
    raise_input("estimate_page_attention: total = " + to_text(total) + " (must be finite and >= 0)");
  if (how != query_signal::bound_softmax && how != query_signal::bound_softmax_tokens)
    raise_input("query_signal = " + to_text(static_cast<int>(how)) + " is not a signal");
}
// One head's unnormalised weights w[p] over its bounds b[p] (the softmax numerators, relative to the head's
// largest finite bound); returns their sum.
inline double head_weights(const float* b, std::span<const std::uint32_t> tokens_per_page, query_signal how,
                           double* w) noexcept {
  const std::size_t pages = tokens_per_page.size();
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
  return sum;
}
// A page's share of one head: its weight over the head's sum, or 1/pages when every bound was -inf (overflowed
// below: nothing tells the pages apart).
inline double head_share(double w, double sum, std::size_t pages) noexcept {
  return sum > 0 ? w / sum : 1.0 / static_cast<double>(pages);
}
}  // namespace detail

/// Per-page attention estimated from bounds[j * pages + p] (query_heads x pages; +inf for a page without a
/// digest) and each page's resident tokens, into `out` (pages entries), summing to `total`. Computed in double,
/// in page order for every head, so the result does not depend on the isa or the thread.
template <std::floating_point Float>
void estimate_page_attention(std::span<const float> bounds, std::size_t query_heads,
                             std::span<const std::uint32_t> tokens_per_page, query_signal how, double total,
                             std::span<Float> out) {
  const std::size_t pages = tokens_per_page.size();
  detail::check_estimate(bounds.size(), query_heads, pages, out.size(), how, total);
  std::fill(out.begin(), out.end(), Float{0});
  if (pages == 0) return;
  std::vector<double> acc(pages, 0.0), w(pages);
  for (std::size_t j = 0; j < query_heads; ++j) {
    const double sum = detail::head_weights(bounds.data() + j * pages, tokens_per_page, how, w.data());
    for (std::size_t p = 0; p < pages; ++p) acc[p] += detail::head_share(w[p], sum, pages);
  }
  for (std::size_t p = 0; p < pages; ++p)
    out[p] = static_cast<Float>(total * acc[p] / static_cast<double>(query_heads));
}

/// The same on `exec`'s threads (core/executor.hpp): each head's softmax is a task, then each page's mean over the
/// heads, in head order, in tasks of pages; the same bits as the call without an executor, for every executor and
/// thread count. Holds query_heads x pages doubles while it runs (the inline executor runs the call above instead).
template <std::floating_point Float, executor Exec>
void estimate_page_attention(std::span<const float> bounds, std::size_t query_heads,
                             std::span<const std::uint32_t> tokens_per_page, query_signal how, double total,
                             std::span<Float> out, Exec& exec) {
  const std::size_t pages = tokens_per_page.size();
  detail::check_estimate(bounds.size(), query_heads, pages, out.size(), how, total);
  if (std::is_same_v<std::remove_cvref_t<Exec>, inline_executor> || pages == 0)
    return estimate_page_attention<Float>(bounds, query_heads, tokens_per_page, how, total, out);
  std::vector<double> w(query_heads * pages), sums(query_heads);
  detail::run_all(exec, query_heads, [&](std::size_t j) {
    sums[j] = detail::head_weights(bounds.data() + j * pages, tokens_per_page, how, w.data() + j * pages);
  });
  constexpr std::size_t chunk = 4096;  // a task's sums: 32 KiB, beside one head's row of the chunk at a time
  detail::run_all(exec, (pages + chunk - 1) / chunk, [&](std::size_t task) {
    const std::size_t first = task * chunk, count = std::min(chunk, pages - first);
    std::vector<double> acc(count, 0.0);
    for (std::size_t j = 0; j < query_heads; ++j) {
      const double* wj = w.data() + j * pages + first;
      for (std::size_t i = 0; i < count; ++i) acc[i] += detail::head_share(wj[i], sums[j], pages);
    }
    for (std::size_t i = 0; i < count; ++i)
      out[first + i] = static_cast<Float>(total * acc[i] / static_cast<double>(query_heads));
  });
}

}  // namespace memdecay

#endif  // MEMDECAY_DIGESTS_QUERY_SIGNAL_HPP
