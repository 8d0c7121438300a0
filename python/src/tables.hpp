// SPDX-License-Identifier: Apache-2.0
// The page tables as the Python module holds them: the owning block pool, and the three non-owning views, each
// keeping the caller's NumPy arrays alive for as long as the view exists (the view edits them in place).
#ifndef MEMDECAY_PYTHON_TABLES_HPP
#define MEMDECAY_PYTHON_TABLES_HPP

#include <cstdint>
#include <optional>

#include <memdecay/page_tables/block_pool.hpp>
#include <memdecay/page_tables/flashinfer_csr.hpp>
#include <memdecay/page_tables/sglang_req_to_token.hpp>
#include <memdecay/page_tables/vllm_block_table.hpp>

#include "bindings.hpp"
#include "common/sequence_handle.hpp"

namespace memdecay_python {

/// vLLM's padded block table [rows, max_blocks_per_row] and num_blocks_per_row [rows], both int32.
struct vllm_view {
  py::array_t<std::int32_t> block_ids, num_blocks;
  memdecay::vllm_block_table table;
  vllm_view(py::array_t<std::int32_t> ids, py::array_t<std::int32_t> counts, std::size_t page_size,
            std::size_t num_pool_blocks)
      : block_ids(std::move(ids)),
        num_blocks(std::move(counts)),
        table({block_ids.mutable_data(), static_cast<std::size_t>(block_ids.size())},
              {num_blocks.mutable_data(), static_cast<std::size_t>(num_blocks.size())},
              static_cast<std::size_t>(block_ids.shape(1)), page_size, num_pool_blocks) {}
};

/// SGLang's req_to_token [rows, max_context_len] (int32 KV slots) and the rows' lengths [rows] (int64).
struct sglang_view {
  py::array_t<std::int32_t> req_to_token;
  py::array_t<std::int64_t> seq_lens;
  memdecay::sglang_req_to_token table;
  sglang_view(py::array_t<std::int32_t> slots, py::array_t<std::int64_t> lens, std::size_t page_size,
              std::size_t num_slots)
      : req_to_token(std::move(slots)),
        seq_lens(std::move(lens)),
        table({req_to_token.mutable_data(), static_cast<std::size_t>(req_to_token.size())},
              {seq_lens.mutable_data(), static_cast<std::size_t>(seq_lens.size())},
              static_cast<std::size_t>(req_to_token.shape(1)), page_size, num_slots) {}
};

/// FlashInfer's paged-KV CSR: indptr [batch + 1], indices [>= nnz], last_page_len [batch], all int32.
struct flashinfer_view {
  py::array_t<std::int32_t> indptr, indices, last_page_len;
  memdecay::flashinfer_csr table;
  flashinfer_view(py::array_t<std::int32_t> ptr, py::array_t<std::int32_t> idx, py::array_t<std::int32_t> last,
                  std::size_t page_size, std::size_t num_pool_pages)
      : indptr(std::move(ptr)),
        indices(std::move(idx)),
        last_page_len(std::move(last)),
        table({indptr.mutable_data(), static_cast<std::size_t>(indptr.size())},
              {indices.mutable_data(), static_cast<std::size_t>(indices.size())},
              {last_page_len.data(), static_cast<std::size_t>(last_page_len.size())}, page_size, num_pool_pages) {}
};

/// Calls fn with the C++ table `obj` holds (the block pool, or a view's table); a ValueError naming `argument`
/// for anything else. The commits of Sequence and Manager dispatch here.
template <class Fn>
decltype(auto) with_table(const py::handle& obj, const char* argument, Fn&& fn) {
  if (py::isinstance<pool_type>(obj)) return fn(obj.cast<pool_type&>());
  if (py::isinstance<vllm_view>(obj)) return fn(obj.cast<vllm_view&>().table);
  if (py::isinstance<sglang_view>(obj)) return fn(obj.cast<sglang_view&>().table);
  if (py::isinstance<flashinfer_view>(obj)) return fn(obj.cast<flashinfer_view&>().table);
  raise_argument(argument, "expected a BlockPool, VllmBlockTable, SglangReqToToken or FlashInferCsr");
}

}  // namespace memdecay_python

#endif  // MEMDECAY_PYTHON_TABLES_HPP
