// SPDX-License-Identifier: Apache-2.0
// memdecay-eval's harness: runs evaluation episodes (episodes.hpp) through a model with a paged KV cache while an
// eviction policy evicts online, and scores recall probes. docs/eval.md describes the protocol.
//
// The harness is generic in the session type, so tests drive it with a small fake model and memdecay-eval with
// the real engine (engine/tiny_lm.hpp). A Session needs (the contract of tools/eval/engine/tiny_lm.hpp):
//
//   step_result append(std::span<const std::int32_t>)   // .layer_mass[layer][resident token, block-table order]
//   std::vector<std::int32_t> answer(std::span<const std::int32_t> prompt, std::size_t max_new) const
//   pool_type& table();  std::uint64_t sequence() const;  std::size_t resident_tokens() const;
//
// with pool_type = memdecay::block_pool<std::int32_t, std::uint64_t>; it is made by a factory
// (page_size, max_tokens) -> Session. When Session is copy-constructible, the harness forks: see `fork` below.
//
// One episode under one policy, page size and budget B (floor(budget x the episode's tokens)). The episode is cut
// into steps: prefilled segments (system, user, tool_out, retrieval) enter `prefill_chunk` tokens per step,
// generated ones (plan, tool_in, scratchpad) one token per step, and a step never crosses a segment boundary or a
// probe's `at`. Step i (the logical clock reads i):
//
//   policy.append(region, n); session.append(chunk) -> per-layer attention rows over the resident tokens;
//   policy.observe(rows summed over layers); policy.advance_to(i + 1);
//   if resident > B: plan = policy.select_for_budget(); policy.commit(plan, session.table(), session.sequence());
//   every probe whose `at` is the number of tokens processed so far: session.answer([query, key], max_new); the
//   probe is recalled when the first generated token is its answer (the session is unchanged: no pollution).
//
// Eviction therefore compounds: the model computes every later token from the survivors. The full cache (no
// policy, no budget) gives the ceiling. Nothing here reads a clock or a random device, and per-episode results
// are merged in episode order, so results do not depend on the number of threads.
//
// Forking (fork = true, Session copyable): until resident tokens first exceed B no policy evicts anything, so
// every policy's run up to that step is the full-cache run. The harness runs the full cache once per page size,
// keeps a copy of the session at each budget's first over-budget step and the layer-summed attention of every
// step before it, and starts each policy run from that copy after feeding the policy the same calls it would
// have seen (append, observe, advance; probes before the fork are the full cache's answers). The results equal
// the unforked run's (tests/tools/eval_harness_test.cpp) and about half the model's work is saved.
#ifndef MEMDECAY_TOOLS_EVAL_HARNESS_HPP
#define MEMDECAY_TOOLS_EVAL_HARNESS_HPP

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <memdecay/page_tables/block_pool.hpp>
#include <memdecay/core/config.hpp>
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
#include <memdecay/io/trace.hpp>

#include "../common/any_sequence.hpp"
#include "../common/policy_catalogue.hpp"
#include "episodes.hpp"
#include "oracle.hpp"

namespace memdecay_eval {

namespace md = memdecay;

/// The page table every session exposes.
using pool_type = md::block_pool<std::int32_t, std::uint64_t>;

// ------------------------------------------------------------------------------------------------------------
// Policies
// ------------------------------------------------------------------------------------------------------------

/// A policy by name, with a factory that builds its sequence from the run's config (budget, page size, protections
/// and region overrides already set).
struct policy_kind {
  std::string name;
  std::string description;
  std::function<std::unique_ptr<memdecay_tools::any_sequence>(const md::config&)> make;
  bool oracle = false;  ///< the clairvoyant evictor (oracle.hpp): built per episode from its needs, not by `make`
};

/// The oracle (oracle.hpp): the most needs any evictor can serve at the run's budget, protections and page size.
inline policy_kind oracle_kind() {
  policy_kind k;
  k.name = "oracle";
  k.description = "clairvoyant: the exact optimum of the offline residency problem (0-1 program, GLPK), probes first";
  k.oracle = true;
  return k;
}

/// MemDecay's and the baselines' parameters (tools/common/policy_catalogue.hpp).
using memdecay_options = memdecay_tools::catalogue_options;

/// Wraps a catalogue entry's sequence behind the tools' one interface (tools/common/any_sequence.hpp).
using kind_wrapper = memdecay_tools::erasing_wrapper<policy_kind>;

/// MemDecay in one normalisation mode, always through policy_sequence<policies::memdecay>.
inline policy_kind memdecay_kind(md::attention_normalization mode, const memdecay_options& m = {}) {
  kind_wrapper wrap;
  return memdecay_tools::memdecay_entry(mode, m, wrap);
}

/// Every policy memdecay-eval knows, in table order: the one catalogue memdecay-replay shares, the baselines with
/// their sources' parameters (docs/policies.md).
inline std::vector<policy_kind> all_policy_kinds(const memdecay_options& m, const md::protection_config& = {}) {
  return memdecay_tools::policy_catalogue(m, kind_wrapper{});
}

/// The ablations of MemDecay (name "memdecay-<mode>+<variant>"):
///   prior-only      alpha 0: the region prior b_r exp(-lambda_r dt) alone (attention still refreshes the clock
///                   above tau, but adds nothing to the score);
///   attention-only  every region b_r = 1 and lambda_r = 0: the attention EWMA alone, regions ignored (pinning
///                   kept, like every policy here);
///   no-refresh      tau = 1e30: attention never resets a token's decay clock;
///   recent-half     protection.recent_fraction = 0.5: the pages holding the last half of the budget's tokens
///                   kept, as H2O keeps its recent window;
///   page-max        a page scores its best token instead of the mean of its tokens.
inline const std::vector<std::string>& ablation_variants() {
  static const std::vector<std::string> v{"prior-only", "attention-only", "no-refresh", "recent-half", "page-max"};
  return v;
}

inline policy_kind memdecay_ablation(md::attention_normalization mode, const std::string& variant,
                                     const memdecay_options& m = {}) {
  memdecay_options o = m;
  if (variant == "prior-only")
    o.alpha = 0.0;
  else if (variant == "no-refresh")
    o.tau = 1e30;
  else if (variant == "page-max")
    o.memdecay_page_max = true;
  else if (variant != "attention-only" && variant != "recent-half")
    throw std::invalid_argument("unknown MemDecay ablation '" + variant + "'");
  policy_kind k = memdecay_kind(mode, o);
  k.name += "+" + variant;
  k.description += "; ablation: " + variant;
  auto make = k.make;
  k.make = [make, variant](const md::config& base) {
    md::config cfg = base;
    if (variant == "attention-only") {
      const md::region_table table = cfg.effective_regions();
      for (const auto& r : table.params())
        cfg.region_overrides.push_back({.region = r.name, .base_priority = 1.0, .decay_rate = 0.0});
    }
    if (variant == "recent-half") cfg.protection.recent_fraction = 0.5;
    return make(cfg);
  };
  return k;
}

/// `kind` with no region pinned (name "<name>-unpinned"): a baseline as its source runs it, without knowing
/// regions, so the system prompt competes like any other page. (Every policy otherwise runs under the same
/// evictor with the same pinned regions.)
inline policy_kind unpinned_variant(const policy_kind& kind) {
  policy_kind k;
  k.name = kind.name + "-unpinned";
  k.description = kind.description + "; no region pinned";
  auto make = kind.make;
  k.make = [make](const md::config& base) {
    md::config cfg = base;
    const md::region_table table = cfg.effective_regions();
    for (const auto& r : table.params())
      if (r.pinned) cfg.region_overrides.push_back({.region = r.name, .pinned = false});
    return make(cfg);
  };
  return k;
}

/// A policy at a page size: one row of the results.
struct config_spec {
  policy_kind kind;
  std::size_t page_size = 16;
  [[nodiscard]] std::string label() const { return kind.name + "/p" + std::to_string(page_size); }
};

// ------------------------------------------------------------------------------------------------------------
// Settings, schedule, results
// ------------------------------------------------------------------------------------------------------------

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
           a.budget_violations == b.budget_violations && a.max_resident == b.max_resident;
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

/// The results of one episode: the full cache, and one per config x budget (index config * budgets + budget).
struct episode_outcome {
  run_result full;
  std::vector<run_result> cells;
  std::optional<md::trace::episode> trace;  ///< the full-cache run as a trace (when asked)
};

template <class Session>
using session_factory = std::function<Session(std::size_t page_size, std::size_t max_tokens)>;

namespace detail {

/// The full-cache run at one page size: per-probe answers, and for forking the layer-summed rows of every step
/// and a copy of the session at each budget's fork step.
template <class Session>
struct full_run {
  std::vector<std::uint8_t> answers;             ///< per probe: recalled
  std::vector<std::vector<float>> mass;          ///< per step (fork only)
  std::vector<std::size_t> fork_step;            ///< per budget: first step whose end exceeds the budget
  std::vector<std::optional<Session>> snapshot;  ///< per budget: the session before that step
};

inline bool answered(const std::vector<std::int32_t>& out, std::int32_t answer) {
  return !out.empty() && out.front() == answer;
}

template <class Session>
full_run<Session> run_full(const episode& ep, const schedule& sch, const episode_vocab& vocab,
                           const session_factory<Session>& make, std::size_t page_size, const eval_settings& s,
                           bool fork, md::trace::episode* trace) {
  full_run<Session> out;
  const std::size_t n = ep.tokens.size();
  out.answers.assign(ep.probes.size(), 0);
  out.fork_step.assign(s.budgets.size(), sch.steps.size());
  out.snapshot.resize(s.budgets.size());
  for (std::size_t b = 0; b < s.budgets.size(); ++b) {
    const auto budget = budget_of(s.budgets[b], n);
    for (std::size_t i = 0; i < sch.steps.size(); ++i)
      if (sch.steps[i].end() > budget) {
        out.fork_step[b] = i;
        break;
      }
  }
  Session session = make(page_size, n);
  std::vector<float> row;
  if (fork) out.mass.resize(sch.steps.size());
  for (std::size_t i = 0; i < sch.steps.size(); ++i) {
    const auto& st = sch.steps[i];
    if constexpr (std::is_copy_constructible_v<Session>)
      if (fork)
        for (std::size_t b = 0; b < s.budgets.size(); ++b)
          if (out.fork_step[b] == i) out.snapshot[b].emplace(session);
    auto r = session.append(std::span<const std::int32_t>(ep.tokens.data() + st.first, st.count));
    sum_layers(r.layer_mass, st.end(), row);
    if (session.resident_tokens() != st.end())
      throw std::runtime_error("the full-cache session holds " + std::to_string(session.resident_tokens()) +
                               " tokens after " + std::to_string(st.end()) + " were appended");
    if (fork) out.mass[i] = row;
    if (trace) {
      trace->events.emplace_back(md::trace::segment{static_cast<md::step_t>(i), st.region, st.count});
      md::trace::attention a;
      a.step = static_cast<md::step_t>(i);
      a.context = st.end();
      for (auto& layer : r.layer_mass) a.layers.push_back({.sparse = false, .positions = {}, .mass = std::move(layer)});
      trace->events.emplace_back(std::move(a));
    }
    for (std::size_t k : sch.probes_after[i]) {
      const auto& p = ep.probes[k];
      const std::int32_t prompt[2] = {vocab.query, p.key};
      out.answers[k] = answered(session.answer(std::span<const std::int32_t>(prompt, 2), s.max_new), p.answer) ? 1 : 0;
      if (trace)
        trace->events.emplace_back(md::trace::probe{static_cast<md::step_t>(i + 1), static_cast<std::uint32_t>(k), p.id,
                                                    p.fact_first, p.fact_length});
    }
  }
  return out;
}

/// One policy run of one episode (from a fork of the full cache, or from scratch).
template <class Session>
run_result run_policy(const episode& ep, const schedule& sch, const episode_vocab& vocab,
                      const session_factory<Session>& make, const config_spec& spec, std::size_t budget_index,
                      const eval_settings& s, const full_run<Session>* fork_from, const full_run<Session>& ceiling) {
  const std::size_t n = ep.tokens.size();
  const double fraction = s.budgets[budget_index];
  const std::uint64_t budget = budget_of(fraction, n);
  run_result res;
  res.episodes = 1;
  res.tokens = n;
  res.steps = sch.steps.size();
  res.budget_tokens = budget;
  const md::config cfg = run_config(s, spec.page_size, budget);
  std::unique_ptr<memdecay_tools::any_sequence> policy;
  if (spec.kind.oracle) {
    std::vector<std::uint32_t> step_end;
    for (const auto& st : sch.steps) step_end.push_back(st.end());
    const auto plan =
        oracle::solve(oracle::make_problem(ep, step_end, sch.probes_after, vocab.query, spec.page_size, budget,
                                           cfg.effective_protection(spec.page_size, n), cfg.effective_regions()));
    using seq = md::policy_sequence<oracle::planned>;
    policy = memdecay_tools::erase(seq(cfg, {std::make_shared<const std::vector<std::size_t>>(plan.departure)}));
  } else {
    policy = spec.kind.make(cfg);
  }
  const std::string label = spec.label();
  auto hook = [&](call_kind what, std::size_t i, std::size_t value) {
    if (s.on_call) s.on_call(label, fraction, {what, i, value, policy->kv_len()});
  };
  auto count_probe = [&](std::size_t k, bool recalled, bool survived) {
    auto& c = res.regions[ep.probes[k].id];
    ++c.probes;
    c.recalled += recalled ? 1 : 0;
    c.survived += survived ? 1 : 0;
    c.ceiling += ceiling.answers[k];
  };

  std::optional<Session> own;
  std::size_t start = 0;
  if (fork_from != nullptr && fork_from->snapshot[budget_index]) {
    own.emplace(*fork_from->snapshot[budget_index]);
    start = fork_from->fork_step[budget_index];
    for (std::size_t i = 0; i < start; ++i) {  // what the policy would have seen: no eviction before `start`
      const auto& st = sch.steps[i];
      policy->append(st.region, st.count);
      policy->observe(fork_from->mass[i]);
      policy->advance_to(static_cast<md::step_t>(i + 1));
      res.max_resident = std::max<std::uint64_t>(res.max_resident, policy->kv_len());
      for (std::size_t k : sch.probes_after[i]) count_probe(k, fork_from->answers[k] != 0, true);
    }
    res.forked_steps = start;
  } else if (fork_from != nullptr) {  // the budget is never exceeded: the whole run is the full cache's
    for (std::size_t i = 0; i < sch.steps.size(); ++i) {
      const auto& st = sch.steps[i];
      policy->append(st.region, st.count);
      policy->observe(fork_from->mass[i]);
      policy->advance_to(static_cast<md::step_t>(i + 1));
      res.max_resident = std::max<std::uint64_t>(res.max_resident, policy->kv_len());
      for (std::size_t k : sch.probes_after[i]) count_probe(k, fork_from->answers[k] != 0, true);
    }
    res.forked_steps = sch.steps.size();
    return res;
  } else {
    own.emplace(make(spec.page_size, n));
  }
  Session& session = *own;

  std::vector<float> row;
  std::vector<std::uint8_t> resident;
  for (std::size_t i = start; i < sch.steps.size(); ++i) {
    const auto& st = sch.steps[i];
    policy->append(st.region, st.count);
    hook(call_kind::policy_append, i, st.count);
    auto r = session.append(std::span<const std::int32_t>(ep.tokens.data() + st.first, st.count));
    hook(call_kind::session_append, i, st.count);
    sum_layers(r.layer_mass, policy->kv_len(), row);
    policy->observe(row);
    hook(call_kind::policy_observe, i, row.size());
    policy->advance_to(static_cast<md::step_t>(i + 1));
    hook(call_kind::advance, i, i + 1);
    const auto e = memdecay_tools::enforce_budget(*policy, session.table(), session.sequence());
    if (e.selected) {
      hook(call_kind::select, i, e.pages);
      if (e.pages > 0) hook(call_kind::commit, i, e.pages);
    }
    res.evicted_pages += e.pages;
    res.evicted_tokens += e.pages * spec.page_size;
    const std::size_t kv = policy->kv_len();
    if (session.resident_tokens() != kv)
      throw std::runtime_error(label + ": the session holds " + std::to_string(session.resident_tokens()) +
                               " tokens, the policy " + std::to_string(kv) + " (step " + std::to_string(i) + ")");
    res.max_resident = std::max<std::uint64_t>(res.max_resident, kv);
    if (kv > budget) {
      if (e.over_budget)
        ++res.over_budget_steps;
      else
        ++res.budget_violations;
    }
    if (sch.probes_after[i].empty()) continue;
    resident.assign(n, 0);
    for (std::size_t j = 0; j < kv; ++j) resident[policy->position_of(j)] = 1;
    for (std::size_t k : sch.probes_after[i]) {
      const auto& p = ep.probes[k];
      bool alive = true;
      for (std::uint32_t j = p.fact_first; j < p.fact_first + p.fact_length; ++j) alive = alive && resident[j] != 0;
      const std::int32_t prompt[2] = {vocab.query, p.key};
      const bool ok = answered(session.answer(std::span<const std::int32_t>(prompt, 2), s.max_new), p.answer);
      hook(call_kind::probe, i, st.end());
      count_probe(k, ok, alive);
    }
  }
  return res;
}

}  // namespace detail

/// Evaluates one episode under the full cache and every config x budget. `trace` (optional) receives the
/// full-cache run as a trace episode.
template <class Session>
episode_outcome evaluate_episode(const episode& ep, const episode_vocab& vocab, const session_factory<Session>& make,
                                 const std::vector<config_spec>& configs, const eval_settings& s, bool record_trace,
                                 const std::function<void()>& progress = {}) {
  const schedule sch = make_schedule(ep, s.prefill_chunk);
  const bool fork = s.fork && std::is_copy_constructible_v<Session>;
  episode_outcome out;
  // Full-cache runs: the ceiling page size first (it is the reported ceiling and the recorded trace), then, when
  // forking, every other page size the configs use.
  std::map<std::size_t, detail::full_run<Session>> full;
  md::trace::episode trace;
  full.emplace(s.ceiling_page_size,
               detail::run_full(ep, sch, vocab, make, s.ceiling_page_size, s, fork, record_trace ? &trace : nullptr));
  if (progress) progress();
  const auto& ceiling = full.at(s.ceiling_page_size);
  if (fork)
    for (const auto& c : configs)
      if (!full.contains(c.page_size))
        full.emplace(c.page_size, detail::run_full(ep, sch, vocab, make, c.page_size, s, true, nullptr));
  out.full.episodes = 1;
  out.full.tokens = ep.tokens.size();
  out.full.steps = sch.steps.size();
  out.full.budget_tokens = ep.tokens.size();
  out.full.max_resident = ep.tokens.size();
  for (std::size_t k = 0; k < ep.probes.size(); ++k) {
    auto& c = out.full.regions[ep.probes[k].id];
    ++c.probes;
    c.recalled += ceiling.answers[k];
    c.survived += 1;
    c.ceiling += ceiling.answers[k];
  }
  if (record_trace) out.trace = std::move(trace);
  out.cells.reserve(configs.size() * s.budgets.size());
  for (const auto& c : configs)
    for (std::size_t b = 0; b < s.budgets.size(); ++b) {
      const detail::full_run<Session>* from = fork ? &full.at(c.page_size) : nullptr;
      out.cells.push_back(detail::run_policy(ep, sch, vocab, make, c, b, s, from, ceiling));
      if (progress) progress();
    }
  return out;
}

/// Runs fn(0..count-1) on `threads` threads (items are taken in order; the first exception, by item index, is
/// rethrown after every thread has stopped).
inline void parallel_for(std::size_t count, std::size_t threads, const std::function<void(std::size_t)>& fn) {
  threads = std::max<std::size_t>(1, std::min(threads, count));
  if (threads == 1) {
    for (std::size_t i = 0; i < count; ++i) fn(i);
    return;
  }
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex m;
  std::size_t failed_at = count;
  std::exception_ptr error;
  auto worker = [&] {
    for (;;) {
      const std::size_t i = next.fetch_add(1);
      if (i >= count || failed.load()) return;
      try {
        fn(i);
      } catch (...) {
        std::lock_guard lock(m);
        if (i < failed_at) {
          failed_at = i;
          error = std::current_exception();
        }
        failed.store(true);
      }
    }
  };
  std::vector<std::thread> pool;
  for (std::size_t t = 0; t < threads; ++t) pool.emplace_back(worker);
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

/// One model x tier to evaluate.
template <class Session>
struct eval_target {
  std::string model;
  const episode_file* file = nullptr;
  session_factory<Session> make;
  std::size_t max_episodes = 0;    ///< 0: every episode of the file
  std::size_t trace_episodes = 0;  ///< record the full-cache run of the first N episodes as a trace
  std::vector<md::region_override> region_overrides{};  ///< added to the settings' (e.g. this model's calibration)
  [[nodiscard]] std::size_t episodes() const {
    return max_episodes == 0 ? file->episodes.size() : std::min(max_episodes, file->episodes.size());
  }
};

/// The results of one target: the full cache and each config x budget (index config * budgets + budget), merged
/// over its episodes in episode order; the recorded trace episodes.
struct target_result {
  run_result full;
  std::vector<run_result> cells;
  std::vector<md::trace::episode> trace;
  std::vector<episode_outcome> episodes;  ///< per episode (the bootstrap resamples them), without traces
};

/// Evaluates every target on `threads` threads (the unit of work is one episode of one target). `progress` is
/// called (from the worker threads, serialised) after each full-cache or policy run of an episode with (done,
/// total). Results do not depend on `threads`.
template <class Session>
std::vector<target_result> evaluate(const std::vector<eval_target<Session>>& targets,
                                    const std::vector<config_spec>& configs, const eval_settings& s,
                                    std::size_t threads,
                                    const std::function<void(std::size_t, std::size_t)>& progress = {}) {
  struct job {
    std::size_t target, episode;
  };
  std::vector<job> jobs;
  for (std::size_t t = 0; t < targets.size(); ++t)
    for (std::size_t e = 0; e < targets[t].episodes(); ++e) jobs.push_back({t, e});
  // Longest episodes first, so the last jobs are short (the merge below restores episode order).
  std::stable_sort(jobs.begin(), jobs.end(), [&](const job& a, const job& b) {
    return targets[a.target].file->episodes[a.episode].tokens.size() >
           targets[b.target].file->episodes[b.episode].tokens.size();
  });
  std::vector<eval_settings> settings(targets.size(), s);
  for (std::size_t t = 0; t < targets.size(); ++t)
    for (const auto& o : targets[t].region_overrides) settings[t].region_overrides.push_back(o);
  std::vector<std::vector<std::optional<episode_outcome>>> outcomes(targets.size());
  for (std::size_t t = 0; t < targets.size(); ++t) outcomes[t].resize(targets[t].episodes());
  const std::size_t total = jobs.size() * (1 + configs.size() * s.budgets.size());
  std::mutex m;
  std::size_t done = 0;
  std::function<void()> tick;
  if (progress)
    tick = [&] {
      std::lock_guard lock(m);
      progress(++done, total);
    };
  parallel_for(jobs.size(), threads, [&](std::size_t j) {
    const auto& tg = targets[jobs[j].target];
    const auto& ep = tg.file->episodes[jobs[j].episode];
    outcomes[jobs[j].target][jobs[j].episode] = evaluate_episode<Session>(
        ep, tg.file->vocab, tg.make, configs, settings[jobs[j].target], jobs[j].episode < tg.trace_episodes, tick);
  });
  std::vector<target_result> out(targets.size());
  for (std::size_t t = 0; t < targets.size(); ++t) {
    out[t].cells.resize(configs.size() * s.budgets.size());
    for (std::size_t e = 0; e < outcomes[t].size(); ++e) {
      auto& o = *outcomes[t][e];
      out[t].full.merge(o.full);
      for (std::size_t c = 0; c < o.cells.size(); ++c) out[t].cells[c].merge(o.cells[c]);
      if (o.trace) {
        o.trace->name = targets[t].model + "/" + targets[t].file->label() + "/" + std::to_string(e);
        out[t].trace.push_back(std::move(*o.trace));
        o.trace.reset();
      }
      out[t].episodes.push_back(std::move(o));
    }
  }
  return out;
}

/// A trace file of recorded full-cache episodes (memdecay-calibrate and memdecay-replay read it).
inline md::trace::trace_file make_trace_file(std::string label, std::uint32_t layers,
                                             std::vector<md::trace::episode> eps) {
  md::trace::trace_file f;
  f.label = std::move(label);
  f.layers = layers;
  f.region_names = md::trace::default_region_names();
  f.episodes = std::move(eps);
  return f;
}

}  // namespace memdecay_eval

#endif  // MEMDECAY_TOOLS_EVAL_HARNESS_HPP
