// SPDX-License-Identifier: Apache-2.0
// Writes the seed corpus of the snapshot fuzzer (corpus/snapshot): a snapshot of every policy's sequence with some
// history (and of an empty one), the same with page digests (format 2), plus a truncated and a corrupted copy. The
// committed seed_empty_/seed_history_/bad_ files are format 1 (kept as they were: they cover the migration), the
// seed_digests_ files format 2, the seed_tier_ files format 3 (a host tier with pages on it), the seed_rule_ files
// format 4 (the same tier with displace_lowest). Run from the
// repository root (then restore the older files with git checkout):
//     g++ -std=c++20 -Iinclude -I/usr/include/eigen3 tests/fuzz/make_snapshot_seeds.cpp -o /tmp/seeds && /tmp/seeds
#include <cstdio>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include "memdecay/io/snapshot.hpp"
#include "snapshot_common.hpp"

namespace {

void write(const std::string& name, const std::vector<std::byte>& b) {
  const std::string path = "tests/fuzz/corpus/snapshot/" + name;
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  std::printf("%s (%zu bytes)\n", path.c_str(), b.size());
}

template <class Seq>
void seeds() {
  Seq seq(snapshot_fuzz::fuzz_config());
  const std::string name(Seq::policy_type::name);
  write("seed_empty_" + name, memdecay::snapshot::save(seq));
  snapshot_fuzz::add_history(seq, 1, 12);
  const auto b = memdecay::snapshot::save(seq);
  write("seed_history_" + name, b);
  write("bad_truncated_" + name,
        std::vector<std::byte>(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(b.size() / 2)));
  auto flipped = b;
  flipped[flipped.size() - 3] ^= std::byte{0x10};
  write("bad_flipped_" + name, flipped);
  // Format 2's page-digest section: f16 min/max digests on some pages.
  seq.enable_digests({.kv_heads = 2, .head_dim = 3, .query_heads = 4, .storage = memdecay::digest_storage::f16});
  for (std::size_t p = 0; p < seq.num_pages(); p += 2) {
    std::vector<float> keys(2 * 2 * 3);
    for (std::size_t i = 0; i < keys.size(); ++i) keys[i] = static_cast<float>((i * 5 + p) % 7) - 3.0f;
    seq.set_page_keys(p, keys);
  }
  write("seed_digests_" + name, memdecay::snapshot::save(seq));
  // Format 3's host-tier section: pages demoted to a bounded host tier by the region rule.
  seq.enable_host_tier({.host_budget = memdecay::budget_config::pages(3), .min_host_priority = 0.35});
  seq.append(memdecay::regions::user, 12);
  seq.advance_to(seq.now() + 2);
  seq.commit(seq.select_for_budget());
  write("seed_tier_" + name, memdecay::snapshot::save(seq));
  // Format 4: the tier's displace_lowest rule.
  seq.enable_host_tier({.host_budget = memdecay::budget_config::pages(3), .min_host_priority = 0.35,
                        .displace_lowest = 2});
  write("seed_rule_" + name, memdecay::snapshot::save(seq));
}

template <class... Seq>
void all(std::tuple<Seq...>*) {
  (seeds<Seq>(), ...);
}

}  // namespace

int main() { all(static_cast<snapshot_fuzz::all_sequences*>(nullptr)); }
