// SPDX-License-Identifier: Apache-2.0
// memdecay: many sequences under one memory pool: per-sequence and global budgets, deterministic global selection.
//
//   memdecay::manager mgr({.page_size = 16, .global = memdecay::global_budget::pages(4096, 3840)});
//   auto& seq = mgr.open(request_id, cfg);        // each sequence has its own config (and per-sequence budget)
//   seq.append(...); seq.observe_tokens(...);      // the sequence's own API, as for a single sequence
//   mgr.advance_to(step);                          // every clock, and the end of last step's protections
//   mgr.protect_tail_tokens(request_id, 4);        // speculative tokens still read these pages this step
//   auto plan = mgr.select_global();               // phase 1: pure
//   auto removals = mgr.commit(plan, pool, memdecay::identity_id{});  // phase 2: every table and state, all or
//                                                                    // nothing; the id map is always named
//
// One manager serves every policy: basic_manager<Sequence> manages any sequence_like type (sequence_like.hpp),
// so basic_manager<memdecay::policy_sequence<memdecay::policies::h2o>> runs H2O under the same budgets.
//
// Selection works in two passes. First every sequence's own budget (config::budget) picks its victims with the
// sequence's own order (score, page). Then, while the physical blocks the sequences hold exceed the global
// budget's high watermark, the lowest-scoring remaining evictable private pages of all sequences go, until the low
// watermark is reached, in the total order (score, tie hash, sequence id, logical page). The tie hash is a
// splitmix64 of (sequence id, original page): equal scores (a cold start, identical sequences) spread over the
// sequences instead of all going to the lowest id, and the order is still a pure function of the calls.
// Sequences live in an ordered map and every tie is broken by ids, so the victims do not depend on the order
// sequences were opened in, on hashing or on threads: every tensor-parallel rank that makes the same calls gets
// the same victims, and digest() lets the ranks check it with one all-gathered number.
//
// Shared pages. A page whose block other holders also hold (a shared prefix, a fork) frees no memory when one
// holder evicts it. The manager knows the sharing it makes (fork) and the sharing it is told (set_shared for
// holders outside the manager, mark_shared_from a table that counts references). Shared pages still count toward
// their sequence's own budget, which is about attention cost and is lowered by evicting them, but the global pass
// never picks them, and the global budget counts each shared block once (physical_pages()).
//
// Protection for a step. Pages that in-flight or speculative tokens still read (vLLM frees "on the
// processed-token basis" for this reason) can be protected until the next advance_to(): no pass selects them, and
// no commit removes them (a plan selected before the protection is rejected, like a stale one). A managed
// sequence's own commit() refuses, so no path removes a page around these protections.
//
// The clock. The manager has one (now()); open() starts a sequence at it, so a sequence opened mid-run does not
// look stale.
//
// Prefix cache. prefix_cache_boundary(id) is the sequence's first evicted original page: the engine must not hash
// or reuse blocks at or after it, because their K/V were computed with context that is gone.
//
// Host tiers (tiers/host_tier.hpp). A managed sequence may have one (seq.enable_host_tier): its victims, of its own
// budget or of the global pass, then split into demoted and dropped by its tier's rules, and the manager adds the
// host pool (manager_config::host_pool), shared by every tier: when the demotions would overfill it, the
// lowest-scoring pages of the pool (host pages and would-be demotions, in the global order) are dropped instead.
// The budgets count device pages; a host page holds no device block, so it is neither shared nor protected (its
// flags end when it leaves the device, as an evicted page's do; protect_pages and set_shared refuse one, and
// protect_tail_tokens passes over it). Recall goes through the manager too
// (select_recall, commit_recall): it never displaces a page protected for this step or shared, and every commit,
// eviction or recall, keeps the pool within its size. The commits that take a host store (tiers/host_store.hpp)
// order the copies with the table's changes, all or nothing, as a single sequence's do.
#ifndef MEMDECAY_CORE_MANAGER_HPP
#define MEMDECAY_CORE_MANAGER_HPP

#include <algorithm>
#include <atomic>
#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "memdecay/core/config.hpp"
#include "memdecay/detail/digest.hpp"
#include "memdecay/detail/error.hpp"
#include "memdecay/core/eviction.hpp"
#include "memdecay/core/attention_rows.hpp"
#include "memdecay/core/executor.hpp"
#include "memdecay/page_tables/page_table.hpp"
#include "memdecay/core/sequence_rules.hpp"
#include "memdecay/core/policy.hpp"
#include "memdecay/core/sequence.hpp"
#include "memdecay/core/sequence_like.hpp"
#include "memdecay/detail/undo.hpp"
#include "memdecay/tiers/host_store.hpp"
#include "memdecay/tiers/host_tier.hpp"

namespace memdecay {

namespace detail {
/// A number no other manager of this process has: what a snapshot checkpoint records as its owner (an address
/// would match a manager that another one was moved into).
inline std::uint64_t next_manager_instance() noexcept {
  static std::atomic<std::uint64_t> count{0};
  return count.fetch_add(1, std::memory_order_relaxed) + 1;
}
}  // namespace detail

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

/// Which scoring kernel the manager's MemDecay sequences run, chosen from the batch's resident tokens
/// (docs/performance.md, "The scorer by the batch's size"). The exp-free kernel moves 25 bytes a token and needs no
/// exponential; the polynomial one moves 21 and computes one. While the batch's state sits in the caches the
/// exp-free pass is the faster one; once it streams from memory, on CPUs whose vector units make the exponential
/// cheap (measured: AVX-512), the polynomial pass is. The rule reads only resident token counts, so every rank of a
/// tensor-parallel group makes the same choice at the same step; the two kernels agree to within the scorer's
/// tolerance (docs/simd.md), not bit for bit, so ranks must share the rule's settings.
struct scorer_rule {
  /// Switch every sequence to the polynomial kernel at an advance_to where the resident tokens of all sequences
  /// exceed this; 0: never (each sequence keeps the kernel its parameters and use_expfree_scores chose).
  std::uint64_t polynomial_above_tokens = 0;
  /// Switch back to the exp-free kernel once the resident tokens fall below this fraction of the threshold (a gap,
  /// so that a batch near the threshold does not switch back and forth: a switch to exp-free costs an exp per token).
  double back_below = 0.75;

  [[nodiscard]] bool active() const noexcept { return polynomial_above_tokens != 0; }
  /// config_error naming the field.
  void validate() const {
    if (!(back_below > 0.0 && back_below <= 1.0))
      detail::raise_config("scorer.back_below = " + detail::to_text(back_below) + " (must be in (0, 1])");
  }
};

/// The configuration of a manager: the page size every sequence must use (the pool's block size), the global
/// budget (device blocks), the host pool and the scorer rule.
struct manager_config {
  std::size_t page_size = 16;
  global_budget global{};
  /// Pages the host pool holds over every sequence's host tier (tiers/host_tier.hpp; each tier also keeps its own
  /// host_budget). A selection that would demote beyond it drops the lowest-scoring pages of the pool instead, in
  /// the global order; every commit keeps the pool within it.
  std::size_t host_pool = std::numeric_limits<std::size_t>::max();
  scorer_rule scorer{};
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
  bool shared;  ///< flagged shared: evicting it frees no memory
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

/// The map from a manager's sequence id to a page table's when they are the same number (block_pool keyed by
/// request id). Every commit names its map: a table indexed by batch row (vLLM, SGLang) takes a lambda from
/// request id to row, and a wrong map cannot pass silently as the default.
struct identity_id {
  template <class Id>
  constexpr Id operator()(Id id) const noexcept {
    return id;
  }
};

/// The basic_manager's policy-independent part: the sequence type decides the policy, the score type and the
/// page size (basic_manager<policy_sequence<policies::h2o>> manages H2O sequences).
template <class Sequence = sequence, std::integral SequenceId = std::uint64_t>
class basic_manager {
  static_assert(sequence_like<Sequence>, "basic_manager manages a sequence_like type (sequence_like.hpp)");

 public:
  using sequence_type = Sequence;
  using sequence_id = SequenceId;
  using float_type = typename Sequence::float_type;
  using params_type = typename Sequence::params_type;
  using plan_type = eviction_plan<float_type>;
  using global_plan_type = global_eviction_plan<float_type, SequenceId>;

  /// config_error for an invalid page size or global budget.
  explicit basic_manager(manager_config cfg = {}) : config_(cfg) {
    if (cfg.page_size == 0 || !std::has_single_bit(cfg.page_size))
      detail::raise_config("manager page_size = " + detail::to_text(cfg.page_size) + " (must be a power of two)");
    if (Sequence::static_page_size != dynamic_page_size && cfg.page_size != Sequence::static_page_size)
      detail::raise_config("manager page_size = " + detail::to_text(cfg.page_size) +
                           " but the sequences are compiled for " + detail::to_text(Sequence::static_page_size));
    cfg.global.validate();
    cfg.scorer.validate();
  }

  [[nodiscard]] const manager_config& get_config() const noexcept { return config_; }
  [[nodiscard]] std::size_t page_size() const noexcept { return config_.page_size; }
  /// The manager's clock: the last advance_to() step (0 before the first).
  [[nodiscard]] step_t now() const noexcept { return now_; }

  // --- sequences ---------------------------------------------------------------------------------------------
  /// Opens a sequence with its own config and policy parameters (validated: config_error; its page size must be
  /// the manager's), at the manager's clock: a sequence opened mid-run starts at now(), so its first tokens are
  /// fresh. usage_error if `id` is already open. Nothing changes on error. The returned sequence labels and
  /// observes as usual; its commits go through the manager (commit(), so that this step's protections hold).
  sequence_type& open(SequenceId id, config cfg, const params_type& params = {}) {
    if (entries_.contains(id)) detail::raise_usage("open: sequence " + detail::to_text(id) + " is already open");
    if (cfg.page_size != page_size())
      detail::raise_config("sequence " + detail::to_text(id) + " page_size = " + detail::to_text(cfg.page_size) +
                           ", the manager's is " + detail::to_text(page_size()));
    auto seq = std::make_unique<sequence_type>(std::move(cfg), params);
    seq->advance_to(now_);
    return adopt(id, std::move(seq));
  }
  /// Opens `child` as a copy of `parent`: the same layout (holes and positions included), labels, clock and
  /// policy state, so the child evicts as the parent would. The parent's full pages become shared between the
  /// two (each physical block counts once toward the global budget; neither evicts it in the global pass while
  /// both hold it); the partial last page is the child's own (the engine copies it: copy on write). usage_error,
  /// changing nothing, if `parent` is not open or `child` is.
  sequence_type& fork(SequenceId parent, SequenceId child) {
    auto& p = find_entry(parent, "fork")->second;
    if (entries_.contains(child)) detail::raise_usage("fork: sequence " + detail::to_text(child) + " is already open");
    check_forkable(*p.seq, parent);
    auto seq = std::make_unique<sequence_type>(*p.seq);  // may throw: nothing changed yet
    auto& out = adopt(child, std::move(seq));
    share_full_pages(p, find_entry(child, "fork")->second);
    return out;
  }
  /// fork(parent, child) and the table's fork(table_id(parent), table_id(child)) together (block_pool::fork
  /// shares the full blocks and gives the child a block for the partial page). usage_error, changing neither,
  /// if the table disagrees with the parent or refuses the fork. A parent with pages on the host cannot fork
  /// (usage_error): a host store keeps one copy per (sequence, page), and the child would hold pages it has none of.
  template <class Table, class IdMap>
  requires page_table<Table> && requires(Table& t, const typename Table::sequence_id& a) { t.fork(a, a); }
  sequence_type& fork(SequenceId parent, SequenceId child, Table& table, IdMap table_id) {
    const auto& p = find_entry(parent, "fork")->second;
    if (entries_.contains(child)) detail::raise_usage("fork: sequence " + detail::to_text(child) + " is already open");
    check_forkable(*p.seq, parent);
    detail::check_page_table(table, table_id_of<Table>(table_id, parent), p.seq->page_size(), p.seq->num_pages(),
                             "fork: sequence " + detail::to_text(parent));
    auto seq = std::make_unique<sequence_type>(*p.seq);
    table.fork(table_id_of<Table>(table_id, parent), table_id_of<Table>(table_id, child));  // may throw
    auto& out = adopt(child, std::move(seq));  // bad_alloc here leaves the table forked: the engine closes it
    share_full_pages(find_entry(parent, "fork")->second, find_entry(child, "fork")->second);
    return out;
  }
  /// Forgets a sequence (the engine releases its blocks). usage_error if it is not open.
  void close(SequenceId id) {
    auto it = find_entry(id, "close");
    for (const auto& [origin, key] : it->second.shared) release_key(key);
    entries_.erase(it);
  }
  [[nodiscard]] bool contains(SequenceId id) const noexcept { return entries_.contains(id); }
  [[nodiscard]] std::size_t size() const noexcept { return entries_.size(); }
  /// The open sequences' ids, ascending.
  [[nodiscard]] std::vector<SequenceId> ids() const {
    std::vector<SequenceId> out;
    out.reserve(entries_.size());
    for (const auto& [id, e] : entries_) out.push_back(id);
    return out;
  }
  /// The sequence `id` (usage_error if it is not open). It labels, observes and selects as usual; its own commit
  /// refuses (usage_error: a managed sequence commits through the manager).
  [[nodiscard]] sequence_type& at(SequenceId id) { return *find_entry(id, "at")->second.seq; }
  [[nodiscard]] const sequence_type& at(SequenceId id) const { return *find_entry(id, "at")->second.seq; }

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
  /// Resident (device) pages over all sequences (a shared page counts once per holder).
  [[nodiscard]] std::size_t resident_pages() const noexcept {
    std::size_t n = 0;
    for (const auto& [id, e] : entries_) n += e.seq->device_pages();
    return n;
  }
  /// Resident pages whose block no one else holds: what eviction could give back to the pool.
  [[nodiscard]] std::size_t reclaimable_pages() const {
    std::size_t n = 0;
    for (const auto& [id, e] : entries_) n += e.seq->device_pages() - count_sharing(e);
    return n;
  }
  /// Pages on the host tiers of all sequences: what the host pool holds (at most manager_config::host_pool).
  [[nodiscard]] std::size_t host_pages() const noexcept {
    std::size_t n = 0;
    for (const auto& [id, e] : entries_) n += e.seq->host_pages();
    return n;
  }
  /// Physical blocks the open sequences hold: private pages, plus each shared block once. The global budget is
  /// measured in these.
  [[nodiscard]] std::size_t physical_pages() const { return reclaimable_pages() + shared_block_count(); }

  // --- the clock and per-step protection ----------------------------------------------------------------------
  /// Moves the manager's and every sequence's clock to `step` and ends the protections of the last step.
  /// input_error, changing nothing, if the manager or any sequence is already past `step`.
  void advance_to(step_t step) {
    check_clock(step);
    apply_scorer_rule(inline_executor{});
    now_ = step;
    for (auto& [id, e] : entries_) {
      e.seq->advance_to(step);
      e.protected_origins.clear();
    }
  }
  /// advance_to(step) with the sequences' clocks moved on the executor's threads (an exp-free MemDecay sequence
  /// rebases its weights now and then, O(tokens)). The same result for every executor (core/executor.hpp).
  template <executor Exec>
  void advance_to(step_t step, Exec&& exec) {
    check_clock(step);
    apply_scorer_rule(exec);
    now_ = step;
    const auto all = entry_list();
    detail::run_all(exec, all.size(), [&](std::size_t i) {
      all[i]->seq->advance_to(step);  // cannot go backwards: checked above
      all[i]->protected_origins.clear();
    });
  }

  // --- a batch of observations (one engine step) ---------------------------------------------------------------
  /// One sequence's observation in a batch: per-token mass over its resident tokens, as observe_tokens takes it.
  struct observation {
    SequenceId id;
    std::span<const float_type> mass;
  };
  /// observe_tokens for every sequence of the batch, on the executor's threads (core/executor.hpp), one task per
  /// sequence; returns what each returned, in batch order. Every observation is checked before any is applied:
  /// usage_error for a sequence that is not open or is named twice, input_error naming the sequence for a bad
  /// mass (the one of the earliest bad entry), and then nothing has changed. The sequences are independent, so
  /// the result is the same for any executor and thread count (ManagerBatch.SameResultForEveryThreadCount).
  template <executor Exec = inline_executor>
  std::vector<std::size_t> observe_batch(std::span<const observation> batch, Exec&& exec = Exec{}) {
    const auto seqs = batch_sequences(batch);
    std::vector<std::vector<float_type>> held(batch.size());  // a sequence with host pages: its held-token mass
    detail::run_all(exec, batch.size(), [&](std::size_t i) {
      naming_sequence(batch[i].id, [&] { held[i] = seqs[i]->check_tokens_for_batch(batch[i].mass); });
    });
    std::vector<std::size_t> refreshed(batch.size());
    detail::run_all(exec, batch.size(),
                    [&](std::size_t i) { refreshed[i] = seqs[i]->observe_checked(batch[i].mass, held[i]); });
    return refreshed;
  }
  /// One sequence's observation in a batch as the engine's kernel wrote it (core/attention_rows.hpp).
  struct rows_observation {
    SequenceId id;
    attention_rows rows;
  };
  /// observe_rows for every sequence of the batch, on the executor's threads: the same contract as the
  /// observe_batch above (every entry checked before any is applied, the earliest bad entry's error naming its
  /// sequence, then its row and token; the same result for any executor and thread count). A sequence whose rows
  /// are reduced into a float vector (several rows) keeps that vector from the check to the observation.
  template <executor Exec = inline_executor>
  std::vector<std::size_t> observe_batch(std::span<const rows_observation> batch, Exec&& exec = Exec{}) {
    const auto seqs = batch_sequences(batch);
    std::vector<std::vector<float_type>> reduced(batch.size());
    detail::run_all(exec, batch.size(), [&](std::size_t i) {
      naming_sequence(batch[i].id, [&] { reduced[i] = seqs[i]->check_rows_for_batch(batch[i].rows); });
    });
    std::vector<std::size_t> refreshed(batch.size());
    detail::run_all(exec, batch.size(), [&](std::size_t i) {
      refreshed[i] = seqs[i]->observe_rows_checked(batch[i].rows, reduced[i]);
    });
    return refreshed;
  }
  /// Protects logical pages of `id` until the next advance_to() (or clear_protections()): pages that in-flight or
  /// speculative tokens still read. usage_error for an unknown sequence, input_error for a page that does not
  /// exist or is on the host (protections are for device pages: a host page holds no device block); nothing
  /// changes on error.
  void protect_pages(SequenceId id, std::span<const std::size_t> pages) {
    auto& e = find_entry(id, "protect_pages")->second;
    const auto origins = device_origins_of(e, id, pages, "protect_pages");
    e.protected_origins.insert(origins.begin(), origins.end());
  }
  /// Protects every page holding one of the last `tokens` resident tokens of `id` (speculative drafts, tokens of
  /// an in-flight step) until the next advance_to(); pages of them on the host are passed over.
  void protect_tail_tokens(SequenceId id, std::size_t tokens) {
    auto& e = find_entry(id, "protect_tail_tokens")->second;
    const std::size_t first = policy_support::first_recent_page(e.seq->view(), tokens);
    const auto origins = e.seq->state().page_origins();
    for (std::size_t p = first; p < e.seq->num_pages(); ++p)
      if (!on_host(e, p)) e.protected_origins.insert(origins[p]);  // a host page holds no device block to keep
  }
  void clear_protections() noexcept {
    for (auto& [id, e] : entries_) e.protected_origins.clear();
  }
  /// The pages of `id` protected for this step, ascending logical indices.
  [[nodiscard]] std::vector<std::size_t> protected_pages(SequenceId id) const {
    const auto& e = find_entry(id, "protected_pages")->second;
    return resident_indices(e, [&](std::uint64_t o) { return e.protected_origins.contains(o); });
  }

  // --- shared pages ------------------------------------------------------------------------------------------
  /// Flags (or unflags) logical pages of `id` as shared with holders the manager does not see (another engine
  /// structure, a prefix cache). The flag follows the page through compaction and ends with its eviction.
  /// usage_error for an unknown sequence, input_error for a page that does not exist or is on the host (it holds
  /// no device block to share); nothing changes on error.
  void set_shared(SequenceId id, std::span<const std::size_t> pages, bool shared = true) {
    auto& e = find_entry(id, "set_shared")->second;
    const auto origins = device_origins_of(e, id, pages, "set_shared");
    for (std::uint64_t o : origins) {
      auto it = e.shared.find(o);
      if (shared) {
        if (it == e.shared.end()) it = link(e, o, next_key_++);
        blocks_[it->second].external = true;
      } else {
        unlink(e, o);
      }
    }
  }
  /// Re-flags every page of every sequence from a table that counts references: shared exactly when its physical
  /// page has more than one holder, holders in this manager found by their physical ids (so the global budget
  /// counts the block once). `table_id` maps a manager id to the table's. usage_error, changing nothing, if the
  /// table does not hold a sequence or holds a different number of pages. Cost: O(resident pages) table lookups,
  /// plus one ref_counts() pass where the table has one (bulk_counted_page_table), else a ref_count() per page.
  template <shared_page_table Table, class IdMap>
  void mark_shared_from(const Table& table, IdMap table_id) {
    for (const auto& [id, e] : entries_)
      detail::check_page_table(table, table_id_of<Table>(table_id, id), e.seq->page_size(), e.seq->device_pages(),
                               "mark_shared_from: sequence " + detail::to_text(id));
    std::map<SequenceId, std::map<std::uint64_t, std::uint64_t>> flags;
    std::map<std::uint64_t, block_holders> blocks;
    std::map<std::uint64_t, std::size_t> table_refs;  // per shared block: the table's reference count
    std::vector<std::size_t> counts;                  // every block's holders in one pass, where the table can
    if constexpr (bulk_counted_page_table<Table>) counts = table.ref_counts();
    const auto refs_of = [&](const auto& block) {
      if constexpr (bulk_counted_page_table<Table>)
        return counts.at(static_cast<std::size_t>(block));
      else
        return static_cast<std::size_t>(table.ref_count(block));
    };
    for (const auto& [id, e] : entries_) {
      const auto tid = table_id_of<Table>(table_id, id);
      auto& f = flags[id];
      const auto origins = e.seq->state().page_origins();
      const auto device = device_page_list(*e.seq);  // the table holds the device pages, in page order
      for (std::size_t d = 0; d < device.size(); ++d) {
        const auto block = table.page_at(tid, d);
        const auto refs = refs_of(block);
        if (refs <= 1) continue;
        const std::uint64_t key = static_cast<std::uint64_t>(block);  // physical ids sit below the synthetic keys
        f.emplace(origins[device[d]], key);
        ++blocks[key].holders;
        table_refs[key] = refs;
      }
    }
    for (auto& [key, b] : blocks) b.external = table_refs[key] > b.holders;
    for (auto& [id, e] : entries_) e.shared = std::move(flags[id]);
    blocks_ = std::move(blocks);
  }
  /// The pages of `id` whose block someone else also holds, ascending logical indices.
  [[nodiscard]] std::vector<std::size_t> shared_pages(SequenceId id) const {
    const auto& e = find_entry(id, "shared_pages")->second;
    return resident_indices(e, [&](std::uint64_t o) { return shares_memory(e, o); });
  }

  // --- selection (phase 1: changes nothing) --------------------------------------------------------------------
  /// What `id`'s own budget asks for, honouring this step's protections.
  /// With a host tier, the host pool's rule applies to the sequence's own pages (see the top of this file).
  [[nodiscard]] plan_type select(SequenceId id) const {
    const auto& e = find_entry(id, "select")->second;
    return fit_one(id, e.seq->select_for_budget(protected_pages(id)));
  }
  /// The `k` lowest-scoring evictable pages of `id`, honouring this step's protections (and the host pool).
  [[nodiscard]] plan_type select(SequenceId id, std::size_t k) const {
    const auto& e = find_entry(id, "select")->second;
    return fit_one(id, e.seq->select(k, protected_pages(id)));
  }
  /// Every sequence's own budget, then the global budget; see the top of this file. `pages_to_free`: the engine
  /// needs at least this many blocks back now (say, to admit a request); the plan frees at least that many in
  /// all (the budgets' victims count), or says in pages_short how many it could not find. When both the global
  /// budget and the request ask for more, the larger need wins and names the reason.
  ///
  /// `exec` (core/executor.hpp) runs the per-sequence work (each sequence's own plan and its candidates for the
  /// global budget) on the engine's threads; the global choice then looks at each sequence's best candidates only.
  /// The plan is the same for every executor and thread count.
  template <executor Exec = inline_executor>
  [[nodiscard]] global_plan_type select_global(std::size_t pages_to_free = 0, Exec&& exec = Exec{}) const {
    global_plan_type out;
    std::vector<candidate> order;  // every victim's key in the total order, aligned with out.victims
    std::map<SequenceId, std::vector<std::size_t>> chosen;  // per sequence, pages the first pass took

    // Pass 1, a task per sequence: its own budget's plan and its reclaimable pages.
    struct own_pass {
      SequenceId id{};
      std::vector<std::size_t> protect;
      plan_type plan;
      std::vector<std::uint8_t> shared;  // per victim of `plan`
      std::size_t reclaimable = 0;
      std::vector<candidate> candidates;  // pass 2's
    };
    std::vector<own_pass> passes(entries_.size());
    std::vector<const entry*> all;
    all.reserve(entries_.size());
    for (const auto& [id, e] : entries_) {
      passes[all.size()].id = id;
      all.push_back(&e);
    }
    detail::run_all(exec, all.size(), [&](std::size_t i) {
      const entry& e = *all[i];
      own_pass& r = passes[i];
      r.protect = protected_pages(r.id);
      r.plan = e.seq->select_for_budget(r.protect);
      const auto origins = e.seq->state().page_origins();
      for (std::size_t p : r.plan.pages) r.shared.push_back(shares_memory(e, origins[p]) ? 1 : 0);
      r.reclaimable = e.seq->device_pages();
      if (!e.shared.empty())
        for (std::size_t p = 0; p < origins.size(); ++p) r.reclaimable -= shares_memory(e, origins[p]) ? 1 : 0;
    });
    std::size_t reclaimable = 0;
    for (auto& r : passes) {
      reclaimable += r.reclaimable;
      auto& taken = chosen[r.id];
      taken = r.plan.pages;
      const auto origins = at(r.id).state().page_origins();
      for (std::size_t k = 0; k < r.plan.pages.size(); ++k) {
        const std::size_t p = r.plan.pages[k];
        out.victims.push_back({r.id, p, r.plan.scores[k], r.shared[k] != 0, eviction_reason::sequence_budget});
        order.push_back({r.plan.scores[k], tie_rank(r.id, origins[p]), r.id, p});
        if (!r.shared[k]) ++out.pages_freed;
      }
    }

    // Pass 2: the global budget (in physical blocks) and the caller's request, over every sequence in one order.
    const std::size_t after_pass_1 = reclaimable + shared_block_count() - out.pages_freed;
    std::size_t budget_need = 0;
    if (!config_.global.is_unlimited() && after_pass_1 > config_.global.high)
      budget_need = after_pass_1 - config_.global.low;
    const std::size_t request_need = pages_to_free > out.pages_freed ? pages_to_free - out.pages_freed : 0;
    const std::size_t need = std::max(budget_need, request_need);
    const eviction_reason reason =
        budget_need >= request_need ? eviction_reason::global_budget : eviction_reason::requested;
    // Only a sequence's `need` best candidates (evictable, not shared, not taken by its own budget) can be among
    // the `need` best of all. A task per sequence finds them: the `need` lowest scores by the fast selection,
    // then every candidate that scores no more than the highest of those (the global order breaks ties by a hash,
    // not the page index), ordered by the global key and cut to `need`. Then the few that are left are ordered.
    if (need > 0)
      detail::run_all(exec, passes.size(), [&](std::size_t i) {
        const entry& e = *all[i];
        own_pass& r = passes[i];
        std::vector<float_type> buffer;
        const auto scores = scores_of(*e.seq, buffer);
        auto status = e.seq->page_statuses(r.protect);
        const auto origins = e.seq->state().page_origins();
        for (std::size_t p : r.plan.pages) status[p] = page_status::protected_;
        if (!e.shared.empty())
          for (std::size_t p = 0; p < status.size(); ++p)
            if (shares_memory(e, origins[p])) status[p] = page_status::protected_;
        // The sampled threshold pays off from a few hundred pages when `need` is small next to them.
        const auto lowest = simd::select_lowest_pages_fast<float_type>(scores, status, need, {.min_pages = 128});
        if (lowest.empty()) return;
        float_type bar = scores[lowest.front()];
        for (std::size_t p : lowest) bar = std::max(bar, scores[p]);
        for (std::size_t p = 0; p < scores.size(); ++p)
          if (status[p] == page_status::evictable && scores[p] <= bar)
            r.candidates.push_back({scores[p], tie_rank(r.id, origins[p]), r.id, p});
        if (r.candidates.size() > need) {
          std::nth_element(r.candidates.begin(), r.candidates.begin() + static_cast<std::ptrdiff_t>(need),
                           r.candidates.end());
          r.candidates.resize(need);
        }
      });
    std::vector<candidate> pool;
    std::size_t kept = 0;
    for (const auto& r : passes) kept += r.candidates.size();
    pool.reserve(kept);
    for (const auto& r : passes) pool.insert(pool.end(), r.candidates.begin(), r.candidates.end());
    const std::size_t take = std::min(need, pool.size());
    std::partial_sort(pool.begin(), pool.begin() + static_cast<std::ptrdiff_t>(take), pool.end());
    for (std::size_t k = 0; k < take; ++k) {
      out.victims.push_back({pool[k].sequence, pool[k].page, pool[k].score, false, reason});
      order.push_back(pool[k]);
      chosen[pool[k].sequence].push_back(pool[k].page);
      ++out.pages_freed;
    }
    out.pages_short = need - take;

    std::vector<std::size_t> rank(out.victims.size());
    std::iota(rank.begin(), rank.end(), std::size_t{0});
    std::sort(rank.begin(), rank.end(), [&](std::size_t a, std::size_t b) { return order[a] < order[b]; });
    std::vector<global_victim<float_type, SequenceId>> sorted;
    sorted.reserve(rank.size());
    for (std::size_t k : rank) sorted.push_back(out.victims[k]);
    out.victims = std::move(sorted);
    for (auto& [id, pages] : chosen) {
      if (pages.empty()) continue;
      std::sort(pages.begin(), pages.end());
      const auto& seq = at(id);
      const std::size_t requested = pages.size();
      std::vector<float_type> buffer;
      const auto scores = scores_of(seq, buffer);
      auto plan = detail::plan_for_pages<float_type>(seq.state(), seq.get_config().budget, scores, std::move(pages),
                                                     requested, seq.device_len());
      if (seq.has_host_tier()) seq.split_for_host(plan, scores);  // both passes' victims, by the tier's rules
      out.plans.emplace(id, std::move(plan));
    }
    fit_host_pool(out.plans, [](SequenceId) { return true; });
    return out;
  }

  // --- commit (phase 2) ----------------------------------------------------------------------------------------
  /// Applies a global plan to the engine's page table and every sequence's state. `table_id` maps a manager id
  /// to the table's (a row index for the vLLM and SGLang views; identity_id{} when they are the same number).
  /// All plans are checked against their sequences and (for a checked_page_table) the table before anything
  /// changes, so a rejected commit changes nothing: usage_error, naming the call and the sequence, for a stale
  /// plan, an unknown sequence, a page protected for this step or a table that disagrees. A batch_page_table
  /// (every table this library ships) then removes every sequence's pages in one call that is itself all or
  /// nothing, and the states follow without anything left that can fail: whatever throws (the table, the engine
  /// behind it, an allocation), the table and every state are as before. Returns each sequence's page_removal
  /// (the removed pages, the memory that freed, their slots). With host tiers the table removes every page that
  /// leaves the device, demoted or dropped (the engine copied the demoted ones to host before; the commit that
  /// takes a host store does that copy itself), and usage_error, changing nothing, if the plan would overfill the
  /// host pool (a recall committed since the selection may have filled it).
  template <page_table Table, class IdMap>
  std::map<SequenceId, page_removal<typename Table::page_id>> commit(const global_plan_type& plan, Table& table,
                                                                     IdMap table_id) {
    for (const auto& [id, p] : plan.plans) check_commit(id, p, table, table_id_of<Table>(table_id, id));
    check_host_pool(plan.plans, "commit");
    std::map<SequenceId, page_removal<typename Table::page_id>> removals;
    if constexpr (batch_page_table<Table>) {
      // One call for the whole batch (a CSR then moves its entries once, not once per sequence), then the states.
      std::vector<sequence_pages<typename Table::sequence_id>> batch;
      std::vector<entry*> entries;
      std::vector<const plan_type*> plans;
      std::vector<std::vector<std::uint64_t>> evicted;
      std::vector<std::vector<std::size_t>> device;  // the table's indices of the pages leaving the device
      batch.reserve(plan.plans.size());
      entries.reserve(plan.plans.size());
      plans.reserve(plan.plans.size());
      evicted.reserve(plan.plans.size());
      device.reserve(plan.plans.size());
      std::vector<page_removal<typename Table::page_id>*> slots;  // the result's nodes, allocated up front
      for (const auto& [id, p] : plan.plans) {
        entries.push_back(&find_entry(id, "commit")->second);
        device.push_back(device_indices_of(*entries.back()->seq, p.pages));
        batch.push_back({table_id_of<Table>(table_id, id), device.back()});
        plans.push_back(&p);
        evicted.push_back(evicted_origins(*entries.back(), p.pages));
        slots.push_back(&removals[id]);
      }
      auto done = table.remove_pages_of(batch);  // may throw; nothing has changed yet
      if (done.size() != batch.size())
        detail::raise_usage("commit: the page table answered " + detail::to_text(done.size()) + " removals for " +
                            detail::to_text(batch.size()) + " sequences (a broken batch_page_table)");
      for (std::size_t k = 0; k < done.size(); ++k) detail::check_removal_answer(done[k], batch[k].pages.size());
      for (std::size_t k = 0; k < entries.size(); ++k) {  // nothing below can fail
        entries[k]->seq->apply_plan(*plans[k]);
        forget(*entries[k], evicted[k]);
        *slots[k] = std::move(done[k]);
      }
    } else {
      // One table call per sequence: a table that fails on sequence k (it passed check_commit, so an allocation
      // or the engine's own error) leaves sequences before k committed, table and state together, and the rest
      // unchanged. Every shipped table is a batch_page_table, which commits all or nothing.
      for (const auto& [id, p] : plan.plans)
        removals.emplace(id, apply(id, p, table, table_id_of<Table>(table_id, id)));
    }
    return removals;
  }
  /// commit(plan, table, table_id) with the engine's host store (tiers/host_store.hpp) doing the copies: every
  /// sequence's demoted pages' K/V goes to the host first, then the table removes every page leaving the device,
  /// then the host copies of the pages dropped from the host tiers are released. A store that throws or copies
  /// fewer pages than asked (input_error) leaves every sequence, the table and the store as they were (the copies
  /// made are released again), as does the table's batch removal failing (a batch_page_table, every table this
  /// library ships: its removal is all or nothing).
  template <batch_page_table Table, class IdMap, class Store>
    requires host_store<Store, typename Table::sequence_id, typename Table::page_id>
  std::map<SequenceId, page_removal<typename Table::page_id>> commit(const global_plan_type& plan, Table& table,
                                                                     IdMap table_id, Store& store) {
    using table_sequence = typename Table::sequence_id;
    for (const auto& [id, p] : plan.plans) check_commit(id, p, table, table_id_of<Table>(table_id, id));
    check_host_pool(plan.plans, "commit");
    struct host_copies {
      table_sequence sequence;
      std::vector<std::uint64_t> demoted, host_dropped;
    };
    std::vector<host_copies> copies;  // per tiered sequence of the plan, in id order
    copies.reserve(plan.plans.size());
    for (const auto& [id, p] : plan.plans)
      if (!p.demoted.empty() || !p.host_dropped.empty()) {
        const auto& seq = at(id);
        copies.push_back({table_id_of<Table>(table_id, id), seq.origins_of(p.demoted), seq.origins_of(p.host_dropped)});
      }
    std::size_t copied = 0;  // sequences whose demoted pages are on the host
    const auto release_copied = [&]() noexcept {
      for (std::size_t k = copied; k-- > 0;) store.release(copies[k].sequence, copies[k].demoted);
    };
    detail::or_undo(
        [&] {
          for (const auto& [id, p] : plan.plans) {
            if (p.demoted.empty() && p.host_dropped.empty()) continue;
            const auto& seq = at(id);
            const auto& c = copies[copied];
            std::vector<typename Table::page_id> blocks;
            blocks.reserve(p.demoted.size());
            for (std::size_t d : seq.host_tier().device_indices(p.demoted))
              blocks.push_back(table.page_at(c.sequence, d));
            sequence_type::copy_all_to_host(store, c.sequence, std::span<const std::uint64_t>(c.demoted), blocks,
                                            "commit");
            ++copied;
          }
        },
        release_copied);
    auto removals = detail::or_undo([&] { return commit(plan, table, table_id); }, release_copied);
    for (const auto& c : copies) store.release(c.sequence, c.host_dropped);
    return removals;
  }
  /// Throws what commit(plan) would throw, changing nothing: for an engine that removes the pages itself between
  /// the check and the state-only commit (the C API's commit with a callback).
  void check_commit(const global_plan_type& plan) const {
    for (const auto& [id, p] : plan.plans) check_commit(id, p);
    check_host_pool(plan.plans, "commit");
  }
  /// Applies a global plan to the sequences' states only (the engine updated its table itself). usage_error,
  /// changing nothing, if any plan is stale or names a page protected for this step, or would overfill the host
  /// pool.
  void commit(const global_plan_type& plan) {
    check_commit(plan);
    for (const auto& [id, p] : plan.plans) apply(id, p);
  }
  /// Applies one sequence's plan to the table and the state (see basic_sequence::commit), honouring this step's
  /// protections and the host pool.
  template <page_table Table, class IdMap>
  page_removal<typename Table::page_id> commit(SequenceId id, const plan_type& plan, Table& table, IdMap table_id) {
    const auto tid = table_id_of<Table>(table_id, id);
    check_commit(id, plan, table, tid);
    check_host_pool(id, plan);
    return apply(id, plan, table, tid);
  }
  /// commit(id, plan, table, table_id) with the engine's host store doing the copies (basic_sequence::commit with a
  /// store: all or nothing, the store included).
  template <page_table Table, class IdMap, class Store>
    requires host_store<Store, typename Table::sequence_id, typename Table::page_id>
  page_removal<typename Table::page_id> commit(SequenceId id, const plan_type& plan, Table& table, IdMap table_id,
                                               Store& store) {
    const auto tid = table_id_of<Table>(table_id, id);
    check_commit(id, plan, table, tid);
    check_host_pool(id, plan);
    auto& e = find_entry(id, "commit")->second;
    const auto evicted = evicted_origins(e, plan.pages);
    auto removal = e.seq->remove_with_store(plan, table, tid, store);
    forget(e, evicted);
    return removal;
  }
  /// Applies one sequence's plan to its state only (the engine updated its table itself).
  void commit(SequenceId id, const plan_type& plan) {
    check_commit(id, plan);
    check_host_pool(id, plan);
    apply(id, plan);
  }

  // --- recall (tiers/host_tier.hpp) ---------------------------------------------------------------------------
  /// basic_sequence::select_recall for `id`, displacing no page protected for this step and no shared page (its
  /// block would stay held: the promotion would take a block and free none). `exec` splits the page bounds over
  /// its threads (the same plan for every executor).
  template <executor Exec = inline_executor>
  [[nodiscard]] recall_plan select_recall(SequenceId id, std::span<const float> query,
                                          head_bounds over_heads = head_bounds::max, Exec&& exec = Exec{}) const {
    const auto& e = find_entry(id, "select_recall")->second;
    return e.seq->select_recall(query, undisplaceable_pages(e, id), over_heads, exec);
  }
  /// basic_sequence::select_recall_for_bounds for `id`, with the same protections as select_recall.
  [[nodiscard]] recall_plan select_recall_for_bounds(SequenceId id, std::span<const float> page_bounds) const {
    const auto& e = find_entry(id, "select_recall_for_bounds")->second;
    return e.seq->select_recall_for_bounds(page_bounds, undisplaceable_pages(e, id));
  }
  /// Throws what commit_recall(id, plan) would throw, changing nothing: what basic_sequence::check_recall rejects,
  /// and a usage_error for an unknown sequence, a displaced page protected for this step, or a plan that would
  /// overfill the host pool.
  void check_recall(SequenceId id, const recall_plan& plan) const {
    const auto& e = find_entry(id, "commit_recall")->second;
    e.seq->check_recall(plan);
    const std::string where = "commit_recall: sequence " + detail::to_text(id);
    const auto origins = e.seq->state().page_origins();
    for (const auto* list : {&plan.demote, &plan.drop})
      for (std::size_t p : *list)
        if (e.protected_origins.contains(origins[p]))
          detail::raise_usage(where + ": plan displaces page " + detail::to_text(p) +
                              ", which is protected for this step");
    check_pool_after(host_pages() - plan.promote.size() + plan.demote.size(), where);
  }
  /// Applies `id`'s recall plan to its state only (the engine moved the K/V and changed its table itself).
  void commit_recall(SequenceId id, const recall_plan& plan) {
    recall_with(id, plan, [&](sequence_type& seq) { seq.apply_recall(plan); });
  }
  /// basic_sequence::commit_recall(plan, table, seq) for `id`, with the manager's checks first.
  template <inserting_page_table Table, class IdMap>
  recall_commit<typename Table::page_id> commit_recall(SequenceId id, const recall_plan& plan, Table& table,
                                                       IdMap table_id) {
    return recall_with(id, plan, [&](sequence_type& seq) {
      return seq.recall_into(plan, table, table_id_of<Table>(table_id, id));
    });
  }
  /// basic_sequence::commit_recall(plan, table, seq, store) for `id`, with the manager's checks first: all or
  /// nothing, the table and the store included.
  template <inserting_page_table Table, class IdMap, class Store>
    requires host_store<Store, typename Table::sequence_id, typename Table::page_id>
  recall_commit<typename Table::page_id> commit_recall(SequenceId id, const recall_plan& plan, Table& table,
                                                       IdMap table_id, Store& store) {
    return recall_with(id, plan, [&](sequence_type& seq) {
      return seq.recall_into(plan, table, table_id_of<Table>(table_id, id), store);
    });
  }

  // --- determinism -------------------------------------------------------------------------------------------
  /// A digest of everything selection depends on: the clock, each sequence's id, config and state digest, its
  /// protected and shared pages, and the manager's config. Ranks with equal digests select the same victims.
  [[nodiscard]] std::uint64_t digest() const noexcept {
    detail::fnv1a64 h;
    h.add(static_cast<std::uint64_t>(config_.page_size)).add(config_.global.high).add(config_.global.low).add(now_);
    h.add(static_cast<std::uint64_t>(config_.host_pool));
    if (config_.scorer.active())  // older digests stay as they were
      h.add(config_.scorer.polynomial_above_tokens).add(config_.scorer.back_below).add(scorer_is_polynomial());
    for (const auto& [id, e] : entries_) {
      h.add(static_cast<std::uint64_t>(id)).add(e.seq->digest());
      h.add(e.seq->config_digest());
      h.add(static_cast<std::uint64_t>(e.protected_origins.size()));
      for (std::uint64_t o : e.protected_origins) h.add(o);
      h.add(static_cast<std::uint64_t>(e.shared.size()));
      for (const auto& [o, key] : e.shared) h.add(o).add(static_cast<std::uint8_t>(shares_memory(e, o)));
    }
    return h.value();
  }

 private:
  friend struct detail::manager_snapshot_access;

  struct entry {
    std::unique_ptr<sequence_type> seq;             // stable address: callers keep references across open()
    std::set<std::uint64_t> protected_origins;      // original page indices, which survive compaction
    std::map<std::uint64_t, std::uint64_t> shared;  // original page index -> the block's key in blocks_
    std::uint64_t serial = 0;  // which opening of this id (a checkpoint must not mistake a reopened id for the old)
  };
  // A block held by more than one resident page (or by holders outside the manager).
  struct block_holders {
    std::size_t holders = 0;  // resident pages of open sequences that hold it
    bool external = false;    // held outside the manager too (set_shared, or table references not seen here)
  };
  // The global order: score, then a per-page hash so that equal scores spread over the sequences instead of all
  // going to the lowest id, then id and page (the hash is a pure function of the two: every rank agrees).
  struct candidate {
    float_type score;
    std::uint64_t tie;
    SequenceId sequence;
    std::size_t page;
    friend bool operator<(const candidate& a, const candidate& b) {
      if (a.score < b.score) return true;
      if (b.score < a.score) return false;
      if (a.tie != b.tie) return a.tie < b.tie;
      if (a.sequence != b.sequence) return a.sequence < b.sequence;
      return a.page < b.page;
    }
  };
  using map_type = std::map<SequenceId, entry>;

  // The sequences of a batch, in batch order: usage_error for an id that is not open or is named twice.
  template <class Entry>
  std::vector<sequence_type*> batch_sequences(std::span<const Entry> batch) {
    std::vector<sequence_type*> seqs;
    seqs.reserve(batch.size());
    for (const auto& o : batch) seqs.push_back(find_entry(o.id, "observe_batch")->second.seq.get());
    std::vector<SequenceId> ids;
    ids.reserve(batch.size());
    for (const auto& o : batch) ids.push_back(o.id);
    std::sort(ids.begin(), ids.end());
    if (const auto twice = std::adjacent_find(ids.begin(), ids.end()); twice != ids.end())
      detail::raise_usage("observe_batch: sequence " + detail::to_text(*twice) + " is named twice");
    return seqs;
  }
  // Runs one sequence's check; an input_error it throws names the sequence ("observe_batch: sequence N: ...").
  template <class Check>
  static void naming_sequence([[maybe_unused]] SequenceId id, Check&& check) {
#if MEMDECAY_HAS_EXCEPTIONS
    try {
      check();
    } catch (const input_error& e) {
      std::string_view why = e.what();
      if (why.starts_with(detail::input_error_prefix)) why.remove_prefix(detail::input_error_prefix.size());
      detail::raise_input("observe_batch: sequence " + detail::to_text(id) + ": " + std::string(why));
    }
#else
    check();
#endif
  }
  void check_clock(step_t step) const {
    if (step < now_)
      detail::raise_input("advance_to: clock goes backwards: advance_to(" + detail::to_text(step) +
                          ") but the manager is at step " + detail::to_text(now_));
    for (const auto& [id, e] : entries_)
      if (e.seq->now() > step)
        detail::raise_input("advance_to: clock goes backwards: advance_to(" + detail::to_text(step) +
                            ") but sequence " + detail::to_text(id) + " is at step " + detail::to_text(e.seq->now()));
  }
  // A sequence's page scores, without a copy where it keeps them (basic_sequence::current_page_scores).
  static std::span<const float_type> scores_of(const sequence_type& seq, std::vector<float_type>& buffer) {
    if constexpr (requires { seq.current_page_scores(buffer); }) {
      return seq.current_page_scores(buffer);
    } else {
      buffer = seq.page_scores();
      return buffer;
    }
  }
  // Every entry in id order: the tasks of a parallel pass index it.
  std::vector<entry*> entry_list() {
    std::vector<entry*> out;
    out.reserve(entries_.size());
    for (auto& [id, e] : entries_) out.push_back(&e);
    return out;
  }

  static std::uint64_t tie_rank(SequenceId id, std::uint64_t origin) noexcept {
    return policy_support::splitmix64(policy_support::splitmix64(static_cast<std::uint64_t>(id)) ^ origin);
  }

  typename map_type::iterator find_entry(SequenceId id, const char* call) {
    auto it = entries_.find(id);
    if (it == entries_.end())
      detail::raise_usage(std::string(call) + ": sequence " + detail::to_text(id) + " is not open in the manager");
    return it;
  }
  typename map_type::const_iterator find_entry(SequenceId id, const char* call) const {
    auto it = entries_.find(id);
    if (it == entries_.end())
      detail::raise_usage(std::string(call) + ": sequence " + detail::to_text(id) + " is not open in the manager");
    return it;
  }
  sequence_type& adopt(SequenceId id, std::unique_ptr<sequence_type> seq) {
    if constexpr (has_scorer_choice) {
      if (config_.scorer.active() && scorer_is_polynomial() && seq->expfree_scores()) seq->use_expfree_scores(false);
    }
    seq->mark_.owned = true;
    return *entries_.emplace(id, entry{std::move(seq), {}, {}, ++openings_}).first->second.seq;
  }

  // --- the scorer rule (scorer_rule) ----------------------------------------------------------------------------
  static constexpr bool has_scorer_choice = requires(sequence_type& s) {
    s.use_expfree_scores(false);
    s.expfree_available();
  };
  // The batch runs the polynomial kernel when a sequence that could run the exp-free one does not (the rule keeps
  // every sequence on one kernel; a sequence opened meanwhile follows the others). Read from the sequences, so a
  // manager restored from a snapshot (which saves each sequence's kernel) continues where the saved one was.
  [[nodiscard]] bool scorer_is_polynomial() const noexcept {
    if constexpr (has_scorer_choice) {
      for (const auto& [id, e] : entries_)
        if (e.seq->expfree_available() && !e.seq->expfree_scores()) return true;
    }
    return false;
  }
  // Before the clocks move: the threshold is crossed upwards -> every sequence to the polynomial kernel (frees the
  // weights, cannot fail); below back_below of it -> every sequence to the exp-free kernel (allocates its weights;
  // all or nothing: a failure switches the ones already switched back, and advance_to then changes nothing).
  template <class Exec>
  void apply_scorer_rule(Exec&& exec) {
    if constexpr (has_scorer_choice) {
      const auto& rule = config_.scorer;
      if (!rule.active() || entries_.empty()) return;
      std::uint64_t tokens = 0;
      for (const auto& [id, e] : entries_) tokens += e.seq->device_len();
      const bool polynomial = scorer_is_polynomial();
      const auto low = static_cast<std::uint64_t>(static_cast<double>(rule.polynomial_above_tokens) * rule.back_below);
      if (!polynomial && tokens > rule.polynomial_above_tokens) {
        for (auto& [id, e] : entries_)
          if (e.seq->expfree_scores()) e.seq->use_expfree_scores(false);
      } else if (polynomial && tokens < low) {
        const auto all = entry_list();
        std::vector<std::uint8_t> switched(all.size(), 0);
        detail::or_undo(
            [&] {
              detail::run_all(exec, all.size(), [&](std::size_t i) {
                auto& s = *all[i]->seq;
                if (s.expfree_available() && !s.expfree_scores()) switched[i] = s.use_expfree_scores(true) ? 1 : 0;
              });
            },
            [&] {
              for (std::size_t i = 0; i < all.size(); ++i)
                if (switched[i]) all[i]->seq->use_expfree_scores(false);
            });
      }
    } else {
      (void)exec;
    }
  }

  template <class Table, class IdMap>
  static typename Table::sequence_id table_id_of(IdMap& map, SequenceId id) {
    return static_cast<typename Table::sequence_id>(map(id));
  }

  // --- shared blocks ---
  static bool is_shared(const block_holders& b) noexcept { return b.external || b.holders > 1; }
  bool shares_memory(const entry& e, std::uint64_t origin) const {
    const auto it = e.shared.find(origin);
    return it != e.shared.end() && is_shared(blocks_.at(it->second));
  }
  std::size_t shared_block_count() const noexcept {
    std::size_t n = 0;
    for (const auto& [key, b] : blocks_) n += is_shared(b) ? 1 : 0;
    return n;
  }
  std::size_t count_sharing(const entry& e) const {
    std::size_t n = 0;
    for (const auto& [o, key] : e.shared) n += is_shared(blocks_.at(key)) ? 1 : 0;
    return n;
  }
  auto link(entry& e, std::uint64_t origin, std::uint64_t key) {
    ++blocks_[key].holders;
    return e.shared.emplace(origin, key).first;
  }
  void release_key(std::uint64_t key) noexcept {
    auto it = blocks_.find(key);
    if (it == blocks_.end()) return;
    if (--it->second.holders == 0) blocks_.erase(it);
  }
  // The page leaves its shared block (if it had one).
  void unlink(entry& e, std::uint64_t origin) noexcept {
    if (auto it = e.shared.find(origin); it != e.shared.end()) {
      release_key(it->second);
      e.shared.erase(it);
    }
  }
  // After a fork: every full page of the parent's is held by both (a new key unless it already had one).
  void share_full_pages(entry& parent, entry& child) {
    const auto& seq = *parent.seq;
    const auto origins = seq.state().page_origins();
    for (std::size_t p = 0; p < seq.num_pages(); ++p) {
      if (seq.state().tokens_in_page(p) != seq.page_size()) continue;
      auto it = parent.shared.find(origins[p]);
      if (it == parent.shared.end()) it = link(parent, origins[p], next_key_++);
      link(child, origins[p], it->second);
    }
  }

  // The original indices of logical pages (input_error naming the call, the sequence and the first page that does
  // not exist).
  static std::vector<std::uint64_t> origins_of(const entry& e, SequenceId id, std::span<const std::size_t> pages,
                                               const char* call) {
    const auto origins = e.seq->state().page_origins();
    std::vector<std::uint64_t> out;
    out.reserve(pages.size());
    for (std::size_t p : pages) {
      if (p >= origins.size())
        detail::raise_input(std::string(call) + ": sequence " + detail::to_text(id) + ": page " + detail::to_text(p) +
                            " does not exist (sequence has " + detail::to_text(origins.size()) + " pages)");
      out.push_back(origins[p]);
    }
    return out;
  }
  static bool on_host(const entry& e, std::size_t page) {
    return e.seq->has_host_tier() && e.seq->host_tier().on_host(page);
  }
  // origins_of for a call on device pages: input_error naming a page on the host as well.
  static std::vector<std::uint64_t> device_origins_of(const entry& e, SequenceId id, std::span<const std::size_t> pages,
                                                      const char* call) {
    auto out = origins_of(e, id, pages, call);
    for (std::size_t p : pages)
      if (on_host(e, p))
        detail::raise_input(std::string(call) + ": sequence " + detail::to_text(id) + ": page " + detail::to_text(p) +
                            " is on the host (protections and sharing are for device pages)");
    return out;
  }
  // The logical indices of the resident pages whose origins satisfy `in`, ascending.
  template <class Predicate>
  static std::vector<std::size_t> resident_indices(const entry& e, Predicate&& in) {
    std::vector<std::size_t> out;
    const auto origins = e.seq->state().page_origins();
    for (std::size_t p = 0; p < origins.size(); ++p)
      if (in(origins[p])) out.push_back(p);
    return out;
  }

  // Every check a commit of `plan` to `id` makes, before anything changes.
  void check_commit(SequenceId id, const plan_type& plan) const {
    const auto& e = find_entry(id, "commit")->second;
    const std::string where = "commit: sequence " + detail::to_text(id);
    if (e.seq->has_host_tier())
      e.seq->check_tiered_plan(plan, where);
    else
      detail::check_plan(plan, e.seq->state(), std::span<const page_status>(e.seq->page_statuses()), where);
    // A plan selected before protect_pages / protect_tail_tokens may name a page protected since: the generation
    // does not see the protection (found by tests/fuzz/adapter_fuzzer.cpp).
    const auto origins = e.seq->state().page_origins();
    for (std::size_t p : plan.pages)
      if (e.protected_origins.contains(origins[p]))
        detail::raise_usage(where + ": plan names page " + detail::to_text(p) + ", which is protected for this step");
  }
  template <class Table>
  void check_commit(SequenceId id, const plan_type& plan, const Table& table,
                    const typename Table::sequence_id& tid) const {
    check_commit(id, plan);
    const auto& seq = *find_entry(id, "commit")->second.seq;
    detail::check_page_table(table, tid, seq.page_size(), seq.device_pages(),
                             "commit: sequence " + detail::to_text(id));
    // A batch table checks the whole batch once (commit(global plan)); one check per sequence would validate it
    // once per sequence.
    if constexpr (checked_page_table<Table> && !batch_page_table<Table>)
      table.check_remove_pages(tid, device_indices_of(seq, plan.pages));
  }

  template <class Table>
  page_removal<typename Table::page_id> apply(SequenceId id, const plan_type& plan, Table& table,
                                              const typename Table::sequence_id& tid) {
    auto& e = find_entry(id, "commit")->second;
    auto evicted = evicted_origins(e, plan.pages);
    auto removal = e.seq->remove_from(plan, table, tid);
    forget(e, evicted);
    return removal;
  }
  // A checked plan to the state only.
  void apply(SequenceId id, const plan_type& plan) {
    auto& e = find_entry(id, "commit")->second;
    forget(e, evicted_origins(e, plan.pages));
    e.seq->apply_plan(plan);
  }
  static std::vector<std::uint64_t> evicted_origins(const entry& e, std::span<const std::size_t> pages) {
    const auto origins = e.seq->state().page_origins();
    std::vector<std::uint64_t> out;
    out.reserve(pages.size());
    for (std::size_t p : pages) out.push_back(origins[p]);
    return out;
  }
  // Flags end with their page: a later page never inherits an evicted page's origin, and a shared block loses a
  // holder.
  void forget(entry& e, std::span<const std::uint64_t> evicted) noexcept {
    for (std::uint64_t o : evicted) {
      unlink(e, o);
      e.protected_origins.erase(o);
    }
  }

  // --- host tiers ---
  void check_forkable(const sequence_type& parent, SequenceId id) const {
    if (parent.host_pages() != 0)
      detail::raise_usage("fork: sequence " + detail::to_text(id) + " has " + detail::to_text(parent.host_pages()) +
                          " pages on the host (a host store keeps one copy per sequence: recall or drop them first)");
  }
  // The held indices of a sequence's device pages, in page order (the engine's device table holds these).
  static std::vector<std::size_t> device_page_list(const sequence_type& seq) {
    if (seq.has_host_tier()) return seq.host_tier().device_page_list();
    std::vector<std::size_t> all(seq.num_pages());
    std::iota(all.begin(), all.end(), std::size_t{0});
    return all;
  }
  // The device table's indices of held device pages (the same numbers without pages on the host).
  static std::vector<std::size_t> device_indices_of(const sequence_type& seq, std::span<const std::size_t> pages) {
    if (seq.host_pages() != 0) return seq.host_tier().device_indices(pages);
    return {pages.begin(), pages.end()};
  }
  // What a recall of `id` may not displace: this step's protections and the shared pages, ascending.
  std::vector<std::size_t> undisplaceable_pages(const entry& e, SequenceId id) const {
    auto out = protected_pages(id);
    if (!e.shared.empty()) {
      const auto shared = resident_indices(e, [&](std::uint64_t o) { return shares_memory(e, o); });
      std::vector<std::size_t> both;
      std::set_union(out.begin(), out.end(), shared.begin(), shared.end(), std::back_inserter(both));
      out = std::move(both);
    }
    return out;
  }
  // Every commit_recall: the manager's checks, then `apply` on the sequence (which may throw, changing nothing), then
  // the displaced pages' flags end.
  template <class Apply>
  decltype(auto) recall_with(SequenceId id, const recall_plan& plan, Apply&& apply) {
    check_recall(id, plan);
    auto& e = find_entry(id, "commit_recall")->second;
    const auto displaced = displaced_origins(e, plan);
    if constexpr (std::is_void_v<decltype(apply(*e.seq))>) {
      apply(*e.seq);
      forget(e, displaced);
    } else {
      auto out = apply(*e.seq);
      forget(e, displaced);
      return out;
    }
  }
  // The origins of the device pages a recall plan displaces (demoted or dropped): their flags end.
  static std::vector<std::uint64_t> displaced_origins(const entry& e, const recall_plan& plan) {
    auto out = evicted_origins(e, plan.demote);
    const auto dropped = evicted_origins(e, plan.drop);
    out.insert(out.end(), dropped.begin(), dropped.end());
    return out;
  }
  // usage_error, "<where> leaves N pages in a host pool of M", unless `after` pages fit the host pool.
  void check_pool_after(std::size_t after, const std::string& where) const {
    if (after > config_.host_pool)
      detail::raise_usage(where + ": the plan leaves " + detail::to_text(after) + " pages in a host pool of " +
                          detail::to_text(config_.host_pool));
  }
  // The pages `plan` adds to the host pool, modulo 2^64 (a plan may release more than it adds; the sum over plans
  // and the pool is what counts). Its host lists are within its sequence: checked before.
  static std::size_t host_growth(const plan_type& plan) noexcept {
    return plan.demoted.size() - plan.host_dropped.size();
  }
  std::size_t host_pages_after(const std::map<SequenceId, plan_type>& plans) const noexcept {
    std::size_t after = host_pages();
    for (const auto& [id, p] : plans) after += host_growth(p);
    return after;
  }
  void check_host_pool(const std::map<SequenceId, plan_type>& plans, const char* call) const {
    if (config_.host_pool == std::numeric_limits<std::size_t>::max()) return;
    check_pool_after(host_pages_after(plans), call);
  }
  void check_host_pool(SequenceId id, const plan_type& plan) const {
    if (plan.demoted.empty() || config_.host_pool == std::numeric_limits<std::size_t>::max()) return;
    check_pool_after(host_pages() + host_growth(plan), "commit: sequence " + detail::to_text(id));
  }
  // A single sequence's plan under the host pool: only its own pages may be dropped for it.
  plan_type fit_one(SequenceId id, plan_type plan) const {
    if (plan.demoted.empty() || config_.host_pool == std::numeric_limits<std::size_t>::max()) return plan;
    std::map<SequenceId, plan_type> one;
    one.emplace(id, std::move(plan));
    fit_host_pool(one, [id](SequenceId s) { return s == id; });
    return std::move(one.begin()->second);
  }
  // The host pool's rule: while the pages the plans leave on the host tiers exceed manager_config::host_pool, the
  // lowest of them in the global order (score, tie hash, sequence, page) are dropped instead: a demotion becomes a
  // drop, a host page joins its sequence's host_dropped (a plan is made for a sequence that had none). Host pages
  // of a sequence that `may_drop` refuses stay (a single sequence's plan cannot touch the others').
  template <class Admit>
  void fit_host_pool(std::map<SequenceId, plan_type>& plans, Admit may_drop) const {
    if (config_.host_pool == std::numeric_limits<std::size_t>::max()) return;
    const std::size_t after = host_pages_after(plans);
    if (after <= config_.host_pool) return;
    std::vector<candidate> pool;
    for (const auto& [id, e] : entries_) {
      if (!e.seq->has_host_tier()) continue;
      const auto found = plans.find(id);
      const plan_type* plan = found == plans.end() ? nullptr : &found->second;
      const bool droppable = may_drop(id) && e.seq->host_pages() != 0;
      if (!droppable && (!plan || plan->demoted.empty())) continue;
      std::vector<float_type> buffer;
      const auto scores = scores_of(*e.seq, buffer);
      const auto origins = e.seq->state().page_origins();
      const auto& tier = e.seq->host_tier();
      if (droppable)
        for (std::size_t p = 0; p < tier.size(); ++p)
          if (tier.on_host(p) && !(plan && std::binary_search(plan->host_dropped.begin(), plan->host_dropped.end(), p)))
            pool.push_back({scores[p], tie_rank(id, origins[p]), id, p});
      if (plan)
        for (std::size_t p : plan->demoted) pool.push_back({scores[p], tie_rank(id, origins[p]), id, p});
    }
    const std::size_t cut = std::min(after - config_.host_pool, pool.size());
    std::partial_sort(pool.begin(), pool.begin() + static_cast<std::ptrdiff_t>(cut), pool.end());
    for (std::size_t k = 0; k < cut; ++k) {
      const candidate& c = pool[k];
      auto found = plans.find(c.sequence);
      if (found == plans.end()) {
        const auto& seq = at(c.sequence);
        found = plans.emplace(c.sequence, detail::plan_for_pages<float_type>(seq.state(), seq.get_config().budget,
                                                                            std::span<const float_type>{}, {}, 0,
                                                                            seq.device_len()))
                    .first;
      }
      plan_type& plan = found->second;
      const auto demoted = std::lower_bound(plan.demoted.begin(), plan.demoted.end(), c.page);
      if (demoted != plan.demoted.end() && *demoted == c.page)
        plan.demoted.erase(demoted);
      else
        plan.host_dropped.insert(std::lower_bound(plan.host_dropped.begin(), plan.host_dropped.end(), c.page), c.page);
    }
  }

  manager_config config_;
  map_type entries_;
  std::map<std::uint64_t, block_holders> blocks_;
  std::uint64_t next_key_ = std::uint64_t{1} << 63;  // synthetic block keys, above any physical id
  step_t now_ = 0;
  std::uint64_t openings_ = 0;                                // sequences adopted so far (the entries' serials)
  std::uint64_t instance_ = detail::next_manager_instance();  // moves with the contents (snapshot checkpoints)
};

/// The common case: MemDecay sequences with float scores, page size chosen at run time, 64-bit request ids.
using manager = basic_manager<sequence, std::uint64_t>;

}  // namespace memdecay

#endif  // MEMDECAY_CORE_MANAGER_HPP
