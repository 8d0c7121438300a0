// SPDX-License-Identifier: Apache-2.0
// tova policy: Token Omission Via Attention: keep what the latest query attends to.
//
// Source: M. Oren, M. Hassid, N. Yarden, Y. Adi, R. Schwartz, "Transformers are Multi-State RNNs", EMNLP 2024;
// reference implementation schwartz-lab-NLP/TOVA, src/tova_cache.py (TOVACache: the attention of the last
// query, averaged over heads with mean(dim=1), drops the lowest token once cache_size is exceeded).
//
// A token's signal is the mass it received in the most recent observation only; each observation replaces the
// previous one. Reduce heads with head_reduction::mean for the reference's head average. Tokens appended since
// the last observation have no signal yet and are kept (the reference scores the newest token by the current
// query, which always sees it). Page score: the mean over its tokens.
//
// State per token: the last mass (Float). Cost: O(n) per observation, O(n) per score.
#ifndef MEMDECAY_POLICIES_TOVA_HPP
#define MEMDECAY_POLICIES_TOVA_HPP

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "memdecay/core/config.hpp"
#include "memdecay/detail/digest.hpp"
#include "memdecay/detail/growth.hpp"
#include "memdecay/core/policy.hpp"

namespace memdecay::policies {

template <class Float = float>
class tova {
  static_assert(std::floating_point<Float>, "policies score in float or double");

 public:
  using float_type = Float;
  struct params_type {};
  static constexpr std::string_view name = "tova";

  tova(const params_type&, const config&, const region_table&) {}

  /// The mass of each token in the last observation (keep_score while it has none).
  [[nodiscard]] std::span<const Float> last() const noexcept { return last_; }

  void reserve(std::size_t tokens) { detail::reserve_for_append(last_, tokens); }
  void on_append(const sequence_view& view, std::size_t) noexcept {
    last_.resize(view.kv_len(), policy_support::keep_score<Float>);
  }
  void check_observation(const sequence_view&, std::span<const Float>) const noexcept {}
  std::size_t on_observe(const sequence_view&, std::span<const Float> mass) noexcept {
    std::copy(mass.begin(), mass.end(), last_.begin());
    return 0;
  }
  void on_remove(const sequence_view& view, std::span<const std::size_t> pages) noexcept {
    policy_support::compact_token_column(last_, pages, view.page_size);
  }
  void page_scores(const sequence_view& view, std::span<Float> out) const noexcept {
    policy_support::page_means<Float>(view, out, [&](std::size_t i) { return last_[i]; });
  }
  [[nodiscard]] std::uint64_t digest() const noexcept {
    detail::fnv1a64 h;
    h.add(std::span<const Float>(last_));
    return h.value();
  }

  /// The snapshot's fields (io/snapshot.hpp): parameters (checked against the target's on load), then state.
  template <class Fields>
  void snapshot_fields(Fields& f) {
    f.column_with_infinities("last", last_, f.kv_len());  // keep_score until observed
  }

 private:
  std::vector<Float> last_;
};

static_assert(eviction_policy<tova<float>> && eviction_policy<tova<double>>);

}  // namespace memdecay::policies

#endif  // MEMDECAY_POLICIES_TOVA_HPP
