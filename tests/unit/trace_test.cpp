// Tests for trace.hpp: the binary format round trip (in memory and through files), in-memory validation, and
// every rejection of the reader, each at the byte offset of the offending field; plus truncation at every byte
// and random corruption, which must be rejected (or accepted) without crashing.
#include <gtest/gtest.h>

#include <memdecay/io/trace.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include <unistd.h>

namespace tr = memdecay::trace;

namespace {

// A small valid trace: two layers, dense and sparse rows, three regions, two probes, a reference, two episodes.
tr::trace_file sample() {
  tr::trace_file f;
  f.label = "sample";
  f.layers = 2;
  f.region_names = {"system", "tool_out", "user"};
  tr::episode a;
  a.name = "a";
  a.seed = 42;
  a.events.emplace_back(tr::segment{0, 0, 4});
  a.events.emplace_back(tr::segment{1, 1, 6});
  a.events.emplace_back(
      tr::attention{1,
                    10,
                    {tr::attention_row{false, {}, {0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f}},
                     tr::attention_row{true, {0, 7}, {0.5f, 0.5f}}}});
  a.events.emplace_back(tr::probe{2, 0, 1, 5, 3});
  a.events.emplace_back(tr::segment{3, 2, 2});
  a.events.emplace_back(tr::probe{3, 1, 2, 10, 2});
  a.events.emplace_back(tr::reference{4, 5, 3});
  tr::episode b;
  b.name = "b";
  b.events.emplace_back(tr::segment{5, 2, 1});
  f.episodes = {a, b};
  return f;
}

// Builds raw files field by field, so each test can plant one defect and know its byte offset.
struct builder {
  std::vector<std::byte> out;
  std::size_t at() const { return out.size(); }
  builder& u8(std::uint8_t v) {
    out.push_back(static_cast<std::byte>(v));
    return *this;
  }
  builder& u16(std::uint16_t v) {
    for (int i = 0; i < 2; ++i) u8(static_cast<std::uint8_t>(v >> (8 * i)));
    return *this;
  }
  builder& u32(std::uint32_t v) {
    for (int i = 0; i < 4; ++i) u8(static_cast<std::uint8_t>(v >> (8 * i)));
    return *this;
  }
  builder& u64(std::uint64_t v) {
    for (int i = 0; i < 8; ++i) u8(static_cast<std::uint8_t>(v >> (8 * i)));
    return *this;
  }
  builder& f32(float v) {
    std::uint32_t b;
    std::memcpy(&b, &v, 4);
    return u32(b);
  }
  builder& text(const std::string& s) {
    for (char c : s) u8(static_cast<std::uint8_t>(c));
    return *this;
  }
  // magic, `version`, flags 0, `layers`, label "t", regions "a" and "b", `episodes`
  builder& header(std::uint32_t layers = 1, std::uint32_t episodes = 1, std::uint32_t version = 2) {
    text(std::string("MDTRACE") + '\0');
    u32(version).u32(0).u32(layers).u16(1).text("t").u16(2).u8(1).text("a").u8(1).text("b");
    return u32(episodes);
  }
  builder& episode(std::uint32_t events) { return u16(1).text("e").u64(7).u32(events); }
  builder& segment(std::uint32_t step, std::uint8_t region, std::uint32_t tokens) {
    return u8(1).u32(step).u8(region).u32(tokens);
  }
  builder& attention(std::uint32_t step, std::uint32_t context) { return u8(2).u32(step).u32(context); }
  builder& probe(std::uint32_t step, std::uint32_t id, std::uint8_t region, std::uint32_t first, std::uint32_t length) {
    return u8(3).u32(step).u32(id).u8(region).u32(first).u32(length);
  }
  builder& reference(std::uint32_t step, std::uint32_t first, std::uint32_t length) {
    return u8(4).u32(step).u32(first).u32(length);
  }
};

// Parses `b`, expects a rejection at `offset` whose message contains `text`.
void expect_rejected(const builder& b, std::uint64_t offset, const std::string& text) {
  const auto r = tr::parse(b.out);
  ASSERT_FALSE(r.ok()) << "expected a rejection containing '" << text << "'";
  EXPECT_EQ(r.error->offset, offset) << r.error->message;
  EXPECT_NE(r.error->message.find(text), std::string::npos) << r.error->message;
  EXPECT_NE(r.error->message.find("byte " + std::to_string(offset) + ":"), std::string::npos) << r.error->message;
  try {
    (void)tr::parse_or_throw(b.out, "x.mdtrace");
    ADD_FAILURE() << "parse_or_throw accepted it";
  } catch (const tr::trace_error& e) {
    EXPECT_EQ(e.offset(), offset);
    EXPECT_NE(std::string(e.what()).find("x.mdtrace"), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(TraceFormat, RoundTripInMemory) {
  const auto f = sample();
  EXPECT_FALSE(tr::check(f).has_value());
  const auto bytes = tr::encode(f);
  const auto r = tr::parse(bytes);
  ASSERT_TRUE(r.ok()) << r.error->message;
  EXPECT_EQ(*r.file, f);
  EXPECT_EQ(tr::encode(*r.file), bytes);
  EXPECT_EQ(r.file->count_probes(), 2u);
  EXPECT_EQ(r.file->episodes[0].total_tokens(), 12u);
  EXPECT_EQ(r.file->episodes[0].last_step(), 4u);
  EXPECT_EQ(r.file->episodes[0].count_references(), 1u);
}

TEST(TraceFormat, HeaderBytesAreAsDocumented) {
  const auto bytes = tr::encode(sample());
  ASSERT_GE(bytes.size(), 24u);
  EXPECT_EQ(std::memcmp(bytes.data(), "MDTRACE\0", 8), 0);
  EXPECT_EQ(std::to_integer<int>(bytes[8]), 2);  // version, little-endian
  EXPECT_EQ(std::to_integer<int>(bytes[9]), 0);
  EXPECT_EQ(std::to_integer<int>(bytes[16]), 2);  // layers
  EXPECT_EQ(std::to_integer<int>(bytes[20]), 6);  // label length "sample"
}

TEST(TraceFormat, RoundTripThroughFiles) {
  const auto dir = std::filesystem::temp_directory_path() / ("memdecay_trace_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto path = dir / "sample.mdtrace";
  tr::write_file(path, sample());
  EXPECT_EQ(tr::read_file(path), sample());
  std::filesystem::remove_all(dir);
}

TEST(TraceFormat, LayerMeanAndAccumulate) {
  const auto f = sample();
  const auto& a = std::get<tr::attention>(f.episodes[0].events[2]);
  const auto mean = a.layer_mean();
  ASSERT_EQ(mean.size(), 10u);
  EXPECT_FLOAT_EQ(mean[0], 0.3f);   // (0.1 + 0.5) / 2
  EXPECT_FLOAT_EQ(mean[1], 0.05f);  // (0.1 + 0) / 2
  EXPECT_FLOAT_EQ(mean[7], 0.3f);
  const auto labels = f.episodes[0].labels();
  EXPECT_EQ(labels, (std::vector<memdecay::region_id>{0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 2, 2}));
}

TEST(TraceReader, MissingFileNamesThePath) {
  try {
    (void)tr::read_file("/nonexistent/dir/none.mdtrace");
    FAIL();
  } catch (const tr::trace_error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot open trace '/nonexistent/dir/none.mdtrace'"), std::string::npos)
        << e.what();
  }
}

TEST(TraceReader, RejectsEmptyAndBadMagic) {
  expect_rejected(builder{}, 0, "truncated: magic needs 8 bytes");
  builder b;
  b.text("MDTRACX").u8(0).u32(1);
  expect_rejected(b, 0, "bad magic");
}

TEST(TraceReader, RejectsVersionAndFlags) {
  builder v;
  v.text(std::string("MDTRACE") + '\0').u32(3);
  expect_rejected(v, 8, "unsupported version 3 (this reader reads versions 1 to 2)");
  builder zero;
  zero.text(std::string("MDTRACE") + '\0').u32(0);
  expect_rejected(zero, 8, "unsupported version 0");
  builder f;
  f.text(std::string("MDTRACE") + '\0').u32(1).u32(4);
  expect_rejected(f, 12, "flags = 4");
}

TEST(TraceReader, RejectsLayerAndRegionCounts) {
  builder l;
  l.text(std::string("MDTRACE") + '\0').u32(1).u32(0).u32(0);
  expect_rejected(l, 16, "layer count 0");
  builder r;
  r.text(std::string("MDTRACE") + '\0').u32(1).u32(0).u32(1).u16(0).u16(0);
  expect_rejected(r, 22, "region count 0");
  builder e;
  e.text(std::string("MDTRACE") + '\0').u32(1).u32(0).u32(1).u16(0).u16(1).u8(0);
  expect_rejected(e, 24, "empty name");
  builder d;
  d.text(std::string("MDTRACE") + '\0').u32(1).u32(0).u32(1).u16(0).u16(2).u8(1).text("a").u8(1);
  const auto at = d.at();
  d.text("a");
  expect_rejected(d, at, "repeats region 0");
}

TEST(TraceReader, RejectsCountsThatCannotFit) {
  builder b;
  b.header(1, 0);
  const auto at = b.at() - 4;
  b.out.resize(at);
  b.u32(1000000);
  expect_rejected(b, at, "episode count 1000000 cannot fit");
  builder e;
  e.header().u16(0).u64(0);
  const auto events_at = e.at();
  e.u32(0xffffffffu);
  expect_rejected(e, events_at, "event count 4294967295 cannot fit");
}

TEST(TraceReader, RejectsUnknownTagAndTrailingBytes) {
  builder t;
  t.header().episode(1);
  const auto at = t.at();
  t.u8(9).u32(0).u32(0).u8(0);  // as long as the shortest event, so the event count fits
  expect_rejected(t, at, "episode 0: event 0: unknown event tag 9");
  builder z;
  z.header().episode(1).segment(0, 0, 1);
  const auto end = z.at();
  z.u8(0);
  expect_rejected(z, end, "1 trailing bytes");
}

TEST(TraceReader, RejectsBadSegments) {
  builder r;
  r.header().episode(1);
  auto at = r.at() + 1;
  r.segment(0, 2, 1);
  expect_rejected(r, at, "region id 2 is not in the region table (2 regions)");
  builder z;
  z.header().episode(1);
  at = z.at() + 1;
  z.segment(0, 0, 0);
  expect_rejected(z, at, "segment has 0 tokens");
  builder s;
  s.header().episode(2).segment(5, 0, 1);
  at = s.at() + 1;
  s.segment(4, 0, 1);
  expect_rejected(s, at, "event 1: step 4 goes backwards (previous event at step 5)");
  builder o;
  o.header().episode(2).segment(0, 0, 0xfffffff0u);
  at = o.at() + 1;
  o.segment(0, 0, 0x20u);
  expect_rejected(o, at, "past 2^32 - 1 tokens");
}

TEST(TraceReader, RejectsAttentionThatDisagreesWithTheContext) {
  builder c;
  c.header().episode(2).segment(0, 0, 3);
  auto at = c.at() + 1;
  c.attention(0, 4).u8(0).f32(0).f32(0).f32(0).f32(0);
  expect_rejected(c, at, "attention context 4 disagrees with the 3 tokens appended so far");
  builder enc;
  enc.header().episode(2).segment(0, 0, 3).attention(0, 3);
  at = enc.at();
  enc.u8(2);
  expect_rejected(enc, at, "layer 0: row encoding 2");
  builder rows;  // 4096 layers announced, a few bytes left: rejected before allocating the rows
  rows.header(4096).episode(2).segment(0, 0, 3).attention(0, 3).u8(0);
  expect_rejected(rows, rows.at() - 1,
                  "truncated: 4096 attention rows need at least 4096 bytes, the file ends after 1");
  builder t;
  t.header().episode(2).segment(0, 0, 3).attention(0, 3);
  at = t.at() + 1;
  t.u8(0).f32(0.5f);
  expect_rejected(t, at, "truncated: a dense row over 3 tokens needs 12 bytes, the file ends after 4");
}

TEST(TraceReader, RejectsBadMassAtItsOffset) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), -0.25f, std::numeric_limits<float>::infinity()}) {
    builder b;
    b.header(2).episode(2).segment(0, 0, 3).attention(0, 3).u8(0).f32(0.2f).f32(0.3f).f32(0.5f).u8(0).f32(0.1f);
    const auto at = b.at();
    b.f32(bad).f32(0.1f);
    const std::string what = std::isnan(bad) ? "mass[1] is NaN"
                             : bad < 0       ? "mass[1] = -0.25 is negative"
                                             : "mass[1] is infinite";
    expect_rejected(b, at, "episode 0: event 1: layer 1: " + what);
  }
}

TEST(TraceReader, RejectsBadSparseRows) {
  builder count;
  count.header().episode(2).segment(0, 0, 3).attention(0, 3).u8(1);
  auto at = count.at();
  count.u32(4);
  expect_rejected(count, at, "sparse entry count 4 exceeds the context of 3 tokens");
  builder order;
  order.header().episode(2).segment(0, 0, 3).attention(0, 3).u8(1).u32(2).u32(2);
  at = order.at();
  order.u32(1).f32(0.5f).f32(0.5f);
  expect_rejected(order, at, "position[1] = 1 is not above position[0] = 2");
  builder outside;
  outside.header().episode(2).segment(0, 0, 3).attention(0, 3).u8(1).u32(1);
  at = outside.at();
  outside.u32(3).f32(1.0f);
  expect_rejected(outside, at, "position[0] = 3 is outside the context of 3 tokens");
  builder truncated;
  truncated.header().episode(2).segment(0, 0, 3).attention(0, 3).u8(1);
  at = truncated.at();
  truncated.u32(3).u32(0);
  expect_rejected(truncated, at, "truncated: 3 sparse entries need 24 bytes");
}

TEST(TraceReader, RejectsBadProbes) {
  builder beyond;
  beyond.header().episode(2).segment(0, 1, 4);
  auto at = beyond.at() + 1;
  beyond.probe(1, 0, 1, 2, 3);
  expect_rejected(beyond, at, "probe 0 covers positions [2, 5) but only 4 tokens were appended before it");
  builder region;
  region.header().episode(3).segment(0, 0, 4).segment(0, 1, 4);
  at = region.at() + 1;
  region.probe(1, 0, 1, 2, 4);
  expect_rejected(region, at, "probe 0 says region 1 but position 2 belongs to region 0");
  builder later;  // the mismatch is in a later run
  later.header().episode(3).segment(0, 1, 4).segment(0, 0, 4);
  at = later.at() + 1;
  later.probe(1, 0, 1, 2, 4);
  expect_rejected(later, at, "position 4 belongs to region 0");
  builder repeated;
  repeated.header().episode(3).segment(0, 1, 4).probe(1, 7, 1, 0, 1);
  at = repeated.at() + 1;
  repeated.probe(1, 7, 1, 1, 1);
  expect_rejected(repeated, at, "probe id 7 is repeated");
  builder empty;
  empty.header().episode(2).segment(0, 1, 4);
  at = empty.at() + 1;
  empty.probe(1, 3, 1, 0, 0);
  expect_rejected(empty, at, "probe 3 has length 0");
  builder unknown;
  unknown.header().episode(2).segment(0, 1, 4);
  at = unknown.at() + 1;
  unknown.probe(1, 3, 5, 0, 1);
  expect_rejected(unknown, at, "region id 5 is not in the region table");
}

TEST(TraceReader, ReadsVersionOneFilesAndRefusesReferencesInThem) {
  builder one;
  one.header(1, 1, 1).episode(2).segment(0, 1, 4).probe(1, 0, 1, 0, 2);
  const auto r = tr::parse(one.out);
  ASSERT_TRUE(r.ok()) << r.error->message;
  EXPECT_EQ(r.file->episodes[0].events.size(), 2u);
  builder refs;
  refs.header(1, 1, 1).episode(2).segment(0, 1, 4);
  const auto at = refs.at();
  refs.reference(1, 0, 2);
  expect_rejected(refs, at, "event 1: unknown event tag 4 (version 1: 1 segment, 2 attention, 3 probe)");
}

TEST(TraceReader, RejectsBadReferences) {
  builder beyond;
  beyond.header().episode(2).segment(0, 1, 4);
  auto at = beyond.at() + 1;
  beyond.reference(1, 2, 3);
  expect_rejected(beyond, at, "reference covers positions [2, 5) but only 4 tokens were appended before it");
  builder empty;
  empty.header().episode(2).segment(0, 1, 4);
  at = empty.at() + 1;
  empty.reference(1, 0, 0);
  expect_rejected(empty, at, "reference has length 0");
  builder back;
  back.header().episode(2).segment(3, 1, 4);
  at = back.at() + 1;
  back.reference(2, 0, 1);
  expect_rejected(back, at, "step 2 goes backwards (previous event at step 3)");
  builder cut;
  cut.header().episode(2).segment(0, 1, 4).u8(4).u32(1).u32(0);
  const auto length_at = cut.at();
  cut.u8(0);  // one byte of the length: the event count still fits, the field does not
  expect_rejected(cut, length_at, "truncated: reference length needs 4 bytes, the file ends after 1");
}

TEST(TraceReader, EveryTruncationIsRejectedWithoutCrashing) {
  const auto bytes = tr::encode(sample());
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    const auto r = tr::parse(std::span<const std::byte>(bytes.data(), n));
    ASSERT_FALSE(r.ok()) << "prefix of " << n << " bytes accepted";
    EXPECT_LE(r.error->offset, n);
    const auto& m = r.error->message;
    EXPECT_TRUE(m.find("truncated") != std::string::npos || m.find("cannot fit") != std::string::npos)
        << n << ": " << m;
  }
}

TEST(TraceReader, RandomCorruptionNeverCrashes) {
  const auto good = tr::encode(sample());
  std::uint64_t state = 12345;
  auto next = [&] {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return state >> 33;
  };
  std::size_t rejected = 0;
  for (int trial = 0; trial < 5000; ++trial) {
    auto bytes = good;
    const int flips = 1 + static_cast<int>(next() % 4);
    for (int k = 0; k < flips; ++k) bytes[next() % bytes.size()] = static_cast<std::byte>(next() & 0xff);
    const auto r = tr::parse(bytes);
    if (!r.ok()) {
      ++rejected;
      EXPECT_LE(r.error->offset, bytes.size());
      EXPECT_FALSE(r.error->message.empty());
    } else {
      EXPECT_FALSE(tr::check(*r.file).has_value());  // whatever is accepted is valid and re-encodes the same
      EXPECT_EQ(tr::encode(*r.file), bytes);
    }
  }
  EXPECT_GT(rejected, 1000u);
}

TEST(TraceCheck, InMemoryViolationsAreNamedAndEncodeRefuses) {
  auto f = sample();
  EXPECT_FALSE(tr::check(f));
  auto bad = f;
  std::get<tr::attention>(bad.episodes[0].events[2]).layers[1].mass[0] = -1.0f;
  auto e = tr::check(bad);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->message, "episode 0: event 2: layer 1: mass[0] = -1 is negative");
  EXPECT_THROW((void)tr::encode(bad), tr::trace_error);
  EXPECT_THROW((void)tr::encode(bad), memdecay::input_error);

  bad = f;
  std::get<tr::attention>(bad.episodes[0].events[2]).layers[0].mass.pop_back();
  ASSERT_TRUE((e = tr::check(bad)));
  EXPECT_EQ(e->message, "episode 0: event 2: layer 0: dense row has 9 masses for a context of 10 tokens");

  bad = f;
  std::get<tr::attention>(bad.episodes[0].events[2]).layers.pop_back();
  ASSERT_TRUE((e = tr::check(bad)));
  EXPECT_EQ(e->message, "episode 0: event 2: attention has 1 layers, the file header says 2");

  bad = f;
  std::get<tr::attention>(bad.episodes[0].events[2]).layers[1].positions = {7, 0};
  ASSERT_TRUE((e = tr::check(bad)));
  EXPECT_EQ(e->message, "episode 0: event 2: layer 1: position[1] = 0 is not above position[0] = 7");

  bad = f;
  std::get<tr::probe>(bad.episodes[0].events[3]).region = 0;
  ASSERT_TRUE((e = tr::check(bad)));
  EXPECT_EQ(e->message, "episode 0: event 3: probe 0 says region 0 but position 5 belongs to region 1");

  bad = f;
  std::get<tr::reference>(bad.episodes[0].events[6]).length = 8;
  ASSERT_TRUE((e = tr::check(bad)));
  EXPECT_EQ(e->message, "episode 0: event 6: reference covers positions [5, 13) but only 12 tokens were appended "
                        "before it");

  bad = f;
  bad.region_names.push_back("system");
  ASSERT_TRUE((e = tr::check(bad)));
  EXPECT_EQ(e->message, "region 3 name 'system' repeats region 0");

  bad = f;
  bad.layers = 0;
  EXPECT_TRUE(tr::check(bad));
}

TEST(TraceCheck, DefaultRegionNamesFollowTheDefaultTable) {
  const auto names = tr::default_region_names();
  ASSERT_EQ(names.size(), memdecay::regions::default_count);
  EXPECT_EQ(names[memdecay::regions::system], "system");
  EXPECT_EQ(names[memdecay::regions::scratchpad], "scratchpad");
}
