// Tests for page_tables/vllm_block_table.hpp: padded int32 rows and block counts, removals that compact one row,
// and bad input rejected with the arrays untouched.
#include <gtest/gtest.h>

#include <memdecay/page_tables/vllm_block_table.hpp>
#include <memdecay/core/sequence.hpp>

#include <cstdint>
#include <vector>

namespace md = memdecay;

namespace {

constexpr std::size_t P = 16;
constexpr std::size_t stride = 6;

struct table {
  std::vector<std::int32_t> blocks{7,  8,  9,  10, 0, 0,   //
                                   20, 21, 0,  0,  0, 0,   //
                                   7,  30, 31, 0,  0, 0};  // row 2 shares block 7 with row 0 (a prefix-cache hit)
  std::vector<std::int32_t> counts{4, 2, 3};
  md::vllm_block_table view() { return md::vllm_block_table(blocks, counts, stride, P, 40); }
  auto arrays() const { return std::make_pair(blocks, counts); }
};

TEST(VllmBlockTable, RemovingBlocksCompactsTheRowAndLowersItsCount) {
  table t;
  auto view = t.view();
  const std::size_t victims[] = {1, 2};
  const auto removal = view.remove_pages(0, victims);
  EXPECT_EQ(removal.removed, (std::vector<std::int32_t>{8, 9}));
  EXPECT_FALSE(removal.freed) << "the scheduler's block pool owns the reference counts";
  EXPECT_EQ(removal.slots, (std::vector<md::slot_range>{{8 * 16, 10 * 16}})) << "blocks 8 and 9 are adjacent";
  EXPECT_EQ(t.counts, (std::vector<std::int32_t>{2, 2, 3}));
  EXPECT_EQ(std::vector(t.blocks.begin(), t.blocks.begin() + 2), (std::vector<std::int32_t>{7, 10}));
  EXPECT_EQ(std::vector(t.blocks.begin() + stride, t.blocks.end()),
            (std::vector<std::int32_t>{20, 21, 0, 0, 0, 0, 7, 30, 31, 0, 0, 0}))
      << "other rows are untouched";
}

TEST(VllmBlockTable, ASingleRowViewEditsTheRowAndItsCount) {
  std::vector<std::int32_t> row{3, 4, 5, 6, 0, 0, 0, 0};
  std::int32_t num_blocks = 4;
  auto view = md::vllm_block_table::row(row, num_blocks, P, 16);
  const std::size_t victims[] = {0, 3};
  const auto removal = view.remove_pages(0, victims);
  EXPECT_EQ(removal.removed, (std::vector<std::int32_t>{3, 6}));
  EXPECT_EQ(removal.slots, (std::vector<md::slot_range>{{3 * 16, 4 * 16}, {6 * 16, 7 * 16}}));
  EXPECT_EQ(num_blocks, 2);
  EXPECT_EQ(row[0], 4);
  EXPECT_EQ(row[1], 5);
}

TEST(VllmBlockTable, CountsSharedBlocksAcrossRows) {
  table t;
  const auto view = t.view();
  EXPECT_EQ(view.ref_count(7), 2u);
  EXPECT_EQ(view.ref_count(30), 1u);
  EXPECT_EQ(view.ref_count(0), 0u) << "padding is not a reference";
}

TEST(VllmBlockTable, CountsEveryBlockInOnePass) {
  table t;
  const auto view = t.view();
  const auto counts = view.ref_counts();
  ASSERT_EQ(counts.size(), 40u);
  for (std::int32_t id = 0; id < 40; ++id) EXPECT_EQ(counts[static_cast<std::size_t>(id)], view.ref_count(id)) << id;
  EXPECT_EQ(counts[7], 2u);
}

TEST(VllmBlockTable, ACommitChecksTheRowItTouches) {
  // The whole table was validated on every commit: rows x blocks per row for each request of a batch commit.
  // check_remove_pages now validates its own row; a row broken elsewhere is reported when it is touched.
  table t;
  auto view = t.view();
  t.blocks[stride + 1] = 20;  // row 1 now lists block 20 twice
  const std::size_t first[] = {0};
  EXPECT_NO_THROW(view.check_remove_pages(0, first));
  EXPECT_THROW(view.check_remove_pages(1, first), md::input_error);
  EXPECT_THROW(view.validate(), md::input_error);
}

TEST(VllmBlockTable, RejectsInconsistentArraysWritingNothing) {
  // The constructor validates every row; a removal validates the row it edits (the others are not its business,
  // and validating them made every commit cost rows x blocks per row).
  struct corruption {
    const char* what;
    std::size_t row;
    void (*apply)(table&);
  };
  const corruption corruptions[] = {
      {"a count above the row width", 1, [](table& t) { t.counts[1] = 7; }},
      {"a negative count", 1, [](table& t) { t.counts[1] = -1; }},
      {"a block outside the pool", 0, [](table& t) { t.blocks[1] = 40; }},
      {"a negative block", 1, [](table& t) { t.blocks[7] = -2; }},
      {"a block listed twice in a row", 0, [](table& t) { t.blocks[2] = 7; }},
  };
  for (const auto& c : corruptions) {
    table fresh;
    c.apply(fresh);
    EXPECT_THROW((void)fresh.view(), md::input_error) << c.what;

    table t;
    auto view = t.view();
    c.apply(t);
    const auto before = t.arrays();
    const std::size_t victims[] = {0};
    EXPECT_THROW((void)view.remove_pages(c.row, victims), md::input_error) << c.what;
    EXPECT_EQ(t.arrays(), before) << c.what;
  }
  table t;
  std::vector<std::int32_t> short_blocks(t.blocks.begin(), t.blocks.end() - 1);
  EXPECT_THROW(md::vllm_block_table(short_blocks, t.counts, stride, P, 40), md::input_error);
  EXPECT_THROW(md::vllm_block_table(t.blocks, t.counts, stride, 10, 40), md::config_error);
}

TEST(VllmBlockTable, ReadersReportACountBrokenSinceConstruction) {
  table t;
  const auto view = t.view();
  t.counts[1] = 9;  // wider than the row
  EXPECT_THROW((void)view.num_pages(1), md::input_error);
  EXPECT_THROW((void)view.page_at(1, 8), md::input_error);
}

TEST(VllmBlockTable, RejectsUnknownRowsAndBadPageListsWritingNothing) {
  table t;
  auto view = t.view();
  const auto before = t.arrays();
  const std::size_t one[] = {0};
  EXPECT_THROW((void)view.remove_pages(3, one), md::usage_error);
  const std::size_t beyond_count[] = {2};  // row 1 holds two blocks; index 2 is padding
  EXPECT_THROW((void)view.remove_pages(1, beyond_count), md::usage_error);
  const std::size_t twice[] = {0, 0};
  EXPECT_THROW((void)view.remove_pages(0, twice), md::usage_error);
  EXPECT_THROW((void)view.page_at(1, 2), md::usage_error);
  EXPECT_EQ(t.arrays(), before);
}

TEST(VllmBlockTable, ASequenceCommitsIntoItsRow) {
  table t;
  auto view = t.view();
  md::sequence seq(md::config{.page_size = P});
  seq.append(md::regions::scratchpad, P);
  seq.append(md::regions::user, P + 3);  // 3 pages, the last partial: row 2
  seq.advance_to(60);
  const auto plan = seq.select(1);
  ASSERT_EQ(plan.pages, std::vector<std::size_t>{0});
  EXPECT_EQ(seq.commit(plan, view, 2).removed, std::vector<std::int32_t>{7});
  EXPECT_EQ(t.counts[2], 2);
  EXPECT_EQ(view.page_at(2, 0), 30);
}

}  // namespace
