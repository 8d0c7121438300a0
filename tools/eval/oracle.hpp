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
// Probes weigh more than all re-reads together (w = re-reads + 1), so the oracle first maximises the probes that
// survive (it is never beaten on probe survival; tests check both that and equality with a brute force on tiny
// episodes), then the re-reads it can serve besides. Its plan becomes a policy: a page scores its departure time,
// so the evictor, taking the lowest scores first and only when over budget, never takes a page the plan still
// needs (the plan fits every step by construction).
#ifndef MEMDECAY_TOOLS_EVAL_ORACLE_HPP
#define MEMDECAY_TOOLS_EVAL_ORACLE_HPP

#include <algorithm>
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
}  // namespace detail

/// The exact optimum (0-1 integer program above, solved by GLPK).
inline solution solve(const problem& pr) {
  const std::size_t S = pr.steps(), P = pr.pages();
  std::vector<std::size_t> until(P);  // protection ends after step until[p] - 1
  for (std::size_t p = 0; p < P; ++p) until[p] = pr.protected_end(p);
  auto always = [&](std::size_t p) { return pr.pinned[p] || p < pr.sink_pages; };
  // Need times per unprotected page.
  std::vector<std::vector<std::size_t>> times(P);
  for (const auto& nd : pr.needs)
    for (std::uint32_t j = nd.first; j < nd.first + nd.length; ++j) {
      const std::size_t p = j / pr.page_size;
      if (!always(p) && nd.time >= until[p]) times[p].push_back(nd.time);
    }
  std::vector<std::vector<int>> col(P);  // GLPK column of y[p][k]
  int ncols = 0;
  for (std::size_t p = 0; p < P; ++p) {
    auto& t = times[p];
    std::sort(t.begin(), t.end());
    t.erase(std::unique(t.begin(), t.end()), t.end());
    for (std::size_t k = 0; k < t.size(); ++k) col[p].push_back(++ncols);
  }
  std::vector<int> need_col(pr.needs.size(), 0);
  const int first_u = ncols + 1;
  for (std::size_t n = 0; n < pr.needs.size(); ++n) need_col[n] = ++ncols;

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
  // Monotone: y[p][k+1] - y[p][k] <= 0.
  for (std::size_t p = 0; p < P; ++p)
    for (std::size_t k = 0; k + 1 < col[p].size(); ++k) {
      terms = {{col[p][k + 1], 1.0}, {col[p][k], -1.0}};
      add_row(terms, 0.0);
    }
  // Capacity after each step.
  for (std::size_t i = 0; i < S; ++i) {
    std::uint64_t forced = 0;
    terms.clear();
    for (std::size_t p = 0; p < P && p * pr.page_size < pr.step_end[i]; ++p) {
      if (always(p) || i < until[p]) {
        forced += pr.tokens_of(p, i);
        continue;
      }
      const auto& t = times[p];
      const auto it = std::lower_bound(t.begin(), t.end(), i);
      if (it != t.end()) terms.emplace_back(col[p][static_cast<std::size_t>(it - t.begin())], 1.0);
    }
    const std::uint64_t room = forced >= pr.budget_tokens ? 0 : (pr.budget_tokens - forced) / pr.page_size;
    if (terms.size() > room) add_row(terms, static_cast<double>(room));
  }
  // Needs.
  for (std::size_t n = 0; n < pr.needs.size(); ++n) {
    const auto& nd = pr.needs[n];
    std::size_t last = std::numeric_limits<std::size_t>::max();
    for (std::uint32_t j = nd.first; j < nd.first + nd.length; ++j) {
      const std::size_t p = j / pr.page_size;
      if (p == last || always(p) || nd.time < until[p]) continue;
      last = p;
      const auto& t = times[p];
      const auto k = static_cast<std::size_t>(std::lower_bound(t.begin(), t.end(), nd.time) - t.begin());
      terms = {{need_col[n], 1.0}, {col[p][k], -1.0}};
      add_row(terms, 0.0);
    }
  }

  std::vector<double> value(static_cast<std::size_t>(ncols) + 1, 0.0);
  {
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
    if (ncols > 0) glp_add_cols(lp, ncols);
    for (int c = 1; c < first_u; ++c) glp_set_col_kind(lp, c, GLP_BV);
    for (std::size_t n = 0; n < pr.needs.size(); ++n) {
      glp_set_col_bnds(lp, need_col[n], GLP_DB, 0.0, 1.0);
      glp_set_obj_coef(lp, need_col[n], static_cast<double>(pr.needs[n].weight));
    }
    if (!row_upper.empty()) {
      glp_add_rows(lp, static_cast<int>(row_upper.size()));
      for (std::size_t r = 0; r < row_upper.size(); ++r)
        glp_set_row_bnds(lp, static_cast<int>(r) + 1, GLP_UP, 0.0, row_upper[r]);
      glp_load_matrix(lp, static_cast<int>(ia.size()) - 1, ia.data(), ja.data(), ar.data());
    }
    if (ncols > 0) {
      glp_iocp parm;
      glp_init_iocp(&parm);
      parm.presolve = GLP_ON;
      parm.msg_lev = GLP_MSG_OFF;
      const int rc = glp_intopt(lp, &parm);
      if (rc != 0 || glp_mip_status(lp) != GLP_OPT)
        throw std::runtime_error("oracle: GLPK did not find the optimum (glp_intopt " + std::to_string(rc) +
                                 ", status " + std::to_string(glp_mip_status(lp)) + ")");
      for (int c = 1; c <= ncols; ++c) value[static_cast<std::size_t>(c)] = glp_mip_col_val(lp, c);
    }
  }
  std::vector<std::size_t> departure(P);
  for (std::size_t p = 0; p < P; ++p) {
    if (always(p)) {
      departure[p] = solution::forever;
      continue;
    }
    departure[p] = until[p];
    for (std::size_t k = 0; k < col[p].size(); ++k)
      if (value[static_cast<std::size_t>(col[p][k])] > 0.5) departure[p] = std::max(departure[p], times[p][k] + 1);
    if (departure[p] >= S) departure[p] = solution::forever;  // resident to the end
  }
  solution out;
  if (!evaluate(pr, departure, out)) throw std::logic_error("oracle: the solver's plan breaks a budget");
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
  std::map<std::int32_t, std::uint32_t> planted;  // key -> position of the fact `key value`
  for (std::size_t j = 0; j + 1 < ep.tokens.size(); ++j) {
    const bool after_query = j > 0 && ep.tokens[j - 1] == query;
    if (ep.tokens[j] == query) {
      const auto it = planted.find(ep.tokens[j + 1]);
      if (it == planted.end()) continue;
      const std::size_t s = step_of(j + 1);
      if (s == 0 || step_of(it->second + 1) >= s) continue;  // read in the step that planted it: always resident
      out.push_back({s - 1, it->second, 2, 1, -1});
    } else if (!after_query && !planted.contains(ep.tokens[j])) {
      planted.emplace(ep.tokens[j], static_cast<std::uint32_t>(j));
    }
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
