// SPDX-License-Identifier: Apache-2.0
// memdecay: the candidates of a recall decision, in one sweep over the page bounds.
//
// A recall plan (tiers/host_tier.hpp) promotes at most k host pages and displaces at most k device pages, so only the
// k host pages with the highest bounds and the k device pages with the lowest matter. The reference
// (select_recall_candidates_reference) writes a (bound, page) pair for every candidate and selects with
// nth_element: two arrays as long as the sequence, most of a fused scoring pass at 128K tokens. The sweep
// (select_recall_candidates) reads each page's bound and its two flag bytes once, W pages per compare, and offers a
// page to a side only when it could still be among that side's k: its bound beats the side's current k-th, a
// threshold that only tightens. After the first pages almost nothing is offered; the offers go to a small buffer
// that nth_element cuts back to k when it fills. The page rules that need more than the flags (sink, recent,
// partial, caller-protected, recently recalled, digests) are asked of the offered pages only, through the caller's
// predicates, so they must be pure.
//
// The result is the reference's, ties included: pages arrive in ascending order, so a later page that ties the k-th
// bound ranks after it (ties go to the lower page) and is rightly not offered. A NaN bound is nobody's candidate
// (every compare with it is false) and is reported, so a caller that must reject NaN needs no second pass.
#ifndef MEMDECAY_SIMD_RECALL_SELECT_HPP
#define MEMDECAY_SIMD_RECALL_SELECT_HPP

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "memdecay/simd/arch.hpp"

MEMDECAY_SIMD_BEGIN
namespace memdecay::simd {

/// A page and its bound.
using bounded_page = std::pair<float, std::size_t>;

/// The two sides of a recall decision.
struct recall_candidates {
  std::vector<bounded_page> host;    ///< the best host pages, highest bound first, ties to the lower page
  std::vector<bounded_page> device;  ///< the weakest device pages, lowest bound first, ties to the lower page
  bool saw_nan = false;              ///< some bound (of any page) is NaN
};

/// The reference: a pair for every candidate, then nth_element and a sort. A host candidate is a page with
/// on_host[p] != 0, a bound that is not NaN and host_ok(p); a device candidate has on_host[p] == 0, pinned[p] == 0,
/// a bound that is not NaN and device_ok(p). At most k of each.
template <class HostOk, class DeviceOk>
[[nodiscard]] recall_candidates select_recall_candidates_reference(std::span<const float> bounds,
                                                                   std::span<const std::uint8_t> on_host,
                                                                   std::span<const std::uint8_t> pinned,
                                                                   std::size_t k, HostOk&& host_ok,
                                                                   DeviceOk&& device_ok) {
  recall_candidates out;
  for (std::size_t p = 0; p < bounds.size(); ++p) {
    if (std::isnan(bounds[p])) {
      out.saw_nan = true;
      continue;
    }
    if (on_host[p] != 0) {
      if (host_ok(p)) out.host.emplace_back(bounds[p], p);
    } else if (pinned[p] == 0 && device_ok(p)) {
      out.device.emplace_back(bounds[p], p);
    }
  }
  const auto keep_first = [k](std::vector<bounded_page>& v, auto before) {
    if (k < v.size()) {
      std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end(), before);
      v.resize(k);
    }
    std::sort(v.begin(), v.end(), before);
  };
  keep_first(out.host, [](const bounded_page& a, const bounded_page& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  });
  keep_first(out.device, [](const bounded_page& a, const bounded_page& b) {
    return a.first < b.first || (a.first == b.first && a.second < b.second);
  });
  return out;
}

namespace detail {

/// The first k pages of a stream in ascending page order, in the order "highest bound first" (Highest) or "lowest
/// bound first", ties to the lower page. limit() is the bound a page must reach (>= for Highest, <= otherwise) to
/// be offered: anything until k pages are held, then strictly better than the k-th.
template <bool Highest>
class first_k_pages {
 public:
  explicit first_k_pages(std::size_t k, std::size_t pages)
      : k_(std::min(k, pages)), capacity_(k_ + std::max<std::size_t>(k_, 32)) {
    kept_.reserve(std::min(capacity_, pages));
  }
  /// Offer only bounds within the limit (a NaN limit admits nothing).
  [[nodiscard]] float limit() const noexcept { return limit_; }
  void offer(float bound, std::size_t page) {
    kept_.emplace_back(bound, page);
    if (kept_.size() >= capacity_) cut();
  }
  [[nodiscard]] std::vector<bounded_page> take() && {
    if (kept_.size() > k_) cut();
    std::sort(kept_.begin(), kept_.end(), order{});
    return std::move(kept_);
  }

 private:
  struct order {  // a function object, so that nth_element and sort inline it
    bool operator()(const bounded_page& a, const bounded_page& b) const noexcept {
      if constexpr (Highest)
        return a.first > b.first || (a.first == b.first && a.second < b.second);
      else
        return a.first < b.first || (a.first == b.first && a.second < b.second);
    }
  };
  // Keeps the k first and tightens the limit to "strictly better than the k-th": a later page with the k-th's bound
  // has a higher index, so it ranks after the k-th. For floats, x > t is x >= nextafter(t, +inf); nothing is
  // strictly better than +inf (highest) or -inf (lowest), and a NaN limit admits nothing.
  void cut() {
    if (k_ == 0) {
      kept_.clear();
      limit_ = std::numeric_limits<float>::quiet_NaN();
      return;
    }
    std::nth_element(kept_.begin(), kept_.begin() + static_cast<std::ptrdiff_t>(k_ - 1), kept_.end(), order{});
    const float kth = kept_[k_ - 1].first;
    kept_.resize(k_);
    constexpr float end = Highest ? std::numeric_limits<float>::infinity() : -std::numeric_limits<float>::infinity();
    limit_ = kth == end ? std::numeric_limits<float>::quiet_NaN() : std::nextafter(kth, end);
  }

  std::size_t k_, capacity_;
  std::vector<bounded_page> kept_;
  float limit_ = Highest ? -std::numeric_limits<float>::infinity() : std::numeric_limits<float>::infinity();
};

// The candidate bits of W pages from `i`: host pages whose bound is >= host_limit, device pages (not on the host,
// not pinned) whose bound is <= device_limit; NaN bounds set `nan`.
struct block_bits {
  std::uint32_t host, device, nan;
};

template <isa A>
MEMDECAY_SIMD_INLINE block_bits candidate_bits(const float* b, const std::uint8_t* on_host, const std::uint8_t* pinned,
                                               float host_limit, float device_limit) noexcept;

template <isa A>
inline constexpr std::size_t block_pages = 1;

template <>
MEMDECAY_SIMD_INLINE block_bits candidate_bits<isa::scalar>(const float* b, const std::uint8_t* on_host,
                                                            const std::uint8_t* pinned, float host_limit,
                                                            float device_limit) noexcept {
  const bool host = *on_host != 0;
  return {static_cast<std::uint32_t>(host && *b >= host_limit),
          static_cast<std::uint32_t>(!host && *pinned == 0 && *b <= device_limit), static_cast<std::uint32_t>(*b != *b)};
}

#if defined(MEMDECAY_SIMD_ENABLE_SSE)
template <>
inline constexpr std::size_t block_pages<isa::sse> = 16;
template <>
MEMDECAY_SIMD_INLINE block_bits candidate_bits<isa::sse>(const float* b, const std::uint8_t* on_host,
                                                         const std::uint8_t* pinned, float host_limit,
                                                         float device_limit) noexcept {
  const __m128i zero = _mm_setzero_si128();
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(on_host));
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(pinned));
  const auto host = static_cast<std::uint32_t>(~_mm_movemask_epi8(_mm_cmpeq_epi8(h, zero)) & 0xffff);
  const auto device = static_cast<std::uint32_t>(_mm_movemask_epi8(_mm_cmpeq_epi8(_mm_or_si128(h, q), zero)));
  const __m128 hl = _mm_set1_ps(host_limit), dl = _mm_set1_ps(device_limit);
  std::uint32_t ge = 0, le = 0, nan = 0;
  for (int j = 0; j < 4; ++j) {
    const __m128 v = _mm_loadu_ps(b + 4 * j);
    ge |= static_cast<std::uint32_t>(_mm_movemask_ps(_mm_cmpge_ps(v, hl))) << (4 * j);
    le |= static_cast<std::uint32_t>(_mm_movemask_ps(_mm_cmple_ps(v, dl))) << (4 * j);
    nan |= static_cast<std::uint32_t>(_mm_movemask_ps(_mm_cmpunord_ps(v, v))) << (4 * j);
  }
  return {host & ge, device & le, nan};
}
#endif

#if defined(MEMDECAY_SIMD_ENABLE_AVX2)
template <>
inline constexpr std::size_t block_pages<isa::avx2> = 32;
template <>
MEMDECAY_SIMD_INLINE block_bits candidate_bits<isa::avx2>(const float* b, const std::uint8_t* on_host,
                                                          const std::uint8_t* pinned, float host_limit,
                                                          float device_limit) noexcept {
  const __m256i zero = _mm256_setzero_si256();
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(on_host));
  const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pinned));
  const auto host = ~static_cast<std::uint32_t>(_mm256_movemask_epi8(_mm256_cmpeq_epi8(h, zero)));
  const auto device = static_cast<std::uint32_t>(_mm256_movemask_epi8(_mm256_cmpeq_epi8(_mm256_or_si256(h, q), zero)));
  const __m256 hl = _mm256_set1_ps(host_limit), dl = _mm256_set1_ps(device_limit);
  std::uint32_t ge = 0, le = 0, nan = 0;
  for (int j = 0; j < 4; ++j) {
    const __m256 v = _mm256_loadu_ps(b + 8 * j);
    ge |= static_cast<std::uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(v, hl, _CMP_GE_OQ))) << (8 * j);
    le |= static_cast<std::uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(v, dl, _CMP_LE_OQ))) << (8 * j);
    nan |= static_cast<std::uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q))) << (8 * j);
  }
  return {host & ge, device & le, nan};
}
#endif

#if defined(MEMDECAY_SIMD_ENABLE_AVX512)
template <>
inline constexpr std::size_t block_pages<isa::avx512> = 32;
template <>
MEMDECAY_SIMD_INLINE block_bits candidate_bits<isa::avx512>(const float* b, const std::uint8_t* on_host,
                                                            const std::uint8_t* pinned, float host_limit,
                                                            float device_limit) noexcept {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(on_host));
  const __m256i hq = _mm256_or_si256(h, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pinned)));
  const __mmask32 host = _mm256_test_epi8_mask(h, h), device = _mm256_testn_epi8_mask(hq, hq);
  const __m512 v0 = _mm512_loadu_ps(b), v1 = _mm512_loadu_ps(b + 16);
  const __m512 hl = _mm512_set1_ps(host_limit), dl = _mm512_set1_ps(device_limit);
  const auto lo = [](__mmask32 m) { return static_cast<__mmask16>(m); };
  const auto hi = [](__mmask32 m) { return static_cast<__mmask16>(m >> 16); };
  const auto join = [](__mmask16 a, __mmask16 c) {
    return static_cast<std::uint32_t>(a) | (static_cast<std::uint32_t>(c) << 16);
  };
  return {join(_mm512_mask_cmp_ps_mask(lo(host), v0, hl, _CMP_GE_OQ), _mm512_mask_cmp_ps_mask(hi(host), v1, hl, _CMP_GE_OQ)),
          join(_mm512_mask_cmp_ps_mask(lo(device), v0, dl, _CMP_LE_OQ),
               _mm512_mask_cmp_ps_mask(hi(device), v1, dl, _CMP_LE_OQ)),
          join(_mm512_cmp_ps_mask(v0, v0, _CMP_UNORD_Q), _mm512_cmp_ps_mask(v1, v1, _CMP_UNORD_Q))};
}
#endif

// From block `i` on, the first block of W pages with a candidate under fixed limits (its bits in `bits`), or the
// first i with fewer than W pages left; NaN bits are or-ed into `nan`. A loop without calls, so that the pointers,
// limits and accumulator stay in registers (with the offers in the same loop, the compiler spilled them).
template <isa A>
[[nodiscard]] std::size_t next_candidates(const float* b, const std::uint8_t* on_host, const std::uint8_t* pinned,
                                          std::size_t i, std::size_t n, float host_limit, float device_limit,
                                          std::uint32_t& nan, block_bits& bits) noexcept {
  constexpr std::size_t W = block_pages<A>;
  std::uint32_t seen = 0;
  for (; i + W <= n; i += W) {
    bits = candidate_bits<A>(b + i, on_host + i, pinned + i, host_limit, device_limit);
    seen |= bits.nan;
    if ((bits.host | bits.device) != 0) break;  // rare once the limits have tightened
  }
  nan |= seen;
  return i;
}

}  // namespace detail

/// The same candidates as select_recall_candidates_reference, from one sweep of W pages per compare (isa A's
/// block: 16 pages on SSE, 32 on AVX2 and AVX-512, one page on the scalar isa).
template <isa A = native_isa, class HostOk, class DeviceOk>
[[nodiscard]] recall_candidates select_recall_candidates(std::span<const float> bounds,
                                                         std::span<const std::uint8_t> on_host,
                                                         std::span<const std::uint8_t> pinned, std::size_t k,
                                                         HostOk&& host_ok, DeviceOk&& device_ok) {
  constexpr std::size_t W = detail::block_pages<A>;
  const std::size_t n = bounds.size();
  detail::first_k_pages<true> host(k, n);
  detail::first_k_pages<false> device(k, n);
  std::uint32_t nan = 0;
  const auto offer = [&](std::size_t first, const detail::block_bits& bits) {
    for (std::uint32_t m = bits.host; m != 0; m &= m - 1) {
      const std::size_t p = first + static_cast<std::size_t>(std::countr_zero(m));
      if (host_ok(p)) host.offer(bounds[p], p);
    }
    for (std::uint32_t m = bits.device; m != 0; m &= m - 1) {
      const std::size_t p = first + static_cast<std::size_t>(std::countr_zero(m));
      if (device_ok(p)) device.offer(bounds[p], p);
    }
  };
  std::size_t i = 0;
  if constexpr (W > 1) {
    detail::block_bits bits{};
    while ((i = detail::next_candidates<A>(bounds.data(), on_host.data(), pinned.data(), i, n, host.limit(),
                                           device.limit(), nan, bits)) + W <= n) {
      offer(i, bits);
      i += W;
    }
  }
  for (; i < n; ++i) {
    const auto bits = detail::candidate_bits<isa::scalar>(bounds.data() + i, on_host.data() + i, pinned.data() + i,
                                                          host.limit(), device.limit());
    nan |= bits.nan;
    if ((bits.host | bits.device) != 0) offer(i, bits);
  }
  return {std::move(host).take(), std::move(device).take(), nan != 0};
}

}  // namespace memdecay::simd
MEMDECAY_SIMD_END

#endif  // MEMDECAY_SIMD_RECALL_SELECT_HPP
