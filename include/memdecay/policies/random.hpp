// SPDX-License-Identifier: Apache-2.0
// random policy: evict uniformly random pages, reproducibly.
//
// Source: the random-eviction baseline of the KV-compression literature (e.g. NVIDIA kvpress RandomPress,
// kvpress/presses/random_press.py). Here the randomness is counter-based: page p's score is
// splitmix64(seed ^ splitmix64(origin_p)) reduced to 24 bits, where origin_p is the page's original index in
// the sequence. Every page draws one key when it is created and keeps it, so the victims are a uniformly random
// order of the evictable pages, a pure function of (seed, layout): identical on every rank, under replay and
// whatever the thread count. No attention needed.
//
// State per token: none. Cost: O(pages) per score, nothing per observation.
#ifndef MEMDECAY_POLICIES_RANDOM_HPP
#define MEMDECAY_POLICIES_RANDOM_HPP

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "memdecay/core/config.hpp"
#include "memdecay/core/policy.hpp"

namespace memdecay::policies {

template <class Float = float>
class random : public policy_support::stateless_hooks<Float> {
  static_assert(std::floating_point<Float>, "policies score in float or double");

 public:
  using float_type = Float;
  struct params_type {
    std::uint64_t seed = 0;  ///< runs with the same seed evict the same pages
  };
  static constexpr std::string_view name = "random";

  random(const params_type& params, const config&, const region_table&) : seed_(params.seed) {}

  /// The key of the page created as the sequence's `origin`-th page: an integer in [0, 2^24), exact in float.
  [[nodiscard]] std::uint64_t key(std::uint64_t origin) const noexcept {
    return policy_support::splitmix64(seed_ ^ policy_support::splitmix64(origin)) >> 40;
  }

  void page_scores(const sequence_view& view, std::span<Float> out) const noexcept {
    for (std::size_t p = 0; p < view.num_pages(); ++p) out[p] = static_cast<Float>(key(view.page_origins[p]));
  }
  [[nodiscard]] std::uint64_t digest() const noexcept { return seed_; }

  /// The snapshot's fields (io/snapshot.hpp): parameters (checked against the target's on load), then state.
  template <class Fields>
  void snapshot_fields(Fields& f) {
    f.param("seed", seed_);
  }

 private:
  std::uint64_t seed_;
};

static_assert(eviction_policy<random<float>> && eviction_policy<random<double>>);

}  // namespace memdecay::policies

#endif  // MEMDECAY_POLICIES_RANDOM_HPP
