// The fast selector returns exactly the reference's victims (ties by lower page index), on random, tied,
// all-equal and sparse-eligibility inputs, for float and double, small and large page counts and k.
#include <gtest/gtest.h>

#include <memdecay/core/eviction.hpp>
#include <memdecay/simd/select.hpp>

#include <random>
#include <vector>

namespace md = memdecay;
namespace ms = memdecay::simd;

namespace {

template <class Float>
void expect_same(const std::vector<Float>& scores, const std::vector<md::page_status>& status, std::size_t k,
                 const char* what) {
  const auto ref = md::select_lowest_pages<Float>(scores, status, k);
  const auto fast = ms::select_lowest_pages_fast<Float>(scores, status, k);
  ASSERT_EQ(fast, ref) << what << " P=" << scores.size() << " k=" << k;
}

template <class Float>
void run_all(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (std::size_t P : {0, 1, 5, 100, 2047, 2048, 5000, 65536, 100003}) {
    for (int variant = 0; variant < 5; ++variant) {
      std::vector<Float> scores(P);
      std::vector<md::page_status> status(P, md::page_status::evictable);
      for (std::size_t p = 0; p < P; ++p) {
        switch (variant) {
          case 0: scores[p] = static_cast<Float>(std::uniform_real_distribution<double>(0, 2)(rng)); break;
          case 1: scores[p] = static_cast<Float>(rng() % 7) / 4; break;  // heavy ties
          case 2: scores[p] = Float(0.5); break;                         // all equal: ties decide everything
          case 3: scores[p] = static_cast<Float>(P - p) / 1000; break;   // descending: the victims are at the end
          default: scores[p] = static_cast<Float>(std::uniform_real_distribution<double>(0, 1)(rng)); break;
        }
        const auto r = rng() % 10;
        if (variant == 4)
          status[p] = r == 0 ? md::page_status::evictable : md::page_status::pinned;  // sparse
        else if (r == 0)
          status[p] = md::page_status::pinned;
        else if (r == 1)
          status[p] = md::page_status::protected_;
      }
      for (std::size_t k : {std::size_t{0}, std::size_t{1}, std::size_t{2}, std::size_t{32}, P / 8, P / 2, P, P + 3})
        expect_same(scores, status, k, "variant");
    }
  }
}

}  // namespace

TEST(SimdSelect, FloatSameVictimsAsReference) { run_all<float>(11); }
TEST(SimdSelect, DoubleSameVictimsAsReference) { run_all<double>(12); }

TEST(SimdSelect, ThresholdTooTightFallsBackToAllPages) {
  // A sample that misses the low scores: they are all in one short run, which the deterministic sample
  // positions never hit with a tight threshold when k is larger than the run. The result must still be exact.
  const std::size_t P = 1 << 16;
  std::vector<float> scores(P, 1.0f);
  std::vector<md::page_status> status(P, md::page_status::evictable);
  for (std::size_t p = 1000; p < 1010; ++p) scores[p] = 0.0f;
  for (std::size_t k : {5, 10, 11, 40, 500}) expect_same(scores, status, k, "run");
}

TEST(SimdSelect, TuningDoesNotChangeTheResult) {
  std::mt19937_64 rng(5);
  std::vector<float> scores(30000);
  for (auto& s : scores) s = static_cast<float>(rng() % 300);
  std::vector<md::page_status> status(scores.size(), md::page_status::evictable);
  const auto ref = md::select_lowest_pages<float>(scores, status, 100);
  for (std::size_t sample : {1, 16, 100, 4096, 30000})
    EXPECT_EQ((ms::select_lowest_pages_fast<float>(scores, status, 100, {.min_pages = 0, .sample_size = sample})), ref)
        << sample;
}
