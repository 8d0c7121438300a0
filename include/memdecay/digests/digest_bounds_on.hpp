// SPDX-License-Identifier: Apache-2.0
// memdecay: the digest bounds of many pages split over the engine's threads.
//
//   memdecay::thread_pool pool(2);
//   digests.bounds(query, out, pool);           // page_digests; or seq.query_page_bounds(query, out, pool),
//   seq.observe_query(query, how, 1.0, pool);   // seq.select_recall(query, {}, head_bounds::max, pool)
//
// One core cannot draw all of a machine's memory bandwidth: on the 2-core AMD EPYC VM of docs/tiers.md one thread
// reads 27-28 GB/s and two 33-34 GB/s; and the bound's FMAs per digest byte put one core's compute rate at about
// its own read rate for 16-bit digests. Long sequences' digests (256K pages of 8 KV heads x 128 are 1-2 GiB) stream
// from DRAM, so the pages are split into tasks of simd::digest_task_pages on an executor (core/executor.hpp).
// Each task runs the single-thread kernel on its pages; task boundaries are whole register blocks, so the bounds
// are bit for bit those of one call, for every executor and thread count (the same decisions on every rank).
#ifndef MEMDECAY_DIGESTS_DIGEST_BOUNDS_ON_HPP
#define MEMDECAY_DIGESTS_DIGEST_BOUNDS_ON_HPP

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "memdecay/core/executor.hpp"
#include "memdecay/simd/digest_bound.hpp"
#include "memdecay/simd/half.hpp"

namespace memdecay {

/// simd::digest_bounds over `pages` pages, as tasks of simd::digest_task_pages pages on `exec` (one call, no task,
/// when they fit one or the executor is inline_executor): the same arguments and the same bounds bit for bit.
template <simd::isa A = simd::native_isa, class Elem, half_format F = half_format::f16, executor Exec>
void digest_bounds_on(Exec& exec, const simd::digest_shape& s, const Elem* digests, std::size_t pages,
                      const float* prepared, float* out, simd::bounds_layout layout) {
  constexpr std::size_t chunk = simd::digest_task_pages;
  if (pages <= chunk || std::is_same_v<std::remove_cvref_t<Exec>, inline_executor>)
    return simd::digest_bounds<A, Elem, F>(s, digests, pages, prepared, out, layout);
  const std::size_t page_elems = s.kv_heads * simd::vectors_per_head(s.kind) * s.dim;
  detail::run_all(exec, (pages + chunk - 1) / chunk, [&](std::size_t task) {
    const std::size_t first = task * chunk;
    simd::digest_bounds<A, Elem, F>(s, digests + first * page_elems, std::min(chunk, pages - first), prepared,
                                    out + first * layout.page_stride, layout);
  });
}

/// The same in head-major rows: out[j * out_stride + p].
template <simd::isa A = simd::native_isa, class Elem, half_format F = half_format::f16, executor Exec>
void digest_bounds_on(Exec& exec, const simd::digest_shape& s, const Elem* digests, std::size_t pages,
                      const float* prepared, float* out, std::size_t out_stride) {
  digest_bounds_on<A, Elem, F>(exec, s, digests, pages, prepared, out, simd::head_major(out_stride));
}

}  // namespace memdecay

#endif  // MEMDECAY_DIGESTS_DIGEST_BOUNDS_ON_HPP
