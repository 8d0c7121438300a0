// digests/query_channels.hpp: keep_largest_query_channels keeps each head's largest channels (ties to the lower
// one), changes nothing on bad input, and the digest bound of the reduced query is Quest's bound over those channels.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include <memdecay/digests/page_digests.hpp>
#include <memdecay/digests/query_channels.hpp>

namespace {

using namespace memdecay;

// The reference: sort each head's channels by (|q| descending, channel ascending) and zero all but the first r.
std::vector<float> reference(std::vector<float> q, std::size_t head_dim, std::size_t r) {
  for (std::size_t h = 0; h < q.size(); h += head_dim) {
    std::vector<std::size_t> order(head_dim);
    for (std::size_t c = 0; c < head_dim; ++c) order[c] = c;
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return std::abs(q[h + a]) > std::abs(q[h + b]); });
    for (std::size_t i = r; i < head_dim; ++i) q[h + order[i]] = 0.0f;
  }
  return q;
}

TEST(KeepLargestQueryChannels, KeepsEachHeadsLargestMagnitudesAndTiesGoToTheLowerChannel) {
  std::vector<float> q{0.5f, -3.0f, 0.5f, 2.0f, /* head 1 */ -1.0f, 1.0f, 1.0f, -1.0f};
  keep_largest_query_channels(q, 4, 2);
  EXPECT_EQ(q, (std::vector<float>{0.0f, -3.0f, 0.0f, 2.0f, -1.0f, 1.0f, 0.0f, 0.0f}));
  std::vector<float> all{1.0f, -2.0f, 3.0f};
  keep_largest_query_channels(all, 3, 3);  // channels >= head_dim: unchanged
  EXPECT_EQ(all, (std::vector<float>{1.0f, -2.0f, 3.0f}));
  keep_largest_query_channels(all, 3, 9);
  EXPECT_EQ(all, (std::vector<float>{1.0f, -2.0f, 3.0f}));
  std::vector<float> none;
  EXPECT_NO_THROW(keep_largest_query_channels(none, 4, 1));  // no heads
}

TEST(KeepLargestQueryChannels, MatchesTheSortingReferenceOnRandomQueriesWithTies) {
  std::mt19937_64 rng(20261204);
  for (int trial = 0; trial < 300; ++trial) {
    const std::size_t head_dim = 1 + rng() % 40, heads = 1 + rng() % 6, r = 1 + rng() % (head_dim + 2);
    std::vector<float> q(heads * head_dim);
    for (float& x : q) x = static_cast<float>(static_cast<int>(rng() % 9) - 4) * 0.25f;  // many ties, zeros
    const auto want = reference(q, head_dim, r);
    keep_largest_query_channels(q, head_dim, r);
    ASSERT_EQ(q, want) << "trial " << trial;
  }
}

TEST(KeepLargestQueryChannels, RejectsBadInputByNameAndChangesNothing) {
  auto expect_input = [](std::vector<float> q, std::size_t head_dim, std::size_t r, const char* what) {
    const auto before = q;
    try {
      keep_largest_query_channels(q, head_dim, r);
      FAIL() << "accepted " << what;
    } catch (const input_error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
    EXPECT_EQ(q.size(), before.size());
    for (std::size_t i = 0; i < q.size(); ++i)
      EXPECT_TRUE(q[i] == before[i] || (std::isnan(q[i]) && std::isnan(before[i]))) << i;
  };
  expect_input({1, 2, 3, 4}, 0, 1, "head_dim = 0");
  expect_input({1, 2, 3, 4}, 2, 0, "channels = 0");
  expect_input({1, 2, 3, 4, 5}, 2, 1, "not a whole number of heads");
  expect_input({1, 2, std::numeric_limits<float>::quiet_NaN(), 4}, 2, 1, "query[2]");
  expect_input({1, 2, 3, std::numeric_limits<float>::infinity()}, 2, 1, "query[3]");
}

// What the recall reads: the digest's bound of the reduced query is Quest's bound summed over the kept channels
// only (a zero channel adds max(0 * min, 0 * max) = 0).
TEST(KeepLargestQueryChannels, TheDigestBoundOfTheReducedQueryIsTheBoundOverTheKeptChannels) {
  constexpr std::size_t kv = 2, dim = 8, tokens = 5, pages = 3, r = 3;
  page_digests d({.kv_heads = kv, .head_dim = dim, .query_heads = kv});
  d.resize(pages);
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<std::vector<float>> keys(pages, std::vector<float>(tokens * kv * dim));
  for (std::size_t p = 0; p < pages; ++p) {
    for (float& k : keys[p]) k = u(rng);
    d.set_from_keys(p, keys[p]);
  }
  std::vector<float> q(kv * dim);
  for (float& x : q) x = u(rng);
  std::vector<float> reduced = q;
  keep_largest_query_channels(reduced, dim, r);
  std::vector<float> bounds(kv * pages);
  d.bounds(reduced, bounds);
  const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
  for (std::size_t h = 0; h < kv; ++h)
    for (std::size_t p = 0; p < pages; ++p) {
      double want = 0;
      std::size_t kept = 0;
      for (std::size_t c = 0; c < dim; ++c) {
        if (reduced[h * dim + c] == 0.0f) continue;
        ++kept;
        float lo = std::numeric_limits<float>::infinity(), hi = -lo;
        for (std::size_t t = 0; t < tokens; ++t) {
          lo = std::min(lo, keys[p][(t * kv + h) * dim + c]);
          hi = std::max(hi, keys[p][(t * kv + h) * dim + c]);
        }
        want += std::max(static_cast<double>(q[h * dim + c]) * lo, static_cast<double>(q[h * dim + c]) * hi);
      }
      EXPECT_EQ(kept, r);
      EXPECT_NEAR(bounds[h * pages + p], want * scale, 1e-5) << "head " << h << " page " << p;
    }
}

}  // namespace
