// Victim selection among P pages, k victims, on the same scores and statuses in one run:
//   select/fast/k<k>/<P>          memdecay::simd::select_lowest_pages_fast (sampled threshold + compress)
//   select/nth_element/k<k>/<P>   (score, page) pairs of the evictable pages + std::nth_element + sort: the
//                                 library's reference select_lowest_pages
//   select/partial_sort/k<k>/<P>  the same pairs + std::partial_sort of the first k + sort
// k is 1, 32 or P/8 (named kP8). Scores are page means of a random state (continuous, some ties); a tenth of the
// pages are pinned or protected. Items are pages.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <memdecay/core/eviction.hpp>
#include <memdecay/simd/select.hpp>

namespace md = memdecay;
namespace ms = memdecay::simd;

namespace {

struct pages {
  std::vector<float> scores;
  std::vector<md::page_status> status;
};

const pages& data(std::size_t P) {
  static std::map<std::size_t, pages> cache;
  auto& d = cache[P];
  if (d.scores.empty()) {
    std::mt19937_64 rng(99);
    std::uniform_real_distribution<float> u(0.0f, 1.5f);
    d.scores.resize(P);
    d.status.assign(P, md::page_status::evictable);
    for (std::size_t p = 0; p < P; ++p) {
      d.scores[p] = rng() % 50 == 0 ? 0.25f : u(rng);  // 2% share one value: ties
      const auto r = rng() % 20;
      if (r == 0)
        d.status[p] = md::page_status::pinned;
      else if (r == 1)
        d.status[p] = md::page_status::protected_;
    }
  }
  return d;
}

std::vector<std::size_t> select_partial_sort(std::span<const float> scores, std::span<const md::page_status> status,
                                             std::size_t k) {
  std::vector<std::pair<float, std::size_t>> c;
  for (std::size_t p = 0; p < scores.size(); ++p)
    if (status[p] == md::page_status::evictable) c.emplace_back(scores[p], p);
  k = std::min(k, c.size());
  std::partial_sort(c.begin(), c.begin() + static_cast<std::ptrdiff_t>(k), c.end());
  std::vector<std::size_t> out;
  out.reserve(k);
  for (std::size_t i = 0; i < k; ++i) out.push_back(c[i].second);
  std::sort(out.begin(), out.end());
  return out;
}

enum class algo { fast, nth_element, partial_sort };

template <algo A>
void run(benchmark::State& st, std::size_t k_code) {
  const auto P = static_cast<std::size_t>(st.range(0));
  const std::size_t k = k_code == 0 ? P / 8 : k_code;
  const auto& d = data(P);
  std::size_t total = 0;
  for (auto _ : st) {
    std::vector<std::size_t> v;
    if constexpr (A == algo::fast)
      v = ms::select_lowest_pages_fast<float>(d.scores, d.status, k);
    else if constexpr (A == algo::nth_element)
      v = md::select_lowest_pages<float>(d.scores, d.status, k);
    else
      v = select_partial_sort(d.scores, d.status, k);
    total += v.size();
    benchmark::DoNotOptimize(v.data());
  }
  benchmark::DoNotOptimize(total);
  st.SetItemsProcessed(static_cast<std::int64_t>(st.iterations()) * static_cast<std::int64_t>(P));
}

void register_all() {
  for (std::int64_t P : {4096, 65536, 1 << 20})
    for (std::size_t k : {std::size_t{1}, std::size_t{32}, std::size_t{0}}) {
      std::string kn = "k";
      kn.append(k == 0 ? std::string("P8") : std::to_string(k));
      auto name = [&kn](const char* algo_name) {
        return std::string("select/").append(algo_name).append("/").append(kn);
      };
      benchmark::RegisterBenchmark(name("fast").c_str(), run<algo::fast>, k)->Arg(P)->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark(name("nth_element").c_str(), run<algo::nth_element>, k)
          ->Arg(P)
          ->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark(name("partial_sort").c_str(), run<algo::partial_sort>, k)
          ->Arg(P)
          ->Unit(benchmark::kMicrosecond);
    }
}

const bool registered = (register_all(), true);

}  // namespace
