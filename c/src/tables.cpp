// SPDX-License-Identifier: Apache-2.0
// memdecay_table: the owning block pool, or a view that edits the engine's arrays in place; and removals.
#include <cstddef>
#include <type_traits>

#include "handles.hpp"

namespace memdecay_c {

namespace {

// rows x columns elements, or an input_error naming the arrays when that overflows.
std::size_t elements(std::size_t rows, std::size_t columns, const char* what) {
  std::size_t n = 0;
  if (__builtin_mul_overflow(rows, columns, &n))
    throw md::input_error(std::string(what) + ": " + std::to_string(rows) + " x " + std::to_string(columns) +
                          " elements overflow size_t");
  return n;
}

pool_type& pool_of(memdecay_table* t) {
  auto* pool = std::get_if<pool_type>(&require(t, "pool")->table);
  if (!pool) raise(MEMDECAY_INVALID_ARGUMENT, "pool: this table is a view, not the owning block pool");
  return *pool;
}

template <class Make>
memdecay_status make_table(memdecay_table** out, Make&& make) {
  return guarded(nullptr, [&] {
    require(out, "out");
    *out = new memdecay_table{make(), {}};
  });
}

}  // namespace

// A removal's slots are handed out in place: memdecay_slot_range is md::slot_range's C twin.
static_assert(sizeof(memdecay_slot_range) == sizeof(md::slot_range) &&
              offsetof(memdecay_slot_range, begin) == offsetof(md::slot_range, begin) &&
              offsetof(memdecay_slot_range, end) == offsetof(md::slot_range, end) &&
              std::is_standard_layout_v<md::slot_range>);

}  // namespace memdecay_c

using namespace memdecay_c;

extern "C" {

memdecay_status memdecay_block_pool_create(size_t num_blocks, size_t page_size, memdecay_table** out) {
  return make_table(out, [&] { return table_variant(std::in_place_type<pool_type>, num_blocks, page_size); });
}

memdecay_status memdecay_block_pool_open(memdecay_table* pool, uint64_t sequence) {
  return guarded(pool ? &pool->error : nullptr, [&] { pool_of(pool).open(sequence); });
}

memdecay_status memdecay_block_pool_close(memdecay_table* pool, uint64_t sequence) {
  return guarded(pool ? &pool->error : nullptr, [&] { pool_of(pool).close(sequence); });
}

memdecay_status memdecay_block_pool_append_tokens(memdecay_table* pool, uint64_t sequence, size_t tokens) {
  return guarded(pool ? &pool->error : nullptr, [&] { pool_of(pool).append_tokens(sequence, tokens); });
}

memdecay_status memdecay_block_pool_free_blocks(const memdecay_table* pool, size_t* count) {
  return guarded(nullptr, [&] { *require(count, "count") = pool_of(const_cast<memdecay_table*>(pool)).free_blocks(); });
}

memdecay_status memdecay_block_pool_blocks(const memdecay_table* pool, uint64_t sequence, int32_t* ids, size_t capacity,
                                           size_t* count) {
  return guarded(nullptr, [&] {
    const auto blocks = pool_of(const_cast<memdecay_table*>(pool)).block_table(sequence);
    copy_out(std::vector<std::int32_t>(blocks.begin(), blocks.end()), ids, capacity, count, "ids");
  });
}

memdecay_status memdecay_vllm_block_table_create(int32_t* block_ids, int32_t* num_blocks_per_row, size_t rows,
                                                 size_t max_blocks_per_row, size_t page_size, size_t num_pool_blocks,
                                                 memdecay_table** out) {
  return make_table(out, [&] {
    const std::size_t n = elements(rows, max_blocks_per_row, "block_ids");
    array_of(block_ids, n, "block_ids");
    array_of(num_blocks_per_row, rows, "num_blocks_per_row");
    return table_variant(std::in_place_type<md::vllm_block_table>, std::span<std::int32_t>(block_ids, n),
                         std::span<std::int32_t>(num_blocks_per_row, rows), max_blocks_per_row, page_size,
                         num_pool_blocks);
  });
}

memdecay_status memdecay_sglang_req_to_token_create(int32_t* req_to_token, int64_t* seq_lens, size_t rows,
                                                    size_t max_context_len, size_t page_size, size_t num_slots,
                                                    memdecay_table** out) {
  return make_table(out, [&] {
    const std::size_t n = elements(rows, max_context_len, "req_to_token");
    array_of(req_to_token, n, "req_to_token");
    array_of(seq_lens, rows, "seq_lens");
    return table_variant(std::in_place_type<md::sglang_req_to_token>, std::span<std::int32_t>(req_to_token, n),
                         std::span<std::int64_t>(seq_lens, rows), max_context_len, page_size, num_slots);
  });
}

memdecay_status memdecay_flashinfer_csr_create(int32_t* indptr, size_t batch, int32_t* indices, size_t indices_capacity,
                                               const int32_t* last_page_len, size_t page_size, size_t num_pool_pages,
                                               memdecay_table** out) {
  return make_table(out, [&] {
    if (batch == SIZE_MAX) throw md::input_error("indptr: batch + 1 overflows size_t");
    require(indptr, "indptr");
    array_of(indices, indices_capacity, "indices");
    array_of(last_page_len, batch, "last_page_len");
    return table_variant(std::in_place_type<md::flashinfer_csr>, std::span<std::int32_t>(indptr, batch + 1),
                         std::span<std::int32_t>(indices, indices_capacity),
                         std::span<const std::int32_t>(last_page_len, batch), page_size, num_pool_pages);
  });
}

void memdecay_table_destroy(memdecay_table* table) { delete table; }

const char* memdecay_table_last_error(const memdecay_table* table) { return table ? table->error.c_str() : ""; }

memdecay_status memdecay_table_num_pages(const memdecay_table* table, uint64_t row, size_t* count) {
  return guarded(nullptr, [&] {
    require(count, "count");
    with_table(*const_cast<memdecay_table*>(require(table, "table")), [&](auto& t) {
      using T = std::decay_t<decltype(t)>;
      *count = t.num_pages(static_cast<typename T::sequence_id>(row));
    });
  });
}

memdecay_removal_view memdecay_removal_get(const memdecay_removal* removal) {
  memdecay_removal_view v{};
  if (!removal) return v;
  const auto& r = removal->removal;
  v.removed = r.removed.data();
  v.num_removed = r.removed.size();
  v.has_freed = r.freed.has_value() ? 1 : 0;
  v.freed = r.freed ? r.freed->data() : nullptr;
  v.num_freed = r.freed ? r.freed->size() : 0;
  v.slots = reinterpret_cast<const memdecay_slot_range*>(r.slots.data());
  v.num_slots = r.slots.size();
  return v;
}

void memdecay_removal_destroy(memdecay_removal* removal) { delete removal; }

}  // extern "C"
