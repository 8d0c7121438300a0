// SPDX-License-Identifier: Apache-2.0
// memdecay-eval's oracle: the clairvoyant evictor that knows every future need of an episode and serves the most of
// them at the same budget, protections and page size as the policies. It is the physical limit of eviction at that
// budget, so every policy's recall can be read as a share of it.
//
// Eviction here is final, so Belady's MIN (evict the page used farthest in the future) is not optimal: a page kept
// to serve one need can cost a page with many later ones. The problem is offline residency: each page stays from its
// arrival to a departure time of its choosing; after every step the resident tokens must fit the budget; a need (a
// probe, or an inline re-read `query key value` of an earlier fact) is served when every page of its fact is
// resident at its time. We solve it exactly as a 0-1 integer program (GLPK's branch-and-cut, `glp_intopt`):
//
//   y[p][k] = 1: page p stays resident through t_k, the k-th distinct time at or after its protection's end at
//             which a need touches it (y[p][k] >= y[p][k+1]: an evicted page never returns; staying past the last need
//             it serves never helps);
//   capacity:  for every step i, the unprotected full pages resident at i fit floor((B - protected tokens(i)) / P)
//              (protected: pinned, sink, partial and recent pages, which the evictor never takes);
//   u[n] <= y[p][k(n)] for every unprotected page p of need n at its time; maximise sum_n w_n u_n.
//
// (solve() states two exact reductions it applies first: pages with the same needs share one chain, and a need over
// one such group needs no u; and it stops once the integer weights leave no room above the plan found. Without
// these, page-1 episodes of multi-token facts took GLPK minutes: it found the optimum early and could not prove
// it.) The search has
// a limit in subproblems, not seconds, so results do not depend on the machine; a plan not proven optimal within
// it is used and flagged (solution::proven, memdecay-eval's `oracle_unproven_runs`), with a bound on the optimum.
//
// Probes weigh more than all re-reads together (w = re-reads + 1), so the oracle first maximises the probes that
// survive (it is never beaten on probe survival; tests check both that and equality with a brute force on tiny
// episodes), then the re-reads it can serve besides. Its plan becomes a policy: a page scores its departure time,
// so the evictor, taking the lowest scores first and only when over budget, never takes a page the plan still
// needs (the plan fits every step by construction).
#ifndef MEMDECAY_TOOLS_EVAL_ORACLE_HPP
#define MEMDECAY_TOOLS_EVAL_ORACLE_HPP

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <glpk.h>

#include <memdecay/core/config.hpp>
#include <memdecay/detail/digest.hpp>
#include <memdecay/core/policy.hpp>
#include <memdecay/core/region.hpp>

#include "episodes.hpp"

namespace memdecay_eval::oracle {

/// A future need: the tokens [first, first + length) resident after step `time`.
struct need {
  std::size_t time = 0;
  std::uint32_t first = 0, length = 0;
  std::uint64_t weight = 1;
  long probe = -1;  ///< the probe's index in the episode, or -1 for an inline re-read
};

/// One episode's residency problem at one page size and budget.
struct problem {
  std::size_t page_size = 16;
  std::uint64_t budget_tokens = 0;
  std::size_t recent_tokens = 0, sink_pages = 0;
  std::vector<std::uint32_t> step_end;  ///< tokens processed after each step
  std::vector<std::uint8_t> pinned;     ///< per original page: holds a token of a pinned region
  std::vector<need> needs;

  [[nodiscard]] std::size_t steps() const noexcept { return step_end.size(); }
  [[nodiscard]] std::size_t pages() const noexcept { return pinned.size(); }
  [[nodiscard]] std::size_t tokens() const noexcept { return step_end.empty() ? 0 : step_end.back(); }
  /// The first step after which page p holds a token.
  [[nodiscard]] std::size_t arrival(std::size_t p) const noexcept {
    return static_cast<std::size_t>(std::upper_bound(step_end.begin(), step_end.end(), p * page_size) -
                                    step_end.begin());
  }
  /// Whether page p (present after step i) is protected then: pinned, a sink, partial, or holding a recent token.
  [[nodiscard]] bool is_protected(std::size_t p, std::size_t i) const noexcept {
    if (pinned[p] || p < sink_pages) return true;
    const std::uint64_t len = step_end[i];
    if ((p + 1) * page_size > len) return true;
    if (recent_tokens == 0) return false;
    if (recent_tokens >= len) return true;
    return p >= (len - recent_tokens) / page_size;
  }
  /// The first step after which page p is no longer protected (protection is a prefix of its life, possibly
  /// empty: a page that arrives full and old can go in the step that brought it); steps() if it never ends.
  [[nodiscard]] std::size_t protected_end(std::size_t p) const noexcept {
    if (pinned[p] || p < sink_pages) return steps();
    std::size_t i = arrival(p);
    while (i < steps() && is_protected(p, i)) ++i;
    return i;
  }
  /// Tokens of page p resident after step i (0 before its arrival).
  [[nodiscard]] std::uint64_t tokens_of(std::size_t p, std::size_t i) const noexcept {
    const std::uint64_t len = step_end[i], first = p * page_size;
    return len <= first ? 0 : std::min<std::uint64_t>(page_size, len - first);
  }
};

/// A plan: per page the first step after which it is no longer resident (`forever` for pages never evicted), and
/// per need whether it is served.
struct solution {
  static constexpr std::size_t forever = std::numeric_limits<std::size_t>::max();
  std::vector<std::size_t> departure;
  std::vector<std::uint8_t> served;
  std::uint64_t value = 0;        ///< sum of the served needs' weights
  std::size_t probes_served = 0;  ///< probes among them
  bool proven = true;             ///< solve(): false when its search limit stopped it before the optimum was proven
  std::uint64_t value_bound = 0;  ///< solve(): no plan serves more weight than this (`value` when proven)
};

/// Whether a departure vector respects every step's budget and every protection; fills `served` and the value.
inline bool evaluate(const problem& pr, std::span<const std::size_t> departure, solution& out) {
  const std::size_t S = pr.steps(), P = pr.pages();
  for (std::size_t p = 0; p < P; ++p)
    if (departure[p] != solution::forever && departure[p] < pr.protected_end(p)) return false;
  for (std::size_t i = 0; i < S; ++i) {
    std::uint64_t resident = 0, forced = 0;
    for (std::size_t p = 0; p < P && p * pr.page_size < pr.step_end[i]; ++p) {
      if (departure[p] != solution::forever && departure[p] <= i) continue;
      const std::uint64_t t = pr.tokens_of(p, i);
      resident += t;
      if (pr.is_protected(p, i)) forced += t;
    }
    // Above the budget only when the protected pages alone exceed it and nothing unprotected stays.
    if (resident > pr.budget_tokens && resident != forced) return false;
  }
  out.departure.assign(departure.begin(), departure.end());
  out.served.assign(pr.needs.size(), 0);
  out.value = 0;
  out.probes_served = 0;
  for (std::size_t n = 0; n < pr.needs.size(); ++n) {
    const auto& nd = pr.needs[n];
    bool ok = true;
    for (std::uint32_t j = nd.first; j < nd.first + nd.length; ++j) {
      const std::size_t p = j / pr.page_size;
      ok = ok && (departure[p] == solution::forever || departure[p] > nd.time);
    }
    if (!ok) continue;
    out.served[n] = 1;
    out.value += nd.weight;
    if (nd.probe >= 0) ++out.probes_served;
  }
  return true;
}

namespace detail {
inline std::mutex& glpk_mutex() {  // GLPK keeps a process-wide environment
  static std::mutex m;
  return m;
}

/// Stops GLPK's branch-and-cut after `limit` subproblems (a count, not a clock, so a stopped search ends in the same
/// place on every machine).
struct node_budget {
  std::uint64_t limit = 0, seen = 0;
  double bound = std::numeric_limits<double>::infinity();  ///< the best bound of the open subproblems, last seen
  static void callback(glp_tree* tree, void* info) {
    auto* self = static_cast<node_budget*>(info);
    if (glp_ios_reason(tree) != GLP_ISELECT) return;
    if (const int best = glp_ios_best_node(tree); best != 0) self->bound = glp_ios_node_bound(tree, best);
    // The weights are integers: once no open subproblem can serve one more unit, the plan found is optimal
    // (GLPK's own pruning does not use that and may branch on for long).
    glp_prob* lp = glp_ios_get_prob(tree);
    const bool settled = glp_mip_status(lp) == GLP_FEAS && std::floor(self->bound - glp_mip_obj_val(lp) + 1e-6) < 1.0;
    if (settled || ++self->seen > self->limit) glp_ios_terminate(tree);
  }
};
}  // namespace detail

/// How hard solve() may search: the branch-and-cut's subproblems at most. Every problem of docs/findings.md's
/// protocol is proven optimal within 10 (solution::proven); a foreign episode file can hold one GLPK cannot prove
/// in any reasonable time, and then the best plan found is used and said to be unproven.
struct solve_limits {
  std::uint64_t max_nodes = 2000;
};

/// The optimum of the 0-1 program above, solved by GLPK, after two exact reductions:
///   * pages with the same needs move together: if every need of page p also needs page q and the other way round,
///     some optimal plan lets both go at the same time (the later one's extra stay serves nothing), so they share one
///     chain of y (a capacity row counts the group's unprotected pages resident then);
///   * a need whose unprotected pages are all in one group is served exactly when that group stays, so its weight
///     goes to the group's y directly, with no u of its own.
/// With `limits` reached before the optimum is proven, the best plan found is returned with `proven` false.
inline solution solve(const problem& pr, const solve_limits& limits = {}) {
  const std::size_t S = pr.steps(), P = pr.pages();
  std::vector<std::size_t> until(P);  // protection ends after step until[p] - 1
  for (std::size_t p = 0; p < P; ++p) until[p] = pr.protected_end(p);
  auto always = [&](std::size_t p) { return pr.pinned[p] || p < pr.sink_pages; };
  // Per page, the needs it constrains (at a time it may be gone), in need order; pages with the same list form a group.
  std::vector<std::vector<std::uint32_t>> needs_of(P);
  for (std::size_t n = 0; n < pr.needs.size(); ++n) {
    const auto& nd = pr.needs[n];
    if (nd.length == 0) continue;
    const std::size_t last = std::min<std::size_t>((nd.first + nd.length - 1) / pr.page_size, P - 1);
    for (std::size_t p = nd.first / pr.page_size; p <= last; ++p)
      if (!always(p) && nd.time >= until[p]) needs_of[p].push_back(static_cast<std::uint32_t>(n));
  }
  std::map<std::vector<std::uint32_t>, std::size_t> group_of_needs;
  std::vector<std::size_t> group(P, solution::forever);    // page -> group (forever: no need, leaves when it may)
  std::vector<std::vector<std::size_t>> times;             // per group: its distinct need times, ascending
  std::vector<std::vector<std::size_t>> members;           // per group: its pages
  for (std::size_t p = 0; p < P; ++p) {
    if (needs_of[p].empty()) continue;
    const auto [it, fresh] = group_of_needs.try_emplace(needs_of[p], times.size());
    if (fresh) {
      std::vector<std::size_t> t;
      for (auto n : needs_of[p]) t.push_back(pr.needs[n].time);
      std::sort(t.begin(), t.end());
      t.erase(std::unique(t.begin(), t.end()), t.end());
      times.push_back(std::move(t));
      members.emplace_back();
    }
    group[p] = it->second;
    members[it->second].push_back(p);
  }
  const std::size_t G = times.size();
  std::vector<std::vector<int>> col(G);  // GLPK column of y[g][k]
  int ncols = 0;
  for (std::size_t g = 0; g < G; ++g)
    for (std::size_t k = 0; k < times[g].size(); ++k) col[g].push_back(++ncols);
  auto k_at = [&](std::size_t g, std::size_t time) {  // the group's first need time at or after `time`
    return static_cast<std::size_t>(std::lower_bound(times[g].begin(), times[g].end(), time) - times[g].begin());
  };
  std::vector<double> objective(static_cast<std::size_t>(ncols) + 1, 0.0);
  // Needs over two or more groups keep a u each (u <= every group's y then); the rest weigh on their group's y.
  std::vector<std::pair<std::size_t, std::vector<std::size_t>>> shared_needs;  // need, its groups
  {
    std::vector<std::size_t> gs;
    for (std::size_t n = 0; n < pr.needs.size(); ++n) {
      const auto& nd = pr.needs[n];
      gs.clear();
      if (nd.length > 0)
        for (std::size_t p = nd.first / pr.page_size; p <= std::min<std::size_t>((nd.first + nd.length - 1) / pr.page_size, P - 1); ++p)
          if (group[p] != solution::forever && nd.time >= until[p]) gs.push_back(group[p]);
      std::sort(gs.begin(), gs.end());
      gs.erase(std::unique(gs.begin(), gs.end()), gs.end());
      if (gs.size() == 1)
        objective[static_cast<std::size_t>(col[gs[0]][k_at(gs[0], nd.time)])] += static_cast<double>(nd.weight);
      else if (gs.size() > 1)
        shared_needs.emplace_back(n, gs);
    }
  }
  const int first_u = ncols + 1;
  for (std::size_t s = 0; s < shared_needs.size(); ++s) {
    ++ncols;
    objective.push_back(static_cast<double>(pr.needs[shared_needs[s].first].weight));
  }

  std::vector<int> ia{0}, ja{0};
  std::vector<double> ar{0.0};
  std::vector<double> row_upper;  // every row is `terms <= upper`
  auto add_row = [&](std::span<const std::pair<int, double>> terms, double upper) {
    row_upper.push_back(upper);
    for (const auto& [c, v] : terms) {
      ia.push_back(static_cast<int>(row_upper.size()));
      ja.push_back(c);
      ar.push_back(v);
    }
  };
  std::vector<std::pair<int, double>> terms;
  // Monotone: y[g][k+1] - y[g][k] <= 0.
  for (std::size_t g = 0; g < G; ++g)
    for (std::size_t k = 0; k + 1 < col[g].size(); ++k) {
      terms = {{col[g][k + 1], 1.0}, {col[g][k], -1.0}};
      add_row(terms, 0.0);
    }
  // Capacity after each step: a group's unprotected pages present then are resident while it stays to its next need.
  std::vector<double> count(G, 0.0);
  std::vector<std::size_t> touched;
  for (std::size_t i = 0; i < S; ++i) {
    std::uint64_t forced = 0;
    double free_pages = 0;
    touched.clear();
    for (std::size_t p = 0; p < P && p * pr.page_size < pr.step_end[i]; ++p) {
      if (always(p) || i < until[p]) {
        forced += pr.tokens_of(p, i);
        continue;
      }
      const std::size_t g = group[p];
      if (g == solution::forever || k_at(g, i) == times[g].size()) continue;  // gone: nothing left to serve
      if (count[g] == 0) touched.push_back(g);
      count[g] += 1;
      free_pages += 1;
    }
    const std::uint64_t room = forced >= pr.budget_tokens ? 0 : (pr.budget_tokens - forced) / pr.page_size;
    terms.clear();
    for (std::size_t g : touched) {
      terms.emplace_back(col[g][k_at(g, i)], count[g]);
      count[g] = 0;
    }
    if (free_pages > static_cast<double>(room)) add_row(terms, static_cast<double>(room));
  }
  // Shared needs: u <= y of each group at the need's time.
  for (std::size_t s = 0; s < shared_needs.size(); ++s) {
    const auto& [n, gs] = shared_needs[s];
    for (std::size_t g : gs) {
      terms = {{first_u + static_cast<int>(s), 1.0}, {col[g][k_at(g, pr.needs[n].time)], -1.0}};
      add_row(terms, 0.0);
    }
  }

  std::vector<double> value(static_cast<std::size_t>(ncols) + 1, 0.0);
  bool proven = true;
  double unserved_bound = 0;  // how much more weight an optimum could serve than the plan found, at most
  if (ncols > 0) {
    std::lock_guard lock(detail::glpk_mutex());
    glp_prob* lp = glp_create_prob();
    // GLPK keeps an environment per thread; free it with the problem, or every worker thread leaks one.
    struct guard {
      glp_prob* lp;
      ~guard() {
        glp_delete_prob(lp);
        glp_free_env();
      }
    } g{lp};
    glp_set_obj_dir(lp, GLP_MAX);
    glp_add_cols(lp, ncols);
    for (int c = 1; c <= ncols; ++c) {
      if (c < first_u)
        glp_set_col_kind(lp, c, GLP_BV);
      else
        glp_set_col_bnds(lp, c, GLP_DB, 0.0, 1.0);
      glp_set_obj_coef(lp, c, objective[static_cast<std::size_t>(c)]);
    }
    if (!row_upper.empty()) {
      glp_add_rows(lp, static_cast<int>(row_upper.size()));
      for (std::size_t r = 0; r < row_upper.size(); ++r)
        glp_set_row_bnds(lp, static_cast<int>(r) + 1, GLP_UP, 0.0, row_upper[r]);
      glp_load_matrix(lp, static_cast<int>(ia.size()) - 1, ia.data(), ja.data(), ar.data());
    }
    detail::node_budget budget{.limit = limits.max_nodes};
    glp_iocp parm;
    glp_init_iocp(&parm);
    parm.presolve = GLP_ON;
    parm.msg_lev = GLP_MSG_OFF;
    parm.mir_cuts = GLP_ON;
    parm.clq_cuts = GLP_ON;
    parm.cb_func = &detail::node_budget::callback;
    parm.cb_info = &budget;
    const int terminal = glp_term_out(GLP_OFF);  // the cut generators print even with msg_lev off
    const int rc = glp_intopt(lp, &parm);
    glp_term_out(terminal);
    const int status = glp_mip_status(lp);
    const bool stopped = rc == GLP_ESTOP, found_plan = status == GLP_OPT || status == GLP_FEAS;
    if (!stopped && !(rc == 0 && status == GLP_OPT))
      throw std::runtime_error("oracle: GLPK found no plan (glp_intopt " + std::to_string(rc) + ", status " +
                               std::to_string(status) + ")");
    proven = !stopped;
    // Stopped before any plan: every page leaves when its protection ends (y = 0), which always fits.
    if (found_plan)
      for (int c = 1; c <= ncols; ++c) value[static_cast<std::size_t>(c)] = glp_mip_col_val(lp, c);
    if (stopped) {  // the weights are integers, so a bound below the next integer proves the plan found
      const double found = found_plan ? glp_mip_obj_val(lp) : 0.0;
      double most = 0;  // every need served
      for (double w : objective) most += w;
      unserved_bound = std::clamp(std::floor(budget.bound - found + 1e-6), 0.0, most - found);
      proven = unserved_bound < 1.0;
    }
  }
  std::vector<std::size_t> departure(P);
  for (std::size_t p = 0; p < P; ++p) {
    if (always(p)) {
      departure[p] = solution::forever;
      continue;
    }
    departure[p] = until[p];
    if (const std::size_t g = group[p]; g != solution::forever)
      for (std::size_t k = 0; k < col[g].size(); ++k)
        if (value[static_cast<std::size_t>(col[g][k])] > 0.5) departure[p] = std::max(departure[p], times[g][k] + 1);
    if (departure[p] >= S) departure[p] = solution::forever;  // resident to the end
  }
  solution out;
  if (!evaluate(pr, departure, out)) throw std::logic_error("oracle: the solver's plan breaks a budget");
  out.proven = proven;
  out.value_bound = out.value + static_cast<std::uint64_t>(proven ? 0.0 : unserved_bound);
  return out;
}

/// The optimum by exhaustive search over each page's departure (its protection's end or one of its need times):
/// for tests on tiny episodes only.
inline solution brute_force(const problem& pr) {
  const std::size_t P = pr.pages();
  std::vector<std::vector<std::size_t>> options(P);
  for (std::size_t p = 0; p < P; ++p) {
    if (pr.pinned[p] || p < pr.sink_pages) {
      options[p] = {solution::forever};
      continue;
    }
    const std::size_t until = pr.protected_end(p);
    options[p] = {until >= pr.steps() ? solution::forever : until};
    for (const auto& nd : pr.needs)
      if (nd.first / pr.page_size <= p && p <= (nd.first + nd.length - 1) / pr.page_size && nd.time >= until)
        options[p].push_back(nd.time + 1 >= pr.steps() ? solution::forever : nd.time + 1);
  }
  std::vector<std::size_t> pick(P, 0), departure(P);
  solution best, trial;
  bool have = false;
  for (;;) {
    for (std::size_t p = 0; p < P; ++p) departure[p] = options[p][pick[p]];
    if (evaluate(pr, departure, trial) && (!have || trial.value > best.value)) {
      best = trial;
      have = true;
    }
    std::size_t p = 0;
    while (p < P && ++pick[p] == options[p].size()) pick[p++] = 0;
    if (p == P) break;
  }
  if (!have) throw std::logic_error("oracle: no feasible plan (the protected pages should always be one)");
  return best;
}

/// The needs of an episode: its probes (asked after step i: resident after step i), and the inline re-reads its
/// tokens hold (`query key value` after the fact `key value` was planted: the fact must be resident after the step
/// before the one that reads the key). Re-reads are found in the tokens, so any file in the public schema has them.
/// Probes weigh more than every re-read together.
inline std::vector<need> episode_needs(const episode& ep, std::span<const std::uint32_t> step_end,
                                       const std::vector<std::vector<std::size_t>>& probes_after, std::int32_t query) {
  std::vector<need> out;
  auto step_of = [&](std::size_t pos) {  // the step that processes token `pos`
    return static_cast<std::size_t>(std::upper_bound(step_end.begin(), step_end.end(), pos) - step_end.begin());
  };
  for (const auto& r : find_rereads(ep, query)) {
    const std::size_t s = step_of(r.at + 1);
    if (s == 0 || step_of(r.fact_first + 1) >= s) continue;  // read in the step that planted it: always resident
    out.push_back({s - 1, r.fact_first, 2, 1, -1});
  }
  const std::uint64_t probe_weight = out.size() + 1;
  for (std::size_t i = 0; i < probes_after.size(); ++i)
    for (std::size_t k : probes_after[i]) {
      const auto& p = ep.probes[k];
      out.push_back({i, p.fact_first, p.fact_length, probe_weight, static_cast<long>(k)});
    }
  return out;
}

/// The residency problem of one run.
inline problem make_problem(const episode& ep, std::span<const std::uint32_t> step_end,
                            const std::vector<std::vector<std::size_t>>& probes_after, std::int32_t query,
                            std::size_t page_size, std::uint64_t budget_tokens,
                            const memdecay::protection_config& protection, const memdecay::region_table& table) {
  problem pr;
  pr.page_size = page_size;
  pr.budget_tokens = budget_tokens;
  pr.recent_tokens = protection.recent_tokens;
  pr.sink_pages = protection.sink_pages;
  pr.step_end.assign(step_end.begin(), step_end.end());
  const std::size_t n = ep.tokens.size();
  pr.pinned.assign((n + page_size - 1) / page_size, 0);
  for (const auto& seg : ep.segments)
    if (table.pinned(seg.id))
      for (std::uint32_t j = seg.first; j < seg.first + seg.length; ++j) pr.pinned[j / page_size] = 1;
  pr.needs = episode_needs(ep, step_end, probes_after, query);
  return pr;
}

/// The oracle's plan as a policy: a page scores its departure step, so the evictor takes the pages the plan has
/// already let go first (only when over budget; the plan fits every step, so it never needs a page it keeps).
template <class Float = float>
class planned : public memdecay::policy_support::stateless_hooks<Float> {
 public:
  using float_type = Float;
  struct params_type {
    std::shared_ptr<const std::vector<std::size_t>> departure;  ///< per original page (solution::departure)
  };
  static constexpr std::string_view name = "oracle";

  planned(const params_type& params, const memdecay::config&, const memdecay::region_table&)
      : departure_(params.departure) {}

  void page_scores(const memdecay::sequence_view& view, std::span<Float> out) const noexcept {
    for (std::size_t p = 0; p < view.num_pages(); ++p) {
      const std::uint64_t origin = view.page_origins[p];
      const std::size_t d = departure_ && origin < departure_->size() ? (*departure_)[origin] : solution::forever;
      out[p] = d == solution::forever ? memdecay::policy_support::keep_score<Float> : static_cast<Float>(d);
    }
  }
  [[nodiscard]] std::uint64_t digest() const noexcept {
    memdecay::detail::fnv1a64 h;
    if (departure_) h.add(std::span<const std::size_t>(*departure_));
    return h.value();
  }

 private:
  std::shared_ptr<const std::vector<std::size_t>> departure_;
};

static_assert(memdecay::eviction_policy<planned<float>>);

/// The order in which a run meets its needs, finer than steps: after step `step`, moment `sub` 0 is the step's own
/// recall (the inline re-reads of the next step need their facts then) and moment 1 + j the j-th probe asked after
/// that step (probes_after[step][j]), each with its own recall before the answer.
inline constexpr std::size_t moments_per_step = 1024;
[[nodiscard]] inline constexpr std::size_t moment(std::size_t step, std::size_t sub) noexcept {
  return step * moments_per_step + sub;
}

/// Per original page, the distinct moments of the needs that touch it, ascending.
inline std::vector<std::vector<std::size_t>> need_moments_by_page(
    const problem& pr, const std::vector<std::vector<std::size_t>>& probes_after) {
  std::vector<std::vector<std::size_t>> out(pr.pages());
  for (const auto& nd : pr.needs) {
    if (nd.length == 0 || out.empty()) continue;
    std::size_t sub = 0;
    if (nd.probe >= 0) {
      const auto& asked = probes_after.at(nd.time);
      const auto at = std::find(asked.begin(), asked.end(), static_cast<std::size_t>(nd.probe));
      if (at == asked.end()) throw std::logic_error("oracle: a probe need that is not asked at its step");
      sub = 1 + static_cast<std::size_t>(at - asked.begin());
      if (sub >= moments_per_step) throw std::runtime_error("oracle: more than 1,023 probes after one step");
    }
    const std::size_t last = std::min<std::size_t>((nd.first + nd.length - 1) / pr.page_size, out.size() - 1);
    for (std::size_t p = nd.first / pr.page_size; p <= last; ++p) out[p].push_back(moment(nd.time, sub));
  }
  for (auto& t : out) {
    std::sort(t.begin(), t.end());
    t.erase(std::unique(t.begin(), t.end()), t.end());
  }
  return out;
}

/// The first need of original page `origin` at or after moment `now`, or solution::forever.
inline std::size_t next_need(const std::vector<std::vector<std::size_t>>& moments, std::uint64_t origin,
                             std::size_t now) noexcept {
  if (origin >= moments.size()) return solution::forever;
  const auto& t = moments[origin];
  const auto it = std::lower_bound(t.begin(), t.end(), now);
  return it == t.end() ? solution::forever : *it;
}

/// The host tier's ceiling: Belady's MIN. With a host tier eviction is no longer final (a demoted page can come
/// back), and then MIN is optimal: demote the page whose next need is farthest (never-needed pages first), and
/// bring a page back exactly when a need touches it (demand recall: belady_bounds). A page scores minus the moments
/// to its next need, so the evictor, taking the lowest scores first, demotes the farthest. The evictor runs after
/// advance_to(step + 1), at moment(step, 0).
template <class Float = float>
class farthest_next_need : public memdecay::policy_support::stateless_hooks<Float> {
 public:
  using float_type = Float;
  struct params_type {
    std::shared_ptr<const std::vector<std::vector<std::size_t>>> need_moments;  ///< need_moments_by_page
  };
  static constexpr std::string_view name = "belady";
  /// The score of a page never needed again: below every page that is.
  static constexpr Float never = Float(-1e30);

  farthest_next_need(const params_type& params, const memdecay::config&, const memdecay::region_table&)
      : moments_(params.need_moments) {}

  void page_scores(const memdecay::sequence_view& view, std::span<Float> out) const noexcept {
    const std::size_t now = moment(view.now == 0 ? 0 : static_cast<std::size_t>(view.now - 1), 0);
    for (std::size_t p = 0; p < view.num_pages(); ++p) {
      const std::size_t t = moments_ ? next_need(*moments_, view.page_origins[p], now) : solution::forever;
      out[p] = t == solution::forever ? never : -static_cast<Float>(t - now);
    }
  }
  [[nodiscard]] std::uint64_t digest() const noexcept {
    memdecay::detail::fnv1a64 h;
    if (moments_)
      for (const auto& t : *moments_) h.add(static_cast<std::uint64_t>(t.size())).add(std::span<const std::size_t>(t));
    return h.value();
  }

 private:
  std::shared_ptr<const std::vector<std::vector<std::size_t>>> moments_;
};

static_assert(memdecay::eviction_policy<farthest_next_need<float>>);

/// Demand recall for Belady's MIN at moment `now`: a host page needed now bounds 0 and every other host page far
/// below any device page (never promoted); a device page bounds minus the moments to its next need
/// (farthest_next_need's score), so a recall displaces the device page needed farthest away, and never one needed
/// now (a tie is not a win). `origin_of(j)` is held page j's original page, `on_device(j)` its tier.
template <class OriginOf, class OnDevice>
void belady_bounds(const std::vector<std::vector<std::size_t>>& moments, std::size_t now, std::size_t held_pages,
                   OriginOf&& origin_of, OnDevice&& on_device, std::vector<float>& out) {
  out.resize(held_pages);
  for (std::size_t j = 0; j < held_pages; ++j) {
    const std::size_t t = next_need(moments, origin_of(j), now);
    if (on_device(j))
      out[j] = t == solution::forever ? farthest_next_need<float>::never : -static_cast<float>(t - now);
    else
      out[j] = t == now ? 0.0f : -3.0e38f;
  }
}

}  // namespace memdecay_eval::oracle

#endif  // MEMDECAY_TOOLS_EVAL_ORACLE_HPP
