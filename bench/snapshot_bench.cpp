// SPDX-License-Identifier: Apache-2.0
// Snapshots (io/snapshot.hpp): save and load of one MemDecay sequence of n resident tokens (pages of 16, an
// episode's worth of history: evictions, refreshes, the exp-free weights), against a plain copy of the same
// sequence (copy/<n>: what an in-memory checkpoint costs). Counters: bytes_per_token of the snapshot; items are
// tokens, so the time per token is 1 / items_per_second.
//
// Manager snapshots (io/manager_snapshot.hpp) of S sequences x T resident tokens: manager/full (every sequence) and
// manager/incremental, the checkpoint an engine takes every few seconds: between two saves every clock moves 64
// steps and a running batch of S/32 sequences (a different one each time) appends and observes; only the save is
// timed. Items are all resident tokens, so bytes_per_token and 1 / items_per_second are per resident token, the
// unit of issue 18's target (under 1 ns and 10 bytes). manager/load reads a full snapshot back.
//
//   memdecay_bench --benchmark_filter='^snapshot/'
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <map>
#include <random>
#include <vector>

#include <memdecay/core/manager.hpp>
#include <memdecay/core/sequence.hpp>
#include <memdecay/io/manager_snapshot.hpp>
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

// --- managers ---

md::config manager_sequence_config(std::size_t tokens) {
  return md::config{.page_size = 16, .budget = md::budget_config::tokens(static_cast<double>(tokens))};
}

// S sequences of T resident tokens each, with history (appends, observations, evictions by their own budgets).
md::manager& fleet(std::size_t sequences, std::size_t tokens) {
  static std::map<std::pair<std::size_t, std::size_t>, md::manager> cache;
  const auto key = std::make_pair(sequences, tokens);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  auto& mgr = cache.emplace(key, md::manager({.page_size = 16})).first->second;
  std::mt19937 rng(11);
  std::vector<float> mass;
  for (std::uint64_t id = 0; id < sequences; ++id) {
    auto& seq = mgr.open(id, manager_sequence_config(tokens));
    seq.append(md::regions::system, 64);
    while (seq.logical_len() < tokens + tokens / 4) {
      seq.append(static_cast<md::region_id>(1 + rng() % 6), tokens / 8);
      mass.resize(seq.kv_len());
      for (auto& m : mass) m = static_cast<float>(rng() % 1000) / (1000.0f * static_cast<float>(mass.size()));
      seq.observe_tokens(mass);
      mgr.commit(id, mgr.select(id));
    }
  }
  return mgr;
}

void finish_manager(benchmark::State& st, const md::manager& mgr, double bytes) {
  std::size_t tokens = 0;
  for (std::uint64_t id : mgr.ids()) tokens += mgr.at(id).kv_len();
  st.SetItemsProcessed(st.iterations() * static_cast<std::int64_t>(tokens));
  st.counters["bytes_per_token"] = bytes / static_cast<double>(tokens);
  st.counters["sequences"] = static_cast<double>(mgr.size());
}

void manager_full(benchmark::State& st) {
  auto& mgr = fleet(static_cast<std::size_t>(st.range(0)), static_cast<std::size_t>(st.range(1)));
  md::snapshot::checkpoint cp;
  std::vector<std::byte> b;  // the engine's checkpoint buffer, reused
  for (auto _ : st) {
    cp.reset();  // full every time
    md::snapshot::save(mgr, cp, b);
    benchmark::DoNotOptimize(b.data());
  }
  finish_manager(st, mgr, static_cast<double>(b.size()));
}

void manager_incremental(benchmark::State& st) {
  auto& mgr = fleet(static_cast<std::size_t>(st.range(0)), static_cast<std::size_t>(st.range(1)));
  md::snapshot::checkpoint cp;
  (void)md::snapshot::save(mgr, cp);
  const std::size_t batch = std::max<std::size_t>(1, mgr.size() / 32);
  std::size_t next = 0, total = 0;
  std::mt19937 rng(5);
  std::vector<float> mass;
  std::vector<std::byte> b;  // the engine's checkpoint buffer, reused
  for (auto _ : st) {
    st.PauseTiming();
    mgr.advance_to(mgr.now() + 64);
    for (std::size_t k = 0; k < batch; ++k, next = (next + 1) % mgr.size()) {
      auto& seq = mgr.at(next);
      seq.append(md::regions::tool_out, 16);
      mass.resize(seq.kv_len());
      for (auto& m : mass) m = static_cast<float>(rng() % 1000) / (1000.0f * static_cast<float>(mass.size()));
      seq.observe_tokens(mass);
      mgr.commit(next, mgr.select(next));
    }
    st.ResumeTiming();
    md::snapshot::save(mgr, cp, b);
    total += b.size();
    benchmark::DoNotOptimize(b.data());
  }
  finish_manager(st, mgr, static_cast<double>(total) / static_cast<double>(std::max<std::int64_t>(1, st.iterations())));
}

void manager_load(benchmark::State& st) {
  auto& mgr = fleet(static_cast<std::size_t>(st.range(0)), static_cast<std::size_t>(st.range(1)));
  const auto bytes = md::snapshot::save(mgr);
  md::manager target({.page_size = 16});
  const auto cfg = manager_sequence_config(static_cast<std::size_t>(st.range(1)));
  for (auto _ : st) {
    md::snapshot::load(target, bytes, cfg);
    benchmark::DoNotOptimize(target.size());
  }
  finish_manager(st, mgr, static_cast<double>(bytes.size()));
}

BENCHMARK(save)->Name("snapshot/save")->Arg(4096)->Arg(32768)->Arg(262144)->Unit(benchmark::kMicrosecond);
BENCHMARK(load)->Name("snapshot/load")->Arg(4096)->Arg(32768)->Arg(262144)->Unit(benchmark::kMicrosecond);
BENCHMARK(copy)->Name("snapshot/copy")->Arg(4096)->Arg(32768)->Arg(262144)->Unit(benchmark::kMicrosecond);
BENCHMARK(manager_full)
    ->Name("snapshot/manager/full")
    ->Args({256, 32768})
    ->Args({4096, 2048})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(manager_incremental)
    ->Name("snapshot/manager/incremental")
    ->Args({256, 32768})
    ->Args({4096, 2048})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(manager_load)
    ->Name("snapshot/manager/load")
    ->Args({256, 32768})
    ->Args({4096, 2048})
    ->Unit(benchmark::kMillisecond);

}  // namespace
