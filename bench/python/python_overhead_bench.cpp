// SPDX-License-Identifier: Apache-2.0
// What a Python engine pays per decode step on top of the C++ API: the same calls (advance_to + observe_tokens,
// and select(32) from cached scores) made through the C++ API and through the memdecay Python package, in one
// process and one run, on the same labels and attention. The Python rows call a Python function that makes the
// calls, as an engine's scheduler written in Python would: the difference per row is the binding's overhead
// (argument conversion, the array checks, releasing the GIL, the returned objects) plus Python's own call.
//
//   memdecay_python_bench --benchmark_filter='^step/' --benchmark_repetitions=3
//
//   step/cxx/observe/<n>      C++: seq.advance_to(s); seq.observe_tokens(mass)
//   step/python/observe/<n>   Python: seq.advance_to(s); seq.observe_tokens(mass)  (mass: a float32 NumPy array)
//   step/cxx/select32/<n>     C++: seq.select(32)
//   step/python/select32/<n>  Python: seq.select(32)                              (returns a memdecay.Plan)
// n = resident tokens, pages of 16, MemDecay with uniform normalisation (as memdecay_bench's library/ rows).
#include <benchmark/benchmark.h>
#include <pybind11/embed.h>
#include <pybind11/numpy.h>

#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include <memdecay/core/sequence.hpp>

#ifndef MEMDECAY_PYTHON_DIR
#error "the build defines MEMDECAY_PYTHON_DIR (where `import memdecay` finds the built package)"
#endif

namespace py = pybind11;
namespace md = memdecay;

namespace {

constexpr std::size_t kPage = 16;

struct workload {
  std::vector<md::region_id> labels;
  std::vector<float> mass;
};

const workload& data(std::size_t n) {
  static std::map<std::size_t, workload> cache;
  auto& w = cache[n];
  if (w.labels.empty()) {
    std::mt19937 rng(42);
    w.labels.resize(n);
    w.mass.resize(n);
    float sum = 0;
    for (std::size_t i = 0; i < n; ++i) {
      w.labels[i] = static_cast<md::region_id>(1 + rng() % 6);  // unpinned regions: every page is a candidate
      sum += w.mass[i] = std::uniform_real_distribution<float>(0, 1)(rng);
    }
    for (auto& m : w.mass) m /= sum;
  }
  return w;
}

md::config bench_config() {
  return md::config{.page_size = kPage, .normalization = md::attention_normalization::uniform};
}

// The Python side: one Sequence per size, built and driven by Python code.
struct python_side {
  py::object seq, mass, observe, select;
  md::step_t step = 0;
};

python_side& python_for(std::size_t n) {
  static std::map<std::size_t, python_side> cache;
  auto& p = cache[n];
  if (!p.seq) {
    const auto& w = data(n);
    py::module_ memdecay = py::module_::import("memdecay");
    py::module_ np = py::module_::import("numpy");
    p.seq = memdecay.attr("Sequence")(
        memdecay.attr("Config")(py::arg("page_size") = kPage, py::arg("normalization") = "uniform"));
    p.seq.attr("append_tokens")(py::array_t<std::uint8_t>(static_cast<py::ssize_t>(n), w.labels.data()));
    p.mass = py::array_t<float>(static_cast<py::ssize_t>(n), w.mass.data());
    py::dict scope;
    py::exec(R"(
def observe(seq, mass, step):
    seq.advance_to(step)
    return seq.observe_tokens(mass)

def select(seq):
    return seq.select(32)
)",
             scope);
    p.observe = scope["observe"];
    p.select = scope["select"];
    p.observe(p.seq, p.mass, ++p.step);
  }
  return p;
}

void finish(benchmark::State& st, std::size_t n) {
  st.SetItemsProcessed(st.iterations() * static_cast<std::int64_t>(n));
}

void cxx_observe(benchmark::State& st) {
  const auto n = static_cast<std::size_t>(st.range(0));
  const auto& w = data(n);
  md::sequence seq(bench_config());
  seq.append_tokens(w.labels);
  md::step_t step = 0;
  for (auto _ : st) {
    seq.advance_to(++step);
    benchmark::DoNotOptimize(seq.observe_tokens(std::span<const float>(w.mass)));
  }
  finish(st, n);
}

void python_observe(benchmark::State& st) {
  const auto n = static_cast<std::size_t>(st.range(0));
  auto& p = python_for(n);
  for (auto _ : st) benchmark::DoNotOptimize(p.observe(p.seq, p.mass, ++p.step).ptr());
  finish(st, n);
}

void cxx_select(benchmark::State& st) {
  const auto n = static_cast<std::size_t>(st.range(0));
  const auto& w = data(n);
  md::sequence seq(bench_config());
  seq.append_tokens(w.labels);
  seq.advance_to(1);
  seq.observe_tokens(std::span<const float>(w.mass));
  for (auto _ : st) {
    auto plan = seq.select(32);
    benchmark::DoNotOptimize(plan.pages.data());
  }
  finish(st, n);
}

void python_select(benchmark::State& st) {
  const auto n = static_cast<std::size_t>(st.range(0));
  auto& p = python_for(n);
  for (auto _ : st) benchmark::DoNotOptimize(p.select(p.seq).ptr());
  finish(st, n);
}

}  // namespace

int main(int argc, char** argv) {
  py::scoped_interpreter interpreter;
  py::module_::import("sys").attr("path").attr("insert")(0, MEMDECAY_PYTHON_DIR);
  for (std::int64_t n : {4096, 65536}) {
    benchmark::RegisterBenchmark("step/cxx/observe", cxx_observe)->Arg(n)->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark("step/python/observe", python_observe)->Arg(n)->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark("step/cxx/select32", cxx_select)->Arg(n)->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark("step/python/select32", python_select)->Arg(n)->Unit(benchmark::kMicrosecond);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
