// The policy end to end, through memdecay::sequence (the SIMD kernels are its hot path):
//   sequence/observe/<n>          observe_tokens: validation + the reference observation + the SIMD score pass
//   sequence/select/<n>           select(n_pages / 8) right after an observation (reuses those scores)
//   sequence/select_after_tick/<n> advance_to(+1) then select(n_pages / 8): a score-only pass + selection
// n = tokens, pages of 16, uniform normalisation. The kernels alone, and their baselines: simd_bench.cpp.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include <memdecay/memdecay.hpp>

namespace md = memdecay;

namespace {

md::sequence make_sequence(std::size_t tokens) {
  md::sequence seq(md::config{.normalization = md::attention_normalization::uniform});
  std::uint64_t x = 12345;
  for (std::size_t done = 0; done < tokens;) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    const std::size_t run = std::min<std::size_t>(tokens - done, 8 + (x >> 58));
    seq.append(static_cast<md::region_id>(1 + (x >> 33) % 6), run);
    done += run;
  }
  seq.advance_to(1000);
  return seq;
}

std::vector<float> make_mass(std::size_t n) {
  std::vector<float> mass(n);
  for (std::size_t i = 0; i < n; ++i) mass[i] = static_cast<float>(i * 7919 % 1000) / 500.0f / static_cast<float>(n);
  return mass;
}

void BM_sequence_observe(benchmark::State& state) {
  auto seq = make_sequence(static_cast<std::size_t>(state.range(0)));
  const auto mass = make_mass(seq.kv_len());
  std::size_t refreshed = 0;
  for (auto _ : state) refreshed += seq.observe_tokens(mass);
  benchmark::DoNotOptimize(refreshed);
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

void BM_sequence_select(benchmark::State& state) {
  auto seq = make_sequence(static_cast<std::size_t>(state.range(0)));
  seq.observe_tokens(make_mass(seq.kv_len()));
  std::size_t victims = 0;
  for (auto _ : state) victims += seq.select(seq.num_pages() / 8).pages.size();
  benchmark::DoNotOptimize(victims);
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

void BM_sequence_select_after_tick(benchmark::State& state) {
  auto seq = make_sequence(static_cast<std::size_t>(state.range(0)));
  seq.observe_tokens(make_mass(seq.kv_len()));
  std::size_t victims = 0;
  md::step_t now = seq.now();
  for (auto _ : state) {
    seq.advance_to(++now);
    victims += seq.select(seq.num_pages() / 8).pages.size();
  }
  benchmark::DoNotOptimize(victims);
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

}  // namespace

BENCHMARK(BM_sequence_observe)->Name("sequence/observe")->RangeMultiplier(16)->Range(1 << 12, 1 << 20);
BENCHMARK(BM_sequence_select)->Name("sequence/select")->RangeMultiplier(16)->Range(1 << 12, 1 << 20);
BENCHMARK(BM_sequence_select_after_tick)
    ->Name("sequence/select_after_tick")
    ->RangeMultiplier(16)
    ->Range(1 << 12, 1 << 20);
