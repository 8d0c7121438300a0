// SPDX-License-Identifier: Apache-2.0
// What the snapshot fuzzer and its seed writer share: the one config every target is built with (so that a seed's
// config digest matches), every policy's sequence type, and sequences with some history to snapshot.
#ifndef MEMDECAY_TESTS_FUZZ_SNAPSHOT_COMMON_HPP
#define MEMDECAY_TESTS_FUZZ_SNAPSHOT_COMMON_HPP

#include <cstdint>
#include <random>
#include <tuple>
#include <vector>

#include "memdecay/core/sequence.hpp"
#include "memdecay/policies/all.hpp"

namespace snapshot_fuzz {

namespace md = memdecay;
namespace pol = memdecay::policies;

inline md::config fuzz_config() {
  return md::config{.page_size = 4, .protection = {.recent_tokens = 4}, .budget = md::budget_config::tokens(24, 16)};
}

using all_sequences = std::tuple<
    md::policy_sequence<pol::memdecay>, md::policy_sequence<pol::h2o>, md::policy_sequence<pol::streaming_llm>,
    md::policy_sequence<pol::tova>, md::policy_sequence<pol::snapkv>, md::policy_sequence<pol::scissorhands>,
    md::policy_sequence<pol::norm_sum>, md::policy_sequence<pol::priority_lru>, md::policy_sequence<pol::random>>;

/// `steps` rounds of appends, clock moves, observations and commits under the budget.
template <class Seq>
void add_history(Seq& seq, std::uint64_t seed, int steps) {
  std::mt19937_64 rng(seed);
  for (int i = 0; i < steps; ++i) {
    seq.append(static_cast<md::region_id>(rng() % 7), 1 + rng() % 6);
    seq.advance_to(seq.now() + static_cast<md::step_t>(rng() % 5));
    std::vector<float> mass(seq.kv_len());
    for (auto& m : mass) m = static_cast<float>(rng() % 100) / (100.0f * static_cast<float>(mass.size()));
    seq.observe_tokens(mass);
    seq.commit(seq.select_for_budget());
  }
}

}  // namespace snapshot_fuzz

#endif  // MEMDECAY_TESTS_FUZZ_SNAPSHOT_COMMON_HPP
