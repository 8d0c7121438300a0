// SPDX-License-Identifier: Apache-2.0
// The soak test (issue 18): many sequences through open / append / observe / select / commit / fork / close /
// save / load cycles for a bounded time, against a twin manager that makes the same calls and is never saved.
// Every few cycles the live manager checkpoints (an incremental save into its chain); every few more it is
// replaced by a load of its own chain, and its digest must equal the twin's. Memory must stay flat: the resident
// set after the warm-up and at the end are reported (and the run fails if the end exceeds the warm-up by more
// than --rss-slack percent). Not part of the CI run; one command, bounded in time and cycles:
//
//   tools/soak                       # the ASan/UBSan build, 10^4 sequences, 10 minutes
//   build/debug/tests/soak/memdecay_soak --sequences 10000 --seconds 600 --cycles 1000000
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <memdecay/core/manager.hpp>
#include <memdecay/io/manager_snapshot.hpp>

namespace md = memdecay;

namespace {

struct options {
  std::size_t sequences = 10000;
  double seconds = 600;
  std::size_t cycles = 1000000;
  std::size_t batch = 64;  // sequences that run (append + observe) per cycle
  double rss_slack = 25;   // percent
  std::uint64_t seed = 1;
};

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i];
    const char* v = argv[i + 1];
    if (key == "--sequences")
      o.sequences = std::strtoull(v, nullptr, 10);
    else if (key == "--seconds")
      o.seconds = std::strtod(v, nullptr);
    else if (key == "--cycles")
      o.cycles = std::strtoull(v, nullptr, 10);
    else if (key == "--batch")
      o.batch = std::strtoull(v, nullptr, 10);
    else if (key == "--rss-slack")
      o.rss_slack = std::strtod(v, nullptr);
    else if (key == "--seed")
      o.seed = std::strtoull(v, nullptr, 10);
    else {
      std::fprintf(stderr, "unknown option %s\n", key.c_str());
      std::exit(2);
    }
  }
  return o;
}

// VmRSS or VmHWM of this process, in MiB.
double status_mib(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(field, 0) == 0) return std::strtod(line.c_str() + std::strlen(field) + 1, nullptr) / 1024.0;
  return 0;
}

md::config sequence_config() {
  return md::config{.page_size = 16, .budget = md::budget_config::tokens(384, 320)};
}

[[noreturn]] void diverged(const char* what, std::size_t cycle) {
  std::fprintf(stderr, "soak: DIVERGED at cycle %zu: %s\n", cycle, what);
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  const options o = parse(argc, argv);
  const md::manager_config mcfg{.page_size = 16,
                                .global = md::global_budget::pages(o.sequences * 20, o.sequences * 18)};
  md::manager live(mcfg), twin(mcfg);
  std::mt19937_64 rng(o.seed);
  std::uint64_t next_id = 0;
  std::vector<std::uint64_t> ids;
  auto both = [&](auto&& call) {
    call(live);
    call(twin);
  };
  auto open_one = [&] {
    // Near the sequence budget (384 tokens) from the start, so that the running batch's appends make it evict.
    const std::uint64_t id = next_id++;
    const std::size_t system = 16 + rng() % 48, history = 240 + rng() % 96;
    both([&](md::manager& m) {
      auto& s = m.open(id, sequence_config());
      s.append(md::regions::system, system);
      s.append(md::regions::tool_out, history);
    });
    ids.push_back(id);
  };
  for (std::size_t i = 0; i < o.sequences; ++i) open_one();

  md::snapshot::checkpoint cp;
  std::vector<std::vector<std::byte>> chain;
  std::vector<float> mass;
  std::size_t saves = 0, loads = 0, forks = 0, closes = 0, evicted_pages = 0, bytes_saved = 0;
  double rss_warm = 0;
  const auto start = std::chrono::steady_clock::now();
  std::size_t cycle = 0;
  for (; cycle < o.cycles; ++cycle) {
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (elapsed >= o.seconds) break;
    both([&](md::manager& m) { m.advance_to(static_cast<md::step_t>(cycle + 1)); });
    // A running batch appends and observes.
    for (std::size_t k = 0; k < o.batch; ++k) {
      const std::uint64_t id = ids[rng() % ids.size()];
      const auto region = static_cast<md::region_id>(1 + rng() % 6);
      const std::size_t count = 8 + rng() % 40;
      const std::size_t kv = live.at(id).kv_len() + count;
      mass.resize(kv);
      for (auto& x : mass) x = static_cast<float>(rng() % 1000) / (1000.0f * static_cast<float>(kv));
      both([&](md::manager& m) {
        auto& s = m.at(id);
        s.append(region, count);
        s.observe_tokens(mass);
      });
    }
    // Close, fork and open: the population stays near its size.
    if (rng() % 4 == 0) {
      const std::size_t k = rng() % ids.size();
      const std::uint64_t id = ids[k];
      both([&](md::manager& m) { m.close(id); });
      ids[k] = ids.back();
      ids.pop_back();
      ++closes;
      if (rng() % 2 == 0) {
        const std::uint64_t parent = ids[rng() % ids.size()], child = next_id++;
        both([&](md::manager& m) { m.fork(parent, child); });
        ids.push_back(child);
        ++forks;
      } else {
        open_one();
      }
    }
    if (rng() % 3 == 0) {
      const std::uint64_t id = ids[rng() % ids.size()];
      const std::size_t drafts = rng() % 8;
      both([&](md::manager& m) { m.protect_tail_tokens(id, drafts); });
    }
    const auto plan = live.select_global();
    if (plan.digest() != twin.select_global().digest()) diverged("the global plans differ", cycle);
    both([&](md::manager& m) { m.commit(plan); });
    evicted_pages += plan.victims.size();
    // Checkpoints and restores.
    if (cycle % 8 == 0) {
      chain.push_back(md::snapshot::save(live, cp));
      bytes_saved += chain.back().size();
      ++saves;
    }
    if (cycle % 64 == 32) {
      md::manager restored(mcfg);
      md::snapshot::load(restored, chain, sequence_config());
      live = std::move(restored);  // the restored manager carries on; its checkpoints start over
      cp.reset();
      chain.clear();
      ++loads;
      if (live.digest() != twin.digest()) diverged("the restored manager's digest differs from the twin's", cycle);
    }
    // The warm-up: the population, the chain and the sanitizer's quarantine of freed memory have filled.
    if (rss_warm == 0 && cycle >= 128 && elapsed >= o.seconds * 0.1) rss_warm = status_mib("VmRSS:");
  }
  if (live.digest() != twin.digest()) diverged("the final digests differ", cycle);
  if (cycle > 200 && evicted_pages == 0) {
    std::fprintf(stderr, "soak: nothing was evicted: the commits were never exercised\n");
    return 1;
  }
  const double rss_end = status_mib("VmRSS:"), hwm = status_mib("VmHWM:");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "soak: %zu cycles in %.0f s, %zu sequences open (%llu opened in all), %zu forks, %zu closes, %zu pages "
      "evicted, %zu saves (%.1f MiB), %zu restores; no divergence. RSS after warm-up %.1f MiB, at the end %.1f MiB, "
      "peak %.1f MiB\n",
      cycle, seconds, ids.size(), static_cast<unsigned long long>(next_id), forks, closes, evicted_pages, saves,
      static_cast<double>(bytes_saved) / (1024.0 * 1024.0), loads, rss_warm, rss_end, hwm);
  if (rss_warm > 0 && rss_end > rss_warm * (1.0 + o.rss_slack / 100.0)) {
    std::fprintf(stderr, "soak: memory grew from %.1f to %.1f MiB (more than %.0f%%)\n", rss_warm, rss_end,
                 o.rss_slack);
    return 1;
  }
  return 0;
}
