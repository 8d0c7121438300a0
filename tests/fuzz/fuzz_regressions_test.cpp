// SPDX-License-Identifier: Apache-2.0
// Regression tests for the bugs the fuzzers found (the API fuzzer, the adapter fuzzer and the calibration-file
// loader's; docs/reliability.md). The inputs that found them are in corpus/*/regression_* and replay in every build;
// these tests state each bug directly.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <vector>

#include "memdecay/page_tables/block_pool.hpp"
#include "memdecay/calibration/file.hpp"
#include "memdecay/core/manager.hpp"
#include "memdecay/page_tables/flashinfer_csr.hpp"
#include "memdecay/core/sequence.hpp"

namespace md = memdecay;

namespace {

template <class Error, class Call>
std::string message_of(Call&& call) {
  try {
    call();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

md::config user_only(md::budget_config budget) { return md::config{.page_size = 16, .budget = budget}; }

}  // namespace

// alpha = 1e39 is a finite double, so config::validate() accepted it; as a float it is inf, and inf * 0 (the EWMA
// of every token never attended) made every page score NaN, so selection compared NaNs.
TEST(FuzzRegression, ConfigNumbersThatOverflowFloatScoresAreRejected) {
  md::config cfg;
  cfg.alpha = 1e39;
  EXPECT_EQ(message_of<md::config_error>([&] { md::sequence seq(cfg); }),
            "invalid config: alpha = 1e+39 (does not fit the score type: at most 3.40282347e+38)");
  EXPECT_NO_THROW((md::basic_sequence<md::policies::memdecay, double, 16>(cfg)));  // double scores hold it

  md::config region_cfg;
  region_cfg.region_overrides = {{.region = "user", .decay_rate = 1e300}};
  EXPECT_NE(message_of<md::config_error>([&] { md::sequence seq(region_cfg); }).find("region 'user' decay_rate"),
            std::string::npos);
  region_cfg.region_overrides = {{.region = "plan", .base_priority = 1e39}};
  EXPECT_NE(message_of<md::config_error>([&] { md::sequence seq(region_cfg); }).find("region 'plan' base_priority"),
            std::string::npos);

  cfg.alpha = 3e38;  // the largest values that fit still work, and score without NaN
  md::sequence seq(cfg);
  seq.append(md::regions::user, 32);
  for (float s : seq.page_scores()) EXPECT_FALSE(std::isnan(s));
}

// A token or page budget of 2^64 tokens or more (tokens(1e300), pages(2^60) with 16-token pages) is valid and can
// never bind. The watermark was a float-to-integer cast out of range (undefined; 0 with g++), or a product that
// wrapped, so such a budget evicted every evictable page.
TEST(FuzzRegression, HugeBudgetsNeverBind) {
  for (const auto budget : {md::budget_config::tokens(1e300), md::budget_config::tokens(18446744073709551616.0),
                            md::budget_config::pages(1152921504606846976.0), md::budget_config::pages(1e300)}) {
    const auto marks = budget.in_tokens(16, 1000);
    EXPECT_EQ(marks.high, std::numeric_limits<std::uint64_t>::max());
    EXPECT_EQ(marks.low, std::numeric_limits<std::uint64_t>::max());
    md::sequence seq(user_only(budget));
    seq.append(md::regions::user, 64);
    seq.advance_to(100);
    EXPECT_TRUE(seq.select_for_budget().empty());
    EXPECT_EQ(seq.select_for_budget().pages_over_budget, 0u);
  }
  // Just below 2^64 the watermark is exact.
  EXPECT_EQ(md::budget_config::tokens(9007199254740992.0).in_tokens(16, 0).high, 9007199254740992ULL);
  EXPECT_EQ(md::budget_config::pages(4).in_tokens(16, 0).high, 64u);
}

// append_tokens(seq, n) with n close to SIZE_MAX wrapped tokens + n (and pages_for's + page_size - 1) to a small
// number: the call was accepted without allocating, and the sequence's token count went wrong.
TEST(FuzzRegression, BlockPoolAppendThatOverflowsIsRejectedChangingNothing) {
  md::block_pool<> pool(8, 16);
  pool.open(1);
  pool.append_tokens(1, 18);
  const std::size_t max = std::numeric_limits<std::size_t>::max();
  for (std::size_t n : {max, max - 3, max - 17, max - 18 - 14}) {
    EXPECT_NE(
        message_of<md::input_error>([&] { pool.append_tokens(1, n); }).find("invalid input: block pool exhausted"),
        std::string::npos)
        << n;
    EXPECT_EQ(pool.num_tokens(1), 18u);
    EXPECT_EQ(pool.num_pages(1), 2u);
    EXPECT_EQ(pool.free_blocks(), 6u);
    EXPECT_TRUE(pool.consistent());
  }
  pool.open(2);
  EXPECT_THROW(pool.append_tokens(2, max - 3), md::input_error);
  EXPECT_EQ(pool.num_tokens(2), 0u);
  pool.append_tokens(1, 14);  // ordinary appends still work
  EXPECT_EQ(pool.num_tokens(1), 32u);
}

// Found by the calibration fuzzer: a region whose decay_rate is a positive denormal (5e-324) has no finite
// half-life (ln 2 / rate overflows). The reader compared |half_life - inf| <= 1e-9 * inf, which holds for ANY finite
// half_life, so it accepted the file; the writer then wrote half_life = inf as null, a file the reader rejects.
// calibration::check() now rejects such a rate (reader and writer alike), and a calibrated fit whose half-life is
// so small that ln 2 / half_life overflows no longer "agrees" with every decay rate.
TEST(FuzzRegression, CalibrationDecayRateWithoutAFiniteHalfLifeIsRejected) {
  namespace cal = md::calibration;
  cal::calibration c;
  cal::region_calibration r;
  r.name = "all";
  r.fit.reason = "uncalibrated by default";
  r.decay_rate = 5e-324;
  c.regions = {r};
  ASSERT_TRUE(c.check().has_value());
  EXPECT_NE(c.check()->find("overflows"), std::string::npos) << *c.check();
  EXPECT_THROW((void)cal::to_json(c), md::config_error);

  c.regions[0].decay_rate = 0.0;
  std::string text = cal::to_json(c);  // valid; now make the rate denormal and the half-life any finite value
  text.replace(text.find("\"decay_rate\": 0.0"), 17, "\"decay_rate\": 5e-324");
  text.replace(text.find("\"half_life\": null"), 17, "\"half_life\": 1.0");
  const auto parsed = cal::parse(text);
  ASSERT_FALSE(parsed.ok()) << text;
  EXPECT_NE(parsed.error->find("overflows"), std::string::npos) << *parsed.error;

  // A calibrated fit with a denormal half-life does not agree with decay_rate = 1.
  cal::region_calibration fitted;
  fitted.name = "all";
  fitted.fit.status = cal::fit_status::calibrated;
  fitted.fit.half_life = 5e-324;
  fitted.fit.half_life_ci = cal::interval{5e-324, 5e-324};
  fitted.decay_rate = 1.0;
  c.regions = {fitted};
  ASSERT_TRUE(c.check().has_value());
  EXPECT_NE(c.check()->find("disagrees"), std::string::npos) << *c.check();
}

// manager::protect_pages / protect_tail_tokens do not change any sequence's generation, so a plan selected before
// the protection was still current and its commit evicted a page the documentation says is kept for the step
// (in-flight or speculative tokens read it). Found by the adapter fuzzer (corpus/adapter/regression_*protected*).
TEST(FuzzRegression, ManagerCommitRejectsAPageProtectedAfterSelection) {
  md::manager mgr({.page_size = 4, .global = md::global_budget::pages(1)});
  for (std::uint64_t id : {1, 2}) {
    auto& seq = mgr.open(id, md::config{.page_size = 4});
    seq.append(md::regions::user, 16);
  }
  md::block_pool<> pool(16, 4);
  for (std::uint64_t id : {1, 2}) {
    pool.open(id);
    pool.append_tokens(id, 16);
  }
  const auto plan = mgr.select_global();
  ASSERT_FALSE(plan.empty());
  const auto victim = plan.victims.front();
  mgr.protect_pages(victim.sequence, std::vector<std::size_t>{victim.page});  // after the selection
  const auto digest = mgr.digest();
  const std::vector<md::block_pool<>::page_id> table(pool.block_table(victim.sequence).begin(),
                                                     pool.block_table(victim.sequence).end());
  const std::string message = message_of<md::usage_error>([&] { (void)mgr.commit(plan, pool, md::identity_id{}); });
  EXPECT_NE(message.find("which is protected for this step"), std::string::npos) << message;
  EXPECT_THROW(mgr.commit(plan), md::usage_error);
  EXPECT_THROW((void)mgr.commit(victim.sequence, plan.plans.at(victim.sequence), pool, md::identity_id{}),
               md::usage_error);
  EXPECT_EQ(mgr.digest(), digest);
  EXPECT_TRUE(std::equal(table.begin(), table.end(), pool.block_table(victim.sequence).begin(),
                         pool.block_table(victim.sequence).end()));
  // A fresh selection honours the protection and commits.
  const auto again = mgr.select_global();
  for (const auto& v : again.victims) EXPECT_FALSE(v.sequence == victim.sequence && v.page == victim.page);
  EXPECT_NO_THROW((void)mgr.commit(again, pool, md::identity_id{}));
}

// flashinfer_csr's readers check the one request they read in O(1), but accepted a request with no pages
// (indptr[r + 1] == indptr[r], which the engine may write between steps): kv_len() wrapped to
// page_size * (SIZE_MAX) + last_page_len, and page_at() called the corruption a misuse. Found by the adapter fuzzer
// (corpus/adapter/regression_*empty_request*).
TEST(FuzzRegression, FlashInferReadersRejectARequestWithoutPages) {
  std::vector<std::int32_t> indptr{0, 2, 3}, indices{4, 5, 6}, last_page_len{3, 1};
  md::flashinfer_csr view(indptr, indices, last_page_len, 4, 8);
  EXPECT_EQ(view.kv_len(0), 7u);
  indptr[1] = 0;  // the engine empties request 0 (and so corrupts the arrays) after the view was made
  EXPECT_THROW((void)view.kv_len(0), md::input_error);
  EXPECT_THROW((void)view.num_pages(0), md::input_error);
  EXPECT_THROW((void)view.page_at(0, 0), md::input_error);
  const std::string message = message_of<md::input_error>([&] { (void)view.kv_len(0); });
  EXPECT_NE(message.find("request 0 has no pages"), std::string::npos) << message;
  EXPECT_EQ(indptr, (std::vector<std::int32_t>{0, 0, 3}));
}
