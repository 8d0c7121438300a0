// Tests for the calibration file (memdecay/calibration/file.hpp): round trips (text and file), loading into a
// region table and a config, every rejection with its message, and arbitrary bytes (truncations, corruptions,
// deep nesting, oversized input) that are rejected with a message and never crash.
#include <gtest/gtest.h>

#include <memdecay/calibration/calibration.hpp>
#include <memdecay/calibration/file.hpp>
#include <memdecay/io/trace.hpp>
#include <memdecay/io/trace_generator.hpp>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <unistd.h>

namespace md = memdecay;
namespace cal = memdecay::calibration;
using json = nlohmann::ordered_json;

namespace {

cal::curve_fit calibrated_fit(double h, std::uint64_t samples) {
  cal::curve_fit f;
  f.status = cal::fit_status::calibrated;
  f.half_life = h;
  f.half_life_ci = cal::interval{h * 0.9, h * 1.15};
  f.floor = 0.45;
  f.amplitude = 1.3;
  f.samples = samples;
  f.episodes = 40;
  return f;
}

// A calibration over the default regions: tool_out and scratchpad fitted (tool_out with three layers' fits),
// the rest uncalibrated; every optional field exercised.
cal::calibration sample() {
  cal::calibration c;
  c.normalization = md::attention_normalization::uniform;
  c.alpha = 1.5;
  c.tau = 2.25;
  const auto table = md::default_region_table();
  for (const auto& p : table.params()) {
    cal::region_calibration r;
    r.name = p.name;
    r.base_priority = p.base_priority;
    r.decay_rate = p.decay_rate;
    r.fit.status = cal::fit_status::uncalibrated;
    r.fit.reason = "too few samples (12, the minimum is 2000)";
    r.fit.samples = 12;
    r.fit.episodes = 2;
    r.layers.assign(3, r.fit);
    c.regions.push_back(std::move(r));
  }
  auto& tool_out = c.regions[md::regions::tool_out];
  tool_out.fit = calibrated_fit(37.5, 123456);
  tool_out.decay_rate = std::numbers::ln2 / 37.5;
  tool_out.layers = {calibrated_fit(36.0, 40000), calibrated_fit(38.0, 41000), calibrated_fit(1.0 / 3.0, 42000)};
  auto& scratch = c.regions[md::regions::scratchpad];
  scratch.fit = calibrated_fit(14.25, 9999);
  scratch.decay_rate = std::numbers::ln2 / 14.25;
  c.regions[md::regions::plan].fit.half_life = 400.0;  // an unreliable fit of an uncalibrated region
  c.regions[md::regions::plan].fit.floor = 0.4;
  c.regions[md::regions::plan].fit.amplitude = -0.01;
  c.source.tool = "memdecay-calibrate 0.1.0";
  c.source.created = "2026-11-29T08:30:00Z";
  c.source.model = "llama-3.1-8b-instruct";
  c.source.synthetic = false;
  c.source.traces = {{"a/tier-450.mdtrace", "tier-450", 148, 1}, {"", "tier-1700", 92, 1}};
  c.estimator.min_samples = 1000;
  c.estimator.per_layer = true;
  return c;
}

std::filesystem::path temp_path(const std::string& name) {
  return std::filesystem::temp_directory_path() /
         ("memdecay_calibration_file_test_" + std::to_string(getpid()) + "_" + name);
}

TEST(CalibrationFile, RoundTripsThroughTextAndFile) {
  const auto c = sample();
  ASSERT_FALSE(c.check().has_value()) << *c.check();
  const std::string text = cal::to_json(c);
  const auto r = cal::parse(text);
  ASSERT_TRUE(r.ok()) << *r.error;
  EXPECT_EQ(*r.value, c);  // every double survives exactly
  EXPECT_EQ(cal::to_json(*r.value), text);

  const auto path = temp_path("round.json");
  cal::write_file(path, c);
  EXPECT_EQ(cal::read_file(path), c);
  std::filesystem::remove(path);

  auto no_model = c;
  no_model.source.model.reset();
  no_model.normalization = md::attention_normalization::none;
  EXPECT_EQ(cal::parse_or_throw(cal::to_json(no_model)), no_model);
}

TEST(CalibrationFile, LoadsIntoARegionTableAndAConfig) {
  const auto c = cal::parse_or_throw(cal::to_json(sample()));
  const auto defaults = md::default_region_table();
  const auto table = c.apply(defaults);
  EXPECT_DOUBLE_EQ(table.decay_rate(md::regions::tool_out), std::numbers::ln2 / 37.5);
  EXPECT_DOUBLE_EQ(table[md::regions::tool_out].half_life(), 37.5);
  EXPECT_DOUBLE_EQ(table[md::regions::scratchpad].half_life(), 14.25);
  for (md::region_id r :
       {md::regions::system, md::regions::plan, md::regions::user, md::regions::tool_in, md::regions::retrieval}) {
    EXPECT_EQ(table.decay_rate(r), defaults.decay_rate(r)) << "uncalibrated region " << int{r} << " keeps its default";
    EXPECT_EQ(table.pinned(r), defaults.pinned(r));
  }
  // Base priorities come from the file.
  auto edited = c;
  edited.regions[md::regions::user].base_priority = 0.25;
  EXPECT_EQ(edited.apply(defaults).base_priority(md::regions::user), 0.25);

  md::config cfg;
  cfg.region_overrides = {{.region = "plan", .pinned = true}};
  c.apply_to(cfg);
  EXPECT_EQ(cfg.normalization, md::attention_normalization::uniform);
  EXPECT_EQ(cfg.alpha, 1.5);
  EXPECT_EQ(cfg.tau, 2.25);
  cfg.validate();
  const auto effective = cfg.effective_regions();
  EXPECT_DOUBLE_EQ(effective[md::regions::tool_out].half_life(), 37.5);
  EXPECT_TRUE(effective.pinned(md::regions::plan));  // earlier overrides stay

  // A region the table does not know is an error, and the config is unchanged.
  auto foreign = c;
  foreign.regions[0].name = "preamble";
  md::config before;
  md::config target = before;
  EXPECT_THROW(foreign.apply_to(target), md::config_error);
  EXPECT_EQ(target.region_overrides.size(), before.region_overrides.size());
  EXPECT_EQ(target.tau, before.tau);
  try {
    (void)foreign.apply(defaults);
    FAIL();
  } catch (const md::config_error& e) {
    EXPECT_NE(std::string(e.what()).find("calibration region 'preamble' is not in the region table"),
              std::string::npos);
  }
}

// Applies `edit` to the sample's JSON and expects parse() to reject it with `message` in the error.
void expect_rejected(const std::function<void(json&)>& edit, const std::string& message) {
  json j = json::parse(cal::to_json(sample()));
  edit(j);
  const std::string text = j.dump(2);
  const auto r = cal::parse(text);
  ASSERT_FALSE(r.ok()) << "accepted, expected: " << message;
  EXPECT_NE(r.error->find(message), std::string::npos) << "error: " << *r.error << "\nexpected: " << message;
  try {
    (void)cal::parse_or_throw(text, "x.json");
    FAIL();
  } catch (const md::config_error& e) {
    EXPECT_NE(std::string(e.what()).find("invalid config: calibration 'x.json': "), std::string::npos) << e.what();
  }
}

// The code block of docs/calibration.md, on a generated trace written to a file.
TEST(CalibrationFile, DocumentationExampleRuns) {
  auto gen = memdecay::trace::tier_config(450, 5);
  const auto trace_path = temp_path("tier-450.mdtrace");
  memdecay::trace::write_file(trace_path, memdecay::trace::generate_tier(gen, 200));
  const auto file = temp_path("model.calibration.json");
  {
    namespace cal = memdecay::calibration;
    std::vector<memdecay::trace::trace_file> traces{memdecay::trace::read_file(trace_path)};
    // The generator's half-lives are attention fades: the excess-decay estimator's quantity (the default estimator,
    // refresh intervals, is for recorded traces; docs/calibration.md).
    cal::calibration c = cal::estimate(traces, {.method = cal::estimator_method::excess_decay});
    cal::write_file(file, c);  // validates first

    auto loaded = cal::read_file(file);  // config_error naming the field on a bad file
    memdecay::region_table table = loaded.apply(memdecay::default_region_table());
    memdecay::config cfg;
    loaded.apply_to(cfg);  // normalisation, alpha, tau, and region_overrides with the fitted decay rates

    EXPECT_EQ(loaded, c);
    std::size_t calibrated = 0;
    for (const auto& r : c.regions) {
      calibrated += r.calibrated() ? 1 : 0;
      EXPECT_EQ(table.decay_rate(*table.find(r.name)), r.decay_rate) << r.name;
      EXPECT_EQ(cfg.effective_regions().decay_rate(*table.find(r.name)), r.decay_rate) << r.name;
    }
    EXPECT_GE(calibrated, 4u);
  }
  std::filesystem::remove(trace_path);
  std::filesystem::remove(file);
}

TEST(CalibrationFile, RejectsMalformedAndOutOfRangeFilesWithClearErrors) {
  expect_rejected([](json& j) { j = json::array(); }, "the document is an array, not an object");
  expect_rejected([](json& j) { j["format"] = "memdecay-trace"; },
                  "format: 'memdecay-trace' (expected 'memdecay-calibration')");
  expect_rejected([](json& j) { j["version"] = 2; }, "version: unsupported version 2 (this reader reads version 1)");
  expect_rejected([](json& j) { j["version"] = -1; }, "version: -1 (must be a whole number >= 0)");
  expect_rejected([](json& j) { j["version"] = 1.5; }, "version: 1.5 (must be a whole number >= 0)");
  expect_rejected([](json& j) { j.erase("tau"); }, "tau: missing");
  expect_rejected([](json& j) { j["tua"] = 2; }, "tua: unknown key (known: format version normalization");
  expect_rejected([](json& j) { j["alpha"] = "1"; }, "alpha: a string \"1\" (must be a number)");
  expect_rejected([](json& j) { j["alpha"] = -0.5; }, "alpha: -0.5 (must be >= 0)");
  expect_rejected([](json& j) { j["normalization"] = "softmax"; }, "normalization: 'softmax' (known: none uniform");
  expect_rejected([](json& j) { j["regions"] = json::array(); }, "regions: has 0 entries (must be 1 to 256)");
  expect_rejected([](json& j) { j["regions"][1] = 7; }, "regions[1]: a number (must be an object)");
  expect_rejected([](json& j) { j["regions"][1]["name"] = "system"; },
                  "regions[1] ('system'): repeats the name of regions[0]");
  expect_rejected([](json& j) { j["regions"][1]["name"] = ""; }, "regions[1] (''): name must be 1 to 255 bytes");
  expect_rejected([](json& j) { j["regions"][2]["decay_rate"] = -0.01; },
                  "regions[2].decay_rate: -0.01 (must be finite and >= 0)");
  expect_rejected([](json& j) { j["regions"][2]["base_priority"] = -1; },
                  "regions[2].base_priority: -1 (must be finite and >= 0)");
  expect_rejected([](json& j) { j["regions"][2]["half_life"] = 81.0; },
                  "regions[2].half_life: 81 disagrees with decay_rate");
  expect_rejected([](json& j) { j["regions"][2]["fit"]["status"] = "maybe"; },
                  "regions[2].fit.status: 'maybe' (must be calibrated or uncalibrated)");
  expect_rejected([](json& j) { j["regions"][2]["fit"].erase("reason"); },
                  "regions[2] ('user'): is uncalibrated without a reason");
  expect_rejected([](json& j) { j["regions"][4]["fit"]["half_life_ci"] = nullptr; },
                  "regions[4] ('tool_out'): a calibrated fit needs half_life_ci");
  expect_rejected(
      [](json& j) {
        j["regions"][4]["fit"]["half_life_ci"] = {40.0, 50.0};
      },
      "regions[4] ('tool_out'): half_life_ci = [40, 50] (must be finite, > 0 and contain half_life = 37.5)");
  expect_rejected([](json& j) { j["regions"][4]["fit"]["half_life_ci"] = {40.0}; },
                  "regions[4].fit.half_life_ci: has 1 entries (must be [lower, upper])");
  expect_rejected([](json& j) { j["regions"][4]["fit"]["half_life_ci"][1] = "x"; },
                  "regions[4].fit.half_life_ci[1]: a string (must be a number)");
  expect_rejected([](json& j) { j["regions"][4]["fit"]["half_life"] = 40.0; },
                  "regions[4] ('tool_out'): decay_rate = 0.0184839248 disagrees with the fitted half_life = 40");
  expect_rejected([](json& j) { j["regions"][4]["fit"]["half_life"] = -3.0; },
                  "half_life = -3 (a calibrated fit needs a finite half-life > 0)");
  expect_rejected([](json& j) { j["regions"][1]["fit"]["half_life"] = 0.0; }, "half_life = 0 (must be finite and > 0)");
  expect_rejected([](json& j) { j["regions"][4]["fit"]["samples"] = -5; },
                  "regions[4].fit.samples: -5 (must be a whole number >= 0)");
  expect_rejected([](json& j) { j["regions"][4]["fit"]["episodes"] = 1000000; },
                  "episodes = 1000000 exceeds samples = 123456");
  expect_rejected([](json& j) { j["regions"][4]["fit"]["colour"] = "red"; }, "regions[4].fit.colour: unknown key");
  expect_rejected([](json& j) { j["regions"][4]["layers"].erase(0); },
                  "regions[4] ('tool_out'): has 2 layers, regions[0] has 3");
  expect_rejected([](json& j) { j["regions"][4]["layers"][2]["status"] = 1; },
                  "regions[4].layers[2].status: a number 1 (must be a string)");
  expect_rejected([](json& j) { j["provenance"]["traces"][0]["layers"] = 0; },
                  "provenance.traces[0].layers: 0 (must be in [1, 4096])");
  expect_rejected([](json& j) { j["provenance"]["model"] = 3; }, "provenance.model: a number 3 (must be a string)");
  expect_rejected(
      [](json& j) { j["estimator"]["method"] = "ols"; },
      "estimator.method: 'ols' (this reader knows 'refresh-interval-mle-jackknife', "
      "'reference-interval-mle-jackknife' and 'wls-excess-decay-jackknife')");
  expect_rejected([](json& j) { j["estimator"]["passes"] = 0; }, "estimator: passes = 0 (must be in [1, 64])");
  expect_rejected([](json& j) { j["estimator"]["sink_positions"] = 5000000000ULL; },
                  "estimator.sink_positions: 5000000000 (at most 4294967295)");
}

TEST(CalibrationFile, RejectsBytesThatAreNotACalibration) {
  auto error_of = [](std::string_view text) {
    const auto r = cal::parse(text);
    EXPECT_FALSE(r.ok()) << text.substr(0, 80);
    return r.error.value_or("");
  };
  EXPECT_NE(error_of("").find("not valid JSON (byte 1)"), std::string::npos);
  EXPECT_NE(error_of("{\"format\": ").find("not valid JSON"), std::string::npos);
  EXPECT_NE(error_of(cal::to_json(sample()) + "x").find("not valid JSON"), std::string::npos);
  EXPECT_NE(error_of("\x89PNG\r\n\x1a\n").find("not valid JSON (byte 1)"), std::string::npos);
  EXPECT_NE(error_of("{\"format\": \"\xff\"}").find("not valid JSON"), std::string::npos);  // not UTF-8
  {
    std::string text = cal::to_json(sample());
    text.replace(text.find("\"alpha\": 1.5"), 12, "\"alpha\": 1e999");
    EXPECT_NE(error_of(text).find("not valid JSON (byte 100): [json.exception.out_of_range.406] number overflow"),
              std::string::npos)
        << error_of(text);
  }
  // Deep nesting is parsed without recursion and rejected.
  EXPECT_NE(error_of(std::string(200000, '[') + std::string(200000, ']')).find("the document is an array"),
            std::string::npos);
  EXPECT_NE(error_of(std::string(200000, '[')).find("not valid JSON"), std::string::npos);
  // Oversized input is refused before parsing.
  EXPECT_NE(error_of(std::string(cal::max_file_bytes + 1, ' ')).find("bytes (at most 16777216)"), std::string::npos);
  // A missing file is an input_error naming it.
  try {
    (void)cal::read_file("no/such/calibration.json");
    FAIL();
  } catch (const md::input_error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot open calibration 'no/such/calibration.json'"), std::string::npos);
  }
  // Writing an inconsistent calibration is refused and writes nothing.
  auto bad = sample();
  bad.regions[0].decay_rate = -1;
  const auto path = temp_path("bad.json");
  EXPECT_THROW(cal::write_file(path, bad), md::config_error);
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(CalibrationFile, ArbitraryCorruptionsAreRejectedOrValid) {
  const std::string good = cal::to_json(sample());
  // Every truncation is rejected (a JSON document cut short is never complete) ...
  for (std::size_t n = 0; n < good.size(); n += 7) EXPECT_FALSE(cal::parse(good.substr(0, n)).ok()) << n;
  // ... and random byte changes are rejected with a message or accepted only as a valid calibration that
  // re-encodes and re-parses to itself.
  std::uint64_t state = 42;
  auto next = [&] {
    state += 0x9e3779b97f4a7c15ULL;
    std::uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  const char alphabet[] = "0123456789.-+eE\"{}[],: nulltruefalse\x7f\xc3\xa9";
  int accepted = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::string text = good;
    const int edits = 1 + static_cast<int>(next() % 3);
    for (int k = 0; k < edits; ++k) {
      const std::size_t at = next() % text.size();
      switch (next() % 3) {
        case 0: text[at] = alphabet[next() % (sizeof alphabet - 1)]; break;
        case 1: text.erase(at, 1 + next() % 4); break;
        default: text.insert(at, 1, static_cast<char>(next() & 0xff)); break;
      }
      if (text.empty()) text = "{";
    }
    const auto r = cal::parse(text);
    if (r.ok()) {
      ++accepted;
      ASSERT_FALSE(r.value->check().has_value());
      const auto again = cal::parse(cal::to_json(*r.value));
      ASSERT_TRUE(again.ok()) << *again.error;
      EXPECT_EQ(*again.value, *r.value);
    } else {
      EXPECT_FALSE(r.error->empty());
    }
  }
  // Whitespace and digit changes in free-form fields keep some files valid; most corruptions are rejected.
  EXPECT_LT(accepted, 3000);
}

}  // namespace
