// A consumer of the installed (or add_subdirectory'd) package: includes the umbrella header, runs a selection.
#include <memdecay/memdecay.hpp>

#include <cstdio>

int main() {
  memdecay::sequence seq(memdecay::config{.page_size = 4, .budget = memdecay::budget_config::tokens(8)});
  seq.append(memdecay::regions::system, 4);
  seq.append(memdecay::regions::scratchpad, 12);
  seq.advance_to(10);
  const auto plan = seq.select_for_budget();
  seq.commit(plan);
  if (seq.kv_len() != 8 || seq.evicted_tokens() != 8) return 1;
  std::printf("consumer ok: memdecay %s, %zu tokens resident\n", memdecay::version_string, seq.kv_len());
  return 0;
}
