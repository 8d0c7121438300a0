// SPDX-License-Identifier: Apache-2.0
// memdecay: the calibration file: a versioned JSON document (through nlohmann-json) holding a calibration
// (calibration.hpp): the runtime settings it was made for, every region's decay rate and fit, the provenance and
// the estimator's options. docs/calibration.md specifies every field.
//
//   namespace cal = memdecay::calibration;
//   cal::calibration c = cal::read_file("model.calibration.json");   // config_error naming the field on bad input
//   memdecay::config cfg;  c.apply_to(cfg);
//   cal::write_file("copy.json", c);                                 // validates first; writes nothing invalid
//   cal::parse_result r = cal::parse(text);                          // non-throwing: r.value, or r.error
//
// The reader accepts arbitrary bytes: it never throws from parse() (only std::bad_alloc), never reads past the
// input, rejects files over max_file_bytes, unknown keys, wrong types, out-of-range or inconsistent values, and
// names the JSON path of the offending field (`regions[2].fit.half_life_ci[1]`) with the value.
//
// Needs nlohmann-json (Debian: nlohmann-json3-dev; tools/bootstrap installs it). The rest of the library does not.
#ifndef MEMDECAY_CALIBRATION_FILE_HPP
#define MEMDECAY_CALIBRATION_FILE_HPP

#if !__has_include(<nlohmann/json.hpp>)
#error "memdecay/calibration/file.hpp needs nlohmann-json (Debian: nlohmann-json3-dev)"
#endif

#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <limits>
#include <numbers>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "memdecay/calibration/calibration.hpp"
#include "memdecay/core/config.hpp"
#include "memdecay/detail/error.hpp"

namespace memdecay::calibration {

/// The value of the file's "format" field.
inline constexpr std::string_view format_name = "memdecay-calibration";
/// Larger inputs are rejected before parsing.
inline constexpr std::size_t max_file_bytes = std::size_t{16} << 20;

/// The outcome of parse(): exactly one of `value` and `error` is set.
struct parse_result {
  std::optional<calibration> value;
  std::optional<std::string> error;
  [[nodiscard]] bool ok() const noexcept { return value.has_value(); }
};

namespace detail {

using json = nlohmann::ordered_json;
using memdecay::detail::to_text;

// A short, printable rendering of a JSON value for error messages.
inline std::string show(const json& v) {
  std::string s = v.dump(-1, ' ', true, json::error_handler_t::replace);
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

inline const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::object: return "an object";
    case json::value_t::array: return "an array";
    case json::value_t::string: return "a string";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
    case json::value_t::number_float: return "a number";
    default: return "not a JSON value";
  }
}

// Reads a parsed document into a calibration; on the first problem, records it and returns false.
class reader {
 public:
  bool document(const json& root, calibration& out) {
    if (!root.is_object()) return fail("", "the document is " + std::string(type_name(root)) + ", not an object");
    if (!keys(root, "", {"format", "version", "normalization", "alpha", "tau", "regions", "provenance", "estimator"}))
      return false;
    std::string format;
    if (!string(root, "format", "", format)) return false;
    if (format != format_name) return fail("format", "'" + format + "' (expected '" + std::string(format_name) + "')");
    std::uint64_t version = 0;
    if (!unsigned_int(root, "version", "", version, std::numeric_limits<std::uint32_t>::max())) return false;
    if (version != static_cast<std::uint64_t>(format_version))
      return fail("version", "unsupported version " + to_text(version) + " (this reader reads version " +
                                 to_text(format_version) + ")");
    std::string mode;
    if (!string(root, "normalization", "", mode)) return false;
    const auto parsed = normalization_from_string(mode);
    if (!parsed) return fail("normalization", "'" + mode + "' (known: " + normalization_names() + ")");
    out.normalization = *parsed;
    if (!number(root, "alpha", "", out.alpha) || !number(root, "tau", "", out.tau)) return false;
    if (!(out.alpha >= 0.0)) return fail("alpha", to_text(out.alpha) + " (must be >= 0)");
    if (!(out.tau >= 0.0)) return fail("tau", to_text(out.tau) + " (must be >= 0)");
    const json* regions = member(root, "regions", "", json::value_t::array);
    if (!regions) return false;
    if (regions->empty() || regions->size() > 256)
      return fail("regions", "has " + to_text(regions->size()) + " entries (must be 1 to 256)");
    for (std::size_t i = 0; i < regions->size(); ++i) {
      out.regions.emplace_back();
      if (!region((*regions)[i], "regions[" + to_text(i) + "]", out.regions.back())) return false;
    }
    const json* prov = member(root, "provenance", "", json::value_t::object);
    if (!prov || !provenance_of(*prov, "provenance", out.source)) return false;
    const json* est = member(root, "estimator", "", json::value_t::object);
    if (!est || !estimator_of(*est, "estimator", out.estimator)) return false;
    return true;
  }

  [[nodiscard]] const std::string& error() const noexcept { return error_; }

 private:
  bool fail(const std::string& path, const std::string& why) {
    error_ = path.empty() ? why : path + ": " + why;
    return false;
  }
  static std::string join(const std::string& parent, const std::string& key) {
    return parent.empty() ? key : parent + "." + key;
  }
  // Every key of `o` must be one of `allowed`.
  bool keys(const json& o, const std::string& path, std::initializer_list<std::string_view> allowed) {
    for (auto it = o.begin(); it != o.end(); ++it) {
      bool ok = false;
      for (auto a : allowed) ok = ok || it.key() == a;
      if (!ok) {
        std::string list;
        for (auto a : allowed) list += " " + std::string(a);
        return fail(join(path, it.key()), "unknown key (known:" + list + ")");
      }
    }
    return true;
  }
  // The member `key` of object `o`, which must be present and of type `type` (or any number for number_float).
  const json* member(const json& o, const std::string& key, const std::string& path, json::value_t type,
                     bool optional_null = false) {
    const auto it = o.find(key);
    if (it == o.end()) {
      fail(join(path, key), "missing");
      return nullptr;
    }
    if (optional_null && it->is_null()) return &*it;
    const bool match = type == json::value_t::number_float ? it->is_number() : it->type() == type;
    if (!match) {
      const char* want = type == json::value_t::number_float ? "a number"
                         : type == json::value_t::string     ? "a string"
                         : type == json::value_t::array      ? "an array"
                         : type == json::value_t::object     ? "an object"
                                                             : "a boolean";
      fail(join(path, key), std::string(type_name(*it)) + " " + show(*it) + " (must be " + want + ")");
      return nullptr;
    }
    return &*it;
  }
  bool string(const json& o, const std::string& key, const std::string& path, std::string& out) {
    const json* v = member(o, key, path, json::value_t::string);
    if (!v) return false;
    out = v->get<std::string>();
    return true;
  }
  bool boolean(const json& o, const std::string& key, const std::string& path, bool& out) {
    const json* v = member(o, key, path, json::value_t::boolean);
    if (!v) return false;
    out = v->get<bool>();
    return true;
  }
  bool finite(const json& v, const std::string& path, double& out) {
    out = v.get<double>();
    if (!std::isfinite(out)) return fail(path, to_text(out) + " (must be finite)");
    return true;
  }
  bool number(const json& o, const std::string& key, const std::string& path, double& out) {
    const json* v = member(o, key, path, json::value_t::number_float);
    return v && finite(*v, join(path, key), out);
  }
  bool optional_number(const json& o, const std::string& key, const std::string& path, std::optional<double>& out) {
    const json* v = member(o, key, path, json::value_t::number_float, true);
    if (!v) return false;
    if (v->is_null()) {
      out.reset();
      return true;
    }
    double d = 0;
    if (!finite(*v, join(path, key), d)) return false;
    out = d;
    return true;
  }
  bool unsigned_int(const json& o, const std::string& key, const std::string& path, std::uint64_t& out,
                    std::uint64_t max) {
    const json* v = member(o, key, path, json::value_t::number_float);
    if (!v) return false;
    if (v->is_number_unsigned()) {
      out = v->get<std::uint64_t>();
    } else {
      return fail(join(path, key), show(*v) + " (must be a whole number >= 0)");
    }
    if (out > max) return fail(join(path, key), to_text(out) + " (at most " + to_text(max) + ")");
    return true;
  }
  template <class T>
  bool small_uint(const json& o, const std::string& key, const std::string& path, T& out) {
    std::uint64_t v = 0;
    if (!unsigned_int(o, key, path, v, std::numeric_limits<T>::max())) return false;
    out = static_cast<T>(v);
    return true;
  }

  bool fit(const json& f, const std::string& path, curve_fit& out) {
    if (!f.is_object()) return fail(path, std::string(type_name(f)) + " (must be an object)");
    if (!keys(f, path, {"status", "reason", "half_life", "half_life_ci", "floor", "amplitude", "samples", "episodes"}))
      return false;
    std::string status;
    if (!string(f, "status", path, status)) return false;
    if (status == "calibrated") {
      out.status = fit_status::calibrated;
    } else if (status == "uncalibrated") {
      out.status = fit_status::uncalibrated;
    } else {
      return fail(join(path, "status"), "'" + status + "' (must be calibrated or uncalibrated)");
    }
    if (f.contains("reason") && !string(f, "reason", path, out.reason)) return false;
    if (!optional_number(f, "half_life", path, out.half_life) || !optional_number(f, "floor", path, out.floor) ||
        !optional_number(f, "amplitude", path, out.amplitude))
      return false;
    const json* ci = member(f, "half_life_ci", path, json::value_t::array, true);
    if (!ci) return false;
    if (ci->is_array()) {
      if (ci->size() != 2)
        return fail(join(path, "half_life_ci"), "has " + to_text(ci->size()) + " entries (must be [lower, upper])");
      interval iv;
      for (std::size_t k = 0; k < 2; ++k) {
        const std::string at = join(path, "half_life_ci") + "[" + to_text(k) + "]";
        if (!(*ci)[k].is_number()) return fail(at, std::string(type_name((*ci)[k])) + " (must be a number)");
        if (!finite((*ci)[k], at, k == 0 ? iv.lower : iv.upper)) return false;
      }
      out.half_life_ci = iv;
    }
    return unsigned_int(f, "samples", path, out.samples, std::numeric_limits<std::uint64_t>::max()) &&
           unsigned_int(f, "episodes", path, out.episodes, std::numeric_limits<std::uint64_t>::max());
  }

  bool region(const json& r, const std::string& path, region_calibration& out) {
    if (!r.is_object()) return fail(path, std::string(type_name(r)) + " (must be an object)");
    if (!keys(r, path, {"name", "base_priority", "decay_rate", "half_life", "fit", "layers"})) return false;
    if (!string(r, "name", path, out.name) || !number(r, "base_priority", path, out.base_priority) ||
        !number(r, "decay_rate", path, out.decay_rate))
      return false;
    if (!(out.base_priority >= 0.0))
      return fail(join(path, "base_priority"), to_text(out.base_priority) + " (must be finite and >= 0)");
    if (!(out.decay_rate >= 0.0))
      return fail(join(path, "decay_rate"), to_text(out.decay_rate) + " (must be finite and >= 0)");
    std::optional<double> half_life;
    if (!optional_number(r, "half_life", path, half_life)) return false;
    // The half-life in effect is informative, but it must agree with the decay rate (catches hand edits).
    if (out.decay_rate > 0.0) {
      const double expected = std::numbers::ln2 / out.decay_rate;
      if (!half_life || !(std::abs(*half_life - expected) <= 1e-9 * expected))
        return fail(join(path, "half_life"), (half_life ? to_text(*half_life) : std::string("null")) +
                                                 " disagrees with decay_rate = " + to_text(out.decay_rate) +
                                                 " (ln 2 / decay_rate = " + to_text(expected) + ")");
    } else if (half_life) {
      return fail(join(path, "half_life"), to_text(*half_life) + " but decay_rate is " + to_text(out.decay_rate) +
                                               " (no decay: half_life must be null)");
    }
    const json* f = member(r, "fit", path, json::value_t::object);
    if (!f || !fit(*f, join(path, "fit"), out.fit)) return false;
    const json* layers = member(r, "layers", path, json::value_t::array);
    if (!layers) return false;
    if (layers->size() > trace::max_layers)
      return fail(join(path, "layers"), "has " + to_text(layers->size()) + " entries (at most 4096)");
    for (std::size_t l = 0; l < layers->size(); ++l) {
      out.layers.emplace_back();
      if (!fit((*layers)[l], join(path, "layers") + "[" + to_text(l) + "]", out.layers.back())) return false;
    }
    return true;
  }

  bool provenance_of(const json& p, const std::string& path, provenance& out) {
    if (!keys(p, path, {"tool", "created", "model", "synthetic", "traces"})) return false;
    if (!string(p, "tool", path, out.tool) || !string(p, "created", path, out.created) ||
        !boolean(p, "synthetic", path, out.synthetic))
      return false;
    const json* model = member(p, "model", path, json::value_t::string, true);
    if (!model) return false;
    if (model->is_string()) out.model = model->get<std::string>();
    const json* traces = member(p, "traces", path, json::value_t::array);
    if (!traces) return false;
    for (std::size_t i = 0; i < traces->size(); ++i) {
      const std::string at = join(path, "traces") + "[" + to_text(i) + "]";
      const json& t = (*traces)[i];
      if (!t.is_object()) return fail(at, std::string(type_name(t)) + " (must be an object)");
      trace_source s;
      if (!keys(t, at, {"path", "label", "episodes", "layers"}) || !string(t, "path", at, s.path) ||
          !string(t, "label", at, s.label) ||
          !unsigned_int(t, "episodes", at, s.episodes, std::numeric_limits<std::uint32_t>::max()) ||
          !small_uint(t, "layers", at, s.layers))
        return false;
      if (s.layers == 0 || s.layers > trace::max_layers)
        return fail(at + ".layers", to_text(s.layers) + " (must be in [1, 4096])");
      out.traces.push_back(std::move(s));
    }
    return true;
  }

  // The estimator's options. Files written before the refresh-interval estimator (method
  // wls-excess-decay-jackknife) carry exactly the keys they always did; the refresh-interval and reference methods
  // add their three (required with them, unknown without them), so version 1 still reads every file it ever read.
  bool estimator_of(const json& e, const std::string& path, estimator_options& o) {
    if (!e.is_object()) return fail(path, std::string(type_name(e)) + " (must be an object)");
    std::string method;
    if (!string(e, "method", path, method)) return false;
    const auto m = estimator_method_from_string(method);
    if (!m || method == "decay" || method == "intervals" || method == "references")
      return fail(join(path, "method"), "'" + method + "' (this reader knows '" +
                                            std::string(to_string(estimator_method::refresh_intervals)) + "', '" +
                                            std::string(to_string(estimator_method::references)) + "' and '" +
                                            std::string(to_string(estimator_method::excess_decay)) + "')");
    o.method = *m;
    if (*m == estimator_method::excess_decay) {
      if (!keys(e, path,
                {"method", "min_samples", "min_episodes", "max_ci_ratio", "refresh_ratio", "sink_positions",
                 "recent_positions", "min_half_life", "max_half_life", "passes", "jackknife_groups", "max_age_bins",
                 "per_layer"}))
        return false;
    } else {
      if (!keys(e, path,
                {"method", "min_samples", "min_episodes", "max_ci_ratio", "refresh_ratio", "sink_positions",
                 "recent_positions", "min_half_life", "max_half_life", "passes", "jackknife_groups", "max_age_bins",
                 "per_layer", "refresh_threshold", "rearm_threshold", "min_intervals"}) ||
          !number(e, "refresh_threshold", path, o.refresh_threshold) ||
          !number(e, "rearm_threshold", path, o.rearm_threshold) ||
          !unsigned_int(e, "min_intervals", path, o.min_intervals, std::numeric_limits<std::uint64_t>::max()))
        return false;
    }
    return unsigned_int(e, "min_samples", path, o.min_samples, std::numeric_limits<std::uint64_t>::max()) &&
           small_uint(e, "min_episodes", path, o.min_episodes) && number(e, "max_ci_ratio", path, o.max_ci_ratio) &&
           number(e, "refresh_ratio", path, o.refresh_ratio) &&
           small_uint(e, "sink_positions", path, o.sink_positions) &&
           small_uint(e, "recent_positions", path, o.recent_positions) &&
           number(e, "min_half_life", path, o.min_half_life) && number(e, "max_half_life", path, o.max_half_life) &&
           small_uint(e, "passes", path, o.passes) && small_uint(e, "jackknife_groups", path, o.jackknife_groups) &&
           small_uint(e, "max_age_bins", path, o.max_age_bins) && boolean(e, "per_layer", path, o.per_layer);
  }

  std::string error_;
};

inline json fit_to_json(const curve_fit& f) {
  json j;
  j["status"] = to_string(f.status);
  if (!f.reason.empty()) j["reason"] = f.reason;
  auto opt = [](const std::optional<double>& v) { return v ? json(*v) : json(nullptr); };
  j["half_life"] = opt(f.half_life);
  j["half_life_ci"] = f.half_life_ci ? json::array({f.half_life_ci->lower, f.half_life_ci->upper}) : json(nullptr);
  j["floor"] = opt(f.floor);
  j["amplitude"] = opt(f.amplitude);
  j["samples"] = f.samples;
  j["episodes"] = f.episodes;
  return j;
}

}  // namespace detail

/// Parses a calibration file's text. Never throws for malformed input: `error` names the JSON path, the value
/// and the rule (for a syntax error, the byte offset).
[[nodiscard]] inline parse_result parse(std::string_view text) {
  parse_result r;
  if (text.size() > max_file_bytes) {
    r.error = "file is " + memdecay::detail::to_text(text.size()) + " bytes (at most " +
              memdecay::detail::to_text(max_file_bytes) + ")";
    return r;
  }
  detail::json root = detail::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) {
    // Re-run through the SAX interface to learn where the syntax error is, without exceptions.
    struct locate : nlohmann::json_sax<detail::json> {
      std::size_t at = 0;
      std::string why;
      bool null() override { return true; }
      bool boolean(bool) override { return true; }
      bool number_integer(number_integer_t) override { return true; }
      bool number_unsigned(number_unsigned_t) override { return true; }
      bool number_float(number_float_t, const string_t&) override { return true; }
      bool string(string_t&) override { return true; }
      bool binary(binary_t&) override { return true; }
      bool start_object(std::size_t) override { return true; }
      bool key(string_t&) override { return true; }
      bool end_object() override { return true; }
      bool start_array(std::size_t) override { return true; }
      bool end_array() override { return true; }
      bool parse_error(std::size_t position, const std::string& last_token,
                       const nlohmann::detail::exception& e) override {
        at = position;
        why = e.what();
        (void)last_token;
        return false;
      }
    } sax;
    (void)detail::json::sax_parse(text.begin(), text.end(), &sax, nlohmann::detail::input_format_t::json, false);
    r.error = "not valid JSON (byte " + memdecay::detail::to_text(sax.at) + "): " + sax.why;
    return r;
  }
  calibration c;
  detail::reader rd;
  if (!rd.document(root, c)) {
    r.error = rd.error();
    return r;
  }
  if (auto e = c.check()) {
    r.error = *e;
    return r;
  }
  r.value = std::move(c);
  return r;
}

/// Parses a calibration file's text; config_error ("calibration 'SOURCE': ...") when it is malformed.
[[nodiscard]] inline calibration parse_or_throw(std::string_view text, std::string_view source = "calibration") {
  auto r = parse(text);
  if (!r.ok()) memdecay::detail::raise_config("calibration '" + std::string(source) + "': " + *r.error);
  return std::move(*r.value);
}

/// The calibration as a JSON document (validated first: config_error when it is inconsistent).
[[nodiscard]] inline std::string to_json(const calibration& c) {
  c.validate();
  using detail::json;
  json j;
  j["format"] = format_name;
  j["version"] = format_version;
  j["normalization"] = memdecay::to_string(c.normalization);
  j["alpha"] = c.alpha;
  j["tau"] = c.tau;
  json regions = json::array();
  for (const auto& r : c.regions) {
    json e;
    e["name"] = r.name;
    e["base_priority"] = r.base_priority;
    e["decay_rate"] = r.decay_rate;
    e["half_life"] = r.decay_rate > 0.0 ? json(std::numbers::ln2 / r.decay_rate) : json(nullptr);
    e["fit"] = detail::fit_to_json(r.fit);
    json layers = json::array();
    for (const auto& l : r.layers) layers.push_back(detail::fit_to_json(l));
    e["layers"] = std::move(layers);
    regions.push_back(std::move(e));
  }
  j["regions"] = std::move(regions);
  json traces = json::array();
  for (const auto& t : c.source.traces)
    traces.push_back({{"path", t.path}, {"label", t.label}, {"episodes", t.episodes}, {"layers", t.layers}});
  j["provenance"] = {{"tool", c.source.tool},
                     {"created", c.source.created},
                     {"model", c.source.model ? json(*c.source.model) : json(nullptr)},
                     {"synthetic", c.source.synthetic},
                     {"traces", std::move(traces)}};
  const auto& o = c.estimator;
  j["estimator"] = {{"method", to_string(o.method)},
                    {"min_samples", o.min_samples},
                    {"min_episodes", o.min_episodes},
                    {"max_ci_ratio", o.max_ci_ratio},
                    {"refresh_ratio", o.refresh_ratio},
                    {"sink_positions", o.sink_positions},
                    {"recent_positions", o.recent_positions},
                    {"min_half_life", o.min_half_life},
                    {"max_half_life", o.max_half_life},
                    {"passes", o.passes},
                    {"jackknife_groups", o.jackknife_groups},
                    {"max_age_bins", o.max_age_bins},
                    {"per_layer", o.per_layer}};
  if (o.method != estimator_method::excess_decay) {
    j["estimator"]["refresh_threshold"] = o.refresh_threshold;
    j["estimator"]["rearm_threshold"] = o.rearm_threshold;
    j["estimator"]["min_intervals"] = o.min_intervals;
  }
  return j.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

/// Reads a calibration file: input_error when it cannot be read, config_error (naming the path, the field and
/// the value) when it is malformed.
[[nodiscard]] inline calibration read_file(const std::filesystem::path& path) {
  std::FILE* fp = std::fopen(path.string().c_str(), "rb");
  if (!fp) memdecay::detail::raise_input("cannot open calibration '" + path.string() + "': " + std::strerror(errno));
  std::string text;
  char buffer[1 << 16];
  std::size_t n = 0;
  bool too_big = false;
  while ((n = std::fread(buffer, 1, sizeof buffer, fp)) > 0) {
    text.append(buffer, n);
    if (text.size() > max_file_bytes) {
      too_big = true;
      break;
    }
  }
  const bool failed = std::ferror(fp) != 0;
  std::fclose(fp);
  if (failed) memdecay::detail::raise_input("cannot read calibration '" + path.string() + "'");
  if (too_big)
    memdecay::detail::raise_config("calibration '" + path.string() + "': file is larger than " +
                                   memdecay::detail::to_text(max_file_bytes) + " bytes");
  return parse_or_throw(text, path.string());
}

/// Writes a calibration file (validated first: config_error, writing nothing, when it is inconsistent);
/// input_error when the file cannot be written.
inline void write_file(const std::filesystem::path& path, const calibration& c) {
  const std::string text = to_json(c);
  std::FILE* fp = std::fopen(path.string().c_str(), "wb");
  if (!fp) memdecay::detail::raise_input("cannot create calibration '" + path.string() + "': " + std::strerror(errno));
  const bool ok = std::fwrite(text.data(), 1, text.size(), fp) == text.size();
  if (std::fclose(fp) != 0 || !ok) memdecay::detail::raise_input("cannot write calibration '" + path.string() + "'");
}

}  // namespace memdecay::calibration

#endif  // MEMDECAY_CALIBRATION_FILE_HPP
