// SPDX-License-Identifier: Apache-2.0
// streaming_llm policy: attention sinks plus a recent window.
//
// Source: G. Xiao, Y. Tian, B. Chen, S. Han, M. Lewis, "Efficient Streaming Language Models with Attention
// Sinks", ICLR 2024; reference implementation mit-han-lab/streaming-llm, streaming_llm/kv_cache.py
// (StartRecentKVCache(start_size=4, recent_size=512)).
//
// The sink pages (those holding one of the first `sink_tokens` absolute positions) are kept; every other page
// scores its original index, so the oldest go first and a budget of B tokens keeps the sinks and the most recent
// B - sinks tokens: StartRecentKVCache(start, recent) is streaming_llm{.sink_tokens = start} with
// budget_config::tokens(start + recent). Evicted pages never come back, so the kept window is always contiguous
// at the end. Page size 1 gives the token-level original. No attention needed.
//
// State per token: none. Cost: O(pages) per score, nothing per observation.
#ifndef MEMDECAY_POLICIES_STREAMING_LLM_HPP
#define MEMDECAY_POLICIES_STREAMING_LLM_HPP

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "memdecay/core/config.hpp"
#include "memdecay/core/policy.hpp"

namespace memdecay::policies {

template <class Float = float>
class streaming_llm : public policy_support::stateless_hooks<Float> {
  static_assert(std::floating_point<Float>, "policies score in float or double");

 public:
  using float_type = Float;
  struct params_type {
    std::size_t sink_tokens = 4;  ///< start_size: pages holding any of the first sink_tokens positions are kept
  };
  static constexpr std::string_view name = "streaming_llm";

  streaming_llm(const params_type& params, const config&, const region_table&) : sink_tokens_(params.sink_tokens) {}

  void page_scores(const sequence_view& view, std::span<Float> out) const noexcept {
    for (std::size_t p = 0; p < view.num_pages(); ++p) {
      const std::uint64_t origin = view.page_origins[p];
      out[p] = origin * view.page_size < sink_tokens_ ? policy_support::keep_score<Float> : static_cast<Float>(origin);
    }
  }
  [[nodiscard]] std::uint64_t digest() const noexcept { return sink_tokens_; }

  /// The snapshot's fields (io/snapshot.hpp): parameters (checked against the target's on load), then state.
  template <class Fields>
  void snapshot_fields(Fields& f) {
    f.param("sink_tokens", sink_tokens_);
  }

 private:
  std::size_t sink_tokens_;
};

static_assert(eviction_policy<streaming_llm<float>> && eviction_policy<streaming_llm<double>>);

}  // namespace memdecay::policies

#endif  // MEMDECAY_POLICIES_STREAMING_LLM_HPP
