// SPDX-License-Identifier: Apache-2.0
// tiers/host_store.hpp: host_block_store's bookkeeping (slots by (sequence, origin), the free list, short copies when
// the slots run out, a throwing copy storing nothing, errors), and a sequence committing through one: demotions and
// drops, recalls with room and through a full table, the K/V following every page.
#include <gtest/gtest.h>

#include <cstdint>
#include <stdexcept>
#include <vector>

#include <memdecay/memdecay.hpp>
#include <memdecay/page_tables/block_pool.hpp>
#include <memdecay/tiers/host_store.hpp>

#include "support/int_memory.hpp"

namespace md = memdecay;

namespace {

// 32 device blocks and 8 host slots of ints, zeroed (support/int_memory.hpp); `fail_at` makes the n-th copy throw.
struct memory : test_memory::int_memory {
  memory() : int_memory(32, 8, 0) {}
};
using copier = test_memory::int_copier;
using store_t = test_memory::int_store;
static_assert(md::host_store<store_t, std::uint64_t, std::int32_t>);

std::vector<std::size_t> free_list(const store_t& s) { return {s.free_list().begin(), s.free_list().end()}; }

}  // namespace

TEST(HostBlockStore, StoresAndLoadsPagesBySequenceAndOrigin) {
  memory m;
  store_t store(4, copier{&m});
  m.device[3] = 30, m.device[5] = 50;
  const std::uint64_t origins[] = {7, 9};
  const std::int32_t blocks[] = {3, 5};
  EXPECT_EQ(store.copy_to_host(1, origins, blocks), 2u);
  EXPECT_EQ(store.slot_of(1, 7), 0u);  // slot 0 first
  EXPECT_EQ(store.slot_of(1, 9), 1u);
  EXPECT_FALSE(store.slot_of(2, 7)) << "another sequence's page 7 is another page";
  EXPECT_EQ(store.used_slots(), 2u);
  EXPECT_EQ(store.free_slots(), 2u);
  const std::int32_t back[] = {11, 12};
  EXPECT_EQ(store.copy_to_device(1, origins, back), 2u);
  EXPECT_EQ(m.device[11], 30);
  EXPECT_EQ(m.device[12], 50);
  EXPECT_EQ(store.used_slots(), 2u) << "a copy back keeps the host copy until it is released";
}

TEST(HostBlockStore, CopiesAPrefixWhenTheSlotsRunOut) {
  memory m;
  store_t store(2, copier{&m});
  const std::uint64_t origins[] = {1, 2, 3};
  const std::int32_t blocks[] = {1, 2, 3};
  EXPECT_EQ(store.copy_to_host(0, origins, blocks), 2u);
  EXPECT_TRUE(store.slot_of(0, 1) && store.slot_of(0, 2));
  EXPECT_FALSE(store.slot_of(0, 3));
  EXPECT_EQ(store.free_slots(), 0u);
}

TEST(HostBlockStore, AThrowingCopyStoresNothingAndKeepsTheFreeList) {
  memory m;
  store_t store(4, copier{&m});
  const auto before = free_list(store);
  m.fail_at = 1;  // the second page
  const std::uint64_t origins[] = {1, 2, 3};
  const std::int32_t blocks[] = {1, 2, 3};
  EXPECT_THROW((void)store.copy_to_host(0, origins, blocks), std::runtime_error);
  EXPECT_EQ(store.used_slots(), 0u);
  EXPECT_EQ(free_list(store), before);
}

TEST(HostBlockStore, ReleasingWhatACopyTookRestoresTheFreeListExactly) {
  memory m;
  store_t store(4, copier{&m});
  const std::uint64_t first[] = {5};
  const std::int32_t b1[] = {1};
  ASSERT_EQ(store.copy_to_host(0, first, b1), 1u);
  const auto before = free_list(store);
  const std::uint64_t origins[] = {1, 2, 3};
  const std::int32_t blocks[] = {1, 2, 3};
  ASSERT_EQ(store.copy_to_host(0, origins, blocks), 3u);
  store.release(0, origins);
  EXPECT_EQ(free_list(store), before);
  store.release(0, origins);  // pages it does not hold are skipped
  EXPECT_EQ(free_list(store), before);
  store.close(0);
  EXPECT_EQ(store.used_slots(), 0u);
  EXPECT_EQ(store.free_slots(), 4u);
}

TEST(HostBlockStore, RejectsMismatchedListsAndPagesInTheWrongPlace) {
  memory m;
  store_t store(4, copier{&m});
  const std::uint64_t origins[] = {1, 2};
  const std::int32_t one[] = {1};
  const std::int32_t two[] = {1, 2};
  EXPECT_THROW((void)store.copy_to_host(0, origins, one), md::usage_error);
  EXPECT_THROW((void)store.copy_to_device(0, origins, two), md::usage_error) << "not on the host";
  ASSERT_EQ(store.copy_to_host(0, origins, two), 2u);
  EXPECT_THROW((void)store.copy_to_host(0, origins, two), md::usage_error) << "already on the host";
  EXPECT_EQ(store.used_slots(), 2u);
  m.device.assign(m.device.size(), -1);
  const std::uint64_t mixed[] = {1, 4};
  EXPECT_THROW((void)store.copy_to_device(0, mixed, two), md::usage_error);
  EXPECT_EQ(m.device[1], -1) << "a copy to the device checks every page before it copies";
}

// A sequence with a host tier committing through a block pool and a store: the K/V follows each page.
TEST(HostBlockStore, CarriesTheKvOfEveryDemotionDropAndRecall) {
  memory m;
  // The host tier holds 3 pages; the store has room for the pages a recall displaces (3 at most) beyond them,
  // because a recall keeps the promoted pages' host copies until it has succeeded.
  store_t store(6, copier{&m});
  md::block_pool<> pool(32, 4);
  md::sequence seq(md::config{.page_size = 4, .budget = md::budget_config::pages(4)});
  pool.open(0);
  for (int p = 0; p < 8; ++p) {
    seq.append(p == 0 ? md::regions::system : md::regions::retrieval, 4);
    pool.append_tokens(0, 4);
    m.device[static_cast<std::size_t>(pool.block_table(0).back())] = 100 + p;
  }
  seq.enable_host_tier({.host_budget = md::budget_config::pages(3)});
  auto kv_of = [&](std::size_t p) {
    return seq.residency(p) == md::page_residency::device
               ? m.device[static_cast<std::size_t>(pool.block_table(0)[seq.device_index(p)])]
               : m.host[*store.slot_of(0, seq.state().page_origins()[p])];
  };
  auto expect_kv_follows = [&] {
    for (std::size_t p = 0; p < seq.num_pages(); ++p)
      EXPECT_EQ(kv_of(p), 100 + static_cast<int>(seq.state().page_origins()[p])) << "page " << p;
    EXPECT_EQ(store.used_slots(), seq.host_pages());
  };
  const auto plan = seq.select_for_budget();
  ASSERT_EQ(plan.pages.size(), 4u);
  ASSERT_EQ(plan.demoted.size(), 3u);
  ASSERT_TRUE(plan.host_dropped.empty());
  (void)seq.commit(plan, pool, 0, store);
  EXPECT_EQ(seq.num_pages(), 7u) << "one victim dropped: the host tier holds 3";
  expect_kv_follows();

  // A query wants the host pages back; the device has no room under its budget, so each displaces one.
  std::vector<float> bounds(seq.num_pages(), 0.0f);
  for (std::size_t p = 0; p < seq.num_pages(); ++p)
    if (seq.residency(p) == md::page_residency::host) bounds[p] = 5.0f;
  auto recall = seq.select_recall_for_bounds(bounds);
  ASSERT_FALSE(recall.promote.empty());
  (void)seq.commit_recall(recall, pool, 0, store);
  expect_kv_follows();

  // The same through a full table: the recall swaps, and the K/V still follows.
  for (std::size_t p = 0; p < seq.num_pages(); ++p)
    bounds[p] = seq.residency(p) == md::page_residency::host ? 9.0f : 0.0f;
  pool.open(1);
  pool.append_tokens(1, pool.free_blocks() * 4);
  seq.advance_to(10);  // past min_device_steps
  recall = seq.select_recall_for_bounds(bounds);
  ASSERT_FALSE(recall.promote.empty());
  ASSERT_EQ(pool.free_blocks(), 0u);
  (void)seq.commit_recall(recall, pool, 0, store);
  expect_kv_follows();
}

TEST(HostBlockStore, AShortCopyIsAnInputErrorThatChangesNothing) {
  memory m;
  store_t store(1, copier{&m});  // room for one page
  md::block_pool<> pool(32, 4);
  md::sequence seq(md::config{.page_size = 4, .budget = md::budget_config::pages(2)});
  pool.open(0);
  seq.append(md::regions::retrieval, 24);
  pool.append_tokens(0, 24);
  seq.enable_host_tier({});  // the tier itself is unbounded: the store is what runs out
  const auto plan = seq.select_for_budget();
  ASSERT_GE(plan.demoted.size(), 2u);
  const auto digest = seq.digest();
  const auto table = std::vector<std::int32_t>(pool.block_table(0).begin(), pool.block_table(0).end());
  try {
    (void)seq.commit(plan, pool, 0, store);
    FAIL() << "a store with one slot cannot take " << plan.demoted.size() << " pages";
  } catch (const md::input_error& e) {
    EXPECT_NE(std::string(e.what()).find("host store copied 1 of"), std::string::npos) << e.what();
  }
  EXPECT_EQ(seq.digest(), digest);
  EXPECT_EQ(std::vector<std::int32_t>(pool.block_table(0).begin(), pool.block_table(0).end()), table);
  EXPECT_EQ(store.used_slots(), 0u);
}
