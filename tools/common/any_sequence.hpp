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

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>

#include <memdecay/page_tables/block_pool.hpp>
#include <memdecay/core/config.hpp>
#include <memdecay/core/eviction.hpp>
#include <memdecay/core/region.hpp>
#include <memdecay/core/sequence_like.hpp>

namespace memdecay_tools {

/// A page's mean decay and attention terms (policies that explain themselves: MemDecay).
struct page_terms {
  double decay = 0;
  double attention = 0;
};

/// The calls the tools make on a sequence, whatever its policy.
class any_sequence {
 public:
  using plan_type = memdecay::eviction_plan<float>;
  using pool_type = memdecay::block_pool<std::int32_t, std::uint64_t>;

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
};

/// any_sequence over one sequence type.
template <memdecay::sequence_like Sequence>
requires std::same_as<typename Sequence::float_type, float>
class erased_sequence final : public any_sequence {
 public:
  explicit erased_sequence(Sequence seq) : seq_(std::move(seq)) {}
  void append(memdecay::region_id region, std::size_t tokens) override { seq_.append(region, tokens); }
  void observe(std::span<const float> mass) override { seq_.observe_tokens(mass); }
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

 private:
  Sequence seq_;
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
};

/// When resident tokens exceed the budget's high watermark: selects, lets `inspect(plan)` see the plan before it
/// is applied, and commits it to the table and the sequence together (nothing when the plan is empty).
template <class Inspect>
enforced enforce_budget(any_sequence& seq, any_sequence::pool_type& table, std::uint64_t sequence, Inspect&& inspect) {
  enforced out;
  if (seq.kv_len() <= seq.budget_high_tokens()) return out;
  out.selected = true;
  const auto plan = seq.select_for_budget();
  out.over_budget = plan.pages_over_budget > 0;
  out.pages = plan.pages.size();
  inspect(plan);
  if (!plan.pages.empty()) seq.commit(plan, table, sequence);
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
