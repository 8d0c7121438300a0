// SPDX-License-Identifier: Apache-2.0
// One sequence type for every policy, for the bindings (Python, C): sequence_handle is the interface,
// handle_impl<Seq, Access> implements it over memdecay::policy_sequence<Policy> (the one evictor), and
// make_sequence builds one from a policy name and its parameters. A handle owns its sequence, or refers to one a
// manager owns (looked up by id on every call, so a closed sequence is a usage_error, never a dangling reference).
#ifndef MEMDECAY_BINDINGS_COMMON_SEQUENCE_HANDLE_HPP
#define MEMDECAY_BINDINGS_COMMON_SEQUENCE_HANDLE_HPP

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <Eigen/Core>

#include <memdecay/core/executor.hpp>
#include <memdecay/core/sequence.hpp>
#include <memdecay/exports/llama_cpp.hpp>
#include <memdecay/exports/tensorrt_llm.hpp>
#include <memdecay/io/snapshot.hpp>
#include <memdecay/page_tables/block_pool.hpp>
#include <memdecay/page_tables/flashinfer_csr.hpp>
#include <memdecay/page_tables/sglang_req_to_token.hpp>
#include <memdecay/page_tables/vllm_block_table.hpp>
#include <memdecay/policies/all.hpp>

#include "policy_dispatch.hpp"
#include "policy_params.hpp"

namespace memdecay_bindings {

namespace md = memdecay;
using plan_type = md::eviction_plan<float>;
using pool_type = md::block_pool<std::int32_t, std::uint64_t>;

/// A page's score broken down (MemDecay only).
struct page_breakdown {
  std::size_t page;
  std::uint64_t first_position;
  std::size_t tokens;
  std::string status;
  double decay, attention, score;
};

class sequence_handle {
 public:
  virtual ~sequence_handle() = default;
  [[nodiscard]] virtual std::string policy() const = 0;
  [[nodiscard]] virtual const md::config& config() const = 0;
  [[nodiscard]] virtual const md::region_table& regions() const = 0;
  virtual void append(md::region_id region, std::size_t count) = 0;
  virtual void append_tokens(std::span<const md::region_id> labels) = 0;
  virtual void advance_to(md::step_t step) = 0;
  virtual std::size_t observe_tokens(std::span<const float> mass) = 0;
  virtual std::size_t observe_pages(std::span<const float> mass) = 0;
  virtual std::size_t observe_heads(const float* data, std::size_t heads, std::size_t tokens,
                                    md::head_reduction how) = 0;
  virtual std::size_t observe_rows(const md::attention_rows& rows) = 0;
  virtual std::size_t observe_key_norms(std::span<const float> norms, double total) = 0;
  [[nodiscard]] virtual plan_type select(std::size_t k, std::span<const std::size_t> caller_protected) const = 0;
  [[nodiscard]] virtual plan_type select_for_budget(std::span<const std::size_t> caller_protected) const = 0;
  [[nodiscard]] virtual std::size_t pages_wanted_by_budget() const = 0;
  /// Whether a manager owns the sequence (then its commits go through the manager).
  [[nodiscard]] virtual bool managed() const = 0;
  virtual void check_commit(const plan_type& plan) const = 0;
  virtual void commit(const plan_type& plan) = 0;
  virtual md::page_removal<std::int32_t> commit(const plan_type& plan, pool_type& table, std::uint64_t seq) = 0;
  virtual md::page_removal<std::int32_t> commit(const plan_type& plan, md::vllm_block_table& table,
                                                std::size_t row) = 0;
  virtual md::page_removal<std::int32_t> commit(const plan_type& plan, md::sglang_req_to_token& table,
                                                std::size_t row) = 0;
  virtual md::page_removal<std::int32_t> commit(const plan_type& plan, md::flashinfer_csr& table,
                                                std::size_t request) = 0;
  [[nodiscard]] virtual std::vector<float> page_scores() const = 0;
  [[nodiscard]] virtual std::vector<std::string> page_statuses(std::span<const std::size_t> prot) const = 0;
  [[nodiscard]] virtual std::optional<page_breakdown> explain_page(std::size_t page) const = 0;
  [[nodiscard]] virtual std::size_t kv_len() const = 0;
  [[nodiscard]] virtual std::size_t num_pages() const = 0;
  [[nodiscard]] virtual std::size_t page_size() const = 0;
  [[nodiscard]] virtual std::uint64_t logical_len() const = 0;
  [[nodiscard]] virtual std::uint64_t evicted_tokens() const = 0;
  [[nodiscard]] virtual md::step_t now() const = 0;
  [[nodiscard]] virtual std::uint64_t generation() const = 0;
  [[nodiscard]] virtual std::uint64_t digest() const = 0;
  // Page digests and the attention-free signal (core/sequence.hpp, digests/).
  virtual void enable_digests(const md::digest_layout& layout) = 0;
  virtual void disable_digests() = 0;
  [[nodiscard]] virtual const md::page_digests* digests() const = 0;  ///< null without digests
  virtual void set_page_digest(std::size_t page, std::span<const float> lo, std::span<const float> hi) = 0;
  virtual void set_page_mean_key(std::size_t page, std::span<const float> mean) = 0;
  virtual void set_page_keys(std::size_t page, std::span<const float> keys) = 0;
  // `threads`: 1 runs the bounds on the caller's thread; more splits the pages over a thread_pool of that many the
  // handle keeps (digests/digest_bounds_on.hpp: the same bounds bit for bit).
  virtual void query_page_bounds(std::span<const float> query, std::span<float> out, std::size_t threads) const = 0;
  virtual std::size_t observe_query(std::span<const float> query, md::query_signal how, double total,
                                    std::size_t threads) = 0;
  [[nodiscard]] virtual std::vector<float> estimate_query_attention(std::span<const float> query, md::query_signal how,
                                                                    double total, std::size_t threads) const = 0;
  // The host tier (tiers/host_tier.hpp).
  virtual void enable_host_tier(const md::host_tier_config& cfg) = 0;
  virtual void disable_host_tier() = 0;
  [[nodiscard]] virtual const md::page_residencies* host_tier() const = 0;  ///< null without a host tier
  [[nodiscard]] virtual std::size_t device_len() const = 0;
  [[nodiscard]] virtual std::size_t device_pages() const = 0;
  [[nodiscard]] virtual std::size_t device_index(std::size_t page) const = 0;
  [[nodiscard]] virtual md::recall_plan select_recall(std::span<const float> query, std::span<const std::size_t> prot,
                                                      md::head_bounds over_heads, std::size_t threads) const = 0;
  [[nodiscard]] virtual md::recall_plan select_recall_for_bounds(std::span<const float> bounds,
                                                                 std::span<const std::size_t> prot) const = 0;
  virtual void check_recall(const md::recall_plan& plan) const = 0;
  virtual void commit_recall(const md::recall_plan& plan) = 0;
  virtual md::recall_commit<std::int32_t> commit_recall(const md::recall_plan& plan, pool_type& table,
                                                        std::uint64_t seq) = 0;
  [[nodiscard]] virtual std::vector<std::uint64_t> positions() const = 0;
  [[nodiscard]] virtual std::vector<md::region_id> labels() const = 0;
  [[nodiscard]] virtual std::optional<std::uint64_t> prefix_cache_boundary() const = 0;
  [[nodiscard]] virtual md::protection_config protection() const = 0;
  [[nodiscard]] virtual std::vector<md::llama_position_range> llama_position_ranges(const plan_type& plan) const = 0;
  [[nodiscard]] virtual std::vector<md::llama_position_range> llama_evicted_ranges() const = 0;
  [[nodiscard]] virtual std::vector<md::token_range_retention> tensorrt_llm_retention(
      const md::retention_options& options) const = 0;
  /// The state snapshot (io/snapshot.hpp, docs/snapshot-format.md).
  [[nodiscard]] virtual std::vector<std::byte> save() const = 0;
  /// Restores the state from a snapshot saved with this config and these parameters (all or nothing).
  virtual void load(std::span<const std::byte> bytes) = 0;
  /// A new, unmanaged copy (its own layout and policy state).
  [[nodiscard]] virtual std::unique_ptr<sequence_handle> copy() const = 0;
};

inline const char* status_name(md::page_status s) { return md::to_string(s); }

/// sequence_handle over a policy_sequence; `Access` gives the sequence (owned, or a manager's by id).
template <class Seq, class Access>
class handle_impl final : public sequence_handle {
 public:
  explicit handle_impl(Access access) : access_(std::move(access)) {}
  [[nodiscard]] std::string policy() const override { return std::string(Seq::policy_type::name); }
  [[nodiscard]] const md::config& config() const override { return get().get_config(); }
  [[nodiscard]] const md::region_table& regions() const override { return get().regions(); }
  void append(md::region_id region, std::size_t count) override { get().append(region, count); }
  void append_tokens(std::span<const md::region_id> labels) override { get().append_tokens(labels); }
  void advance_to(md::step_t step) override { get().advance_to(step); }
  std::size_t observe_tokens(std::span<const float> mass) override { return get().observe_tokens(mass); }
  std::size_t observe_pages(std::span<const float> mass) override { return get().observe_pages(mass); }
  std::size_t observe_heads(const float* data, std::size_t heads, std::size_t tokens, md::head_reduction how) override {
    using matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    return get().observe_heads(
        Eigen::Map<const matrix>(data, static_cast<Eigen::Index>(heads), static_cast<Eigen::Index>(tokens)), how);
  }
  std::size_t observe_rows(const md::attention_rows& rows) override { return get().observe_rows(rows); }
  std::size_t observe_key_norms(std::span<const float> norms, double total) override {
    return get().observe_key_norms(norms, total);
  }
  [[nodiscard]] plan_type select(std::size_t k, std::span<const std::size_t> prot) const override {
    return get().select(k, prot);
  }
  [[nodiscard]] plan_type select_for_budget(std::span<const std::size_t> prot) const override {
    return get().select_for_budget(prot);
  }
  [[nodiscard]] std::size_t pages_wanted_by_budget() const override { return get().pages_wanted_by_budget(); }
  [[nodiscard]] bool managed() const override { return get().managed(); }
  void check_commit(const plan_type& plan) const override { get().check_commit(plan); }
  void commit(const plan_type& plan) override { get().commit(plan); }
  md::page_removal<std::int32_t> commit(const plan_type& plan, pool_type& table, std::uint64_t seq) override {
    return get().commit(plan, table, seq);
  }
  md::page_removal<std::int32_t> commit(const plan_type& plan, md::vllm_block_table& table, std::size_t row) override {
    return get().commit(plan, table, row);
  }
  md::page_removal<std::int32_t> commit(const plan_type& plan, md::sglang_req_to_token& table,
                                        std::size_t row) override {
    return get().commit(plan, table, row);
  }
  md::page_removal<std::int32_t> commit(const plan_type& plan, md::flashinfer_csr& table,
                                        std::size_t request) override {
    return get().commit(plan, table, request);
  }
  [[nodiscard]] std::vector<float> page_scores() const override { return get().page_scores(); }
  [[nodiscard]] std::vector<std::string> page_statuses(std::span<const std::size_t> prot) const override {
    std::vector<std::string> out;
    for (auto s : get().page_statuses(prot)) out.emplace_back(status_name(s));
    return out;
  }
  [[nodiscard]] std::optional<page_breakdown> explain_page(std::size_t page) const override {
    if constexpr (requires(const Seq& s) { s.explain_page(page); }) {
      const auto e = get().explain_page(page);
      return page_breakdown{e.page,
                            e.first_position,
                            e.tokens,
                            status_name(e.status),
                            static_cast<double>(e.terms.decay),
                            static_cast<double>(e.terms.attention),
                            static_cast<double>(e.terms.decay + e.terms.attention)};
    } else {
      (void)page;
      return std::nullopt;
    }
  }
  [[nodiscard]] std::size_t kv_len() const override { return get().kv_len(); }
  [[nodiscard]] std::size_t num_pages() const override { return get().num_pages(); }
  [[nodiscard]] std::size_t page_size() const override { return get().page_size(); }
  [[nodiscard]] std::uint64_t logical_len() const override { return get().logical_len(); }
  [[nodiscard]] std::uint64_t evicted_tokens() const override { return get().evicted_tokens(); }
  [[nodiscard]] md::step_t now() const override { return get().now(); }
  [[nodiscard]] std::uint64_t generation() const override { return get().generation(); }
  [[nodiscard]] std::uint64_t digest() const override { return get().digest(); }
  void enable_digests(const md::digest_layout& layout) override { get().enable_digests(layout); }
  void disable_digests() override { get().disable_digests(); }
  [[nodiscard]] const md::page_digests* digests() const override {
    return get().has_digests() ? &get().digests() : nullptr;
  }
  void set_page_digest(std::size_t page, std::span<const float> lo, std::span<const float> hi) override {
    get().set_page_digest(page, lo, hi);
  }
  void set_page_mean_key(std::size_t page, std::span<const float> mean) override {
    get().set_page_mean_key(page, mean);
  }
  void set_page_keys(std::size_t page, std::span<const float> keys) override { get().set_page_keys(page, keys); }
  void query_page_bounds(std::span<const float> query, std::span<float> out, std::size_t threads) const override {
    on_threads(threads, [&](auto& exec) { get().query_page_bounds(query, out, exec); });
  }
  std::size_t observe_query(std::span<const float> query, md::query_signal how, double total,
                            std::size_t threads) override {
    return on_threads(threads, [&](auto& exec) { return get().observe_query(query, how, total, exec); });
  }
  [[nodiscard]] std::vector<float> estimate_query_attention(std::span<const float> query, md::query_signal how,
                                                            double total, std::size_t threads) const override {
    return on_threads(threads, [&](auto& exec) { return get().estimate_query_attention(query, how, total, exec); });
  }
  void enable_host_tier(const md::host_tier_config& cfg) override { get().enable_host_tier(cfg); }
  void disable_host_tier() override { get().disable_host_tier(); }
  [[nodiscard]] const md::page_residencies* host_tier() const override {
    return get().has_host_tier() ? &get().host_tier() : nullptr;
  }
  [[nodiscard]] std::size_t device_len() const override { return get().device_len(); }
  [[nodiscard]] std::size_t device_pages() const override { return get().device_pages(); }
  [[nodiscard]] std::size_t device_index(std::size_t page) const override { return get().device_index(page); }
  [[nodiscard]] md::recall_plan select_recall(std::span<const float> query, std::span<const std::size_t> prot,
                                              md::head_bounds over_heads, std::size_t threads) const override {
    return on_threads(threads, [&](auto& exec) { return get().select_recall(query, prot, over_heads, exec); });
  }
  [[nodiscard]] md::recall_plan select_recall_for_bounds(std::span<const float> bounds,
                                                         std::span<const std::size_t> prot) const override {
    return get().select_recall_for_bounds(bounds, prot);
  }
  void check_recall(const md::recall_plan& plan) const override { get().check_recall(plan); }
  void commit_recall(const md::recall_plan& plan) override { get().commit_recall(plan); }
  md::recall_commit<std::int32_t> commit_recall(const md::recall_plan& plan, pool_type& table,
                                                std::uint64_t seq) override {
    return get().commit_recall(plan, table, seq);
  }
  [[nodiscard]] std::vector<std::uint64_t> positions() const override { return get().positions(); }
  [[nodiscard]] std::vector<md::region_id> labels() const override {
    const auto l = get().state().regions();
    return {l.begin(), l.end()};
  }
  [[nodiscard]] std::optional<std::uint64_t> prefix_cache_boundary() const override {
    return get().prefix_cache_boundary();
  }
  [[nodiscard]] md::protection_config protection() const override { return get().protection(); }
  [[nodiscard]] std::vector<md::llama_position_range> llama_position_ranges(const plan_type& plan) const override {
    return md::llama_position_ranges(get(), plan);
  }
  [[nodiscard]] std::vector<md::llama_position_range> llama_evicted_ranges() const override {
    return md::llama_evicted_ranges(get());
  }
  [[nodiscard]] std::vector<md::token_range_retention> tensorrt_llm_retention(
      const md::retention_options& options) const override {
    return md::tensorrt_llm_retention(get(), options);
  }
  [[nodiscard]] std::vector<std::byte> save() const override { return md::snapshot::save(get()); }
  void load(std::span<const std::byte> bytes) override { md::snapshot::load(get(), bytes); }
  [[nodiscard]] std::unique_ptr<sequence_handle> copy() const override;

  Seq& get() const { return access_(); }

 private:
  // Runs f(executor): inline for threads <= 1, else on the handle's pool of `threads`, one call at a time (const
  // calls may come from several Python threads at once; a thread_pool takes one call at a time).
  template <class F>
  decltype(auto) on_threads(std::size_t threads, F&& f) const {
    if (threads <= 1) {
      md::inline_executor exec;
      return f(exec);
    }
    std::lock_guard lock(pool_mutex_);
    if (!pool_ || pool_->size() != threads) {
      pool_.reset();
      pool_ = std::make_unique<md::thread_pool>(threads);
    }
    return f(*pool_);
  }

  Access access_;
  mutable std::mutex pool_mutex_;
  mutable std::unique_ptr<md::thread_pool> pool_;
};

/// Owns its sequence.
template <class Seq>
struct owned {
  std::shared_ptr<Seq> seq;
  Seq& operator()() const { return *seq; }
};

template <class Seq, class Access>
std::unique_ptr<sequence_handle> handle_impl<Seq, Access>::copy() const {
  return std::make_unique<handle_impl<Seq, owned<Seq>>>(owned<Seq>{std::make_shared<Seq>(get())});
}

/// A new sequence of `policy` (config_error for an unknown policy or parameter).
inline std::unique_ptr<sequence_handle> make_sequence(const std::string& policy, const md::config& cfg,
                                                      param_source& params) {
  return with_policy(policy, [&]<template <class> class P>() -> std::unique_ptr<sequence_handle> {
    using S = seq_of<P>;
    auto seq = std::make_shared<S>(cfg, params_from<P>(params));
    return std::make_unique<handle_impl<S, owned<S>>>(owned<S>{std::move(seq)});
  });
}

}  // namespace memdecay_bindings

#endif  // MEMDECAY_BINDINGS_COMMON_SEQUENCE_HANDLE_HPP
