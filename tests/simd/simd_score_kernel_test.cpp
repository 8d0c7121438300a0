// The SIMD scorer (score-only and fused observe + score) against the scalar references on random states of many
// shapes, for float and double, compile-time and dynamic page sizes, native isa and scalar fallback.
#include "simd_kernel_checks.hpp"

#include <memdecay/memdecay.hpp>

namespace md = memdecay;
namespace ms = memdecay::simd;

TEST(SimdScoreKernel, FloatNativeIsaMatchesReference) {
  simd_checks::check_scores_many_shapes<ms::native_isa, float>();
}
TEST(SimdScoreKernel, DoubleNativeIsaMatchesReference) {
  simd_checks::check_scores_many_shapes<ms::native_isa, double>();
}
TEST(SimdScoreKernel, FloatScalarFallbackMatchesReference) {
  simd_checks::check_scores_many_shapes<ms::isa::scalar, float>();
}
TEST(SimdScoreKernel, DoubleScalarFallbackMatchesReference) {
  simd_checks::check_scores_many_shapes<ms::isa::scalar, double>();
}

TEST(SimdScoreKernel, SequenceUsesTheKernelAndAgreesWithTheReference) {
  // The policy's page_scores() is the SIMD kernel; select() sees the same scores after an observation (cached
  // by observe_tokens) as a fresh score-only pass would, and the EWMA is the reference's bit for bit. (The
  // polynomial scorer; the exp-free default is tested in simd_expfree_test.cpp.)
  md::sequence seq(md::config{.normalization = md::attention_normalization::uniform});
  ASSERT_FALSE(seq.use_expfree_scores(false));
  std::mt19937_64 rng(3);
  for (int k = 0; k < 300; ++k) seq.append(static_cast<md::region_id>(1 + rng() % 6), 1 + rng() % 30);
  seq.advance_to(500);
  std::vector<float> mass(seq.kv_len());
  for (auto& m : mass) m = static_cast<float>(rng() % 1000) / 1000.0f / static_cast<float>(seq.kv_len());
  seq.observe_tokens(mass);
  const auto fast = seq.page_scores();
  std::vector<float> ref(seq.num_pages());
  md::page_scores_reference(md::token_state_of(seq), seq.regions(), 1.0f, std::span<float>(ref));
  ASSERT_EQ(fast.size(), ref.size());
  for (std::size_t p = 0; p < ref.size(); ++p)
    EXPECT_NEAR(fast[p], ref[p], simd_checks::score_tolerance(ref[p], seq.state().tokens_in_page(p))) << p;
  {
    md::sequence twin(md::config{.normalization = md::attention_normalization::uniform});
    for (std::size_t p = 0; p < seq.kv_len(); ++p) twin.append(seq.state().regions()[p]);
    twin.advance_to(500);
    auto ewma = std::vector<float>(twin.policy().ewma().begin(), twin.policy().ewma().end());
    auto clocks = std::vector<md::step_t>(twin.policy().last_refresh().begin(), twin.policy().last_refresh().end());
    md::observation_params<float> obs{0.9f, 0.01f, static_cast<float>(seq.kv_len())};
    md::observe_tokens_reference<float>(ewma, clocks, mass, 500, obs);
    for (std::size_t i = 0; i < ewma.size(); ++i) ASSERT_EQ(ewma[i], seq.policy().ewma()[i]) << i;
    EXPECT_TRUE(std::equal(clocks.begin(), clocks.end(), seq.policy().last_refresh().begin()));
  }
  std::vector<float> fresh(seq.num_pages());
  ms::page_scores(md::token_state_of(seq), ms::region_lut<float>(seq.regions()), 1.0f, std::span<float>(fresh));
  EXPECT_EQ(fresh, fast);
  // The victims equal the reference selection on the reference scores whenever no two scores are within the
  // tolerance of each other around the cut (checked on the kernel's own scores, where they must be equal).
  const auto plan = seq.select(seq.num_pages() / 3);
  const auto status = seq.page_statuses();
  EXPECT_EQ(plan.pages, md::select_lowest_pages<float>(fast, status, seq.num_pages() / 3));
}
