// Tests for page_tables/flashinfer_csr.hpp: the CSR invariants FlashInfer relies on after a removal, and every
// kind of bad input rejected with the arrays untouched.
#include <gtest/gtest.h>

#include <memdecay/page_tables/flashinfer_csr.hpp>
#include <memdecay/core/sequence.hpp>

#include <cstdint>
#include <type_traits>
#include <vector>

namespace md = memdecay;

namespace {

constexpr std::size_t P = 16;

// A batch of three requests: 4 pages (last holds 5 tokens), 2 pages (last full), 3 pages (last holds 1 token).
struct batch {
  std::vector<std::int32_t> indptr{0, 4, 6, 9};
  std::vector<std::int32_t> indices{40, 41, 42, 43, 50, 51, 60, 61, 62, -1, -1};  // two spare entries
  std::vector<std::int32_t> last_page_len{5, 16, 1};
  md::flashinfer_csr view() { return md::flashinfer_csr(indptr, indices, last_page_len, P, 64); }
  auto arrays() const { return std::make_tuple(indptr, indices, last_page_len); }
};

TEST(FlashInferCsr, ArraysAreInt32) {
  static_assert(std::is_same_v<md::flashinfer_csr::page_id, std::int32_t>);
  static_assert(!std::is_constructible_v<md::flashinfer_csr, std::span<std::int64_t>, std::span<std::int64_t>,
                                         std::span<const std::int64_t>, std::size_t, std::size_t>,
                "int64 arrays must not be accepted: FlashInfer fails on them");
  SUCCEED();
}

TEST(FlashInferCsr, ReadsTheBatch) {
  batch b;
  auto csr = b.view();
  EXPECT_EQ(csr.batch_size(), 3u);
  EXPECT_EQ(csr.nnz(), 9u);
  EXPECT_EQ(csr.num_pages(1), 2u);
  EXPECT_EQ(csr.page_at(2, 1), 61);
  EXPECT_EQ(csr.kv_len(0), 3 * P + 5);
  EXPECT_EQ(csr.kv_len(1), 2 * P);
}

TEST(FlashInferCsr, RemovingPagesCompactsIndicesShiftsIndptrAndKeepsLastPageLen) {
  batch b;
  auto csr = b.view();
  const std::size_t victims[] = {0, 2};
  const auto removal = csr.remove_pages(0, victims);
  EXPECT_EQ(removal.removed, (std::vector<std::int32_t>{40, 42}));
  EXPECT_FALSE(removal.freed);
  EXPECT_EQ(removal.slots, (std::vector<md::slot_range>{{40 * P, 41 * P}, {42 * P, 43 * P}}));
  EXPECT_EQ(b.indptr, (std::vector<std::int32_t>{0, 2, 4, 7}));
  EXPECT_EQ(std::vector(b.indices.begin(), b.indices.begin() + 7),
            (std::vector<std::int32_t>{41, 43, 50, 51, 60, 61, 62}));
  EXPECT_EQ(b.last_page_len, (std::vector<std::int32_t>{5, 16, 1}));
  EXPECT_EQ(csr.kv_len(0), P + 5);
  EXPECT_EQ(csr.kv_len(2), 2 * P + 1);
  EXPECT_EQ(b.indices[9], -1) << "entries past the old nnz are never written";
  for (std::size_t r = 0; r < csr.batch_size(); ++r) {
    EXPECT_GT(b.last_page_len[r], 0);
    EXPECT_LE(b.last_page_len[r], static_cast<std::int32_t>(P));
  }
  EXPECT_NO_THROW(csr.validate());
}

TEST(FlashInferCsr, RemovingAFullLastPageLeavesAFullLastPage) {
  batch b;
  auto csr = b.view();
  const std::size_t victims[] = {1};
  (void)csr.remove_pages(1, victims);
  EXPECT_EQ(b.indptr, (std::vector<std::int32_t>{0, 4, 5, 8}));
  EXPECT_EQ(csr.kv_len(1), P);
  EXPECT_EQ(b.last_page_len[1], 16);
}

TEST(FlashInferCsr, RefusesToLeaveARequestWithoutPagesOrToDropAPartialLastPage) {
  batch b;
  auto csr = b.view();
  const auto before = b.arrays();
  const std::size_t both[] = {0, 1};
  EXPECT_THROW((void)csr.remove_pages(1, both), md::usage_error);
  const std::size_t partial[] = {3};
  EXPECT_THROW((void)csr.remove_pages(0, partial), md::usage_error);
  EXPECT_EQ(b.arrays(), before);
}

TEST(FlashInferCsr, CountsReferencesWithinTheBatch) {
  batch b;
  b.indices[6] = 41;  // request 2 shares request 0's second page (a common prefix page)
  auto csr = b.view();
  EXPECT_EQ(csr.ref_count(41), 2u);
  EXPECT_EQ(csr.ref_count(50), 1u);
  EXPECT_EQ(csr.ref_count(63), 0u);
  EXPECT_EQ(csr.ref_count(-1), 0u) << "spare entries past nnz are not references";
}

// Every inconsistency is reported on construction, and again by a removal after the engine broke the arrays.
struct corruption {
  const char* what;
  void (*apply)(batch&);
};
const corruption corruptions[] = {
    {"indptr not monotone", [](batch& b) { b.indptr[2] = 3; }},
    {"indptr[0] not zero", [](batch& b) { b.indptr[0] = 1; }},
    {"a request without pages", [](batch& b) { b.indptr[2] = 4; }},
    {"indptr past the indices", [](batch& b) { b.indptr[3] = 12; }},
    {"an index out of the pool", [](batch& b) { b.indices[5] = 64; }},
    {"a negative index", [](batch& b) { b.indices[7] = -3; }},
    {"a page listed twice in one request", [](batch& b) { b.indices[3] = 41; }},
    {"last_page_len of zero", [](batch& b) { b.last_page_len[2] = 0; }},
    {"last_page_len above the page size", [](batch& b) { b.last_page_len[0] = 17; }},
};

TEST(FlashInferCsr, RejectsInconsistentArraysOnConstruction) {
  for (const auto& c : corruptions) {
    batch b;
    c.apply(b);
    EXPECT_THROW((void)b.view(), md::input_error) << c.what;
  }
  batch wrong_size;
  wrong_size.last_page_len.push_back(3);
  EXPECT_THROW((void)wrong_size.view(), md::input_error) << "indptr must have batch + 1 entries";
  batch b;
  EXPECT_THROW(md::flashinfer_csr(b.indptr, b.indices, b.last_page_len, 12, 64), md::config_error);
}

TEST(FlashInferCsr, RejectsARemovalFromArraysTheEngineBrokeAndWritesNothing) {
  for (const auto& c : corruptions) {
    batch b;
    auto csr = b.view();
    c.apply(b);
    const auto before = b.arrays();
    const std::size_t victims[] = {0};
    EXPECT_THROW((void)csr.remove_pages(0, victims), md::input_error) << c.what;
    EXPECT_EQ(b.arrays(), before) << c.what;
  }
}

TEST(FlashInferCsr, ReadersReportArraysBrokenSinceConstructionInsteadOfReadingPastThem) {
  batch b;
  const auto csr = b.view();
  b.indptr[3] = 40;  // past the indices buffer
  EXPECT_THROW((void)csr.num_pages(2), md::input_error);
  EXPECT_THROW((void)csr.page_at(2, 20), md::input_error);
  EXPECT_THROW((void)csr.ref_count(41), md::input_error);
  b.indptr[3] = 9;
  b.last_page_len[1] = 0;
  EXPECT_THROW((void)csr.kv_len(1), md::input_error);
}

TEST(FlashInferCsr, RejectsUnknownRequestsAndBadPageListsWritingNothing) {
  batch b;
  auto csr = b.view();
  const auto before = b.arrays();
  const std::size_t one[] = {0};
  EXPECT_THROW((void)csr.remove_pages(3, one), md::usage_error);
  EXPECT_THROW((void)csr.num_pages(7), md::usage_error);
  const std::size_t twice[] = {1, 1};
  EXPECT_THROW((void)csr.remove_pages(0, twice), md::usage_error);
  const std::size_t unsorted[] = {2, 0};
  EXPECT_THROW((void)csr.remove_pages(0, unsorted), md::usage_error);
  const std::size_t out_of_range[] = {4};
  EXPECT_THROW((void)csr.remove_pages(0, out_of_range), md::usage_error);
  EXPECT_EQ(b.arrays(), before);
}

TEST(FlashInferCsr, ASequenceCommitsIntoItsRequestsRow) {
  batch b;
  auto csr = b.view();
  md::sequence seq(md::config{.page_size = P});
  seq.append(md::regions::user, P);
  seq.append(md::regions::scratchpad, P);
  seq.append(md::regions::user, 1);  // 3 pages, last holds 1 token: request 2
  seq.advance_to(60);
  const auto plan = seq.select(1);
  ASSERT_EQ(plan.pages, std::vector<std::size_t>{1});
  const auto removal = seq.commit(plan, csr, 2);
  EXPECT_EQ(removal.removed, std::vector<std::int32_t>{61});
  EXPECT_EQ(csr.kv_len(2), seq.kv_len());
}

// The batch removal the manager's commit uses must leave the arrays exactly as one removal per request does, in
// any order of the batch, and return what each of those removals returns.
TEST(FlashInferCsr, ABatchRemovalEqualsOneRemovalPerRequest) {
  const std::vector<std::size_t> of0{0, 2}, of1{1}, of2{0, 1};
  batch one_by_one;
  auto csr = one_by_one.view();
  const auto r2 = csr.remove_pages(2, of2);
  const auto r0 = csr.remove_pages(0, of0);
  const auto r1 = csr.remove_pages(1, of1);

  batch at_once;
  auto view = at_once.view();
  const std::vector<md::sequence_pages<std::size_t>> requests{{1, of1}, {2, of2}, {0, of0}};  // any order
  const auto removals = view.remove_pages_of(requests);
  ASSERT_EQ(removals.size(), 3u);
  EXPECT_EQ(removals[0], r1);
  EXPECT_EQ(removals[1], r2);
  EXPECT_EQ(removals[2], r0);
  EXPECT_EQ(at_once.indptr, one_by_one.indptr);
  EXPECT_EQ(at_once.last_page_len, one_by_one.last_page_len);
  EXPECT_EQ(std::vector(at_once.indices.begin(), at_once.indices.begin() + 4),
            std::vector(one_by_one.indices.begin(), one_by_one.indices.begin() + 4));
  EXPECT_EQ(at_once.indices[9], -1) << "entries past the old nnz are never written";
  EXPECT_EQ(at_once.indices[10], -1);
  EXPECT_EQ(at_once.indptr, (std::vector<std::int32_t>{0, 2, 3, 4}));
  EXPECT_EQ(std::vector(at_once.indices.begin(), at_once.indices.begin() + 4),
            (std::vector<std::int32_t>{41, 43, 50, 62}));
  view.validate();
}

TEST(FlashInferCsr, ABatchRemovalChecksEveryRequestBeforeWritingAny) {
  batch b;
  auto view = b.view();
  const auto before = b.arrays();
  const std::vector<std::size_t> fine{0}, partial{2}, all{0, 1};
  const std::vector<md::sequence_pages<std::size_t>> twice{{0, fine}, {0, fine}};
  EXPECT_THROW((void)view.remove_pages_of(twice), md::usage_error) << "a request named twice";
  const std::vector<md::sequence_pages<std::size_t>> last_bad{{0, fine}, {2, partial}};
  EXPECT_THROW((void)view.remove_pages_of(last_bad), md::usage_error) << "request 2's partial last page";
  const std::vector<md::sequence_pages<std::size_t>> empties{{0, fine}, {1, all}};
  EXPECT_THROW((void)view.remove_pages_of(empties), md::usage_error) << "every page of request 1";
  const std::vector<md::sequence_pages<std::size_t>> outside{{0, fine}, {3, fine}};
  EXPECT_THROW((void)view.remove_pages_of(outside), md::usage_error) << "a request outside the batch";
  EXPECT_EQ(b.arrays(), before);
  b.indices[7] = 99;  // request 2 names a page outside the pool
  EXPECT_THROW((void)view.remove_pages_of(last_bad), md::input_error);
  b.indices[7] = 61;
  EXPECT_EQ(b.arrays(), before);
}

}  // namespace
