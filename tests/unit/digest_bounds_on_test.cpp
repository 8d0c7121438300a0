// digests/digest_bounds_on.hpp: the digest bounds split over an executor's threads are those of one call bit for
// bit (every storage, digest kind, query group and page count around the task size, every executor and thread
// count), and the sequence's query paths decide alike on a pool.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <memdecay/core/executor.hpp>
#include <memdecay/core/sequence.hpp>
#include <memdecay/digests/digest_bounds_on.hpp>
#include <memdecay/digests/page_digests.hpp>
#include <memdecay/digests/query_signal.hpp>

namespace {

using namespace memdecay;
namespace r = memdecay::regions;

// Runs the tasks last to first: an executor may run them in any order.
struct reversed_executor {
  std::size_t calls = 0;
  void operator()(std::size_t n, const std::function<void(std::size_t)>& task) {
    ++calls;
    for (std::size_t i = n; i-- > 0;) task(i);
  }
};

// Random digests on every page but every seventh (those bound +infinity).
page_digests random_digests(const digest_layout& layout, std::size_t pages, std::uint32_t seed) {
  page_digests d(layout);
  d.resize(pages);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  const std::size_t row = layout.kv_heads * layout.head_dim;
  for (std::size_t p = 0; p < pages; ++p) {
    if (p % 7 == 3) continue;
    std::vector<float> keys(3 * row);
    for (auto& k : keys) k = normal(rng);
    d.set_from_keys(p, keys);
  }
  return d;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  // memcmp of an empty vector's null data is undefined, even for 0 bytes.
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

TEST(DigestBoundsOn, TheTaskSizeIsWholeRegisterBlocksOnEveryIsa) {
  EXPECT_EQ(simd::digest_task_pages % simd::digest_block_accumulators<simd::native_isa>, 0u);
  EXPECT_EQ(simd::digest_task_pages % simd::digest_block_accumulators<simd::isa::scalar>, 0u);
}

TEST(DigestBoundsOn, SameBoundsBitForBitForEveryExecutorAndThreadCount) {
  thread_pool two(2), three_asleep(3, std::chrono::microseconds(0));
  constexpr std::size_t task = simd::digest_task_pages;
  std::uint32_t seed = 1;
  for (auto storage : {digest_storage::f32, digest_storage::f16, digest_storage::bf16})
    for (auto kind : {digest_kind::min_max, digest_kind::mean_key})
      for (std::size_t group : {1, 2, 4, 8})
        for (std::size_t dim : {32, 20}) {  // 20: no whole vector of AVX-512, the one-by-one path
          const digest_layout layout{
              .kv_heads = 2, .head_dim = dim, .query_heads = 2 * group, .kind = kind, .storage = storage};
          for (std::size_t pages : {std::size_t{0}, std::size_t{5}, task, task + 1, 2 * task + 13, 3 * task - 1}) {
            const auto d = random_digests(layout, pages, ++seed);
            std::mt19937 rng(seed);
            std::normal_distribution<float> normal;
            std::vector<float> query(layout.query_size());
            for (auto& q : query) q = normal(rng);
            const std::size_t n = layout.effective_query_heads() * pages;
            std::vector<float> one(n), on_two(n), on_three(n), reversed(n);
            d.bounds(query, one);
            d.bounds(query, on_two, two);
            d.bounds(query, on_three, three_asleep);
            reversed_executor backwards;
            d.bounds(query, reversed, backwards);
            const auto where = std::string(to_string(storage)) + " " + to_string(kind) + " group " +
                               std::to_string(group) + " dim " + std::to_string(dim) + " pages " +
                               std::to_string(pages);
            EXPECT_TRUE(same_bits(on_two, one)) << where;
            EXPECT_TRUE(same_bits(on_three, one)) << where;
            EXPECT_TRUE(same_bits(reversed, one)) << where;
            EXPECT_EQ(backwards.calls, pages > task ? 1u : 0u) << where << ": one call, only above one task";
            if (pages > 3) {
              EXPECT_EQ(one[3], std::numeric_limits<float>::infinity()) << where;
            }
          }
        }
}

TEST(DigestBoundsOn, TheKernelOnTasksIsTheKernelOnAllPages) {
  // Below page_digests: the raw kernel over an array whose page count leaves a partial block in the last task.
  const simd::digest_shape shape{4, 16, 32, digest_kind::min_max};
  const std::size_t pages = 2 * simd::digest_task_pages + 9, page_elems = 4 * 2 * 32;
  std::vector<float> digests(pages * page_elems), query(16 * 32), prepared(query.size());
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  for (auto& v : digests) v = normal(rng);
  for (auto& q : query) q = normal(rng);
  simd::prepare_digest_query(query.data(), 16, 32, 0.25f, prepared.data());
  std::vector<float> one(16 * pages), split(16 * pages);
  simd::digest_bounds(shape, digests.data(), pages, prepared.data(), one.data(), pages);
  thread_pool pool(2);
  digest_bounds_on(pool, shape, digests.data(), pages, prepared.data(), split.data(), pages);
  EXPECT_TRUE(same_bits(split, one));
  // Page-major on the pool: each task's results start at its first page's place in the stream.
  std::vector<float> by_page(16 * pages, -1.0f);
  digest_bounds_on(pool, shape, digests.data(), pages, prepared.data(), by_page.data(), simd::page_major(16));
  std::vector<float> transposed(16 * pages);
  for (std::size_t j = 0; j < 16; ++j)
    for (std::size_t p = 0; p < pages; ++p) transposed[j * pages + p] = by_page[p * 16 + j];
  EXPECT_TRUE(same_bits(transposed, one));
}

TEST(DigestBoundsOn, ABadQueryOnAPoolIsTheSameErrorAndWritesNothing) {
  const digest_layout layout{.kv_heads = 2, .head_dim = 16, .query_heads = 4};
  const auto d = random_digests(layout, 2 * simd::digest_task_pages, 5);
  thread_pool pool(2);
  std::vector<float> query(layout.query_size(), 0.5f), out(4 * d.num_pages(), -1.0f);
  query[9] = std::numeric_limits<float>::quiet_NaN();
  try {
    d.bounds(query, out, pool);
    FAIL() << "a NaN query was accepted";
  } catch (const input_error& e) {
    EXPECT_NE(std::string(e.what()).find("query[9]"), std::string::npos) << e.what();
  }
  for (float v : out) ASSERT_EQ(v, -1.0f);
  query[9] = 0.5f;
  query.pop_back();
  EXPECT_THROW(d.bounds(query, out, pool), input_error);
}

// A sequence of 1,201 pages of 4 tokens with digests on each (kv 2 x 16, 4 query heads), the budget keeping 1,000.
sequence long_tiered_sequence() {
  constexpr std::size_t P = 4;
  sequence seq(config{.alpha = 1.0,
                      .page_size = P,
                      .protection = {.sink_pages = 0, .recent_tokens = P},
                      .budget = budget_config::pages(1000)});
  seq.enable_digests({.kv_heads = 2, .head_dim = 16, .query_heads = 4, .storage = digest_storage::f16});
  seq.append(r::system, P);
  std::mt19937 rng(17);
  std::normal_distribution<float> normal;
  for (std::size_t p = 0; p < 1200; ++p) {
    seq.advance_to(static_cast<step_t>(p + 1));
    seq.append(p % 3 == 0 ? r::tool_out : r::user, P);
  }
  for (std::size_t p = 0; p < seq.num_pages(); ++p) {
    std::vector<float> keys(P * 2 * 16);
    for (auto& k : keys) k = normal(rng);
    seq.set_page_keys(p, keys);
  }
  seq.enable_host_tier({.hysteresis = 0.01});
  seq.commit(seq.select_for_budget());
  return seq;
}

TEST(DigestBoundsOn, TheEstimateOnAnExecutorIsTheEstimateOnOneThreadBitForBit) {
  // Pages past two of the estimate's page tasks (4,096 pages each), unknown (+inf, NaN) and impossible (-inf)
  // bounds among them, and one head whose every bound is -inf (every page alike).
  const std::size_t heads = 5, pages = 2 * 4096 + 37;
  std::vector<float> bounds(heads * pages);
  std::vector<std::uint32_t> tokens(pages);
  std::mt19937 rng(31);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  for (auto& b : bounds) b = normal(rng);
  for (auto& t : tokens) t = 1 + rng() % 16;
  for (std::size_t i = 0; i < bounds.size(); i += 101) bounds[i] = std::numeric_limits<float>::infinity();
  for (std::size_t i = 7; i < bounds.size(); i += 211) bounds[i] = std::numeric_limits<float>::quiet_NaN();
  for (std::size_t i = 13; i < bounds.size(); i += 307) bounds[i] = -std::numeric_limits<float>::infinity();
  std::fill(bounds.begin() + 3 * pages, bounds.begin() + 4 * pages, -std::numeric_limits<float>::infinity());
  thread_pool one(1), three(3);
  reversed_executor reversed;
  for (auto how : {query_signal::bound_softmax, query_signal::bound_softmax_tokens}) {
    std::vector<double> want(pages);
    estimate_page_attention<double>(bounds, heads, tokens, how, 2.0, std::span<double>(want));
    const auto same = [&](auto& exec, const char* name) {
      std::vector<double> got(pages, -1.0);
      estimate_page_attention<double>(bounds, heads, tokens, how, 2.0, std::span<double>(got), exec);
      ASSERT_EQ(std::memcmp(got.data(), want.data(), pages * sizeof(double)), 0) << name << " " << to_string(how);
    };
    same(one, "pool of 1");
    same(three, "pool of 3");
    same(reversed, "reversed");
  }
  EXPECT_GT(reversed.calls, 0u);
  // The same errors, and nothing written.
  std::vector<double> out(pages, -1.0);
  EXPECT_THROW(estimate_page_attention<double>(bounds, heads + 1, tokens, query_signal::bound_softmax, 1.0,
                                               std::span<double>(out), three),
               input_error);
  EXPECT_THROW(estimate_page_attention<double>(bounds, heads, tokens, query_signal::bound_softmax, -1.0,
                                               std::span<double>(out), three),
               input_error);
  EXPECT_THROW(estimate_page_attention<double>(bounds, heads, tokens, static_cast<query_signal>(9), 1.0,
                                               std::span<double>(out), three),
               input_error);
  EXPECT_EQ(std::count(out.begin(), out.end(), -1.0), static_cast<std::ptrdiff_t>(pages));
}

TEST(DigestBoundsOn, TheSequencesQueryPathsDecideAlikeOnAPool) {
  auto inline_seq = long_tiered_sequence(), pooled = long_tiered_sequence();
  ASSERT_GT(inline_seq.num_pages(), 2 * simd::digest_task_pages);
  ASSERT_GT(inline_seq.host_pages(), 0u);
  thread_pool pool(2);
  std::mt19937 rng(23);
  std::normal_distribution<float> normal;
  for (int step = 0; step < 3; ++step) {
    std::vector<float> query(4 * 16);
    for (auto& q : query) q = normal(rng);
    for (auto over : {head_bounds::max, head_bounds::mean, head_bounds::attention}) {
      const auto want = inline_seq.select_recall(query, {}, over);
      const auto got = pooled.select_recall(query, {}, over, pool);
      EXPECT_EQ(got.promote, want.promote);
      EXPECT_EQ(got.promote_bounds, want.promote_bounds);
      EXPECT_EQ(got.demote, want.demote);
      EXPECT_EQ(got.drop, want.drop);
    }
    EXPECT_EQ(pooled.estimate_query_attention(query, query_signal::bound_softmax, 1.0, pool),
              inline_seq.estimate_query_attention(query));
    EXPECT_EQ(pooled.observe_query(query, query_signal::bound_softmax, 1.0, pool), inline_seq.observe_query(query));
    const auto recall = inline_seq.select_recall(query);
    inline_seq.commit_recall(recall);
    pooled.commit_recall(pooled.select_recall(query, {}, head_bounds::max, pool));
    EXPECT_EQ(pooled.digest(), inline_seq.digest()) << "step " << step;
    inline_seq.advance_to(inline_seq.now() + 1);
    pooled.advance_to(pooled.now() + 1);
  }
}

}  // namespace
