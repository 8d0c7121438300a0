// SPDX-License-Identifier: Apache-2.0
// memdecay: calibration: per-region attention half-lives estimated from agent traces (trace.hpp), and the
// calibrated region parameters that replace the default decay rates.
//
//   namespace cal = memdecay::calibration;
//   auto traces = std::vector{memdecay::trace::read_file("tier-450.mdtrace")};
//   cal::calibration c = cal::estimate(traces);       // per region (and per layer): half-life, 95% interval, samples
//   memdecay::region_table t = c.apply(memdecay::default_region_table());  // uncalibrated regions keep defaults
//   memdecay::config cfg;  c.apply_to(cfg);            // normalisation, alpha, tau and the region overrides
//
// calibration_file.hpp reads and writes the versioned JSON file; docs/calibration.md explains the estimator.
//
// Two estimators (estimator_options::method; docs/calibration.md has the reasons and the measured bias and coverage):
//   refresh_intervals (the default): per token, the intervals between refreshes (mass >= refresh_threshold in
//     uniform units), from the first row it is seen below rearm_threshold to its next refresh, fitted as exponential
//     by maximum likelihood truncated at the episode's last row (calibration_intervals.hpp). Sparse rows bound their
//     absent entries by the row's smallest recorded one (never a refresh, never zeros).
//   excess_decay: the fading of mean excess attention with age, below; it needs dense rows (input_error otherwise).
//
// The excess-decay estimator, in short. Every attention row is put in uniform units
// (x_j = m_j * context: 1.0 is "as much as uniform attention"). Each token's age is the steps since its last
// refresh: its arrival, or a re-reference, detected as a row where the token's mass exceeds `refresh_ratio`
// times what the current fit predicts for it. The sink positions and the newest `recent_positions` tokens of
// every row are left out (attention there is about position, not region). Rows are rescaled by a per-row factor
// (the median over the row of observed / predicted mass) so that query and re-read bursts, which take a share of
// the row away from every other token, and the context's changing make-up do not leak into the decay curve.
// The samples are averaged per age bin, and the curve
//
//     E[x | age a] = floor + amplitude * exp(-lambda * a)
//
// is fitted per region by weighted least squares (variable projection: for each lambda, floor and amplitude are
// a linear weighted least-squares problem; lambda minimises the profiled residual). The floor is the long-range
// level the excess decays to, fitted jointly rather than read off the tail, because long-lived regions never reach
// it within an episode. The passes alternate (fit, then re-detect refreshes and rescale rows with the new fit).
// The 95% confidence interval is a delete-one-group jackknife over groups of whole episodes (samples within an
// episode are correlated) on log half-life, with Student's t. A region is calibrated only with enough samples,
// enough episodes, a decay inside [min_half_life, max_half_life] and a bounded, narrow enough interval; otherwise
// it is reported uncalibrated, with the reason, and keeps its default decay rate.
#ifndef MEMDECAY_CALIBRATION_CALIBRATION_HPP
#define MEMDECAY_CALIBRATION_CALIBRATION_HPP

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numbers>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "memdecay/calibration/intervals.hpp"
#include "memdecay/core/config.hpp"
#include "memdecay/detail/error.hpp"
#include "memdecay/core/region.hpp"
#include "memdecay/io/trace.hpp"

namespace memdecay::calibration {

/// The calibration file format version this header writes and reads (calibration_file.hpp).
inline constexpr int format_version = 1;

/// Whether a region (or a layer of it) has a fitted half-life.
enum class fit_status : std::uint8_t {
  calibrated,    ///< fitted; the decay rate comes from the traces
  uncalibrated,  ///< too little or too noisy data: the default decay rate is kept, `reason` says why
};

[[nodiscard]] inline const char* to_string(fit_status s) noexcept {
  return s == fit_status::calibrated ? "calibrated" : "uncalibrated";
}

/// A closed interval of half-lives, in steps.
struct interval {
  double lower = 0.0;
  double upper = 0.0;
  friend bool operator==(const interval&, const interval&) = default;
};

/// One fitted decay curve: a region over every layer (the layer mean), or one layer of a region.
/// The curve is E[x | age] = floor + amplitude * 2^(-age / half_life), x in the scaled uniform units above.
struct curve_fit {
  fit_status status = fit_status::uncalibrated;
  std::string reason;                    ///< why uncalibrated (empty when calibrated)
  std::optional<double> half_life;       ///< steps; always set when calibrated, may be set (unreliable) otherwise
  std::optional<interval> half_life_ci;  ///< 95% interval; always set when calibrated
  std::optional<double> floor;           ///< fitted long-range level (set whenever half_life is)
  std::optional<double> amplitude;       ///< fitted excess at age 0 (set whenever half_life is)
  std::uint64_t samples = 0;             ///< (token, observation) samples in the fit
  std::uint64_t episodes = 0;            ///< episodes that contributed samples
  friend bool operator==(const curve_fit&, const curve_fit&) = default;
};

/// The calibration of one region.
struct region_calibration {
  std::string name;
  double base_priority = 1.0;     ///< b_r to use (the base table's; calibration does not fit it)
  double decay_rate = 0.0;        ///< lambda_r to use: fitted when calibrated, else the base table's default
  curve_fit fit;                  ///< the fit over the layer mean
  std::vector<curve_fit> layers;  ///< one per layer, when the traces carry more than one layer
  friend bool operator==(const region_calibration&, const region_calibration&) = default;

  [[nodiscard]] bool calibrated() const noexcept { return fit.status == fit_status::calibrated; }
  [[nodiscard]] double half_life() const noexcept { return half_life_from_decay_rate(decay_rate); }
};

/// A trace file the calibration was estimated from.
struct trace_source {
  std::string path;  ///< as given (empty for in-memory traces)
  std::string label;
  std::uint64_t episodes = 0;
  std::uint32_t layers = 1;
  friend bool operator==(const trace_source&, const trace_source&) = default;
};

/// Where a calibration came from.
struct provenance {
  std::string tool;                  ///< e.g. "memdecay-calibrate 0.1.0"
  std::string created;               ///< ISO 8601 UTC, e.g. "2026-11-29T08:30:00Z" (empty if unknown)
  std::optional<std::string> model;  ///< the model the traces were recorded from, if known
  bool synthetic = false;            ///< the traces' attention is synthetic (the generator's)
  std::vector<trace_source> traces;
  friend bool operator==(const provenance&, const provenance&) = default;
};

/// Which quantity the half-life is fitted to (docs/calibration.md, "Two estimators").
enum class estimator_method : std::uint8_t {
  /// The default: per token, the intervals between its refreshes (mass at or above `refresh_threshold`), fitted as
  /// exponential by maximum likelihood under the episode-end truncation (calibration_intervals.hpp). This is the
  /// quantity MemDecay's clock models: how long after its last refresh a token is needed again.
  refresh_intervals,
  /// The decay of mean excess attention with age since the last refresh (weighted least squares on binned means).
  /// On real models attention fades within a few steps of any reference, so this measures that fading, not how
  /// long a region stays needed; kept for comparison and for the synthetic generator, whose h_r is a fade.
  excess_decay,
  /// Per token, the intervals between the workload's own references of it (trace reference events, format version
  /// 2: the engine or orchestrator logs that a span was re-read, quoted or reopened), with its arrival as the first
  /// reference, fitted by the same truncated, step-censored exponential likelihood as refresh_intervals. No
  /// attention is read, so no spike of the model's can pass for a need; it needs traces that carry references.
  references,
};

/// The method's name in calibration files and on the command line.
[[nodiscard]] inline const char* to_string(estimator_method m) noexcept {
  switch (m) {
    case estimator_method::excess_decay: return "wls-excess-decay-jackknife";
    case estimator_method::references: return "reference-interval-mle-jackknife";
    case estimator_method::refresh_intervals: break;
  }
  return "refresh-interval-mle-jackknife";
}
/// The method called `name` (its file name, or the short names `decay` and `intervals`), if there is one.
[[nodiscard]] inline std::optional<estimator_method> estimator_method_from_string(std::string_view name) noexcept {
  if (name == "wls-excess-decay-jackknife" || name == "decay") return estimator_method::excess_decay;
  if (name == "refresh-interval-mle-jackknife" || name == "intervals") return estimator_method::refresh_intervals;
  if (name == "reference-interval-mle-jackknife" || name == "references") return estimator_method::references;
  return std::nullopt;
}

/// How the half-lives were estimated (recorded in the file so results can be reproduced).
struct estimator_options {
  estimator_method method = estimator_method::refresh_intervals;  ///< which estimator (the rest says which options)
  // refresh_intervals only:
  double refresh_threshold = 32.0;   ///< a row with the token's mass x >= this (uniform units) is a refresh
  double rearm_threshold = 8.0;      ///< a token is armed for its next refresh once seen below this (<= threshold)
  std::uint64_t min_intervals = 50;  ///< fewer completed intervals: uncalibrated
  // excess_decay (and, where said, both):
  std::uint64_t min_samples = 2000;     ///< fewer samples: uncalibrated
  std::uint32_t min_episodes = 4;       ///< fewer contributing episodes: uncalibrated (the interval needs groups)
  double max_ci_ratio = 2.0;            ///< interval upper / lower above this: uncalibrated (too noisy)
  double refresh_ratio = 2.5;           ///< observed > refresh_ratio x predicted mass: a re-reference (age restarts)
  std::uint32_t sink_positions = 4;     ///< both: the first positions of every row are left out (attention sinks)
  std::uint32_t recent_positions = 32;  ///< both: the newest positions of every row are left out (locality)
  double min_half_life = 1.0;           ///< both: the fit searches half-lives in [min, max] steps ...
  double max_half_life = 100000.0;      ///< ... and one at either end is "no decay measured" (uncalibrated)
  std::uint32_t passes = 16;            ///< fit / re-detect / rescale passes (the first predicts a flat line)
  std::uint32_t jackknife_groups = 20;  ///< both: episode groups for the interval (fewer with fewer episodes)
  std::uint32_t max_age_bins = 1024;    ///< ages are averaged in bins of ceil((last step + 1) / max_age_bins) steps
  bool per_layer = true;                ///< also fit every layer when the traces carry more than one
  friend bool operator==(const estimator_options&, const estimator_options&) = default;

  /// The first out-of-range option, named with its value; nothing when every option is valid.
  [[nodiscard]] std::optional<std::string> check() const {
    using memdecay::detail::to_text;
    if (min_episodes < 2) return "min_episodes = " + to_text(min_episodes) + " (at least 2: the interval needs groups)";
    if (!(max_ci_ratio > 1.0) || !std::isfinite(max_ci_ratio))
      return "max_ci_ratio = " + to_text(max_ci_ratio) + " (must be finite and > 1)";
    if (method != estimator_method::excess_decay && method != estimator_method::refresh_intervals &&
        method != estimator_method::references)
      return "method = " + to_text(static_cast<int>(method)) + " (unknown estimator)";
    if (!(refresh_threshold > 0.0) || !std::isfinite(refresh_threshold))
      return "refresh_threshold = " + to_text(refresh_threshold) + " (must be finite and > 0)";
    if (!(rearm_threshold > 0.0) || !(rearm_threshold <= refresh_threshold))
      return "rearm_threshold = " + to_text(rearm_threshold) +
             " (must be > 0 and <= refresh_threshold = " + to_text(refresh_threshold) + ")";
    if (min_intervals < 2) return "min_intervals = " + to_text(min_intervals) + " (at least 2)";
    if (!(refresh_ratio > 1.0) || !std::isfinite(refresh_ratio))
      return "refresh_ratio = " + to_text(refresh_ratio) + " (must be finite and > 1)";
    if (!(min_half_life > 0.0) || !std::isfinite(min_half_life) || !(max_half_life > min_half_life * 4.0) ||
        !std::isfinite(max_half_life))
      return "half-life search range [" + to_text(min_half_life) + ", " + to_text(max_half_life) +
             "] (must be finite, > 0, and max > 4 x min)";
    if (passes == 0 || passes > 64) return "passes = " + to_text(passes) + " (must be in [1, 64])";
    if (jackknife_groups < 2 || jackknife_groups > 1000)
      return "jackknife_groups = " + to_text(jackknife_groups) + " (must be in [2, 1000])";
    if (max_age_bins < 8 || max_age_bins > (1u << 20))
      return "max_age_bins = " + to_text(max_age_bins) + " (must be in [8, 2^20])";
    return std::nullopt;
  }
  /// Throws config_error naming the field when an option is out of range.
  void validate() const {
    if (auto e = check()) memdecay::detail::raise_config("calibration estimator: " + *e);
  }
};

/// A calibration: the runtime settings it was made for, the per-region results, the provenance and the
/// estimator's options. calibration_file.hpp reads and writes it as JSON.
struct calibration {
  attention_normalization normalization = attention_normalization::uniform;  ///< the mode alpha and tau are for
  double alpha = 1.0;  ///< recorded for the runtime config (not fitted)
  double tau = 2.0;    ///< recorded for the runtime config (not fitted)
  std::vector<region_calibration> regions;
  provenance source;
  estimator_options estimator;
  friend bool operator==(const calibration&, const calibration&) = default;

  /// The region called `name`, if there is one.
  [[nodiscard]] const region_calibration* find(std::string_view name) const noexcept {
    for (const auto& r : regions)
      if (r.name == name) return &r;
    return nullptr;
  }

  /// The changes this calibration makes to a region table, by name: every region's base priority, and the fitted
  /// decay rate of every calibrated region (uncalibrated regions keep the table's decay rate).
  [[nodiscard]] std::vector<region_override> overrides() const {
    std::vector<region_override> out;
    for (const auto& r : regions) {
      region_override o{.region = r.name, .base_priority = r.base_priority};
      if (r.calibrated()) o.decay_rate = r.decay_rate;
      out.push_back(std::move(o));
    }
    return out;
  }

  /// `table` with overrides() applied; config_error when a calibrated region is not in the table.
  [[nodiscard]] region_table apply(const region_table& table) const {
    for (const auto& r : regions)
      if (!table.find(r.name))
        memdecay::detail::raise_config("calibration region '" + r.name + "' is not in the region table");
    return table.with_overrides(overrides());
  }

  /// Sets cfg's normalisation, alpha and tau to the calibration's and appends overrides() to its region overrides
  /// (after any already there, so the calibration wins). config_error (cfg unchanged) when a region is unknown.
  void apply_to(config& cfg) const {
    config next = cfg;
    next.normalization = normalization;
    next.alpha = alpha;
    next.tau = tau;
    for (auto& o : overrides()) next.region_overrides.push_back(std::move(o));
    (void)apply(next.regions);
    next.validate();
    cfg = std::move(next);
  }

  /// The first inconsistency (naming the region and field, and the value); nothing when the calibration is valid.
  /// What the file loader checks after parsing (calibration_file.hpp). Never throws.
  [[nodiscard]] std::optional<std::string> check() const;
  /// Throws config_error with check()'s message.
  void validate() const {
    if (auto e = check()) memdecay::detail::raise_config("calibration: " + *e);
  }
};

/// The normalisation mode called `name` (as memdecay::to_string spells it), if there is one.
[[nodiscard]] inline std::optional<attention_normalization> normalization_from_string(std::string_view name) noexcept {
  for (int i = 0; i < 256; ++i) {
    const auto mode = static_cast<attention_normalization>(i);
    const std::string_view text = memdecay::to_string(mode);
    if (text == "?") break;
    if (text == name) return mode;
  }
  return std::nullopt;
}
/// Every normalisation mode's name, space-separated (for messages).
[[nodiscard]] inline std::string normalization_names() {
  std::string out;
  for (int i = 0; i < 256; ++i) {
    const std::string_view text = memdecay::to_string(static_cast<attention_normalization>(i));
    if (text == "?") break;
    out += (out.empty() ? "" : " ") + std::string(text);
  }
  return out;
}

namespace detail {

using memdecay::detail::to_text;

// Two-sided 97.5% quantile of Student's t with `df` degrees of freedom (df >= 1).
[[nodiscard]] inline double t975(std::size_t df) noexcept {
  static constexpr std::array<double, 30> table{12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
                                                2.201,  2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
                                                2.080,  2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042};
  if (df == 0) return std::numeric_limits<double>::infinity();
  if (df <= table.size()) return table[df - 1];
  const double z = 1.959963984540054, n = static_cast<double>(df);
  return z + (z * z * z + z) / (4.0 * n) + (5.0 * std::pow(z, 5) + 16.0 * z * z * z + 3.0 * z) / (96.0 * n * n);
}

/// The 95% interval of a fitted half-life from its delete-one-group jackknife replicates (log half-lives), with
/// Student's t, into out.half_life_ci; the reason to refuse the fit when there are too few groups or the interval
/// is wider than `max_ci_ratio`. Both estimators share it.
[[nodiscard]] inline std::optional<std::string> set_jackknife_interval(curve_fit& out,
                                                                       const std::vector<double>& leave_out,
                                                                       double max_ci_ratio) {
  const std::size_t k = leave_out.size();
  if (k < 2) return "too few episode groups for an interval (" + to_text(k) + ")";
  double mean = 0;
  for (double v : leave_out) mean += v;
  mean /= static_cast<double>(k);
  double ss = 0;
  for (double v : leave_out) ss += (v - mean) * (v - mean);
  const double se = std::sqrt(ss * static_cast<double>(k - 1) / static_cast<double>(k));
  const double centre = std::log(*out.half_life), half = t975(k - 1) * se;
  out.half_life_ci = interval{std::exp(centre - half), std::exp(centre + half)};
  if (!std::isfinite(out.half_life_ci->upper) || out.half_life_ci->upper / out.half_life_ci->lower > max_ci_ratio)
    return "too noisy: 95% interval [" + to_text(out.half_life_ci->lower) + ", " + to_text(out.half_life_ci->upper) +
           "] is wider than a factor " + to_text(max_ci_ratio);
  return std::nullopt;
}

// Sums of one age bin.
struct bin {
  double n = 0, age = 0, y = 0;
};

// Bins of one (channel, region): per jackknife group, per age bin.
struct curve_data {
  std::vector<std::vector<bin>> groups;    // [group][age bin]
  std::vector<std::uint8_t> episode_seen;  // per episode (global index): contributed samples
  std::uint64_t samples = 0;
};

struct curve {
  double floor = 0, amplitude = 0, lambda = 0;
  bool valid = false;
  [[nodiscard]] double at(double age) const noexcept { return floor + amplitude * std::exp(-lambda * age); }
};

struct merged_bin {
  double n, age, mean;
};

// Merges the groups (all, or all but `skip`) into per-bin means.
[[nodiscard]] inline std::vector<merged_bin> merge(const curve_data& d, std::size_t skip) {
  std::size_t bins = 0;
  for (const auto& g : d.groups) bins = std::max(bins, g.size());
  std::vector<bin> sum(bins);
  for (std::size_t k = 0; k < d.groups.size(); ++k) {
    if (k == skip) continue;
    for (std::size_t b = 0; b < d.groups[k].size(); ++b) {
      sum[b].n += d.groups[k][b].n;
      sum[b].age += d.groups[k][b].age;
      sum[b].y += d.groups[k][b].y;
    }
  }
  std::vector<merged_bin> out;
  for (const auto& s : sum)
    if (s.n > 0) out.push_back({s.n, s.age / s.n, s.y / s.n});
  return out;
}

// For a fixed lambda: the weighted least-squares floor and amplitude, and the residual sum of squares.
// Weights n / mean^2: the noise is multiplicative, so every bin counts by its relative error.
struct profile {
  double floor, amplitude, rss;
  bool ok;
};
[[nodiscard]] inline profile fit_linear(const std::vector<merged_bin>& bins, double lambda) noexcept {
  double sw = 0, se = 0, see = 0, sy = 0, sey = 0;
  for (const auto& b : bins) {
    const double w = b.n / std::max(b.mean * b.mean, 1e-12);
    const double e = std::exp(-lambda * b.age);
    sw += w;
    se += w * e;
    see += w * e * e;
    sy += w * b.mean;
    sey += w * e * b.mean;
  }
  const double det = sw * see - se * se;
  if (!(det > 1e-12 * sw * see) || !std::isfinite(det)) return {0, 0, std::numeric_limits<double>::infinity(), false};
  const double amplitude = (sw * sey - se * sy) / det;
  const double floor = (sy - amplitude * se) / sw;
  double rss = 0;
  for (const auto& b : bins) {
    const double w = b.n / std::max(b.mean * b.mean, 1e-12);
    const double r = b.mean - floor - amplitude * std::exp(-lambda * b.age);
    rss += w * r * r;
  }
  return {floor, amplitude, rss, std::isfinite(rss)};
}

enum class fit_outcome { ok, too_few_bins, at_min, at_max, no_decay };

// Variable projection over log(half-life): a geometric grid, then golden-section refinement around the best point.
[[nodiscard]] inline std::pair<curve, fit_outcome> fit_curve(const std::vector<merged_bin>& bins,
                                                             const estimator_options& o) {
  if (bins.size() < 4) {  // still a level to predict with: the weighted mean
    double n = 0, y = 0;
    for (const auto& b : bins) {
      n += b.n;
      y += b.n * b.mean;
    }
    return {{n > 0 ? y / n : 0.0, 0.0, 0.0, n > 0}, fit_outcome::too_few_bins};
  }
  const double lo = std::log(o.min_half_life), hi = std::log(o.max_half_life);
  auto rss_at = [&](double log_h) { return fit_linear(bins, std::numbers::ln2 / std::exp(log_h)).rss; };
  constexpr int grid = 160;
  int best = 0;
  double best_rss = std::numeric_limits<double>::infinity();
  for (int i = 0; i <= grid; ++i) {
    const double r = rss_at(lo + (hi - lo) * i / grid);
    if (r < best_rss) {
      best_rss = r;
      best = i;
    }
  }
  if (!std::isfinite(best_rss)) return {{}, fit_outcome::too_few_bins};
  if (best == 0 || best == grid) {  // no decay inside the range: the boundary curve still predicts the level
    const double lambda = std::numbers::ln2 / std::exp(best == 0 ? lo : hi);
    const auto p = fit_linear(bins, lambda);
    return {{p.floor, p.amplitude, lambda, p.ok}, best == 0 ? fit_outcome::at_min : fit_outcome::at_max};
  }
  double a = lo + (hi - lo) * (best - 1) / grid, b = lo + (hi - lo) * (best + 1) / grid;
  const double g = (std::sqrt(5.0) - 1.0) / 2.0;
  double c = b - g * (b - a), d = a + g * (b - a);
  double fc = rss_at(c), fd = rss_at(d);
  for (int it = 0; it < 60 && b - a > 1e-9; ++it) {
    if (fc < fd) {
      b = d;
      d = c;
      fd = fc;
      c = b - g * (b - a);
      fc = rss_at(c);
    } else {
      a = c;
      c = d;
      fc = fd;
      d = a + g * (b - a);
      fd = rss_at(d);
    }
  }
  const double lambda = std::numbers::ln2 / std::exp((a + b) / 2.0);
  const auto p = fit_linear(bins, lambda);
  if (!p.ok) return {{}, fit_outcome::too_few_bins};
  return {{p.floor, p.amplitude, lambda, true}, p.amplitude > 0.0 ? fit_outcome::ok : fit_outcome::no_decay};
}

inline std::string outcome_text(fit_outcome f, const estimator_options& o) {
  switch (f) {
    case fit_outcome::ok: return {};
    case fit_outcome::too_few_bins: return "too few distinct ages to fit a curve";
    case fit_outcome::at_min:
      return "decays faster than the search range (half-life below " + to_text(o.min_half_life) + " steps)";
    case fit_outcome::at_max:
      return "no decay measured (half-life beyond " + to_text(o.max_half_life) +
             " steps or longer than the traces show)";
    case fit_outcome::no_decay: return "no excess attention that decays with age";
  }
  return {};
}

// The full fit, the jackknife interval and the calibrated/uncalibrated decision for one (channel, region).
[[nodiscard]] inline std::pair<curve_fit, curve> finish(const curve_data& d, const estimator_options& o,
                                                        bool final_pass = true) {
  curve_fit out;
  out.samples = d.samples;
  out.episodes = static_cast<std::uint64_t>(std::count(d.episode_seen.begin(), d.episode_seen.end(), std::uint8_t{1}));
  // Not a structured binding: the lambda below captures `full` (clang before 16 cannot capture bindings).
  const auto fitted = fit_curve(merge(d, std::numeric_limits<std::size_t>::max()), o);
  const curve full = fitted.first;
  const fit_outcome outcome = fitted.second;
  if (full.valid && outcome == fit_outcome::ok) {
    out.half_life = std::numbers::ln2 / full.lambda;
    out.floor = full.floor;
    out.amplitude = full.amplitude;
  }
  auto refuse = [&](std::string why) {
    out.status = fit_status::uncalibrated;
    out.reason = std::move(why);
    out.half_life_ci.reset();
    return std::pair{out, full};
  };
  if (out.samples < o.min_samples)
    return refuse("too few samples (" + to_text(out.samples) + ", the minimum is " + to_text(o.min_samples) + ")");
  if (out.episodes < o.min_episodes)
    return refuse("too few episodes (" + to_text(out.episodes) + ", the minimum is " + to_text(o.min_episodes) + ")");
  if (outcome != fit_outcome::ok) return refuse(outcome_text(outcome, o));
  if (!final_pass) return {out, full};  // intermediate passes need the curve only
  // Delete-one-group jackknife on log half-life over the groups that hold samples.
  std::vector<double> leave_out;
  for (std::size_t k = 0; k < d.groups.size(); ++k) {
    bool any = false;
    for (const auto& b : d.groups[k]) any = any || b.n > 0;
    if (!any) continue;
    auto [c, why] = fit_curve(merge(d, k), o);
    if (why != fit_outcome::ok)
      return refuse("unstable: leaving out episode group " + to_text(k) + " gives: " + outcome_text(why, o));
    leave_out.push_back(std::log(std::numbers::ln2 / c.lambda));
  }
  if (auto why = set_jackknife_interval(out, leave_out, o.max_ci_ratio)) return refuse(std::move(*why));
  out.status = fit_status::calibrated;
  return {out, full};
}

// ---- The refresh-interval estimator (estimator_method::refresh_intervals; calibration_intervals.hpp) ----

// Bounds on every position's mass in uniform units (x = m * context) for one channel (0: the layer mean; 1 + l:
// layer l). Dense rows are exact (lo == hi). A sparse row that lists k < context positions says nothing exact about
// the others: an engine that stores its top-k entries drops real mass, so an absent entry is only known to lie in
// [0, the row's smallest recorded entry] (an empty sparse row bounds nothing). Reading it as 0 would turn every old
// token into a zero sample and every absent step into "not attended" (the reported failure: one region
// "calibrated" at 5 steps, the others dropped, no warning).
inline void row_bounds(const trace::attention& a, std::size_t channel, std::vector<double>& lo,
                       std::vector<double>& hi) {
  const std::size_t n = a.context;
  lo.assign(n, 0.0);
  hi.assign(n, 0.0);
  double absent = 0.0;  // added to hi of every position a sparse row leaves out
  const std::size_t first = channel == 0 ? 0 : channel - 1, last = channel == 0 ? a.layers.size() : channel;
  const double w = (channel == 0 ? 1.0 / static_cast<double>(a.layers.size()) : 1.0) * static_cast<double>(n);
  for (std::size_t l = first; l < last; ++l) {
    const auto& row = a.layers[l];
    if (!row.sparse) {
      for (std::size_t j = 0; j < n; ++j) lo[j] += w * row.mass[j];
      continue;
    }
    const bool partial = row.positions.size() < n;
    double smallest = std::numeric_limits<double>::infinity();
    for (float m : row.mass) smallest = std::min(smallest, static_cast<double>(m));
    const double bound = partial ? w * smallest : 0.0;  // infinite for an empty row: nothing is known
    absent += bound;
    for (std::size_t k = 0; k < row.positions.size(); ++k) {
      lo[row.positions[k]] += w * row.mass[k];
      hi[row.positions[k]] -= bound;  // listed: exact, undo the absent bound added below (bound finite: k > 0)
    }
  }
  for (std::size_t j = 0; j < n; ++j) hi[j] += lo[j] + absent;
}

// The completed intervals of one fit (a region, or a (channel, region) of the refresh-interval estimator).
struct interval_data {
  std::vector<std::vector<intervals::sample>> groups;  // [group]
  std::vector<std::uint8_t> episode_seen;              // per episode: contributed an interval
  std::uint64_t samples = 0;

  interval_data(std::size_t group_count, std::size_t episodes) : groups(group_count), episode_seen(episodes, 0) {}
  void add(std::size_t group, std::size_t episode, const intervals::sample& s) {
    groups[group].push_back(s);
    ++samples;
    episode_seen[episode] = 1;
  }
};

// What the interval estimators call the events that end an interval.
inline std::string interval_noun(const estimator_options& o) {
  return o.method == estimator_method::references ? "reference" : "refresh";
}

inline std::string rate_outcome_text(intervals::rate_outcome f, const estimator_options& o) {
  switch (f) {
    case intervals::rate_outcome::ok: return {};
    case intervals::rate_outcome::too_few: return "no completed " + interval_noun(o) + " intervals";
    case intervals::rate_outcome::at_min_half_life:
      return "refreshes faster than the search range (half-life below " + to_text(o.min_half_life) + " steps)";
    case intervals::rate_outcome::at_max_half_life:
      return "no decay measured (" + interval_noun(o) +
             " intervals no shorter than a spread over the episodes' remaining steps: half-life beyond " +
             to_text(o.max_half_life) + " steps)";
  }
  return {};
}

// The rate fit, the jackknife interval and the calibrated/uncalibrated decision for one (channel, region).
[[nodiscard]] inline curve_fit finish_intervals(const interval_data& d, const estimator_options& o) {
  curve_fit out;
  out.samples = d.samples;
  out.episodes = static_cast<std::uint64_t>(std::count(d.episode_seen.begin(), d.episode_seen.end(), std::uint8_t{1}));
  const auto none = std::numeric_limits<std::size_t>::max();
  const auto full = intervals::fit_rate(d.groups, none, o.min_half_life, o.max_half_life);
  if (full.outcome == intervals::rate_outcome::ok) out.half_life = std::numbers::ln2 / full.lambda;
  auto refuse = [&](std::string why) {
    out.status = fit_status::uncalibrated;
    out.reason = std::move(why);
    out.half_life_ci.reset();
    return out;
  };
  if (out.samples < o.min_intervals)
    return refuse("too few " + interval_noun(o) + " intervals (" + to_text(out.samples) + ", the minimum is " +
                  to_text(o.min_intervals) + ")");
  if (out.episodes < o.min_episodes)
    return refuse("too few episodes (" + to_text(out.episodes) + ", the minimum is " + to_text(o.min_episodes) + ")");
  if (full.outcome != intervals::rate_outcome::ok) return refuse(rate_outcome_text(full.outcome, o));
  // Delete-one-group jackknife on log half-life over the groups that hold intervals (as the excess-decay fit).
  std::vector<double> leave_out;
  for (std::size_t k = 0; k < d.groups.size(); ++k) {
    if (d.groups[k].empty()) continue;
    const auto f = intervals::fit_rate(d.groups, k, o.min_half_life, o.max_half_life);
    if (f.outcome != intervals::rate_outcome::ok)
      return refuse("unstable: leaving out episode group " + to_text(k) + " gives: " + rate_outcome_text(f.outcome, o));
    leave_out.push_back(std::log(std::numbers::ln2 / f.lambda));
  }
  if (auto why = set_jackknife_interval(out, leave_out, o.max_ci_ratio)) return refuse(std::move(*why));
  out.status = fit_status::calibrated;
  return out;
}

// finish_intervals of every fit, in order.
[[nodiscard]] inline std::vector<curve_fit> finish_all_intervals(const std::vector<interval_data>& data,
                                                                 const estimator_options& o) {
  std::vector<curve_fit> fits;
  fits.reserve(data.size());
  for (const auto& d : data) fits.push_back(finish_intervals(d, o));
  return fits;
}

// Every (channel, region) fit of the refresh-interval estimator: one streaming pass over the rows.
[[nodiscard]] inline std::vector<curve_fit> estimate_intervals(std::span<const trace::trace_file> traces,
                                                               const estimator_options& o, std::size_t channels,
                                                               std::size_t regions, std::size_t groups,
                                                               std::size_t total_episodes) {
  std::vector<interval_data> data(channels * regions, interval_data(groups, total_episodes));
  struct pending {
    std::size_t slot;  // channel * regions + region
    double start, prev, end;
  };
  std::vector<double> lo, hi;
  std::size_t episode_index = 0;
  for (const auto& f : traces) {
    for (const auto& ep : f.episodes) {
      const std::size_t group = episode_index % groups;
      std::vector<region_id> label;
      std::vector<intervals::interval_tracker> trackers(channels);
      std::vector<pending> found;
      step_t last = 0;
      bool observed = false;
      for (const auto& ev : ep.events) {
        if (const auto* s = std::get_if<trace::segment>(&ev)) {
          label.insert(label.end(), s->tokens, s->region);
          continue;
        }
        const auto* a = std::get_if<trace::attention>(&ev);
        if (!a) continue;
        const std::size_t n = a->context;
        if (n <= std::size_t{o.sink_positions} + o.recent_positions) continue;
        const std::size_t first = o.sink_positions, end = n - o.recent_positions;
        for (std::size_t c = 0; c < channels; ++c) {
          row_bounds(*a, c, lo, hi);
          trackers[c].observe(a->step, lo, hi, first, end, o.refresh_threshold, o.rearm_threshold,
                              [&](std::size_t j, double start, double prev, double at) {
                                found.push_back({c * regions + label[j], start, prev, at});
                              });
        }
        last = a->step;
        observed = true;
      }
      if (observed) {
        // The window closes at the episode's last observed row: an interval ending later could not have been seen.
        for (const auto& p : found)
          data[p.slot].add(group, episode_index,
                           {p.prev - p.start, p.end - p.start, static_cast<double>(last) - p.start});
      }
      ++episode_index;
    }
  }
  return finish_all_intervals(data, o);
}

// Every region's fit of the reference estimator. Each reference event completes one interval of its span (in the
// region of the span's first token): from the span's last reference, i.e. the latest arrival or reference of any
// of its tokens (a fact is there once its last token is), to the event's step. The interval is known to a step: a
// reference logged at step s happened in (s - 1, s] (a step clock processes what became due since the previous
// step), and one after the episode's last step could not be logged, so each interval is truncated at the window
// left when it started. The window closes at the episode's last segment, attention or reference event (probes are
// side queries, not the workload's clock). A reference in the step of the span's last reference completes no
// interval. Spans never referenced again contribute nothing: the likelihood is conditional on the next reference
// falling inside the window, so how many spans are never needed again does not enter the rate.
[[nodiscard]] inline std::vector<curve_fit> estimate_references(std::span<const trace::trace_file> traces,
                                                                const estimator_options& o, std::size_t regions,
                                                                std::size_t groups, std::size_t total_episodes) {
  std::vector<interval_data> data(regions, interval_data(groups, total_episodes));
  struct pending {
    region_id region;
    step_t start, at;
  };
  std::size_t episode_index = 0;
  for (const auto& f : traces) {
    for (const auto& ep : f.episodes) {
      const std::size_t group = episode_index % groups;
      std::vector<region_id> label;
      std::vector<step_t> last_reference;
      std::vector<pending> found;
      step_t end = 0;
      for (const auto& ev : ep.events) {
        if (const auto* s = std::get_if<trace::segment>(&ev)) {
          label.insert(label.end(), s->tokens, s->region);
          last_reference.insert(last_reference.end(), s->tokens, s->step);
          end = std::max(end, s->step);
        } else if (const auto* a = std::get_if<trace::attention>(&ev)) {
          end = std::max(end, a->step);
        } else if (const auto* r = std::get_if<trace::reference>(&ev)) {
          end = std::max(end, r->step);
          const std::size_t first = r->first, last = first + r->length;
          const step_t start = *std::max_element(last_reference.begin() + static_cast<std::ptrdiff_t>(first),
                                                 last_reference.begin() + static_cast<std::ptrdiff_t>(last));
          if (r->step > start) found.push_back({label[first], start, r->step});
          std::fill(last_reference.begin() + static_cast<std::ptrdiff_t>(first),
                    last_reference.begin() + static_cast<std::ptrdiff_t>(last), r->step);
        }
      }
      for (const auto& p : found) {
        const auto to_end = static_cast<double>(p.at - p.start);
        data[p.region].add(group, episode_index, {to_end - 1.0, to_end, static_cast<double>(end - p.start)});
      }
      ++episode_index;
    }
  }
  return finish_all_intervals(data, o);
}

// The excess-decay estimator fits every row's masses as samples; a sparse row that leaves positions out has no
// value for them (see row_bounds), so it is refused rather than read as zeros.
inline void require_dense_rows(std::span<const trace::trace_file> traces) {
  for (const auto& f : traces)
    for (const auto& ep : f.episodes) {
      std::size_t event = 0;
      for (const auto& ev : ep.events) {
        if (const auto* a = std::get_if<trace::attention>(&ev))
          for (std::size_t l = 0; l < a->layers.size(); ++l)
            if (a->layers[l].sparse && a->layers[l].positions.size() < a->context)
              memdecay::detail::raise_input(
                  "calibration (method " + std::string(to_string(estimator_method::excess_decay)) + "): trace '" +
                  f.label + "' episode '" + ep.name + "' event " + to_text(event) + " (attention at step " +
                  to_text(a->step) + ") layer " + to_text(l) + ": sparse row lists " +
                  to_text(a->layers[l].positions.size()) + " of " + to_text(a->context) +
                  " positions; this estimator fits every position's mass, and the absent ones are unknown (a "
                  "top-k row is not zero elsewhere): write dense rows, or use the refresh-interval estimator, "
                  "which bounds absent entries by the row's smallest recorded one");
        ++event;
      }
    }
}

}  // namespace detail

/// The measured attention against age of one region (over the layer mean), from the final pass: the points
/// the curve was fitted to, for plots. Ages in steps; mass in the fit's scaled uniform units.
struct age_profile {
  std::vector<double> age;    ///< mean age of each bin
  std::vector<double> mass;   ///< mean scaled mass of each bin
  std::vector<double> count;  ///< samples in each bin
};

/// estimate() rejects episodes longer than this (their rows are expanded per token).
inline constexpr std::uint64_t max_episode_tokens = std::uint64_t{1} << 24;

/// Settings recorded in the calibration besides the fits.
struct runtime_settings {
  attention_normalization normalization = attention_normalization::uniform;
  double alpha = 1.0;
  double tau = 2.0;
};

/// Estimates per-region (and per-layer) half-lives from `traces`. Every file must list the same region names;
/// each must be in `base` (which supplies b_r and the default decay rate kept by uncalibrated regions).
/// Throws config_error for invalid options or settings, input_error for traces that cannot be calibrated
/// together (no traces, different region names, a region missing from `base`).
/// `sources` (optional) names the files for the provenance, one per trace; `profiles` (optional) receives the
/// measured attention against age per region (for plots).
[[nodiscard]] inline calibration estimate(std::span<const trace::trace_file> traces,
                                          const estimator_options& options = {},
                                          const region_table& base = default_region_table(),
                                          const runtime_settings& settings = {},
                                          std::span<const std::string> sources = {},
                                          std::vector<age_profile>* profiles = nullptr) {
  using memdecay::detail::raise_input;
  using memdecay::detail::to_text;
  options.validate();
  base.validate();
  {
    config check;
    check.normalization = settings.normalization;
    check.alpha = settings.alpha;
    check.tau = settings.tau;
    check.validate();
  }
  if (traces.empty()) raise_input("calibration needs at least one trace file");
  if (!sources.empty() && sources.size() != traces.size())
    raise_input("calibration: " + to_text(sources.size()) + " source names for " + to_text(traces.size()) + " traces");
  const auto& names = traces.front().region_names;
  std::uint32_t layers = traces.front().layers;
  for (std::size_t f = 1; f < traces.size(); ++f) {
    if (traces[f].region_names != names)
      raise_input("calibration: trace " + to_text(f) + " ('" + traces[f].label +
                  "') lists other region names than trace 0 ('" + traces.front().label + "')");
    if (traces[f].layers != layers) layers = 0;  // per-layer fits need one layer count
  }
  for (const auto& n : names)
    if (!base.find(n)) raise_input("calibration: trace region '" + n + "' is not in the base region table");
  const bool by_references = options.method == estimator_method::references;
  const bool per_layer = options.per_layer && layers > 1 && !by_references;  // references carry no layers
  const std::size_t channels = per_layer ? std::size_t{layers} + 1 : 1;  // 0: layer mean; 1 + l: layer l
  const std::size_t regions = names.size();

  std::size_t total_episodes = 0, references = 0;
  step_t last = 0;
  for (const auto& f : traces) {
    total_episodes += f.episodes.size();
    for (const auto& e : f.episodes) references += e.count_references();
    for (const auto& e : f.episodes) {
      last = std::max(last, e.last_step());
      // Rows are expanded per token; the reader accepts run-length segments of billions of tokens.
      if (e.total_tokens() > max_episode_tokens)
        raise_input("calibration: episode '" + e.name + "' of '" + f.label + "' holds " + to_text(e.total_tokens()) +
                    " tokens (calibration handles at most " + to_text(max_episode_tokens) + " per episode)");
    }
  }
  if (by_references && references == 0)
    raise_input("calibration (method " + std::string(to_string(options.method)) +
                "): the traces carry no reference events (trace format version 2: the spans the workload re-read); "
                "record them, or calibrate from attention with the refresh-interval estimator");
  const std::uint64_t width =
      std::max<std::uint64_t>(1, (std::uint64_t{last} + options.max_age_bins) / options.max_age_bins);
  const std::size_t groups = std::max<std::size_t>(1, std::min<std::size_t>(options.jackknife_groups, total_episodes));

  std::vector<detail::curve> model(channels * regions);  // the previous pass's fits (invalid: flat prediction)
  std::vector<curve_fit> fits(channels * regions);
  std::vector<detail::curve_data> data;
  const bool by_decay = options.method == estimator_method::excess_decay;
  if (by_decay)
    detail::require_dense_rows(traces);
  else if (by_references)
    fits = detail::estimate_references(traces, options, regions, groups, total_episodes);
  else
    fits = detail::estimate_intervals(traces, options, channels, regions, groups, total_episodes);
  std::vector<float> row;
  std::vector<double> ratio, pred;
  // Predictions by integer age, tabled when the ages are few enough (they are the steps of one episode).
  const std::size_t table_ages = std::size_t{last} + 1;
  const bool tabled = table_ages * channels * regions <= (std::size_t{1} << 22);
  std::vector<double> pred_table;
  for (std::uint32_t pass = 0; by_decay && pass < options.passes; ++pass) {
    if (tabled) {
      pred_table.assign(channels * regions * table_ages, 1.0);
      for (std::size_t i = 0; i < channels * regions; ++i)
        if (model[i].valid)
          for (std::size_t age = 0; age < table_ages; ++age)
            pred_table[i * table_ages + age] = std::max(model[i].at(static_cast<double>(age)), 1e-6);
    }
    data.assign(channels * regions, {});
    for (auto& d : data) {
      d.groups.resize(groups);
      d.episode_seen.assign(total_episodes, 0);
    }
    std::size_t episode_index = 0;
    for (const auto& f : traces) {
      for (const auto& ep : f.episodes) {
        const std::size_t group = episode_index % groups;
        std::vector<region_id> label;
        std::vector<step_t> arrival;
        std::vector<step_t> ref;  // [channel * tokens + j], sized when attention arrives
        for (const auto& ev : ep.events) {
          if (const auto* s = std::get_if<trace::segment>(&ev)) {
            label.insert(label.end(), s->tokens, s->region);
            arrival.insert(arrival.end(), s->tokens, s->step);
            continue;
          }
          const auto* a = std::get_if<trace::attention>(&ev);
          if (!a) continue;
          const std::size_t n = a->context;
          if (ref.size() != channels * label.size()) {  // new tokens since the last row: their age starts at arrival
            std::vector<step_t> grown(channels * label.size());
            const std::size_t old = channels == 0 ? 0 : ref.size() / channels;
            for (std::size_t c = 0; c < channels; ++c)
              for (std::size_t j = 0; j < label.size(); ++j)
                grown[c * label.size() + j] = j < old ? ref[c * old + j] : arrival[j];
            ref = std::move(grown);
          }
          if (n <= std::size_t{options.sink_positions} + options.recent_positions) continue;
          const std::size_t first = options.sink_positions, end = n - options.recent_positions;
          for (std::size_t c = 0; c < channels; ++c) {
            row.assign(n, 0.0f);
            if (c == 0) {
              const float w = 1.0f / static_cast<float>(a->layers.size());
              for (const auto& l : a->layers) l.accumulate(row, w);
            } else {
              a->layers[c - 1].accumulate(row, 1.0f);
            }
            step_t* r = ref.data() + c * n;
            const detail::curve* m = model.data() + c * regions;
            const double* table = tabled ? pred_table.data() + c * regions * table_ages : nullptr;
            auto predicted = [&](std::size_t j) {
              const std::uint64_t age = a->step - r[j];
              if (table) return table[label[j] * table_ages + age];
              const auto& cm = m[label[j]];
              return cm.valid ? std::max(cm.at(static_cast<double>(age)), 1e-6) : 1.0;
            };
            // The row's scale: the median of observed / predicted over the eligible tokens.
            ratio.clear();
            pred.resize(n);
            for (std::size_t j = first; j < end; ++j) {
              pred[j] = predicted(j);
              ratio.push_back(static_cast<double>(row[j]) * static_cast<double>(n) / pred[j]);
            }
            if (ratio.empty()) continue;
            auto mid = ratio.begin() + static_cast<std::ptrdiff_t>(ratio.size() / 2);
            std::nth_element(ratio.begin(), mid, ratio.end());
            const double scale = *mid;
            if (!(scale > 0.0) || !std::isfinite(scale)) continue;  // a row with (almost) no mass says nothing
            for (std::size_t j = first; j < end; ++j) {
              const double y = static_cast<double>(row[j]) * static_cast<double>(n) / scale;
              const double p = pred[j];
              if (y > options.refresh_ratio * p) {  // a re-reference: the token's age restarts here
                r[j] = a->step;
                continue;
              }
              const std::uint64_t age = a->step - r[j];
              auto& d = data[c * regions + label[j]];
              auto& g = d.groups[group];
              const std::size_t b = static_cast<std::size_t>(age / width);
              if (b >= g.size()) g.resize(b + 1);
              g[b].n += 1;
              g[b].age += static_cast<double>(age);
              g[b].y += y;
              ++d.samples;
              d.episode_seen[episode_index] = 1;
            }
          }
        }
        ++episode_index;
      }
    }
    for (std::size_t i = 0; i < data.size(); ++i) {
      auto [fit, c] = detail::finish(data[i], options, pass + 1 == options.passes);
      fits[i] = std::move(fit);
      // The next pass predicts with this fit when there is one (calibrated or not), else a flat line.
      model[i] = c;
    }
  }

  if (profiles) {
    profiles->assign(regions, {});  // the interval estimator has no curve of mass against age: empty profiles
    for (std::size_t r = 0; by_decay && r < regions; ++r)
      for (const auto& b : detail::merge(data[r], std::numeric_limits<std::size_t>::max())) {
        (*profiles)[r].age.push_back(b.age);
        (*profiles)[r].mass.push_back(b.mean);
        (*profiles)[r].count.push_back(b.n);
      }
  }
  calibration out;
  out.normalization = settings.normalization;
  out.alpha = settings.alpha;
  out.tau = settings.tau;
  out.estimator = options;
  for (std::size_t f = 0; f < traces.size(); ++f) {
    out.source.traces.push_back(
        {sources.empty() ? std::string() : sources[f], traces[f].label, traces[f].episodes.size(), traces[f].layers});
  }
  for (std::size_t r = 0; r < regions; ++r) {
    const auto& defaults = base[*base.find(names[r])];
    region_calibration rc;
    rc.name = names[r];
    rc.base_priority = defaults.base_priority;
    rc.fit = fits[r];
    rc.decay_rate = rc.calibrated() ? std::numbers::ln2 / *rc.fit.half_life : defaults.decay_rate;
    for (std::size_t c = 1; c < channels; ++c) rc.layers.push_back(fits[c * regions + r]);
    out.regions.push_back(std::move(rc));
  }
  return out;
}

inline std::optional<std::string> calibration::check() const {
  using memdecay::detail::to_text;
  if (std::string_view(memdecay::to_string(normalization)) == "?")
    return "normalization = " + to_text(static_cast<int>(normalization)) + " (unknown mode)";
  if (!std::isfinite(alpha) || alpha < 0.0) return "alpha = " + to_text(alpha) + " (must be finite and >= 0)";
  if (!std::isfinite(tau) || tau < 0.0) return "tau = " + to_text(tau) + " (must be finite and >= 0)";
  if (auto e = estimator.check()) return "estimator: " + *e;
  if (regions.empty() || regions.size() > 256)
    return ("calibration has " + to_text(regions.size()) + " regions (must be 1 to 256)");
  auto finite_pos = [](double v) { return std::isfinite(v) && v > 0.0; };
  auto check_fit = [&](const curve_fit& f, const std::string& where) -> std::optional<std::string> {
    if (f.status == fit_status::calibrated) {
      if (!f.reason.empty()) return (where + "is calibrated but has a reason ('" + f.reason + "')");
      if (!f.half_life || !finite_pos(*f.half_life))
        return (where + "half_life " + (f.half_life ? "= " + to_text(*f.half_life) : std::string("is missing")) +
                " (a calibrated fit needs a finite half-life > 0)");
      if (!f.half_life_ci) return (where + "a calibrated fit needs half_life_ci");
    } else if (f.reason.empty()) {
      return (where + "is uncalibrated without a reason");
    }
    if (f.half_life && !finite_pos(*f.half_life))
      return (where + "half_life = " + to_text(*f.half_life) + " (must be finite and > 0)");
    if (f.half_life_ci) {
      const auto& ci = *f.half_life_ci;
      if (!f.half_life) return (where + "half_life_ci without a half_life");
      if (!finite_pos(ci.lower) || !finite_pos(ci.upper) || !(ci.lower <= *f.half_life) || !(*f.half_life <= ci.upper))
        return (where + "half_life_ci = [" + to_text(ci.lower) + ", " + to_text(ci.upper) +
                "] (must be finite, > 0 and contain half_life = " + to_text(*f.half_life) + ")");
    }
    if (f.floor && !std::isfinite(*f.floor)) return (where + "floor = " + to_text(*f.floor) + " (must be finite)");
    if (f.amplitude && !std::isfinite(*f.amplitude))
      return (where + "amplitude = " + to_text(*f.amplitude) + " (must be finite)");
    if (f.episodes > f.samples)
      return (where + "episodes = " + to_text(f.episodes) + " exceeds samples = " + to_text(f.samples));
    return std::nullopt;
  };
  std::size_t layer_count = regions.front().layers.size();
  for (std::size_t i = 0; i < regions.size(); ++i) {
    const auto& r = regions[i];
    const std::string where = "regions[" + to_text(i) + "] ('" + r.name + "'): ";
    if (r.name.empty() || r.name.size() > 255) return (where + "name must be 1 to 255 bytes");
    for (std::size_t j = 0; j < i; ++j)
      if (regions[j].name == r.name) return (where + "repeats the name of regions[" + to_text(j) + "]");
    if (!(r.base_priority >= 0.0) || !std::isfinite(r.base_priority))
      return (where + "base_priority = " + to_text(r.base_priority) + " (must be finite and >= 0)");
    if (!(r.decay_rate >= 0.0) || !std::isfinite(r.decay_rate))
      return (where + "decay_rate = " + to_text(r.decay_rate) + " (must be finite and >= 0)");
    // A positive rate so small that ln 2 / rate overflows has no half-life the file can hold (found by fuzzing).
    if (r.decay_rate > 0.0 && !std::isfinite(std::numbers::ln2 / r.decay_rate))
      return (where + "decay_rate = " + to_text(r.decay_rate) +
              " (its half-life ln 2 / decay_rate overflows; use 0 for no decay)");
    if (auto e = check_fit(r.fit, where)) return e;
    if (r.calibrated()) {
      const double expected = std::numbers::ln2 / *r.fit.half_life;
      if (!std::isfinite(expected) || !(std::abs(r.decay_rate - expected) <= 1e-9 * expected))
        return (where + "decay_rate = " + to_text(r.decay_rate) + " disagrees with the fitted half_life = " +
                to_text(*r.fit.half_life) + " (ln 2 / half_life = " + to_text(expected) + ")");
    }
    if (r.layers.size() != layer_count)
      return (where + "has " + to_text(r.layers.size()) + " layers, regions[0] has " + to_text(layer_count));
    for (std::size_t l = 0; l < r.layers.size(); ++l)
      if (auto e = check_fit(r.layers[l], where + "layers[" + to_text(l) + "]: ")) return e;
  }
  return std::nullopt;
}

}  // namespace memdecay::calibration

#endif  // MEMDECAY_CALIBRATION_CALIBRATION_HPP
