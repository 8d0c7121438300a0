// The exp-free fused pass's memory floor: its loads and stores (region byte, w, EWMA and mass read; the EWMA
// written; the clock and w written where the token is refreshed, as masked stores) and its page sums, with the
// per-token math reduced to adds. `fused/expfree_roofline` (simd_bench.cpp) runs it on one state,
// `manager/roofline` (manager_bench.cpp) on every sequence of a batch on an executor's threads.
#ifndef MEMDECAY_BENCH_EXPFREE_ROOFLINE_HPP
#define MEMDECAY_BENCH_EXPFREE_ROOFLINE_HPP

#include <cstddef>

#include <memdecay/memdecay.hpp>

namespace bench_rooflines {

namespace md = memdecay;
namespace ms = memdecay::simd;

template <class P>
struct light_fused {
  typename P::reg scale, beta, omb, tau;
  md::step_t now;
  std::size_t refreshed = 0;
  explicit light_fused(const md::observation_params<float>& o, md::step_t t)
      : scale(P::set1(o.scale)), beta(P::set1(o.beta)), omb(P::set1(1.0f - o.beta)), tau(P::set1(o.tau)), now(t) {}
  MEMDECAY_SIMD_INLINE typename P::reg operator()(const typename P::table& t, const md::region_id* r, md::step_t* lr,
                                                  float* wt, float* ew, const float* mass) {
    const auto x = P::mul(scale, P::load(mass));
    const auto a = P::add(P::mul(beta, P::load(ew)), P::mul(omb, x));
    const auto hit = P::gt(x, tau);
    P::store(ew, a);
    ms::detail::store_u32_where<P>(lr, hit, now);
    const auto g = P::template lookup<true>(t, r);
    const auto wn = P::blend(P::load(wt), g, hit);
    ms::detail::store_where<P>(wt, hit, g, wn);
    refreshed += P::popcount(hit);
    return P::add(a, wn);
  }
};

/// One pass over n tokens (pages of PageSize), page sums to `out`; returns the tokens refreshed.
template <std::size_t PageSize>
std::size_t fused_expfree_roofline(const md::region_id* r, md::step_t* lr, float* wt, float* ew, const float* mass,
                                   std::size_t n, const ms::region_lut<float>& lut,
                                   const md::observation_params<float>& obs, md::step_t now, float* out) {
  using NP = ms::packet<float, ms::native_isa>;
  using SP = ms::packet<float, ms::isa::scalar>;
  const auto vt = NP::make_table(lut.base());
  const auto st = SP::make_table(lut.base());
  light_fused<NP> vf(obs, now);
  light_fused<SP> sf(obs, now);
  ms::detail::page_loop<NP, PageSize>(
      n, PageSize, out, [&](std::size_t i) { return vf(vt, r + i, lr + i, wt + i, ew + i, mass + i); },
      [&](std::size_t i) { return sf(st, r + i, lr + i, wt + i, ew + i, mass + i); });
  return vf.refreshed + sf.refreshed;
}

}  // namespace bench_rooflines

#endif  // MEMDECAY_BENCH_EXPFREE_ROOFLINE_HPP
