// The SIMD checks compiled for avx512 whatever the build's -march: the SIMD headers are compiled under
// #pragma GCC target in this executable only, and the tests skip on a CPU without avx512. (With clang, or when the
// build already targets avx512 natively, the native-isa tests cover it and these skip.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <memdecay/core/eviction.hpp>
#include <memdecay/core/ewma_tracker.hpp>
#include <memdecay/core/region.hpp>
#include <memdecay/core/sequence_state.hpp>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(MEMDECAY_SIMD_ARCH_HPP)
#define FORCED_ISA 1
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512dq,avx512bw,avx2,fma")
#define MEMDECAY_SIMD_ENABLE_AVX512 1
#define MEMDECAY_SIMD_ENABLE_AVX2 1
#define MEMDECAY_SIMD_ENABLE_FMA 1
#define MEMDECAY_SIMD_ISA 3
#include "simd_kernel_checks.hpp"
#pragma GCC pop_options
#else
#define FORCED_ISA 0
#endif

#if FORCED_ISA
namespace {
bool cpu_has_isa() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw");
}
}  // namespace

#define SKIP_UNLESS_ISA() \
  if (!cpu_has_isa()) GTEST_SKIP() << "CPU without avx512"

namespace ms = memdecay::simd;
TEST(SimdIsa_avx512, ExpFloat) {
  SKIP_UNLESS_ISA();
  simd_checks::check_exp_float<ms::isa::avx512>();
}
TEST(SimdIsa_avx512, ExpDouble) {
  SKIP_UNLESS_ISA();
  simd_checks::check_exp_double<ms::isa::avx512>();
}
TEST(SimdIsa_avx512, ScoresFloat) {
  SKIP_UNLESS_ISA();
  simd_checks::check_scores_many_shapes<ms::isa::avx512, float>();
}
TEST(SimdIsa_avx512, ScoresDouble) {
  SKIP_UNLESS_ISA();
  simd_checks::check_scores_many_shapes<ms::isa::avx512, double>();
}
#else
TEST(SimdIsa_avx512, NotCompiled) { GTEST_SKIP() << "needs GCC on x86-64 to force avx512"; }
#endif
