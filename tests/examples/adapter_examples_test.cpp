// The integration examples of docs/integration.md live in examples/engine_adapters.cpp, a program that runs each
// one and checks it (CTest: example_engine_adapters). This test includes that file without its main and asserts
// the exact arrays each engine ends up with. The last test checks that every ```cpp block of docs/integration.md
// appears verbatim in a file under examples/, so the documentation cannot drift from code that compiles and runs.
#include <gtest/gtest.h>

#define MEMDECAY_EXAMPLE_NO_MAIN
#include "../../examples/engine_adapters.cpp"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace {

namespace md = memdecay;
namespace ex = memdecay_examples;
using ex::P;

TEST(IntegrationExamples, FlashInfer) {
  auto seq = ex::over_budget_sequence();
  std::vector<std::int32_t> indptr{0, 2, 8}, indices{5, 6, 10, 11, 12, 13, 14, 15}, last{16, 4};
  ex::page_allocator allocator;
  ex::flashinfer_step(seq, indptr, indices, last, 1, 32, allocator);
  EXPECT_EQ(allocator.released, (std::vector<std::int32_t>{11, 12}));
  EXPECT_EQ(indptr, (std::vector<std::int32_t>{0, 2, 6}));
  EXPECT_EQ(std::vector(indices.begin(), indices.begin() + 6), (std::vector<std::int32_t>{5, 6, 10, 13, 14, 15}));
}

TEST(IntegrationExamples, Vllm) {
  auto seq = ex::over_budget_sequence();
  std::vector<std::int32_t> row{1, 2, 3, 4, 5, 6, 0, 0};
  std::int32_t num_blocks = 6;
  ex::vllm_block_pool pool;
  ex::vllm_step(seq, row, num_blocks, 64, pool);
  EXPECT_EQ(pool.freed, (std::vector<std::int32_t>{2, 3}));
  EXPECT_EQ(num_blocks, 4);
  EXPECT_EQ(std::vector(row.begin(), row.begin() + 4), (std::vector<std::int32_t>{1, 4, 5, 6}));
}

TEST(IntegrationExamples, Sglang) {
  auto seq = ex::over_budget_sequence();
  std::vector<std::int32_t> row(128, 0);
  for (std::size_t i = 0; i < seq.kv_len(); ++i) row[i] = static_cast<std::int32_t>(1000 + i);
  std::int64_t seq_len = static_cast<std::int64_t>(seq.kv_len());
  ex::sglang_allocator allocator;
  ex::sglang_step(seq, row, seq_len, 4096, allocator);
  EXPECT_EQ(allocator.freed, (std::vector<std::pair<std::int64_t, std::int64_t>>{{1016, 1048}}));
  EXPECT_EQ(seq_len, static_cast<std::int64_t>(seq.kv_len()));
  EXPECT_EQ(row[P], 1048);
}

TEST(IntegrationExamples, LlamaCpp) {
  auto seq = ex::over_budget_sequence();
  ex::llama_memory mem;
  ex::llama_cpp_step(seq, &mem, 0);
  EXPECT_EQ(mem.removed, (std::vector<std::pair<std::int32_t, std::int32_t>>{{16, 48}}));
  EXPECT_EQ(seq.num_pages(), 4u);
}

TEST(IntegrationExamples, TensorRtLlm) {
  const md::region_span prompt[] = {{md::regions::system, 200}, {md::regions::user, 60}, {md::regions::retrieval, 500}};
  const auto ranges = ex::tensorrt_llm_request(md::config{}, prompt);
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
  // All pages tie, so the tie hash of (request, page) spreads the four victims over both requests; request 3's
  // drafted pages 3 and 4 are protected and stay.
  EXPECT_EQ(mgr.at(3).num_pages(), 4u);
  EXPECT_EQ(mgr.at(4).num_pages(), 2u);
  EXPECT_EQ(mgr.at(3).positions().back(), 5 * P - 1) << "a drafted page was evicted";
  std::size_t total = 0;
  for (const auto& [id, removal] : freed) total += removal.freed->size();
  EXPECT_EQ(total, 4u);
  EXPECT_EQ(pool.free_blocks(), 32u - 6u);
}

std::string read(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(IntegrationExamples, EveryCodeBlockOfTheIntegrationGuideIsInAnExample) {
  const std::string doc = read(MEMDECAY_SOURCE_DIR "/docs/integration.md");
  ASSERT_FALSE(doc.empty());
  std::vector<std::string> examples;
  for (const auto& entry : std::filesystem::directory_iterator(MEMDECAY_SOURCE_DIR "/examples"))
    if (entry.path().extension() == ".cpp") examples.push_back(read(entry.path()));
  ASSERT_FALSE(examples.empty());
  const std::string open = "```cpp\n", close = "```";
  std::size_t blocks = 0;
  for (std::size_t at = doc.find(open); at != std::string::npos; at = doc.find(open, at)) {
    const std::size_t begin = at + open.size(), end = doc.find(close, begin);
    ASSERT_NE(end, std::string::npos) << "an unclosed ```cpp block";
    const std::string code = doc.substr(begin, end - begin);
    bool found = false;
    for (const auto& source : examples) found = found || source.find(code) != std::string::npos;
    EXPECT_TRUE(found) << "not verbatim in any examples/*.cpp:\n" << code;
    ++blocks;
    at = end + close.size();
  }
  EXPECT_GE(blocks, 6u);
}

}  // namespace
