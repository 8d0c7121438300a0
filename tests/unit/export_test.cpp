// Tests for exports/llama_cpp.hpp (position ranges for llama_memory_seq_rm) and exports/tensorrt_llm.hpp (region
// priors as token-range retention entries).
#include <gtest/gtest.h>

#include <memdecay/exports/llama_cpp.hpp>
#include <memdecay/exports/tensorrt_llm.hpp>
#include <memdecay/policies/h2o.hpp>
#include <memdecay/core/sequence.hpp>

#include <vector>

namespace md = memdecay;

namespace {

constexpr std::size_t P = 16;

md::eviction_plan<float> plan_for(const md::sequence& seq, std::vector<std::size_t> pages) {
  auto plan = seq.select(0);
  plan.pages = std::move(pages);
  return plan;
}

TEST(LlamaCppRanges, AdjacentPagesMergeIntoOneRange) {
  md::sequence seq(md::config{.page_size = P});
  seq.append(md::regions::scratchpad, 8 * P + 3);
  const auto ranges = md::llama_position_ranges(seq, plan_for(seq, {1, 2, 3, 5, 7}));
  EXPECT_EQ(ranges, (std::vector<md::llama_position_range>{{16, 64}, {80, 96}, {112, 128}}));
}

TEST(LlamaCppRanges, UseOriginalPositionsAfterEarlierEvictions) {
  md::sequence seq(md::config{.page_size = P});
  seq.append(md::regions::scratchpad, 10 * P);
  seq.commit(plan_for(seq, {2, 3}));  // resident: original pages 0 1 4 5 6 7 8 9
  // Logical pages 1 and 2 are original pages 1 and 4: not adjacent in position, so two ranges.
  const auto ranges = md::llama_position_ranges(seq, plan_for(seq, {1, 2, 3}));
  EXPECT_EQ(ranges, (std::vector<md::llama_position_range>{{16, 32}, {64, 96}}));
}

TEST(LlamaCppRanges, EvictedRangesListEveryHoleIncludingATrailingOne) {
  md::sequence seq(md::config{.page_size = P});
  seq.append(md::regions::scratchpad, 8 * P);
  EXPECT_TRUE(md::llama_evicted_ranges(seq).empty());
  seq.commit(plan_for(seq, {0, 2, 3, 7}));
  EXPECT_EQ(md::llama_evicted_ranges(seq), (std::vector<md::llama_position_range>{{0, 16}, {32, 64}, {112, 128}}));
  seq.append(md::regions::user, 5);  // the new tokens sit at positions 128.. after the hole
  EXPECT_EQ(seq.position_of(seq.kv_len() - 1), 132u);
  EXPECT_EQ(md::llama_evicted_ranges(seq), (std::vector<md::llama_position_range>{{0, 16}, {32, 64}, {112, 128}}));
}

TEST(LlamaCppRanges, RejectStaleOrInvalidPlans) {
  md::sequence seq(md::config{.page_size = P});
  seq.append(md::regions::scratchpad, 4 * P + 1);
  const auto plan = plan_for(seq, {1});
  EXPECT_THROW((void)md::llama_position_ranges(seq, plan_for(seq, {4})), md::usage_error);  // partial last page
  EXPECT_THROW((void)md::llama_position_ranges(seq, plan_for(seq, {2, 1})), md::usage_error);
  EXPECT_THROW((void)md::llama_position_ranges(seq, plan_for(seq, {1, 1})), md::usage_error);
  seq.append(md::regions::user, 1);
  EXPECT_THROW((void)md::llama_position_ranges(seq, plan), md::usage_error);
}

TEST(LlamaCppRanges, RejectPositionsBeyondInt32) {
  // No test can afford 2^31 tokens of state, so this checks the helper every range goes through.
  std::vector<md::llama_position_range> out;
  md::detail::push_position_range(out, 0, 16);
  md::detail::push_position_range(out, 16, 32);
  md::detail::push_position_range(out, 2147483632, 2147483647);  // ends at INT32_MAX: fits
  EXPECT_EQ(out, (std::vector<md::llama_position_range>{{0, 32}, {2147483632, 2147483647}}));
  EXPECT_THROW(md::detail::push_position_range(out, 2147483632, 2147483648), md::input_error);
  EXPECT_EQ(out.size(), 2u);
}

TEST(TensorRtLlmRetention, PrioritiesFollowBasePriorityAndPinning) {
  const auto table = md::default_region_table();
  EXPECT_EQ(md::retention_priority(table, md::regions::system), 100);
  EXPECT_EQ(md::retention_priority(table, md::regions::plan), 89);        // 99 * 0.9
  EXPECT_EQ(md::retention_priority(table, md::regions::user), 79);        // 99 * 0.8
  EXPECT_EQ(md::retention_priority(table, md::regions::tool_out), 40);    // 99 * 0.4
  EXPECT_EQ(md::retention_priority(table, md::regions::scratchpad), 30);  // 99 * 0.3
  const auto pinned_plan = table.with_overrides({{.region = "plan", .pinned = true}});
  EXPECT_EQ(md::retention_priority(pinned_plan, md::regions::plan), 100);
  EXPECT_THROW((void)md::retention_priority(table, 9), md::input_error);
}

TEST(TensorRtLlmRetention, SpansBecomeMergedTokenRangesWithHalfLifeDurations) {
  const auto table = md::default_region_table();
  const md::region_span spans[] = {{md::regions::system, 100},
                                   {md::regions::user, 30},
                                   {md::regions::user, 10},
                                   {md::regions::tool_out, 0},
                                   {md::regions::scratchpad, 50}};
  const auto entries = md::tensorrt_llm_retention(table, spans, {.milliseconds_per_step = 10.0});
  ASSERT_EQ(entries.size(), 3u);
  EXPECT_EQ(entries[0], (md::token_range_retention{0, 100, 100, std::nullopt}));
  EXPECT_EQ(entries[1], (md::token_range_retention{100, 140, 79, 800}));  // user: half-life 80 steps
  EXPECT_EQ(entries[2], (md::token_range_retention{140, 190, 30, 150}));  // scratchpad: 15 steps
  const auto no_durations = md::tensorrt_llm_retention(table, spans);
  EXPECT_FALSE(no_durations[1].duration_ms.has_value());
}

TEST(TensorRtLlmRetention, RejectsBadOptionsAndUnknownRegions) {
  const auto table = md::default_region_table();
  const md::region_span unknown[] = {{md::regions::user, 4}, {42, 0}};
  EXPECT_THROW((void)md::tensorrt_llm_retention(table, unknown), md::input_error);
  const md::region_span fine[] = {{md::regions::user, 4}};
  EXPECT_THROW((void)md::tensorrt_llm_retention(table, fine, {.milliseconds_per_step = -1.0}), md::config_error);
}

TEST(TensorRtLlmRetention, ASequenceExportsItsResidentTokensAtTheirPositions) {
  md::sequence seq(md::config{.page_size = P});
  seq.append(md::regions::system, P);
  seq.append(md::regions::scratchpad, 2 * P);
  seq.append(md::regions::user, P + 4);
  seq.commit(plan_for(seq, {1}));  // positions 16..32 are gone
  const auto entries = md::tensorrt_llm_retention(seq);
  ASSERT_EQ(entries.size(), 3u);
  EXPECT_EQ(entries[0], (md::token_range_retention{0, 16, 100, std::nullopt}));
  EXPECT_EQ(entries[1], (md::token_range_retention{32, 48, 30, std::nullopt}));
  EXPECT_EQ(entries[2], (md::token_range_retention{48, 68, 79, std::nullopt}));
}

TEST(TensorRtLlmRetention, AConfigExportsItsEffectiveRegionsOverridesIncluded) {
  // The docs' snippet passed cfg.regions, which drops region_overrides: a plan pinned by override got 89, not 100.
  md::config cfg{.page_size = P};
  cfg.region_overrides = {{.region = "plan", .pinned = true}};
  const md::region_span spans[] = {{md::regions::plan, 8}};
  EXPECT_EQ(md::tensorrt_llm_retention(cfg, spans).front().priority, 100);
  EXPECT_LT(md::tensorrt_llm_retention(cfg.regions, spans).front().priority, 100) << "the raw table has no override";
  md::sequence seq(cfg);
  seq.append(md::regions::plan, 8);
  EXPECT_EQ(md::tensorrt_llm_retention(seq).front().priority, 100);
}

TEST(Exports, TakeEveryPolicysSequence) {
  // The exports are written against sequence_like: an H2O sequence exports as a MemDecay one does.
  md::policy_sequence<md::policies::h2o> seq(md::config{.page_size = P});
  seq.append(md::regions::scratchpad, 4 * P);
  auto plan = seq.select(0);
  plan.pages = {1, 2};
  EXPECT_EQ(md::llama_position_ranges(seq, plan), (std::vector<md::llama_position_range>{{16, 48}}));
  seq.commit(plan);
  EXPECT_EQ(md::llama_evicted_ranges(seq), (std::vector<md::llama_position_range>{{16, 48}}));
  EXPECT_EQ(md::tensorrt_llm_retention(seq).size(), 2u);  // [0, 16) and [48, 64): the hole splits them
  EXPECT_THROW((void)md::llama_position_ranges(seq, plan), md::usage_error) << "stale: the one stale-plan rule";
}

}  // namespace
