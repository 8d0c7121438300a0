// SPDX-License-Identifier: Apache-2.0
// memdecay-eval's run model: the settings of an evaluation, the schedule an episode is cut into (steps and the
// probes after each), the counts one run produces, and the memdecay config of one run. harness.hpp runs them.
#ifndef MEMDECAY_TOOLS_EVAL_RUN_TYPES_HPP
#define MEMDECAY_TOOLS_EVAL_RUN_TYPES_HPP

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <memdecay/core/config.hpp>
#include <memdecay/core/region.hpp>
#include <memdecay/page_tables/block_pool.hpp>

#include "episodes.hpp"

namespace memdecay_eval {

namespace md = memdecay;

/// The page table every session exposes.
using pool_type = md::block_pool<std::int32_t, std::uint64_t>;
/// What the test hook sees, in call order.
enum class call_kind { policy_append, session_append, policy_observe, advance, select, commit, probe };
struct call_event {
  call_kind what;
  std::size_t step;      ///< the step index (the clock before advance)
  std::size_t value;     ///< tokens (appends, observe: the mass length), the new clock (advance), pages (select,
                         ///< commit), tokens processed (probe)
  std::size_t resident;  ///< the policy's resident tokens after the call
};

struct eval_settings {
  std::vector<double> budgets{0.25, 0.5, 0.75};  ///< fractions of each episode's tokens
  std::size_t prefill_chunk = 32;                ///< tokens per step in prefilled segments
  md::protection_config protection{.sink_pages = 0, .recent_tokens = 16};
  std::vector<md::region_override> region_overrides{};  ///< e.g. a calibration's fitted decay rates
  bool fork = true;                    ///< start policy runs from the full cache at the first over-budget step
  std::size_t max_new = 1;             ///< tokens decoded per probe (the first must be the answer)
  std::size_t ceiling_page_size = 16;  ///< page size of the full-cache (ceiling) run
  bool trace_attention = true;         ///< recorded traces carry the attention rows (else segments, references, probes)
  /// Test hook: every call of the unforked part of every policy run, in order (must be thread-safe when threads
  /// > 1). Empty in memdecay-eval.
  std::function<void(const std::string& config, double budget, const call_event&)> on_call{};
};

/// One step of an episode: tokens [first, first + count) of one region.
struct step {
  md::region_id region = 0;
  std::uint32_t first = 0;
  std::uint32_t count = 0;
  [[nodiscard]] std::uint32_t end() const noexcept { return first + count; }
};

/// The steps of an episode and the probes asked after each.
struct schedule {
  std::vector<step> steps;
  std::vector<std::vector<std::size_t>> probes_after;  ///< per step: indices into episode.probes
};

/// Cuts an episode into steps: `prefill_chunk` tokens of prefilled segments, one token of generated ones, never
/// crossing a segment boundary or a probe's `at`.
inline schedule make_schedule(const episode& ep, std::size_t prefill_chunk) {
  if (prefill_chunk == 0) throw std::invalid_argument("prefill chunk must be at least 1 token");
  schedule s;
  std::size_t next_probe = 0;  // probes are sorted by `at`
  for (const auto& seg : ep.segments) {
    const std::uint32_t chunk = seg.generated ? 1u : static_cast<std::uint32_t>(prefill_chunk);
    std::uint32_t pos = seg.first;
    while (pos < seg.end()) {
      std::uint32_t n = std::min(chunk, seg.end() - pos);
      while (next_probe < ep.probes.size() && ep.probes[next_probe].at <= pos) ++next_probe;  // asked already
      if (next_probe < ep.probes.size() && ep.probes[next_probe].at < pos + n) n = ep.probes[next_probe].at - pos;
      s.steps.push_back({seg.id, pos, n});
      std::vector<std::size_t> after;
      for (std::size_t k = next_probe; k < ep.probes.size() && ep.probes[k].at == pos + n; ++k) after.push_back(k);
      s.probes_after.push_back(std::move(after));
      pos += n;
    }
  }
  return s;
}

/// Probe counts of one region.
struct region_counts {
  std::uint64_t probes = 0;
  std::uint64_t recalled = 0;  ///< the model answered correctly under this policy
  std::uint64_t survived = 0;  ///< every token of the fact was resident when asked
  std::uint64_t ceiling = 0;   ///< the full cache answered correctly (the same probes)
  void add(const region_counts& o) noexcept {
    probes += o.probes;
    recalled += o.recalled;
    survived += o.survived;
    ceiling += o.ceiling;
  }
};

/// One configuration (policy, page size, budget) over some episodes, or the full cache.
struct run_result {
  std::vector<region_counts> regions = std::vector<region_counts>(md::regions::default_count);
  std::uint64_t episodes = 0, tokens = 0, steps = 0;
  std::uint64_t budget_tokens = 0;  ///< sum over episodes of the token budget
  std::uint64_t evicted_pages = 0, evicted_tokens = 0;
  std::uint64_t over_budget_steps = 0;  ///< steps left above the budget because pinned/protected pages exceed it
  std::uint64_t budget_violations = 0;  ///< steps above the budget without that reason (a bug: always 0)
  std::uint64_t forked_steps = 0;       ///< steps taken from the full-cache run (fork)
  std::uint64_t max_resident = 0;       ///< the most resident tokens after any step of any episode
  /// Policies on the attention-free signal: the summed total variation distance between the estimated and the
  /// measured per-page attention, over `signal_steps` steps (any_sequence.hpp's signal_error).
  double signal_tv_sum = 0;
  std::uint64_t signal_steps = 0;
  /// Policies with a host tier: pages promoted back to the device, demoted to the host (by eviction or to make room
  /// for a promotion), dropped from the host, recall plans that promoted something, and the K/V bytes the host
  /// pool's copies moved (both directions, the engine's fp32 blocks).
  std::uint64_t promoted_pages = 0, demoted_pages = 0, host_dropped_pages = 0, recalls = 0, moved_bytes = 0;
  /// The oracle: runs whose plan its solver could not prove optimal within its search limit (oracle::solve_limits);
  /// their recall is then a lower bound of the ceiling. Always 0 on docs/findings.md's episodes.
  std::uint64_t oracle_unproven = 0;

  void merge(const run_result& o) {
    for (std::size_t r = 0; r < regions.size(); ++r) regions[r].add(o.regions[r]);
    episodes += o.episodes;
    tokens += o.tokens;
    steps += o.steps;
    budget_tokens += o.budget_tokens;
    evicted_pages += o.evicted_pages;
    evicted_tokens += o.evicted_tokens;
    over_budget_steps += o.over_budget_steps;
    budget_violations += o.budget_violations;
    forked_steps += o.forked_steps;
    max_resident = std::max(max_resident, o.max_resident);
    signal_tv_sum += o.signal_tv_sum;
    signal_steps += o.signal_steps;
    promoted_pages += o.promoted_pages;
    demoted_pages += o.demoted_pages;
    host_dropped_pages += o.host_dropped_pages;
    recalls += o.recalls;
    moved_bytes += o.moved_bytes;
    oracle_unproven += o.oracle_unproven;
  }
  [[nodiscard]] region_counts total() const noexcept {
    region_counts t;
    for (const auto& r : regions) t.add(r);
    return t;
  }
  /// Probes of pinned (true) or unpinned (false) regions under `table`.
  [[nodiscard]] region_counts by_pinned(const md::region_table& table, bool pinned) const {
    region_counts t;
    for (std::size_t r = 0; r < regions.size() && r < table.size(); ++r)
      if (table.pinned(static_cast<md::region_id>(r)) == pinned) t.add(regions[r]);
    return t;
  }
  friend bool operator==(const run_result& a, const run_result& b) {
    if (a.regions.size() != b.regions.size()) return false;
    for (std::size_t r = 0; r < a.regions.size(); ++r) {
      const auto &x = a.regions[r], &y = b.regions[r];
      if (x.probes != y.probes || x.recalled != y.recalled || x.survived != y.survived || x.ceiling != y.ceiling)
        return false;
    }
    return a.episodes == b.episodes && a.tokens == b.tokens && a.steps == b.steps &&
           a.budget_tokens == b.budget_tokens && a.evicted_pages == b.evicted_pages &&
           a.evicted_tokens == b.evicted_tokens && a.over_budget_steps == b.over_budget_steps &&
           a.budget_violations == b.budget_violations && a.max_resident == b.max_resident &&
           a.promoted_pages == b.promoted_pages && a.demoted_pages == b.demoted_pages &&
           a.host_dropped_pages == b.host_dropped_pages && a.recalls == b.recalls && a.moved_bytes == b.moved_bytes &&
           a.oracle_unproven == b.oracle_unproven;
  }
};

/// An episode's token budget under a fraction: floor(fraction x its tokens).
[[nodiscard]] inline std::uint64_t budget_of(double fraction, std::size_t episode_tokens) {
  return static_cast<std::uint64_t>(std::floor(fraction * static_cast<double>(episode_tokens)));
}

/// The memdecay config of one run.
inline md::config run_config(const eval_settings& s, std::size_t page_size, std::uint64_t budget) {
  md::config cfg;
  cfg.page_size = page_size;
  cfg.protection = s.protection;
  cfg.region_overrides = s.region_overrides;
  cfg.budget = md::budget_config::tokens(static_cast<double>(budget));
  return cfg;
}

/// Sums per-layer rows into one per-token row, checking the shape the engine returned.
inline void sum_layers(const std::vector<std::vector<float>>& layer_mass, std::size_t expected,
                       std::vector<float>& out) {
  if (layer_mass.empty()) throw std::runtime_error("the session returned no attention rows");
  out.assign(expected, 0.0f);
  for (std::size_t l = 0; l < layer_mass.size(); ++l) {
    if (layer_mass[l].size() != expected)
      throw std::runtime_error("the session's layer " + std::to_string(l) + " attention row has " +
                               std::to_string(layer_mass[l].size()) + " entries, the policy has " +
                               std::to_string(expected) + " resident tokens");
    for (std::size_t i = 0; i < expected; ++i) out[i] += layer_mass[l][i];
  }
}

}  // namespace memdecay_eval

#endif  // MEMDECAY_TOOLS_EVAL_RUN_TYPES_HPP
