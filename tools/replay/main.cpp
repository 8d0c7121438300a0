// SPDX-License-Identifier: Apache-2.0
// memdecay-replay: replays agent traces through eviction policies under budgets and scores the eviction-probe
// protocol (probe survival, attention loss, evictions) per policy x budget x tier x region. docs/replay.md.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <memdecay/calibration/file.hpp>
#include <memdecay/io/trace.hpp>
#include <memdecay/io/trace_generator.hpp>
#include <memdecay/version.hpp>

#include "../common/progress_bar.hpp"
#include "../common/svg_plot.hpp"
#include "replay.hpp"

namespace md = memdecay;
namespace tr = memdecay::trace;
namespace rp = memdecay::replay;
using json = nlohmann::ordered_json;

namespace {

struct options {
  std::vector<std::string> traces;
  bool generate = false;
  std::uint64_t seed = 1;
  std::size_t probes_per_tier = 2160;
  std::uint32_t layers = 1;
  std::string write_traces;
  std::vector<std::string> policies{"all"};
  std::vector<double> budgets{0.25, 0.5, 0.75};
  std::size_t page_size = 16;
  std::size_t recent_tokens = 16;
  std::size_t sink_pages = 0;
  bool pin_plan = false;
  std::optional<double> alpha, tau, ewma_beta;
  std::string json_path, plot_path, log_path;
  std::string calibration_path;
  bool progress = false, no_progress = false, list_policies = false;
};

// Every policy the tool knows, in the order tables list them.
std::vector<rp::policy_entry> known_policies(const options& o) {
  return rp::all_policies(rp::memdecay_options::memdecay(o.alpha, o.tau, o.ewma_beta),
                          {.sink_pages = o.sink_pages, .recent_tokens = o.recent_tokens});
}

std::vector<rp::policy_entry> chosen_policies(const options& o) {
  const auto known = known_policies(o);
  std::vector<rp::policy_entry> out;
  for (const auto& name : o.policies) {
    if (name == "all") {
      for (const auto& p : known)
        if (std::none_of(out.begin(), out.end(), [&](const auto& q) { return q.name == p.name; })) out.push_back(p);
      continue;
    }
    auto it = std::find_if(known.begin(), known.end(), [&](const auto& p) { return p.name == name; });
    if (it == known.end()) {
      std::string names;
      for (const auto& p : known) names += " " + p.name;
      throw md::input_error("unknown policy '" + name + "' (known: all" + names + ")");
    }
    if (std::none_of(out.begin(), out.end(), [&](const auto& q) { return q.name == name; })) out.push_back(*it);
  }
  return out;
}

std::string percent(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f%%", 100.0 * v);
  return b;
}
std::string budget_text(double b) {
  char s[32];
  std::snprintf(s, sizeof s, "%g%%", 100.0 * b);
  return s;
}

void print_tables(const std::vector<rp::cell_result>& cells, const std::vector<std::string>& region_names) {
  std::printf("| policy | budget | tier | probes | survival | attention loss | pages evicted |");
  for (const auto& r : region_names) std::printf(" %s |", r.c_str());
  std::printf("\n|---|---|---|---:|---:|---:|---:|");
  for (std::size_t r = 0; r < region_names.size(); ++r) std::printf("---:|");
  std::printf("\n");
  for (const auto& c : cells) {
    std::printf("| %s | %s | %s | %zu | %s | %s | %llu |", c.policy.c_str(), budget_text(c.budget).c_str(),
                c.tier.c_str(), c.probes, percent(c.survival()).c_str(), percent(c.attention_loss()).c_str(),
                static_cast<unsigned long long>(c.evicted_pages));
    for (std::size_t r = 0; r < region_names.size(); ++r) {
      const auto& g = c.regions[r];
      std::printf(" %s |", g.probes ? percent(static_cast<double>(g.survived) / g.probes).c_str() : "-");
    }
    std::printf("\n");
  }
  // Where the lost attention and the evicted tokens were, per region.
  std::printf("\nAttention loss per region (evicted tokens)\n\n| policy | budget | tier |");
  for (const auto& r : region_names) std::printf(" %s |", r.c_str());
  std::printf("\n|---|---|---|");
  for (std::size_t r = 0; r < region_names.size(); ++r) std::printf("---:|");
  std::printf("\n");
  for (const auto& c : cells) {
    std::printf("| %s | %s | %s |", c.policy.c_str(), budget_text(c.budget).c_str(), c.tier.c_str());
    for (std::size_t r = 0; r < region_names.size(); ++r) {
      const auto& g = c.regions[r];
      std::printf(" %s (%llu) |", percent(c.total_mass > 0 ? g.lost_mass / c.total_mass : 0.0).c_str(),
                  static_cast<unsigned long long>(g.evicted_tokens));
    }
    std::printf("\n");
  }
  // Both tiers pooled: the comparison at a glance.
  std::map<std::pair<std::string, double>, rp::cell_result> pooled;
  std::vector<std::pair<std::string, double>> order;
  for (const auto& c : cells) {
    const auto key = std::make_pair(c.policy, c.budget);
    if (!pooled.count(key)) order.push_back(key);
    auto& p = pooled[key];
    p.policy = c.policy;
    p.budget = c.budget;
    p.probes += c.probes;
    p.survived += c.survived;
    p.total_mass += c.total_mass;
    p.lost_mass += c.lost_mass;
  }
  std::printf("\nAll tiers pooled: probe survival (attention loss)\n\n| policy |");
  std::vector<double> budgets;
  for (const auto& k : order)
    if (std::find(budgets.begin(), budgets.end(), k.second) == budgets.end()) budgets.push_back(k.second);
  for (double b : budgets) std::printf(" %s |", budget_text(b).c_str());
  std::printf("\n|---|");
  for (std::size_t i = 0; i < budgets.size(); ++i) std::printf("---:|");
  std::printf("\n");
  std::vector<std::string> policies;
  for (const auto& k : order)
    if (std::find(policies.begin(), policies.end(), k.first) == policies.end()) policies.push_back(k.first);
  for (const auto& p : policies) {
    std::printf("| %s |", p.c_str());
    for (double b : budgets) {
      const auto it = pooled.find({p, b});
      if (it == pooled.end()) {
        std::printf(" - |");
        continue;
      }
      std::printf(" %s (%s) |", percent(it->second.survival()).c_str(), percent(it->second.attention_loss()).c_str());
    }
    std::printf("\n");
  }
}

json to_json(const rp::cell_result& c, const std::vector<std::string>& region_names) {
  json j{{"policy", c.policy},
         {"budget", c.budget},
         {"tier", c.tier},
         {"episodes", c.episodes},
         {"probes", c.probes},
         {"survived", c.survived},
         {"survival", c.survival()},
         {"attention_mass", c.total_mass},
         {"attention_lost", c.lost_mass},
         {"attention_loss", c.attention_loss()},
         {"evicted_pages", c.evicted_pages},
         {"evicted_tokens", c.evicted_tokens},
         {"over_budget_evictions", c.over_budget}};
  json regions = json::object();
  for (std::size_t r = 0; r < region_names.size(); ++r) {
    const auto& g = c.regions[r];
    regions[region_names[r]] = {
        {"probes", g.probes},
        {"survived", g.survived},
        {"survival", g.probes ? json(static_cast<double>(g.survived) / g.probes) : json(nullptr)},
        {"attention_lost", g.lost_mass},
        {"attention_loss", c.total_mass > 0 ? g.lost_mass / c.total_mass : 0.0},
        {"evicted_tokens", g.evicted_tokens}};
  }
  j["regions"] = std::move(regions);
  return j;
}

// Grouped bars (tools/common/svg_plot.hpp): one panel per tier; top row probe survival, bottom row attention loss;
// groups = budgets, bars = policies.
void write_svg(const std::string& path, const std::vector<rp::cell_result>& cells,
               const std::vector<std::string>& policies, const std::vector<double>& budgets,
               const std::vector<std::string>& tiers) {
  namespace svg = memdecay_tools::svg;
  svg::chart chart;
  chart.title = "memdecay-replay: eviction-probe protocol (synthetic or given traces)";
  chart.series = policies;
  chart.panel_width = 460;
  chart.panel_height = 220;
  chart.bar_share = 0.8;
  chart.legend_columns = 3;
  chart.legend_column_width = 260;
  auto find = [&](const std::string& p, double b, const std::string& t) -> const rp::cell_result* {
    for (const auto& c : cells)
      if (c.policy == p && c.budget == b && c.tier == t) return &c;
    return nullptr;
  };
  for (int row = 0; row < 2; ++row) {
    const char* metric = row == 0 ? "probe survival" : "attention loss";
    double top = 0.0;  // attention loss: scale to the largest value
    for (const auto& c : cells) top = std::max(top, row == 0 ? 1.0 : c.attention_loss());
    top = row == 0 ? 1.0 : std::max(0.1, std::ceil(top * 10.0) / 10.0);  // five ticks
    auto& panels = chart.rows.emplace_back();
    for (const auto& tier : tiers) {
      svg::panel& p = panels.emplace_back();
      p.title = tier + ": " + metric;
      p.top = top;
      for (double budget : budgets) {
        p.groups.push_back("budget " + budget_text(budget));
        auto& bars = p.bars.emplace_back(policies.size());
        for (std::size_t k = 0; k < policies.size(); ++k)
          if (const auto* c = find(policies[k], budget, tier)) {
            const double v = row == 0 ? c->survival() : c->attention_loss();
            bars[k] = svg::bar{
                v, policies[k] + ", budget " + budget_text(budget) + ", " + tier + ": " + metric + " " + percent(v),
                std::nullopt};
          }
      }
    }
  }
  try {
    svg::write(path, chart);
  } catch (const std::runtime_error& e) {
    throw md::input_error(e.what());
  }
}

int run(const options& o) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto policies = chosen_policies(o);
  if (!o.plot_path.empty()) {
    const auto ext = std::filesystem::path(o.plot_path).extension().string();
    if (ext != ".svg")
      throw md::input_error("--plot '" + o.plot_path + "': only SVG output is supported (give a path ending in .svg)");
  }
  for (double b : o.budgets)
    if (!(b > 0.0 && b <= 1.0)) throw md::input_error("budget " + md::detail::to_text(b) + " is outside (0, 1]");
  if (o.traces.empty() && !o.generate)
    throw md::input_error("nothing to replay: give trace files, or --generate for the synthetic protocol");

  std::vector<tr::trace_file> files;
  for (const auto& path : o.traces) files.push_back(tr::read_file(path));
  if (o.generate) {
    auto generated = tr::generate_protocol(o.seed, o.probes_per_tier, o.layers);
    if (!o.write_traces.empty()) {
      std::filesystem::create_directories(o.write_traces);
      for (const auto& f : generated) tr::write_file(std::filesystem::path(o.write_traces) / (f.label + ".mdtrace"), f);
    }
    for (auto& f : generated) files.push_back(std::move(f));
  }

  rp::replay_settings settings;
  settings.page_size = o.page_size;
  settings.protection = {.sink_pages = o.sink_pages, .recent_tokens = o.recent_tokens};
  if (o.pin_plan) settings.region_overrides.push_back({.region = "plan", .pinned = true});
  std::optional<md::calibration::calibration> calibration;
  if (!o.calibration_path.empty()) {  // fitted decay rates and base priorities, by region name (unknown: an error)
    calibration = md::calibration::read_file(o.calibration_path);
    for (auto& ov : calibration->overrides()) settings.region_overrides.push_back(std::move(ov));
  }
  {
    md::config probe_cfg;  // validates the shared settings once, with the library's messages
    probe_cfg.page_size = settings.page_size;
    probe_cfg.protection = settings.protection;
    probe_cfg.region_overrides = settings.region_overrides;
    probe_cfg.validate();
    const auto table = probe_cfg.effective_regions();
    for (const auto& f : files) {
      rp::check_regions(f, table);
      for (double b : o.budgets) rp::check_budget(settings, b, f);
    }
  }
  std::vector<std::string> tiers;
  for (const auto& f : files)
    if (std::find(tiers.begin(), tiers.end(), f.label) == tiers.end()) tiers.push_back(f.label);
  const auto region_names = files.front().region_names;

  std::ofstream log;
  rp::eviction_sink sink;
  if (!o.log_path.empty()) {
    log.open(o.log_path);
    if (!log) throw md::input_error("--log-evictions: cannot create '" + o.log_path + "'");
    sink = [&](const rp::eviction_context& ctx, const rp::eviction_record& e) {
      json j{{"policy", *ctx.policy},
             {"budget", ctx.budget},
             {"tier", *ctx.tier},
             {"sequence", ctx.episode},
             {"episode", *ctx.episode_name},
             {"step", ctx.step},
             {"page", e.page},
             {"first_position", e.first_position},
             {"tokens", e.tokens},
             {"score", e.score}};
      if (e.has_terms) {
        j["decay"] = e.decay;
        j["attention"] = e.attention;
      }
      json regions = json::object();
      for (const auto& [r, n] : e.regions) regions[r < region_names.size() ? region_names[r] : std::to_string(r)] = n;
      j["regions"] = std::move(regions);
      log << j.dump() << '\n';
    };
  }

  std::size_t episodes = 0, probes = 0;
  for (const auto& f : files) {
    episodes += f.episodes.size();
    probes += f.count_probes();
  }
  const bool show = !o.no_progress && (o.progress || isatty(STDERR_FILENO));
  std::vector<rp::cell_result> cells;
  {
    memdecay_tools::progress_bar bar("episode replays", show, episodes * policies.size() * o.budgets.size());
    for (const auto& p : policies)
      for (double b : o.budgets)
        for (const auto& tier : tiers) {
          rp::cell_result merged;
          bool first = true;
          for (const auto& f : files) {
            if (f.label != tier) continue;
            auto c = rp::replay_tier(f, p, b, settings, sink, [&] { bar.tick(); });
            if (first) {
              merged = std::move(c);
              first = false;
              continue;
            }
            merged.episodes += c.episodes;
            merged.probes += c.probes;
            merged.survived += c.survived;
            merged.total_mass += c.total_mass;
            merged.lost_mass += c.lost_mass;
            merged.evicted_pages += c.evicted_pages;
            merged.evicted_tokens += c.evicted_tokens;
            merged.over_budget += c.over_budget;
            for (std::size_t r = 0; r < merged.regions.size() && r < c.regions.size(); ++r) {
              merged.regions[r].probes += c.regions[r].probes;
              merged.regions[r].survived += c.regions[r].survived;
              merged.regions[r].lost_mass += c.regions[r].lost_mass;
              merged.regions[r].evicted_tokens += c.regions[r].evicted_tokens;
            }
          }
          cells.push_back(std::move(merged));
        }
  }
  if (log.is_open()) {
    log.flush();
    if (!log) throw md::input_error("--log-evictions: cannot write '" + o.log_path + "'");
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  std::printf("memdecay-replay %s: %zu probes in %zu episodes", md::version_string, probes, episodes);
  for (const auto& t : tiers) {
    std::size_t e = 0, n = 0;
    for (const auto& f : files)
      if (f.label == t) {
        e += f.episodes.size();
        n += f.count_probes();
      }
    std::printf("%s%s: %zu probes / %zu episodes", t == tiers.front() ? " (" : ", ", t.c_str(), n, e);
  }
  std::printf("); %zu policies x %zu budgets; page size %zu, last %zu tokens protected%s; %.2f s\n", policies.size(),
              o.budgets.size(), o.page_size, o.recent_tokens, o.pin_plan ? ", plan pinned" : "", seconds);
  if (calibration) {
    std::size_t calibrated = 0;
    for (const auto& r : calibration->regions) calibrated += r.calibrated() ? 1 : 0;
    std::printf(
        "Calibration: %s (%zu regions, %zu calibrated: their decay rates, and every region's base priority, "
        "replace the defaults)\n",
        o.calibration_path.c_str(), calibration->regions.size(), calibrated);
  }
  if (o.generate)
    std::printf("Traces: generated, seed %llu (the attention in them is synthetic: docs/trace-format.md)\n",
                static_cast<unsigned long long>(o.seed));
  std::printf("\n");
  print_tables(cells, region_names);

  if (!o.json_path.empty()) {
    json j{{"tool", "memdecay-replay"}, {"version", md::version_string}, {"seconds", seconds}};
    j["settings"] = {{"calibration", o.calibration_path.empty() ? json(nullptr) : json(o.calibration_path)},
                     {"page_size", o.page_size},
                     {"recent_tokens", o.recent_tokens},
                     {"sink_pages", o.sink_pages},
                     {"pin_plan", o.pin_plan},
                     {"budgets", o.budgets},
                     {"budget_unit", "fraction of each episode's tokens"}};
    json pol = json::array();
    for (const auto& p : policies) pol.push_back({{"name", p.name}, {"description", p.description}});
    j["policies"] = std::move(pol);
    json tj = json::array();
    for (const auto& f : files)
      tj.push_back(
          {{"label", f.label}, {"episodes", f.episodes.size()}, {"probes", f.count_probes()}, {"layers", f.layers}});
    j["traces"] = std::move(tj);
    if (o.generate)
      j["generated"] = {{"seed", o.seed}, {"probes_per_tier", o.probes_per_tier}, {"synthetic_attention", true}};
    json cj = json::array();
    for (const auto& c : cells) cj.push_back(to_json(c, region_names));
    j["results"] = std::move(cj);
    std::ofstream out(o.json_path);
    if (!out) throw md::input_error("--json: cannot create '" + o.json_path + "'");
    out << j.dump(2) << '\n';
    if (!out) throw md::input_error("--json: cannot write '" + o.json_path + "'");
  }
  if (!o.plot_path.empty()) {
    std::vector<std::string> names;
    for (const auto& p : policies) names.push_back(p.name);
    write_svg(o.plot_path, cells, names, o.budgets, tiers);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  CLI::App app{
      "memdecay-replay: replay agent traces through KV-cache eviction policies under budgets and score the "
      "eviction-probe protocol: probe survival (every token of a fact resident when it is queried), attention "
      "loss (attention mass that fell on evicted tokens) and evictions, per policy x budget x tier x region. "
      "Prints markdown tables on stdout. docs/replay.md explains the protocol, docs/trace-format.md the traces.",
      "memdecay-replay"};
  app.add_option("traces", o.traces, "Trace files (docs/trace-format.md); episodes are grouped by each file's label")
      ->type_name("FILE");
  app.add_flag("--generate", o.generate,
               "Generate the protocol's synthetic traces: the ~450- and ~1,700-token tiers (synthetic attention)");
  app.add_option("--seed", o.seed, "Generator seed")->capture_default_str();
  app.add_option("--probes-per-tier", o.probes_per_tier,
                 "Generate episodes until each tier holds at least this many probes (2 x 2160 = 4320)")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{1}, std::size_t{1000000}));
  app.add_option("--layers", o.layers, "Attention layers per generated observation (replay averages them)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 64u));
  app.add_option("--write-traces", o.write_traces, "Also write the generated traces to DIR/<tier>.mdtrace")
      ->type_name("DIR");
  app.add_option("--policy,-p", o.policies,
                 "Policies to compare, comma-separated or repeated; 'all' (default) is every one (--list-policies)")
      ->delimiter(',')
      ->capture_default_str();
  app.add_flag("--list-policies", o.list_policies, "List the policies and exit");
  app.add_option("--budget,-b", o.budgets,
                 "Budgets as fractions in (0, 1] of each episode's length, comma-separated or repeated")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--page-size", o.page_size, "Tokens per KV page (a power of two)")->capture_default_str();
  app.add_option("--recent-tokens", o.recent_tokens, "Pages holding the last N resident tokens are never evicted")
      ->capture_default_str();
  app.add_option("--sink-pages", o.sink_pages, "The first N pages are never evicted (attention sinks)")
      ->capture_default_str();
  app.add_flag("--pin-plan", o.pin_plan, "Pin the plan region as well as the system prompt");
  app.add_option("--alpha", o.alpha, "MemDecay: weight of the attention EWMA (default 1; 0.5 for zscore)");
  app.add_option("--tau", o.tau,
                 "MemDecay: refresh threshold (default 0.01 for none; 2 for uniform, lifetime and zscore)");
  app.add_option("--ewma-beta", o.ewma_beta, "MemDecay: EWMA factor per observation (default 0.9)");
  app.add_option("--calibration", o.calibration_path,
                 "Load a calibration file (memdecay-calibrate, docs/calibration.md): its fitted decay rates and its "
                 "base priorities replace the region defaults (alpha and tau stay the command line's)")
      ->type_name("PATH");
  app.add_option("--json", o.json_path, "Write every number (per policy x budget x tier x region) as JSON to PATH")
      ->type_name("PATH");
  app.add_option("--plot", o.plot_path, "Write an SVG chart (survival and attention loss per tier) to PATH (.svg)")
      ->type_name("PATH");
  app.add_option("--log-evictions", o.log_path,
                 "Write every eviction (policy, budget, tier, sequence, step, logical page, score and its terms, "
                 "regions) to PATH as JSON lines")
      ->type_name("PATH");
  app.add_flag("--progress", o.progress, "Show the progress bar even when stderr is not a terminal");
  app.add_flag("--no-progress", o.no_progress, "Never show the progress bar");
  app.set_version_flag("--version", std::string(md::version_string));
  app.footer(
      "Exit status: 0 on success, 1 on bad input (missing or malformed trace, unknown policy, budget outside (0, 1] "
      "or below the pinned set), 2+ on command-line errors.\nExample: memdecay-replay --generate --plot replay.svg");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (o.list_policies) {
      for (const auto& p : known_policies(o)) std::printf("%-22s %s\n", p.name.c_str(), p.description.c_str());
      return 0;
    }
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "memdecay-replay: error: %s\n", e.what());
    return 1;
  }
}
