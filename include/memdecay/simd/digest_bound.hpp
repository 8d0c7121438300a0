// SPDX-License-Identifier: Apache-2.0
// memdecay: the query-aware page bound of Quest (Tang et al., ICML 2024) over page key digests.
//
// A page's digest for one KV head is the per-channel minimum lo and maximum hi of its keys (or, for a mean-key
// digest, their mean m). For a query q of that head, every key k of the page has
//
//     q.k = sum_c q_c k_c  <=  sum_c max(q_c lo_c, q_c hi_c)  =  sum_c (q_c^+ hi_c + q_c^- lo_c)
//
// (q^+ = max(q, 0), q^- = min(q, 0)), so the bound, times the attention scale (1/sqrt(head_dim) unless told),
// is an upper bound of every logit the query gives the page's tokens; a mean-key digest gives q.m instead, an
// estimate, not a bound. With grouped-query attention query head j reads KV head j / (query_heads / kv_heads)
// (the grouping of Hugging Face, vLLM, SGLang and FlashInfer).
//
// digest_bound_reference is the specification: the max form, in double. The kernels read the scaled query once
// per channel vector, split it into q^+ and q^- in registers (a max and a min, no second load: the kernel is
// bound by its loads, docs/tiers.md) and run two fused multiply-adds per channel, as wide as the isa allows, over
// fp32, fp16 or bf16 digests (widened in registers: simd/half.hpp). Error contract, checked by
// tests/simd/simd_digest_bound_test.cpp for every isa the build can emit: |kernel - reference| <=
// digest_bound_tolerance(...) = (head_dim + 2) x FLT_EPSILON x scale x sum_c |q_c| max(|lo_c|, |hi_c|), the
// standard bound of a float dot product of that length.
#ifndef MEMDECAY_SIMD_DIGEST_BOUND_HPP
#define MEMDECAY_SIMD_DIGEST_BOUND_HPP

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "memdecay/simd/arch.hpp"
#include "memdecay/simd/half.hpp"
#include "memdecay/simd/packet.hpp"

namespace memdecay::simd {

/// What a page digest holds per KV head.
enum class digest_kind : std::uint8_t {
  min_max,   ///< per-channel minimum and maximum of the keys (Quest): an upper bound of q.k; 2 x head_dim values
  mean_key,  ///< the keys' mean (ArkVale/InfLLM-style representative): q.m, an estimate; head_dim values
};

[[nodiscard]] constexpr std::size_t vectors_per_head(digest_kind k) noexcept {
  return k == digest_kind::min_max ? 2 : 1;
}

/// How a KV head's min/max digest lies in memory: its channels in runs of 64 bytes (digest_run: 16 fp32 or 32
/// fp16/bf16 values), each run's minima followed by the same channels' maxima, a last shorter run likewise:
///
///     [lo_0 .. lo_15 | hi_0 .. hi_15 | lo_16 .. lo_31 | hi_16 .. hi_31 | ...]   (fp32)
///
/// The kernels read a channel vector's lo and hi together, so in this order they walk a head's bytes one cache
/// line after the next, where with every minimum before every maximum they read two streams head_dim values
/// apart. From DRAM that made fp32 1.05-1.25x faster (4 passes of the committed bench, Zen 5, one core;
/// 16-bit digests within the noise; docs/tiers.md). A mean-key digest is its head_dim values in channel order.
/// interleave_min_max and split_min_max convert from and to minima-then-maxima (what engines compute, what
/// page_digests::set_min_max takes and what snapshots hold).
template <class Elem>
inline constexpr std::size_t digest_run = 64 / sizeof(Elem);

/// Where channel c's minimum sits among a KV head's 2 x dim min/max values of Elem.
template <class Elem>
[[nodiscard]] constexpr std::size_t digest_min_offset(std::size_t c) noexcept {
  constexpr std::size_t run = digest_run<Elem>;
  return c / run * 2 * run + c % run;
}
/// Where channel c's maximum sits: its run's width (digest_run, less in a last shorter run) past its minimum.
template <class Elem>
[[nodiscard]] constexpr std::size_t digest_max_offset(std::size_t c, std::size_t dim) noexcept {
  constexpr std::size_t run = digest_run<Elem>;
  return digest_min_offset<Elem>(c) + std::min(run, dim - c / run * run);
}

/// One KV head's minima and maxima (dim values each, in channel order) into the digest layout: out has 2 x dim.
template <class Elem>
constexpr void interleave_min_max(const Elem* lo, const Elem* hi, std::size_t dim, Elem* out) noexcept {
  for (std::size_t c = 0; c < dim; ++c) {
    out[digest_min_offset<Elem>(c)] = lo[c];
    out[digest_max_offset<Elem>(c, dim)] = hi[c];
  }
}
/// The inverse: one KV head's 2 x dim digest values back to its minima and maxima in channel order.
template <class Elem>
constexpr void split_min_max(const Elem* digest, std::size_t dim, Elem* lo, Elem* hi) noexcept {
  for (std::size_t c = 0; c < dim; ++c) {
    lo[c] = digest[digest_min_offset<Elem>(c)];
    hi[c] = digest[digest_max_offset<Elem>(c, dim)];
  }
}

/// The reference bound of one page and head, in double: scale x sum_c max(q_c lo_c, q_c hi_c) (min_max) or
/// scale x sum_c q_c m_c (mean_key, `hi` unused). `lo`, `hi` are already widened to float.
[[nodiscard]] inline double digest_bound_reference(const float* q, const float* lo, const float* hi, std::size_t dim,
                                                   digest_kind kind, double scale) noexcept {
  double sum = 0;
  for (std::size_t c = 0; c < dim; ++c) {
    const double qc = q[c];
    sum += kind == digest_kind::min_max ? std::max(qc * lo[c], qc * hi[c]) : qc * lo[c];
  }
  return scale * sum;
}

/// The largest |kernel - reference| the kernels may show for that page and head (see the header comment).
[[nodiscard]] inline double digest_bound_tolerance(const float* q, const float* lo, const float* hi, std::size_t dim,
                                                   digest_kind kind, double scale) noexcept {
  double magnitude = 0;
  for (std::size_t c = 0; c < dim; ++c) {
    const double m = kind == digest_kind::min_max ? std::max(std::abs(double{lo[c]}), std::abs(double{hi[c]}))
                                                  : std::abs(double{lo[c]});
    magnitude += std::abs(double{q[c]}) * m;
  }
  return static_cast<double>(dim + 2) * std::numeric_limits<float>::epsilon() * scale * magnitude;
}

/// The query in the form the kernels read, for either digest kind: scale x q, query head after query head;
/// `out` has query_heads x dim floats.
inline void prepare_digest_query(const float* query, std::size_t query_heads, std::size_t dim, float scale,
                                 float* out) noexcept {
  for (std::size_t i = 0; i < query_heads * dim; ++i) out[i] = scale * query[i];
}

/// The two halves of a scaled query value: q^+ = max(q, 0) and q^- = min(q, 0), both +0 at q = +-0, as the kernels
/// form them in registers.
[[nodiscard]] inline float positive_part(float q) noexcept { return q > 0.0f ? q : 0.0f; }
[[nodiscard]] inline float negative_part(float q) noexcept { return q < 0.0f ? q : 0.0f; }

/// The shape of a digest array: pages x kv_heads x vectors_per_head(kind) x dim elements, page after page, a KV
/// head's min/max values in the digest layout (digest_min_offset / digest_max_offset).
struct digest_shape {
  std::size_t kv_heads = 0;
  std::size_t query_heads = 0;  ///< a multiple of kv_heads
  std::size_t dim = 0;
  digest_kind kind = digest_kind::min_max;
};

/// Where query head j's bound of page p goes: out[j * head_stride + p * page_stride]. Head-major rows
/// ({pages, 1}: what page_digests::bounds returns, one row per query head for the per-head softmax) put a page's
/// results in as many places a sequence apart; page-major ({1, query_heads}) writes them as one stream, which from
/// DRAM measured 1.00-1.15x the head-major rows (digest/bounds_page_major, docs/tiers.md). The bounds are the same
/// bit for bit whatever the layout.
struct bounds_layout {
  std::size_t head_stride = 0;
  std::size_t page_stride = 1;
};
[[nodiscard]] constexpr bounds_layout head_major(std::size_t row_stride) noexcept { return {row_stride, 1}; }
[[nodiscard]] constexpr bounds_layout page_major(std::size_t query_heads) noexcept { return {1, query_heads}; }

MEMDECAY_SIMD_BEGIN

// Full unrolling of the register-block loops (constant trip counts), so that the accumulators live in registers.
#if defined(__clang__) || defined(__GNUC__)
#define MEMDECAY_SIMD_UNROLL _Pragma("GCC unroll 16")
#else
#define MEMDECAY_SIMD_UNROLL
#endif

/// The accumulators of one register block of the kernels (pages x the group's query heads): one transpose_sum's
/// registers where the isa has one, else 8. A block holds digest_block_accumulators<A> / group pages.
template <isa A>
inline constexpr std::size_t digest_block_accumulators =
    requires { packet<float, A>::has_transpose_sum; } ? packet<float, A>::lanes : 8;

/// The pages of one register block for G query heads per KV head: as many as the accumulators hold, but at most 4.
/// A block reads each of its pages' lo and hi rows side by side, so 16 pages (MHA on AVX-512) are 32 streams a page
/// apart, which one core reads from DRAM at half its plain rate; 4 pages cost a query load per 8 FMAs more and
/// measured 1.3-1.5x faster from DRAM for G = 1 and 1.1-1.2x for G = 2 (Zen 5, docs/tiers.md).
template <isa A, std::size_t G>
inline constexpr std::size_t digest_block_pages = std::min<std::size_t>(digest_block_accumulators<A> / G, 4);

/// Pages per task when the bounds are split over threads (digests/digest_bounds_on.hpp). A multiple of every
/// register block's page count (digest_block_pages <= 4), so a task's pages fall in
/// the same blocks as in one call over all pages, the tail pages are the same, and the bounds are the same bit for
/// bit whatever the split. 512 pages of 8 KV heads x 128 min/max are 4 MiB of f32 (2 of f16): long enough for the
/// prefetch to run ahead within the task and for a pool's dispatch (about a microsecond) to vanish.
inline constexpr std::size_t digest_task_pages = 512;

namespace detail {
// A line of a later register block, asked for into L1 (locality 3: prefetcht0 on x86), two blocks ahead
// (digest_prefetch_blocks_ahead, pages_in_blocks), so that the block's loads find their operands in L1, not L2.
// Two blocks of 4 pages are 32 KiB of 16-bit or 64 KiB of f32 digests, about an L1 (48 KiB on Zen 5). Since a
// min/max head is read in address order and the prefetch is a fixed run of instructions, that measured faster from
// DRAM than the outer caches (locality 1) four blocks ahead (4 query heads per KV head, Zen 5, docs/tiers.md): the
// kernel's median time f32 79.1 -> 76.2 ms, f16 38.3 -> 36.1, bf16 38.1 -> 35.6; its paired share of the plain read
// (14 passes before, 17 after) f32 0.93 -> 0.93, f16 0.89 -> 0.99, bf16 0.90 -> 0.98.
inline constexpr std::size_t digest_prefetch_blocks_ahead = 2;
MEMDECAY_SIMD_INLINE void prefetch(const void* p) noexcept {
#if defined(__GNUC__) || defined(__clang__)
  __builtin_prefetch(p, 0, 3);
#else
  (void)p;
#endif
}
template <isa A, class Elem, half_format F>
MEMDECAY_SIMD_INLINE typename packet<float, A>::reg load_digest(const Elem* p) noexcept {
  if constexpr (std::is_same_v<Elem, float>)
    return packet<float, A>::load(p);
  else
    return load_widened<A, F>(p);
}
// q^+ and q^- of a vector of the scaled query. At q = +-0, x86's max/min return their second operand (+0) and the
// scalar packet's compare false, as positive_part/negative_part do; NEON's min gives -0 for q = -0, whose products
// add nothing either.
template <isa A>
MEMDECAY_SIMD_INLINE typename packet<float, A>::reg positive_part(typename packet<float, A>::reg q) noexcept {
  return packet<float, A>::max(q, packet<float, A>::zero());
}
template <isa A>
MEMDECAY_SIMD_INLINE typename packet<float, A>::reg negative_part(typename packet<float, A>::reg q) noexcept {
  return packet<float, A>::min(q, packet<float, A>::zero());
}
template <class Elem, half_format F>
MEMDECAY_SIMD_INLINE float digest_value(const Elem* p) noexcept {
  if constexpr (std::is_same_v<Elem, float>)
    return *p;
  else
    return half_to_float(*p, F);
}

// One page and KV head against one prepared query head.
template <isa A, class Elem, half_format F, digest_kind Kind>
MEMDECAY_SIMD_INLINE float head_bound(const float* q, const Elem* digest, std::size_t dim) noexcept {
  using P = packet<float, A>;
  constexpr std::size_t L = P::lanes;
  auto a0 = P::zero(), a1 = P::zero(), a2 = P::zero(), a3 = P::zero();
  std::size_t c = 0;
  static_assert(digest_run<Elem> % L == 0, "a channel vector must lie in one run of the digest layout");
  if constexpr (Kind == digest_kind::min_max) {
    // A vector of L channels (L divides digest_run) lies in one run, its minima and its maxima each side by side.
    const auto lo = [&](std::size_t ch) { return digest + digest_min_offset<Elem>(ch); };
    const auto hi = [&](std::size_t ch) { return digest + digest_max_offset<Elem>(ch, dim); };
    for (; c + 2 * L <= dim; c += 2 * L) {  // two independent chains per term hide the fma latency
      const auto q0 = P::load(q + c), q1 = P::load(q + c + L);
      a0 = P::fma(positive_part<A>(q0), load_digest<A, Elem, F>(hi(c)), a0);
      a1 = P::fma(negative_part<A>(q0), load_digest<A, Elem, F>(lo(c)), a1);
      a2 = P::fma(positive_part<A>(q1), load_digest<A, Elem, F>(hi(c + L)), a2);
      a3 = P::fma(negative_part<A>(q1), load_digest<A, Elem, F>(lo(c + L)), a3);
    }
    for (; c + L <= dim; c += L) {
      const auto q0 = P::load(q + c);
      a0 = P::fma(positive_part<A>(q0), load_digest<A, Elem, F>(hi(c)), a0);
      a1 = P::fma(negative_part<A>(q0), load_digest<A, Elem, F>(lo(c)), a1);
    }
    float sum = P::reduce_add(P::add(P::add(a0, a1), P::add(a2, a3)));
    for (; c < dim; ++c)
      sum = std::fma(simd::positive_part(q[c]), digest_value<Elem, F>(hi(c)),
                     std::fma(simd::negative_part(q[c]), digest_value<Elem, F>(lo(c)), sum));
    return sum;
  } else {
    for (; c + 2 * L <= dim; c += 2 * L) {
      a0 = P::fma(P::load(q + c), load_digest<A, Elem, F>(digest + c), a0);
      a1 = P::fma(P::load(q + c + L), load_digest<A, Elem, F>(digest + c + L), a1);
    }
    for (; c + L <= dim; c += L) a0 = P::fma(P::load(q + c), load_digest<A, Elem, F>(digest + c), a0);
    float sum = P::reduce_add(P::add(a0, a1));
    for (; c < dim; ++c) sum = std::fma(q[c], digest_value<Elem, F>(digest + c), sum);
    return sum;
  }
}

// Where a register block's accumulators, the group's query and a page's digest values all fit in the isa's
// registers, the kernels pin the loaded values (in_register): otherwise GCC folds each load into every FMA that
// reads it, every FMA reads both operands from memory, and the loads bound the kernel (AVX-512, G = 4: 2.4x faster
// in cache with the pins, docs/tiers.md). Where they do not fit (AVX2's 16 registers), pinning spills: measured
// slower (f16 in cache 1.2x) or no faster (A/B in one run), so AVX2 runs unpinned.
template <isa A, digest_kind Kind, std::size_t G, std::size_t PB>
inline constexpr bool digest_block_pinned = static_cast<int>(G* PB + vectors_per_head(Kind) * G +
                                                             vectors_per_head(Kind)) <= vector_registers(A);

// One channel step c of a register block (head_block): the prefetch of the later block's share of the step, the
// group's query vectors split into q^+ and q^-, and each page's digest vectors into its G accumulators.
template <isa A, class Elem, half_format F, digest_kind Kind, std::size_t G, std::size_t PB, std::size_t Dim>
MEMDECAY_SIMD_INLINE void block_step(std::size_t c, const float* q, const Elem* head0, std::size_t page_elems,
                                     std::size_t dim, const char* later, typename packet<float, A>::reg* acc) noexcept {
  using P = packet<float, A>;
  constexpr std::size_t L = P::lanes, V = vectors_per_head(Kind);
  constexpr bool pin = digest_block_pinned<A, Kind, G, PB>;
  // The prefetch of a later block's slice (as many bytes from `later` as this block reads, PB x V x dim values),
  // spread over the channel steps in address order: step_bytes per step, a fixed count of lines, a run of prefetch
  // instructions. Counted at run time GCC had kept it a loop of its own per step (a compare and two jumps per line
  // on top of the prefetch), and from DRAM the kernel ran 1.15-1.35x slower (fp32 and 16-bit, 4 query heads per
  // KV head, Zen 5, docs/tiers.md).
  constexpr std::size_t step_bytes = PB * V * L * sizeof(Elem);
  if (later) {
    const char* step = later + (c / L) * step_bytes;
    if constexpr (step_bytes >= 64) {
      MEMDECAY_SIMD_UNROLL
      for (std::size_t off = 0; off < step_bytes; off += 64) prefetch(step + off);
    } else if ((c / L) * step_bytes % 64 == 0) {
      prefetch(step);  // a line every 64 / step_bytes steps
    }
  }
  typename P::reg qa[G], qb[G];
  MEMDECAY_SIMD_UNROLL
  for (std::size_t g = 0; g < G; ++g) {
    qa[g] = P::load(q + g * dim + c);
    if constexpr (Kind == digest_kind::min_max) {
      qb[g] = negative_part<A>(qa[g]);
      qa[g] = positive_part<A>(qa[g]);
      if constexpr (pin) in_register(qb[g]);
    }
    if constexpr (pin) in_register(qa[g]);
  }
  MEMDECAY_SIMD_UNROLL
  for (std::size_t b = 0; b < PB; ++b) {
    const Elem* d = head0 + b * page_elems;
    if constexpr (Kind == digest_kind::min_max) {
      // c is a multiple of L, which divides digest_run: the vector lies in one run. Where the head dim is a
      // compile-time multiple of the run, every run is whole and hi is a run past lo.
      constexpr std::size_t run = digest_run<Elem>;
      const std::size_t width = Dim != 0 && Dim % run == 0 ? run : std::min(run, dim - c / run * run);
      const Elem* at = d + digest_min_offset<Elem>(c);
      auto lo = load_digest<A, Elem, F>(at), hi = load_digest<A, Elem, F>(at + width);
      if constexpr (pin) {
        in_register(lo);
        in_register(hi);
      }
      MEMDECAY_SIMD_UNROLL
      for (std::size_t g = 0; g < G; ++g) acc[b * G + g] = P::fma(qa[g], hi, P::fma(qb[g], lo, acc[b * G + g]));
    } else {
      auto m = load_digest<A, Elem, F>(d + c);
      if constexpr (pin) in_register(m);
      MEMDECAY_SIMD_UNROLL
      for (std::size_t g = 0; g < G; ++g) acc[b * G + g] = P::fma(qa[g], m, acc[b * G + g]);
    }
  }
}

// One KV head of pages [first, first + PB) against its G query heads: G x PB accumulators, one register each, so
// every digest value is loaded once and used G times, every query value once per PB pages (and split into q^+ and
// q^- in registers: 1/G + 1/(2 PB) loads per FMA instead of 1/G + 1/PB, 1.1-1.5x in one A/B run on AVX-512 and
// 1.15-1.4x on AVX2 code, docs/tiers.md), and the sums leave through one transpose_sum where the isa has one and
// the block fills it.
// Needs dim % lanes == 0. Dim is the head dim where it is known at compile time (else 0 and `head_dim`).
template <isa A, class Elem, half_format F, digest_kind Kind, std::size_t G, std::size_t PB, std::size_t Dim = 0>
MEMDECAY_SIMD_INLINE void head_block(const float* q, const Elem* head0, std::size_t page_elems, std::size_t head_dim,
                                     float* out, bounds_layout layout, const char* later = nullptr) noexcept {
  const std::size_t dim = Dim != 0 ? Dim : head_dim;
  using P = packet<float, A>;
  constexpr std::size_t L = P::lanes, N = G * PB;
  static_assert(digest_run<Elem> % L == 0, "a channel vector must lie in one run of the digest layout");
  typename P::reg acc[N];
  MEMDECAY_SIMD_UNROLL
  for (auto& a : acc) a = P::zero();
  // A pinned block runs its channel steps unrolled (the prefetch a fixed run of instructions in each); an unpinned
  // one (AVX2, 4 query heads per KV head) as a loop: unrolled, its folded loads made fp32 from DRAM 1.3-1.5x slower
  // (the same VM, AVX2 code on the Zen 5 core, docs/tiers.md).
  if constexpr (digest_block_pinned<A, Kind, G, PB>) {
    MEMDECAY_SIMD_UNROLL
    for (std::size_t c = 0; c < dim; c += L)
      block_step<A, Elem, F, Kind, G, PB, Dim>(c, q, head0, page_elems, dim, later, acc);
  } else {
    for (std::size_t c = 0; c < dim; c += L)
      block_step<A, Elem, F, Kind, G, PB, Dim>(c, q, head0, page_elems, dim, later, acc);
  }
  alignas(64) float sums[N];
  if constexpr (requires { P::has_transpose_sum; } && N == L) {
    P::store(sums, P::transpose_sum(acc));
  } else {
    for (std::size_t i = 0; i < N; ++i) sums[i] = P::reduce_add(acc[i]);
  }
  for (std::size_t b = 0; b < PB; ++b)
    for (std::size_t g = 0; g < G; ++g) out[g * layout.head_stride + b * layout.page_stride] = sums[b * G + g];
}

// Every page and KV head one at a time (any group, any dim: the tails).
template <isa A, class Elem, half_format F, digest_kind Kind>
void pages_one_by_one(const digest_shape& s, const Elem* digests, std::size_t first, std::size_t last,
                      const float* prepared, float* out, bounds_layout layout) noexcept {
  constexpr std::size_t V = vectors_per_head(Kind);
  const std::size_t group = s.query_heads / s.kv_heads;
  const std::size_t page_elems = s.kv_heads * V * s.dim;
  for (std::size_t p = first; p < last; ++p)
    for (std::size_t h = 0; h < s.kv_heads; ++h) {
      const Elem* d = digests + p * page_elems + h * V * s.dim;
      for (std::size_t g = 0; g < group; ++g) {
        const std::size_t j = h * group + g;
        out[j * layout.head_stride + p * layout.page_stride] =
            head_bound<A, Elem, F, Kind>(prepared + j * s.dim, d, s.dim);
      }
    }
}

template <isa A, class Elem, half_format F, digest_kind Kind, std::size_t G, std::size_t Dim>
void pages_in_blocks(const digest_shape& s, const Elem* digests, std::size_t pages, const float* prepared, float* out,
                     bounds_layout layout) noexcept {
  constexpr std::size_t V = vectors_per_head(Kind);
  constexpr std::size_t PB = digest_block_pages<A, G>;
  static_assert(digest_task_pages % PB == 0, "a task's pages must fall in whole blocks");
  const std::size_t dim = Dim != 0 ? Dim : s.dim;
  const std::size_t page_elems = s.kv_heads * V * dim;
  std::size_t p = 0;
  for (; p + PB <= pages; p += PB)
    for (std::size_t h = 0; h < s.kv_heads; ++h) {
      // The block reads PB pages a page apart: more streams, each crossing 4 KiB pages, than the hardware
      // prefetcher follows, and while the FMAs run nothing asks for the next bytes. So each head's block also asks
      // for one slice of the block `ahead` blocks on, a few lines per channel step (detail::prefetch: into L1).
      // From DRAM, with no prefetch 4 query heads per KV head ran 1.3x (f32) and 1.7-1.8x (f16) slower (Zen 5,
      // docs/tiers.md); all of a block's prefetches at once were slower than none.
      constexpr std::size_t ahead = digest_prefetch_blocks_ahead;
      const std::size_t slice = PB * V * dim * sizeof(Elem);  // a KV head's share of PB pages' bytes
      const char* later = p + (ahead + 1) * PB <= pages
                              ? reinterpret_cast<const char*>(digests + (p + ahead * PB) * page_elems) + h * slice
                              : nullptr;
      head_block<A, Elem, F, Kind, G, PB, Dim>(prepared + h * G * dim, digests + p * page_elems + h * V * dim,
                                               page_elems, dim, out + h * G * layout.head_stride + p * layout.page_stride,
                                               layout, later);
    }
  pages_one_by_one<A, Elem, F, Kind>(s, digests, p, pages, prepared, out, layout);
}

// The head dims of most models (64: GPT-2, Falcon, Phi; 128: Llama, Mistral, Qwen; 256: Gemma) as compile-time
// constants, as FlashInfer and FlashAttention dispatch theirs: the channel loop then unrolls and the prefetch of a
// later block is a fixed run of instructions. From DRAM that measured 1.13-1.17x over the same code with the head
// dim at run time (Zen 5, page-major, one binary, docs/tiers.md); any other dim runs the run-time loop.
template <isa A, class Elem, half_format F, digest_kind Kind, std::size_t G>
void blocks_for_dim(const digest_shape& s, const Elem* digests, std::size_t pages, const float* prepared, float* out,
                    bounds_layout layout) noexcept {
  switch (s.dim) {
    case 64:
      return pages_in_blocks<A, Elem, F, Kind, G, 64>(s, digests, pages, prepared, out, layout);
    case 128:
      return pages_in_blocks<A, Elem, F, Kind, G, 128>(s, digests, pages, prepared, out, layout);
    case 256:
      return pages_in_blocks<A, Elem, F, Kind, G, 256>(s, digests, pages, prepared, out, layout);
    default:
      return pages_in_blocks<A, Elem, F, Kind, G, 0>(s, digests, pages, prepared, out, layout);
  }
}

template <isa A, class Elem, half_format F, digest_kind Kind>
void digest_bounds_kind(const digest_shape& s, const Elem* digests, std::size_t pages, const float* prepared,
                        float* out, bounds_layout layout) noexcept {
  using P = packet<float, A>;
  const std::size_t group = s.query_heads / s.kv_heads;
  if (P::lanes > 1 && s.dim % P::lanes == 0) {
    // The common groups (MHA, and GQA's 2, 4 and 8 query heads per KV head) in register blocks.
    if (group == 1) return blocks_for_dim<A, Elem, F, Kind, 1>(s, digests, pages, prepared, out, layout);
    if (group == 2) return blocks_for_dim<A, Elem, F, Kind, 2>(s, digests, pages, prepared, out, layout);
    if (group == 4) return blocks_for_dim<A, Elem, F, Kind, 4>(s, digests, pages, prepared, out, layout);
    if constexpr (digest_block_accumulators<A> >= 8)
      if (group == 8) return blocks_for_dim<A, Elem, F, Kind, 8>(s, digests, pages, prepared, out, layout);
  }
  pages_one_by_one<A, Elem, F, Kind>(s, digests, 0, pages, prepared, out, layout);
}
}  // namespace detail

/// Bounds of `pages` pages of `digests` (pages x kv_heads x vectors x dim elements of Elem: float, or uint16_t in
/// format F; min/max heads in the digest layout, interleave_min_max) for a prepared query (prepare_digest_query);
/// query head j's bound of page p goes to out[j * layout.head_stride + p * layout.page_stride].
template <isa A = native_isa, class Elem, half_format F = half_format::f16>
void digest_bounds(const digest_shape& s, const Elem* digests, std::size_t pages, const float* prepared, float* out,
                   bounds_layout layout) noexcept {
  static_assert(std::is_same_v<Elem, float> || std::is_same_v<Elem, std::uint16_t>, "fp32 or 16-bit digests");
  if (s.kind == digest_kind::min_max)
    detail::digest_bounds_kind<A, Elem, F, digest_kind::min_max>(s, digests, pages, prepared, out, layout);
  else
    detail::digest_bounds_kind<A, Elem, F, digest_kind::mean_key>(s, digests, pages, prepared, out, layout);
}

/// The same in head-major rows: out[j * out_stride + p] is query head j's bound of page p.
template <isa A = native_isa, class Elem, half_format F = half_format::f16>
void digest_bounds(const digest_shape& s, const Elem* digests, std::size_t pages, const float* prepared, float* out,
                   std::size_t out_stride) noexcept {
  digest_bounds<A, Elem, F>(s, digests, pages, prepared, out, head_major(out_stride));
}

MEMDECAY_SIMD_END

}  // namespace memdecay::simd

#endif  // MEMDECAY_SIMD_DIGEST_BOUND_HPP
