/* SPDX-License-Identifier: Apache-2.0 */
/*
 * memdecay's C ABI: the library for engines that build as C or C++17 (llama.cpp, OpenVINO GenAI, engine plug-ins).
 * C99, opaque handles, no exceptions across the boundary. Link memdecay::memdecay_c (CMake) or `pkg-config
 * memdecay_c`; docs/c-api.md is the guide.
 *
 * The rules, the same as the C++ API's:
 *  - Every call returns a memdecay_status. On an error nothing changed (all or nothing) and the message, which names
 *    the field, is kept twice: per handle (memdecay_sequence_last_error(seq), ...) and per thread
 *    (memdecay_last_error(), the only place for a create call that failed, and for plans and removals).
 *  - Handles are not thread-safe: one thread at a time per handle (different handles on different threads are fine).
 *  - Sizes are size_t, positions and ids uint64_t, attention float (the score type).
 *  - Arrays out: the caller passes a buffer and its capacity; *count is always set to the length needed. A NULL
 *    buffer only asks for the length (MEMDECAY_OK); a buffer that is too short gets MEMDECAY_BUFFER_TOO_SMALL.
 *  - Page tables edit the engine's own arrays in place; the arrays must outlive the table handle.
 *
 *   memdecay_config* cfg; memdecay_sequence* seq; memdecay_plan* plan;
 *   memdecay_config_create(&cfg);
 *   memdecay_config_set_budget(cfg, MEMDECAY_BUDGET_TOKENS, 4096, 3584);
 *   memdecay_sequence_create(cfg, "memdecay", NULL, &seq);
 *   memdecay_sequence_append(seq, MEMDECAY_REGION_SYSTEM, 512);       // label spans as they are prefilled
 *   memdecay_sequence_observe_tokens(seq, mass, kv_len, NULL);         // per step, attention per resident token
 *   memdecay_sequence_select_for_budget(seq, NULL, 0, &plan);          // phase 1: changes nothing
 *   memdecay_sequence_commit_to_table(seq, plan, table, row, NULL);    // phase 2: the table and the state together
 */
#ifndef MEMDECAY_C_MEMDECAY_H
#define MEMDECAY_C_MEMDECAY_H

#include <stddef.h>
#include <stdint.h>

/* Bumped on any incompatible change of this header; memdecay_abi_version() is the library's. */
#define MEMDECAY_C_ABI_VERSION 1

#if defined(_WIN32)
#define MEMDECAY_C_API __declspec(dllimport)
#elif defined(__GNUC__)
#define MEMDECAY_C_API __attribute__((visibility("default")))
#else
#define MEMDECAY_C_API
#endif
#ifdef MEMDECAY_C_BUILDING
#undef MEMDECAY_C_API
#if defined(_WIN32)
#define MEMDECAY_C_API __declspec(dllexport)
#else
#define MEMDECAY_C_API __attribute__((visibility("default")))
#endif
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status, version ------------------------------------------------------------------------------------------ */

typedef enum memdecay_status {
  MEMDECAY_OK = 0,
  MEMDECAY_CONFIG_ERROR = 1,     /* an invalid configuration, policy or policy parameter */
  MEMDECAY_INPUT_ERROR = 2,      /* bad data: a wrong length, NaN or negative attention, an unknown region... */
  MEMDECAY_USAGE_ERROR = 3,      /* a call out of order: a stale plan, a closed sequence, an inconsistent table */
  MEMDECAY_BUFFER_TOO_SMALL = 4, /* an output buffer is shorter than *count */
  MEMDECAY_CALLBACK_ERROR = 5,   /* the engine's callback returned non-zero: nothing was committed */
  MEMDECAY_INVALID_ARGUMENT = 6, /* a NULL handle or pointer where one is required */
  MEMDECAY_OUT_OF_MEMORY = 7,
  MEMDECAY_INTERNAL_ERROR = 8,
  MEMDECAY_STATUS_MAX_ENUM = 0x7fffffff /* every enum spans int: any value a C caller passes is representable */
} memdecay_status;

MEMDECAY_C_API uint32_t memdecay_abi_version(void);
/* The library's version, "major.minor.patch". */
MEMDECAY_C_API const char* memdecay_version(void);
/* "ok", "config_error", ... (a static string). */
MEMDECAY_C_API const char* memdecay_status_name(memdecay_status status);
/* The message of this thread's last failed call ("" if none); valid until this thread's next failed call. */
MEMDECAY_C_API const char* memdecay_last_error(void);

/* The default region ids (the paper's seven regions; system is pinned). */
enum {
  MEMDECAY_REGION_SYSTEM = 0,
  MEMDECAY_REGION_PLAN = 1,
  MEMDECAY_REGION_USER = 2,
  MEMDECAY_REGION_TOOL_IN = 3,
  MEMDECAY_REGION_TOOL_OUT = 4,
  MEMDECAY_REGION_RETRIEVAL = 5,
  MEMDECAY_REGION_SCRATCHPAD = 6
};

/* ---- configuration ------------------------------------------------------------------------------------------- */

typedef struct memdecay_config memdecay_config;

typedef enum memdecay_budget_unit {
  MEMDECAY_BUDGET_UNLIMITED = 0,
  MEMDECAY_BUDGET_TOKENS = 1,
  MEMDECAY_BUDGET_PAGES = 2,
  MEMDECAY_BUDGET_RATIO = 3, /* of every token ever appended */
  MEMDECAY_BUDGET_MAX_ENUM = 0x7fffffff
} memdecay_budget_unit;

/* One region of a region table. decay_rate is lambda_r per step (ln 2 / half-life). */
typedef struct memdecay_region {
  const char* name;
  double base_priority;
  double decay_rate;
  int pinned;
} memdecay_region;

/* A change to one region by name, on top of the table; a field applies only when its has_ flag is non-zero. */
typedef struct memdecay_region_override {
  int has_base_priority;
  double base_priority;
  int has_decay_rate;
  double decay_rate;
  int has_half_life;
  double half_life;
  int has_pinned;
  int pinned;
} memdecay_region_override;

/* A config with the library's defaults (alpha 1, EWMA beta 0.9, tau 0.01, page size 16, the default regions). */
MEMDECAY_C_API memdecay_status memdecay_config_create(memdecay_config** out);
MEMDECAY_C_API memdecay_status memdecay_config_copy(const memdecay_config* config, memdecay_config** out);
MEMDECAY_C_API void memdecay_config_destroy(memdecay_config* config);
MEMDECAY_C_API const char* memdecay_config_last_error(const memdecay_config* config);
/*
 * Every setter validates the config it would leave and changes nothing when that is invalid.
 * Numeric fields: "alpha", "ewma_beta", "ewma_half_life" (NaN: unset), "tau", "page_size",
 * "protection.sink_pages", "protection.recent_tokens", "protection.recent_fraction".
 */
MEMDECAY_C_API memdecay_status memdecay_config_set_number(memdecay_config* config, const char* field, double value);
/* Text fields: "normalization" = "none", "uniform", "lifetime" or "zscore". */
MEMDECAY_C_API memdecay_status memdecay_config_set_text(memdecay_config* config, const char* field, const char* value);
/* Watermarks high >= low in `unit` (low NaN: equal to high); evicting starts above high and stops at low. */
MEMDECAY_C_API memdecay_status memdecay_config_set_budget(memdecay_config* config, memdecay_budget_unit unit,
                                                          double high, double low);
/* Replaces the region table (ids 0..count-1 in order); region overrides given before still apply by name. */
MEMDECAY_C_API memdecay_status memdecay_config_set_regions(memdecay_config* config, const memdecay_region* regions,
                                                           size_t count);
MEMDECAY_C_API memdecay_status memdecay_config_override_region(memdecay_config* config, const char* region,
                                                               const memdecay_region_override* change);
/* Applies a calibration file (memdecay-calibrate's JSON): normalisation, alpha, tau and region overrides. */
MEMDECAY_C_API memdecay_status memdecay_config_apply_calibration(memdecay_config* config, const char* path);
MEMDECAY_C_API memdecay_status memdecay_config_get_number(const memdecay_config* config, const char* field,
                                                          double* value);
/* The id of a region of the effective table, by name. */
MEMDECAY_C_API memdecay_status memdecay_config_region_id(const memdecay_config* config, const char* name, uint8_t* id);

/* ---- page tables ---------------------------------------------------------------------------------------------- */

/*
 * A page table memdecay edits on commit: the owning block pool (block ids int32, sequences by uint64 id), or a
 * view over the engine's arrays (edited in place). A "row" is the view's batch row or the pool's sequence id.
 */
typedef struct memdecay_table memdecay_table;

MEMDECAY_C_API memdecay_status memdecay_block_pool_create(size_t num_blocks, size_t page_size, memdecay_table** out);
MEMDECAY_C_API memdecay_status memdecay_block_pool_open(memdecay_table* pool, uint64_t sequence);
MEMDECAY_C_API memdecay_status memdecay_block_pool_close(memdecay_table* pool, uint64_t sequence);
MEMDECAY_C_API memdecay_status memdecay_block_pool_append_tokens(memdecay_table* pool, uint64_t sequence,
                                                                 size_t tokens);
MEMDECAY_C_API memdecay_status memdecay_block_pool_free_blocks(const memdecay_table* pool, size_t* count);
/* The sequence's block ids in logical order. */
MEMDECAY_C_API memdecay_status memdecay_block_pool_blocks(const memdecay_table* pool, uint64_t sequence, int32_t* ids,
                                                          size_t capacity, size_t* count);
/* vLLM's padded block table [rows x max_blocks_per_row] and num_blocks_per_row [rows]. */
MEMDECAY_C_API memdecay_status memdecay_vllm_block_table_create(int32_t* block_ids, int32_t* num_blocks_per_row,
                                                                size_t rows, size_t max_blocks_per_row,
                                                                size_t page_size, size_t num_pool_blocks,
                                                                memdecay_table** out);
/* SGLang's req_to_token [rows x max_context_len] (KV slots) and seq_lens [rows]. */
MEMDECAY_C_API memdecay_status memdecay_sglang_req_to_token_create(int32_t* req_to_token, int64_t* seq_lens,
                                                                   size_t rows, size_t max_context_len,
                                                                   size_t page_size, size_t num_slots,
                                                                   memdecay_table** out);
/* FlashInfer's paged-KV CSR: indptr [batch + 1], indices [indices_capacity], last_page_len [batch]. */
MEMDECAY_C_API memdecay_status memdecay_flashinfer_csr_create(int32_t* indptr, size_t batch, int32_t* indices,
                                                              size_t indices_capacity, const int32_t* last_page_len,
                                                              size_t page_size, size_t num_pool_pages,
                                                              memdecay_table** out);
MEMDECAY_C_API void memdecay_table_destroy(memdecay_table* table);
MEMDECAY_C_API const char* memdecay_table_last_error(const memdecay_table* table);
MEMDECAY_C_API memdecay_status memdecay_table_num_pages(const memdecay_table* table, uint64_t row, size_t* count);

/* What a commit to a table removed (see page_removal in page_tables/page_table.hpp). */
typedef struct memdecay_removal memdecay_removal;
typedef struct memdecay_slot_range {
  int64_t begin;
  int64_t end; /* exclusive */
} memdecay_slot_range;
typedef struct memdecay_removal_view {
  const int32_t* removed; /* every removed page id, in logical order */
  size_t num_removed;
  int has_freed;        /* 1 for the owning block pool; 0 for the views (the engine's allocator owns the counts) */
  const int32_t* freed; /* the ids whose memory is now free */
  size_t num_freed;
  const memdecay_slot_range* slots; /* the KV slots, as merged ranges */
  size_t num_slots;
} memdecay_removal_view;
/* The view's pointers live as long as the removal. */
MEMDECAY_C_API memdecay_removal_view memdecay_removal_get(const memdecay_removal* removal);
MEMDECAY_C_API void memdecay_removal_destroy(memdecay_removal* removal);

/* ---- sequences ---------------------------------------------------------------------------------------------- */

typedef struct memdecay_sequence memdecay_sequence;
typedef struct memdecay_plan memdecay_plan;

typedef enum memdecay_head_reduction {
  MEMDECAY_HEADS_SUM = 0,
  MEMDECAY_HEADS_MEAN = 1,
  MEMDECAY_HEADS_MAX_ENUM = 0x7fffffff
} memdecay_head_reduction;

/*
 * A sequence under `policy` ("memdecay", "h2o", "streaming_llm", "tova", "snapkv", "scissorhands", "norm_sum",
 * "priority_lru", "random"; docs/policies.md), with its parameters as "key=value,key=value" (NULL or "": the
 * defaults), e.g. "recent_fraction=0.5" for h2o or "region_priority=100:60:50,refresh_threshold=1" (a list is
 * colon-separated). An unknown policy, key or value is a MEMDECAY_CONFIG_ERROR naming it.
 */
MEMDECAY_C_API memdecay_status memdecay_sequence_create(const memdecay_config* config, const char* policy,
                                                        const char* params, memdecay_sequence** out);
/* An independent copy (its own layout and policy state, the same thread count; never managed). */
MEMDECAY_C_API memdecay_status memdecay_sequence_copy(const memdecay_sequence* sequence, memdecay_sequence** out);
MEMDECAY_C_API void memdecay_sequence_destroy(memdecay_sequence* sequence);
MEMDECAY_C_API const char* memdecay_sequence_last_error(const memdecay_sequence* sequence);

MEMDECAY_C_API memdecay_status memdecay_sequence_append(memdecay_sequence* sequence, uint8_t region, size_t count);
MEMDECAY_C_API memdecay_status memdecay_sequence_append_tokens(memdecay_sequence* sequence, const uint8_t* labels,
                                                               size_t count);
/* Moves the logical clock (MEMDECAY_INPUT_ERROR if it goes back). */
MEMDECAY_C_API memdecay_status memdecay_sequence_advance_to(memdecay_sequence* sequence, uint32_t step);
/* Attention per resident token (count == kv_len); *refreshed (may be NULL): tokens whose decay clock reset. */
MEMDECAY_C_API memdecay_status memdecay_sequence_observe_tokens(memdecay_sequence* sequence, const float* mass,
                                                                size_t count, size_t* refreshed);
/* Attention per page (count == num_pages), shared among the page's tokens. */
MEMDECAY_C_API memdecay_status memdecay_sequence_observe_pages(memdecay_sequence* sequence, const float* mass,
                                                               size_t count, size_t* refreshed);
/* A row-major heads x tokens matrix (tokens == kv_len), reduced over heads. */
MEMDECAY_C_API memdecay_status memdecay_sequence_observe_heads(memdecay_sequence* sequence, const float* mass,
                                                               size_t heads, size_t tokens, memdecay_head_reduction how,
                                                               size_t* refreshed);

/* The element type of memdecay_sequence_observe_rows's buffer. */
typedef enum memdecay_mass_format {
  MEMDECAY_MASS_F32 = 0,  /* float */
  MEMDECAY_MASS_F16 = 1,  /* IEEE binary16 bits (uint16_t) */
  MEMDECAY_MASS_BF16 = 2, /* bfloat16 bits (uint16_t) */
  MEMDECAY_MASS_MAX_ENUM = 0x7fffffff
} memdecay_mass_format;
/*
 * Attention as the engine's kernel wrote it, read in place (docs/integration.md): `rows` rows of `tokens` masses
 * (tokens == the device tokens), row r starting at element r * stride of `data` (stride >= tokens; 0: tokens),
 * `elements` elements in the buffer, of `format`; reduced over the rows by `how`. The same as observe_tokens of
 * the rows' float sum in row order (times 1 / rows for a mean). MEMDECAY_INPUT_ERROR naming the row and token of a
 * bad element, or the field of a shape the buffer cannot hold; nothing changes then. Since ABI version 1.
 */
MEMDECAY_C_API memdecay_status memdecay_sequence_observe_rows(memdecay_sequence* sequence, const void* data,
                                                              size_t elements, memdecay_mass_format format,
                                                              size_t rows, size_t tokens, size_t stride,
                                                              memdecay_head_reduction how, size_t* refreshed);

/*
 * Page digests and the attention-free signal (docs/tiers.md), for engines whose kernels never materialise
 * attention: a digest of each page's keys, and observe_query instead of observe_tokens. query_heads 0 = kv_heads;
 * scale 0 = 1/sqrt(head_dim). Pages enter without a digest and digests leave with their pages.
 */
typedef enum memdecay_digest_kind {
  MEMDECAY_DIGEST_MIN_MAX = 0,  /* per-channel minimum and maximum of the keys (Quest): an upper bound of q.k */
  MEMDECAY_DIGEST_MEAN_KEY = 1, /* the keys' mean: q.m, an estimate */
  MEMDECAY_DIGEST_KIND_MAX_ENUM = 0x7fffffff
} memdecay_digest_kind;
typedef enum memdecay_digest_storage {
  MEMDECAY_DIGEST_F32 = 0,
  MEMDECAY_DIGEST_F16 = 1, /* minimum rounded down, maximum up: still a bound */
  MEMDECAY_DIGEST_BF16 = 2,
  MEMDECAY_DIGEST_STORAGE_MAX_ENUM = 0x7fffffff
} memdecay_digest_storage;
typedef enum memdecay_query_signal {
  MEMDECAY_SIGNAL_BOUND_SOFTMAX = 0,        /* a page's share: the softmax of its bound over the pages */
  MEMDECAY_SIGNAL_BOUND_SOFTMAX_TOKENS = 1, /* the same, weighted by each page's resident tokens */
  MEMDECAY_SIGNAL_MAX_ENUM = 0x7fffffff
} memdecay_query_signal;
MEMDECAY_C_API memdecay_status memdecay_sequence_enable_digests(memdecay_sequence* sequence, size_t kv_heads,
                                                                size_t head_dim, size_t query_heads,
                                                                memdecay_digest_kind kind,
                                                                memdecay_digest_storage storage, double scale);
/* Page `page`'s min/max digest: lo and hi hold `count` = kv_heads x head_dim values each. */
MEMDECAY_C_API memdecay_status memdecay_sequence_set_page_digest(memdecay_sequence* sequence, size_t page,
                                                                 const float* lo, const float* hi, size_t count);
/* Page `page`'s mean-key digest (kind MEMDECAY_DIGEST_MEAN_KEY): `count` = kv_heads x head_dim values. */
MEMDECAY_C_API memdecay_status memdecay_sequence_set_page_mean_key(memdecay_sequence* sequence, size_t page,
                                                                   const float* mean, size_t count);
/* Page `page`'s digest computed from its keys: `count` = tokens x kv_heads x head_dim values. */
MEMDECAY_C_API memdecay_status memdecay_sequence_set_page_keys(memdecay_sequence* sequence, size_t page,
                                                               const float* keys, size_t count);
/* Each query head's bound on each page into out[j * num_pages + p] (out_count == query_heads x num_pages;
 * +inf for a page without a digest). `query`: query_heads x head_dim. */
MEMDECAY_C_API memdecay_status memdecay_sequence_page_bounds(const memdecay_sequence* sequence, const float* query,
                                                             size_t query_count, float* out, size_t out_count);
/* Observes the attention estimated from the device tokens' key norms (`count` == the device tokens; KnormPress: a
 * low norm, a high share; summing to `total`), for engines that see neither attention nor keep digests. */
MEMDECAY_C_API memdecay_status memdecay_sequence_observe_key_norms(memdecay_sequence* sequence, const float* norms,
                                                                   size_t count, double total, size_t* refreshed);
/* The digest bounds of memdecay_sequence_page_bounds, _observe_query and _select_recall* split over `threads`
 * threads (a pool the handle keeps, made again when the count changes; docs/tiers.md, "Split over cores"): the same
 * bounds and decisions bit for bit for every count. 1, the default: the caller's thread. Not 1 to 1024:
 * MEMDECAY_INVALID_ARGUMENT, and the count stays. A sequence handle's own count (each handle of a managed sequence
 * has its own). */
MEMDECAY_C_API memdecay_status memdecay_sequence_set_threads(memdecay_sequence* sequence, size_t threads);
MEMDECAY_C_API memdecay_status memdecay_sequence_get_threads(const memdecay_sequence* sequence, size_t* threads);
/* Observes the attention estimated from `query` and the digests (summing to `total`: 1 for a mean over heads). */
MEMDECAY_C_API memdecay_status memdecay_sequence_observe_query(memdecay_sequence* sequence, const float* query,
                                                               size_t query_count, memdecay_query_signal signal,
                                                               double total, size_t* refreshed);
/* The per-page attention memdecay_sequence_observe_query would observe, without observing it: one entry per device
 * page (host pages have none), in page order, summing to `total` (an array out: the two-call rule). The same errors as
 * observe_query; nothing changes. */
MEMDECAY_C_API memdecay_status memdecay_sequence_estimate_query_attention(const memdecay_sequence* sequence,
                                                                         const float* query, size_t query_count,
                                                                         memdecay_query_signal signal, double total,
                                                                         float* mass, size_t capacity, size_t* count);

/* Phase 1 (changes nothing): the k lowest-scoring evictable pages, never one of `protect` (logical pages). */
MEMDECAY_C_API memdecay_status memdecay_sequence_select(const memdecay_sequence* sequence, size_t k,
                                                        const size_t* protect, size_t num_protect, memdecay_plan** out);
/* Phase 1 against the config's budget: enough pages to get from the high watermark to the low one. */
MEMDECAY_C_API memdecay_status memdecay_sequence_select_for_budget(const memdecay_sequence* sequence,
                                                                   const size_t* protect, size_t num_protect,
                                                                   memdecay_plan** out);
/* A plan of the engine's own victims (logical pages, ascending); commit checks them like any plan. */
MEMDECAY_C_API memdecay_status memdecay_sequence_plan_pages(const memdecay_sequence* sequence, const size_t* pages,
                                                            size_t count, memdecay_plan** out);
MEMDECAY_C_API memdecay_status memdecay_sequence_pages_wanted_by_budget(const memdecay_sequence* sequence,
                                                                        size_t* pages);

/* Phase 2, state only: the engine has removed the plan's pages itself. */
MEMDECAY_C_API memdecay_status memdecay_sequence_commit(memdecay_sequence* sequence, const memdecay_plan* plan);
/*
 * Phase 2 with the engine's removal: the plan is checked, then remove(user_data, pages, count) is called once with
 * its logical pages (ascending, in the layout before the commit); it returns 0 when the engine removed them, and
 * then the state commits. Any other return leaves the state as it was (MEMDECAY_CALLBACK_ERROR).
 */
typedef int (*memdecay_remove_pages_fn)(void* user_data, const size_t* pages, size_t count);
MEMDECAY_C_API memdecay_status memdecay_sequence_commit_with(memdecay_sequence* sequence, const memdecay_plan* plan,
                                                             memdecay_remove_pages_fn remove, void* user_data);
/* Phase 2 to a table (row: the pool's sequence id or the view's batch row); *removal (may be NULL) says what left. */
MEMDECAY_C_API memdecay_status memdecay_sequence_commit_to_table(memdecay_sequence* sequence, const memdecay_plan* plan,
                                                                 memdecay_table* table, uint64_t row,
                                                                 memdecay_removal** removal);

/* State. */
typedef struct memdecay_sequence_info {
  size_t kv_len;    /* resident tokens */
  size_t num_pages; /* resident pages */
  size_t page_size;
  uint64_t logical_len; /* every token ever appended (the next position) */
  uint64_t evicted_tokens;
  uint32_t now;
  uint64_t generation; /* bumped by every change; a plan is valid only at its generation */
  uint64_t digest;     /* everything selection depends on: equal digests, equal decisions */
  int has_prefix_cache_boundary;
  uint64_t prefix_cache_boundary; /* the first original page that is gone */
} memdecay_sequence_info;
MEMDECAY_C_API memdecay_status memdecay_sequence_get_info(const memdecay_sequence* sequence,
                                                          memdecay_sequence_info* info);
/* The policy's name (valid while the sequence lives). */
MEMDECAY_C_API const char* memdecay_sequence_policy(const memdecay_sequence* sequence);
MEMDECAY_C_API memdecay_status memdecay_sequence_page_scores(const memdecay_sequence* sequence, float* scores,
                                                             size_t capacity, size_t* count);
/* The original position of each resident token. */
MEMDECAY_C_API memdecay_status memdecay_sequence_positions(const memdecay_sequence* sequence, uint64_t* positions,
                                                           size_t capacity, size_t* count);
MEMDECAY_C_API memdecay_status memdecay_sequence_labels(const memdecay_sequence* sequence, uint8_t* labels,
                                                        size_t capacity, size_t* count);
MEMDECAY_C_API memdecay_status memdecay_sequence_region_id(const memdecay_sequence* sequence, const char* name,
                                                           uint8_t* id);

/* Snapshots (docs/snapshot-format.md): the state as bytes, for preemption, restart and migration. */
MEMDECAY_C_API memdecay_status memdecay_sequence_save(const memdecay_sequence* sequence, uint8_t* bytes,
                                                      size_t capacity, size_t* count);
/* Restores the state; the sequence must have the config and policy parameters the snapshot was saved with
 * (MEMDECAY_INPUT_ERROR naming the field and byte offset otherwise, and nothing changes). */
MEMDECAY_C_API memdecay_status memdecay_sequence_load(memdecay_sequence* sequence, const uint8_t* bytes, size_t count);

/* Plans. */
typedef struct memdecay_plan_view {
  const size_t* pages; /* logical pages, ascending */
  const float* scores; /* each victim's page score */
  size_t num_pages;
  size_t requested;
  size_t pages_over_budget; /* by which the high watermark is still exceeded after the plan */
  size_t page_size;
  uint64_t generation;
} memdecay_plan_view;
MEMDECAY_C_API memdecay_plan_view memdecay_plan_get(const memdecay_plan* plan);
MEMDECAY_C_API void memdecay_plan_destroy(memdecay_plan* plan);

/* ---- the host tier (docs/tiers.md) ------------------------------------------------------------------------- */
/* Demote the budget's victims to host memory instead of dropping them, and recall them by query. Page indices
 * (plans, scores) count device and host pages alike; observations cover the device tokens (device_len). */

typedef struct memdecay_host_tier_config {
  memdecay_budget_unit host_budget_unit; /* the host tier's size: MEMDECAY_BUDGET_UNLIMITED by default */
  double host_budget;
  double min_host_priority;  /* a page goes to host only if one of its regions has base priority >= this */
  double hysteresis;         /* logits a host page's bound must beat a device page's by */
  uint32_t min_device_steps; /* a recalled page stays this many steps */
  size_t max_recall_pages;   /* promotions per recall plan; 0 = no limit */
} memdecay_host_tier_config;
/* The defaults: unlimited host tier, no region rule, no hysteresis, 4 steps, no limit. */
MEMDECAY_C_API memdecay_host_tier_config memdecay_host_tier_config_default(void);
/* MEMDECAY_CONFIG_ERROR naming the field. A manager's sequence counts toward its manager's host pool. */
MEMDECAY_C_API memdecay_status memdecay_sequence_enable_host_tier(memdecay_sequence* sequence,
                                                                  const memdecay_host_tier_config* config);
/* memdecay_sequence_enable_host_tier with a displacement rule: displace_lowest > 0 lets a recall displace only that
 * many device pages, the evictor's lowest-scoring evictable ones (the score decides what may leave, the query what
 * returns; host_tier_config::displace_lowest); 0 is the plain call (any evictable page the query bounds lower). A
 * function of its own rather than a field, so that memdecay_host_tier_config keeps its layout in ABI version 1. */
MEMDECAY_C_API memdecay_status memdecay_sequence_enable_host_tier_displacing(memdecay_sequence* sequence,
                                                                             const memdecay_host_tier_config* config,
                                                                             size_t displace_lowest);
/* MEMDECAY_USAGE_ERROR while pages are on the host (they would be lost). */
MEMDECAY_C_API memdecay_status memdecay_sequence_disable_host_tier(memdecay_sequence* sequence);
typedef struct memdecay_tier_info {
  int has_host_tier;
  size_t device_len; /* tokens on the device: what observations cover */
  size_t device_pages;
  size_t host_pages;
} memdecay_tier_info;
MEMDECAY_C_API memdecay_status memdecay_sequence_get_tier_info(const memdecay_sequence* sequence,
                                                               memdecay_tier_info* info);
/* Per held page: 1 on the host, 0 on the device. */
MEMDECAY_C_API memdecay_status memdecay_sequence_on_host(const memdecay_sequence* sequence, uint8_t* flags,
                                                         size_t capacity, size_t* count);
/* A device page's index in the engine's device page table (MEMDECAY_INPUT_ERROR for a host page). */
MEMDECAY_C_API memdecay_status memdecay_sequence_device_index(const memdecay_sequence* sequence, size_t page,
                                                              size_t* index);

typedef struct memdecay_recall_plan memdecay_recall_plan;
/* Phase 1 of a recall (changes nothing): from the step's query (query_heads x head_dim; needs page digests) ... */
MEMDECAY_C_API memdecay_status memdecay_sequence_select_recall(const memdecay_sequence* sequence, const float* query,
                                                               size_t query_count, const size_t* protect,
                                                               size_t num_protect, memdecay_recall_plan** out);
/* ... or from per-page bounds the engine computed (one per held page). */
MEMDECAY_C_API memdecay_status memdecay_sequence_select_recall_for_bounds(const memdecay_sequence* sequence,
                                                                          const float* bounds, size_t count,
                                                                          const size_t* protect, size_t num_protect,
                                                                          memdecay_recall_plan** out);
/* How a recall ranks a page from its bounds over the query heads (head_bounds in C++): its best head's bound (the
 * plain select_recall), the mean over the heads (docs/tiers.md: more recall for fewer bytes on the bundled models,
 * but not everywhere), or its estimated attention mass (each head's softmax over the pages' bounds, averaged over
 * the heads; ranked in log units, so the tier's hysteresis is then in nats). */
typedef enum memdecay_recall_heads {
  MEMDECAY_RECALL_BEST_HEAD = 0,
  MEMDECAY_RECALL_MEAN_OF_HEADS = 1,
  MEMDECAY_RECALL_ESTIMATED_ATTENTION = 2,
  MEMDECAY_RECALL_HEADS_MAX_ENUM = 0x7fffffff
} memdecay_recall_heads;
/* Keeps, in every head of `query` (query_count floats, heads x head_dim), its `channels` largest-magnitude channels
 * and sets the others to 0, in place (ties to the lower channel): pass the result to select_recall for a digest bound
 * over those channels only (docs/tiers.md, "Recall from the query's largest channels"). MEMDECAY_INPUT_ERROR, the
 * query unchanged, for head_dim or channels of 0, a count that is not a whole number of heads or a non-finite
 * element; MEMDECAY_INVALID_ARGUMENT for a NULL query with a count. */
MEMDECAY_C_API memdecay_status memdecay_keep_largest_query_channels(float* query, size_t query_count, size_t head_dim,
                                                                    size_t channels);
/* memdecay_sequence_select_recall with a page ranked by `heads`; MEMDECAY_INVALID_ARGUMENT for another value. */
MEMDECAY_C_API memdecay_status memdecay_sequence_select_recall_over_heads(const memdecay_sequence* sequence,
                                                                          const float* query, size_t query_count,
                                                                          const size_t* protect, size_t num_protect,
                                                                          memdecay_recall_heads heads,
                                                                          memdecay_recall_plan** out);
/* Phase 2: promoted pages return to the device at their place, demoted ones go to host, dropped ones leave (the
 * engine has copied them and updated its table). MEMDECAY_USAGE_ERROR for a stale plan. */
MEMDECAY_C_API memdecay_status memdecay_sequence_commit_recall(memdecay_sequence* sequence,
                                                               const memdecay_recall_plan* plan);
/* Phase 2 through a block pool (memdecay_block_pool_create; its row `row` is this sequence): the displaced device
 * pages leave the pool, the promoted pages get fresh blocks at their places (a full pool swaps: the removal first).
 * `inserted` receives the new blocks in page order (capacity >= the plan's num_promote, checked before anything
 * changes; *num_inserted may be NULL), *removal (may be NULL) what the pool removed. Nothing changes on any error. */
MEMDECAY_C_API memdecay_status memdecay_sequence_commit_recall_to_pool(memdecay_sequence* sequence,
                                                                       const memdecay_recall_plan* plan,
                                                                       memdecay_table* pool, uint64_t row,
                                                                       int32_t* inserted, size_t capacity,
                                                                       size_t* num_inserted,
                                                                       memdecay_removal** removal);
typedef struct memdecay_recall_plan_view {
  const size_t* promote; /* host pages, ascending */
  const float* promote_bounds;
  size_t num_promote;
  const size_t* demote; /* device pages to host, ascending */
  size_t num_demote;
  const size_t* drop; /* device pages dropped, ascending */
  size_t num_drop;
  size_t page_size;
  uint64_t generation;
} memdecay_recall_plan_view;
MEMDECAY_C_API memdecay_recall_plan_view memdecay_recall_plan_get(const memdecay_recall_plan* plan);
/* An eviction plan's host-tier part: the victims that go to host (a subset of its pages) and the host pages dropped
 * to make room for them (both empty without a tier). The pointers live as long as the plan. */
typedef struct memdecay_plan_tier_view {
  const size_t* demoted;
  size_t num_demoted;
  const size_t* host_dropped;
  size_t num_host_dropped;
} memdecay_plan_tier_view;
MEMDECAY_C_API memdecay_plan_tier_view memdecay_plan_get_tier(const memdecay_plan* plan);
MEMDECAY_C_API void memdecay_recall_plan_destroy(memdecay_recall_plan* plan);

/* ---- exports ------------------------------------------------------------------------------------------------- */

/* A llama.cpp position range [p0, p1) for llama_memory_seq_rm. */
typedef struct memdecay_llama_range {
  int32_t p0;
  int32_t p1;
} memdecay_llama_range;
/* The plan's victims as merged position ranges (call before the commit). */
MEMDECAY_C_API memdecay_status memdecay_llama_position_ranges(const memdecay_sequence* sequence,
                                                              const memdecay_plan* plan, memdecay_llama_range* ranges,
                                                              size_t capacity, size_t* count);
/* Every position evicted so far, merged. */
MEMDECAY_C_API memdecay_status memdecay_llama_evicted_ranges(const memdecay_sequence* sequence,
                                                             memdecay_llama_range* ranges, size_t capacity,
                                                             size_t* count);
/* TensorRT-LLM's TokenRangeRetentionConfig entries. */
typedef struct memdecay_token_range_retention {
  int64_t token_start;
  int64_t token_end;
  int priority; /* 0..100 */
  int has_duration;
  int64_t duration_ms;
} memdecay_token_range_retention;
/* milliseconds_per_step: wall-clock ms of one step, to turn half-lives into durations (0: no durations). */
MEMDECAY_C_API memdecay_status memdecay_tensorrt_llm_retention(const memdecay_sequence* sequence,
                                                               double milliseconds_per_step,
                                                               memdecay_token_range_retention* entries, size_t capacity,
                                                               size_t* count);

/* ---- the manager ---------------------------------------------------------------------------------------------- */

typedef struct memdecay_manager memdecay_manager;
typedef struct memdecay_global_plan memdecay_global_plan;

/* Many sequences of one policy under one pool: global_high pages (0: no global budget), global_low <= high. */
MEMDECAY_C_API memdecay_status memdecay_manager_create(const char* policy, size_t page_size, size_t global_high,
                                                       size_t global_low, memdecay_manager** out);
/* memdecay_manager_create with a host pool: at most host_pool pages on the host tiers of all its sequences
 * (docs/tiers.md, "Many sequences"; memdecay_sequence_enable_host_tier on a managed sequence gives it a tier). */
MEMDECAY_C_API memdecay_status memdecay_manager_create_with_host_pool(const char* policy, size_t page_size,
                                                                      size_t global_high, size_t global_low,
                                                                      size_t host_pool, memdecay_manager** out);
/* memdecay_manager_create_with_host_pool (host_pool SIZE_MAX: unlimited) with the scorer rule (manager_config::scorer,
 * docs/performance.md): at an advance where the resident tokens of all sequences exceed polynomial_above_tokens, every
 * MemDecay sequence scores with the polynomial kernel, and back with the exp-free one below back_below x that (0 <
 * back_below <= 1; MEMDECAY_CONFIG_ERROR naming scorer.back_below otherwise); polynomial_above_tokens 0: never. */
MEMDECAY_C_API memdecay_status memdecay_manager_create_with_scorer_rule(const char* policy, size_t page_size,
                                                                        size_t global_high, size_t global_low,
                                                                        size_t host_pool,
                                                                        uint64_t polynomial_above_tokens,
                                                                        double back_below, memdecay_manager** out);
MEMDECAY_C_API void memdecay_manager_destroy(memdecay_manager* manager);
MEMDECAY_C_API const char* memdecay_manager_last_error(const memdecay_manager* manager);
/*
 * Opens sequence `id` at the manager's clock. *out (may be NULL) is a handle to it: every sequence call works on
 * it except the commits (commit through the manager); after close it is a MEMDECAY_USAGE_ERROR. Destroy it with
 * memdecay_sequence_destroy (the sequence stays open).
 */
MEMDECAY_C_API memdecay_status memdecay_manager_open(memdecay_manager* manager, uint64_t id,
                                                     const memdecay_config* config, const char* params,
                                                     memdecay_sequence** out);
MEMDECAY_C_API memdecay_status memdecay_manager_sequence(memdecay_manager* manager, uint64_t id,
                                                         memdecay_sequence** out);
/* A child sharing the parent's full pages, with a copy of its policy state; pool (may be NULL) forks too. */
MEMDECAY_C_API memdecay_status memdecay_manager_fork(memdecay_manager* manager, uint64_t parent, uint64_t child,
                                                     memdecay_table* pool);
MEMDECAY_C_API memdecay_status memdecay_manager_close(memdecay_manager* manager, uint64_t id);
MEMDECAY_C_API memdecay_status memdecay_manager_advance_to(memdecay_manager* manager, uint32_t step);
/* The batch step (memdecay_manager_advance_to), memdecay_manager_select_global and the digest bounds of
 * memdecay_manager_select_recall* on `threads` threads (a pool the manager keeps; core/executor.hpp): the same clocks,
 * scores, plans and recall plans for every count. 1, the default: the caller's thread. Not 1 to 1024:
 * MEMDECAY_INVALID_ARGUMENT, and the count stays. */
MEMDECAY_C_API memdecay_status memdecay_manager_set_threads(memdecay_manager* manager, size_t threads);
MEMDECAY_C_API memdecay_status memdecay_manager_get_threads(const memdecay_manager* manager, size_t* threads);
MEMDECAY_C_API memdecay_status memdecay_manager_protect_pages(memdecay_manager* manager, uint64_t id,
                                                              const size_t* pages, size_t count);
MEMDECAY_C_API memdecay_status memdecay_manager_protect_tail_tokens(memdecay_manager* manager, uint64_t id,
                                                                    size_t tokens);
MEMDECAY_C_API memdecay_status memdecay_manager_clear_protections(memdecay_manager* manager);
MEMDECAY_C_API memdecay_status memdecay_manager_set_shared(memdecay_manager* manager, uint64_t id, const size_t* pages,
                                                           size_t count, int shared);
typedef struct memdecay_manager_info {
  size_t sequences;
  size_t resident_pages;
  size_t reclaimable_pages;
  size_t physical_pages;
  uint32_t now;
  uint64_t digest;
} memdecay_manager_info;
MEMDECAY_C_API memdecay_status memdecay_manager_get_info(const memdecay_manager* manager, memdecay_manager_info* info);
MEMDECAY_C_API memdecay_status memdecay_manager_ids(const memdecay_manager* manager, uint64_t* ids, size_t capacity,
                                                    size_t* count);
/* Pages on the host tiers of all sequences (at most the host pool). */
MEMDECAY_C_API memdecay_status memdecay_manager_host_pages(const memdecay_manager* manager, size_t* pages);
/* Sequence id's recall plan (as memdecay_sequence_select_recall*), never displacing a page protected for this step
 * or shared; memdecay_manager_commit_recall applies one with the manager's checks (a protected page displaced, the
 * host pool overfilled: MEMDECAY_USAGE_ERROR, nothing changes). A managed sequence's own commit_recall refuses. */
MEMDECAY_C_API memdecay_status memdecay_manager_select_recall(const memdecay_manager* manager, uint64_t id,
                                                              const float* query, size_t query_count,
                                                              memdecay_recall_plan** out);
/* memdecay_manager_select_recall with a page ranked by `heads` (memdecay_recall_heads). */
MEMDECAY_C_API memdecay_status memdecay_manager_select_recall_over_heads(const memdecay_manager* manager, uint64_t id,
                                                                         const float* query, size_t query_count,
                                                                         memdecay_recall_heads heads,
                                                                         memdecay_recall_plan** out);
MEMDECAY_C_API memdecay_status memdecay_manager_select_recall_for_bounds(const memdecay_manager* manager, uint64_t id,
                                                                         const float* bounds, size_t count,
                                                                         memdecay_recall_plan** out);
MEMDECAY_C_API memdecay_status memdecay_manager_commit_recall(memdecay_manager* manager, uint64_t id,
                                                              const memdecay_recall_plan* plan);

/* Phase 1 (changes nothing): every sequence's budget, then the global one, plus pages_to_free more. */
MEMDECAY_C_API memdecay_status memdecay_manager_select_global(const memdecay_manager* manager, size_t pages_to_free,
                                                              memdecay_global_plan** out);
/* Phase 2, state only. */
MEMDECAY_C_API memdecay_status memdecay_manager_commit(memdecay_manager* manager, const memdecay_global_plan* plan);
/*
 * Phase 2 with the engine's removal: every sequence's plan is checked, then remove(user_data, sequences, pages,
 * count) is called once with every victim, grouped by sequence in id order (pages ascending within a sequence, in
 * the layout before the commit). It returns 0 when the engine removed them all, and then every state commits; any
 * other return leaves every state as it was (MEMDECAY_CALLBACK_ERROR).
 */
typedef int (*memdecay_remove_sequence_pages_fn)(void* user_data, const uint64_t* sequences, const size_t* pages,
                                                 size_t count);
MEMDECAY_C_API memdecay_status memdecay_manager_commit_with(memdecay_manager* manager, const memdecay_global_plan* plan,
                                                            memdecay_remove_sequence_pages_fn remove, void* user_data);
/*
 * Phase 2 to a table, all or nothing. rows maps the manager's ids to the table's rows: ids[i] -> rows[i]; NULL ids
 * and rows with count 0 mean the ids are the rows (the block pool). removals (may be NULL) gets one removal per
 * sequence that lost pages, in id order: removal_ids[i] and removals[i], both of capacity `capacity`; *count is
 * the number of sequences.
 */
MEMDECAY_C_API memdecay_status memdecay_manager_commit_to_table(memdecay_manager* manager,
                                                                const memdecay_global_plan* plan, memdecay_table* table,
                                                                const uint64_t* ids, const uint64_t* rows,
                                                                size_t num_rows, uint64_t* removal_ids,
                                                                memdecay_removal** removals, size_t capacity,
                                                                size_t* count);

/*
 * Manager snapshots (docs/snapshot-format.md, part 2): every open sequence, the shared pages, this step's
 * protections and the clock. A checkpoint makes saves incremental: with NULL or an empty checkpoint the save is
 * full; otherwise only the sequences that changed since the last save with it are written, and it is updated.
 */
typedef struct memdecay_checkpoint memdecay_checkpoint;
MEMDECAY_C_API memdecay_status memdecay_checkpoint_create(memdecay_checkpoint** out);
MEMDECAY_C_API void memdecay_checkpoint_destroy(memdecay_checkpoint* checkpoint);
/* The next save with it is full. */
MEMDECAY_C_API void memdecay_checkpoint_reset(memdecay_checkpoint* checkpoint);
/*
 * Saves into the manager's own buffer: *bytes and *count describe it until the next save or the manager's
 * destruction (the buffer is reused, so a periodic checkpoint touches no fresh memory). A checkpoint belongs to one
 * manager (MEMDECAY_USAGE_ERROR for another's).
 */
MEMDECAY_C_API memdecay_status memdecay_manager_save(memdecay_manager* manager, memdecay_checkpoint* checkpoint,
                                                     const uint8_t** bytes, size_t* count);
/*
 * For a load: sequence `id`'s config (*config, required) and policy parameters (*params, "key=value,..." or NULL
 * for the defaults), both read before the callback is called again. Return 0; any other value refuses the load
 * (MEMDECAY_CALLBACK_ERROR, nothing changes).
 */
typedef int (*memdecay_configure_fn)(void* user_data, uint64_t id, const memdecay_config** config, const char** params);
/*
 * Replaces the manager's contents with a chain: snapshots[0] a full snapshot, then the incremental ones saved
 * after it, in order (lengths[i] bytes each). MEMDECAY_INPUT_ERROR naming the element, the field and the byte
 * offset for a corrupted, truncated, reordered or mismatched chain; nothing changes on any error. Handles to the
 * manager's sequences then refer to the loaded sequences of the same ids.
 */
MEMDECAY_C_API memdecay_status memdecay_manager_load(memdecay_manager* manager, const uint8_t* const* snapshots,
                                                     const size_t* lengths, size_t num_snapshots,
                                                     memdecay_configure_fn configure, void* user_data);

typedef enum memdecay_victim_reason {
  MEMDECAY_VICTIM_SEQUENCE_BUDGET = 0, /* the sequence's own budget */
  MEMDECAY_VICTIM_GLOBAL_BUDGET = 1,   /* the global budget */
  MEMDECAY_VICTIM_REQUESTED = 2,       /* pages_to_free */
  MEMDECAY_VICTIM_MAX_ENUM = 0x7fffffff
} memdecay_victim_reason;
typedef struct memdecay_global_victim {
  uint64_t sequence;
  size_t page;
  float score;
  int shared;
  memdecay_victim_reason reason;
} memdecay_global_victim;
typedef struct memdecay_global_plan_view {
  const memdecay_global_victim* victims; /* in the total order (score, tie hash, id, page) */
  size_t num_victims;
  size_t pages_freed;
  size_t pages_short;
  uint64_t digest;
} memdecay_global_plan_view;
MEMDECAY_C_API memdecay_global_plan_view memdecay_global_plan_get(const memdecay_global_plan* plan);
MEMDECAY_C_API void memdecay_global_plan_destroy(memdecay_global_plan* plan);

#ifdef __cplusplus
}
#endif

#endif /* MEMDECAY_C_MEMDECAY_H */
