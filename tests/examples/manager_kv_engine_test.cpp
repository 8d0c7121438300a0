// The small engine of examples/kv_engine.cpp (real K and V tensors in blocks of the owning block pool, driven by
// the manager, keys rotated with RoPE at their absolute positions), included here without its main. The tests
// assert what the example checks: attention over the survivors, read through the compacted block table, equals
// attention computed directly over the same surviving tokens at their original positions, and differs from the
// same tokens renumbered (which is why positions must stay absolute); and freed blocks are reused without
// disturbing the survivors.
#include <gtest/gtest.h>

#define MEMDECAY_EXAMPLE_NO_MAIN
#include "../../examples/kv_engine.cpp"

namespace {

namespace md = memdecay;
namespace kv = memdecay_kv_engine;
using kv::P;

TEST(KvEngine, AttentionOverSurvivorsMatchesDirectAttentionAtOriginalPositions) {
  kv::tiny_engine engine;
  const auto report = kv::run_episode(engine);
  ASSERT_EQ(report.steps.size(), std::size(kv::episode));
  for (const auto& s : report.steps) {
    EXPECT_TRUE(s.pool_consistent) << "step " << s.step;
    ASSERT_EQ(s.requests.size(), 2u);
    for (const auto& r : s.requests) {
      EXPECT_LE(r.output_difference, kv::tolerance) << "step " << s.step << ", request " << r.id;
      EXPECT_LE(r.probability_difference, kv::tolerance) << "step " << s.step << ", request " << r.id;
    }
  }
  ASSERT_GT(report.evicted_pages, 10u) << "the episode must evict for the comparison to mean anything";
  EXPECT_LE(report.reclaimable_pages, 20u);
  ASSERT_GT(report.evicted_tokens, 0u);
  // Renumbering the survivors (positions 0..n-1) changes the result: positions must stay absolute.
  EXPECT_GT(report.renumbered_difference, 1e-3f);
}

TEST(KvEngine, FreedBlocksAreReusedWithoutDisturbingSurvivors) {
  kv::tiny_engine engine;
  engine.open(1);
  engine.append(1, md::regions::system, P);
  engine.append(1, md::regions::scratchpad, 6 * P);
  engine.append(1, md::regions::user, P);
  engine.mgr.advance_to(100);
  const auto before = engine.pool.free_blocks();
  const auto plan = engine.mgr.select_global(4);
  ASSERT_EQ(plan.pages_freed, 4u);
  const auto released = engine.mgr.commit(plan, engine.pool, md::identity_id{});
  EXPECT_EQ(engine.pool.free_blocks(), before + 4);
  engine.append(1, md::regions::tool_out, 3 * P);  // written into the blocks just freed
  EXPECT_EQ(engine.pool.free_blocks(), before + 1);
  const auto& seq = engine.mgr.at(1);
  const auto direct = kv::reference(1, seq.positions(), seq.logical_len());
  const auto through_cache = engine.attend_next(1);
  EXPECT_LE(kv::max_difference(through_cache.output, direct.output), kv::tolerance);
  EXPECT_LE(kv::max_difference(through_cache.probabilities, direct.probabilities), kv::tolerance);
  EXPECT_EQ(released.at(1).freed->size(), 4u);
}

}  // namespace
