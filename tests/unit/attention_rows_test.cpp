// SPDX-License-Identifier: Apache-2.0
// attention_rows (core/attention_rows.hpp), its SIMD reduction (simd/reduce_rows.hpp) and
// basic_sequence::observe_rows: float32, fp16 and bf16 rows with a leading dimension give the same bits as the
// scalar reduction, and observing them gives the same state as observe_tokens of the reduced float vector, for
// every normalisation, page size and policy; bad rows are named by row and token and change nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <memdecay/core/attention_rows.hpp>
#include <memdecay/core/sequence.hpp>
#include <memdecay/policies/all.hpp>
#include <memdecay/simd/reduce_rows.hpp>

namespace md = memdecay;

namespace {

// An engine's buffer: `rows` rows of `tokens` masses, `stride` apart, in `format`, each row summing to about 1.
struct engine_rows {
  md::mass_format format;
  std::size_t rows, tokens, stride;
  md::head_reduction how;
  std::vector<float> f32;
  std::vector<std::uint16_t> half;

  engine_rows(md::mass_format f, std::size_t r, std::size_t t, std::size_t pad, md::head_reduction h,
              std::uint64_t seed)
      : format(f), rows(r), tokens(t), stride(t + pad), how(h) {
    std::mt19937_64 rng(seed);
    const std::size_t size = rows == 0 ? 0 : (rows - 1) * stride + tokens + pad;  // the padding after the last row too
    std::vector<float> values(size, 0.0f);
    for (auto& v : values) {
      const double u = static_cast<double>(rng() % 100000) / 100000.0;
      // A spread of magnitudes: spikes, ordinary shares, values near fp16's subnormals, exact zeros.
      const int kind = static_cast<int>(rng() % 10);
      v = kind == 0   ? static_cast<float>(u * 50.0 / static_cast<double>(t + 1))
          : kind == 1 ? static_cast<float>(u * 1e-6)
          : kind == 2 ? 0.0f
                      : static_cast<float>(u * 2.0 / static_cast<double>(t + 1));
    }
    if (format == md::mass_format::f32) {
      f32 = values;
    } else {
      const auto hf = format == md::mass_format::f16 ? md::half_format::f16 : md::half_format::bf16;
      for (float v : values) half.push_back(md::simd::float_to_half(v, hf));
    }
  }
  [[nodiscard]] md::attention_rows view() const {
    if (format == md::mass_format::f32) return {std::span<const float>(f32), rows, tokens, stride, how};
    return {std::span<const std::uint16_t>(half),
            format == md::mass_format::f16 ? md::half_format::f16 : md::half_format::bf16, rows, tokens, stride, how};
  }
  void set(std::size_t r, std::size_t t, float f32_value, std::uint16_t half_bits) {
    if (format == md::mass_format::f32)
      f32[r * stride + t] = f32_value;
    else
      half[r * stride + t] = half_bits;
  }
};

constexpr md::mass_format formats[] = {md::mass_format::f32, md::mass_format::f16, md::mass_format::bf16};

template <class Seq>
Seq make_sequence(const md::config& cfg, std::size_t tokens, std::uint64_t seed) {
  Seq s(cfg);
  std::mt19937_64 rng(seed);
  s.append(md::regions::system, 16);
  while (s.kv_len() < tokens)
    s.append(static_cast<md::region_id>(1 + rng() % 6), std::min<std::size_t>(1 + rng() % 300, tokens - s.kv_len()));
  return s;
}

std::string rejection(auto&& call) {
  try {
    call();
  } catch (const md::input_error& e) {
    return e.what();
  }
  return "accepted";
}

}  // namespace

TEST(AttentionRows, ShapesThatDoNotFitTheBufferAreRejectedByName) {
  const std::vector<float> buf(100, 0.1f);
  EXPECT_NE(rejection([&] { md::attention_rows(std::span<const float>(buf), 0, 10); }).find("rows = 0"),
            std::string::npos);
  EXPECT_NE(rejection([&] { md::attention_rows(std::span<const float>(buf), 2, 10, 5); }).find("stride = 5"),
            std::string::npos);
  EXPECT_NE(rejection([&] { md::attention_rows(std::span<const float>(buf), 4, 30, 32); }).find("need 126"),
            std::string::npos);
  EXPECT_NE(rejection([&] { md::attention_rows(std::span<const float>(buf), 1, 101); }).find("holds 100"),
            std::string::npos);
  EXPECT_EQ(rejection([&] { md::attention_rows(std::span<const float>(buf), 4, 28, 24 + 0 * 4); }).find("accepted"),
            std::string::npos);  // stride 24 < 28
  EXPECT_EQ(rejection([&] { md::attention_rows(std::span<const float>(buf), 4, 25); }), "accepted");  // exactly fits
  EXPECT_EQ(rejection([&] { md::attention_rows(std::span<const float>(buf), 3, 10, 45); }), "accepted");
  const std::vector<std::uint16_t> halves(64, 0);
  EXPECT_NE(rejection([&] {
              md::attention_rows(std::span<const std::uint16_t>(halves), md::half_format::bf16, 3, 32);
            }).find("attention rows (bf16)"),
            std::string::npos);
}

TEST(AttentionRows, TheSimdReductionGivesTheReferenceBitsForEveryFormatStrideAndTail) {
  std::uint64_t seed = 1;
  for (const auto format : formats)
    // 9 and 20 rows: groups of 8 over tiles of 1,024 tokens (simd/reduce_rows.hpp), 3,000 tokens: tiles and a tail.
    for (std::size_t rows : {1u, 2u, 3u, 8u, 9u, 20u})
      for (std::size_t tokens : {0u, 1u, 7u, 16u, 33u, 1000u, 3000u})
        for (std::size_t pad : {0u, 5u})
          for (const auto how : {md::head_reduction::sum, md::head_reduction::mean}) {
            const engine_rows e(format, rows, tokens, pad, how, ++seed);
            const auto v = e.view();
            std::vector<float> reference(tokens + 1, -1.0f), simd(tokens + 1, -1.0f), checked(tokens + 1, -1.0f);
            // A block that starts inside the rows, as observe_rows's second and later blocks do.
            const std::size_t begin = tokens / 3, count = tokens - begin;
            md::reduce_rows_reference<float>(v, begin, count, reference.data());
            md::simd::reduce_rows(v, begin, count, simd.data());
            EXPECT_TRUE(md::simd::reduce_rows_checked(v, begin, count, checked.data(), 3.0f));
            SCOPED_TRACE(std::string(md::to_string(format)) + " rows " + std::to_string(rows) + " tokens " +
                         std::to_string(tokens) + " pad " + std::to_string(pad));
            EXPECT_EQ(std::memcmp(reference.data(), simd.data(), sizeof(float) * reference.size()), 0);
            EXPECT_EQ(std::memcmp(reference.data(), checked.data(), sizeof(float) * reference.size()), 0);
            EXPECT_EQ(simd[count], -1.0f) << "wrote past the block";
            // The reference itself: widened values summed in row order.
            for (std::size_t t = 0; t < count && rows > 0; ++t) {
              float sum = v.element(0, begin + t);
              for (std::size_t r = 1; r < rows; ++r) sum += v.element(r, begin + t);
              ASSERT_EQ(reference[t], how == md::head_reduction::mean ? sum * (1.0f / static_cast<float>(rows)) : sum);
            }
          }
}

TEST(AttentionRows, TheCheckedReductionFindsEveryKindOfBadElement) {
  for (const auto format : formats) {
    // (f32 value, its half bits): NaN, +inf, a negative, -inf.
    const auto hf = format == md::mass_format::f16 ? md::half_format::f16 : md::half_format::bf16;
    const float bad[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(), -0.25f,
                         -std::numeric_limits<float>::infinity()};
    for (float b : bad)
      for (std::size_t at : {0u, 5u, 40u, 99u}) {
        engine_rows e(format, 3, 100, 4, md::head_reduction::sum, 7);
        e.set(1, at, b, md::simd::float_to_half(b, hf));
        std::vector<float> out(100);
        EXPECT_FALSE(md::simd::reduce_rows_checked(e.view(), 0, 100, out.data())) << b << " at " << at;
        EXPECT_TRUE(md::simd::reduce_rows_checked(e.view(), at + 1, 99 - at, out.data()));  // outside the range
        const std::string why = rejection([&] { md::check_row_elements(e.view(), 0, 100); });
        EXPECT_NE(why.find("row 1, token " + std::to_string(at)), std::string::npos) << why;
      }
    // -0.0 is not negative.
    engine_rows e(format, 2, 50, 0, md::head_reduction::sum, 8);
    e.set(0, 3, -0.0f, 0x8000);
    std::vector<float> out(50);
    EXPECT_TRUE(md::simd::reduce_rows_checked(e.view(), 0, 50, out.data()));
  }
}

TEST(AttentionRows, ObserveRowsIsObserveTokensOfTheReducedMassForEveryNormalisationAndPageSize) {
  using norm = md::attention_normalization;
  std::uint64_t seed = 100;
  for (const auto mode : {norm::none, norm::uniform, norm::lifetime, norm::zscore})
    for (std::size_t page : {1u, 4u, 16u, 256u, 4096u})  // 4096: larger than a block, the copy path
      for (const auto format : formats) {
        md::config cfg{.page_size = page, .normalization = mode};
        // 5,000 tokens: three blocks of observe_rows, the last one partial, with a partial page at the end.
        auto by_rows = make_sequence<md::sequence>(cfg, 5000 + page / 2, ++seed);
        auto by_tokens = by_rows;
        for (md::step_t step = 1; step <= 4; ++step) {
          by_rows.advance_to(step * 7);
          by_tokens.advance_to(step * 7);
          const engine_rows e(format, 8, by_rows.kv_len(), step % 2 == 0 ? 0 : 3,
                              step % 3 == 0 ? md::head_reduction::mean : md::head_reduction::sum, seed * 10 + step);
          const auto reduced = md::reduce_rows<float>(e.view());
          SCOPED_TRACE(std::string(md::to_string(format)) + " page " + std::to_string(page) + " mode " +
                       std::to_string(static_cast<int>(mode)) + " step " + std::to_string(step));
          ASSERT_EQ(by_rows.observe_rows(e.view()), by_tokens.observe_tokens(reduced));
          ASSERT_EQ(by_rows.digest(), by_tokens.digest());
          ASSERT_EQ(by_rows.page_scores(), by_tokens.page_scores());
          if (step == 2) {  // a selection in between: the cached scores and the plans agree too
            const auto a = by_rows.select(3), b = by_tokens.select(3);
            ASSERT_EQ(a.pages, b.pages);
            by_rows.commit(a);
            by_tokens.commit(b);
          }
        }
      }
}

TEST(AttentionRows, DoubleScoresAndEveryOtherPolicyTakeTheReducedMassToo) {
  const md::config cfg{.page_size = 16, .normalization = md::attention_normalization::uniform};
  auto check = [&](auto by_rows) {
    auto by_tokens = by_rows;
    for (md::step_t step = 1; step <= 3; ++step) {
      by_rows.advance_to(step);
      by_tokens.advance_to(step);
      const engine_rows e(md::mass_format::bf16, 4, by_rows.kv_len(), 2, md::head_reduction::mean, 40 + step);
      using F = typename decltype(by_rows)::float_type;
      const auto reduced = md::reduce_rows<F>(e.view());
      ASSERT_EQ(by_rows.observe_rows(e.view()), by_tokens.observe_tokens(reduced));
      ASSERT_EQ(by_rows.digest(), by_tokens.digest());
    }
  };
  check(make_sequence<md::basic_sequence<md::policies::memdecay, double>>(cfg, 3000, 1));
  check(make_sequence<md::policy_sequence<md::policies::h2o>>(cfg, 3000, 2));
  check(make_sequence<md::policy_sequence<md::policies::tova>>(cfg, 3000, 3));
  check(make_sequence<md::policy_sequence<md::policies::snapkv>>(cfg, 3000, 4));
}

TEST(AttentionRows, ABadObservationIsNamedByRowAndTokenAndChangesNothing) {
  const md::config cfg{.page_size = 16, .normalization = md::attention_normalization::uniform};
  for (const auto format : formats) {
    auto seq = make_sequence<md::sequence>(cfg, 4500, 9);
    seq.advance_to(3);
    const auto before = seq.digest();
    const auto hf = format == md::mass_format::f16 ? md::half_format::f16 : md::half_format::bf16;
    auto expect_rejected = [&](const engine_rows& e, const std::string& needle) {
      const std::string why = rejection([&] { seq.observe_rows(e.view()); });
      EXPECT_NE(why.find(needle), std::string::npos) << md::to_string(format) << ": " << why;
      EXPECT_EQ(rejection([&] { seq.check_observe_rows(e.view()); }), why);
      EXPECT_EQ(seq.digest(), before);
    };
    {  // in the third block, after two good ones
      engine_rows e(format, 8, 4500, 0, md::head_reduction::sum, 1);
      e.set(5, 4400, std::numeric_limits<float>::quiet_NaN(), 0x7fc1);
      expect_rejected(e, "row 5, token 4400");
    }
    {  // a negative element that the row sum would hide
      engine_rows e(format, 8, 4500, 0, md::head_reduction::sum, 2);
      e.set(2, 17, -1e-3f, md::simd::float_to_half(-1e-3f, hf));
      e.set(3, 17, 1.0f, md::simd::float_to_half(1.0f, hf));
      expect_rejected(e, "row 2, token 17");
    }
    {  // finite elements whose normalised sum is not (uniform: x 4,500)
      engine_rows e(format, 2, 4500, 0, md::head_reduction::sum, 3);
      const float big = format == md::mass_format::f16 ? 60000.0f : 3e38f;
      const auto bits = md::simd::float_to_half(big, hf);
      e.set(0, 3000, big, bits);
      e.set(1, 3000, big, bits);
      if (format == md::mass_format::f16) {
        // f16 cannot reach float's range: the sum is finite, the normalised sum too; accepted.
        auto copy = seq;
        EXPECT_NO_THROW(copy.observe_rows(e.view()));
      } else {
        expect_rejected(e, "token 3000 reduces to");
      }
    }
    expect_rejected(engine_rows(format, 2, 4499, 0, md::head_reduction::sum, 4), "have 4499 tokens, expected 4500");
    // and the same sequence then takes a good observation
    EXPECT_NO_THROW(seq.observe_rows(engine_rows(format, 2, 4500, 0, md::head_reduction::sum, 5).view()));
  }
}

TEST(AttentionRows, AHostTierSequenceObservesItsDeviceTokens) {
  md::config cfg{.page_size = 16, .normalization = md::attention_normalization::uniform};
  cfg.budget = md::budget_config::tokens(1024);
  auto by_rows = make_sequence<md::sequence>(cfg, 2000, 11);
  md::host_tier_config tier;
  tier.host_budget = md::budget_config::tokens(4096);
  tier.min_host_priority = 0.0;
  by_rows.enable_host_tier(tier);
  by_rows.advance_to(1);
  by_rows.commit(by_rows.select_for_budget());
  ASSERT_LT(by_rows.device_len(), by_rows.kv_len());  // pages on the host
  auto by_tokens = by_rows;
  const engine_rows e(md::mass_format::f16, 4, by_rows.device_len(), 1, md::head_reduction::sum, 12);
  EXPECT_EQ(by_rows.observe_rows(e.view()), by_tokens.observe_tokens(md::reduce_rows<float>(e.view())));
  EXPECT_EQ(by_rows.digest(), by_tokens.digest());
  const engine_rows wrong(md::mass_format::f16, 4, by_rows.kv_len(), 0, md::head_reduction::sum, 13);
  EXPECT_NE(rejection([&] { by_rows.observe_rows(wrong.view()); }).find("expected " + std::to_string(by_rows.device_len())),
            std::string::npos);
}
