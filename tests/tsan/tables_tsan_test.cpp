// SPDX-License-Identifier: Apache-2.0
// ThreadSanitizer test of the documented concurrency of block_pool and the page-table adapters
// (docs/reliability.md, "Thread safety"): build with -fsanitize=thread (tests/tsan/CMakeLists.txt).
//
// The documented rule for each type is "one writer per pool or table; const members concurrently with each other".
// What an engine may therefore do, and this test does, with 4 threads:
//   1. block_pool: one pool per worker thread (its own sequences; open, append, share_prefix, remove_pages,
//      close), then every thread runs const queries (block_table, page_at, ref_count, consistent) on ONE pool
//      at once; all must agree;
//   2. flashinfer_csr: one batch (its own indptr / indices / last_page_len) per thread, removals and reads; then
//      const reads (num_pages, kv_len, page_at, ref_count, check_remove_pages) of ONE view from every thread;
//   3. vllm_block_table and sglang_req_to_token: ONE shared matrix, each thread removing pages from its own row
//      through a one-row view (vllm_block_table::row / sglang_req_to_token::row), which touches only that row
//      and its count (a whole-table view validates every row, so it is one writer per table).
// The threaded run must end in exactly the state of the same calls made on one thread. With the argument
// `race`, two threads remove pages of DIFFERENT sequences of the SAME block_pool (what the documentation forbids:
// one pool is one free list), and CTest tables_tsan_detects_a_race expects TSan's report.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <thread>
#include <vector>

#include "memdecay/page_tables/block_pool.hpp"
#include "memdecay/detail/digest.hpp"
#include "memdecay/page_tables/flashinfer_csr.hpp"
#include "memdecay/page_tables/sglang_req_to_token.hpp"
#include "memdecay/page_tables/vllm_block_table.hpp"

namespace md = memdecay;

namespace {

constexpr int threads = 4;
constexpr int rounds = 30;

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "tables_tsan_test: FAILED: %s\n", what);
  std::exit(1);
}

template <class F>
void spread(bool threaded, F&& f) {
  if (threaded) {
    std::vector<std::jthread> pool;
    for (int t = 0; t < threads; ++t) pool.emplace_back(f, t);
  } else {
    for (int t = 0; t < threads; ++t) f(t);
  }
}

// A deterministic workload on one pool (the worker's own): returns a digest of its block tables.
std::uint64_t pool_work(md::block_pool<>& pool, int t) {
  md::detail::fnv1a64 h;
  for (int round = 0; round < rounds; ++round) {
    const std::uint64_t a = static_cast<std::uint64_t>(round) * 2, b = a + 1;
    pool.open(a);
    pool.append_tokens(a, 8 + static_cast<std::size_t>((round + t) % 13));
    pool.open(b);
    pool.share_prefix(a, b, 1);
    pool.append_tokens(b, 5);
    const std::vector<std::size_t> victims{1};
    for (auto id : pool.remove_pages(a, victims).removed) h.add(static_cast<std::uint64_t>(id));
    for (auto id : pool.block_table(b)) h.add(static_cast<std::uint64_t>(id));
    if (round % 3 != 0) pool.close(a);
    if (round % 4 == 0) pool.close(b);
  }
  if (!pool.consistent()) fail("a worker's pool is inconsistent");
  h.add(static_cast<std::uint64_t>(pool.free_blocks()));
  return h.value();
}

std::uint64_t block_pools(bool threaded) {
  std::vector<md::block_pool<>> pools;
  for (int t = 0; t < threads; ++t) pools.emplace_back(256, 4);
  std::vector<std::uint64_t> digests(threads);
  spread(threaded,
         [&](int t) { digests[static_cast<std::size_t>(t)] = pool_work(pools[static_cast<std::size_t>(t)], t); });
  // Every thread reads pool 0 at once (const members only).
  const md::block_pool<>& shared = pools[0];
  std::vector<std::uint64_t> seen(threads);
  spread(threaded, [&](int t) {
    md::detail::fnv1a64 h;
    for (std::uint64_t seq = 0; seq < 2 * rounds; ++seq) {
      if (!shared.contains(seq)) continue;
      for (auto id : shared.block_table(seq)) h.add(static_cast<std::uint64_t>(shared.ref_count(id)));
      if (shared.num_pages(seq) > 0) h.add(static_cast<std::uint64_t>(shared.page_at(seq, 0)));
    }
    h.add(static_cast<std::uint64_t>(shared.consistent()));
    seen[static_cast<std::size_t>(t)] = h.value();
  });
  md::detail::fnv1a64 h;
  for (int t = 0; t < threads; ++t) {
    if (seen[static_cast<std::size_t>(t)] != seen[0]) fail("concurrent reads of one pool disagree");
    h.add(digests[static_cast<std::size_t>(t)]);
  }
  return h.add(seen[0]).value();
}

// One FlashInfer batch per thread: 3 requests of 6 pages (page size 4), request 1 shares request 0's first page.
struct csr_batch {
  std::vector<std::int32_t> indptr{0, 6, 12, 18}, indices, last_page_len{4, 2, 4};
  explicit csr_batch(int t) {
    for (int k = 0; k < 18; ++k) indices.push_back(t * 100 + k);
    indices[6] = indices[0];
  }
  md::flashinfer_csr view() { return md::flashinfer_csr(indptr, indices, last_page_len, 4, 1000); }
};

std::uint64_t flashinfer_batches(bool threaded) {
  std::vector<csr_batch> batches;
  for (int t = 0; t < threads; ++t) batches.emplace_back(t);
  std::vector<std::uint64_t> digests(threads);
  spread(threaded, [&](int t) {
    auto v = batches[static_cast<std::size_t>(t)].view();
    md::detail::fnv1a64 h;
    const std::vector<std::size_t> first{0}, middle{1, 3};
    for (auto id : v.remove_pages(1, first).removed) h.add(static_cast<std::uint64_t>(id));
    for (auto id : v.remove_pages(0, middle).removed) h.add(static_cast<std::uint64_t>(id));
    for (auto id : v.remove_pages(2, std::vector<std::size_t>{static_cast<std::size_t>(t % 5)}).removed)
      h.add(static_cast<std::uint64_t>(id));
    for (std::size_t r = 0; r < v.batch_size(); ++r) h.add(static_cast<std::uint64_t>(v.kv_len(r)));
    digests[static_cast<std::size_t>(t)] = h.value();
  });
  // Every thread reads batch 0 through one view at once.
  const auto shared = batches[0].view();
  std::vector<std::uint64_t> seen(threads);
  spread(threaded, [&](int t) {
    md::detail::fnv1a64 h;
    for (std::size_t r = 0; r < shared.batch_size(); ++r) {
      h.add(static_cast<std::uint64_t>(shared.num_pages(r))).add(static_cast<std::uint64_t>(shared.kv_len(r)));
      for (std::size_t p = 0; p < shared.num_pages(r); ++p)
        h.add(static_cast<std::uint64_t>(shared.ref_count(shared.page_at(r, p))));
      shared.check_remove_pages(r, std::vector<std::size_t>{0});
    }
    seen[static_cast<std::size_t>(t)] = h.value();
  });
  md::detail::fnv1a64 h;
  for (int t = 0; t < threads; ++t) {
    if (seen[static_cast<std::size_t>(t)] != seen[0]) fail("concurrent reads of one CSR view disagree");
    h.add(digests[static_cast<std::size_t>(t)]);
  }
  return h.add(seen[0]).value();
}

// One vLLM block table and one SGLang req_to_token matrix, a row per thread.
std::uint64_t row_views(bool threaded) {
  constexpr std::size_t blocks_per_row = 8, context = 32;
  std::vector<std::int32_t> block_ids(threads * blocks_per_row), num_blocks(threads, 8);
  std::vector<std::int32_t> slots(threads * context);
  std::vector<std::int64_t> seq_lens(threads, 30);
  for (std::size_t i = 0; i < block_ids.size(); ++i) block_ids[i] = static_cast<std::int32_t>(i);
  for (std::size_t i = 0; i < slots.size(); ++i) slots[i] = static_cast<std::int32_t>(i);
  std::vector<std::uint64_t> digests(threads);
  spread(threaded, [&](int t) {
    const auto r = static_cast<std::size_t>(t);
    auto vllm = md::vllm_block_table::row(std::span(block_ids).subspan(r * blocks_per_row, blocks_per_row),
                                          num_blocks[r], 4, block_ids.size());
    auto sglang =
        md::sglang_req_to_token::row(std::span(slots).subspan(r * context, context), seq_lens[r], 4, slots.size());
    md::detail::fnv1a64 h;
    for (int round = 0; round < 3; ++round) {
      const std::vector<std::size_t> victims{static_cast<std::size_t>((t + round) % 3)};
      for (auto id : vllm.remove_pages(0, victims).removed) h.add(static_cast<std::uint64_t>(id));
      for (auto range : sglang.remove_pages(0, victims).slots)
        h.add(static_cast<std::uint64_t>(range.begin)).add(static_cast<std::uint64_t>(range.end));
    }
    digests[r] = h.value();
  });
  // The whole-table views agree with what the row views did.
  const md::vllm_block_table vllm(block_ids, num_blocks, blocks_per_row, 4, block_ids.size());
  const md::sglang_req_to_token sglang(slots, seq_lens, context, 4, slots.size());
  md::detail::fnv1a64 h;
  for (std::size_t r = 0; r < threads; ++r) {
    h.add(digests[r])
        .add(static_cast<std::uint64_t>(vllm.num_pages(r)))
        .add(static_cast<std::uint64_t>(sglang.seq_len(r)));
    for (auto id : vllm.row_blocks(r)) h.add(static_cast<std::uint64_t>(id));
  }
  return h.value();
}

// Forbidden: two threads mutate one pool (different sequences, one free list).
void race() {
  md::block_pool<> pool(1024, 4);
  for (std::uint64_t s = 0; s < 2; ++s) {
    pool.open(s);
    pool.append_tokens(s, 400);
  }
  std::vector<std::jthread> workers;
  for (std::uint64_t s = 0; s < 2; ++s)
    workers.emplace_back([&pool, s] {
      for (int k = 0; k < 50; ++k) {
        (void)pool.remove_pages(s, std::vector<std::size_t>{0});
        pool.append_tokens(s, 4);
      }
    });
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string_view(argv[1]) == "race") {
    race();
    std::printf("tables_tsan_test: the racy run ended without a report\n");
    return 1;
  }
  const std::uint64_t pools[2] = {block_pools(false), block_pools(true)};
  const std::uint64_t csr[2] = {flashinfer_batches(false), flashinfer_batches(true)};
  const std::uint64_t rows[2] = {row_views(false), row_views(true)};
  if (pools[0] != pools[1]) fail("block_pool: the threaded run differs from the serial one");
  if (csr[0] != csr[1]) fail("flashinfer_csr: the threaded run differs from the serial one");
  if (rows[0] != rows[1]) fail("vllm / sglang row views: the threaded run differs from the serial one");
  std::printf(
      "tables_tsan_test: OK: %d threads; block_pool, flashinfer_csr, vllm and sglang row views give the "
      "serial results\n",
      threads);
  return 0;
}
