// The integration examples of docs/integration.md, one short function per engine, showing the lines the engine
// adds (FlashInfer CSR, vLLM block-table row, SGLang req_to_token row, llama.cpp position ranges, TensorRT-LLM
// retention, the manager's step over many requests). main() runs each against arrays shaped like that engine's,
// prints the table before and after, and checks that the engine's allocator got back exactly the memory of the
// pages memdecay chose and that the survivors kept their order. The engines' own calls (allocators,
// llama_memory_seq_rm, TokenRangeRetentionConfig) are stand-ins that record what they were given.
//
// Every ```cpp block of docs/integration.md appears verbatim in this file (tests/examples/adapter_examples_test.cpp
// checks it, and includes this file without main to assert on the same functions). The program returns 1 if any
// check fails.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <memdecay/page_tables/block_pool.hpp>
#include <memdecay/exports/llama_cpp.hpp>
#include <memdecay/exports/tensorrt_llm.hpp>
#include <memdecay/core/attention_rows.hpp>
#include <memdecay/core/executor.hpp>
#include <memdecay/core/manager.hpp>
#include <memdecay/page_tables/flashinfer_csr.hpp>
#include <memdecay/page_tables/sglang_req_to_token.hpp>
#include <memdecay/page_tables/vllm_block_table.hpp>
#include <memdecay/core/sequence.hpp>

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
  std::vector<std::pair<std::int64_t, std::int64_t>> freed;
  void free(std::int64_t begin, std::int64_t end) { freed.emplace_back(begin, end); }
};
struct llama_memory {
  std::vector<std::pair<std::int32_t, std::int32_t>> removed;
};
using llama_memory_t = llama_memory*;
inline bool llama_memory_seq_rm(llama_memory_t mem, std::int32_t /*seq_id*/, std::int32_t p0, std::int32_t p1) {
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
inline void flashinfer_step(memdecay::sequence& seq, std::vector<std::int32_t>& indptr,
                            std::vector<std::int32_t>& indices, const std::vector<std::int32_t>& last_page_len,
                            std::size_t batch_row, std::size_t num_pool_pages, page_allocator& allocator) {
  memdecay::flashinfer_csr csr(indptr, indices, last_page_len, seq.page_size(), num_pool_pages);
  const auto plan = seq.select_for_budget();
  for (std::int32_t page : seq.commit(plan, csr, batch_row).removed) allocator.release(page);  // drops one reference
  // indptr[-1] is the new nnz; last_page_len is unchanged; positions stay absolute (pos_encoding_mode="NONE").
}

inline void vllm_step(memdecay::sequence& seq, std::span<std::int32_t> block_table_row, std::int32_t& num_blocks,
                      std::size_t num_gpu_blocks, vllm_block_pool& block_pool) {
  auto row = memdecay::vllm_block_table::row(block_table_row, num_blocks, seq.page_size(), num_gpu_blocks);
  const auto plan = seq.select_for_budget();
  for (std::int32_t block : seq.commit(plan, row, 0).removed) block_pool.free_block(block);  // drops one reference
  // Workers: seq_len_kv = seq.kv_len(); positions absolute; a new token at pos goes to KV index
  // pos - seq.evicted_tokens(), i.e. slot = row[i / B] * B + i % B with i = pos - evicted.
}

inline void sglang_step(memdecay::sequence& seq, std::span<std::int32_t> req_to_token_row, std::int64_t& seq_len,
                        std::size_t kv_pool_size, sglang_allocator& allocator) {
  auto row = memdecay::sglang_req_to_token::row(req_to_token_row, seq_len, seq.page_size(), kv_pool_size);
  const auto plan = seq.select_for_budget();
  for (const memdecay::slot_range& r : seq.commit(plan, row, 0).slots) allocator.free(r.begin, r.end);
  // The next decode position is seq_len + seq.evicted_tokens(); the radix cache may only insert the tokens
  // before the prefix-cache boundary.
}

inline void llama_cpp_step(memdecay::sequence& seq, llama_memory_t mem, std::int32_t seq_id) {
  const auto plan = seq.select_for_budget();
  for (const auto& [p0, p1] : memdecay::llama_position_ranges(seq, plan)) llama_memory_seq_rm(mem, seq_id, p0, p1);
  seq.commit(plan);
  // New tokens need explicit batch.pos = seq.logical_len() + i: the cache now has holes.
}

inline std::vector<TokenRangeRetentionConfig> tensorrt_llm_request(const memdecay::config& cfg,
                                                                   std::span<const memdecay::region_span> prompt) {
  std::vector<TokenRangeRetentionConfig> ranges;
  for (const auto& e : memdecay::tensorrt_llm_retention(cfg, prompt, {.milliseconds_per_step = 25.0}))
    ranges.emplace_back(e.token_start, e.token_end, e.priority, e.duration_ms);
  return ranges;  // KvCacheRetentionConfig(ranges, /*decodePriority=*/35); request.setKvCacheRetentionConfig(...)
}

inline std::map<std::uint64_t, memdecay::page_removal<std::int32_t>> manager_step(
    memdecay::manager& mgr, memdecay::block_pool<>& pool, memdecay::step_t step,
    const std::map<std::uint64_t, std::size_t>& drafts) {
  mgr.advance_to(step);  // every clock; ends last step's protections
  for (const auto& [id, tokens] : drafts) mgr.protect_tail_tokens(id, tokens);  // speculative tokens in flight
  const auto plan = mgr.select_global();  // sequence budgets, then the global one; (score, tie hash, id, page) order
  return mgr.commit(plan, pool, memdecay::identity_id{});  // all or nothing; per request, its page_removal
}

inline std::size_t observe_engine_rows(memdecay::sequence& seq, const std::uint16_t* attn_bf16, std::size_t heads,
                                       std::size_t ld) {
  // This request's attention, heads x tokens in bf16, row h at attn_bf16 + h * ld (ld >= the resident tokens).
  const memdecay::attention_rows rows(std::span<const std::uint16_t>(attn_bf16, (heads - 1) * ld + seq.kv_len()),
                                      memdecay::half_format::bf16, heads, seq.kv_len(), ld,
                                      memdecay::head_reduction::mean);
  return seq.observe_rows(rows);  // == observe_tokens(the rows' float mean); input_error names a bad row and token
}

struct running_request {
  std::uint64_t id;
  std::vector<float> attention_mass;  // over its resident tokens
};

inline std::map<std::uint64_t, memdecay::page_removal<std::int32_t>> batch_step(
    memdecay::manager& mgr, memdecay::block_pool<>& block_pool, memdecay::step_t step,
    const std::vector<running_request>& running) {
  static memdecay::thread_pool pool(4);                            // once, owned by the engine
  mgr.advance_to(step, pool);           // the clocks (an exp-free rebase is O(tokens) now and then)
  std::vector<memdecay::manager::observation> batch;               // {id, mass over its resident tokens}
  for (const auto& r : running) batch.push_back({r.id, r.attention_mass});
  mgr.observe_batch(batch, pool);       // every mass checked first (input_error naming the sequence, nothing
                                        // changed), then every sequence observed, a task each
  const auto plan = mgr.select_global(0, pool);  // own budgets and candidates per task, then the global choice
  return mgr.commit(plan, block_pool, memdecay::identity_id{});
}

// --- the scenario ------------------------------------------------------------------------------------------------
constexpr std::size_t P = 16;

// A sequence of 6 pages (the last holds 4 tokens) with a budget of 4 pages: system (pinned), two scratchpad pages
// (decayed by step 60), then a user turn. The two scratchpad pages go.
inline memdecay::sequence over_budget_sequence() {
  memdecay::sequence seq(memdecay::config{.page_size = P, .budget = memdecay::budget_config::pages(4)});
  seq.append(memdecay::regions::system, P);
  seq.append(memdecay::regions::scratchpad, 2 * P);
  seq.append(memdecay::regions::user, 2 * P + 4);
  seq.advance_to(60);
  return seq;
}

// `row` without the entries at the logical pages `pages` (ascending): what a table must hold after the removal.
template <class T>
std::vector<T> without_pages(const std::vector<T>& row, const std::vector<std::size_t>& pages, std::size_t per_page) {
  std::vector<T> out;
  for (std::size_t i = 0; i < row.size(); ++i) {
    bool removed = false;
    for (std::size_t p : pages) removed = removed || i / per_page == p;
    if (!removed) out.push_back(row[i]);
  }
  return out;
}
// The entries of `row` at the logical pages `pages`: what the allocator must get back.
template <class T>
std::vector<T> at_pages(const std::vector<T>& row, const std::vector<std::size_t>& pages, std::size_t per_page) {
  std::vector<T> out;
  for (std::size_t p : pages)
    for (std::size_t i = p * per_page; i < (p + 1) * per_page && i < row.size(); ++i) out.push_back(row[i]);
  return out;
}

}  // namespace memdecay_examples

#ifndef MEMDECAY_EXAMPLE_NO_MAIN
namespace {

namespace md = memdecay;
namespace ex = memdecay_examples;
using ex::P;
int failures = 0;

void check(bool ok, const char* what) {
  std::printf("  %s %s\n", ok ? "ok:  " : "FAIL:", what);
  if (!ok) ++failures;
}
template <class T>
std::string list(const std::vector<T>& v) {
  std::string out = "{";
  for (std::size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + "}";
}
template <class T>
std::string ranges(const std::vector<std::pair<T, T>>& v) {
  std::string out;
  for (const auto& [a, b] : v) out += (out.empty() ? "[" : " [") + std::to_string(a) + ", " + std::to_string(b) + ")";
  return out;
}
template <class T>
std::vector<T> slice(const std::vector<T>& v, std::size_t begin, std::size_t end) {
  return std::vector<T>(v.begin() + static_cast<std::ptrdiff_t>(begin), v.begin() + static_cast<std::ptrdiff_t>(end));
}

void flashinfer() {
  std::printf("FlashInfer CSR: batch of 2 requests; request 1 (row 1) holds 6 pages and must keep 4\n");
  auto seq = ex::over_budget_sequence();
  const auto plan = seq.select_for_budget();  // pure: the step below makes the same plan
  std::vector<std::int32_t> indptr{0, 2, 8}, indices{5, 6, 10, 11, 12, 13, 14, 15}, last{16, 4};
  const auto row0 = slice(indices, 0, 2), row1 = slice(indices, 2, 8);
  std::printf("  before: indptr %s indices %s last_page_len %s; plan evicts logical pages %s\n", list(indptr).c_str(),
              list(indices).c_str(), list(last).c_str(), list(plan.pages).c_str());
  ex::page_allocator allocator;
  ex::flashinfer_step(seq, indptr, indices, last, 1, 32, allocator);
  std::printf("  after:  indptr %s indices %s; released %s\n", list(indptr).c_str(),
              list(slice(indices, 0, static_cast<std::size_t>(indptr.back()))).c_str(),
              list(allocator.released).c_str());
  check(allocator.released == ex::at_pages(row1, plan.pages, 1), "the allocator got back the plan's pages");
  check(indptr.back() == 8 - static_cast<std::int32_t>(plan.pages.size()), "indptr[-1] is the new nnz");
  check(slice(indices, 0, 2) == row0, "row 0 untouched");
  check(slice(indices, 2, static_cast<std::size_t>(indptr[2])) == ex::without_pages(row1, plan.pages, 1),
        "row 1 keeps its other pages, in order");
  check(last[1] == 4, "last_page_len unchanged");
}

void vllm() {
  std::printf("vLLM block table: one row of 6 blocks (width 8), budget 4 pages\n");
  auto seq = ex::over_budget_sequence();
  const auto plan = seq.select_for_budget();
  std::vector<std::int32_t> row{1, 2, 3, 4, 5, 6, 0, 0};
  const auto before = slice(row, 0, 6);
  std::int32_t num_blocks = 6;
  std::printf("  before: row %s num_blocks %d; plan evicts logical pages %s\n", list(row).c_str(), num_blocks,
              list(plan.pages).c_str());
  ex::vllm_block_pool pool;
  ex::vllm_step(seq, row, num_blocks, 64, pool);
  std::printf("  after:  row %s num_blocks %d; free_block(%s)\n", list(slice(row, 0, 4)).c_str(), num_blocks,
              list(pool.freed).c_str());
  check(pool.freed == ex::at_pages(before, plan.pages, 1), "the block pool got back the plan's blocks");
  check(static_cast<std::size_t>(num_blocks) == seq.num_pages(), "num_blocks equals the sequence's pages");
  check(slice(row, 0, static_cast<std::size_t>(num_blocks)) == ex::without_pages(before, plan.pages, 1),
        "the row keeps its other blocks, in order");
  std::printf("  workers: seq_len_kv %zu; the next token (position %llu) goes to KV index %llu\n", seq.kv_len(),
              static_cast<unsigned long long>(seq.logical_len()),
              static_cast<unsigned long long>(seq.logical_len() - seq.evicted_tokens()));
  check(seq.logical_len() - seq.evicted_tokens() == seq.kv_len(), "the next token goes right after the survivors");
}

void sglang() {
  std::printf("SGLang req_to_token: one row, token i in KV slot 1000 + i\n");
  auto seq = ex::over_budget_sequence();
  const auto plan = seq.select_for_budget();
  std::vector<std::int32_t> row(128, 0);
  for (std::size_t i = 0; i < seq.kv_len(); ++i) row[i] = static_cast<std::int32_t>(1000 + i);
  const auto before = slice(row, 0, seq.kv_len());
  std::int64_t seq_len = static_cast<std::int64_t>(seq.kv_len());
  std::printf("  before: seq_len %lld; plan evicts logical pages %s\n", static_cast<long long>(seq_len),
              list(plan.pages).c_str());
  ex::sglang_allocator allocator;
  ex::sglang_step(seq, row, seq_len, 4096, allocator);
  std::printf("  after:  seq_len %lld; allocator.free %s\n", static_cast<long long>(seq_len),
              ranges(allocator.freed).c_str());
  std::vector<std::int32_t> freed;
  for (const auto& [b, e] : allocator.freed)
    for (std::int64_t s = b; s < e; ++s) freed.push_back(static_cast<std::int32_t>(s));
  check(freed == ex::at_pages(before, plan.pages, P), "the allocator got back the slots of the plan's pages");
  check(seq_len == static_cast<std::int64_t>(seq.kv_len()), "seq_len equals the resident tokens");
  check(slice(row, 0, static_cast<std::size_t>(seq_len)) == ex::without_pages(before, plan.pages, P),
        "the row keeps its other slots, in order");
}

void llama_cpp() {
  std::printf("llama.cpp: llama_memory_seq_rm by position range\n");
  auto seq = ex::over_budget_sequence();
  const auto plan = seq.select_for_budget();
  std::vector<std::int32_t> expected;  // the positions of the plan's pages
  for (std::size_t p : plan.pages)
    for (std::size_t i = p * P; i < (p + 1) * P; ++i) expected.push_back(static_cast<std::int32_t>(seq.position_of(i)));
  ex::llama_memory mem;
  ex::llama_cpp_step(seq, &mem, 0);
  std::printf("  llama_memory_seq_rm %s; %zu pages left; next batch.pos %llu\n", ranges(mem.removed).c_str(),
              seq.num_pages(), static_cast<unsigned long long>(seq.logical_len()));
  std::vector<std::int32_t> removed;
  for (const auto& [p0, p1] : mem.removed)
    for (std::int32_t p = p0; p < p1; ++p) removed.push_back(p);
  check(removed == expected, "the removed ranges are exactly the plan's positions");
  check(seq.num_pages() == 4, "the budget of 4 pages is met");
}

void tensorrt_llm() {
  std::printf("TensorRT-LLM: retention ranges for a prompt of system 200, user 60, retrieval 500 tokens\n");
  const md::region_span prompt[] = {{md::regions::system, 200}, {md::regions::user, 60}, {md::regions::retrieval, 500}};
  const auto ranges = ex::tensorrt_llm_request(md::config{}, prompt);
  std::int64_t next = 0;
  bool contiguous = true;
  for (const auto& r : ranges) {
    std::printf("  TokenRangeRetentionConfig(%lld, %lld, priority %d, duration %s)\n", static_cast<long long>(r.start),
                static_cast<long long>(r.end.value_or(-1)), r.priority,
                r.duration_ms ? (std::to_string(*r.duration_ms) + " ms").c_str() : "none");
    contiguous = contiguous && r.start == next && r.end && *r.end > r.start;
    next = r.end.value_or(next);
  }
  check(contiguous && next == 760, "the ranges cover the prompt once, in order");
  check(!ranges.empty() && ranges.front().priority == 100 && !ranges.front().duration_ms,
        "the pinned system prompt gets priority 100 and no duration");
}

void manager() {
  std::printf(
      "manager: requests 3 and 4 of 5 pages each, global budget 8 pages (down to 6); request 3 has 20 "
      "draft tokens\n");
  md::manager mgr({.page_size = P, .global = md::global_budget::pages(8, 6)});
  md::block_pool<> pool(32, P);
  for (std::uint64_t id : {3, 4}) {
    auto& seq = mgr.open(id, md::config{.page_size = P});
    pool.open(id);
    seq.append(md::regions::scratchpad, 5 * P);
    pool.append_tokens(id, seq.kv_len());
  }
  const auto removals = ex::manager_step(mgr, pool, 40, {{3, 20}});
  std::size_t total = 0;
  for (const auto& [id, removal] : removals) {
    std::printf("  request %llu: freed blocks %s, %zu pages left\n", static_cast<unsigned long long>(id),
                list(*removal.freed).c_str(), mgr.at(id).num_pages());
    total += removal.freed->size();
  }
  check(mgr.reclaimable_pages() == 6, "the pool is down to the low watermark");
  check(pool.free_blocks() == 32 - 6 && total == 4, "the freed blocks are back in the pool");
  check(pool.consistent(), "the block pool is consistent");
  const auto kept = mgr.at(3).positions();
  bool drafts_resident = true;  // request 3's 20 drafts read positions 60..79
  for (std::uint64_t pos = 60; pos < 80; ++pos)
    drafts_resident = drafts_resident && std::find(kept.begin(), kept.end(), pos) != kept.end();
  check(drafts_resident, "request 3 keeps the pages its drafts read");
}

void attention_rows() {
  std::printf("attention rows: 4 heads x 200 tokens of bf16, rows 256 apart, observed in place\n");
  md::sequence by_rows(md::config{.page_size = P});
  by_rows.append(md::regions::system, P);
  by_rows.append(md::regions::tool_out, 200 - P);
  by_rows.advance_to(1);
  md::sequence by_floats = by_rows;
  std::vector<std::uint16_t> attn(4 * 256, 0);
  std::vector<float> mean(200, 0.0f);
  for (std::size_t t = 0; t < 200; ++t) {
    for (std::size_t h = 0; h < 4; ++h) {
      attn[h * 256 + t] = t % 7 == h ? 0x3c00 : 0x3b00;  // bf16 bits: 0.0078125 or 0.001953125
      mean[t] = h == 0 ? md::simd::bf16_to_float(attn[t]) : mean[t] + md::simd::bf16_to_float(attn[h * 256 + t]);
    }
    mean[t] *= 1.0f / 4.0f;
  }
  const std::size_t refreshed = ex::observe_engine_rows(by_rows, attn.data(), 4, 256);
  check(refreshed == by_floats.observe_tokens(mean) && by_rows.digest() == by_floats.digest(),
        "observe_rows on the bf16 rows == observe_tokens of their float mean");
}

void batch() {
  std::printf("batch step: 6 requests of 300 tokens on a pool of 4 threads, global budget 100 pages (down to 90)\n");
  std::vector<ex::running_request> running;
  auto open_all = [&running](md::manager& mgr, md::block_pool<>& pool) {
    running.clear();
    for (std::uint64_t id = 1; id <= 6; ++id) {
      auto& seq = mgr.open(id, md::config{.page_size = P});
      pool.open(id);
      seq.append(md::regions::system, P);
      seq.append(static_cast<md::region_id>(1 + id % 6), 300 - P);
      pool.append_tokens(id, seq.kv_len());
      std::vector<float> mass(seq.kv_len());
      for (std::size_t t = 0; t < mass.size(); ++t) mass[t] = static_cast<float>((t * 37 + id * 11) % 101) / 3000.0f;
      running.push_back({id, mass});
    }
  };
  md::manager serial_mgr({.page_size = P, .global = md::global_budget::pages(100, 90)});
  md::manager threaded_mgr({.page_size = P, .global = md::global_budget::pages(100, 90)});
  md::block_pool<> serial_pool(200, P), threaded_pool(200, P);
  open_all(threaded_mgr, threaded_pool);
  const auto threaded = ex::batch_step(threaded_mgr, threaded_pool, 5, running);
  open_all(serial_mgr, serial_pool);
  serial_mgr.advance_to(5);
  for (const auto& r : running) serial_mgr.at(r.id).observe_tokens(r.attention_mass);
  const auto serial = serial_mgr.commit(serial_mgr.select_global(), serial_pool, md::identity_id{});
  std::size_t freed = 0;
  bool same = serial.size() == threaded.size();
  for (const auto& [id, removal] : threaded) {
    freed += removal.freed->size();
    same = same && serial.count(id) != 0 && serial.at(id).removed == removal.removed;
  }
  std::printf("  %zu blocks freed across %zu requests\n", freed, threaded.size());
  check(same && freed > 0 && threaded_mgr.reclaimable_pages() == 90,
        "the threaded step frees what the serial calls free");
  check(threaded_pool.consistent(), "the block pool is consistent");
}

}  // namespace

int main() {
  flashinfer();
  vllm();
  sglang();
  llama_cpp();
  tensorrt_llm();
  manager();
  attention_rows();
  batch();
  if (failures != 0) {
    std::printf("FAIL: %d checks failed\n", failures);
    return 1;
  }
  std::printf("OK: every adapter example freed exactly what memdecay chose\n");
  return 0;
}
#endif
