// SPDX-License-Identifier: Apache-2.0
// The C API from C++17 (what llama.cpp and most engine plug-ins build as), linked statically: RAII over the
// handles, an engine loop over a vLLM block-table row under a token budget, and the engine's callback. Includes
// only the C header.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <memdecay/c/memdecay.h>

#if __cplusplus != 201703L
#error "this test is the C++17 consumer"
#endif

namespace {

int failures = 0;
#define EXPECT(cond)                                                                                            \
  do {                                                                                                          \
    if (!(cond)) {                                                                                              \
      std::fprintf(stderr, "%s:%d: EXPECT(%s) failed: %s\n", __FILE__, __LINE__, #cond, memdecay_last_error()); \
      ++failures;                                                                                               \
    }                                                                                                           \
  } while (0)

template <class T, void (*Destroy)(T*)>
struct deleter {
  void operator()(T* p) const { Destroy(p); }
};
using config_ptr = std::unique_ptr<memdecay_config, deleter<memdecay_config, memdecay_config_destroy>>;
using sequence_ptr = std::unique_ptr<memdecay_sequence, deleter<memdecay_sequence, memdecay_sequence_destroy>>;
using plan_ptr = std::unique_ptr<memdecay_plan, deleter<memdecay_plan, memdecay_plan_destroy>>;
using table_ptr = std::unique_ptr<memdecay_table, deleter<memdecay_table, memdecay_table_destroy>>;

template <class Ptr, class Make>
Ptr make(Make&& make_fn) {
  typename Ptr::pointer raw = nullptr;
  if (make_fn(&raw) != MEMDECAY_OK) {
    std::fprintf(stderr, "create failed: %s\n", memdecay_last_error());
    std::exit(1);
  }
  return Ptr(raw);
}

}  // namespace

int main() {
  auto cfg = make<config_ptr>([](memdecay_config** out) { return memdecay_config_create(out); });
  EXPECT(memdecay_config_set_budget(cfg.get(), MEMDECAY_BUDGET_TOKENS, 512, 384) == MEMDECAY_OK);
  EXPECT(memdecay_config_set_number(cfg.get(), "protection.recent_tokens", 64) == MEMDECAY_OK);
  auto seq = make<sequence_ptr>(
      [&](memdecay_sequence** out) { return memdecay_sequence_create(cfg.get(), "memdecay", nullptr, out); });

  // One vLLM row of up to 64 blocks of 16 tokens.
  constexpr std::size_t max_blocks = 64, page = 16;
  std::vector<std::int32_t> block_ids(max_blocks, -1), num_blocks(1, 0);
  auto table = make<table_ptr>([&](memdecay_table** out) {
    return memdecay_vllm_block_table_create(block_ids.data(), num_blocks.data(), 1, max_blocks, page, 4096, out);
  });
  std::int32_t next_block = 0;
  std::size_t evictions = 0;
  std::vector<float> mass;
  for (std::uint32_t step = 1; step <= 60; ++step) {
    // The engine appends 16 tokens per step (a new block each) and labels them.
    const std::uint8_t region =
        step == 1 ? MEMDECAY_REGION_SYSTEM : (step % 3 ? MEMDECAY_REGION_TOOL_OUT : MEMDECAY_REGION_USER);
    block_ids[static_cast<std::size_t>(num_blocks[0])] = next_block++;
    ++num_blocks[0];
    EXPECT(memdecay_sequence_append(seq.get(), region, page) == MEMDECAY_OK);
    EXPECT(memdecay_sequence_advance_to(seq.get(), step) == MEMDECAY_OK);
    memdecay_sequence_info info{};
    EXPECT(memdecay_sequence_get_info(seq.get(), &info) == MEMDECAY_OK);
    mass.assign(info.kv_len, 1.0f / static_cast<float>(info.kv_len));
    EXPECT(memdecay_sequence_observe_tokens(seq.get(), mass.data(), mass.size(), nullptr) == MEMDECAY_OK);
    auto plan = make<plan_ptr>(
        [&](memdecay_plan** out) { return memdecay_sequence_select_for_budget(seq.get(), nullptr, 0, out); });
    if (memdecay_plan_get(plan.get()).num_pages == 0) continue;
    ++evictions;
    EXPECT(memdecay_sequence_commit_to_table(seq.get(), plan.get(), table.get(), 0, nullptr) == MEMDECAY_OK);
    EXPECT(memdecay_sequence_get_info(seq.get(), &info) == MEMDECAY_OK);
    EXPECT(info.kv_len <= 512);
    EXPECT(static_cast<std::size_t>(num_blocks[0]) == info.num_pages);
  }
  EXPECT(evictions > 0);
  // The system block (block 0) is pinned: still the first block of the row.
  EXPECT(block_ids[0] == 0);
  // Errors come back as codes with messages, never as exceptions.
  EXPECT(memdecay_sequence_advance_to(seq.get(), 1) == MEMDECAY_INPUT_ERROR);
  EXPECT(std::string(memdecay_sequence_last_error(seq.get())).find("1") != std::string::npos);
  if (failures) {
    std::fprintf(stderr, "%d checks failed\n", failures);
    return 1;
  }
  std::printf("C API from C++17: %zu evictions, every check passed\n", evictions);
  return 0;
}
