// SPDX-License-Identifier: Apache-2.0
// memdecay: compile-time SIMD architecture selection.
//
// The scorer is compiled for one instruction set per translation unit, chosen from the compiler's target
// macros (what -march/-m flags enable), best first:
//
//   isa::avx512  __AVX512F__ + __AVX512VL__ + __AVX512DQ__ + __AVX512BW__  16 floats / 8 doubles per register
//   isa::avx2    __AVX2__ (+ __FMA__ when present)                           8 floats / 4 doubles
//   isa::sse     __SSE2__ (every x86-64; SSE4.1 instructions when __SSE4_1__)  4 floats / 2 doubles
//   isa::neon    __aarch64__ + __ARM_NEON (AArch64 Advanced SIMD, FMA always)   4 floats / 2 doubles
//   isa::scalar  anything else                                                1 lane
//
// Kernels are templates over the isa (packet<Float, isa>), so a test or an engine can instantiate any isa its
// compiler can emit next to the native one. MEMDECAY_SIMD_ISA overrides the choice (0 scalar, 1 sse, 2 avx2,
// 3 avx512); MEMDECAY_SIMD_ENABLE_AVX2 / _AVX512 declare an isa available when the code is compiled under
// `#pragma GCC target` (which does not define the __AVX2__ family of macros). There is no run-time dispatch: a
// header-only library cannot own per-ISA translation units; build the engine with the -march it runs on.
#ifndef MEMDECAY_SIMD_ARCH_HPP
#define MEMDECAY_SIMD_ARCH_HPP

#if !defined(MEMDECAY_SIMD_ENABLE_AVX512) && defined(__AVX512F__) && defined(__AVX512VL__) && defined(__AVX512DQ__) && \
    defined(__AVX512BW__)
#define MEMDECAY_SIMD_ENABLE_AVX512 1
#endif
#if !defined(MEMDECAY_SIMD_ENABLE_AVX2) && (defined(__AVX2__) || defined(MEMDECAY_SIMD_ENABLE_AVX512))
#define MEMDECAY_SIMD_ENABLE_AVX2 1
#endif
#if !defined(MEMDECAY_SIMD_ENABLE_SSE) && (defined(__SSE2__) || defined(_M_X64))
#define MEMDECAY_SIMD_ENABLE_SSE 1
#endif

#if !defined(MEMDECAY_SIMD_ENABLE_NEON) && defined(__aarch64__) && defined(__ARM_NEON)
#define MEMDECAY_SIMD_ENABLE_NEON 1
#endif

#if !defined(MEMDECAY_SIMD_ISA)
#if defined(MEMDECAY_SIMD_ENABLE_NEON)
#define MEMDECAY_SIMD_ISA 4
#elif defined(MEMDECAY_SIMD_ENABLE_AVX512)
#define MEMDECAY_SIMD_ISA 3
#elif defined(MEMDECAY_SIMD_ENABLE_AVX2)
#define MEMDECAY_SIMD_ISA 2
#elif defined(MEMDECAY_SIMD_ENABLE_SSE)
#define MEMDECAY_SIMD_ISA 1
#else
#define MEMDECAY_SIMD_ISA 0
#endif
#endif

#if defined(MEMDECAY_SIMD_ENABLE_SSE) || defined(MEMDECAY_SIMD_ENABLE_AVX2) || defined(MEMDECAY_SIMD_ENABLE_AVX512)
#include <immintrin.h>
#endif

#if defined(MEMDECAY_SIMD_ENABLE_NEON)
#include <arm_neon.h>
#endif

// FMA: AVX-512 and AArch64 always have it; AVX2 and SSE use it when the compiler targets it.
#if defined(__FMA__) || defined(MEMDECAY_SIMD_ENABLE_FMA) || defined(MEMDECAY_SIMD_ENABLE_AVX512) || \
    defined(MEMDECAY_SIMD_ENABLE_NEON)
#define MEMDECAY_SIMD_HAS_FMA 1
#else
#define MEMDECAY_SIMD_HAS_FMA 0
#endif

#if defined(__GNUC__) || defined(__clang__)
#define MEMDECAY_SIMD_INLINE inline __attribute__((always_inline))
#else
#define MEMDECAY_SIMD_INLINE inline
#endif

// GCC 12 reports -W(maybe-)uninitialized inside its own AVX-512 intrinsics (_mm512_undefined_ps) once they are
// inlined at -O2; every simd header wraps its definitions in these so that -Werror builds stay clean.
#if defined(__GNUC__) && !defined(__clang__)
#define MEMDECAY_SIMD_BEGIN                                                                  \
  _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"") \
      _Pragma("GCC diagnostic ignored \"-Wuninitialized\"")
#define MEMDECAY_SIMD_END _Pragma("GCC diagnostic pop")
#else
#define MEMDECAY_SIMD_BEGIN
#define MEMDECAY_SIMD_END
#endif

namespace memdecay::simd {

namespace detail {
// Keeps a loaded packet in a register. Without it GCC folds a load that feeds several instructions into each of
// them as a memory operand, so the value is read once per use: in reduce_rows the checked reduction of 8 rows
// read every element twice and took 1.5-2.3x the plain one (1.0-1.4x with it); in digest_bound every FMA read
// both its operands from memory and the kernel ran at half the FMA rate (docs/tiers.md).
template <class Reg>
MEMDECAY_SIMD_INLINE void in_register([[maybe_unused]] Reg& x) noexcept {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  asm("" : "+v"(x));
#elif defined(__GNUC__) && defined(__aarch64__)
  asm("" : "+w"(x));
#endif
}
}  // namespace detail

/// The instruction sets the kernels are written for.
enum class isa : int { scalar = 0, sse = 1, avx2 = 2, avx512 = 3, neon = 4 };

/// The instruction set this translation unit's kernels use by default.
inline constexpr isa native_isa = static_cast<isa>(MEMDECAY_SIMD_ISA);

/// Whether the fused kernels' EWMA update (packet fma, every isa) is bitwise ewma_step (std::fma, the scalar
/// reference): true where the packets' fma is a fused multiply-add. The sequences run the fused observation +
/// score kernels only then, and otherwise the reference loop followed by a score pass, so their EWMA bits are the
/// reference's on every build.
inline constexpr bool fused_observation_exact = MEMDECAY_SIMD_HAS_FMA != 0;

[[nodiscard]] constexpr const char* to_string(isa a) noexcept {
  switch (a) {
    case isa::scalar: return "scalar";
    case isa::sse: return "sse";
    case isa::avx2: return "avx2";
    case isa::avx512: return "avx512";
    case isa::neon: return "neon";
  }
  return "?";
}

/// The vector registers the isa names (what a register block of accumulators and operands must fit in).
[[nodiscard]] constexpr int vector_registers(isa a) noexcept {
  switch (a) {
    case isa::avx512:
    case isa::neon: return 32;
    case isa::avx2:
    case isa::sse: return 16;
    case isa::scalar: return 0;
  }
  return 0;
}

/// Whether this translation unit can emit code for `a`.
[[nodiscard]] constexpr bool isa_available(isa a) noexcept {
  switch (a) {
    case isa::scalar: return true;
    case isa::sse:
#if defined(MEMDECAY_SIMD_ENABLE_SSE)
      return true;
#else
      return false;
#endif
    case isa::avx2:
#if defined(MEMDECAY_SIMD_ENABLE_AVX2)
      return true;
#else
      return false;
#endif
    case isa::avx512:
#if defined(MEMDECAY_SIMD_ENABLE_AVX512)
      return true;
#else
      return false;
#endif
    case isa::neon:
#if defined(MEMDECAY_SIMD_ENABLE_NEON)
      return true;
#else
      return false;
#endif
  }
  return false;
}

}  // namespace memdecay::simd

#endif  // MEMDECAY_SIMD_ARCH_HPP
