// SPDX-License-Identifier: Apache-2.0
// memdecay: victim selection for large page counts (sampled threshold + SIMD compress + nth_element).
//
// select_lowest_pages (eviction.hpp) builds a (score, page) pair for every evictable page and runs nth_element
// over all of them: O(P) with a large constant and P pairs of memory. When k is small next to P almost all of
// that work is wasted. This selector:
//   1. samples S evictable scores at deterministic, hashed positions (S = min(1024, P/8); no RNG state, so every rank
//      computes the same thing) and takes the sample's order statistic at rank k*S/P plus a 3-sigma margin as a
//      threshold t (t = +inf when that rank is past the sample);
//   2. compresses the evictable pages with score <= t into a survivor list in one vectorised sweep (AVX-512:
//      mask compare of scores and statuses, in-register compress of page indices; elsewhere a branch-free loop);
//   3. runs nth_element on the survivors' (score, page) pairs, keeps k, sorts the pages.
// Correctness does not depend on the sample: if at least k evictable pages score <= t, the k smallest pages in
// the order (score, page) all score <= t (the k-th smallest does, and every page before it in that order scores
// no more), so they are all survivors and nth_element finds exactly them. When fewer than k survive, the
// selector reruns with t = +inf (all evictable pages), which is the reference algorithm. The result is therefore
// always identical to select_lowest_pages, ties included (tests/simd/simd_select_test.cpp checks it on adversarial
// inputs: all-equal scores, heavy ties, few evictable pages).
// Precondition: scores are not NaN (page scores of validated state never are).
#ifndef MEMDECAY_SIMD_SELECT_HPP
#define MEMDECAY_SIMD_SELECT_HPP

#include <algorithm>
#include <bit>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "memdecay/core/eviction.hpp"
#include "memdecay/simd/arch.hpp"

MEMDECAY_SIMD_BEGIN
namespace memdecay::simd {

/// Tuning of select_lowest_pages_fast. The defaults were measured on the benchmark machine (docs/benchmarks.md).
struct select_tuning {
  std::size_t min_pages = 1024;    ///< below this the reference algorithm runs (it is as fast there)
  std::size_t sample_size = 1024;  ///< scores sampled to place the threshold (at most pages / 16 are)
};

namespace detail {

/// Writes the indices of the pages that are evictable and score <= t to `idx` (which has room for
/// scores.size() + 16 entries) and returns how many. The native isa's fastest form.
template <std::floating_point Float>
std::size_t compress_survivors(std::span<const Float> scores, std::span<const page_status> status, Float t,
                               std::uint32_t* idx) noexcept {
  static_assert(static_cast<std::uint8_t>(page_status::evictable) == 0);
  const std::size_t n = scores.size();
  const Float* s = scores.data();
  const auto* st = reinterpret_cast<const std::uint8_t*>(status.data());
  std::size_t count = 0, i = 0;
#if defined(MEMDECAY_SIMD_ENABLE_AVX512)
  if constexpr (std::same_as<Float, float>) {
    const __m512 tv = _mm512_set1_ps(t);
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (; i + 16 <= n; i += 16) {
      const __mmask16 ok = static_cast<__mmask16>(
          _mm512_cmp_ps_mask(_mm512_loadu_ps(s + i), tv, _CMP_LE_OQ) &
          _mm_cmpeq_epi8_mask(_mm_loadu_si128(reinterpret_cast<const __m128i*>(st + i)), _mm_setzero_si128()));
      if (ok) {  // rare when k << P: the sweep is one compare per 16 pages
        const __m512i ids = _mm512_add_epi32(iota, _mm512_set1_epi32(static_cast<int>(i)));
        _mm512_storeu_si512(idx + count, _mm512_maskz_compress_epi32(ok, ids));
        count += static_cast<std::size_t>(std::popcount(static_cast<unsigned>(ok)));
      }
    }
  } else {
    const __m512d tv = _mm512_set1_pd(t);
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (; i + 8 <= n; i += 8) {
      const __mmask8 ok = static_cast<__mmask8>(
          _mm512_cmp_pd_mask(_mm512_loadu_pd(s + i), tv, _CMP_LE_OQ) &
          _mm_cmpeq_epi8_mask(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(st + i)), _mm_setzero_si128()));
      if (ok) {
        const __m256i ids = _mm256_add_epi32(iota, _mm256_set1_epi32(static_cast<int>(i)));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(idx + count), _mm256_maskz_compress_epi32(ok, ids));
        count += static_cast<std::size_t>(std::popcount(static_cast<unsigned>(ok)));
      }
    }
  }
#endif
  for (; i < n; ++i) {  // branch-free: always write, advance only on a survivor
    idx[count] = static_cast<std::uint32_t>(i);
    count += static_cast<std::size_t>((st[i] == 0) & (s[i] <= t));
  }
  return count;
}

}  // namespace detail

/// The same victims as select_lowest_pages(scores, status, k) (the k lowest evictable pages in the order
/// (score, page), ascending page order), faster when k is small next to the page count.
template <std::floating_point Float>
[[nodiscard]] std::vector<std::size_t> select_lowest_pages_fast(std::span<const Float> scores,
                                                                std::span<const page_status> status, std::size_t k,
                                                                const select_tuning& tuning = {}) {
  const std::size_t n = scores.size();
  if (k == 0 || n == 0) return {};
  if (n < tuning.min_pages || n > std::numeric_limits<std::uint32_t>::max() - 64)
    return select_lowest_pages<Float>(scores, status, k);

  // 1. The threshold from a deterministic sample of evictable scores.
  Float t = std::numeric_limits<Float>::infinity();
  // At most pages / 16: with pages / 8, sampling was a quarter of a select(32) of 4,096 pages and the smaller
  // sample's extra survivors cost less than that (select(32) at 64K tokens: 1.44 -> 1.03 us).
  const std::size_t samples = std::clamp<std::size_t>(std::min(tuning.sample_size, n / 16), 1, n);
  const double expected_rank = static_cast<double>(k) * static_cast<double>(samples) / static_cast<double>(n);
  const auto rank = static_cast<std::size_t>(std::ceil(expected_rank + 3.0 * std::sqrt(expected_rank) + 2.0));
  if (rank < samples) {
    std::vector<Float> sample(samples);
    std::size_t taken = 0;
    const std::size_t stride = n / samples;
    for (std::size_t j = 0; j < samples; ++j) {
      // A draw in [0, stride) from a Weyl sequence, by multiply-shift: a splitmix64 and a 64-bit division per
      // sample were most of a select(32) at 64K tokens. stride < 2^32 (n is), so the product fits. The write is
      // unconditional and the count moves only for an evictable page (no branch to mispredict).
      const std::uint64_t draw = (static_cast<std::uint64_t>(j + 1) * 0x9E3779B97F4A7C15ULL) >> 32;
      const std::size_t p = j * stride + static_cast<std::size_t>((draw * stride) >> 32);
      sample[taken] = scores[p];
      taken += status[p] == page_status::evictable ? 1 : 0;
    }
    if (rank < taken) {
      std::nth_element(sample.begin(), sample.begin() + static_cast<std::ptrdiff_t>(rank),
                       sample.begin() + static_cast<std::ptrdiff_t>(taken));
      t = sample[rank];
    }
  }

  // 2. Compress the survivors; 3. select among them. Rerun with t = +inf if the threshold was too tight.
  const std::unique_ptr<std::uint32_t[]> idx(new std::uint32_t[n + 16]);  // uninitialised: written before read
  std::size_t count = detail::compress_survivors<Float>(scores, status, t, idx.get());
  if (count < k && t != std::numeric_limits<Float>::infinity())
    count = detail::compress_survivors<Float>(scores, status, std::numeric_limits<Float>::infinity(), idx.get());
  std::vector<std::pair<Float, std::uint32_t>> candidates(count);
  for (std::size_t j = 0; j < count; ++j) candidates[j] = {scores[idx[j]], idx[j]};
  if (k < candidates.size()) {
    // (score, page), lexicographic: std::pair's operator< goes through a float <=> (partial_ordering), which
    // made this nth_element a sixth of a select(32) at 64K tokens.
    auto lower = [](const std::pair<Float, std::uint32_t>& a, const std::pair<Float, std::uint32_t>& b) {
      return a.first < b.first || (!(b.first < a.first) && a.second < b.second);
    };
    std::nth_element(candidates.begin(), candidates.begin() + static_cast<std::ptrdiff_t>(k), candidates.end(),
                     lower);
    candidates.resize(k);
  }
  std::vector<std::size_t> pages(candidates.size());
  for (std::size_t j = 0; j < candidates.size(); ++j) pages[j] = candidates[j].second;
  std::sort(pages.begin(), pages.end());
  return pages;
}

}  // namespace memdecay::simd
MEMDECAY_SIMD_END

#endif  // MEMDECAY_SIMD_SELECT_HPP
