// SPDX-License-Identifier: Apache-2.0
// Page tables: BlockPool (owning), and VllmBlockTable, SglangReqToToken, FlashInferCsr over the engine's NumPy
// arrays (no copies: a removal edits the caller's arrays), and PageRemoval, what every removal returns.
#include "tables.hpp"

namespace memdecay_python {

namespace md = memdecay;

namespace {

using removal = md::page_removal<std::int32_t>;

std::vector<std::pair<std::int64_t, std::int64_t>> slot_pairs(const removal& r) {
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  for (const auto& s : r.slots) out.emplace_back(s.begin, s.end);
  return out;
}

// The members every view has, over its C++ table: `id` names the view's sequence id (row or request).
template <class View, class Class>
void def_view_members(Class& cls, const char* id) {
  cls.def_property_readonly("page_size", [](const View& v) { return v.table.page_size(); })
      .def(
          "num_pages", [](const View& v, std::size_t r) { return v.table.num_pages(r); }, py::arg(id))
      .def(
          "page_at", [](const View& v, std::size_t r, std::size_t i) { return v.table.page_at(r, i); }, py::arg(id),
          py::arg("index"))
      .def("validate", [](const View& v) { v.table.validate(); })
      .def(
          "remove_pages",
          [](View& v, std::size_t r, const py::object& pages) { return v.table.remove_pages(r, page_list(pages)); },
          py::arg(id), py::arg("pages"));
}

}  // namespace

void bind_tables(py::module_& m) {
  py::class_<removal>(
      m, "PageRemoval",
      "What a removal did: `removed` (every removed page's id, logical order; drop one reference to each), "
      "`freed` (the removed pages no holder keeps any more, or None when the table does not own the reference "
      "counts: the views), `slots` (the removed pages' KV slots as merged [begin, end) ranges).")
      .def_readonly("removed", &removal::removed)
      .def_readonly("freed", &removal::freed)
      .def_property_readonly("slots", &slot_pairs)
      .def("__repr__", [](const removal& r) {
        py::dict d;
        d["removed"] = r.removed;
        d["freed"] = r.freed ? py::cast(*r.freed) : py::none();
        d["slots"] = slot_pairs(r);
        return "PageRemoval(" + py::repr(d).cast<std::string>() + ")";
      });

  py::class_<pool_type>(m, "BlockPool",
                        "An owning KV block pool: a free list, reference counts and per-sequence block tables "
                        "(ids only; the engine owns the memory).")
      .def(py::init<std::size_t, std::size_t>(), py::arg("num_blocks"), py::arg("page_size"))
      .def_property_readonly("page_size", &pool_type::page_size)
      .def_property_readonly("capacity", &pool_type::capacity)
      .def_property_readonly("free_blocks", &pool_type::free_blocks)
      .def_property_readonly("used_blocks", &pool_type::used_blocks)
      .def("__contains__", &pool_type::contains)
      .def("open", &pool_type::open, py::arg("seq"))
      .def("close", &pool_type::close, py::arg("seq"))
      .def("append_tokens", &pool_type::append_tokens, py::arg("seq"), py::arg("tokens"))
      .def("fork", &pool_type::fork, py::arg("parent"), py::arg("child"))
      .def("share_prefix", &pool_type::share_prefix, py::arg("parent"), py::arg("child"), py::arg("pages"))
      .def("num_tokens", &pool_type::num_tokens, py::arg("seq"))
      .def("num_pages", &pool_type::num_pages, py::arg("seq"))
      .def("page_at", &pool_type::page_at, py::arg("seq"), py::arg("index"))
      .def("ref_count", &pool_type::ref_count, py::arg("block"))
      .def(
          "block_table",
          [](const pool_type& p, std::uint64_t seq) {
            const auto t = p.block_table(seq);
            return to_numpy(std::vector<std::int32_t>(t.begin(), t.end()));
          },
          py::arg("seq"), "A copy of the sequence's block ids in logical order.")
      .def(
          "remove_pages",
          [](pool_type& p, std::uint64_t seq, const py::object& pages) {
            const auto list = page_list(pages);
            return p.remove_pages(seq, list);
          },
          py::arg("seq"), py::arg("pages"))
      .def(
          "insert_pages",
          [](pool_type& p, std::uint64_t seq, const py::object& positions) {
            const auto list = page_list(positions);
            return to_numpy(p.insert_pages(seq, list));
          },
          py::arg("seq"), py::arg("positions"),
          "Inserts full pages at the ascending final positions, each in a fresh block (a host tier's recall); "
          "returns the blocks.")
      .def("consistent", &pool_type::consistent);

  py::class_<vllm_view> vllm(
      m, "VllmBlockTable",
      "vLLM's padded block table [rows, max_blocks_per_row] and num_blocks_per_row [rows] (int32 "
      "NumPy arrays, edited in place). Sequence ids are rows.");
  vllm.def(py::init([](const py::object& block_ids, const py::object& num_blocks, std::size_t page_size,
                       std::size_t num_pool_blocks) {
             auto ids = exact_array<std::int32_t>(block_ids, "block_ids", 2, true);
             auto counts = exact_array<std::int32_t>(num_blocks, "num_blocks_per_row", 1, true);
             if (counts.shape(0) != ids.shape(0))
               raise_argument("num_blocks_per_row",
                              std::to_string(counts.shape(0)) + " rows, block_ids has " + std::to_string(ids.shape(0)));
             return vllm_view(ids, counts, page_size, num_pool_blocks);
           }),
           py::arg("block_ids"), py::arg("num_blocks_per_row"), py::arg("page_size"), py::arg("num_pool_blocks"))
      .def_property_readonly("num_rows", [](const vllm_view& v) { return v.table.num_rows(); })
      .def(
          "ref_count", [](const vllm_view& v, std::int32_t id) { return v.table.ref_count(id); }, py::arg("block"));
  def_view_members<vllm_view>(vllm, "row");

  py::class_<sglang_view> sglang(
      m, "SglangReqToToken",
      "SGLang's req_to_token [rows, max_context_len] (int32 slots) and the rows' lengths [rows] "
      "(int64), edited in place. Sequence ids are rows; a page's id is its first slot.");
  sglang
      .def(py::init([](const py::object& req_to_token, const py::object& seq_lens, std::size_t page_size,
                       std::size_t num_slots) {
             auto slots = exact_array<std::int32_t>(req_to_token, "req_to_token", 2, true);
             auto lens = exact_array<std::int64_t>(seq_lens, "seq_lens", 1, true);
             if (lens.shape(0) != slots.shape(0))
               raise_argument("seq_lens", std::to_string(lens.shape(0)) + " rows, req_to_token has " +
                                              std::to_string(slots.shape(0)));
             return sglang_view(slots, lens, page_size, num_slots);
           }),
           py::arg("req_to_token"), py::arg("seq_lens"), py::arg("page_size"), py::arg("num_slots"))
      .def_property_readonly("num_rows", [](const sglang_view& v) { return v.table.num_rows(); })
      .def(
          "seq_len", [](const sglang_view& v, std::size_t r) { return v.table.seq_len(r); }, py::arg("row"));
  def_view_members<sglang_view>(sglang, "row");

  py::class_<flashinfer_view> flashinfer(
      m, "FlashInferCsr",
      "FlashInfer's paged-KV CSR: indptr [batch + 1], indices (at least nnz entries), "
      "last_page_len [batch], all int32, edited in place. Sequence ids are requests.");
  flashinfer
      .def(py::init([](const py::object& indptr, const py::object& indices, const py::object& last_page_len,
                       std::size_t page_size, std::size_t num_pool_pages) {
             return flashinfer_view(exact_array<std::int32_t>(indptr, "indptr", 1, true),
                                    exact_array<std::int32_t>(indices, "indices", 1, true),
                                    exact_array<std::int32_t>(last_page_len, "last_page_len", 1, false), page_size,
                                    num_pool_pages);
           }),
           py::arg("indptr"), py::arg("indices"), py::arg("last_page_len"), py::arg("page_size"),
           py::arg("num_pool_pages"))
      .def_property_readonly("batch_size", [](const flashinfer_view& v) { return v.table.batch_size(); })
      .def_property_readonly("nnz", [](const flashinfer_view& v) { return v.table.nnz(); })
      .def(
          "kv_len", [](const flashinfer_view& v, std::size_t r) { return v.table.kv_len(r); }, py::arg("request"))
      .def(
          "ref_count", [](const flashinfer_view& v, std::int32_t id) { return v.table.ref_count(id); },
          py::arg("page"));
  def_view_members<flashinfer_view>(flashinfer, "request");
}

}  // namespace memdecay_python
