// SPDX-License-Identifier: Apache-2.0
// memdecay-calibrate: estimates per-region (and per-layer) attention half-lives from agent traces and writes a
// versioned calibration file that memdecay-replay --calibration and engines (memdecay/calibration/file.hpp) load.
// Prints a summary table on stdout; --plot draws attention against age per region with the fitted curves (SVG).
// docs/calibration.md explains the estimator and the file.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include <memdecay/calibration/calibration.hpp>
#include <memdecay/calibration/file.hpp>
#include <memdecay/calibration/selftest.hpp>
#include <memdecay/io/trace.hpp>
#include <memdecay/io/trace_generator.hpp>
#include <memdecay/version.hpp>

#include "../common/xml_escape.hpp"

namespace md = memdecay;
namespace tr = memdecay::trace;
namespace cal = memdecay::calibration;

namespace {

using memdecay_tools::xml_escape;

struct options {
  std::vector<std::string> traces;
  std::string output = "calibration.json";
  std::string plot_path;
  std::optional<std::string> model;
  // Generated traces.
  bool generate = false;
  std::uint64_t seed = 1;
  std::size_t probes_per_tier = 2160;
  std::uint32_t layers = 1;
  std::vector<std::string> half_lives;  // region=steps
  std::string write_traces;
  // Runtime settings recorded in the file.
  std::string normalization = "uniform";
  double alpha = 1.0, tau = 2.0;
  // Estimator.
  cal::estimator_options est;
  std::string method = "intervals";
  std::size_t self_test = 0;  // replicates; 0: calibrate
  bool sparse_top_k = false;
  bool no_per_layer = false;
};

std::string fixed(double v, int digits = 1) {
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", digits, v);
  return b;
}

std::string now_utc() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char b[32];
  std::strftime(b, sizeof b, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return b;
}

md::attention_normalization parse_mode(const std::string& s) {
  if (auto m = cal::normalization_from_string(s)) return *m;
  throw md::config_error("invalid config: --normalization '" + s + "' (known: " + cal::normalization_names() + ")");
}

// --half-life region=steps for the generator: the model's h_r per region (the rest keep the defaults).
void apply_half_lives(tr::generator_config& c, const std::vector<std::string>& specs) {
  const auto table = md::default_region_table();
  for (const auto& spec : specs) {
    const auto eq = spec.find('=');
    if (eq == std::string::npos)
      throw md::input_error("--half-life '" + spec + "': expected REGION=STEPS, e.g. scratchpad=12");
    const std::string name = spec.substr(0, eq);
    const auto id = table.find(name);
    if (!id) throw md::input_error("--half-life '" + spec + "': unknown region '" + name + "'");
    double h = 0;
    try {
      std::size_t used = 0;
      h = std::stod(spec.substr(eq + 1), &used);
      if (used != spec.size() - eq - 1) h = -1;
    } catch (const std::exception&) {
      h = -1;
    }
    if (!(h > 0.0) || !std::isfinite(h))
      throw md::input_error("--half-life '" + spec + "': steps must be a number > 0");
    c.attention[*id].half_life = h;
  }
}

std::string interval_text(const std::optional<cal::interval>& ci) {
  return ci ? "[" + fixed(ci->lower) + ", " + fixed(ci->upper) + "]" : "-";
}

void print_summary(const cal::calibration& c, const md::region_table& base) {
  // samples: (token, row) samples for the excess-decay fit, completed refresh intervals for the interval fit; floor
  // and amplitude belong to the excess-decay curve only.
  std::printf(
      "| region | status | half-life | 95%% interval | decay rate | floor | amplitude | samples | episodes | "
      "default half-life | note |\n|---|---|---:|---|---:|---:|---:|---:|---:|---:|---|\n");
  for (const auto& r : c.regions) {
    const auto& f = r.fit;
    const double def = base[*base.find(r.name)].half_life();
    std::printf("| %s | %s | %s | %s | %.6f | %s | %s | %llu | %llu | %s | %s |\n", r.name.c_str(),
                cal::to_string(f.status), r.calibrated() ? fixed(*f.half_life).c_str() : "-",
                interval_text(f.half_life_ci).c_str(), r.decay_rate, f.floor ? fixed(*f.floor, 3).c_str() : "-",
                f.amplitude ? fixed(*f.amplitude, 3).c_str() : "-", static_cast<unsigned long long>(f.samples),
                static_cast<unsigned long long>(f.episodes), fixed(def).c_str(),
                r.calibrated() ? "fitted" : ("default kept: " + f.reason).c_str());
  }
  if (!c.regions.empty() && !c.regions.front().layers.empty()) {
    std::printf(
        "\nPer layer\n\n| region | layer | status | half-life | 95%% interval | samples | note |\n"
        "|---|---:|---|---:|---|---:|---|\n");
    for (const auto& r : c.regions)
      for (std::size_t l = 0; l < r.layers.size(); ++l) {
        const auto& f = r.layers[l];
        std::printf("| %s | %zu | %s | %s | %s | %llu | %s |\n", r.name.c_str(), l, cal::to_string(f.status),
                    f.status == cal::fit_status::calibrated ? fixed(*f.half_life).c_str() : "-",
                    interval_text(f.half_life_ci).c_str(), static_cast<unsigned long long>(f.samples),
                    f.reason.c_str());
      }
  }
}

// One panel per region: the measured mean mass per age bin (dots, area by sample count) and the fitted curve
// floor + amplitude * 2^(-age / h) (line), with the floor dashed and the half-life marked.
void write_svg(const std::string& path, const cal::calibration& c, const std::vector<cal::age_profile>& profiles) {
  const int cols = 4;
  const int rows = static_cast<int>((c.regions.size() + cols - 1) / cols);
  const double pw = 300, ph = 200, ml = 55, mt = 80, gx = 40, gy = 70;
  const double width = ml + cols * (pw + gx), height = mt + rows * (ph + gy);
  std::ostringstream s;
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
    << "\" font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    << "<text x=\"" << width / 2 << "\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">memdecay-calibrate: "
    << "attention against age since the last refresh, per region (dots: measured; line: fitted)</text>\n"
    << "<text x=\"" << width / 2 << "\" y=\"42\" text-anchor=\"middle\" fill=\"#555\">mass in scaled uniform units "
    << "(1 = a typical token of the row); dashed: fitted floor; marker: half-life</text>\n";
  for (std::size_t r = 0; r < c.regions.size(); ++r) {
    const auto& reg = c.regions[r];
    const auto& p = r < profiles.size() ? profiles[r] : cal::age_profile{};
    const double x0 = ml + static_cast<double>(r % cols) * (pw + gx),
                 y0 = mt + static_cast<double>(r / cols) * (ph + gy);
    double max_age = 1, max_mass = 0.5, max_count = 1;
    for (std::size_t k = 0; k < p.age.size(); ++k) {
      max_age = std::max(max_age, p.age[k]);
      max_mass = std::max(max_mass, p.mass[k]);
      max_count = std::max(max_count, p.count[k]);
    }
    const auto& f = reg.fit;
    if (f.floor && f.amplitude) max_mass = std::max(max_mass, *f.floor + *f.amplitude);
    max_mass *= 1.1;
    auto X = [&](double a) { return x0 + pw * a / max_age; };
    auto Y = [&](double m) { return y0 + ph - ph * std::clamp(m / max_mass, 0.0, 1.0); };
    const std::string title =
        reg.name + ": " +
        (reg.calibrated() ? "half-life " + fixed(*f.half_life) + " " + interval_text(f.half_life_ci) + " steps"
                          : std::string("uncalibrated"));
    s << "<text x=\"" << x0 + pw / 2 << "\" y=\"" << y0 - 8 << "\" text-anchor=\"middle\" font-size=\"12\">"
      << xml_escape(title) << "</text>\n";
    for (int k = 0; k <= 4; ++k) {
      const double y = y0 + ph - ph * k / 4.0;
      s << "<line x1=\"" << x0 << "\" y1=\"" << y << "\" x2=\"" << x0 + pw << "\" y2=\"" << y << "\" stroke=\"#eee\"/>"
        << "<text x=\"" << x0 - 4 << "\" y=\"" << y + 4 << "\" text-anchor=\"end\">" << fixed(max_mass * k / 4.0, 2)
        << "</text>\n";
      const double x = x0 + pw * k / 4.0;
      s << "<text x=\"" << x << "\" y=\"" << y0 + ph + 14 << "\" text-anchor=\"middle\">" << fixed(max_age * k / 4.0, 0)
        << "</text>\n";
    }
    s << "<text x=\"" << x0 + pw / 2 << "\" y=\"" << y0 + ph + 28 << "\" text-anchor=\"middle\" fill=\"#555\">age "
      << "(steps since the last refresh)</text>\n";
    for (std::size_t k = 0; k < p.age.size(); ++k) {
      const double radius = 1.0 + 2.5 * std::sqrt(p.count[k] / max_count);
      s << "<circle cx=\"" << X(p.age[k]) << "\" cy=\"" << Y(p.mass[k]) << "\" r=\"" << radius
        << "\" fill=\"#1f77b4\" fill-opacity=\"0.5\"/>\n";
    }
    if (f.half_life && f.floor && f.amplitude) {
      const double lambda = std::numbers::ln2 / *f.half_life;
      s << "<polyline fill=\"none\" stroke=\"" << (reg.calibrated() ? "#d62728" : "#999")
        << "\" stroke-width=\"2\" points=\"";
      for (int k = 0; k <= 100; ++k) {
        const double a = max_age * k / 100.0;
        s << X(a) << "," << Y(*f.floor + *f.amplitude * std::exp(-lambda * a)) << " ";
      }
      s << "\"/>\n<line x1=\"" << x0 << "\" y1=\"" << Y(*f.floor) << "\" x2=\"" << x0 + pw << "\" y2=\"" << Y(*f.floor)
        << "\" stroke=\"#d62728\" stroke-dasharray=\"4,3\" stroke-opacity=\"0.6\"/>\n";
      if (*f.half_life <= max_age)
        s << "<line x1=\"" << X(*f.half_life) << "\" y1=\"" << y0 << "\" x2=\"" << X(*f.half_life) << "\" y2=\""
          << y0 + ph << "\" stroke=\"#2ca02c\" stroke-dasharray=\"2,2\"/>\n";
    }
    s << "<line x1=\"" << x0 << "\" y1=\"" << y0 + ph << "\" x2=\"" << x0 + pw << "\" y2=\"" << y0 + ph
      << "\" stroke=\"black\"/><line x1=\"" << x0 << "\" y1=\"" << y0 << "\" x2=\"" << x0 << "\" y2=\"" << y0 + ph
      << "\" stroke=\"black\"/>\n";
  }
  s << "</svg>\n";
  std::ofstream out(path);
  if (!out) throw md::input_error("--plot: cannot create '" + path + "'");
  out << s.str();
  if (!out) throw md::input_error("--plot: cannot write '" + path + "'");
}

// --self-test N: bias and 95%-interval coverage of both estimators on N seeded synthetic traces with known answers
// (calibration_selftest.hpp), the measurement docs/calibration.md reports. --seed picks the first seed; the
// estimator options given on the command line apply to both.
int self_test(const options& o) {
  namespace st = cal::selftest;
  st::synthetic_config c;
  std::printf(
      "memdecay-calibrate --self-test %zu --seed %llu: %u episodes x %u steps x %u tokens/step per trace, "
      "continue probability %.2f, log-normal noise sigma %.2f%s\n\n",
      o.self_test, static_cast<unsigned long long>(o.seed), c.episodes, c.steps, c.tokens_per_step,
      c.continue_probability, c.noise_sigma, o.sparse_top_k ? ", rows stored top-64 sparse" : "");
  std::printf(
      "| estimator | region | true half-life | calibrated | mean fitted | bias | rmse | 95%% coverage |\n"
      "|---|---|---:|---:|---:|---:|---:|---:|\n");
  for (auto method : {cal::estimator_method::refresh_intervals, cal::estimator_method::references,
                      cal::estimator_method::excess_decay}) {
    auto est = o.est;
    est.method = method;
    if (o.sparse_top_k && method == cal::estimator_method::excess_decay) continue;  // refused: needs dense rows
    const auto t0 = std::chrono::steady_clock::now();
    st::report r;
    if (o.sparse_top_k) {
      // The same measurement with every row stored as its 64 largest entries (the sparse-trace report).
      r = st::report{};
      r.replicates = o.self_test;
      st::synthetic_config cc = c;
      std::vector<md::region_params> params;
      for (const auto& n : cc.names) params.push_back({n, 1.0, 0.01, false});
      const md::region_table base(params);
      r.regions.resize(cc.names.size());
      for (std::size_t k = 0; k < o.self_test; ++k) {
        const std::vector<tr::trace_file> traces{st::keep_top_k(st::build(cc, o.seed + k), 64)};
        const auto res = cal::estimate(traces, est, base);
        for (std::size_t i = 0; i < cc.names.size(); ++i) {
          auto& rr = r.regions[i];
          rr.name = cc.names[i];
          rr.truth = cc.refresh_half_life[i];
          const auto& f = res.regions[i].fit;
          if (f.status != cal::fit_status::calibrated) continue;
          ++rr.calibrated;
          rr.mean_half_life += *f.half_life;
          rr.rmse += (*f.half_life / rr.truth - 1) * (*f.half_life / rr.truth - 1);
          rr.covered += f.half_life_ci->lower <= rr.truth && rr.truth <= f.half_life_ci->upper;
        }
      }
      for (auto& rr : r.regions) {
        if (!rr.calibrated) continue;
        rr.mean_half_life /= static_cast<double>(rr.calibrated);
        rr.bias = rr.mean_half_life / rr.truth - 1;
        rr.rmse = std::sqrt(rr.rmse / static_cast<double>(rr.calibrated));
        rr.coverage = static_cast<double>(rr.covered) / static_cast<double>(rr.calibrated);
        r.calibrated += rr.calibrated;
        r.covered += rr.covered;
      }
    } else {
      r = st::measure(c, est, o.self_test, o.seed);
    }
    for (const auto& rr : r.regions)
      std::printf("| %s | %s | %.0f | %zu/%zu | %.2f | %+.1f%% | %.1f%% | %.3f |\n", cal::to_string(method),
                  rr.name.c_str(), rr.truth, rr.calibrated, r.replicates, rr.mean_half_life, 100 * rr.bias,
                  100 * rr.rmse, rr.coverage);
    std::printf("| %s | all | | %zu/%zu | | | | %.3f |\n", cal::to_string(method), r.calibrated,
                r.replicates * r.regions.size(), r.coverage());
    std::fprintf(stderr, "%s: %.1f s\n", cal::to_string(method),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 0;
}

int run(options& o) {
  const auto t0 = std::chrono::steady_clock::now();
  if (o.self_test) {
    o.est.per_layer = !o.no_per_layer;
    o.est.validate();
    return self_test(o);
  }
  if (!o.plot_path.empty() && std::filesystem::path(o.plot_path).extension() != ".svg")
    throw md::input_error("--plot '" + o.plot_path + "': only SVG output is supported (give a path ending in .svg)");
  if (o.traces.empty() && !o.generate)
    throw md::input_error("nothing to calibrate: give trace files, or --generate for synthetic traces");
  if (!o.half_lives.empty() && !o.generate)
    throw md::input_error("--half-life sets the generator's model: it needs --generate");
  cal::runtime_settings settings{parse_mode(o.normalization), o.alpha, o.tau};
  o.est.per_layer = !o.no_per_layer;
  if (auto m = cal::estimator_method_from_string(o.method))
    o.est.method = *m;
  else
    throw md::input_error("--method '" + o.method + "': expected intervals, references or decay");
  o.est.validate();

  std::vector<tr::trace_file> files;
  std::vector<std::string> sources;
  for (const auto& path : o.traces) {
    files.push_back(tr::read_file(path));
    sources.push_back(path);
  }
  if (o.generate) {
    for (std::uint32_t tokens : {450u, 1700u}) {
      auto c = tr::tier_config(tokens, o.seed);
      c.layers = o.layers;
      apply_half_lives(c, o.half_lives);
      auto f = tr::generate_tier(c, o.probes_per_tier);
      if (!o.write_traces.empty()) {
        std::filesystem::create_directories(o.write_traces);
        const auto path = std::filesystem::path(o.write_traces) / (f.label + ".mdtrace");
        tr::write_file(path, f);
        sources.push_back(path.string());
      } else {
        sources.push_back("(generated: " + f.label + ", seed " + std::to_string(o.seed) + ")");
      }
      files.push_back(std::move(f));
    }
  }
  std::vector<cal::age_profile> profiles;
  const auto base = md::default_region_table();
  auto result = cal::estimate(files, o.est, base, settings, sources, &profiles);
  result.source.tool = std::string("memdecay-calibrate ") + md::version_string;
  result.source.created = now_utc();
  result.source.model = o.model;
  result.source.synthetic = o.generate;
  cal::write_file(o.output, result);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  std::size_t episodes = 0, calibrated = 0;
  for (const auto& f : files) episodes += f.episodes.size();
  for (const auto& r : result.regions) calibrated += r.calibrated() ? 1 : 0;
  std::printf(
      "memdecay-calibrate %s: %zu trace files, %zu episodes, %u layer(s); %zu of %zu regions calibrated; "
      "wrote %s; %.2f s\n",
      md::version_string, files.size(), episodes, files.front().layers, calibrated, result.regions.size(),
      o.output.c_str(), seconds);
  if (o.generate) {
    std::printf(
        "Traces: generated, seed %llu (the attention in them is synthetic: docs/trace-format.md); model "
        "half-lives:",
        static_cast<unsigned long long>(o.seed));
    auto c = tr::tier_config(450, o.seed);
    apply_half_lives(c, o.half_lives);
    for (std::size_t r = 0; r < base.size(); ++r)
      std::printf(" %s %g", base[static_cast<md::region_id>(r)].name.c_str(), c.attention[r].half_life);
    std::printf("\n");
  }
  std::printf("\n");
  print_summary(result, base);
  if (!o.plot_path.empty()) write_svg(o.plot_path, result, profiles);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  CLI::App app{
      "memdecay-calibrate: estimate per-region attention half-lives (and decay rates) from agent traces and write "
      "a versioned calibration file (JSON) for memdecay-replay --calibration and engines. Prints a summary table "
      "(half-life, 95% interval, floor, samples per region, and per layer when the traces carry layers). A region "
      "with too few or too noisy samples is reported uncalibrated and keeps its default. docs/calibration.md.",
      "memdecay-calibrate"};
  app.add_option("traces", o.traces, "Trace files (docs/trace-format.md); all must list the same regions")
      ->type_name("FILE");
  app.add_option("--output,-o", o.output, "Calibration file to write")->capture_default_str()->type_name("PATH");
  app.add_option("--plot", o.plot_path, "Write attention against age per region with the fitted curves (SVG) to PATH")
      ->type_name("PATH");
  app.add_option("--model", o.model, "The model the traces were recorded from (recorded in the provenance)");
  app.add_flag("--generate", o.generate, "Calibrate on generated synthetic traces (the ~450- and ~1,700-token tiers)");
  app.add_option("--seed", o.seed, "Generator seed")->capture_default_str();
  app.add_option("--probes-per-tier", o.probes_per_tier, "Generate episodes until each tier holds this many probes")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{1}, std::size_t{1000000}));
  app.add_option("--layers", o.layers, "Attention layers per generated observation")
      ->capture_default_str()
      ->check(CLI::Range(1u, 64u));
  app.add_option("--half-life", o.half_lives,
                 "Generator model half-life of a region, REGION=STEPS (repeatable, comma-separated); the rest keep "
                 "default_region_attention()")
      ->delimiter(',');
  app.add_option("--write-traces", o.write_traces, "Also write the generated traces to DIR/<tier>.mdtrace")
      ->type_name("DIR");
  app.add_option("--normalization", o.normalization, "Runtime normalisation mode alpha and tau are for (recorded)")
      ->capture_default_str();
  app.add_option("--alpha", o.alpha, "Runtime alpha (recorded, not fitted)")->capture_default_str();
  app.add_option("--tau", o.tau, "Runtime tau (recorded, not fitted)")->capture_default_str();
  app.add_option("--method", o.method,
                 "intervals: fit the time between a token's refreshes (what MemDecay's clock models; the default); "
                 "references: the time between the workload's references of a token (trace reference events); "
                 "decay: fit the fading of mean excess attention with age (docs/calibration.md)")
      ->capture_default_str();
  app.add_option("--refresh-threshold", o.est.refresh_threshold,
                 "intervals: a token's mass at or above this (uniform units: mass x context) is a refresh")
      ->capture_default_str();
  app.add_option("--rearm-threshold", o.est.rearm_threshold,
                 "intervals: a token seen below this is armed for its next refresh (its interval starts)")
      ->capture_default_str();
  app.add_option("--min-intervals", o.est.min_intervals, "intervals: fewer completed intervals: uncalibrated")
      ->capture_default_str();
  app.add_option("--min-samples", o.est.min_samples, "decay: fewer samples: uncalibrated")->capture_default_str();
  app.add_option("--min-episodes", o.est.min_episodes, "Fewer episodes: uncalibrated")->capture_default_str();
  app.add_option("--max-ci-ratio", o.est.max_ci_ratio, "A 95% interval wider than this factor: uncalibrated")
      ->capture_default_str();
  app.add_option("--refresh-ratio", o.est.refresh_ratio,
                 "Mass above this multiple of the prediction is a re-reference (age restarts)")
      ->capture_default_str();
  app.add_option("--sink-positions", o.est.sink_positions, "Leave out the first N positions of every row")
      ->capture_default_str();
  app.add_option("--recent-positions", o.est.recent_positions, "Leave out the newest N positions of every row")
      ->capture_default_str();
  app.add_option("--passes", o.est.passes, "Fit / re-detect / rescale passes")->capture_default_str();
  app.add_option("--jackknife-groups", o.est.jackknife_groups, "Episode groups for the interval")
      ->capture_default_str();
  app.add_flag("--no-per-layer", o.no_per_layer, "Fit the layer mean only");
  app.add_option("--self-test", o.self_test,
                 "Measure both estimators' bias and 95% coverage on N seeded synthetic traces with known half-lives "
                 "(--seed: the first seed) instead of calibrating")
      ->type_name("N")
      ->check(CLI::Range(std::size_t{1}, std::size_t{100000}));
  app.add_flag(
      "--self-test-top-k", o.sparse_top_k,
      "With --self-test: store every synthetic row as its 64 largest entries (refresh-interval estimator only)");
  app.set_version_flag("--version", std::string(md::version_string));
  app.footer(
      "Exit status: 0 on success, 1 on bad input (missing or malformed trace, invalid option value), 2+ on "
      "command-line errors.\nExample: memdecay-calibrate --generate --half-life scratchpad=10 -o cal.json --plot "
      "cal.svg");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "memdecay-calibrate: error: %s\n", e.what());
    return 1;
  }
}
