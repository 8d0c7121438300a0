// Tests for region.hpp: the default set, half-lives, lookups, user-defined regions, overrides and validation.
#include <gtest/gtest.h>

#include <memdecay/core/region.hpp>

#include <cmath>
#include <string>

namespace md = memdecay;

TEST(Region, DefaultSetIsThePapersSevenInOrder) {
  const auto t = md::default_region_table();
  ASSERT_EQ(t.size(), md::regions::default_count);
  const char* names[] = {"system", "plan", "user", "tool_in", "tool_out", "retrieval", "scratchpad"};
  for (std::size_t i = 0; i < t.size(); ++i) EXPECT_EQ(t[static_cast<md::region_id>(i)].name, names[i]);
  EXPECT_EQ(t.id_of("system"), md::regions::system);
  EXPECT_EQ(t.id_of("scratchpad"), md::regions::scratchpad);
}

TEST(Region, DefaultsPinSystemOnlyAndFollowThePapersLifetimes) {
  const auto t = md::default_region_table();
  EXPECT_TRUE(t.pinned(md::regions::system));
  for (md::region_id r = 1; r < t.size(); ++r) EXPECT_FALSE(t.pinned(r)) << t[r].name;
  // System ~148-189 steps, scratchpad ~14-16: an order of magnitude apart.
  EXPECT_GE(t[md::regions::system].half_life(), 148.0);
  EXPECT_LE(t[md::regions::system].half_life(), 189.0);
  EXPECT_GE(t[md::regions::scratchpad].half_life(), 14.0);
  EXPECT_LE(t[md::regions::scratchpad].half_life(), 16.0);
  // Retrieval is the longest-lived region that can move.
  for (md::region_id r = 1; r < t.size(); ++r) {
    if (r == md::regions::retrieval || r == md::regions::plan) continue;
    EXPECT_GT(t[md::regions::retrieval].half_life(), t[r].half_life()) << t[r].name;
  }
}

TEST(Region, HalfLifeAndDecayRateAreInverse) {
  EXPECT_DOUBLE_EQ(md::decay_rate_from_half_life(10.0), std::log(2.0) / 10.0);
  EXPECT_DOUBLE_EQ(md::half_life_from_decay_rate(md::decay_rate_from_half_life(37.0)), 37.0);
  EXPECT_TRUE(std::isinf(md::half_life_from_decay_rate(0.0)));
  md::region_params p{"x", 1.0, 0.0, false};
  p.set_half_life(25.0);
  EXPECT_NEAR(std::exp(-p.decay_rate * 25.0), 0.5, 1e-15);
  EXPECT_THROW(p.set_half_life(0.0), md::config_error);
  EXPECT_THROW(p.set_half_life(-3.0), md::config_error);
  EXPECT_THROW(p.set_half_life(NAN), md::config_error);
  EXPECT_NEAR(p.half_life(), 25.0, 1e-12);  // unchanged by the rejected calls
}

TEST(Region, UserDefinedSetsByName) {
  md::region_table t({{"instructions", 1.0, 0.0, true}, {"chat", 0.7, 0.01, false}});
  EXPECT_EQ(t.size(), 2u);
  const md::region_id code = t.add({"code", 0.5, 0.05, false});
  EXPECT_EQ(code, 2);
  EXPECT_EQ(t.id_of("code"), 2);
  EXPECT_FALSE(t.find("nope").has_value());
  EXPECT_THROW((void)t.id_of("nope"), md::config_error);
}

TEST(Region, RejectedAddChangesNothing) {
  auto t = md::default_region_table();
  EXPECT_THROW(t.add({"user", 1.0, 0.0, false}), md::config_error);  // duplicate
  EXPECT_THROW(t.add({"", 1.0, 0.0, false}), md::config_error);
  EXPECT_THROW(t.add({"neg", -1.0, 0.0, false}), md::config_error);
  EXPECT_THROW(t.add({"nan", 1.0, NAN, false}), md::config_error);
  EXPECT_EQ(t.size(), md::regions::default_count);
}

TEST(Region, ValidationNamesTheRegionAndField) {
  try {
    md::region_table t({{"a", 1.0, -0.5, false}});
    FAIL() << "negative decay accepted";
  } catch (const md::config_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'a'"), std::string::npos) << what;
    EXPECT_NE(what.find("decay_rate = -0.5"), std::string::npos) << what;
  }
  EXPECT_THROW(md::region_table(std::vector<md::region_params>{}), md::config_error);
  std::vector<md::region_params> many(257);
  for (std::size_t i = 0; i < many.size(); ++i) many[i].name = "r" + std::to_string(i);
  EXPECT_THROW(md::region_table{many}, md::config_error);
  many.pop_back();
  EXPECT_NO_THROW(md::region_table{many});
}

TEST(Region, OverridesApplyByName) {
  const auto base = md::default_region_table();
  const auto t = base.with_overrides({{.region = "plan", .pinned = true},
                                      {.region = "user", .base_priority = 0.95, .half_life = 200.0},
                                      {.region = "tool_out", .decay_rate = 0.0}});
  EXPECT_TRUE(t.pinned(md::regions::plan));
  EXPECT_DOUBLE_EQ(t.base_priority(md::regions::user), 0.95);
  EXPECT_NEAR(t[md::regions::user].half_life(), 200.0, 1e-9);
  EXPECT_EQ(t.decay_rate(md::regions::tool_out), 0.0);
  EXPECT_FALSE(base.pinned(md::regions::plan));  // the original is untouched
}

TEST(Region, InvalidOverridesAreRejected) {
  const auto base = md::default_region_table();
  EXPECT_THROW((void)base.with_overrides({{.region = "plann", .pinned = true}}), md::config_error);
  EXPECT_THROW((void)base.with_overrides({{.region = "user", .decay_rate = 0.1, .half_life = 3.0}}), md::config_error);
  EXPECT_THROW((void)base.with_overrides({{.region = "user", .base_priority = -1.0}}), md::config_error);
  EXPECT_THROW((void)base.with_overrides({{.region = "user", .half_life = 0.0}}), md::config_error);
}

TEST(Region, AtRejectsUnknownIds) {
  const auto t = md::default_region_table();
  EXPECT_EQ(t.at(md::regions::user).name, "user");
  EXPECT_THROW((void)t.at(7), md::input_error);
  EXPECT_THROW((void)t.at(255), md::input_error);
}

// A compile-time region set modelling the concept: engines with a fixed label set need no run-time table.
struct two_regions {
  static constexpr std::size_t size() { return 2; }
  static constexpr double base_priority(md::region_id r) { return r == 0 ? 1.0 : 0.5; }
  static constexpr double decay_rate(md::region_id r) { return r == 0 ? 0.0 : 0.1; }
  static constexpr bool pinned(md::region_id r) { return r == 0; }
};
static_assert(md::region_table_like<two_regions>);
static_assert(md::region_table_like<md::region_table>);
static_assert(!md::region_table_like<int>);
