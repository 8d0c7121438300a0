// SPDX-License-Identifier: Apache-2.0
// io/snapshot.hpp and detail/crc32c.hpp: the checksum's published test vectors; a snapshot rejected for every
// single flipped bit, every truncation, another policy, config, parameter, page size, float type or format
// version, always with the field and the offset named and the target unchanged. (That a loaded sequence is
// bit-identical and decides as the saved one, for every policy, is in the conformance suite.)
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <memdecay/core/manager.hpp>
#include <memdecay/detail/crc32c.hpp>
#include <memdecay/io/snapshot.hpp>
#include <memdecay/policies/all.hpp>

namespace md = memdecay;

namespace {

std::vector<std::byte> bytes_of(const std::string& s) {
  std::vector<std::byte> out(s.size());
  std::memcpy(out.data(), s.data(), s.size());
  return out;
}

md::config small_config() {
  return md::config{.page_size = 4, .protection = {.recent_tokens = 4}, .budget = md::budget_config::tokens(24, 16)};
}

// A sequence with some history: evictions, refreshes, a clock that moved.
template <class Seq>
Seq with_history(std::uint64_t seed, const md::config& cfg = small_config()) {
  Seq seq(cfg);
  std::mt19937_64 rng(seed);
  for (md::step_t step = 1; step <= 12; ++step) {
    seq.append(static_cast<md::region_id>(rng() % 7), 1 + rng() % 6);
    seq.advance_to(step);
    std::vector<float> mass(seq.kv_len());
    for (auto& m : mass) m = static_cast<float>(rng() % 100) / (100.0f * static_cast<float>(mass.size()));
    seq.observe_tokens(mass);
    seq.commit(seq.select_for_budget());
  }
  return seq;
}

template <class Seq>
void expect_rejected(Seq& target, const std::vector<std::byte>& bytes, const std::string& needle) {
  const auto digest = target.digest();
  const auto generation = target.generation();
  try {
    md::snapshot::load(target, bytes);
    ADD_FAILURE() << "accepted; expected an input_error containing '" << needle << "'";
  } catch (const md::input_error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("offset"), std::string::npos) << "no offset named: " << e.what();
  }
  EXPECT_EQ(target.digest(), digest);
  EXPECT_EQ(target.generation(), generation);
}

}  // namespace

TEST(Crc32c, TheFastPathIsTheTableOnEveryLengthAndAlignment) {
  std::vector<std::byte> v(300);
  std::mt19937 rng(3);
  for (auto& b : v) b = static_cast<std::byte>(rng());
  for (std::size_t first = 0; first < 9; ++first)
    for (std::size_t n = 0; first + n <= v.size(); n += 1 + n / 8) {
      const auto part = std::span<const std::byte>(v).subspan(first, n);
      ASSERT_EQ(md::detail::crc32c(part), md::detail::crc32c_reference(part)) << first << " " << n;
    }
  static_assert(md::detail::crc32c_reference(std::span<const std::byte>{}) == 0);
}

TEST(Crc32c, PublishedTestVectors) {
  EXPECT_EQ(md::detail::crc32c_reference(bytes_of("123456789")), 0xE3069283u);
  EXPECT_EQ(md::detail::crc32c(bytes_of("123456789")), 0xE3069283u);
  EXPECT_EQ(md::detail::crc32c({}), 0u);
  // RFC 3720 appendix B.4.
  std::vector<std::byte> v(32, std::byte{0});
  EXPECT_EQ(md::detail::crc32c(v), 0x8A9136AAu);
  std::fill(v.begin(), v.end(), std::byte{0xFF});
  EXPECT_EQ(md::detail::crc32c(v), 0x62A8AB43u);
  for (std::size_t i = 0; i < 32; ++i) v[i] = static_cast<std::byte>(i);
  EXPECT_EQ(md::detail::crc32c(v), 0x46DD794Eu);
  for (std::size_t i = 0; i < 32; ++i) v[i] = static_cast<std::byte>(31 - i);
  EXPECT_EQ(md::detail::crc32c(v), 0x113FDB5Cu);
  // Extending is the checksum of the concatenation.
  const auto all = bytes_of("123456789");
  const auto head = std::span<const std::byte>(all).first(4), tail = std::span<const std::byte>(all).subspan(4);
  EXPECT_EQ(md::detail::crc32c_extend(md::detail::crc32c(head), tail), 0xE3069283u);
}

TEST(Snapshot, TheHeaderIsTheDocumentedOne) {
  const auto seq = with_history<md::sequence>(1);
  const auto b = md::snapshot::save(seq);
  ASSERT_GT(b.size(), md::snapshot::header_bytes);
  EXPECT_EQ(std::memcmp(b.data(), "MDSNAP\r\n", 8), 0);
  auto u32 = [&](std::size_t at) {
    std::uint32_t v = 0;
    for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<std::uint32_t>(b[at + static_cast<std::size_t>(i)]);
    return v;
  };
  EXPECT_EQ(u32(8), md::snapshot::format_version);
  EXPECT_EQ(static_cast<int>(b[16]), 4);  // float
  EXPECT_EQ(static_cast<int>(b[17]), 8);  // "memdecay"
  EXPECT_EQ(u32(20), 4u);                 // page size
  EXPECT_EQ(std::memcmp(b.data() + 48, "memdecay", 8), 0);
}

TEST(Snapshot, EverySingleFlippedBitIsRejectedAndChangesNothing) {
  auto saved = with_history<md::sequence>(2);
  auto target = with_history<md::sequence>(3);
  const auto bytes = md::snapshot::save(saved);
  ASSERT_NE(target.digest(), saved.digest());
  for (std::size_t i = 0; i < bytes.size(); ++i)
    for (int bit = 0; bit < 8; ++bit) {
      auto bad = bytes;
      bad[i] ^= static_cast<std::byte>(1u << bit);
      SCOPED_TRACE(testing::Message() << "byte " << i << " bit " << bit);
      expect_rejected(target, bad, "snapshot");
    }
  md::snapshot::load(target, bytes);  // and the original still loads
  EXPECT_EQ(target.digest(), saved.digest());
}

TEST(Snapshot, EveryTruncationIsRejected) {
  auto saved = with_history<md::policy_sequence<md::policies::h2o>>(4);
  auto target = with_history<md::policy_sequence<md::policies::h2o>>(5);
  const auto bytes = md::snapshot::save(saved);
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    SCOPED_TRACE(n);
    expect_rejected(target, std::vector<std::byte>(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n)),
                    n < md::snapshot::header_bytes ? "truncated" : "snapshot");
  }
  auto padded = bytes;
  padded.push_back(std::byte{0});
  expect_rejected(target, padded, "payload length");
}

TEST(Snapshot, AnotherPolicyConfigParameterPageSizeOrFloatTypeIsRejectedByName) {
  const auto bytes = md::snapshot::save(with_history<md::sequence>(6));
  auto h2o = with_history<md::policy_sequence<md::policies::h2o>>(6);
  expect_rejected(h2o, bytes, "policy at offset 48: 'memdecay', the target's is 'h2o'");
  md::config other = small_config();
  other.alpha = 0.5;
  md::sequence other_config(other);
  expect_rejected(other_config, bytes, "config digest at offset 24");
  other = small_config();
  other.page_size = 8;
  md::sequence other_pages(other);
  expect_rejected(other_pages, bytes, "page size at offset 20: 4, the target's is 8");
  md::basic_sequence<md::policies::memdecay, double> wide(small_config());
  expect_rejected(wide, bytes, "float type at offset 16: 32-bit, the target's is 64-bit");
  md::sequence max_pages(small_config(), {.aggregation = md::policies::memdecay<float>::page_aggregation::max});
  expect_rejected(max_pages, bytes, "policy parameter aggregation differs");
  // Parameters of a baseline.
  md::policy_sequence<md::policies::h2o> saved(small_config(), {.recent_tokens = 8});
  saved.append(md::regions::user, 10);
  md::policy_sequence<md::policies::h2o> other_params(small_config(), {.recent_tokens = 4});
  expect_rejected(other_params, md::snapshot::save(saved), "policy parameter recent_tokens differs");
}

TEST(Snapshot, AnotherFormatVersionIsRejectedByName) {
  auto target = with_history<md::sequence>(7);
  auto bytes = md::snapshot::save(with_history<md::sequence>(8));
  bytes[8] = std::byte{5};
  md::detail::seal_snapshot(bytes);  // a snapshot written by a later library: its checksums are its own
  expect_rejected(target, bytes, "format version at offset 8: 5; this library");
  bytes[8] = std::byte{0};
  md::detail::seal_snapshot(bytes);
  expect_rejected(target, bytes, "format version at offset 8: 0; this library");
}

TEST(Snapshot, AManagedTargetIsAUsageError) {
  md::manager mgr(md::manager_config{.page_size = 4});
  mgr.open(1, small_config());
  const auto bytes = md::snapshot::save(with_history<md::sequence>(9));
  EXPECT_THROW(md::snapshot::load(mgr.at(1), bytes), md::usage_error);
}

TEST(Snapshot, AnEmptySequenceAndAnEvictedOneRoundTrip) {
  md::sequence empty(small_config());
  md::sequence loaded(small_config());
  md::snapshot::load(loaded, md::snapshot::save(empty));
  EXPECT_EQ(loaded.digest(), empty.digest());
  auto evicted = with_history<md::sequence>(10);
  ASSERT_GT(evicted.evicted_tokens(), 0u);
  md::snapshot::load(loaded, md::snapshot::save(evicted));
  EXPECT_EQ(loaded.digest(), evicted.digest());
  EXPECT_EQ(loaded.prefix_cache_boundary(), evicted.prefix_cache_boundary());
  EXPECT_EQ(loaded.select(2).pages, evicted.select(2).pages);
}

TEST(Snapshot, AClockThatRebasedTheExpFreeWeightsRoundTrips) {
  // The exp-free clock rebases every floor(40 / max lambda_r) steps (866 with the default regions): its epoch is
  // then not 0, and the load must check the saved clock against the saved epoch (found by bench/snapshot_bench).
  md::sequence seq(small_config());
  for (md::step_t step = 1; step <= 3000; step += 97) {
    seq.append(md::regions::tool_out, 3);
    seq.advance_to(step);
    seq.observe_tokens(std::vector<float>(seq.kv_len(), 1.0f / static_cast<float>(seq.kv_len())));
    seq.commit(seq.select_for_budget());
    md::sequence loaded(small_config());
    md::snapshot::load(loaded, md::snapshot::save(seq));
    ASSERT_EQ(loaded.digest(), seq.digest()) << "step " << step;
    ASSERT_EQ(loaded.select(1).pages, seq.select(1).pages) << "step " << step;
  }
}

namespace {

// The offset of the value of the scalar field `name` (its head: length, name, kind, size, element kind, count).
std::size_t value_offset(const std::vector<std::byte>& b, const std::string& name) {
  const std::string needle = std::string(1, static_cast<char>(name.size())) + name;
  for (std::size_t i = md::snapshot::header_bytes; i + needle.size() < b.size(); ++i)
    if (std::memcmp(b.data() + i, needle.data(), needle.size()) == 0) return i + needle.size() + 3 + 8;
  ADD_FAILURE() << "no field " << name;
  return 0;
}

}  // namespace

// Found by the snapshot fuzzer: a crafted snapshot (valid checksums) whose bool is 2 loaded as true and saved back
// as 1, so the format was not canonical; and a clock outside its span was rejected without an offset.
TEST(Snapshot, CraftedFieldsWithValidChecksumsAreRejectedByName) {
  const auto saved = with_history<md::sequence>(11);
  auto target = with_history<md::sequence>(12);
  auto bytes = md::snapshot::save(saved);
  auto bad = bytes;
  bad[value_offset(bad, "expfree")] = std::byte{2};
  md::detail::seal_snapshot(bad);
  expect_rejected(target, bad, "snapshot expfree at offset");
  bad = bytes;
  const std::size_t now_at = value_offset(bad, "clock_now");
  bad[now_at + 3] = std::byte{0x40};  // now far past the epoch
  md::detail::seal_snapshot(bad);
  expect_rejected(target, bad, "snapshot clock_now at offset");
  bad = bytes;
  const std::size_t ewma_at = value_offset(bad, "ewma");  // the first EWMA: a NaN
  const std::uint32_t nan = 0x7FC00000u;
  std::memcpy(bad.data() + ewma_at, &nan, 4);
  md::detail::seal_snapshot(bad);
  expect_rejected(target, bad, "snapshot ewma at offset");
}
