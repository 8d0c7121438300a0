// SPDX-License-Identifier: Apache-2.0
// What the API fuzzers share: the input reader, the failure report with the calls that led to it, the call wrapper
// that classifies errors by tier (checking each tier's message prefix), and the conversion of the model's config
// into the library's.
#ifndef MEMDECAY_FUZZ_COMMON_HPP
#define MEMDECAY_FUZZ_COMMON_HPP

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "memdecay/core/config.hpp"
#include "memdecay/detail/error.hpp"
#include "memdecay/core/region.hpp"
#include "model.hpp"

namespace memdecay_fuzz {

// ------------------------------------------------------------------------------------------------------------------
// Input decoding.
class reader {
 public:
  reader(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  bool done() const { return pos_ >= size_; }
  std::uint8_t u8() { return pos_ < size_ ? data_[pos_++] : 0; }
  std::uint16_t u16() { return static_cast<std::uint16_t>(u8() | (u8() << 8)); }
  std::uint32_t u32() { return static_cast<std::uint32_t>(u16()) | (static_cast<std::uint32_t>(u16()) << 16); }
  bool flip(unsigned one_in) { return u8() % one_in == 0; }
  template <class T, std::size_t N>
  T pick(const T (&values)[N]) {
    return values[u8() % N];
  }
  template <class T>
  T pick(std::span<const T> values) {
    return values[u8() % values.size()];
  }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

constexpr double nan_d = std::numeric_limits<double>::quiet_NaN();
constexpr double inf_d = std::numeric_limits<double>::infinity();

// The trace of the current input, printed when a check fails.
inline std::string g_trace;
inline void trace(const std::string& line) {
  if (g_trace.size() < (1u << 16)) g_trace += line + "\n";
}

[[noreturn]] inline void fail(const std::string& what) {
  std::fprintf(stderr, "memdecay fuzzer: CHECK FAILED: %s\n--- calls of this input ---\n%s", what.c_str(),
               g_trace.c_str());
  std::abort();
}
#define FUZZ_CHECK(cond, msg)                                                                          \
  do {                                                                                                 \
    if (!(cond)) fail(std::string(#cond " -- ") + (msg) + " (line " + std::to_string(__LINE__) + ")"); \
  } while (0)

/// Runs `call`, returns which error tier it raised (and checks the message prefix of that tier).
template <class Call>
outcome run_call(Call&& call) {
  try {
    call();
    return outcome::ok;
  } catch (const memdecay::config_error& e) {
    FUZZ_CHECK(std::strncmp(e.what(), "invalid config: ", 16) == 0, e.what());
    return outcome::config_error;
  } catch (const memdecay::input_error& e) {
    FUZZ_CHECK(std::strncmp(e.what(), "invalid input: ", 15) == 0, e.what());
    return outcome::input_error;
  } catch (const memdecay::usage_error& e) {
    FUZZ_CHECK(std::strncmp(e.what(), "invalid use: ", 13) == 0, e.what());
    return outcome::usage_error;
  } catch (const std::exception& e) {
    fail(std::string("unexpected exception type: ") + e.what());
  }
}

inline void expect(outcome got, outcome want, const std::string& call) {
  trace(call + " -> " + name(got));
  if (got != want) fail(call + ": memdecay says " + name(got) + ", the model says " + name(want));
}

inline std::string describe(const model_config& c) {
  auto num = [](double v) { return memdecay::detail::to_text(v); };
  std::string s = "config: alpha " + num(c.alpha) + " beta " + num(c.beta) +
                  (c.half_life ? " half_life " + num(*c.half_life) : std::string()) + " tau " + num(c.tau) +
                  " page_size " + std::to_string(c.page_size) + " normalization " + std::to_string(c.normalization) +
                  " sink " + std::to_string(c.sink_pages) + " recent " + std::to_string(c.recent_tokens) +
                  " budget unit " + std::to_string(static_cast<int>(c.unit)) + " high " + num(c.high) +
                  (c.low ? " low " + num(*c.low) : std::string()) + "\n  regions:";
  for (const auto& r : c.regions)
    s += " [" + r.name + " b " + num(r.base) + " l " + num(r.rate) + (r.pinned ? " pinned" : "") + "]";
  for (const auto& o : c.overrides)
    s += "\n  override " + o.region + (o.base ? " b " + num(*o.base) : std::string()) +
         (o.rate ? " l " + num(*o.rate) : std::string()) + (o.half_life ? " h " + num(*o.half_life) : std::string()) +
         (o.pinned ? (*o.pinned ? " pin" : " unpin") : std::string());
  return s;
}

inline memdecay::config to_library(const model_config& c) {
  memdecay::config cfg;
  cfg.alpha = c.alpha;
  cfg.ewma_beta = c.beta;
  cfg.ewma_half_life = c.half_life;
  cfg.tau = c.tau;
  cfg.page_size = c.page_size;
  cfg.normalization = static_cast<memdecay::attention_normalization>(c.normalization);
  cfg.protection = {.sink_pages = c.sink_pages, .recent_tokens = c.recent_tokens};
  cfg.budget = {static_cast<memdecay::budget_unit>(c.unit), c.high, c.low};
  std::vector<memdecay::region_params> params;
  for (const auto& r : c.regions) params.push_back({r.name, r.base, r.rate, r.pinned});
  // A table with a bad region is rejected by region_table's own constructor, before the config exists: both are
  // config_error, so the whole construction is one call for the fuzzer.
  cfg.regions = memdecay::region_table(std::move(params));
  for (const auto& o : c.overrides)
    cfg.region_overrides.push_back({.region = o.region,
                                    .base_priority = o.base,
                                    .decay_rate = o.rate,
                                    .half_life = o.half_life,
                                    .pinned = o.pinned});
  return cfg;
}
/// The documented accuracy of the scorer against the scalar formula: 1e-5 * (1 + |ref|) for float, 1e-12 for
/// double (simd/score_kernel.hpp, tests/simd/simd_score_kernel_test.cpp).
template <class Float>
Float score_tolerance(Float ref) {
  const Float rel = std::is_same_v<Float, float> ? Float(1e-5) : Float(1e-12);
  return rel * (Float{1} + std::fabs(ref));
}
/// A library page score against the model's. A page score sums its tokens before dividing: near the type's maximum
/// the sum overflows to +inf in one summation order and not in another. Both are fine (the order stays total, ties
/// by page); NaN never is.
template <class Float>
bool scores_close(Float got, Float ref) {
  const Float near_max = std::numeric_limits<Float>::max() / Float(1024);
  if (std::isinf(got) || std::isinf(ref)) return got == ref || (got > near_max && ref > near_max);
  return std::fabs(got - ref) <= score_tolerance(ref);
}

}  // namespace memdecay_fuzz

#endif  // MEMDECAY_FUZZ_COMMON_HPP
