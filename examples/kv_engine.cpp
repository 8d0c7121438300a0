// A small engine with real K and V tensors (float arrays) in blocks of the owning block pool, driven by the
// manager. Two requests append agent segments with region labels; keys are rotated with RoPE at their absolute
// positions when they are written. Each step the engine computes attention for the next token's query through the
// block table, feeds the mass back, evicts under the global budget and compacts. After every eviction it checks
// that attention over the survivors, read through the compacted block table, equals attention computed directly
// over the same surviving tokens at their original positions; at the end it shows that renumbering the survivors
// (positions 0..n-1) gives a different result, which is why positions must stay absolute.
//
// The program returns 1 if any check fails. tests/examples/manager_kv_engine_test.cpp includes this file (without main)
// and asserts on the same engine.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <memdecay/page_tables/block_pool.hpp>
#include <memdecay/core/manager.hpp>

namespace memdecay_kv_engine {

namespace md = memdecay;

constexpr std::size_t P = 16;       // tokens per page (and per block)
constexpr std::size_t dim = 8;      // head dimension
constexpr float tolerance = 1e-5f;  // cache vs direct: the same float operations in the same order
using vec = std::vector<float>;

// The un-rotated key and the value of the token at absolute position `pos` of request `id`: a pure function, so
// the reference can rebuild any token without the cache.
inline vec base_key(std::uint64_t id, std::uint64_t pos) {
  vec k(dim);
  for (std::size_t j = 0; j < dim; ++j) k[j] = std::sin(0.37f * static_cast<float>(pos * (j + 1) + id * 11) + 0.1f * j);
  return k;
}
inline vec value(std::uint64_t id, std::uint64_t pos) {
  vec v(dim);
  for (std::size_t j = 0; j < dim; ++j) v[j] = std::cos(0.23f * static_cast<float>(pos + j * 5 + id));
  return v;
}
// RoPE: rotates pairs (2j, 2j+1) by pos * 10000^(-2j/dim).
inline vec rope(vec x, std::uint64_t pos) {
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
inline attention_result attend(const vec& q, const std::vector<vec>& keys, const std::vector<vec>& values) {
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
    mgr.open(id, md::config{.alpha = 1.0,
                            .tau = 2.0,
                            .page_size = P,
                            .normalization = md::attention_normalization::uniform,
                            .protection = {.sink_pages = 1, .recent_tokens = P}});
    pool.open(id);
  }
  // Appends a segment: labels it, allocates blocks, and writes each token's rotated key and value into its slot.
  void append(std::uint64_t id, md::region_id region, std::size_t tokens) {
    auto& seq = mgr.at(id);
    const std::size_t first_slot = seq.kv_len();
    const std::uint64_t first_pos = seq.logical_len();  // absolute: evicted tokens keep their numbers
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

// Attention computed from scratch over the given positions, without the cache. With `renumber`, the same tokens
// are rotated as if they sat at positions 0..n-1 (what a kernel that applies RoPE by KV column would do).
inline attention_result reference(std::uint64_t id, const std::vector<std::uint64_t>& positions,
                                  std::uint64_t query_pos, bool renumber = false) {
  const auto q = rope(base_key(id, query_pos + 1000), renumber ? positions.size() : query_pos);
  std::vector<vec> keys, values;
  for (std::size_t i = 0; i < positions.size(); ++i) {
    keys.push_back(rope(base_key(id, positions[i]), renumber ? i : positions[i]));
    values.push_back(value(id, positions[i]));
  }
  return attend(q, keys, values);
}

// The largest element-wise difference; infinity when the sizes differ.
inline float max_difference(const vec& a, const vec& b) {
  if (a.size() != b.size()) return INFINITY;
  float d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

// Merged half-open ranges of sorted positions, e.g. "[0, 16) [48, 96)".
inline std::string position_ranges(const std::vector<std::uint64_t>& positions) {
  std::string out;
  for (std::size_t i = 0; i < positions.size();) {
    std::size_t j = i + 1;
    while (j < positions.size() && positions[j] == positions[j - 1] + 1) ++j;
    out +=
        (out.empty() ? "[" : " [") + std::to_string(positions[i]) + ", " + std::to_string(positions[j - 1] + 1) + ")";
    i = j;
  }
  return out;
}

struct segment {
  md::region_id region;
  const char* name;
  std::size_t tokens;  // for request 1; request 2 appends tokens / 2 + 3
};

// One agent episode: system prompt, user turn, scratchpad, a tool call and its long output, more reasoning, a
// follow-up, another tool output, and a final stretch of scratchpad.
inline constexpr segment episode[] = {{md::regions::system, "system", 20},
                                      {md::regions::user, "user", 30},
                                      {md::regions::scratchpad, "scratchpad", 40},
                                      {md::regions::tool_in, "tool_in", 10},
                                      {md::regions::tool_out, "tool_out", 70},
                                      {md::regions::scratchpad, "scratchpad", 25},
                                      {md::regions::user, "user", 12},
                                      {md::regions::tool_out, "tool_out", 50},
                                      {md::regions::scratchpad, "scratchpad", 33}};
inline constexpr std::uint64_t requests[] = {1, 2};

struct request_check {
  std::uint64_t id;
  std::size_t kv_len;         // resident tokens
  std::uint64_t logical_len;  // tokens appended so far (the next absolute position)
  float output_difference;    // max |through the cache - direct over the survivors at their positions|
  float probability_difference;
};
struct step_report {
  md::step_t step;
  const segment* appended;
  std::size_t evicted_pages;
  bool pool_consistent;
  std::vector<request_check> requests;
};
struct episode_report {
  std::vector<step_report> steps;
  std::size_t evicted_pages = 0;
  std::size_t reclaimable_pages = 0;  // after the last step
  std::uint64_t evicted_tokens = 0;   // of request 1
  std::string survivors;              // request 1's surviving positions, as ranges
  float renumbered_difference = 0;    // request 1: through the cache vs the survivors renumbered 0..n-1
};

// Runs the episode on `engine`: append, attend, observe, select, commit, then compare cache against reference.
inline episode_report run_episode(tiny_engine& engine) {
  episode_report report;
  for (std::uint64_t id : requests) engine.open(id);
  md::step_t step = 0;
  for (const auto& s : episode) {
    engine.mgr.advance_to(step += 5);
    for (std::uint64_t id : requests) {
      engine.append(id, s.region, id == 1 ? s.tokens : s.tokens / 2 + 3);
      const auto att = engine.attend_next(id);
      engine.mgr.at(id).observe_tokens(att.probabilities);  // the mass the query gave each resident token
    }
    const auto plan = engine.mgr.select_global();
    engine.mgr.commit(plan, engine.pool,
                      md::identity_id{});  // removes the blocks from the pool's tables and compacts memdecay's state

    step_report r{step, &s, plan.victims.size(), engine.pool.consistent(), {}};
    for (std::uint64_t id : requests) {
      const auto& seq = engine.mgr.at(id);
      const auto through_cache = engine.attend_next(id);
      const auto direct = reference(id, seq.positions(), seq.logical_len());
      r.requests.push_back({id, seq.kv_len(), seq.logical_len(), max_difference(through_cache.output, direct.output),
                            max_difference(through_cache.probabilities, direct.probabilities)});
    }
    report.evicted_pages += r.evicted_pages;
    report.steps.push_back(std::move(r));
  }
  report.reclaimable_pages = engine.mgr.reclaimable_pages();
  const auto& seq = engine.mgr.at(1);
  report.evicted_tokens = seq.evicted_tokens();
  report.survivors = position_ranges(seq.positions());
  const auto renumbered = reference(1, seq.positions(), seq.logical_len(), /*renumber=*/true);
  report.renumbered_difference = max_difference(engine.attend_next(1).output, renumbered.output);
  return report;
}

}  // namespace memdecay_kv_engine

#ifndef MEMDECAY_EXAMPLE_NO_MAIN
int main() {
  namespace kv = memdecay_kv_engine;
  kv::tiny_engine engine;
  std::printf("K/V engine: %zu blocks of %zu tokens, head dim %zu, global budget 20 pages (down to 16)\n",
              kv::tiny_engine::num_blocks, kv::P, kv::dim);
  const auto report = kv::run_episode(engine);

  int failures = 0;
  for (const auto& s : report.steps) {
    std::printf("step %3llu  +%-10s evicted %2zu pages  pool %s\n", static_cast<unsigned long long>(s.step),
                s.appended->name, s.evicted_pages, s.pool_consistent ? "consistent" : "INCONSISTENT");
    if (!s.pool_consistent) ++failures;
    for (const auto& r : s.requests) {
      const bool ok = r.output_difference <= kv::tolerance && r.probability_difference <= kv::tolerance;
      std::printf(
          "    request %llu: %3zu of %3llu tokens resident; cache vs direct: output %.1e, probabilities %.1e%s\n",
          static_cast<unsigned long long>(r.id), r.kv_len, static_cast<unsigned long long>(r.logical_len),
          static_cast<double>(r.output_difference), static_cast<double>(r.probability_difference),
          ok ? "" : "  MISMATCH");
      if (!ok) ++failures;
    }
  }
  std::printf("evicted %zu pages in all; %zu pages reclaimable at the end\n", report.evicted_pages,
              report.reclaimable_pages);
  std::printf("request 1 lost %llu tokens; survivors at their original positions: %s\n",
              static_cast<unsigned long long>(report.evicted_tokens), report.survivors.c_str());
  std::printf("renumbering the survivors 0..n-1 changes the output by %.3f\n",
              static_cast<double>(report.renumbered_difference));

  if (report.evicted_pages <= 10 || report.evicted_tokens == 0) {
    std::printf("FAIL: the episode must evict for the comparison to mean anything\n");
    ++failures;
  }
  if (report.reclaimable_pages > 20) {
    std::printf("FAIL: the global budget was not met\n");
    ++failures;
  }
  if (!(report.renumbered_difference > 1e-3f)) {
    std::printf("FAIL: renumbered positions should change attention\n");
    ++failures;
  }
  if (failures != 0) {
    std::printf("FAIL: %d checks failed\n", failures);
    return 1;
  }
  std::printf(
      "OK: after every eviction, attention over the survivors equals direct attention at their original "
      "positions\n");
  return 0;
}
#endif
