// SPDX-License-Identifier: Apache-2.0
// Built with -fno-exceptions: every public header compiles, a correct program works, and each error tier ends the
// process (std::abort) after printing "memdecay: fatal: <message>" to stderr. Run by check_probe.cmake, one scenario
// per CTest test; a scenario whose bad call returns prints UNREACHABLE and exits 0, which the checker fails.
#include <memdecay/memdecay.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#if MEMDECAY_HAS_EXCEPTIONS
#error "this probe must be compiled with -fno-exceptions"
#endif

namespace md = memdecay;

namespace {

md::config small_config() {
  return md::config{.alpha = 1.0,
                    .tau = 2.0,
                    .page_size = 4,
                    .normalization = md::attention_normalization::uniform,
                    .budget = md::budget_config::tokens(8)};
}

int unreachable(const char* scenario) {
  std::printf("UNREACHABLE: scenario '%s' returned from the bad call\n", scenario);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const char* scenario = argc > 1 ? argv[1] : "ok";
  if (std::strcmp(scenario, "ok") == 0) {  // a correct program: append, observe, select, commit
    md::sequence seq(small_config());
    md::block_pool<> pool(16, 4);
    pool.open(0);
    seq.append(md::regions::system, 4);
    seq.append(md::regions::tool_out, 12);
    pool.append_tokens(0, seq.kv_len());
    seq.advance_to(10);
    std::vector<float> mass(seq.kv_len(), 1.0f / 16);
    seq.observe_tokens(mass);
    const auto plan = seq.select_for_budget();
    seq.commit(plan, pool, 0);
    std::printf("ok: evicted %zu pages, %zu tokens resident, pool consistent %d\n", plan.pages.size(), seq.kv_len(),
                pool.consistent() ? 1 : 0);
    return 0;
  }
  if (std::strcmp(scenario, "config") == 0) {  // config_error tier
    md::config cfg = small_config();
    cfg.alpha = -1.0;
    md::sequence seq(cfg);
    return unreachable(scenario);
  }
  if (std::strcmp(scenario, "budget") == 0) {
    md::config cfg = small_config();
    cfg.budget = md::budget_config::tokens(8, 16);
    md::sequence seq(cfg);
    return unreachable(scenario);
  }
  if (std::strcmp(scenario, "pool_config") == 0) {
    md::block_pool<> pool(8, 3);
    return unreachable(scenario);
  }
  md::sequence seq(small_config());
  seq.append(md::regions::user, 6);
  seq.advance_to(5);
  if (std::strcmp(scenario, "nan") == 0) {  // input_error tier
    std::vector<float> mass(seq.kv_len(), 0.1f);
    mass[1] = std::numeric_limits<float>::quiet_NaN();
    seq.observe_tokens(mass);
    return unreachable(scenario);
  }
  if (std::strcmp(scenario, "length") == 0) {
    std::vector<float> mass(seq.kv_len() + 1, 0.1f);
    seq.observe_tokens(mass);
    return unreachable(scenario);
  }
  if (std::strcmp(scenario, "region") == 0) {
    seq.append(md::region_id{9}, 2);
    return unreachable(scenario);
  }
  if (std::strcmp(scenario, "clock") == 0) {
    seq.advance_to(3);
    return unreachable(scenario);
  }
  if (std::strcmp(scenario, "stale") == 0) {  // usage_error tier
    const auto plan = seq.select(1);
    seq.advance_to(6);
    seq.commit(plan);
    return unreachable(scenario);
  }
  if (std::strcmp(scenario, "pool_usage") == 0) {
    md::block_pool<> pool(8, 4);
    pool.close(7);
    return unreachable(scenario);
  }
  std::fprintf(stderr, "unknown scenario '%s'\n", scenario);
  return 2;
}
