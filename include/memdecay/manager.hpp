// SPDX-License-Identifier: Apache-2.0
// memdecay: many sequences under one memory pool: per-sequence and global budgets, deterministic global selection.
//
//   memdecay::manager mgr({.page_size = 16, .global = memdecay::global_budget::pages(4096, 3840)});
//   auto& seq = mgr.open(request_id, cfg);        // each sequence has its own config (and per-sequence budget)
//   seq.append(...); seq.observe_tokens(...);      // the sequence's own API, as for a single sequence
//   mgr.advance_to(step);                          // every clock, and the end of last step's protections
//   mgr.protect_tail_tokens(request_id, 4);        // speculative tokens still read these pages this step
//   auto plan = mgr.select_global();               // phase 1: pure
//   auto released = mgr.commit(plan, pool);        // phase 2: every table and state, all or nothing
//
// Selection works in two passes. First every sequence's own budget (config::budget) picks its victims with the
// sequence's own order (score, page). Then, while the pages the pool could reclaim exceed the global budget's
// high watermark, the lowest-scoring remaining evictable pages of all sequences go, until the low watermark is
// reached, in the total order (score, sequence id, logical page). Sequences live in an ordered map and every
// tie is broken by ids, so the victims are a pure function of the calls and do not depend on the order sequences
// were opened in, on hashing or on threads: every tensor-parallel rank that makes the same calls gets the same
// victims, and digest() lets the ranks check it with one all-gathered number.
//
// Shared pages. A page that other requests also hold (reference count > 1: a shared prefix, a beam fork) frees no
// memory when one holder evicts it. Flag such pages (set_shared, or mark_shared_from a table that counts
// references): they still count toward their sequence's own budget, which is about attention cost and is
// lowered by evicting them, but the global pass never picks them and they are not counted as reclaimable.
//
// Protection for a step. Pages that in-flight or speculative tokens still read (vLLM frees "on the
// processed-token basis" for this reason) can be protected until the next advance_to(): no pass selects them, and
// no commit removes them (a plan selected before the protection is rejected, like a stale one).
//
// Prefix cache. prefix_cache_boundary(id) is the sequence's first evicted original page: the engine must not hash
// or reuse blocks at or after it, because their K/V were computed with context that is gone.
#ifndef MEMDECAY_MANAGER_HPP
#define MEMDECAY_MANAGER_HPP

#include <algorithm>
#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "memdecay/config.hpp"
#include "memdecay/detail/digest.hpp"
#include "memdecay/detail/error.hpp"
#include "memdecay/eviction.hpp"
#include "memdecay/page_table.hpp"
#include "memdecay/sequence.hpp"

namespace memdecay {

/// The pool-wide budget, in pages the pool could reclaim (resident pages not flagged shared). When they exceed
/// `high`, the global pass evicts until they are at most `low`; the gap makes eviction run in batches.
struct global_budget {
  std::size_t high = std::numeric_limits<std::size_t>::max();
  std::size_t low = std::numeric_limits<std::size_t>::max();

  static global_budget unlimited() { return {}; }
  static global_budget pages(std::size_t high, std::optional<std::size_t> low = std::nullopt) {
    return {high, low.value_or(high)};
  }
  [[nodiscard]] bool is_unlimited() const noexcept { return high == std::numeric_limits<std::size_t>::max(); }
  void validate() const {
    if (low > high)
      detail::raise_config("global budget low = " + detail::to_text(low) + " is above high = " + detail::to_text(high));
  }
};

/// The configuration of a manager: the page size every sequence must use (the pool's block size) and the global
/// budget.
struct manager_config {
  std::size_t page_size = 16;
  global_budget global{};
};

/// Why a page was selected.
enum class eviction_reason : std::uint8_t {
  sequence_budget,  ///< its sequence exceeded its own budget
  global_budget,    ///< the pool exceeded the global budget
  requested,        ///< the caller asked for pages to be freed (select_global(pages_to_free))
};

[[nodiscard]] inline const char* to_string(eviction_reason r) noexcept {
  switch (r) {
    case eviction_reason::sequence_budget: return "sequence budget";
    case eviction_reason::global_budget: return "global budget";
    case eviction_reason::requested: return "requested";
  }
  return "?";
}

/// One victim of a global selection.
template <std::floating_point Float, std::integral SequenceId>
struct global_victim {
  SequenceId sequence;
  std::size_t page;  ///< logical index in the sequence's resident layout at selection time
  Float score;
  bool shared;       ///< flagged shared: evicting it frees no memory
  eviction_reason reason;
  friend bool operator==(const global_victim&, const global_victim&) = default;
};

/// The result of a global selection: the victims in the total order (score, sequence id, page), and one
/// eviction_plan per sequence that loses pages, ready to commit.
template <std::floating_point Float, std::integral SequenceId>
struct global_eviction_plan {
  std::vector<global_victim<Float, SequenceId>> victims;
  std::map<SequenceId, eviction_plan<Float>> plans;
  std::size_t pages_freed = 0;  ///< victims that are not shared: blocks the pool gets back
  std::size_t pages_short = 0;  ///< pages the global budget (or request) still wanted when nothing evictable was left

  [[nodiscard]] bool empty() const noexcept { return victims.empty(); }
  /// A digest of the decision (victims, scores' bits, and the generations the plans were made at): equal on every
  /// rank that must evict the same pages.
  [[nodiscard]] std::uint64_t digest() const noexcept {
    detail::fnv1a64 h;
    for (const auto& v : victims) {
      h.add(static_cast<std::uint64_t>(v.sequence)).add(static_cast<std::uint64_t>(v.page)).add(v.score);
      h.add(static_cast<std::uint8_t>(v.shared)).add(static_cast<std::uint8_t>(v.reason));
    }
    for (const auto& [id, plan] : plans) h.add(static_cast<std::uint64_t>(id)).add(plan.generation);
    return h.value();
  }
};

/// The default map from a manager's sequence id to a page table's: the same number. Engines whose table is
/// indexed by batch row pass their own (a lambda from request id to row).
struct identity_id {
  template <class Id>
  constexpr Id operator()(Id id) const noexcept {
    return id;
  }
};

template <std::floating_point Float = float, std::size_t PageSize = dynamic_page_size,
          std::integral SequenceId = std::uint64_t>
class basic_manager {
 public:
  using sequence_type = basic_sequence<Float, PageSize>;
  using sequence_id = SequenceId;
  using plan_type = eviction_plan<Float>;
  using global_plan_type = global_eviction_plan<Float, SequenceId>;

  /// config_error for an invalid page size or global budget.
  explicit basic_manager(manager_config cfg = {}) : config_(cfg) {
    if (cfg.page_size == 0 || !std::has_single_bit(cfg.page_size))
      detail::raise_config("manager page_size = " + detail::to_text(cfg.page_size) + " (must be a power of two)");
    if (PageSize != dynamic_page_size && cfg.page_size != PageSize)
      detail::raise_config("manager page_size = " + detail::to_text(cfg.page_size) + " but the sequences are compiled for " +
                           detail::to_text(PageSize));
    cfg.global.validate();
  }

  [[nodiscard]] const manager_config& get_config() const noexcept { return config_; }
  [[nodiscard]] std::size_t page_size() const noexcept { return config_.page_size; }

  // --- sequences ---------------------------------------------------------------------------------------------
  /// Opens a sequence with its own config (validated: config_error; its page size must be the manager's).
  /// usage_error if `id` is already open. Nothing changes on error.
  sequence_type& open(SequenceId id, config cfg) {
    if (entries_.contains(id)) detail::raise_usage("sequence " + detail::to_text(id) + " is already open");
    if (cfg.page_size != page_size())
      detail::raise_config("sequence " + detail::to_text(id) + " page_size = " + detail::to_text(cfg.page_size) +
                           ", the manager's is " + detail::to_text(page_size()));
    auto seq = std::make_unique<sequence_type>(std::move(cfg));
    return *entries_.emplace(id, entry{std::move(seq), {}, {}}).first->second.seq;
  }
  /// Forgets a sequence (the engine releases its blocks). usage_error if it is not open.
  void close(SequenceId id) { entries_.erase(find_entry(id)); }
  [[nodiscard]] bool contains(SequenceId id) const noexcept { return entries_.contains(id); }
  [[nodiscard]] std::size_t size() const noexcept { return entries_.size(); }
  /// The open sequences' ids, ascending.
  [[nodiscard]] std::vector<SequenceId> ids() const {
    std::vector<SequenceId> out;
    out.reserve(entries_.size());
    for (const auto& [id, e] : entries_) out.push_back(id);
    return out;
  }
  /// The sequence `id` (usage_error if it is not open). Its own API labels, observes and selects as usual.
  [[nodiscard]] sequence_type& at(SequenceId id) { return *find_entry(id)->second.seq; }
  [[nodiscard]] const sequence_type& at(SequenceId id) const { return *find_entry(id)->second.seq; }

  /// The first original page of `id` that was evicted: do not hash or reuse (prefix-cache) its blocks from there
  /// on. Empty while nothing was evicted.
  [[nodiscard]] std::optional<std::uint64_t> prefix_cache_boundary(SequenceId id) const {
    return at(id).prefix_cache_boundary();
  }
  /// Tokens of `id` that may be registered in a prefix cache: all of them until the first eviction, then the
  /// tokens before the boundary.
  [[nodiscard]] std::uint64_t prefix_cacheable_tokens(SequenceId id) const {
    const auto& seq = at(id);
    const auto boundary = seq.prefix_cache_boundary();
    return boundary ? *boundary * page_size() : seq.logical_len();
  }

  // --- sizes -------------------------------------------------------------------------------------------------
  /// Resident pages over all sequences (a shared page counts once per holder).
  [[nodiscard]] std::size_t resident_pages() const noexcept {
    std::size_t n = 0;
    for (const auto& [id, e] : entries_) n += e.seq->num_pages();
    return n;
  }
  /// Resident pages that are not flagged shared: what eviction could give back to the pool.
  [[nodiscard]] std::size_t reclaimable_pages() const {
    std::size_t n = 0;
    for (const auto& [id, e] : entries_) n += e.seq->num_pages() - count_resident(e, e.shared);
    return n;
  }

  // --- the clock and per-step protection ----------------------------------------------------------------------
  /// Moves every sequence's clock to `step` and ends the protections of the last step. input_error, changing
  /// nothing, if any sequence is already past `step`.
  void advance_to(step_t step) {
    for (const auto& [id, e] : entries_)
      if (e.seq->now() > step)
        detail::raise_input("clock goes backwards: advance_to(" + detail::to_text(step) + ") but sequence " +
                            detail::to_text(id) + " is at step " + detail::to_text(e.seq->now()));
    for (auto& [id, e] : entries_) {
      e.seq->advance_to(step);
      e.protected_origins.clear();
    }
  }
  /// Protects logical pages of `id` until the next advance_to() (or clear_protections()): pages that in-flight or
  /// speculative tokens still read. usage_error for an unknown sequence, input_error for a page that does not
  /// exist; nothing changes on error.
  void protect_pages(SequenceId id, std::span<const std::size_t> pages) {
    auto& e = find_entry(id)->second;
    const auto origins = origins_of(e, pages, "protect_pages");
    e.protected_origins.insert(origins.begin(), origins.end());
  }
  /// Protects every page holding one of the last `tokens` resident tokens of `id` (speculative drafts, tokens of
  /// an in-flight step) until the next advance_to().
  void protect_tail_tokens(SequenceId id, std::size_t tokens) {
    auto& e = find_entry(id)->second;
    const std::size_t n = e.seq->kv_len();
    if (tokens == 0 || n == 0) return;
    const std::size_t first = tokens >= n ? 0 : (n - tokens) / page_size();
    const auto origins = e.seq->state().page_origins();
    for (std::size_t p = first; p < e.seq->num_pages(); ++p) e.protected_origins.insert(origins[p]);
  }
  void clear_protections() noexcept {
    for (auto& [id, e] : entries_) e.protected_origins.clear();
  }
  /// The pages of `id` protected for this step, ascending logical indices.
  [[nodiscard]] std::vector<std::size_t> protected_pages(SequenceId id) const {
    const auto& e = find_entry(id)->second;
    return resident_indices(e, e.protected_origins);
  }

  // --- shared pages ------------------------------------------------------------------------------------------
  /// Flags (or unflags) logical pages of `id` as shared with other requests. The flag follows the page through
  /// compaction and ends with its eviction. usage_error for an unknown sequence, input_error for a page that
  /// does not exist; nothing changes on error.
  void set_shared(SequenceId id, std::span<const std::size_t> pages, bool shared = true) {
    auto& e = find_entry(id)->second;
    const auto origins = origins_of(e, pages, "set_shared");
    for (std::uint64_t o : origins) {
      if (shared) e.shared.insert(o);
      else e.shared.erase(o);
    }
  }
  /// Re-flags every page of every sequence from a table that counts references: shared exactly when its physical
  /// page has more than one holder. `table_id` maps a manager id to the table's (identity by default).
  /// usage_error, changing nothing, if the table does not hold a sequence or holds a different number of pages.
  template <shared_page_table Table, class IdMap = identity_id>
  void mark_shared_from(const Table& table, IdMap table_id = {}) {
    std::map<SequenceId, std::set<std::uint64_t>> flags;
    for (const auto& [id, e] : entries_) {
      const auto tid = table_id_of<Table>(table_id, id);
      check_table_agrees(table, tid, id, *e.seq);
      auto& f = flags[id];
      const auto origins = e.seq->state().page_origins();
      for (std::size_t p = 0; p < e.seq->num_pages(); ++p)
        if (static_cast<std::size_t>(table.ref_count(table.page_at(tid, p))) > 1) f.insert(origins[p]);
    }
    for (auto& [id, e] : entries_) e.shared = std::move(flags[id]);
  }
  /// The pages of `id` flagged shared, ascending logical indices.
  [[nodiscard]] std::vector<std::size_t> shared_pages(SequenceId id) const {
    const auto& e = find_entry(id)->second;
    return resident_indices(e, e.shared);
  }

  // --- selection (phase 1: changes nothing) --------------------------------------------------------------------
  /// What `id`'s own budget asks for, honouring this step's protections.
  [[nodiscard]] plan_type select(SequenceId id) const {
    const auto& e = find_entry(id)->second;
    return e.seq->select_for_budget(resident_indices(e, e.protected_origins));
  }
  /// The `k` lowest-scoring evictable pages of `id`, honouring this step's protections.
  [[nodiscard]] plan_type select(SequenceId id, std::size_t k) const {
    const auto& e = find_entry(id)->second;
    return e.seq->select(k, resident_indices(e, e.protected_origins));
  }
  /// Every sequence's own budget, then the global budget; see the top of this file. `pages_to_free`: the engine
  /// needs at least this many blocks back now (say, to admit a request); the plan frees at least that many in
  /// all (the budgets' victims count), or says in pages_short how many it could not find. When both the global
  /// budget and the request ask for more, the larger need wins and names the reason.
  [[nodiscard]] global_plan_type select_global(std::size_t pages_to_free = 0) const {
    global_plan_type out;
    struct candidate {
      Float score;
      SequenceId sequence;
      std::size_t page;
    };
    std::vector<candidate> pool;
    std::map<SequenceId, std::vector<std::size_t>> chosen;  // per sequence, pages the first pass took
    std::size_t reclaimable = 0;

    // Pass 1: each sequence's own budget. Also gathers the candidates of pass 2.
    for (const auto& [id, e] : entries_) {
      const auto protect = resident_indices(e, e.protected_origins);
      const auto shared = resident_flags(e, e.shared);
      const auto plan = e.seq->select_for_budget(protect);
      const auto scores = e.seq->page_scores();
      const auto status = e.seq->page_statuses(protect);
      auto& taken = chosen[id];
      taken = plan.pages;
      for (std::size_t k = 0; k < plan.pages.size(); ++k) {
        const std::size_t p = plan.pages[k];
        out.victims.push_back({id, p, plan.scores[k], shared[p], eviction_reason::sequence_budget});
        if (!shared[p]) ++out.pages_freed;
      }
      for (std::size_t p = 0; p < scores.size(); ++p) {
        if (!shared[p]) ++reclaimable;
        if (status[p] == page_status::evictable && !shared[p] &&
            !std::binary_search(plan.pages.begin(), plan.pages.end(), p))
          pool.push_back({scores[p], id, p});
      }
    }

    // Pass 2: the global budget (and the caller's request), over every sequence in one total order.
    const std::size_t after_pass_1 = reclaimable - out.pages_freed;
    std::size_t budget_need = 0;
    if (!config_.global.is_unlimited() && after_pass_1 > config_.global.high) budget_need = after_pass_1 - config_.global.low;
    const std::size_t request_need = pages_to_free > out.pages_freed ? pages_to_free - out.pages_freed : 0;
    const std::size_t need = std::max(budget_need, request_need);
    const eviction_reason reason = budget_need >= request_need ? eviction_reason::global_budget : eviction_reason::requested;
    const std::size_t take = std::min(need, pool.size());
    const auto before = [](const candidate& a, const candidate& b) {
      if (a.score < b.score) return true;
      if (b.score < a.score) return false;
      if (a.sequence != b.sequence) return a.sequence < b.sequence;
      return a.page < b.page;
    };
    std::partial_sort(pool.begin(), pool.begin() + static_cast<std::ptrdiff_t>(take), pool.end(), before);
    for (std::size_t k = 0; k < take; ++k) {
      out.victims.push_back({pool[k].sequence, pool[k].page, pool[k].score, false, reason});
      chosen[pool[k].sequence].push_back(pool[k].page);
      ++out.pages_freed;
    }
    out.pages_short = need - take;

    std::sort(out.victims.begin(), out.victims.end(), [&](const auto& a, const auto& b) {
      return before({a.score, a.sequence, a.page}, {b.score, b.sequence, b.page});
    });
    for (auto& [id, pages] : chosen) {
      if (pages.empty()) continue;
      std::sort(pages.begin(), pages.end());
      out.plans.emplace(id, make_plan(id, std::move(pages)));
    }
    return out;
  }

  // --- commit (phase 2) ----------------------------------------------------------------------------------------
  /// Applies a global plan to the engine's page table and every sequence's state. All plans are checked against
  /// their sequences and (for a checked_page_table) the table before anything changes, so a rejected commit
  /// changes nothing: usage_error for a stale plan, an unknown sequence, a page protected for this step or a
  /// table that disagrees. Returns, per sequence, what the table's remove_pages returned (freed ids or slot
  /// ranges) when it returns anything.
  template <page_table Table, class IdMap = identity_id>
  auto commit(const global_plan_type& plan, Table& table, IdMap table_id = {}) {
    for (const auto& [id, p] : plan.plans) {
      const auto& e = find_entry(id)->second;
      const auto tid = table_id_of<Table>(table_id, id);
      check_plan(*e.seq, p);
      check_unprotected(e, id, p);
      check_table_agrees(table, tid, id, *e.seq);
      if constexpr (checked_page_table<Table>) table.check_remove_pages(tid, p.pages);
    }
    using result = decltype(table.remove_pages(std::declval<const typename Table::sequence_id&>(), std::span<const std::size_t>{}));
    if constexpr (std::is_void_v<result>) {
      for (const auto& [id, p] : plan.plans) apply(id, p, table, table_id_of<Table>(table_id, id));
    } else {
      std::map<SequenceId, result> released;
      for (const auto& [id, p] : plan.plans) released.emplace(id, apply(id, p, table, table_id_of<Table>(table_id, id)));
      return released;
    }
  }
  /// Applies a global plan to the sequences' states only (the engine updated its table itself). usage_error,
  /// changing nothing, if any plan is stale or names a page protected for this step.
  void commit(const global_plan_type& plan) {
    for (const auto& [id, p] : plan.plans) {
      const auto& e = find_entry(id)->second;
      check_plan(*e.seq, p);
      check_unprotected(e, id, p);
    }
    for (const auto& [id, p] : plan.plans) {
      auto& e = find_entry(id)->second;
      forget_evicted(e, p.pages);
      e.seq->commit(p);
    }
  }
  /// Applies one sequence's plan to the table and the state (see basic_sequence::commit).
  template <page_table Table, class IdMap = identity_id>
  auto commit(SequenceId id, const plan_type& plan, Table& table, IdMap table_id = {}) {
    auto& e = find_entry(id)->second;
    const auto tid = table_id_of<Table>(table_id, id);
    check_plan(*e.seq, plan);
    check_unprotected(e, id, plan);
    check_table_agrees(table, tid, id, *e.seq);
    return apply(id, plan, table, tid);
  }

  // --- determinism -------------------------------------------------------------------------------------------
  /// A digest of everything selection depends on: each sequence's id, config and state digest, its protected and
  /// shared pages, and the manager's config. Ranks with equal digests select the same victims.
  [[nodiscard]] std::uint64_t digest() const noexcept {
    detail::fnv1a64 h;
    h.add(static_cast<std::uint64_t>(config_.page_size)).add(config_.global.high).add(config_.global.low);
    for (const auto& [id, e] : entries_) {
      h.add(static_cast<std::uint64_t>(id)).add(e.seq->digest());
      add_config(h, e.seq->get_config(), e.seq->regions());
      h.add(static_cast<std::uint64_t>(e.protected_origins.size()));
      for (std::uint64_t o : e.protected_origins) h.add(o);
      h.add(static_cast<std::uint64_t>(e.shared.size()));
      for (std::uint64_t o : e.shared) h.add(o);
    }
    return h.value();
  }


 private:
  struct entry {
    std::unique_ptr<sequence_type> seq;  // stable address: callers keep references across open()
    std::set<std::uint64_t> protected_origins;  // original page indices, which survive compaction
    std::set<std::uint64_t> shared;
  };
  using map_type = std::map<SequenceId, entry>;

  typename map_type::iterator find_entry(SequenceId id) {
    auto it = entries_.find(id);
    if (it == entries_.end()) detail::raise_usage("sequence " + detail::to_text(id) + " is not open in the manager");
    return it;
  }
  typename map_type::const_iterator find_entry(SequenceId id) const {
    auto it = entries_.find(id);
    if (it == entries_.end()) detail::raise_usage("sequence " + detail::to_text(id) + " is not open in the manager");
    return it;
  }

  template <class Table, class IdMap>
  static typename Table::sequence_id table_id_of(IdMap& map, SequenceId id) {
    return static_cast<typename Table::sequence_id>(map(id));
  }

  // The original indices of logical pages (input_error naming the first page that does not exist).
  static std::vector<std::uint64_t> origins_of(const entry& e, std::span<const std::size_t> pages, const char* what) {
    const auto origins = e.seq->state().page_origins();
    std::vector<std::uint64_t> out;
    out.reserve(pages.size());
    for (std::size_t p : pages) {
      if (p >= origins.size())
        detail::raise_input(std::string(what) + ": page " + detail::to_text(p) + " does not exist (sequence has " +
                            detail::to_text(origins.size()) + " pages)");
      out.push_back(origins[p]);
    }
    return out;
  }
  // The logical indices of the resident pages whose origins are in `set`, ascending.
  static std::vector<std::size_t> resident_indices(const entry& e, const std::set<std::uint64_t>& set) {
    std::vector<std::size_t> out;
    if (set.empty()) return out;
    const auto origins = e.seq->state().page_origins();
    for (std::size_t p = 0; p < origins.size(); ++p)
      if (set.contains(origins[p])) out.push_back(p);
    return out;
  }
  static std::vector<bool> resident_flags(const entry& e, const std::set<std::uint64_t>& set) {
    const auto origins = e.seq->state().page_origins();
    std::vector<bool> out(origins.size(), false);
    if (set.empty()) return out;
    for (std::size_t p = 0; p < origins.size(); ++p) out[p] = set.contains(origins[p]);
    return out;
  }
  static std::size_t count_resident(const entry& e, const std::set<std::uint64_t>& set) {
    return resident_indices(e, set).size();
  }

  // A plan for `pages` (ascending) of sequence `id`, in the form basic_sequence::commit expects.
  plan_type make_plan(SequenceId id, std::vector<std::size_t> pages) const {
    const auto& seq = at(id);
    const auto scores = seq.page_scores();
    plan_type plan;
    plan.page_size = seq.page_size();
    plan.generation = seq.state().generation();
    plan.requested = pages.size();
    for (std::size_t p : pages) plan.scores.push_back(scores[p]);
    plan.pages = std::move(pages);
    const auto marks = seq.get_config().budget.in_tokens(seq.page_size(), seq.logical_len());
    const std::uint64_t after = seq.kv_len() - plan.tokens();
    plan.pages_over_budget = after > marks.high ? static_cast<std::size_t>((after - marks.high + seq.page_size() - 1) / seq.page_size()) : 0;
    return plan;
  }

  // The checks basic_sequence::commit(plan) makes, so that a batch commit can make them all before changing
  // anything.
  static void check_plan(const sequence_type& seq, const plan_type& plan) {
    if (plan.generation != seq.state().generation())
      detail::raise_usage("stale plan: selected at generation " + detail::to_text(plan.generation) +
                          ", the sequence is at generation " + detail::to_text(seq.state().generation()));
    if (plan.page_size != seq.page_size()) detail::raise_usage("plan was made for page size " + detail::to_text(plan.page_size));
    seq.state().check_removable(plan.pages);
    const auto status = seq.page_statuses();
    for (std::size_t p : plan.pages)
      if (status[p] != page_status::evictable)
        detail::raise_usage("plan names page " + detail::to_text(p) + ", which is " + to_string(status[p]));
  }
  // A plan selected before protect_pages / protect_tail_tokens may name a page protected since: the generation
  // does not see the protection, so commit checks it (found by tests/fuzz/adapter_fuzzer.cpp). Call after
  // check_plan, which checked that the pages exist.
  static void check_unprotected(const entry& e, SequenceId id, const plan_type& plan) {
    if (e.protected_origins.empty()) return;
    const auto origins = e.seq->state().page_origins();
    for (std::size_t p : plan.pages)
      if (e.protected_origins.contains(origins[p]))
        detail::raise_usage("plan names page " + detail::to_text(p) + " of sequence " + detail::to_text(id) +
                            ", which is protected for this step");
  }
  template <class Table>
  static void check_table_agrees(const Table& table, const typename Table::sequence_id& tid, SequenceId id,
                                 const sequence_type& seq) {
    if (static_cast<std::size_t>(table.page_size()) != seq.page_size())
      detail::raise_usage("page table has page size " + detail::to_text(table.page_size()) + ", sequence " +
                          detail::to_text(id) + " has " + detail::to_text(seq.page_size()));
    if (static_cast<std::size_t>(table.num_pages(tid)) != seq.num_pages())
      detail::raise_usage("page table holds " + detail::to_text(table.num_pages(tid)) + " pages for sequence " +
                          detail::to_text(id) + ", which has " + detail::to_text(seq.num_pages()));
  }

  template <class Table>
  auto apply(SequenceId id, const plan_type& plan, Table& table, const typename Table::sequence_id& tid) {
    auto& e = find_entry(id)->second;
    auto evicted = evicted_origins(e, plan.pages);
    if constexpr (std::is_void_v<decltype(e.seq->commit(plan, table, tid))>) {
      e.seq->commit(plan, table, tid);
      forget(e, evicted);
    } else {
      auto released = e.seq->commit(plan, table, tid);
      forget(e, evicted);
      return released;
    }
  }
  static std::vector<std::uint64_t> evicted_origins(const entry& e, std::span<const std::size_t> pages) {
    const auto origins = e.seq->state().page_origins();
    std::vector<std::uint64_t> out;
    for (std::size_t p : pages) out.push_back(origins[p]);
    return out;
  }
  // Flags end with their page: a later page never inherits an evicted page's origin, but the sets stay small.
  static void forget(entry& e, std::span<const std::uint64_t> evicted) noexcept {
    for (std::uint64_t o : evicted) {
      e.shared.erase(o);
      e.protected_origins.erase(o);
    }
  }
  static void forget_evicted(entry& e, std::span<const std::size_t> pages) { forget(e, evicted_origins(e, pages)); }

  static void add_config(detail::fnv1a64& h, const config& c, const region_table& regions) noexcept {
    h.add(c.alpha).add(c.effective_beta()).add(c.tau).add(static_cast<std::uint64_t>(c.page_size));
    h.add(static_cast<std::uint8_t>(c.normalization));
    h.add(static_cast<std::uint64_t>(c.protection.sink_pages)).add(static_cast<std::uint64_t>(c.protection.recent_tokens));
    h.add(c.protection.recent_fraction);
    h.add(static_cast<std::uint8_t>(c.budget.unit)).add(c.budget.high).add(c.budget.low.value_or(c.budget.high));
    for (const auto& r : regions.params()) h.add(r.base_priority).add(r.decay_rate).add(static_cast<std::uint8_t>(r.pinned));
  }

  manager_config config_;
  map_type entries_;
};

/// The common case: float scores, page size chosen at run time, 64-bit request ids.
using manager = basic_manager<float, dynamic_page_size, std::uint64_t>;

}  // namespace memdecay

#endif  // MEMDECAY_MANAGER_HPP
