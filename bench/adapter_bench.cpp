// What the manager's table operations cost, per page table, on a batch of 128 requests holding N pages in all
// (N = 2K, 8K, 32K; pages of 16 tokens; every fourth request starts from another's first half: shared blocks):
//   adapter/<table>/mark_shared/<N>   manager::mark_shared_from(table, ids): re-flag shared pages from the table
//   adapter/<table>/commit128/<N>     manager::commit of a global plan of 128 victims spread over the batch by the
//                                     tie hash (the setup, rebuilding the batch, is not timed)
// <table> is block_pool (owning, O(1) reference counts), vllm (vllm_block_table over a rows x max_blocks array)
// or flashinfer (flashinfer_csr over indptr / indices / last_page_len). Items are pages.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <numeric>
#include <vector>

#include <memdecay/page_tables/block_pool.hpp>
#include <memdecay/core/manager.hpp>
#include <memdecay/page_tables/flashinfer_csr.hpp>
#include <memdecay/page_tables/vllm_block_table.hpp>

namespace md = memdecay;

namespace {

constexpr std::size_t kPage = 16;
constexpr std::size_t kRows = 128;

// The batch: the manager's sequences and a block pool that holds their blocks (sharing included).
struct batch {
  md::manager mgr{{.page_size = kPage}};
  md::block_pool<> pool;
  explicit batch(std::size_t total_pages) : pool(total_pages + kRows, kPage) {
    const std::size_t per_row = total_pages / kRows;
    for (std::uint64_t id = 0; id < kRows; ++id) {
      auto& seq = mgr.open(id, md::config{.page_size = kPage});
      pool.open(id);
      const bool shares = id % 4 == 3;
      if (shares) pool.share_prefix(id - 1, id, per_row / 2);
      seq.append(md::regions::tool_out, per_row * kPage);
      pool.append_tokens(id, (shares ? per_row - per_row / 2 : per_row) * kPage);
    }
  }
  md::manager::global_plan_type one_page_each() const {
    return mgr.select_global(kRows);  // every page ties: the tie hash spreads the 128 victims over the rows
  }
};

// The vLLM and FlashInfer arrays of the pool's rows.
struct vllm_arrays {
  std::vector<std::int32_t> ids, counts;
  std::size_t stride = 0;
  explicit vllm_arrays(const md::block_pool<>& pool) {
    for (std::uint64_t id = 0; id < kRows; ++id) stride = std::max(stride, pool.num_pages(id));
    ids.assign(kRows * stride, 0);
    for (std::uint64_t id = 0; id < kRows; ++id) {
      const auto row = pool.block_table(id);
      std::copy(row.begin(), row.end(), ids.begin() + static_cast<std::ptrdiff_t>(id * stride));
      counts.push_back(static_cast<std::int32_t>(row.size()));
    }
  }
  md::vllm_block_table view(std::size_t pool_blocks) { return {ids, counts, stride, kPage, pool_blocks}; }
};
struct csr_arrays {
  std::vector<std::int32_t> indptr{0}, indices, last;
  explicit csr_arrays(const md::block_pool<>& pool) {
    for (std::uint64_t id = 0; id < kRows; ++id) {
      const auto row = pool.block_table(id);
      indices.insert(indices.end(), row.begin(), row.end());
      indptr.push_back(static_cast<std::int32_t>(indices.size()));
      last.push_back(static_cast<std::int32_t>(kPage));
    }
  }
  md::flashinfer_csr view(std::size_t pool_blocks) { return {indptr, indices, last, kPage, pool_blocks}; }
};

void finish(benchmark::State& st, std::size_t pages) {
  st.SetItemsProcessed(static_cast<std::int64_t>(st.iterations()) * static_cast<std::int64_t>(pages));
}

void mark_shared_pool(benchmark::State& st) {
  const auto n = static_cast<std::size_t>(st.range(0));
  batch b(n);
  for (auto _ : st) b.mgr.mark_shared_from(b.pool, md::identity_id{});
  finish(st, n);
}
void mark_shared_vllm(benchmark::State& st) {
  const auto n = static_cast<std::size_t>(st.range(0));
  batch b(n);
  vllm_arrays a(b.pool);
  const auto view = a.view(b.pool.capacity());
  for (auto _ : st) b.mgr.mark_shared_from(view, [](std::uint64_t id) { return id; });
  finish(st, n);
}
void mark_shared_flashinfer(benchmark::State& st) {
  const auto n = static_cast<std::size_t>(st.range(0));
  batch b(n);
  csr_arrays a(b.pool);
  const auto view = a.view(b.pool.capacity());
  for (auto _ : st) b.mgr.mark_shared_from(view, [](std::uint64_t id) { return id; });
  finish(st, n);
}

template <class MakeTable>
void commit128(benchmark::State& st, MakeTable make_table) {
  const auto n = static_cast<std::size_t>(st.range(0));
  for (auto _ : st) {
    st.PauseTiming();
    batch b(n);
    auto arrays = make_table(b.pool);
    auto view = arrays.view(b.pool.capacity());
    const auto plan = b.one_page_each();
    st.ResumeTiming();
    benchmark::DoNotOptimize(b.mgr.commit(plan, view, [](std::uint64_t id) { return id; }));
  }
  finish(st, n);
}
void commit128_pool(benchmark::State& st) {
  const auto n = static_cast<std::size_t>(st.range(0));
  for (auto _ : st) {
    st.PauseTiming();
    batch b(n);
    const auto plan = b.one_page_each();
    st.ResumeTiming();
    benchmark::DoNotOptimize(b.mgr.commit(plan, b.pool, md::identity_id{}));
  }
  finish(st, n);
}

const bool registered = [] {
  auto sizes = [](benchmark::internal::Benchmark* b) {
    for (long n : {2048L, 8192L, 32768L}) b->Arg(n);
    b->Unit(benchmark::kMicrosecond);
  };
  sizes(benchmark::RegisterBenchmark("adapter/block_pool/mark_shared", mark_shared_pool));
  sizes(benchmark::RegisterBenchmark("adapter/vllm/mark_shared", mark_shared_vllm));
  sizes(benchmark::RegisterBenchmark("adapter/flashinfer/mark_shared", mark_shared_flashinfer));
  sizes(benchmark::RegisterBenchmark("adapter/block_pool/commit128", commit128_pool));
  sizes(benchmark::RegisterBenchmark("adapter/vllm/commit128", [](benchmark::State& st) {
    commit128(st, [](const md::block_pool<>& pool) { return vllm_arrays(pool); });
  }));
  sizes(benchmark::RegisterBenchmark("adapter/flashinfer/commit128", [](benchmark::State& st) {
    commit128(st, [](const md::block_pool<>& pool) { return csr_arrays(pool); });
  }));
  return true;
}();

}  // namespace
