// Tests for eviction.hpp: page scores by hand, page statuses, and the (score, page) selection order.
#include <gtest/gtest.h>

#include <memdecay/core/eviction.hpp>

#include <cmath>
#include <vector>

namespace md = memdecay;

namespace {
md::region_table three_regions() {
  return md::region_table({{"pin", 1.0, 0.0, true}, {"slow", 0.8, 0.01, false}, {"fast", 0.4, 0.2, false}});
}
}  // namespace

TEST(Eviction, PageScoreIsTheMeanOfTokenScores) {
  const auto table = three_regions();
  md::token_state<double, 4> s;
  s.append(std::vector<md::region_span>{{1, 2}, {2, 2}, {2, 3}});  // page 0: slow x2 + fast x2; page 1: fast x3
  s.advance_to(10);
  s.ewma_mut()[0] = 0.5;
  std::vector<double> scores(2);
  md::page_scores_reference(s, table, 2.0, std::span<double>(scores));
  const double slow = 0.8 * std::exp(-0.01 * 10), fast = 0.4 * std::exp(-0.2 * 10);
  EXPECT_NEAR(scores[0], (slow + 2.0 * 0.5 + slow + fast + fast) / 4.0, 1e-15);
  EXPECT_NEAR(scores[1], fast, 1e-15);  // the partial last page averages over its 3 tokens
}

TEST(Eviction, StatusesFollowTheOrderOfTheChecks) {
  const auto table = three_regions();
  md::token_state<float, 4> s;
  // pages: 0 slow, 1 slow+pin, 2 fast, 3 fast, 4 fast, 5 fast, 6 partial
  s.append(std::vector<md::region_span>{{1, 4}, {1, 3}, {0, 1}, {2, 16}, {2, 2}});
  std::vector<md::page_status> st(s.num_pages());
  md::page_statuses(s, table, md::protection_config{.sink_pages = 1, .recent_tokens = 5},
                    std::vector<std::size_t>{2, 99}, std::span<md::page_status>(st));
  using ps = md::page_status;
  EXPECT_EQ(st, (std::vector<ps>{ps::sink, ps::pinned, ps::protected_, ps::evictable, ps::evictable, ps::recent,
                                 ps::recent}));
  // Without protections only the pinned page and the partial last page are kept.
  md::page_statuses(s, table, md::protection_config{}, {}, std::span<md::page_status>(st));
  EXPECT_EQ(st, (std::vector<ps>{ps::evictable, ps::pinned, ps::evictable, ps::evictable, ps::evictable, ps::evictable,
                                 ps::partial}));
  EXPECT_STREQ(md::to_string(ps::protected_), "protected");
}

TEST(Eviction, SelectsTheLowestAndBreaksTiesByLowerIndex) {
  using ps = md::page_status;
  const std::vector<float> scores{0.5f, 0.1f, 0.3f, 0.1f, 0.0f, 0.1f};
  const std::vector<ps> status{ps::evictable, ps::evictable, ps::evictable, ps::evictable, ps::pinned, ps::evictable};
  EXPECT_EQ(md::select_lowest_pages<float>(scores, status, 2), (std::vector<std::size_t>{1, 3}));
  EXPECT_EQ(md::select_lowest_pages<float>(scores, status, 3), (std::vector<std::size_t>{1, 3, 5}));
  EXPECT_EQ(md::select_lowest_pages<float>(scores, status, 4), (std::vector<std::size_t>{1, 2, 3, 5}));
  EXPECT_EQ(md::select_lowest_pages<float>(scores, status, 99), (std::vector<std::size_t>{0, 1, 2, 3, 5}));
  EXPECT_TRUE(md::select_lowest_pages<float>(scores, status, 0).empty());
}
