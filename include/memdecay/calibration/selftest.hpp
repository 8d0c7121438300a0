// SPDX-License-Identifier: Apache-2.0
// memdecay: calibration self-test: seeded synthetic traces whose answers are known, and the bias and 95%-interval
// coverage of an estimator measured over many replicate traces.
//
//   namespace st = memdecay::calibration::selftest;
//   st::synthetic_config c;                              // 3 regions, refresh half-lives 8 / 24 / 60 steps
//   memdecay::trace::trace_file f = st::build(c, seed);  // deterministic for (c, seed)
//   st::report r = st::measure(c, options, /*replicates=*/200, /*seed=*/1);
//   // r.regions[i].bias, .coverage: mean fitted / true - 1, share of replicates whose interval holds the truth
//
// The traces model what both estimators assume, with the truth stated twice: every token draws a chain of
// re-references (after its arrival and after each re-reference, with probability `continue_probability`, the next
// one follows after an exponential interval with the region's `refresh_half_life`, rounded up to the next step as a
// step clock does; one after the episode's last step is dropped), and its attention is
//   w_j = floor + amplitude * 2^(-(t - last reference) / fade_half_life)
// times log-normal noise exp(noise_sigma * z), normalised to what the row's re-references leave: a token
// re-referenced at a step takes `burst_level` in uniform units (at most `burst_cap` of the row for all of them),
// as a query's attention concentrates on what it reads.
// Every `fact_every`-th token is a fact (draws re-references), the rest filler; a prompt is prefilled at step 0.
// Each re-reference is also logged as a reference event. The refresh-interval and reference estimators' truth is
// refresh_half_life, the excess-decay estimator's is fade_half_life (equal by default, so all three answer the same
// question on the same traces). memdecay-calibrate --self-test prints the measurement; docs/calibration.md has it.
#ifndef MEMDECAY_CALIBRATION_SELFTEST_HPP
#define MEMDECAY_CALIBRATION_SELFTEST_HPP

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numbers>
#include <numeric>
#include <string>
#include <vector>

#include "memdecay/calibration/calibration.hpp"
#include "memdecay/detail/error.hpp"
#include "memdecay/io/trace.hpp"
#include "memdecay/io/trace_generator.hpp"

namespace memdecay::calibration::selftest {

/// What the synthetic episodes look like. Regions take turns by segments of `segment_tokens` tokens.
struct synthetic_config {
  std::vector<std::string> names{"short", "medium", "long"};
  std::vector<double> refresh_half_life{8.0, 24.0, 60.0};  ///< steps: the intervals between re-references
  std::vector<double> fade_half_life{8.0, 24.0, 60.0};     ///< steps: the fading of excess attention
  double continue_probability = 0.7;  ///< after each reference (and the arrival), another one follows
  std::uint32_t episodes = 20;
  std::uint32_t steps = 160;  ///< rows at steps 0 .. steps - 1, one per step
  std::uint32_t tokens_per_step = 2;
  std::uint32_t segment_tokens = 6;
  double floor = 1.0;
  double amplitude = 3.0;
  std::uint32_t prompt_tokens = 128;  ///< tokens prefilled at step 0 (so that re-references stand out from the start)
  std::uint32_t fact_every = 8;       ///< every this-many-th token is a fact (draws re-references); the rest is filler
  double burst_level = 100.0;  ///< a re-referenced token's mass in uniform units (mass x context), as a query's ...
  double burst_cap = 0.95;     ///< ... attention concentrates on what it reads; together at most this share of the row
  double noise_sigma = 0.3;    ///< log-normal noise on every weight
  std::uint32_t layers = 1;    ///< identical layers (independent noise)

  /// The first invalid field, named with its value; nothing when valid.
  [[nodiscard]] std::optional<std::string> check() const {
    using memdecay::detail::to_text;
    if (names.empty() || names.size() > 256) return "names: " + to_text(names.size()) + " regions (must be 1 to 256)";
    if (refresh_half_life.size() != names.size() || fade_half_life.size() != names.size())
      return "refresh_half_life / fade_half_life: one per region (" + to_text(names.size()) + ")";
    for (double h : refresh_half_life)
      if (!(h > 0.0) || !std::isfinite(h)) return "refresh_half_life = " + to_text(h) + " (must be finite and > 0)";
    for (double h : fade_half_life)
      if (!(h > 0.0) || !std::isfinite(h)) return "fade_half_life = " + to_text(h) + " (must be finite and > 0)";
    if (!(continue_probability >= 0.0 && continue_probability < 1.0))
      return "continue_probability = " + to_text(continue_probability) + " (must be in [0, 1))";
    if (episodes == 0 || steps < 2 || tokens_per_step == 0 || segment_tokens == 0 || layers == 0 || layers > 64)
      return "episodes, steps (>= 2), tokens_per_step, segment_tokens must be > 0 and layers in [1, 64]";
    if (std::uint64_t{steps} * tokens_per_step + prompt_tokens > (1u << 20))
      return "steps x tokens_per_step exceeds 2^20 tokens";
    if (!(floor > 0.0) || !(amplitude >= 0.0) || !(noise_sigma >= 0.0) || !std::isfinite(floor) ||
        !std::isfinite(amplitude) || !std::isfinite(noise_sigma) || fact_every == 0 || !(burst_level > 0.0) ||
        !std::isfinite(burst_level) || !(burst_cap > 0.0 && burst_cap < 1.0))
      return "floor > 0, amplitude and noise_sigma >= 0 and finite, fact_every > 0, burst_level > 0, burst_cap in (0, "
             "1)";
    return std::nullopt;
  }
};

/// One synthetic trace (label "synthetic"), deterministic for (c, seed). input_error naming the field for an
/// invalid config.
[[nodiscard]] inline trace::trace_file build(const synthetic_config& c, std::uint64_t seed) {
  if (auto e = c.check()) memdecay::detail::raise_input("calibration self-test config: " + *e);
  trace::trace_file f;
  f.label = "synthetic";
  f.layers = c.layers;
  f.region_names = c.names;
  const std::size_t regions = c.names.size();
  for (std::uint32_t e = 0; e < c.episodes; ++e) {
    trace::splitmix64 rng(seed * 0x9e3779b97f4a7c15ULL + e * 0xd1b54a32d192ed03ULL + 1);
    auto gauss = [&] {  // Box-Muller: the standard normal from two uniforms
      const double u = 1.0 - rng.uniform(), v = rng.uniform();
      return std::sqrt(-2.0 * std::log(u)) * std::cos(2.0 * std::numbers::pi * v);
    };
    trace::episode ep;
    ep.name = "synthetic/" + std::to_string(e);
    ep.seed = seed;
    std::vector<region_id> label;
    constexpr step_t none = std::numeric_limits<step_t>::max();
    std::vector<step_t> ref, next;  // last reference (or arrival); next reference (`none`: no more)
    const step_t last = c.steps - 1;
    auto draw_next = [&](std::size_t j, step_t from) {
      next[j] = none;
      if (!rng.chance(c.continue_probability)) return;
      const double lambda = std::numbers::ln2 / c.refresh_half_life[label[j]];
      const double gap = -std::log(1.0 - rng.uniform()) / lambda;
      const double at = std::ceil(static_cast<double>(from) + gap);  // a step clock: the first step at or after it
      if (at <= static_cast<double>(last)) next[j] = static_cast<step_t>(std::max(at, static_cast<double>(from) + 1.0));
    };
    std::vector<double> w;
    auto append = [&](step_t t, std::uint32_t tokens) {
      while (tokens > 0) {  // segments of segment_tokens, regions in turn
        const auto r = static_cast<region_id>((label.size() / c.segment_tokens) % regions);
        const auto n = std::min<std::uint32_t>(
            tokens, c.segment_tokens - static_cast<std::uint32_t>(label.size() % c.segment_tokens));
        ep.events.emplace_back(trace::segment{t, r, n});
        for (std::uint32_t k = 0; k < n; ++k) {
          label.push_back(r);
          ref.push_back(t);
          next.push_back(none);
          if ((label.size() - 1) % c.fact_every == 0) draw_next(label.size() - 1, t);
        }
        tokens -= n;
      }
    };
    for (step_t t = 0; t <= last; ++t) {
      append(t, c.tokens_per_step + (t == 0 ? c.prompt_tokens : 0));
      const std::size_t n = label.size();
      std::vector<std::uint8_t> burst(n, 0);
      bool any = false;
      for (std::size_t j = 0; j < n; ++j)
        if (next[j] == t) {
          burst[j] = 1;
          any = true;
          ref[j] = t;
          draw_next(j, t);
          ep.events.emplace_back(trace::reference{t, static_cast<std::uint32_t>(j), 1});
        }
      trace::attention a{t, static_cast<std::uint32_t>(n), {}};
      for (std::uint32_t l = 0; l < c.layers; ++l) {
        w.assign(n, 0.0);
        double sum = 0, burst_sum = 0;
        for (std::size_t j = 0; j < n; ++j) {
          const double noise = std::exp(c.noise_sigma * gauss());
          if (burst[j]) {
            w[j] = noise;
            burst_sum += noise;
          } else {
            w[j] = (c.floor + c.amplitude * std::exp2(-static_cast<double>(t - ref[j]) / c.fade_half_life[label[j]])) *
                   noise;
            sum += w[j];
          }
        }
        // The re-referenced tokens take burst_level / n each (burst_cap of the row at most, split by their noise);
        // the background shares the rest.
        const double k = std::accumulate(burst.begin(), burst.end(), 0.0);
        const double share = any ? std::min(c.burst_cap, k * c.burst_level / static_cast<double>(n)) : 0.0;
        trace::attention_row row;
        row.mass.resize(n);
        for (std::size_t j = 0; j < n; ++j)
          row.mass[j] = static_cast<float>(burst[j] ? share * w[j] / burst_sum : (1.0 - share) * w[j] / sum);
        a.layers.push_back(std::move(row));
      }
      ep.events.emplace_back(std::move(a));
    }
    f.episodes.push_back(std::move(ep));
  }
  return f;
}

/// `f` with every row that holds more than k positions stored sparse with its k largest entries only (what an
/// engine that records top-k attention writes: the dropped mass is not zero).
[[nodiscard]] inline trace::trace_file keep_top_k(trace::trace_file f, std::size_t k) {
  std::vector<std::uint32_t> order;
  for (auto& ep : f.episodes)
    for (auto& ev : ep.events)
      if (auto* a = std::get_if<trace::attention>(&ev))
        for (auto& row : a->layers) {
          if (row.sparse || row.mass.size() <= k) continue;
          order.resize(row.mass.size());
          std::iota(order.begin(), order.end(), 0u);
          std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                            [&](std::uint32_t x, std::uint32_t y) {
                              return row.mass[x] > row.mass[y] || (row.mass[x] == row.mass[y] && x < y);
                            });
          order.resize(k);
          std::sort(order.begin(), order.end());
          trace::attention_row sparse{true, order, {}};
          for (auto p : order) sparse.mass.push_back(row.mass[p]);
          row = std::move(sparse);
        }
  return f;
}

/// One region's measurement over the replicates.
struct region_report {
  std::string name;
  double truth = 0;
  std::size_t calibrated = 0;  ///< replicates in which the region was calibrated
  double mean_half_life = 0;   ///< over the calibrated replicates
  double bias = 0;             ///< mean_half_life / truth - 1
  double rmse = 0;             ///< root mean square of (fitted / truth - 1)
  std::size_t covered = 0;     ///< calibrated replicates whose 95% interval contains the truth
  double coverage = 0;         ///< covered / calibrated
};

struct report {
  std::size_t replicates = 0;
  std::vector<region_report> regions;
  std::size_t calibrated = 0, covered = 0;  ///< over every region and replicate
  [[nodiscard]] double coverage() const noexcept {
    return calibrated ? static_cast<double>(covered) / static_cast<double>(calibrated) : 0.0;
  }
};

/// Runs `options`' estimator on `replicates` traces built from `c` with seeds seed, seed + 1, ... and compares
/// every region's fit with its truth (refresh_half_life for the refresh-interval estimator, fade_half_life for the
/// excess-decay one).
[[nodiscard]] inline report measure(const synthetic_config& c, const estimator_options& options, std::size_t replicates,
                                    std::uint64_t seed) {
  std::vector<region_params> params;
  for (const auto& n : c.names) params.push_back({n, 1.0, 0.01, false});
  const region_table base(params);
  const auto& truth = options.method == estimator_method::excess_decay ? c.fade_half_life : c.refresh_half_life;
  report out;
  out.replicates = replicates;
  for (std::size_t r = 0; r < c.names.size(); ++r) out.regions.push_back({.name = c.names[r], .truth = truth[r]});
  std::vector<double> sq(c.names.size(), 0.0);
  for (std::size_t k = 0; k < replicates; ++k) {
    const std::vector<trace::trace_file> traces{build(c, seed + k)};
    const auto cal = estimate(traces, options, base);
    for (std::size_t r = 0; r < c.names.size(); ++r) {
      const auto& fit = cal.regions[r].fit;
      if (fit.status != fit_status::calibrated) continue;
      auto& rr = out.regions[r];
      ++rr.calibrated;
      rr.mean_half_life += *fit.half_life;
      sq[r] += (*fit.half_life / truth[r] - 1.0) * (*fit.half_life / truth[r] - 1.0);
      if (fit.half_life_ci->lower <= truth[r] && truth[r] <= fit.half_life_ci->upper) ++rr.covered;
    }
  }
  for (std::size_t r = 0; r < c.names.size(); ++r) {
    auto& rr = out.regions[r];
    if (rr.calibrated == 0) continue;
    const double n = static_cast<double>(rr.calibrated);
    rr.mean_half_life /= n;
    rr.bias = rr.mean_half_life / rr.truth - 1.0;
    rr.rmse = std::sqrt(sq[r] / n);
    rr.coverage = static_cast<double>(rr.covered) / n;
    out.calibrated += rr.calibrated;
    out.covered += rr.covered;
  }
  return out;
}

}  // namespace memdecay::calibration::selftest

#endif  // MEMDECAY_CALIBRATION_SELFTEST_HPP
