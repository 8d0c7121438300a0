// SPDX-License-Identifier: Apache-2.0
// The self-test traces the interval estimators' tests share (calibration_intervals_test, calibration_references_test):
// small enough for the sanitized debug build, large enough that every region calibrates; and a region table naming
// the config's regions.
#ifndef MEMDECAY_TESTS_SUPPORT_CALIBRATION_CASES_HPP
#define MEMDECAY_TESTS_SUPPORT_CALIBRATION_CASES_HPP

#include <vector>

#include <memdecay/calibration/selftest.hpp>
#include <memdecay/core/region.hpp>

namespace calibration_cases {

inline memdecay::calibration::selftest::synthetic_config small_config() {
  memdecay::calibration::selftest::synthetic_config c;
  c.names = {"short", "long"};
  c.refresh_half_life = {6.0, 20.0};
  c.fade_half_life = {6.0, 20.0};
  c.episodes = 20;
  c.steps = 110;
  c.prompt_tokens = 96;
  return c;
}

inline memdecay::region_table table_for(const memdecay::calibration::selftest::synthetic_config& c) {
  std::vector<memdecay::region_params> p;
  for (const auto& n : c.names) p.push_back({n, 0.5, 0.01, false});
  return memdecay::region_table(p);
}

}  // namespace calibration_cases

#endif  // MEMDECAY_TESTS_SUPPORT_CALIBRATION_CASES_HPP
