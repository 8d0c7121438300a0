// Tests for eviction.hpp: page scores by hand, page statuses, and the (score, page) selection order.
#include <gtest/gtest.h>

#include <memdecay/core/eviction.hpp>
#include <memdecay/core/sequence.hpp>
#include <memdecay/io/snapshot.hpp>

#include <algorithm>
#include <cmath>
#include <random>
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

// pinned_pages keeps one flag per page as tokens arrive and pages leave; a sequence's statuses read it instead of
// every label. Property: through random appends, evictions, protections and snapshot loads, the statuses equal the
// reference's, which reads the labels.
TEST(PinnedPages, StatusesEqualTheReferenceThroughAppendsEvictionsAndLoads) {
  std::mt19937_64 rng(1);
  std::size_t pinned_seen = 0, compared = 0;
  for (int trial = 0; trial < 200; ++trial) {
    md::config cfg{.page_size = 4};
    cfg.protection.sink_pages = rng() % 3;
    cfg.protection.recent_tokens = rng() % 10;
    md::sequence seq(cfg);
    for (md::step_t step = 1; step <= 30; ++step) {
      std::vector<md::region_id> labels(rng() % 7);
      for (auto& l : labels) l = rng() % 7 == 0 ? md::regions::system : static_cast<md::region_id>(1 + rng() % 6);
      seq.append_tokens(labels);
      seq.advance_to(step);
      if (rng() % 3 == 0) seq.commit(seq.select(rng() % 4));
      if (rng() % 7 == 0) {
        md::sequence loaded(cfg);
        md::snapshot::load(loaded, md::snapshot::save(seq));
        seq = loaded;
      }
      const std::vector<std::size_t> in_flight{static_cast<std::size_t>(rng() % 8)};
      std::vector<md::page_status> ref(seq.num_pages());
      md::page_statuses(seq.state(), seq.regions(), seq.protection(), in_flight, std::span<md::page_status>(ref));
      ASSERT_EQ(seq.page_statuses(in_flight), ref) << "trial " << trial << " step " << step;
      pinned_seen += static_cast<std::size_t>(std::count(ref.begin(), ref.end(), md::page_status::pinned));
      ++compared;
    }
  }
  EXPECT_GT(pinned_seen, compared) << "the episodes should hold pinned pages";
}

TEST(PinnedPages, FlagsFollowAppendsToThePartialPageAndRemovals) {
  md::region_table table = md::default_region_table();
  md::sequence_state<> s(4);
  md::pinned_pages pinned(table);
  auto append = [&](md::region_id r, std::size_t n) {
    const std::size_t first = s.kv_len();
    const md::region_span span[] = {{r, n}};
    s.append(span);
    pinned.reserve(s.num_pages());
    pinned.appended(s, first);
  };
  append(md::regions::user, 6);    // pages 0 (full), 1 (partial)
  append(md::regions::system, 1);  // the partial page 1 now holds a system token
  append(md::regions::user, 5);    // page 1 full, page 2 full
  EXPECT_EQ(std::vector<std::uint8_t>(pinned.flags().begin(), pinned.flags().end()),
            (std::vector<std::uint8_t>{0, 1, 0}));
  const std::size_t leave[] = {0};
  pinned.remove_pages(leave);
  s.remove_pages(leave);
  EXPECT_EQ(std::vector<std::uint8_t>(pinned.flags().begin(), pinned.flags().end()), (std::vector<std::uint8_t>{1, 0}));
  md::pinned_pages rebuilt(table);
  rebuilt.rebuild(s);
  EXPECT_TRUE(std::ranges::equal(rebuilt.flags(), pinned.flags()));
}
