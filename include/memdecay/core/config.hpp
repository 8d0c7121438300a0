// SPDX-License-Identifier: Apache-2.0
// memdecay: the configuration of a sequence: score weights, EWMA, refresh threshold, page size, attention
// normalisation, protections, budget and regions.
//
// Configs are aggregates so that engines can write them with designated initializers:
//
//   memdecay::config cfg{.alpha = 4.0, .tau = 2.0, .page_size = 16,
//                        .normalization = memdecay::attention_normalization::uniform,
//                        .budget = memdecay::budget_config::tokens(4096, 3584),
//                        .region_overrides = {{.region = "plan", .pinned = true}}};
//
// validate() throws config_error naming the field and the value; every class that takes a config calls it on
// construction, so an invalid config never reaches the hot path.
#ifndef MEMDECAY_CORE_CONFIG_HPP
#define MEMDECAY_CORE_CONFIG_HPP

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "memdecay/detail/error.hpp"
#include "memdecay/core/region.hpp"

namespace memdecay {

/// How the attention mass of an observation is scaled before it enters the EWMA and the refresh test.
enum class attention_normalization : std::uint8_t {
  /// x_i = m_i, as in the paper. A token's share of one attention row is ~1/n, so with n in the thousands the
  /// alpha * a_i term is orders of magnitude below b_r and old unpinned facts are lost regardless of attention.
  none,
  /// x_i = m_i * n, n = resident tokens: 1.0 means "as much as uniform attention". Makes alpha and tau
  /// independent of context length (the fix the paper's authors name).
  uniform,
  /// x_i = m_i * n as in `uniform`, and the attention term uses the EWMA divided by the weight it has gathered
  /// over the token's lifetime in the cache: a_i / (1 - beta^k_i), k_i = observations since the token was
  /// appended (0 while k_i = 0). The divisor lies in [1 - beta, 1], so the term is bounded by the largest x_i
  /// seen. An exponentially weighted OpenVINO NORM_SUM: a token that arrived two observations ago is not
  /// ranked as if it had been ignored for the other 1/(1-beta). Helps when tool outputs arrive in bursts and
  /// must compete with older tokens right away. MemDecay policy only (memdecay::policies::memdecay).
  lifetime,
  /// x_i = (m_i - mean(m)) / std(m) over the resident tokens of one observation (0 for all when std = 0), so
  /// tau counts standard deviations above the mean (TriAttention's normalize_scores). Scale-free: the same tau
  /// works for peaky and flat heads and at any context length. The EWMA may go negative. MemDecay policy only.
  zscore,
};

[[nodiscard]] inline const char* to_string(attention_normalization mode) noexcept {
  switch (mode) {
    case attention_normalization::none: return "none";
    case attention_normalization::uniform: return "uniform";
    case attention_normalization::lifetime: return "lifetime";
    case attention_normalization::zscore: return "zscore";
  }
  return "?";
}

/// Pages that are never evicted regardless of their score. The partial last page is always protected: the next
/// token is written into it, and FlashInfer-style tables require every page but the last to be full.
struct protection_config {
  std::size_t sink_pages = 0;     ///< the first pages of the sequence (StreamingLLM's attention sinks)
  std::size_t recent_tokens = 0;  ///< every page holding one of the last `recent_tokens` resident tokens
  /// Also every page holding one of the last floor(recent_fraction x B) tokens, B the budget's upper watermark in
  /// tokens (H2O's recent ratio: a recent window that scales with the budget); 0 turns it off, and so does an
  /// unlimited budget. In [0, 1].
  double recent_fraction = 0.0;
};

/// The unit of a budget's watermarks.
enum class budget_unit : std::uint8_t {
  unlimited,  ///< never evict on budget (select(k) still works)
  tokens,     ///< resident tokens
  pages,      ///< resident pages
  ratio,      ///< a fraction in (0, 1] of the sequence's logical length (every token ever appended)
};

/// How much of a sequence may stay resident. When the resident size exceeds `high`, eviction removes pages until
/// it is at most `low` (default: `high`), so a gap between the two makes eviction run in batches instead of one
/// page per step.
struct budget_config {
  budget_unit unit = budget_unit::unlimited;
  double high = 0.0;            ///< upper watermark, in `unit`
  std::optional<double> low{};  ///< lower watermark, in `unit`; defaults to `high`

  static budget_config tokens(double high, std::optional<double> low = std::nullopt) {
    return {budget_unit::tokens, high, low};
  }
  static budget_config pages(double high, std::optional<double> low = std::nullopt) {
    return {budget_unit::pages, high, low};
  }
  static budget_config ratio(double high, std::optional<double> low = std::nullopt) {
    return {budget_unit::ratio, high, low};
  }

  /// The watermarks in tokens for a sequence whose logical length is `logical_len`.
  struct token_watermarks {
    std::uint64_t high;
    std::uint64_t low;
  };
  [[nodiscard]] token_watermarks in_tokens(std::size_t page_size, std::uint64_t logical_len) const noexcept {
    const double lo = low.value_or(high);
    // Saturating: a watermark of 2^64 tokens or more (tokens(1e300), pages(2^60)) never binds. A plain cast is
    // undefined there and gave 0 with g++, evicting everything (found by tests/fuzz; docs/reliability.md).
    constexpr std::uint64_t all = std::numeric_limits<std::uint64_t>::max();
    auto floor_tokens = [](double v) {
      const double f = std::floor(v);
      return f < 18446744073709551616.0 ? static_cast<std::uint64_t>(f) : all;
    };
    auto times_page = [page_size](std::uint64_t pages) { return pages > all / page_size ? all : pages * page_size; };
    switch (unit) {
      case budget_unit::unlimited: break;
      case budget_unit::tokens: return {floor_tokens(high), floor_tokens(lo)};
      case budget_unit::pages: return {times_page(floor_tokens(high)), times_page(floor_tokens(lo))};
      case budget_unit::ratio: {
        const double n = static_cast<double>(logical_len);
        return {floor_tokens(high * n), floor_tokens(lo * n)};
      }
    }
    return {std::numeric_limits<std::uint64_t>::max(), std::numeric_limits<std::uint64_t>::max()};
  }

  void validate() const {
    if (unit == budget_unit::unlimited) return;
    const double lo = low.value_or(high);
    auto field = [](const char* name, double v) { return std::string("budget.") + name + " = " + detail::to_text(v); };
    if (!std::isfinite(high) || high < 0.0) detail::raise_config(field("high", high) + " (must be finite and >= 0)");
    if (!std::isfinite(lo) || lo < 0.0) detail::raise_config(field("low", lo) + " (must be finite and >= 0)");
    if (lo > high) detail::raise_config(field("low", lo) + " is above budget.high = " + detail::to_text(high));
    if (unit == budget_unit::ratio && (high <= 0.0 || high > 1.0))
      detail::raise_config(field("high", high) + " (a ratio must be in (0, 1])");
    if ((unit == budget_unit::tokens || unit == budget_unit::pages) &&
        (high != std::floor(high) || lo != std::floor(lo)))
      detail::raise_config(field("high", high) + ", " + field("low", lo) +
                           " (token and page budgets are whole numbers)");
  }
};

/// The configuration of one MemDecay sequence. Score: s_i = b_r * exp(-lambda_r * dt_i) + alpha * a_i.
struct config {
  /// Weight of the attention EWMA in the score (>= 0). With `uniform` normalisation a_i = 1 means "attended as
  /// much as uniform attention", so alpha is the score bonus of such a token relative to b_r (b_r <= 1).
  double alpha = 1.0;
  /// EWMA factor per observation: a_i <- beta * a_i + (1 - beta) * x_i, beta in [0, 1).
  double ewma_beta = 0.9;
  /// If set, overrides ewma_beta with the half-life in observations: beta = 2^(-1 / half_life).
  std::optional<double> ewma_half_life{};
  /// Refresh threshold, in the units of the normalised mass x_i: a token with x_i > tau has its decay clock reset.
  /// (none: a raw share of the attention; uniform, lifetime: a multiple of uniform attention; zscore: standard
  /// deviations above the observation's mean.)
  double tau = 0.01;
  /// Tokens per page: a power of two (16 matches vLLM's and SGLang's defaults).
  std::size_t page_size = 16;
  attention_normalization normalization = attention_normalization::none;
  protection_config protection{};
  budget_config budget{};
  /// The region set. default_region_table() is the paper's seven; users may pass their own.
  region_table regions = default_region_table();
  /// Per-region changes by name, applied on top of `regions` (e.g. pin the plan, set a calibrated half-life).
  std::vector<region_override> region_overrides{};

  /// The EWMA factor in effect (from ewma_half_life when set).
  [[nodiscard]] double effective_beta() const noexcept {
    return ewma_half_life ? std::exp2(-1.0 / *ewma_half_life) : ewma_beta;
  }
  /// The region table with the overrides applied; throws config_error when an override is invalid.
  [[nodiscard]] region_table effective_regions() const { return regions.with_overrides(region_overrides); }

  /// The protections in effect for a sequence of `logical_len` tokens: recent_tokens widened to the budget's
  /// recent_fraction share.
  [[nodiscard]] protection_config effective_protection(std::size_t page, std::uint64_t logical_len) const noexcept {
    protection_config p = protection;
    if (p.recent_fraction > 0.0 && budget.unit != budget_unit::unlimited) {
      const double share =
          std::floor(p.recent_fraction * static_cast<double>(budget.in_tokens(page, logical_len).high));
      const std::size_t tokens = share >= 1e18 ? std::size_t{1} << 60 : static_cast<std::size_t>(share);
      if (tokens > p.recent_tokens) p.recent_tokens = tokens;
    }
    return p;
  }

  /// Throws config_error naming the first invalid field and its value.
  void validate() const {
    auto bad = [](const char* name, double v, const char* why) {
      detail::raise_config(std::string(name) + " = " + detail::to_text(v) + " (" + why + ")");
    };
    if (!std::isfinite(alpha) || alpha < 0.0) bad("alpha", alpha, "must be finite and >= 0");
    if (!(ewma_beta >= 0.0 && ewma_beta < 1.0)) bad("ewma_beta", ewma_beta, "must be in [0, 1)");
    if (ewma_half_life && (!std::isfinite(*ewma_half_life) || *ewma_half_life <= 0.0))
      bad("ewma_half_life", *ewma_half_life, "must be finite and > 0 observations");
    if (!std::isfinite(tau) || tau < 0.0) bad("tau", tau, "must be finite and >= 0");
    if (page_size == 0 || !std::has_single_bit(page_size) || page_size > (std::size_t{1} << 20))
      bad("page_size", static_cast<double>(page_size), "must be a power of two in [1, 2^20]");
    if (!(protection.recent_fraction >= 0.0 && protection.recent_fraction <= 1.0))
      bad("protection.recent_fraction", protection.recent_fraction, "must be in [0, 1]");
    if (normalization > attention_normalization::zscore)
      bad("normalization", static_cast<double>(normalization), "unknown mode");
    budget.validate();
    regions.validate();
    (void)effective_regions();
  }
};

}  // namespace memdecay

#endif  // MEMDECAY_CORE_CONFIG_HPP
