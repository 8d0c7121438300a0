// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: the calibration-file loader (memdecay::calibration::parse) on arbitrary bytes
// (docs/reliability.md).
//
// parse() must never crash, leak or hit UB (ASan + UBSan) and never throw, and
//   - on failure: report a non-empty error;
//   - on success: the calibration must pass check(), to_json() must not throw, parsing to_json()'s text must give
//     an equal calibration, and writing that one again must give the same text (the writer is a fixed point).
// Any difference aborts.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "memdecay/calibration/file.hpp"

namespace {
[[noreturn]] void fail(const char* what, const std::string& detail = {}) {
  std::fprintf(stderr, "calibration_fuzzer: %s %s\n", what, detail.c_str());
  std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace cal = memdecay::calibration;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  cal::parse_result r;
  try {
    r = cal::parse(text);
  } catch (const std::exception& e) {
    fail("parse threw:", e.what());
  }
  if (r.value.has_value() == r.error.has_value()) fail("parse must set exactly one of value and error");
  if (!r.ok()) {
    if (r.error->empty()) fail("empty error message");
    return 0;
  }
  const cal::calibration& c = *r.value;
  if (auto e = c.check()) fail("a parsed calibration fails check():", *e);
  std::string json;
  try {
    json = cal::to_json(c);
  } catch (const std::exception& e) {
    fail("to_json of a parsed calibration threw:", e.what());
  }
  const auto r2 = cal::parse(json);
  if (!r2.ok()) fail("to_json's text does not parse:", *r2.error + "\n" + json);
  if (!(*r2.value == c)) fail("parse(to_json(c)) != c:", json);
  if (cal::to_json(*r2.value) != json) fail("to_json is not a fixed point:", json);
  return 0;
}
