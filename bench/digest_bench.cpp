// SPDX-License-Identifier: Apache-2.0
// Query-aware page scoring over key digests (simd/digest_bound.hpp, digests/page_digests.hpp): Quest's min/max
// bound of P pages x 8 KV heads x head dim 128, for a query of 32 heads (grouped-query attention, 4 query heads per
// KV head: Llama 3 8B's layer geometry), with fp32, fp16 and bf16 digests.
//
//   digest/bounds/<storage>/<pages>    the native-isa kernel
//   digest/bounds_page_major/<storage>/<pages>  the same kernel writing page-major bounds (simd::page_major: a
//                                      page's 32 results together, one stream) instead of 32 head-major rows
//   digest/bounds_group/<storage>/<pages>/<G>  bounds_page_major with G query heads per KV head (8 x G query heads):
//                                      1 for multi-head attention (Llama 2 7B), 8 for Llama 3 70B's grouping
//   digest/scalar/<storage>/<pages>    the same kernel instantiated for isa::scalar: the plain loop
//   digest/roofline/<storage>/<pages>  a read of the same digest bytes and nothing else (4 vector accumulators):
//                                      the memory roofline the kernel is measured against
//   digest/roofline_share/<storage>/<pages>/<G>  bounds_group and roofline run in turns in every iteration, each
//                                      timed: the counter share = read time / kernel time, the kernel's share of
//                                      the roofline with both measured over the same stretch of the run
//   digest/block_order_roofline/<storage>/<pages>  the same read in the kernel's order (blocks of pages, a KV head's
//                                      slice of each page of the block at a time): what that access order allows
//   digest/tiled_prototype/<storage>/<pages>/<G>  a prototype, not the library: the kernel's register block for G
//                                      query heads per KV head (the same FMAs in the same order, checked bit for
//                                      bit against the library's page-major bounds before timing) over a copy of
//                                      the digests tiled so that the block reads in address order: [block of PB
//                                      pages][KV head][channel step][lo of the PB pages][hi of them]. Answers
//                                      whether page_digests should store that layout (docs/tiers.md)
//   digest/fma_roofline/<storage>      independent vector FMAs and nothing else, counted as the digest bytes those
//                                      FMAs consume here (each digest value feeds one FMA lane per query head of
//                                      its group): the compute roofline, the most the kernel can reach in any cache
//   digest/observe_query/f16/<pages>   seq.observe_query: bounds, the softmax estimate and the observation
//   digest/observe_query_pool/f16/<pages>/<threads>  the same with the bounds and the estimate on a thread_pool
//   digest/select_recall/f16/<pages>   seq.select_recall(query) (head_bounds::max): bounds, each page's best head
//                                      and the recall plan, half the pages on the host, at most 8 promotions
//   digest/bounds_pool/<storage>/<pages>/<threads>    the kernel in tasks of simd::digest_task_pages pages on a
//                                      thread_pool (digests/digest_bounds_on.hpp, what page_digests::bounds runs
//                                      with an executor)
//   digest/roofline_pool/<storage>/<pages>/<threads>  the plain read in the same tasks on the same pool: the
//                                      memory roofline of that many cores (one core cannot draw a machine's DRAM
//                                      bandwidth), which bounds_pool is measured against
//
// Items are pages; bytes_per_second counts the digest bytes read (bytes_per_page without the presence byte), so
// bounds / roofline is the share of the roofline reached. At 1K pages (4-8 MiB) the digests sit in L2/L3, at 256K
// (1-2 GiB) they stream from DRAM.
//
//   memdecay_bench --benchmark_filter='^digest/'
#include <benchmark/benchmark.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <memory>
#include <random>
#include <tuple>
#include <vector>

#include <memdecay/core/executor.hpp>
#include <memdecay/core/sequence.hpp>
#include <memdecay/digests/digest_bounds_on.hpp>
#include <memdecay/digests/page_digests.hpp>
#include <memdecay/simd/digest_bound.hpp>
#include <memdecay/simd/packet.hpp>

namespace md = memdecay;

namespace {

constexpr std::size_t kv_heads = 8, query_heads = 32, head_dim = 128;

struct workload {
  md::digest_storage storage;
  md::page_digests::f32_values f32;  // stored as page_digests stores them (on cache lines)
  md::page_digests::half_values half;
  std::vector<float> prepared, out;
  std::size_t pages = 0;
  std::size_t bytes() const { return f32.size() * 4 + half.size() * 2; }
};

workload& digests(md::digest_storage storage, std::size_t pages) {
  static std::map<std::pair<int, std::size_t>, std::unique_ptr<workload>> cache;
  auto& slot = cache[{static_cast<int>(storage), pages}];
  if (slot) return *slot;
  slot = std::make_unique<workload>();
  workload& w = *slot;
  w.storage = storage;
  w.pages = pages;
  const std::size_t values = pages * kv_heads * 2 * head_dim;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  const auto fmt = storage == md::digest_storage::bf16 ? md::half_format::bf16 : md::half_format::f16;
  if (storage == md::digest_storage::f32) {
    w.f32.resize(values);
    for (auto& v : w.f32) v = normal(rng);
  } else {
    w.half.resize(values);
    for (auto& v : w.half) v = md::simd::float_to_half(normal(rng), fmt);
  }
  std::vector<float> query(query_heads * head_dim);
  for (auto& q : query) q = normal(rng);
  w.prepared.resize(query.size());
  md::simd::prepare_digest_query(query.data(), query_heads, head_dim, 0.088f, w.prepared.data());
  w.out.resize(query_heads * pages);
  return w;
}

// The library's bounds of w's digests for a prepared query of `heads` heads (query_heads, or 8 x G for another
// group) into `out`, placed as `layout` says.
template <md::simd::isa A>
void run_bounds(const workload& w, std::size_t heads, const float* prepared, float* out,
                md::simd::bounds_layout layout) {
  const md::simd::digest_shape shape{kv_heads, heads, head_dim, md::digest_kind::min_max};
  switch (w.storage) {
    case md::digest_storage::f32:
      return md::simd::digest_bounds<A>(shape, w.f32.data(), w.pages, prepared, out, layout);
    case md::digest_storage::f16:
      return md::simd::digest_bounds<A, std::uint16_t, md::half_format::f16>(shape, w.half.data(), w.pages, prepared,
                                                                             out, layout);
    case md::digest_storage::bf16:
      return md::simd::digest_bounds<A, std::uint16_t, md::half_format::bf16>(shape, w.half.data(), w.pages, prepared,
                                                                              out, layout);
  }
}

template <md::simd::isa A>
void run_bounds(workload& w, md::simd::bounds_layout layout) {
  run_bounds<A>(w, query_heads, w.prepared.data(), w.out.data(), layout);
  benchmark::DoNotOptimize(w.out.data());
  benchmark::ClobberMemory();
}

// The digest bytes of pages [first, first + count) summed as floats (4 vector accumulators): a plain read.
float read_pages(const workload& w, std::size_t first, std::size_t count) {
  using P = md::simd::packet<float, md::simd::native_isa>;
  const std::size_t page = w.bytes() / 4 / w.pages;  // floats per page
  const float* p = (w.f32.empty() ? reinterpret_cast<const float*>(w.half.data()) : w.f32.data()) + first * page;
  const std::size_t n = count * page;
  auto a0 = P::zero(), a1 = P::zero(), a2 = P::zero(), a3 = P::zero();
  std::size_t i = 0;
  for (; i + 4 * P::lanes <= n; i += 4 * P::lanes) {
    a0 = P::add(a0, P::load(p + i));
    a1 = P::add(a1, P::load(p + i + P::lanes));
    a2 = P::add(a2, P::load(p + i + 2 * P::lanes));
    a3 = P::add(a3, P::load(p + i + 3 * P::lanes));
  }
  return P::reduce_add(P::add(P::add(a0, a1), P::add(a2, a3)));
}
float read_all(const workload& w) { return read_pages(w, 0, w.pages); }

// The same bytes in the kernel's order: blocks of PB pages (the register block digest_bound.hpp uses for 4 query
// heads per KV head), one KV head's slice of each page of the block at a time, one vector of each page in turn.
float read_in_block_order(const workload& w) {
  using P = md::simd::packet<float, md::simd::native_isa>;
  constexpr std::size_t G = query_heads / kv_heads;
  constexpr std::size_t PB = md::simd::digest_block_pages<md::simd::native_isa, G>;
  const float* base = w.f32.empty() ? reinterpret_cast<const float*>(w.half.data()) : w.f32.data();
  const std::size_t page = w.bytes() / 4 / w.pages, slice = page / kv_heads;
  auto a0 = P::zero(), a1 = P::zero();
  for (std::size_t p = 0; p + PB <= w.pages; p += PB)
    for (std::size_t h = 0; h < kv_heads; ++h)
      for (std::size_t c = 0; c + 2 * P::lanes <= slice; c += 2 * P::lanes)
        for (std::size_t b = 0; b < PB; ++b) {
          const float* d = base + (p + b) * page + h * slice + c;
          a0 = P::add(a0, P::load(d));
          a1 = P::add(a1, P::load(d + P::lanes));
        }
  return P::reduce_add(P::add(a0, a1));
}

// The prototype for G query heads per KV head (the block of digest_bound.hpp for that group).
template <std::size_t G>
struct proto {
  using P = md::simd::packet<float, md::simd::native_isa>;
  static constexpr std::size_t L = P::lanes;
  static constexpr std::size_t PB = md::simd::digest_block_pages<md::simd::native_isa, G>, N = G * PB;
  static constexpr std::size_t steps = head_dim / L, head_tile = PB * 2 * head_dim, block_tile = kv_heads * head_tile;

  // The page-major values of whole blocks in tiles: tile[block][head][step][lo of PB pages | hi of PB pages][L].
  template <class Values>
  static Values tiled(const Values& page_major, std::size_t pages) {
    using Elem = typename Values::value_type;
    Values t(pages / PB * block_tile);
    std::size_t o = 0;
    for (std::size_t p = 0; p + PB <= pages; p += PB)
      for (std::size_t h = 0; h < kv_heads; ++h)
        for (std::size_t c = 0; c < head_dim; c += L)
          for (std::size_t part = 0; part < 2; ++part)
            for (std::size_t b = 0; b < PB; ++b)
              for (std::size_t l = 0; l < L; ++l)
                t[o++] = page_major[((p + b) * kv_heads + h) * 2 * head_dim +
                                    (part == 0 ? md::simd::digest_min_offset<Elem>(c + l)
                                               : md::simd::digest_max_offset<Elem>(c + l, head_dim))];
    return t;
  }

  // digest_bound.hpp's head_block over one tile, with its prefetch of the tile as many blocks on as the library's
  // (digest_prefetch_blocks_ahead) spread over the steps.
  template <class Elem, md::half_format F>
  static void bounds(const Elem* tiles, std::size_t pages, const float* q_all, float* out) {
    constexpr bool pin = md::simd::detail::digest_block_pinned<md::simd::native_isa, md::digest_kind::min_max, G, PB>;
    constexpr std::size_t ahead = md::simd::detail::digest_prefetch_blocks_ahead;
    constexpr std::size_t tile_bytes = head_tile * sizeof(Elem);
    constexpr std::size_t per_step = (tile_bytes / steps + 63) / 64 * 64;
    for (std::size_t p = 0; p + PB <= pages; p += PB)
      for (std::size_t h = 0; h < kv_heads; ++h) {
        const Elem* d = tiles + (p / PB) * block_tile + h * head_tile;
        const char* later =
            p + (ahead + 1) * PB <= pages ? reinterpret_cast<const char*>(d + ahead * block_tile) : nullptr;
        const float* q = q_all + h * G * head_dim;
        typename P::reg acc[N];
        for (auto& a : acc) a = P::zero();
        for (std::size_t c = 0; c < head_dim; c += L, d += 2 * PB * L) {
          if (later)
            for (std::size_t off = (c / L) * per_step, end = std::min(off + per_step, tile_bytes); off < end; off += 64)
              md::simd::detail::prefetch(later + off);
          typename P::reg qa[G], qb[G];
          MEMDECAY_SIMD_UNROLL
          for (std::size_t g = 0; g < G; ++g) {
            qa[g] = P::load(q + g * head_dim + c);
            qb[g] = md::simd::detail::negative_part<md::simd::native_isa>(qa[g]);
            qa[g] = md::simd::detail::positive_part<md::simd::native_isa>(qa[g]);
            if constexpr (pin) {
              md::simd::detail::in_register(qa[g]);
              md::simd::detail::in_register(qb[g]);
            }
          }
          MEMDECAY_SIMD_UNROLL
          for (std::size_t b = 0; b < PB; ++b) {
            auto lo = md::simd::detail::load_digest<md::simd::native_isa, Elem, F>(d + b * L);
            auto hi = md::simd::detail::load_digest<md::simd::native_isa, Elem, F>(d + (PB + b) * L);
            if constexpr (pin) {
              md::simd::detail::in_register(lo);
              md::simd::detail::in_register(hi);
            }
            MEMDECAY_SIMD_UNROLL
            for (std::size_t g = 0; g < G; ++g) acc[b * G + g] = P::fma(qa[g], hi, P::fma(qb[g], lo, acc[b * G + g]));
          }
        }
        alignas(64) float sums[N];
        if constexpr (requires { P::has_transpose_sum; } && N == L)
          P::store(sums, P::transpose_sum(acc));
        else
          for (std::size_t i = 0; i < N; ++i) sums[i] = P::reduce_add(acc[i]);
        for (std::size_t b = 0; b < PB; ++b)
          for (std::size_t g = 0; g < G; ++g) out[(p + b) * kv_heads * G + h * G + g] = sums[b * G + g];
      }
  }
};

void finish(benchmark::State& st, const workload& w) {
  st.SetItemsProcessed(st.iterations() * static_cast<std::int64_t>(w.pages));
  st.SetBytesProcessed(st.iterations() * static_cast<std::int64_t>(w.bytes()));
}

template <md::simd::isa A>
void bounds(benchmark::State& st, md::digest_storage storage) {
  auto& w = digests(storage, static_cast<std::size_t>(st.range(0)));
  for (auto _ : st) run_bounds<A>(w, md::simd::head_major(w.pages));
  finish(st, w);
}

void bounds_page_major(benchmark::State& st, md::digest_storage storage) {
  auto& w = digests(storage, static_cast<std::size_t>(st.range(0)));
  for (auto _ : st) run_bounds<md::simd::native_isa>(w, md::simd::page_major(query_heads));
  finish(st, w);
}

// A query of `heads` heads prepared for the kernel.
std::vector<float> prepared_query(std::size_t heads) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::vector<float> query(heads * head_dim), prepared(query.size());
  for (auto& q : query) q = normal(rng);
  md::simd::prepare_digest_query(query.data(), heads, head_dim, 0.088f, prepared.data());
  return prepared;
}

template <std::size_t G>
void tiled_prototype(benchmark::State& st, workload& w) {
  using block = proto<G>;
  const bool is_f32 = w.storage == md::digest_storage::f32;
  const auto f32 = is_f32 ? block::tiled(w.f32, w.pages) : md::page_digests::f32_values{};
  const auto half = is_f32 ? md::page_digests::half_values{} : block::tiled(w.half, w.pages);
  const std::vector<float> prepared = prepared_query(kv_heads * G);
  md::page_digests::f32_values out(kv_heads * G * w.pages);
  const auto run = [&] {
    switch (w.storage) {
      case md::digest_storage::f32:
        return block::template bounds<float, md::half_format::f16>(f32.data(), w.pages, prepared.data(), out.data());
      case md::digest_storage::f16:
        return block::template bounds<std::uint16_t, md::half_format::f16>(half.data(), w.pages, prepared.data(),
                                                                           out.data());
      case md::digest_storage::bf16:
        return block::template bounds<std::uint16_t, md::half_format::bf16>(half.data(), w.pages, prepared.data(),
                                                                            out.data());
    }
  };
  std::vector<float> expected(out.size());
  run_bounds<md::simd::native_isa>(w, kv_heads * G, prepared.data(), expected.data(),
                                   md::simd::page_major(kv_heads * G));
  run();
  if (w.pages % block::PB != 0 || !std::equal(expected.begin(), expected.end(), out.begin(), [](float a, float b) {
        return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b);
      }))
    return st.SkipWithError("the tiled prototype's bounds differ from the kernel's");
  for (auto _ : st) {
    run();
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  finish(st, w);
}
void tiled_prototype(benchmark::State& st, md::digest_storage storage) {
  auto& w = digests(storage, static_cast<std::size_t>(st.range(0)));
  switch (st.range(1)) {
    case 1: return tiled_prototype<1>(st, w);
    case 2: return tiled_prototype<2>(st, w);
    default: return tiled_prototype<4>(st, w);
  }
}

// One timed pass of bounds_group: the library's page-major bounds for `heads` query heads, kept from the optimiser.
void group_bounds(const workload& w, std::size_t heads, const float* prepared, float* out) {
  run_bounds<md::simd::native_isa>(w, heads, prepared, out, md::simd::page_major(heads));
  benchmark::DoNotOptimize(out);
  benchmark::ClobberMemory();
}

void bounds_group(benchmark::State& st, md::digest_storage storage) {
  auto& w = digests(storage, static_cast<std::size_t>(st.range(0)));
  const auto heads = kv_heads * static_cast<std::size_t>(st.range(1));
  const std::vector<float> prepared = prepared_query(heads);
  md::page_digests::f32_values out(heads * w.pages);
  for (auto _ : st) group_bounds(w, heads, prepared.data(), out.data());
  finish(st, w);
}

// bounds_group and the plain read of the same bytes in every iteration, each timed (in turns, so that neither
// always finds the other's last lines in cache): share = read time / kernel time over the run. The two see the
// same moments of the host, so the share does not move with the memory bandwidth a shared VM gets from one row to
// the next, as bounds / roofline of separate rows does.
void roofline_share(benchmark::State& st, md::digest_storage storage) {
  auto& w = digests(storage, static_cast<std::size_t>(st.range(0)));
  const auto heads = kv_heads * static_cast<std::size_t>(st.range(1));
  const std::vector<float> prepared = prepared_query(heads);
  md::page_digests::f32_values out(heads * w.pages);
  using clock = std::chrono::steady_clock;
  const auto time = [](auto&& f) {
    const auto start = clock::now();
    f();
    return std::chrono::duration<double>(clock::now() - start).count();
  };
  const auto read_once = [&] { benchmark::DoNotOptimize(read_all(w)); };
  const auto kernel_once = [&] { group_bounds(w, heads, prepared.data(), out.data()); };
  double kernel = 0, read = 0;
  bool read_first = true;
  for (auto _ : st) {
    if (read_first) {
      read += time(read_once);
      kernel += time(kernel_once);
    } else {
      kernel += time(kernel_once);
      read += time(read_once);
    }
    read_first = !read_first;
  }
  const auto n = static_cast<double>(st.iterations());
  st.counters["share"] = read / kernel;
  st.counters["kernel_ms"] = kernel / n * 1e3;
  st.counters["read_ms"] = read / n * 1e3;
}

void roofline(benchmark::State& st, md::digest_storage storage) {
  auto& w = digests(storage, static_cast<std::size_t>(st.range(0)));
  for (auto _ : st) benchmark::DoNotOptimize(read_all(w));
  finish(st, w);
}

// 12 independent FMA chains (more than latency x throughput on the CPUs these benchmarks run on), kept in
// registers; the chains converge (x -> 0.999 x + 1e-4), so no value overflows.
void fma_roofline(benchmark::State& st, md::digest_storage storage) {
  using P = md::simd::packet<float, md::simd::native_isa>;
  constexpr int chains = 12, rounds = 1000;
  typename P::reg acc[chains];
  for (int i = 0; i < chains; ++i) acc[i] = P::set1(1.0f + 0.1f * static_cast<float>(i));
  const auto x = P::set1(0.999f), y = P::set1(1e-4f);
  for (auto _ : st) {
    for (int r = 0; r < rounds; ++r) {
      MEMDECAY_SIMD_UNROLL
      for (int i = 0; i < chains; ++i) acc[i] = P::fma(acc[i], x, y);
    }
    for (auto& a : acc) benchmark::DoNotOptimize(a);
  }
  const std::int64_t fmas = st.iterations() * chains * rounds;
  const std::size_t element = storage == md::digest_storage::f32 ? 4 : 2;
  st.SetItemsProcessed(fmas);
  st.SetBytesProcessed(fmas * static_cast<std::int64_t>(P::lanes * element / (query_heads / kv_heads)));
}

void roofline_in_block_order(benchmark::State& st, md::digest_storage storage) {
  auto& w = digests(storage, static_cast<std::size_t>(st.range(0)));
  for (auto _ : st) benchmark::DoNotOptimize(read_in_block_order(w));
  finish(st, w);
}

md::thread_pool& pool(std::size_t threads) {
  static std::map<std::size_t, std::unique_ptr<md::thread_pool>> pools;
  auto& slot = pools[threads];
  if (!slot) slot = std::make_unique<md::thread_pool>(threads);
  return *slot;
}

void bounds_pool(benchmark::State& st, md::digest_storage storage) {
  auto& w = digests(storage, static_cast<std::size_t>(st.range(0)));
  auto& exec = pool(static_cast<std::size_t>(st.range(1)));
  const md::simd::digest_shape shape{kv_heads, query_heads, head_dim, md::digest_kind::min_max};
  for (auto _ : st) {
    switch (storage) {
      case md::digest_storage::f32:
        md::digest_bounds_on(exec, shape, w.f32.data(), w.pages, w.prepared.data(), w.out.data(), w.pages);
        break;
      case md::digest_storage::f16:
        md::digest_bounds_on<md::simd::native_isa, std::uint16_t, md::half_format::f16>(
            exec, shape, w.half.data(), w.pages, w.prepared.data(), w.out.data(), w.pages);
        break;
      case md::digest_storage::bf16:
        md::digest_bounds_on<md::simd::native_isa, std::uint16_t, md::half_format::bf16>(
            exec, shape, w.half.data(), w.pages, w.prepared.data(), w.out.data(), w.pages);
        break;
    }
    benchmark::DoNotOptimize(w.out.data());
    benchmark::ClobberMemory();
  }
  finish(st, w);
}

void roofline_pool(benchmark::State& st, md::digest_storage storage) {
  auto& w = digests(storage, static_cast<std::size_t>(st.range(0)));
  auto& exec = pool(static_cast<std::size_t>(st.range(1)));
  constexpr std::size_t chunk = md::simd::digest_task_pages;
  const std::size_t tasks = (w.pages + chunk - 1) / chunk;
  std::vector<float> sums(tasks);
  const std::function<void(std::size_t)> task = [&](std::size_t t) {
    sums[t] = read_pages(w, t * chunk, std::min(chunk, w.pages - t * chunk));
  };
  for (auto _ : st) {
    exec(tasks, task);
    benchmark::DoNotOptimize(sums.data());
  }
  finish(st, w);
}

// A sequence of `pages` full pages of 16 tokens with f16 min/max digests of random keys, and a random query.
std::vector<float> digested(md::sequence& seq, std::size_t pages) {
  seq.enable_digests(
      {.kv_heads = kv_heads, .head_dim = head_dim, .query_heads = query_heads, .storage = md::digest_storage::f16});
  seq.append(md::regions::tool_out, pages * 16);
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  std::vector<float> lo(kv_heads * head_dim), hi(lo.size()), query(query_heads * head_dim);
  for (std::size_t p = 0; p < pages; ++p) {
    for (std::size_t i = 0; i < lo.size(); ++i) {
      const float a = normal(rng), b = normal(rng);
      lo[i] = std::min(a, b);
      hi[i] = std::max(a, b);
    }
    seq.set_page_digest(p, lo, hi);
  }
  for (auto& q : query) q = normal(rng);
  return query;
}

template <md::executor Exec>
void observe_query_on(benchmark::State& st, Exec& exec) {
  const auto pages = static_cast<std::size_t>(st.range(0));
  md::sequence seq(md::config{.page_size = 16});
  const std::vector<float> query = digested(seq, pages);
  md::step_t step = 0;
  for (auto _ : st) {
    seq.advance_to(++step);
    benchmark::DoNotOptimize(seq.observe_query(query, md::query_signal::bound_softmax, 1.0, exec));
  }
  st.SetItemsProcessed(st.iterations() * static_cast<std::int64_t>(pages));
}
void observe_query(benchmark::State& st) {
  md::inline_executor exec;
  observe_query_on(st, exec);
}
void observe_query_pool(benchmark::State& st) { observe_query_on(st, pool(static_cast<std::size_t>(st.range(1)))); }

void select_recall(benchmark::State& st) {
  const auto pages = static_cast<std::size_t>(st.range(0));
  md::sequence seq(md::config{.page_size = 16, .budget = md::budget_config::pages(static_cast<double>(pages / 2))});
  const std::vector<float> query = digested(seq, pages);
  seq.enable_host_tier({.max_recall_pages = 8});
  seq.commit(seq.select_for_budget());
  std::size_t promoted = 0;
  for (auto _ : st) {
    const auto plan = seq.select_recall(query);
    promoted += plan.promote.size();
    benchmark::DoNotOptimize(plan.promote.data());
  }
  st.counters["host_pages"] = static_cast<double>(seq.host_pages());
  st.counters["promoted"] = static_cast<double>(promoted) / static_cast<double>(st.iterations());
  st.SetItemsProcessed(st.iterations() * static_cast<std::int64_t>(pages));
}

void sizes(benchmark::internal::Benchmark* b) { b->Arg(1024)->Arg(16384)->Arg(262144)->Unit(benchmark::kMicrosecond); }

const int registered = [] {
  for (auto storage : {md::digest_storage::f32, md::digest_storage::f16, md::digest_storage::bf16}) {
    const std::string s = md::to_string(storage);
    sizes(benchmark::RegisterBenchmark(("digest/bounds/" + s).c_str(),
                                       [storage](benchmark::State& st) { bounds<md::simd::native_isa>(st, storage); }));
    sizes(benchmark::RegisterBenchmark(("digest/bounds_page_major/" + s).c_str(),
                                       [storage](benchmark::State& st) { bounds_page_major(st, storage); }));
    benchmark::RegisterBenchmark(("digest/bounds_group/" + s).c_str(),
                                 [storage](benchmark::State& st) { bounds_group(st, storage); })
        ->ArgsProduct({{1024, 262144}, {1, 2, 8}})
        ->Unit(benchmark::kMicrosecond);
    sizes(benchmark::RegisterBenchmark(("digest/scalar/" + s).c_str(), [storage](benchmark::State& st) {
      bounds<md::simd::isa::scalar>(st, storage);
    }));
    benchmark::RegisterBenchmark(("digest/tiled_prototype/" + s).c_str(),
                                 [storage](benchmark::State& st) { tiled_prototype(st, storage); })
        ->ArgsProduct({{1024, 16384, 262144}, {1, 2, 4}})
        ->Unit(benchmark::kMicrosecond);
    sizes(benchmark::RegisterBenchmark(("digest/roofline/" + s).c_str(),
                                       [storage](benchmark::State& st) { roofline(st, storage); }));
    benchmark::RegisterBenchmark(("digest/roofline_share/" + s).c_str(),
                                 [storage](benchmark::State& st) { roofline_share(st, storage); })
        ->ArgsProduct({{1024, 262144}, {1, 2, 4, 8}})
        ->Unit(benchmark::kMicrosecond);
    sizes(benchmark::RegisterBenchmark(("digest/block_order_roofline/" + s).c_str(),
                                       [storage](benchmark::State& st) { roofline_in_block_order(st, storage); }));
    benchmark::RegisterBenchmark(("digest/fma_roofline/" + s).c_str(),
                                 [storage](benchmark::State& st) { fma_roofline(st, storage); });
    const auto pages_and_threads = [](benchmark::internal::Benchmark* b) {
      b->ArgsProduct({{16384, 262144}, {1, 2}})->Unit(benchmark::kMicrosecond);
    };
    pages_and_threads(benchmark::RegisterBenchmark(("digest/bounds_pool/" + s).c_str(),
                                                   [storage](benchmark::State& st) { bounds_pool(st, storage); }));
    pages_and_threads(benchmark::RegisterBenchmark(("digest/roofline_pool/" + s).c_str(),
                                                   [storage](benchmark::State& st) { roofline_pool(st, storage); }));
  }
  benchmark::RegisterBenchmark("digest/observe_query/f16", observe_query)
      ->Arg(1024)
      ->Arg(16384)
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("digest/observe_query_pool/f16", observe_query_pool)
      ->ArgsProduct({{1024, 16384}, {1, 2}})
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("digest/select_recall/f16", select_recall)
      ->Arg(1024)
      ->Arg(16384)
      ->Unit(benchmark::kMicrosecond);
  return 0;
}();

}  // namespace
