// SPDX-License-Identifier: Apache-2.0
// The host tier's decisions (tiers/host_tier.hpp) against one engine step's scoring pass over the same sequence:
//
//   tier/recall_decision/<tokens>  select_recall_for_bounds: a recall plan from per-page bounds the engine
//                                  computed (the candidate sweep, simd/recall_select.hpp, and the plan), half the
//                                  pages on the host, at most 8 promotions (random bounds: every plan promotes 8)
//   tier/fused_pass/<tokens>       advance_to + observe_tokens through the public API on a memdecay::sequence of
//                                  as many device tokens, no tier: the step's fused observation and scoring pass
//   tier/demotion/<tokens>         select(32) with the tier: victims, the region rule and the host pool split
//
// Pages of 16, default regions, float. recall_decision / fused_pass is the share of a scoring pass a recall
// decision costs (issue 16's target: under 5% at 128K resident tokens). Items are tokens.
//
//   memdecay_bench --benchmark_filter='^tier/'
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

#include <memdecay/core/sequence.hpp>

namespace md = memdecay;

namespace {

constexpr std::size_t P = 16;

// `tokens` held tokens, half of the pages on the host (unlimited host tier, no region rule), at most 8 promotions
// per plan.
md::sequence tiered(std::size_t tokens) {
  const std::size_t pages = tokens / P;
  md::sequence seq(md::config{.page_size = P, .budget = md::budget_config::pages(static_cast<double>(pages / 2))});
  std::mt19937 rng(9);
  for (std::size_t p = 0; p < pages; ++p) seq.append(static_cast<md::region_id>(1 + rng() % 6), P);
  seq.advance_to(100);
  std::vector<float> mass(seq.kv_len());
  for (auto& m : mass) m = static_cast<float>(rng() % 1000) / (1000.0f * static_cast<float>(mass.size()));
  seq.observe_tokens(mass);
  seq.enable_host_tier({.max_recall_pages = 8});  // ArkVale-like: a few pages per step
  seq.commit(seq.select_for_budget());
  return seq;
}

void recall_decision(benchmark::State& st) {
  const auto tokens = static_cast<std::size_t>(st.range(0));
  const md::sequence seq = tiered(tokens);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  std::vector<float> bounds(seq.num_pages());
  for (auto& b : bounds) b = normal(rng);
  std::size_t promoted = 0;
  for (auto _ : st) {
    const auto plan = seq.select_recall_for_bounds(bounds);
    promoted += plan.promote.size();
    benchmark::DoNotOptimize(plan.promote.data());
  }
  st.counters["host_pages"] = static_cast<double>(seq.host_pages());
  st.counters["promoted"] = static_cast<double>(promoted) / static_cast<double>(st.iterations());
  st.SetItemsProcessed(st.iterations() * static_cast<std::int64_t>(tokens));
}

void demotion(benchmark::State& st) {
  const auto tokens = static_cast<std::size_t>(st.range(0));
  const md::sequence seq = tiered(tokens);
  for (auto _ : st) {
    const auto plan = seq.select(32);
    benchmark::DoNotOptimize(plan.demoted.data());
  }
  st.SetItemsProcessed(st.iterations() * static_cast<std::int64_t>(tokens));
}

void fused_pass(benchmark::State& st) {
  const auto tokens = static_cast<std::size_t>(st.range(0));
  md::sequence seq(md::config{.page_size = P});
  std::mt19937 rng(9);
  for (std::size_t p = 0; p < tokens / P; ++p) seq.append(static_cast<md::region_id>(1 + rng() % 6), P);
  std::vector<float> mass(seq.kv_len());
  for (auto& m : mass) m = static_cast<float>(rng() % 1000) / (1000.0f * static_cast<float>(mass.size()));
  md::step_t step = 0;
  for (auto _ : st) {
    seq.advance_to(++step);
    benchmark::DoNotOptimize(seq.observe_tokens(mass));
  }
  st.SetItemsProcessed(st.iterations() * static_cast<std::int64_t>(tokens));
}

void sizes(benchmark::internal::Benchmark* b) { b->Arg(16384)->Arg(131072)->Unit(benchmark::kMicrosecond); }

const int registered = [] {
  sizes(benchmark::RegisterBenchmark("tier/recall_decision", recall_decision));
  sizes(benchmark::RegisterBenchmark("tier/fused_pass", fused_pass));
  sizes(benchmark::RegisterBenchmark("tier/demotion", demotion));
  return 0;
}();

}  // namespace
