// digests/page_digests.hpp, digests/query_signal.hpp and the sequence's digest API: layout validation, storage and
// rounding, errors that change nothing, digests leaving with their pages, the attention-free observation.
#include <gtest/gtest.h>

#include <algorithm>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include <memdecay/core/manager.hpp>
#include <memdecay/core/sequence.hpp>
#include <memdecay/io/manager_snapshot.hpp>
#include <memdecay/io/snapshot.hpp>
#include <memdecay/page_tables/block_pool.hpp>

namespace {

using namespace memdecay;

digest_layout small_layout(digest_storage storage = digest_storage::f32, digest_kind kind = digest_kind::min_max) {
  return {.kv_heads = 2, .head_dim = 4, .query_heads = 4, .kind = kind, .storage = storage};
}

std::vector<float> iota_values(std::size_t n, float first, float step = 1.0f) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = first + step * static_cast<float>(i);
  return v;
}

TEST(DigestLayout, RejectsEveryInvalidFieldByName) {
  auto expect_config = [](digest_layout l, const char* field) {
    try {
      l.validate();
      FAIL() << "accepted " << field;
    } catch (const config_error& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  expect_config({.kv_heads = 0, .head_dim = 4}, "kv_heads");
  expect_config({.kv_heads = 2, .head_dim = 0}, "head_dim");
  expect_config({.kv_heads = 2, .head_dim = 4, .query_heads = 3}, "query_heads");
  expect_config({.kv_heads = 2, .head_dim = 4, .scale = -1}, "scale");
  expect_config({.kv_heads = 2, .head_dim = 4, .scale = std::numeric_limits<double>::quiet_NaN()}, "scale");
  expect_config({.kv_heads = 2, .head_dim = 4, .scale = 1e300}, "scale");
  expect_config({.kv_heads = 2, .head_dim = 4, .kind = static_cast<digest_kind>(7)}, "kind");
  expect_config({.kv_heads = 2, .head_dim = 4, .storage = static_cast<digest_storage>(9)}, "storage");
  EXPECT_NO_THROW(small_layout().validate());
}

TEST(DigestLayout, BytesPerPageAreTheValuesAndThePresenceByte) {
  const digest_layout quest{.kv_heads = 8, .head_dim = 128, .query_heads = 32, .storage = digest_storage::f16};
  EXPECT_EQ(quest.bytes_per_page(), 8u * 2 * 128 * 2 + 1);
  const digest_layout mean{.kv_heads = 8, .head_dim = 128, .kind = digest_kind::mean_key};
  EXPECT_EQ(mean.bytes_per_page(), 8u * 128 * 4 + 1);
  EXPECT_EQ(quest.query_size(), 32u * 128);
  EXPECT_DOUBLE_EQ(quest.effective_scale(), 1.0 / std::sqrt(128.0));
}

TEST(PageDigests, BadDigestsAreRejectedByNameAndChangeNothing) {
  page_digests d(small_layout());
  d.resize(3);
  d.set_min_max(1, iota_values(8, 0), iota_values(8, 1));
  const auto before = d.digest();
  auto expect_input = [&](auto&& call, const char* needle) {
    try {
      call();
      FAIL() << "accepted: " << needle;
    } catch (const input_error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_EQ(d.digest(), before);
  };
  expect_input([&] { d.set_min_max(0, iota_values(7, 0), iota_values(8, 1)); }, "lo has 7");
  expect_input([&] { d.set_min_max(0, iota_values(8, 0), iota_values(9, 1)); }, "hi has 9");
  expect_input([&] { d.set_min_max(3, iota_values(8, 0), iota_values(8, 1)); }, "page 3 does not exist");
  auto nan = iota_values(8, 0);
  nan[5] = std::numeric_limits<float>::quiet_NaN();
  expect_input([&] { d.set_min_max(0, nan, iota_values(8, 10)); }, "lo[5]");
  auto swapped_hi = iota_values(8, 1);
  swapped_hi[6] = -100.0f;
  expect_input([&] { d.set_min_max(0, iota_values(8, 0), swapped_hi); }, "head 1, channel 2");
  expect_input([&] { d.set_from_keys(0, iota_values(12, 0)); }, "multiple of kv_heads x head_dim = 8");
  auto bad_keys = iota_values(16, 0);
  bad_keys[9] = std::numeric_limits<float>::infinity();
  expect_input([&] { d.set_from_keys(0, bad_keys); }, "token 1");
  std::vector<float> out(4 * 3);
  expect_input([&] { d.bounds(iota_values(15, 0), out); }, "query has 15");
  auto bad_query = iota_values(16, 0);
  bad_query[4] = std::numeric_limits<float>::quiet_NaN();
  expect_input([&] { d.bounds(bad_query, out); }, "query[4]");
  std::vector<float> short_out(11);
  expect_input([&] { d.bounds(iota_values(16, 0), short_out); }, "bounds output has 11");
  expect_input([&] { d.bounds_by_page(iota_values(16, 0), short_out); }, "bounds output has 11");
  expect_input([&] { d.bounds_by_page(bad_query, out); }, "query[4]");
  const std::size_t unsorted[] = {2, 1};
  expect_input([&] { d.remove_pages(unsorted); }, "pages[1] = 1");
  EXPECT_THROW(d.set_mean_key(0, iota_values(8, 0)), usage_error);
}

TEST(PageDigests, HalfStorageKeepsTheBoundAndRejectsWhatItCannotHold) {
  page_digests d(small_layout(digest_storage::f16));
  d.resize(1);
  auto lo = iota_values(8, 0.1f, 0.37f), hi = iota_values(8, 0.2f, 0.41f);
  d.set_min_max(0, lo, hi);
  const auto slo = d.stored(0, 0), shi = d.stored(0, 1);
  for (std::size_t i = 0; i < 8; ++i) {
    EXPECT_LE(slo[i], lo[i]);
    EXPECT_GE(shi[i], hi[i]);
    EXPECT_NEAR(slo[i], lo[i], 1e-3 * std::abs(lo[i]));
  }
  const auto before = d.digest();
  hi[3] = 70000.0f;  // beyond fp16
  try {
    d.set_min_max(0, lo, hi);
    FAIL();
  } catch (const input_error& e) {
    EXPECT_NE(std::string(e.what()).find("hi[3] = 70000 is beyond the range of f16"), std::string::npos) << e.what();
  }
  EXPECT_EQ(d.digest(), before);
  page_digests b(small_layout(digest_storage::bf16));
  b.resize(1);
  EXPECT_NO_THROW(b.set_min_max(0, lo, hi));  // bf16 has float's range
  EXPECT_GE(b.stored(0, 1)[3], 70000.0f);
}

TEST(PageDigests, KeysGiveTheirPerChannelMinimumMaximumAndMean) {
  page_digests mm(small_layout());
  page_digests mean(small_layout(digest_storage::f32, digest_kind::mean_key));
  mm.resize(1);
  mean.resize(1);
  std::vector<float> keys = iota_values(8, 0);
  const auto second = iota_values(8, 10, -2);
  keys.insert(keys.end(), second.begin(), second.end());
  mm.set_from_keys(0, keys);
  mean.set_from_keys(0, keys);
  for (std::size_t i = 0; i < 8; ++i) {
    EXPECT_EQ(mm.stored(0, 0)[i], std::min(keys[i], keys[8 + i]));
    EXPECT_EQ(mm.stored(0, 1)[i], std::max(keys[i], keys[8 + i]));
    EXPECT_FLOAT_EQ(mean.stored(0)[i], (keys[i] + keys[8 + i]) / 2);
  }
}

TEST(PageDigests, BoundsFollowGroupedQueryHeadsAndMarkPagesWithoutDigests) {
  page_digests d({.kv_heads = 2, .head_dim = 4, .query_heads = 4, .scale = 1.0});
  d.resize(3);
  d.set_min_max(0, iota_values(8, -1, 0.25f), iota_values(8, 0, 0.5f));
  d.set_min_max(2, iota_values(8, -3), iota_values(8, 3));
  const auto query = iota_values(16, -2, 0.3f);
  std::vector<float> out(12);
  d.bounds(query, out);
  for (std::size_t j = 0; j < 4; ++j) {
    EXPECT_EQ(out[j * 3 + 1], std::numeric_limits<float>::infinity());
    for (std::size_t p : {std::size_t{0}, std::size_t{2}}) {
      const auto lo = d.stored(p, 0), hi = d.stored(p, 1);
      const std::size_t h = j / 2;  // query heads 0, 1 read KV head 0; 2, 3 read KV head 1
      const double want = simd::digest_bound_reference(query.data() + j * 4, lo.data() + h * 4, hi.data() + h * 4, 4,
                                                       digest_kind::min_max, 1.0);
      EXPECT_NEAR(out[j * 3 + p], want, 1e-5) << j << " " << p;
    }
  }
  // Page after page: the same bits, a page's four bounds together, +inf for the page without a digest.
  std::vector<float> by_page(12, -1.0f);
  d.bounds_by_page(query, by_page);
  for (std::size_t j = 0; j < 4; ++j)
    for (std::size_t p = 0; p < 3; ++p)
      EXPECT_EQ(std::bit_cast<std::uint32_t>(by_page[p * 4 + j]), std::bit_cast<std::uint32_t>(out[j * 3 + p]))
          << j << " " << p;
}

TEST(PageDigests, RemovedPagesTakeTheirDigestsWithThem) {
  page_digests d(small_layout());
  d.resize(5);
  for (std::size_t p = 0; p < 5; ++p)
    if (p != 3) d.set_min_max(p, iota_values(8, float(p)), iota_values(8, float(p) + 1));
  const std::size_t gone[] = {0, 2};
  d.remove_pages(gone);
  ASSERT_EQ(d.num_pages(), 3u);
  EXPECT_EQ(d.stored(0, 0)[0], 1.0f);  // was page 1
  EXPECT_FALSE(d.has_digest(1));       // was page 3
  EXPECT_EQ(d.stored(2, 0)[0], 4.0f);  // was page 4
  EXPECT_EQ(d.pages_with_digest(), 2u);
}

TEST(QuerySignal, EstimatesSumToTheTotalAndFollowTheBounds) {
  const float inf = std::numeric_limits<float>::infinity();
  // 2 heads x 3 pages; page 2 has no digest.
  const std::vector<float> bounds = {0.0f, std::log(3.0f), inf, 1.0f, 1.0f, inf};
  const std::vector<std::uint32_t> tokens = {16, 16, 4};
  std::vector<double> m(3);
  estimate_page_attention<double>(bounds, 2, tokens, query_signal::bound_softmax, 1.0, m);
  EXPECT_NEAR(m[0] + m[1] + m[2], 1.0, 1e-12);
  // Head 0: weights 1, 3, 3 (page 2 takes the head's best); head 1: 1, 1, 1.
  EXPECT_NEAR(m[0], (1.0 / 7 + 1.0 / 3) / 2, 1e-7);
  EXPECT_NEAR(m[2], (3.0 / 7 + 1.0 / 3) / 2, 1e-7);
  estimate_page_attention<double>(bounds, 2, tokens, query_signal::bound_softmax_tokens, 2.0, m);
  EXPECT_NEAR(m[0] + m[1] + m[2], 2.0, 1e-12);
  EXPECT_NEAR(m[2], 2.0 * (12.0 / (16 + 48 + 12) + 4.0 / 36) / 2, 1e-7);
  // Bounds that overflowed to -inf everywhere: the head spreads its share evenly.
  const std::vector<float> sunk = {-inf, -inf, -inf};
  std::vector<double> even(3);
  estimate_page_attention<double>(sunk, 1, tokens, query_signal::bound_softmax, 1.0, even);
  EXPECT_NEAR(even[0], 1.0 / 3, 1e-12);
  EXPECT_NEAR(even[2], 1.0 / 3, 1e-12);
  std::vector<double> wrong(2);
  EXPECT_THROW(estimate_page_attention<double>(bounds, 2, tokens, query_signal::bound_softmax, 1.0, wrong),
               input_error);
  EXPECT_THROW(estimate_page_attention<double>(bounds, 2, tokens, query_signal::bound_softmax, -1.0, m), input_error);
}

config sequence_config() {
  config c;
  c.page_size = 4;
  c.protection.sink_pages = 0;
  c.protection.recent_tokens = 0;
  return c;
}

TEST(SequenceDigests, WithoutDigestsEveryDigestCallIsAUsageError) {
  sequence seq(sequence_config());
  seq.append(regions::user, 8);
  const auto q = iota_values(16, 0);
  EXPECT_FALSE(seq.has_digests());
  EXPECT_THROW(seq.observe_query(q), usage_error);
  EXPECT_THROW(seq.set_page_keys(0, iota_values(8, 0)), usage_error);
  EXPECT_THROW((void)seq.digests(), usage_error);
}

TEST(SequenceDigests, PagesEnterWithoutADigestAndLeaveWithIt) {
  sequence seq(sequence_config());
  seq.enable_digests(small_layout());
  seq.append(regions::user, 10);  // pages 0, 1 full, page 2 holds 2 tokens
  ASSERT_EQ(seq.digests().num_pages(), 3u);
  for (std::size_t p = 0; p < 3; ++p) seq.set_page_digest(p, iota_values(8, float(p)), iota_values(8, float(p) + 1));
  seq.append(regions::user, 1);  // page 2 grew: its digest no longer covers its keys
  EXPECT_TRUE(seq.digests().has_digest(1));
  EXPECT_FALSE(seq.digests().has_digest(2));
  seq.append(regions::user, 1);  // page 2 full now; the engine sends its digest
  seq.set_page_digest(2, iota_values(8, 2), iota_values(8, 3));
  seq.append(regions::tool_out, 4);  // page 3, new, no digest; page 2 keeps its digest (it was full)
  EXPECT_TRUE(seq.digests().has_digest(2));
  EXPECT_FALSE(seq.digests().has_digest(3));
  eviction_plan<float> plan;
  plan.pages = {1};
  plan.scores = {0.0f};
  plan.page_size = 4;
  plan.generation = seq.generation();
  seq.commit(plan);
  ASSERT_EQ(seq.digests().num_pages(), 3u);
  EXPECT_EQ(seq.digests().stored(0, 0)[0], 0.0f);
  EXPECT_EQ(seq.digests().stored(1, 0)[0], 2.0f);  // was page 2
  EXPECT_FALSE(seq.digests().has_digest(2));
}

TEST(SequenceDigests, ObserveQueryIsObservePagesOfTheEstimate) {
  sequence a(sequence_config()), b(sequence_config());
  a.enable_digests(small_layout(digest_storage::f16));
  a.append(regions::user, 12);
  b.append(regions::user, 12);
  std::mt19937 rng(4);
  std::normal_distribution<float> normal;
  for (std::size_t p = 0; p < 3; ++p) {
    std::vector<float> keys(4 * 8);
    for (auto& k : keys) k = normal(rng);
    a.set_page_keys(p, keys);
  }
  std::vector<float> q(16);
  for (auto& x : q) x = normal(rng);
  const auto mass = a.estimate_query_attention(q, query_signal::bound_softmax, 2.0);
  EXPECT_NEAR(std::accumulate(mass.begin(), mass.end(), 0.0), 2.0, 1e-5);
  a.observe_query(q, query_signal::bound_softmax, 2.0);
  b.observe_pages(mass);
  EXPECT_EQ(a.policy().digest(), b.policy().digest());
  EXPECT_EQ(a.page_scores(), b.page_scores());
}

TEST(SequenceDigests, ABadQueryChangesNothing) {
  sequence seq(sequence_config());
  seq.enable_digests(small_layout());
  seq.append(regions::user, 8);
  seq.set_page_keys(0, iota_values(32, 0, 0.1f));
  const auto before = seq.digest();
  auto q = iota_values(16, 0);
  q[3] = std::numeric_limits<float>::infinity();
  EXPECT_THROW(seq.observe_query(q), input_error);
  EXPECT_THROW(seq.observe_query(iota_values(4, 0)), input_error);
  EXPECT_EQ(seq.digest(), before);
}

TEST(SequenceDigests, DigestsAreInTheSequenceDigestAndItsGeneration) {
  sequence a(sequence_config()), b(sequence_config());
  a.enable_digests(small_layout());
  b.enable_digests(small_layout());
  a.append(regions::user, 8);
  b.append(regions::user, 8);
  EXPECT_EQ(a.digest(), b.digest());
  const auto generation = a.generation();
  a.set_page_keys(0, iota_values(32, 0, 0.1f));
  EXPECT_NE(a.digest(), b.digest());
  EXPECT_GT(a.generation(), generation);  // a plan made before is stale; an incremental snapshot saves it again
  b.set_page_keys(0, iota_values(32, 0, 0.1f));
  EXPECT_EQ(a.digest(), b.digest());
}

// The little-endian bytes of values (floats, or the 16-bit patterns of f16) as a snapshot encodes them.
template <class Elem>
std::vector<std::byte> encoded(const std::vector<Elem>& values) {
  std::vector<std::byte> bytes(values.size() * sizeof(Elem));
  for (std::size_t i = 0; i < values.size(); ++i) {
    std::uint32_t bits = 0;
    if constexpr (sizeof(Elem) == 4)
      bits = std::bit_cast<std::uint32_t>(values[i]);
    else
      bits = values[i];
    for (std::size_t b = 0; b < sizeof(Elem); ++b) bytes[i * sizeof(Elem) + b] = std::byte((bits >> (8 * b)) & 0xff);
  }
  return bytes;
}

template <class Elem>
void check_stored_layout(digest_storage storage) {
  // Head dim 40: fp32 runs of 16, 16 and 8 channels, 16-bit runs of 32 and 8, so the kernels' layout differs from
  // minima-then-maxima in every run. Integers below 2048: exact in f16, whatever the rounding.
  const std::size_t D = 40;
  sequence a(sequence_config());
  a.enable_digests({.kv_heads = 2, .head_dim = D, .query_heads = 2, .storage = storage});
  a.append(regions::user, 8);
  const auto lo = iota_values(2 * D, 100), hi = iota_values(2 * D, 300);
  a.set_page_digest(1, lo, hi);
  const page_digests& d = a.digests();
  auto stored_value = [&](std::size_t i) -> Elem {
    if constexpr (sizeof(Elem) == 4)
      return d.raw_f32()[i];
    else
      return d.raw_half()[i];
  };
  auto as_elem = [](float x) -> Elem {
    if constexpr (sizeof(Elem) == 4)
      return x;
    else
      return simd::float_to_half(x, half_format::f16);
  };
  const std::size_t page = d.layout().values_per_page();
  std::vector<Elem> head_in_memory(2 * D), head_in_snapshot(2 * D);
  for (std::size_t h = 0; h < 2; ++h)
    for (std::size_t c = 0; c < D; ++c) {
      ASSERT_EQ(stored_value(page + h * 2 * D + simd::digest_min_offset<Elem>(c)), as_elem(lo[h * D + c]));
      ASSERT_EQ(stored_value(page + h * 2 * D + simd::digest_max_offset<Elem>(c, D)), as_elem(hi[h * D + c]));
    }
  EXPECT_EQ(d.stored(1, 0), lo);
  EXPECT_EQ(d.stored(1, 1), hi);
  for (std::size_t i = 0; i < 2 * D; ++i) {
    head_in_memory[i] = stored_value(page + i);
    head_in_snapshot[i] = as_elem(i < D ? lo[i] : hi[i - D]);
  }
  // The snapshot holds head 0 of page 1 as its minima then its maxima (docs/snapshot-format.md), not as stored.
  const auto bytes = snapshot::save(a);
  const auto canonical = encoded(head_in_snapshot), in_memory = encoded(head_in_memory);
  EXPECT_NE(std::search(bytes.begin(), bytes.end(), canonical.begin(), canonical.end()), bytes.end());
  EXPECT_EQ(std::search(bytes.begin(), bytes.end(), in_memory.begin(), in_memory.end()), bytes.end());
  sequence fresh(sequence_config());
  snapshot::load(fresh, bytes);
  EXPECT_EQ(fresh.digest(), a.digest());
  EXPECT_EQ(fresh.digests().stored(1, 1), hi);
  std::vector<float> q = iota_values(2 * D, -4, 0.2f), x(2 * 2), y(2 * 2);
  fresh.query_page_bounds(q, x);
  a.query_page_bounds(q, y);
  EXPECT_EQ(x, y);
}

TEST(PageDigests, MinMaxHeadsAreStoredInTheKernelsLayoutAndSnapshotMinimaFirst) {
  check_stored_layout<float>(digest_storage::f32);
  check_stored_layout<std::uint16_t>(digest_storage::f16);
}

TEST(SequenceDigests, SnapshotsHoldTheDigestsBitForBit) {
  for (auto storage : {digest_storage::f32, digest_storage::f16, digest_storage::bf16}) {
    sequence a(sequence_config());
    a.enable_digests(small_layout(storage));
    a.append(regions::user, 14);
    a.set_page_keys(0, iota_values(32, -3, 0.37f));
    a.set_page_digest(3, iota_values(8, -1), iota_values(8, 2));  // the partial page (2 tokens)
    const auto bytes = snapshot::save(a);
    sequence fresh(sequence_config()), other(sequence_config());
    other.enable_digests({.kv_heads = 1, .head_dim = 2});
    other.append(regions::user, 4);
    for (sequence* t : {&fresh, &other}) {
      snapshot::load(*t, bytes);
      ASSERT_TRUE(t->has_digests());
      EXPECT_EQ(t->digest(), a.digest());
      EXPECT_EQ(t->digests().layout(), a.digests().layout());
      EXPECT_EQ(snapshot::save(*t), bytes);
      std::vector<float> q = iota_values(16, -1, 0.2f), x(16), y(16);
      t->query_page_bounds(q, x);
      a.query_page_bounds(q, y);
      EXPECT_EQ(x, y);
    }
    // A sequence without digests loads as one without digests, whatever the target kept.
    sequence plain(sequence_config());
    plain.append(regions::user, 4);
    snapshot::load(other, snapshot::save(plain));
    EXPECT_FALSE(other.has_digests());
  }
}

TEST(SequenceDigests, ACorruptedDigestSectionIsRejectedByName) {
  sequence a(sequence_config());
  a.enable_digests(small_layout());
  a.append(regions::user, 8);
  a.set_page_digest(0, iota_values(8, 0), iota_values(8, 1));
  const auto bytes = snapshot::save(a);
  // The values are 2 pages x 2 heads x 2 vectors x 4 channels floats before the last byte (format 3's "no host
  // tier"); page 0 head 0's lo[0] is first.
  const std::size_t values_at = bytes.size() - 1 - 2 * 16 * 4;
  auto expect_rejected = [&](std::vector<std::byte> b, const char* needle) {
    memdecay::detail::seal_snapshot(b);  // the checksums are the corrupter's: the section's own checks must hold
    sequence target(sequence_config());
    target.append(regions::tool_out, 3);
    const auto before = target.digest();
    try {
      snapshot::load(target, b);
      FAIL() << "accepted: " << needle;
    } catch (const input_error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_EQ(target.digest(), before);
  };
  auto b = bytes;
  const float big = 1e9f;
  std::memcpy(b.data() + values_at, &big, 4);
  expect_rejected(b, "page 0 head 0 channel 0 has its minimum above its maximum");
  b = bytes;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(b.data() + values_at + 8, &nan, 4);
  expect_rejected(b, "digest values at offset");
  b = bytes;
  b[values_at - 2] = std::byte{7};  // page 0's presence byte
  expect_rejected(b, "digest presence");
  b = bytes;
  b.resize(b.size() - 4);
  expect_rejected(b, "digest values");
}

TEST(SequenceDigests, AVersionOneSnapshotLoadsWithoutDigests) {
  sequence a(sequence_config());
  a.append(regions::user, 9);
  a.advance_to(3);
  auto bytes = snapshot::save(a);
  ASSERT_EQ(bytes.back(), std::byte{0});  // version 3's "no host tier" flag
  bytes.pop_back();
  ASSERT_EQ(bytes.back(), std::byte{0});  // version 2's "no digests" flag: the rest of the difference
  bytes.pop_back();
  bytes[8] = std::byte{1};
  memdecay::detail::seal_snapshot(bytes);
  sequence target(sequence_config());
  target.enable_digests(small_layout());
  snapshot::load(target, bytes);
  EXPECT_FALSE(target.has_digests());
  EXPECT_EQ(target.digest(), a.digest());
}

}  // namespace

namespace {

TEST(SequenceDigests, AManagersCommitTakesTheDigestsWithThePages) {
  memdecay::manager mgr({.page_size = 4, .global = memdecay::global_budget::pages(6, 4)});
  memdecay::block_pool<> pool(64, 4);
  for (std::uint64_t id : {1u, 2u}) {
    auto& seq = mgr.open(id, sequence_config());
    pool.open(id);
    seq.enable_digests(small_layout(digest_storage::bf16));
    seq.append(regions::tool_out, 16);
    pool.append_tokens(id, 16);
    for (std::size_t p = 0; p < 4; ++p) seq.set_page_keys(p, iota_values(32, float(p) + 10.0f * float(id), 0.5f));
  }
  const auto plan = mgr.select_global();
  ASSERT_FALSE(plan.plans.empty());
  mgr.commit(plan, pool, memdecay::identity_id{});
  for (std::uint64_t id : {1u, 2u}) {
    const auto& seq = mgr.at(id);
    ASSERT_EQ(seq.digests().num_pages(), seq.num_pages());
    EXPECT_EQ(seq.digests().pages_with_digest(), seq.num_pages());
    // Every surviving page's digest is the one set for its original page (its first key was 10 id + page).
    for (std::size_t p = 0; p < seq.num_pages(); ++p)
      EXPECT_EQ(seq.digests().stored(p, 0)[0], 10.0f * float(id) + float(seq.position_of(p * 4) / 4)) << id << " " << p;
  }
  // A manager snapshot holds them too: the loaded manager's sequences have the same digests.
  memdecay::manager copy({.page_size = 4, .global = memdecay::global_budget::pages(6, 4)});
  memdecay::snapshot::load(copy, memdecay::snapshot::save(mgr), sequence_config());
  for (std::uint64_t id : {1u, 2u}) {
    ASSERT_TRUE(copy.at(id).has_digests());
    EXPECT_EQ(copy.at(id).digest(), mgr.at(id).digest());
  }
}

}  // namespace
