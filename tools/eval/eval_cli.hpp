// SPDX-License-Identifier: Apache-2.0
// The evaluation command line shared by memdecay-eval (the bundled models in the project's engine) and
// memdecay-llama (any GGUF model inside llama.cpp): its options, and run(), which evaluates every policy on
// every model x episode file through an Engine's sessions (harness.hpp) and prints the same tables, JSON and plot.
//
// An Engine provides: model_type (name(), vocab()), session_type (the harness's Session contract),
//   model_path(spec, data_dir) -> std::filesystem::path;  load(path) -> model_type;
//   max_positions(model), layers(model), describe(model) -> json, factory(model) -> session_factory;
//   tool (the program's name); and optionally report(std::ostream&) / report_json(json&) for its own numbers.
#ifndef MEMDECAY_TOOLS_EVAL_EVAL_CLI_HPP
#define MEMDECAY_TOOLS_EVAL_EVAL_CLI_HPP

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <memdecay/calibration/file.hpp>
#include <memdecay/io/trace.hpp>
#include <memdecay/version.hpp>

#include "../common/progress_bar.hpp"
#include "../common/svg_plot.hpp"
#include "engine/model_config.hpp"
#include "episodes.hpp"
#include "bootstrap.hpp"
#include "harness.hpp"

#ifndef MEMDECAY_EVAL_DATA_DIR
#define MEMDECAY_EVAL_DATA_DIR "models"
#endif

namespace memdecay_eval::cli {

namespace md = memdecay;
namespace ev = memdecay_eval;
using json = nlohmann::ordered_json;

struct options {
  std::string data_dir = MEMDECAY_EVAL_DATA_DIR;
  std::vector<std::string> models{"small", "large"};
  std::vector<int> tiers{450, 1700};
  std::vector<std::string> families{"control"};
  std::vector<std::string> episode_files;
  std::size_t episodes = 0;
  std::vector<double> budgets{0.25, 0.5, 0.75};
  std::vector<std::string> policies{"all"};
  std::vector<std::size_t> page_sizes{16, 1};
  std::vector<std::size_t> baseline_page_sizes{16};
  std::size_t threads = 1;
  bool quick = false;
  std::string json_path, markdown_path, plot_path;
  std::vector<std::string> plot_policies;
  std::string traces_dir;
  std::size_t trace_episodes = 24;
  bool no_trace_attention = false;
  std::vector<std::string> calibrations;
  std::size_t recent_tokens = 16, sink_pages = 0, prefill_chunk = 32;
  bool pin_plan = false, no_fork = false;
  std::optional<double> alpha, tau, ewma_beta;
  std::optional<double> h2o_recent_fraction;
  std::optional<std::size_t> snapkv_window, scissorhands_history;
  md::host_tier_config host;  // the +host variants' recall rule (the library's defaults unless told)
  bool progress = false, no_progress = false, list_policies = false;
};

inline ev::memdecay_options catalogue(const options& o) {
  auto c = ev::memdecay_options::memdecay(o.alpha, o.tau, o.ewma_beta);
  c.h2o_recent_fraction = o.h2o_recent_fraction;
  c.snapkv_window = o.snapkv_window;
  c.scissorhands_history = o.scissorhands_history;
  return c;
}

// The README demo: the small model, the need-aligned 450-token tier, the tightest budget, MemDecay against
// recency, the faithful H2O and TOVA, and the oracle, on the 8 episodes of the committed file.
inline void apply_quick(options& o, const CLI::App& app) {
  if (app.count("--models") == 0) o.models = {"small"};
  if (app.count("--tiers") == 0 && o.episode_files.empty()) o.tiers = {450};
  if (app.count("--budgets") == 0) o.budgets = {0.25};
  if (app.count("--families") == 0 && o.episode_files.empty()) o.families = {"need-aligned"};
  if (app.count("--policies") == 0)
    o.policies = {"memdecay-none", "memdecay-lifetime", "memdecay-zscore", "streaming_llm-unpinned", "h2o", "tova",
                  "oracle"};
  if (app.count("--page-sizes") == 0) o.page_sizes = {16};
  if (app.count("--episodes") == 0) o.episodes = 8;
}

inline std::string pct(std::uint64_t k, std::uint64_t n) {
  if (n == 0) return "-";
  char b[32];
  std::snprintf(b, sizeof b, "%.1f%%", 100.0 * static_cast<double>(k) / static_cast<double>(n));
  return b;
}
inline std::string frac(std::uint64_t k, std::uint64_t n) {
  if (n == 0) return "-";
  return std::to_string(k) + "/" + std::to_string(n);
}
inline std::string budget_text(double b) {
  char s[32];
  std::snprintf(s, sizeof s, "%g%%", 100.0 * b);
  return s;
}

// One row of the results: a model x tier x (budget, config) cell, or the full cache.
struct row {
  std::string model;
  std::string tier;
  std::optional<double> budget;  // none: the full cache
  std::string policy;            // "full" for the full cache
  std::size_t page_size = 0;
  const ev::run_result* result = nullptr;
  std::size_t target = 0;                                      // index into the targets / results
  std::size_t cell = std::numeric_limits<std::size_t>::max();  // config * budgets + budget; max: the full cache
  std::optional<ev::stats::interval> ci;                       // 95% bootstrap interval of the recall
  std::optional<double> oracle_recall;                         // the oracle's recall on the same probes
};

// Per-episode counts of one row's cell (all probes, or the unpinned ones), for the bootstrap.
inline std::vector<ev::stats::counts> episode_counts(const ev::target_result& r, std::size_t cell,
                                              const md::region_table& table, bool unpinned) {
  std::vector<ev::stats::counts> out;
  for (const auto& e : r.episodes) {
    const ev::run_result& x = cell == std::numeric_limits<std::size_t>::max() ? e.full : e.cells[cell];
    const auto c = unpinned ? x.by_pinned(table, false) : x.total();
    out.push_back({c.recalled, c.probes});
  }
  return out;
}

inline std::string ci_text(const std::optional<ev::stats::interval>& ci) {
  if (!ci) return "-";
  char b[64];
  std::snprintf(b, sizeof b, "[%.1f, %.1f]", 100.0 * ci->lower, 100.0 * ci->upper);
  return b;
}

inline json counts_json(const ev::region_counts& c) {
  auto rate = [](std::uint64_t k, std::uint64_t n) {
    return n ? json(static_cast<double>(k) / static_cast<double>(n)) : json(nullptr);
  };
  return {{"probes", c.probes},
          {"recalled", c.recalled},
          {"recall", rate(c.recalled, c.probes)},
          {"survived", c.survived},
          {"survival", rate(c.survived, c.probes)},
          {"ceiling", c.ceiling},
          {"ceiling_recall", rate(c.ceiling, c.probes)}};
}

// Grouped bars (tools/common/svg_plot.hpp): a row of panels per model and metric (recall, unpinned recall), a panel
// per tier; groups are budgets, bars are configs (with their 95% bootstrap intervals on recall); a dashed line
// marks the full cache and a red dotted one the oracle.
inline void write_svg(const std::string& path, const std::vector<row>& rows, const std::vector<std::string>& models,
               const std::vector<std::string>& tiers, const std::vector<double>& budgets,
               const std::vector<std::string>& configs, const md::region_table& table) {
  namespace svg = memdecay_tools::svg;
  svg::chart chart;
  chart.title =
      "memdecay-eval: probe recall under online eviction (dashed: full cache; red dotted: the oracle; "
      "whiskers: 95% bootstrap intervals)";
  chart.series = configs;
  auto find = [&](const std::string& m, const std::string& t, std::optional<double> b,
                  const std::string& label) -> const row* {
    for (const auto& r : rows) {
      const std::string l = r.policy == "full" ? "full" : r.policy + "/p" + std::to_string(r.page_size);
      if (r.model == m && r.tier == t && r.budget == b && l == label) return &r;
    }
    return nullptr;
  };
  auto share = [](double v) { return pct(static_cast<std::uint64_t>(std::lround(v * 1e6)), 1000000); };
  for (std::size_t m = 0; m < models.size(); ++m)
    for (int metric = 0; metric < 2; ++metric) {
      auto& panels = chart.rows.emplace_back();
      auto value = [&](const ev::run_result& r) {
        const auto c = metric == 0 ? r.total() : r.by_pinned(table, false);
        return c.probes ? static_cast<double>(c.recalled) / static_cast<double>(c.probes) : 0.0;
      };
      for (const auto& tier : tiers) {
        svg::panel& p = panels.emplace_back();
        p.title = models[m] + ", " + tier + ": " + (metric == 0 ? "recall" : "unpinned recall");
        for (double budget : budgets) {
          p.groups.push_back("budget " + budget_text(budget));
          auto& bars = p.bars.emplace_back(configs.size());
          for (std::size_t c = 0; c < configs.size(); ++c) {
            const auto* r = find(models[m], tier, budget, configs[c]);
            if (!r) continue;
            const double v = value(*r->result);
            svg::bar b{v, configs[c] + ", budget " + budget_text(budget) + ": " + share(v), std::nullopt};
            if (metric == 0 && r->ci) b.interval = std::pair(r->ci->lower, r->ci->upper);
            bars[c] = std::move(b);
          }
          // The oracle's recall at this budget (largest page size).
          const row* oracle = nullptr;
          for (const auto& r : rows)
            if (r.policy == "oracle" && r.model == models[m] && r.tier == tier && r.budget == budget &&
                (!oracle || r.page_size > oracle->page_size))
              oracle = &r;
          if (oracle)
            p.group_markers.push_back(svg::marker{
                value(*oracle->result),
                "oracle (page " + std::to_string(oracle->page_size) + "): " + share(value(*oracle->result))});
          else
            p.group_markers.push_back(std::nullopt);
        }
        if (const auto* full = find(models[m], tier, std::nullopt, "full"))
          p.panel_marker = svg::marker{value(*full->result), "full cache: " + share(value(*full->result))};
      }
    }
  svg::write(path, chart);
}

inline void check_vocab(const ev::episode_file& f, const ev::vocab_layout& v, const std::string& model) {
  auto bad = [&](const std::string& field, long a, long b) {
    throw std::runtime_error("episode file '" + f.source + "' was generated for another vocabulary than model '" +
                             model + "' (" + field + ": " + std::to_string(a) + " in the file, " + std::to_string(b) +
                             " in the model)");
  };
  const auto& e = f.vocab;
  if (e.pad != v.pad) bad("pad", e.pad, v.pad);
  if (e.bos != v.bos) bad("bos", e.bos, v.bos);
  if (e.query != v.query) bad("query", e.query, v.query);
  if (e.key_first != v.key_first) bad("key_first", e.key_first, v.key_first);
  if (e.key_count != v.key_count) bad("key_count", e.key_count, v.key_count);
  if (e.value_first != v.value_first) bad("value_first", e.value_first, v.value_first);
  if (e.value_count != v.value_count) bad("value_count", e.value_count, v.value_count);
  if (e.filler_first != v.filler_first) bad("filler_first", e.filler_first, v.filler_first);
  if (e.filler_count != v.filler_count) bad("filler_count", e.filler_count, v.filler_count);
  for (const auto& [name, id] : e.region_markers) {
    auto it = v.region_markers.find(name);
    if (it == v.region_markers.end()) bad("region_markers." + name, id, -1);
    if (it->second != id) bad("region_markers." + name, id, it->second);
  }
}

/// The evaluation's options on `app` (memdecay-eval's; memdecay-llama adds its own).
inline void add_options(CLI::App& app, options& o) {
  app.add_flag("--quick", o.quick,
               "The README demo: small model, need-aligned 450-token tier, budget 25%, MemDecay (none, lifetime, "
               "zscore) against StreamingLLM (unpinned, as its source), H2O (half the budget recent, as its source), "
               "TOVA and the oracle, 8 episodes (options given explicitly still apply)");
  app.add_option("--data-dir", o.data_dir, "Where models/<name>/model.safetensors and episodes-<tier>.json are")
      ->capture_default_str()
      ->type_name("DIR");
  app.add_option("--models", o.models, "Models: names under --data-dir, or .safetensors paths")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--tiers", o.tiers, "Tiers: episodes-<tier>.json under --data-dir")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--families", o.families,
                 "Episode families under --data-dir: control (episodes-<tier>.json: probe times independent of the "
                 "region) and need-aligned (episodes-need-<tier>.json: each region's own future need)")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--episodes-file", o.episode_files, "Episode files instead of --tiers (docs/eval.md)")
      ->type_name("FILE")
      ->delimiter(',');
  app.add_option("--episodes", o.episodes, "Use the first N episodes of each tier (0: all)")->capture_default_str();
  app.add_option("--budgets,-b", o.budgets, "Budgets as fractions in (0, 1] of each episode's tokens")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option(
         "--policies,-p", o.policies,
         "Policies: all, memdecay (the four normalisations), baselines, or names (--list-policies); NAME-unpinned "
         "runs NAME with no region pinned")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--page-sizes", o.page_sizes, "Page sizes for MemDecay")->delimiter(',')->capture_default_str();
  app.add_option("--baseline-page-sizes", o.baseline_page_sizes, "Page sizes for the baselines")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--threads,-j", o.threads, "Episodes evaluated in parallel (results do not depend on it)")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{1}, std::size_t{256}));
  app.add_option("--json", o.json_path, "Write every number as JSON to PATH")->type_name("PATH");
  app.add_option("--markdown", o.markdown_path, "Also write the markdown tables to PATH")->type_name("PATH");
  app.add_option("--plot", o.plot_path, "Write an SVG chart of recall and unpinned recall to PATH (.svg)")
      ->type_name("PATH");
  app.add_option("--plot-policies", o.plot_policies, "Draw only these policies in --plot (default: all)")
      ->delimiter(',');
  app.add_option("--record-traces", o.traces_dir,
                 "Write the full-cache runs (segments, attention per layer, the inline re-reads as reference events, "
                 "probes) as trace files DIR/<model>-tier-<n>.mdtrace, for memdecay-calibrate and memdecay-replay")
      ->type_name("DIR");
  app.add_flag("--no-trace-attention", o.no_trace_attention,
               "Leave the attention rows out of --record-traces (what an engine that never sees attention logs: "
               "enough for memdecay-calibrate --method references, a fraction of the bytes)");
  app.add_option("--trace-episodes", o.trace_episodes, "Episodes per model and tier to record with --record-traces")
      ->capture_default_str();
  app.add_option("--calibration", o.calibrations,
                 "A calibration file (memdecay-calibrate): its fitted decay rates and base priorities replace the "
                 "region defaults in every policy; PATH for every model or NAME=PATH for one (repeatable)")
      ->type_name("[MODEL=]PATH");
  app.add_option("--recent-tokens", o.recent_tokens, "Pages holding the last N resident tokens are never evicted")
      ->capture_default_str();
  app.add_option("--sink-pages", o.sink_pages, "The first N pages are never evicted")->capture_default_str();
  app.add_option("--prefill-chunk", o.prefill_chunk, "Tokens per step in prefilled segments")->capture_default_str();
  app.add_flag("--pin-plan", o.pin_plan, "Pin the plan region as well as the system prompt");
  app.add_option("--alpha", o.alpha, "MemDecay: weight of the attention EWMA (default 1; 0.5 for zscore)");
  app.add_option("--tau", o.tau, "MemDecay: refresh threshold (default 0.01 for none; 2 otherwise)");
  app.add_option("--ewma-beta", o.ewma_beta, "MemDecay: EWMA factor per observation (default 0.9)");
  app.add_option("--h2o-recent-fraction", o.h2o_recent_fraction,
                 "H2O: the recent window's share of the budget (default 0.5, the source's heavy_ratio = recent_ratio)");
  app.add_option("--host-min-stay", o.host.min_device_steps,
                 "+host variants: steps a recalled page stays before it may be demoted again")
      ->capture_default_str();
  app.add_option("--host-hysteresis", o.host.hysteresis,
                 "+host variants: logits a host page's bound must beat a device page's by to swap")
      ->capture_default_str();
  app.add_option("--host-min-priority", o.host.min_host_priority,
                 "+host variants: a victim goes to host only if a token's region has a base priority >= this")
      ->capture_default_str();
  app.add_option("--snapkv-window", o.snapkv_window,
                 "SnapKV: observations that vote (default 64, the source's window_size)");
  app.add_option(
      "--scissorhands-history", o.scissorhands_history,
      "Scissorhands: observations remembered (default 64; the source's 400 is above this implementation's 64)");
  app.add_flag("--no-fork", o.no_fork,
               "Run every policy from the first token instead of from the full cache's state at its first eviction "
               "(same results, about twice the time)");
  app.add_flag("--list-policies", o.list_policies, "List the policies and exit");
  app.add_flag("--progress", o.progress, "Show the progress bar even when stderr is not a terminal");
  app.add_flag("--no-progress", o.no_progress, "Never show the progress bar");
}

/// --list-policies.
inline void list_policies(const options& o) {
  auto kinds = ev::all_policy_kinds(catalogue(o));
  kinds.push_back(ev::oracle_kind());
  kinds.push_back(ev::belady_kind());
  kinds.push_back(ev::arkvale_kind(kinds));
  for (const auto& k : kinds) std::printf("%-20s %s\n", k.name.c_str(), k.description.c_str());
}

template <class Engine>
int run(options& o, Engine& engine) {
  using Session = typename Engine::session_type;
  const auto t0 = std::chrono::steady_clock::now();
  for (double b : o.budgets)
    if (!(b > 0.0 && b <= 1.0)) throw std::runtime_error("budget " + md::detail::to_text(b) + " is outside (0, 1]");
  if (!o.plot_path.empty() && std::filesystem::path(o.plot_path).extension() != ".svg")
    throw std::runtime_error("--plot '" + o.plot_path + "': only SVG output is supported (give a path ending in .svg)");
  for (auto p : o.page_sizes)
    if (p == 0 || (p & (p - 1)) != 0)
      throw std::runtime_error("page size " + std::to_string(p) + " is not a power of two");
  for (auto p : o.baseline_page_sizes)
    if (p == 0 || (p & (p - 1)) != 0)
      throw std::runtime_error("page size " + std::to_string(p) + " is not a power of two");

  ev::eval_settings settings;
  settings.budgets = o.budgets;
  settings.prefill_chunk = o.prefill_chunk;
  settings.protection = {.sink_pages = o.sink_pages, .recent_tokens = o.recent_tokens};
  settings.fork = !o.no_fork;
  settings.trace_attention = !o.no_trace_attention;
  if (o.pin_plan) settings.region_overrides.push_back({.region = "plan", .pinned = true});
  if (o.prefill_chunk == 0) throw std::runtime_error("--prefill-chunk must be at least 1");
  if constexpr (requires { engine.configure(settings); }) engine.configure(settings);

  // Policies x page sizes.
  auto kinds = ev::all_policy_kinds(catalogue(o), settings.protection);
  kinds.push_back(ev::oracle_kind());
  kinds.push_back(ev::belady_kind());
  kinds.push_back(ev::arkvale_kind(kinds));
  if constexpr (requires { engine.add_kinds(kinds); }) engine.add_kinds(kinds);  // the engine's own baselines
  // A policy by name: a catalogue entry, memdecay-<mode>+<ablation or signal>, NAME-unpinned, NAME+host<percent>.
  std::function<std::optional<ev::policy_kind>(const std::string&)> named =
      [&](const std::string& name) -> std::optional<ev::policy_kind> {
    for (const auto& k : kinds)
      if (name == k.name) return k;
    if (name.rfind("arkvale-", 0) == 0) {  // arkvale[-hyst<logits>][-lowest<pages>][-qch<r>][-mean|-att|-exact]: departures
      std::string rest = name.substr(7);
      ev::policy_kind exact_rule;
      const auto rule = ev::take_recall_suffixes(rest, exact_rule, name);
      if (!rest.empty()) return std::nullopt;
      const bool exact = rule.exact;
      const auto over_heads = rule.over_heads;
      const double hysteresis = rule.hysteresis.value_or(0.0);
      const std::size_t displaceable = rule.displace_lowest.value_or(0), query_channels = rule.query_channels.value_or(0);
      auto k = ev::arkvale_kind(kinds, hysteresis, displaceable, over_heads, exact ? &exact_rule : nullptr,
                                query_channels);
      if (k.name != name) return std::nullopt;  // "arkvale-hyst0" or a spelling to_text does not give back
      return k;
    }
    if (const auto plus = name.rfind('+'); plus != std::string::npos && ev::is_host_suffix(name.substr(plus + 1))) {
      if (auto base = named(name.substr(0, plus))) return ev::host_variant(*base, name.substr(plus + 1), o.host);
      return std::nullopt;
    }
    if (name.rfind("memdecay-", 0) == 0 && name.find('+') != std::string::npos) {
      const std::string mode_name = name.substr(9, name.find('+') - 9), variant = name.substr(name.find('+') + 1);
      for (auto mode : {md::attention_normalization::none, md::attention_normalization::uniform,
                        md::attention_normalization::lifetime, md::attention_normalization::zscore})
        if (mode_name == md::to_string(mode) && ev::is_memdecay_variant(variant))
          return ev::memdecay_ablation(mode, variant, catalogue(o));
    }
    if (name.ends_with("-unpinned"))
      for (const auto& k : kinds)
        if (name == k.name + "-unpinned") return ev::unpinned_variant(k);
    return std::nullopt;
  };
  std::vector<ev::policy_kind> chosen;
  auto choose = [&](const ev::policy_kind& k) {
    if (std::none_of(chosen.begin(), chosen.end(), [&](const auto& c) { return c.name == k.name; }))
      chosen.push_back(k);
  };
  for (const auto& name : o.policies) {
    bool found = false;
    for (const auto& k : kinds)
      if ((name == "all" && !k.host) ||
          (name == "baselines" && k.name.rfind("memdecay-", 0) != 0 && !k.oracle && !k.host) ||
          (name == "memdecay" && k.name.rfind("memdecay-", 0) == 0)) {
        found = true;
        choose(k);
      }
    if (!found)
      if (auto k = named(name)) {
        found = true;
        choose(*k);
      }
    if (!found) {
      std::string names;
      for (const auto& k : kinds) names += " " + k.name;
      throw std::runtime_error(
          "unknown policy '" + name + "' (known: all memdecay baselines" + names +
          ", any of them with -unpinned, memdecay-<mode>+<ablation> with ablation prior-only, attention-only, "
          "no-refresh, recent-half, page-max or page-mass, memdecay-<mode>+query or +query-tokens (the attention-free "
          "signal), any policy with digests +host<percent> or +host-all (a host tier))");
    }
  }
  std::vector<ev::config_spec> configs;
  std::vector<std::size_t> every_page_size = o.page_sizes;  // the oracle runs at every page size in use
  for (auto p : o.baseline_page_sizes)
    if (std::find(every_page_size.begin(), every_page_size.end(), p) == every_page_size.end())
      every_page_size.push_back(p);
  for (const auto& k : chosen) {
    const bool is_memdecay = k.name.rfind("memdecay-", 0) == 0;
    for (auto p : k.oracle ? every_page_size : is_memdecay ? o.page_sizes : o.baseline_page_sizes)
      configs.push_back({k, p});
  }
  // Table order: MemDecay at each page size, then the baselines at each page size, then the oracle.
  std::stable_sort(configs.begin(), configs.end(), [](const ev::config_spec& a, const ev::config_spec& b) {
    const bool am = a.kind.name.rfind("memdecay-", 0) == 0, bm = b.kind.name.rfind("memdecay-", 0) == 0;
    if (am != bm) return am;
    if (a.kind.is_ceiling() != b.kind.is_ceiling()) return b.kind.is_ceiling();
    return a.page_size > b.page_size;
  });
  if (!configs.empty()) settings.ceiling_page_size = configs.front().page_size;
  if (std::any_of(configs.begin(), configs.end(), [](const auto& c) { return c.page_size == 16; }))
    settings.ceiling_page_size = 16;

  // Episode files (one per tier).
  std::vector<ev::episode_file> files;
  if (!o.episode_files.empty()) {
    for (const auto& p : o.episode_files) files.push_back(ev::read_episodes(p));
  } else {
    for (const auto& family : o.families)
      for (int t : o.tiers) {
        if (family != "control" && family != "need-aligned")
          throw std::runtime_error("unknown episode family '" + family + "' (known: control, need-aligned)");
        const std::string stem = family == "control" ? "episodes-" : "episodes-need-";
        files.push_back(ev::read_episodes(std::filesystem::path(o.data_dir) / (stem + std::to_string(t) + ".json")));
      }
  }
  for (const auto& f : files)
    for (double b : o.budgets)
      for (const auto& ep : f.episodes)
        if (ev::budget_of(b, ep.tokens.size()) == 0)
          throw std::runtime_error("budget " + md::detail::to_text(b) + " of a " + std::to_string(ep.tokens.size()) +
                                   "-token episode of '" + f.source + "' is 0 tokens");

  // Models.
  std::vector<typename Engine::model_type> models;
  std::vector<std::string> model_paths;
  for (const auto& m : o.models) {
    const auto path = engine.model_path(m, o.data_dir);
    model_paths.push_back(path.string());
    models.push_back(engine.load(path));
  }
  // Calibrations: PATH for every model, or NAME=PATH for one.
  std::map<std::string, std::vector<md::region_override>> calibration_overrides;
  std::vector<std::string> calibration_text;
  for (const auto& c : o.calibrations) {
    const auto eq = c.find('=');
    const std::string who = eq == std::string::npos ? "" : c.substr(0, eq);
    const std::string path = eq == std::string::npos ? c : c.substr(eq + 1);
    const auto cal = md::calibration::read_file(path);
    if (!who.empty() && std::none_of(models.begin(), models.end(), [&](const auto& m) { return m.name() == who; }))
      throw std::runtime_error("--calibration " + c + ": no model named '" + who + "' is evaluated");
    for (const auto& m : models)
      if (who.empty() || m.name() == who)
        for (auto& ov : cal.overrides()) calibration_overrides[m.name()].push_back(ov);
    calibration_text.push_back(c);
  }

  std::vector<ev::eval_target<Session>> targets;
  for (std::size_t m = 0; m < models.size(); ++m)
    for (const auto& f : files) {
      check_vocab(f, models[m].vocab(), models[m].name());
      for (const auto& ep : f.episodes)
        if (ep.tokens.size() + 2 > engine.max_positions(models[m]))
          throw std::runtime_error("episode of " + std::to_string(ep.tokens.size()) + " tokens in '" + f.source +
                                   "' is longer than model '" + models[m].name() + "' handles (max_positions " +
                                   std::to_string(engine.max_positions(models[m])) + ")");
      ev::eval_target<Session> t;
      t.model = models[m].name();
      t.file = &f;
      t.make = engine.factory(models[m]);
      t.max_episodes = o.episodes;
      t.trace_episodes = o.traces_dir.empty() ? 0 : o.trace_episodes;
      t.region_overrides = calibration_overrides[models[m].name()];
      targets.push_back(std::move(t));
    }
  if (!o.traces_dir.empty()) std::filesystem::create_directories(o.traces_dir);

  const bool show = !o.no_progress && (o.progress || isatty(STDERR_FILENO));
  std::vector<ev::target_result> results;
  {
    memdecay_tools::progress_bar bar("episode runs", show);
    results = ev::evaluate<Session>(targets, configs, settings, o.threads,
                                           [&](std::size_t done, std::size_t total) { bar.update(done, total); });
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // Traces.
  std::vector<std::string> trace_paths;
  if (!o.traces_dir.empty())
    for (std::size_t t = 0; t < targets.size(); ++t) {
      if (results[t].trace.empty()) continue;
      const auto& model = models[t / files.size()];
      const auto path =
          std::filesystem::path(o.traces_dir) / (model.name() + "-" + targets[t].file->label() + ".mdtrace");
      md::trace::write_file(
          path, ev::make_trace_file(targets[t].file->label(), static_cast<std::uint32_t>(engine.layers(model)),
                                    std::move(results[t].trace)));
      trace_paths.push_back(path.string());
    }

  // Rows.
  const md::region_table table = md::default_region_table().with_overrides(settings.region_overrides);
  std::vector<row> rows;
  std::vector<std::string> model_names, tier_names, config_labels;
  for (const auto& m : models) model_names.push_back(m.name());
  for (const auto& f : files) tier_names.push_back(f.label());
  for (const auto& c : configs) config_labels.push_back(c.label());
  std::size_t distinct = 0, answered = 0, episodes = 0;
  for (std::size_t t = 0; t < targets.size(); ++t) {
    const auto& model = targets[t].model;
    const auto tier = targets[t].file->label();
    rows.push_back({model, tier, std::nullopt, "full", settings.ceiling_page_size, &results[t].full, t,
                    std::numeric_limits<std::size_t>::max(), std::nullopt, std::nullopt});
    distinct += results[t].full.total().probes;
    episodes += results[t].full.episodes;
    for (std::size_t b = 0; b < o.budgets.size(); ++b)
      for (std::size_t c = 0; c < configs.size(); ++c) {
        const auto& cell = results[t].cells[c * o.budgets.size() + b];
        rows.push_back({model, tier, o.budgets[b], configs[c].kind.name, configs[c].page_size, &cell, t,
                        c * o.budgets.size() + b, std::nullopt, std::nullopt});
        answered += cell.total().probes;
      }
    answered += results[t].full.total().probes;
  }
  // Intervals, and each row's recall as a share of the oracle's at the same model, tier, budget and page size.
  for (auto& r : rows) {
    if (r.budget) r.ci = ev::stats::bootstrap({episode_counts(results[r.target], r.cell, table, false)});
    for (const auto& q : rows)
      if (q.policy == "oracle" && q.model == r.model && q.tier == r.tier && q.budget == r.budget &&
          q.page_size == r.page_size && q.result->total().probes > 0)
        r.oracle_recall =
            static_cast<double>(q.result->total().recalled) / static_cast<double>(q.result->total().probes);
  }
  auto of_oracle = [](const row& r, std::uint64_t recalled, std::uint64_t probes) -> std::string {
    if (!r.oracle_recall || probes == 0 || *r.oracle_recall <= 0) return "-";
    char b[32];
    std::snprintf(b, sizeof b, "%.1f%%",
                  100.0 * static_cast<double>(recalled) / static_cast<double>(probes) / *r.oracle_recall);
    return b;
  };
  // Pooled over the tiers of one model: strata = tiers.
  auto pooled_strata = [&](const std::string& model, std::size_t cell, bool unpinned) {
    ev::stats::strata st;
    for (std::size_t t = 0; t < targets.size(); ++t)
      if (targets[t].model == model) st.push_back(episode_counts(results[t], cell, table, unpinned));
    return st;
  };

  // Markdown.
  std::ostringstream md_out;
  char head[512];
  const std::size_t per_model_probes = models.empty() ? 0 : distinct / models.size();
  const std::size_t per_model_episodes = models.empty() ? 0 : episodes / models.size();
  std::snprintf(head, sizeof head,
                "%s %s: %zu model%s x %zu tier%s (%zu episodes, %zu probes per model) x (%zu configs x %zu "
                "budget%s + the full cache) = %zu probe answers; %.1f s on %zu thread%s\n",
                engine.tool, md::version_string, models.size(), models.size() == 1 ? "" : "s", files.size(),
                files.size() == 1 ? "" : "s", per_model_episodes, per_model_probes, configs.size(), o.budgets.size(),
                o.budgets.size() == 1 ? "" : "s", answered, seconds, o.threads, o.threads == 1 ? "" : "s");
  md_out << head;
  md_out << "Protocol: prefilled segments in chunks of " << o.prefill_chunk
         << " tokens, generated ones a token per step; online eviction (every policy run re-runs the model); probes "
            "forked (greedy, 1 token), recall = the answer token; last "
         << o.recent_tokens << " tokens protected" << (o.pin_plan ? ", plan pinned" : "")
         << "; budget = floor(fraction x "
         << "episode tokens).\n";
  for (std::size_t i = 0; i < files.size(); ++i)
    md_out << "Episodes: " << files[i].source << " (" << files[i].label() << ", seed " << files[i].seed << ", "
           << (targets.empty() ? 0 : targets[i].episodes()) << " of " << files[i].episodes.size() << " episodes)\n";
  for (const auto& c : calibration_text) md_out << "Calibration: " << c << "\n";
  md_out << "\n| model | tier | budget | policy | page | probes | recall | 95% CI | of full | of oracle | survival | "
            "pinned | "
            "unpinned | over-budget steps |\n|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const auto& r : rows) {
    const auto tot = r.result->total();
    const auto pin = r.result->by_pinned(table, true), unpin = r.result->by_pinned(table, false);
    md_out << "| " << r.model << " | " << r.tier << " | " << (r.budget ? budget_text(*r.budget) : "100%") << " | "
           << (r.policy == "full" ? "**full cache**" : r.policy) << " | " << r.page_size << " | " << tot.probes << " | "
           << pct(tot.recalled, tot.probes) << " | " << ci_text(r.ci) << " | " << pct(tot.recalled, tot.ceiling)
           << " | " << of_oracle(r, tot.recalled, tot.probes) << " | " << pct(tot.survived, tot.probes) << " | "
           << frac(pin.recalled, pin.probes) << " | " << pct(unpin.recalled, unpin.probes) << " | "
           << r.result->over_budget_steps << " |\n";
  }
  std::uint64_t unproven = 0;
  for (const auto& r : rows)
    if (r.policy == "oracle" && r.result) unproven += r.result->oracle_unproven;
  if (unproven > 0)
    md_out << "\nThe oracle's plan was not proven optimal in " << unproven << " episode run" << (unproven == 1 ? "" : "s")
           << " (its solver's search limit): the oracle rows holding them are lower bounds of the ceiling.\n";
  bool any_signal = false;
  for (const auto& r : rows) any_signal = any_signal || (r.result && r.result->signal_steps > 0);
  if (any_signal) {
    md_out << "\nAttention-free signal against the measured attention: mean total variation distance between the "
              "estimated and the measured per-page attention (0 equal, 1 disjoint), over the steps it observed\n\n"
              "| model | tier | budget | policy | page | steps | distance |\n|---|---|---:|---|---:|---:|---:|\n";
    for (const auto& r : rows)
      if (r.result && r.result->signal_steps > 0)
        md_out << "| " << r.model << " | " << r.tier << " | " << (r.budget ? budget_text(*r.budget) : "100%") << " | "
               << r.policy << " | " << r.page_size << " | " << r.result->signal_steps << " | "
               << r.result->signal_tv_sum / static_cast<double>(r.result->signal_steps) << " |\n";
  }
  auto has_host = [&](const std::string& policy) {
    return std::any_of(configs.begin(), configs.end(), [&](const auto& c) { return c.kind.name == policy && c.kind.host; });
  };
  if (std::any_of(rows.begin(), rows.end(), [&](const row& r) { return has_host(r.policy); })) {
    md_out << "\nHost tier (docs/tiers.md): recall as a share of the full cache's, and what the tier moved: pages "
              "promoted / demoted to host / dropped from host per step, and the K/V bytes the host pool copied per "
              "episode token (fp32 blocks, both directions)\n\n"
              "| model | tier | budget | policy | page | recall | of full | promoted/step | demoted/step | "
              "host-dropped/step | bytes moved/token |\n|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|\n";
    for (const auto& r : rows)
      if (has_host(r.policy)) {
        const auto& x = *r.result;
        const auto tot = x.total();
        const double steps = std::max<double>(1.0, static_cast<double>(x.steps));
        char moved[64];
        std::snprintf(moved, sizeof moved, "%.3f | %.3f | %.3f | %.0f", x.promoted_pages / steps,
                      x.demoted_pages / steps, x.host_dropped_pages / steps,
                      static_cast<double>(x.moved_bytes) / std::max<double>(1.0, static_cast<double>(x.tokens)));
        md_out << "| " << r.model << " | " << r.tier << " | " << (r.budget ? budget_text(*r.budget) : "100%") << " | "
               << r.policy << " | " << r.page_size << " | " << pct(tot.recalled, tot.probes) << " | "
               << pct(tot.recalled, tot.ceiling) << " | " << moved << " |\n";
      }
  }
  md_out << "\nRecall per region of the fact\n\n| model | tier | budget | policy | page |";
  for (const auto& p : table.params()) md_out << " " << p.name << (p.pinned ? " (pinned)" : "") << " |";
  md_out << "\n|---|---|---:|---|---:|";
  for (std::size_t i = 0; i < table.size(); ++i) md_out << "---:|";
  md_out << "\n";
  for (const auto& r : rows) {
    md_out << "| " << r.model << " | " << r.tier << " | " << (r.budget ? budget_text(*r.budget) : "100%") << " | "
           << (r.policy == "full" ? "**full cache**" : r.policy) << " | " << r.page_size << " |";
    for (std::size_t i = 0; i < table.size(); ++i) {
      const auto& g = r.result->regions[i];
      md_out << " " << pct(g.recalled, g.probes) << " |";
    }
    md_out << "\n";
  }
  // Pooled over tiers: recall (unpinned recall) per model, config and budget.
  md_out << "\nTiers pooled: recall [95% CI] (unpinned recall); of the oracle's recall\n\n| model | policy | page |";
  for (double b : o.budgets) md_out << " " << budget_text(b) << " |";
  md_out << "\n|---|---|---:|";
  for (std::size_t i = 0; i < o.budgets.size(); ++i) md_out << "---:|";
  md_out << "\n";
  for (const auto& m : model_names) {
    ev::run_result full;
    for (const auto& r : rows)
      if (r.model == m && r.policy == "full") full.merge(*r.result);
    md_out << "| " << m << " | **full cache** | " << settings.ceiling_page_size << " |";
    for (std::size_t i = 0; i < o.budgets.size(); ++i)
      md_out << " " << pct(full.total().recalled, full.total().probes) << " ("
             << pct(full.by_pinned(table, false).recalled, full.by_pinned(table, false).probes) << ") |";
    md_out << "\n";
    for (std::size_t ci = 0; ci < configs.size(); ++ci) {
      const auto& c = configs[ci];
      md_out << "| " << m << " | " << c.kind.name << " | " << c.page_size << " |";
      for (std::size_t bi = 0; bi < o.budgets.size(); ++bi) {
        const double b = o.budgets[bi];
        ev::run_result pooled, oracle;
        for (const auto& r : rows)
          if (r.model == m && r.budget == b && r.page_size == c.page_size) {
            if (r.policy == c.kind.name) pooled.merge(*r.result);
            if (r.policy == "oracle") oracle.merge(*r.result);
          }
        const auto tot = pooled.total(), un = pooled.by_pinned(table, false);
        const auto ci95 = ev::stats::bootstrap(pooled_strata(m, ci * o.budgets.size() + bi, false));
        md_out << " " << pct(tot.recalled, tot.probes) << " " << ci_text(ci95) << " (" << pct(un.recalled, un.probes)
               << ")";
        if (oracle.total().probes > 0 && oracle.total().recalled > 0)
          md_out << "; " << pct(tot.recalled * oracle.total().probes, oracle.total().recalled * tot.probes);
        md_out << " |";
      }
      md_out << "\n";
    }
  }
  // The question of the evaluation: MemDecay's best mode against the best baseline at each page size and budget,
  // tiers pooled, with the paired bootstrap interval of the difference (a tie when it contains 0).
  md_out
      << "\nMemDecay against the best baseline (tiers pooled; recall difference in points, paired 95% bootstrap "
         "interval over episodes)\n\n| model | page | budget | best MemDecay | best baseline | difference | 95% CI | "
         "verdict |\n|---|---:|---:|---|---|---:|---:|---|\n";
  for (const auto& m : model_names)
    for (std::size_t page : every_page_size)
      for (std::size_t bi = 0; bi < o.budgets.size(); ++bi) {
        auto best = [&](bool memdecay) {
          std::optional<std::size_t> pick;
          double value = -1;
          for (std::size_t ci = 0; ci < configs.size(); ++ci) {
            const auto& c = configs[ci];
            if (c.page_size != page || c.kind.is_ceiling() || (c.kind.name.rfind("memdecay-", 0) == 0) != memdecay) continue;
            const auto v =
                ev::stats::bootstrap(pooled_strata(m, ci * o.budgets.size() + bi, false), nullptr, {.resamples = 0});
            if (v.estimate > value) value = v.estimate, pick = ci;
          }
          return pick;
        };
        const auto md_best = best(true), base_best = best(false);
        if (!md_best || !base_best) continue;
        const auto a = pooled_strata(m, *base_best * o.budgets.size() + bi, false);
        const auto d = ev::stats::bootstrap(pooled_strata(m, *md_best * o.budgets.size() + bi, false), &a);
        char line[256];
        std::snprintf(line, sizeof line, "| %s | %zu | %s | %s | %s | %+.1f | [%+.1f, %+.1f] | %s |\n", m.c_str(), page,
                      budget_text(o.budgets[bi]).c_str(), configs[*md_best].kind.name.c_str(),
                      configs[*base_best].kind.name.c_str(), 100.0 * d.estimate, 100.0 * d.lower, 100.0 * d.upper,
                      d.contains_zero() ? "tie"
                      : d.estimate > 0  ? "MemDecay ahead"
                                        : "baseline ahead");
        md_out << line;
      }
  std::uint64_t violations = 0;
  for (const auto& r : rows) violations += r.result->budget_violations;
  if (violations > 0)
    md_out << "\nWARNING: " << violations << " steps ended above the budget without a pinned/protected reason\n";
  if (!trace_paths.empty()) {
    md_out << "\nTraces (full-cache attention):";
    for (const auto& p : trace_paths) md_out << " " << p;
    md_out << "\n";
  }
  if constexpr (requires { engine.report(md_out); }) engine.report(md_out);
  std::fputs(md_out.str().c_str(), stdout);
  if (!o.markdown_path.empty()) {
    std::ofstream out(o.markdown_path);
    if (!out) throw std::runtime_error("--markdown: cannot create '" + o.markdown_path + "'");
    out << md_out.str();
    if (!out) throw std::runtime_error("--markdown: cannot write '" + o.markdown_path + "'");
  }

  if (!o.json_path.empty()) {
    json j{{"tool", engine.tool}, {"version", md::version_string}, {"seconds", seconds},
           {"threads", o.threads},    {"probe_answers", answered},     {"probes", distinct},
           {"episode_runs", episodes}};
    j["settings"] = {{"budgets", o.budgets},
                     {"budget_unit", "fraction of each episode's tokens (floor)"},
                     {"prefill_chunk", o.prefill_chunk},
                     {"recent_tokens", o.recent_tokens},
                     {"sink_pages", o.sink_pages},
                     {"pin_plan", o.pin_plan},
                     {"fork", settings.fork},
                     {"ceiling_page_size", settings.ceiling_page_size},
                     {"calibrations", calibration_text},
                     {"max_new", settings.max_new}};
    json jm = json::array();
    for (std::size_t m = 0; m < models.size(); ++m) {
      json d = engine.describe(models[m]);
      d["name"] = models[m].name();
      d["path"] = model_paths[m];
      jm.push_back(std::move(d));
    }
    j["models"] = std::move(jm);
    json jt = json::array();
    for (std::size_t i = 0; i < files.size(); ++i)
      jt.push_back({{"label", files[i].label()},
                    {"path", files[i].source},
                    {"seed", files[i].seed},
                    {"episodes", targets.empty() ? 0 : targets[i].episodes()},
                    {"episodes_in_file", files[i].episodes.size()}});
    j["tiers"] = std::move(jt);
    json jp = json::array();
    for (const auto& k : chosen) jp.push_back({{"name", k.name}, {"description", k.description}});
    j["policies"] = std::move(jp);
    json jr = json::array();
    for (const auto& r : rows) {
      const auto& x = *r.result;
      json cell{{"model", r.model},
                {"tier", r.tier},
                {"budget", r.budget ? json(*r.budget) : json(nullptr)},
                {"policy", r.policy},
                {"page_size", r.page_size}};
      cell["all"] = counts_json(x.total());
      cell["pinned"] = counts_json(x.by_pinned(table, true));
      cell["unpinned"] = counts_json(x.by_pinned(table, false));
      json regions = json::object();
      for (std::size_t i = 0; i < table.size(); ++i)
        regions[table[static_cast<md::region_id>(i)].name] = counts_json(x.regions[i]);
      cell["regions"] = std::move(regions);
      cell["episodes"] = x.episodes;
      cell["tokens"] = x.tokens;
      cell["steps"] = x.steps;
      cell["budget_tokens"] = x.budget_tokens;
      cell["evicted_pages"] = x.evicted_pages;
      cell["evicted_tokens"] = x.evicted_tokens;
      cell["over_budget_steps"] = x.over_budget_steps;
      cell["budget_violations"] = x.budget_violations;
      cell["forked_steps"] = x.forked_steps;
      cell["max_resident"] = x.max_resident;
      if (r.policy == "oracle") cell["oracle_unproven_runs"] = x.oracle_unproven;
      if (has_host(r.policy)) {  // what the host tier moved
        cell["promoted_pages"] = x.promoted_pages;
        cell["demoted_pages"] = x.demoted_pages;
        cell["host_dropped_pages"] = x.host_dropped_pages;
        cell["recalls"] = x.recalls;
        cell["moved_bytes"] = x.moved_bytes;
      }
      if (x.signal_steps > 0) {  // the attention-free signal against the measured attention
        cell["signal_steps"] = x.signal_steps;
        cell["signal_tv_mean"] = x.signal_tv_sum / static_cast<double>(x.signal_steps);
      }
      cell["recall_ci95"] = r.ci ? json::array({r.ci->lower, r.ci->upper}) : json(nullptr);
      cell["oracle_recall"] = r.oracle_recall ? json(*r.oracle_recall) : json(nullptr);
      json per = json::array();  // per episode: probes, recalled, survived (the bootstrap's input)
      for (const auto& e : results[r.target].episodes) {
        const ev::run_result& y = r.cell == std::numeric_limits<std::size_t>::max() ? e.full : e.cells[r.cell];
        const auto t = y.total(), u = y.by_pinned(table, false);
        per.push_back(json::array({t.probes, t.recalled, t.survived, u.probes, u.recalled}));
      }
      cell["per_episode"] = std::move(per);
      jr.push_back(std::move(cell));
    }
    j["results"] = std::move(jr);
    j["traces"] = trace_paths;
    if constexpr (requires { engine.report_json(j); }) engine.report_json(j);
    std::ofstream out(o.json_path);
    if (!out) throw std::runtime_error("--json: cannot create '" + o.json_path + "'");
    out << j.dump(2) << '\n';
    if (!out) throw std::runtime_error("--json: cannot write '" + o.json_path + "'");
  }
  if (!o.plot_path.empty()) {
    std::vector<std::string> drawn;  // --plot-policies: only these policies (every page size), in table order
    for (const auto& c : configs)
      if (o.plot_policies.empty() ||
          std::find(o.plot_policies.begin(), o.plot_policies.end(), c.kind.name) != o.plot_policies.end())
        drawn.push_back(c.label());
    write_svg(o.plot_path, rows, model_names, tier_names, o.budgets, drawn, table);
  }
  return violations > 0 ? 3 : 0;
}

}  // namespace memdecay_eval::cli

#endif  // MEMDECAY_TOOLS_EVAL_EVAL_CLI_HPP
