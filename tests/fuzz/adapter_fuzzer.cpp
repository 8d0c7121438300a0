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
//
// Input layout (reads past the end give zero bytes): a header (page size, global budget, pool pages, slack of the
// indices buffer), then operations, one opcode byte each followed by its arguments (see run).
// tests/fuzz/README.md has the details.
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
#include <vector>

#include "common.hpp"
#include "memdecay/core/manager.hpp"
#include "memdecay/io/manager_snapshot.hpp"
#include "memdecay/page_tables/flashinfer_csr.hpp"
#include "model.hpp"

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

/// One request of the batch: the model of its sequence, the physical pages of its CSR row, and the manager's
/// per-step protections and shared blocks as the model keeps them (by original page index; a shared page maps to
/// its block's key in the harness's model of the manager's blocks).
struct request {
  std::uint64_t id = 0;
  model_sequence<Float> m;
  std::vector<std::int32_t> pages;
  std::set<std::uint64_t> protect;
  std::map<std::uint64_t, std::uint64_t> shared;  // origin -> block key

  std::uint64_t origin(std::size_t p) const { return m.tokens[p * m.P].position / m.P; }
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
          memdecay::global_budget global)
      : mgr_(mgr), P_(page_size), pool_pages_(pool_pages), slack_(slack), global_(global), refs_(pool_pages, 0) {
    for (std::size_t i = pool_pages; i-- > 0;) free_.push_back(static_cast<std::int32_t>(i));
    rebuild();
  }

  void run(reader& in) {
    compare_all("start");
    for (std::size_t op = 0; op < k_max_ops && !in.done(); ++op) {
      const snapshot before = snap();
      const std::uint8_t code = in.u8();
      switch (code % 20) {
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
        default: op_commit_one(in); break;
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
  bool allocate(request& r, std::size_t tokens) {
    const std::size_t total = r.m.kv_len() + tokens;
    const std::size_t need = (total + P_ - 1) / P_ - r.pages.size();
    if (need > free_.size()) return false;
    for (std::size_t k = 0; k < need; ++k) {
      r.pages.push_back(free_.back());
      refs_[static_cast<std::size_t>(free_.back())] = 1;
      free_.pop_back();
    }
    return true;
  }

  // --- snapshots and comparisons ----------------------------------------------------------------------------------
  struct snapshot {
    std::uint64_t digest;
    std::vector<std::uint64_t> generations;
    csr_arrays arrays;
    std::size_t free;
    bool operator==(const snapshot&) const = default;
  };
  snapshot snap() const {
    snapshot s{mgr_.digest(), {}, arrays_, free_.size()};
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
      FUZZ_CHECK(v.num_pages(row) == r.pages.size() && v.kv_len(row) == r.m.kv_len(), where + ": csr row");
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
    resident += m.num_pages();
    reclaimable += m.num_pages() - shared_indices(r).size();
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
    const std::size_t fork_pages = source ? in.u8() % (source->m.kv_len() / P_ + 1) : 0;
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
    const outcome want = find(child) ? outcome::usage_error : outcome::ok;
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
      if (!full) {  // the child's own copy of the partial page
        c.pages[k] = free_.back();
        refs_[static_cast<std::size_t>(free_.back())] = 1;
        free_.pop_back();
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
    if (got == outcome::ok) rebuild();
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
    const std::size_t expected = per_page ? r->m.num_pages() : r->m.kv_len();
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
      const std::size_t tokens = in.u8() % 40;
      got = run_call([&] { mgr_.protect_tail_tokens(id, tokens); });
      expect(got, want, "protect_tail_tokens(" + std::to_string(id) + ", " + std::to_string(tokens) + ")");
      if (got == outcome::ok && tokens > 0) {
        const std::size_t n = r->m.kv_len();
        const std::size_t first = tokens >= n ? 0 : (n - tokens) / P_;
        for (std::size_t p = first; p < r->m.num_pages(); ++p) r->protect.insert(r->origin(p));
      }
    } else {
      const auto pages = page_list(in, r ? r->m.num_pages() : 2);
      if (r)
        for (std::size_t p : pages)
          if (p >= r->m.num_pages()) want = outcome::input_error;
      got = run_call([&] { mgr_.protect_pages(id, pages); });
      expect(got, want, "protect_pages(" + std::to_string(id) + ", " + std::to_string(pages.size()) + " pages)");
      if (got == outcome::ok)
        for (std::size_t p : pages) r->protect.insert(r->origin(p));
    }
    unchanged_if_rejected(got, before, "protect");
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
        for (std::size_t p = 0; p < r.pages.size(); ++p) {
          const std::size_t refs = holders(r.pages[p]);
          if (refs <= 1) continue;
          const auto key = static_cast<std::uint64_t>(r.pages[p]);
          r.shared.emplace(r.origin(p), key);
          ++blocks_[key].holders;
        }
      }
      for (auto& [key, b] : blocks_) b.external = holders(static_cast<std::int32_t>(key)) > b.holders;
      return;
    }
    const std::uint64_t id = pick_id(in);
    request* r = find(id);
    const auto pages = page_list(in, r ? r->m.num_pages() : 2);
    const bool flag = !in.flip(4);
    outcome want = r ? outcome::ok : outcome::usage_error;
    if (r)
      for (std::size_t p : pages)
        if (p >= r->m.num_pages()) want = outcome::input_error;
    const outcome got = run_call([&] { mgr_.set_shared(id, pages, flag); });
    expect(got, want,
           "set_shared(" + std::to_string(id) + ", " + std::to_string(pages.size()) + " pages, " +
               (flag ? "true" : "false") + ")");
    unchanged_if_rejected(got, before, "set_shared");
    if (got == outcome::ok)
      for (std::size_t p : pages) {
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
    const std::uint64_t after = r.m.kv_len() - pages.size() * P_;
    plan.pages_over_budget = after > high ? static_cast<std::size_t>((after - high + P_ - 1) / P_) : 0;
    plan.pages = std::move(pages);
    return plan;
  }
  static bool same_plan(const plan_type& a, const plan_type& b) {
    if (a.pages != b.pages || a.requested != b.requested || a.pages_over_budget != b.pages_over_budget ||
        a.page_size != b.page_size || a.generation != b.generation)
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
    const auto prot = r->indices_of(r->protect);
    const auto scores = mgr_.at(id).page_scores();
    const auto want = r->m.select_with(scores, budget ? r->m.budget_request() : k, prot);
    FUZZ_CHECK(plan.pages == want.pages && plan.requested == want.requested &&
                   plan.pages_over_budget == want.over_budget && plan.generation == r->m.generation,
               "select: differs from the model");
    FUZZ_CHECK(same_bits(plan.scores, want.scores), "select: victim scores");
    last_one_ = {id, plan};
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
    const auto tie_of = [this](std::uint64_t id, std::size_t page) {
      using memdecay::policy_support::splitmix64;
      return splitmix64(splitmix64(id) ^ find_const(id)->origin(page));
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
        if (!shared) ++reclaimable;
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
      out.plans.emplace(id, model_plan(*r, pages, scores[id]));
    }
    return out;
  }
  void op_select_global(reader& in) {
    static const std::size_t requests[] = {0, 0, 0, 1, 2, 5, 1000};
    const std::size_t pages_to_free = in.pick(requests);
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
    older_ = last_;
    last_ = plan;
    if (in.u8() % 4 != 0) commit_global(plan, in.u8() % 4 == 0, "commit(select_global)");
  }

  /// The documented outcome of manager::commit(global plan, table): every plan checked (its sequence open, not
  /// stale, same page size, strictly ascending resident full pages, evictable under the config, none protected
  /// for this step), the table agreeing and accepting the removal, before anything changes.
  outcome model_commit(const global_plan_type& plan, bool with_table) const {
    for (const auto& [id, p] : plan.plans) {
      const request* r = nullptr;
      for (const auto& q : reqs_)
        if (q.id == id) r = &q;
      if (!r) return outcome::usage_error;
      if (r->m.check_plan(p.generation, p.page_size, p.pages) != outcome::ok) return outcome::usage_error;
      for (std::size_t page : p.pages)
        if (r->protect.contains(r->origin(page))) return outcome::usage_error;
      if (with_table) {
        std::vector<std::int32_t> pages = r->pages, removed;
        if (model_csr_remove(pages, r->last_len(), P_, p.pages, removed) != outcome::ok) return outcome::usage_error;
      }
    }
    return outcome::ok;
  }
  /// Applies an accepted plan to the model; returns the ids each request's row gives back.
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
        FUZZ_CHECK(model_csr_remove(r->pages, r->last_len(), P_, p.pages, removed) == outcome::ok, "model csr remove");
      }
      r->m.remove(p.pages);
    }
    return out;
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
    if (state_only) {
      // The engine updates its own table: it does so only for plans FlashInfer can represent.
      if (want != model_commit(plan, false)) return;
      const outcome got = run_call([&] { mgr_.commit(plan); });
      expect(got, want, call + " (state only)");
      unchanged_if_rejected(got, before, call);
      if (got != outcome::ok) return;
      const auto expected = model_apply(plan.plans, true);
      csr v = view();
      for (const auto& entry : plan.plans) {
        const std::uint64_t id = entry.first;
        const std::size_t row = row_of(id);
        const auto& pages = entry.second.pages;
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
    std::vector<std::int32_t> released;
    const outcome got = run_call([&] {
      csr v = view();
      released = mgr_.commit(id, plan, v, row_map()).removed;
    });
    expect(got, want, "commit(" + std::to_string(id) + ", plan of " + std::to_string(plan.pages.size()) + " pages)");
    unchanged_if_rejected(got, before, "commit(one)");
    if (got != outcome::ok) return;
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

  manager_type& mgr_;
  memdecay::snapshot::checkpoint checkpoint_;
  std::vector<std::vector<std::byte>> chain_;
  std::size_t P_, pool_pages_, slack_;
  memdecay::global_budget global_;
  std::vector<std::size_t> refs_;
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
  std::optional<manager_type> mgr;
  const bool valid = page_size != 0 && (page_size & (page_size - 1)) == 0 && global.low <= global.high;
  const outcome got =
      run_call([&] { mgr.emplace(memdecay::manager_config{.page_size = page_size, .global = global}); });
  expect(got, valid ? outcome::ok : outcome::config_error, "construct manager");
  if (mgr) {
    harness h(*mgr, page_size, pool_pages, slack, global);
    h.run(in);
  }
  static const bool print_trace = std::getenv("MEMDECAY_FUZZ_TRACE") != nullptr;
  if (print_trace) std::fprintf(stderr, "%s", g_trace.c_str());
  return 0;
}
