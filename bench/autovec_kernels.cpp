// Baseline kernels compiled with -O3 -ffast-math (see bench/CMakeLists.txt). No memdecay header here.
#include <cmath>

#include "baselines.hpp"

namespace baselines {

void score_autovec(const score_args& a) {
  // The gotcha: GCC 12 will not vectorise the table lookups if base/neg_rate are read through `a` inside the
  // loop, so every pointer is a local.
  const std::uint8_t* r = a.regions;
  const std::uint32_t* lr = a.last_refresh;
  const float* ew = a.ewma;
  const float* base = a.base;
  const float* neg = a.neg_rate;
  const float alpha = a.alpha;
  const std::uint32_t now = a.now;
  float* out = a.out;
  const std::size_t pages = a.n / 16;
  for (std::size_t p = 0; p < pages; ++p) {
    float sum = 0;
    for (std::size_t j = 0; j < 16; ++j) {
      const std::size_t i = p * 16 + j;
      sum += base[r[i]] * std::exp(neg[r[i]] * static_cast<float>(now - lr[i])) + alpha * ew[i];
    }
    out[p] = sum / 16.0f;
  }
}

std::size_t fused_autovec(const score_args& a, const observe_args& o) {
  const std::uint8_t* r = a.regions;
  std::uint32_t* lr = o.last_refresh;
  float* ew = o.ewma;
  const float* mass = o.mass;
  const float* base = a.base;
  const float* neg = a.neg_rate;
  const float alpha = a.alpha, beta = o.beta, omb = 1.0f - o.beta, tau = o.tau, scale = o.scale;
  const std::uint32_t now = a.now;
  float* out = a.out;
  const std::size_t pages = a.n / 16;
  std::size_t refreshed = 0;
  for (std::size_t p = 0; p < pages; ++p) {
    float sum = 0;
    for (std::size_t j = 0; j < 16; ++j) {
      const std::size_t i = p * 16 + j;
      const float x = scale * mass[i];
      const float e = beta * ew[i] + omb * x;
      ew[i] = e;
      const bool hit = x > tau;
      const std::uint32_t l = hit ? now : lr[i];
      lr[i] = l;
      refreshed += hit;
      sum += base[r[i]] * std::exp(neg[r[i]] * static_cast<float>(now - l)) + alpha * e;
    }
    out[p] = sum / 16.0f;
  }
  return refreshed;
}

}  // namespace baselines
