// SPDX-License-Identifier: Apache-2.0
// cell_mirror: positions learnt from masks, and every disagreement refused with the mirror unchanged.
#include <memdecay/llama_cpp/cell_mirror.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace {

using memdecay::llama_cpp::cell_mirror;
using memdecay::llama_cpp::mask_view;

// The mask llama.cpp builds for one sequence: token t sees cell c iff the cell holds a position <= pos[t].
mask_view causal_mask(const std::vector<std::int32_t>& cell_pos, const std::vector<std::int32_t>& pos) {
  mask_view m;
  m.cells = cell_pos.size();
  m.tokens = pos.size();
  m.bits.assign(m.cells * m.tokens, 0);
  for (std::size_t t = 0; t < pos.size(); ++t)
    for (std::size_t c = 0; c < cell_pos.size(); ++c)
      m.bits[t * m.cells + c] = cell_pos[c] >= 0 && cell_pos[c] <= pos[t] ? 1 : 0;
  return m;
}

TEST(CellMirror, LearnsNewCellsFromTheFirstTokenThatSeesThem) {
  cell_mirror m;
  m.observe(causal_mask({0, 1, 2, -1}, {0, 1, 2}), std::vector<std::int32_t>{0, 1, 2});
  EXPECT_EQ(m.position(0), 0);
  EXPECT_EQ(m.position(2), 2);
  EXPECT_EQ(m.position(3), cell_mirror::free_cell);
  m.remove(1, 2);  // llama_memory_seq_rm frees cell 1; the next token reuses it
  m.observe(causal_mask({0, 3, 2, -1}, {3}), std::vector<std::int32_t>{3});
  EXPECT_EQ(m.position(1), 3);
  EXPECT_EQ(m.held(), 3u);
}

TEST(CellMirror, ShiftsFollowSeqAdd) {
  cell_mirror m;
  m.observe(causal_mask({0, 1, 2, 3}, {0, 1, 2, 3}), std::vector<std::int32_t>{0, 1, 2, 3});
  m.remove(1, 3);
  m.shift(3, -1, -2);
  EXPECT_EQ(m.position(3), 1);
  m.observe(causal_mask({0, 2, -1, 1}, {2}), std::vector<std::int32_t>{2});
  EXPECT_EQ(m.position(1), 2);
}

TEST(CellMirror, AMaskThatDisagreesIsAClearErrorAndChangesNothing) {
  cell_mirror m;
  m.observe(causal_mask({0, 1, 2}, {0, 1, 2}), std::vector<std::int32_t>{0, 1, 2});
  // A cell the mirror holds is hidden (llama.cpp freed or moved it without the mirror knowing).
  const auto bad = causal_mask({0, -1, 2, 3}, {3});
  try {
    m.observe(bad, std::vector<std::int32_t>{3});
    FAIL() << "a hidden known cell was accepted";
  } catch (const memdecay::usage_error& e) {
    EXPECT_NE(std::string(e.what()).find("cell 1 holds position 1"), std::string::npos) << e.what();
  }
  EXPECT_EQ(m.position(1), 1);
  EXPECT_EQ(m.cells(), 3u);
  // Two new cells claiming one token.
  EXPECT_THROW(m.observe(causal_mask({0, 1, 2, 3, 3}, {3}), std::vector<std::int32_t>{3}), memdecay::usage_error);
  // A batch token no cell holds.
  EXPECT_THROW(m.observe(causal_mask({0, 1, 2, -1}, {3}), std::vector<std::int32_t>{3}), memdecay::usage_error);
  EXPECT_EQ(m.held(), 3u);
  m.observe(causal_mask({0, 1, 2, 3}, {3}), std::vector<std::int32_t>{3});
  EXPECT_EQ(m.position(3), 3);
}

TEST(CellMirror, BatchPositionsMustIncrease) {
  cell_mirror m;
  EXPECT_THROW(m.observe(causal_mask({0, 1}, {1, 0}), std::vector<std::int32_t>{1, 0}), memdecay::usage_error);
}

}  // namespace
