// SPDX-License-Identifier: Apache-2.0
// memdecay_sequence (any policy, owned or a manager's), plans, and the llama.cpp and TensorRT-LLM exports.
#include <memdecay/digests/query_channels.hpp>
#include <Eigen/Core>

#include "handles.hpp"
#include "text_params.hpp"

namespace memdecay_c {
namespace {

std::string* error_of(const memdecay_sequence* s) { return s ? &const_cast<memdecay_sequence*>(s)->error : nullptr; }

sequence_handle& handle_of(const memdecay_sequence* s) { return *require(s, "sequence")->handle; }

const plan_type& plan_of(const memdecay_plan* p) { return require(p, "plan")->plan; }

// Runs fn(handle) with the sequence's errors recorded on it.
template <class Fn>
memdecay_status on_sequence(const memdecay_sequence* s, Fn&& fn) {
  return guarded(error_of(s), [&] { fn(handle_of(s)); });
}

void set_if(std::size_t* out, std::size_t value) {
  if (out) *out = value;
}

void emit_plan(memdecay_plan** out, plan_type plan) {
  require(out, "out");
  *out = new memdecay_plan{std::move(plan)};
}

md::host_tier_config host_tier_config_from(const memdecay_host_tier_config& c) {
  md::host_tier_config t{
      .min_host_priority = c.min_host_priority, .hysteresis = c.hysteresis, .min_device_steps = c.min_device_steps};
  switch (c.host_budget_unit) {
    case MEMDECAY_BUDGET_UNLIMITED: break;
    case MEMDECAY_BUDGET_TOKENS: t.host_budget = md::budget_config::tokens(c.host_budget); break;
    case MEMDECAY_BUDGET_PAGES: t.host_budget = md::budget_config::pages(c.host_budget); break;
    case MEMDECAY_BUDGET_RATIO: t.host_budget = md::budget_config::ratio(c.host_budget); break;
    default:
      throw md::config_error("invalid config: host_tier.host_budget_unit = " +
                             std::to_string(static_cast<int>(c.host_budget_unit)));
  }
  if (c.max_recall_pages != 0) t.max_recall_pages = c.max_recall_pages;
  return t;
}

md::query_signal signal_of(memdecay_query_signal signal) {
  if (signal != MEMDECAY_SIGNAL_BOUND_SOFTMAX && signal != MEMDECAY_SIGNAL_BOUND_SOFTMAX_TOKENS)
    raise(MEMDECAY_INVALID_ARGUMENT, "signal = " + std::to_string(static_cast<int>(signal)) +
                                         " (MEMDECAY_SIGNAL_BOUND_SOFTMAX or _BOUND_SOFTMAX_TOKENS)");
  return static_cast<md::query_signal>(signal);
}

}  // namespace

memdecay_sequence* wrap_sequence(std::shared_ptr<sequence_handle> handle) {
  auto policy = handle->policy();
  return new memdecay_sequence{std::move(handle), std::move(policy), {}};
}

}  // namespace memdecay_c

using namespace memdecay_c;

extern "C" {

memdecay_status memdecay_sequence_create(const memdecay_config* config, const char* policy, const char* params,
                                         memdecay_sequence** out) {
  return guarded(nullptr, [&] {
    require(out, "out");
    text_params source(params);
    auto handle =
        memdecay_bindings::make_sequence(require(policy, "policy"), require(config, "config")->config, source);
    *out = wrap_sequence(std::move(handle));
  });
}

memdecay_status memdecay_sequence_copy(const memdecay_sequence* sequence, memdecay_sequence** out) {
  return guarded(nullptr, [&] {
    require(out, "out");
    *out = wrap_sequence(handle_of(sequence).copy());
    (*out)->threads = sequence->threads;
  });
}

void memdecay_sequence_destroy(memdecay_sequence* sequence) { delete sequence; }

const char* memdecay_sequence_last_error(const memdecay_sequence* sequence) {
  return sequence ? sequence->error.c_str() : "";
}

const char* memdecay_sequence_policy(const memdecay_sequence* sequence) {
  return sequence ? sequence->policy.c_str() : "";
}

memdecay_status memdecay_sequence_append(memdecay_sequence* sequence, uint8_t region, size_t count) {
  return on_sequence(sequence, [&](sequence_handle& s) { s.append(region, count); });
}

memdecay_status memdecay_sequence_append_tokens(memdecay_sequence* sequence, const uint8_t* labels, size_t count) {
  return on_sequence(sequence, [&](sequence_handle& s) { s.append_tokens(array_of(labels, count, "labels")); });
}

memdecay_status memdecay_sequence_advance_to(memdecay_sequence* sequence, uint32_t step) {
  return on_sequence(sequence, [&](sequence_handle& s) { s.advance_to(step); });
}

memdecay_status memdecay_sequence_observe_tokens(memdecay_sequence* sequence, const float* mass, size_t count,
                                                 size_t* refreshed) {
  return on_sequence(sequence,
                     [&](sequence_handle& s) { set_if(refreshed, s.observe_tokens(array_of(mass, count, "mass"))); });
}

memdecay_status memdecay_sequence_observe_pages(memdecay_sequence* sequence, const float* mass, size_t count,
                                                size_t* refreshed) {
  return on_sequence(sequence,
                     [&](sequence_handle& s) { set_if(refreshed, s.observe_pages(array_of(mass, count, "mass"))); });
}

memdecay_status memdecay_sequence_enable_digests(memdecay_sequence* sequence, size_t kv_heads, size_t head_dim,
                                                 size_t query_heads, memdecay_digest_kind kind,
                                                 memdecay_digest_storage storage, double scale) {
  return on_sequence(sequence, [&](sequence_handle& s) {
    if (kind != MEMDECAY_DIGEST_MIN_MAX && kind != MEMDECAY_DIGEST_MEAN_KEY)
      raise(MEMDECAY_INVALID_ARGUMENT, "kind = " + std::to_string(static_cast<int>(kind)) +
                                           " (MEMDECAY_DIGEST_MIN_MAX or MEMDECAY_DIGEST_MEAN_KEY)");
    if (storage != MEMDECAY_DIGEST_F32 && storage != MEMDECAY_DIGEST_F16 && storage != MEMDECAY_DIGEST_BF16)
      raise(MEMDECAY_INVALID_ARGUMENT,
            "storage = " + std::to_string(static_cast<int>(storage)) + " (MEMDECAY_DIGEST_F32, _F16 or _BF16)");
    s.enable_digests({.kv_heads = kv_heads,
                      .head_dim = head_dim,
                      .query_heads = query_heads,
                      .kind = static_cast<md::digest_kind>(kind),
                      .storage = static_cast<md::digest_storage>(storage),
                      .scale = scale});
  });
}

memdecay_status memdecay_sequence_set_page_digest(memdecay_sequence* sequence, size_t page, const float* lo,
                                                  const float* hi, size_t count) {
  return on_sequence(sequence, [&](sequence_handle& s) {
    s.set_page_digest(page, array_of(lo, count, "lo"), array_of(hi, count, "hi"));
  });
}

memdecay_status memdecay_sequence_set_page_mean_key(memdecay_sequence* sequence, size_t page, const float* mean,
                                                    size_t count) {
  return on_sequence(sequence, [&](sequence_handle& s) { s.set_page_mean_key(page, array_of(mean, count, "mean")); });
}

memdecay_status memdecay_sequence_observe_key_norms(memdecay_sequence* sequence, const float* norms, size_t count,
                                                    double total, size_t* refreshed) {
  return on_sequence(sequence, [&](sequence_handle& s) {
    set_if(refreshed, s.observe_key_norms(array_of(norms, count, "norms"), total));
  });
}

memdecay_status memdecay_sequence_set_page_keys(memdecay_sequence* sequence, size_t page, const float* keys,
                                                size_t count) {
  return on_sequence(sequence, [&](sequence_handle& s) { s.set_page_keys(page, array_of(keys, count, "keys")); });
}

memdecay_status memdecay_sequence_page_bounds(const memdecay_sequence* sequence, const float* query, size_t query_count,
                                              float* out, size_t out_count) {
  return on_sequence(sequence, [&](sequence_handle& s) {
    array_of(out, out_count, "out");
    s.query_page_bounds(array_of(query, query_count, "query"), {out, out_count}, sequence->threads);
  });
}

memdecay_status memdecay_sequence_set_threads(memdecay_sequence* sequence, size_t threads) {
  return on_sequence(sequence, [&](sequence_handle&) { sequence->threads = thread_count(threads); });
}

memdecay_status memdecay_sequence_get_threads(const memdecay_sequence* sequence, size_t* threads) {
  return on_sequence(sequence, [&](sequence_handle&) { *require(threads, "threads") = sequence->threads; });
}

memdecay_status memdecay_sequence_observe_query(memdecay_sequence* sequence, const float* query, size_t query_count,
                                                memdecay_query_signal signal, double total, size_t* refreshed) {
  return on_sequence(sequence, [&](sequence_handle& s) {
    const auto how = signal_of(signal);
    set_if(refreshed, s.observe_query(array_of(query, query_count, "query"), how, total, sequence->threads));
  });
}

memdecay_status memdecay_sequence_estimate_query_attention(const memdecay_sequence* sequence, const float* query,
                                                           size_t query_count, memdecay_query_signal signal,
                                                           double total, float* mass, size_t capacity,
                                                           size_t* count) {
  return on_sequence(sequence, [&](sequence_handle& s) {
    const auto how = signal_of(signal);
    require(count, "count");
    copy_out(s.estimate_query_attention(array_of(query, query_count, "query"), how, total, sequence->threads), mass,
             capacity, count, "mass");
  });
}

memdecay_status memdecay_sequence_observe_heads(memdecay_sequence* sequence, const float* mass, size_t heads,
                                                size_t tokens, memdecay_head_reduction how, size_t* refreshed) {
  return on_sequence(sequence, [&](sequence_handle& s) {
    std::size_t n = 0;
    if (__builtin_mul_overflow(heads, tokens, &n)) throw md::input_error("mass: heads x tokens overflows size_t");
    array_of(mass, n, "mass");
    if (how != MEMDECAY_HEADS_SUM && how != MEMDECAY_HEADS_MEAN)
      raise(MEMDECAY_INVALID_ARGUMENT,
            "how = " + std::to_string(static_cast<int>(how)) + " (MEMDECAY_HEADS_SUM or MEMDECAY_HEADS_MEAN)");
    const auto r = how == MEMDECAY_HEADS_SUM ? md::head_reduction::sum : md::head_reduction::mean;
    set_if(refreshed, s.observe_heads(mass, heads, tokens, r));
  });
}

memdecay_status memdecay_sequence_observe_rows(memdecay_sequence* sequence, const void* data, size_t elements,
                                               memdecay_mass_format format, size_t rows, size_t tokens,
                                               size_t stride, memdecay_head_reduction how, size_t* refreshed) {
  return on_sequence(sequence, [&](sequence_handle& s) {
    if (data == nullptr && elements > 0) raise(MEMDECAY_INVALID_ARGUMENT, "data is NULL with elements > 0");
    if (how != MEMDECAY_HEADS_SUM && how != MEMDECAY_HEADS_MEAN)
      raise(MEMDECAY_INVALID_ARGUMENT,
            "how = " + std::to_string(static_cast<int>(how)) + " (MEMDECAY_HEADS_SUM or MEMDECAY_HEADS_MEAN)");
    const auto r = how == MEMDECAY_HEADS_SUM ? md::head_reduction::sum : md::head_reduction::mean;
    switch (format) {
      case MEMDECAY_MASS_F32:
        set_if(refreshed, s.observe_rows(md::attention_rows(
                              std::span<const float>(static_cast<const float*>(data), elements), rows, tokens, stride, r)));
        return;
      case MEMDECAY_MASS_F16:
      case MEMDECAY_MASS_BF16:
        set_if(refreshed,
               s.observe_rows(md::attention_rows(
                   std::span<const std::uint16_t>(static_cast<const std::uint16_t*>(data), elements),
                   format == MEMDECAY_MASS_F16 ? md::half_format::f16 : md::half_format::bf16, rows, tokens, stride, r)));
        return;
      default:
        raise(MEMDECAY_INVALID_ARGUMENT, "format = " + std::to_string(static_cast<int>(format)) +
                                             " (MEMDECAY_MASS_F32, MEMDECAY_MASS_F16 or MEMDECAY_MASS_BF16)");
    }
  });
}

memdecay_status memdecay_sequence_select(const memdecay_sequence* sequence, size_t k, const size_t* protect,
                                         size_t num_protect, memdecay_plan** out) {
  return on_sequence(sequence, [&](sequence_handle& s) {
    require(out, "out");
    emit_plan(out, s.select(k, array_of(protect, num_protect, "protect")));
  });
}

memdecay_status memdecay_sequence_select_for_budget(const memdecay_sequence* sequence, const size_t* protect,
                                                    size_t num_protect, memdecay_plan** out) {
  return on_sequence(sequence, [&](sequence_handle& s) {
    require(out, "out");
    emit_plan(out, s.select_for_budget(array_of(protect, num_protect, "protect")));
  });
}

memdecay_status memdecay_sequence_plan_pages(const memdecay_sequence* sequence, const size_t* pages, size_t count,
                                             memdecay_plan** out) {
  return on_sequence(sequence, [&](sequence_handle& s) {
    require(out, "out");
    const auto victims = array_of(pages, count, "pages");
    plan_type plan;
    plan.page_size = s.page_size();
    plan.generation = s.generation();
    plan.requested = count;
    const auto scores = s.page_scores();
    for (std::size_t k = 0; k < victims.size(); ++k) {
      if (victims[k] >= scores.size())
        throw md::usage_error("pages[" + std::to_string(k) + "] = " + std::to_string(victims[k]) +
                              ": the sequence has " + std::to_string(scores.size()) + " pages");
      plan.pages.push_back(victims[k]);
      plan.scores.push_back(scores[victims[k]]);
    }
    s.check_commit(plan);  // ascending, evictable: rejected here rather than at the commit
    emit_plan(out, std::move(plan));
  });
}

memdecay_status memdecay_sequence_pages_wanted_by_budget(const memdecay_sequence* sequence, size_t* pages) {
  return on_sequence(sequence, [&](sequence_handle& s) { *require(pages, "pages") = s.pages_wanted_by_budget(); });
}

memdecay_status memdecay_sequence_commit(memdecay_sequence* sequence, const memdecay_plan* plan) {
  return on_sequence(sequence, [&](sequence_handle& s) { s.commit(plan_of(plan)); });
}

memdecay_status memdecay_sequence_commit_with(memdecay_sequence* sequence, const memdecay_plan* plan,
                                              memdecay_remove_pages_fn remove, void* user_data) {
  return on_sequence(sequence, [&](sequence_handle& s) {
    const plan_type& p = plan_of(plan);
    require(remove, "remove");
    if (s.managed())
      throw md::usage_error("commit: this sequence is owned by a manager; commit through memdecay_manager_commit*");
    s.check_commit(p);
    check_engine_answer(remove(user_data, p.pages.data(), p.pages.size()));
    s.commit(p);  // usage_error (stale) if the callback changed the sequence
  });
}

memdecay_status memdecay_sequence_commit_to_table(memdecay_sequence* sequence, const memdecay_plan* plan,
                                                  memdecay_table* table, uint64_t row, memdecay_removal** removal) {
  return on_sequence(sequence, [&](sequence_handle& s) {
    const plan_type& p = plan_of(plan);
    // The removal is allocated first, so that nothing can fail after the commit.
    std::unique_ptr<memdecay_removal> out;
    if (removal) out = std::make_unique<memdecay_removal>();
    auto done = with_table(*require(table, "table"), [&](auto& t) {
      using T = std::decay_t<decltype(t)>;
      return s.commit(p, t, static_cast<typename T::sequence_id>(row));
    });
    if (out) {
      out->removal = std::move(done);
      *removal = out.release();
    }
  });
}

memdecay_status memdecay_sequence_get_info(const memdecay_sequence* sequence, memdecay_sequence_info* info) {
  return on_sequence(sequence, [&](sequence_handle& s) {
    memdecay_sequence_info& i = *require(info, "info");
    const auto boundary = s.prefix_cache_boundary();
    i = memdecay_sequence_info{s.kv_len(), s.num_pages(),  s.page_size(), s.logical_len(),  s.evicted_tokens(),
                               s.now(),    s.generation(), s.digest(),    boundary ? 1 : 0, boundary.value_or(0)};
  });
}

memdecay_status memdecay_sequence_page_scores(const memdecay_sequence* sequence, float* scores, size_t capacity,
                                              size_t* count) {
  return on_sequence(sequence,
                     [&](sequence_handle& s) { copy_out(s.page_scores(), scores, capacity, count, "scores"); });
}

memdecay_status memdecay_sequence_positions(const memdecay_sequence* sequence, uint64_t* positions, size_t capacity,
                                            size_t* count) {
  return on_sequence(sequence,
                     [&](sequence_handle& s) { copy_out(s.positions(), positions, capacity, count, "positions"); });
}

memdecay_status memdecay_sequence_labels(const memdecay_sequence* sequence, uint8_t* labels, size_t capacity,
                                         size_t* count) {
  return on_sequence(sequence, [&](sequence_handle& s) { copy_out(s.labels(), labels, capacity, count, "labels"); });
}

memdecay_status memdecay_sequence_region_id(const memdecay_sequence* sequence, const char* name, uint8_t* id) {
  return on_sequence(sequence,
                     [&](sequence_handle& s) { *require(id, "id") = s.regions().id_of(require(name, "name")); });
}

memdecay_status memdecay_sequence_save(const memdecay_sequence* sequence, uint8_t* bytes, size_t capacity,
                                       size_t* count) {
  return on_sequence(sequence, [&](sequence_handle& s) {
    copy_out(s.save(), bytes, capacity, count, "bytes", [](std::byte b) { return static_cast<uint8_t>(b); });
  });
}

memdecay_status memdecay_sequence_load(memdecay_sequence* sequence, const uint8_t* bytes, size_t count) {
  return on_sequence(sequence, [&](sequence_handle& s) {
    const auto in = array_of(bytes, count, "bytes");
    s.load(std::as_bytes(in));
  });
}

memdecay_plan_view memdecay_plan_get(const memdecay_plan* plan) {
  if (!plan) return memdecay_plan_view{};
  const plan_type& p = plan->plan;
  return {p.pages.data(), p.scores.data(), p.pages.size(), p.requested, p.pages_over_budget, p.page_size, p.generation};
}

memdecay_plan_tier_view memdecay_plan_get_tier(const memdecay_plan* plan) {
  if (!plan) return memdecay_plan_tier_view{};
  const plan_type& p = plan->plan;
  return {p.demoted.data(), p.demoted.size(), p.host_dropped.data(), p.host_dropped.size()};
}

memdecay_host_tier_config memdecay_host_tier_config_default(void) {
  const md::host_tier_config d;
  return {MEMDECAY_BUDGET_UNLIMITED, 0.0, d.min_host_priority, d.hysteresis, d.min_device_steps, 0};
}

memdecay_status memdecay_sequence_enable_host_tier(memdecay_sequence* sequence,
                                                   const memdecay_host_tier_config* config) {
  return memdecay_sequence_enable_host_tier_displacing(sequence, config, 0);
}

memdecay_status memdecay_sequence_enable_host_tier_displacing(memdecay_sequence* sequence,
                                                              const memdecay_host_tier_config* config,
                                                              size_t displace_lowest) {
  return on_sequence(sequence, [&](sequence_handle& s) {
    md::host_tier_config t = host_tier_config_from(*require(config, "config"));
    t.displace_lowest = displace_lowest;
    s.enable_host_tier(t);
  });
}

memdecay_status memdecay_sequence_disable_host_tier(memdecay_sequence* sequence) {
  return on_sequence(sequence, [&](sequence_handle& s) { s.disable_host_tier(); });
}

memdecay_status memdecay_sequence_get_tier_info(const memdecay_sequence* sequence, memdecay_tier_info* info) {
  return on_sequence(sequence, [&](sequence_handle& s) {
    const auto* t = s.host_tier();
    *require(info, "info") = memdecay_tier_info{t ? 1 : 0, s.device_len(), s.device_pages(), t ? t->host_pages() : 0};
  });
}

memdecay_status memdecay_sequence_on_host(const memdecay_sequence* sequence, uint8_t* flags, size_t capacity,
                                          size_t* count) {
  return on_sequence(sequence, [&](sequence_handle& s) {
    std::vector<std::uint8_t> out(s.num_pages(), 0);
    if (const auto* t = s.host_tier()) out.assign(t->host_flags().begin(), t->host_flags().end());
    copy_out(out, flags, capacity, count, "flags");
  });
}

memdecay_status memdecay_sequence_device_index(const memdecay_sequence* sequence, size_t page, size_t* index) {
  return on_sequence(sequence, [&](sequence_handle& s) { *require(index, "index") = s.device_index(page); });
}

memdecay_status memdecay_sequence_select_recall(const memdecay_sequence* sequence, const float* query,
                                                size_t query_count, const size_t* protect, size_t num_protect,
                                                memdecay_recall_plan** out) {
  return memdecay_sequence_select_recall_over_heads(sequence, query, query_count, protect, num_protect,
                                                    MEMDECAY_RECALL_BEST_HEAD, out);
}

memdecay_status memdecay_keep_largest_query_channels(float* query, size_t query_count, size_t head_dim,
                                                    size_t channels) {
  return guarded(nullptr, [&] {
    if (query_count) require(query, "query");
    md::keep_largest_query_channels(std::span<float>(query, query_count), head_dim, channels);
  });
}

memdecay_status memdecay_sequence_select_recall_over_heads(const memdecay_sequence* sequence, const float* query,
                                                           size_t query_count, const size_t* protect,
                                                           size_t num_protect, memdecay_recall_heads heads,
                                                           memdecay_recall_plan** out) {
  return on_sequence(sequence, [&](sequence_handle& s) {
    require(out, "out");
    auto plan = s.select_recall(array_of(query, query_count, "query"), array_of(protect, num_protect, "protect"),
                                head_bounds_of(heads), sequence->threads);
    *out = new memdecay_recall_plan{std::move(plan)};
  });
}

memdecay_status memdecay_sequence_select_recall_for_bounds(const memdecay_sequence* sequence, const float* bounds,
                                                           size_t count, const size_t* protect, size_t num_protect,
                                                           memdecay_recall_plan** out) {
  return on_sequence(sequence, [&](sequence_handle& s) {
    require(out, "out");
    auto plan =
        s.select_recall_for_bounds(array_of(bounds, count, "bounds"), array_of(protect, num_protect, "protect"));
    *out = new memdecay_recall_plan{std::move(plan)};
  });
}

memdecay_status memdecay_sequence_commit_recall(memdecay_sequence* sequence, const memdecay_recall_plan* plan) {
  return on_sequence(sequence, [&](sequence_handle& s) { s.commit_recall(require(plan, "plan")->plan); });
}

memdecay_status memdecay_sequence_commit_recall_to_pool(memdecay_sequence* sequence, const memdecay_recall_plan* plan,
                                                       memdecay_table* pool, uint64_t row, int32_t* inserted,
                                                       size_t capacity, size_t* num_inserted,
                                                       memdecay_removal** removal) {
  return on_sequence(sequence, [&](sequence_handle& s) {
    const md::recall_plan& p = require(plan, "plan")->plan;
    auto* blocks = std::get_if<pool_type>(&require(pool, "pool")->table);
    if (blocks == nullptr)
      raise(MEMDECAY_INVALID_ARGUMENT, "pool: a block pool is needed (the table that can insert the promoted pages)");
    if (p.promote.size() > 0 && inserted == nullptr)
      raise(MEMDECAY_INVALID_ARGUMENT, "inserted is NULL for " + std::to_string(p.promote.size()) + " promotions");
    if (capacity < p.promote.size())
      raise(MEMDECAY_BUFFER_TOO_SMALL, "inserted: " + std::to_string(p.promote.size()) + " needed, capacity " +
                                           std::to_string(capacity));
    // Everything that can fail for lack of memory comes before the commit.
    std::unique_ptr<memdecay_removal> out;
    if (removal) out = std::make_unique<memdecay_removal>();
    auto done = s.commit_recall(p, *blocks, row);
    std::copy(done.inserted.begin(), done.inserted.end(), inserted);
    if (num_inserted) *num_inserted = done.inserted.size();
    if (out) {
      out->removal = std::move(done.removed);
      *removal = out.release();
    }
  });
}

memdecay_recall_plan_view memdecay_recall_plan_get(const memdecay_recall_plan* plan) {
  if (!plan) return memdecay_recall_plan_view{};
  const md::recall_plan& p = plan->plan;
  return {p.promote.data(), p.promote_bounds.data(), p.promote.size(), p.demote.data(), p.demote.size(),
          p.drop.data(),    p.drop.size(),           p.page_size,      p.generation};
}

void memdecay_recall_plan_destroy(memdecay_recall_plan* plan) { delete plan; }

void memdecay_plan_destroy(memdecay_plan* plan) { delete plan; }

memdecay_status memdecay_llama_position_ranges(const memdecay_sequence* sequence, const memdecay_plan* plan,
                                               memdecay_llama_range* ranges, size_t capacity, size_t* count) {
  return on_sequence(sequence, [&](sequence_handle& s) {
    copy_out(s.llama_position_ranges(plan_of(plan)), ranges, capacity, count, "ranges",
             [](const md::llama_position_range& r) {
               return memdecay_llama_range{r.p0, r.p1};
             });
  });
}

memdecay_status memdecay_llama_evicted_ranges(const memdecay_sequence* sequence, memdecay_llama_range* ranges,
                                              size_t capacity, size_t* count) {
  return on_sequence(sequence, [&](sequence_handle& s) {
    copy_out(s.llama_evicted_ranges(), ranges, capacity, count, "ranges", [](const md::llama_position_range& r) {
      return memdecay_llama_range{r.p0, r.p1};
    });
  });
}

memdecay_status memdecay_tensorrt_llm_retention(const memdecay_sequence* sequence, double milliseconds_per_step,
                                                memdecay_token_range_retention* entries, size_t capacity,
                                                size_t* count) {
  return on_sequence(sequence, [&](sequence_handle& s) {
    md::retention_options options{milliseconds_per_step};
    options.validate();
    copy_out(s.tensorrt_llm_retention(options), entries, capacity, count, "entries",
             [](const md::token_range_retention& r) {
               return memdecay_token_range_retention{r.token_start, r.token_end, r.priority, r.duration_ms ? 1 : 0,
                                                     r.duration_ms.value_or(0)};
             });
  });
}

}  // extern "C"
