// SPDX-License-Identifier: Apache-2.0
// memdecay's share of a llama.cpp decode step (docs/llama-cpp.md): one token decoded by llama.cpp over a context
// of N resident tokens, with and without attention capture, against memdecay's own work for that step at N
// resident tokens (append, observe the layer-summed row, advance, select for the budget, commit when a page is
// due: one page of 16 every 16 steps at a full budget). The ratios are taken within one run.
//
//   memdecay_llama_bench --benchmark_filter='llama/' --benchmark_min_time=0.5
//
// The model is the committed llama-small (2 layers, d 128): a real model's decode step is orders of magnitude
// longer, so the share here is an upper bound for it.
#include <benchmark/benchmark.h>

#include <memdecay/core/sequence.hpp>
#include <memdecay/llama_cpp/session.hpp>
#include <memdecay/page_tables/block_pool.hpp>

#include <cstdint>
#include <memory>
#include <vector>

namespace {

namespace md = memdecay;
namespace lc = memdecay::llama_cpp;

std::shared_ptr<const lc::model> bench_model() {
  static auto m = lc::model::load(MEMDECAY_LLAMA_BENCH_MODEL);
  return m;
}

// A session holding n resident tokens of filler (ids 256-511) in a context with room for one more.
std::unique_ptr<lc::session> filled(std::size_t n, bool capture) {
  lc::session_options o;
  o.capture_attention = capture;
  o.n_ctx = static_cast<std::uint32_t>(n + 256);
  o.n_batch = 512;
  o.positions = lc::position_mode::compact;
  auto s = std::make_unique<lc::session>(bench_model(), o);
  std::vector<llama_token> t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = static_cast<llama_token>(256 + (i * 37) % 256);
  t[0] = 1;
  for (std::size_t first = 0; first < n; first += 512)
    s->decode(std::span<const llama_token>(t.data() + first, std::min<std::size_t>(512, n - first)));
  return s;
}

// llama.cpp's decode of one token at n resident tokens; the token is removed again (outside the timing) so every
// iteration sees the same context.
void decode_step(benchmark::State& state, bool capture) {
  const auto n = static_cast<std::size_t>(state.range(0));
  auto s = filled(n, capture);
  const llama_token tok[] = {300};
  for (auto _ : state) {
    auto r = s->decode(tok);
    benchmark::DoNotOptimize(r.last_logits.data());
    state.PauseTiming();
    const md::llama_position_range last[] = {{static_cast<std::int32_t>(s->appended() - 1),
                                              static_cast<std::int32_t>(s->appended())}};
    s->remove(last);
    state.ResumeTiming();
  }
  state.SetLabel(capture ? "attention captured" : "llama.cpp alone");
}
void BM_decode_step(benchmark::State& state) { decode_step(state, false); }
void BM_decode_step_capture(benchmark::State& state) { decode_step(state, true); }

// memdecay's step at n resident tokens, the configuration memdecay-llama measures (lifetime normalisation,
// page 16, budget n): one token appended and observed per step.
void BM_memdecay_step(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  md::config cfg;
  cfg.page_size = 16;
  cfg.normalization = md::attention_normalization::lifetime;
  cfg.alpha = 1.0;
  cfg.tau = 2.0;
  cfg.budget = md::budget_config::tokens(static_cast<double>(n));
  cfg.protection = {.sink_pages = 0, .recent_tokens = 16};
  md::sequence seq(cfg);
  md::block_pool<> pool((n + 64) / 16 + 8, 16);
  pool.open(0);
  const md::region_span prompt[] = {{md::regions::system, 256}, {md::regions::user, n - 256}};
  seq.append(prompt);
  pool.append_tokens(0, seq.kv_len());
  std::vector<float> mass;
  md::step_t now = 0;
  for (auto _ : state) {
    seq.append(md::regions::scratchpad, 1);
    pool.append_tokens(0, 1);
    mass.assign(seq.kv_len(), 2.0f / static_cast<float>(seq.kv_len()));  // two layers' rows, summed
    mass[seq.kv_len() - 2] += 0.5f;
    seq.observe_tokens(mass);
    seq.advance_to(++now);
    const auto plan = seq.select_for_budget();
    if (!plan.pages.empty()) seq.commit(plan, pool, 0);
    benchmark::DoNotOptimize(plan.pages.data());
  }
  state.SetLabel("lifetime, page 16, budget = context");
}

BENCHMARK(BM_decode_step)->Name("llama/decode_step")->Arg(2048)->Arg(16384)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_decode_step_capture)->Name("llama/decode_step_capture")->Arg(2048)->Arg(16384)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_memdecay_step)->Name("llama/memdecay_step")->Arg(2048)->Arg(16384)->Unit(benchmark::kMicrosecond);

}  // namespace
