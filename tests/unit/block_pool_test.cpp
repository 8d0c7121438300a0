// Tests for block_pool.hpp beyond the page-table conformance suite: the deterministic free list, exhaustion,
// reference-counted prefix sharing, and the invariants consistent() checks.
#include <gtest/gtest.h>

#include <memdecay/page_tables/block_pool.hpp>

#include <cstdint>
#include <vector>

namespace md = memdecay;

namespace {

constexpr std::size_t P = 16;

std::vector<std::int32_t> table_of(const md::block_pool<>& pool, std::uint64_t seq) {
  const auto t = pool.block_table(seq);
  return {t.begin(), t.end()};
}

TEST(BlockPool, RejectsAPageSizeThatIsNotAPowerOfTwoOrIdsThatDoNotFit) {
  EXPECT_THROW(md::block_pool<>(8, 0), md::config_error);
  EXPECT_THROW(md::block_pool<>(8, 12), md::config_error);
  EXPECT_THROW((md::block_pool<std::int8_t>(129, 16)), md::config_error);
  EXPECT_NO_THROW((md::block_pool<std::int8_t>(128, 16)));
}

TEST(BlockPool, HandsOutIdsInADeterministicOrderAndReusesTheLastFreedFirst) {
  md::block_pool<> pool(8, P);
  pool.open(1);
  pool.append_tokens(1, 3 * P + 1);
  EXPECT_EQ(table_of(pool, 1), (std::vector<std::int32_t>{0, 1, 2, 3}));
  const std::size_t victims[] = {1, 2};
  const auto removal = pool.remove_pages(1, victims);
  EXPECT_EQ(removal.removed, (std::vector<std::int32_t>{1, 2}));
  EXPECT_EQ(removal.freed, (std::vector<std::int32_t>{1, 2}));
  EXPECT_EQ(removal.slots, (std::vector<md::slot_range>{{P, 3 * P}}));
  pool.open(2);
  pool.append_tokens(2, 2 * P);
  EXPECT_EQ(table_of(pool, 2), (std::vector<std::int32_t>{2, 1}));
  EXPECT_TRUE(pool.consistent());
}

TEST(BlockPool, AllocatesNothingWhenExhausted) {
  md::block_pool<> pool(3, P);
  pool.open(1);
  pool.append_tokens(1, P + 1);
  EXPECT_THROW(pool.append_tokens(1, 2 * P), md::input_error);
  EXPECT_EQ(pool.num_tokens(1), P + 1);
  EXPECT_EQ(pool.free_blocks(), 1u);
  pool.append_tokens(1, P - 1);  // fills page 1 exactly: no new block
  EXPECT_EQ(pool.free_blocks(), 1u);
  EXPECT_TRUE(pool.consistent());
}

TEST(BlockPool, OpenAndCloseRejectMisuse) {
  md::block_pool<> pool(4, P);
  pool.open(1);
  EXPECT_THROW(pool.open(1), md::usage_error);
  EXPECT_THROW(pool.close(2), md::usage_error);
  EXPECT_THROW(pool.append_tokens(2, 1), md::usage_error);
  EXPECT_THROW((void)pool.ref_count(4), md::input_error);
  EXPECT_THROW((void)pool.ref_count(-1), md::input_error);
}

TEST(BlockPool, SharedPrefixBlocksAreFreedOnlyByTheirLastHolder) {
  md::block_pool<> pool(16, P);
  pool.open(1);
  pool.append_tokens(1, 4 * P + 5);
  pool.open(2);
  pool.share_prefix(1, 2, 3);
  pool.append_tokens(2, P + 2);  // sequence 2 grows on its own blocks
  EXPECT_EQ(table_of(pool, 2), (std::vector<std::int32_t>{0, 1, 2, 5, 6}));
  EXPECT_EQ(pool.ref_count(1), 2u);
  EXPECT_EQ(pool.ref_count(3), 1u);
  EXPECT_EQ(pool.ref_count(9), 0u);
  EXPECT_TRUE(pool.consistent());

  const std::size_t victims[] = {0, 1, 3};
  const auto removal = pool.remove_pages(2, victims);
  EXPECT_EQ(removal.removed, (std::vector<std::int32_t>{0, 1, 5})) << "removed from sequence 2";
  EXPECT_EQ(removal.freed, std::vector<std::int32_t>{5}) << "blocks 0 and 1 are still held by 1";
  EXPECT_EQ(pool.ref_count(0), 1u);
  EXPECT_EQ(table_of(pool, 2), (std::vector<std::int32_t>{2, 6}));
  const std::size_t first[] = {0};
  EXPECT_EQ(pool.remove_pages(1, first).freed, std::vector<std::int32_t>{0}) << "the last holder frees it";
  EXPECT_TRUE(pool.consistent());

  const std::size_t before = pool.free_blocks();
  pool.close(2);  // block 2 is still held by sequence 1; block 6 is freed
  EXPECT_EQ(pool.free_blocks(), before + 1);
  EXPECT_EQ(pool.ref_count(2), 1u);
  EXPECT_TRUE(pool.consistent());
}

TEST(BlockPool, SharePrefixRejectsMisuseChangingNothing) {
  md::block_pool<> pool(16, P);
  pool.open(1);
  pool.append_tokens(1, 2 * P + 3);
  pool.open(2);
  pool.open(3);
  pool.append_tokens(3, 1);
  EXPECT_THROW(pool.share_prefix(1, 2, 3), md::usage_error) << "page 2 is partial";
  EXPECT_THROW(pool.share_prefix(1, 3, 1), md::usage_error) << "the target is not empty";
  EXPECT_THROW(pool.share_prefix(1, 1, 1), md::usage_error);
  EXPECT_THROW(pool.share_prefix(9, 2, 1), md::usage_error);
  EXPECT_EQ(pool.num_pages(2), 0u);
  EXPECT_EQ(pool.ref_count(0), 1u);
  EXPECT_TRUE(pool.consistent());
}

TEST(BlockPool, RemovingRejectsPartialPagesAndBadListsChangingNothing) {
  md::block_pool<> pool(8, P);
  pool.open(1);
  pool.append_tokens(1, 3 * P + 2);
  const auto table = table_of(pool, 1);
  for (const auto& pages : std::vector<std::vector<std::size_t>>{{3}, {1, 0}, {2, 2}, {4}}) {
    EXPECT_THROW(pool.check_remove_pages(1, pages), md::usage_error);
    EXPECT_THROW((void)pool.remove_pages(1, pages), md::usage_error);
  }
  EXPECT_EQ(table_of(pool, 1), table);
  EXPECT_EQ(pool.num_tokens(1), 3 * P + 2);
  EXPECT_EQ(pool.free_blocks(), 4u);
}

}  // namespace
