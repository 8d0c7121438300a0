// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: the snapshot reader (memdecay::snapshot::load) on arbitrary bytes, into a sequence of every
// policy (docs/snapshot-format.md, docs/reliability.md). For each target, load() must never crash, leak or hit UB
// (ASan + UBSan) and may only throw input_error; then:
//   - on failure: the target is unchanged (digest and generation) and the message names an offset;
//   - on success: saving the target gives back the input (the format is canonical), apart from the writer's
//     library version and so the header checksum; the loaded sequence scores without NaN, selects, and takes
//     further appends, observations and commits.
// Any difference aborts. Each input is tried twice: as it is, and with its length and checksums fixed up, so
// that mutations reach the payload's field checks instead of stopping at the CRC.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "memdecay/io/snapshot.hpp"
#include "snapshot_common.hpp"

namespace {

[[noreturn]] void fail(const char* what, const std::string& detail = {}) {
  std::fprintf(stderr, "snapshot_fuzzer: %s %s\n", what, detail.c_str());
  std::abort();
}

template <class Seq>
void try_load(std::span<const std::byte> bytes) {
  namespace md = memdecay;
  Seq target(snapshot_fuzz::fuzz_config());
  snapshot_fuzz::add_history(target, 99, 3);
  const auto digest = target.digest();
  const auto generation = target.generation();
  try {
    md::snapshot::load(target, bytes);
  } catch (const md::input_error& e) {
    if (target.digest() != digest || target.generation() != generation) fail("a rejected load changed the target");
    if (std::string(e.what()).find("offset") == std::string::npos) fail("no offset in:", e.what());
    return;
  } catch (const std::exception& e) {
    fail("load threw something other than input_error:", e.what());
  }
  const auto again = md::snapshot::save(target);
  // An older snapshot saves again as the current version (the migrations of docs/snapshot-format.md): the same
  // bytes, then a 0 byte for each section it lacks (version 1: digests and host tier; version 2: host tier), and in
  // a version-3 host tier the 8 zero bytes of displace_lowest before the page count; with its own version, payload
  // length and checksums.
  const auto version = static_cast<unsigned>(bytes[8]);
  std::vector<std::byte> expected(bytes.begin(), bytes.end());
  const std::size_t missing = version == 1 ? 2 : version == 2 ? 1 : 0;
  expected.insert(expected.end(), missing, std::byte{0});
  if (version == 3 && target.has_host_tier()) {  // the section ends: pages (8), flags (p), recall steps (4p)
    const std::size_t at = expected.size() - 5 * target.num_pages() - 8;
    expected.insert(expected.begin() + static_cast<std::ptrdiff_t>(at), 8, std::byte{0});
  }
  if (again.size() != expected.size()) fail("save(load(bytes)) has another size");
  const bool migrated = version != md::snapshot::format_version;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const bool writer_owned = (i >= 12 && i < 16) || (i >= 44 && i < 48);  // library version, header checksum
    const bool rewritten = migrated && ((i >= 8 && i < 12) || (i >= 32 && i < 44));  // version, length, CRC
    if (!writer_owned && !rewritten && again[i] != expected[i])
      fail("save(load(bytes)) differs at byte", std::to_string(i));
  }
  try {
    for (float s : target.page_scores())
      if (std::isnan(s)) fail("a loaded sequence scores NaN");
    (void)target.select(2);
    target.append(md::regions::user, 5);
    // A snapshot may hold the last step there is: then the clock cannot move on, and advance_to(now + 1) would
    // wrap to 0 (rightly an input_error), so only a clock with room advances.
    if (target.now() < std::numeric_limits<md::step_t>::max()) target.advance_to(target.now() + 1);
    target.observe_tokens(std::vector<float>(target.device_len(), 1.0f / static_cast<float>(target.device_len())));
    target.commit(target.select_for_budget());
  } catch (const std::exception& e) {
    fail("a loaded sequence fails a valid call:", e.what());
  }
}

template <class... Seq>
void try_all(std::span<const std::byte> bytes, std::tuple<Seq...>*) {
  (try_load<Seq>(bytes), ...);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace md = memdecay;
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try_all(bytes, static_cast<snapshot_fuzz::all_sequences*>(nullptr));
  const std::size_t header = md::snapshot::header_bytes;
  if (size >= header && size >= header + static_cast<std::size_t>(data[17])) {
    std::vector<std::byte> fixed(bytes.begin(), bytes.end());
    md::detail::seal_snapshot(fixed);
    try_all(std::span<const std::byte>(fixed), static_cast<snapshot_fuzz::all_sequences*>(nullptr));
  }
  return 0;
}
