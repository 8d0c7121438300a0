// SPDX-License-Identifier: Apache-2.0
// memdecay: the SIMD scorer: page scores in one sweep, and the fused observe + score pass.
//
// Per token (the formulas of retention_score.hpp and ewma_tracker.hpp, one register of tokens at a time):
//     observe:  x = scale * m;  a <- beta * a + (1 - beta) * x;  if x > tau: last_refresh <- now
//     score:    s = b[r] * exp(-lambda[r] * (now - last_refresh)) + alpha * a
// and a page's score is the mean of its tokens' scores, summed in registers:
//   * page size >= lanes: the page's registers are added lane-wise, then reduced horizontally (one reduction
//     per page);
//   * page size <  lanes: one register holds lanes / page_size pages; it is spilled to a 64-byte stack buffer
//     and each page summed from there;
//   * the partial last page, and the pages left over when page size < lanes, run the same code one lane at a
//     time (packet<Float, isa::scalar>), so no load ever reads past the end of the state.
// The fused pass writes the updated EWMA and refresh clocks back and scores from the registers it already
// holds: 21 bytes of traffic per float token (read region 1, clock 4, EWMA 4, mass 4; write clock 4, EWMA 4)
// against 9 for a score-only pass. Both are memory-bound beyond the L2 cache (see docs/benchmarks.md).
//
// Accuracy against the scalar reference (page_scores_reference): the EWMA update is computed as the reference
// writes it (two products, one sum; no FMA), so refresh decisions and clocks are identical, and the EWMA is
// bit-identical unless the compiler contracts the reference into an FMA (GCC does under -march=native; then
// within 1 ulp, which is why basic_sequence observes with the reference and scores with this kernel); scores
// differ by the exp error (<= 2e-7 relative for float, see exp.hpp), the FMA in alpha * a + decay and the
// order of the page sum. tests/simd/simd_score_kernel_test.cpp holds them to |simd - ref| <= 1e-5 * (1 + |ref|)
// (float) and 1e-12 * (1 + |ref|) (double); docs/simd.md has the measured maxima.
#ifndef MEMDECAY_SIMD_SCORE_KERNEL_HPP
#define MEMDECAY_SIMD_SCORE_KERNEL_HPP

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>

#include "memdecay/core/ewma_tracker.hpp"
#include "memdecay/core/page_geometry.hpp"
#include "memdecay/core/region.hpp"
#include "memdecay/core/retention_score.hpp"
#include "memdecay/core/token_state.hpp"
#include "memdecay/simd/arch.hpp"
#include "memdecay/simd/exp.hpp"
#include "memdecay/simd/packet.hpp"

MEMDECAY_SIMD_BEGIN
namespace memdecay::simd {

/// The per-region constants of the score, in the layout the kernels read: 256-entry tables (any u8 id is in
/// bounds), 64-byte aligned. Build one per region table; it does not change while the table does not.
template <std::floating_point Float>
class region_lut {
 public:
  static constexpr std::size_t capacity = 256;

  region_lut() = default;
  template <region_table_like Regions>
  explicit region_lut(const Regions& table) : size_(std::min<std::size_t>(table.size(), capacity)) {
    for (std::size_t r = 0; r < size_; ++r) {
      base_[r] = static_cast<Float>(table.base_priority(static_cast<region_id>(r)));
      neg_rate_[r] = -static_cast<Float>(table.decay_rate(static_cast<region_id>(r)));
    }
  }
  /// Number of regions (entries past it are 0).
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  /// b_r for every id.
  [[nodiscard]] const Float* base() const noexcept { return base_.data(); }
  /// -lambda_r for every id.
  [[nodiscard]] const Float* neg_rate() const noexcept { return neg_rate_.data(); }

 private:
  alignas(64) std::array<Float, capacity> base_{};
  alignas(64) std::array<Float, capacity> neg_rate_{};
  std::size_t size_ = 0;
};

namespace detail {

/// Scores one register of tokens. Small: the region set fits one register (lookups are permutes).
template <class P, bool Small>
struct token_scorer {
  using Float = typename P::value_type;
  using reg = typename P::reg;
  typename P::table base, rate;
  reg alpha;
  step_t now;

  token_scorer(const region_lut<Float>& lut, Float alpha_value, step_t now_step) noexcept
      : base(P::make_table(lut.base())),
        rate(P::make_table(lut.neg_rate())),
        alpha(P::set1(alpha_value)),
        now(now_step) {}

  [[nodiscard]] MEMDECAY_SIMD_INLINE reg operator()(const region_id* r, typename P::ureg last_refresh,
                                                    reg ewma) const noexcept {
    // -lambda * age <= 0, so the clamp-free exp applies (same values as exp<P>).
    const reg decay = exp_bounded_above<P>(P::mul(P::template lookup<Small>(rate, r), P::age(last_refresh, now)));
    return P::fma(alpha, ewma, P::mul(P::template lookup<Small>(base, r), decay));
  }
};

/// Applies one observation to one register of tokens and returns the new clocks and EWMA.
template <class P>
struct token_observer {
  using Float = typename P::value_type;
  using reg = typename P::reg;
  reg scale, beta, one_minus_beta, tau;
  step_t now;
  std::size_t refreshed = 0;

  token_observer(const observation_params<Float>& p, step_t now_step) noexcept
      : scale(P::set1(p.scale)),
        beta(P::set1(p.beta)),
        one_minus_beta(P::set1(Float{1} - p.beta)),
        tau(P::set1(p.tau)),
        now(now_step) {}

  MEMDECAY_SIMD_INLINE void operator()(step_t* last_refresh, Float* ewma, const Float* mass,
                                       typename P::ureg& new_refresh, reg& new_ewma) noexcept {
    const reg x = P::mul(scale, P::load(mass));
    new_ewma =
        P::fma(beta, P::load(ewma), P::mul(one_minus_beta, x));  // ewma_step: exact where fused_observation_exact
    const auto hit = P::gt(x, tau);
    new_refresh = P::blend_u32(P::load_u32(last_refresh), now, hit);
    refreshed += P::popcount(hit);
    P::store(ewma, new_ewma);
    P::store_u32(last_refresh, new_refresh);
  }
};

/// Drives the page structure: `block(i)` scores the register of tokens starting at i, `one(i)` token i alone.
template <class P, std::size_t PageSize, class Block, class One>
MEMDECAY_SIMD_INLINE void page_loop(std::size_t n, std::size_t dynamic_size, typename P::value_type* out, Block&& block,
                                    One&& one) noexcept {
  using Float = typename P::value_type;
  constexpr std::size_t W = P::lanes;
  const std::size_t ps = PageSize != dynamic_page_size ? PageSize : dynamic_size;
  const std::size_t full = n / ps;
  std::size_t p = 0;
  if (ps >= W) {
    if constexpr (requires { P::has_transpose_sum; }) {
      // W pages at a time: one register of page sums by a transposing reduction, one store. ps is a power of
      // two, so multiplying by 1/ps is exact: the same result as the division below.
      const auto inv = P::set1(Float{1} / static_cast<Float>(ps));
      for (; p + W <= full; p += W) {
        typename P::reg acc[W];
        for (std::size_t q = 0; q < W; ++q) {
          const std::size_t first = (p + q) * ps;
          acc[q] = block(first);
          for (std::size_t j = W; j < ps; j += W) acc[q] = P::add(acc[q], block(first + j));
        }
        P::store(out + p, P::mul(P::transpose_sum(acc), inv));
      }
    }
    for (; p < full; ++p) {
      const std::size_t first = p * ps;
      auto acc = block(first);
      for (std::size_t j = W; j < ps; j += W) acc = P::add(acc, block(first + j));
      out[p] = P::reduce_add(acc) / static_cast<Float>(ps);
    }
  } else {
    const std::size_t per = W / ps;
    alignas(64) Float spill[W];
    for (; p + per <= full; p += per) {
      P::store(spill, block(p * ps));
      for (std::size_t q = 0; q < per; ++q) {
        Float sum = spill[q * ps];
        for (std::size_t j = 1; j < ps; ++j) sum += spill[q * ps + j];
        out[p + q] = sum / static_cast<Float>(ps);
      }
    }
  }
  for (; p * ps < n; ++p) {
    const std::size_t first = p * ps, count = std::min(ps, n - first);
    Float sum = one(first);
    for (std::size_t j = 1; j < count; ++j) sum += one(first + j);
    out[p] = sum / static_cast<Float>(count);
  }
}

template <isa A, std::size_t PageSize, bool Small, std::floating_point Float>
void score_pages_impl(const region_id* regions, const step_t* last_refresh, const Float* ewma, std::size_t n,
                      std::size_t page_size, step_t now, const region_lut<Float>& lut, Float alpha,
                      Float* out) noexcept {
  using P = packet<Float, A>;
  using S = packet<Float, isa::scalar>;
  const token_scorer<P, Small> vec(lut, alpha, now);
  const token_scorer<S, false> one(lut, alpha, now);
  page_loop<P, PageSize>(
      n, page_size, out,
      [&](std::size_t i) { return vec(regions + i, P::load_u32(last_refresh + i), P::load(ewma + i)); },
      [&](std::size_t i) { return one(regions + i, S::load_u32(last_refresh + i), S::load(ewma + i)); });
}

template <isa A, std::size_t PageSize, bool Small, std::floating_point Float>
std::size_t observe_and_score_impl(const region_id* regions, step_t* last_refresh, Float* ewma, const Float* mass,
                                   std::size_t n, std::size_t page_size, step_t now,
                                   const observation_params<Float>& obs, const region_lut<Float>& lut, Float alpha,
                                   Float* out) noexcept {
  using P = packet<Float, A>;
  using S = packet<Float, isa::scalar>;
  const token_scorer<P, Small> vec(lut, alpha, now);
  const token_scorer<S, false> one(lut, alpha, now);
  token_observer<P> vobs(obs, now);
  token_observer<S> sobs(obs, now);
  page_loop<P, PageSize>(
      n, page_size, out,
      [&](std::size_t i) {
        typename P::ureg lr;
        typename P::reg a;
        vobs(last_refresh + i, ewma + i, mass + i, lr, a);
        return vec(regions + i, lr, a);
      },
      [&](std::size_t i) {
        typename S::ureg lr;
        typename S::reg a;
        sobs(last_refresh + i, ewma + i, mass + i, lr, a);
        return one(regions + i, lr, a);
      });
  return vobs.refreshed + sobs.refreshed;
}

}  // namespace detail

/// Page scores of a state given as arrays (n tokens in page order, pages of `page_size` tokens, the last one
/// possibly partial): out[p] = mean over page p of b_r * exp(-lambda_r * (now - last_refresh)) + alpha * ewma.
/// `out` has ceil(n / page_size) entries. PageSize: a compile-time page size, or dynamic_page_size.
template <isa A = native_isa, std::size_t PageSize = dynamic_page_size, std::floating_point Float>
void score_pages(const region_id* regions, const step_t* last_refresh, const Float* ewma, std::size_t n,
                 std::size_t page_size, step_t now, const region_lut<Float>& lut, Float alpha, Float* out) noexcept {
  if (lut.size() <= packet<Float, A>::table_lanes)
    detail::score_pages_impl<A, PageSize, true>(regions, last_refresh, ewma, n, page_size, now, lut, alpha, out);
  else
    detail::score_pages_impl<A, PageSize, false>(regions, last_refresh, ewma, n, page_size, now, lut, alpha, out);
}

/// The fused pass: applies one observation (`mass`, n entries, already validated) to the EWMA and refresh
/// clocks, and writes the page scores of the updated state to `out`, in one sweep. Returns the number of
/// refreshed tokens. The scores are bitwise those score_pages() computes on the updated state.
template <isa A = native_isa, std::size_t PageSize = dynamic_page_size, std::floating_point Float>
std::size_t observe_and_score(const region_id* regions, step_t* last_refresh, Float* ewma, const Float* mass,
                              std::size_t n, std::size_t page_size, step_t now, const observation_params<Float>& obs,
                              const region_lut<Float>& lut, Float alpha, Float* out) noexcept {
  if (lut.size() <= packet<Float, A>::table_lanes)
    return detail::observe_and_score_impl<A, PageSize, true>(regions, last_refresh, ewma, mass, n, page_size, now, obs,
                                                             lut, alpha, out);
  return detail::observe_and_score_impl<A, PageSize, false>(regions, last_refresh, ewma, mass, n, page_size, now, obs,
                                                            lut, alpha, out);
}

/// The observation alone (no scores): the vectorised observe_tokens_reference. Returns the refreshed count.
template <isa A = native_isa, std::floating_point Float>
std::size_t observe(step_t* last_refresh, Float* ewma, const Float* mass, std::size_t n, step_t now,
                    const observation_params<Float>& obs) noexcept {
  using P = packet<Float, A>;
  using S = packet<Float, isa::scalar>;
  detail::token_observer<P> vobs(obs, now);
  detail::token_observer<S> sobs(obs, now);
  std::size_t i = 0;
  for (; i + P::lanes <= n; i += P::lanes) {
    typename P::ureg lr;
    typename P::reg a;
    vobs(last_refresh + i, ewma + i, mass + i, lr, a);
  }
  for (; i < n; ++i) {
    typename S::ureg lr;
    typename S::reg a;
    sobs(last_refresh + i, ewma + i, mass + i, lr, a);
  }
  return vobs.refreshed + sobs.refreshed;
}

// --- the same on a token_state ------------------------------------------------------------------------------

/// Page scores of `state` into `out` (num_pages() entries).
template <isa A = native_isa, std::floating_point Float, std::size_t PageSize>
void page_scores(const token_state<Float, PageSize>& state, const region_lut<Float>& lut, Float alpha,
                 std::span<Float> out) noexcept {
  score_pages<A, PageSize>(state.regions().data(), state.last_refresh().data(), state.ewma().data(), state.kv_len(),
                           state.page_size(), state.now(), lut, alpha, out.data());
}

/// The fused pass on `state` (`mass`: kv_len() validated entries; `out`: num_pages() entries). The caller bumps
/// the state's generation (state.touch()) afterwards, as for observe_tokens_reference.
template <isa A = native_isa, std::floating_point Float, std::size_t PageSize>
std::size_t observe_and_score(token_state<Float, PageSize>& state, std::span<const Float> mass,
                              const observation_params<Float>& obs, const region_lut<Float>& lut, Float alpha,
                              std::span<Float> out) noexcept {
  return observe_and_score<A, PageSize>(state.regions().data(), state.last_refresh_mut().data(),
                                        state.ewma_mut().data(), mass.data(), state.kv_len(), state.page_size(),
                                        state.now(), obs, lut, alpha, out.data());
}

}  // namespace memdecay::simd
MEMDECAY_SIMD_END

#endif  // MEMDECAY_SIMD_SCORE_KERNEL_HPP
