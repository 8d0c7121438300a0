// SPDX-License-Identifier: Apache-2.0
// memdecay: an optional compact token-state layout (5 bytes per token instead of 9) and its scorer.
//
// For contexts whose state exceeds the caches the score-only pass is memory-bound (docs/benchmarks.md), so
// bytes per token are time. compact_state keeps, per token, in page order:
//   region   u8                                         (as sequence_state)
//   stamp    u16: the refresh step relative to an epoch E  (instead of a u32 clock)
//   ewma     u16: the EWMA as an IEEE binary16 (fp16)      (instead of a float)
//
// Ages. age_i = min(now - E - stamp_i, max_age) with max_age = 2^15, all in u32 arithmetic (wrapping, as the
// reference's now - last_refresh). Invariant (kept by advance_to's rebasing): max_age <= now - E <= 65535, so a
// refresh at `now` is the stamp now - E, and stamp 0 means "refreshed at or before E", an age >= max_age.
// Hence age_i == min(now - last_refresh_i, max_age) exactly, for every token, at every step. The epoch starts at
// now - max_age. Rebasing rule: when advance_to(t) would make t - E exceed 65535, E becomes t - max_age and every
// stamp s becomes max(s - (new E - old E), 0) (one pass over 2 bytes per token, at most once per 32768 steps).
// EWMA. Rounded to nearest even on store (F16C / AVX-512 vcvtps2ph where the isa has it; a scalar conversion
// that gives the same bits otherwise), after saturating at 65504 (the largest finite fp16, never inf).
//
// Error (docs/simd.md, measured by tests/simd_compact_test.cpp), per token, against the full-precision state:
//   attention term  |alpha * (fp16(a) - a)| <= alpha * (2^-11 * a + 2^-25)   (2^-25: fp16 subnormals, a < 2^-14)
//   decay term      exact while age <= max_age; beyond, b * exp(-lambda * max_age) instead of the smaller
//                   b * exp(-lambda * age): an over-estimate of at most b * 2^(-max_age / half_life)
// and a page's score error is the mean of its tokens' errors (plus the SIMD scorer's own tolerance).
// Observation on the compact state (compact_observe_and_score) applies the reference update to the decoded EWMA
// in float and rounds it to fp16: clocks and refresh decisions are exact; the EWMA carries one fp16 rounding per
// observation, so its drift from a full-precision EWMA is bounded by 2^-11 * max(a) / (1 - beta).
//
// Float only: fp16 storage makes a double scorer pointless. Vector kernels need AVX-512 (F, VL, DQ, BW) or AVX2
// with F16C (__F16C__, or MEMDECAY_SIMD_ENABLE_F16C); other isas (SSE included) run the 1-lane kernel, whose
// conversions give the same bits.
#ifndef MEMDECAY_SIMD_COMPACT_STATE_HPP
#define MEMDECAY_SIMD_COMPACT_STATE_HPP

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "memdecay/detail/error.hpp"
#include "memdecay/ewma_tracker.hpp"
#include "memdecay/page_geometry.hpp"
#include "memdecay/region.hpp"
#include "memdecay/retention_score.hpp"
#include "memdecay/sequence_state.hpp"
#include "memdecay/simd/arch.hpp"
#include "memdecay/simd/exp.hpp"
#include "memdecay/simd/packet.hpp"
#include "memdecay/simd/score_kernel.hpp"

#if !defined(MEMDECAY_SIMD_ENABLE_F16C) && (defined(__F16C__) || defined(MEMDECAY_SIMD_ENABLE_AVX512))
#define MEMDECAY_SIMD_ENABLE_F16C 1
#endif

MEMDECAY_SIMD_BEGIN
namespace memdecay::simd {

// --- fp16 ------------------------------------------------------------------------------------------------------

/// The largest finite fp16 value; compact EWMAs saturate here.
inline constexpr float half_max = 65504.0f;

/// float -> fp16 bits, round to nearest even (the bits vcvtps2ph gives with imm 0 for every non-NaN input:
/// overflow to inf, subnormals, signed zeros). NaN: some quiet NaN.
[[nodiscard]] inline std::uint16_t float_to_half_bits(float value) noexcept {
  std::uint32_t f = std::bit_cast<std::uint32_t>(value);
  const std::uint32_t sign = f & 0x80000000u;
  f ^= sign;
  std::uint32_t o;
  if (f >= (127u + 16u) << 23) {  // |value| >= 2^16: inf (or NaN)
    o = f > 0x7f800000u ? 0x7e00u : 0x7c00u;
  } else if (f < (113u << 23)) {  // below 2^-14: fp16 subnormal or zero; the float add rounds to nearest even
    constexpr std::uint32_t magic_bits = ((127u - 15u) + (23u - 10u) + 1u) << 23;  // 0.5
    const float sum = std::bit_cast<float>(f) + std::bit_cast<float>(magic_bits);
    o = std::bit_cast<std::uint32_t>(sum) - magic_bits;
  } else {
    const std::uint32_t mant_odd = (f >> 13) & 1u;
    f += (static_cast<std::uint32_t>(15 - 127) << 23) + 0xfffu + mant_odd;  // rebias; round to nearest even
    o = f >> 13;                                                            // carries into inf above 65519.99
  }
  return static_cast<std::uint16_t>(o | (sign >> 16));
}

/// fp16 bits -> float (exact).
[[nodiscard]] inline float half_bits_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {
    const float mag = static_cast<float>(m) * 0x1p-24f;  // exact: m < 2^10
    return std::bit_cast<float>(std::bit_cast<std::uint32_t>(mag) | sign);
  }
  if (e == 31) return std::bit_cast<float>(sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0u));
  return std::bit_cast<float>(sign | ((e + 112u) << 23) | (m << 13));
}

/// The isa the compact kernels run for a requested isa: vector only where fp16 conversions exist.
[[nodiscard]] constexpr isa compact_isa(isa a) noexcept {
#if defined(MEMDECAY_SIMD_ENABLE_AVX512)
  if (a == isa::avx512) return a;
#endif
#if defined(MEMDECAY_SIMD_ENABLE_AVX2) && defined(MEMDECAY_SIMD_ENABLE_F16C)
  if (a == isa::avx2) return a;
#endif
  (void)a;
  return isa::scalar;
}

// --- the layout --------------------------------------------------------------------------------------------------

/// The compact per-sequence token state (see the top of this file). Page order and page size as sequence_state.
template <std::size_t PageSize = dynamic_page_size>
class compact_state {
 public:
  using geometry_type = page_geometry<PageSize>;
  /// Ages saturate here (steps).
  static constexpr step_t max_age = step_t{1} << 15;
  /// now - epoch never exceeds this.
  static constexpr step_t max_span = 65535;

  explicit compact_state(std::size_t page_size = PageSize == dynamic_page_size ? 16 : PageSize)
      : geometry_(page_size) {}

  /// The compact form of `state`: same regions; ages min(now - last_refresh, max_age); EWMA rounded to fp16
  /// (saturating at half_max).
  template <std::floating_point Float>
  explicit compact_state(const sequence_state<Float, PageSize>& state) : geometry_(state.page_size()) {
    now_ = state.now();
    epoch_ = now_ - max_age;  // u32 arithmetic: wraps below step 2^15, as ages do
    const std::size_t n = state.kv_len();
    region_.assign(state.regions().begin(), state.regions().end());
    stamp_.resize(n);
    ewma_.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      const step_t age = now_ - state.last_refresh()[i];  // the reference's age (u32, wrapping)
      stamp_[i] = static_cast<std::uint16_t>(age >= max_age ? 0 : max_age - age);
      ewma_[i] = encode(static_cast<float>(state.ewma()[i]));
    }
  }

  /// A sequence_state with this state's regions, clocks now - age(i) and decoded EWMA (page origins 0, 1, ...:
  /// positions are not part of the compact layout).
  template <std::floating_point Float = float>
  [[nodiscard]] sequence_state<Float, PageSize> to_sequence_state() const {
    sequence_state<Float, PageSize> s(page_size());
    s.append(std::span<const region_id>(region_));
    s.advance_to(now_);
    auto lr = s.last_refresh_mut();
    auto ew = s.ewma_mut();
    for (std::size_t i = 0; i < kv_len(); ++i) {
      lr[i] = now_ - age(i);
      ew[i] = static_cast<Float>(ewma(i));
    }
    return s;
  }

  // --- sizes and values ------------------------------------------------------------------------------------------
  [[nodiscard]] std::size_t page_size() const noexcept { return geometry_.size(); }
  [[nodiscard]] std::size_t kv_len() const noexcept { return region_.size(); }
  [[nodiscard]] std::size_t num_pages() const noexcept { return geometry_.pages_for(kv_len()); }
  [[nodiscard]] std::size_t tokens_in_page(std::size_t page) const noexcept {
    return std::min(page_size(), kv_len() - page * page_size());
  }
  [[nodiscard]] step_t now() const noexcept { return now_; }
  [[nodiscard]] step_t epoch() const noexcept { return epoch_; }
  /// min(now - last_refresh, max_age) of token i.
  [[nodiscard]] step_t age(std::size_t i) const noexcept {
    return std::min<step_t>(now_ - epoch_ - stamp_[i], max_age);
  }
  /// The decoded EWMA of token i.
  [[nodiscard]] float ewma(std::size_t i) const noexcept { return half_bits_to_float(ewma_[i]); }
  [[nodiscard]] std::span<const region_id> regions() const noexcept { return region_; }
  [[nodiscard]] std::span<const std::uint16_t> stamps() const noexcept { return stamp_; }
  [[nodiscard]] std::span<const std::uint16_t> ewma_bits() const noexcept { return ewma_; }
  /// Mutable views for the kernels.
  [[nodiscard]] std::span<std::uint16_t> stamps_mut() noexcept { return stamp_; }
  [[nodiscard]] std::span<std::uint16_t> ewma_bits_mut() noexcept { return ewma_; }
  /// Bytes of state per token (region + stamp + EWMA).
  static constexpr std::size_t bytes_per_token = 5;

  /// The fp16 bits a compact EWMA stores for `a` (saturated at half_max).
  [[nodiscard]] static std::uint16_t encode(float a) noexcept { return float_to_half_bits(std::min(a, half_max)); }

  // --- mutation --------------------------------------------------------------------------------------------------
  /// Moves the clock to `step` (throws input_error backwards), rebasing the epoch when step - epoch > max_span.
  void advance_to(step_t step) {
    if (step < now_)
      memdecay::detail::raise_input("clock goes backwards: advance_to(" + memdecay::detail::to_text(step) +
                                    ") at step " + memdecay::detail::to_text(now_));
    now_ = step;
    if (now_ - epoch_ <= max_span) return;
    const step_t next = now_ - max_age;
    const step_t shift = next - epoch_;
    const auto sh = static_cast<std::uint16_t>(std::min<step_t>(shift, max_span));
    for (auto& s : stamp_) s = s > sh ? static_cast<std::uint16_t>(s - sh) : std::uint16_t{0};
    epoch_ = next;
  }
  /// Appends fresh tokens (refreshed now, EWMA 0).
  void append(std::span<const region_id> labels) {
    region_.insert(region_.end(), labels.begin(), labels.end());
    stamp_.resize(region_.size(), static_cast<std::uint16_t>(now_ - epoch_));
    ewma_.resize(region_.size(), std::uint16_t{0});
  }

 private:
  geometry_type geometry_;
  std::vector<region_id> region_;
  std::vector<std::uint16_t> stamp_;
  std::vector<std::uint16_t> ewma_;
  step_t now_ = 0;
  step_t epoch_ = step_t{0} - max_age;
};

// --- per-isa loads and stores of the compact fields ---------------------------------------------------------------
namespace detail {

template <isa A>
struct compact_io;

template <>
struct compact_io<isa::scalar> {
  using P = packet<float, isa::scalar>;
  static MEMDECAY_SIMD_INLINE P::reg load_ewma(const std::uint16_t* p) noexcept { return half_bits_to_float(*p); }
  /// Stores fp16(min(a, half_max)) and returns the value stored.
  static MEMDECAY_SIMD_INLINE P::reg store_ewma(std::uint16_t* p, P::reg a) noexcept {
    *p = float_to_half_bits(P::min(a, half_max));
    return half_bits_to_float(*p);
  }
  static MEMDECAY_SIMD_INLINE P::reg age(const std::uint16_t* s, std::uint32_t span) noexcept {
    return static_cast<float>(std::min<std::uint32_t>(span - *s, compact_state<>::max_age));
  }
  static MEMDECAY_SIMD_INLINE void refresh(std::uint16_t* s, std::uint32_t span, P::mask hit) noexcept {
    if (hit) *s = static_cast<std::uint16_t>(span);
  }
};

#if defined(MEMDECAY_SIMD_ENABLE_AVX2) && defined(MEMDECAY_SIMD_ENABLE_F16C)
template <>
struct compact_io<isa::avx2> {
  using P = packet<float, isa::avx2>;
  static MEMDECAY_SIMD_INLINE P::reg load_ewma(const std::uint16_t* p) noexcept {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static MEMDECAY_SIMD_INLINE P::reg store_ewma(std::uint16_t* p, P::reg a) noexcept {
    const __m128i h = _mm256_cvtps_ph(_mm256_min_ps(a, _mm256_set1_ps(half_max)), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), h);
    return _mm256_cvtph_ps(h);
  }
  static MEMDECAY_SIMD_INLINE P::reg age(const std::uint16_t* s, std::uint32_t span) noexcept {
    const __m256i st = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s)));
    const __m256i d = _mm256_sub_epi32(_mm256_set1_epi32(static_cast<int>(span)), st);
    return _mm256_cvtepi32_ps(_mm256_min_epu32(d, _mm256_set1_epi32(static_cast<int>(compact_state<>::max_age))));
  }
  static MEMDECAY_SIMD_INLINE void refresh(std::uint16_t* s, std::uint32_t span, P::mask hit) noexcept {
    const __m256i m = _mm256_castps_si256(hit);
    const __m128i m16 = _mm_packs_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
    const __m128i old = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
    const __m128i now16 = _mm_set1_epi16(static_cast<short>(static_cast<std::uint16_t>(span)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(s), _mm_blendv_epi8(old, now16, m16));
  }
};
#endif

#if defined(MEMDECAY_SIMD_ENABLE_AVX512)
template <>
struct compact_io<isa::avx512> {
  using P = packet<float, isa::avx512>;
  static MEMDECAY_SIMD_INLINE P::reg load_ewma(const std::uint16_t* p) noexcept {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static MEMDECAY_SIMD_INLINE P::reg store_ewma(std::uint16_t* p, P::reg a) noexcept {
    const __m256i h = _mm512_cvtps_ph(_mm512_min_ps(a, _mm512_set1_ps(half_max)), _MM_FROUND_TO_NEAREST_INT);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), h);
    return _mm512_cvtph_ps(h);
  }
  static MEMDECAY_SIMD_INLINE P::reg age(const std::uint16_t* s, std::uint32_t span) noexcept {
    const __m512i st = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s)));
    const __m512i d = _mm512_sub_epi32(_mm512_set1_epi32(static_cast<int>(span)), st);
    return _mm512_cvtepi32_ps(_mm512_min_epu32(d, _mm512_set1_epi32(static_cast<int>(compact_state<>::max_age))));
  }
  static MEMDECAY_SIMD_INLINE void refresh(std::uint16_t* s, std::uint32_t span, P::mask hit) noexcept {
    const __m256i old = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s));
    const __m256i now16 = _mm256_set1_epi16(static_cast<short>(static_cast<std::uint16_t>(span)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(s), _mm256_mask_mov_epi16(old, hit, now16));
  }
};
#endif

template <isa A, bool Small>
struct compact_token {
  using P = packet<float, A>;
  using IO = compact_io<A>;
  using reg = typename P::reg;
  typename P::table base, rate;
  reg alpha, scale, beta, one_minus_beta, tau;
  std::uint32_t span;
  std::size_t refreshed = 0;

  compact_token(const region_lut<float>& lut, float alpha_value, std::uint32_t span_value,
                const observation_params<float>& obs) noexcept
      : base(P::make_table(lut.base())), rate(P::make_table(lut.neg_rate())), alpha(P::set1(alpha_value)),
        scale(P::set1(obs.scale)), beta(P::set1(obs.beta)), one_minus_beta(P::set1(1.0f - obs.beta)),
        tau(P::set1(obs.tau)), span(span_value) {}

  [[nodiscard]] MEMDECAY_SIMD_INLINE reg score(const region_id* r, const std::uint16_t* s, reg a) const noexcept {
    const reg decay = exp_bounded_above<P>(P::mul(P::template lookup<Small>(rate, r), IO::age(s, span)));
    return P::fma(alpha, a, P::mul(P::template lookup<Small>(base, r), decay));
  }
  [[nodiscard]] MEMDECAY_SIMD_INLINE reg score_only(const region_id* r, const std::uint16_t* s,
                                                    const std::uint16_t* e) const noexcept {
    return score(r, s, IO::load_ewma(e));
  }
  [[nodiscard]] MEMDECAY_SIMD_INLINE reg observe_score(const region_id* r, std::uint16_t* s, std::uint16_t* e,
                                                       const float* m) noexcept {
    const reg x = P::mul(scale, P::load(m));
    const reg a = P::add(P::mul(beta, IO::load_ewma(e)), P::mul(one_minus_beta, x));  // as the reference
    const auto hit = P::gt(x, tau);
    refreshed += P::popcount(hit);
    IO::refresh(s, span, hit);
    return score(r, s, IO::store_ewma(e, a));
  }
};

template <isa A, std::size_t PageSize, bool Small, bool Observe>
std::size_t compact_pass(compact_state<PageSize>& state, const float* mass, const observation_params<float>& obs,
                         const region_lut<float>& lut, float alpha, float* out) noexcept {
  using P = packet<float, A>;
  const region_id* r = state.regions().data();
  std::uint16_t* s = state.stamps_mut().data();
  std::uint16_t* e = state.ewma_bits_mut().data();
  const std::uint32_t span = state.now() - state.epoch();
  compact_token<A, Small> vec(lut, alpha, span, obs);
  compact_token<isa::scalar, false> one(lut, alpha, span, obs);
  page_loop<P, PageSize>(
      state.kv_len(), state.page_size(), out,
      [&](std::size_t i) {
        if constexpr (Observe) return vec.observe_score(r + i, s + i, e + i, mass + i);
        else return vec.score_only(r + i, s + i, e + i);
      },
      [&](std::size_t i) {
        if constexpr (Observe) return one.observe_score(r + i, s + i, e + i, mass + i);
        else return one.score_only(r + i, s + i, e + i);
      });
  return vec.refreshed + one.refreshed;
}

template <isa A, bool Observe, std::size_t PageSize>
std::size_t compact_dispatch(compact_state<PageSize>& state, const float* mass, const observation_params<float>& obs,
                             const region_lut<float>& lut, float alpha, float* out) noexcept {
  constexpr isa C = compact_isa(A);
  if (lut.size() <= packet<float, C>::table_lanes)
    return compact_pass<C, PageSize, true, Observe>(state, mass, obs, lut, alpha, out);
  return compact_pass<C, PageSize, false, Observe>(state, mass, obs, lut, alpha, out);
}

}  // namespace detail

/// Page scores of a compact state into `out` (num_pages() entries): the score of score_kernel.hpp with the
/// saturated age and the fp16 EWMA (error: see the top of this file and docs/simd.md).
template <isa A = native_isa, std::size_t PageSize>
void compact_page_scores(const compact_state<PageSize>& state, const region_lut<float>& lut, float alpha,
                         std::span<float> out) noexcept {
  // The score-only pass writes nothing to the state; the shared pass takes it mutable.
  detail::compact_dispatch<A, false>(const_cast<compact_state<PageSize>&>(state), nullptr,
                                     observation_params<float>{0.0f, 0.0f, 0.0f}, lut, alpha, out.data());
}

/// The fused pass on a compact state: applies one observation (`mass`: kv_len() validated entries) in float from
/// the decoded EWMA, stores it as fp16, refreshes the stamps of tokens above tau, and writes the page scores of
/// the updated state (bitwise those compact_page_scores() gives on it). Returns the refreshed count.
template <isa A = native_isa, std::size_t PageSize>
std::size_t compact_observe_and_score(compact_state<PageSize>& state, std::span<const float> mass,
                                      const observation_params<float>& obs, const region_lut<float>& lut,
                                      float alpha, std::span<float> out) noexcept {
  return detail::compact_dispatch<A, true>(state, mass.data(), obs, lut, alpha, out.data());
}

}  // namespace memdecay::simd
MEMDECAY_SIMD_END

#endif  // MEMDECAY_SIMD_COMPACT_STATE_HPP
