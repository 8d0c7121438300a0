// SPDX-License-Identifier: Apache-2.0
// The C API decides what the C++ API decides: random episodes (appends of random regions, clock moves, attention
// per token, per page and per head, selections under a budget, commits, occasional bad input) run through
// memdecay_sequence_* and through memdecay::policy_sequence side by side, for every policy; at every step both
// return the same status, the same victims and scores, and the same digest. The manager the same way.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <memdecay/c/memdecay.h>
#include <memdecay/core/manager.hpp>
#include <memdecay/core/sequence.hpp>

#include "common/policy_dispatch.hpp"

namespace {

namespace md = memdecay;

std::vector<float> random_mass(std::mt19937_64& rng, std::size_t n) {
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> m(n);
  float sum = 0;
  for (auto& x : m) sum += x = u(rng) * u(rng);
  for (auto& x : m) x /= sum > 0 ? sum : 1;
  return m;
}

// The C API's status of a C++ call.
template <class Fn>
memdecay_status status_of(Fn&& fn) {
  try {
    fn();
    return MEMDECAY_OK;
  } catch (const md::config_error&) {
    return MEMDECAY_CONFIG_ERROR;
  } catch (const md::input_error&) {
    return MEMDECAY_INPUT_ERROR;
  } catch (const md::usage_error&) {
    return MEMDECAY_USAGE_ERROR;
  }
}

template <template <class> class P>
void replay_sequence(const std::string& policy, std::uint64_t seed) {
  SCOPED_TRACE(policy + " seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  md::config cfg;
  cfg.budget = md::budget_config::tokens(256, 192);
  cfg.protection.recent_tokens = 32;
  memdecay_config* ccfg = nullptr;
  ASSERT_EQ(memdecay_config_create(&ccfg), MEMDECAY_OK);
  ASSERT_EQ(memdecay_config_set_budget(ccfg, MEMDECAY_BUDGET_TOKENS, 256, 192), MEMDECAY_OK);
  ASSERT_EQ(memdecay_config_set_number(ccfg, "protection.recent_tokens", 32), MEMDECAY_OK);
  memdecay_sequence* c = nullptr;
  ASSERT_EQ(memdecay_sequence_create(ccfg, policy.c_str(), nullptr, &c), MEMDECAY_OK);
  md::policy_sequence<P> cpp(cfg);
  md::step_t now = 0;
  std::size_t committed = 0, rejected = 0;
  for (int step = 0; step < 120; ++step) {
    const int op = static_cast<int>(rng() % 8);
    memdecay_status want = MEMDECAY_OK, got = MEMDECAY_OK;
    if (op <= 1) {
      const auto region = static_cast<std::uint8_t>(rng() % 8);  // 7 is not a region: both refuse it
      const std::size_t n = 1 + rng() % 40;
      want = status_of([&] { cpp.append(region, n); });
      got = memdecay_sequence_append(c, region, n);
    } else if (op == 2) {
      const md::step_t to = rng() % 10 == 0 ? now - 1 : now + static_cast<md::step_t>(rng() % 4);
      want = status_of([&] { cpp.advance_to(to); });
      got = memdecay_sequence_advance_to(c, to);
      if (want == MEMDECAY_OK) now = to;
    } else if (op == 3) {
      auto m = random_mass(rng, cpp.kv_len() + (rng() % 12 == 0 ? 1 : 0));
      std::size_t r1 = 0, r2 = 0;
      want = status_of([&] { r1 = cpp.observe_tokens(m); });
      got = memdecay_sequence_observe_tokens(c, m.data(), m.size(), &r2);
      EXPECT_EQ(r1, r2);
    } else if (op == 4) {
      auto m = random_mass(rng, cpp.num_pages());
      want = status_of([&] { (void)cpp.observe_pages(m); });
      got = memdecay_sequence_observe_pages(c, m.data(), m.size(), nullptr);
    } else if (op == 5) {
      const std::size_t heads = 1 + rng() % 3;
      auto m = random_mass(rng, heads * cpp.kv_len());
      using matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
      want = status_of([&] {
        (void)cpp.observe_heads(Eigen::Map<const matrix>(m.data(), static_cast<Eigen::Index>(heads),
                                                         static_cast<Eigen::Index>(cpp.kv_len())),
                                md::head_reduction::mean);
      });
      got = memdecay_sequence_observe_heads(c, m.data(), heads, cpp.kv_len(), MEMDECAY_HEADS_MEAN, nullptr);
    } else {
      md::eviction_plan<float> plan;
      memdecay_plan* cplan = nullptr;
      const std::size_t k = rng() % 4;
      if (op == 6) {
        want = status_of([&] { plan = cpp.select(k); });
        got = memdecay_sequence_select(c, k, nullptr, 0, &cplan);
      } else {
        want = status_of([&] { plan = cpp.select_for_budget(); });
        got = memdecay_sequence_select_for_budget(c, nullptr, 0, &cplan);
      }
      ASSERT_EQ(got, want) << memdecay_last_error();
      if (cplan) {
        const memdecay_plan_view v = memdecay_plan_get(cplan);
        ASSERT_EQ(std::vector<std::size_t>(v.pages, v.pages + v.num_pages), plan.pages);
        if (!plan.scores.empty()) {
          ASSERT_EQ(0, std::memcmp(v.scores, plan.scores.data(), plan.scores.size() * sizeof(float)));
        }
        EXPECT_EQ(v.generation, plan.generation);
        EXPECT_EQ(v.pages_over_budget, plan.pages_over_budget);
        cpp.commit(plan);
        ASSERT_EQ(memdecay_sequence_commit(c, cplan), MEMDECAY_OK) << memdecay_last_error();
        committed += plan.pages.size();
        memdecay_plan_destroy(cplan);
      }
    }
    ASSERT_EQ(got, want) << "step " << step << " op " << op << ": " << memdecay_last_error();
    rejected += got != MEMDECAY_OK ? 1 : 0;
    memdecay_sequence_info info{};
    ASSERT_EQ(memdecay_sequence_get_info(c, &info), MEMDECAY_OK);
    ASSERT_EQ(info.digest, cpp.digest()) << "step " << step << " op " << op;
    ASSERT_EQ(info.kv_len, cpp.kv_len());
  }
  EXPECT_GT(committed, 0u) << "the episode never evicted: the comparison would be vacuous";
  EXPECT_GT(rejected, 0u) << "the episode never gave bad input";
  memdecay_sequence_destroy(c);
  memdecay_config_destroy(ccfg);
}

TEST(CApiCrossCheck, EverySequencePolicyDecidesAsTheCxxApi) {
  for (const auto& name : memdecay_bindings::policy_names())
    for (std::uint64_t seed = 1; seed <= 6; ++seed)
      memdecay_bindings::with_policy(name, [&]<template <class> class P>() { replay_sequence<P>(name, seed); });
}

TEST(CApiCrossCheck, TheManagerSelectsAsTheCxxManager) {
  for (std::uint64_t seed = 1; seed <= 8; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    md::basic_manager<md::policy_sequence<md::policies::memdecay>> cpp(
        md::manager_config{.page_size = 16, .global = md::global_budget::pages(24, 20)});
    memdecay_manager* c = nullptr;
    ASSERT_EQ(memdecay_manager_create("memdecay", 16, 24, 20, &c), MEMDECAY_OK);
    memdecay_config* ccfg = nullptr;
    ASSERT_EQ(memdecay_config_create(&ccfg), MEMDECAY_OK);
    for (std::uint64_t id = 1; id <= 3; ++id) {
      cpp.open(id, md::config{});
      ASSERT_EQ(memdecay_manager_open(c, id, ccfg, nullptr, nullptr), MEMDECAY_OK);
    }
    for (md::step_t step = 1; step <= 30; ++step) {
      cpp.advance_to(step);
      ASSERT_EQ(memdecay_manager_advance_to(c, step), MEMDECAY_OK);
      for (std::uint64_t id = 1; id <= 3; ++id) {
        memdecay_sequence* s = nullptr;
        ASSERT_EQ(memdecay_manager_sequence(c, id, &s), MEMDECAY_OK);
        const auto region = static_cast<std::uint8_t>(rng() % 7);
        const std::size_t n = 1 + rng() % 24;
        cpp.at(id).append(region, n);
        ASSERT_EQ(memdecay_sequence_append(s, region, n), MEMDECAY_OK);
        const auto m = random_mass(rng, cpp.at(id).kv_len());
        (void)cpp.at(id).observe_tokens(m);
        ASSERT_EQ(memdecay_sequence_observe_tokens(s, m.data(), m.size(), nullptr), MEMDECAY_OK);
        memdecay_sequence_destroy(s);
      }
      const auto plan = cpp.select_global();
      memdecay_global_plan* cplan = nullptr;
      ASSERT_EQ(memdecay_manager_select_global(c, 0, &cplan), MEMDECAY_OK);
      const auto v = memdecay_global_plan_get(cplan);
      ASSERT_EQ(v.num_victims, plan.victims.size());
      ASSERT_EQ(v.digest, plan.digest());
      for (std::size_t i = 0; i < v.num_victims; ++i) {
        EXPECT_EQ(v.victims[i].sequence, plan.victims[i].sequence);
        EXPECT_EQ(v.victims[i].page, plan.victims[i].page);
      }
      cpp.commit(plan);
      ASSERT_EQ(memdecay_manager_commit(c, cplan), MEMDECAY_OK);
      memdecay_global_plan_destroy(cplan);
      memdecay_manager_info info{};
      ASSERT_EQ(memdecay_manager_get_info(c, &info), MEMDECAY_OK);
      ASSERT_EQ(info.digest, cpp.digest());
    }
    memdecay_config_destroy(ccfg);
    memdecay_manager_destroy(c);
  }
}

}  // namespace
