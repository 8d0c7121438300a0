// SPDX-License-Identifier: Apache-2.0
// memdecay: a layout with MemDecay's per-token signal beside it, the form the scalar reference and the SIMD
// kernels' convenience overloads take.
//
//   memdecay::token_state<float> s(16);
//   s.append(spans);                                   // fresh tokens: refreshed now, EWMA 0
//   memdecay::observe_tokens_reference<float>(s.ewma_mut(), s.last_refresh_mut(), mass, s.now(), params);
//   memdecay::page_scores_reference(s, table, alpha, out);
//
// The evictor (basic_sequence) does not use this type: its layout is a sequence_state and policies::memdecay
// keeps the same two columns itself. Kernels, tests and benchmarks use this one to drive the kernels without an
// evictor. Per resident token: its region (1 byte, in the layout), the step it was last refreshed (4 bytes) and
// the EWMA of the attention it received (sizeof(Float)).
#ifndef MEMDECAY_CORE_TOKEN_STATE_HPP
#define MEMDECAY_CORE_TOKEN_STATE_HPP

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "memdecay/detail/column_vector.hpp"
#include "memdecay/detail/digest.hpp"
#include "memdecay/detail/growth.hpp"
#include "memdecay/core/page_geometry.hpp"
#include "memdecay/page_tables/page_table.hpp"
#include "memdecay/core/region.hpp"
#include "memdecay/core/retention_score.hpp"
#include "memdecay/core/sequence_state.hpp"

namespace memdecay {

template <std::floating_point Float = float, std::size_t PageSize = dynamic_page_size>
class token_state : public sequence_state<PageSize> {
  using layout = sequence_state<PageSize>;

 public:
  using float_type = Float;
  using layout::layout;
  /// A copy of `l` with the given columns (kv_len() entries each; the caller's, e.g. policies::memdecay's).
  token_state(const layout& l, std::span<const step_t> last_refresh, std::span<const Float> ewma)
      : layout(l), last_refresh_(last_refresh.begin(), last_refresh.end()), ewma_(ewma.begin(), ewma.end()) {}

  [[nodiscard]] const layout& layout_state() const noexcept { return *this; }
  [[nodiscard]] std::span<const step_t> last_refresh() const noexcept { return last_refresh_; }
  [[nodiscard]] std::span<const Float> ewma() const noexcept { return ewma_; }
  /// Mutable views for the observation kernels (kv_len() entries). Callers bump the generation through touch()
  /// once they changed anything.
  [[nodiscard]] std::span<step_t> last_refresh_mut() noexcept { return last_refresh_; }
  [[nodiscard]] std::span<Float> ewma_mut() noexcept { return ewma_; }

  /// Appends fresh tokens (refreshed now, EWMA 0). Strong guarantee.
  void append(std::span<const region_span> spans) {
    std::size_t total = 0;
    for (const auto& s : spans) total += s.count;
    grow(total, [&] { layout::append(spans); });
  }
  void append(std::span<const region_id> labels) {
    grow(labels.size(), [&] { layout::append(labels); });
  }
  /// Removes whole pages from the layout and the columns (usage_error, changing nothing, as the layout's).
  void remove_pages(std::span<const std::size_t> pages) {
    layout::remove_pages(pages);  // checks first
    last_refresh_.resize(compact_pages(std::span<step_t>(last_refresh_), this->page_size(), pages));
    ewma_.resize(compact_pages(std::span<Float>(ewma_), this->page_size(), pages));
  }
  /// The layout's digest and the columns' bits.
  [[nodiscard]] std::uint64_t digest() const noexcept {
    detail::fnv1a64 h;
    h.add(layout::digest()).add(std::span<const step_t>(last_refresh_)).add(std::span<const Float>(ewma_));
    return h.value();
  }

 private:
  template <class AppendLayout>
  void grow(std::size_t tokens, AppendLayout&& append_layout) {
    detail::reserve_for_append(last_refresh_, this->kv_len() + tokens);
    detail::reserve_for_append(ewma_, this->kv_len() + tokens);
    append_layout();  // strong guarantee; the columns below stay within their capacity
    last_refresh_.resize(this->kv_len(), this->now());
    ewma_.resize(this->kv_len(), Float{0});
  }

  detail::column_vector<step_t, 1> last_refresh_;
  detail::column_vector<Float, 3> ewma_;
};

}  // namespace memdecay

#endif  // MEMDECAY_CORE_TOKEN_STATE_HPP
