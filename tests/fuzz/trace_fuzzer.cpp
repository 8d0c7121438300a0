// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: the trace reader (memdecay::trace::parse) on arbitrary bytes (docs/reliability.md).
//
// parse() must never crash, leak or hit UB (ASan + UBSan), never throw, and
//   - on failure: report an error whose byte offset lies within the input and whose message is not empty;
//   - on success: the file must pass check(), encode() must give back exactly the input bytes (the format is
//     canonical: every field is fixed-width, counts are exact and trailing bytes are rejected; a version-1 input
//     comes back as version 2, the one field that differs), and parsing that encoding must give an equal
//     trace_file. Any difference aborts.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "memdecay/io/trace.hpp"

namespace {
[[noreturn]] void fail(const char* what, const std::string& detail = {}) {
  std::fprintf(stderr, "trace_fuzzer: %s %s\n", what, detail.c_str());
  std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace tr = memdecay::trace;
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  tr::parse_result r;
  try {
    r = tr::parse(bytes);
  } catch (const std::exception& e) {
    fail("parse threw:", e.what());
  }
  if (r.file.has_value() == r.error.has_value()) fail("parse must set exactly one of file and error");
  if (!r.ok()) {
    if (r.error->offset > size) fail("error offset past the end of the input:", r.error->message);
    if (r.error->message.empty()) fail("empty error message");
    return 0;
  }
  const tr::trace_file& f = *r.file;
  if (auto e = tr::check(f)) fail("a parsed trace fails check():", e->message);
  std::vector<std::byte> again;
  try {
    again = tr::encode(f);
  } catch (const std::exception& e) {
    fail("encode of a parsed trace threw:", e.what());
  }
  // The writer writes version 2; a version-1 input (which holds no reference events) comes back with only its
  // version field changed.
  std::vector<std::byte> expected(bytes.begin(), bytes.end());
  if (expected.size() >= 12 && expected[8] == std::byte{1}) expected[8] = std::byte{2};
  if (again != expected) fail("encode(parse(bytes)) differs from bytes");
  const auto r2 = tr::parse(again);
  if (!r2.ok()) fail("the re-encoded trace does not parse:", r2.error->message);
  if (!(*r2.file == f)) fail("parse(encode(file)) != file");
  return 0;
}
