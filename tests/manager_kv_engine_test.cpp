// A small engine with real K and V tensors (float arrays) in blocks of the owning block pool, driven by the
// manager. It appends agent segments with region labels, rotates keys with RoPE at their absolute positions when
// they are written, computes attention for a query through the block table, feeds the mass back, evicts and
// compacts. The test shows that attention over the survivors, read through the compacted block table, equals
// attention computed directly over the same surviving tokens at their original positions, and differs from the
// same tokens renumbered (which is why positions must stay absolute).
#include <gtest/gtest.h>

#include <memdecay/block_pool.hpp>
#include <memdecay/manager.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace md = memdecay;

namespace {

constexpr std::size_t P = 16;
constexpr std::size_t dim = 8;
using vec = std::vector<float>;

// The un-rotated key and the value of the token at absolute position `pos` of request `id`: a pure function, so
// the reference can rebuild any token without the cache.
vec base_key(std::uint64_t id, std::uint64_t pos) {
  vec k(dim);
  for (std::size_t j = 0; j < dim; ++j) k[j] = std::sin(0.37f * static_cast<float>(pos * (j + 1) + id * 11) + 0.1f * j);
  return k;
}
vec value(std::uint64_t id, std::uint64_t pos) {
  vec v(dim);
  for (std::size_t j = 0; j < dim; ++j) v[j] = std::cos(0.23f * static_cast<float>(pos + j * 5 + id));
  return v;
}
// RoPE: rotates pairs (2j, 2j+1) by pos * 10000^(-2j/dim).
vec rope(vec x, std::uint64_t pos) {
  for (std::size_t j = 0; j < dim / 2; ++j) {
    const double theta = static_cast<double>(pos) * std::pow(10000.0, -2.0 * static_cast<double>(j) / dim);
    const float c = static_cast<float>(std::cos(theta)), s = static_cast<float>(std::sin(theta));
    const float a = x[2 * j], b = x[2 * j + 1];
    x[2 * j] = a * c - b * s;
    x[2 * j + 1] = a * s + b * c;
  }
  return x;
}

struct attention_result {
  vec probabilities;  // per resident token, in page order
  vec output;
};

// Softmax attention of `q` over keys and values, in the order given.
attention_result attend(const vec& q, const std::vector<vec>& keys, const std::vector<vec>& values) {
  attention_result r{vec(keys.size()), vec(dim, 0.0f)};
  float max_logit = -INFINITY;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    float dot = 0;
    for (std::size_t j = 0; j < dim; ++j) dot += q[j] * keys[i][j];
    r.probabilities[i] = dot / std::sqrt(static_cast<float>(dim));
    max_logit = std::max(max_logit, r.probabilities[i]);
  }
  float sum = 0;
  for (auto& p : r.probabilities) sum += (p = std::exp(p - max_logit));
  for (std::size_t i = 0; i < keys.size(); ++i) {
    r.probabilities[i] /= sum;
    for (std::size_t j = 0; j < dim; ++j) r.output[j] += r.probabilities[i] * values[i][j];
  }
  return r;
}

class tiny_engine {
 public:
  static constexpr std::size_t num_blocks = 48;
  md::manager mgr{{.page_size = P, .global = md::global_budget::pages(20, 16)}};
  md::block_pool<> pool{num_blocks, P};
  vec k_cache = vec(num_blocks * P * dim), v_cache = vec(num_blocks * P * dim);

  void open(std::uint64_t id) {
    mgr.open(id, md::config{.alpha = 1.0, .tau = 2.0, .page_size = P,
                            .normalization = md::attention_normalization::uniform,
                            .protection = {.sink_pages = 1, .recent_tokens = P}});
    pool.open(id);
  }
  // Appends a segment: labels it, allocates blocks, and writes each token's rotated key and value into its slot.
  void append(std::uint64_t id, md::region_id region, std::size_t tokens) {
    auto& seq = mgr.at(id);
    const std::size_t first_slot = seq.kv_len();
    const std::uint64_t first_pos = seq.logical_len();
    seq.append(region, tokens);
    pool.append_tokens(id, tokens);
    for (std::size_t t = 0; t < tokens; ++t) {
      const std::size_t slot = cache_index(id, first_slot + t);
      const auto k = rope(base_key(id, first_pos + t), first_pos + t);
      const auto v = value(id, first_pos + t);
      std::copy(k.begin(), k.end(), k_cache.begin() + static_cast<std::ptrdiff_t>(slot * dim));
      std::copy(v.begin(), v.end(), v_cache.begin() + static_cast<std::ptrdiff_t>(slot * dim));
    }
  }
  // Decode-style attention for the request's next token: the query sits at the next absolute position.
  attention_result attend_next(std::uint64_t id) const {
    const auto& seq = mgr.at(id);
    const std::uint64_t pos = seq.logical_len();
    const auto q = rope(base_key(id, pos + 1000), pos);
    std::vector<vec> keys, values;
    for (std::size_t i = 0; i < seq.kv_len(); ++i) {
      const std::size_t slot = cache_index(id, i);
      keys.emplace_back(k_cache.begin() + static_cast<std::ptrdiff_t>(slot * dim),
                        k_cache.begin() + static_cast<std::ptrdiff_t>((slot + 1) * dim));
      values.emplace_back(v_cache.begin() + static_cast<std::ptrdiff_t>(slot * dim),
                          v_cache.begin() + static_cast<std::ptrdiff_t>((slot + 1) * dim));
    }
    return attend(q, keys, values);
  }
  // The slot of resident token `i`: block_table[i / P] * P + i % P (vLLM's slot mapping, on compacted indices).
  std::size_t cache_index(std::uint64_t id, std::size_t i) const {
    return static_cast<std::size_t>(pool.page_at(id, i / P)) * P + i % P;
  }
};

// Attention computed from scratch over the given positions, without the cache.
attention_result reference(std::uint64_t id, const std::vector<std::uint64_t>& positions, std::uint64_t query_pos,
                           bool renumber = false) {
  const auto q = rope(base_key(id, query_pos + 1000), renumber ? positions.size() : query_pos);
  std::vector<vec> keys, values;
  for (std::size_t i = 0; i < positions.size(); ++i) {
    keys.push_back(rope(base_key(id, positions[i]), renumber ? i : positions[i]));
    values.push_back(value(id, positions[i]));
  }
  return attend(q, keys, values);
}

void expect_near(const vec& a, const vec& b, float tolerance) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], tolerance) << "index " << i;
}

float max_difference(const vec& a, const vec& b) {
  float d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

TEST(KvEngine, AttentionOverSurvivorsMatchesDirectAttentionAtOriginalPositions) {
  tiny_engine engine;
  const std::uint64_t a = 1, b = 2;
  engine.open(a);
  engine.open(b);
  struct segment {
    md::region_id region;
    std::size_t tokens;
  };
  const segment episode[] = {{md::regions::system, 20}, {md::regions::user, 30},     {md::regions::scratchpad, 40},
                             {md::regions::tool_in, 10}, {md::regions::tool_out, 70}, {md::regions::scratchpad, 25},
                             {md::regions::user, 12},    {md::regions::tool_out, 50}, {md::regions::scratchpad, 33}};
  std::size_t evicted_pages = 0;
  md::step_t step = 0;
  for (const auto& s : episode) {
    engine.mgr.advance_to(step += 5);
    for (std::uint64_t id : {a, b}) {
      engine.append(id, s.region, id == a ? s.tokens : s.tokens / 2 + 3);
      const auto att = engine.attend_next(id);
      engine.mgr.at(id).observe_tokens(att.probabilities);  // the mass the query gave each resident token
    }
    const auto plan = engine.mgr.select_global();
    evicted_pages += plan.victims.size();
    engine.mgr.commit(plan, engine.pool);
    ASSERT_TRUE(engine.pool.consistent());

    for (std::uint64_t id : {a, b}) {
      const auto& seq = engine.mgr.at(id);
      const auto through_cache = engine.attend_next(id);
      const auto direct = reference(id, seq.positions(), seq.logical_len());
      expect_near(through_cache.output, direct.output, 1e-5f);
      expect_near(through_cache.probabilities, direct.probabilities, 1e-5f);
    }
  }
  ASSERT_GT(evicted_pages, 10u) << "the episode must evict for the comparison to mean anything";
  EXPECT_LE(engine.mgr.reclaimable_pages(), 20u);
  const auto& seq = engine.mgr.at(a);
  ASSERT_GT(seq.evicted_tokens(), 0u);
  // Renumbering the survivors (positions 0..n-1) changes the result: positions must stay absolute.
  const auto renumbered = reference(a, seq.positions(), seq.logical_len(), /*renumber=*/true);
  EXPECT_GT(max_difference(engine.attend_next(a).output, renumbered.output), 1e-3f);
}

TEST(KvEngine, FreedBlocksAreReusedWithoutDisturbingSurvivors) {
  tiny_engine engine;
  engine.open(1);
  engine.append(1, md::regions::system, P);
  engine.append(1, md::regions::scratchpad, 6 * P);
  engine.append(1, md::regions::user, P);
  engine.mgr.advance_to(100);
  const auto before = engine.pool.free_blocks();
  const auto plan = engine.mgr.select_global(4);
  ASSERT_EQ(plan.pages_freed, 4u);
  const auto released = engine.mgr.commit(plan, engine.pool);
  EXPECT_EQ(engine.pool.free_blocks(), before + 4);
  engine.append(1, md::regions::tool_out, 3 * P);  // written into the blocks just freed
  EXPECT_EQ(engine.pool.free_blocks(), before + 1);
  const auto& seq = engine.mgr.at(1);
  const auto direct = reference(1, seq.positions(), seq.logical_len());
  expect_near(engine.attend_next(1).output, direct.output, 1e-5f);
  EXPECT_EQ(released.at(1).size(), 4u);
}

}  // namespace
