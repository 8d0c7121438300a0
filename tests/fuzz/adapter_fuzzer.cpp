// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: a serving engine's loop over memdecay::manager (several sequences, per-sequence and global
// budgets, per-step protections, shared prefix pages) whose page table is a FlashInfer CSR batch
// (memdecay::flashinfer_csr over the engine's own int32 arrays), plus adapter operations on corrupted and scratch
// copies of those arrays. Everything is checked against the scalar models in model.hpp (one model_sequence per
// request) and a plain list-of-pages model of the CSR arrays written here. Aborts on:
//   * an outcome (ok / config_error / input_error / usage_error) other than the documented one;
//   * any difference in a sequence's state (labels, refresh steps, EWMA bits, positions, page origins, clock,
//     generation), in its page scores beyond the scorer's tolerance, in page statuses, in the manager's protected
//     and shared pages or sizes, or in the CSR arrays (indptr, indices, last_page_len) and the page ids a removal
//     returns;
//   * any difference in victims (sequence, page, score bits, shared flag, reason), in the per-sequence plans or in
//     pages_freed / pages_short of a global selection, computed by the model's rule on the library's scores;
//   * a broken invariant: a victim that is pinned, sink, recent, partial or protected for the step; a feasible
//     global budget not brought to its low watermark; a rejected call that changes the manager's digest, any
//     generation, the CSR arrays (every entry of the buffer, past nnz too) or the engine's allocator; a removal
//     that writes indices past the new nnz.
// The host-tier path (a first byte 0xF0..0xFE) adds a small manager_config::host_pool, tiered requests
// (enable_host_tier), page digests and queries, recall (select_recall / check_recall / commit_recall, stale and
// forged plans) and commits through the engine's host store (failing copies included), checked against
// tier_model.hpp and the host pool's rule restated here. It aborts, besides, on any difference in residency, last
// recall, demotions, host drops or recall plans; on a host pool over host_pool or a tier over its host budget; on
// a CSR row that is not exactly the device pages or a host store that does not hold exactly the host pages (a K/V
// tag per block and host copy: every page's K/V where its residency says); on a recall that displaces a protected
// or shared page; on a failed commit (a throwing or refusing store) that changed anything, the store included; and
// on a manager loaded from a snapshot of this one, or asked twice, that selects otherwise.
//
// Input layout (reads past the end give zero bytes): a header (page size, global budget, pool pages, slack of the
// indices buffer; on the host-tier path the host pool and the host store's slots), then operations, one opcode byte
// each followed by its arguments (see run). tests/fuzz/README.md has the details.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common.hpp"
#include "memdecay/core/manager.hpp"
#include "memdecay/io/manager_snapshot.hpp"
#include "memdecay/page_tables/flashinfer_csr.hpp"
#include "memdecay/tiers/host_store.hpp"
#include "memdecay/tiers/host_tier.hpp"
#include "model.hpp"
#include "tier_bridge.hpp"
#include "tier_model.hpp"

namespace {

using namespace memdecay_fuzz;
using Float = float;
using manager_type = memdecay::manager;
using plan_type = manager_type::plan_type;
using global_plan_type = manager_type::global_plan_type;
using csr = memdecay::flashinfer_csr;

constexpr std::size_t k_max_ops = 300;
constexpr std::size_t k_max_tokens = 400;  // per sequence: keeps one input fast
constexpr std::size_t k_max_requests = 6;
constexpr std::int32_t k_stale = 0x5EADBEEF;  // what the indices buffer holds past nnz at first

/// The CSR arrays of a batch, as the engine keeps them: indices has slack past nnz.
struct csr_arrays {
  std::vector<std::int32_t> indptr, indices, last_page_len;
  bool operator==(const csr_arrays&) const = default;
};

/// The documented validation rule of flashinfer_csr, restated: true when the arrays are a valid CSR.
bool model_csr_valid(const csr_arrays& a, std::size_t page_size, std::size_t pool_pages) {
  const std::size_t batch = a.last_page_len.size();
  if (a.indptr.size() != batch + 1 || a.indptr[0] != 0) return false;
  for (std::size_t r = 0; r < batch; ++r) {
    if (a.indptr[r + 1] <= a.indptr[r]) return false;  // not monotone, or a request without pages
    if (a.last_page_len[r] <= 0 || static_cast<std::size_t>(a.last_page_len[r]) > page_size) return false;
  }
  if (static_cast<std::size_t>(a.indptr[batch]) > a.indices.size()) return false;
  for (std::size_t r = 0; r < batch; ++r) {
    std::set<std::int32_t> seen;
    for (std::int32_t k = a.indptr[r]; k < a.indptr[r + 1]; ++k) {
      const std::int32_t id = a.indices[static_cast<std::size_t>(k)];
      if (id < 0 || static_cast<std::size_t>(id) >= pool_pages || !seen.insert(id).second) return false;
    }
  }
  return true;
}

/// The documented rule of flashinfer_csr::remove_pages on one request's page list: the outcome, and on success
/// the list without the pages and the removed ids in logical order.
outcome model_csr_remove(std::vector<std::int32_t>& pages, std::size_t last_len, std::size_t page_size,
                         const std::vector<std::size_t>& remove, std::vector<std::int32_t>& removed) {
  const std::size_t n = pages.size();
  for (std::size_t k = 0; k < remove.size(); ++k) {
    if (remove[k] >= n) return outcome::usage_error;
    if (k > 0 && remove[k] <= remove[k - 1]) return outcome::usage_error;
  }
  if (!remove.empty() && remove.size() == n) return outcome::usage_error;  // FlashInfer needs a page per request
  if (!remove.empty() && remove.back() == n - 1 && last_len != page_size) return outcome::usage_error;  // partial
  std::vector<std::int32_t> kept;
  for (std::size_t p = 0; p < n; ++p) {
    if (std::binary_search(remove.begin(), remove.end(), p))
      removed.push_back(pages[p]);
    else
      kept.push_back(pages[p]);
  }
  pages = std::move(kept);
  return outcome::ok;
}

// --- the host tiers (the path of a header byte 0xF0..0xFE: see LLVMFuzzerTestOneInput) -----------------------------
/// What the fuzzer's host store throws when a fault is injected into one of its copies (not a memdecay error: the
/// manager must undo and let it through).
struct injected_fault {};

/// The host-tier path's settings, read from the header (absent: the path is off and nothing below is read).
struct tier_options {
  bool on = false;
  std::size_t host_pool = std::numeric_limits<std::size_t>::max();  // manager_config::host_pool
  std::size_t store_slots = 0;                                      // the engine's host store
};

/// One request of the batch: the model of its sequence, the physical pages of its CSR row (its device pages, in
/// page order), the K/V each held page holds (a tag: device blocks and host copies carry the tag of the page whose
/// K/V they hold), and the manager's per-step protections and shared blocks as the model keeps them (by original
/// page index; a shared page maps to its block's key in the harness's model of the manager's blocks).
struct request {
  std::uint64_t id = 0;
  model_sequence<Float> m;
  std::vector<std::int32_t> pages;
  std::vector<std::uint64_t> kv;  // per held page
  std::set<std::uint64_t> protect;
  std::map<std::uint64_t, std::uint64_t> shared;  // origin -> block key

  std::uint64_t origin(std::size_t p) const { return m.tokens[p * m.P].position / m.P; }
  /// The held index of every device page, in page order (the CSR row's order).
  std::vector<std::size_t> device_list() const {
    std::vector<std::size_t> out;
    for (std::size_t p = 0; p < m.num_pages(); ++p)
      if (!m.on_host(p)) out.push_back(p);
    return out;
  }
  /// The CSR indices of held device pages (ascending).
  std::vector<std::size_t> device_indices(const std::vector<std::size_t>& held) const {
    std::vector<std::size_t> out;
    for (std::size_t p : held) out.push_back(m.device_index(p));
    return out;
  }
  std::vector<std::size_t> indices_of(const std::set<std::uint64_t>& set) const {
    std::vector<std::size_t> out;
    for (std::size_t p = 0; p < m.num_pages(); ++p)
      if (set.contains(origin(p))) out.push_back(p);
    return out;
  }
  std::size_t last_len() const { return m.kv_len() - m.P * (m.num_pages() - 1); }
};

class harness {
 public:
  harness(manager_type& mgr, std::size_t page_size, std::size_t pool_pages, std::size_t slack,
          memdecay::global_budget global, tier_options tiers = {})
      : mgr_(mgr),
        P_(page_size),
        pool_pages_(pool_pages),
        slack_(slack),
        global_(global),
        tiers_(tiers),
        refs_(pool_pages, 0),
        block_kv_(pool_pages, k_no_kv) {
    for (std::size_t i = pool_pages; i-- > 0;) free_.push_back(static_cast<std::int32_t>(i));
    rebuild();
  }

  void run(reader& in) {
    compare_all("start");
    for (std::size_t op = 0; op < k_max_ops && !in.done(); ++op) {
      const snapshot before = snap();
      const std::uint8_t code = in.u8();
      // The host-tier path has seven operations more (20-26); without it the opcodes are as they always were.
      switch (code % (tiers_.on ? 27 : 20)) {
        case 0: op_open(in); break;
        case 1:
          if (in.flip(2))
            op_fork(in);
          else
            op_open(in);
          break;
        case 2: op_close(in); break;
        case 3:
        case 4:
        case 5: op_append(in); break;
        case 6: op_advance(in); break;
        case 7:
        case 8: op_observe(in); break;
        case 9: op_protect(in); break;
        case 10: op_shared(in); break;
        case 11: op_select_one(in); break;
        case 12:
        case 13:
        case 14: op_select_global(in); break;
        case 15:
        case 16: op_commit_global(in); break;
        case 17: op_corrupt(in); break;
        case 18:
          if (in.flip(2))
            op_snapshot(in);
          else
            op_scratch_remove(in);
          break;
        case 19: op_commit_one(in); break;
        case 20: op_enable_tier(in); break;
        case 21: op_digests(in); break;
        case 22:
        case 23: op_recall(in); break;
        case 24: op_store_commit(in); break;
        case 25: op_recall_forged(in); break;
        default: op_tier_checks(in); break;
      }
      // The full comparison after every call that changed something (the digest covers every field the
      // selection reads), and every 8th call anyway.
      if (!(snap() == before) || op % 8 == 0) compare_all("after op " + std::to_string(op));
    }
  }

 private:
  // --- engine side ------------------------------------------------------------------------------------------------
  request* find(std::uint64_t id) {
    for (auto& r : reqs_)
      if (r.id == id) return &r;
    return nullptr;
  }
  const request* find_const(std::uint64_t id) const {
    for (const auto& r : reqs_)
      if (r.id == id) return &r;
    return nullptr;
  }
  std::size_t row_of(std::uint64_t id) const {
    for (std::size_t r = 0; r < reqs_.size(); ++r)
      if (reqs_[r].id == id) return r;
    return reqs_.size();  // not in the batch: flashinfer_csr says usage_error
  }
  auto row_map() {
    return [this](std::uint64_t id) { return row_of(id); };
  }
  /// Writes the arrays from the requests' page lists (what the engine does after allocating or dropping a row).
  void rebuild() {
    arrays_.indptr.assign(1, 0);
    arrays_.indices.clear();
    arrays_.last_page_len.clear();
    for (const auto& r : reqs_) {
      arrays_.indices.insert(arrays_.indices.end(), r.pages.begin(), r.pages.end());
      arrays_.indptr.push_back(static_cast<std::int32_t>(arrays_.indices.size()));
      arrays_.last_page_len.push_back(static_cast<std::int32_t>(r.last_len()));
    }
    arrays_.indices.resize(arrays_.indices.size() + slack_, k_stale);
  }
  csr view() { return view_of(arrays_); }
  csr view_of(csr_arrays& a) { return csr(a.indptr, a.indices, a.last_page_len, P_, pool_pages_); }
  std::size_t holders(std::int32_t id) const {
    std::size_t n = 0;
    for (const auto& r : reqs_) n += static_cast<std::size_t>(std::count(r.pages.begin(), r.pages.end(), id));
    return n;
  }
  void release(std::int32_t id) {
    if (--refs_[static_cast<std::size_t>(id)] == 0) free_.push_back(id);
  }
  // --- the model of the manager's shared blocks: a block is shared while two resident pages of open requests
  // hold it, or while holders outside the manager do (set_shared; table references the manager cannot see) ---
  struct model_block {
    std::size_t holders = 0;
    bool external = false;
  };
  bool block_shared(std::uint64_t key) const {
    const auto& b = blocks_.at(key);
    return b.external || b.holders > 1;
  }
  bool shares(const request& r, std::uint64_t origin) const {
    const auto it = r.shared.find(origin);
    return it != r.shared.end() && block_shared(it->second);
  }
  std::vector<std::size_t> shared_indices(const request& r) const {
    std::vector<std::size_t> out;
    for (std::size_t p = 0; p < r.m.num_pages(); ++p)
      if (shares(r, r.origin(p))) out.push_back(p);
    return out;
  }
  std::size_t shared_blocks() const {
    std::size_t n = 0;
    for (const auto& [key, b] : blocks_) n += block_shared(key) ? 1 : 0;
    return n;
  }
  void release_key(std::uint64_t key) {
    auto it = blocks_.find(key);
    FUZZ_CHECK(it != blocks_.end(), "model: a shared page without a block");
    if (--it->second.holders == 0) blocks_.erase(it);
  }
  // The key of the page's block; a page without one gets a fresh block that it alone holds.
  std::uint64_t shared_key(request& r, std::uint64_t origin) {
    auto it = r.shared.find(origin);
    if (it == r.shared.end()) {
      it = r.shared.emplace(origin, next_key_++).first;
      ++blocks_[it->second].holders;
    }
    return it->second;
  }
  void unshare(request& r, std::uint64_t origin) {
    if (auto it = r.shared.find(origin); it != r.shared.end()) {
      release_key(it->second);
      r.shared.erase(it);
    }
  }
  /// Pages the engine allocates so that request r holds `tokens` more tokens; false (nothing allocated) if the
  /// pool is short.
  /// (The device pages: host pages hold no block, and are always full.) Each fresh block gets a new K/V tag.
  bool allocate(request& r, std::size_t tokens) {
    const std::size_t total = r.m.device_len() + tokens;
    const std::size_t need = (total + P_ - 1) / P_ - r.pages.size();
    if (need > free_.size()) return false;
    for (std::size_t k = 0; k < need; ++k) r.pages.push_back(take_block(next_kv_++));
    return true;
  }
  /// A fresh block from the end of the free list, holding the K/V `tag`.
  std::int32_t take_block(std::uint64_t tag) {
    const std::int32_t id = free_.back();
    free_.pop_back();
    refs_[static_cast<std::size_t>(id)] = 1;
    block_kv_[static_cast<std::size_t>(id)] = tag;
    return id;
  }
  /// The K/V tags of the pages an append added (the last held pages, on the device: the blocks allocate() took).
  void sync_kv(request& r) {
    while (r.kv.size() < r.m.num_pages()) {
      const std::size_t d = r.pages.size() - (r.m.num_pages() - r.kv.size());
      r.kv.push_back(block_kv_[static_cast<std::size_t>(r.pages[d])]);
    }
  }

  // --- snapshots and comparisons ----------------------------------------------------------------------------------
  using store_key = std::pair<std::uint64_t, std::uint64_t>;  // (request id, origin)
  struct snapshot {
    std::uint64_t digest;
    std::vector<std::uint64_t> generations;
    csr_arrays arrays;
    std::size_t free;
    std::map<store_key, std::uint64_t> store;  // the host store's copies (empty without the host-tier path)
    bool operator==(const snapshot&) const = default;
  };
  snapshot snap() const {
    snapshot s{mgr_.digest(), {}, arrays_, free_.size(), host_kv_};
    for (const auto& r : reqs_) s.generations.push_back(mgr_.at(r.id).state().generation());
    return s;
  }
  void unchanged_if_rejected(outcome o, const snapshot& before, const std::string& call) {
    if (o != outcome::ok) FUZZ_CHECK(snap() == before, call + " was rejected but changed something");
  }

  void compare_all(const std::string& where) {
    FUZZ_CHECK(mgr_.size() == reqs_.size(), where + ": manager size");
    std::vector<std::uint64_t> ids;
    for (const auto& r : reqs_) ids.push_back(r.id);
    std::sort(ids.begin(), ids.end());
    FUZZ_CHECK(mgr_.ids() == ids, where + ": manager ids");
    std::size_t resident = 0, reclaimable = 0;
    for (const auto& r : reqs_) compare_request(r, where, resident, reclaimable);
    FUZZ_CHECK(mgr_.resident_pages() == resident, where + ": resident pages");
    FUZZ_CHECK(mgr_.reclaimable_pages() == reclaimable, where + ": reclaimable pages");
    FUZZ_CHECK(mgr_.physical_pages() == reclaimable + shared_blocks(), where + ": physical pages");
    // The host pool: every tier's host pages, within manager_config::host_pool; the store holds nothing else.
    std::size_t hosted = 0;
    for (const auto& r : reqs_) hosted += r.m.host_pages();
    FUZZ_CHECK(mgr_.host_pages() == hosted, where + ": host pages");
    FUZZ_CHECK(hosted <= tiers_.host_pool, where + ": the host pool holds more than host_pool");
    FUZZ_CHECK(host_kv_.size() == hosted, where + ": host store copies of pages that are not held");
    // The arrays are exactly the rows of the model, and the adapter reads them back.
    csr_arrays want;
    want.indptr.assign(1, 0);
    for (const auto& r : reqs_) {
      want.indices.insert(want.indices.end(), r.pages.begin(), r.pages.end());
      want.indptr.push_back(static_cast<std::int32_t>(want.indices.size()));
      want.last_page_len.push_back(static_cast<std::int32_t>(r.last_len()));
    }
    FUZZ_CHECK(arrays_.indptr == want.indptr, where + ": indptr");
    FUZZ_CHECK(arrays_.last_page_len == want.last_page_len, where + ": last_page_len");
    FUZZ_CHECK(arrays_.indices.size() >= want.indices.size() &&
                   std::equal(want.indices.begin(), want.indices.end(), arrays_.indices.begin()),
               where + ": indices");
    const csr v = view();
    FUZZ_CHECK(v.batch_size() == reqs_.size() && v.nnz() == want.indices.size(), where + ": csr sizes");
    std::map<std::int32_t, std::size_t> count;
    for (std::int32_t id : want.indices) ++count[id];
    for (std::size_t row = 0; row < reqs_.size(); ++row) {
      const auto& r = reqs_[row];
      FUZZ_CHECK(v.num_pages(row) == r.pages.size() && v.kv_len(row) == r.m.device_len(), where + ": csr row");
      for (std::size_t p = 0; p < r.pages.size(); ++p) {
        FUZZ_CHECK(v.page_at(row, p) == r.pages[p], where + ": page_at");
        FUZZ_CHECK(refs_[static_cast<std::size_t>(r.pages[p])] == count[r.pages[p]], where + ": engine refs");
      }
      // ref_count scans the batch: checked on the first and last page of each row.
      for (std::int32_t id : {r.pages.front(), r.pages.back()})
        FUZZ_CHECK(v.ref_count(id) == count[id], where + ": ref_count of page " + std::to_string(id));
    }
    FUZZ_CHECK(
        free_.size() + std::count_if(refs_.begin(), refs_.end(), [](std::size_t n) { return n > 0; }) == pool_pages_,
        where + ": engine allocator");
  }
  void compare_request(const request& r, const std::string& where, std::size_t& resident, std::size_t& reclaimable) {
    const auto& seq = mgr_.at(r.id);
    const auto& st = seq.state();
    const auto& pol = seq.policy();
    const auto& m = r.m;
    const std::string w = where + ", sequence " + std::to_string(r.id);
    FUZZ_CHECK(st.kv_len() == m.kv_len() && st.num_pages() == m.num_pages() && st.logical_len() == m.logical_len, w);
    FUZZ_CHECK(st.now() == m.now, w + ": clock");
    FUZZ_CHECK(st.generation() == m.generation, w + ": generation");
    for (std::size_t i = 0; i < m.kv_len(); ++i) {
      const auto& t = m.tokens[i];
      FUZZ_CHECK(st.regions()[i] == t.region && pol.last_refresh()[i] == t.refreshed && st.position_of(i) == t.position,
                 w + ": token " + std::to_string(i));
      FUZZ_CHECK(std::memcmp(&pol.ewma()[i], &t.ewma, sizeof(Float)) == 0, w + ": EWMA of token " + std::to_string(i));
    }
    for (std::size_t p = 0; p < m.num_pages(); ++p) FUZZ_CHECK(st.page_origins()[p] == r.origin(p), w + ": origin");
    const auto scores = seq.page_scores();
    const auto model_scores = m.page_scores();
    for (std::size_t p = 0; p < scores.size(); ++p)
      FUZZ_CHECK(!std::isnan(scores[p]) && scores_close(scores[p], model_scores[p]),
                 w + ": score of page " + std::to_string(p) + ": " + std::to_string(scores[p]) + " vs model " +
                     std::to_string(model_scores[p]));
    const auto prot = r.indices_of(r.protect);
    FUZZ_CHECK(mgr_.protected_pages(r.id) == prot, w + ": protected pages");
    FUZZ_CHECK(mgr_.shared_pages(r.id) == shared_indices(r), w + ": shared pages");
    const auto got = seq.page_statuses(prot);
    const auto want = m.statuses(prot);
    for (std::size_t p = 0; p < got.size(); ++p)
      FUZZ_CHECK(static_cast<int>(got[p]) == static_cast<int>(want[p]), w + ": status of page " + std::to_string(p));
    resident += m.device_pages();
    reclaimable += m.device_pages() - shared_indices(r).size();
    compare_residency(r, w);
  }
  /// Where every held page is: the tier's flags and recall steps, the sizes, the CSR row (exactly the device pages,
  /// each block holding its page's K/V) and the host store (exactly the host pages, each copy holding its page's
  /// K/V): no page is both on the device and on the host, and none is lost.
  void compare_residency(const request& r, const std::string& w) {
    const auto& seq = mgr_.at(r.id);
    const auto& m = r.m;
    FUZZ_CHECK(seq.has_host_tier() == m.tier.has_value(), w + ": has_host_tier");
    FUZZ_CHECK(seq.host_pages() == m.host_pages() && seq.device_pages() == m.device_pages() &&
                   seq.device_len() == m.device_len(),
               w + ": host pages " + std::to_string(seq.host_pages()) + " vs model " + std::to_string(m.host_pages()));
    if (m.tier) {
      const auto& t = seq.host_tier();
      FUZZ_CHECK(t.config().digest() == tier_to_library(m.tier->cfg).digest(), w + ": tier rules");
      FUZZ_CHECK(t.size() == m.num_pages(), w + ": tier columns");
      for (std::size_t p = 0; p < m.num_pages(); ++p) {
        FUZZ_CHECK(t.host_flags()[p] == m.tier->on_host[p], w + ": residency of page " + std::to_string(p));
        FUZZ_CHECK(t.recalled_at()[p] == m.tier->recalled_at[p], w + ": last recall of page " + std::to_string(p));
      }
      FUZZ_CHECK(m.host_pages() <= model_host_capacity(m.tier->cfg, m.P, m.logical_len),
                 w + ": the tier holds more than its host budget");
    }
    FUZZ_CHECK(r.kv.size() == m.num_pages() && r.pages.size() == m.device_pages(), w + ": device pages vs CSR row");
    std::size_t hosted = 0;
    for (std::size_t p = 0, d = 0; p < m.num_pages(); ++p) {
      if (m.on_host(p)) {
        const auto it = host_kv_.find({r.id, r.origin(p)});
        FUZZ_CHECK(it != host_kv_.end(), w + ": host page " + std::to_string(p) + " has no host copy");
        FUZZ_CHECK(it->second == r.kv[p], w + ": the host copy of page " + std::to_string(p) + " holds other K/V");
        ++hosted;
      } else {
        FUZZ_CHECK(block_kv_[static_cast<std::size_t>(r.pages[d])] == r.kv[p],
                   w + ": the block of device page " + std::to_string(p) + " holds other K/V");
        ++d;
      }
    }
    const auto first = host_kv_.lower_bound({r.id, 0});
    const auto last = host_kv_.lower_bound({r.id + 1, 0});
    FUZZ_CHECK(static_cast<std::size_t>(std::distance(first, last)) == hosted,
               w + ": the host store holds a copy of a page that is not on the host");
  }

  // --- value generators -------------------------------------------------------------------------------------------
  std::uint64_t pick_id(reader& in) {
    const std::uint8_t b = in.u8();
    if (reqs_.empty() || b % 8 == 7) return b % 32 == 31 ? 999 : 10 + (b >> 3) % 8;  // maybe not open
    return reqs_[b % reqs_.size()].id;
  }
  model_config pick_config(reader& in) {
    model_config c;
    c.page_size = P_;
    c.float_scores = true;
    static const double alphas[] = {0.0, 0.25, 1.0, 4.0};
    static const double betas[] = {0.0, 0.5, 0.9};
    static const double taus[] = {0.0, 0.01, 1.0};
    c.alpha = in.pick(alphas);
    c.beta = in.pick(betas);
    c.tau = in.pick(taus);
    c.normalization = in.u8() % 2;
    c.sink_pages = in.u8() % 4 == 0 ? 1 : 0;
    static const std::size_t recents[] = {0, 0, 1, 4, 16};
    c.recent_tokens = in.pick(recents);
    c.unit = static_cast<model_budget_unit>(in.u8() % 4);
    switch (c.unit) {
      case model_budget_unit::unlimited: break;
      case model_budget_unit::tokens: {
        static const double h[] = {0, 8, 32, 64, 200};
        c.high = in.pick(h);
        break;
      }
      case model_budget_unit::pages: {
        static const double h[] = {0, 1, 2, 4, 8};
        c.high = in.pick(h);
        break;
      }
      case model_budget_unit::ratio: {
        static const double h[] = {0.25, 0.5, 1.0};
        c.high = in.pick(h);
        break;
      }
    }
    if (c.unit != model_budget_unit::unlimited && in.flip(2))
      c.low = c.unit == model_budget_unit::ratio ? c.high / 2 : std::floor(c.high / 2);
    if (in.flip(2)) {
      const char* names[] = {"system", "plan", "user", "tool_in", "tool_out", "retrieval", "scratchpad"};
      const double bases[] = {1.00, 0.90, 0.80, 0.50, 0.40, 0.60, 0.30};
      const double half[] = {170.0, 120.0, 80.0, 30.0, 40.0, 100.0, 15.0};
      for (int i = 0; i < 7; ++i) c.regions.push_back({names[i], bases[i], 0.69314718055994530942 / half[i], i == 0});
    } else {
      static const double rates[] = {0.0, 0.05, 1.0};
      const std::size_t n = 1 + in.u8() % 3;
      for (std::size_t i = 0; i < n; ++i)
        c.regions.push_back(
            {"r" + std::to_string(i), 0.25 * static_cast<double>(1 + in.u8() % 4), in.pick(rates), in.u8() % 6 == 0});
    }
    if (in.u8() % 16 == 0) c.alpha = -1.0;        // invalid: the sequence's own validation
    if (in.u8() % 16 == 0) c.page_size = P_ * 2;  // not the manager's page size
    return c;
  }
  std::vector<std::pair<std::uint8_t, std::size_t>> spans(reader& in, const request& r, std::size_t at_least) {
    std::vector<std::pair<std::uint8_t, std::size_t>> out;
    const std::size_t n = 1 + in.u8() % 3;
    static const std::size_t lens[] = {1, 2, 3, 5, 8, 15, 16, 17, 31, 32, 64};
    std::size_t total = 0;
    for (std::size_t k = 0; k < n; ++k) {
      const std::uint8_t b = in.u8();
      const std::uint8_t region = b >= 0xF8 ? static_cast<std::uint8_t>(r.m.regions.size() + (b & 7))  // unknown
                                            : static_cast<std::uint8_t>(b % r.m.regions.size());
      out.emplace_back(region, in.pick(lens));
      total += out.back().second;
    }
    if (total < at_least) out.emplace_back(0, at_least - total);
    return out;
  }
  Float mass_value(reader& in, std::size_t n) {
    const std::uint8_t b = in.u8();
    switch (b % 24) {
      case 0: return Float{0};
      case 1: return std::numeric_limits<Float>::quiet_NaN();
      case 2: return std::numeric_limits<Float>::infinity();
      case 3: return Float{-1};
      case 4: return Float{1e30};
      case 5: return std::numeric_limits<Float>::max();
      case 6: return Float{1};
      default: return static_cast<Float>(b) / Float{64} / static_cast<Float>(n ? n : 1);
    }
  }
  std::vector<std::size_t> page_list(reader& in, std::size_t num_pages) {
    std::vector<std::size_t> out;
    const std::size_t n = in.u8() % 4;
    for (std::size_t k = 0; k < n; ++k) out.push_back(in.u8() % (num_pages + 1));
    if (!in.flip(4)) {  // usually a valid list
      std::sort(out.begin(), out.end());
      out.erase(std::unique(out.begin(), out.end()), out.end());
    }
    return out;
  }

  // --- operations -------------------------------------------------------------------------------------------------
  /// Opens a request with 1+ tokens (FlashInfer needs a page per request), maybe forking another's full pages.
  void op_open(reader& in) {
    const std::uint64_t id = pick_id(in);
    const model_config c = pick_config(in);
    request* source = reqs_.empty() || in.flip(2) ? nullptr : &reqs_[in.u8() % reqs_.size()];
    const std::size_t fork_pages = source ? in.u8() % (forkable_pages(*source) + 1) : 0;
    const auto before = snap();
    std::vector<model_region> effective;
    outcome want = outcome::ok;
    if (find(id))
      want = outcome::usage_error;
    else if (c.page_size != P_ || !model_config_valid(c, effective))
      want = outcome::config_error;
    if (want == outcome::ok && reqs_.size() >= k_max_requests) return;  // the engine's batch is full
    const outcome got = run_call([&] { (void)mgr_.open(id, to_library(c)); });
    expect(got, want, "open(" + std::to_string(id) + ")");
    unchanged_if_rejected(got, before, "open");
    if (got != outcome::ok) return;
    request r;
    r.id = id;
    r.m.init(c, effective);
    FUZZ_CHECK(r.m.advance_to(now_) == outcome::ok, "model: a request opens at the manager's clock");
    // The fork copies the source's labels for its shared pages (the same prefix) and shares their blocks.
    std::vector<std::pair<std::uint8_t, std::size_t>> labels;
    if (source) {
      for (std::size_t i = 0; i < fork_pages * P_; ++i)
        labels.emplace_back(static_cast<std::uint8_t>(source->m.tokens[i].region % effective.size()), 1);
      r.pages.assign(source->pages.begin(), source->pages.begin() + static_cast<std::ptrdiff_t>(fork_pages));
      for (std::int32_t p : r.pages) ++refs_[static_cast<std::size_t>(p)];
    }
    auto more = spans(in, r, fork_pages ? 0 : 1);
    for (auto& s : more) s.first = static_cast<std::uint8_t>(s.first % effective.size());
    std::size_t extra = 0;
    for (const auto& s : more) extra += s.second;
    if (r.m.kv_len() + fork_pages * P_ + extra > k_max_tokens || !allocate(r, fork_pages * P_ + extra)) {
      for (std::int32_t p : r.pages) release(p);  // the engine gives up: the request leaves again
      const outcome closed = run_call([&] { mgr_.close(id); });
      expect(closed, outcome::ok, "close(" + std::to_string(id) + ") (pool short)");
      return;
    }
    labels.insert(labels.end(), more.begin(), more.end());
    FUZZ_CHECK(r.m.append(labels) == outcome::ok, "model append");
    sync_kv(r);
    std::vector<memdecay::region_span> lib;
    for (const auto& s : labels) lib.push_back({s.first, s.second});
    const outcome appended = run_call([&] { mgr_.at(id).append(lib); });
    expect(appended, outcome::ok, "append at open");
    trace("  request " + std::to_string(id) + " forks " + std::to_string(fork_pages) + " pages, " +
          std::to_string(r.m.kv_len()) + " tokens");
    reqs_.push_back(std::move(r));
    rebuild();
  }
  /// manager::fork of a request: the child shares the parent's full blocks and gets its own block for the partial
  /// page (the engine copies it), and the model copies the parent's model.
  void op_fork(reader& in) {
    if (reqs_.empty()) return;
    const std::uint64_t parent = reqs_[in.u8() % reqs_.size()].id;
    const std::uint64_t child = pick_id(in);
    const auto before = snap();
    // A parent with pages on the host cannot fork (a host store keeps one copy per sequence and page).
    const outcome want = find(child) || find(parent)->m.hosting() ? outcome::usage_error : outcome::ok;
    const bool partial = find(parent)->m.kv_len() % P_ != 0;
    if (want == outcome::ok && (reqs_.size() >= k_max_requests || (partial && free_.empty()))) return;
    const outcome got = run_call([&] { (void)mgr_.fork(parent, child); });
    expect(got, want, "fork(" + std::to_string(parent) + ", " + std::to_string(child) + ")");
    unchanged_if_rejected(got, before, "fork");
    if (got != outcome::ok) return;
    request& p = *find(parent);
    request c = p;
    c.id = child;
    c.protect.clear();
    c.shared.clear();
    for (std::size_t k = 0; k < c.pages.size(); ++k) {
      const bool full = k + 1 < c.pages.size() || !partial;
      if (!full) {  // the child's own copy of the partial page (the same K/V)
        c.pages[k] = take_block(block_kv_[static_cast<std::size_t>(c.pages[k])]);
        continue;
      }
      ++refs_[static_cast<std::size_t>(c.pages[k])];
      const std::uint64_t o = p.origin(k);
      const std::uint64_t key = shared_key(p, o);
      c.shared.emplace(o, key);
      ++blocks_[key].holders;
    }
    reqs_.push_back(std::move(c));
    rebuild();
  }
  void op_close(reader& in) {
    const std::uint64_t id = pick_id(in);
    const auto before = snap();
    request* r = find(id);
    const outcome got = run_call([&] { mgr_.close(id); });
    expect(got, r ? outcome::ok : outcome::usage_error, "close(" + std::to_string(id) + ")");
    unchanged_if_rejected(got, before, "close");
    if (!r) return;
    for (const auto& [origin, key] : r->shared) release_key(key);
    for (auto it = r->pages.rbegin(); it != r->pages.rend(); ++it) release(*it);
    host_kv_.erase(host_kv_.lower_bound({id, 0}), host_kv_.lower_bound({id + 1, 0}));  // the engine frees its copies
    reqs_.erase(reqs_.begin() + (r - reqs_.data()));
    rebuild();
  }
  void op_append(reader& in) {
    const std::uint64_t id = pick_id(in);
    request* r = find(id);
    const auto before = snap();
    if (!r) {
      const outcome got = run_call([&] { (void)mgr_.at(id); });
      expect(got, outcome::usage_error, "at(" + std::to_string(id) + ")");
      unchanged_if_rejected(got, before, "at");
      return;
    }
    const auto s = spans(in, *r, 1);
    std::size_t total = 0;
    bool known = true;
    for (const auto& x : s) {
      total += x.second;
      known = known && x.first < r->m.regions.size();
    }
    if (known && (r->m.kv_len() + total > k_max_tokens || !allocate(*r, total))) return;  // the engine waits
    std::vector<memdecay::region_span> lib;
    for (const auto& x : s) lib.push_back({x.first, x.second});
    const outcome want = r->m.append(s);
    const outcome got = run_call([&] { mgr_.at(id).append(lib); });
    expect(got, want, "append(" + std::to_string(id) + ", " + std::to_string(total) + " tokens)");
    unchanged_if_rejected(got, before, "append");
    if (got == outcome::ok) {
      sync_kv(*r);
      rebuild();
    }
  }
  void op_advance(reader& in) {
    std::uint32_t latest = now_;  // the manager's clock, which outlives its requests
    for (const auto& r : reqs_) latest = std::max(latest, r.m.now);
    const std::uint8_t b = in.u8();
    const std::uint32_t step = b % 8 == 0 ? (latest ? latest - 1 : 0) : latest + b % 5;
    const auto before = snap();
    outcome want = step < now_ ? outcome::input_error : outcome::ok;
    for (const auto& r : reqs_)
      if (r.m.now > step) want = outcome::input_error;
    const outcome got = run_call([&] { mgr_.advance_to(step); });
    expect(got, want, "advance_to(" + std::to_string(step) + ")");
    unchanged_if_rejected(got, before, "advance_to");
    if (got != outcome::ok) return;
    now_ = step;
    for (auto& r : reqs_) {
      FUZZ_CHECK(r.m.advance_to(step) == outcome::ok, "model advance");
      r.protect.clear();
    }
  }
  void op_observe(reader& in) {
    request* r = find(pick_id(in));
    if (!r) return;
    const bool per_page = in.flip(3);
    const std::size_t expected = per_page ? r->m.device_pages() : r->m.device_len();  // observations: the device
    std::size_t len = expected;
    if (in.u8() % 16 == 0) len = expected + 1;
    std::vector<Float> mass(len, mass_value(in, expected));
    const std::size_t edits = in.u8() % 4;
    for (std::size_t e = 0; e < edits && len; ++e) mass[in.u16() % len] = mass_value(in, expected);
    const auto before = snap();
    const outcome want = per_page ? r->m.observe_pages(mass) : r->m.observe_tokens(mass);
    const outcome got = run_call([&] {
      auto& seq = mgr_.at(r->id);
      if (per_page)
        (void)seq.observe_pages(mass);
      else
        (void)seq.observe_tokens(mass);
    });
    expect(got, want, std::string(per_page ? "observe_pages(" : "observe_tokens(") + std::to_string(r->id) + ")");
    unchanged_if_rejected(got, before, "observe");
  }
  void op_protect(reader& in) {
    const std::uint64_t id = pick_id(in);
    request* r = find(id);
    const auto before = snap();
    const std::uint8_t what = in.u8() % 4;
    outcome want = r ? outcome::ok : outcome::usage_error, got;
    if (what == 3) {
      mgr_.clear_protections();
      for (auto& q : reqs_) q.protect.clear();
      trace("clear_protections()");
      return;
    }
    if (what == 2) {
      std::size_t tokens = in.u8() % 40;
      // The tail may reach pages on the host: the manager passes over them.
      got = run_call([&] { mgr_.protect_tail_tokens(id, tokens); });
      expect(got, want, "protect_tail_tokens(" + std::to_string(id) + ", " + std::to_string(tokens) + ")");
      if (got == outcome::ok && tokens > 0) {
        const std::size_t n = r->m.kv_len();
        const std::size_t first = tokens >= n ? 0 : (n - tokens) / P_;
        for (std::size_t p = first; p < r->m.num_pages(); ++p)
          if (!r->m.on_host(p)) r->protect.insert(r->origin(p));  // a host page is never protected (docs/tiers.md)
      }
    } else {
      auto pages = page_list(in, r ? r->m.num_pages() : 2);
      const bool names_host = name_host_pages(r, pages);
      if (r)
        for (std::size_t p : pages)
          if (p >= r->m.num_pages()) want = outcome::input_error;
      if (names_host) want = outcome::input_error;  // a host page holds no device block to protect
      got = run_call([&] { mgr_.protect_pages(id, pages); });
      expect(got, want, "protect_pages(" + std::to_string(id) + ", " + std::to_string(pages.size()) + " pages)");
      if (got == outcome::ok)
        for (std::size_t p : pages)
          if (!r->m.on_host(p)) r->protect.insert(r->origin(p));
    }
    unchanged_if_rejected(got, before, "protect");
  }
  /// Whether a page list names a page of `r` on the host (protect_pages and set_shared refuse it: found by this
  /// path, when the manager flagged such pages).
  bool name_host_pages(const request* r, const std::vector<std::size_t>& pages) const {
    if (!r || !r->m.hosting()) return false;
    const auto on_host = [&](std::size_t p) { return p < r->m.num_pages() && r->m.on_host(p); };
    return std::any_of(pages.begin(), pages.end(), on_host);
  }
  /// The full pages of `r` another request may fork (share), from the first: on the device.
  std::size_t forkable_pages(const request& r) const {
    std::size_t n = 0;
    while (n < r.m.kv_len() / P_ && !r.m.on_host(n)) ++n;
    return n;
  }
  void op_shared(reader& in) {
    const auto before = snap();
    if (in.flip(2)) {  // re-flag from the CSR's reference counts
      const outcome got = run_call([&] {
        const csr v = view();
        mgr_.mark_shared_from(v, row_map());
      });
      expect(got, outcome::ok, "mark_shared_from(csr)");
      blocks_.clear();
      for (auto& r : reqs_) {
        r.shared.clear();
        const auto device = r.device_list();  // the CSR row holds the device pages
        for (std::size_t d = 0; d < r.pages.size(); ++d) {
          const std::size_t refs = holders(r.pages[d]);
          if (refs <= 1) continue;
          const auto key = static_cast<std::uint64_t>(r.pages[d]);
          r.shared.emplace(r.origin(device[d]), key);
          ++blocks_[key].holders;
        }
      }
      for (auto& [key, b] : blocks_) b.external = holders(static_cast<std::int32_t>(key)) > b.holders;
      return;
    }
    const std::uint64_t id = pick_id(in);
    request* r = find(id);
    auto pages = page_list(in, r ? r->m.num_pages() : 2);
    const bool names_host = name_host_pages(r, pages);
    const bool flag = !in.flip(4);
    outcome want = r ? outcome::ok : outcome::usage_error;
    if (r)
      for (std::size_t p : pages)
        if (p >= r->m.num_pages()) want = outcome::input_error;
    if (names_host) want = outcome::input_error;  // a host page holds no device block to share
    const outcome got = run_call([&] { mgr_.set_shared(id, pages, flag); });
    expect(got, want,
           "set_shared(" + std::to_string(id) + ", " + std::to_string(pages.size()) + " pages, " +
               (flag ? "true" : "false") + ")");
    unchanged_if_rejected(got, before, "set_shared");
    if (got == outcome::ok)
      for (std::size_t p : pages) {
        if (r->m.on_host(p)) continue;  // a host page is never shared (docs/tiers.md)
        const std::uint64_t o = r->origin(p);
        if (flag) {
          blocks_[shared_key(*r, o)].external = true;
        } else {
          unshare(*r, o);
        }
      }
  }

  /// The model's plan for `pages` of request r (ascending), as the manager builds one.
  plan_type model_plan(const request& r, std::vector<std::size_t> pages, const std::vector<Float>& scores) const {
    plan_type plan;
    plan.page_size = P_;
    plan.generation = r.m.generation;
    plan.requested = pages.size();
    for (std::size_t p : pages) plan.scores.push_back(scores[p]);
    const std::uint64_t high = r.m.watermarks().first;
    const std::uint64_t after = r.m.device_len() - pages.size() * P_;  // the budget counts device tokens
    plan.pages_over_budget = after > high ? static_cast<std::size_t>((after - high + P_ - 1) / P_) : 0;
    plan.pages = std::move(pages);
    return plan;
  }
  static bool same_plan(const plan_type& a, const plan_type& b) {
    if (a.pages != b.pages || a.requested != b.requested || a.pages_over_budget != b.pages_over_budget ||
        a.page_size != b.page_size || a.generation != b.generation || a.demoted != b.demoted ||
        a.host_dropped != b.host_dropped)
      return false;
    return same_bits(a.scores, b.scores);
  }
  static bool same_bits(const std::vector<Float>& a, const std::vector<Float>& b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(),
                                              [](Float x, Float y) { return std::memcmp(&x, &y, sizeof(Float)) == 0; });
  }

  void op_select_one(reader& in) {
    const std::uint64_t id = pick_id(in);
    request* r = find(id);
    const bool budget = in.flip(2);
    static const std::size_t ks[] = {0, 1, 2, 3, 1000, std::numeric_limits<std::size_t>::max()};
    const std::size_t k = in.pick(ks);
    const auto before = snap();
    plan_type plan;
    const outcome got = run_call([&] { plan = budget ? mgr_.select(id) : mgr_.select(id, k); });
    expect(got, r ? outcome::ok : outcome::usage_error,
           budget ? "select(" + std::to_string(id) + ")" : "select(" + std::to_string(id) + ", k)");
    FUZZ_CHECK(snap() == before, "select changed something");
    if (!r) return;
    check_select_one(*r, plan, budget ? r->m.budget_request() : k, "select");
    last_one_ = {id, plan};
  }
  /// A plan of manager::select(id[, k]) against the model: the k lowest evictable device pages, split by the
  /// sequence's tier (select(0) splits nothing) and cut to the host pool from the sequence's own pages.
  void check_select_one(const request& r, const plan_type& plan, std::size_t k, const std::string& call) {
    const auto prot = r.indices_of(r.protect);
    const auto scores = mgr_.at(r.id).page_scores();
    const auto want = r.m.select_with(scores, k, prot);
    FUZZ_CHECK(plan.pages == want.pages && plan.requested == want.requested &&
                   plan.pages_over_budget == want.over_budget && plan.generation == r.m.generation,
               call + ": differs from the model");
    FUZZ_CHECK(same_bits(plan.scores, want.scores), call + ": victim scores");
    std::map<std::uint64_t, plan_type> plans;
    plan_type& p = plans[r.id] = model_plan(r, want.pages, scores);
    p.requested = want.requested;
    if (r.m.tier && k > 0) {
      const auto split = model_split(r.m, want.pages, scores);
      p.demoted = split.demoted;
      p.host_dropped = split.host_dropped;
    }
    std::map<std::uint64_t, std::vector<Float>> all_scores{{r.id, scores}};
    model_fit_host_pool(plans, all_scores, r.id);
    FUZZ_CHECK(plan.demoted == p.demoted, call + ": demoted pages differ from the model's");
    FUZZ_CHECK(plan.host_dropped == p.host_dropped, call + ": host-dropped pages differ from the model's");
  }
  /// The host pool's rule (docs/tiers.md): while the plans would leave more than host_pool pages on the host tiers,
  /// the lowest of the pool (host pages, unless `only` names another sequence, and would-be demotions) in the global
  /// order (score, tie hash, sequence, page) are dropped instead: a demotion becomes a drop, a host page joins its
  /// sequence's host_dropped (in a plan made for it when it had none).
  void model_fit_host_pool(std::map<std::uint64_t, plan_type>& plans,
                           const std::map<std::uint64_t, std::vector<Float>>& scores,
                           std::optional<std::uint64_t> only = std::nullopt) const {
    if (tiers_.host_pool == std::numeric_limits<std::size_t>::max()) return;
    std::size_t after = mgr_host_pages_model();
    for (const auto& [id, p] : plans) after += p.demoted.size() - p.host_dropped.size();
    if (after <= tiers_.host_pool) return;
    struct cand {
      Float score;
      std::uint64_t tie, seq;
      std::size_t page;
    };
    std::vector<cand> pool;
    for (const auto& r : reqs_) {
      if (!r.m.tier) continue;
      const auto found = plans.find(r.id);
      const plan_type* plan = found == plans.end() ? nullptr : &found->second;
      const bool droppable = (!only || *only == r.id) && r.m.hosting();
      if (!droppable && (!plan || plan->demoted.empty())) continue;
      const auto& s = scores.at(r.id);
      for (std::size_t p = 0; p < r.m.num_pages() && droppable; ++p)
        if (r.m.on_host(p) && !(plan && std::binary_search(plan->host_dropped.begin(), plan->host_dropped.end(), p)))
          pool.push_back({s[p], tie_of(r.id, p), r.id, p});
      if (plan)
        for (std::size_t p : plan->demoted) pool.push_back({s[p], tie_of(r.id, p), r.id, p});
    }
    std::sort(pool.begin(), pool.end(), [](const cand& a, const cand& b) {
      if (a.score != b.score) return a.score < b.score;
      if (a.tie != b.tie) return a.tie < b.tie;
      if (a.seq != b.seq) return a.seq < b.seq;
      return a.page < b.page;
    });
    const std::size_t cut = std::min(after - tiers_.host_pool, pool.size());
    for (std::size_t k = 0; k < cut; ++k) {
      const cand& c = pool[k];
      auto it = plans.find(c.seq);
      if (it == plans.end()) it = plans.emplace(c.seq, model_plan(*find_const(c.seq), {}, scores.at(c.seq))).first;
      auto& demoted = it->second.demoted;
      auto& dropped = it->second.host_dropped;
      if (const auto d = std::lower_bound(demoted.begin(), demoted.end(), c.page); d != demoted.end() && *d == c.page)
        demoted.erase(d);
      else
        dropped.insert(std::lower_bound(dropped.begin(), dropped.end(), c.page), c.page);
    }
  }
  std::size_t mgr_host_pages_model() const {
    std::size_t n = 0;
    for (const auto& r : reqs_) n += r.m.host_pages();
    return n;
  }
  std::uint64_t tie_of(std::uint64_t id, std::size_t page) const {
    using memdecay::policy_support::splitmix64;
    return splitmix64(splitmix64(id) ^ find_const(id)->origin(page));
  }

  /// The model's global selection: every request's own budget, then the global budget and the caller's request
  /// over all of them in the order (score, tie hash, sequence id, page), on the library's page scores, the global
  /// budget counting physical blocks (each shared block once).
  global_plan_type model_select_global(std::size_t pages_to_free) const {
    global_plan_type out;
    struct cand {
      Float score;
      std::uint64_t tie;
      std::uint64_t seq;
      std::size_t page;
    };
    const auto before = [](const cand& a, const cand& b) {
      if (a.score != b.score) return a.score < b.score;
      if (a.tie != b.tie) return a.tie < b.tie;
      if (a.seq != b.seq) return a.seq < b.seq;
      return a.page < b.page;
    };
    std::vector<cand> pool;
    std::map<std::uint64_t, std::vector<std::size_t>> chosen;
    std::size_t reclaimable = 0;
    std::vector<const request*> by_id;
    for (const auto& r : reqs_) by_id.push_back(&r);
    std::sort(by_id.begin(), by_id.end(), [](auto* a, auto* b) { return a->id < b->id; });
    std::map<std::uint64_t, std::vector<Float>> scores;
    for (const request* r : by_id) {
      const auto prot = r->indices_of(r->protect);
      const auto& s = scores[r->id] = mgr_.at(r->id).page_scores();
      const auto own = r->m.select_with(s, r->m.budget_request(), prot);
      const auto status = r->m.statuses(prot);
      chosen[r->id] = own.pages;
      for (std::size_t p : own.pages) {
        const bool shared = shares(*r, r->origin(p));
        out.victims.push_back({r->id, p, s[p], shared, memdecay::eviction_reason::sequence_budget});
        if (!shared) ++out.pages_freed;
      }
      for (std::size_t p = 0; p < s.size(); ++p) {
        const bool shared = shares(*r, r->origin(p));
        if (!shared && !r->m.on_host(p)) ++reclaimable;  // the budgets count device pages
        if (status[p] == model_status::evictable && !shared &&
            !std::binary_search(own.pages.begin(), own.pages.end(), p))
          pool.push_back({s[p], tie_of(r->id, p), r->id, p});
      }
    }
    const std::size_t after = reclaimable + shared_blocks() - out.pages_freed;
    const std::size_t budget_need = !global_.is_unlimited() && after > global_.high ? after - global_.low : 0;
    const std::size_t request_need = pages_to_free > out.pages_freed ? pages_to_free - out.pages_freed : 0;
    const std::size_t need = std::max(budget_need, request_need);
    const auto reason =
        budget_need >= request_need ? memdecay::eviction_reason::global_budget : memdecay::eviction_reason::requested;
    std::sort(pool.begin(), pool.end(), before);
    const std::size_t take = std::min(need, pool.size());
    for (std::size_t k = 0; k < take; ++k) {
      out.victims.push_back({pool[k].seq, pool[k].page, pool[k].score, false, reason});
      chosen[pool[k].seq].push_back(pool[k].page);
      ++out.pages_freed;
    }
    out.pages_short = need - take;
    std::sort(out.victims.begin(), out.victims.end(), [&](const auto& a, const auto& b) {
      return before({a.score, tie_of(a.sequence, a.page), a.sequence, a.page},
                    {b.score, tie_of(b.sequence, b.page), b.sequence, b.page});
    });
    for (auto& [id, pages] : chosen) {
      if (pages.empty()) continue;
      std::sort(pages.begin(), pages.end());
      const request* r = nullptr;
      for (const request* q : by_id)
        if (q->id == id) r = q;
      auto& plan = out.plans.emplace(id, model_plan(*r, pages, scores[id])).first->second;
      if (r->m.tier) {  // both passes' victims, split by the sequence's tier
        const auto split = model_split(r->m, plan.pages, scores[id]);
        plan.demoted = split.demoted;
        plan.host_dropped = split.host_dropped;
      }
    }
    model_fit_host_pool(out.plans, scores);
    return out;
  }
  void op_select_global(reader& in) {
    static const std::size_t requests[] = {0, 0, 0, 1, 2, 5, 1000};
    const std::size_t pages_to_free = in.pick(requests);
    const auto plan = select_global_checked(pages_to_free);
    older_ = last_;
    last_ = plan;
    if (in.u8() % 4 != 0) commit_global(plan, in.u8() % 4 == 0, "commit(select_global)");
  }
  /// select_global(pages_to_free), checked against the model and the invariants.
  global_plan_type select_global_checked(std::size_t pages_to_free) {
    const auto before = snap();
    global_plan_type plan;
    const outcome got = run_call([&] { plan = mgr_.select_global(pages_to_free); });
    expect(got, outcome::ok, "select_global(" + std::to_string(pages_to_free) + ")");
    FUZZ_CHECK(snap() == before, "select_global changed something");
    const auto want = model_select_global(pages_to_free);
    trace("  " + std::to_string(plan.victims.size()) + " victims, " + std::to_string(plan.pages_freed) + " freed, " +
          std::to_string(plan.pages_short) + " short");
    FUZZ_CHECK(plan.victims.size() == want.victims.size(), "select_global: victim count differs from the model's");
    for (std::size_t k = 0; k < want.victims.size(); ++k) {
      const auto& a = plan.victims[k];
      const auto& b = want.victims[k];
      FUZZ_CHECK(a.sequence == b.sequence && a.page == b.page && a.shared == b.shared && a.reason == b.reason &&
                     std::memcmp(&a.score, &b.score, sizeof(Float)) == 0,
                 "select_global: victim " + std::to_string(k) + " differs from the model's (" +
                     std::to_string(a.sequence) + ":" + std::to_string(a.page) + " vs " + std::to_string(b.sequence) +
                     ":" + std::to_string(b.page) + ")");
    }
    FUZZ_CHECK(plan.pages_freed == want.pages_freed && plan.pages_short == want.pages_short,
               "select_global: pages_freed / pages_short");
    FUZZ_CHECK(plan.plans.size() == want.plans.size(), "select_global: plan count");
    for (const auto& [id, p] : want.plans)
      FUZZ_CHECK(plan.plans.contains(id) && same_plan(plan.plans.at(id), p),
                 "select_global: plan of " + std::to_string(id));
    // Invariants, stated directly: no victim is pinned, sink, recent, partial or protected; a feasible global
    // budget reaches its low watermark.
    std::map<std::uint64_t, std::vector<model_status>> statuses;  // once per sequence: O(tokens) each
    for (const auto& v : plan.victims) {
      const request* r = find(v.sequence);
      FUZZ_CHECK(r != nullptr, "select_global: a victim of a sequence that is not open");
      auto it = statuses.find(v.sequence);
      if (it == statuses.end()) it = statuses.emplace(v.sequence, r->m.statuses(r->indices_of(r->protect))).first;
      FUZZ_CHECK(it->second[v.page] == model_status::evictable, "select_global: a victim that may not be evicted");
    }
    if (!global_.is_unlimited() && plan.pages_short == 0) {
      const std::size_t after = mgr_.physical_pages() - plan.pages_freed;
      std::size_t after_own = mgr_.physical_pages();
      for (const auto& v : plan.victims)
        if (v.reason == memdecay::eviction_reason::sequence_budget && !v.shared) --after_own;
      FUZZ_CHECK(after_own <= global_.high || after <= global_.low, "a feasible global budget left above low");
    }
    // The host pool, stated directly: a fresh plan leaves no more than host_pool pages on the host tiers, and
    // every tier within its own host budget.
    if (tiers_.on) {
      std::size_t hosted = mgr_.host_pages();
      for (const auto& [id, p] : plan.plans) {
        hosted += p.demoted.size() - p.host_dropped.size();
        const request* r = find(id);
        if (r->m.tier)
          FUZZ_CHECK(r->m.host_pages() - p.host_dropped.size() + p.demoted.size() <=
                         model_host_capacity(r->m.tier->cfg, P_, r->m.logical_len),
                     "select_global: a plan overfills its tier");
      }
      FUZZ_CHECK(hosted <= tiers_.host_pool, "select_global: the plans overfill the host pool");
    }
    return plan;
  }

  /// The documented outcome of manager::commit(global plan, table): every plan checked (its sequence open, not
  /// stale, same page size, strictly ascending resident full pages, evictable under the config, none protected
  /// for this step), the table agreeing and accepting the removal, before anything changes.
  outcome model_commit(const global_plan_type& plan, bool with_table) const {
    std::size_t after = mgr_host_pages_model();  // what the host pool holds after the plans (modulo 2^64)
    for (const auto& [id, p] : plan.plans) {
      const request* r = find_const(id);
      if (!r) return outcome::usage_error;
      if (r->m.check_plan(p.generation, p.page_size, p.pages, p.demoted, p.host_dropped) != outcome::ok)
        return outcome::usage_error;
      // The tier's own host budget holds at every commit.
      if (r->m.tier && r->m.host_pages() - p.host_dropped.size() + p.demoted.size() >
                           model_host_capacity(r->m.tier->cfg, P_, r->m.logical_len))
        return outcome::usage_error;
      for (std::size_t page : p.pages)
        if (r->protect.contains(r->origin(page))) return outcome::usage_error;
      if (with_table) {  // the CSR row loses every page leaving the device, at its device index
        std::vector<std::int32_t> pages = r->pages, removed;
        if (model_csr_remove(pages, r->last_len(), P_, r->device_indices(p.pages), removed) != outcome::ok)
          return outcome::usage_error;
      }
      after += p.demoted.size() - p.host_dropped.size();
    }
    // The host pool holds what the plans leave on the host tiers (two plans that each fit alone may not together).
    if (after > tiers_.host_pool) return outcome::usage_error;
    return outcome::ok;
  }
  /// Applies an accepted plan to the model; returns the ids each request's row gives back. The demoted pages stay
  /// held (on the host), the other victims and the host-dropped pages leave, with their K/V tags.
  std::map<std::uint64_t, std::vector<std::int32_t>> model_apply(const std::map<std::uint64_t, plan_type>& plans,
                                                                 bool to_rows) {
    std::map<std::uint64_t, std::vector<std::int32_t>> out;
    for (const auto& [id, p] : plans) {
      request* r = find(id);
      for (std::size_t page : p.pages) {
        r->protect.erase(r->origin(page));
        unshare(*r, r->origin(page));
      }
      if (to_rows) {
        auto& removed = out[id];
        FUZZ_CHECK(model_csr_remove(r->pages, r->last_len(), P_, r->device_indices(p.pages), removed) == outcome::ok,
                   "model csr remove");
      }
      std::vector<std::size_t> leaving;
      std::set_difference(p.pages.begin(), p.pages.end(), p.demoted.begin(), p.demoted.end(),
                          std::back_inserter(leaving));
      leaving.insert(leaving.end(), p.host_dropped.begin(), p.host_dropped.end());
      std::sort(leaving.begin(), leaving.end());
      erase_kv(*r, leaving);
      r->m.commit_plan(p.pages, p.demoted, p.host_dropped);
    }
    return out;
  }
  static void erase_kv(request& r, const std::vector<std::size_t>& leaving) {
    std::vector<std::uint64_t> kept;
    for (std::size_t p = 0; p < r.kv.size(); ++p)
      if (!std::binary_search(leaving.begin(), leaving.end(), p)) kept.push_back(r.kv[p]);
    r.kv = std::move(kept);
  }
  /// What the engine copies itself when it commits without a host store (it copies the demoted pages' K/V before
  /// committing, and frees the dropped host pages' copies after): each demoted page's block's K/V to the host, and
  /// the host-dropped pages' copies. Empty (the engine waits) when its store has no room. For checked plans.
  struct engine_copies {
    std::vector<std::pair<store_key, std::uint64_t>> to_host;
    std::vector<store_key> released;
  };
  std::optional<engine_copies> copies_for(const std::map<std::uint64_t, plan_type>& plans) const {
    engine_copies c;
    for (const auto& [id, p] : plans) {
      const request* r = find_const(id);
      for (std::size_t page : p.demoted)
        c.to_host.push_back({{id, r->origin(page)}, block_kv_[static_cast<std::size_t>(r->pages[r->m.device_index(page)])]});
      for (std::size_t page : p.host_dropped) c.released.push_back({id, r->origin(page)});
    }
    if (!c.to_host.empty() && host_kv_.size() + c.to_host.size() > tiers_.store_slots) return std::nullopt;
    return c;
  }
  void apply_copies(const engine_copies& c) {
    for (const auto& [key, tag] : c.to_host) FUZZ_CHECK(host_kv_.emplace(key, tag).second, "engine copy: twice");
    for (const auto& key : c.released) host_kv_.erase(key);
  }
  /// Checks the indices buffer past nnz: a removal from one row leaves every entry past the new nnz as it was; a
  /// batch of removals (one per row, each moving the later rows down) never writes at or past the old nnz.
  void check_tail(const csr_arrays& before, std::size_t rows_changed, const std::string& call) {
    const std::size_t from = static_cast<std::size_t>(rows_changed <= 1 ? arrays_.indptr.back() : before.indptr.back());
    FUZZ_CHECK(arrays_.indices.size() == before.indices.size(), call);
    for (std::size_t i = from; i < before.indices.size(); ++i)
      FUZZ_CHECK(arrays_.indices[i] == before.indices[i],
                 call + ": indices[" + std::to_string(i) + "] past nnz was written");
  }
  void commit_global(const global_plan_type& plan, bool state_only, const std::string& call) {
    const auto before = snap();
    outcome want = model_commit(plan, true);
    std::optional<engine_copies> copies;
    if (want == outcome::ok && !(copies = copies_for(plan.plans))) return;  // the engine waits for host room
    if (state_only) {
      // The engine updates its own table: it does so only for plans FlashInfer can represent.
      if (want != model_commit(plan, false)) return;
      std::map<std::uint64_t, std::vector<std::size_t>> device;  // each plan's pages in the CSR row
      if (want == outcome::ok)
        for (const auto& [id, p] : plan.plans) device[id] = find(id)->device_indices(p.pages);
      const outcome got = run_call([&] { mgr_.commit(plan); });
      expect(got, want, call + " (state only)");
      unchanged_if_rejected(got, before, call);
      if (got != outcome::ok) return;
      apply_copies(*copies);
      const auto expected = model_apply(plan.plans, true);
      csr v = view();
      for (const auto& entry : plan.plans) {
        const std::uint64_t id = entry.first;
        const std::size_t row = row_of(id);
        const auto& pages = device.at(id);
        std::vector<std::int32_t> removed;
        const outcome r = run_call([&] { removed = v.remove_pages(row, pages).removed; });
        expect(r, outcome::ok, "csr.remove_pages(row of " + std::to_string(id) + ")");
        FUZZ_CHECK(removed == expected.at(id), "csr.remove_pages returned other ids");
        for (std::int32_t x : removed) release(x);
      }
      check_tail(before.arrays, plan.plans.size(), call);
      return;
    }
    std::map<std::uint64_t, std::vector<std::int32_t>> released;
    const outcome got = run_call([&] {
      csr v = view();
      for (auto& [id, removal] : mgr_.commit(plan, v, row_map())) {
        FUZZ_CHECK(!removal.freed, call + ": a view reported freed pages");
        released.emplace(id, std::move(removal.removed));
      }
    });
    expect(got, want, call + " of " + std::to_string(plan.plans.size()) + " plans");
    unchanged_if_rejected(got, before, call);
    if (got != outcome::ok) return;
    apply_copies(*copies);
    const auto expected = model_apply(plan.plans, true);
    FUZZ_CHECK(released == expected, call + ": released ids differ from the model's");
    for (const auto& [id, ids] : released)
      for (std::int32_t x : ids) release(x);
    check_tail(before.arrays, plan.plans.size(), call);
  }
  void op_commit_global(reader& in) {
    if (!last_) return;
    global_plan_type plan = in.flip(4) && older_ ? *older_ : *last_;
    const std::uint8_t forge = in.u8() % 10;
    if (!plan.plans.empty() || forge >= 6) {
      const std::uint64_t id = plan.plans.empty() ? pick_id(in) : plan.plans.begin()->first;
      const request* r = find(id);
      auto& p = plan.plans[id];
      if (plan.plans.size() == 1 && p.pages.empty()) {
        p.page_size = P_;
        p.generation = r ? r->m.generation : 0;
      }
      switch (forge) {
        case 0:
        case 1:
        case 2: break;  // as selected (maybe stale)
        case 3: p.generation += 1; break;
        case 4:
          if (r) p.generation = r->m.generation;
          break;  // refreshed: the content decides
        case 5: p.page_size *= 2; break;
        case 6:
          if (r) {
            p.generation = r->m.generation;
            p.pages.push_back(in.u8() % (r->m.num_pages() + 1));
            std::sort(p.pages.begin(), p.pages.end());
          }
          break;
        case 7:  // a page protected for this step, at the current generation
          if (r && !r->protect.empty()) {
            p.generation = r->m.generation;
            const auto prot = r->indices_of(r->protect);
            if (!prot.empty()) p.pages = {prot[in.u8() % prot.size()]};
          }
          break;
        case 8:  // every page of the request (FlashInfer keeps one page per request)
          if (r) {
            p.generation = r->m.generation;
            p.pages.clear();
            for (std::size_t q = 0; q < r->m.num_pages(); ++q) p.pages.push_back(q);
          }
          break;
        default: plan.plans[999] = p; break;  // a sequence that is not open
      }
    }
    commit_global(plan, in.u8() % 4 == 0, "commit(forge " + std::to_string(forge) + ")");
  }
  void op_commit_one(reader& in) {
    if (!last_one_) return;
    const std::uint64_t id = last_one_->first;
    plan_type plan = last_one_->second;
    request* r = find(id);
    if (in.flip(3) && r) {  // every page of the request
      plan.generation = r->m.generation;
      plan.pages.clear();
      for (std::size_t q = 0; q < r->m.num_pages(); ++q) plan.pages.push_back(q);
    }
    const auto before = snap();
    global_plan_type as_global;
    as_global.plans[id] = plan;
    const outcome want = model_commit(as_global, true);
    std::optional<engine_copies> copies;
    if (want == outcome::ok && !(copies = copies_for(as_global.plans))) return;  // the engine waits for host room
    std::vector<std::int32_t> released;
    const outcome got = run_call([&] {
      csr v = view();
      released = mgr_.commit(id, plan, v, row_map()).removed;
    });
    expect(got, want, "commit(" + std::to_string(id) + ", plan of " + std::to_string(plan.pages.size()) + " pages)");
    unchanged_if_rejected(got, before, "commit(one)");
    if (got != outcome::ok) return;
    apply_copies(*copies);
    const auto expected = model_apply(as_global.plans, true);
    FUZZ_CHECK(released == expected.at(id), "commit(one): released ids");
    for (std::int32_t x : released) release(x);
    check_tail(before.arrays, 1, "commit(one)");
  }

  /// The engine writes something inconsistent into its arrays; the adapter must notice before any removal (and
  /// its readers must not read out of bounds), and nothing may change. The engine then repairs the arrays.
  void op_corrupt(reader& in) {
    if (reqs_.empty()) return;
    const csr_arrays saved = arrays_;
    csr stale_view = view();  // made before the corruption, as an engine keeps one across steps
    const std::size_t batch = reqs_.size();
    const std::size_t row = in.u8() % batch;
    const std::uint8_t kind = in.u8() % 8;
    auto& a = arrays_;
    switch (kind) {
      case 0: a.indptr[0] = in.flip(2) ? -1 : 1; break;
      case 1: a.indptr[row + 1] = a.indptr[row] - static_cast<std::int32_t>(in.u8() % 2); break;  // empty or decreasing
      case 2: a.indptr[row] = a.indptr[row + 1] + 1; break;
      case 3:
        a.indices[static_cast<std::size_t>(a.indptr[row])] = in.flip(2) ? -1 : static_cast<std::int32_t>(pool_pages_);
        break;
      case 4:
        if (a.indptr[row + 1] - a.indptr[row] >= 2)
          a.indices[static_cast<std::size_t>(a.indptr[row]) + 1] = a.indices[static_cast<std::size_t>(a.indptr[row])];
        break;
      case 5: a.last_page_len[row] = in.flip(2) ? 0 : static_cast<std::int32_t>(P_ + 1); break;
      case 6: a.indptr[batch] = static_cast<std::int32_t>(a.indices.size() + 1); break;
      default: a.last_page_len[row] = -static_cast<std::int32_t>(in.u8()); break;
    }
    const bool valid = model_csr_valid(a, P_, pool_pages_);
    const auto before = snap();
    const std::uint8_t call = in.u8() % 6;
    std::string what =
        "corrupt " + std::to_string(kind) + " row " + std::to_string(row) + (valid ? " (still valid)" : "");
    outcome got;
    switch (call) {
      case 0:
        got = run_call([&] { (void)view(); });
        expect(got, valid ? outcome::ok : outcome::input_error, what + ": construct a view");
        break;
      case 1: {
        const std::size_t q = in.u8() % batch;
        got = run_call([&] { stale_view.check_remove_pages(q, std::vector<std::size_t>{}); });
        expect(got, valid ? outcome::ok : outcome::input_error,
               what + ": check_remove_pages(" + std::to_string(q) + ", {})");
        break;
      }
      case 2: {
        const std::size_t q = in.u8() % batch;
        got = run_call([&] { (void)stale_view.remove_pages(q, std::vector<std::size_t>{0}); });
        if (!valid)
          expect(got, outcome::input_error, what + ": remove_pages(" + std::to_string(q) + ", {0})");
        else if (got == outcome::ok) {
          arrays_ = saved;
          return;
        }  // a valid edit: a legal removal, then repaired
        break;
      }
      case 3: {  // the readers check the one request they read
        const std::size_t q = in.u8() % batch;
        const std::int32_t b = a.indptr[q], e = a.indptr[q + 1];
        const bool row_ok = b >= 0 && e > b && static_cast<std::size_t>(e) <= a.indices.size() &&
                            a.last_page_len[q] > 0 && static_cast<std::size_t>(a.last_page_len[q]) <= P_;
        const outcome want = row_ok ? outcome::ok : outcome::input_error;
        std::size_t pages = 0, kv = 0;
        std::int32_t first = 0;
        got = run_call([&] {
          pages = stale_view.num_pages(q);
          kv = stale_view.kv_len(q);
          first = stale_view.page_at(q, 0);
        });
        expect(got, want, what + ": num_pages/kv_len/page_at of row " + std::to_string(q));
        if (got == outcome::ok) {
          FUZZ_CHECK(pages == static_cast<std::size_t>(e - b), "num_pages of a corrupted row");
          FUZZ_CHECK(kv == P_ * (pages - 1) + static_cast<std::size_t>(a.last_page_len[q]),
                     "kv_len of a corrupted row");
          FUZZ_CHECK(first == a.indices[static_cast<std::size_t>(b)], "page_at of a corrupted row");
        }
        break;
      }
      case 4: {  // a batch commit through arrays the engine broke: rejected before anything changes
        if (valid) {
          got = outcome::ok;
          break;
        }
        global_plan_type plan;
        (void)run_call([&] { plan = mgr_.select_global(in.u8() % 4); });
        got = run_call([&] { (void)mgr_.commit(plan, stale_view, row_map()); });
        trace(what + ": commit of " + std::to_string(plan.plans.size()) + " plans -> " + name(got));
        FUZZ_CHECK(plan.plans.empty() || got == outcome::input_error || got == outcome::usage_error,
                   what + ": a commit through broken arrays was accepted");
        break;
      }
      default: {
        const std::int32_t id = static_cast<std::int32_t>(in.u8() % (pool_pages_ + 1));
        std::size_t n = 0;
        got = run_call([&] { n = stale_view.ref_count(id); });
        const bool in_range = a.indptr[batch] >= 0 && static_cast<std::size_t>(a.indptr[batch]) <= a.indices.size();
        expect(got, in_range || valid ? outcome::ok : outcome::input_error, what + ": ref_count");
        if (got == outcome::ok)
          FUZZ_CHECK(
              n == static_cast<std::size_t>(std::count(a.indices.begin(), a.indices.begin() + a.indptr[batch], id)),
              "ref_count of corrupted arrays");
        break;
      }
    }
    if (got != outcome::ok)
      FUZZ_CHECK(snap() == before, what + ": a rejected call changed something");
    else
      FUZZ_CHECK(snap() == before, what + ": a reader changed something");
    arrays_ = saved;  // the engine repairs its arrays
  }

  /// flashinfer_csr::remove_pages on a copy of the arrays (the manager and sequences are not involved): any page
  /// list, against the list-of-pages model; a rejected removal leaves every entry of the copy alone.
  void op_scratch_remove(reader& in) {
    if (in.u8() % 16 == 0) {
      static const std::size_t sizes[] = {0, 3, 12, std::size_t{1} << 31};
      const std::size_t ps = in.pick(sizes);
      csr_arrays copy = arrays_;
      const outcome got = run_call([&] { csr v(copy.indptr, copy.indices, copy.last_page_len, ps, pool_pages_); });
      expect(got, outcome::config_error, "flashinfer_csr(page_size " + std::to_string(ps) + ")");
      FUZZ_CHECK(copy == arrays_, "a rejected construction wrote the arrays");
      return;
    }
    if (reqs_.empty()) return;
    csr_arrays copy = arrays_;
    const std::size_t row = in.u8() % (reqs_.size() + (in.flip(8) ? 1 : 0));
    std::vector<std::size_t> pages;
    switch (in.u8() % 4) {
      case 0: pages = page_list(in, row < reqs_.size() ? reqs_[row].pages.size() : 1); break;
      case 1:
        if (row < reqs_.size())
          for (std::size_t p = 0; p < reqs_[row].pages.size(); ++p) pages.push_back(p);
        break;
      case 2:
        if (row < reqs_.size()) pages = {reqs_[row].pages.size() - 1};
        break;
      default: {
        const std::size_t n = row < reqs_.size() ? reqs_[row].pages.size() : 1;
        for (std::size_t p = 0; p + 1 < n; p += 2) pages.push_back(p);
        break;
      }
    }
    std::vector<std::vector<std::int32_t>> rows;
    for (const auto& r : reqs_) rows.push_back(r.pages);
    std::vector<std::int32_t> removed_model;
    const outcome want = row >= reqs_.size()
                             ? outcome::usage_error
                             : model_csr_remove(rows[row], reqs_[row].last_len(), P_, pages, removed_model);
    std::vector<std::int32_t> removed;
    const outcome got = run_call([&] {
      csr v(copy.indptr, copy.indices, copy.last_page_len, P_, pool_pages_);
      removed = v.remove_pages(row, pages).removed;
    });
    expect(got, want,
           "scratch csr.remove_pages(row " + std::to_string(row) + ", " + std::to_string(pages.size()) + " pages)");
    if (got != outcome::ok) {
      FUZZ_CHECK(copy == arrays_, "a rejected remove_pages wrote the arrays");
      return;
    }
    FUZZ_CHECK(removed == removed_model, "scratch remove_pages: removed ids");
    std::vector<std::int32_t> indptr{0}, indices;
    for (const auto& r : rows) {
      indices.insert(indices.end(), r.begin(), r.end());
      indptr.push_back(static_cast<std::int32_t>(indices.size()));
    }
    FUZZ_CHECK(copy.indptr == indptr, "scratch remove_pages: indptr");
    FUZZ_CHECK(copy.last_page_len == arrays_.last_page_len, "scratch remove_pages: last_page_len changed");
    FUZZ_CHECK(std::equal(indices.begin(), indices.end(), copy.indices.begin()), "scratch remove_pages: indices");
    for (std::size_t i = indices.size(); i < copy.indices.size(); ++i)
      FUZZ_CHECK(copy.indices[i] == arrays_.indices[i], "scratch remove_pages: wrote past the new nnz");
  }

  /// Manager snapshots: an incremental save appended to the chain, the whole chain loaded into a new manager
  /// (the same digest; sometimes it then replaces the fuzzed manager, so every later call checks the load against
  /// the model), or a full snapshot with a flipped bit or truncated, loaded into the fuzzed manager itself (rejected
  /// with an input_error, nothing changed).
  void op_snapshot(reader& in) {
    const auto before = snap();
    const auto configure = [&](std::uint64_t id) { return mgr_.at(id).get_config(); };
    const std::uint8_t how = in.u8() % 4;
    if (how < 2) {
      std::vector<std::byte> bytes;
      FUZZ_CHECK(run_call([&] { memdecay::snapshot::save(mgr_, checkpoint_, bytes); }) == outcome::ok,
                 "manager save failed");
      chain_.push_back(std::move(bytes));
      std::optional<manager_type> loaded;
      std::string error;
      const outcome got = run_call([&] {
        loaded.emplace(mgr_.get_config());
        try {
          memdecay::snapshot::load(*loaded, chain_, configure);
        } catch (const std::exception& e) {
          error = e.what();
          throw;
        }
      });
      FUZZ_CHECK(got == outcome::ok,
                 "loading an intact chain of " + std::to_string(chain_.size()) + " failed: " + error);
      FUZZ_CHECK(loaded->digest() == mgr_.digest(), "a loaded chain has another digest");
      FUZZ_CHECK(memdecay::snapshot::save(*loaded) == memdecay::snapshot::save(mgr_),
                 "a loaded manager saves other bytes");
      if (how == 1) mgr_ = std::move(*loaded);  // its checkpoints are then another manager's
      if (how == 1 || chain_.size() >= 6) {
        checkpoint_.reset();
        chain_.clear();
      }
      FUZZ_CHECK(snap() == before, "a save or a replacing load changed something");
      return;
    }
    auto bytes = memdecay::snapshot::save(mgr_);
    if (how == 2) {
      const std::size_t bit = in.u32() % (8 * bytes.size());
      bytes[bit / 8] ^= static_cast<std::byte>(1u << (bit % 8));
    } else {
      bytes.resize(in.u32() % bytes.size());
    }
    const outcome got = run_call([&] { memdecay::snapshot::load(mgr_, bytes, configure); });
    expect(got, outcome::input_error, how == 2 ? "manager load(a flipped bit)" : "manager load(truncated)");
    FUZZ_CHECK(snap() == before, "a rejected manager snapshot changed something");
  }

  // --- the host-tier path (tier_options::on; tests/fuzz/README.md) ------------------------------------------------
  /// The engine's host store (tiers/host_store.hpp) over the batch's rows: a copy keyed by (request id, origin)
  /// holding the K/V tag of the block it was copied from, at most tiers_.store_slots copies (then a short count),
  /// and an armed fault: the copy that throws (storing nothing) or refuses (a short count). It checks the manager's
  /// side of the contract: a row of the batch, lists of one length, a block some request holds, never a second copy.
  struct store_ref {
    harness* h;
    std::size_t copy_to_host(const std::size_t& row, std::span<const std::uint64_t> origins,
                             std::span<const std::int32_t> blocks) {
      return h->store_to_host(row, origins, blocks);
    }
    std::size_t copy_to_device(const std::size_t&, std::span<const std::uint64_t>, std::span<const std::int32_t>) {
      fail("host store: copy_to_device in a commit of an eviction plan");
    }
    void release(const std::size_t& row, std::span<const std::uint64_t> origins) noexcept {
      h->store_release(row, origins);
    }
  };
  static_assert(memdecay::host_store<store_ref, csr::sequence_id, csr::page_id>);
  std::size_t store_to_host(std::size_t row, std::span<const std::uint64_t> origins,
                            std::span<const std::int32_t> blocks) {
    FUZZ_CHECK(row < reqs_.size() && origins.size() == blocks.size(), "host store: copy_to_host of a bad row or lists");
    const std::uint64_t id = reqs_[row].id;
    std::size_t done = 0;
    for (; done < origins.size(); ++done) {
      if (fault_countdown_ == 0) {
        fault_countdown_ = -1;
        if (!fault_throws_) return done;  // refuses the rest
        for (std::size_t k = 0; k < done; ++k) host_kv_.erase({id, origins[k]});  // a throwing copy stores nothing
        throw injected_fault{};
      }
      if (fault_countdown_ > 0) --fault_countdown_;
      if (host_kv_.size() >= tiers_.store_slots) return done;  // out of slots
      const auto b = static_cast<std::size_t>(blocks[done]);
      FUZZ_CHECK(b < pool_pages_ && refs_[b] > 0, "host store: copy_to_host of a block no request holds");
      FUZZ_CHECK(host_kv_.emplace(store_key{id, origins[done]}, block_kv_[b]).second,
                 "host store: copy_to_host of a page already on the host");
    }
    return done;
  }
  void store_release(std::size_t row, std::span<const std::uint64_t> origins) noexcept {
    FUZZ_CHECK(row < reqs_.size(), "host store: release of a row outside the batch");
    for (std::uint64_t o : origins) host_kv_.erase({reqs_[row].id, o});
  }
  /// The store's outcome for a commit that copies `n` pages (in order): the armed fault when no copy before it ran
  /// out of slots (a throw: `faulted`; a refusal: input_error), else input_error when they run out, else ok.
  outcome model_store(std::size_t n, int fault, bool throws, bool& faulted) const {
    const std::size_t room = tiers_.store_slots > host_kv_.size() ? tiers_.store_slots - host_kv_.size() : 0;
    if (fault >= 0 && static_cast<std::size_t>(fault) < n && static_cast<std::size_t>(fault) <= room) {
      faulted = throws;
      return throws ? outcome::ok : outcome::input_error;
    }
    return n > room ? outcome::input_error : outcome::ok;
  }

  /// enable_host_tier on a request (the rules drawn as tier_bridge.hpp's draw_tier draws them; sometimes invalid:
  /// config_error; enabling again changes the rules, and may not shrink the budget below the pages on the host),
  /// or disable_host_tier.
  void op_enable_tier(reader& in) {
    const std::uint64_t id = pick_id(in);
    request* r = find(id);
    const auto before = snap();
    if (in.u8() % 8 == 0) {
      const outcome want = !r || r->m.hosting() ? outcome::usage_error : outcome::ok;
      const outcome got = run_call([&] { mgr_.at(id).disable_host_tier(); });
      expect(got, want, "disable_host_tier(" + std::to_string(id) + ")");
      unchanged_if_rejected(got, before, "disable_host_tier");
      if (got == outcome::ok && r->m.tier) {
        r->m.tier.reset();
        ++r->m.generation;
      }
      return;
    }
    static const double token_highs[] = {0, 8, 16, 48, 64, 1e300};
    static const double priorities[] = {0.0, 0.25, 0.5, 0.75, 1.0, 2.0, -1.0, 0.0};
    const drawn_tier d = draw_tier(in, {.token_highs = token_highs, .priorities = priorities});
    const model_tier_config& c = d.model;
    const bool valid = d.valid();
    const bool shrinks_below = r && r->m.tier && valid && model_host_capacity(c, P_, r->m.logical_len) < r->m.host_pages();
    const outcome want = !r ? outcome::usage_error : valid && !shrinks_below ? outcome::ok : outcome::config_error;
    const outcome got = run_call([&] { mgr_.at(id).enable_host_tier(d.library); });
    expect(got, want, "enable_host_tier(" + std::to_string(id) + ": " + d.describe() + ")");
    unchanged_if_rejected(got, before, "enable_host_tier");
    if (got != outcome::ok) return;
    if (r->m.tier) {
      r->m.tier->cfg = c;  // new rules, every page where it is
    } else {
      model_tier t;
      t.cfg = c;
      t.on_host.assign(r->m.num_pages(), 0);
      t.recalled_at.assign(r->m.num_pages(), model_tier::never);
      r->m.tier = std::move(t);
    }
    ++r->m.generation;
  }

  /// Page digests for a request (enabled with a random f32/f16 layout when it has none), every full page without a
  /// digest digested (from keys, or a min/max digest given directly, sometimes with a channel whose minimum exceeds
  /// its maximum or a NaN: an input_error that changes nothing), then maybe observe_query.
  void op_digests(reader& in) {
    request* r = find(pick_id(in));
    if (!r) return;
    auto& seq = mgr_.at(r->id);
    if (!seq.has_digests() || in.flip(16)) {
      const std::size_t kv = 1 + in.u8() % 2, dim = 1 + in.u8() % 4, group = 1 + in.u8() % 2;
      const auto kind = in.flip(3) ? memdecay::digest_kind::mean_key : memdecay::digest_kind::min_max;
      const auto storage = in.flip(2) ? memdecay::digest_storage::f32 : memdecay::digest_storage::f16;
      const outcome got = run_call([&] {
        seq.enable_digests({.kv_heads = kv, .head_dim = dim, .query_heads = kv * group, .kind = kind, .storage = storage});
      });
      expect(got, outcome::ok,
             "enable_digests(" + std::to_string(r->id) + ": " + std::to_string(kv) + "x" + std::to_string(dim) +
                 ", group " + std::to_string(group) + ")");
      ++r->m.generation;
    }
    const auto& layout = seq.digests().layout();
    const std::size_t row = layout.kv_heads * layout.head_dim;
    const bool min_max = layout.kind == memdecay::digest_kind::min_max;
    auto value = [&] { return static_cast<float>(static_cast<std::int8_t>(in.u8())) / 8; };
    for (std::size_t p = 0; p < r->m.num_pages() && p < 64; ++p) {
      if (r->m.page_count(p) != P_ || seq.digests().has_digest(p)) continue;
      const auto before = snap();
      outcome want = outcome::ok, got;
      std::string call;
      if (min_max && in.flip(2)) {
        std::vector<float> lo(row), hi(row);
        for (std::size_t c = 0; c < row; ++c) {
          const float a = value(), b = value();
          lo[c] = std::min(a, b), hi[c] = std::max(a, b);
        }
        const std::uint8_t bad = in.u8() % 16;
        if (bad == 0 && lo[0] != hi[0]) std::swap(lo[0], hi[0]), want = outcome::input_error;
        if (bad == 1) hi[row - 1] = std::numeric_limits<float>::quiet_NaN(), want = outcome::input_error;
        got = run_call([&] { seq.set_page_digest(p, lo, hi); });
        call = "set_page_digest(" + std::to_string(p) + ")";
      } else {
        std::vector<float> keys(row * (1 + in.u8() % 4));
        for (auto& k : keys) k = value();
        got = run_call([&] { seq.set_page_keys(p, keys); });
        call = "set_page_keys(" + std::to_string(p) + ")";
      }
      expect(got, want, call);
      unchanged_if_rejected(got, before, call);
      if (got == outcome::ok) ++r->m.generation;
    }
    if (in.flip(2)) observe_query_checked(*r, make_query(in, r));
  }
  /// A query for the request's digest layout (query_heads x head_dim), sometimes one value too long or short, or
  /// with a NaN.
  std::vector<float> make_query(reader& in, const request* r) {
    std::size_t len = 4;
    if (r && mgr_.at(r->id).has_digests()) {
      const auto& l = mgr_.at(r->id).digests().layout();
      len = l.effective_query_heads() * l.head_dim;
    }
    const std::uint8_t shape = in.u8() % 16;
    if (shape == 0) len += 1;
    if (shape == 1 && len > 0) len -= 1;
    std::vector<float> q(len);
    for (auto& x : q) x = static_cast<float>(static_cast<std::int8_t>(in.u8())) / 16;
    if (!q.empty() && in.flip(16)) q[in.u8() % q.size()] = std::numeric_limits<float>::quiet_NaN();
    return q;
  }
  bool query_fits(const request& r, const std::vector<float>& q) const {
    const auto& seq = mgr_.at(r.id);
    if (!seq.has_digests()) return false;
    const auto& l = seq.digests().layout();
    if (q.size() != l.effective_query_heads() * l.head_dim) return false;
    return std::all_of(q.begin(), q.end(), [](float x) { return std::isfinite(x); });
  }
  /// observe_query on a managed sequence: exactly the model's observe_pages of estimate_query_attention (one entry
  /// per device page).
  void observe_query_checked(request& r, const std::vector<float>& query) {
    auto& seq = mgr_.at(r.id);
    const auto before = snap();
    std::vector<Float> estimate;
    const outcome estimated = run_call([&] { estimate = seq.estimate_query_attention(query); });
    const outcome fits = query_fits(r, query) ? outcome::ok
                         : seq.has_digests()  ? outcome::input_error
                                              : outcome::usage_error;
    expect(estimated, fits, "estimate_query_attention(" + std::to_string(r.id) + ")");
    FUZZ_CHECK(snap() == before, "estimate_query_attention changed something");
    if (estimated == outcome::ok)
      FUZZ_CHECK(estimate.size() == r.m.device_pages(), "the estimate does not cover the device pages");
    const outcome want = estimated == outcome::ok ? r.m.observe_pages(estimate) : estimated;
    const outcome got = run_call([&] { (void)seq.observe_query(query); });
    expect(got, want,
           "observe_query(" + std::to_string(r.id) + ", " + std::to_string(query.size()) + ") over " +
               std::to_string(r.m.device_pages()) + " device pages");
    unchanged_if_rejected(got, before, "observe_query");
  }

  /// What manager::select_recall passes as undisplaceable: this step's protected pages and the shared ones.
  std::vector<std::size_t> undisplaceable(const request& r) const {
    auto out = r.indices_of(r.protect);
    const auto shared = shared_indices(r);
    out.insert(out.end(), shared.begin(), shared.end());
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
  }
  /// manager::select_recall(id, query, head rule) or select_recall_for_bounds(id, bounds), checked against the
  /// model (tier_model.hpp's decision on the library's bounds, the protected and shared pages undisplaceable), then
  /// not committed, checked (check_recall) or committed (commit_recall, the engine moving the K/V itself).
  void op_recall(reader& in) {
    const std::uint64_t id = pick_id(in);
    request* r = find(id);
    const std::uint8_t how = in.u8();
    const memdecay::head_bounds rule = (how & 0x08) == 0   ? memdecay::head_bounds::max
                                       : (how & 0x10) != 0 ? memdecay::head_bounds::attention
                                                           : memdecay::head_bounds::mean;
    const bool by_bounds = (how & 0x20) != 0;
    std::vector<float> query, bounds;
    bool bounds_ok = false;
    if (by_bounds) {  // the engine's own bounds, one per held page (sometimes one too many, or a NaN)
      bounds.resize((r ? r->m.num_pages() : 2) + (in.flip(8) ? 1 : 0));
      for (auto& b : bounds) b = static_cast<float>(static_cast<std::int8_t>(in.u8())) / 8;
      if (!bounds.empty() && in.flip(8)) bounds[in.u8() % bounds.size()] = std::numeric_limits<float>::quiet_NaN();
      bounds_ok = r && bounds.size() == r->m.num_pages() &&
                  std::none_of(bounds.begin(), bounds.end(), [](float b) { return std::isnan(b); });
    } else {
      query = make_query(in, r);
    }
    const auto before = snap();
    const outcome want = !r || !r->m.tier                           ? outcome::usage_error
                         : by_bounds                                ? (bounds_ok ? outcome::ok : outcome::input_error)
                         : !mgr_.at(id).has_digests()               ? outcome::usage_error
                         : !query_fits(*r, query)                   ? outcome::input_error
                                                                    : outcome::ok;
    memdecay::recall_plan plan;
    const outcome got = run_call([&] {
      plan = by_bounds ? mgr_.select_recall_for_bounds(id, bounds) : mgr_.select_recall(id, query, rule);
    });
    expect(got, want,
           std::string(by_bounds ? "select_recall_for_bounds(" : "select_recall(") + std::to_string(id) + ", " +
               std::to_string(by_bounds ? bounds.size() : query.size()) + ")");
    FUZZ_CHECK(snap() == before, "select_recall changed something");
    if (got != outcome::ok) return;
    const auto& seq = mgr_.at(id);
    const std::size_t n = r->m.num_pages();
    std::vector<float> best = bounds;
    std::vector<bool> has_digest(n, true);
    if (seq.has_digests())
      for (std::size_t p = 0; p < n; ++p) has_digest[p] = seq.digests().has_digest(p);
    if (!by_bounds) {
      const std::size_t heads = seq.digests().layout().effective_query_heads();
      std::vector<float> per_head(heads * n);
      seq.query_page_bounds(query, per_head);
      best = combined_bounds(per_head, heads, n, rule);
    }
    compare_recall(*r, plan, best, has_digest, "select_recall");
    older_recall_ = last_recall_;
    last_recall_ = {id, plan};
    switch ((how >> 6) & 3) {
      case 0: break;
      case 1: commit_recall(id, plan, recall_path::check, "check_recall(fresh)"); break;
      default: commit_recall(id, plan, recall_path::engine, "commit_recall(fresh)"); break;
    }
  }
  /// A recall plan against the model's decision on the same bounds, and the properties that hold whatever the rule's
  /// details: never a protected or shared page displaced, a promotion beats every page it displaces by the
  /// hysteresis, within max_recall_pages and the device budget, a fresh plan the model accepts.
  void compare_recall(const request& r, const memdecay::recall_plan& plan, const std::vector<float>& best,
                      const std::vector<bool>& has_digest, const std::string& call) {
    const auto& m = r.m;
    trace("  -> promote " + std::to_string(plan.promote.size()) + ", demote " + std::to_string(plan.demote.size()) +
          ", drop " + std::to_string(plan.drop.size()));
    const auto prot = undisplaceable(r);
    const auto want = model_select_recall(m, best, has_digest, prot, mgr_.at(r.id).page_scores());
    FUZZ_CHECK(plan.promote == want.promote, call + ": promotions differ from the model's");
    FUZZ_CHECK(plan.demote == want.demote, call + ": demotions differ from the model's");
    FUZZ_CHECK(plan.drop == want.drop, call + ": drops differ from the model's");
    FUZZ_CHECK(plan.promote_bounds.size() == want.promote_bounds.size(), call + ": promote_bounds");
    for (std::size_t k = 0; k < want.promote_bounds.size(); ++k)
      FUZZ_CHECK(std::memcmp(&plan.promote_bounds[k], &want.promote_bounds[k], sizeof(float)) == 0,
                 call + ": promote_bounds");
    FUZZ_CHECK(plan.page_size == P_ && plan.generation == m.generation, call + ": page size or generation");
    const auto& rules = m.tier->cfg;
    const auto status = m.statuses(prot);
    FUZZ_CHECK(plan.promote.size() <= rules.max_recall_pages, call + ": more promotions than max_recall_pages");
    FUZZ_CHECK(plan.demote.size() + plan.drop.size() <= plan.promote.size(), call + ": displaces more than it promotes");
    for (std::size_t p : plan.promote) FUZZ_CHECK(m.on_host(p) && has_digest[p], call + ": promotes a device page");
    std::vector<std::size_t> displaced;
    std::merge(plan.demote.begin(), plan.demote.end(), plan.drop.begin(), plan.drop.end(),
               std::back_inserter(displaced));
    for (std::size_t p : displaced) {
      FUZZ_CHECK(!std::binary_search(prot.begin(), prot.end(), p),
                 call + ": displaces page " + std::to_string(p) + ", protected for this step or shared");
      FUZZ_CHECK(status[p] == model_status::evictable, call + ": displaces page " + std::to_string(p));
    }
    for (std::size_t p : plan.demote) FUZZ_CHECK(model_worthy(m, p), call + ": demotes page " + std::to_string(p));
    for (std::size_t p : plan.drop) FUZZ_CHECK(!model_worthy(m, p), call + ": drops page " + std::to_string(p));
    for (float b : plan.promote_bounds)
      for (std::size_t d : displaced)
        FUZZ_CHECK(static_cast<double>(b) > static_cast<double>(best[d]) + rules.hysteresis,
                   call + ": a promotion does not beat a page it displaces by the hysteresis");
    if (plan.promote.size() > displaced.size())
      FUZZ_CHECK(m.device_len() + (plan.promote.size() - displaced.size()) * P_ <= m.watermarks().first,
                 call + ": recall beyond the device budget");
    FUZZ_CHECK(model_check_recall(m, plan.generation, plan.page_size, want) == outcome::ok,
               call + ": the model rejects a fresh recall plan");
  }
  /// manager::check_recall / commit_recall's acceptance rule: the sequence's (tier_model.hpp), then no displaced
  /// page protected for this step, then the host pool holding what the plan leaves on the host.
  outcome model_manager_recall(const request* r, const memdecay::recall_plan& plan) const {
    if (!r) return outcome::usage_error;
    const model_recall mp{plan.promote, plan.demote, plan.drop, plan.promote_bounds};
    const outcome want = model_check_recall(r->m, plan.generation, plan.page_size, mp);
    if (want != outcome::ok) return want;
    for (const auto* list : {&plan.demote, &plan.drop})
      for (std::size_t p : *list)
        if (r->protect.contains(r->origin(p))) return outcome::usage_error;
    if (mgr_host_pages_model() - plan.promote.size() + plan.demote.size() > tiers_.host_pool)
      return outcome::usage_error;
    return outcome::ok;
  }
  /// Whether the engine can follow a recall plan: room in its host store for the demoted pages, blocks for the
  /// promoted ones once the displaced ones are freed, and a page left on the device (FlashInfer needs one).
  bool recall_fits(const request& r, const memdecay::recall_plan& plan) const {
    const auto device = r.device_list();
    std::size_t freed = 0, displaced = 0;
    for (std::size_t d = 0; d < device.size(); ++d)
      if (std::binary_search(plan.demote.begin(), plan.demote.end(), device[d]) ||
          std::binary_search(plan.drop.begin(), plan.drop.end(), device[d])) {
        ++displaced;
        freed += refs_[static_cast<std::size_t>(r.pages[d])] == 1 ? 1 : 0;
      }
    return host_kv_.size() + plan.demote.size() <= tiers_.store_slots && free_.size() + freed >= plan.promote.size() &&
           device.size() - displaced + plan.promote.size() >= 1;
  }
  enum class recall_path { check, engine, own };
  /// check_recall, commit_recall (state only: FlashInfer's CSR cannot insert pages, so the engine moves the K/V and
  /// rewrites the row itself, as it does when it can follow the plan), or the managed sequence's own commit_recall
  /// (always refused). A rejected call changes nothing.
  void commit_recall(std::uint64_t id, const memdecay::recall_plan& plan, recall_path path, const std::string& call) {
    request* r = find(id);
    const auto before = snap();
    outcome want = path == recall_path::own ? outcome::usage_error : model_manager_recall(r, plan);
    if (path == recall_path::engine && want == outcome::ok && !recall_fits(*r, plan)) path = recall_path::check;
    outcome got;
    switch (path) {
      case recall_path::check: got = run_call([&] { mgr_.check_recall(id, plan); }); break;
      case recall_path::engine: got = run_call([&] { mgr_.commit_recall(id, plan); }); break;
      default: got = run_call([&] { mgr_.at(id).commit_recall(plan); }); break;
    }
    expect(got, want,
           call + (path == recall_path::check ? " (check)" : path == recall_path::own ? " (own)" : "") + " of " +
               std::to_string(id) + ": promote " + std::to_string(plan.promote.size()) + ", demote " +
               std::to_string(plan.demote.size()) + ", drop " + std::to_string(plan.drop.size()) +
               " at generation " + std::to_string(plan.generation));
    if (got != outcome::ok || path == recall_path::check) {
      FUZZ_CHECK(snap() == before, call + " changed something");
      return;
    }
    engine_recall(*r, plan);
    const model_recall mp{plan.promote, plan.demote, plan.drop, plan.promote_bounds};
    model_apply_recall(r->m, mp);
    rebuild();
  }
  /// The engine's side of a committed recall, and the flags that end with the displaced pages: the demoted pages'
  /// K/V to the host store, the displaced blocks freed, a fresh block for each promoted page holding its host copy's
  /// K/V (the copy then freed), the row rewritten in page order, the dropped pages' tags gone.
  void engine_recall(request& r, const memdecay::recall_plan& plan) {
    const auto in = [](const std::vector<std::size_t>& v, std::size_t p) {
      return std::binary_search(v.begin(), v.end(), p);
    };
    const auto device = r.device_list();
    for (std::size_t d = 0; d < device.size(); ++d) {
      const std::size_t p = device[d];
      if (in(plan.demote, p))
        FUZZ_CHECK(host_kv_.emplace(store_key{r.id, r.origin(p)}, block_kv_[static_cast<std::size_t>(r.pages[d])]).second,
                   "engine recall: a second host copy");
      if (in(plan.demote, p) || in(plan.drop, p)) {
        release(r.pages[d]);
        r.protect.erase(r.origin(p));
        unshare(r, r.origin(p));
      }
    }
    std::vector<std::int32_t> row;
    for (std::size_t p = 0, d = 0; p < r.m.num_pages(); ++p) {
      if (in(plan.promote, p)) {
        const auto it = host_kv_.find({r.id, r.origin(p)});
        FUZZ_CHECK(it != host_kv_.end(), "engine recall: a promoted page without a host copy");
        row.push_back(take_block(it->second));
        host_kv_.erase(it);
        continue;
      }
      if (r.m.on_host(p)) continue;
      if (!in(plan.demote, p) && !in(plan.drop, p)) row.push_back(r.pages[d]);
      ++d;
    }
    r.pages = std::move(row);
    erase_kv(r, plan.drop);
  }

  /// A remembered recall plan (maybe stale, maybe another request's), or one forged at the current generation: a
  /// promotion of a device page or of a page that does not exist, a displaced page that may not leave (pinned,
  /// partial, host, recalled), one protected for this step (only the manager refuses it), a shared one (accepted:
  /// only the selection spares them), bounds not aligned, a page both demoted and dropped, every evictable page
  /// demoted (beyond the tier's budget or the host pool), lists out of order, another page size, or the managed
  /// sequence's own select_recall (which ignores the manager's protections). Checked, committed or committed
  /// through the sequence itself; the model says which are rejected.
  void op_recall_forged(reader& in) {
    std::uint64_t id;
    memdecay::recall_plan plan;
    if (last_recall_ && !in.flip(8)) {
      std::tie(id, plan) = in.flip(4) && older_recall_ ? *older_recall_ : *last_recall_;
    } else {
      id = pick_id(in);
      if (const request* r = find(id)) plan.page_size = P_, plan.generation = r->m.generation;
    }
    const request* r = find(id);
    const std::size_t n = r ? r->m.num_pages() : 0;
    auto add = [](std::vector<std::size_t>& v, std::size_t p) {
      v.push_back(p);
      std::sort(v.begin(), v.end());
    };
    const std::uint8_t forge = in.u8() % 14;
    switch (forge) {
      case 0: break;                                           // as selected (maybe stale)
      case 1: plan.generation = r ? r->m.generation : 0; break;  // refreshed: the content decides
      case 2:
        if (n) add(plan.promote, in.u8() % n), plan.promote_bounds.push_back(1.0f);
        break;
      case 3:
        if (n) add(in.flip(2) ? plan.demote : plan.drop, in.u8() % n);
        break;
      case 4: add(plan.promote, n + in.u8() % 3), plan.promote_bounds.push_back(1.0f); break;
      case 5:
        if (plan.promote_bounds.empty())
          plan.promote_bounds.push_back(0.0f);
        else
          plan.promote_bounds.pop_back();
        break;
      case 6:
        if (n) {
          const std::size_t p = in.u8() % n;
          add(plan.demote, p), add(plan.drop, p);
        }
        break;
      case 7:  // demote every evictable device page: beyond a bounded tier or the host pool
        if (r) {
          const auto status = r->m.statuses({});
          for (std::size_t p = 0; p < n; ++p)
            if (status[p] == model_status::evictable && !std::binary_search(plan.drop.begin(), plan.drop.end(), p) &&
                !std::binary_search(plan.demote.begin(), plan.demote.end(), p))
              add(plan.demote, p);
        }
        break;
      case 8:
        std::reverse(plan.promote.begin(), plan.promote.end());
        std::reverse(plan.drop.begin(), plan.drop.end());
        break;
      case 9: plan.page_size *= 2; break;
      case 10:  // displace a page protected for this step (protected now if need be), nothing else
      case 11:  // displace a shared page (flagged now if need be), nothing else
        if (r) {
          plan = {};
          plan.page_size = P_;
          plan.generation = r->m.generation;
          std::vector<std::size_t> evictable;
          const auto status = r->m.statuses({});
          for (std::size_t p = 0; p < n; ++p)
            if (status[p] == model_status::evictable) evictable.push_back(p);
          if (evictable.empty()) break;
          const std::size_t p = evictable[in.u8() % evictable.size()];
          flag_page(*find(id), p, forge == 10);
          (in.flip(2) ? plan.demote : plan.drop).push_back(p);
        }
        break;
      default:  // the sequence's own selection, blind to the manager's protections and shared pages
        if (r && r->m.tier && mgr_.at(id).has_digests()) {
          const auto query = make_query(in, r);
          const auto before = snap();
          (void)run_call([&] { plan = mgr_.at(id).select_recall(query); });
          FUZZ_CHECK(snap() == before, "the sequence's own select_recall changed something");
        }
        break;
    }
    if (forge >= 2 && !in.flip(4) && r) plan.generation = r->m.generation;
    static const recall_path paths[] = {recall_path::check, recall_path::engine, recall_path::engine, recall_path::own};
    commit_recall(id, plan, in.pick(paths), "commit_recall(forge " + std::to_string(forge) + ")");
  }

  /// protect_pages(id, {p}) (`protect`) or set_shared(id, {p}) of a device page, checked, as op_protect and
  /// op_shared do.
  void flag_page(request& r, std::size_t p, bool protect) {
    const std::size_t pages[] = {p};
    const auto before = snap();
    const outcome got = run_call([&] {
      if (protect)
        mgr_.protect_pages(r.id, pages);
      else
        mgr_.set_shared(r.id, pages, true);
    });
    expect(got, outcome::ok, std::string(protect ? "protect_pages(" : "set_shared(") + std::to_string(r.id) + ", {" +
                                 std::to_string(p) + "})");
    unchanged_if_rejected(got, before, "flag a page");
    if (protect)
      r.protect.insert(r.origin(p));
    else
      blocks_[shared_key(r, r.origin(p))].external = true;
  }

  /// select_global or select(id[, k]), checked, maybe forged (a demotion of a page the plan keeps on the device, a
  /// host drop of a device page, no host drops, every victim demoted, stale), then committed through the CSR and the
  /// engine's host store (manager::commit(plan, csr, rows, store) / commit(id, plan, csr, rows, store)), maybe with
  /// the store failing at a copy (a throw or a short count): a failure changes nothing, the store included.
  void op_store_commit(reader& in) {
    const std::uint8_t how = in.u8();
    const std::uint8_t f = in.u8();
    const int fault = f % 4 == 0 ? (f >> 2) % 4 : -1;
    fault_throws_ = (f & 0x40) != 0;
    const bool single = (how & 1) != 0;
    const std::uint8_t forge = (how >> 1) % 8;
    global_plan_type plan;
    std::uint64_t id = 0;
    if (single) {
      id = pick_id(in);
      request* r = find(id);
      const bool budget = in.flip(2);
      static const std::size_t ks[] = {1, 2, 3, 1000};
      const std::size_t k = in.pick(ks);
      const auto before = snap();
      plan_type one;
      const outcome got = run_call([&] { one = budget ? mgr_.select(id) : mgr_.select(id, k); });
      expect(got, r ? outcome::ok : outcome::usage_error, "select(" + std::to_string(id) + ") for the store");
      FUZZ_CHECK(snap() == before, "select changed something");
      if (!r) return;
      check_select_one(*r, one, budget ? r->m.budget_request() : k, "select(store)");
      last_one_ = {id, one};
      plan.plans[id] = one;
    } else {
      static const std::size_t requests[] = {0, 1, 2, 5, 1000};
      plan = select_global_checked(in.pick(requests));
      older_ = last_;
      last_ = plan;
      if (plan.plans.empty()) return;
      id = plan.plans.begin()->first;
      for (const auto& [q, p] : plan.plans)
        if (!p.demoted.empty()) id = q;  // forge a plan with demotions where there is one
    }
    plan_type& p = plan.plans.at(id);
    const request* r = find(id);
    const std::size_t n = r->m.num_pages();
    auto add = [](std::vector<std::size_t>& v, std::size_t x) {
      v.push_back(x);
      std::sort(v.begin(), v.end());
    };
    switch (forge) {
      case 3: add(p.demoted, in.u8() % (n + 1)); break;
      case 4: add(p.host_dropped, in.u8() % (n + 1)); break;
      case 5: p.host_dropped.clear(); break;
      case 6: p.demoted = r->m.tier ? p.pages : p.demoted; break;
      case 7: p.generation += 1; break;
      default: break;
    }
    const auto before = snap();
    outcome want = model_commit(plan, false);
    bool expect_fault = false;
    if (single) {
      // State, tier budget, protections and pool; then the table's check; then the copies; then the removal.
      if (want == outcome::ok) want = model_commit(plan, true);
      if (want == outcome::ok && r->m.tier) want = model_store(p.demoted.size(), fault, fault_throws_, expect_fault);
    } else {
      // State, tier budgets, protections and pool; then every sequence's copies; then the batch removal.
      std::size_t copies = 0;
      for (const auto& [q, x] : plan.plans) copies += x.demoted.size();
      if (want == outcome::ok) want = model_store(copies, fault, fault_throws_, expect_fault);
      if (want == outcome::ok && !expect_fault) want = model_commit(plan, true);
    }
    fault_countdown_ = fault;
    bool faulted = false;
    std::map<std::uint64_t, std::vector<std::int32_t>> released;
    store_ref store{this};
    const outcome got = run_call([&] {
      try {
        csr v = view();
        if (single) {
          auto removal = mgr_.commit(id, p, v, row_map(), store);
          FUZZ_CHECK(!removal.freed, "a view reported freed pages");
          released.emplace(id, std::move(removal.removed));
        } else {
          for (auto& [q, removal] : mgr_.commit(plan, v, row_map(), store)) {
            FUZZ_CHECK(!removal.freed, "a view reported freed pages");
            released.emplace(q, std::move(removal.removed));
          }
        }
      } catch (const injected_fault&) {
        faulted = true;
      }
    });
    fault_countdown_ = -1;
    const std::string call = std::string(single ? "commit(one" : "commit(global") + ", store, forge " +
                             std::to_string(forge) + ", fault " + std::to_string(fault) +
                             (fault_throws_ ? " throws" : " refuses") + ") of " + std::to_string(p.pages.size()) +
                             " pages (" + std::to_string(p.demoted.size()) + " demoted, " +
                             std::to_string(p.host_dropped.size()) + " host-dropped)";
    expect(got, want, call + (faulted ? ": the store threw" : ""));
    FUZZ_CHECK(faulted == expect_fault, call + (faulted ? ": the store threw, unexpectedly" : ": the store did not throw"));
    if (faulted || got != outcome::ok) {
      FUZZ_CHECK(snap() == before, call + ": a failed commit changed something");
      return;
    }
    const auto expected = model_apply(plan.plans, true);
    FUZZ_CHECK(released == expected, call + ": released ids differ from the model's");
    for (const auto& [q, ids] : released)
      for (std::int32_t x : ids) release(x);
    check_tail(before.arrays, plan.plans.size(), call);
  }

  /// Checks that need no model: determinism (a manager loaded from a snapshot of this one, and this one asked twice,
  /// select the same victims, demotions, host drops and recalls), and wrong calls (a held-length observation while
  /// pages are on the host, residency / device_index of a page that does not exist or is on the host, host_tier()
  /// without a tier).
  void op_tier_checks(reader& in) {
    const std::uint8_t what = in.u8() % 4;
    const auto before = snap();
    if (what == 0) {
      static const std::size_t requests[] = {0, 1, 3, 1000};
      const std::size_t k = in.pick(requests);
      manager_type twin(mgr_.get_config());
      const auto configure = [&](std::uint64_t q) { return mgr_.at(q).get_config(); };
      FUZZ_CHECK(run_call([&] { memdecay::snapshot::load(twin, memdecay::snapshot::save(mgr_), configure); }) ==
                     outcome::ok,
                 "loading a snapshot failed");
      FUZZ_CHECK(twin.digest() == mgr_.digest() && twin.host_pages() == mgr_.host_pages(), "a loaded manager differs");
      const auto a = mgr_.select_global(k), b = mgr_.select_global(k), c = twin.select_global(k);
      for (const auto* x : {&b, &c}) {
        FUZZ_CHECK(x->digest() == a.digest() && x->plans.size() == a.plans.size() && x->pages_freed == a.pages_freed &&
                       x->pages_short == a.pages_short,
                   "select_global is not deterministic");
        for (const auto& [q, p] : a.plans)
          FUZZ_CHECK(x->plans.contains(q) && same_plan(x->plans.at(q), p), "select_global is not deterministic");
      }
      const auto query = make_query(in, reqs_.empty() ? nullptr : &reqs_[0]);
      for (const auto& r : reqs_) {
        if (!r.m.tier || !mgr_.at(r.id).has_digests() || !query_fits(r, query)) continue;
        const auto x = mgr_.select_recall(r.id, query), y = twin.select_recall(r.id, query);
        FUZZ_CHECK(x.promote == y.promote && x.demote == y.demote && x.drop == y.drop && x.generation == y.generation,
                   "select_recall is not deterministic");
      }
      FUZZ_CHECK(snap() == before, "the determinism check changed something");
      return;
    }
    request* r = find(pick_id(in));
    if (!r) return;
    auto& seq = mgr_.at(r->id);
    if (what == 1) {  // held length: an input_error while pages are on the host
      std::vector<Float> mass(r->m.kv_len(), r->m.kv_len() ? Float{1} / static_cast<Float>(r->m.kv_len()) : Float{0});
      const outcome want = r->m.observe_tokens(mass);
      const outcome got = run_call([&] { (void)seq.observe_tokens(mass); });
      expect(got, want, "observe_tokens(held length " + std::to_string(mass.size()) + ", device " +
                            std::to_string(r->m.device_len()) + ")");
      unchanged_if_rejected(got, before, "observe_tokens(held length)");
      return;
    }
    if (what == 2) {
      std::vector<Float> mass(r->m.num_pages(), Float{0.125});
      const outcome want = r->m.observe_pages(mass);
      const outcome got = run_call([&] { (void)seq.observe_pages(mass); });
      expect(got, want, "observe_pages(held pages " + std::to_string(mass.size()) + ")");
      unchanged_if_rejected(got, before, "observe_pages(held pages)");
      return;
    }
    const std::size_t p = in.u8() % (r->m.num_pages() + 2);
    memdecay::page_residency where{};
    const outcome got = run_call([&] { where = seq.residency(p); });
    expect(got, p < r->m.num_pages() ? outcome::ok : outcome::input_error, "residency(" + std::to_string(p) + ")");
    if (got == outcome::ok) FUZZ_CHECK((where == memdecay::page_residency::host) == r->m.on_host(p), "residency");
    std::size_t d = 0;
    const outcome got2 = run_call([&] { d = seq.device_index(p); });
    expect(got2, p < r->m.num_pages() && !r->m.on_host(p) ? outcome::ok : outcome::input_error,
           "device_index(" + std::to_string(p) + ")");
    if (got2 == outcome::ok) FUZZ_CHECK(d == r->m.device_index(p), "device_index");
    const outcome got3 = run_call([&] { (void)seq.host_tier(); });
    expect(got3, r->m.tier ? outcome::ok : outcome::usage_error, "host_tier()");
    FUZZ_CHECK(snap() == before, "a const call changed something");
  }

  manager_type& mgr_;
  memdecay::snapshot::checkpoint checkpoint_;
  std::vector<std::vector<std::byte>> chain_;
  std::size_t P_, pool_pages_, slack_;
  memdecay::global_budget global_;
  tier_options tiers_;
  std::vector<std::size_t> refs_;
  static constexpr std::uint64_t k_no_kv = std::numeric_limits<std::uint64_t>::max();
  std::vector<std::uint64_t> block_kv_;     // per physical page: the K/V tag it holds
  std::uint64_t next_kv_ = 0;               // the tag of the next fresh page's K/V
  std::map<store_key, std::uint64_t> host_kv_;  // the engine's host store: (request, origin) -> K/V tag
  int fault_countdown_ = -1;                // the store's copy that fails (0: the next one), -1: none
  bool fault_throws_ = false;               // it throws (else it refuses: a short count)
  std::optional<std::pair<std::uint64_t, memdecay::recall_plan>> last_recall_, older_recall_;
  std::vector<std::int32_t> free_;
  std::vector<request> reqs_;
  std::map<std::uint64_t, model_block> blocks_;
  std::uint64_t next_key_ = std::uint64_t{1} << 63;
  std::uint32_t now_ = 0;
  csr_arrays arrays_;
  std::optional<global_plan_type> last_, older_;
  std::optional<std::pair<std::uint64_t, plan_type>> last_one_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  g_trace.clear();
  reader in(data, size);
  const std::uint8_t head = in.u8();
  static const std::size_t sizes[] = {1, 2, 4, 8, 16, 4, 8, 16};
  std::size_t page_size = sizes[head % 8];
  if (head == 0xFF) page_size = in.flip(2) ? 0 : 3;  // not a power of two: config_error
  memdecay::global_budget global = memdecay::global_budget::unlimited();
  const std::uint8_t g = in.u8();
  if (g % 4 != 0) {
    static const std::size_t highs[] = {0, 1, 2, 4, 8, 16, 32, 64};
    const std::size_t high = in.pick(highs);
    global = memdecay::global_budget::pages(high, g % 4 == 1   ? high
                                                  : g % 4 == 2 ? high / 2
                                                               : high + (g == 0xFF ? 1 : 0));
  }
  static const std::size_t pools[] = {16, 64, 256, 1024};
  const std::size_t pool_pages = in.pick(pools);
  const std::size_t slack = in.u8() % 4;
  trace("page_size " + std::to_string(page_size) + " global " + std::to_string(global.high) + "/" +
        std::to_string(global.low) + " pool " + std::to_string(pool_pages) + " slack " + std::to_string(slack));
  // The host-tier path: a first byte 0xF0..0xFE (no input written before the path has one; 0xFF is the bad page
  // size above), then the host pool (manager_config::host_pool, small so that it binds) and the engine's host store.
  tier_options tiers;
  if (head >= 0xF0 && head != 0xFF) {
    static const std::size_t host_pools[] = {1, 2, 3, 4, 6, 8, 0, std::numeric_limits<std::size_t>::max()};
    static const std::size_t store_slots[] = {1024, 1024, 2, 4};
    tiers.on = true;
    tiers.host_pool = in.pick(host_pools);
    tiers.store_slots = in.pick(store_slots);
    trace("host tiers: host_pool " + std::to_string(tiers.host_pool) + ", host store of " +
          std::to_string(tiers.store_slots) + " slots");
  }
  std::optional<manager_type> mgr;
  const bool valid = page_size != 0 && (page_size & (page_size - 1)) == 0 && global.low <= global.high;
  const outcome got = run_call([&] {
    mgr.emplace(memdecay::manager_config{.page_size = page_size, .global = global, .host_pool = tiers.host_pool});
  });
  expect(got, valid ? outcome::ok : outcome::config_error, "construct manager");
  if (mgr) {
    harness h(*mgr, page_size, pool_pages, slack, global, tiers);
    h.run(in);
  }
  static const bool print_trace = std::getenv("MEMDECAY_FUZZ_TRACE") != nullptr;
  if (print_trace) std::fprintf(stderr, "%s", g_trace.c_str());
  return 0;
}
