// digests/key_norm_signal.hpp and basic_sequence::observe_key_norms: KnormPress's norms as attention.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include <memdecay/core/sequence.hpp>

namespace {

using namespace memdecay;

TEST(KeyNormSignal, LowerNormsGetExponentiallyMoreMassAndTheTotalIsKept) {
  // Norms 1, 2, 3: mean 2, stddev sqrt(2/3); shares e^0 : e^{-1/s} : e^{-2/s}.
  const std::vector<float> norms = {3.0f, 1.0f, 2.0f};
  std::vector<double> m(3);
  key_norm_attention<double>(norms, 2.0, m);
  const double s = std::sqrt(2.0 / 3.0), z = 1 + std::exp(-1 / s) + std::exp(-2 / s);
  EXPECT_NEAR(m[1], 2.0 / z, 1e-6);
  EXPECT_NEAR(m[2], 2.0 * std::exp(-1 / s) / z, 1e-6);
  EXPECT_NEAR(m[0], 2.0 * std::exp(-2 / s) / z, 1e-6);
  EXPECT_NEAR(std::accumulate(m.begin(), m.end(), 0.0), 2.0, 1e-12);
  const std::vector<float> equal = {4.0f, 4.0f};  // no spread: equal shares
  std::vector<double> e(2);
  key_norm_attention<double>(equal, 1.0, e);
  EXPECT_DOUBLE_EQ(e[0], 0.5);
}

TEST(KeyNormSignal, BadNormsAreRejectedByIndexAndChangeNothing) {
  config c;
  c.page_size = 4;
  sequence seq(c);
  seq.append(regions::user, 6);
  const auto before = seq.digest();
  std::vector<float> norms(6, 1.0f);
  norms[4] = -1.0f;
  try {
    seq.observe_key_norms(norms);
    FAIL();
  } catch (const input_error& e) {
    EXPECT_NE(std::string(e.what()).find("key norms[4] = -1"), std::string::npos) << e.what();
  }
  norms[4] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(seq.observe_key_norms(norms), input_error);
  EXPECT_THROW(seq.observe_key_norms(std::vector<float>(5, 1.0f)), input_error);
  EXPECT_EQ(seq.digest(), before);
}

TEST(KeyNormSignal, ObserveKeyNormsIsObserveTokensOfTheEstimate) {
  config c;
  c.page_size = 4;
  sequence a(c), b(c);
  a.append(regions::tool_out, 9);
  b.append(regions::tool_out, 9);
  const std::vector<float> norms = {1, 5, 2, 8, 3, 3, 0.5f, 7, 4};
  std::vector<float> mass(9);
  key_norm_attention<float>(norms, 3.0, mass);
  a.observe_key_norms(norms, 3.0);
  b.observe_tokens(mass);
  EXPECT_EQ(a.digest(), b.digest());
}

}  // namespace
