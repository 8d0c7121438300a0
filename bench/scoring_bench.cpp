// Scoring microbenchmarks: the scalar reference page scorer and selection, over sequence lengths.
// Report ratios against a baseline measured in the same run (see docs/benchmarks.md).
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
  std::vector<float> mass(seq.kv_len(), 1.0f / static_cast<float>(seq.kv_len()));
  seq.observe_tokens(mass);
  return seq;
}

// Baseline: one pass that only reads the state (sum of EWMA), the memory-bound floor of any scorer.
void BM_read_state_floor(benchmark::State& state) {
  const auto seq = make_sequence(static_cast<std::size_t>(state.range(0)));
  for (auto _ : state) {
    float sum = 0;
    for (float a : seq.state().ewma()) sum += a;
    benchmark::DoNotOptimize(sum);
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

void BM_page_scores_scalar_reference(benchmark::State& state) {
  const auto seq = make_sequence(static_cast<std::size_t>(state.range(0)));
  std::vector<float> out(seq.num_pages());
  for (auto _ : state) {
    seq.page_scores(out);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

void BM_select_for_budget_scalar_reference(benchmark::State& state) {
  auto seq = make_sequence(static_cast<std::size_t>(state.range(0)));
  std::size_t victims = 0;
  for (auto _ : state) {
    const auto plan = seq.select(seq.num_pages() / 4);
    victims += plan.pages.size();
    benchmark::DoNotOptimize(victims);
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

}  // namespace

BENCHMARK(BM_read_state_floor)->RangeMultiplier(8)->Range(1 << 10, 1 << 19);
BENCHMARK(BM_page_scores_scalar_reference)->RangeMultiplier(8)->Range(1 << 10, 1 << 19);
BENCHMARK(BM_select_for_budget_scalar_reference)->RangeMultiplier(8)->Range(1 << 10, 1 << 19);
