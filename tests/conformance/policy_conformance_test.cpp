// The policy conformance suite: every shipped policy, under basic_policy_sequence, on random agent episodes
// (page sizes 1..16, so the token-level variants too):
//   * the budget holds after each commit whenever the evictable pages suffice, and the shortfall is reported
//     exactly when they do not;
//   * the victims are the k lowest of the policy's own page scores, ties to the lower page index;
//   * pinned, sink, recent, partial and caller-protected pages are never evicted; the page table follows;
//   * the same calls give the same victims and the same digest;
//   * every rejected input (unknown region, bad mass, backwards clock, stale or forged plan, a page table that
//     disagrees) throws its error tier and changes nothing, so the sequence then behaves exactly like a twin
//     that never saw the bad call.
#include <gtest/gtest.h>

#include <memdecay/page_tables/block_pool.hpp>
#include <memdecay/core/manager.hpp>
#include <memdecay/policies/all.hpp>
#include <memdecay/core/sequence.hpp>
#include <memdecay/io/manager_snapshot.hpp>
#include <memdecay/io/snapshot.hpp>

#include "support/policy_cases.hpp"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <tuple>
#include <vector>

namespace md = memdecay;
namespace pol = memdecay::policies;
using policy_cases::all_policies;
using policy_cases::sequence_of;

namespace {

md::config random_config(std::mt19937_64& rng, md::attention_normalization mode) {
  auto uniform = [&](std::uint64_t n) { return static_cast<std::size_t>(rng() % n); };
  const std::size_t P = std::size_t{1} << uniform(5);  // 1..16
  const double high = static_cast<double>(P * (4 + uniform(20)));
  md::config cfg{.alpha = 0.5 * static_cast<double>(uniform(5)),
                 .ewma_beta = 0.1 * static_cast<double>(uniform(10)),
                 .tau = 0.5 * static_cast<double>(uniform(4)),
                 .page_size = P,
                 .normalization = mode,
                 .protection = {.sink_pages = uniform(3), .recent_tokens = uniform(3 * P)},
                 .budget = md::budget_config::tokens(high, high - static_cast<double>(P * uniform(4)))};
  if (uniform(2)) cfg.region_overrides = {{.region = "plan", .pinned = true}};
  return cfg;
}

struct episode_result {
  std::vector<std::vector<std::size_t>> victims;
  std::uint64_t digest = 0;
  friend bool operator==(const episode_result&, const episode_result&) = default;
};

// One random episode; `check` runs the per-step property checks.
template <class Case, class Float>
episode_result run_episode(std::uint64_t seed, bool check) {
  std::mt19937_64 rng(seed);
  auto uniform = [&](std::uint64_t n) { return static_cast<std::size_t>(rng() % n); };
  const md::config cfg = random_config(rng, Case::normalization);
  const std::size_t P = cfg.page_size;
  sequence_of<Case, Float> seq(cfg, Case::template params<Float>());
  md::block_pool<> pool(4096, P);
  pool.open(0);
  episode_result result;
  md::step_t step = 0;
  std::uint64_t pinned_appended = 0;
  for (int round = 0; round < 50; ++round) {
    const auto region = static_cast<md::region_id>(uniform(md::regions::default_count));
    const std::size_t count = 1 + uniform(3 * P);
    seq.append(region, count);
    pool.append_tokens(0, count);
    if (seq.regions().pinned(region)) pinned_appended += count;
    step += static_cast<md::step_t>(uniform(12));
    seq.advance_to(step);
    if (uniform(3)) {
      std::vector<Float> mass(seq.kv_len());
      for (auto& m : mass)
        m = static_cast<Float>(uniform(1000)) / static_cast<Float>(1000 * mass.size()) * (uniform(8) == 0 ? 20 : 1);
      seq.observe_tokens(mass);
    } else if (uniform(2)) {
      std::vector<Float> mass(seq.num_pages());
      for (auto& m : mass) m = static_cast<Float>(uniform(100)) / static_cast<Float>(100 * mass.size());
      seq.observe_pages(mass);
    }
    std::vector<std::size_t> in_flight;
    if (uniform(3) == 0) in_flight.push_back(uniform(seq.num_pages()));
    const auto plan = seq.select_for_budget(in_flight);
    if (check) {
      const auto scores = seq.page_scores();
      const auto status = seq.page_statuses(in_flight);
      EXPECT_EQ(scores, seq.page_scores()) << "page scores are not a pure function of the state";
      for (Float s : scores) EXPECT_FALSE(std::isnan(s)) << "a NaN score";
      std::vector<std::pair<Float, std::size_t>> eligible;
      for (std::size_t p = 0; p < scores.size(); ++p)
        if (status[p] == md::page_status::evictable) eligible.emplace_back(scores[p], p);
      std::sort(eligible.begin(), eligible.end());
      const auto marks = cfg.budget.in_tokens(P, seq.logical_len());
      const std::size_t wanted = seq.kv_len() > marks.high ? (seq.kv_len() - marks.low + P - 1) / P : 0;
      const std::size_t k = std::min(wanted, eligible.size());
      std::vector<std::size_t> expected;
      for (std::size_t i = 0; i < k; ++i) expected.push_back(eligible[i].second);
      std::sort(expected.begin(), expected.end());
      EXPECT_EQ(plan.pages, expected) << "not the k lowest (score, page) evictable pages, round " << round;
      for (std::size_t v : plan.pages) {
        EXPECT_EQ(status[v], md::page_status::evictable) << "evicted page " << v << ": " << md::to_string(status[v]);
        EXPECT_TRUE(std::find(in_flight.begin(), in_flight.end(), v) == in_flight.end())
            << "evicted a caller-protected page";
      }
      const std::uint64_t after = seq.kv_len() - plan.tokens();
      if (after > marks.high) {
        EXPECT_EQ(plan.pages.size(), eligible.size()) << "over budget while evictable pages remain";
        EXPECT_EQ(plan.pages_over_budget, (after - marks.high + P - 1) / P);
      } else {
        EXPECT_EQ(plan.pages_over_budget, 0u);
      }
    }
    result.victims.push_back(plan.pages);
    const auto before = seq.page_scores();
    seq.commit(plan, pool, 0);
    if (check && Case::local_scores) {
      // The policy compacted its per-token state with the layout: the survivors keep their order (among the
      // scores that are finite after the commit).
      const auto after = seq.page_scores();
      std::vector<std::size_t> survivors;
      for (std::size_t p = 0; p < before.size(); ++p)
        if (!std::binary_search(plan.pages.begin(), plan.pages.end(), p)) survivors.push_back(p);
      EXPECT_EQ(survivors.size(), after.size());
      for (std::size_t a = 0; a < survivors.size(); ++a)
        for (std::size_t b = a + 1; b < survivors.size() && b < a + 8; ++b) {
          const Float x = before[survivors[a]], y = before[survivors[b]];
          // A recent window moves with the end of the sequence: a page it now covers may turn to keep_score.
          if (std::isinf(after[a]) || std::isinf(after[b])) continue;
          EXPECT_EQ(x < y, after[a] < after[b]) << "survivors " << survivors[a] << ", " << survivors[b];
          EXPECT_EQ(y < x, after[b] < after[a]) << "survivors " << survivors[a] << ", " << survivors[b];
        }
    }
    if (check) {
      EXPECT_EQ(pool.num_pages(0), seq.num_pages());
      EXPECT_TRUE(pool.consistent());
      std::uint64_t pinned_resident = 0;
      for (md::region_id r : seq.state().regions()) pinned_resident += seq.regions().pinned(r);
      EXPECT_EQ(pinned_resident, pinned_appended) << "a pinned token was evicted";
      const auto positions = seq.positions();
      EXPECT_TRUE(std::is_sorted(positions.begin(), positions.end()));
      EXPECT_EQ(seq.evicted_tokens() % P, 0u);
    }
  }
  result.digest = seq.digest();
  return result;
}

// Runs `call`, expects `Error`, and checks that nothing observable changed.
template <class Error, class Sequence>
void expect_rejected_unchanged(Sequence& seq, const std::function<void()>& call, const char* what) {
  const auto digest = seq.digest();
  const auto generation = seq.generation();
  const auto kv = seq.kv_len();
  const auto scores = seq.page_scores();
  EXPECT_THROW(call(), Error) << what;
  EXPECT_EQ(seq.digest(), digest) << what;
  EXPECT_EQ(seq.generation(), generation) << what;
  EXPECT_EQ(seq.kv_len(), kv) << what;
  const auto after = seq.page_scores();
  EXPECT_EQ(std::memcmp(scores.data(), after.data(), scores.size() * sizeof(scores[0])), 0) << what;
}

}  // namespace

template <class Case>
class PolicyConformance : public ::testing::Test {};

TYPED_TEST_SUITE(PolicyConformance, all_policies);

TYPED_TEST(PolicyConformance, BudgetProtectionsAndLowestScoresOnRandomEpisodes) {
  for (std::uint64_t seed = 1; seed <= 12; ++seed) {
    SCOPED_TRACE(seed);
    run_episode<TypeParam, float>(seed, true);
    run_episode<TypeParam, double>(seed + 100, true);
  }
}

TYPED_TEST(PolicyConformance, SameCallsSameVictimsAndDigest) {
  for (std::uint64_t seed = 1; seed <= 6; ++seed) {
    const auto a = run_episode<TypeParam, float>(seed, false);
    EXPECT_EQ(a, (run_episode<TypeParam, float>(seed, false)));
    std::size_t evicted = 0;
    for (const auto& v : a.victims) evicted += v.size();
    EXPECT_GT(evicted, 0u) << "the episode never evicted: the test would prove nothing";
  }
}

TYPED_TEST(PolicyConformance, PinnedAndProtectedPagesSurviveAnyRequest) {
  md::config cfg{.page_size = 4, .protection = {.sink_pages = 1, .recent_tokens = 5}};
  cfg.region_overrides = {{.region = "plan", .pinned = true}};
  sequence_of<TypeParam, float> seq(cfg, TypeParam::template params<float>());
  seq.append(md::regions::tool_out, 8);  // pages 0 (sink), 1
  seq.append(md::regions::system, 2);    // page 2: pinned (mixed with tool_out)
  seq.append(md::regions::tool_out, 2);
  seq.append(md::regions::plan, 4);         // page 3: pinned by override
  seq.append(md::regions::scratchpad, 14);  // pages 4..7; recent: the last 5 tokens (pages 6, 7); 7 is partial
  seq.advance_to(40);
  seq.observe_tokens(std::vector<float>(seq.kv_len(), 1.0f / static_cast<float>(seq.kv_len())));
  const std::size_t in_flight[] = {4};
  const auto plan = seq.select(100, in_flight);
  EXPECT_EQ(plan.pages, (std::vector<std::size_t>{1, 5}));
  seq.commit(plan);
  EXPECT_EQ(seq.num_pages(), 6u);
  EXPECT_TRUE(seq.select(100, std::vector<std::size_t>{0, 1, 2, 3, 4, 5}).empty());
}

TYPED_TEST(PolicyConformance, RejectedInputsChangeNothing) {
  const md::config cfg{.page_size = 4, .budget = md::budget_config::tokens(24, 16)};
  const auto params = TypeParam::template params<float>();
  sequence_of<TypeParam, float> seq(cfg, params), twin(cfg, params);
  auto both = [&](auto&& f) {
    f(seq);
    f(twin);
  };
  both([](auto& s) {
    s.append(md::regions::system, 4);
    s.append(md::regions::user, 14);
    s.advance_to(10);
    std::vector<float> mass(s.kv_len());
    for (std::size_t i = 0; i < mass.size(); ++i) mass[i] = static_cast<float>(i % 5) / 40.0f;
    s.observe_tokens(mass);
  });

  expect_rejected_unchanged<md::input_error>(
      seq, [&] { seq.append(7, 3); }, "unknown region");
  const md::region_span spans[] = {{md::regions::user, 2}, {200, 1}};
  expect_rejected_unchanged<md::input_error>(
      seq, [&] { seq.append(spans); }, "unknown region in spans");
  const md::region_id labels[] = {0, 1, 9};
  expect_rejected_unchanged<md::input_error>(
      seq, [&] { seq.append_tokens(labels); }, "unknown label");
  expect_rejected_unchanged<md::input_error>(
      seq, [&] { seq.advance_to(9); }, "clock backwards");
  const std::size_t n = seq.kv_len();
  const std::vector<float> short_mass(n - 1, 0.1f), long_mass(n + 1, 0.1f);
  expect_rejected_unchanged<md::input_error>(
      seq, [&] { seq.observe_tokens(short_mass); }, "short");
  expect_rejected_unchanged<md::input_error>(
      seq, [&] { seq.observe_tokens(long_mass); }, "long");
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(), -0.5f}) {
    std::vector<float> mass(n, 0.1f);
    mass[n - 2] = bad;
    expect_rejected_unchanged<md::input_error>(
        seq, [&] { seq.observe_tokens(mass); }, "bad mass");
    std::vector<float> pages(seq.num_pages(), 0.1f);
    pages.back() = bad;
    expect_rejected_unchanged<md::input_error>(
        seq, [&] { seq.observe_pages(pages); }, "bad page mass");
  }
  expect_rejected_unchanged<md::input_error>(
      seq, [&] { seq.observe_pages(std::vector<float>(2, 0.1f)); }, "pages");
  Eigen::MatrixXf heads = Eigen::MatrixXf::Constant(2, static_cast<Eigen::Index>(n + 3), 0.1f);
  expect_rejected_unchanged<md::input_error>(
      seq, [&] { seq.observe_heads(heads, md::head_reduction::sum); }, "heads");

  const auto plan = seq.select(2);
  ASSERT_EQ(plan.pages.size(), 2u);
  auto forged = plan;
  forged.pages = {0};  // the pinned system page
  expect_rejected_unchanged<md::usage_error>(
      seq, [&] { seq.commit(forged); }, "pinned page");
  forged.pages = {4};  // the partial last page
  expect_rejected_unchanged<md::usage_error>(
      seq, [&] { seq.commit(forged); }, "partial page");
  forged.pages = {9};
  expect_rejected_unchanged<md::usage_error>(
      seq, [&] { seq.commit(forged); }, "no such page");
  forged.pages = {2, 1};
  expect_rejected_unchanged<md::usage_error>(
      seq, [&] { seq.commit(forged); }, "unsorted");
  forged = plan;
  forged.page_size = 8;
  expect_rejected_unchanged<md::usage_error>(
      seq, [&] { seq.commit(forged); }, "page size");
  md::block_pool<> short_pool(16, 4), wide_pool(16, 8);
  short_pool.open(1);
  short_pool.append_tokens(1, 8);
  wide_pool.open(1);
  wide_pool.append_tokens(1, n);
  expect_rejected_unchanged<md::usage_error>(
      seq, [&] { seq.commit(plan, short_pool, 1); }, "table too short");
  expect_rejected_unchanged<md::usage_error>(
      seq, [&] { seq.commit(plan, wide_pool, 1); }, "table page size");
  expect_rejected_unchanged<md::usage_error>(
      seq, [&] { seq.commit(plan, short_pool, 2); }, "unknown sequence");
  EXPECT_EQ(short_pool.num_pages(1), 2u);

  // The bad calls left no trace: the sequence and its twin agree from here on.
  const auto stale = seq.select(1);
  both([](auto& s) { s.append(md::regions::tool_out, 3); });
  expect_rejected_unchanged<md::usage_error>(
      seq, [&] { seq.commit(stale); }, "stale plan");
  for (md::step_t step = 11; step < 30; ++step) {
    both([&](auto& s) {
      s.append(md::regions::tool_out, 2);
      s.advance_to(step);
      std::vector<float> mass(s.kv_len());
      for (std::size_t i = 0; i < mass.size(); ++i) mass[i] = static_cast<float>((i * 3 + step) % 7) / 60.0f;
      s.observe_tokens(mass);
    });
    const auto a = seq.select_for_budget(), b = twin.select_for_budget();
    ASSERT_EQ(a.pages, b.pages);
    seq.commit(a);
    twin.commit(b);
  }
  EXPECT_EQ(seq.digest(), twin.digest());
}

TYPED_TEST(PolicyConformance, ExtremeMassIsTakenOrRejectedCleanly) {
  sequence_of<TypeParam, float> seq(md::config{.page_size = 2}, TypeParam::template params<float>());
  seq.append(md::regions::user, 8);
  std::vector<float> mass(8, 0.0f);
  mass[3] = std::numeric_limits<float>::max();
  for (int i = 0; i < 4; ++i) {
    const auto digest = seq.digest();
    try {
      seq.observe_tokens(mass);
    } catch (const md::input_error&) {
      EXPECT_EQ(seq.digest(), digest);
    }
    for (float s : seq.page_scores()) EXPECT_FALSE(std::isnan(s));
  }
}

// One random step for every sequence in `seqs`, the same calls for all: labels, clock, an observation.
template <class Float, class Seq>
void same_random_step(std::mt19937_64& rng, md::step_t& step, std::vector<Seq*> seqs) {
  auto uniform = [&](std::uint64_t n) { return static_cast<std::size_t>(rng() % n); };
  const auto region = static_cast<md::region_id>(uniform(md::regions::default_count));
  const std::size_t count = 1 + uniform(3 * seqs.front()->page_size());
  step += static_cast<md::step_t>(uniform(12));
  std::vector<Float> mass(seqs.front()->kv_len() + count);
  for (auto& m : mass) m = static_cast<Float>(uniform(1000)) / static_cast<Float>(1000 * mass.size());
  for (Seq* s : seqs) {
    s->append(region, count);
    s->advance_to(step);
    if (step % 3 != 0) s->observe_tokens(mass);
  }
}

TYPED_TEST(PolicyConformance, ACopyEvictsExactlyAsTheOriginal) {
  // A fork (beam search, parallel sampling, an agent branch) copies the sequence mid-run, holes and policy state
  // included: from then on the same calls must give both the same victims and the same digest.
  for (std::uint64_t seed = 1; seed <= 6; ++seed) {
    SCOPED_TRACE(seed);
    std::mt19937_64 rng(seed);
    const md::config cfg = random_config(rng, TypeParam::normalization);
    sequence_of<TypeParam, float> seq(cfg, TypeParam::template params<float>());
    md::step_t step = 0;
    std::size_t evicted = 0;
    for (int round = 0; round < 20; ++round) {
      same_random_step<float>(rng, step, std::vector{&seq});
      const auto plan = seq.select_for_budget();
      evicted += plan.pages.size();
      seq.commit(plan);
    }
    auto twin = seq;  // the fork
    EXPECT_EQ(twin.digest(), seq.digest());
    EXPECT_EQ(twin.positions(), seq.positions()) << "the copy must keep the parent's holes";
    for (int round = 0; round < 20; ++round) {
      same_random_step<float>(rng, step, std::vector{&seq, &twin});
      const auto a = seq.select_for_budget(), b = twin.select_for_budget();
      ASSERT_EQ(a.pages, b.pages) << "round " << round;
      evicted += a.pages.size();
      seq.commit(a);
      twin.commit(b);
      ASSERT_EQ(twin.digest(), seq.digest()) << "round " << round;
    }
    EXPECT_GT(evicted, 0u) << "the episode never evicted: the test would prove nothing";
  }
}

TYPED_TEST(PolicyConformance, OneManagerRunsThePolicyUnderAGlobalBudget) {
  // The manager is written against sequence_like, not MemDecay: every policy runs under its global budget with
  // the same guarantees (the budget reached, pinned pages kept, the same victims on every rank).
  using seq_t = sequence_of<TypeParam, float>;
  auto run = [](std::uint64_t seed) {
    md::basic_manager<seq_t> mgr({.page_size = 4, .global = md::global_budget::pages(24, 20)});
    md::block_pool<> pool(1024, 4);
    md::config cfg{.page_size = 4, .normalization = TypeParam::normalization};
    cfg.region_overrides = {{.region = "plan", .pinned = true}};
    std::mt19937_64 rng(seed);
    md::step_t step = 0;
    std::vector<std::uint64_t> digests;
    for (std::uint64_t id = 1; id <= 3; ++id) {
      mgr.open(id, cfg, TypeParam::template params<float>()).append(md::regions::plan, 4);
      pool.open(id);
      pool.append_tokens(id, 4);
    }
    for (int round = 0; round < 30; ++round) {
      step += 1 + static_cast<md::step_t>(rng() % 5);
      mgr.advance_to(step);
      for (std::uint64_t id = 1; id <= 3; ++id) {
        auto& s = mgr.at(id);
        const std::size_t count = 1 + rng() % 9;
        s.append(static_cast<md::region_id>(2 + rng() % 5), count);
        pool.append_tokens(id, count);
        std::vector<float> mass(s.kv_len());
        for (auto& m : mass) m = static_cast<float>(rng() % 100) / static_cast<float>(100 * mass.size());
        s.observe_tokens(mass);
      }
      const auto plan = mgr.select_global();
      digests.push_back(plan.digest());
      mgr.commit(plan, pool, md::identity_id{});
      EXPECT_EQ(plan.pages_short, 0u);
      EXPECT_LE(mgr.physical_pages(), 24u) << "over the global budget";
      for (std::uint64_t id = 1; id <= 3; ++id) {
        EXPECT_EQ(pool.num_pages(id), mgr.at(id).num_pages());
        EXPECT_EQ(mgr.at(id).state().regions()[0], md::regions::plan) << "a pinned page was evicted";
      }
    }
    digests.push_back(mgr.digest());
    return digests;
  };
  EXPECT_EQ(run(7), run(7));
}

namespace {

// One round of random calls, made identically on every sequence in `seqs` (the plan is each one's own, and
// must be the same: the caller compares them).
template <class Seq, class Float>
std::vector<md::eviction_plan<Float>> random_round(std::mt19937_64& rng, std::vector<Seq*> seqs, md::step_t& step) {
  auto uniform = [&](std::uint64_t n) { return static_cast<std::size_t>(rng() % n); };
  const std::size_t P = seqs[0]->page_size();
  const auto region = static_cast<md::region_id>(uniform(md::regions::default_count));
  const std::size_t count = 1 + uniform(3 * P);
  step += static_cast<md::step_t>(uniform(12));
  std::vector<Float> mass;
  const int observe = static_cast<int>(uniform(3));
  const std::size_t kv = seqs[0]->kv_len() + count;
  const std::size_t pages = (kv + P - 1) / P;
  mass.resize(observe == 0 ? kv : observe == 1 ? pages : 0);
  for (auto& m : mass) m = static_cast<Float>(uniform(1000)) / static_cast<Float>(1000 * mass.size());
  std::vector<md::eviction_plan<Float>> plans;
  for (Seq* s : seqs) {
    s->append(region, count);
    s->advance_to(step);
    if (observe == 0) s->observe_tokens(mass);
    if (observe == 1) s->observe_pages(mass);
    plans.push_back(s->select_for_budget());
    s->commit(plans.back());
  }
  return plans;
}

}  // namespace

TYPED_TEST(PolicyConformance, ASnapshotLoadsBitIdenticalAndDecidesAsTheOriginal) {
  std::size_t evicted = 0;
  auto run = [&evicted](std::uint64_t seed, auto float_tag) {
    using Float = decltype(float_tag);
    using Seq = sequence_of<TypeParam, Float>;
    SCOPED_TRACE(testing::Message() << "seed " << seed << ", " << 8 * sizeof(Float) << "-bit");
    std::mt19937_64 rng(seed);
    const md::config cfg = random_config(rng, TypeParam::normalization);
    Seq original(cfg, TypeParam::template params<Float>());
    md::step_t step = 0;
    const std::size_t before = rng() % 30;
    for (std::size_t i = 0; i < before; ++i) random_round<Seq, Float>(rng, {&original}, step);
    const auto bytes = md::snapshot::save(original);
    Seq loaded(cfg, TypeParam::template params<Float>());
    md::snapshot::load(loaded, bytes);
    ASSERT_EQ(loaded.digest(), original.digest());
    ASSERT_EQ(loaded.generation(), original.generation());
    ASSERT_EQ(loaded.positions(), original.positions());
    ASSERT_EQ(md::snapshot::save(loaded), bytes) << "a loaded sequence saves to the same bytes";
    const auto a = original.page_scores(), b = loaded.page_scores();
    ASSERT_EQ(a.size(), b.size());
    if (!a.empty()) {
      ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(Float)), 0) << "scores differ in their bits";
    }
    for (int i = 0; i < 30; ++i) {
      const auto plans = random_round<Seq, Float>(rng, {&original, &loaded}, step);
      ASSERT_EQ(plans[0].pages, plans[1].pages) << "round " << i;
      ASSERT_EQ(plans[0].scores, plans[1].scores) << "round " << i;
      ASSERT_EQ(original.digest(), loaded.digest()) << "round " << i;
      evicted += plans[0].pages.size();
    }
  };
  for (std::uint64_t seed = 1; seed <= 10; ++seed) {
    run(seed, float{});
    run(seed, double{});
  }
  EXPECT_GT(evicted, 0u) << "the episodes never evicted: the comparison would be vacuous";
}

namespace {

// One round of random manager calls (open, fork, close, labels, attention, sharing, protections, the clock, a
// global selection and its commit), made identically on every manager in `mgrs`; returns each one's plan digest.
template <class Mgr>
std::vector<std::uint64_t> random_manager_round(std::mt19937_64& rng, const std::vector<Mgr*>& mgrs,
                                                const md::config& cfg, const typename Mgr::params_type& params,
                                                md::step_t& step, std::uint64_t& next_id) {
  auto uniform = [&](std::uint64_t n) { return static_cast<std::size_t>(rng() % n); };
  using Float = typename Mgr::float_type;
  const auto ids = mgrs[0]->ids();
  const int op = static_cast<int>(uniform(8));
  if (ids.size() < 2 || op == 0) {
    const std::uint64_t id = next_id++;
    const std::size_t system = 1 + uniform(4);
    for (Mgr* m : mgrs) m->open(id, cfg, params).append(md::regions::system, system);
  } else if (op == 1) {
    const std::uint64_t parent = ids[uniform(ids.size())], child = next_id++;
    for (Mgr* m : mgrs) m->fork(parent, child);
  } else if (op == 2 && ids.size() > 3) {
    const std::uint64_t id = ids[uniform(ids.size())];
    for (Mgr* m : mgrs) m->close(id);
  }
  step += static_cast<md::step_t>(uniform(6));
  for (Mgr* m : mgrs) m->advance_to(step);
  const auto now_ids = mgrs[0]->ids();
  for (std::uint64_t id : now_ids) {
    if (uniform(3) == 0) continue;  // a waiting sequence: only its clock moves
    const auto region = static_cast<md::region_id>(uniform(md::regions::default_count));
    const std::size_t count = 1 + uniform(2 * cfg.page_size);
    const std::size_t kv = mgrs[0]->at(id).kv_len() + count;
    std::vector<Float> mass(uniform(2) ? kv : 0);
    for (auto& m : mass) m = static_cast<Float>(uniform(1000)) / static_cast<Float>(1000 * mass.size());
    for (Mgr* m : mgrs) {
      auto& s = m->at(id);
      s.append(region, count);
      if (!mass.empty()) s.observe_tokens(mass);
    }
  }
  if (uniform(4) == 0) {
    const std::uint64_t id = now_ids[uniform(now_ids.size())];
    const std::size_t pages = mgrs[0]->at(id).num_pages();
    const std::vector<std::size_t> one{uniform(pages)};
    const bool flag = uniform(3) != 0;
    for (Mgr* m : mgrs) m->set_shared(id, one, flag);
  }
  if (uniform(2) == 0) {
    const std::uint64_t id = now_ids[uniform(now_ids.size())];
    const std::size_t tokens = uniform(3 * cfg.page_size);
    for (Mgr* m : mgrs) m->protect_tail_tokens(id, tokens);
  }
  std::vector<std::uint64_t> digests;
  for (Mgr* m : mgrs) {
    const auto plan = m->select_global();
    digests.push_back(plan.digest());
    m->commit(plan);
  }
  return digests;
}

}  // namespace

TYPED_TEST(PolicyConformance, AManagerSnapshotChainLoadsBitIdenticalAndDecidesAsTheOriginal) {
  // A full snapshot, then incremental ones (clock and unchanged records among them), loaded as a chain at a random
  // point: the loaded manager has the original's digest, saves to the same bytes, and selects the same victims
  // for every later call.
  std::size_t evicted = 0, light_records = 0;
  auto run = [&](std::uint64_t seed, auto float_tag) {
    using Float = decltype(float_tag);
    using Seq = sequence_of<TypeParam, Float>;
    using Mgr = md::basic_manager<Seq>;
    SCOPED_TRACE(testing::Message() << "seed " << seed << ", " << 8 * sizeof(Float) << "-bit");
    std::mt19937_64 rng(seed);
    md::config cfg = random_config(rng, TypeParam::normalization);
    const auto params = TypeParam::template params<Float>();
    const md::manager_config mcfg{.page_size = cfg.page_size, .global = md::global_budget::pages(40, 32)};
    Mgr original(mcfg);
    md::step_t step = 0;
    std::uint64_t next_id = 1;
    md::snapshot::checkpoint cp;
    std::vector<std::vector<std::byte>> chain;
    const std::size_t rounds = 5 + rng() % 25;
    for (std::size_t i = 0; i < rounds; ++i) {
      random_manager_round<Mgr>(rng, {&original}, cfg, params, step, next_id);
      if (rng() % 3 == 0 || i + 1 == rounds) {
        chain.push_back(md::snapshot::save(original, cp));
        if (rng() % 2 == 0) {  // a quiet moment: only the clocks move (clock records), then nothing (unchanged)
          original.advance_to(++step);
          chain.push_back(md::snapshot::save(original, cp));
          chain.push_back(md::snapshot::save(original, cp));
          light_records += chain.back().size() < chain.front().size() / 2 ? 1 : 0;
        }
      }
    }
    Mgr loaded(mcfg);
    md::snapshot::load(loaded, chain, cfg, params);
    ASSERT_EQ(loaded.digest(), original.digest());
    ASSERT_EQ(loaded.ids(), original.ids());
    ASSERT_EQ(md::snapshot::save(loaded), md::snapshot::save(original)) << "a loaded manager saves to the same bytes";
    for (std::uint64_t id : original.ids()) {
      ASSERT_EQ(loaded.at(id).digest(), original.at(id).digest()) << "sequence " << id;
      ASSERT_EQ(loaded.protected_pages(id), original.protected_pages(id)) << "sequence " << id;
      ASSERT_EQ(loaded.shared_pages(id), original.shared_pages(id)) << "sequence " << id;
    }
    ASSERT_EQ(loaded.physical_pages(), original.physical_pages());
    for (int i = 0; i < 20; ++i) {
      const auto digests = random_manager_round<Mgr>(rng, {&original, &loaded}, cfg, params, step, next_id);
      ASSERT_EQ(digests[0], digests[1]) << "round " << i;
      ASSERT_EQ(original.digest(), loaded.digest()) << "round " << i;
    }
    for (std::uint64_t id : original.ids()) evicted += original.at(id).evicted_tokens();
  };
  for (std::uint64_t seed = 1; seed <= 6; ++seed) {
    run(seed, float{});
    run(seed, double{});
  }
  EXPECT_GT(light_records, 0u) << "no incremental snapshot was smaller than the full one: the deltas were not tried";
  EXPECT_GT(evicted, 0u) << "the episodes never evicted: the comparison would be vacuous";
}
