// SPDX-License-Identifier: Apache-2.0
// The policies the typed suites run (policy_conformance_test, fault_injection_test): each shipped policy with small
// parameters, so that short random episodes exercise its signal rather than the defaults' large windows.
#ifndef MEMDECAY_TESTS_SUPPORT_POLICY_CASES_HPP
#define MEMDECAY_TESTS_SUPPORT_POLICY_CASES_HPP

#include <gtest/gtest.h>

#include <memdecay/core/sequence.hpp>
#include <memdecay/policies/all.hpp>

namespace policy_cases {

namespace md = memdecay;
namespace pol = memdecay::policies;

// A policy under test: the policy template, the normalisation (MemDecay only) and small parameters so that the
// short episodes exercise the signal rather than the defaults' large windows.
template <template <class> class P, md::attention_normalization N = md::attention_normalization::none>
struct policy_case {
  template <class F>
  using policy = P<F>;
  static constexpr md::attention_normalization normalization = N;
  /// A page's score depends on its own tokens only (up to a monotone map), so removing other pages keeps the
  /// order of the survivors. False for SnapKV's pooling, which reads the neighbours.
  static constexpr bool local_scores = true;
  template <class F>
  static typename P<F>::params_type params() {
    return {};
  }
};
struct h2o_case : policy_case<pol::h2o> {
  template <class F>
  static typename pol::h2o<F>::params_type params() {
    return {.recent_tokens = 6};
  }
};
struct scissorhands_case : policy_case<pol::scissorhands> {
  template <class F>
  static typename pol::scissorhands<F>::params_type params() {
    return {.history_window = 8, .recent_tokens = 3};
  }
};
struct snapkv_case : policy_case<pol::snapkv> {
  static constexpr bool local_scores = false;
};
struct snapkv_max_case : snapkv_case {
  template <class F>
  static typename pol::snapkv<F>::params_type params() {
    return {.window = 3, .kernel_size = 3, .pool = pol::snapkv<F>::pooling::max};
  }
};
struct random_case : policy_case<pol::random> {
  template <class F>
  static typename pol::random<F>::params_type params() {
    return {.seed = 42};
  }
};

template <class Case, class Float = float>
using sequence_of = md::basic_sequence<Case::template policy, Float>;

using all_policies =
    ::testing::Types<policy_case<pol::memdecay>, policy_case<pol::memdecay, md::attention_normalization::uniform>,
                     policy_case<pol::memdecay, md::attention_normalization::lifetime>,
                     policy_case<pol::memdecay, md::attention_normalization::zscore>, random_case,
                     policy_case<pol::streaming_llm>, h2o_case, policy_case<pol::tova>, scissorhands_case,
                     policy_case<pol::norm_sum>, policy_case<pol::priority_lru>, snapkv_case, snapkv_max_case>;

}  // namespace policy_cases

#endif  // MEMDECAY_TESTS_SUPPORT_POLICY_CASES_HPP
