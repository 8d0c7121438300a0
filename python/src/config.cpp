// SPDX-License-Identifier: Apache-2.0
// Configuration: Config (keyword arguments, validated with the C++ messages), Budget, Protection, Region,
// RegionOverride and RegionTable, and the normalisation modes by name.
#include <memdecay/calibration/file.hpp>
#include <memdecay/core/config.hpp>
#include <memdecay/core/region.hpp>

#include "bindings.hpp"

namespace memdecay_python {

namespace md = memdecay;

namespace {

md::attention_normalization normalization_of(const py::handle& v) {
  if (py::isinstance<md::attention_normalization>(v)) return v.cast<md::attention_normalization>();
  const auto name = v.cast<std::string>();
  for (auto mode : {md::attention_normalization::none, md::attention_normalization::uniform,
                    md::attention_normalization::lifetime, md::attention_normalization::zscore})
    if (name == md::to_string(mode)) return mode;
  throw md::config_error("normalization = '" + name + "' (must be none, uniform, lifetime or zscore)");
}

std::string budget_repr(const md::budget_config& b) {
  const char* unit = b.unit == md::budget_unit::tokens  ? "tokens"
                     : b.unit == md::budget_unit::pages ? "pages"
                     : b.unit == md::budget_unit::ratio ? "ratio"
                                                        : "unlimited";
  if (b.unit == md::budget_unit::unlimited) return "Budget.unlimited()";
  return std::string("Budget.") + unit + "(" + md::detail::to_text(b.high) + ", " +
         md::detail::to_text(b.low.value_or(b.high)) + ")";
}

}  // namespace

void bind_config(py::module_& m) {
  py::enum_<md::attention_normalization>(m, "Normalization",
                                         "How attention mass is scaled before the EWMA and the refresh test.")
      .value("none", md::attention_normalization::none)
      .value("uniform", md::attention_normalization::uniform)
      .value("lifetime", md::attention_normalization::lifetime)
      .value("zscore", md::attention_normalization::zscore);

  py::class_<md::budget_config>(m, "Budget", "How much of a sequence may stay resident (watermarks high >= low).")
      .def_static("unlimited", [] { return md::budget_config{}; })
      .def_static("tokens", &md::budget_config::tokens, py::arg("high"), py::arg("low") = py::none())
      .def_static("pages", &md::budget_config::pages, py::arg("high"), py::arg("low") = py::none())
      .def_static("ratio", &md::budget_config::ratio, py::arg("high"), py::arg("low") = py::none())
      .def_property_readonly("unit",
                             [](const md::budget_config& b) {
                               switch (b.unit) {
                                 case md::budget_unit::tokens: return "tokens";
                                 case md::budget_unit::pages: return "pages";
                                 case md::budget_unit::ratio: return "ratio";
                                 default: return "unlimited";
                               }
                             })
      .def_readonly("high", &md::budget_config::high)
      .def_property_readonly("low", [](const md::budget_config& b) { return b.low.value_or(b.high); })
      .def("__repr__", &budget_repr);

  py::class_<md::protection_config>(m, "Protection", "Pages never evicted regardless of score.")
      .def(py::init([](std::size_t sink_pages, std::size_t recent_tokens, double recent_fraction) {
             return md::protection_config{sink_pages, recent_tokens, recent_fraction};
           }),
           py::kw_only(), py::arg("sink_pages") = 0, py::arg("recent_tokens") = 0, py::arg("recent_fraction") = 0.0)
      .def_readwrite("sink_pages", &md::protection_config::sink_pages)
      .def_readwrite("recent_tokens", &md::protection_config::recent_tokens)
      .def_readwrite("recent_fraction", &md::protection_config::recent_fraction);

  py::class_<md::region_params>(m, "Region", "One region of a region table: b_r, lambda_r and whether it is pinned.")
      .def(py::init([](std::string name, double base_priority, std::optional<double> decay_rate,
                       std::optional<double> half_life, bool pinned) {
             if (decay_rate && half_life)
               throw md::config_error("region '" + name + "': give decay_rate or half_life, not both");
             md::region_params p{std::move(name), base_priority, decay_rate.value_or(0.0), pinned};
             if (half_life) p.set_half_life(*half_life);
             return p;
           }),
           py::arg("name"), py::kw_only(), py::arg("base_priority") = 1.0, py::arg("decay_rate") = py::none(),
           py::arg("half_life") = py::none(), py::arg("pinned") = false)
      .def_readonly("name", &md::region_params::name)
      .def_readonly("base_priority", &md::region_params::base_priority)
      .def_readonly("decay_rate", &md::region_params::decay_rate)
      .def_readonly("pinned", &md::region_params::pinned)
      .def_property_readonly("half_life", &md::region_params::half_life)
      .def("__repr__", [](const md::region_params& p) {
        return "Region('" + p.name + "', base_priority=" + md::detail::to_text(p.base_priority) +
               ", decay_rate=" + md::detail::to_text(p.decay_rate) + ", pinned=" + (p.pinned ? "True" : "False") + ")";
      });

  py::class_<md::region_override>(m, "RegionOverride", "A per-region change by name, applied on top of the table.")
      .def(py::init([](std::string region, std::optional<double> base_priority, std::optional<double> decay_rate,
                       std::optional<double> half_life, std::optional<bool> pinned) {
             return md::region_override{std::move(region), base_priority, decay_rate, half_life, pinned};
           }),
           py::arg("region"), py::kw_only(), py::arg("base_priority") = py::none(), py::arg("decay_rate") = py::none(),
           py::arg("half_life") = py::none(), py::arg("pinned") = py::none())
      .def_readonly("region", &md::region_override::region)
      .def_readonly("base_priority", &md::region_override::base_priority)
      .def_readonly("decay_rate", &md::region_override::decay_rate)
      .def_readonly("half_life", &md::region_override::half_life)
      .def_readonly("pinned", &md::region_override::pinned);

  py::class_<md::region_table>(m, "RegionTable", "A region set: ids 0, 1, ... in order.")
      .def(py::init([](std::vector<md::region_params> regions) { return md::region_table(std::move(regions)); }),
           py::arg("regions"))
      .def_static("default", &md::default_region_table, "The paper's seven regions (system pinned).")
      .def("__len__", &md::region_table::size)
      .def("__getitem__", [](const md::region_table& t, const py::handle& r) { return t.at(region_of(r, t)); })
      .def("id_of", [](const md::region_table& t, const std::string& name) { return int{t.id_of(name)}; })
      .def_property_readonly("names",
                             [](const md::region_table& t) {
                               std::vector<std::string> out;
                               for (const auto& p : t.params()) out.push_back(p.name);
                               return out;
                             })
      .def("with_overrides", &md::region_table::with_overrides, py::arg("overrides"));

  py::class_<md::config>(m, "Config",
                         "The configuration of a sequence. Every keyword is validated when a sequence is built; "
                         "validate() checks it now (ConfigError naming the field).")
      .def(py::init([](double alpha, double ewma_beta, std::optional<double> ewma_half_life, double tau,
                       std::size_t page_size, const py::object& normalization, md::protection_config protection,
                       md::budget_config budget, std::optional<md::region_table> regions,
                       std::vector<md::region_override> region_overrides) {
             md::config c;
             c.alpha = alpha;
             c.ewma_beta = ewma_beta;
             c.ewma_half_life = ewma_half_life;
             c.tau = tau;
             c.page_size = page_size;
             c.normalization = normalization_of(normalization);
             c.protection = protection;
             c.budget = budget;
             if (regions) c.regions = std::move(*regions);
             c.region_overrides = std::move(region_overrides);
             c.validate();
             return c;
           }),
           py::kw_only(), py::arg("alpha") = 1.0, py::arg("ewma_beta") = 0.9, py::arg("ewma_half_life") = py::none(),
           py::arg("tau") = 0.01, py::arg("page_size") = 16, py::arg("normalization") = "none",
           py::arg("protection") = md::protection_config{}, py::arg("budget") = md::budget_config{},
           py::arg("regions") = py::none(), py::arg("region_overrides") = std::vector<md::region_override>{})
      .def_readonly("alpha", &md::config::alpha)
      .def_readonly("ewma_beta", &md::config::ewma_beta)
      .def_readonly("ewma_half_life", &md::config::ewma_half_life)
      .def_readonly("tau", &md::config::tau)
      .def_readonly("page_size", &md::config::page_size)
      .def_readonly("normalization", &md::config::normalization)
      .def_readonly("protection", &md::config::protection)
      .def_readonly("budget", &md::config::budget)
      .def_readonly("regions", &md::config::regions)
      .def_readonly("region_overrides", &md::config::region_overrides)
      .def("effective_regions", &md::config::effective_regions)
      .def("validate", &md::config::validate);

  m.def(
      "apply_calibration",
      [](md::config cfg, const std::string& path) {
        md::calibration::read_file(path).apply_to(cfg);
        return cfg;
      },
      py::arg("config"), py::arg("path"),
      "A copy of `config` with a calibration file (memdecay-calibrate's output) applied: its normalisation, alpha, "
      "tau and region overrides. ConfigError naming the JSON field on a bad file.");

  auto regions = m.def_submodule("regions", "The default region ids.");
  regions.attr("system") = int{md::regions::system};
  regions.attr("plan") = int{md::regions::plan};
  regions.attr("user") = int{md::regions::user};
  regions.attr("tool_in") = int{md::regions::tool_in};
  regions.attr("tool_out") = int{md::regions::tool_out};
  regions.attr("retrieval") = int{md::regions::retrieval};
  regions.attr("scratchpad") = int{md::regions::scratchpad};
}

}  // namespace memdecay_python
