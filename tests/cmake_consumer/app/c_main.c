/* SPDX-License-Identifier: Apache-2.0 */
/* A C consumer of the installed C ABI, built with only `pkg-config --cflags --libs memdecay_c`. */
#include <stdio.h>

#include <memdecay/c/memdecay.h>

int main(void) {
  memdecay_config* cfg = NULL;
  memdecay_sequence* seq = NULL;
  memdecay_plan* plan = NULL;
  memdecay_sequence_info info;
  if (memdecay_abi_version() != MEMDECAY_C_ABI_VERSION) return 1;
  if (memdecay_config_create(&cfg) != MEMDECAY_OK) return 1;
  if (memdecay_config_set_budget(cfg, MEMDECAY_BUDGET_TOKENS, 32, 32) != MEMDECAY_OK) return 1;
  if (memdecay_sequence_create(cfg, "memdecay", NULL, &seq) != MEMDECAY_OK) return 1;
  if (memdecay_sequence_append(seq, MEMDECAY_REGION_USER, 64) != MEMDECAY_OK) return 1;
  if (memdecay_sequence_select_for_budget(seq, NULL, 0, &plan) != MEMDECAY_OK) return 1;
  if (memdecay_sequence_commit(seq, plan) != MEMDECAY_OK) return 1;
  if (memdecay_sequence_get_info(seq, &info) != MEMDECAY_OK || info.kv_len != 32) return 1;
  memdecay_plan_destroy(plan);
  memdecay_sequence_destroy(seq);
  memdecay_config_destroy(cfg);
  printf("C consumer ok (memdecay %s)\n", memdecay_version());
  return 0;
}
