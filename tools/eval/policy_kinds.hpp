// SPDX-License-Identifier: Apache-2.0
// memdecay-eval's policies: each row of the results is a policy (a name, a description, a factory over
// memdecay_tools::any_sequence built from the run's config) at a page size. The baselines come from the one
// catalogue that memdecay-replay also uses (tools/common/policy_catalogue.hpp); the MemDecay modes, ablations and
// the oracle are the evaluation's own.
#ifndef MEMDECAY_TOOLS_EVAL_POLICY_KINDS_HPP
#define MEMDECAY_TOOLS_EVAL_POLICY_KINDS_HPP

#include <cstddef>
#include <algorithm>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <memdecay/core/config.hpp>
#include <memdecay/core/sequence.hpp>
#include <memdecay/policies/memdecay.hpp>

#include "../common/any_sequence.hpp"
#include "../common/policy_catalogue.hpp"

namespace memdecay_eval {

namespace md = memdecay;

/// A policy by name, with a factory that builds its sequence from the run's config (budget, page size, protections
/// and region overrides already set).
struct policy_kind {
  std::string name;
  std::string description;
  std::function<std::unique_ptr<memdecay_tools::any_sequence>(const md::config&)> make;
  bool oracle = false;  ///< the clairvoyant evictor (oracle.hpp): built per episode from its needs, not by `make`
  bool observes_queries = false;  ///< on the attention-free signal: sees the step's queries, not its attention
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
///   page-mass       the measured attention summed per page and observed per page (observe_pages: shared evenly
///                   among the page's tokens), as the attention-free signal is: separates what the signal's
///                   page granularity does from what its estimate does.
inline const std::vector<std::string>& ablation_variants() {
  static const std::vector<std::string> v{"prior-only", "attention-only", "no-refresh", "recent-half", "page-max"};
  return v;
}
inline bool is_observation_variant(const std::string& variant) { return variant == "page-mass"; }

/// MemDecay on the attention-free signal (name "memdecay-<mode>+<variant>"): the engine's attention is not
/// observed; each step's queries are, against Quest min/max page digests of the keys kept in fp16
/// (digests/query_signal.hpp), every layer's heads as KV heads:
///   query         bound_softmax: a page's estimated share is the softmax of its bound over the pages
///   query-tokens  bound_softmax_tokens: the same, each page weighted by its resident tokens
///   knorm         no query either: each resident key's norm (KnormPress; digests/key_norm_signal.hpp)
///   query-last    bound_softmax from the step's last query only (a prefill chunk's other queries unused: each
///                 query's estimate covers every resident token, the chunk's later ones included, which the
///                 measured attention's causal mask hides from it; the last query sees them all)
inline const std::vector<std::string>& query_signal_variants() {
  static const std::vector<std::string> v{"query", "query-tokens", "query-last", "knorm"};
  return v;
}
inline bool is_query_signal_variant(const std::string& variant) {
  const auto& v = query_signal_variants();
  return std::find(v.begin(), v.end(), variant) != v.end();
}

/// `kind` renamed "<name>+<variant>", each sequence it makes set up by `setup(sequence)` (how it observes).
template <class Setup>
policy_kind observing_variant(policy_kind k, const std::string& variant, const std::string& description, Setup setup) {
  k.name += "+" + variant;
  k.description += "; " + description;
  k.make = [make = k.make, setup](const md::config& cfg) {
    auto seq = make(cfg);
    setup(*seq);
    return seq;
  };
  return k;
}

inline policy_kind memdecay_ablation(md::attention_normalization mode, const std::string& variant,
                                     const memdecay_options& m = {}) {
  if (is_observation_variant(variant))
    return observing_variant(memdecay_kind(mode, m), variant, "measured attention observed per page",
                             [](memdecay_tools::any_sequence& s) { s.observe_per_page(); });
  if (is_query_signal_variant(variant)) {
    const memdecay_tools::query_signal_options o{
        .how = variant == "query-tokens" ? md::query_signal::bound_softmax_tokens : md::query_signal::bound_softmax,
        .last_query_only = variant == "query-last",
        .key_norms = variant == "knorm"};
    policy_kind k = observing_variant(
        memdecay_kind(mode, m), variant,
        o.key_norms ? std::string("attention-free: key norms (KnormPress)")
                    : std::string("attention-free: ") + md::to_string(o.how) + " over fp16 min/max page digests",
        [o](memdecay_tools::any_sequence& s) { s.use_query_signal(o); });
    k.observes_queries = true;
    return k;
  }
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

}  // namespace memdecay_eval

#endif  // MEMDECAY_TOOLS_EVAL_POLICY_KINDS_HPP
