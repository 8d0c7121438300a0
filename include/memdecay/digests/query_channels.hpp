// SPDX-License-Identifier: Apache-2.0
// memdecay: a query reduced to its largest channels, for the recall's digest bounds.
//
// Quest's per-page bound sum_c max(q_c min_c, q_c max_c) is loose by about sum_c |q_c| (max_c - min_c) / 2: every
// channel adds its spread over the page's keys, scaled by the query there. Channels where the query is small add that
// slack and little of the true score, and the slack differs from page to page (a page of varied keys spreads more),
// so on many channels the bound ranks pages by their spread as much as by their match. Keeping only each head's few
// largest query channels (the others set to 0, so they contribute nothing) makes the bound the one of the partial
// dot product over those channels: no longer an upper bound of q.k, but an estimate that follows where the query
// looks. InfiniGen (Lee et al., OSDI 2024) scores offloaded tokens the same way, with channels chosen offline.
//
// Measured on the bundled models (docs/tiers.md, "Recall from the query's largest channels"): 3 of 32 / 48 channels
// per head, chosen on the training split, lift the host tier's recall by 3-16 points with a short stay, moving
// 1.4-1.8x the bytes (still about a third of ArkVale-style recall's); the bound costs what it did (the digest kernel
// reads every channel, the zeros included).
#ifndef MEMDECAY_DIGESTS_QUERY_CHANNELS_HPP
#define MEMDECAY_DIGESTS_QUERY_CHANNELS_HPP

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <numeric>
#include <span>
#include <vector>

#include "memdecay/detail/error.hpp"

namespace memdecay {

/// Keeps, in every head of `query` (heads x head_dim, the layout select_recall and observe_query take), the
/// `channels` channels of largest magnitude and sets the others to 0; ties go to the lower channel, so every rank of
/// a tensor-parallel group keeps the same channels. `channels` >= head_dim keeps the query as it is. input_error,
/// with `query` unchanged, for head_dim or channels of 0, a length that is not a whole number of heads, or an
/// element that is not finite (named by its index).
inline void keep_largest_query_channels(std::span<float> query, std::size_t head_dim, std::size_t channels) {
  if (head_dim == 0) detail::raise_input("keep_largest_query_channels: head_dim = 0");
  if (channels == 0) detail::raise_input("keep_largest_query_channels: channels = 0 (keep at least one)");
  if (query.size() % head_dim != 0)
    detail::raise_input("keep_largest_query_channels: the query has " + detail::to_text(query.size()) +
                        " elements, not a whole number of heads of " + detail::to_text(head_dim));
  for (std::size_t i = 0; i < query.size(); ++i)
    if (!std::isfinite(query[i]))
      detail::raise_input("keep_largest_query_channels: query[" + detail::to_text(i) + "] = " +
                          detail::to_text(query[i]) + " is not finite");
  if (channels >= head_dim) return;
  std::vector<std::size_t> order(head_dim);
  for (std::size_t first = 0; first < query.size(); first += head_dim) {
    float* q = query.data() + first;
    std::iota(order.begin(), order.end(), std::size_t{0});
    // (|q_c| descending, c ascending): a strict total order, so the kept set does not depend on the algorithm.
    std::nth_element(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(channels), order.end(),
                     [q](std::size_t a, std::size_t b) {
                       const float x = std::abs(q[a]), y = std::abs(q[b]);
                       return x != y ? x > y : a < b;
                     });
    for (std::size_t i = channels; i < head_dim; ++i) q[order[i]] = 0.0f;
  }
}

}  // namespace memdecay

#endif  // MEMDECAY_DIGESTS_QUERY_CHANNELS_HPP
