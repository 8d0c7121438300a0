// SPDX-License-Identifier: Apache-2.0
// Snapshots (io/snapshot.hpp): save and load of one MemDecay sequence of n resident tokens (pages of 16, an
// episode's worth of history: evictions, refreshes, the exp-free weights), against a plain copy of the same
// sequence (copy/<n>: what an in-memory checkpoint costs). Counters: bytes_per_token of the snapshot; items are
// tokens, so the time per token is 1 / items_per_second.
//
//   memdecay_bench --benchmark_filter='^snapshot/'
#include <benchmark/benchmark.h>

#include <cstdint>
#include <map>
#include <random>
#include <vector>

#include <memdecay/core/sequence.hpp>
#include <memdecay/io/snapshot.hpp>

namespace md = memdecay;

namespace {

const md::sequence& history(std::size_t n) {
  static std::map<std::size_t, md::sequence> cache;
  auto it = cache.find(n);
  if (it != cache.end()) return it->second;
  md::sequence seq(md::config{.page_size = 16, .budget = md::budget_config::tokens(static_cast<double>(n))});
  std::mt19937 rng(7);
  std::vector<float> mass;
  md::step_t step = 0;
  while (seq.logical_len() < n + n / 4) {
    seq.append(static_cast<md::region_id>(1 + rng() % 6), 256);
    seq.advance_to(++step);
    mass.resize(seq.kv_len());
    for (auto& m : mass) m = static_cast<float>(rng() % 1000) / (1000.0f * static_cast<float>(mass.size()));
    seq.observe_tokens(mass);
    seq.commit(seq.select_for_budget());
  }
  return cache.emplace(n, std::move(seq)).first->second;
}

void finish(benchmark::State& st, const md::sequence& seq, std::size_t bytes) {
  st.SetItemsProcessed(st.iterations() * static_cast<std::int64_t>(seq.kv_len()));
  st.counters["bytes_per_token"] = static_cast<double>(bytes) / static_cast<double>(seq.kv_len());
}

void save(benchmark::State& st) {
  const auto& seq = history(static_cast<std::size_t>(st.range(0)));
  std::size_t bytes = 0;
  for (auto _ : st) {
    auto b = md::snapshot::save(seq);
    bytes = b.size();
    benchmark::DoNotOptimize(b.data());
  }
  finish(st, seq, bytes);
}

void load(benchmark::State& st) {
  const auto& seq = history(static_cast<std::size_t>(st.range(0)));
  const auto bytes = md::snapshot::save(seq);
  md::sequence target(seq.get_config());
  for (auto _ : st) {
    md::snapshot::load(target, bytes);
    benchmark::DoNotOptimize(target.kv_len());
  }
  finish(st, seq, bytes.size());
}

void copy(benchmark::State& st) {
  const auto& seq = history(static_cast<std::size_t>(st.range(0)));
  for (auto _ : st) {
    md::sequence c(seq);
    benchmark::DoNotOptimize(c.kv_len());
  }
  finish(st, seq, 0);
}

BENCHMARK(save)->Name("snapshot/save")->Arg(4096)->Arg(32768)->Arg(262144)->Unit(benchmark::kMicrosecond);
BENCHMARK(load)->Name("snapshot/load")->Arg(4096)->Arg(32768)->Arg(262144)->Unit(benchmark::kMicrosecond);
BENCHMARK(copy)->Name("snapshot/copy")->Arg(4096)->Arg(32768)->Arg(262144)->Unit(benchmark::kMicrosecond);

}  // namespace
