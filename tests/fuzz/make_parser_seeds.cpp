// SPDX-License-Identifier: Apache-2.0
// Writes the seed corpora of the parser fuzzers (corpus/trace, corpus/calibration) with the library's own writers
// (trace::encode, calibration::to_json), plus truncated and corrupted copies. Run from the repository root:
//     g++ -std=c++20 -Iinclude tests/fuzz/make_parser_seeds.cpp -o /tmp/make_parser_seeds && /tmp/make_parser_seeds
#include <cstddef>
#include <cstdio>
#include <fstream>
#include <numbers>
#include <string>
#include <vector>

#include "memdecay/calibration/file.hpp"
#include "memdecay/io/trace.hpp"

namespace tr = memdecay::trace;
namespace cal = memdecay::calibration;

static void write(const std::string& path, const void* data, std::size_t n) {
  std::ofstream out(path, std::ios::binary);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
  std::printf("%s (%zu bytes)\n", path.c_str(), n);
}
static void write_bytes(const std::string& path, const std::vector<std::byte>& b) { write(path, b.data(), b.size()); }
static void write_text(const std::string& path, const std::string& s) { write(path, s.data(), s.size()); }

static tr::trace_file small_trace() {
  tr::trace_file f;
  f.label = "tier-seed";
  f.layers = 2;
  f.region_names = {"system", "user", "tool"};
  tr::episode ep;
  ep.name = "ep0";
  ep.seed = 42;
  ep.events.emplace_back(tr::segment{0, 0, 3});
  ep.events.emplace_back(tr::segment{1, 1, 2});
  tr::attention a{2, 5, {}};
  a.layers.push_back({false, {}, {0.5f, 0.25f, 0.0f, -0.0f, 1e-40f}});
  a.layers.push_back({true, {1, 4}, {0.75f, 0.25f}});
  ep.events.emplace_back(a);
  ep.events.emplace_back(tr::probe{3, 7, 1, 3, 2});
  ep.events.emplace_back(tr::reference{3, 1, 3});
  ep.events.emplace_back(tr::segment{4, 2, 1});
  f.episodes.push_back(ep);
  tr::episode empty;
  empty.name = "";
  f.episodes.push_back(empty);
  return f;
}

static cal::calibration small_calibration() {
  cal::calibration c;
  c.normalization = memdecay::attention_normalization::uniform;
  c.alpha = 1.5;
  c.tau = 2.0;
  cal::region_calibration sys;
  sys.name = "system";
  sys.base_priority = 4.0;
  sys.decay_rate = 0.0;
  sys.fit.status = cal::fit_status::uncalibrated;
  sys.fit.reason = "too few samples";
  cal::curve_fit layer_fit = sys.fit;
  sys.layers = {layer_fit, layer_fit};
  cal::region_calibration user;
  user.name = "user";
  user.base_priority = 1.0;
  user.fit.status = cal::fit_status::calibrated;
  user.fit.half_life = 37.25;
  user.decay_rate = std::numbers::ln2 / 37.25;
  user.fit.half_life_ci = cal::interval{30.0, 45.5};
  user.fit.floor = 0.001;
  user.fit.amplitude = -0.5;
  user.fit.samples = 123456;
  user.fit.episodes = 12;
  cal::curve_fit unreliable;
  unreliable.status = cal::fit_status::uncalibrated;
  unreliable.reason = "interval too wide";
  unreliable.half_life = 1e5;
  unreliable.floor = 0.0;
  unreliable.amplitude = 0.0;
  user.layers = {user.fit, unreliable};
  c.regions = {sys, user};
  c.source.tool = "memdecay-calibrate seed";
  c.source.created = "2026-11-29T08:30:00Z";
  c.source.model = "tiny-model";
  c.source.synthetic = true;
  c.source.traces.push_back({"tier-450.mdtrace", "tier-450", 8, 2});
  return c;
}

int main() {
  const std::string td = "tests/fuzz/corpus/trace/", cd = "tests/fuzz/corpus/calibration/";
  // Traces: valid files from the writer (version 2), then truncated and corrupted copies. The version-1 files the
  // writer wrote before reference events (seed_version1_*) stay in the corpus as they are.
  const auto full = tr::encode(small_trace());
  write_bytes(td + "seed_valid_two_layers", full);
  tr::trace_file minimal;
  minimal.label = "";
  minimal.region_names = {"r"};
  write_bytes(td + "seed_valid_no_episodes", tr::encode(minimal));
  tr::trace_file one = minimal;
  one.episodes.push_back(
      {"solo", 1,
       {tr::segment{0, 0, 4}, tr::attention{0, 4, {{false, {}, {1, 2, 3, 4}}}}, tr::reference{1, 2, 2},
        tr::probe{1, 0, 0, 0, 4}}});
  write_bytes(td + "seed_valid_one_layer", tr::encode(one));
  write_bytes(td + "bad_truncated_header", std::vector<std::byte>(full.begin(), full.begin() + 20));
  write_bytes(td + "bad_truncated_in_attention", std::vector<std::byte>(full.begin(), full.end() - 9));
  auto flipped = full;
  flipped[0] = std::byte{'X'};
  write_bytes(td + "bad_magic", flipped);
  auto nan = full;  // the first dense mass of the attention event, 0.5f, becomes a NaN
  for (std::size_t i = 0; i + 4 <= nan.size(); ++i)
    if (nan[i] == std::byte{0x00} && nan[i + 1] == std::byte{0x00} && nan[i + 2] == std::byte{0x00} &&
        nan[i + 3] == std::byte{0x3f}) {  // 0.5f
      nan[i + 2] = std::byte{0xc0};
      nan[i + 3] = std::byte{0x7f};  // quiet NaN
      break;
    }
  write_bytes(td + "bad_nan_mass", nan);
  auto trailing = full;
  trailing.push_back(std::byte{0});
  write_bytes(td + "bad_trailing_byte", trailing);

  // Calibrations: valid files from the writer, then truncated and corrupted copies.
  const std::string json = cal::to_json(small_calibration());
  write_text(cd + "seed_valid_two_regions.json", json);
  cal::calibration plain;
  cal::region_calibration r;
  r.name = "all";
  r.fit.reason = "uncalibrated by default";
  plain.regions = {r};
  write_text(cd + "seed_valid_minimal.json", cal::to_json(plain));
  write_text(cd + "bad_truncated.json", json.substr(0, json.size() / 2));
  std::string wrong_type = json;
  wrong_type.replace(wrong_type.find("1.5"), 3, "\"x\"");
  write_text(cd + "bad_wrong_type.json", wrong_type);
  std::string unknown = json;
  unknown.replace(unknown.find("\"tau\""), 5, "\"tao\"");
  write_text(cd + "bad_unknown_key.json", unknown);
  write_text(cd + "bad_not_json", "{\"format\": \"memdecay-calibration\", \x01}");
  return 0;
}
