// The integration examples of docs/integration.md: one short function per engine, showing the lines the engine
// adds, each run here against arrays shaped like that engine's. The engines' own calls (allocators,
// llama_memory_seq_rm, TokenRangeRetentionConfig) are stand-ins that record what they were given. The last test
// checks that every ```cpp block of docs/integration.md appears verbatim in this file, so the documentation
// cannot drift from code that compiles and runs.
#include <gtest/gtest.h>

#include <memdecay/block_pool.hpp>
#include <memdecay/exports/llama_cpp.hpp>
#include <memdecay/exports/tensorrt_llm.hpp>
#include <memdecay/manager.hpp>
#include <memdecay/page_tables/flashinfer_csr.hpp>
#include <memdecay/page_tables/sglang_req_to_token.hpp>
#include <memdecay/page_tables/vllm_block_table.hpp>
#include <memdecay/sequence.hpp>

#include <cstdint>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace memdecay_examples {

// --- stand-ins for the engines' own APIs ---------------------------------------------------------------------
struct page_allocator {  // FlashInfer users' own page allocator
  std::vector<std::int32_t> released;
  void release(std::int32_t page) { released.push_back(page); }
};
struct vllm_block_pool {  // vllm/v1/core/block_pool.py, reduced to the call used here
  std::vector<std::int32_t> freed;
  void free_block(std::int32_t block) { freed.push_back(block); }
};
struct sglang_allocator {  // TokenToKVPoolAllocator.free(slots)
  std::vector<std::pair<std::int32_t, std::int32_t>> freed;
  void free(std::int32_t begin, std::int32_t end) { freed.emplace_back(begin, end); }
};
struct llama_memory {
  std::vector<std::pair<std::int32_t, std::int32_t>> removed;
};
using llama_memory_t = llama_memory*;
bool llama_memory_seq_rm(llama_memory_t mem, std::int32_t /*seq_id*/, std::int32_t p0, std::int32_t p1) {
  mem->removed.emplace_back(p0, p1);
  return true;
}
struct TokenRangeRetentionConfig {  // tensorrt_llm::executor::KvCacheRetentionConfig::TokenRangeRetentionConfig
  TokenRangeRetentionConfig(std::int64_t start, std::optional<std::int64_t> end, int priority,
                            std::optional<std::int64_t> duration_ms)
      : start(start), end(end), priority(priority), duration_ms(duration_ms) {}
  std::int64_t start;
  std::optional<std::int64_t> end;
  int priority;
  std::optional<std::int64_t> duration_ms;
};

// --- the examples (each body is a block of docs/integration.md) --------------------------------------------------
void flashinfer_step(memdecay::sequence& seq, std::vector<std::int32_t>& indptr, std::vector<std::int32_t>& indices,
                     const std::vector<std::int32_t>& last_page_len, std::size_t batch_row,
                     std::size_t num_pool_pages, page_allocator& allocator) {
  memdecay::flashinfer_csr csr(indptr, indices, last_page_len, seq.page_size(), num_pool_pages);
  const auto plan = seq.select_for_budget();
  for (std::int32_t page : seq.commit(plan, csr, batch_row)) allocator.release(page);  // if no one else holds it
  // indptr[-1] is the new nnz; last_page_len is unchanged; positions stay absolute (pos_encoding_mode="NONE").
}

void vllm_step(memdecay::sequence& seq, std::span<std::int32_t> block_table_row, std::int32_t& num_blocks,
               std::size_t num_gpu_blocks, vllm_block_pool& block_pool) {
  auto row = memdecay::vllm_block_table::row(block_table_row, num_blocks, seq.page_size(), num_gpu_blocks);
  const auto plan = seq.select_for_budget();
  for (std::int32_t block : seq.commit(plan, row, 0)) block_pool.free_block(block);  // drops one reference
  // Workers: seq_len_kv = seq.kv_len(); positions absolute; a new token at pos goes to KV index
  // pos - seq.evicted_tokens(), i.e. slot = row[i / B] * B + i % B with i = pos - evicted.
}

void sglang_step(memdecay::sequence& seq, std::span<std::int32_t> req_to_token_row, std::int64_t& seq_len,
                 std::size_t kv_pool_size, sglang_allocator& allocator) {
  auto row = memdecay::sglang_req_to_token::row(req_to_token_row, seq_len, seq.page_size(), kv_pool_size);
  const auto plan = seq.select_for_budget();
  for (const memdecay::slot_range& r : seq.commit(plan, row, 0)) allocator.free(r.begin, r.end);
  // The next decode position is seq_len + seq.evicted_tokens(); the radix cache may only insert the tokens
  // before the prefix-cache boundary.
}

void llama_cpp_step(memdecay::sequence& seq, llama_memory_t mem, std::int32_t seq_id) {
  const auto plan = seq.select_for_budget();
  for (const auto& [p0, p1] : memdecay::llama_position_ranges(seq, plan)) llama_memory_seq_rm(mem, seq_id, p0, p1);
  seq.commit(plan);
  // New tokens need explicit batch.pos = seq.logical_len() + i: the cache now has holes.
}

std::vector<TokenRangeRetentionConfig> tensorrt_llm_request(const memdecay::region_table& regions,
                                                            std::span<const memdecay::region_span> prompt) {
  std::vector<TokenRangeRetentionConfig> ranges;
  for (const auto& e : memdecay::tensorrt_llm_retention(regions, prompt, {.milliseconds_per_step = 25.0}))
    ranges.emplace_back(e.token_start, e.token_end, e.priority, e.duration_ms);
  return ranges;  // KvCacheRetentionConfig(ranges, /*decodePriority=*/35); request.setKvCacheRetentionConfig(...)
}

std::map<std::uint64_t, std::vector<std::int32_t>> manager_step(memdecay::manager& mgr, memdecay::block_pool<>& pool,
                                                                memdecay::step_t step,
                                                                const std::map<std::uint64_t, std::size_t>& drafts) {
  mgr.advance_to(step);  // every clock; ends last step's protections
  for (const auto& [id, tokens] : drafts) mgr.protect_tail_tokens(id, tokens);  // speculative tokens in flight
  const auto plan = mgr.select_global();  // sequence budgets, then the global one; (score, id, page) order
  return mgr.commit(plan, pool);          // all or nothing; per request, the blocks that became free
}

}  // namespace memdecay_examples

namespace {

namespace md = memdecay;
namespace ex = memdecay_examples;
constexpr std::size_t P = 16;

// A sequence of 6 pages (the last holds 4 tokens) with a budget of 4 pages: the two scratchpad pages go.
md::sequence over_budget_sequence() {
  md::sequence seq(md::config{.page_size = P, .budget = md::budget_config::pages(4)});
  seq.append(md::regions::system, P);
  seq.append(md::regions::scratchpad, 2 * P);
  seq.append(md::regions::user, 2 * P + 4);
  seq.advance_to(60);
  return seq;
}

TEST(IntegrationExamples, FlashInfer) {
  auto seq = over_budget_sequence();
  std::vector<std::int32_t> indptr{0, 2, 8}, indices{5, 6, 10, 11, 12, 13, 14, 15}, last{16, 4};
  ex::page_allocator allocator;
  ex::flashinfer_step(seq, indptr, indices, last, 1, 32, allocator);
  EXPECT_EQ(allocator.released, (std::vector<std::int32_t>{11, 12}));
  EXPECT_EQ(indptr, (std::vector<std::int32_t>{0, 2, 6}));
  EXPECT_EQ(std::vector(indices.begin(), indices.begin() + 6), (std::vector<std::int32_t>{5, 6, 10, 13, 14, 15}));
}

TEST(IntegrationExamples, Vllm) {
  auto seq = over_budget_sequence();
  std::vector<std::int32_t> row{1, 2, 3, 4, 5, 6, 0, 0};
  std::int32_t num_blocks = 6;
  ex::vllm_block_pool pool;
  ex::vllm_step(seq, row, num_blocks, 64, pool);
  EXPECT_EQ(pool.freed, (std::vector<std::int32_t>{2, 3}));
  EXPECT_EQ(num_blocks, 4);
  EXPECT_EQ(std::vector(row.begin(), row.begin() + 4), (std::vector<std::int32_t>{1, 4, 5, 6}));
}

TEST(IntegrationExamples, Sglang) {
  auto seq = over_budget_sequence();
  std::vector<std::int32_t> row(128, 0);
  for (std::size_t i = 0; i < seq.kv_len(); ++i) row[i] = static_cast<std::int32_t>(1000 + i);
  std::int64_t seq_len = static_cast<std::int64_t>(seq.kv_len());
  ex::sglang_allocator allocator;
  ex::sglang_step(seq, row, seq_len, 4096, allocator);
  EXPECT_EQ(allocator.freed, (std::vector<std::pair<std::int32_t, std::int32_t>>{{1016, 1048}}));
  EXPECT_EQ(seq_len, static_cast<std::int64_t>(seq.kv_len()));
  EXPECT_EQ(row[P], 1048);
}

TEST(IntegrationExamples, LlamaCpp) {
  auto seq = over_budget_sequence();
  ex::llama_memory mem;
  ex::llama_cpp_step(seq, &mem, 0);
  EXPECT_EQ(mem.removed, (std::vector<std::pair<std::int32_t, std::int32_t>>{{16, 48}}));
  EXPECT_EQ(seq.num_pages(), 4u);
}

TEST(IntegrationExamples, TensorRtLlm) {
  const md::region_span prompt[] = {{md::regions::system, 200}, {md::regions::user, 60}, {md::regions::retrieval, 500}};
  const auto ranges = ex::tensorrt_llm_request(md::default_region_table(), prompt);
  ASSERT_EQ(ranges.size(), 3u);
  EXPECT_EQ(ranges[0].priority, 100);
  EXPECT_FALSE(ranges[0].duration_ms);
  EXPECT_EQ(ranges[2].start, 260);
  EXPECT_EQ(ranges[2].end, 760);
  EXPECT_EQ(ranges[2].priority, 59);
  EXPECT_EQ(ranges[2].duration_ms, 2500);  // retrieval: 100-step half-life x 25 ms
}

TEST(IntegrationExamples, Manager) {
  md::manager mgr({.page_size = P, .global = md::global_budget::pages(8, 6)});
  md::block_pool<> pool(32, P);
  for (std::uint64_t id : {3, 4}) {
    auto& seq = mgr.open(id, md::config{.page_size = P});
    pool.open(id);
    seq.append(md::regions::scratchpad, 5 * P);
    pool.append_tokens(id, seq.kv_len());
  }
  const auto freed = ex::manager_step(mgr, pool, 40, {{3, 20}});  // request 3's last 20 tokens are drafts
  EXPECT_EQ(mgr.reclaimable_pages(), 6u);
  // All pages tie; request 3's drafted pages 3 and 4 are protected, so it loses 0, 1, 2 (the lower id first).
  EXPECT_EQ(mgr.at(3).num_pages(), 2u);
  EXPECT_EQ(mgr.at(4).num_pages(), 4u);
  std::size_t total = 0;
  for (const auto& [id, blocks] : freed) total += blocks.size();
  EXPECT_EQ(total, 4u);
  EXPECT_EQ(pool.free_blocks(), 32u - 6u);
}

TEST(IntegrationExamples, EveryCodeBlockOfTheIntegrationGuideIsInThisFile) {
  const auto read = [](const std::string& path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  };
  const std::string doc = read(MEMDECAY_SOURCE_DIR "/docs/integration.md");
  const std::string self = read(MEMDECAY_SOURCE_DIR "/tests/adapter_examples_test.cpp");
  ASSERT_FALSE(doc.empty());
  ASSERT_FALSE(self.empty());
  const std::string open = "```cpp\n", close = "```";
  std::size_t blocks = 0;
  for (std::size_t at = doc.find(open); at != std::string::npos; at = doc.find(open, at)) {
    const std::size_t begin = at + open.size(), end = doc.find(close, begin);
    ASSERT_NE(end, std::string::npos) << "an unclosed ```cpp block";
    const std::string code = doc.substr(begin, end - begin);
    EXPECT_NE(self.find(code), std::string::npos) << "not verbatim in this file:\n" << code;
    ++blocks;
    at = end + close.size();
  }
  EXPECT_GE(blocks, 6u);
}

}  // namespace
