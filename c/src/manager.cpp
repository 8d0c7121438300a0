// SPDX-License-Identifier: Apache-2.0
// memdecay_manager (many sequences of one policy) and global plans.
#include <limits>
#include <map>

#include "handles.hpp"
#include "text_params.hpp"

namespace memdecay_c {
namespace {

std::string* error_of(const memdecay_manager* m) { return m ? &const_cast<memdecay_manager*>(m)->error : nullptr; }

template <class Fn>
memdecay_status on_manager(const memdecay_manager* m, Fn&& fn) {
  return guarded(error_of(m), [&] { fn(*require(m, "manager")->handle); });
}

const global_plan& plan_of(const memdecay_global_plan* p) { return require(p, "plan")->plan; }

memdecay_victim_reason reason_of(md::eviction_reason r) {
  switch (r) {
    case md::eviction_reason::sequence_budget: return MEMDECAY_VICTIM_SEQUENCE_BUDGET;
    case md::eviction_reason::global_budget: return MEMDECAY_VICTIM_GLOBAL_BUDGET;
    case md::eviction_reason::requested: return MEMDECAY_VICTIM_REQUESTED;
  }
  return MEMDECAY_VICTIM_REQUESTED;
}

// The explicit map from the manager's ids to the table's rows: usage_error for an id it does not name.
memdecay_bindings::id_map rows_of(const uint64_t* ids, const uint64_t* rows, std::size_t count) {
  if (count == 0 && !ids && !rows) return [](std::uint64_t id) { return static_cast<std::size_t>(id); };
  std::map<std::uint64_t, std::size_t> map;
  const auto i = array_of(ids, count, "ids");
  const auto r = array_of(rows, count, "rows");
  for (std::size_t k = 0; k < count; ++k)
    if (!map.emplace(i[k], static_cast<std::size_t>(r[k])).second)
      throw md::usage_error("ids[" + std::to_string(k) + "] = " + std::to_string(i[k]) + " is given twice");
  return [map = std::move(map)](std::uint64_t id) {
    auto it = map.find(id);
    if (it == map.end()) throw md::usage_error("the row map has no row for sequence " + std::to_string(id));
    return it->second;
  };
}

}  // namespace
}  // namespace memdecay_c

using namespace memdecay_c;

extern "C" {

memdecay_status memdecay_manager_create(const char* policy, size_t page_size, size_t global_high, size_t global_low,
                                        memdecay_manager** out) {
  return memdecay_manager_create_with_host_pool(policy, page_size, global_high, global_low,
                                                std::numeric_limits<size_t>::max(), out);
}

memdecay_status memdecay_manager_create_with_host_pool(const char* policy, size_t page_size, size_t global_high,
                                                       size_t global_low, size_t host_pool, memdecay_manager** out) {
  return memdecay_manager_create_with_scorer_rule(policy, page_size, global_high, global_low, host_pool, 0, 0.75, out);
}

memdecay_status memdecay_manager_create_with_scorer_rule(const char* policy, size_t page_size, size_t global_high,
                                                         size_t global_low, size_t host_pool,
                                                         uint64_t polynomial_above_tokens, double back_below,
                                                         memdecay_manager** out) {
  return guarded(nullptr, [&] {
    require(out, "out");
    md::manager_config cfg{.page_size = page_size,
                           .host_pool = host_pool,
                           .scorer = {.polynomial_above_tokens = polynomial_above_tokens, .back_below = back_below}};
    if (global_high) cfg.global = md::global_budget::pages(global_high, global_low);
    cfg.global.validate();
    auto handle = memdecay_bindings::with_policy(require(policy, "policy"),
                                                 [&]<template <class> class P>() -> std::shared_ptr<manager_handle> {
                                                   return std::make_shared<memdecay_bindings::manager_impl<P>>(cfg);
                                                 });
    *out = new memdecay_manager{std::move(handle), {}, {}};
  });
}

void memdecay_manager_destroy(memdecay_manager* manager) { delete manager; }

const char* memdecay_manager_last_error(const memdecay_manager* manager) {
  return manager ? manager->error.c_str() : "";
}

memdecay_status memdecay_manager_open(memdecay_manager* manager, uint64_t id, const memdecay_config* config,
                                      const char* params, memdecay_sequence** out) {
  return on_manager(manager, [&](manager_handle& m) {
    text_params source(params);
    const md::config& cfg = require(config, "config")->config;
    // The handle is allocated before the sequence opens, so that nothing can fail once it is open.
    std::unique_ptr<memdecay_sequence> handle;
    if (out) handle.reset(new memdecay_sequence{nullptr, m.policy(), {}});
    auto seq = m.open(id, cfg, source);
    if (handle) {
      handle->handle = std::move(seq);
      *out = handle.release();
    }
  });
}

memdecay_status memdecay_manager_sequence(memdecay_manager* manager, uint64_t id, memdecay_sequence** out) {
  return on_manager(manager, [&](manager_handle& m) {
    require(out, "out");
    *out = wrap_sequence(m.at(id));
  });
}

memdecay_status memdecay_manager_fork(memdecay_manager* manager, uint64_t parent, uint64_t child,
                                      memdecay_table* pool) {
  return on_manager(manager, [&](manager_handle& m) {
    pool_type* p = nullptr;
    if (pool) {
      p = std::get_if<pool_type>(&pool->table);
      if (!p) raise(MEMDECAY_INVALID_ARGUMENT, "pool: fork takes the owning block pool (or NULL), not a view");
    }
    (void)m.fork(parent, child, p);
  });
}

memdecay_status memdecay_manager_close(memdecay_manager* manager, uint64_t id) {
  return on_manager(manager, [&](manager_handle& m) { m.close(id); });
}

memdecay_status memdecay_manager_advance_to(memdecay_manager* manager, uint32_t step) {
  return on_manager(manager, [&](manager_handle& m) { m.advance_to(step, manager->threads); });
}

memdecay_status memdecay_manager_set_threads(memdecay_manager* manager, size_t threads) {
  return on_manager(manager, [&](manager_handle&) { manager->threads = thread_count(threads); });
}

memdecay_status memdecay_manager_get_threads(const memdecay_manager* manager, size_t* threads) {
  return on_manager(manager, [&](manager_handle&) { *require(threads, "threads") = manager->threads; });
}

memdecay_status memdecay_manager_protect_pages(memdecay_manager* manager, uint64_t id, const size_t* pages,
                                               size_t count) {
  return on_manager(manager, [&](manager_handle& m) { m.protect_pages(id, array_of(pages, count, "pages")); });
}

memdecay_status memdecay_manager_protect_tail_tokens(memdecay_manager* manager, uint64_t id, size_t tokens) {
  return on_manager(manager, [&](manager_handle& m) { m.protect_tail_tokens(id, tokens); });
}

memdecay_status memdecay_manager_clear_protections(memdecay_manager* manager) {
  return on_manager(manager, [&](manager_handle& m) { m.clear_protections(); });
}

memdecay_status memdecay_manager_set_shared(memdecay_manager* manager, uint64_t id, const size_t* pages, size_t count,
                                            int shared) {
  return on_manager(manager,
                    [&](manager_handle& m) { m.set_shared(id, array_of(pages, count, "pages"), shared != 0); });
}

memdecay_status memdecay_manager_get_info(const memdecay_manager* manager, memdecay_manager_info* info) {
  return on_manager(manager, [&](manager_handle& m) {
    *require(info, "info") = memdecay_manager_info{
        m.ids().size(), m.resident_pages(), m.reclaimable_pages(), m.physical_pages(), m.now(), m.digest()};
  });
}

memdecay_status memdecay_manager_ids(const memdecay_manager* manager, uint64_t* ids, size_t capacity, size_t* count) {
  return on_manager(manager, [&](manager_handle& m) {
    const auto all = m.ids();
    copy_out(std::vector<uint64_t>(all.begin(), all.end()), ids, capacity, count, "ids");
  });
}

memdecay_status memdecay_manager_host_pages(const memdecay_manager* manager, size_t* pages) {
  return on_manager(manager, [&](manager_handle& m) { *require(pages, "pages") = m.host_pages(); });
}

memdecay_status memdecay_manager_select_recall(const memdecay_manager* manager, uint64_t id, const float* query,
                                               size_t query_count, memdecay_recall_plan** out) {
  return memdecay_manager_select_recall_over_heads(manager, id, query, query_count, MEMDECAY_RECALL_BEST_HEAD, out);
}

memdecay_status memdecay_manager_select_recall_over_heads(const memdecay_manager* manager, uint64_t id,
                                                          const float* query, size_t query_count,
                                                          memdecay_recall_heads heads, memdecay_recall_plan** out) {
  return on_manager(manager, [&](manager_handle& m) {
    require(out, "out");
    *out = new memdecay_recall_plan{
        m.select_recall(id, array_of(query, query_count, "query"), head_bounds_of(heads), manager->threads)};
  });
}

memdecay_status memdecay_manager_select_recall_for_bounds(const memdecay_manager* manager, uint64_t id,
                                                          const float* bounds, size_t count,
                                                          memdecay_recall_plan** out) {
  return on_manager(manager, [&](manager_handle& m) {
    require(out, "out");
    *out = new memdecay_recall_plan{m.select_recall_for_bounds(id, array_of(bounds, count, "bounds"))};
  });
}

memdecay_status memdecay_manager_commit_recall(memdecay_manager* manager, uint64_t id,
                                               const memdecay_recall_plan* plan) {
  return on_manager(manager, [&](manager_handle& m) { m.commit_recall(id, require(plan, "plan")->plan); });
}

memdecay_status memdecay_manager_select_global(const memdecay_manager* manager, size_t pages_to_free,
                                               memdecay_global_plan** out) {
  return on_manager(manager, [&](manager_handle& m) {
    require(out, "out");
    auto* p = new memdecay_global_plan{m.select_global(pages_to_free, manager->threads), {}};
    try {
      p->victims.reserve(p->plan.victims.size());
      for (const auto& v : p->plan.victims)
        p->victims.push_back({v.sequence, v.page, v.score, v.shared ? 1 : 0, reason_of(v.reason)});
    } catch (...) {
      delete p;
      throw;
    }
    *out = p;
  });
}

memdecay_status memdecay_manager_commit(memdecay_manager* manager, const memdecay_global_plan* plan) {
  return on_manager(manager, [&](manager_handle& m) { m.commit(plan_of(plan)); });
}

memdecay_status memdecay_manager_commit_with(memdecay_manager* manager, const memdecay_global_plan* plan,
                                             memdecay_remove_sequence_pages_fn remove, void* user_data) {
  return on_manager(manager, [&](manager_handle& m) {
    const global_plan& p = plan_of(plan);
    require(remove, "remove");
    m.check_commit(p);
    std::vector<std::uint64_t> sequences;
    std::vector<std::size_t> pages;
    for (const auto& [id, seq_plan] : p.plans) {
      sequences.insert(sequences.end(), seq_plan.pages.size(), id);
      pages.insert(pages.end(), seq_plan.pages.begin(), seq_plan.pages.end());
    }
    check_engine_answer(remove(user_data, sequences.data(), pages.data(), pages.size()));
    m.commit(p);  // usage_error (stale) if the callback changed a sequence
  });
}

memdecay_status memdecay_manager_commit_to_table(memdecay_manager* manager, const memdecay_global_plan* plan,
                                                 memdecay_table* table, const uint64_t* ids, const uint64_t* rows,
                                                 size_t num_rows, uint64_t* removal_ids, memdecay_removal** removals,
                                                 size_t capacity, size_t* count) {
  return on_manager(manager, [&](manager_handle& m) {
    const global_plan& p = plan_of(plan);
    memdecay_table& t = *require(table, "table");
    if ((removal_ids == nullptr) != (removals == nullptr))
      raise(MEMDECAY_INVALID_ARGUMENT, "removal_ids and removals: give both or neither");
    if (removals && capacity < p.plans.size())
      raise(MEMDECAY_BUFFER_TOO_SMALL, "removals: capacity " + std::to_string(capacity) + ", " +
                                           std::to_string(p.plans.size()) + " needed (checked before committing)");
    const bool identity = num_rows == 0 && !ids && !rows;
    auto map = rows_of(ids, rows, num_rows);
    // The removals are allocated first, so that nothing can fail after the commit.
    std::vector<std::unique_ptr<memdecay_removal>> made(removals ? p.plans.size() : 0);
    for (auto& r : made) r = std::make_unique<memdecay_removal>();
    auto done = with_table(t, [&](auto& tab) {
      using T = std::decay_t<decltype(tab)>;
      if constexpr (std::is_same_v<T, pool_type>) {
        if (!identity)
          raise(MEMDECAY_INVALID_ARGUMENT, "ids/rows: the block pool is keyed by the manager's ids (pass NULL, 0)");
        return m.commit(p, tab);
      } else {
        return m.commit(p, tab, map);
      }
    });
    if (count) *count = done.size();
    if (!removals) return;
    std::size_t k = 0;
    for (auto& [id, r] : done) {
      removal_ids[k] = id;
      made[k]->removal = std::move(r);
      removals[k] = made[k].release();
      ++k;
    }
  });
}

memdecay_global_plan_view memdecay_global_plan_get(const memdecay_global_plan* plan) {
  if (!plan) return memdecay_global_plan_view{};
  return {plan->victims.data(), plan->victims.size(), plan->plan.pages_freed, plan->plan.pages_short,
          plan->plan.digest()};
}

void memdecay_global_plan_destroy(memdecay_global_plan* plan) { delete plan; }

}  // extern "C"

extern "C" {

memdecay_status memdecay_checkpoint_create(memdecay_checkpoint** out) {
  return guarded(nullptr, [&] { *require(out, "out") = new memdecay_checkpoint{}; });
}

void memdecay_checkpoint_destroy(memdecay_checkpoint* checkpoint) { delete checkpoint; }

void memdecay_checkpoint_reset(memdecay_checkpoint* checkpoint) {
  if (checkpoint) checkpoint->checkpoint.reset();
}

memdecay_status memdecay_manager_save(memdecay_manager* manager, memdecay_checkpoint* checkpoint, const uint8_t** bytes,
                                      size_t* count) {
  return on_manager(manager, [&](manager_handle& m) {
    require(bytes, "bytes");
    require(count, "count");
    m.save(checkpoint ? &checkpoint->checkpoint : nullptr, manager->snapshot);
    *bytes = reinterpret_cast<const uint8_t*>(manager->snapshot.data());
    *count = manager->snapshot.size();
  });
}

memdecay_status memdecay_manager_load(memdecay_manager* manager, const uint8_t* const* snapshots, const size_t* lengths,
                                      size_t num_snapshots, memdecay_configure_fn configure, void* user_data) {
  return on_manager(manager, [&](manager_handle& m) {
    const auto data = array_of(snapshots, num_snapshots, "snapshots");
    const auto sizes = array_of(lengths, num_snapshots, "lengths");
    require(configure, "configure");
    std::vector<std::span<const std::byte>> chain;
    chain.reserve(num_snapshots);
    for (std::size_t k = 0; k < num_snapshots; ++k)
      chain.push_back(std::as_bytes(array_of(data[k], sizes[k], "snapshots[k]")));
    m.load(chain, [&](std::uint64_t id, const std::function<void(memdecay_bindings::param_source&)>& params) {
      const memdecay_config* cfg = nullptr;
      const char* text = nullptr;
      const int rc = configure(user_data, id, &cfg, &text);
      if (rc != 0)
        raise(MEMDECAY_CALLBACK_ERROR, "load: the engine's configure callback returned " + std::to_string(rc) +
                                           " for sequence " + std::to_string(id) + "; nothing was loaded");
      if (!cfg)
        raise(MEMDECAY_INVALID_ARGUMENT,
              "load: the configure callback gave no config for sequence " + std::to_string(id));
      text_params source(text);
      params(source);
      return cfg->config;
    });
  });
}

}  // extern "C"
