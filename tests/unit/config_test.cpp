// Tests for config.hpp: defaults, designated initializers, validation messages, budgets and watermarks.
#include <gtest/gtest.h>

#include <memdecay/core/config.hpp>

#include <cmath>
#include <limits>
#include <string>

namespace md = memdecay;

namespace {
// Expects cfg.validate() to throw config_error whose message contains `needle`.
void expect_rejected(const md::config& cfg, const std::string& needle) {
  try {
    cfg.validate();
    ADD_FAILURE() << "accepted a config that should fail with: " << needle;
  } catch (const md::config_error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}
}  // namespace

TEST(Config, DefaultsAreValid) {
  const md::config cfg{};
  EXPECT_NO_THROW(cfg.validate());
  EXPECT_EQ(cfg.page_size, 16u);
  EXPECT_EQ(cfg.normalization, md::attention_normalization::none);
  EXPECT_EQ(cfg.budget.unit, md::budget_unit::unlimited);
  EXPECT_EQ(cfg.regions.size(), md::regions::default_count);
}

TEST(Config, DesignatedInitializersCompose) {
  const md::config cfg{.alpha = 4.0,
                       .tau = 2.0,
                       .page_size = 32,
                       .normalization = md::attention_normalization::uniform,
                       .protection = {.sink_pages = 1, .recent_tokens = 64},
                       .budget = md::budget_config::tokens(4096, 3584),
                       .region_overrides = {{.region = "plan", .pinned = true}}};
  EXPECT_NO_THROW(cfg.validate());
  EXPECT_TRUE(cfg.effective_regions().pinned(md::regions::plan));
}

TEST(Config, EachInvalidFieldIsNamedWithItsValue) {
  expect_rejected(md::config{.alpha = -1.0}, "alpha = -1");
  expect_rejected(md::config{.alpha = INFINITY}, "alpha = inf");
  expect_rejected(md::config{.ewma_beta = 1.0}, "ewma_beta = 1");
  expect_rejected(md::config{.ewma_beta = -0.1}, "ewma_beta = -0.1");
  expect_rejected(md::config{.ewma_beta = NAN}, "ewma_beta = nan");
  expect_rejected(md::config{.ewma_half_life = 0.0}, "ewma_half_life = 0");
  expect_rejected(md::config{.tau = -0.5}, "tau = -0.5");
  expect_rejected(md::config{.page_size = 12}, "page_size = 12");
  expect_rejected(md::config{.page_size = 0}, "page_size = 0");
  expect_rejected(md::config{.normalization = static_cast<md::attention_normalization>(9)}, "normalization");
  expect_rejected(md::config{.budget = md::budget_config::tokens(100, 200)}, "budget.low = 200");
  expect_rejected(md::config{.budget = md::budget_config::tokens(-5)}, "budget.high = -5");
  expect_rejected(md::config{.budget = md::budget_config::tokens(10.5)}, "whole numbers");
  expect_rejected(md::config{.budget = md::budget_config::ratio(1.5)}, "ratio must be in (0, 1]");
  expect_rejected(md::config{.budget = md::budget_config::ratio(0.0)}, "ratio must be in (0, 1]");
  expect_rejected(md::config{.region_overrides = {{.region = "sytem", .pinned = false}}},
                  "unknown region name 'sytem'");
  expect_rejected(md::config{.protection = {.recent_fraction = 1.5}}, "protection.recent_fraction = 1.5");
  expect_rejected(md::config{.protection = {.recent_fraction = -0.1}}, "protection.recent_fraction = -0.1");
  expect_rejected(md::config{.protection = {.recent_fraction = NAN}}, "protection.recent_fraction = nan");
}

TEST(Config, RecentFractionWidensTheRecentWindowWithTheBudget) {
  md::config cfg{.protection = {.recent_tokens = 16, .recent_fraction = 0.5}, .budget = md::budget_config::tokens(100)};
  EXPECT_EQ(cfg.effective_protection(16, 1000).recent_tokens, 50u);  // max(16, floor(0.5 x 100))
  cfg.budget = md::budget_config::ratio(0.25);
  EXPECT_EQ(cfg.effective_protection(1, 400).recent_tokens, 50u);  // half of 25% of 400 tokens
  EXPECT_EQ(cfg.effective_protection(1, 40).recent_tokens, 16u);   // the fixed floor
  cfg.budget = {};
  EXPECT_EQ(cfg.effective_protection(1, 400).recent_tokens, 16u);  // unlimited: the fixed window alone
  cfg.budget = md::budget_config::tokens(1e300);
  EXPECT_GT(cfg.effective_protection(1, 400).recent_tokens, 400u);  // saturates, never wraps
  EXPECT_EQ(md::config{}.effective_protection(16, 1000).recent_tokens, 0u);
}

TEST(Config, EwmaHalfLifeOverridesBeta) {
  const md::config cfg{.ewma_beta = 0.1, .ewma_half_life = 4.0};
  EXPECT_NEAR(std::pow(cfg.effective_beta(), 4.0), 0.5, 1e-12);
  EXPECT_DOUBLE_EQ(md::config{.ewma_beta = 0.3}.effective_beta(), 0.3);
}

TEST(Config, BudgetWatermarksInTokens) {
  const auto tokens = md::budget_config::tokens(100, 80).in_tokens(16, 1000);
  EXPECT_EQ(tokens.high, 100u);
  EXPECT_EQ(tokens.low, 80u);
  const auto pages = md::budget_config::pages(10, 8).in_tokens(16, 1000);
  EXPECT_EQ(pages.high, 160u);
  EXPECT_EQ(pages.low, 128u);
  const auto ratio = md::budget_config::ratio(0.5, 0.25).in_tokens(16, 1000);
  EXPECT_EQ(ratio.high, 500u);
  EXPECT_EQ(ratio.low, 250u);
  const auto low_defaults_to_high = md::budget_config::tokens(64).in_tokens(16, 10);
  EXPECT_EQ(low_defaults_to_high.low, 64u);
  const auto unlimited = md::budget_config{}.in_tokens(16, 10);
  EXPECT_EQ(unlimited.high, std::numeric_limits<std::uint64_t>::max());
}

TEST(Config, NormalizationNames) {
  EXPECT_STREQ(md::to_string(md::attention_normalization::none), "none");
  EXPECT_STREQ(md::to_string(md::attention_normalization::uniform), "uniform");
}
