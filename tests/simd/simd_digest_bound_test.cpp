// The digest-bound kernels (simd/digest_bound.hpp) against digest_bound_reference within the stated tolerance,
// for every isa this build can emit, fp32 / fp16 / bf16 digests, both kinds, grouped-query attention and head
// sizes that leave tails; the widening loads (simd/half.hpp) bit for bit against the scalar conversions. CMake
// builds this file again with -mavx2 -mfma -mf16c (and the AVX-512 flags) where the machine runs them.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <type_traits>
#include <vector>

#include <memdecay/simd/digest_bound.hpp>
#include <memdecay/simd/half.hpp>

namespace {

using namespace memdecay;
using simd::isa;

template <isa A>
void check_widening(half_format f) {
  using P = simd::packet<float, A>;
  std::mt19937 rng(7);
  std::vector<std::uint16_t> bits(P::lanes);
  for (int trial = 0; trial < 2000; ++trial) {
    for (auto& b : bits) b = static_cast<std::uint16_t>(rng());
    if (trial == 0)
      for (std::size_t i = 0; i < bits.size(); ++i) bits[i] = static_cast<std::uint16_t>(i);  // zero, subnormals
    alignas(64) float got[P::lanes];
    if (f == half_format::f16)
      P::store(got, simd::load_widened<A, half_format::f16>(bits.data()));
    else
      P::store(got, simd::load_widened<A, half_format::bf16>(bits.data()));
    for (std::size_t i = 0; i < P::lanes; ++i) {
      const float want = simd::half_to_float(bits[i], f);
      if (std::isnan(want))
        EXPECT_TRUE(std::isnan(got[i])) << bits[i];
      else
        EXPECT_EQ(std::bit_cast<std::uint32_t>(got[i]), std::bit_cast<std::uint32_t>(want)) << bits[i];
    }
  }
}

struct digest_case {
  std::size_t kv_heads, query_heads, dim, pages;
  simd::digest_kind kind;
};

template <isa A, class Elem, half_format F>
void check_bounds(const digest_case& c, float magnitude, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, magnitude);
  const std::size_t V = simd::vectors_per_head(c.kind);
  const std::size_t per_page = c.kv_heads * V * c.dim;
  std::vector<Elem> digests(c.pages * per_page);
  std::vector<float> widened(digests.size());
  for (std::size_t p = 0; p < c.pages; ++p)
    for (std::size_t h = 0; h < c.kv_heads; ++h)
      for (std::size_t ch = 0; ch < c.dim; ++ch) {
        float lo = normal(rng), hi = normal(rng);
        if (lo > hi) std::swap(lo, hi);
        // The kernels read a min/max head in the digest layout; the reference reads its minima then maxima.
        const std::size_t head = p * per_page + h * V * c.dim;
        const float values[2] = {lo, hi};
        for (std::size_t v = 0; v < V; ++v) {
          const std::size_t stored = head + (V == 1   ? ch
                                             : v == 0 ? simd::digest_min_offset<Elem>(ch)
                                                      : simd::digest_max_offset<Elem>(ch, c.dim));
          if constexpr (std::is_same_v<Elem, float>) {
            digests[stored] = values[v];
            widened[head + v * c.dim + ch] = values[v];
          } else {
            const auto r = v == 0 ? half_rounding::toward_minus : half_rounding::toward_plus;
            digests[stored] = simd::float_to_half(values[v], F, r);
            widened[head + v * c.dim + ch] = simd::half_to_float(digests[stored], F);
          }
        }
      }
  std::vector<float> query(c.query_heads * c.dim);
  for (auto& q : query) q = normal(rng);
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.dim));
  std::vector<float> prepared(query.size());
  simd::prepare_digest_query(query.data(), c.query_heads, c.dim, static_cast<float>(scale), prepared.data());
  std::vector<float> out(c.query_heads * c.pages, -1.0f);
  const simd::digest_shape shape{c.kv_heads, c.query_heads, c.dim, c.kind};
  simd::digest_bounds<A, Elem, F>(shape, digests.data(), c.pages, prepared.data(), out.data(), c.pages);
  const std::size_t group = c.query_heads / c.kv_heads;
  for (std::size_t j = 0; j < c.query_heads; ++j)
    for (std::size_t p = 0; p < c.pages; ++p) {
      const float* d = widened.data() + p * per_page + (j / group) * V * c.dim;
      const float* q = query.data() + j * c.dim;
      const double want = simd::digest_bound_reference(q, d, d + (V - 1) * c.dim, c.dim, c.kind, scale);
      const double tol = simd::digest_bound_tolerance(q, d, d + (V - 1) * c.dim, c.dim, c.kind, scale);
      ASSERT_NEAR(out[j * c.pages + p], want, tol)
          << simd::to_string(A) << " head " << j << " page " << p << " dim " << c.dim;
    }
  // Page-major (one stream of results) and a padded head-major row: the same bounds, bit for bit, only placed
  // elsewhere; nothing written outside the places the layout names.
  std::vector<float> by_page(c.query_heads * c.pages + 1, -1.0f);
  simd::digest_bounds<A, Elem, F>(shape, digests.data(), c.pages, prepared.data(), by_page.data(),
                                  simd::page_major(c.query_heads));
  const std::size_t padded = c.pages + 3;
  std::vector<float> rows(c.query_heads * padded, -1.0f);
  simd::digest_bounds<A, Elem, F>(shape, digests.data(), c.pages, prepared.data(), rows.data(),
                                  simd::bounds_layout{padded, 1});
  for (std::size_t j = 0; j < c.query_heads; ++j)
    for (std::size_t p = 0; p < c.pages; ++p) {
      const auto want = std::bit_cast<std::uint32_t>(out[j * c.pages + p]);
      ASSERT_EQ(std::bit_cast<std::uint32_t>(by_page[p * c.query_heads + j]), want) << simd::to_string(A);
      ASSERT_EQ(std::bit_cast<std::uint32_t>(rows[j * padded + p]), want) << simd::to_string(A);
      for (std::size_t pad = c.pages; pad < padded; ++pad) ASSERT_EQ(rows[j * padded + pad], -1.0f);
    }
  ASSERT_EQ(by_page.back(), -1.0f);
}

template <isa A>
void check_all_bounds() {
  const digest_case cases[] = {
      {1, 1, 1, 3, simd::digest_kind::min_max},
      {2, 8, 128, 37, simd::digest_kind::min_max},
      {4, 4, 80, 11, simd::digest_kind::min_max},
      {8, 32, 64, 5, simd::digest_kind::min_max},
      {3, 6, 17, 9, simd::digest_kind::mean_key},
      {2, 4, 128, 13, simd::digest_kind::mean_key},
      {1, 3, 250, 4, simd::digest_kind::min_max},
      // Register blocks (every group the kernels block, with pages left over for the one-by-one tail):
      {4, 4, 64, 40, simd::digest_kind::min_max},
      {2, 4, 32, 33, simd::digest_kind::min_max},
      {1, 8, 64, 21, simd::digest_kind::min_max},
      {2, 8, 128, 19, simd::digest_kind::mean_key},
      {3, 3, 48, 35, simd::digest_kind::mean_key},
      {1, 16, 16, 7, simd::digest_kind::min_max},
      // The head dims the kernels take as compile-time constants (64 and 128 above, 256 here):
      {2, 4, 256, 11, simd::digest_kind::min_max},
      {1, 2, 256, 9, simd::digest_kind::mean_key},
  };
  std::uint32_t seed = 1;
  for (const auto& c : cases)
    for (float magnitude : {1.0f, 30.0f}) {
      check_bounds<A, float, half_format::f16>(c, magnitude, seed++);
      check_bounds<A, std::uint16_t, half_format::f16>(c, magnitude, seed++);
      check_bounds<A, std::uint16_t, half_format::bf16>(c, magnitude, seed++);
    }
}

// The register blocks with the head dim as a compile-time constant (blocks_for_dim's 64, 128, 256) give the same
// bits as the run-time loop over the same dim, for every group the kernels block and both layouts.
template <isa A, class Elem, half_format F, simd::digest_kind Kind, std::size_t G, std::size_t Dim>
void check_fixed_dim_is_the_runtime_loop() {
  constexpr std::size_t kv_heads = 2, pages = 37, V = simd::vectors_per_head(Kind);
  const simd::digest_shape shape{kv_heads, kv_heads * G, Dim, Kind};
  std::mt19937 rng(static_cast<std::uint32_t>(Dim * 10 + G));
  std::normal_distribution<float> normal;
  std::vector<Elem> digests(pages * kv_heads * V * Dim);
  for (auto& d : digests) {
    if constexpr (std::is_same_v<Elem, float>)
      d = normal(rng);
    else
      d = simd::float_to_half(normal(rng), F);
  }
  std::vector<float> query(shape.query_heads * Dim), prepared(query.size());
  for (auto& q : query) q = normal(rng);
  simd::prepare_digest_query(query.data(), shape.query_heads, Dim, 0.1f, prepared.data());
  for (const auto layout : {simd::head_major(pages), simd::page_major(shape.query_heads)}) {
    std::vector<float> fixed(shape.query_heads * pages, -1.0f), runtime(fixed.size(), -2.0f);
    simd::detail::pages_in_blocks<A, Elem, F, Kind, G, Dim>(shape, digests.data(), pages, prepared.data(),
                                                            fixed.data(), layout);
    simd::detail::pages_in_blocks<A, Elem, F, Kind, G, 0>(shape, digests.data(), pages, prepared.data(),
                                                          runtime.data(), layout);
    for (std::size_t i = 0; i < fixed.size(); ++i)
      ASSERT_EQ(std::bit_cast<std::uint32_t>(fixed[i]), std::bit_cast<std::uint32_t>(runtime[i]))
          << "dim " << Dim << " group " << G << " entry " << i;
  }
}

template <isa A, std::size_t G>
void check_fixed_dims_for_group() {
  if constexpr (simd::packet<float, A>::lanes > 1) {
    check_fixed_dim_is_the_runtime_loop<A, float, half_format::f16, simd::digest_kind::min_max, G, 64>();
    check_fixed_dim_is_the_runtime_loop<A, float, half_format::f16, simd::digest_kind::min_max, G, 128>();
    check_fixed_dim_is_the_runtime_loop<A, std::uint16_t, half_format::f16, simd::digest_kind::min_max, G, 256>();
    check_fixed_dim_is_the_runtime_loop<A, std::uint16_t, half_format::bf16, simd::digest_kind::mean_key, G, 128>();
  }
}

TEST(DigestBoundKernels, CompileTimeHeadDimsGiveTheRunTimeLoopsBits) {
  check_fixed_dims_for_group<simd::native_isa, 1>();
  check_fixed_dims_for_group<simd::native_isa, 2>();
  check_fixed_dims_for_group<simd::native_isa, 4>();
  if constexpr (simd::digest_block_accumulators<simd::native_isa> >= 8)
    check_fixed_dims_for_group<simd::native_isa, 8>();
}

TEST(DigestBoundKernels, ScalarMatchesTheReference) { check_all_bounds<isa::scalar>(); }
TEST(DigestBoundKernels, NativeIsaMatchesTheReference) { check_all_bounds<simd::native_isa>(); }
#if defined(MEMDECAY_SIMD_ENABLE_SSE)
TEST(DigestBoundKernels, SseMatchesTheReference) { check_all_bounds<isa::sse>(); }
#endif
#if defined(MEMDECAY_SIMD_ENABLE_AVX2)
TEST(DigestBoundKernels, Avx2MatchesTheReference) { check_all_bounds<isa::avx2>(); }
#endif
#if defined(MEMDECAY_SIMD_ENABLE_AVX512)
TEST(DigestBoundKernels, Avx512MatchesTheReference) { check_all_bounds<isa::avx512>(); }
#endif

TEST(DigestBoundKernels, WideningLoadsAreTheScalarConversionBitForBit) {
  for (half_format f : {half_format::f16, half_format::bf16}) {
    check_widening<isa::scalar>(f);
    check_widening<simd::native_isa>(f);
  }
}

template <class Elem>
void check_layout(std::size_t dim) {
  // Every channel's minimum and maximum get a place of their own among the head's 2 x dim values, a run's minima
  // side by side and its maxima a run's width on; split_min_max undoes interleave_min_max.
  constexpr std::size_t run = simd::digest_run<Elem>;
  std::vector<int> seen(2 * dim, 0);
  for (std::size_t c = 0; c < dim; ++c) {
    const std::size_t lo = simd::digest_min_offset<Elem>(c), hi = simd::digest_max_offset<Elem>(c, dim);
    ASSERT_LT(hi, 2 * dim) << "dim " << dim << " channel " << c;
    ++seen[lo];
    ++seen[hi];
    ASSERT_EQ(lo / (2 * run), c / run) << "channel " << c << "'s minimum leaves its run";
    if (c % run != 0) {
      ASSERT_EQ(lo, simd::digest_min_offset<Elem>(c - 1) + 1);
      ASSERT_EQ(hi, simd::digest_max_offset<Elem>(c - 1, dim) + 1);
    }
    ASSERT_EQ(hi - lo, std::min(run, dim - c / run * run)) << "dim " << dim << " channel " << c;
  }
  for (std::size_t i = 0; i < 2 * dim; ++i) ASSERT_EQ(seen[i], 1) << "dim " << dim << " offset " << i;
  std::vector<Elem> lo(dim), hi(dim), stored(2 * dim), lo2(dim), hi2(dim);
  for (std::size_t c = 0; c < dim; ++c) {
    lo[c] = static_cast<Elem>(c + 1);
    hi[c] = static_cast<Elem>(1000 + c);
  }
  simd::interleave_min_max(lo.data(), hi.data(), dim, stored.data());
  simd::split_min_max(stored.data(), dim, lo2.data(), hi2.data());
  EXPECT_EQ(lo2, lo);
  EXPECT_EQ(hi2, hi);
  EXPECT_EQ(stored[0], lo[0]);
  EXPECT_EQ(stored[std::min(run, dim)], hi[0]);
}

TEST(DigestBoundKernels, TheDigestLayoutPutsEachRunsMinimaThenItsMaximaOnOneLine) {
  static_assert(simd::digest_run<float> * sizeof(float) == 64 && simd::digest_run<std::uint16_t> * 2 == 64);
  for (std::size_t dim : {1, 15, 16, 17, 32, 48, 64, 80, 100, 128, 250, 256}) {
    check_layout<float>(dim);
    check_layout<std::uint16_t>(dim);
  }
  // fp32, head dim 128: [lo 0-15 | hi 0-15 | lo 16-31 | ...]; 16-bit, head dim 48: [lo 0-31 | hi 0-31 | lo 32-47 |
  // hi 32-47].
  EXPECT_EQ(simd::digest_max_offset<float>(0, 128), 16u);
  EXPECT_EQ(simd::digest_min_offset<float>(16), 32u);
  EXPECT_EQ(simd::digest_max_offset<std::uint16_t>(31, 48), 63u);
  EXPECT_EQ(simd::digest_min_offset<std::uint16_t>(32), 64u);
  EXPECT_EQ(simd::digest_max_offset<std::uint16_t>(32, 48), 80u);
}

TEST(DigestBoundKernels, TheMinMaxBoundIsAnUpperBoundOfEveryKeysLogit) {
  // Keys drawn per page, digested, narrowed to f16: every token's exact logit is below its page's bound.
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  const std::size_t D = 64, T = 16, pages = 20;
  std::vector<float> keys(pages * T * D), query(D);
  for (auto& k : keys) k = normal(rng);
  for (auto& q : query) q = normal(rng);
  std::vector<std::uint16_t> digests(pages * 2 * D), lo(D), hi(D);
  for (std::size_t p = 0; p < pages; ++p) {
    for (std::size_t c = 0; c < D; ++c) {
      float min = keys[p * T * D + c], max = min;
      for (std::size_t t = 1; t < T; ++t) {
        min = std::min(min, keys[(p * T + t) * D + c]);
        max = std::max(max, keys[(p * T + t) * D + c]);
      }
      lo[c] = simd::float_to_half(min, half_format::f16, half_rounding::toward_minus);
      hi[c] = simd::float_to_half(max, half_format::f16, half_rounding::toward_plus);
    }
    simd::interleave_min_max(lo.data(), hi.data(), D, digests.data() + p * 2 * D);
  }
  std::vector<float> prepared(D), out(pages);
  simd::prepare_digest_query(query.data(), 1, D, 1.0f, prepared.data());
  simd::digest_bounds<simd::native_isa, std::uint16_t, half_format::f16>(
      {1, 1, D, simd::digest_kind::min_max}, digests.data(), pages, prepared.data(), out.data(), pages);
  for (std::size_t p = 0; p < pages; ++p)
    for (std::size_t t = 0; t < T; ++t) {
      double logit = 0;
      for (std::size_t c = 0; c < D; ++c) logit += double{query[c]} * keys[(p * T + t) * D + c];
      EXPECT_LE(logit, out[p] + 1e-4 * std::abs(out[p])) << "page " << p << " token " << t;
    }
}

}  // namespace
