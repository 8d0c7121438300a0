// Tests for sequence_state.hpp (through token_state.hpp, which adds the MemDecay columns): appends, page layout, positions after eviction, prefix boundary, clock, digest.
#include <gtest/gtest.h>

#include <memdecay/core/token_state.hpp>

#include <vector>

namespace md = memdecay;

namespace {
using state4 = md::token_state<float, 4>;
}

TEST(SequenceState, AppendsSpansAndLabelsInPageOrder) {
  state4 s;
  const md::region_span spans[] = {{0, 3}, {2, 4}};
  s.append(spans);
  const md::region_id labels[] = {5, 6};
  s.append(labels);
  EXPECT_EQ(s.kv_len(), 9u);
  EXPECT_EQ(s.num_pages(), 3u);
  EXPECT_EQ(s.tokens_in_page(2), 1u);
  const std::vector<md::region_id> expected{0, 0, 0, 2, 2, 2, 2, 5, 6};
  EXPECT_EQ(std::vector<md::region_id>(s.regions().begin(), s.regions().end()), expected);
  for (float a : s.ewma()) EXPECT_EQ(a, 0.0f);
  for (md::step_t t : s.last_refresh()) EXPECT_EQ(t, 0u);
}

TEST(SequenceState, NewTokensAreFreshAtTheCurrentStep) {
  state4 s;
  s.append(std::vector<md::region_span>{{1, 2}});
  s.advance_to(7);
  s.append(std::vector<md::region_span>{{1, 2}});
  EXPECT_EQ(s.last_refresh()[0], 0u);
  EXPECT_EQ(s.last_refresh()[3], 7u);
}

TEST(SequenceState, ClockNeverGoesBackwards) {
  state4 s;
  s.advance_to(10);
  const auto g = s.generation();
  EXPECT_THROW(s.advance_to(9), md::input_error);
  EXPECT_EQ(s.now(), 10u);
  EXPECT_EQ(s.generation(), g);
  s.advance_to(10);  // standing still is allowed
  EXPECT_EQ(s.generation(), g);
}

TEST(SequenceState, RemovingPagesKeepsAbsolutePositions) {
  state4 s;
  s.append(std::vector<md::region_span>{{0, 4}, {1, 4}, {2, 4}, {3, 4}, {4, 2}});  // pages 0..4, last partial
  const std::size_t victims[] = {1, 3};
  s.remove_pages(victims);
  EXPECT_EQ(s.kv_len(), 10u);
  EXPECT_EQ(s.evicted_tokens(), 8u);
  EXPECT_EQ(s.logical_len(), 18u);
  const std::vector<std::uint64_t> positions{0, 1, 2, 3, 8, 9, 10, 11, 16, 17};
  EXPECT_EQ(s.positions(), positions);
  const std::vector<md::region_id> regions{0, 0, 0, 0, 2, 2, 2, 2, 4, 4};
  EXPECT_EQ(std::vector<md::region_id>(s.regions().begin(), s.regions().end()), regions);
  EXPECT_EQ(s.prefix_cache_boundary(), std::optional<std::uint64_t>(1));
  // Appending continues the positions and fills the partial page first.
  s.append(std::vector<md::region_span>{{5, 3}});
  EXPECT_EQ(s.position_of(10), 18u);
  EXPECT_EQ(s.position_of(11), 19u);
  EXPECT_EQ(s.position_of(12), 20u);
  EXPECT_EQ(s.num_pages(), 4u);
  EXPECT_EQ(s.page_origins()[3], 5u);
}

TEST(SequenceState, PrefixBoundaryIsEmptyUntilSomethingIsEvicted) {
  state4 s;
  s.append(std::vector<md::region_span>{{0, 12}});
  EXPECT_FALSE(s.prefix_cache_boundary().has_value());
  const std::size_t last_full[] = {2};
  s.remove_pages(last_full);
  EXPECT_EQ(s.prefix_cache_boundary(), std::optional<std::uint64_t>(2));
}

TEST(SequenceState, InvalidRemovalsChangeNothing) {
  state4 s;
  s.append(std::vector<md::region_span>{{0, 14}});
  const auto before = s.digest();
  const auto generation = s.generation();
  EXPECT_THROW(s.remove_pages(std::vector<std::size_t>{4}), md::usage_error);     // no such page
  EXPECT_THROW(s.remove_pages(std::vector<std::size_t>{3}), md::usage_error);     // the partial last page
  EXPECT_THROW(s.remove_pages(std::vector<std::size_t>{1, 1}), md::usage_error);  // duplicate
  EXPECT_THROW(s.remove_pages(std::vector<std::size_t>{2, 0}), md::usage_error);  // unsorted
  EXPECT_EQ(s.digest(), before);
  EXPECT_EQ(s.generation(), generation);
}

TEST(SequenceState, DigestSeesEveryField) {
  auto make = [] {
    md::token_state<float, 4> s;
    s.append(std::vector<md::region_span>{{1, 9}});
    return s;
  };
  const auto base = make().digest();
  EXPECT_EQ(make().digest(), base);  // deterministic
  auto clock = make();
  clock.advance_to(1);
  EXPECT_NE(clock.digest(), base);
  auto ewma = make();
  ewma.ewma_mut()[3] = 0.5f;
  EXPECT_NE(ewma.digest(), base);
  auto refresh = make();
  refresh.last_refresh_mut()[3] = 2;
  EXPECT_NE(refresh.digest(), base);
  auto label = make();
  label.append(std::vector<md::region_span>{{2, 1}});
  EXPECT_NE(label.digest(), base);
}

TEST(SequenceState, DynamicPageSizeMatchesCompileTime) {
  md::token_state<double, md::dynamic_page_size> d(8);
  md::token_state<double, 8> s;
  const std::vector<md::region_span> spans{{0, 5}, {3, 20}};
  d.append(spans);
  s.append(spans);
  const std::size_t victims[] = {0, 2};
  d.remove_pages(victims);
  s.remove_pages(victims);
  EXPECT_EQ(d.positions(), s.positions());
  EXPECT_EQ(d.digest(), s.digest());
}
