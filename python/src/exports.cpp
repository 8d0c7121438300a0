// SPDX-License-Identifier: Apache-2.0
// Exports: llama.cpp position ranges (llama_memory_seq_rm) and TensorRT-LLM token-range retention entries
// (KvCacheRetentionConfig), as module functions over a Sequence or a config and its region spans.
#include "common/sequence_handle.hpp"

#include "bindings.hpp"

namespace memdecay_python {

namespace {

std::vector<std::pair<std::int32_t, std::int32_t>> pairs(const std::vector<md::llama_position_range>& v) {
  std::vector<std::pair<std::int32_t, std::int32_t>> out;
  for (const auto& r : v) out.emplace_back(r.p0, r.p1);
  return out;
}

py::list retention_list(const std::vector<md::token_range_retention>& v) {
  py::list out;
  for (const auto& e : v)
    out.append(
        py::make_tuple(e.token_start, e.token_end, e.priority, e.duration_ms ? py::cast(*e.duration_ms) : py::none()));
  return out;
}

}  // namespace

void bind_exports(py::module_& m) {
  m.def(
      "llama_position_ranges",
      [](const sequence_handle& s, const plan_type& plan) { return pairs(s.llama_position_ranges(plan)); },
      py::arg("sequence"), py::arg("plan"),
      "The plan's pages as merged [p0, p1) llama.cpp position ranges for llama_memory_seq_rm (UsageError for a "
      "plan commit would reject). Changes nothing; commit the plan after removing them.");
  m.def(
      "llama_evicted_ranges", [](const sequence_handle& s) { return pairs(s.llama_evicted_ranges()); },
      py::arg("sequence"), "Every position the sequence has evicted so far, as merged ranges.");
  m.def(
      "tensorrt_llm_retention",
      [](const sequence_handle& s, double milliseconds_per_step) {
        return retention_list(s.tensorrt_llm_retention({.milliseconds_per_step = milliseconds_per_step}));
      },
      py::arg("sequence"), py::arg("milliseconds_per_step") = 0.0,
      "TensorRT-LLM retention entries (token_start, token_end, priority 0..100, duration_ms or None) for the "
      "sequence's resident tokens, by its effective region table.");
  m.def(
      "tensorrt_llm_retention_for_prompt",
      [](const md::config& cfg, const std::vector<std::pair<py::object, std::size_t>>& spans,
         double milliseconds_per_step) {
        const auto regions = cfg.effective_regions();
        std::vector<md::region_span> s;
        for (const auto& [region, count] : spans) s.push_back({region_of(region, regions), count});
        return retention_list(md::tensorrt_llm_retention(cfg, s, {.milliseconds_per_step = milliseconds_per_step}));
      },
      py::arg("config"), py::arg("spans"), py::arg("milliseconds_per_step") = 0.0,
      "Retention entries for a prompt given as (region, tokens) spans, by the config's effective regions.");
}

}  // namespace memdecay_python
