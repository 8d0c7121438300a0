// SPDX-License-Identifier: Apache-2.0
// memdecay: the exp-free scorer: the decay term as a per-step, per-region factor times a per-token weight.
//
//     b_r * exp(-lambda_r * (now - t_i))  =  f_r(now) * w_i
//     f_r(now) = b_r * exp(-lambda_r * (now - E))     per region, once per step        (expfree_clock::set)
//     w_i      = exp(lambda_r * (t_i - E))              per token, stored beside the state
//     g_r(now) = exp(lambda_r * (now - E))              per region: a refresh at `now` writes w_i = g_r(now)
//
// E is the epoch, a step at or before now. t_i (the integer last-refresh step) stays the source of truth: w_i is a
// cache of a function of t_i, rewritten from t_i at every rebase, so no error accumulates over steps.
//   * A score costs one lookup, one multiply and one FMA per token (no exponential): score_pages_expfree.
//   * A refresh costs a lookup and a blend (g_r is a per-step constant): observe_and_score_expfree.
//   * Rebase: once now - E would exceed span() = floor(L / max_r lambda_r) steps (L = 40), E := now and every w_i
//     is recomputed from t_i: one exponential per token (rebase_weights), at most once per span() steps (865 steps
//     for the default regions). Until then g_r <= e^L and f_r >= b_r * e^-L stay normal numbers.
//
// Ranges and hazards (float; double alike with its own limits):
//   * Overflow: none. g_r <= e^40 = 2.4e17 and w_i <= g_r.
//   * f_r underflow: excluded. The clock is usable() only when every region has b_r = 0 or b_r >= FLT_MIN * e^40
//     (2.8e-21), so f_r is normal; and when span() >= min_span (8 steps), i.e. max lambda_r <= 5 (half-life >= 0.14
//     steps). Tables outside that domain must use the polynomial kernels (score_kernel.hpp); the sequences do.
//   * w_i underflow: at a rebase, w_i = 0 when lambda_r * (E - t_i) > 87.3 (exp's own flush threshold, exp.hpp),
//     so every stored w_i is 0 or a normal number >= 1.2e-38. The dropped decay term is < b_r * 1.2e-38: the same
//     flush the polynomial kernel applies.
//   * Subnormal products: f_r * w_i is subnormal exactly when the true decay term is below FLT_MIN (the reference
//     computes a subnormal there too). Measured on the benchmark machine (Zen 4): no penalty for subnormal
//     multiply results. On CPUs with microcode assists for them (Intel without FTZ) such tokens are slow.
//   * Drift: none; f_r, g_r are recomputed from (now - E) each step and w_i from t_i at each rebase, in double.
//     Measured over 10^6 steps (tests/simd/simd_expfree_test.cpp): max relative error 1.39e-7 per decay term, the same
//     in the first and the last 10^5 steps.
//   * Wrap-around: ages are u32 differences, as in the reference; t_i <= E <= now is required (E is only ever set
//     to the current step).
// Error (float): f_r and g_r are exp in double rounded once to float (0.5 ulp); w_i likewise; the product one more
// rounding: the decay term is within 1.5 ulp (+ 2^-149 absolute) of b_r * exp(-lambda_r * age) evaluated exactly.
// The scalar reference rounds its exponent argument -lambda_r * age to float first, an error of up to
// lambda_r * age * 2^-24 relative (5e-6 at age = 87.3 / lambda_r) that this formulation does not make; tests
// compare with both (tests/simd/simd_expfree_test.cpp; docs/simd.md "Exp-free formulation").
// Double: the same steps with exponents rounded to double; f_r and g_r carry exponents up to L that cancel for
// tokens refreshed after the epoch, so the error is up to (lambda_r * age + 2 L + 3) * 2^-53 relative (measured
// 5.6e-14 over 10^5 steps): use the polynomial kernels where double's full precision matters.
// Speed: the per-step set() costs ~25 ns (two vector exps in double over the regions); a token costs a lookup, a
// multiply and an FMA (score), plus a compare, a blend and masked stores (fused). docs/benchmarks.md.
#ifndef MEMDECAY_SIMD_EXPFREE_HPP
#define MEMDECAY_SIMD_EXPFREE_HPP

#include <algorithm>
#include <array>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>

#include "memdecay/core/ewma_tracker.hpp"
#include "memdecay/core/region.hpp"
#include "memdecay/core/retention_score.hpp"
#include "memdecay/core/token_state.hpp"
#include "memdecay/simd/arch.hpp"
#include "memdecay/simd/exp.hpp"
#include "memdecay/simd/packet.hpp"
#include "memdecay/simd/score_kernel.hpp"

MEMDECAY_SIMD_BEGIN
namespace memdecay::simd {

/// The limits of the exp-free formulation for one float type.
template <std::floating_point Float>
struct expfree_limits {
  /// L: the largest exponent lambda_r * (now - E) allowed before a rebase.
  static constexpr double max_exponent = 40.0;
  /// Below this many steps between rebases the formulation is not used (a rebase costs one exp per token).
  static constexpr step_t min_span = 8;
  /// The smallest non-zero b_r: f_r = b_r * e^-L stays a normal number.
  static double min_base() noexcept {
    return static_cast<double>(std::numeric_limits<Float>::min()) * std::exp(max_exponent);
  }
  /// w_i is flushed to 0 below exp(flush_exponent) (exp's own range, so stored weights are 0 or normal).
  static constexpr double flush_exponent = exp_constants<Float>::lo;
};

/// The per-region, per-step factors of the exp-free formulation, relative to an epoch E: f_r(now) and g_r(now).
/// Built from a region_lut; set(E, now) once per step (cheap: a few vector exps in double over the regions).
template <std::floating_point Float>
class expfree_clock {
 public:
  static constexpr std::size_t capacity = region_lut<Float>::capacity;

  expfree_clock() = default;
  explicit expfree_clock(const region_lut<Float>& lut) : size_(lut.size()) {
    double max_rate = 0;
    usable_ = size_ > 0;
    for (std::size_t r = 0; r < size_; ++r) {
      neg_rate_[r] = static_cast<double>(lut.neg_rate()[r]);
      base_[r] = static_cast<double>(lut.base()[r]);
      max_rate = std::max(max_rate, -neg_rate_[r]);
      if (base_[r] != 0 && base_[r] < expfree_limits<Float>::min_base()) usable_ = false;
      if (!std::isfinite(neg_rate_[r]) || !std::isfinite(base_[r])) usable_ = false;
    }
    const double span = max_rate > 0 ? std::floor(expfree_limits<Float>::max_exponent / max_rate) : 4.0e9;
    span_ = span >= 4.0e9 ? std::numeric_limits<step_t>::max() : static_cast<step_t>(span);
    if (span_ < expfree_limits<Float>::min_span) usable_ = false;
  }

  /// Whether every region is inside the formulation's domain (see the header comment). When false, use the
  /// polynomial kernels; the functions below still compute something, without the stated accuracy.
  [[nodiscard]] bool usable() const noexcept { return usable_; }
  /// The most steps the clock may run ahead of the epoch: floor(L / max lambda_r).
  [[nodiscard]] step_t span() const noexcept { return span_; }
  [[nodiscard]] step_t epoch() const noexcept { return epoch_; }
  [[nodiscard]] step_t now() const noexcept { return now_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  /// Whether `now` is too far past the epoch (or before it): then rebase (rebase_weights with E = now).
  [[nodiscard]] bool needs_rebase(step_t now) const noexcept { return now - epoch_ > span_; }

  /// Sets the epoch and the step, and computes f_r and g_r for them. Requires now - epoch <= span().
  template <isa A = native_isa>
  void set(step_t epoch, step_t now) noexcept {
    using Pd = packet<double, A>;
    epoch_ = epoch;
    now_ = now;
    const double dt = static_cast<double>(now - epoch);
    for (std::size_t r = 0; r < size_; r += Pd::lanes) {
      const typename Pd::reg x = Pd::mul(Pd::load(neg_rate_.data() + r), Pd::set1(dt));  // -lambda * dt, >= -L
      const typename Pd::reg f = Pd::mul(Pd::load(base_.data() + r), exp<Pd>(x));
      const typename Pd::reg g = exp<Pd>(Pd::sub(Pd::zero(), x));
      if constexpr (std::same_as<Float, float>) {
        Pd::store_float(factor_.data() + r, f);
        Pd::store_float(refresh_.data() + r, g);
      } else {
        Pd::store(factor_.data() + r, f);
        Pd::store(refresh_.data() + r, g);
      }
    }
  }

  /// f_r(now) = b_r * exp(-lambda_r * (now - E)), 256 entries (0 past size(); ids past size() never occur).
  [[nodiscard]] const Float* factor() const noexcept { return factor_.data(); }
  /// g_r(now) = exp(lambda_r * (now - E)): the weight of a token refreshed at now.
  [[nodiscard]] const Float* refresh_weight() const noexcept { return refresh_.data(); }
  /// -lambda_r in double (the float lut's values, widened).
  [[nodiscard]] const double* neg_rate() const noexcept { return neg_rate_.data(); }

 private:
  // 256 + 8 entries: set() reads whole registers of 8 doubles past size().
  alignas(64) std::array<double, capacity + 8> neg_rate_{};
  alignas(64) std::array<double, capacity + 8> base_{};
  // + 8: set() writes whole registers of up to 8 lanes past size() (entries past size() are never looked up by
  // a region id the table has, but stay finite: exp of 0 times a base of 0).
  alignas(64) std::array<Float, capacity + 8> factor_{};
  alignas(64) std::array<Float, capacity + 8> refresh_{};
  std::size_t size_ = 0;
  step_t span_ = 0;
  step_t epoch_ = 0;
  step_t now_ = 0;
  bool usable_ = false;
};

/// Rebase: w[i] = exp(-lambda_r * (clock.epoch() - last_refresh[i])) for n tokens, computed in double and rounded
/// once to Float; 0 where the exponent is below expfree_limits<Float>::flush_exponent. Requires
/// last_refresh[i] <= epoch (in u32 steps). Call after clock.set(now, now) when clock.needs_rebase(now).
template <isa A = native_isa, std::floating_point Float>
void rebase_weights(const region_id* regions, const step_t* last_refresh, std::size_t n,
                    const expfree_clock<Float>& clock, Float* w) noexcept {
  using Pd = packet<double, A>;
  using Sd = packet<double, isa::scalar>;
  constexpr std::size_t chunk = 256;
  alignas(64) double buf[chunk];
  const step_t epoch = clock.epoch();
  const auto vt = Pd::make_table(clock.neg_rate());
  const auto st = Sd::make_table(clock.neg_rate());
  const bool small = clock.size() <= Pd::table_lanes;
  const double flush = expfree_limits<Float>::flush_exponent;
  for (std::size_t first = 0; first < n; first += chunk) {
    const std::size_t m = std::min(chunk, n - first);
    const region_id* r = regions + first;
    const step_t* t = last_refresh + first;
    std::size_t i = 0;
    if (small) {
      for (; i + Pd::lanes <= m; i += Pd::lanes) {
        const auto x = Pd::mul(Pd::template lookup<true>(vt, r + i), Pd::age(Pd::load_u32(t + i), epoch));
        Pd::store(buf + i, Pd::zero_below(x, Pd::set1(flush), exp<Pd>(x)));
      }
    } else {
      for (; i + Pd::lanes <= m; i += Pd::lanes) {
        const auto x = Pd::mul(Pd::template lookup<false>(vt, r + i), Pd::age(Pd::load_u32(t + i), epoch));
        Pd::store(buf + i, Pd::zero_below(x, Pd::set1(flush), exp<Pd>(x)));
      }
    }
    for (; i < m; ++i) {
      const double x = Sd::mul(Sd::template lookup<false>(st, r + i), Sd::age(t[i], epoch));
      buf[i] = Sd::zero_below(x, flush, exp<Sd>(x));
    }
    for (i = 0; i < m; ++i) w[first + i] = static_cast<Float>(buf[i]);
  }
}

/// Sets w[i] = g_r(now) for tokens [first, last) (tokens appended at now, or refreshed at now).
template <std::floating_point Float>
void refresh_weights(const region_id* regions, std::size_t first, std::size_t last, const expfree_clock<Float>& clock,
                     Float* w) noexcept {
  const Float* g = clock.refresh_weight();
  for (std::size_t i = first; i < last; ++i) w[i] = g[regions[i]];
}

namespace detail {

/// b where m, written to p: a masked store where the isa has one, else the blended register.
template <class P>
MEMDECAY_SIMD_INLINE void store_where(typename P::value_type* p, typename P::mask m, typename P::reg b,
                                      typename P::reg blended) noexcept {
  if constexpr (requires { P::masked_store(p, m, b); })
    P::masked_store(p, m, b);
  else
    P::store(p, blended);
}
template <class P>
MEMDECAY_SIMD_INLINE void store_u32_where(step_t* p, typename P::mask m, step_t v) noexcept {
  if constexpr (requires { P::masked_store_u32(p, m, v); })
    P::masked_store_u32(p, m, v);
  else
    P::store_u32(p, P::blend_u32(P::load_u32(p), v, m));
}

/// The per-register pieces of the exp-free kernels.
template <class P, bool Small>
struct expfree_token {
  using Float = typename P::value_type;
  using reg = typename P::reg;
  typename P::table factor, refresh;
  reg alpha;

  expfree_token(const expfree_clock<Float>& clock, Float alpha_value) noexcept
      : factor(P::make_table(clock.factor())),
        refresh(P::make_table(clock.refresh_weight())),
        alpha(P::set1(alpha_value)) {}

  [[nodiscard]] MEMDECAY_SIMD_INLINE reg score(const region_id* r, reg w, reg ewma) const noexcept {
    return score_with(P::template lookup<Small>(factor, r), w, ewma);
  }
  [[nodiscard]] MEMDECAY_SIMD_INLINE reg score_with(reg f, reg w, reg ewma) const noexcept {
    return P::fma(alpha, ewma, P::mul(f, w));
  }
  [[nodiscard]] MEMDECAY_SIMD_INLINE reg factor_of(const region_id* r) const noexcept {
    return P::template lookup<Small>(factor, r);
  }
  [[nodiscard]] MEMDECAY_SIMD_INLINE reg refreshed(const region_id* r) const noexcept {
    return P::template lookup<Small>(refresh, r);
  }
};

template <isa A, std::size_t PageSize, bool Small, std::floating_point Float>
void score_pages_expfree_impl(const region_id* regions, const Float* w, const Float* ewma, std::size_t n,
                              std::size_t page_size, const expfree_clock<Float>& clock, Float alpha,
                              Float* out) noexcept {
  using P = packet<Float, A>;
  using S = packet<Float, isa::scalar>;
  const expfree_token<P, Small> vec(clock, alpha);
  const expfree_token<S, false> one(clock, alpha);
  page_loop<P, PageSize>(
      n, page_size, out, [&](std::size_t i) { return vec.score(regions + i, P::load(w + i), P::load(ewma + i)); },
      [&](std::size_t i) { return one.score(regions + i, S::load(w + i), S::load(ewma + i)); });
}

/// One register of the fused pass: observation (as token_observer: two products and a sum), refresh of the clock
/// and the weight (masked stores where the isa has them), score.
template <class P, bool Small>
struct expfree_fused_token {
  using Float = typename P::value_type;
  using reg = typename P::reg;
  expfree_token<P, Small> tok;
  reg scale, beta, one_minus_beta, tau;
  step_t now;
  std::size_t refreshed = 0;

  expfree_fused_token(const expfree_clock<Float>& clock, const observation_params<Float>& p, Float alpha) noexcept
      : tok(clock, alpha),
        scale(P::set1(p.scale)),
        beta(P::set1(p.beta)),
        one_minus_beta(P::set1(Float{1} - p.beta)),
        tau(P::set1(p.tau)),
        now(clock.now()) {}

  MEMDECAY_SIMD_INLINE reg operator()(const region_id* r, step_t* last_refresh, Float* w, Float* ewma,
                                      const Float* mass) noexcept {
    // Loads and lookups first: the region bytes are widened once for both lookups (a store in between would
    // make the compiler reload them, since w or the clocks might alias the labels).
    const reg g = tok.refreshed(r), f = tok.factor_of(r), w_old = P::load(w);
    const reg x = P::mul(scale, P::load(mass));
    const reg a = P::fma(beta, P::load(ewma), P::mul(one_minus_beta, x));  // ewma_step
    const auto hit = P::gt(x, tau);
    const reg wn = P::blend(w_old, g, hit);
    P::store(ewma, a);
    store_u32_where<P>(last_refresh, hit, now);
    store_where<P>(w, hit, g, wn);
    refreshed += P::popcount(hit);
    return tok.score_with(f, wn, a);
  }
};

template <isa A, std::size_t PageSize, bool Small, std::floating_point Float>
std::size_t observe_and_score_expfree_impl(const region_id* regions, step_t* last_refresh, Float* w, Float* ewma,
                                           const Float* mass, std::size_t n, std::size_t page_size,
                                           const expfree_clock<Float>& clock, const observation_params<Float>& obs,
                                           Float alpha, Float* out) noexcept {
  using P = packet<Float, A>;
  using S = packet<Float, isa::scalar>;
  expfree_fused_token<P, Small> vec(clock, obs, alpha);
  expfree_fused_token<S, false> one(clock, obs, alpha);
  page_loop<P, PageSize>(
      n, page_size, out, [&](std::size_t i) { return vec(regions + i, last_refresh + i, w + i, ewma + i, mass + i); },
      [&](std::size_t i) { return one(regions + i, last_refresh + i, w + i, ewma + i, mass + i); });
  return vec.refreshed + one.refreshed;
}

/// One register of the sync + score pass: tokens whose clock is now get w = g_r(now), then the score.
template <class P, bool Small>
struct expfree_sync_token {
  using Float = typename P::value_type;
  using reg = typename P::reg;
  expfree_token<P, Small> tok;
  step_t now;

  expfree_sync_token(const expfree_clock<Float>& clock, Float alpha) noexcept : tok(clock, alpha), now(clock.now()) {}

  MEMDECAY_SIMD_INLINE reg operator()(const region_id* r, const step_t* last_refresh, Float* w,
                                      const Float* ewma) const noexcept {
    const reg g = tok.refreshed(r), f = tok.factor_of(r), w_old = P::load(w), a = P::load(ewma);
    const auto hit = P::eq_u32(P::load_u32(last_refresh), now);
    const reg wn = P::blend(w_old, g, hit);
    store_where<P>(w, hit, g, wn);
    return tok.score_with(f, wn, a);
  }
};

template <isa A, std::size_t PageSize, bool Small, std::floating_point Float>
void sync_and_score_expfree_impl(const region_id* regions, const step_t* last_refresh, Float* w, const Float* ewma,
                                 std::size_t n, std::size_t page_size, const expfree_clock<Float>& clock, Float alpha,
                                 Float* out) noexcept {
  using P = packet<Float, A>;
  using S = packet<Float, isa::scalar>;
  const expfree_sync_token<P, Small> vec(clock, alpha);
  const expfree_sync_token<S, false> one(clock, alpha);
  page_loop<P, PageSize>(
      n, page_size, out, [&](std::size_t i) { return vec(regions + i, last_refresh + i, w + i, ewma + i); },
      [&](std::size_t i) { return one(regions + i, last_refresh + i, w + i, ewma + i); });
}

}  // namespace detail

/// Page scores from the weights: out[p] = mean over page p of f_r(now) * w_i + alpha * ewma_i (clock.now()).
template <isa A = native_isa, std::size_t PageSize = dynamic_page_size, std::floating_point Float>
void score_pages_expfree(const region_id* regions, const Float* w, const Float* ewma, std::size_t n,
                         std::size_t page_size, const expfree_clock<Float>& clock, Float alpha, Float* out) noexcept {
  if (clock.size() <= packet<Float, A>::table_lanes)
    detail::score_pages_expfree_impl<A, PageSize, true>(regions, w, ewma, n, page_size, clock, alpha, out);
  else
    detail::score_pages_expfree_impl<A, PageSize, false>(regions, w, ewma, n, page_size, clock, alpha, out);
}

/// The exp-free fused pass: applies one observation at clock.now() (EWMA, refresh clocks, and w = g_r(now) for the
/// refreshed tokens) and writes the page scores of the updated state, in one sweep. Returns the refreshed count.
/// Clocks and refresh counts equal observe_tokens_reference's; the EWMA is computed as token_observer computes it.
template <isa A = native_isa, std::size_t PageSize = dynamic_page_size, std::floating_point Float>
std::size_t observe_and_score_expfree(const region_id* regions, step_t* last_refresh, Float* w, Float* ewma,
                                      const Float* mass, std::size_t n, std::size_t page_size,
                                      const expfree_clock<Float>& clock, const observation_params<Float>& obs,
                                      Float alpha, Float* out) noexcept {
  if (clock.size() <= packet<Float, A>::table_lanes)
    return detail::observe_and_score_expfree_impl<A, PageSize, true>(regions, last_refresh, w, ewma, mass, n, page_size,
                                                                     clock, obs, alpha, out);
  return detail::observe_and_score_expfree_impl<A, PageSize, false>(regions, last_refresh, w, ewma, mass, n, page_size,
                                                                    clock, obs, alpha, out);
}

/// After an observation applied elsewhere (observe_tokens_reference): w = g_r(now) where last_refresh == now, then
/// the page scores, in one sweep. What basic_sequence runs after each observation.
template <isa A = native_isa, std::size_t PageSize = dynamic_page_size, std::floating_point Float>
void sync_and_score_expfree(const region_id* regions, const step_t* last_refresh, Float* w, const Float* ewma,
                            std::size_t n, std::size_t page_size, const expfree_clock<Float>& clock, Float alpha,
                            Float* out) noexcept {
  if (clock.size() <= packet<Float, A>::table_lanes)
    detail::sync_and_score_expfree_impl<A, PageSize, true>(regions, last_refresh, w, ewma, n, page_size, clock, alpha,
                                                           out);
  else
    detail::sync_and_score_expfree_impl<A, PageSize, false>(regions, last_refresh, w, ewma, n, page_size, clock, alpha,
                                                            out);
}

/// Recomputes all n weights with the epoch at `now` (a full rebase): the clock's factors restart from 1.
template <isa A = native_isa, std::floating_point Float>
void reset_expfree(const region_id* regions, const step_t* last_refresh, std::size_t n, step_t now,
                   expfree_clock<Float>& clock, Float* w) noexcept {
  clock.template set<A>(now, now);
  rebase_weights<A>(regions, last_refresh, n, clock, w);
}

/// Moves `clock` to `now`, rebasing the n weights `w` first when needed (from the tokens' labels and integer
/// clocks). Returns whether it rebased.
template <isa A = native_isa, std::floating_point Float>
bool advance_expfree(const region_id* regions, const step_t* last_refresh, std::size_t n, step_t now,
                     expfree_clock<Float>& clock, Float* w) noexcept {
  if (clock.needs_rebase(now)) {
    reset_expfree<A>(regions, last_refresh, n, now, clock, w);
    return true;
  }
  if (now != clock.now()) clock.template set<A>(clock.epoch(), now);
  return false;
}

/// w[i] = g_r(now) where last_refresh[i] == clock.now(): the weights of tokens an observation refreshed (for
/// observations applied without the fused pass, e.g. policies::memdecay's lifetime and zscore modes).
template <std::floating_point Float>
void sync_weights(const region_id* regions, const step_t* last_refresh, std::size_t n,
                  const expfree_clock<Float>& clock, Float* w) noexcept {
  const Float* g = clock.refresh_weight();
  const step_t now = clock.now();
  for (std::size_t i = 0; i < n; ++i)
    if (last_refresh[i] == now) w[i] = g[regions[i]];
}

// --- on a token_state, with the weights held beside it ----------------------------------------------------

/// Moves `clock` to state.now(), rebasing `w` (kv_len() entries) first when needed. Returns whether it rebased.
template <isa A = native_isa, std::floating_point Float, std::size_t PageSize>
bool advance_expfree(const token_state<Float, PageSize>& state, expfree_clock<Float>& clock,
                     std::span<Float> w) noexcept {
  return advance_expfree<A>(state.regions().data(), state.last_refresh().data(), state.kv_len(), state.now(), clock,
                            w.data());
}

/// Recomputes every weight of `state` with the epoch at state.now() (a full rebase).
template <isa A = native_isa, std::floating_point Float, std::size_t PageSize>
void reset_expfree(const token_state<Float, PageSize>& state, expfree_clock<Float>& clock,
                   std::span<Float> w) noexcept {
  reset_expfree<A>(state.regions().data(), state.last_refresh().data(), state.kv_len(), state.now(), clock, w.data());
}

/// Page scores of `state` from its weights (clock at state.now()).
template <isa A = native_isa, std::floating_point Float, std::size_t PageSize>
void page_scores_expfree(const token_state<Float, PageSize>& state, std::span<const Float> w,
                         const expfree_clock<Float>& clock, Float alpha, std::span<Float> out) noexcept {
  score_pages_expfree<A, PageSize>(state.regions().data(), w.data(), state.ewma().data(), state.kv_len(),
                                   state.page_size(), clock, alpha, out.data());
}

/// The exp-free fused pass on `state` (clock at state.now()). The caller bumps the generation (state.touch()).
template <isa A = native_isa, std::floating_point Float, std::size_t PageSize>
std::size_t observe_and_score_expfree(token_state<Float, PageSize>& state, std::span<Float> w,
                                      std::span<const Float> mass, const observation_params<Float>& obs,
                                      const expfree_clock<Float>& clock, Float alpha, std::span<Float> out) noexcept {
  return observe_and_score_expfree<A, PageSize>(state.regions().data(), state.last_refresh_mut().data(), w.data(),
                                                state.ewma_mut().data(), mass.data(), state.kv_len(), state.page_size(),
                                                clock, obs, alpha, out.data());
}

}  // namespace memdecay::simd
MEMDECAY_SIMD_END

#endif  // MEMDECAY_SIMD_EXPFREE_HPP
