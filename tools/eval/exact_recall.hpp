// SPDX-License-Identifier: Apache-2.0
// Recall by exact attention over the held keys (memdecay-eval's "-exact" host-tier rows).
//
// The library's recall ranks pages by a bound from a compact digest (Quest's per-channel min/max), because an
// engine keeps the keys of offloaded pages in host memory, not beside the decision. An engine that does keep them
// there (the K/V it demoted is in its host pool; RetroInfer and MagicPIG attend over offloaded keys on the CPU) can
// instead score every held page by the attention the query would give it if it were resident, and hand those
// scores to the library as bounds (sequence::select_recall_for_bounds). These rows measure what that better signal
// is worth against the digest's bound: each query head's softmax over the logits of every held token (device and
// host), a page's mass summed over its tokens, averaged over the heads, as a log (the bound the plan compares).
// It reads no future: only the query of the moment and the keys already computed.
#ifndef MEMDECAY_TOOLS_EVAL_EXACT_RECALL_HPP
#define MEMDECAY_TOOLS_EVAL_EXACT_RECALL_HPP

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "../common/any_sequence.hpp"

namespace memdecay_eval {

/// Cheaper estimates of held_keys' scores, to measure what they keep: only the heads from `first_head` on (the last
/// layer's, say), and only the `channels` channels of each head where the query is largest in magnitude (0: all;
/// InfiniGen's partial keys pick their channels offline, this picks them per query).
struct held_keys_options {
  std::size_t first_head = 0;
  std::size_t channels = 0;
};

/// Every held page's keys, by original page: a device page's are read from the session at each refresh (a partial
/// page grows), a host page keeps the ones it had when it left the device (only full pages leave).
class held_keys {
 public:
  /// Reads the keys of every device page of `policy` from `session` (`page_keys(device_index, out)`: tokens x
  /// (heads x head_dim)).
  template <class Session>
  void refresh(const memdecay_tools::any_sequence& policy, const Session& session) {
    const std::size_t held = policy.held_pages();
    std::size_t device_index = 0;
    for (std::size_t j = 0; j < held; ++j) {
      if (!policy.on_device(j)) continue;
      const auto origin = static_cast<std::size_t>(policy.origin_of_page(j));
      if (origin >= by_origin_.size()) by_origin_.resize(origin + 1);
      session.page_keys(device_index++, by_origin_[origin]);
    }
  }

  using options = held_keys_options;

  /// log(mean over heads of the page's share of each head's softmax over every held token), one per held page.
  /// `query`: heads x head_dim, the layout of the keys' rows.
  void log_attention(const memdecay_tools::any_sequence& policy, std::span<const float> query, std::size_t heads,
                     std::size_t head_dim, std::vector<float>& out, options o = {}) {
    const std::size_t row = heads * head_dim;
    if (query.size() != row) throw std::invalid_argument("held_keys: the query is not heads x head_dim");
    if (o.first_head >= heads) throw std::invalid_argument("held_keys: first_head is past the heads");
    const std::size_t held = policy.held_pages();
    const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    const std::size_t used = heads - o.first_head;
    // Per used head, the channels the dot products read (the query's largest, ties to the lower channel).
    const std::size_t width = o.channels == 0 || o.channels >= head_dim ? head_dim : o.channels;
    channels_.resize(used * width);
    for (std::size_t u = 0; u < used; ++u) {
      const float* q = query.data() + (o.first_head + u) * head_dim;
      order_.resize(head_dim);
      for (std::size_t c = 0; c < head_dim; ++c) order_[c] = c;
      std::stable_sort(order_.begin(), order_.end(),
                       [q](std::size_t a, std::size_t b) { return std::abs(q[a]) > std::abs(q[b]); });
      std::copy_n(order_.begin(), width, channels_.begin() + static_cast<std::ptrdiff_t>(u * width));
    }
    // logits_[t * heads + h] for every held token t, pages in held order.
    logits_.clear();
    first_.assign(held + 1, 0);
    for (std::size_t j = 0; j < held; ++j) {
      const auto origin = static_cast<std::size_t>(policy.origin_of_page(j));
      if (origin >= by_origin_.size() || by_origin_[origin].empty())
        throw std::logic_error("held_keys: held page " + std::to_string(j) + " has no keys");
      const std::vector<float>& k = by_origin_[origin];
      const std::size_t tokens = k.size() / row;
      for (std::size_t t = 0; t < tokens; ++t)
        for (std::size_t u = 0; u < used; ++u) {
          float dot = 0.0f;
          const float* q = query.data() + (o.first_head + u) * head_dim;
          const float* kk = k.data() + t * row + (o.first_head + u) * head_dim;
          for (std::size_t i = 0; i < width; ++i) dot += q[channels_[u * width + i]] * kk[channels_[u * width + i]];
          logits_.push_back(dot * scale);
        }
      first_[j + 1] = first_[j] + tokens;
    }
    const std::size_t tokens = first_[held];
    top_.assign(used, -std::numeric_limits<float>::infinity());
    for (std::size_t t = 0; t < tokens; ++t)
      for (std::size_t h = 0; h < used; ++h) top_[h] = std::max(top_[h], logits_[t * used + h]);
    z_.assign(used, 0.0);
    weights_.resize(tokens * used);
    for (std::size_t t = 0; t < tokens; ++t)
      for (std::size_t h = 0; h < used; ++h) {
        weights_[t * used + h] = std::exp(static_cast<double>(logits_[t * used + h] - top_[h]));
        z_[h] += weights_[t * used + h];
      }
    out.assign(held, 0.0f);
    for (std::size_t j = 0; j < held; ++j) {
      double mass = 0.0;
      for (std::size_t t = first_[j]; t < first_[j + 1]; ++t)
        for (std::size_t h = 0; h < used; ++h) mass += weights_[t * used + h] / z_[h];
      mass /= static_cast<double>(used);
      out[j] = static_cast<float>(std::log(std::max(mass, 1e-300)));
    }
  }

 private:
  std::vector<std::vector<float>> by_origin_;
  std::vector<float> logits_, top_;
  std::vector<double> z_, weights_;  // softmax normalisers per head; exp(logit - top) per (token, head)
  std::vector<std::size_t> first_, channels_, order_;
};

}  // namespace memdecay_eval

#endif  // MEMDECAY_TOOLS_EVAL_EXACT_RECALL_HPP
