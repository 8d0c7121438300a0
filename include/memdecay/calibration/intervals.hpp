// SPDX-License-Identifier: Apache-2.0
// memdecay: calibration by refresh intervals: per token, the times between the model's re-references of it, and
// the maximum-likelihood exponential rate of those intervals under the truncation an episode's end imposes.
//
// MemDecay's clock restarts at a refresh (attention on a token at or above a threshold), and b_r exp(-lambda_r dt)
// says how likely a token is to be needed again dt steps after its last refresh. So lambda_r is the rate of the
// interval between refreshes, and that is what this estimator fits (calibration.hpp's `estimate` with
// estimator_method::refresh_intervals; docs/calibration.md has the derivation and the measured bias and coverage).
//
//   interval_tracker t;                       // one per (episode, channel)
//   t.observe(step, lo, hi, first, end, ...)  // every attention row: mass bounds in uniform units
//   double lambda = fit_rate(samples, ...)    // the truncated, grid-censored exponential MLE
//
// Why the clock starts where it does. A token is "armed" (its next refresh can be detected) only when it is seen
// below the re-arm level: right after arrival it sits among the newest positions (left out) or is attended for being
// new, right after a refresh it may still be attended. An interval starts at the first observation at which the
// token is armed and ends at the next observation at or above the refresh threshold. For exponential intervals the
// time from any moment the token is known not to be in a refresh to its next refresh is again exponential with the
// same rate (memorylessness), whatever happened before, so these starts are unbiased and need no dead-time model;
// starting at the arrival or the refresh itself would count the blind steps after it as waiting time, or miss
// refreshes that fall in them and report their sum as one long interval.
#ifndef MEMDECAY_CALIBRATION_INTERVALS_HPP
#define MEMDECAY_CALIBRATION_INTERVALS_HPP

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numbers>
#include <span>
#include <vector>

#include "memdecay/core/retention_score.hpp"

namespace memdecay::calibration::intervals {

/// One completed interval, in steps relative to its start `b`: the refresh was detected at the observation
/// `b + to_end`, the previous observation of the episode was at `b + to_prev` (so the refresh happened in
/// (b + to_prev, b + to_end]: rows are a grid, not a continuous record), and the episode's last observation is at
/// `b + window` (an interval that would have ended after it cannot be seen). 0 <= to_prev < to_end <= window.
struct sample {
  double to_prev = 0;
  double to_end = 0;
  double window = 0;
};

/// d/d lambda of the log-likelihood of `s` under exponential intervals of rate `lambda`, given that the interval
/// ended inside the window:
///   l = log(exp(-lambda to_prev) - exp(-lambda to_end)) - log(1 - exp(-lambda window))
/// (with observations every instant this is log(lambda) - lambda d - log(1 - exp(-lambda (T - s))), the
/// continuous truncated exponential; on the observation grid the interval is known only to lie between two rows).
[[nodiscard]] inline double score(const sample& s, double lambda) noexcept {
  const double w = s.to_end - s.to_prev;
  return -s.to_prev + w / std::expm1(lambda * w) - s.window / std::expm1(lambda * s.window);
}

/// The log-likelihood itself (for tests and the profile).
[[nodiscard]] inline double log_likelihood(const sample& s, double lambda) noexcept {
  const double w = s.to_end - s.to_prev;
  return -lambda * s.to_prev + std::log(-std::expm1(-lambda * w)) - std::log(-std::expm1(-lambda * s.window));
}

enum class rate_outcome { ok, too_few, at_min_half_life, at_max_half_life };

struct rate_fit {
  double lambda = 0;
  rate_outcome outcome = rate_outcome::too_few;
};

/// The maximum-likelihood rate over every group of `groups` except `skip`, with the half-life searched in
/// [min_half_life, max_half_life]. The score of each sample falls with lambda (the truncated exponential's mean
/// falls with its rate), so the total has one root: bisection on log lambda. A root outside the range is reported
/// at the end it lies beyond (at_max_half_life: the intervals look no more concentrated at short lengths than a
/// uniform spread over each window, i.e. no decay measured).
[[nodiscard]] inline rate_fit fit_rate(std::span<const std::vector<sample>> groups, std::size_t skip,
                                       double min_half_life, double max_half_life) noexcept {
  std::size_t n = 0;
  for (std::size_t g = 0; g < groups.size(); ++g)
    if (g != skip) n += groups[g].size();
  if (n == 0) return {0, rate_outcome::too_few};
  auto total = [&](double lambda) {
    double s = 0;
    for (std::size_t g = 0; g < groups.size(); ++g)
      if (g != skip)
        for (const auto& x : groups[g]) s += score(x, lambda);
    return s;
  };
  double lo = std::log(std::numbers::ln2 / max_half_life), hi = std::log(std::numbers::ln2 / min_half_life);
  if (total(std::exp(lo)) <= 0.0) return {std::exp(lo), rate_outcome::at_max_half_life};
  if (total(std::exp(hi)) >= 0.0) return {std::exp(hi), rate_outcome::at_min_half_life};
  for (int it = 0; it < 100 && hi - lo > 1e-10; ++it) {
    const double mid = 0.5 * (lo + hi);
    (total(std::exp(mid)) > 0.0 ? lo : hi) = mid;
  }
  return {std::exp(0.5 * (lo + hi)), rate_outcome::ok};
}

/// Per-token refresh state of one (episode, channel): whether each token is armed and since when.
class interval_tracker {
 public:
  /// One attention row at `step`: for every position j in [first, end), lo[j] <= x_j <= hi[j] are bounds on its
  /// mass in uniform units (equal for dense rows; a sparse row only bounds its absent entries by its smallest
  /// recorded one). A token at or above `threshold` for certain (lo) while armed ends an interval (`emit(region
  /// of j, sample)` is called with prev_step, the previous row's step, and the window left open, closed by
  /// finish()); one below `rearm` for certain (hi) while not armed is armed from this step. An uncertain entry
  /// changes nothing: it is never a refresh, and never arms a token.
  template <class Emit>
  void observe(step_t step, std::span<const double> lo, std::span<const double> hi, std::size_t first, std::size_t end,
               double threshold, double rearm, Emit&& emit) {
    if (armed_.size() < end) {
      armed_.resize(end, 0);
      start_.resize(end, 0);
    }
    for (std::size_t j = first; j < end; ++j) {
      if (armed_[j]) {
        if (lo[j] >= threshold) {
          emit(j, static_cast<double>(start_[j]), static_cast<double>(prev_), static_cast<double>(step));
          armed_[j] = 0;
        }
      } else if (hi[j] < rearm) {
        armed_[j] = 1;
        start_[j] = step;
      }
    }
    prev_ = step;
  }

 private:
  std::vector<std::uint8_t> armed_;
  std::vector<step_t> start_;
  step_t prev_ = 0;
};

}  // namespace memdecay::calibration::intervals

#endif  // MEMDECAY_CALIBRATION_INTERVALS_HPP
