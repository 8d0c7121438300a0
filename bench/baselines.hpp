// The loops a user would write instead of memdecay's SIMD scorer, for the benchmark's ratios. Page size 16,
// token counts a multiple of 16, float scores. autovec_kernels.cpp is compiled with -O3 -ffast-math (so GCC may
// vectorise std::exp through glibc's libmvec) and includes no memdecay header, so no inline function of the
// library is ever compiled with -ffast-math.
#ifndef MEMDECAY_BENCH_BASELINES_HPP
#define MEMDECAY_BENCH_BASELINES_HPP

#include <cstddef>
#include <cstdint>

namespace baselines {

struct score_args {
  const std::uint8_t* regions;
  const std::uint32_t* last_refresh;  // read by score, read and written by fused
  const float* ewma;
  std::size_t n;
  std::uint32_t now;
  const float* base;      // b_r, 256 entries
  const float* neg_rate;  // -lambda_r, 256 entries
  float alpha;
  float* out;  // n / 16 page scores
};
struct observe_args {
  std::uint32_t* last_refresh;
  float* ewma;
  const float* mass;
  float beta, tau, scale;
};

/// The plain loops with pointers hoisted to locals, compiled -O3 -ffast-math: GCC vectorises the gathers and
/// calls libmvec's vector expf.
void score_autovec(const score_args& a);
std::size_t fused_autovec(const score_args& a, const observe_args& o);
}  // namespace baselines

#endif  // MEMDECAY_BENCH_BASELINES_HPP
