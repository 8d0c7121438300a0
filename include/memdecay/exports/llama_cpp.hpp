// SPDX-License-Identifier: Apache-2.0
// memdecay: eviction decisions as llama.cpp position ranges.
//
// llama.cpp stores K/V in cells tagged with a position and removes them by position range:
//   bool llama_memory_seq_rm(llama_memory_t mem, llama_seq_id seq_id, llama_pos p0, llama_pos p1);  // [p0, p1)
// llama_pos is int32. An engine turns a plan into calls with:
//   for (auto [p0, p1] : memdecay::llama_position_ranges(seq, plan)) llama_memory_seq_rm(mem, id, p0, p1);
//   seq.commit(plan);
// Ranges are computed from the positions the plan's pages hold *before* commit (commit renumbers logical pages).
// Keys keep their absolute positions, so the cache has holes afterwards: new tokens need explicit batch.pos, and
// llama.cpp's "every position in [pos_min, pos_max] is present" guarantee no longer holds (docs/integration.md).
#ifndef MEMDECAY_EXPORTS_LLAMA_CPP_HPP
#define MEMDECAY_EXPORTS_LLAMA_CPP_HPP

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "memdecay/detail/error.hpp"
#include "memdecay/core/eviction.hpp"
#include "memdecay/core/sequence_like.hpp"

namespace memdecay {

/// A half-open range [p0, p1) of llama.cpp positions (llama_pos is int32).
struct llama_position_range {
  std::int32_t p0;
  std::int32_t p1;
  friend bool operator==(const llama_position_range&, const llama_position_range&) = default;
};

namespace detail {
// Appends [begin, end) to `out`, merging it into the last range when they touch; input_error if it leaves int32.
inline void push_position_range(std::vector<llama_position_range>& out, std::uint64_t begin, std::uint64_t end) {
  if (end > static_cast<std::uint64_t>(std::numeric_limits<std::int32_t>::max()))
    detail::raise_input("position " + detail::to_text(end) + " does not fit llama_pos (int32)");
  if (!out.empty() && static_cast<std::uint64_t>(out.back().p1) == begin) {
    out.back().p1 = static_cast<std::int32_t>(end);
  } else {
    out.push_back({static_cast<std::int32_t>(begin), static_cast<std::int32_t>(end)});
  }
}
}  // namespace detail

/// The positions `plan` evicts from `seq`, as ascending, merged ranges for llama_memory_seq_rm. Call before
/// commit. usage_error if commit would reject the plan (stale, or naming pages that cannot be removed);
/// input_error if a position does not fit int32. Changes nothing. Any policy's sequence (sequence_like).
template <sequence_like Sequence>
[[nodiscard]] std::vector<llama_position_range> llama_position_ranges(const Sequence& seq,
                                                                      const typename Sequence::plan_type& plan) {
  seq.check_commit(plan);
  std::vector<llama_position_range> out;
  const auto origins = seq.state().page_origins();
  for (std::size_t p : plan.pages)
    detail::push_position_range(out, origins[p] * seq.page_size(), (origins[p] + 1) * seq.page_size());
  return out;
}

/// Every position `seq` has evicted so far, as ascending, merged ranges: the holes in its llama.cpp cache. An
/// engine that rebuilds or checks its cache (after a restore, or to assert the two agree) replays these. With a host
/// tier (tiers/host_tier.hpp), a page on the host is a hole too: the cache holds the device pages only.
template <sequence_like Sequence>
[[nodiscard]] std::vector<llama_position_range> llama_evicted_ranges(const Sequence& seq) {
  std::vector<llama_position_range> out;
  const std::uint64_t P = seq.page_size();
  std::uint64_t expected = 0;  // the next original page if nothing had been evicted
  const auto origins = seq.state().page_origins();
  for (std::size_t p = 0; p < origins.size(); ++p) {
    if constexpr (requires { seq.host_pages(); })
      if (seq.host_pages() != 0 && seq.host_tier().on_host(p)) continue;
    const std::uint64_t origin = origins[p];
    if (origin > expected) detail::push_position_range(out, expected * P, origin * P);
    expected = origin + 1;
  }
  if (expected * P < seq.logical_len()) detail::push_position_range(out, expected * P, seq.logical_len());
  return out;
}

}  // namespace memdecay

#endif  // MEMDECAY_EXPORTS_LLAMA_CPP_HPP
