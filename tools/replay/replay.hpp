// SPDX-License-Identifier: Apache-2.0
// memdecay-replay's engine: replays trace episodes (memdecay/io/trace.hpp) through an eviction policy on the owning
// block pool under a token budget, and scores the eviction-probe protocol (docs/replay.md).
//
// Per episode, events are applied in file order:
//   segment   : the clock moves to its step, its tokens are appended to the policy and the block pool, and when
//               the resident size exceeds the budget the policy's plan is committed to both (logged, counted);
//   attention : the trace's row (mean over layers) is over absolute positions; the mass on resident tokens is
//               mapped to the resident layout through the sequence's positions, renormalised to sum 1 (what an
//               engine that evicted the rest would report), and observed. The mass that fell on evicted tokens
//               is the attention loss;
//   probe     : the fact survives when every one of its tokens is resident.
// Nothing here reads a clock or a random device: the same traces, policies and budgets give the same numbers.
#ifndef MEMDECAY_TOOLS_REPLAY_HPP
#define MEMDECAY_TOOLS_REPLAY_HPP

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <memdecay/page_tables/block_pool.hpp>
#include <memdecay/core/config.hpp>
#include <memdecay/detail/error.hpp>
#include <memdecay/core/eviction.hpp>
#include <memdecay/policies/h2o.hpp>
#include <memdecay/policies/memdecay.hpp>
#include <memdecay/policies/norm_sum.hpp>
#include <memdecay/policies/priority_lru.hpp>
#include <memdecay/policies/random.hpp>
#include <memdecay/policies/scissorhands.hpp>
#include <memdecay/policies/snapkv.hpp>
#include <memdecay/policies/streaming_llm.hpp>
#include <memdecay/policies/tova.hpp>
#include <memdecay/core/sequence.hpp>
#include <memdecay/core/region.hpp>
#include <memdecay/core/sequence.hpp>
#include <memdecay/io/trace.hpp>

#include "../common/any_sequence.hpp"
#include "../common/policy_catalogue.hpp"

namespace memdecay::replay {

/// One eviction decision, with what made it (for --log-evictions).
struct eviction_record {
  std::size_t page = 0;              ///< logical page index in the resident layout at the time
  std::uint64_t first_position = 0;  ///< absolute position of its first token
  std::size_t tokens = 0;
  double score = 0;
  bool has_terms = false;  ///< decay/attention are the MemDecay terms (other policies: score only)
  double decay = 0;
  double attention = 0;
  std::vector<std::pair<region_id, std::size_t>> regions;  ///< tokens per region, ascending id
};

/// A policy under replay: its sequence (any policy, behind tools/common/any_sequence.hpp) and the block pool it
/// commits through, sized for the episode.
class runner {
 public:
  runner(std::unique_ptr<memdecay_tools::any_sequence> seq, std::size_t total_tokens)
      : seq_(std::move(seq)), pool_(total_tokens / seq_->page_size() + 2, seq_->page_size()) {
    pool_.open(id_);
  }
  void advance_to(step_t step) { seq_->advance_to(step); }
  void append(region_id region, std::size_t tokens) {
    seq_->append(region, tokens);
    pool_.append_tokens(id_, tokens);
  }
  void observe(std::span<const float> mass) { seq_->observe(mass); }
  [[nodiscard]] std::size_t kv_len() const { return seq_->kv_len(); }
  [[nodiscard]] std::uint64_t position_of(std::size_t index) const { return seq_->position_of(index); }
  /// When over budget: plans, commits to the sequence and the block pool together, and returns one record per
  /// evicted page (with its score terms and regions when `explain`); `over_budget` says whether the plan fell
  /// short of the budget (pinned or protected pages alone exceed it).
  std::vector<eviction_record> enforce_budget(bool explain, bool& over_budget) {
    std::vector<eviction_record> out;
    const auto done = memdecay_tools::enforce_budget(*seq_, pool_, id_, [&](const auto& plan) {
      const std::size_t P = seq_->page_size();
      const auto labels = seq_->labels();
      out.reserve(plan.pages.size());
      for (std::size_t k = 0; k < plan.pages.size(); ++k) {
        const std::size_t p = plan.pages[k];
        eviction_record e;
        e.page = p;
        e.first_position = seq_->position_of(p * P);
        e.tokens = P;
        e.score = static_cast<double>(plan.scores[k]);
        if (explain) {
          if (const auto terms = seq_->explain(p)) {
            e.has_terms = true;
            e.decay = terms->decay;
            e.attention = terms->attention;
          }
          std::size_t per_region[256] = {};
          for (std::size_t i = p * P; i < (p + 1) * P; ++i) ++per_region[labels[i]];
          for (std::size_t r = 0; r < 256; ++r)
            if (per_region[r]) e.regions.emplace_back(static_cast<region_id>(r), per_region[r]);
        }
        out.push_back(std::move(e));
      }
    });
    over_budget = done.over_budget;
    return out;
  }

 private:
  std::unique_ptr<memdecay_tools::any_sequence> seq_;
  block_pool<> pool_;
  std::uint64_t id_ = 0;
};

/// A named policy: builds its sequence for one episode from the replay's base config (budget already set).
struct policy_entry {
  std::string name;
  std::string description;
  std::function<std::unique_ptr<memdecay_tools::any_sequence>(const config&)> make;
};

/// MemDecay's and the baselines' parameters (tools/common/policy_catalogue.hpp).
using memdecay_options = memdecay_tools::catalogue_options;

/// Wraps a catalogue entry's sequence behind the tools' one interface.
using entry_wrapper = memdecay_tools::erasing_wrapper<policy_entry>;

/// MemDecay with a normalisation mode (policy_sequence<policies::memdecay>; per-mode defaults unless given).
inline policy_entry memdecay_policy(attention_normalization mode, std::optional<double> alpha = {},
                                    std::optional<double> tau = {}, std::optional<double> beta = {}) {
  entry_wrapper wrap;
  return memdecay_tools::memdecay_entry(mode, memdecay_options::memdecay(alpha, tau, beta), wrap);
}

/// Every policy memdecay-replay compares, in table order: the one catalogue memdecay-eval shares (MemDecay in
/// each normalisation mode, then the baselines with their sources' parameters, docs/policies.md).
inline std::vector<policy_entry> all_policies(const memdecay_options& m, const protection_config& = {}) {
  return memdecay_tools::policy_catalogue(m, entry_wrapper{});
}

/// Per-region numbers of one cell.
struct region_result {
  std::size_t probes = 0;
  std::size_t survived = 0;
  double lost_mass = 0;  ///< attention mass on evicted tokens of this region
  std::uint64_t evicted_tokens = 0;
};

/// One policy x budget x tier cell.
struct cell_result {
  std::string policy;
  double budget = 0;  ///< fraction of each episode's length
  std::string tier;
  std::size_t episodes = 0;
  std::size_t probes = 0;
  std::size_t survived = 0;
  double total_mass = 0;  ///< attention mass observed (sum of the trace rows)
  double lost_mass = 0;   ///< of which on evicted tokens
  std::uint64_t evicted_pages = 0;
  std::uint64_t evicted_tokens = 0;
  std::uint64_t over_budget = 0;  ///< evictions that could not reach the budget (pinned/protected pages)
  std::vector<region_result> regions;

  [[nodiscard]] double survival() const noexcept {
    return probes ? static_cast<double>(survived) / static_cast<double>(probes) : 0.0;
  }
  [[nodiscard]] double attention_loss() const noexcept { return total_mass > 0 ? lost_mass / total_mass : 0.0; }
};

/// What one logged eviction belongs to (for --log-evictions).
struct eviction_context {
  const std::string* policy;
  double budget;
  const std::string* tier;
  std::size_t episode;  ///< index in the tier (the block pool's sequence)
  const std::string* episode_name;
  step_t step;
};
using eviction_sink = std::function<void(const eviction_context&, const eviction_record&)>;

/// The replay settings shared by every policy.
struct replay_settings {
  std::size_t page_size = 16;
  protection_config protection{.sink_pages = 0, .recent_tokens = 16};
  std::vector<region_override> region_overrides{};
};

/// The base config of one episode: the token budget floor(fraction x the episode's length), protections, regions.
inline config episode_config(const replay_settings& s, double fraction, std::uint64_t episode_tokens) {
  config cfg;
  cfg.page_size = s.page_size;
  cfg.protection = s.protection;
  cfg.region_overrides = s.region_overrides;
  cfg.budget = budget_config::tokens(std::floor(fraction * static_cast<double>(episode_tokens)));
  return cfg;
}

/// Throws input_error when `fraction` is outside (0, 1], or the budget of some episode cannot hold its pinned
/// pages (naming the tier, the episode and the sizes).
inline void check_budget(const replay_settings& s, double fraction, const trace::trace_file& file) {
  if (!(fraction > 0.0 && fraction <= 1.0))
    memdecay::detail::raise_input("budget " + memdecay::detail::to_text(fraction) + " is outside (0, 1]");
  const region_table table = default_region_table().with_overrides(s.region_overrides);
  for (std::size_t e = 0; e < file.episodes.size(); ++e) {
    const auto& ep = file.episodes[e];
    std::set<std::uint64_t> pinned_pages;
    std::uint64_t pos = 0;
    for (const auto& ev : ep.events)
      if (const auto* seg = std::get_if<trace::segment>(&ev)) {
        if (table.contains(seg->region) && table.pinned(seg->region))
          for (std::uint64_t p = pos / s.page_size; p <= (pos + seg->tokens - 1) / s.page_size; ++p)
            pinned_pages.insert(p);
        pos += seg->tokens;
      }
    const auto budget = static_cast<std::uint64_t>(std::floor(fraction * static_cast<double>(pos)));
    const std::uint64_t pinned = pinned_pages.size() * s.page_size;
    if (budget < pinned)
      memdecay::detail::raise_input("budget " + memdecay::detail::to_text(fraction) + " of " + file.label +
                                    " episode " + std::to_string(e) + " ('" + ep.name + "') is " +
                                    std::to_string(budget) + " tokens, below its pinned set of " +
                                    std::to_string(pinned) + " tokens (" + std::to_string(pinned_pages.size()) +
                                    " pinned pages of " + std::to_string(s.page_size) + ")");
  }
}

/// Throws input_error unless every region id of the file is in the replay's region table under the same name.
inline void check_regions(const trace::trace_file& file, const region_table& table) {
  for (std::size_t r = 0; r < file.region_names.size(); ++r) {
    if (r >= table.size())
      memdecay::detail::raise_input(file.label + ": trace region " + std::to_string(r) + " ('" + file.region_names[r] +
                                    "') is not in the policy's region table (" + std::to_string(table.size()) +
                                    " regions)");
    if (table[static_cast<region_id>(r)].name != file.region_names[r])
      memdecay::detail::raise_input(file.label + ": trace region " + std::to_string(r) + " is '" +
                                    file.region_names[r] + "', the policy's region table calls it '" +
                                    table[static_cast<region_id>(r)].name + "'");
  }
}

/// Replays one episode through `run` and adds its numbers to `cell`.
inline void replay_episode(const trace::episode& ep, runner& run, cell_result& cell, std::size_t regions,
                           const eviction_context& ctx_in, const eviction_sink& sink) {
  const std::uint64_t total = ep.total_tokens();
  std::vector<std::uint8_t> resident(total, 0);
  std::vector<region_id> label(total);
  std::vector<float> mean, resident_mass;
  std::uint64_t appended = 0;
  eviction_context ctx = ctx_in;
  if (cell.regions.size() < regions) cell.regions.resize(regions);
  ++cell.episodes;
  for (const auto& ev : ep.events) {
    if (const auto* s = std::get_if<trace::segment>(&ev)) {
      run.advance_to(s->step);
      run.append(s->region, s->tokens);
      std::fill_n(resident.begin() + static_cast<std::ptrdiff_t>(appended), s->tokens, std::uint8_t{1});
      std::fill_n(label.begin() + static_cast<std::ptrdiff_t>(appended), s->tokens, s->region);
      appended += s->tokens;
      bool over = false;
      const auto evicted = run.enforce_budget(static_cast<bool>(sink), over);
      cell.over_budget += over ? 1 : 0;
      ctx.step = s->step;
      for (const auto& e : evicted) {
        for (std::uint64_t j = e.first_position; j < e.first_position + e.tokens; ++j) {
          resident[j] = 0;
          ++cell.regions[label[j]].evicted_tokens;
        }
        ++cell.evicted_pages;
        cell.evicted_tokens += e.tokens;
        if (sink) sink(ctx, e);
      }
    } else if (const auto* a = std::get_if<trace::attention>(&ev)) {
      run.advance_to(a->step);
      std::span<const float> row;
      if (a->layers.size() == 1 && !a->layers[0].sparse) {
        row = a->layers[0].mass;
      } else {
        mean.assign(a->context, 0.0f);
        const float w = 1.0f / static_cast<float>(a->layers.size());
        for (const auto& layer : a->layers) layer.accumulate(mean, w);
        row = mean;
      }
      double on_resident = 0;
      for (std::size_t j = 0; j < row.size(); ++j) {
        cell.total_mass += row[j];
        if (!resident[j]) {
          cell.lost_mass += row[j];
          cell.regions[label[j]].lost_mass += row[j];
        }
      }
      const std::size_t n = run.kv_len();
      resident_mass.resize(n);
      for (std::size_t i = 0; i < n; ++i) {
        resident_mass[i] = row[run.position_of(i)];
        on_resident += resident_mass[i];
      }
      if (on_resident > 0) {
        const float scale = static_cast<float>(1.0 / on_resident);
        for (float& m : resident_mass) m *= scale;
      }
      run.observe(resident_mass);
    } else if (const auto* probe = std::get_if<trace::probe>(&ev)) {
      const auto& p = *probe;
      run.advance_to(p.step);
      bool alive = true;
      for (std::uint64_t j = p.first; j < std::uint64_t{p.first} + p.length; ++j) alive = alive && resident[j];
      ++cell.probes;
      ++cell.regions[p.region].probes;
      if (alive) {
        ++cell.survived;
        ++cell.regions[p.region].survived;
      }
    }  // a reference event (the workload re-read a span) is for calibration: replay scores by attention only
  }
}

/// Replays every episode of `file` under one policy and budget. `progress` (optional) is called after each
/// episode.
inline cell_result replay_tier(const trace::trace_file& file, const policy_entry& policy, double fraction,
                               const replay_settings& settings, const eviction_sink& sink = {},
                               const std::function<void()>& progress = {}) {
  cell_result cell;
  cell.policy = policy.name;
  cell.budget = fraction;
  cell.tier = file.label;
  cell.regions.resize(file.region_names.size());
  for (std::size_t e = 0; e < file.episodes.size(); ++e) {
    const auto& ep = file.episodes[e];
    const auto total = ep.total_tokens();
    runner run(policy.make(episode_config(settings, fraction, total)), static_cast<std::size_t>(total));
    const eviction_context ctx{&cell.policy, fraction, &file.label, e, &ep.name, 0};
    replay_episode(ep, run, cell, file.region_names.size(), ctx, sink);
    if (progress) progress();
  }
  return cell;
}

}  // namespace memdecay::replay

#endif  // MEMDECAY_TOOLS_REPLAY_HPP
