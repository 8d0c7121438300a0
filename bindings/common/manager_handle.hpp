// SPDX-License-Identifier: Apache-2.0
// One manager type for every policy, for the bindings (Python, C): manager_handle is the interface, manager_impl<P>
// implements it over memdecay::basic_manager<policy_sequence<P>>. The sequences it hands out refer to the manager's
// by id (a closed one is a usage_error on its next call). A table indexed by batch row takes an id_map from the
// manager's id to the row; the block pool is keyed by the manager's ids.
#ifndef MEMDECAY_BINDINGS_COMMON_MANAGER_HANDLE_HPP
#define MEMDECAY_BINDINGS_COMMON_MANAGER_HANDLE_HPP

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <memdecay/core/executor.hpp>
#include <memdecay/core/manager.hpp>
#include <memdecay/io/manager_snapshot.hpp>

#include "sequence_handle.hpp"

namespace memdecay_bindings {

using global_plan = md::global_eviction_plan<float, std::uint64_t>;
using id_map = std::function<std::size_t(std::uint64_t)>;
using removals = std::map<std::uint64_t, md::page_removal<std::int32_t>>;
/// For a manager load: sequence `id`'s config, and its policy parameters read from `params` (called once per
/// sequence of the chain's full records, before anything changes).
using configure_fn = std::function<md::config(std::uint64_t id, const std::function<void(param_source&)>& params)>;

class manager_handle {
 public:
  virtual ~manager_handle() = default;
  [[nodiscard]] virtual std::string policy() const = 0;
  virtual std::shared_ptr<sequence_handle> open(std::uint64_t id, const md::config& cfg, param_source& params) = 0;
  virtual std::shared_ptr<sequence_handle> fork(std::uint64_t parent, std::uint64_t child, pool_type* pool) = 0;
  virtual void close(std::uint64_t id) = 0;
  [[nodiscard]] virtual std::shared_ptr<sequence_handle> at(std::uint64_t id) = 0;
  [[nodiscard]] virtual bool contains(std::uint64_t id) const = 0;
  [[nodiscard]] virtual std::vector<std::uint64_t> ids() const = 0;
  virtual void advance_to(md::step_t step) = 0;
  /// The batch step on `threads` threads (core/executor.hpp): 1 is the caller's thread; more, a thread_pool the
  /// handle keeps (made again when the count changes). The same result for every count.
  virtual void advance_to(md::step_t step, std::size_t threads) = 0;
  virtual std::vector<std::size_t> observe_batch(std::span<const std::uint64_t> ids,
                                                 std::span<const std::span<const float>> masses,
                                                 std::size_t threads) = 0;
  virtual std::vector<std::size_t> observe_batch_rows(std::span<const std::uint64_t> ids,
                                                      std::span<const md::attention_rows> rows,
                                                      std::size_t threads) = 0;
  [[nodiscard]] virtual global_plan select_global(std::size_t pages_to_free, std::size_t threads) = 0;
  [[nodiscard]] virtual md::step_t now() const = 0;
  virtual void protect_pages(std::uint64_t id, std::span<const std::size_t> pages) = 0;
  virtual void protect_tail_tokens(std::uint64_t id, std::size_t tokens) = 0;
  virtual void clear_protections() = 0;
  [[nodiscard]] virtual std::vector<std::size_t> protected_pages(std::uint64_t id) const = 0;
  virtual void set_shared(std::uint64_t id, std::span<const std::size_t> pages, bool shared) = 0;
  [[nodiscard]] virtual std::vector<std::size_t> shared_pages(std::uint64_t id) const = 0;
  virtual void mark_shared_from(const pool_type& table) = 0;
  virtual void mark_shared_from(const md::vllm_block_table& table, const id_map& map) = 0;
  virtual void mark_shared_from(const md::flashinfer_csr& table, const id_map& map) = 0;
  [[nodiscard]] virtual std::size_t resident_pages() const = 0;
  [[nodiscard]] virtual std::size_t reclaimable_pages() const = 0;
  [[nodiscard]] virtual std::size_t physical_pages() const = 0;
  [[nodiscard]] virtual std::size_t host_pages() const = 0;
  /// `threads` > 1 splits the page bounds over the handle's pool (the same plan).
  [[nodiscard]] virtual md::recall_plan select_recall(std::uint64_t id, std::span<const float> query,
                                                      md::head_bounds over_heads, std::size_t threads) const = 0;
  [[nodiscard]] virtual md::recall_plan select_recall_for_bounds(std::uint64_t id,
                                                                 std::span<const float> bounds) const = 0;
  virtual void check_recall(std::uint64_t id, const md::recall_plan& plan) const = 0;
  virtual void commit_recall(std::uint64_t id, const md::recall_plan& plan) = 0;
  virtual md::recall_commit<std::int32_t> commit_recall(std::uint64_t id, const md::recall_plan& plan,
                                                        pool_type& table) = 0;
  [[nodiscard]] virtual std::optional<std::uint64_t> prefix_cache_boundary(std::uint64_t id) const = 0;
  [[nodiscard]] virtual std::uint64_t prefix_cacheable_tokens(std::uint64_t id) const = 0;
  [[nodiscard]] virtual global_plan select_global(std::size_t pages_to_free) const = 0;
  virtual void check_commit(const global_plan& plan) const = 0;
  virtual void commit(const global_plan& plan) = 0;
  virtual removals commit(const global_plan& plan, pool_type& table) = 0;
  virtual removals commit(const global_plan& plan, md::vllm_block_table& table, const id_map& map) = 0;
  virtual removals commit(const global_plan& plan, md::sglang_req_to_token& table, const id_map& map) = 0;
  virtual removals commit(const global_plan& plan, md::flashinfer_csr& table, const id_map& map) = 0;
  [[nodiscard]] virtual std::uint64_t digest() const = 0;
  /// io/manager_snapshot.hpp: full with `since` null or empty, else incremental (and `since` is updated); into
  /// `out`, whose capacity is reused.
  virtual void save(md::snapshot::checkpoint* since, std::vector<std::byte>& out) const = 0;
  /// Replaces the manager's contents with a chain's (all or nothing).
  virtual void load(std::span<const std::span<const std::byte>> chain, const configure_fn& configure) = 0;
};

template <class Seq>
struct managed {
  std::shared_ptr<md::basic_manager<Seq>> mgr;
  std::uint64_t id;
  Seq& operator()() const { return mgr->at(id); }
};

template <template <class> class P>
class manager_impl final : public manager_handle {
 public:
  using Seq = seq_of<P>;
  using Mgr = md::basic_manager<Seq>;
  explicit manager_impl(md::manager_config cfg) : mgr_(std::make_shared<Mgr>(cfg)) {}
  [[nodiscard]] std::string policy() const override { return std::string(P<float>::name); }
  std::shared_ptr<sequence_handle> open(std::uint64_t id, const md::config& cfg, param_source& params) override {
    mgr_->open(id, cfg, params_from<P>(params));
    return handle(id);
  }
  std::shared_ptr<sequence_handle> fork(std::uint64_t parent, std::uint64_t child, pool_type* pool) override {
    if (pool)
      mgr_->fork(parent, child, *pool, md::identity_id{});
    else
      mgr_->fork(parent, child);
    return handle(child);
  }
  void close(std::uint64_t id) override { mgr_->close(id); }
  [[nodiscard]] std::shared_ptr<sequence_handle> at(std::uint64_t id) override {
    (void)mgr_->at(id);  // usage_error if it is not open
    return handle(id);
  }
  [[nodiscard]] bool contains(std::uint64_t id) const override { return mgr_->contains(id); }
  [[nodiscard]] std::vector<std::uint64_t> ids() const override { return mgr_->ids(); }
  void advance_to(md::step_t step) override { mgr_->advance_to(step); }
  void advance_to(md::step_t step, std::size_t threads) override {
    if (threads <= 1) return mgr_->advance_to(step);
    mgr_->advance_to(step, pool(threads));
  }
  std::vector<std::size_t> observe_batch(std::span<const std::uint64_t> ids,
                                         std::span<const std::span<const float>> masses,
                                         std::size_t threads) override {
    std::vector<typename Mgr::observation> batch;
    batch.reserve(ids.size());
    for (std::size_t i = 0; i < ids.size(); ++i) batch.push_back({ids[i], masses[i]});
    if (threads <= 1) return mgr_->observe_batch(std::span<const typename Mgr::observation>(batch));
    return mgr_->observe_batch(std::span<const typename Mgr::observation>(batch), pool(threads));
  }
  std::vector<std::size_t> observe_batch_rows(std::span<const std::uint64_t> ids,
                                              std::span<const md::attention_rows> rows,
                                              std::size_t threads) override {
    std::vector<typename Mgr::rows_observation> batch;
    batch.reserve(ids.size());
    for (std::size_t i = 0; i < ids.size(); ++i) batch.push_back({ids[i], rows[i]});
    const std::span<const typename Mgr::rows_observation> all(batch);
    if (threads <= 1) return mgr_->observe_batch(all);
    return mgr_->observe_batch(all, pool(threads));
  }
  [[nodiscard]] global_plan select_global(std::size_t pages_to_free, std::size_t threads) override {
    if (threads <= 1) return mgr_->select_global(pages_to_free);
    return mgr_->select_global(pages_to_free, pool(threads));
  }
  [[nodiscard]] md::step_t now() const override { return mgr_->now(); }
  void protect_pages(std::uint64_t id, std::span<const std::size_t> pages) override { mgr_->protect_pages(id, pages); }
  void protect_tail_tokens(std::uint64_t id, std::size_t tokens) override { mgr_->protect_tail_tokens(id, tokens); }
  void clear_protections() override { mgr_->clear_protections(); }
  [[nodiscard]] std::vector<std::size_t> protected_pages(std::uint64_t id) const override {
    return mgr_->protected_pages(id);
  }
  void set_shared(std::uint64_t id, std::span<const std::size_t> pages, bool shared) override {
    mgr_->set_shared(id, pages, shared);
  }
  [[nodiscard]] std::vector<std::size_t> shared_pages(std::uint64_t id) const override {
    return mgr_->shared_pages(id);
  }
  void mark_shared_from(const pool_type& table) override { mgr_->mark_shared_from(table, md::identity_id{}); }
  void mark_shared_from(const md::vllm_block_table& table, const id_map& map) override {
    mgr_->mark_shared_from(table, map);
  }
  void mark_shared_from(const md::flashinfer_csr& table, const id_map& map) override {
    mgr_->mark_shared_from(table, map);
  }
  [[nodiscard]] std::size_t resident_pages() const override { return mgr_->resident_pages(); }
  [[nodiscard]] std::size_t reclaimable_pages() const override { return mgr_->reclaimable_pages(); }
  [[nodiscard]] std::size_t physical_pages() const override { return mgr_->physical_pages(); }
  [[nodiscard]] std::size_t host_pages() const override { return mgr_->host_pages(); }
  [[nodiscard]] md::recall_plan select_recall(std::uint64_t id, std::span<const float> query,
                                              md::head_bounds over_heads, std::size_t threads) const override {
    if (threads <= 1) return mgr_->select_recall(id, query, over_heads);
    // A const call: several Python threads may make one at once, and a thread_pool takes one call at a time.
    std::lock_guard lock(const_pool_mutex_);
    return mgr_->select_recall(id, query, over_heads, pool(threads));
  }
  [[nodiscard]] md::recall_plan select_recall_for_bounds(std::uint64_t id,
                                                         std::span<const float> bounds) const override {
    return mgr_->select_recall_for_bounds(id, bounds);
  }
  void check_recall(std::uint64_t id, const md::recall_plan& plan) const override { mgr_->check_recall(id, plan); }
  void commit_recall(std::uint64_t id, const md::recall_plan& plan) override { mgr_->commit_recall(id, plan); }
  md::recall_commit<std::int32_t> commit_recall(std::uint64_t id, const md::recall_plan& plan,
                                                pool_type& table) override {
    return mgr_->commit_recall(id, plan, table, md::identity_id{});
  }
  [[nodiscard]] std::optional<std::uint64_t> prefix_cache_boundary(std::uint64_t id) const override {
    return mgr_->prefix_cache_boundary(id);
  }
  [[nodiscard]] std::uint64_t prefix_cacheable_tokens(std::uint64_t id) const override {
    return mgr_->prefix_cacheable_tokens(id);
  }
  [[nodiscard]] global_plan select_global(std::size_t pages_to_free) const override {
    return mgr_->select_global(pages_to_free);
  }
  void check_commit(const global_plan& plan) const override { mgr_->check_commit(plan); }
  void commit(const global_plan& plan) override { mgr_->commit(plan); }
  removals commit(const global_plan& plan, pool_type& table) override {
    return mgr_->commit(plan, table, md::identity_id{});
  }
  removals commit(const global_plan& plan, md::vllm_block_table& table, const id_map& map) override {
    return mgr_->commit(plan, table, map);
  }
  removals commit(const global_plan& plan, md::sglang_req_to_token& table, const id_map& map) override {
    return mgr_->commit(plan, table, map);
  }
  removals commit(const global_plan& plan, md::flashinfer_csr& table, const id_map& map) override {
    return mgr_->commit(plan, table, map);
  }
  [[nodiscard]] std::uint64_t digest() const override { return mgr_->digest(); }
  void save(md::snapshot::checkpoint* since, std::vector<std::byte>& out) const override {
    if (since) {
      md::snapshot::save(*mgr_, *since, out);
    } else {
      md::snapshot::checkpoint full;
      md::snapshot::save(*mgr_, full, out);
    }
  }
  void load(std::span<const std::span<const std::byte>> chain, const configure_fn& configure) override {
    using params_type = typename Seq::params_type;
    md::snapshot::load(*mgr_, chain, [&](std::uint64_t id) {
      params_type params{};
      md::config cfg = configure(id, [&](param_source& source) { params = params_from<P>(source); });
      return std::pair<md::config, params_type>(std::move(cfg), params);
    });
  }

 private:
  md::thread_pool& pool(std::size_t threads) const {
    if (!pool_ || pool_->size() != threads) {
      pool_.reset();
      pool_ = std::make_unique<md::thread_pool>(threads);
    }
    return *pool_;
  }
  std::shared_ptr<sequence_handle> handle(std::uint64_t id) {
    return std::make_shared<handle_impl<Seq, managed<Seq>>>(managed<Seq>{mgr_, id});
  }
  std::shared_ptr<Mgr> mgr_;
  mutable std::unique_ptr<md::thread_pool> pool_;  // the batch step's and, under the mutex, const calls'
  mutable std::mutex const_pool_mutex_;
};

}  // namespace memdecay_bindings

#endif  // MEMDECAY_BINDINGS_COMMON_MANAGER_HANDLE_HPP
