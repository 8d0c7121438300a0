// The exp-free checks (tests/simd/simd_expfree_checks.hpp) compiled for avx512 whatever the build's -march: the SIMD
// headers are compiled under #pragma GCC target in this executable only, and the tests skip on a CPU without
// avx512. (With clang, or when the build already targets avx512 natively, the native-isa tests cover it.)
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <span>
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
#include "simd_expfree_checks.hpp"
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
TEST(SimdExpfreeIsa_avx512, ManyShapesFloat) {
  SKIP_UNLESS_ISA();
  expfree_checks::check_many_shapes<ms::isa::avx512, float>();
}
TEST(SimdExpfreeIsa_avx512, ManyShapesDouble) {
  SKIP_UNLESS_ISA();
  expfree_checks::check_many_shapes<ms::isa::avx512, double>();
}
TEST(SimdExpfreeIsa_avx512, LongRunFloat) {
  SKIP_UNLESS_ISA();
  const double worst = expfree_checks::long_run<ms::isa::avx512, float>(1000, 200'000, 7, "avx512");
  EXPECT_LE(worst, 2 * std::numeric_limits<float>::epsilon());
}
#else
TEST(SimdExpfreeIsa_avx512, NotCompiled) { GTEST_SKIP() << "needs GCC on x86-64 to force avx512"; }
#endif
