// The compact state layout (simd/compact_state.hpp: u8 region, u16 stamp, fp16 EWMA; 5 bytes per token) against
// the full layout (u8 region, u32 clock, float EWMA; 9 bytes), same tokens, same kernel structure, in one run:
//   compact/score_full/<n>      simd::page_scores on a sequence_state<float, 16>
//   compact/score_compact/<n>   simd::compact_page_scores on the compact_state of the same tokens
//   compact/fused_full/<n>      simd::observe_and_score (full layout)
//   compact/fused_compact/<n>   simd::compact_observe_and_score
// n = tokens; pages of 16; float; the default seven regions. Items are tokens; bytes are the state traffic per
// token: score 9 vs 5 (+ 0.25 for the page score), fused 21 vs 13 (+ 0.25). See docs/benchmarks.md.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <memdecay/memdecay.hpp>
#include <memdecay/simd/compact_state.hpp>

namespace md = memdecay;
namespace ms = memdecay::simd;

namespace {

constexpr std::size_t kPage = 16;

struct compact_workload {
  md::region_table table = md::default_region_table();
  md::sequence_state<float, kPage> full;
  ms::compact_state<kPage> compact;
  std::vector<float> mass, out;
  ms::region_lut<float> lut{table};
  md::observation_params<float> obs{};
  float alpha = 1.0f;

  explicit compact_workload(std::size_t n) {
    std::uint64_t x = 12345;
    auto next = [&x] { return x = x * 6364136223846793005ULL + 1442695040888963407ULL; };
    std::vector<md::region_span> spans;
    for (std::size_t done = 0; done < n;) {
      const std::size_t run = std::min<std::size_t>(n - done, 8 + (next() >> 58));
      spans.push_back({static_cast<md::region_id>((next() >> 33) % 7), run});
      done += run;
    }
    full.append(spans);
    full.advance_to(5000);
    auto lr = full.last_refresh_mut();
    auto ew = full.ewma_mut();
    mass.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      lr[i] = static_cast<md::step_t>(1000 + (next() >> 33) % 4000);
      ew[i] = static_cast<float>((next() >> 40) % 1000) / 500.0f;
      mass[i] = static_cast<float>((next() >> 40) % 1000) / 400.0f / static_cast<float>(n);
    }
    compact = ms::compact_state<kPage>(full);
    out.resize(full.num_pages());
    obs = {0.9f, 1.0f, static_cast<float>(n)};
  }
};

compact_workload& data(std::size_t n) {
  static std::map<std::size_t, std::unique_ptr<compact_workload>> cache;
  auto it = cache.find(n);
  if (it == cache.end()) {
    cache.clear();
    it = cache.emplace(n, std::make_unique<compact_workload>(n)).first;
  }
  return *it->second;
}

template <class F>
void run(benchmark::State& st, double bytes_per_token, F&& kernel) {
  const auto n = static_cast<std::size_t>(st.range(0));
  auto& w = data(n);
  std::size_t sink = 0;
  for (auto _ : st) {
    sink += kernel(w);
    benchmark::DoNotOptimize(w.out.data());
    benchmark::ClobberMemory();
  }
  benchmark::DoNotOptimize(sink);
  st.SetItemsProcessed(static_cast<std::int64_t>(st.iterations()) * static_cast<std::int64_t>(n));
  st.SetBytesProcessed(static_cast<std::int64_t>(static_cast<double>(st.iterations()) * static_cast<double>(n) *
                                                 bytes_per_token));
}

void register_all() {
  const std::vector<std::int64_t> sizes = {65536, 1 << 20, 1 << 24};
  std::vector<std::pair<std::string, void (*)(benchmark::State&)>> variants;
  auto add = [&](const std::string& name, void (*fn)(benchmark::State&)) { variants.emplace_back(name, fn); };
  add("compact/score_full", [](benchmark::State& st) {
    run(st, 9.25, [](compact_workload& w) {
      ms::page_scores(w.full, w.lut, w.alpha, std::span<float>(w.out));
      return std::size_t{0};
    });
  });
  add("compact/score_compact", [](benchmark::State& st) {
    run(st, 5.25, [](compact_workload& w) {
      ms::compact_page_scores(w.compact, w.lut, w.alpha, std::span<float>(w.out));
      return std::size_t{0};
    });
  });
  add("compact/fused_full", [](benchmark::State& st) {
    run(st, 21.25, [](compact_workload& w) {
      return ms::observe_and_score(w.full, std::span<const float>(w.mass), w.obs, w.lut, w.alpha,
                                   std::span<float>(w.out));
    });
  });
  add("compact/fused_compact", [](benchmark::State& st) {
    run(st, 13.25, [](compact_workload& w) {
      return ms::compact_observe_and_score(w.compact, std::span<const float>(w.mass), w.obs, w.lut, w.alpha,
                                           std::span<float>(w.out));
    });
  });
  for (auto n : sizes)
    for (const auto& [name, fn] : variants)
      benchmark::RegisterBenchmark(name.c_str(), fn)->Arg(n)->Unit(benchmark::kMicrosecond);
}

const bool registered = (register_all(), true);

}  // namespace
