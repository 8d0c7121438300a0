// SPDX-License-Identifier: Apache-2.0
// The llama.cpp side of memdecay, in C++17 through the C ABI only (include/memdecay/c/memdecay.h): what an engine
// built like llama.cpp adds to its decode loop. llama.cpp's KV cache is a set of cells, each holding a position
// and the sequences that use it; `llama_memory_seq_rm(mem, seq, p0, p1)` frees a sequence's cells with positions
// in [p0, p1) and returns false when a partial removal is impossible (recurrent memory). The cache below is a
// stand-in with that contract, so the sketch runs here; in llama.cpp the three marked calls are the real ones.
//
// Per decode step the engine:
//   1. labels the new tokens by region (memdecay_sequence_append), keeping explicit positions in its batch;
//   2. observes attention when it has it (flash attention off: the kq_soft_max tensors via cb_eval) or skips it;
//   3. asks for a plan under the token budget and commits it with a callback that calls llama_memory_seq_rm for
//      each merged position range; if llama.cpp refuses, memdecay's state stays as it was.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <set>
#include <vector>

#include <memdecay/c/memdecay.h>

namespace {

// --- a stand-in for llama.cpp's KV cells (llama-kv-cache.cpp) ---------------------------------------------------
using llama_pos = std::int32_t;
using llama_seq_id = std::int32_t;
struct llama_kv_cell {
  llama_pos pos = -1;
  std::set<llama_seq_id> seq;
};
struct llama_memory {
  std::vector<llama_kv_cell> cells;
  bool recurrent = false;  // a recurrent memory cannot remove part of a sequence
};
using llama_memory_t = llama_memory*;

// The contract of llama.h's llama_memory_seq_rm: frees seq's cells with positions in [p0, p1).
bool llama_memory_seq_rm(llama_memory_t mem, llama_seq_id seq, llama_pos p0, llama_pos p1) {
  if (mem->recurrent) return false;
  for (auto& c : mem->cells)
    if (c.pos >= p0 && c.pos < p1 && c.seq.erase(seq) && c.seq.empty()) c.pos = -1;
  return true;
}
// A decode of n new tokens at explicit positions (memdecay leaves holes, so batch.pos is always explicit).
void llama_decode_at(llama_memory_t mem, llama_seq_id seq, llama_pos first, int n) {
  for (int i = 0; i < n; ++i) {
    llama_kv_cell cell;
    cell.pos = first + i;
    cell.seq.insert(seq);
    bool placed = false;
    for (auto& c : mem->cells)
      if (c.pos < 0) {
        c = cell;
        placed = true;
        break;
      }
    if (!placed) mem->cells.push_back(cell);
  }
}
std::vector<llama_pos> positions_of(const llama_memory& mem, llama_seq_id seq) {
  std::vector<llama_pos> out;
  for (const auto& c : mem.cells)
    if (c.seq.count(seq)) out.push_back(c.pos);
  std::sort(out.begin(), out.end());
  return out;
}

// --- the engine's side --------------------------------------------------------------------------------------------
struct removal_context {
  llama_memory_t mem;
  llama_seq_id seq_id;
  memdecay_sequence* seq;
  const memdecay_plan* plan;
  int calls = 0;
};

// memdecay_sequence_commit_with calls this once, before its state changes: remove the plan's positions.
int remove_from_llama(void* user, const size_t*, size_t) {
  auto* ctx = static_cast<removal_context*>(user);
  size_t count = 0;
  if (memdecay_llama_position_ranges(ctx->seq, ctx->plan, nullptr, 0, &count) != MEMDECAY_OK) return 1;
  std::vector<memdecay_llama_range> ranges(count);
  if (memdecay_llama_position_ranges(ctx->seq, ctx->plan, ranges.data(), ranges.size(), &count) != MEMDECAY_OK)
    return 1;
  for (const auto& r : ranges) {
    ++ctx->calls;
    if (!llama_memory_seq_rm(ctx->mem, ctx->seq_id, r.p0, r.p1)) return 2;  // llama.cpp: the real call
  }
  return 0;
}

#define REQUIRE(call)                                                        \
  do {                                                                       \
    if ((call) != MEMDECAY_OK) {                                             \
      std::fprintf(stderr, "%s failed: %s\n", #call, memdecay_last_error()); \
      return 1;                                                              \
    }                                                                        \
  } while (0)

}  // namespace

int main() {
  memdecay_config* cfg = nullptr;
  REQUIRE(memdecay_config_create(&cfg));
  // llama.cpp removes single cells, but memdecay decides in pages: 16-token pages, a 1024-token budget.
  REQUIRE(memdecay_config_set_budget(cfg, MEMDECAY_BUDGET_TOKENS, 1024, 896));
  REQUIRE(memdecay_config_set_number(cfg, "protection.recent_tokens", 128));
  memdecay_sequence* seq = nullptr;
  REQUIRE(memdecay_sequence_create(cfg, "memdecay", nullptr, &seq));

  llama_memory mem;
  const llama_seq_id id = 0;
  llama_pos next_pos = 0;
  // An agent episode: the system prompt, then turns of user text, tool calls, tool output and reasoning.
  struct span {
    uint8_t region;
    int tokens;
  };
  std::vector<span> spans = {{MEMDECAY_REGION_SYSTEM, 160}};
  for (int turn = 0; turn < 12; ++turn) {
    spans.push_back({MEMDECAY_REGION_USER, 48});
    spans.push_back({MEMDECAY_REGION_TOOL_IN, 32});
    spans.push_back({MEMDECAY_REGION_TOOL_OUT, 192});
    spans.push_back({MEMDECAY_REGION_SCRATCHPAD, 64});
  }
  int evictions = 0, seq_rm_calls = 0;
  uint32_t step = 0;
  for (const auto& s : spans) {
    llama_decode_at(&mem, id, next_pos, s.tokens);  // llama.cpp: llama_decode with batch.pos = next_pos + i
    next_pos += s.tokens;
    REQUIRE(memdecay_sequence_append(seq, s.region, static_cast<size_t>(s.tokens)));
    REQUIRE(memdecay_sequence_advance_to(seq, ++step));
    // With flash attention off, the kq_soft_max tensors give attention per cell; this sketch has none, so the
    // region priors and decay decide alone (the attention term is optional).
    memdecay_plan* plan = nullptr;
    REQUIRE(memdecay_sequence_select_for_budget(seq, nullptr, 0, &plan));
    if (memdecay_plan_get(plan).num_pages > 0) {
      removal_context ctx{&mem, id, seq, plan};
      REQUIRE(memdecay_sequence_commit_with(seq, plan, remove_from_llama, &ctx));
      seq_rm_calls += ctx.calls;
      ++evictions;
    }
    memdecay_plan_destroy(plan);
  }

  // llama.cpp refusing (a recurrent memory) leaves memdecay's state as it was.
  mem.recurrent = true;
  memdecay_sequence_info before{}, after{};
  REQUIRE(memdecay_sequence_get_info(seq, &before));
  memdecay_plan* plan = nullptr;
  REQUIRE(memdecay_sequence_select(seq, 1, nullptr, 0, &plan));
  removal_context ctx{&mem, id, seq, plan};
  const memdecay_status refused = memdecay_sequence_commit_with(seq, plan, remove_from_llama, &ctx);
  memdecay_plan_destroy(plan);
  REQUIRE(memdecay_sequence_get_info(seq, &after));

  // The cells llama.cpp kept are exactly the positions memdecay kept.
  size_t n = 0;
  REQUIRE(memdecay_sequence_positions(seq, nullptr, 0, &n));
  std::vector<uint64_t> kept(n);
  REQUIRE(memdecay_sequence_positions(seq, kept.data(), kept.size(), &n));
  const auto cells = positions_of(mem, id);
  bool same = cells.size() == kept.size();
  for (size_t i = 0; same && i < kept.size(); ++i) same = static_cast<uint64_t>(cells[i]) == kept[i];
  const bool system_kept = cells.size() >= 160 && cells[159] == 159;
  std::printf("%d tokens decoded, %zu kept in %zu cells; %d evictions, %d llama_memory_seq_rm calls\n", next_pos,
              kept.size(), cells.size(), evictions, seq_rm_calls);
  std::printf("refused removal: %s, state unchanged: %s\n", memdecay_status_name(refused),
              before.digest == after.digest ? "yes" : "no");
  memdecay_sequence_destroy(seq);
  memdecay_config_destroy(cfg);
  if (!same || !system_kept || evictions == 0 || refused != MEMDECAY_CALLBACK_ERROR || before.digest != after.digest) {
    std::fprintf(stderr, "FAILED: llama.cpp's cells and memdecay's positions disagree\n");
    return 1;
  }
  std::printf("OK: llama.cpp's cells hold exactly the positions memdecay kept\n");
  return 0;
}
