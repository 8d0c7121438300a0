// SPDX-License-Identifier: Apache-2.0
// memdecay tools: a sequence of any policy behind one interface, so that one driver runs every policy. Both
// memdecay-eval's harness and memdecay-replay drive their policies through it; the catalogue
// (policy_catalogue.hpp) builds the sequences and erasing_wrapper turns each into an any_sequence.
//
//   std::unique_ptr<memdecay_tools::any_sequence> seq = memdecay_tools::erase(memdecay::sequence(cfg));
//   seq->append(region, n); seq->observe(mass); seq->advance_to(step);
//   memdecay_tools::enforce_budget(*seq, pool, id);  // select_for_budget + commit, when over the budget
#ifndef MEMDECAY_TOOLS_COMMON_ANY_SEQUENCE_HPP
#define MEMDECAY_TOOLS_COMMON_ANY_SEQUENCE_HPP

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <memdecay/page_tables/block_pool.hpp>
#include <memdecay/core/config.hpp>
#include <memdecay/core/eviction.hpp>
#include <memdecay/core/region.hpp>
#include <memdecay/core/sequence_like.hpp>
#include <memdecay/digests/page_digests.hpp>
#include <memdecay/digests/query_signal.hpp>
#include <memdecay/tiers/host_store.hpp>
#include <memdecay/tiers/host_tier.hpp>

namespace memdecay_tools {

/// A page's mean decay and attention terms (policies that explain themselves: MemDecay).
struct page_terms {
  double decay = 0;
  double attention = 0;
};

/// One step's queries, for a policy driven by the attention-free signal (memdecay's observe_query) instead of the
/// measured attention.
struct query_step {
  std::span<const float> queries;  ///< n x heads x head_dim: every query of the step, all layers' heads stacked
  std::size_t n = 0, heads = 0, head_dim = 0;
  /// Resident page `page`'s keys into the vector: tokens x heads x head_dim.
  std::function<void(std::size_t page, std::vector<float>& keys)> page_keys;
  std::span<const float> exact;  ///< the step's measured attention per resident token (to measure the estimate)
  double total = 1;              ///< what `exact` sums to, and the estimate with it
};
/// How a policy turns queries into attention (memdecay's digests/query_signal.hpp), and its digests' storage.
struct query_signal_options {
  memdecay::query_signal how = memdecay::query_signal::bound_softmax;
  memdecay::digest_storage storage = memdecay::digest_storage::f16;
  bool last_query_only = false;  ///< estimate from the step's last query alone (what a decode step has)
  bool key_norms = false;        ///< ignore the queries: observe the resident keys' norms (KnormPress)
};
/// How far the estimates were from the measured attention: the sum over steps of the total variation distance
/// between the two per-page distributions (0: equal, 1: disjoint), and the steps.
struct signal_error {
  double tv_sum = 0;
  std::uint64_t steps = 0;
};

/// The calls the tools make on a sequence, whatever its policy.
class any_sequence {
 public:
  using plan_type = memdecay::eviction_plan<float>;
  using pool_type = memdecay::block_pool<std::int32_t, std::uint64_t>;
  /// The engine's host memory for a run with a host tier: host slots, the copy moving one page's K/V.
  using host_copy = std::function<void(memdecay::copy_direction, const std::int32_t&, std::size_t)>;
  using host_store_type = memdecay::host_block_store<std::uint64_t, std::int32_t, host_copy>;
  /// Device page `page`'s keys (the engine's device page table order): tokens x heads x head_dim.
  using page_keys_fn = std::function<void(std::size_t page, std::vector<float>& keys)>;

  virtual ~any_sequence() = default;
  virtual void append(memdecay::region_id region, std::size_t tokens) = 0;
  virtual void observe(std::span<const float> resident_mass) = 0;
  /// Moves the clock to `step` when it is later than now (events of one step may come in several calls).
  virtual void advance_to(memdecay::step_t step) = 0;
  [[nodiscard]] virtual std::size_t kv_len() const = 0;
  [[nodiscard]] virtual std::size_t page_size() const = 0;
  [[nodiscard]] virtual std::uint64_t position_of(std::size_t index) const = 0;
  [[nodiscard]] virtual std::span<const memdecay::region_id> labels() const = 0;
  /// The budget's high watermark, in tokens, now.
  [[nodiscard]] virtual std::uint64_t budget_high_tokens() const = 0;
  [[nodiscard]] virtual plan_type select_for_budget() const = 0;
  virtual void commit(const plan_type& plan, pool_type& table, std::uint64_t sequence) = 0;
  /// The page's terms, for policies that explain their scores; empty otherwise.
  [[nodiscard]] virtual std::optional<page_terms> explain(std::size_t page) const = 0;
  /// From now on the policy observes queries (observe_queries) instead of attention; std::logic_error for a
  /// policy without page digests.
  virtual void use_query_signal(const query_signal_options&) {
    throw std::logic_error("this policy cannot observe queries (no page digests)");
  }
  [[nodiscard]] virtual bool observes_queries() const { return false; }
  virtual void observe_queries(const query_step&) { throw std::logic_error("this policy does not observe queries"); }
  [[nodiscard]] virtual signal_error signal_error_so_far() const { return {}; }
  /// From now on observe(mass) sums the mass per page and observes it with observe_pages (each page's mass shared
  /// evenly among its tokens), as an engine that reduces attention per page on the GPU would.
  virtual void observe_per_page() = 0;

  // The host tier (memdecay's tiers/host_tier.hpp): victims go to host memory and come back on a query's bound.
  // Held pages (kv_len, position_of, plans) count host pages too; observations cover device_len() tokens.
  /// std::logic_error for a policy without page digests, or one observing key norms (they cover held tokens).
  virtual void use_host_tier(const memdecay::host_tier_config&) {
    throw std::logic_error("this policy cannot have a host tier (no page digests)");
  }
  [[nodiscard]] virtual bool has_host_tier() const { return false; }
  [[nodiscard]] virtual std::size_t device_len() const { return kv_len(); }
  [[nodiscard]] virtual bool on_device(std::size_t /*page*/) const { return true; }
  /// Digests (Quest min/max of the keys, every layer's heads as KV heads) for every device page without one: the
  /// pages that filled or grew since the last call. Recall needs them on every page that may go to host.
  virtual void digest_pages(const page_keys_fn&, std::size_t /*heads*/, std::size_t /*head_dim*/) {
    throw std::logic_error("this policy has no page digests");
  }
  /// The recall plan for `query`, by the tier's rules (host_tier_config::displace_lowest among them), a page's
  /// bound combined over the query heads by `over_heads`.
  [[nodiscard]] virtual memdecay::recall_plan select_recall(std::span<const float> /*query*/,
                                                            memdecay::head_bounds /*over_heads*/) const {
    throw std::logic_error("this policy has no host tier");
  }
  /// The recall plan for bounds the caller computed itself, one per held page (sequence::select_recall_for_bounds):
  /// how a clairvoyant recall (the evaluation's Belady ceiling) ranks pages without a query.
  [[nodiscard]] virtual memdecay::recall_plan select_recall_for_bounds(std::span<const float> /*page_bounds*/) const {
    throw std::logic_error("this policy has no host tier");
  }
  /// The original page (position / page size) of held page `page`, device or host.
  [[nodiscard]] std::uint64_t origin_of_page(std::size_t page) const {
    return position_of(page * page_size()) / page_size();
  }
  /// Held pages, device and host.
  [[nodiscard]] std::size_t held_pages() const { return (kv_len() + page_size() - 1) / page_size(); }
  /// commit with the host store doing the demoted pages' copies (all or nothing).
  virtual void commit(const plan_type&, pool_type&, std::uint64_t, host_store_type&) {
    throw std::logic_error("this policy has no host tier");
  }
  /// The promoted pages' fresh blocks, in page order (their K/V already copied in from the store).
  virtual std::vector<std::int32_t> commit_recall(const memdecay::recall_plan&, pool_type&, std::uint64_t,
                                                  host_store_type&) {
    throw std::logic_error("this policy has no host tier");
  }
};

/// any_sequence over one sequence type.
template <memdecay::sequence_like Sequence>
requires std::same_as<typename Sequence::float_type, float>
class erased_sequence final : public any_sequence {
 public:
  explicit erased_sequence(Sequence seq) : seq_(std::move(seq)) {}
  void append(memdecay::region_id region, std::size_t tokens) override { seq_.append(region, tokens); }
  void observe(std::span<const float> mass) override {
    if (!page_observation_) {
      seq_.observe_tokens(mass);
      return;
    }
    per_page(mass, mass_);
    seq_.observe_pages(std::span<const float>(mass_));
  }
  void observe_per_page() override { page_observation_ = true; }
  void advance_to(memdecay::step_t step) override {
    if (step > seq_.now()) seq_.advance_to(step);
  }
  [[nodiscard]] std::size_t kv_len() const override { return seq_.kv_len(); }
  [[nodiscard]] std::size_t page_size() const override { return seq_.page_size(); }
  [[nodiscard]] std::uint64_t position_of(std::size_t index) const override { return seq_.position_of(index); }
  [[nodiscard]] std::span<const memdecay::region_id> labels() const override { return seq_.state().regions(); }
  [[nodiscard]] std::uint64_t budget_high_tokens() const override {
    return seq_.get_config().budget.in_tokens(seq_.page_size(), seq_.logical_len()).high;
  }
  [[nodiscard]] plan_type select_for_budget() const override { return seq_.select_for_budget(); }
  void commit(const plan_type& plan, pool_type& table, std::uint64_t sequence) override {
    seq_.commit(plan, table, sequence);
  }
  [[nodiscard]] std::optional<page_terms> explain(std::size_t page) const override {
    if constexpr (requires { seq_.explain_page(page); }) {
      const auto x = seq_.explain_page(page);
      return page_terms{static_cast<double>(x.terms.decay), static_cast<double>(x.terms.attention)};
    } else {
      return std::nullopt;
    }
  }
  [[nodiscard]] const Sequence& sequence() const noexcept { return seq_; }

  void use_query_signal(const query_signal_options& o) override {
    if constexpr (has_digests) {
      query_ = o;
    } else {
      any_sequence::use_query_signal(o);
    }
  }
  [[nodiscard]] bool observes_queries() const override { return query_.has_value(); }
  // Digests every page that has none (the partial page again each step: it grew), averages the estimate of each
  // of the step's queries, observes it per page, and measures it against the exact attention when given.
  void observe_queries(const query_step& q) override {
    if constexpr (has_digests) {
      if (!query_) any_sequence::observe_queries(q);
      if (query_->key_norms) return observe_key_norms(q);
      digest_pages(q.page_keys, q.heads, q.head_dim);
      const std::size_t size = q.heads * q.head_dim, pages = seq_.device_pages();
      mass_.assign(pages, 0.0f);
      const std::size_t first = query_->last_query_only && q.n > 0 ? q.n - 1 : 0;
      for (std::size_t t = first; t < q.n; ++t) {
        const auto m = seq_.estimate_query_attention(q.queries.subspan(t * size, size), query_->how, q.total);
        for (std::size_t p = 0; p < pages; ++p) mass_[p] += m[p] / static_cast<float>(q.n - first);
      }
      measure(q, mass_);
      seq_.observe_pages(std::span<const float>(mass_));
    } else {
      any_sequence::observe_queries(q);
    }
  }
  [[nodiscard]] signal_error signal_error_so_far() const override { return error_; }

  void use_host_tier(const memdecay::host_tier_config& cfg) override {
    if constexpr (has_digests) {
      if (query_ && query_->key_norms)
        throw std::logic_error("the key-norm signal covers every held token: it has no host tier here");
      seq_.enable_host_tier(cfg);
    } else {
      any_sequence::use_host_tier(cfg);
    }
  }
  [[nodiscard]] bool has_host_tier() const override {
    if constexpr (has_digests) return seq_.has_host_tier();
    return false;
  }
  [[nodiscard]] std::size_t device_len() const override {
    if constexpr (has_digests) return seq_.device_len();
    return seq_.kv_len();
  }
  [[nodiscard]] bool on_device(std::size_t page) const override {
    if constexpr (has_digests) return seq_.residency(page) == memdecay::page_residency::device;
    return true;
  }
  void digest_pages(const page_keys_fn& page_keys, std::size_t heads, std::size_t head_dim) override {
    if constexpr (has_digests) {
      if (!seq_.has_digests())
        seq_.enable_digests({.kv_heads = heads,
                             .head_dim = head_dim,
                             .storage = query_ ? query_->storage : memdecay::digest_storage::f16});
      for (std::size_t p = 0; p < seq_.num_pages(); ++p)
        if (!seq_.digests().has_digest(p) && on_device(p)) {
          page_keys(seq_.has_host_tier() ? seq_.device_index(p) : p, keys_);
          seq_.set_page_keys(p, keys_);
        }
    } else {
      any_sequence::digest_pages(page_keys, heads, head_dim);
    }
  }
  [[nodiscard]] memdecay::recall_plan select_recall(std::span<const float> query,
                                                    memdecay::head_bounds over_heads) const override {
    if constexpr (has_digests)
      return seq_.select_recall(query, {}, over_heads);
    else
      return any_sequence::select_recall(query, over_heads);
  }
  [[nodiscard]] memdecay::recall_plan select_recall_for_bounds(std::span<const float> page_bounds) const override {
    if constexpr (has_digests)
      return seq_.select_recall_for_bounds(page_bounds);
    else
      return any_sequence::select_recall_for_bounds(page_bounds);
  }
  void commit(const plan_type& plan, pool_type& table, std::uint64_t sequence, host_store_type& store) override {
    if constexpr (has_digests)
      seq_.commit(plan, table, sequence, store);
    else
      any_sequence::commit(plan, table, sequence, store);
  }
  std::vector<std::int32_t> commit_recall(const memdecay::recall_plan& plan, pool_type& table,
                                          std::uint64_t sequence, host_store_type& store) override {
    if constexpr (has_digests) return seq_.commit_recall(plan, table, sequence, store).inserted;
    return any_sequence::commit_recall(plan, table, sequence, store);
  }

 private:
  // A per-token row summed per device page (page order, as the sequence's device tokens).
  void per_page(std::span<const float> per_token, std::vector<float>& out) const {
    const std::size_t P = seq_.page_size();
    if constexpr (has_digests)
      out.assign(seq_.device_pages(), 0.0f);
    else
      out.assign(seq_.num_pages(), 0.0f);
    for (std::size_t i = 0; i < per_token.size() && i / P < out.size(); ++i) out[i / P] += per_token[i];
  }
  // The total variation distance between the estimated per-page mass and the measured one.
  void measure(const query_step& q, std::span<const float> page_mass) {
    if (q.exact.empty() || !(q.total > 0)) return;
    per_page(q.exact, exact_pages_);
    double tv = 0;
    for (std::size_t p = 0; p < page_mass.size(); ++p)
      tv += std::abs(static_cast<double>(exact_pages_[p]) - static_cast<double>(page_mass[p])) / q.total;
    error_.tv_sum += tv / 2;
    ++error_.steps;
  }
  // KnormPress: each resident token's key norm (the mean over the stacked heads), computed once per position.
  void observe_key_norms(const query_step& q) {
    if constexpr (has_digests) {
      const std::size_t n = seq_.kv_len(), P = seq_.page_size();
      norms_.resize(n);
      for (std::size_t p = 0; p * P < n; ++p) {
        bool known = true;
        for (std::size_t i = p * P; i < std::min(n, (p + 1) * P); ++i)
          known = known && seq_.position_of(i) < by_position_.size() && by_position_[seq_.position_of(i)] >= 0;
        if (!known) {
          q.page_keys(p, keys_);
          for (std::size_t i = p * P; i < std::min(n, (p + 1) * P); ++i) {
            const float* k = keys_.data() + (i - p * P) * q.heads * q.head_dim;
            double mean = 0;
            for (std::size_t h = 0; h < q.heads; ++h) {
              double sq = 0;
              for (std::size_t c = 0; c < q.head_dim; ++c) sq += double{k[h * q.head_dim + c]} * k[h * q.head_dim + c];
              mean += std::sqrt(sq);
            }
            const std::uint64_t pos = seq_.position_of(i);
            if (by_position_.size() <= pos) by_position_.resize(pos + 1, -1.0f);
            by_position_[pos] = static_cast<float>(mean / static_cast<double>(q.heads));
          }
        }
        for (std::size_t i = p * P; i < std::min(n, (p + 1) * P); ++i) norms_[i] = by_position_[seq_.position_of(i)];
      }
      std::vector<float> mass(n), pages;
      memdecay::key_norm_attention<float>(norms_, q.total, std::span<float>(mass));
      per_page(mass, pages);
      measure(q, pages);
      seq_.observe_key_norms(norms_, q.total);
    }
  }

  static constexpr bool has_digests = requires(Sequence & s, std::span<const float> q) { s.observe_query(q); };
  Sequence seq_;
  std::optional<query_signal_options> query_;
  bool page_observation_ = false;                         // observe_per_page
  std::vector<float> keys_, mass_, norms_, by_position_;  // by_position_: key norm per absolute position (-1 unknown)
  std::vector<float> exact_pages_;
  signal_error error_;
};

/// `seq` behind the one interface.
template <class Sequence>
[[nodiscard]] std::unique_ptr<any_sequence> erase(Sequence seq) {
  return std::make_unique<erased_sequence<Sequence>>(std::move(seq));
}

/// What one budget check did.
struct enforced {
  std::size_t pages = 0;     ///< pages committed (evicted)
  bool selected = false;     ///< the budget was exceeded, so a plan was made
  bool over_budget = false;  ///< the plan could not reach the budget (pinned / protected pages)
  std::size_t demoted = 0;       ///< of `pages`, those that went to the host tier
  std::size_t host_dropped = 0;  ///< host pages dropped to make room for better ones
};

/// When device tokens exceed the budget's high watermark: selects, lets `inspect(plan)` see the plan before it
/// is applied, and commits it to the table and the sequence together (nothing when the plan is empty); with a
/// host store, the demoted pages' K/V go to it in the same commit.
template <class Inspect>
enforced enforce_budget(any_sequence& seq, any_sequence::pool_type& table, std::uint64_t sequence, Inspect&& inspect,
                        any_sequence::host_store_type* store = nullptr) {
  enforced out;
  if (seq.device_len() <= seq.budget_high_tokens()) return out;
  out.selected = true;
  const auto plan = seq.select_for_budget();
  out.over_budget = plan.pages_over_budget > 0;
  out.pages = plan.pages.size();
  out.demoted = plan.demoted.size();
  out.host_dropped = plan.host_dropped.size();
  inspect(plan);
  if (!plan.pages.empty() || !plan.host_dropped.empty()) {
    if (store != nullptr)
      seq.commit(plan, table, sequence, *store);
    else
      seq.commit(plan, table, sequence);
  }
  return out;
}
inline enforced enforce_budget(any_sequence& seq, any_sequence::pool_type& table, std::uint64_t sequence) {
  return enforce_budget(seq, table, sequence, [](const any_sequence::plan_type&) {});
}

/// The `wrap` of a tool whose entries are {name, description, make}, make(config) returning the policy's sequence
/// behind any_sequence.
template <class Entry>
struct erasing_wrapper {
  template <class Construct>
  Entry operator()(std::string name, std::string description, Construct construct) const {
    Entry e;
    e.name = std::move(name);
    e.description = std::move(description);
    e.make = [construct](const memdecay::config& cfg) { return erase(construct(cfg)); };
    return e;
  }
};

}  // namespace memdecay_tools

#endif  // MEMDECAY_TOOLS_COMMON_ANY_SEQUENCE_HPP
