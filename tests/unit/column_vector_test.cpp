// Tests for detail/column_vector.hpp: where a kernel's column starts (a cache line; a large one its slot's KiB past a
// page), and that it behaves as a std::vector through growth, copies, moves and the policy's own use (the
// sanitizers check that every block goes back to the operator delete of its alignment).
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <vector>

#include <memdecay/detail/column_vector.hpp>
#include <memdecay/memdecay.hpp>

namespace md = memdecay;

namespace {

std::uintptr_t address(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

template <std::size_t Slot>
void check_layout() {
  md::detail::column_vector<float, Slot> v;
  for (std::size_t n : {1u, 15u, 1000u, 16383u, 16384u, 100000u, 1u << 20}) {
    v.assign(n, 1.0f);
    const auto a = address(v.data());
    ASSERT_EQ(a % 64, 0u) << "slot " << Slot << ", " << n << " floats";
    if (v.capacity() * sizeof(float) >= 64 * 1024) EXPECT_EQ(a % 4096, Slot * 1024) << "slot " << Slot << ", " << n;
  }
}

}  // namespace

TEST(ColumnVector, StartsOnALineAndALargeColumnAtItsSlotInAPage) {
  check_layout<0>();
  check_layout<1>();
  check_layout<2>();
  check_layout<3>();
  md::detail::column_vector<std::uint8_t> bytes(200000);
  EXPECT_EQ(address(bytes.data()) % 4096, 0u);
}

TEST(ColumnVector, BehavesAsAVectorThroughGrowthCopiesAndMoves) {
  md::detail::column_vector<std::uint32_t, 2> v;
  for (std::uint32_t i = 0; i < 50000; ++i) v.push_back(i);  // crosses the 64 KiB line while growing
  std::vector<std::uint32_t> expected(50000);
  std::iota(expected.begin(), expected.end(), 0u);
  ASSERT_TRUE(std::equal(v.begin(), v.end(), expected.begin(), expected.end()));
  auto copy = v;
  EXPECT_EQ(address(copy.data()) % 4096, 2u * 1024);
  auto moved = std::move(copy);
  EXPECT_TRUE(std::equal(moved.begin(), moved.end(), expected.begin(), expected.end()));
  moved.resize(10);  // shrinking keeps the block; shrink_to_fit moves to a small one
  moved.shrink_to_fit();
  EXPECT_EQ(address(moved.data()) % 64, 0u);
  EXPECT_EQ(moved.size(), 10u);
  EXPECT_EQ(moved.back(), 9u);
  v.clear();
  v.shrink_to_fit();
  EXPECT_EQ(v.capacity(), 0u);
}

// The columns the fused observation streams, in a sequence the size of a long context: each on a line, the large
// ones in different slots, so that no two start at the same offset in a page.
TEST(ColumnVector, ASequencesKernelColumnsAreLaidOutApart) {
  md::sequence seq(md::config{.page_size = 16});
  std::vector<md::region_id> labels(65536, md::regions::tool_out);
  seq.append_tokens(labels);
  const auto regions = address(seq.state().regions().data());
  EXPECT_EQ(regions % 64, 0u);
  const auto& policy = seq.policy();
  const auto clocks = address(policy.last_refresh().data()), ewma = address(policy.ewma().data());
  EXPECT_EQ(clocks % 4096, 1024u);
  EXPECT_EQ(ewma % 4096, 3u * 1024);
}
