// SPDX-License-Identifier: Apache-2.0
// ThreadSanitizer test of the documented concurrency of memdecay::manager and basic_sequence
// (docs/reliability.md, "Thread safety"): build with -fsanitize=thread (tests/tsan/CMakeLists.txt).
//
// Every step of an engine loop, as the documentation allows it:
//   1. one thread per group of sequences: each thread appends to and observes ONLY its own sequences, reached
//      through manager::at(id) (a lookup, no change to the manager), while the other threads do the same to theirs;
//   2. one thread (this one) does the manager-level mutations: advance_to, protect_tail_tokens;
//   3. several threads run const queries at once on the same manager: select_global(), select(id), digest(),
//      page_scores(), and all of them must get the same answer;
//   4. one thread commits the global plan.
// A third run does steps 1, 2 and 4 through the manager's batch step (observe_batch, advance_to and select_global
// on a thread_pool whose waiting threads spin, the default) and must make the same decisions; a fourth, on a pool
// whose threads sleep as soon as they wait. Last, a long sequence's digest bounds split over the pool's threads.
// Every other sequence has a host tier, under a host pool they share: observations cover device tokens, the global
// plans demote and drop, step 2 also commits a recall, and step 3's queries include recall plans.
// TSan reports any data race (the test fails with exit code 66); the test also checks that the threaded run made
// exactly the decisions of the same calls made on one thread (decisions never depend on threads).
// With the argument `race`, two threads feed the SAME sequence (what the documentation forbids), to show that
// TSan catches it in this build (CTest manager_tsan_detects_a_race expects its report).
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <thread>
#include <vector>

#include "memdecay/core/executor.hpp"
#include "memdecay/core/manager.hpp"
#include "memdecay/digests/page_digests.hpp"

namespace md = memdecay;

namespace {

constexpr int threads = 4;
constexpr std::uint64_t sequences = 8;
constexpr int steps = 40;

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "tsan_test: FAILED: %s\n", what);
  std::exit(1);
}

md::config config_for(std::uint64_t id) {
  md::config c;
  c.page_size = 4;
  c.budget = md::budget_config::pages(static_cast<double>(6 + id % 3), static_cast<double>(4 + id % 3));
  return c;
}

// The work of one sequence in one step: a few tokens of a region, then an attention observation over every
// resident token. Deterministic in (id, step).
void append_for(md::sequence& seq, std::uint64_t id, int step) {
  seq.append(static_cast<md::region_id>(1 + (id + static_cast<std::uint64_t>(step)) % 6), 1 + (id + step) % 5);
}
std::vector<float> mass_for(const md::sequence& seq, std::uint64_t id, int step) {
  std::vector<float> mass(seq.device_len());
  for (std::size_t i = 0; i < mass.size(); ++i)
    mass[i] = static_cast<float>((i * 7 + id * 3 + static_cast<std::size_t>(step)) % 11) / 11.0f;
  return mass;
}
void feed(md::sequence& seq, std::uint64_t id, int step) {
  append_for(seq, id, step);
  (void)seq.observe_tokens(mass_for(seq, id, step));
  (void)seq.select(2);  // a const query on one's own sequence between mutations
}

// Query bounds that favour the pages whose origin matches the step: deterministic in (layout, step).
std::vector<float> bounds_for(const md::sequence& seq, int step) {
  std::vector<float> bounds(seq.num_pages());
  const auto origins = seq.state().page_origins();
  for (std::size_t p = 0; p < bounds.size(); ++p)
    bounds[p] = static_cast<float>((origins[p] * 5 + static_cast<std::uint64_t>(step)) % 7);
  return bounds;
}
std::uint64_t recalled = 0;  // pages step 2 promoted (this thread only)

// Step 2's recall: one tiered sequence per step, through the manager (one thread: it changes the manager).
std::uint64_t recall_one(md::manager& mgr, int step) {
  const std::uint64_t id = 10 * (1 + 2 * static_cast<std::uint64_t>(step % (sequences / 2)));
  const auto plan = mgr.select_recall_for_bounds(id, bounds_for(mgr.at(id), step));
  mgr.commit_recall(id, plan);
  recalled += plan.promote.size();
  return plan.pages_moved() + 100 * mgr.host_pages();
}

// Step 3's const queries on the whole manager, hashed: every thread (and every run) must see the same.
std::uint64_t queries(const md::manager& cmgr, const md::manager::global_plan_type& plan, int step) {
  std::uint64_t h = plan.digest() ^ cmgr.digest();
  for (std::uint64_t id : cmgr.ids()) {
    h += cmgr.select(id).pages.size() + cmgr.at(id).page_scores().size() + cmgr.protected_pages(id).size();
    if (cmgr.at(id).has_host_tier())
      h += cmgr.select_recall_for_bounds(id, bounds_for(cmgr.at(id), step)).pages_moved();
  }
  return h + cmgr.host_pages();
}

// Runs the loop; `threaded` spreads steps 1 and 3 over threads; `batched` does step 1's observations, the clock and
// the global selection through the manager's batch step on a thread_pool (core/executor.hpp) instead. Returns a
// digest of every decision.
std::uint64_t run(bool threaded, bool race = false, bool batched = false,
                  std::chrono::microseconds spin = md::thread_pool::default_spin) {
  md::manager mgr({.page_size = 4, .global = md::global_budget::pages(30, 24), .host_pool = 10});
  for (std::uint64_t id = 0; id < sequences; ++id) {
    auto& seq = mgr.open(id * 10, config_for(id));
    if (id % 2 == 1) seq.enable_host_tier({.min_host_priority = 0.3, .min_device_steps = 2});
  }
  md::thread_pool executor(threads, spin);
  md::detail::fnv1a64 decisions;
  for (int step = 1; step <= steps; ++step) {
    if (batched) {
      std::vector<std::vector<float>> masses;
      std::vector<md::manager::observation> batch;
      for (std::uint64_t id = 0; id < sequences; ++id) append_for(mgr.at(id * 10), id, step);
      for (std::uint64_t id = 0; id < sequences; ++id) masses.push_back(mass_for(mgr.at(id * 10), id, step));
      for (std::uint64_t id = 0; id < sequences; ++id) batch.push_back({id * 10, masses[id]});
      (void)mgr.observe_batch(batch, executor);
      mgr.advance_to(static_cast<md::step_t>(step), executor);
      mgr.protect_tail_tokens(10 * static_cast<std::uint64_t>(step % sequences), 3);
      decisions.add(recall_one(mgr, step));
      const auto plan = mgr.select_global(static_cast<std::size_t>(step % 3), executor);
      decisions.add(plan.digest()).add(queries(mgr, plan, step));
      mgr.commit(plan);
      continue;
    }
    // 1. Each thread its own sequences.
    auto own = [&](int t) {
      if (race) {
        feed(mgr.at(0), 0, step);  // every thread on sequence 0: a data race
        return;
      }
      for (std::uint64_t id = static_cast<std::uint64_t>(t); id < sequences; id += threads)
        feed(mgr.at(id * 10), id, step);
    };
    if (threaded) {
      std::vector<std::jthread> pool;
      for (int t = 0; t < threads; ++t) pool.emplace_back(own, t);
    } else {
      for (int t = 0; t < threads; ++t) own(t);
    }
    // 2. Manager-level mutations: one thread.
    mgr.advance_to(static_cast<md::step_t>(step));
    mgr.protect_tail_tokens(10 * static_cast<std::uint64_t>(step % sequences), 3);
    decisions.add(recall_one(mgr, step));
    // 3. Concurrent const queries on the same manager: every thread must see the same plan.
    const auto& cmgr = mgr;
    std::vector<std::uint64_t> seen(threads);
    auto query = [&](int t) {
      seen[static_cast<std::size_t>(t)] = queries(cmgr, cmgr.select_global(static_cast<std::size_t>(step % 3)), step);
    };
    if (threaded) {
      std::vector<std::jthread> pool;
      for (int t = 0; t < threads; ++t) pool.emplace_back(query, t);
    } else {
      for (int t = 0; t < threads; ++t) query(t);
    }
    for (int t = 1; t < threads; ++t)
      if (seen[static_cast<std::size_t>(t)] != seen[0]) fail("concurrent const queries disagree");
    // 4. One thread commits.
    const auto plan = mgr.select_global(static_cast<std::size_t>(step % 3));
    decisions.add(plan.digest()).add(seen[0]);
    mgr.commit(plan);
  }
  decisions.add(mgr.digest()).add(static_cast<std::uint64_t>(mgr.resident_pages()));
  if (mgr.host_pages() == 0 || recalled == 0) fail("the tiers were not exercised (no host page or no recall)");
  return decisions.value();
}

// The digest bounds of a long sequence split over a pool's threads (digests/digest_bounds_on.hpp): the tasks write
// disjoint columns of one output while reading the same digests and query; the same bits as one call.
bool pooled_bounds_match(std::chrono::microseconds spin) {
  md::page_digests d({.kv_heads = 2, .head_dim = 16, .query_heads = 4, .storage = md::digest_storage::f16});
  const std::size_t pages = 3 * md::simd::digest_task_pages + 5;
  d.resize(pages);
  std::vector<float> keys(2 * 2 * 16);
  for (std::size_t p = 0; p < pages; ++p) {
    for (std::size_t i = 0; i < keys.size(); ++i) keys[i] = static_cast<float>((p * 31 + i * 7) % 23) / 11.0f - 1.0f;
    d.set_from_keys(p, keys);
  }
  std::vector<float> query(4 * 16);
  for (std::size_t i = 0; i < query.size(); ++i) query[i] = static_cast<float>(i % 5) - 2.0f;
  std::vector<float> one(4 * pages), pooled(4 * pages);
  d.bounds(query, one);
  md::thread_pool pool(threads, spin);
  d.bounds(query, pooled, pool);
  return one == pooled;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string_view(argv[1]) == "race") {
    (void)run(true, true);
    std::printf("tsan_test: the racy run ended without a report\n");
    return 1;
  }
  const std::uint64_t serial = run(false);
  const std::uint64_t threaded = run(true);
  if (serial != threaded) fail("the threaded run made other decisions than the serial one");
  if (run(false, false, true) != serial) fail("the batch step on a thread_pool made other decisions");
  if (run(false, false, true, std::chrono::microseconds{0}) != serial)
    fail("the batch step on a thread_pool whose threads sleep at once made other decisions");
  if (!pooled_bounds_match(md::thread_pool::default_spin) || !pooled_bounds_match(std::chrono::microseconds{0}))
    fail("the digest bounds on a thread_pool differ from one call's");
  std::printf("tsan_test: OK: %d threads, %llu sequences, %d steps, same decisions as one thread (%016llx)\n", threads,
              static_cast<unsigned long long>(sequences), steps, static_cast<unsigned long long>(threaded));
  return 0;
}
