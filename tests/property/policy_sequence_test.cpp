// Tests for sequence.hpp: the one evictor. Under it, policies::memdecay must match the scalar reference on the same
// calls (random episodes, float and double, none and uniform, both scorers); the evictor's own contract
// (compile-time page sizes, parameter validation, views, digests) is checked here, the per-policy contract in
// policy_conformance_test.cpp.
#include <gtest/gtest.h>

#include <memdecay/page_tables/block_pool.hpp>
#include <memdecay/policies/all.hpp>
#include <memdecay/core/sequence.hpp>
#include <memdecay/core/token_state.hpp>

#include <Eigen/Core>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace md = memdecay;
namespace pol = memdecay::policies;

namespace {

template <class Float>
bool bitwise_equal(const std::vector<Float>& a, const std::vector<Float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(Float)) == 0);
}

// Drives the evictor (MemDecay under basic_sequence) and a scalar model with identical calls and checks after every
// step: EWMA and refresh clocks bit for bit those of observe_tokens_reference on a token_state, page scores within
// the scorers' tolerance of page_scores_reference, every victim among the lowest reference scores (to within that
// tolerance), the layout and the page table. The evictor scores with the exp-free kernel (the default) or the
// polynomial one; `fast_regions` gives two regions half-lives of 2 and 3 steps, so the exp-free clock rebases every
// 115 steps (several times per episode).
template <class Float>
void same_as_scalar_reference(std::uint64_t seed, md::attention_normalization mode, bool expfree = true,
                              bool fast_regions = false) {
  std::mt19937_64 rng(seed);
  auto uniform = [&](std::uint64_t n) { return static_cast<std::size_t>(rng() % n); };
  const std::size_t P = std::size_t{1} << uniform(5);
  const double high = static_cast<double>(P * (4 + uniform(20)));
  md::config cfg{.alpha = 0.5 * static_cast<double>(uniform(5)),
                 .ewma_beta = 0.1 * static_cast<double>(uniform(10)),
                 .tau = mode == md::attention_normalization::uniform ? 0.5 * static_cast<double>(uniform(6))
                                                                     : 0.01 * static_cast<double>(uniform(30)),
                 .page_size = P,
                 .normalization = mode,
                 .protection = {.sink_pages = uniform(3), .recent_tokens = uniform(3 * P)},
                 .budget = md::budget_config::tokens(high, high - static_cast<double>(P * uniform(4)))};
  if (uniform(2)) cfg.region_overrides = {{.region = "plan", .pinned = true}};
  if (fast_regions) {
    cfg.region_overrides.push_back({.region = "scratchpad", .half_life = 2.0});
    cfg.region_overrides.push_back({.region = "tool_out", .half_life = 3.0});
  }
  md::basic_sequence<pol::memdecay, Float> seq(cfg);
  ASSERT_EQ(seq.use_expfree_scores(expfree), expfree);
  ASSERT_EQ(seq.expfree_scores(), expfree);
  md::token_state<Float> model(P);
  const md::region_table table = cfg.effective_regions();
  const auto alpha = static_cast<Float>(cfg.alpha);
  md::block_pool<> pool(4096, P);
  pool.open(0);
  md::step_t step = 0;
  auto observe_model = [&](std::vector<Float> mass) {
    const md::observation_params<Float> params{static_cast<Float>(cfg.effective_beta()), static_cast<Float>(cfg.tau),
                                               md::normalization_scale<Float>(mode, model.kv_len())};
    std::size_t refreshed = md::observe_tokens_reference<Float>(model.ewma_mut(), model.last_refresh_mut(),
                                                                std::span<const Float>(mass), model.now(), params);
    model.touch();
    return refreshed;
  };
  for (int round = 0; round < 50; ++round) {
    const auto region = static_cast<md::region_id>(uniform(md::regions::default_count));
    const std::size_t count = 1 + uniform(3 * P);
    const md::region_span span{region, count};
    model.append(std::span<const md::region_span>(&span, 1));
    seq.append(region, count);
    pool.append_tokens(0, count);
    step += static_cast<md::step_t>(uniform(fast_regions ? 40 : 12));
    model.advance_to(step);
    seq.advance_to(step);
    switch (uniform(4)) {
      case 0: break;  // no attention this step
      case 1: {
        std::vector<Float> mass(seq.kv_len());
        for (auto& m : mass)
          m = static_cast<Float>(uniform(1000)) / static_cast<Float>(1000 * mass.size()) * (uniform(8) == 0 ? 20 : 1);
        EXPECT_EQ(seq.observe_tokens(mass), observe_model(mass));
        break;
      }
      case 2: {
        std::vector<Float> mass(seq.num_pages());
        for (auto& m : mass) m = static_cast<Float>(uniform(1000)) / static_cast<Float>(1000 * mass.size());
        std::vector<Float> spread(seq.kv_len());
        for (std::size_t i = 0; i < spread.size(); ++i)
          spread[i] = mass[i / P] / static_cast<Float>(model.tokens_in_page(i / P));
        EXPECT_EQ(seq.observe_pages(mass), observe_model(spread));
        break;
      }
      default: {
        Eigen::Matrix<Float, Eigen::Dynamic, Eigen::Dynamic> heads(2, static_cast<Eigen::Index>(seq.kv_len()));
        for (Eigen::Index h = 0; h < heads.rows(); ++h)
          for (Eigen::Index i = 0; i < heads.cols(); ++i)
            heads(h, i) = static_cast<Float>(uniform(100)) / static_cast<Float>(100 * heads.cols());
        const auto reduced = md::reduce_heads(heads, md::head_reduction::mean);
        EXPECT_EQ(seq.observe_heads(heads, md::head_reduction::mean),
                  observe_model(std::vector<Float>(reduced.begin(), reduced.end())));
      }
    }
    ASSERT_TRUE(bitwise_equal(std::vector<Float>(model.ewma().begin(), model.ewma().end()),
                              std::vector<Float>(seq.policy().ewma().begin(), seq.policy().ewma().end())))
        << "round " << round;
    ASSERT_TRUE(std::equal(model.last_refresh().begin(), model.last_refresh().end(),
                           seq.policy().last_refresh().begin(), seq.policy().last_refresh().end()));
    std::vector<Float> ref(model.num_pages());
    md::page_scores_reference(model, table, alpha, std::span<Float>(ref));
    const auto got = seq.page_scores();
    auto tolerance = [&](std::size_t p) {
      return static_cast<Float>(16 + P) * std::numeric_limits<Float>::epsilon() * (Float{1} + std::abs(ref[p]));
    };
    for (std::size_t p = 0; p < ref.size(); ++p) ASSERT_NEAR(got[p], ref[p], tolerance(p)) << "page " << p;
    std::vector<std::size_t> in_flight;
    if (uniform(3) == 0 && seq.num_pages() > 0) in_flight.push_back(uniform(seq.num_pages()));
    std::vector<md::page_status> status(model.num_pages());
    md::page_statuses(model, table, seq.protection(), in_flight, std::span<md::page_status>(status));
    EXPECT_EQ(seq.page_statuses(in_flight), status);
    const auto plan = seq.select_for_budget(in_flight);
    EXPECT_EQ(plan.requested, md::detail::pages_wanted_by_budget(cfg.budget, P, model.logical_len(), model.kv_len()));
    for (std::size_t v : plan.pages) {
      ASSERT_EQ(status[v], md::page_status::evictable);
      for (std::size_t p = 0; p < ref.size(); ++p) {
        if (status[p] != md::page_status::evictable || std::binary_search(plan.pages.begin(), plan.pages.end(), p))
          continue;
        EXPECT_LE(ref[v], ref[p] + tolerance(v) + tolerance(p)) << "victim " << v << " over survivor " << p;
      }
    }
    seq.commit(plan, pool, 0);
    model.remove_pages(plan.pages);
    ASSERT_EQ(model.kv_len(), seq.kv_len());
    EXPECT_EQ(model.positions(), seq.positions());
    EXPECT_EQ(model.prefix_cache_boundary(), seq.prefix_cache_boundary());
    EXPECT_EQ(pool.num_pages(0), seq.num_pages());
  }
}

// The polynomial kernel's page scores of the policy's state at the view's step.
void ms_score_pages(const md::sequence_view& v, const pol::memdecay<float>& p, const md::config& cfg,
                    std::vector<float>& out) {
  const md::simd::region_lut<float> lut(*v.regions);
  md::simd::score_pages(v.labels.data(), p.last_refresh().data(), p.ewma().data(), v.kv_len(), v.page_size, v.now, lut,
                        static_cast<float>(cfg.alpha), out.data());
}

}  // namespace

// 30 seeds per variant, looped inside one test (one process per variant under CTest: a process per seed cost more
// to start under the sanitizers than the episodes take to run).
template <class Float>
void thirty_episodes(md::attention_normalization mode, bool expfree = true, bool fast_regions = false) {
  for (std::uint64_t seed = 1; seed <= 30; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    same_as_scalar_reference<Float>(seed, mode, expfree, fast_regions);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST(MemDecayPolicyEpisodes, FloatNoneMatchesTheScalarReference) {
  thirty_episodes<float>(md::attention_normalization::none);
}
TEST(MemDecayPolicyEpisodes, FloatUniformMatchesTheScalarReference) {
  thirty_episodes<float>(md::attention_normalization::uniform);
}
TEST(MemDecayPolicyEpisodes, DoubleNoneMatchesTheScalarReference) {
  thirty_episodes<double>(md::attention_normalization::none);
}
TEST(MemDecayPolicyEpisodes, DoubleUniformMatchesTheScalarReference) {
  thirty_episodes<double>(md::attention_normalization::uniform);
}
TEST(MemDecayPolicyEpisodes, FloatNoneAcrossExpfreeRebases) {
  thirty_episodes<float>(md::attention_normalization::none, true, true);
}
TEST(MemDecayPolicyEpisodes, DoubleUniformAcrossExpfreeRebases) {
  thirty_episodes<double>(md::attention_normalization::uniform, true, true);
}
TEST(MemDecayPolicyEpisodes, FloatUniformPolynomialScorer) {
  thirty_episodes<float>(md::attention_normalization::uniform, false);
}

TEST(PolicySequence, FusedObservationWhereTheBuildHasFma) {
  // The sequences run the fused observation kernels exactly when the build has FMA instructions; this file is
  // also built with -mavx2 -mfma (tests/CMakeLists.txt: policy_sequence_test_fma) so both paths are covered.
#if defined(__FMA__) || defined(__AVX512F__) || defined(__aarch64__)
  EXPECT_TRUE(md::simd::fused_observation_exact);
#else
  EXPECT_FALSE(md::simd::fused_observation_exact);
#endif
}

TEST(PolicySequence, MemDecayPolicyWithoutOnAdvanceFallsBackToThePolynomialScorer) {
  // A driver that never calls on_advance (here: a copy of the policy, left behind when the sequence's clock
  // moves) must not score from stale exp-free factors: it gets the polynomial kernel's scores for the new step.
  md::config cfg{.page_size = 8};
  md::policy_sequence<pol::memdecay> seq(cfg);
  ASSERT_TRUE(seq.policy().expfree_scores());
  for (int k = 0; k < 30; ++k) seq.append(static_cast<md::region_id>(k % 7), 1 + k % 11);
  seq.advance_to(40);
  std::vector<float> mass(seq.kv_len(), 0.5f / static_cast<float>(seq.kv_len()));
  mass[3] = 0.4f;
  seq.observe_tokens(mass);
  const pol::memdecay<float> stale = seq.policy();  // its clock stays at step 40
  seq.advance_to(1000);                             // past a rebase (span 865 for the default regions)
  std::vector<float> got(seq.num_pages()), poly(seq.num_pages());
  stale.page_scores(seq.view(), std::span<float>(got));
  const auto v = seq.view();
  ms_score_pages(v, stale, cfg, poly);
  EXPECT_EQ(got, poly);
  // The sequence's own policy followed the clock: its exp-free scores agree with those to the kernels' tolerance.
  const auto fresh = seq.page_scores();
  for (std::size_t p = 0; p < fresh.size(); ++p) EXPECT_NEAR(fresh[p], poly[p], 1e-5f * poly[p] + 1e-30f) << p;
}

TEST(PolicySequence, EveryNormalisationRunsInTheOneEvictor) {
  // memdecay::sequence rejected lifetime and zscore while it was a second evictor; now it is this one.
  static_assert(std::is_same_v<md::sequence, md::policy_sequence<pol::memdecay>>);
  for (auto mode : {md::attention_normalization::none, md::attention_normalization::uniform,
                    md::attention_normalization::lifetime, md::attention_normalization::zscore}) {
    md::sequence seq(md::config{.page_size = 4, .normalization = mode});
    seq.append(md::regions::tool_out, 16);
    seq.advance_to(3);
    std::vector<float> mass(16, 0.01f);
    mass[5] = 0.5f;
    EXPECT_NO_THROW(seq.observe_tokens(mass)) << md::to_string(mode);
    EXPECT_EQ(seq.select(1).pages.size(), 1u);
    EXPECT_EQ(seq.explain_page(1).tokens, 4u);
  }
}

TEST(PolicySequence, InvalidConfigOrParamsAreRejectedOnConstruction) {
  EXPECT_THROW(md::policy_sequence<pol::h2o>(md::config{.alpha = -1}), md::config_error);
  EXPECT_THROW(md::policy_sequence<pol::tova>(md::config{.page_size = 3}), md::config_error);
  EXPECT_THROW((md::basic_sequence<pol::tova, float, 16>(md::config{.page_size = 32})), md::config_error);
  EXPECT_NO_THROW((md::basic_sequence<pol::tova, float, 16>(md::config{.page_size = 16})));
  EXPECT_THROW(md::policy_sequence<pol::scissorhands>(md::config{}, {.history_window = 0}), md::config_error);
  EXPECT_THROW(md::policy_sequence<pol::scissorhands>(md::config{}, {.history_window = 65}), md::config_error);
  EXPECT_NO_THROW(md::policy_sequence<pol::scissorhands>(md::config{}, {.history_window = 64}));
  EXPECT_THROW(md::policy_sequence<pol::snapkv>(md::config{}, {.window = 0}), md::config_error);
  EXPECT_THROW(md::policy_sequence<pol::snapkv>(md::config{}, {.kernel_size = 4}), md::config_error);
  EXPECT_THROW(md::policy_sequence<pol::priority_lru>(md::config{}, {.region_priority = {1, 2, 3}}), md::config_error);
  EXPECT_THROW(md::policy_sequence<pol::priority_lru>(md::config{}, {.region_priority = {0, 1, 2, 3, 4, 5, 101}}),
               md::config_error);
  EXPECT_THROW(md::policy_sequence<pol::priority_lru>(md::config{}, {.refresh_threshold = -1}), md::config_error);
}

TEST(PolicySequence, NumbersMustFitTheScoreType) {
  EXPECT_THROW(md::policy_sequence<pol::memdecay>(md::config{.alpha = 1e39}), md::config_error);
  EXPECT_NO_THROW((md::basic_sequence<pol::memdecay, double>(md::config{.alpha = 1e39})));
  md::config cfg;
  cfg.region_overrides = {{.region = "user", .base_priority = 1e40}};
  EXPECT_THROW(md::policy_sequence<pol::h2o>{cfg}, md::config_error);
}

TEST(PolicySequence, CommitReturnsWhatThePageTableFreed) {
  md::policy_sequence<pol::streaming_llm> seq(md::config{.page_size = 4}, {.sink_tokens = 0});
  md::block_pool<> pool(8, 4);
  pool.open(5);
  seq.append(md::regions::user, 13);
  pool.append_tokens(5, 13);
  const std::vector<std::int32_t> table(pool.block_table(5).begin(), pool.block_table(5).end());
  const auto removal = seq.commit(seq.select(2), pool, 5);  // the two oldest pages
  EXPECT_EQ(removal.freed, (std::vector<std::int32_t>{table[0], table[1]}));
  EXPECT_EQ(pool.num_pages(5), seq.num_pages());
  EXPECT_EQ(seq.positions().front(), 8u);
}

TEST(PolicySequence, PriorityLruDerivesPrioritiesFromBasePriorities) {
  md::policy_sequence<pol::priority_lru> seq(md::config{});
  EXPECT_EQ(seq.policy().priority(md::regions::system), 100);
  EXPECT_EQ(seq.policy().priority(md::regions::user), 80);
  EXPECT_EQ(seq.policy().priority(md::regions::scratchpad), 30);
}

TEST(PolicySequence, CompileTimePageSizeGivesTheSameVictims) {
  const md::config cfg{.page_size = 4, .budget = md::budget_config::tokens(24, 16)};
  md::policy_sequence<pol::h2o> dynamic(cfg, {.recent_tokens = 4, .recent_fraction = 0});
  md::basic_sequence<pol::h2o, float, 4> fixed(cfg, {.recent_tokens = 4, .recent_fraction = 0});
  for (md::step_t step = 1; step < 30; ++step) {
    dynamic.append(md::regions::tool_out, 3);
    fixed.append(md::regions::tool_out, 3);
    std::vector<float> mass(dynamic.kv_len());
    for (std::size_t i = 0; i < mass.size(); ++i) mass[i] = static_cast<float>((i * 5 + step) % 7) / 50.0f;
    dynamic.observe_tokens(mass);
    fixed.observe_tokens(mass);
    const auto a = dynamic.select_for_budget(), b = fixed.select_for_budget();
    ASSERT_EQ(a.pages, b.pages);
    dynamic.commit(a);
    fixed.commit(b);
  }
  EXPECT_EQ(dynamic.positions(), fixed.positions());
  EXPECT_EQ(dynamic.digest(), fixed.digest());
}

TEST(PolicySequence, ViewDescribesTheResidentLayout) {
  md::policy_sequence<pol::tova> seq(md::config{.page_size = 4});
  seq.append(md::regions::user, 6);
  seq.append(md::regions::tool_out, 8);
  seq.advance_to(3);
  seq.commit(seq.select(1));  // no observation yet: everything ties at keep_score, page 0 goes
  const auto v = seq.view();
  EXPECT_EQ(v.kv_len(), 10u);
  EXPECT_EQ(v.num_pages(), 3u);
  EXPECT_EQ(v.tokens_in_page(2), 2u);
  EXPECT_EQ(v.now, 3u);
  EXPECT_EQ(v.position_of(0), 4u);
  EXPECT_EQ(v.position_of(9), 13u);
  EXPECT_EQ(v.labels[0], md::regions::user);
  EXPECT_EQ(v.labels[2], md::regions::tool_out);
  EXPECT_EQ(seq.positions(), (std::vector<std::uint64_t>{4, 5, 6, 7, 8, 9, 10, 11, 12, 13}));
  EXPECT_EQ(seq.prefix_cache_boundary(), std::optional<std::uint64_t>{0});
}

TEST(PolicySequence, DigestCoversThePolicyState) {
  md::policy_sequence<pol::h2o> a(md::config{.page_size = 4}), b(md::config{.page_size = 4});
  a.append(md::regions::user, 8);
  b.append(md::regions::user, 8);
  EXPECT_EQ(a.digest(), b.digest());
  std::vector<float> mass(8, 0.1f);
  a.observe_tokens(mass);
  EXPECT_NE(a.digest(), b.digest());
  b.observe_tokens(mass);
  EXPECT_EQ(a.digest(), b.digest());
  mass[3] = 0.2f;
  a.observe_tokens(mass);
  b.observe_tokens(std::vector<float>(8, 0.1f));
  EXPECT_NE(a.digest(), b.digest());  // same layout, different cumulative attention
  EXPECT_EQ(a.state().digest(), b.state().digest());
}

TEST(PolicySequence, PageScoresOutputLengthIsChecked) {
  md::policy_sequence<pol::norm_sum> seq(md::config{.page_size = 4});
  seq.append(md::regions::user, 9);
  std::vector<float> out(2);
  EXPECT_THROW(seq.page_scores(out), md::input_error);
  out.resize(3);
  EXPECT_NO_THROW(seq.page_scores(out));
}

TEST(PolicySequence, OneTokenAppendsGrowEveryColumnGeometrically) {
  // Engines append one token per decode step. Reserving exactly size + 1 before each append reallocated and
  // copied every per-token column on every step (quadratic in the sequence length); capacities now grow
  // geometrically: 20,000 single-token appends move each column at most ~log2(20,000) + 1 times.
  constexpr int appends = 20000;
  auto count_moves = [](auto&& append_one, auto&& data_of) {
    int moves = 0;
    const void* last = nullptr;
    for (int k = 0; k < appends; ++k) {
      append_one(k);
      const void* now = data_of();
      if (now != last) ++moves;
      last = now;
    }
    return moves;
  };
  md::config cfg{.page_size = 16};
  md::sequence seq(cfg);
  EXPECT_LE(count_moves([&](int k) { seq.append(static_cast<md::region_id>(k % 7)); },
                        [&] { return static_cast<const void*>(seq.state().regions().data()); }),
            20);
  md::policy_sequence<pol::memdecay> ps(cfg);
  EXPECT_LE(count_moves([&](int k) { ps.append(static_cast<md::region_id>(k % 7)); },
                        [&] { return static_cast<const void*>(ps.policy().ewma().data()); }),
            20);
  md::policy_sequence<pol::h2o> h2o(cfg);
  EXPECT_LE(count_moves([&](int k) { h2o.append(static_cast<md::region_id>(k % 7)); },
                        [&] { return static_cast<const void*>(h2o.state().regions().data()); }),
            20);
  md::block_pool<> pool(appends / 16 + 1, 16);
  pool.open(0);
  int block_moves = 0;
  const void* last = nullptr;
  for (int k = 0; k < appends; ++k) {
    pool.append_tokens(0, 1);
    const void* now = pool.block_table(0).data();
    if (now != last) ++block_moves;
    last = now;
  }
  EXPECT_LE(block_moves, 16);
}

TEST(PolicySequence, MemDecayPolicyOutsideTheExpfreeDomainUsesThePolynomialScorer) {
  // As basic_sequence: a region with half-life 0.1 steps (lambda = 6.9 > 5) is outside the exp-free domain, so the
  // policy scores with the polynomial kernel even though exp_free_scores is asked for, and agrees with the sequence.
  md::config cfg{.page_size = 4};
  cfg.region_overrides.push_back({.region = "scratchpad", .half_life = 0.1});
  md::sequence ref(cfg);
  md::policy_sequence<pol::memdecay> seq(cfg, {.exp_free_scores = true});
  EXPECT_FALSE(seq.policy().expfree_scores());
  EXPECT_FALSE(ref.expfree_scores());
  for (int k = 0; k < 40; ++k) {
    ref.append(static_cast<md::region_id>(k % 7), 1 + k % 5);
    seq.append(static_cast<md::region_id>(k % 7), 1 + k % 5);
  }
  ref.advance_to(9);
  seq.advance_to(9);
  EXPECT_EQ(ref.page_scores(), seq.page_scores());
}

TEST(PolicySequence, RecentFractionProtectsTheBudgetsShareOfRecentPagesForEveryPolicy) {
  // Page 4, a budget of 32 tokens, recent_fraction 0.5: the pages holding the last 16 tokens are recent, for
  // basic_sequence and for a baseline behind the policy interface alike.
  md::config cfg{.page_size = 4, .protection = {.recent_fraction = 0.5}, .budget = md::budget_config::tokens(32)};
  md::policy_sequence<pol::tova> tova(cfg);
  md::sequence seq(cfg);
  tova.append(md::regions::tool_out, 40);
  seq.append(md::regions::tool_out, 40);
  for (const auto& status : {tova.page_statuses(), seq.page_statuses()}) {
    ASSERT_EQ(status.size(), 10u);
    for (std::size_t p = 0; p < 10; ++p)
      EXPECT_EQ(status[p], p >= 6 ? md::page_status::recent : md::page_status::evictable) << p;
  }
  const auto plan = tova.select_for_budget();
  for (auto p : plan.pages) EXPECT_LT(p, 6u);
  EXPECT_EQ(plan.pages.size(), 2u);  // 40 -> 32 tokens
}
