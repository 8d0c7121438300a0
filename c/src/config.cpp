// SPDX-License-Identifier: Apache-2.0
// memdecay_config: the C++ config behind setters by field name. Every setter edits a copy, validates it and only
// then replaces the config, so a rejected value changes nothing.
#include <cmath>
#include <string_view>

#ifdef MEMDECAY_C_HAS_CALIBRATION
#include <memdecay/calibration/file.hpp>
#endif

#include "handles.hpp"

namespace memdecay_c {
namespace {

// Applies edit to a copy of the config, validates it and keeps it.
template <class Edit>
memdecay_status edit(memdecay_config* c, Edit&& fn) {
  return guarded(c ? &c->error : nullptr, [&] {
    md::config next = require(c, "config")->config;
    fn(next);
    next.validate();
    c->config = std::move(next);
  });
}

std::size_t whole(std::string_view field, double value) {
  if (!(value >= 0) || value != std::floor(value) || value > 9007199254740992.0)
    throw md::config_error(std::string(field) + " = " + md::detail::to_text(value) +
                           " (must be a non-negative integer)");
  return static_cast<std::size_t>(value);
}

[[noreturn]] void unknown_field(std::string_view field, const std::string& known) {
  throw md::config_error("no config field '" + std::string(field) + "' (" + known + ")");
}

// The numeric fields, by name: how memdecay_config_get_number reads each and memdecay_config_set_number writes
// it (counts must be whole; ewma_half_life is unset by NaN).
struct number_field {
  const char* name;
  double (*get)(const md::config&);
  void (*set)(md::config&, double);
};
constexpr number_field number_fields[] = {
    {"alpha", [](const md::config& c) { return c.alpha; }, [](md::config& c, double v) { c.alpha = v; }},
    {"ewma_beta", [](const md::config& c) { return c.ewma_beta; }, [](md::config& c, double v) { c.ewma_beta = v; }},
    {"ewma_half_life", [](const md::config& c) { return c.ewma_half_life.value_or(std::nan("")); },
     [](md::config& c, double v) { c.ewma_half_life = std::isnan(v) ? std::nullopt : std::optional<double>(v); }},
    {"tau", [](const md::config& c) { return c.tau; }, [](md::config& c, double v) { c.tau = v; }},
    {"page_size", [](const md::config& c) { return static_cast<double>(c.page_size); },
     [](md::config& c, double v) { c.page_size = whole("page_size", v); }},
    {"protection.sink_pages", [](const md::config& c) { return static_cast<double>(c.protection.sink_pages); },
     [](md::config& c, double v) { c.protection.sink_pages = whole("protection.sink_pages", v); }},
    {"protection.recent_tokens", [](const md::config& c) { return static_cast<double>(c.protection.recent_tokens); },
     [](md::config& c, double v) { c.protection.recent_tokens = whole("protection.recent_tokens", v); }},
    {"protection.recent_fraction", [](const md::config& c) { return c.protection.recent_fraction; },
     [](md::config& c, double v) { c.protection.recent_fraction = v; }},
};

const number_field& number_field_named(std::string_view name) {
  for (const auto& f : number_fields)
    if (name == f.name) return f;
  std::string known;
  for (const auto& f : number_fields) known += (known.empty() ? "" : ", ") + std::string(f.name);
  unknown_field(name, known);
}

}  // namespace
}  // namespace memdecay_c

using namespace memdecay_c;

extern "C" {

memdecay_status memdecay_config_create(memdecay_config** out) {
  return guarded(nullptr, [&] { emit(out); });
}

memdecay_status memdecay_config_copy(const memdecay_config* config, memdecay_config** out) {
  return guarded(nullptr, [&] { emit(out, require(config, "config")->config, std::string()); });
}

void memdecay_config_destroy(memdecay_config* config) { delete config; }

const char* memdecay_config_last_error(const memdecay_config* config) { return config ? config->error.c_str() : ""; }

memdecay_status memdecay_config_set_number(memdecay_config* config, const char* field, double value) {
  return edit(config, [&](md::config& c) { number_field_named(require(field, "field")).set(c, value); });
}

memdecay_status memdecay_config_get_number(const memdecay_config* config, const char* field, double* value) {
  return guarded(nullptr, [&] {
    const md::config& c = require(config, "config")->config;
    const std::string_view name = require(field, "field");
    double& v = *require(value, "value");
    v = number_field_named(name).get(c);
  });
}

memdecay_status memdecay_config_set_text(memdecay_config* config, const char* field, const char* value) {
  return edit(config, [&](md::config& c) {
    const std::string_view f = require(field, "field");
    const std::string v = require(value, "value");
    if (f != "normalization") unknown_field(f, "normalization");
    for (auto mode : {md::attention_normalization::none, md::attention_normalization::uniform,
                      md::attention_normalization::lifetime, md::attention_normalization::zscore})
      if (v == md::to_string(mode)) {
        c.normalization = mode;
        return;
      }
    throw md::config_error("normalization = '" + v + "' (must be none, uniform, lifetime or zscore)");
  });
}

memdecay_status memdecay_config_set_budget(memdecay_config* config, memdecay_budget_unit unit, double high,
                                           double low) {
  return edit(config, [&](md::config& c) {
    const std::optional<double> lo = std::isnan(low) ? std::nullopt : std::optional<double>(low);
    switch (unit) {
      case MEMDECAY_BUDGET_UNLIMITED: c.budget = md::budget_config{}; return;
      case MEMDECAY_BUDGET_TOKENS: c.budget = md::budget_config::tokens(high, lo); return;
      case MEMDECAY_BUDGET_PAGES: c.budget = md::budget_config::pages(high, lo); return;
      case MEMDECAY_BUDGET_RATIO: c.budget = md::budget_config::ratio(high, lo); return;
      case MEMDECAY_BUDGET_MAX_ENUM: break;
    }
    throw md::config_error("budget unit = " + std::to_string(static_cast<int>(unit)) +
                           " (must be MEMDECAY_BUDGET_UNLIMITED, _TOKENS, _PAGES or _RATIO)");
  });
}

memdecay_status memdecay_config_set_regions(memdecay_config* config, const memdecay_region* regions, size_t count) {
  return edit(config, [&](md::config& c) {
    std::vector<md::region_params> params;
    for (const memdecay_region& r : array_of(regions, count, "regions")) {
      if (!r.name) raise(MEMDECAY_INVALID_ARGUMENT, "regions[" + std::to_string(params.size()) + "].name is NULL");
      params.push_back({r.name, r.base_priority, r.decay_rate, r.pinned != 0});
    }
    c.regions = md::region_table(std::move(params));
  });
}

memdecay_status memdecay_config_override_region(memdecay_config* config, const char* region,
                                                const memdecay_region_override* change) {
  return edit(config, [&](md::config& c) {
    const memdecay_region_override& o = *require(change, "change");
    md::region_override r{require(region, "region")};
    if (o.has_base_priority) r.base_priority = o.base_priority;
    if (o.has_decay_rate) r.decay_rate = o.decay_rate;
    if (o.has_half_life) r.half_life = o.half_life;
    if (o.has_pinned) r.pinned = o.pinned != 0;
    c.region_overrides.push_back(std::move(r));
  });
}

memdecay_status memdecay_config_apply_calibration(memdecay_config* config, const char* path) {
#ifdef MEMDECAY_C_HAS_CALIBRATION
  return edit(config, [&](md::config& c) { md::calibration::read_file(require(path, "path")).apply_to(c); });
#else
  return guarded(config ? &config->error : nullptr,
                 [&] { throw md::config_error("calibration files: this memdecay_c was built without nlohmann-json"); });
#endif
}

memdecay_status memdecay_config_region_id(const memdecay_config* config, const char* name, uint8_t* id) {
  return guarded(nullptr, [&] {
    const auto table = require(config, "config")->config.effective_regions();
    *require(id, "id") = table.id_of(require(name, "name"));
  });
}

}  // extern "C"
