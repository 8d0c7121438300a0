// The page-table contract, checked against every implementation: the owning block_pool and the non-owning
// FlashInfer CSR, vLLM block-table and SGLang req_to_token views. Each harness builds the same batch (three
// sequences of 100, 64 and 37 tokens, 16-token pages, distinct physical memory) in its table's own format; the
// typed tests then use only the page_table concept, plus the harness to read the underlying memory.
#include <gtest/gtest.h>

#include <memdecay/page_tables/block_pool.hpp>
#include <memdecay/page_tables/page_table.hpp>
#include <memdecay/page_tables/flashinfer_csr.hpp>
#include <memdecay/page_tables/sglang_req_to_token.hpp>
#include <memdecay/page_tables/vllm_block_table.hpp>
#include <memdecay/core/sequence.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <vector>

namespace md = memdecay;

namespace {

constexpr std::size_t page = 16;
const std::vector<std::size_t> tokens_per_sequence = {100, 64, 37};  // 7 pages (last partial), 4 full, 3

std::size_t pages_for(std::size_t tokens) { return (tokens + page - 1) / page; }

// Physical pages are handed out in a scrambled order so that a table that confused logical and physical
// indices would fail.
std::vector<std::int32_t> scrambled_ids(std::size_t n) {
  std::vector<std::int32_t> ids(n);
  for (std::size_t i = 0; i < n; ++i) ids[i] = static_cast<std::int32_t>((i * 7 + 3) % n);
  return ids;
}

struct block_pool_harness {
  static constexpr bool owns_references = true;
  using table_type = md::block_pool<>;
  static constexpr bool knows_partial_last_page = true;
  table_type pool{64, page};
  block_pool_harness() {
    for (std::size_t s = 0; s < tokens_per_sequence.size(); ++s) {
      pool.open(10 + s);
      pool.append_tokens(10 + s, tokens_per_sequence[s]);
    }
  }
  table_type& table() { return pool; }
  table_type::sequence_id id(std::size_t s) const { return 10 + s; }
  // The memory a logical page occupies, in the table's units (here: one block id).
  std::vector<std::int64_t> memory_of(std::size_t s, std::size_t i) const { return {pool.page_at(id(s), i)}; }
  // The KV slots a logical page occupies: a block table's block b holds [b * page, (b + 1) * page).
  std::vector<std::int64_t> slots_of(std::size_t s, std::size_t i) const {
    std::vector<std::int64_t> out(page);
    for (std::size_t k = 0; k < page; ++k) out[k] = static_cast<std::int64_t>(pool.page_at(id(s), i)) * page + k;
    return out;
  }
  std::vector<std::int64_t> snapshot() const {
    std::vector<std::int64_t> out{static_cast<std::int64_t>(pool.free_blocks())};
    for (std::size_t s = 0; s < tokens_per_sequence.size(); ++s) {
      out.push_back(static_cast<std::int64_t>(pool.num_tokens(id(s))));
      for (auto b : pool.block_table(id(s))) out.push_back(b);
    }
    return out;
  }
};

struct flashinfer_harness {
  static constexpr bool owns_references = false;  // the engine's allocator counts references
  using table_type = md::flashinfer_csr;
  static constexpr bool knows_partial_last_page = true;
  std::vector<std::int32_t> indptr{0}, indices, last_page_len;
  table_type csr;
  static table_type make(flashinfer_harness& h) {
    const auto ids = scrambled_ids(64);
    std::size_t next = 0;
    for (std::size_t tokens : tokens_per_sequence) {
      for (std::size_t i = 0; i < pages_for(tokens); ++i) h.indices.push_back(ids[next++]);
      h.indptr.push_back(static_cast<std::int32_t>(h.indices.size()));
      h.last_page_len.push_back(static_cast<std::int32_t>(tokens - (pages_for(tokens) - 1) * page));
    }
    h.indices.resize(h.indices.size() + 5, -7);  // spare capacity the engine allocated, never read
    return table_type(h.indptr, h.indices, h.last_page_len, page, 64);
  }
  flashinfer_harness() : csr(make(*this)) {}
  table_type& table() { return csr; }
  table_type::sequence_id id(std::size_t s) const { return s; }
  std::vector<std::int64_t> memory_of(std::size_t s, std::size_t i) const { return {csr.page_at(s, i)}; }
  // The KV slots a logical page occupies: a block table's block b holds [b * page, (b + 1) * page).
  std::vector<std::int64_t> slots_of(std::size_t s, std::size_t i) const {
    std::vector<std::int64_t> out(page);
    for (std::size_t k = 0; k < page; ++k) out[k] = static_cast<std::int64_t>(csr.page_at(id(s), i)) * page + k;
    return out;
  }
  std::vector<std::int64_t> snapshot() const {
    std::vector<std::int64_t> out(indptr.begin(), indptr.end());
    out.insert(out.end(), indices.begin(), indices.end());
    out.insert(out.end(), last_page_len.begin(), last_page_len.end());
    return out;
  }
};

struct vllm_harness {
  static constexpr bool owns_references = false;  // the engine's allocator counts references
  using table_type = md::vllm_block_table;
  static constexpr bool knows_partial_last_page = false;  // a row has no token count
  static constexpr std::size_t stride = 10;
  std::vector<std::int32_t> blocks, counts;
  table_type view;
  static table_type make(vllm_harness& h) {
    const auto ids = scrambled_ids(64);
    h.blocks.assign(tokens_per_sequence.size() * stride, 0);
    std::size_t next = 0;
    for (std::size_t s = 0; s < tokens_per_sequence.size(); ++s) {
      const std::size_t n = pages_for(tokens_per_sequence[s]);
      for (std::size_t i = 0; i < n; ++i) h.blocks[s * stride + i] = ids[next++];
      h.counts.push_back(static_cast<std::int32_t>(n));
    }
    return table_type(h.blocks, h.counts, stride, page, 64);
  }
  vllm_harness() : view(make(*this)) {}
  table_type& table() { return view; }
  table_type::sequence_id id(std::size_t s) const { return s; }
  std::vector<std::int64_t> memory_of(std::size_t s, std::size_t i) const { return {view.page_at(s, i)}; }
  // The KV slots a logical page occupies: a block table's block b holds [b * page, (b + 1) * page).
  std::vector<std::int64_t> slots_of(std::size_t s, std::size_t i) const {
    std::vector<std::int64_t> out(page);
    for (std::size_t k = 0; k < page; ++k) out[k] = static_cast<std::int64_t>(view.page_at(id(s), i)) * page + k;
    return out;
  }
  std::vector<std::int64_t> snapshot() const {
    std::vector<std::int64_t> out(blocks.begin(), blocks.end());
    out.insert(out.end(), counts.begin(), counts.end());
    return out;
  }
};

struct sglang_harness {
  static constexpr bool owns_references = false;  // the engine's allocator counts references
  using table_type = md::sglang_req_to_token;
  static constexpr bool knows_partial_last_page = true;
  static constexpr std::size_t max_context = 128;
  std::vector<std::int32_t> slots;
  std::vector<std::int64_t> lens;
  table_type view;
  static table_type make(sglang_harness& h) {
    // Token slots come from scrambled pages of a 64-page KV pool, as SGLang's paged allocator hands them out.
    const auto ids = scrambled_ids(64);
    h.slots.assign(tokens_per_sequence.size() * max_context, 0);
    std::size_t next = 0;
    for (std::size_t s = 0; s < tokens_per_sequence.size(); ++s) {
      for (std::size_t i = 0; i < pages_for(tokens_per_sequence[s]); ++i, ++next)
        for (std::size_t k = 0; k < page && i * page + k < tokens_per_sequence[s]; ++k)
          h.slots[s * max_context + i * page + k] = static_cast<std::int32_t>(ids[next] * page + k);
      h.lens.push_back(static_cast<std::int64_t>(tokens_per_sequence[s]));
    }
    return table_type(h.slots, h.lens, max_context, page, 64 * page);
  }
  sglang_harness() : view(make(*this)) {}
  table_type& table() { return view; }
  table_type::sequence_id id(std::size_t s) const { return s; }
  std::vector<std::int64_t> memory_of(std::size_t s, std::size_t i) const {
    const auto row = view.row_slots(s);
    const std::size_t end = std::min(row.size(), (i + 1) * page);
    return {row.begin() + static_cast<std::ptrdiff_t>(i * page), row.begin() + static_cast<std::ptrdiff_t>(end)};
  }
  std::vector<std::int64_t> slots_of(std::size_t s, std::size_t i) const { return memory_of(s, i); }
  std::vector<std::int64_t> snapshot() const {
    std::vector<std::int64_t> out(slots.begin(), slots.end());
    out.insert(out.end(), lens.begin(), lens.end());
    return out;
  }
};

template <class Harness>
class PageTableConformance : public ::testing::Test {
 protected:
  Harness h;
  auto& table() { return h.table(); }
  auto id(std::size_t s) const { return h.id(s); }
  std::vector<std::vector<std::int64_t>> memory_of_all(std::size_t s) {
    std::vector<std::vector<std::int64_t>> out;
    for (std::size_t i = 0; i < h.table().num_pages(h.id(s)); ++i) out.push_back(h.memory_of(s, i));
    return out;
  }
};

using Harnesses = ::testing::Types<block_pool_harness, flashinfer_harness, vllm_harness, sglang_harness>;
class HarnessNames {
 public:
  template <class T>
  static std::string GetName(int) {
    if constexpr (std::is_same_v<T, block_pool_harness>) return "block_pool";
    if constexpr (std::is_same_v<T, flashinfer_harness>) return "flashinfer_csr";
    if constexpr (std::is_same_v<T, vllm_harness>) return "vllm_block_table";
    if constexpr (std::is_same_v<T, sglang_harness>) return "sglang_req_to_token";
    return "?";
  }
};
TYPED_TEST_SUITE(PageTableConformance, Harnesses, HarnessNames);

TYPED_TEST(PageTableConformance, ModelsTheConcepts) {
  using table_type = typename TypeParam::table_type;
  static_assert(md::page_table<table_type>);
  static_assert(md::checked_page_table<table_type>);
  EXPECT_EQ(this->table().page_size(), page);
}

TYPED_TEST(PageTableConformance, CountsPagesOfEverySequence) {
  for (std::size_t s = 0; s < tokens_per_sequence.size(); ++s)
    EXPECT_EQ(this->table().num_pages(this->id(s)), pages_for(tokens_per_sequence[s])) << "sequence " << s;
}

TYPED_TEST(PageTableConformance, PagesOfTheBatchOccupyDistinctMemory) {
  std::vector<std::int64_t> all;
  for (std::size_t s = 0; s < tokens_per_sequence.size(); ++s)
    for (const auto& units : this->memory_of_all(s)) all.insert(all.end(), units.begin(), units.end());
  std::sort(all.begin(), all.end());
  EXPECT_EQ(std::adjacent_find(all.begin(), all.end()), all.end());
}

TYPED_TEST(PageTableConformance, RemovingPagesCompactsInOrderAndReleasesExactlyTheirMemory) {
  const auto before = this->memory_of_all(0);
  const auto others_before = std::vector{this->memory_of_all(1), this->memory_of_all(2)};
  const std::size_t victims[] = {1, 3, 4};
  std::vector<typename TypeParam::table_type::page_id> ids;
  std::vector<std::int64_t> wanted;
  for (std::size_t v : victims) {
    ids.push_back(this->table().page_at(this->id(0), v));
    const auto slots = this->h.slots_of(0, v);
    wanted.insert(wanted.end(), slots.begin(), slots.end());
  }
  const auto removal = this->table().remove_pages(this->id(0), victims);

  std::vector<std::vector<std::int64_t>> expected;
  for (std::size_t i = 0; i < before.size(); ++i)
    if (i != 1 && i != 3 && i != 4) expected.push_back(before[i]);
  EXPECT_EQ(this->memory_of_all(0), expected);
  EXPECT_EQ(this->table().num_pages(this->id(0)), before.size() - 3);

  EXPECT_EQ(removal.removed, ids) << "every removed page, in logical order";
  if (TypeParam::owns_references)
    EXPECT_EQ(removal.freed, ids) << "no page is shared here, so every removed page is freed";
  else
    EXPECT_FALSE(removal.freed) << "a view cannot know what the engine's allocator frees";
  EXPECT_EQ(removal.slots, md::merge_slots(wanted)) << "the slots of exactly the removed pages";

  EXPECT_EQ(this->memory_of_all(1), others_before[0]) << "another sequence changed";
  EXPECT_EQ(this->memory_of_all(2), others_before[1]) << "another sequence changed";
}

TYPED_TEST(PageTableConformance, RemovingTheFirstPagesOfAMiddleSequenceLeavesItsNeighboursIntact) {
  const auto first = this->memory_of_all(0), middle = this->memory_of_all(1), last = this->memory_of_all(2);
  const std::size_t victims[] = {0, 1};
  (void)this->table().remove_pages(this->id(1), victims);
  EXPECT_EQ(this->memory_of_all(0), first);
  EXPECT_EQ(this->memory_of_all(1), (std::vector{middle[2], middle[3]}));
  EXPECT_EQ(this->memory_of_all(2), last);
}

TYPED_TEST(PageTableConformance, AnEmptyRemovalChangesNothing) {
  const auto before = this->h.snapshot();
  const auto removal = this->table().remove_pages(this->id(0), std::span<const std::size_t>{});
  EXPECT_TRUE(removal.removed.empty());
  EXPECT_TRUE(removal.slots.empty());
  EXPECT_EQ(this->h.snapshot(), before);
}

TYPED_TEST(PageTableConformance, RejectsBadPageListsAndChangesNothing) {
  const auto before = this->h.snapshot();
  const std::vector<std::vector<std::size_t>> bad = {{7}, {2, 1}, {1, 1}, {0, 99}};
  for (const auto& pages : bad) {
    EXPECT_THROW(this->table().check_remove_pages(this->id(0), pages), md::usage_error);
    EXPECT_THROW((void)this->table().remove_pages(this->id(0), pages), md::usage_error);
    EXPECT_EQ(this->h.snapshot(), before);
  }
}

TYPED_TEST(PageTableConformance, RejectsAnUnknownSequenceAndChangesNothing) {
  const auto before = this->h.snapshot();
  const std::size_t victims[] = {0};
  const auto unknown = this->id(0) + 1000;
  EXPECT_THROW((void)this->table().num_pages(unknown), md::usage_error);
  EXPECT_THROW((void)this->table().page_at(unknown, 0), md::usage_error);
  EXPECT_THROW((void)this->table().remove_pages(unknown, victims), md::usage_error);
  EXPECT_THROW((void)this->table().page_at(this->id(1), 4), md::usage_error);
  EXPECT_EQ(this->h.snapshot(), before);
}

TYPED_TEST(PageTableConformance, RefusesThePartialLastPage) {
  if (!TypeParam::knows_partial_last_page) GTEST_SKIP() << "this table does not record token counts";
  const auto before = this->h.snapshot();
  const std::size_t victims[] = {2, 6};  // page 6 of sequence 0 holds 4 of 16 tokens
  EXPECT_THROW(this->table().check_remove_pages(this->id(0), victims), md::usage_error);
  EXPECT_THROW((void)this->table().remove_pages(this->id(0), victims), md::usage_error);
  EXPECT_EQ(this->h.snapshot(), before);
}

TYPED_TEST(PageTableConformance, RemovesAFullLastPage) {
  const auto before = this->memory_of_all(1);  // 64 tokens: four full pages
  const std::size_t victims[] = {3};
  (void)this->table().remove_pages(this->id(1), victims);
  EXPECT_EQ(this->memory_of_all(1), (std::vector{before[0], before[1], before[2]}));
}

TYPED_TEST(PageTableConformance, RepeatedRemovalsKeepTheRestInOrder) {
  auto expected = this->memory_of_all(0);
  // Always the second page, until two are left: the survivors' order must never change.
  while (expected.size() > 2) {
    const std::size_t victims[] = {1};
    (void)this->table().remove_pages(this->id(0), victims);
    expected.erase(expected.begin() + 1);
    ASSERT_EQ(this->memory_of_all(0), expected);
  }
}

TYPED_TEST(PageTableConformance, CommitsAPlanTogetherWithTheSequence) {
  md::sequence seq(md::config{.page_size = page});
  seq.append(md::regions::scratchpad, 48);
  seq.append(md::regions::user, 52);  // 100 tokens, like sequence 0
  seq.advance_to(50);
  const auto plan = seq.select(2);
  ASSERT_EQ(plan.pages, (std::vector<std::size_t>{0, 1}));  // the scratchpad pages decay fastest
  const auto before = this->memory_of_all(0);
  seq.commit(plan, this->table(), this->id(0));
  EXPECT_EQ(seq.num_pages(), this->table().num_pages(this->id(0)));
  EXPECT_EQ(this->memory_of_all(0), std::vector(before.begin() + 2, before.end()));
}

TYPED_TEST(PageTableConformance, ACommitTheTableRefusesLeavesTheSequenceUnchanged) {
  md::sequence seq(md::config{.page_size = page});
  seq.append(md::regions::scratchpad, 64);  // 4 pages; the table's sequence 0 has 7
  seq.advance_to(50);
  const auto plan = seq.select(1);
  const auto table_before = this->h.snapshot();
  const auto digest = seq.digest();
  EXPECT_THROW(seq.commit(plan, this->table(), this->id(0)), md::usage_error);
  EXPECT_EQ(seq.digest(), digest);
  EXPECT_EQ(this->h.snapshot(), table_before);
}

}  // namespace
