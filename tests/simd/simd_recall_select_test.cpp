// The recall-candidate sweep returns exactly the reference's candidates (the k best host pages and the k weakest
// device pages, ties to the lower page) for every isa this build can emit: random, tied, all-equal, ascending and
// descending bounds (the sweep's limit never tightens on an ascending host side), infinities, NaNs, sparse flags,
// predicates that refuse pages, page counts around the block width and k from 0 to beyond the page count.
#include <gtest/gtest.h>

#include <memdecay/simd/recall_select.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace ms = memdecay::simd;
using ms::isa;

namespace {

struct pages {
  std::vector<float> bounds;
  std::vector<std::uint8_t> on_host, pinned, host_ok, device_ok;
};

pages make(std::size_t n, int variant, std::mt19937_64& rng) {
  pages g;
  const float inf = std::numeric_limits<float>::infinity();
  for (std::size_t p = 0; p < n; ++p) {
    float b = 0;
    switch (variant) {
      case 0: b = std::normal_distribution<float>()(rng); break;
      case 1: b = static_cast<float>(rng() % 5); break;  // heavy ties
      case 2: b = 0.25f; break;                          // all equal: the page order decides
      case 3: b = static_cast<float>(p); break;          // ascending
      case 4: b = -static_cast<float>(p); break;         // descending
      default: {
        const auto r = rng() % 8;
        b = r == 0 ? inf : r == 1 ? -inf : r == 2 ? std::numeric_limits<float>::quiet_NaN()
                                                  : static_cast<float>(rng() % 3) - 1.0f;
      }
    }
    g.bounds.push_back(b);
    const auto r = rng() % 10;
    g.on_host.push_back(variant == 3 ? static_cast<std::uint8_t>(r < 8 ? 7 : 0)  // any nonzero byte is "on host"
                                     : static_cast<std::uint8_t>(r < 4));
    g.pinned.push_back(static_cast<std::uint8_t>(rng() % 9 == 0));
    g.host_ok.push_back(static_cast<std::uint8_t>(rng() % 6 != 0));
    g.device_ok.push_back(static_cast<std::uint8_t>(rng() % 5 != 0));
  }
  if (variant == 0 && n > 3) g.bounds[n / 2] = std::numeric_limits<float>::quiet_NaN();
  return g;
}

template <isa A>
void check_all() {
  std::mt19937_64 rng(29);
  for (std::size_t n : std::vector<std::size_t>{0, 1, 15, 16, 17, 33, 100, 1000, 4099, 20000}) {
    for (int variant = 0; variant < 6; ++variant) {
      const pages g = make(n, variant, rng);
      const auto host_ok = [&](std::size_t p) { return g.host_ok[p] != 0; };
      const auto device_ok = [&](std::size_t p) { return g.device_ok[p] != 0; };
      for (std::size_t k : {std::size_t{0}, std::size_t{1}, std::size_t{2}, std::size_t{8}, std::size_t{64}, n / 3,
                            n, std::numeric_limits<std::size_t>::max()}) {
        const auto ref = ms::select_recall_candidates_reference(g.bounds, g.on_host, g.pinned, k, host_ok, device_ok);
        const auto fast = ms::select_recall_candidates<A>(g.bounds, g.on_host, g.pinned, k, host_ok, device_ok);
        const auto same = [](const std::vector<ms::bounded_page>& a, const std::vector<ms::bounded_page>& b) {
          if (a.size() != b.size()) return false;
          for (std::size_t j = 0; j < a.size(); ++j)  // bit-equal bounds (infinities compare equal, no NaN here)
            if (a[j].second != b[j].second || !(a[j].first == b[j].first)) return false;
          return true;
        };
        ASSERT_TRUE(same(fast.host, ref.host)) << ms::to_string(A) << " n=" << n << " variant " << variant << " k=" << k;
        ASSERT_TRUE(same(fast.device, ref.device))
            << ms::to_string(A) << " n=" << n << " variant " << variant << " k=" << k;
        ASSERT_EQ(fast.saw_nan, ref.saw_nan) << ms::to_string(A) << " n=" << n << " variant " << variant;
        if (k != 0 && n != 0) {  // the reference itself, against its definition
          for (const auto& [b, p] : ref.host) EXPECT_TRUE(g.on_host[p] != 0 && g.host_ok[p] && !std::isnan(b));
          for (const auto& [b, p] : ref.device)
            EXPECT_TRUE(g.on_host[p] == 0 && g.pinned[p] == 0 && g.device_ok[p] && !std::isnan(b));
        }
      }
    }
  }
}

}  // namespace

TEST(RecallSelect, ScalarMatchesTheReference) { check_all<isa::scalar>(); }
TEST(RecallSelect, NativeIsaMatchesTheReference) { check_all<ms::native_isa>(); }
#if defined(MEMDECAY_SIMD_ENABLE_SSE)
TEST(RecallSelect, SseMatchesTheReference) { check_all<isa::sse>(); }
#endif
#if defined(MEMDECAY_SIMD_ENABLE_AVX2)
TEST(RecallSelect, Avx2MatchesTheReference) { check_all<isa::avx2>(); }
#endif
#if defined(MEMDECAY_SIMD_ENABLE_AVX512)
TEST(RecallSelect, Avx512MatchesTheReference) { check_all<isa::avx512>(); }
#endif

TEST(RecallSelect, TheKBestHostAndKWeakestDeviceByHand) {
  //                         0     1     2     3     4     5     6     7
  const std::vector<float> b{0.5f, 2.0f, 2.0f, -1.f, 3.0f, 0.1f, 0.1f, 9.0f};
  const std::vector<std::uint8_t> host{0, 1, 1, 0, 1, 0, 0, 0}, pinned{0, 0, 0, 0, 0, 0, 0, 1};
  const auto all = [](std::size_t) { return true; };
  const auto c = ms::select_recall_candidates(b, host, pinned, 2, all, all);
  ASSERT_EQ(c.host.size(), 2u);
  EXPECT_EQ(c.host[0], (ms::bounded_page{3.0f, 4}));
  EXPECT_EQ(c.host[1], (ms::bounded_page{2.0f, 1}));  // ties to the lower page
  ASSERT_EQ(c.device.size(), 2u);
  EXPECT_EQ(c.device[0], (ms::bounded_page{-1.f, 3}));
  EXPECT_EQ(c.device[1], (ms::bounded_page{0.1f, 5}));  // page 7 is pinned, page 6 ties after 5
  EXPECT_FALSE(c.saw_nan);
}
