// Tests for page_tables/sglang_req_to_token.hpp: token rows shift left by whole pages, seq_len drops, and the freed
// KV slots come back as merged ranges; bad input is rejected with the arrays untouched.
#include <gtest/gtest.h>

#include <memdecay/page_tables/sglang_req_to_token.hpp>
#include <memdecay/core/sequence.hpp>

#include <cstdint>
#include <numeric>
#include <vector>

namespace md = memdecay;

namespace {

constexpr std::size_t P = 4;
constexpr std::size_t max_context = 16;

// Two requests. Row 0: 14 tokens in slots 100..113 (pages of 4: [100..104) [104..108) [108..112) [112, 113...]).
// Row 1: 8 tokens in scattered slots (a page_size = 1 allocator hands out any slot).
struct pool {
  std::vector<std::int32_t> slots = [] {
    std::vector<std::int32_t> s(2 * max_context, 0);
    std::iota(s.begin(), s.begin() + 14, 100);
    const std::int32_t row1[] = {9, 3, 4, 5, 60, 61, 20, 2};
    std::copy(std::begin(row1), std::end(row1), s.begin() + max_context);
    return s;
  }();
  std::vector<std::int64_t> lens{14, 8};
  md::sglang_req_to_token view() { return md::sglang_req_to_token(slots, lens, max_context, P, 200); }
  auto arrays() const { return std::make_pair(slots, lens); }
};

TEST(SglangReqToToken, PagesAreGroupsOfTokensNamedByTheirFirstSlot) {
  pool p;
  const auto view = p.view();
  EXPECT_EQ(view.num_pages(0), 4u);
  EXPECT_EQ(view.page_at(0, 2), 108);
  EXPECT_EQ(view.page_at(1, 1), 60);
}

TEST(SglangReqToToken, RemovingPagesShiftsTheRowAndReturnsMergedSlotRanges) {
  pool p;
  auto view = p.view();
  const std::size_t victims[] = {0, 1};
  const auto removal = view.remove_pages(0, victims);
  EXPECT_EQ(removal.slots, (std::vector<md::slot_range>{{100, 108}}));
  EXPECT_EQ(removal.removed, (std::vector<std::int32_t>{100, 104})) << "a page is named by its first slot";
  EXPECT_FALSE(removal.freed) << "the radix cache may still hold the slots";
  EXPECT_EQ(p.lens[0], 6);
  EXPECT_EQ(std::vector(p.slots.begin(), p.slots.begin() + 6),
            (std::vector<std::int32_t>{108, 109, 110, 111, 112, 113}));
  EXPECT_EQ(p.lens[1], 8);
}

TEST(SglangReqToToken, ScatteredSlotsComeBackSortedAndMerged) {
  pool p;
  auto view = p.view();
  const std::size_t victims[] = {0};
  const auto removal = view.remove_pages(1, victims);  // slots 9, 3, 4, 5
  EXPECT_EQ(removal.slots, (std::vector<md::slot_range>{{3, 6}, {9, 10}}));
  EXPECT_EQ(removal.removed, std::vector<std::int32_t>{9});
  EXPECT_EQ(std::vector(p.slots.begin() + max_context, p.slots.begin() + max_context + 4),
            (std::vector<std::int32_t>{60, 61, 20, 2}));
  EXPECT_EQ(p.lens[1], 4);
}

TEST(SglangReqToToken, RefusesThePartialLastPage) {
  pool p;
  auto view = p.view();
  const auto before = p.arrays();
  const std::size_t victims[] = {3};  // tokens 12, 13 of 14
  EXPECT_THROW((void)view.remove_pages(0, victims), md::usage_error);
  EXPECT_EQ(p.arrays(), before);
}

TEST(SglangReqToToken, RejectsInconsistentArraysWritingNothing) {
  struct corruption {
    const char* what;
    void (*apply)(pool&);
  };
  const corruption corruptions[] = {
      {"a length above max_context_len", [](pool& p) { p.lens[1] = 17; }},
      {"a negative length", [](pool& p) { p.lens[0] = -4; }},
      {"a slot outside the KV pool", [](pool& p) { p.slots[3] = 200; }},
      {"a negative slot", [](pool& p) { p.slots[max_context + 2] = -1; }},
      {"a slot listed twice in one row", [](pool& p) { p.slots[max_context + 7] = 9; }},
  };
  for (const auto& c : corruptions) {
    pool fresh;
    c.apply(fresh);
    EXPECT_THROW((void)fresh.view(), md::input_error) << c.what;

    pool q;
    auto view = q.view();
    c.apply(q);
    const auto before = q.arrays();
    const std::size_t victims[] = {0};
    EXPECT_THROW((void)view.remove_pages(0, victims), md::input_error) << c.what;
    EXPECT_EQ(q.arrays(), before) << c.what;
  }
  pool p;
  EXPECT_THROW(md::sglang_req_to_token(p.slots, p.lens, max_context + 1, P, 200), md::input_error);
  EXPECT_THROW(md::sglang_req_to_token(p.slots, p.lens, max_context, 3, 200), md::config_error);
}

TEST(SglangReqToToken, ReadersReportALengthBrokenSinceConstruction) {
  pool p;
  const auto view = p.view();
  p.lens[0] = 40;  // longer than max_context_len
  EXPECT_THROW((void)view.num_pages(0), md::input_error);
  EXPECT_THROW((void)view.row_slots(0), md::input_error);
}

TEST(SglangReqToToken, RejectsUnknownRowsAndBadPageListsWritingNothing) {
  pool p;
  auto view = p.view();
  const auto before = p.arrays();
  const std::size_t one[] = {0};
  EXPECT_THROW((void)view.remove_pages(2, one), md::usage_error);
  const std::size_t twice[] = {1, 1};
  EXPECT_THROW((void)view.remove_pages(0, twice), md::usage_error);
  const std::size_t beyond[] = {4};
  EXPECT_THROW((void)view.remove_pages(0, beyond), md::usage_error);
  EXPECT_EQ(p.arrays(), before);
}

TEST(SglangReqToToken, ASingleRowViewAndASequenceCommit) {
  std::vector<std::int32_t> row(12, 0);
  std::iota(row.begin(), row.begin() + 9, 40);
  std::int64_t seq_len = 9;
  auto view = md::sglang_req_to_token::row(row, seq_len, P, 64);
  md::sequence seq(md::config{.page_size = P});
  seq.append(md::regions::user, P);
  seq.append(md::regions::scratchpad, P);
  seq.append(md::regions::user, 1);
  seq.advance_to(60);
  const auto plan = seq.select(1);
  ASSERT_EQ(plan.pages, std::vector<std::size_t>{1});
  EXPECT_EQ(seq.commit(plan, view, 0).slots, (std::vector<md::slot_range>{{44, 48}}));
  EXPECT_EQ(seq_len, 5);
  EXPECT_EQ(row[4], 48) << "the last token moved down one page";
  // Decode positions stay absolute: the next token is at seq_len + evicted_tokens.
  EXPECT_EQ(static_cast<std::uint64_t>(seq_len) + seq.evicted_tokens(), seq.logical_len());
}

}  // namespace
