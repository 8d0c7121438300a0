/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The C API from C99: every entry point, every error status, the all-or-nothing rule (a rejected call leaves the
 * digest and the engine's arrays as they were), the two-call array rule, the engine callbacks, every table and the
 * manager. Run as `memdecay_c_test <source dir>` (for the calibration file in tests/).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <memdecay/c/memdecay.h>

static int failures = 0;

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                              \
    }                                                                          \
  } while (0)

#define CHECK_OK(call)                                                                                    \
  do {                                                                                                    \
    memdecay_status s_ = (call);                                                                          \
    if (s_ != MEMDECAY_OK) {                                                                              \
      fprintf(stderr, "%s:%d: %s returned %s: %s\n", __FILE__, __LINE__, #call, memdecay_status_name(s_), \
              memdecay_last_error());                                                                     \
      ++failures;                                                                                         \
    }                                                                                                     \
  } while (0)

/* `call` fails with `status` and its message contains `needle`. */
#define CHECK_FAILS(call, status, needle)                                                                           \
  do {                                                                                                              \
    memdecay_status s_ = (call);                                                                                    \
    if (s_ != (status) || strstr(memdecay_last_error(), (needle)) == NULL) {                                        \
      fprintf(stderr, "%s:%d: %s returned %s (\"%s\"), expected %s containing \"%s\"\n", __FILE__, __LINE__, #call, \
              memdecay_status_name(s_), memdecay_last_error(), memdecay_status_name(status), (needle));             \
      ++failures;                                                                                                   \
    }                                                                                                               \
  } while (0)

static uint64_t digest_of(const memdecay_sequence* seq) {
  memdecay_sequence_info info;
  if (memdecay_sequence_get_info(seq, &info) != MEMDECAY_OK) return 0;
  return info.digest;
}

static memdecay_sequence_info info_of(const memdecay_sequence* seq) {
  memdecay_sequence_info info;
  memset(&info, 0, sizeof info);
  CHECK_OK(memdecay_sequence_get_info(seq, &info));
  return info;
}

/* A sequence of `tokens` tokens: one system page, then user tokens, observed once with decaying attention. */
static memdecay_sequence* episode(const memdecay_config* cfg, const char* policy, const char* params, size_t tokens) {
  memdecay_sequence* seq = NULL;
  float* mass;
  size_t i;
  CHECK_OK(memdecay_sequence_create(cfg, policy, params, &seq));
  if (!seq) return NULL;
  CHECK_OK(memdecay_sequence_append(seq, MEMDECAY_REGION_SYSTEM, 16));
  CHECK_OK(memdecay_sequence_append(seq, MEMDECAY_REGION_USER, tokens - 16));
  CHECK_OK(memdecay_sequence_advance_to(seq, 10));
  mass = (float*)malloc(tokens * sizeof(float));
  for (i = 0; i < tokens; ++i) mass[i] = (float)((i * 7919) % 97) / 970.0f;
  CHECK_OK(memdecay_sequence_observe_tokens(seq, mass, tokens, NULL));
  free(mass);
  return seq;
}

static void test_versions_and_status(void) {
  CHECK(memdecay_abi_version() == MEMDECAY_C_ABI_VERSION);
  CHECK(strlen(memdecay_version()) >= 5);
  CHECK(strcmp(memdecay_status_name(MEMDECAY_INPUT_ERROR), "input_error") == 0);
  CHECK(strcmp(memdecay_status_name((memdecay_status)99), "unknown_status") == 0);
}

static void test_config(void) {
  memdecay_config* cfg = NULL;
  memdecay_config* copy = NULL;
  double v = 0;
  uint8_t id = 0;
  memdecay_region regions[2] = {{"prompt", 1.0, 0.0, 1}, {"chat", 0.5, 0.05, 0}};
  memdecay_region_override change;
  CHECK_OK(memdecay_config_create(&cfg));
  CHECK_OK(memdecay_config_get_number(cfg, "alpha", &v));
  CHECK(v == 1.0);
  CHECK_OK(memdecay_config_set_number(cfg, "alpha", 0.5));
  CHECK_OK(memdecay_config_set_number(cfg, "page_size", 8));
  CHECK_OK(memdecay_config_set_text(cfg, "normalization", "zscore"));
  /* Rejected values name the field and change nothing. */
  CHECK_FAILS(memdecay_config_set_number(cfg, "alpha", -1), MEMDECAY_CONFIG_ERROR, "alpha");
  CHECK(strstr(memdecay_config_last_error(cfg), "alpha") != NULL);
  CHECK_FAILS(memdecay_config_set_number(cfg, "page_size", 12), MEMDECAY_CONFIG_ERROR, "page_size");
  CHECK_FAILS(memdecay_config_set_number(cfg, "page_size", 8.5), MEMDECAY_CONFIG_ERROR, "page_size");
  CHECK_FAILS(memdecay_config_set_number(cfg, "ewma_beta", NAN), MEMDECAY_CONFIG_ERROR, "ewma_beta");
  CHECK_FAILS(memdecay_config_set_number(cfg, "gamma", 1), MEMDECAY_CONFIG_ERROR, "no config field 'gamma'");
  CHECK_FAILS(memdecay_config_set_text(cfg, "normalization", "l2"), MEMDECAY_CONFIG_ERROR, "normalization");
  CHECK_FAILS(memdecay_config_set_budget(cfg, MEMDECAY_BUDGET_TOKENS, 64, 128), MEMDECAY_CONFIG_ERROR, "low");
  CHECK_FAILS(memdecay_config_set_budget(cfg, (memdecay_budget_unit)9, 1, 1), MEMDECAY_CONFIG_ERROR, "unit");
  CHECK_FAILS(memdecay_config_set_number(NULL, "alpha", 1), MEMDECAY_INVALID_ARGUMENT, "config is NULL");
  CHECK_FAILS(memdecay_config_set_number(cfg, NULL, 1), MEMDECAY_INVALID_ARGUMENT, "field is NULL");
  CHECK_OK(memdecay_config_get_number(cfg, "alpha", &v));
  CHECK(v == 0.5);
  CHECK_OK(memdecay_config_get_number(cfg, "page_size", &v));
  CHECK(v == 8);
  CHECK_OK(memdecay_config_set_budget(cfg, MEMDECAY_BUDGET_TOKENS, 64, NAN));
  CHECK_OK(memdecay_config_get_number(cfg, "ewma_half_life", &v));
  CHECK(isnan(v));

  /* Regions: a table of its own, overrides by name, ids by name. */
  CHECK_OK(memdecay_config_copy(cfg, &copy));
  CHECK_OK(memdecay_config_set_regions(copy, regions, 2));
  CHECK_OK(memdecay_config_region_id(copy, "chat", &id));
  CHECK(id == 1);
  CHECK_FAILS(memdecay_config_region_id(copy, "user", &id), MEMDECAY_CONFIG_ERROR, "unknown region name 'user'");
  memset(&change, 0, sizeof change);
  change.has_half_life = 1;
  change.half_life = 10;
  CHECK_OK(memdecay_config_override_region(copy, "chat", &change));
  CHECK_FAILS(memdecay_config_override_region(copy, "nope", &change), MEMDECAY_CONFIG_ERROR, "nope");
  regions[1].decay_rate = -1;
  CHECK_FAILS(memdecay_config_set_regions(copy, regions, 2), MEMDECAY_CONFIG_ERROR, "chat");
  CHECK_OK(memdecay_config_region_id(copy, "chat", &id)); /* the table is the one before */
  CHECK_OK(memdecay_config_region_id(cfg, "scratchpad", &id));
  CHECK(id == MEMDECAY_REGION_SCRATCHPAD);
  CHECK_FAILS(memdecay_config_apply_calibration(copy, "/nonexistent/calibration.json"), MEMDECAY_INPUT_ERROR,
              "calibration.json");
  memdecay_config_destroy(copy);
  memdecay_config_destroy(cfg);
  memdecay_config_destroy(NULL);
}

static void test_policies_and_params(void) {
  static const char* policies[] = {"memdecay",     "h2o",      "streaming_llm", "tova",  "snapkv",
                                   "scissorhands", "norm_sum", "priority_lru",  "random"};
  memdecay_config* cfg = NULL;
  memdecay_sequence* seq = NULL;
  size_t p;
  CHECK_OK(memdecay_config_create(&cfg));
  CHECK_OK(memdecay_config_set_budget(cfg, MEMDECAY_BUDGET_TOKENS, 128, 96));
  for (p = 0; p < sizeof policies / sizeof policies[0]; ++p) {
    memdecay_sequence* s = episode(cfg, policies[p], NULL, 256);
    memdecay_plan* plan = NULL;
    CHECK(s != NULL);
    if (!s) continue;
    CHECK(strcmp(memdecay_sequence_policy(s), policies[p]) == 0);
    CHECK_OK(memdecay_sequence_select_for_budget(s, NULL, 0, &plan));
    CHECK(memdecay_plan_get(plan).num_pages == 10); /* 16 pages, 128 -> 96 tokens: 10 pages go */
    CHECK_OK(memdecay_sequence_commit(s, plan));
    CHECK(info_of(s).kv_len == 96);
    memdecay_plan_destroy(plan);
    memdecay_sequence_destroy(s);
  }
  /* Parameters: typed, by name, and every mistake names the key. */
  CHECK_OK(memdecay_sequence_create(cfg, "h2o", "recent_fraction=0.25, recent_tokens=0", &seq));
  memdecay_sequence_destroy(seq);
  CHECK_OK(memdecay_sequence_create(cfg, "priority_lru", "region_priority=100:90:80:70:60:50:40", &seq));
  memdecay_sequence_destroy(seq);
  CHECK_OK(memdecay_sequence_create(cfg, "memdecay", "aggregation=max,exp_free_scores=false", &seq));
  memdecay_sequence_destroy(seq);
  seq = NULL;
  CHECK_FAILS(memdecay_sequence_create(cfg, "h3o", NULL, &seq), MEMDECAY_CONFIG_ERROR, "policy = 'h3o'");
  CHECK_FAILS(memdecay_sequence_create(cfg, "h2o", "window=4", &seq), MEMDECAY_CONFIG_ERROR, "has no parameter window");
  CHECK_FAILS(memdecay_sequence_create(cfg, "h2o", "recent_fraction=half", &seq), MEMDECAY_CONFIG_ERROR,
              "recent_fraction");
  CHECK_FAILS(memdecay_sequence_create(cfg, "snapkv", "window=-1", &seq), MEMDECAY_CONFIG_ERROR, "window");
  CHECK_FAILS(memdecay_sequence_create(cfg, "snapkv", "pooling=median", &seq), MEMDECAY_CONFIG_ERROR, "pooling");
  CHECK_FAILS(memdecay_sequence_create(cfg, "random", "seed=1,seed=2", &seq), MEMDECAY_CONFIG_ERROR, "twice");
  CHECK_FAILS(memdecay_sequence_create(cfg, "random", "seed", &seq), MEMDECAY_CONFIG_ERROR, "no '='");
  CHECK_FAILS(memdecay_sequence_create(cfg, "priority_lru", "region_priority=100:x", &seq), MEMDECAY_CONFIG_ERROR,
              "region_priority");
  CHECK_FAILS(memdecay_sequence_create(cfg, "priority_lru", "region_priority=100", &seq), MEMDECAY_CONFIG_ERROR,
              "region_priority");
  CHECK_FAILS(memdecay_sequence_create(cfg, "tova", "x=1", &seq), MEMDECAY_CONFIG_ERROR, "its parameters: none");
  CHECK_FAILS(memdecay_sequence_create(NULL, "tova", NULL, &seq), MEMDECAY_INVALID_ARGUMENT, "config");
  CHECK_FAILS(memdecay_sequence_create(cfg, "tova", NULL, NULL), MEMDECAY_INVALID_ARGUMENT, "out");
  CHECK(seq == NULL);
  memdecay_config_destroy(cfg);
}

static void test_sequence_errors_change_nothing(void) {
  memdecay_config* cfg = NULL;
  memdecay_sequence* seq;
  uint64_t before;
  float mass[300];
  uint8_t labels[3] = {2, 9, 2};
  size_t i, n = 0, pages[2] = {3, 2};
  memdecay_plan* plan = NULL;
  CHECK_OK(memdecay_config_create(&cfg));
  seq = episode(cfg, "memdecay", NULL, 256);
  before = digest_of(seq);
  for (i = 0; i < 300; ++i) mass[i] = 0.01f;
  CHECK_FAILS(memdecay_sequence_observe_tokens(seq, mass, 255, NULL), MEMDECAY_INPUT_ERROR, "256");
  mass[7] = NAN;
  CHECK_FAILS(memdecay_sequence_observe_tokens(seq, mass, 256, NULL), MEMDECAY_INPUT_ERROR, "7");
  mass[7] = -1;
  CHECK_FAILS(memdecay_sequence_observe_tokens(seq, mass, 256, NULL), MEMDECAY_INPUT_ERROR, "7");
  CHECK(strstr(memdecay_sequence_last_error(seq), "7") != NULL);
  CHECK_FAILS(memdecay_sequence_observe_tokens(seq, NULL, 256, NULL), MEMDECAY_INVALID_ARGUMENT, "mass");
  CHECK_FAILS(memdecay_sequence_observe_heads(seq, mass, 2, 256, (memdecay_head_reduction)5, NULL),
              MEMDECAY_INVALID_ARGUMENT, "how");
  CHECK_FAILS(memdecay_sequence_append(seq, 9, 4), MEMDECAY_INPUT_ERROR, "9");
  CHECK_FAILS(memdecay_sequence_append_tokens(seq, labels, 3), MEMDECAY_INPUT_ERROR, "9");
  CHECK_FAILS(memdecay_sequence_advance_to(seq, 9), MEMDECAY_INPUT_ERROR, "9");
  CHECK_FAILS(memdecay_sequence_plan_pages(seq, pages, 2, &plan), MEMDECAY_USAGE_ERROR, "");
  pages[0] = 0;
  pages[1] = 99;
  CHECK_FAILS(memdecay_sequence_plan_pages(seq, pages, 2, &plan), MEMDECAY_USAGE_ERROR, "99");
  CHECK_FAILS(memdecay_sequence_plan_pages(seq, pages, 1, &plan), MEMDECAY_USAGE_ERROR, "pinned");
  CHECK(plan == NULL);
  CHECK(digest_of(seq) == before);
  /* Arrays out: a NULL buffer asks for the length; a short one is refused with the length. */
  CHECK_OK(memdecay_sequence_page_scores(seq, NULL, 0, &n));
  CHECK(n == 16);
  CHECK_FAILS(memdecay_sequence_page_scores(seq, mass, 15, &n), MEMDECAY_BUFFER_TOO_SMALL, "16 needed");
  CHECK(n == 16);
  CHECK_OK(memdecay_sequence_page_scores(seq, mass, 300, &n));
  CHECK(mass[0] > mass[5]); /* the pinned system page scores b_r = 1 at most; the user pages decayed */
  CHECK_FAILS(memdecay_sequence_page_scores(seq, mass, 300, NULL), MEMDECAY_INVALID_ARGUMENT, "count");
  memdecay_sequence_destroy(seq);
  memdecay_config_destroy(cfg);
}

/* Attention rows read in place: fp16 rows with a leading dimension observe as the float sum; bad ones change nothing. */
static void test_observe_rows(void) {
  memdecay_config* cfg = NULL;
  memdecay_sequence *a, *b;
  uint16_t rows[3 * 260];
  float sum[256];
  size_t i, r, refreshed_a = 0, refreshed_b = 0;
  uint64_t before;
  CHECK_OK(memdecay_config_create(&cfg));
  a = episode(cfg, "memdecay", NULL, 256);
  b = episode(cfg, "memdecay", NULL, 256);
  /* 1/512 and 1/256 are exact in fp16: 0x1800 and 0x1c00 */
  for (r = 0; r < 3; ++r)
    for (i = 0; i < 260; ++i) rows[r * 260 + i] = (uint16_t)(i % 2 ? 0x1c00 : 0x1800);
  for (i = 0; i < 256; ++i) sum[i] = i % 2 ? 3.0f / 256.0f : 3.0f / 512.0f;
  CHECK_OK(memdecay_sequence_observe_rows(a, rows, 3 * 260, MEMDECAY_MASS_F16, 3, 256, 260, MEMDECAY_HEADS_SUM,
                                          &refreshed_a));
  CHECK_OK(memdecay_sequence_observe_tokens(b, sum, 256, &refreshed_b));
  CHECK(refreshed_a == refreshed_b);
  CHECK(digest_of(a) == digest_of(b));
  before = digest_of(a);
  rows[2 * 260 + 40] = 0xbc00; /* -1.0 in fp16 */
  CHECK_FAILS(memdecay_sequence_observe_rows(a, rows, 3 * 260, MEMDECAY_MASS_F16, 3, 256, 260, MEMDECAY_HEADS_SUM, NULL),
              MEMDECAY_INPUT_ERROR, "row 2, token 40");
  CHECK_FAILS(memdecay_sequence_observe_rows(a, rows, 3 * 260 - 5, MEMDECAY_MASS_F16, 3, 256, 260, MEMDECAY_HEADS_SUM,
                                             NULL),
              MEMDECAY_INPUT_ERROR, "need 776");
  CHECK_FAILS(memdecay_sequence_observe_rows(a, rows, 3 * 260, (memdecay_mass_format)7, 3, 256, 260,
                                             MEMDECAY_HEADS_SUM, NULL),
              MEMDECAY_INVALID_ARGUMENT, "format");
  CHECK(digest_of(a) == before);
  memdecay_sequence_destroy(a);
  memdecay_sequence_destroy(b);
  memdecay_config_destroy(cfg);
}

/* Mean-key digests and key norms through the C ABI: the same state as the C++ calls would leave (checked against a
 * twin fed the per-token mass the key-norm signal defines), bad input changes nothing. */
static void test_mean_keys_and_key_norms(void) {
  memdecay_config* cfg = NULL;
  memdecay_sequence* seq;
  float mean[2 * 4], norms[256], query[2 * 4], bounds[2 * 16];
  uint64_t before;
  size_t i, refreshed = 99;
  CHECK_OK(memdecay_config_create(&cfg));
  seq = episode(cfg, "memdecay", NULL, 256); /* 16 pages of 16 */
  CHECK_FAILS(memdecay_sequence_set_page_mean_key(seq, 0, mean, 8), MEMDECAY_USAGE_ERROR, "enable_digests");
  CHECK_OK(memdecay_sequence_enable_digests(seq, 2, 4, 2, MEMDECAY_DIGEST_MEAN_KEY, MEMDECAY_DIGEST_F32, 1.0));
  for (i = 0; i < 8; ++i) mean[i] = (float)i * 0.25f;
  CHECK_OK(memdecay_sequence_set_page_mean_key(seq, 3, mean, 8));
  for (i = 0; i < 8; ++i) query[i] = 1.0f;
  CHECK_OK(memdecay_sequence_page_bounds(seq, query, 8, bounds, 32));
  CHECK(bounds[3] == 0.0f + 0.25f + 0.5f + 0.75f);     /* head 0 on page 3: q . mean over the first kv head */
  CHECK(bounds[16 + 3] == 1.0f + 1.25f + 1.5f + 1.75f); /* head 1: the second kv head */
  before = digest_of(seq);
  CHECK_FAILS(memdecay_sequence_set_page_mean_key(seq, 3, mean, 7), MEMDECAY_INPUT_ERROR, "");
  mean[2] = NAN;
  CHECK_FAILS(memdecay_sequence_set_page_mean_key(seq, 3, mean, 8), MEMDECAY_INPUT_ERROR, "");
  CHECK_FAILS(memdecay_sequence_set_page_mean_key(seq, 99, mean, 8), MEMDECAY_INPUT_ERROR, "99");
  for (i = 0; i < 256; ++i) norms[i] = 1.0f + (float)(i % 5);
  CHECK_FAILS(memdecay_sequence_observe_key_norms(seq, norms, 255, 1.0, NULL), MEMDECAY_INPUT_ERROR, "256");
  norms[9] = -1.0f;
  CHECK_FAILS(memdecay_sequence_observe_key_norms(seq, norms, 256, 1.0, NULL), MEMDECAY_INPUT_ERROR, "");
  CHECK(digest_of(seq) == before);
  norms[9] = 2.0f;
  CHECK_OK(memdecay_sequence_observe_key_norms(seq, norms, 256, 1.0, &refreshed));
  CHECK(refreshed != 99);
  CHECK(digest_of(seq) != before);
  memdecay_sequence_destroy(seq);
  memdecay_config_destroy(cfg);
}

/* Page digests and the attention-free signal: bad input changes nothing; bounds and observe_query work. */
static void test_digests(void) {
  memdecay_config* cfg = NULL;
  memdecay_sequence* seq;
  float keys[16 * 2 * 4], lo[8], hi[8], query[16], bounds[4 * 16], mass[16];
  uint64_t before;
  double total;
  size_t i, p, refreshed = 0, count = 0;
  CHECK_OK(memdecay_config_create(&cfg));
  seq = episode(cfg, "memdecay", NULL, 256); /* 16 pages of 16 */
  CHECK_FAILS(memdecay_sequence_observe_query(seq, query, 16, MEMDECAY_SIGNAL_BOUND_SOFTMAX, 1.0, NULL),
              MEMDECAY_USAGE_ERROR, "enable_digests");
  CHECK_FAILS(memdecay_sequence_enable_digests(seq, 2, 4, 3, MEMDECAY_DIGEST_MIN_MAX, MEMDECAY_DIGEST_F16, 0.0),
              MEMDECAY_CONFIG_ERROR, "query_heads");
  CHECK_FAILS(memdecay_sequence_enable_digests(seq, 2, 4, 4, (memdecay_digest_kind)7, MEMDECAY_DIGEST_F16, 0.0),
              MEMDECAY_INVALID_ARGUMENT, "kind");
  CHECK_OK(memdecay_sequence_enable_digests(seq, 2, 4, 4, MEMDECAY_DIGEST_MIN_MAX, MEMDECAY_DIGEST_F16, 0.0));
  for (p = 0; p < 16; ++p) {
    for (i = 0; i < 16 * 2 * 4; ++i) keys[i] = (float)((i * 7 + p * 13) % 17) / 8.0f - 1.0f;
    CHECK_OK(memdecay_sequence_set_page_keys(seq, p, keys, 16 * 2 * 4));
  }
  for (i = 0; i < 16; ++i) query[i] = (float)(i % 5) - 2.0f;
  before = digest_of(seq);
  for (i = 0; i < 8; ++i) {
    lo[i] = 1.0f;
    hi[i] = 0.0f;
  }
  CHECK_FAILS(memdecay_sequence_set_page_digest(seq, 0, lo, hi, 8), MEMDECAY_INPUT_ERROR, "exceeds hi");
  CHECK_FAILS(memdecay_sequence_set_page_keys(seq, 0, keys, 7), MEMDECAY_INPUT_ERROR, "multiple");
  CHECK_FAILS(memdecay_sequence_set_page_keys(seq, 99, keys, 8), MEMDECAY_INPUT_ERROR, "page 99");
  CHECK_FAILS(memdecay_sequence_page_bounds(seq, query, 15, bounds, 64), MEMDECAY_INPUT_ERROR, "query has 15");
  CHECK_FAILS(memdecay_sequence_observe_query(seq, query, 16, (memdecay_query_signal)4, 1.0, NULL),
              MEMDECAY_INVALID_ARGUMENT, "signal");
  query[3] = NAN;
  CHECK_FAILS(memdecay_sequence_observe_query(seq, query, 16, MEMDECAY_SIGNAL_BOUND_SOFTMAX, 1.0, NULL),
              MEMDECAY_INPUT_ERROR, "query[3]");
  query[3] = 1.0f;
  CHECK(digest_of(seq) == before);
  CHECK_OK(memdecay_sequence_page_bounds(seq, query, 16, bounds, 64));
  for (i = 0; i < 64; ++i) CHECK(isfinite(bounds[i]));
  /* The estimate observe_query would observe: one entry per page summing to total, the state unchanged. */
  CHECK_OK(memdecay_sequence_estimate_query_attention(seq, query, 16, MEMDECAY_SIGNAL_BOUND_SOFTMAX_TOKENS, 4.0, NULL,
                                                      0, &count));
  CHECK(count == 16);
  CHECK_FAILS(memdecay_sequence_estimate_query_attention(seq, query, 16, MEMDECAY_SIGNAL_BOUND_SOFTMAX, 4.0, mass, 15,
                                                         &count),
              MEMDECAY_BUFFER_TOO_SMALL, "capacity 15");
  CHECK_FAILS(memdecay_sequence_estimate_query_attention(seq, query, 16, (memdecay_query_signal)4, 4.0, mass, 16,
                                                         &count),
              MEMDECAY_INVALID_ARGUMENT, "signal");
  CHECK_FAILS(memdecay_sequence_estimate_query_attention(seq, query, 15, MEMDECAY_SIGNAL_BOUND_SOFTMAX, 4.0, mass, 16,
                                                         &count),
              MEMDECAY_INPUT_ERROR, "query has 15");
  CHECK_FAILS(memdecay_sequence_estimate_query_attention(seq, query, 16, MEMDECAY_SIGNAL_BOUND_SOFTMAX, 4.0, mass, 16,
                                                         NULL),
              MEMDECAY_INVALID_ARGUMENT, "count");
  CHECK_OK(memdecay_sequence_estimate_query_attention(seq, query, 16, MEMDECAY_SIGNAL_BOUND_SOFTMAX_TOKENS, 4.0, mass,
                                                      16, &count));
  total = 0.0;
  for (i = 0; i < 16; ++i) {
    CHECK(mass[i] >= 0.0f);
    total += mass[i];
  }
  CHECK(count == 16 && fabs(total - 4.0) < 1e-4);
  CHECK(digest_of(seq) == before);
  CHECK_OK(memdecay_sequence_advance_to(seq, 11));
  CHECK_OK(memdecay_sequence_observe_query(seq, query, 16, MEMDECAY_SIGNAL_BOUND_SOFTMAX_TOKENS, 4.0, &refreshed));
  CHECK(digest_of(seq) != before);
  memdecay_sequence_destroy(seq);
  memdecay_config_destroy(cfg);
}

/* Page digests (1 KV head of 2 channels) whose keys rise with the page: the query (0, 1) prefers later pages. */
static void ramp_keys(memdecay_sequence* seq) {
  float keys[16 * 2];
  size_t i, p;
  CHECK_OK(memdecay_sequence_enable_digests(seq, 1, 2, 1, MEMDECAY_DIGEST_MIN_MAX, MEMDECAY_DIGEST_F32, 0.0));
  for (p = 0; p < 16; ++p) {
    for (i = 0; i < 16; ++i) {
      keys[2 * i] = 1.0f;
      keys[2 * i + 1] = 0.1f * (float)p;
    }
    CHECK_OK(memdecay_sequence_set_page_keys(seq, p, keys, 32));
  }
}

static void test_host_tier(void) {
  memdecay_config* cfg = NULL;
  memdecay_sequence* seq;
  memdecay_plan* plan = NULL;
  memdecay_recall_plan* recall = NULL;
  memdecay_host_tier_config tier = memdecay_host_tier_config_default();
  memdecay_tier_info info;
  memdecay_plan_view pv;
  memdecay_plan_tier_view tv;
  memdecay_recall_plan_view rv;
  float keys[16 * 2], query[2] = {0.0f, 1.0f};
  uint8_t flags[16];
  size_t i, p, count = 0, host = 0, index = 0;
  CHECK_OK(memdecay_config_create(&cfg));
  CHECK_OK(memdecay_config_set_budget(cfg, MEMDECAY_BUDGET_PAGES, 8, NAN));
  seq = episode(cfg, "memdecay", NULL, 256); /* 16 pages of 16, budget 8 pages */
  ramp_keys(seq);
  tier.hysteresis = -1.0;
  CHECK_FAILS(memdecay_sequence_enable_host_tier(seq, &tier), MEMDECAY_CONFIG_ERROR, "hysteresis");
  CHECK_FAILS(memdecay_sequence_select_recall(seq, query, 2, NULL, 0, &recall), MEMDECAY_USAGE_ERROR, "host tier");
  tier = memdecay_host_tier_config_default();
  tier.host_budget_unit = MEMDECAY_BUDGET_PAGES;
  tier.host_budget = 6;
  tier.max_recall_pages = 1;
  CHECK_OK(memdecay_sequence_enable_host_tier(seq, &tier));
  CHECK_OK(memdecay_sequence_select_for_budget(seq, NULL, 0, &plan));
  pv = memdecay_plan_get(plan);
  tv = memdecay_plan_get_tier(plan);
  CHECK(pv.num_pages == 8 && tv.num_demoted == 6 && tv.num_host_dropped == 0);
  CHECK_OK(memdecay_sequence_commit(seq, plan));
  memdecay_plan_destroy(plan);
  CHECK_OK(memdecay_sequence_get_tier_info(seq, &info));
  CHECK(info.has_host_tier == 1 && info.host_pages == 6 && info.device_pages == 8 && info.device_len == 8 * 16);
  CHECK_OK(memdecay_sequence_on_host(seq, flags, 16, &count));
  CHECK(count == 14);
  for (p = 0; p < count; ++p)
    if (flags[p]) host = p;
  CHECK_FAILS(memdecay_sequence_device_index(seq, host, &index), MEMDECAY_INPUT_ERROR, "on the host");
  /* The query now wants the last host page. */
  for (i = 0; i < 16; ++i) keys[2 * i] = 1.0f, keys[2 * i + 1] = 50.0f;
  CHECK_OK(memdecay_sequence_set_page_keys(seq, host, keys, 32));
  CHECK_OK(memdecay_sequence_select_recall(seq, query, 2, NULL, 0, &recall));
  rv = memdecay_recall_plan_get(recall);
  CHECK(rv.num_promote == 1 && rv.promote[0] == host && rv.num_demote + rv.num_drop == 1);
  CHECK_OK(memdecay_sequence_commit_recall(seq, recall));
  CHECK_FAILS(memdecay_sequence_commit_recall(seq, recall), MEMDECAY_USAGE_ERROR, "stale");
  memdecay_recall_plan_destroy(recall);
  CHECK_OK(memdecay_sequence_device_index(seq, host, &index));
  CHECK_FAILS(memdecay_sequence_disable_host_tier(seq), MEMDECAY_USAGE_ERROR, "on the host");
  memdecay_sequence_destroy(seq);
  memdecay_config_destroy(cfg);
}

/* memdecay_sequence_enable_host_tier_displacing: with displace_lowest = 1 a recall may displace only the evictor's
 * lowest-scoring evictable device page (what select(1) names), not the page the query bounds lowest; with 0 it is the
 * plain call. An invalid config still fails naming the field. */
static void test_host_tier_displace_lowest(void) {
  memdecay_config* cfg = NULL;
  memdecay_sequence* seq;
  memdecay_plan* plan = NULL;
  memdecay_recall_plan* recall = NULL;
  memdecay_host_tier_config tier = memdecay_host_tier_config_default();
  memdecay_recall_plan_view rv;
  memdecay_plan_view pv;
  float keys[16 * 2], query[2] = {0.0f, 1.0f};
  uint8_t flags[16];
  size_t i, p, count = 0, host = 0, lowest = 0, by_bound = 0;
  CHECK_OK(memdecay_config_create(&cfg));
  CHECK_OK(memdecay_config_set_budget(cfg, MEMDECAY_BUDGET_PAGES, 8, NAN));
  seq = episode(cfg, "memdecay", NULL, 256); /* 16 pages of 16, budget 8 pages */
  ramp_keys(seq);                            /* page p's bound for the query is 0.1 p */
  tier.host_budget_unit = MEMDECAY_BUDGET_PAGES;
  tier.host_budget = 8;
  tier.max_recall_pages = 1;
  tier.hysteresis = -1.0;
  CHECK_FAILS(memdecay_sequence_enable_host_tier_displacing(seq, &tier, 1), MEMDECAY_CONFIG_ERROR, "hysteresis");
  tier.hysteresis = 0.0;
  CHECK_OK(memdecay_sequence_enable_host_tier_displacing(seq, &tier, 0));
  CHECK_OK(memdecay_sequence_select_for_budget(seq, NULL, 0, &plan));
  CHECK_OK(memdecay_sequence_commit(seq, plan));
  memdecay_plan_destroy(plan);
  CHECK_OK(memdecay_sequence_on_host(seq, flags, 16, &count));
  for (p = 0; p < count; ++p)
    if (flags[p]) host = p;
  for (i = 0; i < 16; ++i) keys[2 * i] = 1.0f, keys[2 * i + 1] = 50.0f;
  CHECK_OK(memdecay_sequence_set_page_keys(seq, host, keys, 32)); /* the query wants the last host page */
  /* Rule 0: the device page with the lowest bound makes room. */
  CHECK_OK(memdecay_sequence_select_recall(seq, query, 2, NULL, 0, &recall));
  rv = memdecay_recall_plan_get(recall);
  CHECK(rv.num_promote == 1 && rv.promote[0] == host && rv.num_demote + rv.num_drop == 1);
  if (rv.num_demote + rv.num_drop == 1) by_bound = rv.num_demote ? rv.demote[0] : rv.drop[0];
  memdecay_recall_plan_destroy(recall);
  /* Ranking pages by the mean over the query heads (one head here: the same plan); a bad value names `heads`. */
  CHECK_OK(memdecay_sequence_select_recall_over_heads(seq, query, 2, NULL, 0, MEMDECAY_RECALL_MEAN_OF_HEADS, &recall));
  rv = memdecay_recall_plan_get(recall);
  CHECK(rv.num_promote == 1 && rv.promote[0] == host && rv.num_demote + rv.num_drop == 1);
  memdecay_recall_plan_destroy(recall);
  /* ... and by the estimated attention mass (one head: the softmax keeps the bound's order, the same plan). */
  CHECK_OK(memdecay_sequence_select_recall_over_heads(seq, query, 2, NULL, 0, MEMDECAY_RECALL_ESTIMATED_ATTENTION,
                                                      &recall));
  rv = memdecay_recall_plan_get(recall);
  CHECK(rv.num_promote == 1 && rv.promote[0] == host && rv.num_demote + rv.num_drop == 1);
  memdecay_recall_plan_destroy(recall);
  recall = NULL;
  CHECK_FAILS(memdecay_sequence_select_recall_over_heads(seq, query, 2, NULL, 0, (memdecay_recall_heads)7, &recall),
              MEMDECAY_INVALID_ARGUMENT, "heads");
  CHECK(recall == NULL);
  /* Rule 1: the evictor's lowest-scoring evictable page makes room, whatever its bound. */
  CHECK_OK(memdecay_sequence_enable_host_tier_displacing(seq, &tier, 1));
  CHECK_OK(memdecay_sequence_select(seq, 1, NULL, 0, &plan));
  pv = memdecay_plan_get(plan);
  CHECK(pv.num_pages == 1);
  if (pv.num_pages == 1) lowest = pv.pages[0];
  memdecay_plan_destroy(plan);
  CHECK(lowest != by_bound); /* the two rules disagree here, so the check below tells them apart */
  CHECK_OK(memdecay_sequence_select_recall(seq, query, 2, NULL, 0, &recall));
  rv = memdecay_recall_plan_get(recall);
  CHECK(rv.num_promote == 1 && rv.num_demote + rv.num_drop == 1);
  if (rv.num_demote + rv.num_drop == 1) CHECK((rv.num_demote ? rv.demote[0] : rv.drop[0]) == lowest);
  CHECK_OK(memdecay_sequence_commit_recall(seq, recall));
  memdecay_recall_plan_destroy(recall);
  memdecay_sequence_destroy(seq);
  memdecay_config_destroy(cfg);
}

/* A recall through a block pool: the demoted pages leave the pool at the tiered commit, the promoted page gets a fresh
 * block at its place; a short `inserted` buffer or a table that is not a block pool changes nothing. */
static void test_recall_through_a_pool(void) {
  memdecay_config* cfg = NULL;
  memdecay_sequence* seq;
  memdecay_table* pool = NULL;
  memdecay_plan* plan = NULL;
  memdecay_recall_plan* recall = NULL;
  memdecay_removal* removal = NULL;
  memdecay_host_tier_config tier = memdecay_host_tier_config_default();
  memdecay_recall_plan_view rv;
  float keys[16 * 2], query[2] = {0.0f, 1.0f};
  uint8_t flags[16];
  memdecay_table* vllm = NULL;
  int32_t inserted[4], blocks[32], vllm_ids[16] = {0, 1, 2, 3, 4, 5, 6, 7}, vllm_counts[1] = {8};
  size_t i, p, count = 0, host = 0, free_blocks = 0, num_inserted = 0, num_blocks = 0;
  uint64_t before;
  CHECK_OK(memdecay_config_create(&cfg));
  CHECK_OK(memdecay_config_set_budget(cfg, MEMDECAY_BUDGET_PAGES, 8, NAN));
  seq = episode(cfg, "memdecay", NULL, 256); /* 16 pages of 16, budget 8 pages */
  CHECK_OK(memdecay_block_pool_create(20, 16, &pool));
  CHECK_OK(memdecay_block_pool_open(pool, 7));
  CHECK_OK(memdecay_block_pool_append_tokens(pool, 7, 256));
  ramp_keys(seq);
  tier.host_budget_unit = MEMDECAY_BUDGET_PAGES;
  tier.host_budget = 6;
  tier.max_recall_pages = 1;
  CHECK_OK(memdecay_sequence_enable_host_tier(seq, &tier));
  CHECK_OK(memdecay_sequence_select_for_budget(seq, NULL, 0, &plan));
  CHECK_OK(memdecay_sequence_commit_to_table(seq, plan, pool, 7, NULL)); /* 8 leave the pool: 6 to host, 2 dropped */
  memdecay_plan_destroy(plan);
  CHECK_OK(memdecay_block_pool_free_blocks(pool, &free_blocks));
  CHECK(free_blocks == 20 - 8);
  CHECK_OK(memdecay_sequence_on_host(seq, flags, 16, &count));
  for (p = 0; p < count; ++p)
    if (flags[p]) host = p;
  for (i = 0; i < 16; ++i) keys[2 * i] = 1.0f, keys[2 * i + 1] = 50.0f;
  CHECK_OK(memdecay_sequence_set_page_keys(seq, host, keys, 32));
  CHECK_OK(memdecay_sequence_select_recall(seq, query, 2, NULL, 0, &recall));
  rv = memdecay_recall_plan_get(recall);
  CHECK(rv.num_promote == 1 && rv.num_demote + rv.num_drop == 1);
  before = digest_of(seq);
  CHECK_FAILS(memdecay_sequence_commit_recall_to_pool(seq, recall, pool, 7, inserted, 0, &num_inserted, NULL),
              MEMDECAY_BUFFER_TOO_SMALL, "1 needed");
  CHECK_OK(memdecay_vllm_block_table_create(vllm_ids, vllm_counts, 1, 16, 16, 32, &vllm));
  CHECK_FAILS(memdecay_sequence_commit_recall_to_pool(seq, recall, vllm, 0, inserted, 4, &num_inserted, NULL),
              MEMDECAY_INVALID_ARGUMENT, "block pool");
  memdecay_table_destroy(vllm);
  CHECK(digest_of(seq) == before);
  CHECK_OK(memdecay_sequence_commit_recall_to_pool(seq, recall, pool, 7, inserted, 4, &num_inserted, &removal));
  CHECK(num_inserted == 1 && memdecay_removal_get(removal).num_removed == 1);
  CHECK_OK(memdecay_block_pool_blocks(pool, 7, blocks, 32, &num_blocks));
  CHECK(num_blocks == 8); /* 8 device pages, the recalled one among them at its place */
  CHECK_OK(memdecay_sequence_device_index(seq, host, &i));
  CHECK(blocks[i] == inserted[0]);
  CHECK_FAILS(memdecay_sequence_commit_recall_to_pool(seq, recall, pool, 7, inserted, 4, NULL, NULL),
              MEMDECAY_USAGE_ERROR, "stale");
  memdecay_removal_destroy(removal);
  memdecay_recall_plan_destroy(recall);
  memdecay_table_destroy(pool);
  memdecay_sequence_destroy(seq);
  memdecay_config_destroy(cfg);
}

struct removal_log {
  size_t calls;
  size_t pages[64];
  size_t count;
  int answer;
};

static int remove_pages(void* user, const size_t* pages, size_t count) {
  struct removal_log* log = (struct removal_log*)user;
  ++log->calls;
  log->count = count;
  memcpy(log->pages, pages, count * sizeof(size_t));
  return log->answer;
}

static void test_commits(void) {
  memdecay_config* cfg = NULL;
  memdecay_sequence *seq, *twin = NULL;
  memdecay_plan* plan = NULL;
  memdecay_plan_view view;
  struct removal_log log;
  uint64_t before;
  memdecay_llama_range ranges[8];
  size_t n = 0, victims[2] = {3, 4};
  CHECK_OK(memdecay_config_create(&cfg));
  seq = episode(cfg, "memdecay", NULL, 256);
  CHECK_OK(memdecay_sequence_copy(seq, &twin));
  CHECK(digest_of(twin) == digest_of(seq));
  CHECK_OK(memdecay_sequence_select(seq, 3, NULL, 0, &plan));
  view = memdecay_plan_get(plan);
  CHECK(view.num_pages == 3 && view.page_size == 16 && view.generation == info_of(seq).generation);
  CHECK(view.pages[0] < view.pages[1] && view.pages[1] < view.pages[2]);
  CHECK_OK(memdecay_llama_position_ranges(seq, plan, ranges, 8, &n));
  CHECK(n >= 1 && n <= 3 && ranges[0].p0 == (int32_t)(view.pages[0] * 16));

  /* A callback that fails leaves the state as it was; one that succeeds commits. */
  memset(&log, 0, sizeof log);
  log.answer = 7;
  before = digest_of(seq);
  CHECK_FAILS(memdecay_sequence_commit_with(seq, plan, remove_pages, &log), MEMDECAY_CALLBACK_ERROR, "7");
  CHECK(log.calls == 1 && log.count == 3 && log.pages[0] == view.pages[0]);
  CHECK(digest_of(seq) == before);
  log.answer = 0;
  CHECK_OK(memdecay_sequence_commit_with(seq, plan, remove_pages, &log));
  CHECK(log.calls == 2 && info_of(seq).kv_len == 256 - 48);
  /* The plan is stale now: no callback, usage error. */
  CHECK_FAILS(memdecay_sequence_commit_with(seq, plan, remove_pages, &log), MEMDECAY_USAGE_ERROR, "stale");
  CHECK(log.calls == 2);
  CHECK_FAILS(memdecay_sequence_commit(seq, plan), MEMDECAY_USAGE_ERROR, "stale");
  memdecay_plan_destroy(plan);
  CHECK_OK(memdecay_llama_evicted_ranges(seq, ranges, 8, &n));
  CHECK(n >= 1);

  /* The engine's own victims. */
  CHECK_OK(memdecay_sequence_plan_pages(twin, victims, 2, &plan));
  CHECK_OK(memdecay_sequence_commit(twin, plan));
  CHECK(info_of(twin).kv_len == 256 - 32);
  memdecay_plan_destroy(plan);
  {
    uint64_t positions[256];
    CHECK_OK(memdecay_sequence_positions(twin, positions, 256, &n));
    CHECK(n == 224 && positions[47] == 47 && positions[48] == 80);
  }
  {
    memdecay_token_range_retention entries[16];
    CHECK_OK(memdecay_tensorrt_llm_retention(twin, 10.0, entries, 16, &n));
    CHECK(n >= 2 && entries[0].token_start == 0 && entries[0].priority == 100);
    CHECK_FAILS(memdecay_tensorrt_llm_retention(twin, -1.0, entries, 16, &n), MEMDECAY_CONFIG_ERROR,
                "milliseconds_per_step");
  }
  memdecay_sequence_destroy(twin);
  memdecay_sequence_destroy(seq);
  memdecay_config_destroy(cfg);
}

static void test_snapshots(void) {
  memdecay_config* cfg = NULL;
  memdecay_sequence *seq, *restored = NULL, *h2o = NULL;
  uint8_t* bytes;
  size_t n = 0, m = 0;
  uint64_t before;
  CHECK_OK(memdecay_config_create(&cfg));
  seq = episode(cfg, "memdecay", NULL, 256);
  CHECK_OK(memdecay_sequence_save(seq, NULL, 0, &n));
  CHECK(n > 256);
  bytes = (uint8_t*)malloc(n);
  CHECK_FAILS(memdecay_sequence_save(seq, bytes, n - 1, &m), MEMDECAY_BUFFER_TOO_SMALL, "needed");
  CHECK_OK(memdecay_sequence_save(seq, bytes, n, &m));
  CHECK(m == n && memcmp(bytes, "MDSNAP\r\n", 8) == 0);
  CHECK_OK(memdecay_sequence_create(cfg, "memdecay", NULL, &restored));
  CHECK_OK(memdecay_sequence_load(restored, bytes, n));
  CHECK(digest_of(restored) == digest_of(seq));
  /* Corrupted, truncated, another policy: named, and nothing changes. */
  CHECK_OK(memdecay_sequence_append(restored, MEMDECAY_REGION_USER, 3));
  before = digest_of(restored);
  bytes[100] ^= 4;
  CHECK_FAILS(memdecay_sequence_load(restored, bytes, n), MEMDECAY_INPUT_ERROR, "checksum");
  bytes[100] ^= 4;
  CHECK_FAILS(memdecay_sequence_load(restored, bytes, 30), MEMDECAY_INPUT_ERROR, "truncated");
  CHECK(digest_of(restored) == before);
  CHECK_OK(memdecay_sequence_create(cfg, "h2o", NULL, &h2o));
  CHECK_FAILS(memdecay_sequence_load(h2o, bytes, n), MEMDECAY_INPUT_ERROR, "policy");
  CHECK_FAILS(memdecay_sequence_load(h2o, NULL, 5), MEMDECAY_INVALID_ARGUMENT, "bytes");
  free(bytes);
  memdecay_sequence_destroy(h2o);
  memdecay_sequence_destroy(restored);
  memdecay_sequence_destroy(seq);
  memdecay_config_destroy(cfg);
}

/* The same plan to each table: the engine's arrays change exactly as the removal says. */
static void test_tables(void) {
  memdecay_config* cfg = NULL;
  memdecay_sequence *seq, *copy;
  memdecay_plan* plan = NULL;
  memdecay_table *pool = NULL, *vllm = NULL, *sglang = NULL, *csr = NULL;
  memdecay_removal* removal = NULL;
  memdecay_removal_view r;
  int32_t block_ids[2 * 16], num_blocks[2] = {0, 16}, ids[16];
  int32_t req_to_token[2 * 256];
  int64_t seq_lens[2] = {0, 256};
  int32_t indptr[3] = {0, 1, 17}, indices[17], last_page_len[2] = {16, 16};
  size_t i, n = 0, pages = 0;
  CHECK_OK(memdecay_config_create(&cfg));
  seq = episode(cfg, "memdecay", NULL, 256);
  CHECK_OK(memdecay_sequence_select(seq, 4, NULL, 0, &plan));

  CHECK_OK(memdecay_block_pool_create(32, 16, &pool));
  CHECK_OK(memdecay_block_pool_open(pool, 5));
  CHECK_OK(memdecay_block_pool_append_tokens(pool, 5, 256));
  CHECK_FAILS(memdecay_block_pool_append_tokens(pool, 5, 1000), MEMDECAY_INPUT_ERROR, "");
  CHECK_OK(memdecay_table_num_pages(pool, 5, &pages));
  CHECK(pages == 16);
  CHECK_OK(memdecay_sequence_copy(seq, &copy));
  CHECK_FAILS(memdecay_sequence_commit_to_table(copy, plan, pool, 6, &removal), MEMDECAY_USAGE_ERROR, "");
  CHECK(digest_of(copy) == digest_of(seq));
  CHECK_OK(memdecay_sequence_commit_to_table(copy, plan, pool, 5, &removal));
  r = memdecay_removal_get(removal);
  CHECK(r.num_removed == 4 && r.has_freed && r.num_freed == 4 && r.num_slots >= 1);
  CHECK_OK(memdecay_block_pool_free_blocks(pool, &n));
  CHECK(n == 32 - 12);
  CHECK_OK(memdecay_block_pool_blocks(pool, 5, ids, 16, &n));
  CHECK(n == 12);
  memdecay_removal_destroy(removal);
  memdecay_sequence_destroy(copy);

  for (i = 0; i < 16; ++i) block_ids[i] = -1, block_ids[16 + i] = (int32_t)(100 + i);
  CHECK_OK(memdecay_vllm_block_table_create(block_ids, num_blocks, 2, 16, 16, 200, &vllm));
  CHECK_OK(memdecay_sequence_copy(seq, &copy));
  CHECK_OK(memdecay_sequence_commit_to_table(copy, plan, vllm, 1, &removal));
  r = memdecay_removal_get(removal);
  CHECK(num_blocks[1] == 12 && r.num_removed == 4 && !r.has_freed &&
        r.removed[0] == 100 + (int32_t)memdecay_plan_get(plan).pages[0]);
  memdecay_removal_destroy(removal);
  memdecay_sequence_destroy(copy);
  CHECK_FAILS(memdecay_vllm_block_table_create(block_ids, num_blocks, 2, 16, 12, 200, &vllm), MEMDECAY_CONFIG_ERROR,
              "page_size");

  for (i = 0; i < 256; ++i) req_to_token[i] = 0, req_to_token[256 + i] = (int32_t)(1000 + i);
  CHECK_OK(memdecay_sglang_req_to_token_create(req_to_token, seq_lens, 2, 256, 16, 4096, &sglang));
  CHECK_OK(memdecay_sequence_copy(seq, &copy));
  CHECK_OK(memdecay_sequence_commit_to_table(copy, plan, sglang, 1, NULL));
  CHECK(seq_lens[1] == 192);
  memdecay_sequence_destroy(copy);

  for (i = 0; i < 17; ++i) indices[i] = (int32_t)(300 + i);
  CHECK_OK(memdecay_flashinfer_csr_create(indptr, 2, indices, 17, last_page_len, 16, 400, &csr));
  CHECK_OK(memdecay_sequence_copy(seq, &copy));
  CHECK_OK(memdecay_sequence_commit_to_table(copy, plan, csr, 1, NULL));
  CHECK(indptr[1] == 1 && indptr[2] == 13 && indices[0] == 300);
  memdecay_sequence_destroy(copy);
  {
    memdecay_table* bad = NULL;
    indptr[1] = 20; /* inconsistent: rejected when made */
    CHECK_FAILS(memdecay_flashinfer_csr_create(indptr, 2, indices, 17, last_page_len, 16, 400, &bad),
                MEMDECAY_INPUT_ERROR, "flashinfer_csr");
    CHECK(bad == NULL);
  }

  CHECK_FAILS(memdecay_block_pool_open(vllm, 1), MEMDECAY_INVALID_ARGUMENT, "view");
  memdecay_table_destroy(csr);
  memdecay_table_destroy(sglang);
  memdecay_table_destroy(vllm);
  memdecay_table_destroy(pool);
  memdecay_plan_destroy(plan);
  memdecay_sequence_destroy(seq);
  memdecay_config_destroy(cfg);
}

struct batch_log {
  size_t calls, count;
  uint64_t sequences[64];
  int answer;
};

static int remove_batch(void* user, const uint64_t* sequences, const size_t* pages, size_t count) {
  struct batch_log* log = (struct batch_log*)user;
  (void)pages;
  ++log->calls;
  log->count = count;
  memcpy(log->sequences, sequences, count * sizeof(uint64_t));
  return log->answer;
}

static void test_manager(void) {
  memdecay_config* cfg = NULL;
  memdecay_manager* mgr = NULL;
  memdecay_table* pool = NULL;
  memdecay_sequence *a = NULL, *b = NULL;
  memdecay_global_plan* plan = NULL;
  memdecay_global_plan_view view;
  memdecay_manager_info info;
  memdecay_removal* removals[4];
  uint64_t removal_ids[4], ids[4];
  struct batch_log log;
  float mass[256];
  size_t i, n = 0;
  uint64_t before;
  for (i = 0; i < 256; ++i) mass[i] = (float)(i % 13) / 1300.0f;
  CHECK_OK(memdecay_config_create(&cfg));
  CHECK_FAILS(memdecay_manager_create("memdecay", 16, 8, 16, &mgr), MEMDECAY_CONFIG_ERROR, "");
  CHECK_OK(memdecay_manager_create("memdecay", 16, 20, 16, &mgr));
  CHECK_OK(memdecay_block_pool_create(64, 16, &pool));
  CHECK_OK(memdecay_manager_open(mgr, 1, cfg, NULL, &a));
  CHECK_OK(memdecay_manager_open(mgr, 2, cfg, NULL, &b));
  CHECK_FAILS(memdecay_manager_open(mgr, 2, cfg, NULL, NULL), MEMDECAY_USAGE_ERROR, "2");
  CHECK_FAILS(memdecay_manager_open(mgr, 3, cfg, "nope=1", NULL), MEMDECAY_CONFIG_ERROR, "nope");
  CHECK_OK(memdecay_block_pool_open(pool, 1));
  CHECK_OK(memdecay_block_pool_open(pool, 2));
  CHECK_OK(memdecay_sequence_append(a, MEMDECAY_REGION_SYSTEM, 16));
  CHECK_OK(memdecay_sequence_append(a, MEMDECAY_REGION_TOOL_OUT, 240));
  CHECK_OK(memdecay_sequence_append(b, MEMDECAY_REGION_USER, 256));
  CHECK_OK(memdecay_block_pool_append_tokens(pool, 1, 256));
  CHECK_OK(memdecay_block_pool_append_tokens(pool, 2, 256));
  CHECK_OK(memdecay_manager_advance_to(mgr, 3));
  CHECK_OK(memdecay_sequence_observe_tokens(a, mass, 256, NULL));
  CHECK_OK(memdecay_sequence_observe_tokens(b, mass, 256, NULL));
  CHECK_OK(memdecay_manager_protect_tail_tokens(mgr, 2, 64));
  CHECK_OK(memdecay_manager_get_info(mgr, &info));
  CHECK(info.sequences == 2 && info.resident_pages == 32 && info.now == 3);
  CHECK_OK(memdecay_manager_ids(mgr, ids, 4, &n));
  CHECK(n == 2 && ids[0] == 1 && ids[1] == 2);

  CHECK_OK(memdecay_manager_select_global(mgr, 0, &plan));
  view = memdecay_global_plan_get(plan);
  CHECK(view.num_victims == 16 && view.pages_freed == 16 && view.pages_short == 0);
  CHECK(view.victims[0].reason == MEMDECAY_VICTIM_GLOBAL_BUDGET);
  /* A managed sequence commits through its manager only. */
  {
    memdecay_plan* p = NULL;
    struct removal_log rl;
    memset(&rl, 0, sizeof rl);
    CHECK_OK(memdecay_sequence_select(a, 1, NULL, 0, &p));
    CHECK_FAILS(memdecay_sequence_commit_with(a, p, remove_pages, &rl), MEMDECAY_USAGE_ERROR, "manager");
    CHECK(rl.calls == 0);
    memdecay_plan_destroy(p);
  }
  /* The batch callback: all or nothing. */
  memset(&log, 0, sizeof log);
  log.answer = 1;
  CHECK_OK(memdecay_manager_get_info(mgr, &info));
  before = info.digest;
  CHECK_FAILS(memdecay_manager_commit_with(mgr, plan, remove_batch, &log), MEMDECAY_CALLBACK_ERROR, "");
  CHECK(log.calls == 1 && log.count == 16);
  for (i = 1; i < log.count; ++i) CHECK(log.sequences[i - 1] <= log.sequences[i]);
  CHECK_OK(memdecay_manager_get_info(mgr, &info));
  CHECK(info.digest == before);
  /* A table with a short output array is refused before anything changes. */
  CHECK_FAILS(memdecay_manager_commit_to_table(mgr, plan, pool, NULL, NULL, 0, removal_ids, removals, 1, &n),
              MEMDECAY_BUFFER_TOO_SMALL, "removals");
  CHECK_OK(memdecay_manager_commit_to_table(mgr, plan, pool, NULL, NULL, 0, removal_ids, removals, 4, &n));
  CHECK(n >= 1 && n <= 2);
  for (i = 0; i < n; ++i) {
    CHECK(memdecay_removal_get(removals[i]).has_freed);
    memdecay_removal_destroy(removals[i]);
  }
  CHECK_OK(memdecay_manager_get_info(mgr, &info));
  CHECK(info.resident_pages == 16);
  CHECK_OK(memdecay_block_pool_free_blocks(pool, &n));
  CHECK(n == 64 - 16);
  memdecay_global_plan_destroy(plan);

  CHECK_OK(memdecay_manager_clear_protections(mgr));
  CHECK_OK(memdecay_manager_fork(mgr, 1, 7, pool));
  CHECK_OK(memdecay_manager_get_info(mgr, &info));
  CHECK(info.sequences == 3 && info.physical_pages == 16);
  CHECK_OK(memdecay_manager_close(mgr, 2));
  CHECK_FAILS(memdecay_sequence_append(b, MEMDECAY_REGION_USER, 1), MEMDECAY_USAGE_ERROR, "2");
  memdecay_sequence_destroy(b);
  memdecay_sequence_destroy(a);
  CHECK_OK(memdecay_manager_sequence(mgr, 7, &a));
  CHECK(info_of(a).kv_len > 0);
  memdecay_sequence_destroy(a);
  memdecay_manager_destroy(mgr);
  memdecay_table_destroy(pool);
  memdecay_config_destroy(cfg);
}

/* The configure callback of a manager load: one config for every sequence, or a refusal. */
struct configure_state {
  const memdecay_config* config;
  int answer;
  int calls;
};
static int configure_all(void* user_data, uint64_t id, const memdecay_config** config, const char** params) {
  struct configure_state* st = (struct configure_state*)user_data;
  (void)id;
  ++st->calls;
  *config = st->config;
  *params = NULL;
  return st->answer;
}

/* Host tiers under a manager: a host pool shared by the tiers, recall through the manager around this step's
 * protections, and a managed sequence's own commit_recall refused. */
static void test_manager_host_tier(void) {
  memdecay_config* cfg = NULL;
  memdecay_manager* mgr = NULL;
  memdecay_sequence* seqs[2] = {NULL, NULL};
  memdecay_global_plan* plan = NULL;
  memdecay_recall_plan* recall = NULL;
  memdecay_recall_plan_view rv;
  memdecay_host_tier_config tier = memdecay_host_tier_config_default();
  memdecay_tier_info ti;
  memdecay_manager_info info;
  uint8_t on_host[16];
  float bounds[16];
  size_t i, k, n = 0, hosted = 0, low = 16;
  uint64_t sid = 0, before;
  CHECK_OK(memdecay_config_create(&cfg));
  CHECK_OK(memdecay_config_set_budget(cfg, MEMDECAY_BUDGET_PAGES, 5, NAN));
  CHECK_OK(memdecay_config_set_number(cfg, "protection.recent_tokens", 16));
  CHECK_OK(memdecay_manager_create_with_host_pool("memdecay", 16, 0, 0, 3, &mgr));
  for (k = 0; k < 2; ++k) {
    CHECK_OK(memdecay_manager_open(mgr, k + 1, cfg, NULL, &seqs[k]));
    CHECK_OK(memdecay_sequence_append(seqs[k], MEMDECAY_REGION_SYSTEM, 16));
    CHECK_OK(memdecay_sequence_append(seqs[k], MEMDECAY_REGION_RETRIEVAL, 96));
    CHECK_OK(memdecay_sequence_enable_host_tier(seqs[k], &tier));
  }
  CHECK_OK(memdecay_manager_select_global(mgr, 0, &plan));
  CHECK_OK(memdecay_manager_commit(mgr, plan));
  memdecay_global_plan_destroy(plan);
  CHECK_OK(memdecay_manager_host_pages(mgr, &hosted));
  CHECK(hosted == 3); /* 4 victims, a pool of 3 */
  CHECK_OK(memdecay_manager_get_info(mgr, &info));
  CHECK(info.resident_pages == 10);
  for (k = 0; k < 2 && sid == 0; ++k) {
    CHECK_OK(memdecay_sequence_get_tier_info(seqs[k], &ti));
    if (ti.host_pages > 0) sid = k + 1;
  }
  CHECK(sid != 0);
  if (sid == 0) return;
  CHECK_OK(memdecay_sequence_on_host(seqs[sid - 1], on_host, 16, &n));
  for (i = 0; i < n; ++i) {
    bounds[i] = on_host[i] ? 9.0f : (float)i;
    if (!on_host[i] && i > 0 && i < low) low = i; /* the lowest-bound device page after the pinned system page */
  }
  CHECK_OK(memdecay_manager_protect_pages(mgr, sid, &low, 1));
  CHECK_OK(memdecay_manager_select_recall_for_bounds(mgr, sid, bounds, n, &recall));
  rv = memdecay_recall_plan_get(recall);
  CHECK(rv.num_promote > 0 && rv.num_demote + rv.num_drop == rv.num_promote);
  for (i = 0; i < rv.num_demote; ++i) CHECK(rv.demote[i] != low);
  for (i = 0; i < rv.num_drop; ++i) CHECK(rv.drop[i] != low);
  CHECK_FAILS(memdecay_sequence_commit_recall(seqs[sid - 1], recall), MEMDECAY_USAGE_ERROR, "owned by a manager");
  CHECK_OK(memdecay_manager_get_info(mgr, &info));
  before = info.digest;
  CHECK_FAILS(memdecay_manager_select_recall(mgr, sid, bounds, 1, NULL), MEMDECAY_INVALID_ARGUMENT, "out");
  {
    memdecay_recall_plan* unused = NULL;
    CHECK_FAILS(memdecay_manager_select_recall_over_heads(mgr, sid, bounds, 1, (memdecay_recall_heads)9, &unused),
                MEMDECAY_INVALID_ARGUMENT, "heads");
    CHECK(unused == NULL);
  }
  CHECK_OK(memdecay_manager_commit_recall(mgr, sid, recall));
  CHECK_FAILS(memdecay_manager_commit_recall(mgr, sid, recall), MEMDECAY_USAGE_ERROR, "stale");
  CHECK_OK(memdecay_manager_get_info(mgr, &info));
  CHECK(info.digest != before);
  memdecay_recall_plan_destroy(recall);
  for (k = 0; k < 2; ++k) memdecay_sequence_destroy(seqs[k]);
  memdecay_manager_destroy(mgr);
  memdecay_config_destroy(cfg);
}

/* The scorer rule: a bad gap is a config error naming the field; a manager with the rule runs steps as any. */
static void test_manager_scorer_rule(void) {
  memdecay_config* cfg = NULL;
  memdecay_manager* mgr = NULL;
  memdecay_sequence* s = NULL;
  memdecay_global_plan* plan = NULL;
  float mass[300];
  size_t i;
  for (i = 0; i < 300; ++i) mass[i] = (float)(i % 7) / 2100.0f;
  CHECK_OK(memdecay_config_create(&cfg));
  CHECK_FAILS(memdecay_manager_create_with_scorer_rule("memdecay", 16, 0, 0, SIZE_MAX, 100, 0.0, &mgr),
              MEMDECAY_CONFIG_ERROR, "scorer.back_below");
  CHECK_FAILS(memdecay_manager_create_with_scorer_rule("memdecay", 16, 0, 0, SIZE_MAX, 100, 1.5, &mgr),
              MEMDECAY_CONFIG_ERROR, "scorer.back_below");
  CHECK(mgr == NULL);
  CHECK_OK(memdecay_manager_create_with_scorer_rule("memdecay", 16, 16, 12, SIZE_MAX, 100, 0.5, &mgr));
  CHECK_OK(memdecay_manager_open(mgr, 1, cfg, NULL, &s));
  CHECK_OK(memdecay_sequence_append(s, MEMDECAY_REGION_USER, 300)); /* past 100 tokens: the polynomial kernel */
  CHECK_OK(memdecay_manager_advance_to(mgr, 1));
  CHECK_OK(memdecay_sequence_observe_tokens(s, mass, 300, NULL));
  CHECK_OK(memdecay_manager_select_global(mgr, 0, &plan));
  CHECK(memdecay_global_plan_get(plan).num_victims > 0);
  memdecay_global_plan_destroy(plan);
  memdecay_sequence_destroy(s);
  memdecay_manager_destroy(mgr);
  memdecay_config_destroy(cfg);
}

static void test_manager_snapshots(void) {
  memdecay_config* cfg = NULL;
  memdecay_manager *mgr = NULL, *back = NULL;
  memdecay_checkpoint* cp = NULL;
  memdecay_sequence* a = NULL;
  memdecay_manager_info info;
  struct configure_state st;
  const uint8_t* bytes = NULL;
  const uint8_t* chain[2];
  size_t lengths[2];
  uint8_t *full, *delta;
  size_t n = 0, full_n, delta_n;
  uint64_t digest, before;
  float mass[64];
  int i;
  for (i = 0; i < 64; ++i) mass[i] = (float)(i % 7) / 700.0f;
  CHECK_OK(memdecay_config_create(&cfg));
  CHECK_OK(memdecay_manager_create("memdecay", 16, 0, 0, &mgr));
  CHECK_OK(memdecay_manager_open(mgr, 4, cfg, NULL, &a));
  CHECK_OK(memdecay_manager_open(mgr, 9, cfg, NULL, NULL));
  CHECK_OK(memdecay_sequence_append(a, MEMDECAY_REGION_USER, 64));
  CHECK_OK(memdecay_manager_advance_to(mgr, 2));
  CHECK_OK(memdecay_sequence_observe_tokens(a, mass, 64, NULL));
  CHECK_OK(memdecay_checkpoint_create(&cp));
  CHECK_OK(memdecay_manager_save(mgr, cp, &bytes, &n));
  CHECK(n > 64 && memcmp(bytes, "MDMGRS\r\n", 8) == 0);
  full_n = n;
  full = (uint8_t*)malloc(n);
  memcpy(full, bytes, n);
  CHECK_OK(memdecay_manager_advance_to(mgr, 5)); /* only the clocks move: a short delta */
  CHECK_OK(memdecay_manager_save(mgr, cp, &bytes, &n));
  CHECK(n < full_n);
  delta_n = n;
  delta = (uint8_t*)malloc(n);
  memcpy(delta, bytes, n);
  CHECK_OK(memdecay_manager_get_info(mgr, &info));
  digest = info.digest;

  CHECK_OK(memdecay_manager_create("memdecay", 16, 0, 0, &back));
  chain[0] = full;
  chain[1] = delta;
  lengths[0] = full_n;
  lengths[1] = delta_n;
  st.config = cfg;
  st.answer = 0;
  st.calls = 0;
  CHECK_OK(memdecay_manager_load(back, chain, lengths, 2, configure_all, &st));
  CHECK(st.calls == 2);
  CHECK_OK(memdecay_manager_get_info(back, &info));
  CHECK(info.digest == digest && info.sequences == 2 && info.now == 5);
  /* Refused, corrupted, reordered, missing: named, and nothing changes. */
  CHECK_OK(memdecay_manager_open(back, 11, cfg, NULL, NULL));
  CHECK_OK(memdecay_manager_get_info(back, &info));
  before = info.digest;
  st.answer = 3;
  CHECK_FAILS(memdecay_manager_load(back, chain, lengths, 2, configure_all, &st), MEMDECAY_CALLBACK_ERROR, "3");
  st.answer = 0;
  delta[delta_n - 1] ^= 1;
  CHECK_FAILS(memdecay_manager_load(back, chain, lengths, 2, configure_all, &st), MEMDECAY_INPUT_ERROR,
              "snapshot 2 of 2 payload checksum");
  delta[delta_n - 1] ^= 1;
  chain[0] = delta;
  lengths[0] = delta_n;
  CHECK_FAILS(memdecay_manager_load(back, chain, lengths, 1, configure_all, &st), MEMDECAY_INPUT_ERROR, "kind");
  CHECK_FAILS(memdecay_manager_load(back, chain, lengths, 1, NULL, &st), MEMDECAY_INVALID_ARGUMENT, "configure");
  CHECK_OK(memdecay_manager_get_info(back, &info));
  CHECK(info.digest == before);
  /* A checkpoint belongs to one manager. */
  CHECK_FAILS(memdecay_manager_save(back, cp, &bytes, &n), MEMDECAY_USAGE_ERROR, "checkpoint");
  memdecay_checkpoint_reset(cp);
  CHECK_OK(memdecay_manager_save(back, cp, &bytes, &n));
  CHECK_OK(memdecay_manager_save(back, NULL, &bytes, &n)); /* full, the checkpoint untouched */
  free(full);
  free(delta);
  memdecay_checkpoint_destroy(cp);
  memdecay_sequence_destroy(a);
  memdecay_manager_destroy(back);
  memdecay_manager_destroy(mgr);
  memdecay_config_destroy(cfg);
}

/* A query reduced to each head's largest channels (ties to the lower channel), in place; bad input changes nothing. */
static void test_keep_largest_query_channels(void) {
  float q[8] = {0.5f, -3.0f, 0.5f, 2.0f, -1.0f, 1.0f, 1.0f, -1.0f};
  const float want[8] = {0.0f, -3.0f, 0.0f, 2.0f, -1.0f, 1.0f, 0.0f, 0.0f};
  float bad[2] = {1.0f, NAN};
  size_t i;
  CHECK_OK(memdecay_keep_largest_query_channels(q, 8, 4, 2));
  for (i = 0; i < 8; ++i) CHECK(q[i] == want[i]);
  CHECK_OK(memdecay_keep_largest_query_channels(q, 8, 4, 4)); /* every channel kept: unchanged */
  for (i = 0; i < 8; ++i) CHECK(q[i] == want[i]);
  CHECK_FAILS(memdecay_keep_largest_query_channels(q, 7, 4, 2), MEMDECAY_INPUT_ERROR, "whole number of heads");
  CHECK_FAILS(memdecay_keep_largest_query_channels(q, 8, 0, 2), MEMDECAY_INPUT_ERROR, "head_dim");
  CHECK_FAILS(memdecay_keep_largest_query_channels(q, 8, 4, 0), MEMDECAY_INPUT_ERROR, "channels");
  CHECK_FAILS(memdecay_keep_largest_query_channels(NULL, 8, 4, 2), MEMDECAY_INVALID_ARGUMENT, "query");
  CHECK_FAILS(memdecay_keep_largest_query_channels(bad, 2, 2, 1), MEMDECAY_INPUT_ERROR, "query[1]");
  CHECK(bad[0] == 1.0f && isnan(bad[1]));
  CHECK_OK(memdecay_keep_largest_query_channels(NULL, 0, 4, 1)); /* no heads */
}

/* A manager with one sequence of 1,300 pages (more than two of the bounds' 512-page tasks) with f16 min/max digests
 * (2 KV heads of 16 channels, 4 query heads), a host tier, and half its pages demoted to host. */
enum { long_pages = 1300, long_kv = 2, long_dim = 16, long_query_heads = 4 };
static memdecay_manager* long_tiered_manager(const memdecay_config* cfg, memdecay_sequence** seq) {
  memdecay_manager* mgr = NULL;
  memdecay_global_plan* plan = NULL;
  memdecay_host_tier_config tier = memdecay_host_tier_config_default();
  float lo[long_kv * long_dim], hi[long_kv * long_dim];
  uint32_t state = 12345u;
  size_t p, i;
  CHECK_OK(memdecay_manager_create_with_host_pool("memdecay", 16, 0, 0, long_pages, &mgr));
  CHECK_OK(memdecay_manager_open(mgr, 7, cfg, NULL, seq));
  CHECK_OK(memdecay_sequence_append(*seq, MEMDECAY_REGION_SYSTEM, 16));
  CHECK_OK(memdecay_sequence_append(*seq, MEMDECAY_REGION_TOOL_OUT, (long_pages - 1) * 16));
  CHECK_OK(memdecay_sequence_enable_digests(*seq, long_kv, long_dim, long_query_heads, MEMDECAY_DIGEST_MIN_MAX,
                                            MEMDECAY_DIGEST_F16, 0.0));
  for (p = 0; p < long_pages; ++p) {
    for (i = 0; i < long_kv * long_dim; ++i) {
      state = state * 1664525u + 1013904223u;
      lo[i] = (float)(state >> 8) / 16777216.0f - 0.5f;
      hi[i] = lo[i] + (float)((state >> 4) & 15u) / 16.0f;
    }
    CHECK_OK(memdecay_sequence_set_page_digest(*seq, p, lo, hi, long_kv * long_dim));
  }
  tier.host_budget_unit = MEMDECAY_BUDGET_PAGES;
  tier.host_budget = long_pages;
  CHECK_OK(memdecay_sequence_enable_host_tier(*seq, &tier));
  CHECK_OK(memdecay_manager_select_global(mgr, 0, &plan));
  CHECK_OK(memdecay_manager_commit(mgr, plan));
  memdecay_global_plan_destroy(plan);
  return mgr;
}

static int same_recall(const memdecay_recall_plan* a, const memdecay_recall_plan* b) {
  const memdecay_recall_plan_view x = memdecay_recall_plan_get(a), y = memdecay_recall_plan_get(b);
  return x.num_promote == y.num_promote && x.num_demote == y.num_demote && x.num_drop == y.num_drop &&
         (x.num_promote == 0 || (memcmp(x.promote, y.promote, x.num_promote * sizeof(size_t)) == 0 &&
                                 memcmp(x.promote_bounds, y.promote_bounds, x.num_promote * sizeof(float)) == 0)) &&
         (x.num_demote == 0 || memcmp(x.demote, y.demote, x.num_demote * sizeof(size_t)) == 0) &&
         (x.num_drop == 0 || memcmp(x.drop, y.drop, x.num_drop * sizeof(size_t)) == 0);
}

/* memdecay_sequence_set_threads / memdecay_manager_set_threads: the digest bounds (and the manager's step and
 * global plan) on a pool give the same bounds bit for bit, the same recall plans and the same state as on the
 * caller's thread; a count out of range is an invalid argument naming it and the count stays. */
static void test_threads(void) {
  memdecay_config* cfg = NULL;
  memdecay_manager *serial = NULL, *pooled = NULL;
  memdecay_sequence *one = NULL, *three = NULL;
  memdecay_recall_plan *r1 = NULL, *r3 = NULL;
  memdecay_global_plan *g1 = NULL, *g2 = NULL;
  memdecay_global_plan_view v1, v2;
  memdecay_manager_info i1, i3;
  memdecay_tier_info tier_info;
  float query[long_query_heads * long_dim];
  float* b1 = (float*)malloc(long_query_heads * long_pages * sizeof(float));
  float* b3 = (float*)malloc(long_query_heads * long_pages * sizeof(float));
  size_t i, threads = 0, refreshed1 = 0, refreshed3 = 0, count1 = 0, count3 = 0;
  CHECK_OK(memdecay_config_create(&cfg));
  CHECK_OK(memdecay_config_set_budget(cfg, MEMDECAY_BUDGET_PAGES, long_pages / 2, NAN));
  serial = long_tiered_manager(cfg, &one);
  pooled = long_tiered_manager(cfg, &three);
  for (i = 0; i < long_query_heads * long_dim; ++i) query[i] = (float)((i * 37) % 23) / 11.0f - 1.0f;

  CHECK_OK(memdecay_sequence_get_threads(one, &threads));
  CHECK(threads == 1);
  CHECK_FAILS(memdecay_sequence_set_threads(three, 0), MEMDECAY_INVALID_ARGUMENT, "threads = 0");
  CHECK_FAILS(memdecay_sequence_set_threads(three, 5000), MEMDECAY_INVALID_ARGUMENT, "threads = 5000");
  CHECK_FAILS(memdecay_sequence_get_threads(three, NULL), MEMDECAY_INVALID_ARGUMENT, "threads");
  CHECK_FAILS(memdecay_sequence_set_threads(NULL, 2), MEMDECAY_INVALID_ARGUMENT, "sequence");
  CHECK_OK(memdecay_sequence_set_threads(three, 3));
  CHECK_FAILS(memdecay_sequence_set_threads(three, 0), MEMDECAY_INVALID_ARGUMENT, "1 to 1024");
  CHECK_OK(memdecay_sequence_get_threads(three, &threads));
  CHECK(threads == 3);
  CHECK_FAILS(memdecay_manager_set_threads(pooled, 0), MEMDECAY_INVALID_ARGUMENT, "threads = 0");
  CHECK_OK(memdecay_manager_set_threads(pooled, 2));
  CHECK_FAILS(memdecay_manager_set_threads(pooled, 1025), MEMDECAY_INVALID_ARGUMENT, "threads = 1025");
  CHECK_OK(memdecay_manager_get_threads(pooled, &threads));
  CHECK(threads == 2);
  CHECK_OK(memdecay_manager_get_threads(serial, &threads));
  CHECK(threads == 1);

  CHECK_OK(memdecay_sequence_page_bounds(one, query, long_query_heads * long_dim, b1, long_query_heads * long_pages));
  CHECK_OK(memdecay_sequence_page_bounds(three, query, long_query_heads * long_dim, b3, long_query_heads * long_pages));
  CHECK(memcmp(b1, b3, long_query_heads * long_pages * sizeof(float)) == 0);
  CHECK_OK(memdecay_sequence_estimate_query_attention(one, query, long_query_heads * long_dim,
                                                      MEMDECAY_SIGNAL_BOUND_SOFTMAX, 1.0, b1, long_pages, &count1));
  CHECK_OK(memdecay_sequence_estimate_query_attention(three, query, long_query_heads * long_dim,
                                                      MEMDECAY_SIGNAL_BOUND_SOFTMAX, 1.0, b3, long_pages, &count3));
  /* One entry per device page: the host pages have none. */
  CHECK_OK(memdecay_sequence_get_tier_info(one, &tier_info));
  CHECK(count1 == tier_info.device_pages && count1 < long_pages && count1 == count3 &&
        memcmp(b1, b3, count1 * sizeof(float)) == 0);
  {
    memdecay_sequence* copy = NULL;
    CHECK_OK(memdecay_sequence_copy(three, &copy));
    CHECK_OK(memdecay_sequence_get_threads(copy, &threads));
    CHECK(threads == 3);
    memdecay_sequence_destroy(copy);
  }

  CHECK_OK(memdecay_sequence_select_recall(one, query, long_query_heads * long_dim, NULL, 0, &r1));
  CHECK_OK(memdecay_sequence_select_recall(three, query, long_query_heads * long_dim, NULL, 0, &r3));
  CHECK(r1 && r3 && memdecay_recall_plan_get(r1).num_promote > 0 && same_recall(r1, r3));
  memdecay_recall_plan_destroy(r1);
  memdecay_recall_plan_destroy(r3);
  CHECK_OK(memdecay_manager_select_recall(serial, 7, query, long_query_heads * long_dim, &r1));
  CHECK_OK(memdecay_manager_select_recall(pooled, 7, query, long_query_heads * long_dim, &r3));
  CHECK(r1 && r3 && memdecay_recall_plan_get(r1).num_promote > 0 && same_recall(r1, r3));
  CHECK_OK(memdecay_manager_commit_recall(serial, 7, r1));
  CHECK_OK(memdecay_manager_commit_recall(pooled, 7, r3));
  memdecay_recall_plan_destroy(r1);
  memdecay_recall_plan_destroy(r3);

  CHECK_OK(memdecay_manager_advance_to(serial, 12));
  CHECK_OK(memdecay_manager_advance_to(pooled, 12));
  CHECK_OK(memdecay_sequence_observe_query(one, query, long_query_heads * long_dim, MEMDECAY_SIGNAL_BOUND_SOFTMAX, 1.0,
                                           &refreshed1));
  CHECK_OK(memdecay_sequence_observe_query(three, query, long_query_heads * long_dim, MEMDECAY_SIGNAL_BOUND_SOFTMAX,
                                           1.0, &refreshed3));
  CHECK(refreshed1 == refreshed3 && digest_of(one) == digest_of(three));
  CHECK_OK(memdecay_manager_advance_to(serial, 20));
  CHECK_OK(memdecay_manager_advance_to(pooled, 20));
  CHECK_OK(memdecay_manager_select_global(serial, 64, &g1));
  CHECK_OK(memdecay_manager_select_global(pooled, 64, &g2));
  v1 = memdecay_global_plan_get(g1);
  v2 = memdecay_global_plan_get(g2);
  CHECK(v1.num_victims >= 64 && v1.num_victims == v2.num_victims);
  for (i = 0; i < v1.num_victims && i < v2.num_victims; ++i)
    CHECK(v1.victims[i].page == v2.victims[i].page &&
          memcmp(&v1.victims[i].score, &v2.victims[i].score, sizeof(float)) == 0);
  memdecay_global_plan_destroy(g1);
  memdecay_global_plan_destroy(g2);
  CHECK_OK(memdecay_manager_get_info(serial, &i1));
  CHECK_OK(memdecay_manager_get_info(pooled, &i3));
  CHECK(i1.digest == i3.digest && i1.now == 20 && i3.now == 20);

  free(b1);
  free(b3);
  memdecay_sequence_destroy(one);
  memdecay_sequence_destroy(three);
  memdecay_manager_destroy(serial);
  memdecay_manager_destroy(pooled);
  memdecay_config_destroy(cfg);
}

int main(int argc, char** argv) {
  (void)argc;
  (void)argv;
  test_versions_and_status();
  test_config();
  test_policies_and_params();
  test_sequence_errors_change_nothing();
  test_observe_rows();
  test_mean_keys_and_key_norms();
  test_digests();
  test_host_tier();
  test_keep_largest_query_channels();
  test_host_tier_displace_lowest();
  test_recall_through_a_pool();
  test_commits();
  test_snapshots();
  test_tables();
  test_manager();
  test_manager_host_tier();
  test_manager_scorer_rule();
  test_manager_snapshots();
  test_threads();
  if (failures) {
    fprintf(stderr, "%d checks failed\n", failures);
    return 1;
  }
  printf("C API: every check passed\n");
  return 0;
}
