// The SIMD scorer against the baselines a user would otherwise write, on the same data, in one run:
//   <pass>/simd/<n>             memdecay::simd kernels, native isa, compile-time page size 16
//   <pass>/simd_dynamic/<n>     the same with the page size chosen at run time
//   <pass>/simd_scalar_isa/<n>  the same kernel compiled for the 1-lane fallback (what non-x86 targets run)
//   <pass>/reference/<n>        the library's scalar reference (page_scores_reference / observe_tokens_reference)
//   <pass>/scalar_exp/<n>       a plain scalar loop calling std::exp
//   <pass>/autovec/<n>          that loop compiled -O3 -ffast-math so that GCC vectorises it (libmvec expf)
//   <pass>/eigen/<n>            an Eigen 3.4 array expression (vectorised exp), in cache-sized chunks
//   <pass>/roofline/<n>         the simd kernel with the exp and region math removed (same loads, stores,
//                               page sums; fused keeps the EWMA update): the memory/loop floor
//   <pass>/expfree/<n>          the exp-free kernels (simd/expfree.hpp): f_r(now) * w_i per token, per-step
//                               tables and the amortised rebase included (one step per iteration)
//   <pass>/expfree_roofline/<n> the exp-free kernel's loads and stores (w and masked clock/weight stores) with
//                               the per-token math removed
//   library/observe/<what>/<n>  one engine step through the public API: advance_to + observe_tokens on a
//                               memdecay::sequence (`sequence`, exp-free default) or policy_sequence<memdecay>
//                               (`policy`): validation, the fused pass, the score cache
//   library/validate/<how>/<n>  the mass validation alone: `simd` (simd::mass_is_valid, the fast path) or `scalar`
//                               (the per-token loop with a branch it replaced)
//   library/select32/<what>/<n> select(32) through the public API (cached scores, page statuses, selection)
// <pass> is `score` (score-only) or `fused` (observe + score). n = tokens; pages of 16; float. Items are
// tokens; bytes are the state traffic per token (score 9 + 0.25, fused 21 + 0.25).
// Speed claims are ratios between rows of one run (docs/benchmarks.md, bench/run_benchmarks.py).
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

// GCC 12 warns about its own AVX-512 intrinsics inlined into Eigen's exp (-Wmaybe-uninitialized, a false positive).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <Eigen/Core>

#include <memdecay/memdecay.hpp>

#include "baselines.hpp"
#include "expfree_roofline.hpp"

namespace md = memdecay;
namespace ms = memdecay::simd;

namespace {

constexpr std::size_t kPage = 16;
constexpr double kScoreBytes = 9.0 + 4.0 / kPage;
constexpr double kFusedBytes = 21.0 + 4.0 / kPage;
// exp-free: score reads region 1, w 4, EWMA 4 (9, as the polynomial pass). Fused reads region, w, EWMA, mass (13)
// and writes the EWMA (4) and, where refreshed, the clock and w (masked stores; with this workload's refresh rate
// nearly every cache line is written): counted as 13 + 12 = 25 bytes per token.
constexpr double kExpfreeScoreBytes = 9.0 + 4.0 / kPage;
constexpr double kExpfreeFusedBytes = 25.0 + 4.0 / kPage;

/// One workload: a state of n tokens of the default regions, clocks spread over the last 4000 steps, EWMA and
/// an observation (uniform normalisation, a quarter of the tokens above tau).
struct workload {
  md::region_table table = md::default_region_table();
  md::token_state<float, kPage> state;
  std::vector<float> mass, out;
  ms::region_lut<float> lut{table};
  md::observation_params<float> obs{};
  float alpha = 1.0f;
  // exp-free: the weights beside the state, and its clock (epoch at span() steps before now, so a benchmark
  // iteration that moves it one step forward reaches a rebase after span() iterations, as an engine would).
  md::detail::column_vector<float, 2> w;  // the policy's layout for its weights (detail/column_vector.hpp)
  ms::expfree_clock<float> clock{lut};
  std::size_t steps_since_rebase = 0;

  explicit workload(std::size_t n) {
    std::uint64_t x = 12345;
    auto next = [&x] { return x = x * 6364136223846793005ULL + 1442695040888963407ULL; };
    std::vector<md::region_span> spans;
    for (std::size_t done = 0; done < n;) {
      const std::size_t run = std::min<std::size_t>(n - done, 8 + (next() >> 58));
      spans.push_back({static_cast<md::region_id>((next() >> 33) % 7), run});
      done += run;
    }
    state.append(spans);
    state.advance_to(5000);
    auto lr = state.last_refresh_mut();
    auto ew = state.ewma_mut();
    mass.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      lr[i] = static_cast<md::step_t>(1000 + (next() >> 33) % 4000);
      ew[i] = static_cast<float>((next() >> 40) % 1000) / 500.0f;
      mass[i] = static_cast<float>((next() >> 40) % 1000) / 400.0f / static_cast<float>(n);
    }
    out.resize(state.num_pages());
    obs = {0.9f, 1.0f, static_cast<float>(n)};
    w.resize(n);
    ms::reset_expfree(state, clock, std::span<float>(w));
  }
  /// One engine step of the exp-free formulation at a fixed state clock: the per-step tables, and every span()
  /// steps a rebase (the same epoch, so the weights stay valid and every variant sees the same data).
  void expfree_step() {
    if (++steps_since_rebase >= clock.span()) {
      steps_since_rebase = 0;
      ms::reset_expfree(state, clock, std::span<float>(w));
    } else {
      clock.set(clock.epoch(), state.now());
    }
  }
  baselines::score_args score_args() {
    return {state.regions().data(),
            state.last_refresh().data(),
            state.ewma().data(),
            state.kv_len(),
            state.now(),
            lut.base(),
            lut.neg_rate(),
            alpha,
            out.data()};
  }
  baselines::observe_args observe_args() {
    return {state.last_refresh_mut().data(), state.ewma_mut().data(), mass.data(), obs.beta, obs.tau, obs.scale};
  }
};

workload& data(std::size_t n) {
  static std::map<std::size_t, std::unique_ptr<workload>> cache;
  auto it = cache.find(n);
  if (it == cache.end()) {
    cache.clear();  // keep one size resident: 16M tokens is 208 MB
    it = cache.emplace(n, std::make_unique<workload>(n)).first;
  }
  return *it->second;
}

void finish(benchmark::State& st, std::size_t n, double bytes_per_token) {
  st.SetItemsProcessed(static_cast<std::int64_t>(st.iterations()) * static_cast<std::int64_t>(n));
  st.SetBytesProcessed(
      static_cast<std::int64_t>(static_cast<double>(st.iterations()) * static_cast<double>(n) * bytes_per_token));
}

// --- the plain scalar loops (no -ffast-math, so std::exp stays a libm call per token) ----------------------------
void score_scalar_exp(const baselines::score_args& a) {
  const std::uint8_t* r = a.regions;
  const std::uint32_t* lr = a.last_refresh;
  const float* ew = a.ewma;
  const float* base = a.base;
  const float* neg = a.neg_rate;
  for (std::size_t p = 0; p < a.n / kPage; ++p) {
    float sum = 0;
    for (std::size_t i = p * kPage; i < (p + 1) * kPage; ++i)
      sum += base[r[i]] * std::exp(neg[r[i]] * static_cast<float>(a.now - lr[i])) + a.alpha * ew[i];
    a.out[p] = sum / static_cast<float>(kPage);
  }
}
std::size_t fused_scalar_exp(const baselines::score_args& a, const baselines::observe_args& o) {
  const std::uint8_t* r = a.regions;
  std::uint32_t* lr = o.last_refresh;
  float* ew = o.ewma;
  const float* base = a.base;
  const float* neg = a.neg_rate;
  std::size_t refreshed = 0;
  for (std::size_t p = 0; p < a.n / kPage; ++p) {
    float sum = 0;
    for (std::size_t i = p * kPage; i < (p + 1) * kPage; ++i) {
      const float x = o.scale * o.mass[i];
      ew[i] = o.beta * ew[i] + (1.0f - o.beta) * x;
      if (x > o.tau) {
        lr[i] = a.now;
        ++refreshed;
      }
      sum += base[r[i]] * std::exp(neg[r[i]] * static_cast<float>(a.now - lr[i])) + a.alpha * ew[i];
    }
    a.out[p] = sum / static_cast<float>(kPage);
  }
  return refreshed;
}

// --- Eigen: lookups into per-token arrays, then one array expression (no cast<>/select in it, or Eigen 3.4's
// exp would silently go scalar), page means by a colwise sum; chunks of 4096 tokens stay in L1/L2. ----------------
constexpr std::size_t kChunk = 4096;
void eigen_chunk_scores(const baselines::score_args& a, std::size_t first, std::size_t m, const float* ewma, float* tb,
                        float* targ) {
  const std::uint8_t* r = a.regions + first;
  const std::uint32_t* lr = a.last_refresh + first;
  const float* base = a.base;
  const float* neg = a.neg_rate;
  for (std::size_t i = 0; i < m; ++i) {
    tb[i] = base[r[i]];
    targ[i] = neg[r[i]] * static_cast<float>(a.now - lr[i]);
  }
  const auto em = static_cast<Eigen::Index>(m);
  Eigen::Map<Eigen::ArrayXf> b(tb, em), arg(targ, em);
  Eigen::Map<const Eigen::ArrayXf> e(ewma + first, em);
  b = b * arg.exp() + a.alpha * e;
  Eigen::Map<Eigen::Array<float, static_cast<int>(kPage), Eigen::Dynamic>> pages(tb, kPage, em / kPage);
  Eigen::Map<Eigen::Array<float, 1, Eigen::Dynamic>> out(a.out + first / kPage, em / kPage);
  out = pages.colwise().sum() / static_cast<float>(kPage);
}
void score_eigen(const baselines::score_args& a, std::vector<float>& tb, std::vector<float>& targ) {
  for (std::size_t first = 0; first < a.n; first += kChunk)
    eigen_chunk_scores(a, first, std::min(kChunk, a.n - first), a.ewma, tb.data(), targ.data());
}
std::size_t fused_eigen(const baselines::score_args& a, const baselines::observe_args& o, std::vector<float>& tb,
                        std::vector<float>& targ) {
  std::size_t refreshed = 0;
  for (std::size_t first = 0; first < a.n; first += kChunk) {
    const std::size_t m = std::min(kChunk, a.n - first);
    const auto em = static_cast<Eigen::Index>(m);
    Eigen::Map<const Eigen::ArrayXf> mass(o.mass + first, em);
    Eigen::Map<Eigen::ArrayXf> ew(o.ewma + first, em);
    ew = o.beta * ew + (1.0f - o.beta) * (o.scale * mass);
    std::uint32_t* lr = o.last_refresh + first;
    for (std::size_t i = 0; i < m; ++i)
      if (o.scale * o.mass[first + i] > o.tau) {
        lr[i] = a.now;
        ++refreshed;
      }
    eigen_chunk_scores(a, first, m, o.ewma, tb.data(), targ.data());
  }
  return refreshed;
}

// --- roofline: the scorer's loop with the exp and the per-region math taken out. Same loads (region byte,
// clock, EWMA; and mass for fused), same stores, same page structure and transposed page sums; per token it only
// adds EWMA + age + b_r. ------------------------------------------------------------------------------------------
using NP = ms::packet<float, ms::native_isa>;
using SP = ms::packet<float, ms::isa::scalar>;

template <class P>
MEMDECAY_SIMD_INLINE typename P::reg light(const typename P::table& t, const md::region_id* r, typename P::ureg lr,
                                           typename P::reg ew, md::step_t now) {
  return P::add(P::add(ew, P::age(lr, now)), P::template lookup<true>(t, r));
}

void score_roofline(workload& w) {
  const md::region_id* r = w.state.regions().data();
  const md::step_t* lr = w.state.last_refresh().data();
  const float* ew = w.state.ewma().data();
  const auto vt = NP::make_table(w.lut.base());
  const auto st = SP::make_table(w.lut.base());
  const md::step_t now = w.state.now();
  ms::detail::page_loop<NP, kPage>(
      w.state.kv_len(), kPage, w.out.data(),
      [&](std::size_t i) { return light<NP>(vt, r + i, NP::load_u32(lr + i), NP::load(ew + i), now); },
      [&](std::size_t i) { return light<SP>(st, r + i, SP::load_u32(lr + i), SP::load(ew + i), now); });
}

std::size_t fused_roofline(workload& w) {
  const md::region_id* r = w.state.regions().data();
  md::step_t* lr = w.state.last_refresh_mut().data();
  float* ew = w.state.ewma_mut().data();
  const float* mass = w.mass.data();
  const auto vt = NP::make_table(w.lut.base());
  const auto st = SP::make_table(w.lut.base());
  const md::step_t now = w.state.now();
  ms::detail::token_observer<NP> vobs(w.obs, now);
  ms::detail::token_observer<SP> sobs(w.obs, now);
  ms::detail::page_loop<NP, kPage>(
      w.state.kv_len(), kPage, w.out.data(),
      [&](std::size_t i) {
        NP::ureg l;
        NP::reg a;
        vobs(lr + i, ew + i, mass + i, l, a);
        return light<NP>(vt, r + i, l, a, now);
      },
      [&](std::size_t i) {
        SP::ureg l;
        SP::reg a;
        sobs(lr + i, ew + i, mass + i, l, a);
        return light<SP>(st, r + i, l, a, now);
      });
  return vobs.refreshed + sobs.refreshed;
}

// --- exp-free roofline: the exp-free kernels' loads and stores (region byte, w, EWMA; fused adds mass, the EWMA
// store and the masked clock / weight stores) with the per-token math reduced to adds. ---------------------------
template <class P>
MEMDECAY_SIMD_INLINE typename P::reg light_w(const typename P::table& t, const md::region_id* r, typename P::reg w,
                                             typename P::reg ew) {
  return P::add(P::add(ew, w), P::template lookup<true>(t, r));
}
void score_expfree_roofline(workload& w) {
  const md::region_id* r = w.state.regions().data();
  const float* wt = w.w.data();
  const float* ew = w.state.ewma().data();
  const auto vt = NP::make_table(w.lut.base());
  const auto st = SP::make_table(w.lut.base());
  ms::detail::page_loop<NP, kPage>(
      w.state.kv_len(), kPage, w.out.data(),
      [&](std::size_t i) { return light_w<NP>(vt, r + i, NP::load(wt + i), NP::load(ew + i)); },
      [&](std::size_t i) { return light_w<SP>(st, r + i, SP::load(wt + i), SP::load(ew + i)); });
}
std::size_t fused_expfree_roofline(workload& w) {
  return bench_rooflines::fused_expfree_roofline<kPage>(w.state.regions().data(), w.state.last_refresh_mut().data(),
                                                        w.w.data(), w.state.ewma_mut().data(), w.mass.data(),
                                                        w.state.kv_len(), w.lut, w.obs, w.state.now(), w.out.data());
}

// --- benchmark bodies ---------------------------------------------------------------------------------------
template <class F>
void run_score(benchmark::State& st, F&& kernel, double bytes = kScoreBytes) {
  const auto n = static_cast<std::size_t>(st.range(0));
  auto& w = data(n);
  for (auto _ : st) {
    kernel(w);
    benchmark::DoNotOptimize(w.out.data());
    benchmark::ClobberMemory();
  }
  finish(st, n, bytes);
}
template <class F>
void run_fused(benchmark::State& st, F&& kernel, double bytes = kFusedBytes) {
  const auto n = static_cast<std::size_t>(st.range(0));
  auto& w = data(n);
  std::size_t refreshed = 0;
  for (auto _ : st) {
    refreshed += kernel(w);
    benchmark::DoNotOptimize(w.out.data());
    benchmark::ClobberMemory();
  }
  benchmark::DoNotOptimize(refreshed);
  finish(st, n, bytes);
}

/// One engine step through the public API on a sequence built from the workload's labels: advance the clock by
/// one and observe (or, with `select`, select 32 victims from the cached scores). Sequences are built once per size.
template <class Seq>
void run_library(benchmark::State& st, bool select) {
  const auto n = static_cast<std::size_t>(st.range(0));
  auto& w = data(n);
  static std::map<std::size_t, std::unique_ptr<Seq>> built;
  auto& seq = built[n];
  if (!seq) {
    seq = std::make_unique<Seq>(md::config{.page_size = kPage, .normalization = md::attention_normalization::uniform});
    seq->append_tokens(w.state.regions());
  }
  md::step_t step = seq->now();
  seq->advance_to(++step);
  seq->observe_tokens(std::span<const float>(w.mass));
  for (auto _ : st) {
    if (select) {
      auto plan = seq->select(32);
      benchmark::DoNotOptimize(plan.pages.data());
    } else {
      seq->advance_to(++step);
      benchmark::DoNotOptimize(seq->observe_tokens(std::span<const float>(w.mass)));
    }
  }
  finish(st, n, kFusedBytes);
}

/// observe_rows (core/attention_rows.hpp) on the same workload: `heads` rows of the observation in `format`, each
/// row the per-token mass over the heads (so the reduced mass is the same as library/observe's), rows `pad`
/// elements longer than the tokens (a leading dimension). `eigen` observes the float32 rows the way an engine did
/// before observe_rows: an Eigen heads x tokens map through observe_heads (a reduced copy, then observe_tokens).
void run_rows(benchmark::State& st, md::mass_format format, std::size_t heads, std::size_t pad, bool eigen) {
  const auto n = static_cast<std::size_t>(st.range(0));
  auto& w = data(n);
  const std::size_t stride = n + pad;
  std::vector<float> f32;
  std::vector<std::uint16_t> half;
  const auto hf = format == md::mass_format::f16 ? md::half_format::f16 : md::half_format::bf16;
  if (format == md::mass_format::f32)
    f32.assign(heads * stride, 0.0f);
  else
    half.assign(heads * stride, 0);
  for (std::size_t h = 0; h < heads; ++h)
    for (std::size_t t = 0; t < n; ++t) {
      const float m = w.mass[t] / static_cast<float>(heads);
      if (format == md::mass_format::f32)
        f32[h * stride + t] = m;
      else
        half[h * stride + t] = ms::float_to_half(m, hf);
    }
  const auto rows = format == md::mass_format::f32
                        ? md::attention_rows(std::span<const float>(f32), heads, n, stride)
                        : md::attention_rows(std::span<const std::uint16_t>(half), hf, heads, n, stride);
  md::sequence seq(md::config{.page_size = kPage, .normalization = md::attention_normalization::uniform});
  seq.append_tokens(w.state.regions());
  md::step_t step = 0;
  using row_major = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const Eigen::Map<const row_major, 0, Eigen::OuterStride<>> matrix(
      f32.data(), static_cast<Eigen::Index>(heads), static_cast<Eigen::Index>(n),
      Eigen::OuterStride<>(static_cast<Eigen::Index>(stride)));
  for (auto _ : st) {
    seq.advance_to(++step);
    if (eigen)
      benchmark::DoNotOptimize(seq.observe_heads(matrix, md::head_reduction::sum));
    else
      benchmark::DoNotOptimize(seq.observe_rows(rows));
  }
  // The state's bytes (the fused pass without its 4-byte mass) plus the rows read, counted once.
  finish(st, n, kFusedBytes - 4.0 + static_cast<double>(heads * rows.element_bytes()));
}

void register_all() {
  static std::vector<float> tb(kChunk), targ(kChunk);
  const std::vector<std::int64_t> sizes = {4096, 65536, 1 << 20, 1 << 24};
  // Variants are registered size by size, so that one workload is built per size (16M tokens take a second).
  std::vector<std::pair<std::string, void (*)(benchmark::State&)>> variants;
  auto add = [&](const std::string& name, void (*fn)(benchmark::State&)) { variants.emplace_back(name, fn); };
  // score-only
  add("score/simd", [](benchmark::State& st) {
    run_score(st, [](workload& w) { ms::page_scores(w.state, w.lut, w.alpha, std::span<float>(w.out)); });
  });
  add("score/simd_dynamic", [](benchmark::State& st) {
    run_score(st, [](workload& w) {
      ms::score_pages(w.state.regions().data(), w.state.last_refresh().data(), w.state.ewma().data(), w.state.kv_len(),
                      kPage, w.state.now(), w.lut, w.alpha, w.out.data());
    });
  });
  add("score/simd_scalar_isa", [](benchmark::State& st) {
    run_score(st,
              [](workload& w) { ms::page_scores<ms::isa::scalar>(w.state, w.lut, w.alpha, std::span<float>(w.out)); });
  });
  add("score/reference", [](benchmark::State& st) {
    run_score(st, [](workload& w) { md::page_scores_reference(w.state, w.table, w.alpha, std::span<float>(w.out)); });
  });
  add("score/scalar_exp",
      [](benchmark::State& st) { run_score(st, [](workload& w) { score_scalar_exp(w.score_args()); }); });
  add("score/autovec",
      [](benchmark::State& st) { run_score(st, [](workload& w) { baselines::score_autovec(w.score_args()); }); });
  add("score/eigen",
      [](benchmark::State& st) { run_score(st, [](workload& w) { score_eigen(w.score_args(), tb, targ); }); });
  add("score/roofline", [](benchmark::State& st) { run_score(st, [](workload& w) { score_roofline(w); }); });
  add("score/expfree", [](benchmark::State& st) {
    run_score(
        st,
        [](workload& w) {
          w.expfree_step();
          ms::page_scores_expfree(w.state, std::span<const float>(w.w), w.clock, w.alpha, std::span<float>(w.out));
        },
        kExpfreeScoreBytes);
  });
  add("score/expfree_scalar_isa", [](benchmark::State& st) {
    run_score(
        st,
        [](workload& w) {
          w.expfree_step();
          ms::page_scores_expfree<ms::isa::scalar>(w.state, std::span<const float>(w.w), w.clock, w.alpha,
                                                   std::span<float>(w.out));
        },
        kExpfreeScoreBytes);
  });
  add("score/expfree_roofline", [](benchmark::State& st) {
    run_score(
        st, [](workload& w) { score_expfree_roofline(w); }, kExpfreeScoreBytes);
  });
  // fused observe + score
  add("fused/simd", [](benchmark::State& st) {
    run_fused(st, [](workload& w) {
      return ms::observe_and_score(w.state, std::span<const float>(w.mass), w.obs, w.lut, w.alpha,
                                   std::span<float>(w.out));
    });
  });
  add("fused/simd_scalar_isa", [](benchmark::State& st) {
    run_fused(st, [](workload& w) {
      return ms::observe_and_score<ms::isa::scalar>(w.state, std::span<const float>(w.mass), w.obs, w.lut, w.alpha,
                                                    std::span<float>(w.out));
    });
  });
  add("fused/reference", [](benchmark::State& st) {
    run_fused(st, [](workload& w) {
      const std::size_t r = md::observe_tokens_reference<float>(w.state.ewma_mut(), w.state.last_refresh_mut(),
                                                                std::span<const float>(w.mass), w.state.now(), w.obs);
      md::page_scores_reference(w.state, w.table, w.alpha, std::span<float>(w.out));
      return r;
    });
  });
  add("fused/scalar_exp", [](benchmark::State& st) {
    run_fused(st, [](workload& w) { return fused_scalar_exp(w.score_args(), w.observe_args()); });
  });
  add("fused/autovec", [](benchmark::State& st) {
    run_fused(st, [](workload& w) { return baselines::fused_autovec(w.score_args(), w.observe_args()); });
  });
  add("fused/eigen", [](benchmark::State& st) {
    run_fused(st, [](workload& w) { return fused_eigen(w.score_args(), w.observe_args(), tb, targ); });
  });
  add("fused/roofline", [](benchmark::State& st) { run_fused(st, [](workload& w) { return fused_roofline(w); }); });
  add("fused/expfree", [](benchmark::State& st) {
    run_fused(
        st,
        [](workload& w) {
          w.expfree_step();
          return ms::observe_and_score_expfree(w.state, std::span<float>(w.w), std::span<const float>(w.mass), w.obs,
                                               w.clock, w.alpha, std::span<float>(w.out));
        },
        kExpfreeFusedBytes);
  });
  add("fused/expfree_scalar_isa", [](benchmark::State& st) {
    run_fused(
        st,
        [](workload& w) {
          w.expfree_step();
          return ms::observe_and_score_expfree<ms::isa::scalar>(w.state, std::span<float>(w.w),
                                                                std::span<const float>(w.mass), w.obs, w.clock, w.alpha,
                                                                std::span<float>(w.out));
        },
        kExpfreeFusedBytes);
  });
  add("fused/expfree_roofline", [](benchmark::State& st) {
    run_fused(
        st, [](workload& w) { return fused_expfree_roofline(w); }, kExpfreeFusedBytes);
  });
  // The public API, one engine step at a time (the same workload's labels and observation).
  add("library/observe/sequence", [](benchmark::State& st) { run_library<md::sequence>(st, false); });
  add("library/observe/policy",
      [](benchmark::State& st) { run_library<md::policy_sequence<md::policies::memdecay>>(st, false); });
  add("library/select32/sequence", [](benchmark::State& st) { run_library<md::sequence>(st, true); });
  // Attention as the engine wrote it (observe_rows): one row in each format, and 8 heads with a leading dimension.
  add("library/observe/rows_f32",
      [](benchmark::State& st) { run_rows(st, md::mass_format::f32, 1, 0, false); });
  add("library/observe/rows_f16",
      [](benchmark::State& st) { run_rows(st, md::mass_format::f16, 1, 0, false); });
  add("library/observe/rows_bf16",
      [](benchmark::State& st) { run_rows(st, md::mass_format::bf16, 1, 0, false); });
  add("library/observe/heads8_f32_strided",
      [](benchmark::State& st) { run_rows(st, md::mass_format::f32, 8, 64, false); });
  add("library/observe/heads8_f16_strided",
      [](benchmark::State& st) { run_rows(st, md::mass_format::f16, 8, 64, false); });
  add("library/observe/heads8_eigen",
      [](benchmark::State& st) { run_rows(st, md::mass_format::f32, 8, 64, true); });
  add("library/validate/simd", [](benchmark::State& st) {
    auto& w = data(static_cast<std::size_t>(st.range(0)));
    for (auto _ : st) benchmark::DoNotOptimize(ms::mass_is_valid(w.mass.data(), w.mass.size(), 1.0f));
    finish(st, w.mass.size(), 4.0);
  });
  add("library/validate/scalar", [](benchmark::State& st) {
    auto& w = data(static_cast<std::size_t>(st.range(0)));
    for (auto _ : st) {
      bool ok = true;
      for (float m : w.mass)
        if (!std::isfinite(m) || m < 0.0f) {
          ok = false;
          break;
        }
      benchmark::DoNotOptimize(ok);
    }
    finish(st, w.mass.size(), 4.0);
  });
  for (auto n : sizes)
    for (const auto& [name, fn] : variants) {
      if (n > (1 << 20) && name.find("heads8") != std::string::npos) continue;  // 8 x 16M rows: 512 MB a buffer
      benchmark::RegisterBenchmark(name.c_str(), fn)->Arg(n)->Unit(benchmark::kMicrosecond);
    }
}

const bool registered = (register_all(), true);

}  // namespace
