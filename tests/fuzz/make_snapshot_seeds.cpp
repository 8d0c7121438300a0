// SPDX-License-Identifier: Apache-2.0
// Writes the seed corpus of the snapshot fuzzer (corpus/snapshot): a snapshot of every policy's sequence with some
// history (and of an empty one), plus a truncated and a corrupted copy. Run from the repository root:
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
}

template <class... Seq>
void all(std::tuple<Seq...>*) {
  (seeds<Seq>(), ...);
}

}  // namespace

int main() { all(static_cast<snapshot_fuzz::all_sequences*>(nullptr)); }
