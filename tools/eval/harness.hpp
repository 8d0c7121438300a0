// SPDX-License-Identifier: Apache-2.0
// memdecay-eval's harness: runs evaluation episodes (episodes.hpp) through a model with a paged KV cache while an
// eviction policy evicts online, and scores recall probes. docs/eval.md describes the protocol. The policies are
// policy_kinds.hpp; the settings, schedule and results, run_types.hpp.
//
// The harness is generic in the session type, so tests drive it with a small fake model and memdecay-eval with
// the real engine (engine/kv_session.hpp). A Session needs (the contract of tools/eval/engine/kv_session.hpp):
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
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <memdecay/core/sequence.hpp>
#include <memdecay/digests/query_channels.hpp>
#include <memdecay/io/trace.hpp>

#include "../common/any_sequence.hpp"
#include "../common/parallel_for.hpp"
#include "episodes.hpp"
#include "exact_recall.hpp"
#include "oracle.hpp"
#include "policy_kinds.hpp"
#include "run_types.hpp"

namespace memdecay_eval {

namespace md = memdecay;
using memdecay_tools::parallel_for;

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
  // The trace logs each inline re-read as a reference of its fact (the workload's own references, for calibration's
  // reference estimator), at the step that appends its query token: when the need arises, as the need-aligned
  // generator draws it (python/episodes.py: a re-read starts at the first step at or after its drawn time).
  const std::vector<reread> rereads = trace ? find_rereads(ep, vocab.query) : std::vector<reread>{};
  std::size_t next_reread = 0;
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
      if (s.trace_attention) {
        md::trace::attention a;
        a.step = static_cast<md::step_t>(i);
        a.context = st.end();
        for (auto& layer : r.layer_mass)
          a.layers.push_back({.sparse = false, .positions = {}, .mass = std::move(layer)});
        trace->events.emplace_back(std::move(a));
      }
      for (; next_reread < rereads.size() && rereads[next_reread].at < st.end(); ++next_reread)
        trace->events.emplace_back(md::trace::reference{static_cast<md::step_t>(i), rereads[next_reread].fact_first, 2});
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

// A policy on the attention-free signal sees the step's queries (every layer's heads stacked, as the session's
// page_keys stacks the keys) instead of the attention; `exact` (the layer-summed row) only measures the estimate.
template <class Session, class Step>
void observe_queries(memdecay_tools::any_sequence& policy, const Session& session, const Step& r,
                     const std::vector<float>& exact) {
  if constexpr (requires(std::vector<float> & keys) {
                  session.page_keys(std::size_t{}, keys);
                  r.layer_queries;
                }) {
    const std::size_t L = r.layer_queries.size(), H = session.heads(), hd = session.head_dim(), d = H * hd;
    const std::size_t n = L == 0 ? 0 : r.layer_queries[0].size() / d;
    std::vector<float> stacked(n * L * d);
    for (std::size_t t = 0; t < n; ++t)
      for (std::size_t l = 0; l < L; ++l)
        std::copy_n(r.layer_queries[l].data() + t * d, d, stacked.data() + (t * L + l) * d);
    memdecay_tools::query_step q;
    q.queries = stacked;
    q.n = n;
    q.heads = L * H;
    q.head_dim = hd;
    q.page_keys = [&session](std::size_t page, std::vector<float>& keys) { session.page_keys(page, keys); };
    q.exact = exact;
    q.total = static_cast<double>(L);  // each layer's row sums to 1
    policy.observe_queries(q);
  } else {
    throw std::runtime_error("this session gives no queries and keys: policies on the query signal cannot run");
  }
}

// A run's host pool (policies with a host tier): host slots holding demoted blocks' K/V and first positions, the
// library's host_block_store over them, and the bytes its copies moved. Sized for every page of the episode, so
// the host tier's own budget (the library's) is what limits it.
template <class Session>
class host_pool {
 public:
  host_pool(Session& session, std::size_t pages, run_result& res) {
    if constexpr (requires(std::span<float> kv, std::uint32_t& pos) {
                    session.save_block(std::int32_t{}, kv, pos);
                    session.block_floats();
                  }) {
      const std::size_t floats = session.block_floats();
      kv_.assign(pages * floats, 0.0f);
      first_.assign(pages, 0);
      store_.emplace(pages, [this, &session, &res, floats](md::copy_direction dir, const std::int32_t& block,
                                                            std::size_t slot) {
        const std::span<float> host(kv_.data() + slot * floats, floats);
        if (dir == md::copy_direction::to_host)
          session.save_block(block, host, first_[slot]);
        else
          session.load_block(block, std::span<const float>(host), first_[slot]);
        res.moved_bytes += floats * sizeof(float);
      });
    } else {
      (void)session, (void)pages, (void)res;
      throw std::runtime_error("this session cannot copy blocks: policies with a host tier cannot run");
    }
  }
  host_pool(const host_pool&) = delete;
  host_pool& operator=(const host_pool&) = delete;
  [[nodiscard]] memdecay_tools::any_sequence::host_store_type& store() { return *store_; }

 private:
  std::vector<float> kv_;
  std::vector<std::uint32_t> first_;
  std::optional<memdecay_tools::any_sequence::host_store_type> store_;
};

// Digests of every device page that has none (the pages that filled or grew this step), from the session's keys.
template <class Session>
void digest_pages(memdecay_tools::any_sequence& policy, const Session& session) {
  if constexpr (requires(std::vector<float> & keys) { session.page_keys(std::size_t{}, keys); }) {
    policy.digest_pages([&session](std::size_t page, std::vector<float>& keys) { session.page_keys(page, keys); },
                        session.layers() * session.heads(), session.head_dim());
  } else {
    throw std::runtime_error("this session gives no keys: policies with a host tier cannot run");
  }
}

// Asks the host tier which pages `query` (every layer's heads stacked) wants back and commits the plan, the K/V
// moving through the host pool.
// `clairvoyant` (the Belady ceiling's need moments): the plan comes from the needs at moment `now` (oracle::moment)
// instead of the query.
template <class Session>
void recall_for(memdecay_tools::any_sequence& policy, Session& session, host_pool<Session>& pool,
                std::span<const float> query, md::head_bounds over_heads, run_result& res,
                const std::vector<std::vector<std::size_t>>* clairvoyant = nullptr, std::size_t now = 0,
                held_keys* exact = nullptr, const policy_kind* rule = nullptr) {
  md::recall_plan plan;
  if (exact != nullptr) {
    if constexpr (requires(std::vector<float> & keys) { session.page_keys(std::size_t{}, keys); }) {
      std::vector<float> bounds;
      exact->refresh(policy, session);
      held_keys::options o;
      if (rule != nullptr) {
        o.first_head = rule->exact_last_layer ? (session.layers() - 1) * session.heads() : 0;
        o.channels = rule->exact_channels;
      }
      exact->log_attention(policy, query, session.layers() * session.heads(), session.head_dim(), bounds, o);
      plan = policy.select_recall_for_bounds(bounds);
    }
  } else if (clairvoyant != nullptr) {
    std::vector<float> bounds;
    oracle::belady_bounds(
        *clairvoyant, now, policy.held_pages(), [&](std::size_t j) { return policy.origin_of_page(j); },
        [&](std::size_t j) { return policy.on_device(j); }, bounds);
    plan = policy.select_recall_for_bounds(bounds);
  } else if (rule != nullptr && rule->query_channels > 0) {
    if constexpr (requires { session.head_dim(); }) {
      std::vector<float> sparse(query.begin(), query.end());
      md::keep_largest_query_channels(sparse, session.head_dim(), rule->query_channels);
      plan = policy.select_recall(sparse, over_heads);
    }
  } else {
    plan = policy.select_recall(query, over_heads);
  }
  if (plan.empty()) return;
  (void)policy.commit_recall(plan, session.table(), session.sequence(), pool.store());
  ++res.recalls;
  res.promoted_pages += plan.promote.size();
  res.demoted_pages += plan.demote.size();
}

// The absolute positions of the policy's device tokens in order: what the session's block table must hold.
inline void device_positions(const memdecay_tools::any_sequence& policy, std::vector<std::uint32_t>& out) {
  out.clear();
  const std::size_t P = policy.page_size();
  for (std::size_t j = 0; j < policy.kv_len(); ++j)
    if (policy.on_device(j / P)) out.push_back(static_cast<std::uint32_t>(policy.position_of(j)));
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
  std::shared_ptr<const std::vector<std::vector<std::size_t>>> need_moments;  // the Belady ceiling's clairvoyance
  if (spec.kind.is_ceiling()) {  // both ceilings know the episode's needs: its residency problem at this run
    std::vector<std::uint32_t> step_end;
    for (const auto& st : sch.steps) step_end.push_back(st.end());
    const auto problem = oracle::make_problem(ep, step_end, sch.probes_after, vocab.query, spec.page_size, budget,
                                              cfg.effective_protection(spec.page_size, n), cfg.effective_regions());
    if (spec.kind.belady) {
      need_moments = std::make_shared<const std::vector<std::vector<std::size_t>>>(
          oracle::need_moments_by_page(problem, sch.probes_after));
      using seq = md::policy_sequence<oracle::farthest_next_need>;
      policy = memdecay_tools::erase(seq(cfg, {need_moments}));
    } else {
      const auto plan = oracle::solve(problem);
      res.oracle_unproven = plan.proven ? 0 : 1;
      using seq = md::policy_sequence<oracle::planned>;
      policy = memdecay_tools::erase(seq(cfg, {std::make_shared<const std::vector<std::size_t>>(plan.departure)}));
    }
  } else {
    policy = spec.kind.make(cfg);
  }
  if (spec.kind.host) {
    md::host_tier_config tier = *spec.kind.host;
    tier.host_budget = spec.kind.host_fraction < 0
                           ? md::budget_config{}
                           : md::budget_config::tokens(static_cast<double>(budget_of(spec.kind.host_fraction, n)));
    policy->use_host_tier(tier);
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
    if constexpr (std::is_copy_constructible_v<Session>) own.emplace(*fork_from->snapshot[budget_index]);
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
  const bool tiered = policy->has_host_tier();
  std::optional<host_pool<Session>> host;
  if (tiered) host.emplace(session, (n + spec.page_size - 1) / spec.page_size, res);
  std::optional<held_keys> exact_keys;
  if (tiered && spec.kind.recall_exact) exact_keys.emplace();

  std::vector<float> row, query;
  std::vector<std::uint8_t> resident;
  std::vector<std::uint32_t> device_at;
  // Device tokens of the fact of probe k now: what the answer can attend to.
  auto fact_on_device = [&](const probe& p) {
    device_positions(*policy, device_at);
    resident.assign(n, 0);
    for (std::uint32_t pos : device_at) resident[pos] = 1;
    bool alive = true;
    for (std::uint32_t j = p.fact_first; j < p.fact_first + p.fact_length; ++j) alive = alive && resident[j] != 0;
    return alive;
  };
  for (std::size_t i = start; i < sch.steps.size(); ++i) {
    const auto& st = sch.steps[i];
    policy->append(st.region, st.count);
    hook(call_kind::policy_append, i, st.count);
    auto r = session.append(std::span<const std::int32_t>(ep.tokens.data() + st.first, st.count));
    hook(call_kind::session_append, i, st.count);
    sum_layers(r.layer_mass, policy->device_len(), row);
    if (policy->observes_queries())
      observe_queries(*policy, session, r, row);
    else
      policy->observe(row);
    hook(call_kind::policy_observe, i, row.size());
    policy->advance_to(static_cast<md::step_t>(i + 1));
    hook(call_kind::advance, i, i + 1);
    if (tiered) digest_pages(*policy, session);
    if constexpr (requires(std::vector<float> & keys) { session.page_keys(std::size_t{}, keys); })
      if (exact_keys) exact_keys->refresh(*policy, session);  // before the budget may demote what filled
    const auto e = memdecay_tools::enforce_budget(
        *policy, session.table(), session.sequence(), [](const auto&) {}, tiered ? &host->store() : nullptr);
    if (e.selected) {
      hook(call_kind::select, i, e.pages);
      if (e.pages > 0) hook(call_kind::commit, i, e.pages);
    }
    res.evicted_pages += e.pages;
    res.evicted_tokens += e.pages * spec.page_size;
    res.demoted_pages += e.demoted;
    res.host_dropped_pages += e.host_dropped;
    if constexpr (requires { r.layer_queries; })
      if (tiered) {  // the next step's pages, chosen with the latest query (the step's last), every layer's heads
        const std::size_t L = r.layer_queries.size(), d = L == 0 ? 0 : r.layer_queries[0].size() / st.count;
        query.resize(L * d);
        for (std::size_t l = 0; l < L; ++l)
          std::copy_n(r.layer_queries[l].data() + (st.count - 1) * d, d, query.data() + l * d);
        recall_for(*policy, session, *host, query, spec.kind.recall_heads, res, need_moments.get(),
                   oracle::moment(i, 0), exact_keys ? &*exact_keys : nullptr, &spec.kind);
      }
    const std::size_t kv = policy->device_len();
    if (session.resident_tokens() != kv)
      throw std::runtime_error(label + ": the session holds " + std::to_string(session.resident_tokens()) +
                               " tokens, the policy " + std::to_string(kv) + " (step " + std::to_string(i) + ")");
    if constexpr (requires { session.resident_positions(); })
      if (tiered) {  // a recalled page is back at its original place
        device_positions(*policy, device_at);
        if (session.resident_positions() != device_at)
          throw std::runtime_error(label + ": the session's device tokens are not at the policy's positions (step " +
                                   std::to_string(i) + ")");
      }
    res.max_resident = std::max<std::uint64_t>(res.max_resident, kv);
    if (kv > budget) {
      if (e.over_budget)
        ++res.over_budget_steps;
      else
        ++res.budget_violations;
    }
    for (std::size_t j = 0; j < sch.probes_after[i].size(); ++j) {
      const std::size_t k = sch.probes_after[i][j];
      const auto& p = ep.probes[k];
      const std::int32_t prompt[2] = {vocab.query, p.key};
      if (tiered) {  // the question arrives: bring back what its query wants before answering
        if constexpr (requires { session.prompt_queries(std::span<const std::int32_t>(prompt, 2), query); }) {
          session.prompt_queries(std::span<const std::int32_t>(prompt, 2), query);
          recall_for(*policy, session, *host, query, spec.kind.recall_heads, res, need_moments.get(),
                     oracle::moment(i, 1 + j), exact_keys ? &*exact_keys : nullptr, &spec.kind);
        }
      }
      const bool alive = fact_on_device(p);
      const bool ok = answered(session.answer(std::span<const std::int32_t>(prompt, 2), s.max_new), p.answer);
      hook(call_kind::probe, i, st.end());
      count_probe(k, ok, alive);
    }
  }
  const auto signal = policy->signal_error_so_far();
  res.signal_tv_sum = signal.tv_sum;
  res.signal_steps = signal.steps;
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
      // A policy on the query signal runs from the start: the full-cache run before the fork recorded attention,
      // not the queries and keys it observes.
      const detail::full_run<Session>* from = fork && !c.kind.observes_queries ? &full.at(c.page_size) : nullptr;
      out.cells.push_back(detail::run_policy(ep, sch, vocab, make, c, b, s, from, ceiling));
      if (progress) progress();
    }
  return out;
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
