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
#include <optional>
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
  bool belady = false;  ///< the host tier's clairvoyant ceiling (oracle.hpp's farthest_next_need), per episode too
  bool observes_queries = false;  ///< on the attention-free signal: sees the step's queries, not its attention
  /// With a host tier (docs/tiers.md): the device budget's victims go to a host pool and come back on a query's
  /// bound. `host.host_budget` is ignored: the harness sets it per episode from `host_fraction`.
  std::optional<md::host_tier_config> host;
  double host_fraction = -1;  ///< the host tier's size as a fraction of the episode's tokens; < 0: unlimited
  /// How a recall combines a page's bounds over the query heads (the "-mean" variants: head_bounds::mean).
  md::head_bounds recall_heads = md::head_bounds::max;
  /// Recall by exact attention over every held page's keys (the "-exact" variants, exact_recall.hpp): the engine
  /// scores the pages itself and hands the scores to select_recall_for_bounds; recall_heads is then unused.
  bool recall_exact = false;
  bool exact_last_layer = false;   ///< "-exact-last": only the last layer's heads score
  std::size_t exact_channels = 0;  ///< "-exact-ch<r>": only the query's r largest channels per head (0: all)
  /// "-qch<r>": the digest's bound from the query's r largest channels per head only (keep_largest_query_channels)
  std::size_t query_channels = 0;

  /// A clairvoyant ceiling (the oracle or the Belady host tier), not a policy an engine could run.
  [[nodiscard]] bool is_ceiling() const noexcept { return oracle || belady; }
};

/// The oracle (oracle.hpp): the most needs any evictor can serve at the run's budget, protections and page size.
inline policy_kind oracle_kind() {
  policy_kind k;
  k.name = "oracle";
  k.description = "clairvoyant: the exact optimum of the offline residency problem (0-1 program, GLPK), probes first";
  k.oracle = true;
  return k;
}

/// The host tier's ceiling (oracle.hpp, farthest_next_need): Belady's MIN over an unlimited host pool. It knows
/// every future need (probes and inline re-reads), demotes the device page needed farthest away and recalls a page
/// exactly when a need touches it; no minimum stay, no hysteresis. With pages free to come back MIN serves every
/// need whose pages fit the device budget beside the protected ones, with the fewest recalls.
inline policy_kind belady_kind() {
  policy_kind k;
  k.name = "belady";
  k.description = "clairvoyant host tier: Belady's MIN (demote the farthest next need, recall on need), unlimited host";
  k.belady = true;
  k.host = md::host_tier_config{.hysteresis = 0.0, .min_device_steps = 0};
  k.host_fraction = -1;
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

/// `kind` with each sequence it makes set up by `setup(sequence)` (how it observes); the caller names it.
template <class Setup>
policy_kind observing_variant(policy_kind k, const std::string& description, Setup setup) {
  k.description += "; " + description;
  k.make = [make = k.make, setup](const md::config& cfg) {
    auto seq = make(cfg);
    setup(*seq);
    return seq;
  };
  return k;
}

/// Splits "a+b+c" at '+'.
inline std::vector<std::string> split_variants(const std::string& variants) {
  std::vector<std::string> parts;
  std::size_t from = 0;
  for (std::size_t plus; (plus = variants.find('+', from)) != std::string::npos; from = plus + 1)
    parts.push_back(variants.substr(from, plus - from));
  parts.push_back(variants.substr(from));
  return parts;
}

/// A part of a MemDecay variant that changes what the policy observes (at most one per policy).
inline bool is_signal_variant(const std::string& part) {
  return is_query_signal_variant(part) || is_observation_variant(part);
}

/// Whether every part of "a+b+..." is an ablation or a signal, each named once, at most one signal.
inline bool is_memdecay_variant(const std::string& variants) {
  const auto parts = split_variants(variants);
  std::size_t signals = 0;
  for (const auto& p : parts) {
    const bool ablation =
        std::find(ablation_variants().begin(), ablation_variants().end(), p) != ablation_variants().end();
    const bool signal = is_signal_variant(p);
    if ((!ablation && !signal) || std::count(parts.begin(), parts.end(), p) > 1) return false;
    signals += signal ? 1 : 0;
  }
  return signals <= 1;
}

/// MemDecay with the ablations and at most one signal of `variants` ("recent-half", "query", "recent-half+query",
/// ...; is_memdecay_variant), named "memdecay-<mode>+<variants>" as asked.
inline policy_kind memdecay_ablation(md::attention_normalization mode, const std::string& variants,
                                     const memdecay_options& m = {}) {
  if (!is_memdecay_variant(variants)) throw std::invalid_argument("unknown MemDecay ablation '" + variants + "'");
  memdecay_options o = m;
  bool attention_only = false, recent_half = false;
  std::string signal, ablations;
  for (const auto& variant : split_variants(variants)) {
    if (is_signal_variant(variant)) {
      signal = variant;
      continue;
    }
    ablations += (ablations.empty() ? "" : ", ") + variant;
    if (variant == "prior-only")
      o.alpha = 0.0;
    else if (variant == "no-refresh")
      o.tau = 1e30;
    else if (variant == "page-max")
      o.memdecay_page_max = true;
    else if (variant == "attention-only")
      attention_only = true;
    else if (variant == "recent-half")
      recent_half = true;
  }
  policy_kind k = memdecay_kind(mode, o);
  if (!ablations.empty()) {
    k.description += "; ablation: " + ablations;
    auto make = k.make;
    k.make = [make, attention_only, recent_half](const md::config& base) {
      md::config cfg = base;
      if (attention_only) {
        const md::region_table table = cfg.effective_regions();
        for (const auto& r : table.params())
          cfg.region_overrides.push_back({.region = r.name, .base_priority = 1.0, .decay_rate = 0.0});
      }
      if (recent_half) cfg.protection.recent_fraction = 0.5;
      return make(cfg);
    };
  }
  if (is_observation_variant(signal)) {
    k = observing_variant(k, "measured attention observed per page",
                          [](memdecay_tools::any_sequence& s) { s.observe_per_page(); });
  } else if (is_query_signal_variant(signal)) {
    const memdecay_tools::query_signal_options q{
        .how = signal == "query-tokens" ? md::query_signal::bound_softmax_tokens : md::query_signal::bound_softmax,
        .last_query_only = signal == "query-last",
        .key_norms = signal == "knorm"};
    k = observing_variant(
        k,
        q.key_norms ? std::string("attention-free: key norms (KnormPress)")
                    : std::string("attention-free: ") + md::to_string(q.how) + " over fp16 min/max page digests",
        [q](memdecay_tools::any_sequence& s) { s.use_query_signal(q); });
    k.observes_queries = true;
  }
  k.name = std::string("memdecay-") + md::to_string(mode) + "+" + variants;
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

/// For "<rest><tag>": leaves <rest> in `text` and returns true; false, `text` unchanged, when it does not end so.
inline bool take_flag(std::string& text, const std::string& tag) {
  if (text.size() < tag.size() || text.compare(text.size() - tag.size(), tag.size(), tag) != 0) return false;
  text.resize(text.size() - tag.size());
  return true;
}

/// The recall rule's suffix, taken off `text`: "-mean" (head_bounds::mean), "-att" (head_bounds::attention), or
/// none (head_bounds::max).
inline md::head_bounds recall_heads_suffix(std::string& text) {
  if (take_flag(text, "-mean")) return md::head_bounds::mean;
  if (take_flag(text, "-att")) return md::head_bounds::attention;
  return md::head_bounds::max;
}
inline std::string recall_heads_description(md::head_bounds over_heads) {
  if (over_heads == md::head_bounds::mean) return "; recall by the mean of a page's bounds over the query heads";
  if (over_heads == md::head_bounds::attention)
    return "; recall by a page's estimated attention mass (each head's softmax over the bounds, mean over heads)";
  return "";
}

/// The "-exact[-last][-ch<r>]" suffix, taken off `text` into `kind` (exact_recall.hpp's estimates); false without it.
inline bool take_exact_suffix(std::string& text, policy_kind& kind, const std::string& name);

/// For "<rest><tag><value>": returns <value> and leaves <rest> in `text`; nullopt, `text` unchanged, without `tag`.
inline std::optional<std::string> take_suffix(std::string& text, const std::string& tag) {
  const std::size_t at = text.find(tag);
  if (at == std::string::npos) return std::nullopt;
  std::string value = text.substr(at + tag.size());
  text.resize(at);
  return value;
}

inline bool take_exact_suffix(std::string& text, policy_kind& kind, const std::string& name) {
  const std::size_t at = text.rfind("-exact");
  if (at == std::string::npos) return false;
  std::string rest = text.substr(at + 6);
  kind.exact_last_layer = false;
  kind.exact_channels = 0;
  if (const auto ch = rest.find("-ch"); ch != std::string::npos) {
    const std::string digits = rest.substr(ch + 3);
    if (digits.empty() || digits.size() > 3 || digits.find_first_not_of("0123456789") != std::string::npos ||
        std::stoul(digits) == 0)
      throw std::invalid_argument("'" + name + "': -exact-ch takes a channel count, e.g. -exact-ch8");
    kind.exact_channels = static_cast<std::size_t>(std::stoul(digits));
    rest.resize(ch);
  }
  if (rest == "-last") {
    kind.exact_last_layer = true;
  } else if (!rest.empty()) {
    throw std::invalid_argument("'" + name + "': unknown recall '-exact" + text.substr(at + 6) +
                                "' (-exact, -exact-last, -exact-ch<r>, -exact-last-ch<r>)");
  }
  kind.recall_exact = true;
  text.resize(at);
  return true;
}
inline std::string exact_description(const policy_kind& kind) {
  std::string d = "; recall by exact attention over every held page's keys (the engine's host copy)";
  if (kind.exact_last_layer) d += ", the last layer's heads only";
  if (kind.exact_channels > 0) d += ", the query's " + std::to_string(kind.exact_channels) + " largest channels per head";
  return d;
}

/// A count of 1-3 decimal digits, at most `most`; nullopt for anything else.
inline std::optional<std::size_t> small_count(const std::string& digits, std::size_t most) {
  if (digits.empty() || digits.size() > 3 || digits.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  const auto n = static_cast<std::size_t>(std::stoul(digits));
  return n <= most ? std::optional<std::size_t>(n) : std::nullopt;
}

/// The hysteresis of a "-hyst<logits>" suffix ("-hyst1", "-hyst0.5"); std::invalid_argument for anything else.
inline double hysteresis_suffix(const std::string& text, const std::string& name) {
  std::size_t used = 0;
  double h = -1;
  try {
    h = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (text.empty() || used != text.size() || !(h >= 0) || h > 100 || text.find_first_not_of("0123456789.") != std::string::npos)
    throw std::invalid_argument("'" + name + "': -hyst takes logits in [0, 100], e.g. -hyst1 or -hyst0.5");
  return h;
}

/// The recall rule both host-tier spellings end with ("NAME+host<p>[-stay<s>]<rule>" and "arkvale<rule>"), in this
/// order: [-hyst<logits>][-lowest<pages>][-qch<r>][-mean|-att|-exact[-last][-ch<r>]]. Absent parts stay empty.
struct recall_suffixes {
  bool exact = false;  ///< "-exact...": recall by exact attention (the estimate's options are in the kind)
  md::head_bounds over_heads = md::head_bounds::max;
  std::optional<double> hysteresis;
  std::optional<std::size_t> displace_lowest, query_channels;
};

/// Takes the recall rule off the end of `text` (the exact-attention part into `kind`); std::invalid_argument naming
/// `name` for a count outside 1..999 or a malformed hysteresis.
inline recall_suffixes take_recall_suffixes(std::string& text, policy_kind& kind, const std::string& name) {
  recall_suffixes r;
  r.exact = take_exact_suffix(text, kind, name);
  if (!r.exact) r.over_heads = recall_heads_suffix(text);
  auto count = [&](const std::optional<std::string>& digits, const char* tag) -> std::optional<std::size_t> {
    if (!digits) return std::nullopt;
    const auto n = small_count(*digits, 999);
    if (!n || *n == 0)
      throw std::invalid_argument("'" + name + "': " + tag + " takes a count in 1..999, e.g. " + tag + "2");
    return n;
  };
  r.query_channels = count(take_suffix(text, "-qch"), "-qch");
  r.displace_lowest = count(take_suffix(text, "-lowest"), "-lowest");
  if (const auto hyst = take_suffix(text, "-hyst")) r.hysteresis = hysteresis_suffix(*hyst, name);
  return r;
}

/// `kind` with a host tier (name "<name>+host<percent>" or "<name>+host-all", optionally "-stay<steps>", then the
/// recall rule of recall_suffixes): the
/// device budget's victims go to a host pool of `percent` of the episode's tokens (unlimited for -all) instead of
/// being dropped, and come back when a query's Quest bound wants them (the harness asks after every step with its
/// last query and before every probe with the probe's). `rule`: the region rule, hysteresis and minimum stay (the
/// library's defaults: no region rule, every victim is worth the host; no hysteresis; a recalled page kept 4
/// steps); "-stay<steps>" and "-hyst<logits>" set this variant's minimum stay and hysteresis; "-lowest<pages>" lets
/// a recall displace only the policy's that many lowest-scoring evictable pages (host_tier_config::displace_lowest:
/// the policy decides what may leave, the query what returns); "-mean" ranks pages for recall by the mean of their
/// bounds over the query heads instead of the best head's (head_bounds::mean); "-exact" by the attention the query
/// would give each held page over its exact keys (exact_recall.hpp), no digest bound.
inline policy_kind host_variant(policy_kind kind, const std::string& suffix, const md::host_tier_config& rule = {}) {
  if (kind.oracle || kind.belady || kind.host)
    throw std::invalid_argument("'" + kind.name + "' cannot take a host tier");
  auto number = [&](const std::string& digits, std::size_t least, std::size_t most) {
    const auto n = small_count(digits, most);
    if (!n || *n < least)
      throw std::invalid_argument("unknown host tier '" + suffix +
                                  "' (host1 .. host100: percent of the episode, or host-all; then -stay0 .. -stay999)");
    return *n;
  };
  md::host_tier_config tier = rule;
  std::string size = suffix;  // what is left once the rule suffixes are taken off: host<percent> or host-all
  const recall_suffixes rule_suffixes = take_recall_suffixes(size, kind, suffix);
  const bool exact = rule_suffixes.exact;
  const md::head_bounds over_heads = rule_suffixes.over_heads;
  if (rule_suffixes.query_channels) kind.query_channels = *rule_suffixes.query_channels;
  if (rule_suffixes.displace_lowest) tier.displace_lowest = *rule_suffixes.displace_lowest;
  if (rule_suffixes.hysteresis) tier.hysteresis = *rule_suffixes.hysteresis;
  if (const auto stay = take_suffix(size, "-stay")) tier.min_device_steps = static_cast<md::step_t>(number(*stay, 0, 999));
  double fraction = -1;
  if (size != "host-all") {
    if (size.rfind("host", 0) != 0) number("", 1, 0);
    fraction = static_cast<double>(number(size.substr(4), 1, 100)) / 100.0;
  }
  kind.name += "+" + suffix;
  kind.description += (fraction < 0 ? std::string("; host tier, unlimited") : "; host tier of " + size.substr(4) + "% of the episode") +
                      " (min stay " + std::to_string(tier.min_device_steps) + " steps, hysteresis " +
                      md::detail::to_text(tier.hysteresis) + ", min host priority " +
                      md::detail::to_text(tier.min_host_priority) + ")";
  if (tier.displace_lowest > 0)
    kind.description += "; a recall displaces only the policy's " + std::to_string(tier.displace_lowest) +
                        " lowest-scoring pages";
  kind.description += exact ? exact_description(kind) : recall_heads_description(over_heads);
  if (kind.query_channels > 0)
    kind.description += "; the bound from the query's " + std::to_string(kind.query_channels) + " largest channels per head";
  kind.host = tier;
  kind.host_fraction = fraction;
  kind.recall_heads = over_heads;

  return kind;
}
inline bool is_host_suffix(const std::string& s) { return s.rfind("host", 0) == 0; }

/// ArkVale-style recallable eviction (Chen et al., NeurIPS 2024; the source's defaults in policy_catalogue.hpp's
/// source_params): no attention and no region prior; every page scored by the current query's bound against its
/// key digest (TOVA over the attention-free estimate from the step's last query: the ranking of the bounds),
/// 2 sink pages and the last 2 pages kept, every victim backed up to an unlimited host pool, and host pages
/// swapped back whenever their bound beats a device page's (no hysteresis, no minimum stay: ArkVale reselects its
/// top pages every step). Departures: Quest's min/max digest (ArkVale's is centre +- mean distance, not a bound),
/// one selection for every layer and head (ArkVale selects per layer), pinned regions kept as for every policy.
/// `hysteresis` > 0 (name "arkvale-hyst<logits>") and `displaceable` > 0 ("arkvale-lowest<pages>", after the
/// hysteresis) depart from the source on purpose: they measure what the library's anti-thrash margin and the
/// policy-chosen displacement save without a region prior; `over_heads` = mean ("arkvale-mean", last) ranks pages
/// for recall by the mean of their bounds over the heads; `exact` ("arkvale-exact") by exact attention over the held
/// pages' keys (exact_recall.hpp; `exact`'s recall_exact, exact_last_layer and exact_channels), to separate what that
/// signal gives from what the region prior does.
inline policy_kind arkvale_kind(const std::vector<policy_kind>& catalogue, double hysteresis = 0.0,
                                std::size_t displaceable = 0, md::head_bounds over_heads = md::head_bounds::max,
                                const policy_kind* exact = nullptr, std::size_t query_channels = 0) {
  namespace sp = memdecay_tools::source_params;
  const auto tova = std::find_if(catalogue.begin(), catalogue.end(), [](const auto& k) { return k.name == "tova"; });
  if (tova == catalogue.end()) throw std::logic_error("the catalogue has no TOVA");
  const memdecay_tools::query_signal_options o{.how = md::query_signal::bound_softmax, .last_query_only = true};
  policy_kind k;
  k.name = "arkvale";
  k.description = "ArkVale-style: pages by the current query's digest bound, " + std::to_string(sp::arkvale_sink_pages) +
                  " sink + " + std::to_string(sp::arkvale_window_pages) +
                  " window pages, every victim to an unlimited host pool, recall by bound";
  k.make = [make = tova->make, o](const md::config& base) {
    md::config cfg = base;
    cfg.protection = {.sink_pages = sp::arkvale_sink_pages, .recent_tokens = cfg.page_size};
    auto seq = make(cfg);
    seq->use_query_signal(o);
    return seq;
  };
  k.observes_queries = true;
  k.host = md::host_tier_config{.hysteresis = hysteresis, .min_device_steps = 0, .displace_lowest = displaceable};
  if (hysteresis > 0) {
    k.name += "-hyst" + md::detail::to_text(hysteresis);
    k.description += " (hysteresis " + md::detail::to_text(hysteresis) + " logits: not the source's)";
  }
  if (displaceable > 0) {
    k.name += "-lowest" + std::to_string(displaceable);
    k.description += " (a recall displaces only its " + std::to_string(displaceable) +
                     " lowest-scoring pages: not the source's)";
  }
  if (query_channels > 0) {
    k.name += "-qch" + std::to_string(query_channels);
    k.description += " (the bound from the query's " + std::to_string(query_channels) + " largest channels per head)";
    k.query_channels = query_channels;
  }
  if (over_heads == md::head_bounds::mean) {
    k.name += "-mean";
    k.description += " (recall by the mean of a page's bounds over the heads)";
  } else if (over_heads == md::head_bounds::attention) {
    k.name += "-att";
    k.description += " (recall by a page's estimated attention mass over the heads)";
  }
  if (exact != nullptr && exact->recall_exact) {
    k.name += "-exact";
    if (exact->exact_last_layer) k.name += "-last";
    if (exact->exact_channels > 0) k.name += "-ch" + std::to_string(exact->exact_channels);
    k.description += " (" + exact_description(*exact).substr(2) + ": not the source's digest bound)";
    k.recall_exact = true;
    k.exact_last_layer = exact->exact_last_layer;
    k.exact_channels = exact->exact_channels;
  }
  k.recall_heads = over_heads;
  k.host_fraction = -1;
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
