// SPDX-License-Identifier: Apache-2.0
// memdecay: a deterministic, seeded generator of synthetic agent episodes in the trace format (trace.hpp).
//
// THE ATTENTION IT WRITES IS SYNTHETIC. It comes from the generative model below, not from a transformer; it is
// built to have the structure the policies react to (region-dependent lifetimes, re-reads, sinks, recency), and
// its parameters are known, so calibration can be tested against them. docs/trace-format.md describes it.
//
// An episode looks like an orchestrated agent prompt: a system prompt, the user's task, a plan, then actions until
// the episode holds exactly `tokens` tokens: tool calls (tool_in) with long tool-output bodies (tool_out),
// retrieved documents, scratchpad bursts, plan updates and user follow-ups. Prefilled regions (system, user,
// tool_out, retrieval) enter `prefill_chunk` tokens per step; generated regions (plan, tool_in, scratchpad) one
// token per step. Facts are planted the way they sit in real prompts: long bodies (tool outputs, retrieved prose)
// hold a cluster of a few facts in one dense span inside long filler, short turns hold at most one. Each fact is
// queried once, at a step drawn uniformly between its last token's arrival and the end of the episode, so ages
// spread from one step to the whole episode.
//
// Attention model, per observation step t (every `observe_every` steps, and at every query), per layer l, over
// every position j appended so far (region r, last referenced at step ref_j, initially its arrival step):
//
//   w_j = floor_r + g_l * A_r * exp(-ln 2 * (t - ref_j) / h_r)      region floor + excess with half-life h_r
//       + s_l * sink   (j < sink_tokens)                             attention sink on the first tokens
//       + recent * exp(-(L - 1 - j) / recent_scale)                  locality: the last few tokens
//   w_j *= u_j,  u_j uniform in [1 - noise, 1 + noise]               per token, per layer, per step
//
// The row is w / sum(w) scaled to (1 - bursts), plus the bursts: a query puts `query_share` of the row evenly on
// the fact it asks for; with probability `rereference_rate` an observation also re-reads an earlier span (a fact,
// or a filler span of 8-24 tokens; spans are picked with per-region weights) with `rereference_share`. A burst is
// a re-reference: ref_j := t for its tokens, so their excess restarts at full strength. Layer l of L has
// g_l = 0.5 + l / (L - 1) and s_l = 1.5 - l / (L - 1) (early layers sink-heavy, late layers region-heavy); with
// one layer g = s = 1. Every row sums to 1.
#ifndef MEMDECAY_IO_TRACE_GENERATOR_HPP
#define MEMDECAY_IO_TRACE_GENERATOR_HPP

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numbers>
#include <string>
#include <vector>

#include "memdecay/detail/error.hpp"
#include "memdecay/core/region.hpp"
#include "memdecay/io/trace.hpp"

namespace memdecay::trace {

/// A SplitMix64 stream: the generator's only source of randomness (counter-based, identical on every platform).
class splitmix64 {
 public:
  explicit splitmix64(std::uint64_t seed) noexcept : state_(seed) {}
  std::uint64_t next() noexcept {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  /// Uniform in [0, 1).
  double uniform() noexcept { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  /// Uniform integer in [lo, hi] (hi >= lo).
  std::uint32_t between(std::uint32_t lo, std::uint32_t hi) noexcept {
    return lo + static_cast<std::uint32_t>(next() % (std::uint64_t{hi} - lo + 1));
  }
  bool chance(double p) noexcept { return uniform() < p; }

 private:
  std::uint64_t state_;
};

/// An inclusive range of token counts.
struct length_range {
  std::uint32_t lo;
  std::uint32_t hi;
};

/// What the episodes look like: segment lengths per kind and the mix of actions.
struct episode_shape {
  length_range system{40, 56};
  length_range task{24, 40};  ///< the user's first turn
  length_range plan{16, 24};  ///< the first plan
  length_range tool_in{8, 16};
  length_range tool_out{48, 96};
  length_range retrieval{48, 96};
  length_range scratchpad{16, 40};
  length_range follow_up{12, 24};  ///< later user turns
  length_range plan_update{8, 16};
  /// Relative weights of the actions after the plan: tool call, retrieval, scratchpad, user follow-up, plan update.
  std::array<double, 5> action_weights{0.35, 0.15, 0.25, 0.10, 0.15};
};

/// The attention model of one region (see the header comment).
struct region_attention {
  double half_life;           ///< h_r, steps
  double amplitude;           ///< A_r: excess over the floor right after a (re)reference
  double floor;               ///< floor_r: the long-range level
  double rereference_weight;  ///< how often re-reads pick this region's spans
};

/// The per-region model for the default seven regions, half-lives matching default_region_table().
inline std::array<region_attention, regions::default_count> default_region_attention() {
  return {{
      {170.0, 3.0, 1.0, 0.5},  // system
      {120.0, 4.0, 1.0, 2.0},  // plan
      {80.0, 4.0, 1.0, 2.0},   // user
      {30.0, 3.0, 1.0, 0.5},   // tool_in
      {40.0, 3.0, 1.0, 1.0},   // tool_out
      {100.0, 3.0, 1.0, 1.5},  // retrieval
      {15.0, 5.0, 1.0, 0.5},   // scratchpad
  }};
}

/// Everything the generator does is a pure function of this.
struct generator_config {
  std::uint64_t seed = 1;
  std::uint32_t tokens = 450;        ///< every episode holds exactly this many tokens
  std::uint32_t layers = 1;          ///< attention rows per observation
  std::uint32_t prefill_chunk = 32;  ///< tokens per step for prefilled regions
  std::uint32_t observe_every = 2;   ///< an observation every k steps (and at every query)
  episode_shape shape{};
  std::array<region_attention, regions::default_count> attention = default_region_attention();
  double sink = 4.0;  ///< extra weight of each of the first sink_tokens tokens
  std::uint32_t sink_tokens = 4;
  double recent = 6.0;                  ///< locality weight of the newest token
  double recent_scale = 8.0;            ///< tokens over which locality falls by e
  double noise = 0.4;                   ///< multiplicative uniform noise amplitude, in [0, 1)
  double query_share = 0.4;             ///< row share a query puts on its fact
  double rereference_rate = 0.25;       ///< probability an observation also re-reads an earlier span
  double rereference_share = 0.3;       ///< row share of a re-read
  double fact_probability_short = 0.6;  ///< chance a short turn holds a fact
  double cluster_probability = 0.9;     ///< chance a long body holds a cluster of facts
  length_range cluster_facts{2, 4};     ///< facts per cluster
  length_range fact_tokens{4, 8};       ///< tokens per fact
  length_range fact_gap{0, 3};          ///< filler tokens between the facts of a cluster

  /// Throws config_error naming the field when the config cannot generate episodes.
  void validate() const {
    auto bad = [](const std::string& what) { memdecay::detail::raise_config("trace generator: " + what); };
    if (tokens < 64) bad("tokens = " + std::to_string(tokens) + " (at least 64)");
    if (layers == 0 || layers > max_layers) bad("layers = " + std::to_string(layers) + " (must be in [1, 4096])");
    if (prefill_chunk == 0) bad("prefill_chunk = 0");
    if (observe_every == 0) bad("observe_every = 0");
    if (!(noise >= 0.0 && noise < 1.0)) bad("noise must be in [0, 1)");
    if (!(query_share >= 0.0 && rereference_share >= 0.0 && query_share + rereference_share < 1.0))
      bad("query_share + rereference_share must be in [0, 1)");
    if (!(rereference_rate >= 0.0 && rereference_rate <= 1.0)) bad("rereference_rate must be in [0, 1]");
    for (const auto* r : {&shape.system, &shape.task, &shape.plan, &shape.tool_in, &shape.tool_out, &shape.retrieval,
                          &shape.scratchpad, &shape.follow_up, &shape.plan_update, &cluster_facts, &fact_tokens})
      if (r->lo == 0 || r->lo > r->hi) bad("a length range is empty or starts at 0");
    if (fact_gap.lo > fact_gap.hi) bad("fact_gap is empty");
    if (shape.system.hi + shape.task.hi + shape.plan.hi >= tokens) bad("the opening segments do not fit the episode");
    double total = 0;
    for (double w : shape.action_weights) {
      if (!(w >= 0.0) || !std::isfinite(w)) bad("action weights must be finite and >= 0");
      total += w;
    }
    if (!(total > 0.0)) bad("action weights sum to 0");
    for (const auto& a : attention)
      if (!(a.half_life > 0.0) || !(a.amplitude >= 0.0) || !(a.floor > 0.0) || !(a.rereference_weight >= 0.0) ||
          !std::isfinite(a.half_life + a.amplitude + a.floor + a.rereference_weight))
        bad("region attention parameters must be finite, half_life and floor > 0, the rest >= 0");
  }
};

/// The config of one of the protocol's two context tiers: about 450 tokens (`small`) and about 1,700 (`large`),
/// with segment lengths scaled to the tier.
inline generator_config tier_config(std::uint32_t tokens, std::uint64_t seed = 1) {
  generator_config c;
  c.seed = seed;
  c.tokens = tokens;
  if (tokens >= 1000) {
    c.shape = episode_shape{.system = {96, 144},
                            .task = {40, 80},
                            .plan = {24, 48},
                            .tool_in = {8, 24},
                            .tool_out = {128, 320},
                            .retrieval = {128, 256},
                            .scratchpad = {24, 64},
                            .follow_up = {24, 56},
                            .plan_update = {16, 32}};
  }
  return c;
}

/// The ground truth of a generated fact (what the probe asks for, and when it was planted).
struct planted_fact {
  probe query;
  step_t planted;  ///< the step its last token arrived
};

namespace detail {

struct planned_segment {
  region_id region;
  std::uint32_t tokens;
  bool generated;  ///< one token per step (else prefilled in chunks)
};

struct span {
  std::uint32_t first;
  std::uint32_t length;
};

inline std::vector<planned_segment> plan_segments(const generator_config& c, splitmix64& rng) {
  auto len = [&](length_range r) { return rng.between(r.lo, r.hi); };
  std::vector<planned_segment> segs{{regions::system, len(c.shape.system), false},
                                    {regions::user, len(c.shape.task), false},
                                    {regions::plan, len(c.shape.plan), true}};
  double total_weight = 0;
  for (double w : c.shape.action_weights) total_weight += w;
  auto total = [&] {
    std::uint64_t n = 0;
    for (const auto& s : segs) n += s.tokens;
    return n;
  };
  while (total() < c.tokens) {
    double pick = rng.uniform() * total_weight;
    std::size_t action = 0;
    while (action + 1 < c.shape.action_weights.size() && pick >= c.shape.action_weights[action])
      pick -= c.shape.action_weights[action++];
    switch (action) {
      case 0:
        segs.push_back({regions::tool_in, len(c.shape.tool_in), true});
        segs.push_back({regions::tool_out, len(c.shape.tool_out), false});
        break;
      case 1: segs.push_back({regions::retrieval, len(c.shape.retrieval), false}); break;
      case 2: segs.push_back({regions::scratchpad, len(c.shape.scratchpad), true}); break;
      case 3: segs.push_back({regions::user, len(c.shape.follow_up), false}); break;
      default: segs.push_back({regions::plan, len(c.shape.plan_update), true}); break;
    }
  }
  // Trim to exactly c.tokens: shorten the last segment, dropping it if nothing of it would remain.
  std::uint64_t excess = total() - c.tokens;
  while (excess > 0) {
    auto& last = segs.back();
    if (last.tokens > excess) {
      last.tokens -= static_cast<std::uint32_t>(excess);
      excess = 0;
    } else {
      excess -= last.tokens;
      segs.pop_back();
    }
  }
  return segs;
}

}  // namespace detail

/// Generates one episode with its own seed. Deterministic: the same config and seed give the same episode,
/// byte for byte. `facts` (optional) receives the planted facts.
inline episode generate_episode(const generator_config& c, std::uint64_t seed, std::string name,
                                std::vector<planted_fact>* facts = nullptr) {
  c.validate();
  splitmix64 rng(seed);
  const auto segs = detail::plan_segments(c, rng);

  // Timeline: which tokens arrive at which step.
  struct append_op {
    step_t step;
    region_id region;
    std::uint32_t tokens;
  };
  std::vector<append_op> ops;
  std::vector<step_t> arrival(c.tokens);
  std::vector<region_id> label(c.tokens);
  std::vector<std::uint32_t> seg_start;
  {
    step_t step = 0;
    std::uint32_t pos = 0;
    for (const auto& s : segs) {
      seg_start.push_back(pos);
      for (std::uint32_t done = 0; done < s.tokens;) {
        const std::uint32_t n = s.generated ? 1 : std::min(c.prefill_chunk, s.tokens - done);
        ops.push_back({step, s.region, n});
        for (std::uint32_t k = 0; k < n; ++k) {
          arrival[pos + k] = step;
          label[pos + k] = s.region;
        }
        pos += n;
        done += n;
        ++step;
      }
    }
  }
  const step_t last_step = ops.back().step;

  // Facts: a cluster inside long bodies, at most one in short turns; each queried once.
  std::vector<planted_fact> planted;
  for (std::size_t k = 0; k < segs.size(); ++k) {
    const auto& s = segs[k];
    const bool body = s.region == regions::tool_out || s.region == regions::retrieval;
    std::vector<detail::span> spans;
    if (body && rng.chance(c.cluster_probability)) {
      const std::uint32_t n = rng.between(c.cluster_facts.lo, c.cluster_facts.hi);
      std::vector<std::uint32_t> lengths, gaps;
      std::uint32_t width = 0;
      for (std::uint32_t f = 0; f < n; ++f) {
        lengths.push_back(rng.between(c.fact_tokens.lo, c.fact_tokens.hi));
        gaps.push_back(f + 1 < n ? rng.between(c.fact_gap.lo, c.fact_gap.hi) : 0);
        width += lengths.back() + gaps.back();
      }
      if (width <= s.tokens) {
        std::uint32_t at = seg_start[k] + rng.between(0, s.tokens - width);
        for (std::uint32_t f = 0; f < n; ++f) {
          spans.push_back({at, lengths[f]});
          at += lengths[f] + gaps[f];
        }
      }
    } else if (!body && rng.chance(c.fact_probability_short)) {
      const std::uint32_t length = std::min(s.tokens, rng.between(c.fact_tokens.lo, c.fact_tokens.hi));
      spans.push_back({seg_start[k] + rng.between(0, s.tokens - length), length});
    }
    for (const auto& sp : spans) {
      const step_t ready = arrival[sp.first + sp.length - 1];
      if (ready >= last_step) continue;  // nothing left to ask it in
      const step_t query = static_cast<step_t>(rng.between(ready + 1, last_step));
      planted.push_back(
          {probe{query, static_cast<std::uint32_t>(planted.size()), s.region, sp.first, sp.length}, ready});
    }
  }

  episode ep;
  ep.name = std::move(name);
  ep.seed = seed;
  std::vector<step_t> ref(arrival);  // last (re)reference of each token
  std::vector<double> weight(c.tokens);
  std::uint32_t context = 0;
  std::size_t next_op = 0;
  std::vector<std::vector<std::size_t>> queries(last_step + 1);
  for (std::size_t f = 0; f < planted.size(); ++f) queries[planted[f].query.step].push_back(f);
  const double ln2 = std::numbers::ln2;

  for (step_t t = 0; t <= last_step; ++t) {
    while (next_op < ops.size() && ops[next_op].step == t) {
      ep.events.emplace_back(segment{t, ops[next_op].region, ops[next_op].tokens});
      context += ops[next_op].tokens;
      ++next_op;
    }
    for (std::size_t f : queries[t]) ep.events.emplace_back(planted[f].query);
    const bool observe = t % c.observe_every == 0 || !queries[t].empty() || t == last_step;
    if (!observe) continue;

    // Bursts of this observation: the queries, and maybe one re-read of an earlier span.
    struct burst {
      detail::span where;
      double share;
    };
    std::vector<burst> bursts;
    for (std::size_t f : queries[t])
      bursts.push_back(
          {{planted[f].query.first, planted[f].query.length}, c.query_share / static_cast<double>(queries[t].size())});
    if (rng.chance(c.rereference_rate)) {
      // Pick a region by weight among those present before this step, then a fact or a filler span of it.
      std::array<double, regions::default_count> present{};
      for (std::uint32_t j = 0; j < context; ++j)
        if (arrival[j] < t) present[label[j]] = c.attention[label[j]].rereference_weight;
      double total = 0;
      for (double w : present) total += w;
      if (total > 0) {
        double pick = rng.uniform() * total;
        region_id r = 0;
        while (std::size_t{r} + 1 < present.size() && pick >= present[r]) pick -= present[r++];
        std::vector<detail::span> facts_of_r;
        for (const auto& f : planted)
          if (f.query.region == r && f.planted < t) facts_of_r.push_back({f.query.first, f.query.length});
        if (!facts_of_r.empty() && rng.chance(0.5)) {
          bursts.push_back(
              {facts_of_r[rng.between(0, static_cast<std::uint32_t>(facts_of_r.size() - 1))], c.rereference_share});
        } else {
          std::vector<std::uint32_t> tokens_of_r;
          for (std::uint32_t j = 0; j < context; ++j)
            if (label[j] == r && arrival[j] < t) tokens_of_r.push_back(j);
          if (tokens_of_r.empty()) tokens_of_r.push_back(0);  // only through rounding of `pick`: re-read the start
          const std::uint32_t centre = tokens_of_r[rng.between(0, static_cast<std::uint32_t>(tokens_of_r.size() - 1))];
          const std::uint32_t length = rng.between(8, 24);
          // The span stays inside the run of region r around `centre`.
          std::uint32_t first = centre, end = centre + 1;
          while (end < context && end - first < length && label[end] == r && arrival[end] < t) ++end;
          while (first > 0 && end - first < length && label[first - 1] == r) --first;
          bursts.push_back({{first, end - first}, c.rereference_share});
        }
      }
    }
    double burst_total = 0;
    for (const auto& b : bursts) burst_total += b.share;

    attention obs{t, context, std::vector<attention_row>(c.layers)};
    for (std::uint32_t l = 0; l < c.layers; ++l) {
      const double frac = c.layers == 1 ? 0.5 : static_cast<double>(l) / (c.layers - 1);
      const double g = c.layers == 1 ? 1.0 : 0.5 + frac, s = c.layers == 1 ? 1.0 : 1.5 - frac;
      double sum = 0;
      for (std::uint32_t j = 0; j < context; ++j) {
        const auto& a = c.attention[label[j]];
        double w = a.floor + g * a.amplitude * std::exp(-ln2 * static_cast<double>(t - ref[j]) / a.half_life);
        if (j < c.sink_tokens) w += s * c.sink;
        w += c.recent * std::exp(-static_cast<double>(context - 1 - j) / c.recent_scale);
        w *= 1.0 + c.noise * (2.0 * rng.uniform() - 1.0);
        weight[j] = w;
        sum += w;
      }
      const double scale = (1.0 - burst_total) / sum;
      for (std::uint32_t j = 0; j < context; ++j) weight[j] *= scale;
      for (const auto& b : bursts)
        for (std::uint32_t j = b.where.first; j < b.where.first + b.where.length; ++j)
          weight[j] += b.share / b.where.length;
      auto& row = obs.layers[l];
      row.mass.resize(context);
      for (std::uint32_t j = 0; j < context; ++j) row.mass[j] = static_cast<float>(weight[j]);
    }
    for (const auto& b : bursts)
      for (std::uint32_t j = b.where.first; j < b.where.first + b.where.length; ++j) ref[j] = t;
    ep.events.emplace_back(std::move(obs));
  }
  if (facts) *facts = std::move(planted);
  return ep;
}

/// The seed of episode `index` of a tier: a SplitMix64 mix of the config's seed, the tier size and the index,
/// so episodes are independent and any one can be regenerated alone.
[[nodiscard]] inline std::uint64_t episode_seed(const generator_config& c, std::uint64_t index) noexcept {
  splitmix64 mix(c.seed ^ (std::uint64_t{c.tokens} << 32) ^ (index * 0xd1b54a32d192ed03ULL));
  mix.next();
  return mix.next();
}

/// Generates episodes 0, 1, ... of one tier until they hold at least `min_probes` probes (and at least one
/// episode). The file's label is `label`, or "tier-<tokens>".
inline trace_file generate_tier(const generator_config& c, std::size_t min_probes, std::string label = {}) {
  c.validate();
  trace_file f;
  f.label = label.empty() ? "tier-" + std::to_string(c.tokens) : std::move(label);
  f.layers = c.layers;
  f.region_names = default_region_names();
  std::size_t probes = 0;
  for (std::uint64_t k = 0; f.episodes.empty() || probes < min_probes; ++k) {
    f.episodes.push_back(generate_episode(c, episode_seed(c, k), f.label + "/" + std::to_string(k)));
    probes += f.episodes.back().count_probes();
  }
  return f;
}

/// The eviction-probe protocol's trace set: the ~450- and ~1,700-token tiers, each with at least
/// `probes_per_tier` probes (2 x 2,160 = the paper's 4,320 by default).
inline std::vector<trace_file> generate_protocol(std::uint64_t seed = 1, std::size_t probes_per_tier = 2160,
                                                 std::uint32_t layers = 1) {
  std::vector<trace_file> out;
  for (std::uint32_t tokens : {450u, 1700u}) {
    auto c = tier_config(tokens, seed);
    c.layers = layers;
    out.push_back(generate_tier(c, probes_per_tier));
  }
  return out;
}

}  // namespace memdecay::trace

#endif  // MEMDECAY_IO_TRACE_GENERATOR_HPP
