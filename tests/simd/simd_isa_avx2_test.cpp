// The SIMD checks compiled for avx2 whatever the build's -march: the SIMD headers are compiled under
// #pragma GCC target in this executable only, and the tests skip on a CPU without avx2. (With clang, or when the
// build already targets avx2 natively, the native-isa tests cover it and these skip.)
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
#pragma GCC target("avx2,fma")
#define MEMDECAY_SIMD_ENABLE_AVX2 1
#define MEMDECAY_SIMD_ENABLE_FMA 1
#define MEMDECAY_SIMD_ISA 2
#include "simd_kernel_checks.hpp"
#pragma GCC pop_options
#else
#define FORCED_ISA 0
#endif

#if FORCED_ISA
namespace {
bool cpu_has_isa() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
}  // namespace

#define SKIP_UNLESS_ISA() \
  if (!cpu_has_isa()) GTEST_SKIP() << "CPU without avx2"

namespace ms = memdecay::simd;
TEST(SimdIsa_avx2, ExpFloat) {
  SKIP_UNLESS_ISA();
  simd_checks::check_exp_float<ms::isa::avx2>();
}
TEST(SimdIsa_avx2, ExpDouble) {
  SKIP_UNLESS_ISA();
  simd_checks::check_exp_double<ms::isa::avx2>();
}
TEST(SimdIsa_avx2, ScoresFloat) {
  SKIP_UNLESS_ISA();
  simd_checks::check_scores_many_shapes<ms::isa::avx2, float>();
}
TEST(SimdIsa_avx2, ScoresDouble) {
  SKIP_UNLESS_ISA();
  simd_checks::check_scores_many_shapes<ms::isa::avx2, double>();
}
#else
TEST(SimdIsa_avx2, NotCompiled) { GTEST_SKIP() << "needs GCC on x86-64 to force avx2"; }
#endif
