// The main demo: an agent episode (system prompt, plan, user turns, tool calls with long outputs, retrieval,
// scratchpad) grows in a paged KV cache under a token budget. MemDecay evicts pages online, and every eviction is
// printed with its reason: the page's score broken down into the decay and attention terms, per region.
//
// The attention here is a small synthetic model (recency, a sink on the system prompt, re-reads of the user's
// request and of the plan); the replay tool and the bundled transformer give real evaluations.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <memdecay/memdecay.hpp>

namespace md = memdecay;

namespace {

// A tiny deterministic generator (SplitMix64) so that the demo prints the same run on every machine.
struct splitmix64 {
  std::uint64_t state;
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
};

struct event {
  md::region_id region;
  std::size_t tokens;
  const char* what;
};

// One step of synthetic attention over the resident tokens: a sink on the system prompt, a recency window, and
// re-reads of the user's request and of the plan on some steps. Rows sum to 1 (one query, heads averaged).
std::vector<float> synthetic_attention(const md::sequence& seq, splitmix64& rng) {
  const auto regions = seq.state().regions();
  const std::size_t n = seq.kv_len();
  std::vector<float> w(n);
  const bool reread_user = rng.uniform() < 0.15, reread_plan = rng.uniform() < 0.10;
  for (std::size_t i = 0; i < n; ++i) {
    double v = 0.2 + 0.2 * rng.uniform();
    if (regions[i] == md::regions::system) v += 2.0;
    if (i + 48 >= n) v += 6.0;  // recent tokens
    if (reread_user && regions[i] == md::regions::user) v += 12.0;
    if (reread_plan && regions[i] == md::regions::plan) v += 10.0;
    w[i] = static_cast<float>(v);
  }
  double total = 0;
  for (float v : w) total += v;
  for (float& v : w) v = static_cast<float>(v / total);
  return w;
}

void print_eviction(const md::sequence& seq, std::size_t page) {
  const auto e = seq.explain_page(page);
  std::printf("    evict page %3zu  positions [%5llu, %5llu)  score %.4f = decay %.4f + attention %.4f  |", e.page,
              static_cast<unsigned long long>(e.first_position),
              static_cast<unsigned long long>(e.first_position + e.tokens), e.terms.total(), e.terms.decay,
              e.terms.attention);
  for (const auto& r : e.by_region)
    std::printf(" %s x%zu (%.4f + %.4f)", seq.regions()[r.region].name.c_str(), r.tokens, r.terms.decay,
                r.terms.attention);
  std::printf("\n");
}

}  // namespace

int main() {
  const md::config cfg{
      .alpha = 0.5,
      .ewma_beta = 0.8,
      .tau = 3.0,  // refreshed when a token gets 3x the uniform share
      .page_size = 16,
      .normalization = md::attention_normalization::uniform,
      .protection = {.sink_pages = 0, .recent_tokens = 32},
      .budget = md::budget_config::tokens(768, 640),  // evict in batches from 768 down to 640 resident tokens
      .region_overrides = {{.region = "plan", .pinned = true}},
  };
  md::sequence seq(cfg);
  md::block_pool<> pool(/*num_blocks=*/128, cfg.page_size);
  const std::uint64_t id = 7;
  pool.open(id);

  const std::vector<event> episode = {
      {md::regions::system, 96, "system prompt"},      {md::regions::plan, 40, "plan"},
      {md::regions::user, 56, "user: the task"},       {md::regions::scratchpad, 48, "scratchpad"},
      {md::regions::tool_in, 24, "tool call: search"}, {md::regions::tool_out, 320, "tool output: search results"},
      {md::regions::scratchpad, 64, "scratchpad"},     {md::regions::retrieval, 256, "retrieved document"},
      {md::regions::tool_in, 16, "tool call: fetch"},  {md::regions::tool_out, 288, "tool output: page body"},
      {md::regions::user, 40, "user: follow-up"},      {md::regions::scratchpad, 80, "scratchpad"},
      {md::regions::tool_in, 24, "tool call: code"},   {md::regions::tool_out, 200, "tool output: run log"},
      {md::regions::scratchpad, 48, "scratchpad"},
  };

  splitmix64 rng{42};
  md::step_t step = 0;
  std::size_t evictions = 0;
  std::vector<std::uint64_t> appended(seq.regions().size(), 0);
  std::printf("memdecay %s demo: budget 768 -> 640 tokens, %zu-token pages, plan pinned, last 32 tokens protected\n",
              md::version_string, cfg.page_size);
  for (const auto& ev : episode) {
    // The orchestrator knows each span's region; tokens are decoded (or prefilled) one step per 8 tokens.
    std::printf("step %4u  + %-28s %4zu tokens (%s)\n", step, ev.what, ev.tokens,
                seq.regions()[ev.region].name.c_str());
    for (std::size_t done = 0; done < ev.tokens; done += 8) {
      const std::size_t chunk = std::min<std::size_t>(8, ev.tokens - done);
      seq.append(ev.region, chunk);
      pool.append_tokens(id, chunk);
      appended[ev.region] += chunk;
      seq.advance_to(++step);
      seq.observe_tokens(synthetic_attention(seq, rng));

      const auto plan = seq.select_for_budget();
      if (plan.empty()) continue;
      std::printf("  step %4u: %zu resident tokens > 768, evicting %zu pages:\n", step, seq.kv_len(),
                  plan.pages.size());
      for (std::size_t p : plan.pages) print_eviction(seq, p);
      if (plan.pages_over_budget) std::printf("    budget still exceeded by %zu pages\n", plan.pages_over_budget);
      seq.commit(plan, pool, id);
      evictions += plan.pages.size();
    }
  }

  std::vector<std::uint64_t> kept(seq.regions().size(), 0);
  for (md::region_id r : seq.state().regions()) ++kept[r];
  std::printf("\nafter %u steps: %zu pages evicted, %zu of %llu tokens resident, pool %zu/%zu blocks in use\n", step,
              evictions, seq.kv_len(), static_cast<unsigned long long>(seq.logical_len()), pool.used_blocks(),
              pool.capacity());
  for (std::size_t r = 0; r < kept.size(); ++r)
    std::printf("  %-10s tokens kept: %llu of %llu\n", seq.regions()[static_cast<md::region_id>(r)].name.c_str(),
                static_cast<unsigned long long>(kept[r]), static_cast<unsigned long long>(appended[r]));
  std::printf("prefix-cache boundary: page %llu; state digest %016llx\n",
              static_cast<unsigned long long>(seq.prefix_cache_boundary().value_or(0)),
              static_cast<unsigned long long>(seq.digest()));
  return kept[md::regions::system] == appended[md::regions::system] ? 0 : 1;
}
