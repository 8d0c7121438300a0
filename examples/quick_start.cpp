// The README's quick start, verbatim: label tokens, let time pass, observe attention, evict under a budget.
#include <cstdio>
#include <vector>

#include <memdecay/memdecay.hpp>

int main() {
  namespace md = memdecay;
  // 16-token pages, keep at most 64 tokens; system is pinned by default.
  md::sequence seq(md::config{.alpha = 1.0,
                              .tau = 2.0,
                              .page_size = 16,
                              .normalization = md::attention_normalization::uniform,
                              .budget = md::budget_config::tokens(64)});
  md::block_pool<> pool(/*num_blocks=*/64, /*page_size=*/16);
  pool.open(/*seq=*/0);

  const md::region_span prompt[] = {
      {md::regions::system, 16}, {md::regions::user, 32}, {md::regions::tool_out, 32}, {md::regions::scratchpad, 16}};
  seq.append(prompt);
  pool.append_tokens(0, seq.kv_len());

  seq.advance_to(40);                                  // 40 decode steps later
  std::vector<float> mass(seq.kv_len(), 0.5f / 96);    // half the attention spread evenly ...
  for (int i = 16; i < 48; ++i) mass[i] += 0.5f / 32;  // ... half on the user turn
  seq.observe_tokens(mass);

  const auto plan = seq.select_for_budget();  // phase 1: pure
  seq.commit(plan, pool, 0);                  // phase 2: page table and state together
  std::printf("evicted %zu pages, %zu tokens resident, first evicted page %llu\n", plan.pages.size(), seq.kv_len(),
              static_cast<unsigned long long>(*seq.prefix_cache_boundary()));
}
