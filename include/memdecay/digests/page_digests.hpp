// SPDX-License-Identifier: Apache-2.0
// memdecay: page key digests, the compact summary of a page's keys that query-aware scoring reads.
//
//   memdecay::page_digests d({.kv_heads = 8, .head_dim = 128, .query_heads = 32});  // Quest min/max, fp32
//   d.resize(seq.num_pages());
//   d.set_from_keys(page, keys);         // the page's keys, tokens x kv_heads x head_dim; or set_min_max / _mean
//   d.bounds(query, out);                // out[j * num_pages() + p]: query head j's logit bound on page p
//   d.bounds(query, out, pool);          // the same bounds, the pages split over an executor's threads
//   d.bounds_by_page(query, out);        // out[p * query_heads + j]: the same bits, a page's bounds together
//
// A basic_sequence holds one (enable_digests) and keeps it in its page order: pages enter without a digest,
// digests leave with their pages, and observe_query turns the bounds into the attention MemDecay consumes
// (digests/query_signal.hpp). The engine computes the digest on the GPU when a page fills, or hands the page's
// keys here; memdecay never touches K/V memory.
//
// Storage per page: kv_heads x vectors x head_dim values (vectors = 2 for min_max, 1 for mean_key) of 4 bytes
// (f32) or 2 (f16, bf16), and one presence byte; bytes_per_page() says it (8 KV heads x 128, min_max, f16: 4,097
// bytes, i.e. 256 per token at page 16 against 4,096 of the fp16 keys themselves). A narrowed minimum rounds down
// and a maximum up (simd/half.hpp), so a bound from an f16 or bf16 digest is still a bound of the keys.
//
// Every call validates first and changes nothing on error: input_error naming the field and the index (a
// digest of the wrong length, a NaN or infinite value, a channel whose minimum exceeds its maximum, a value
// beyond the storage format's range, a page that does not exist), config_error for an invalid layout.
#ifndef MEMDECAY_DIGESTS_PAGE_DIGESTS_HPP
#define MEMDECAY_DIGESTS_PAGE_DIGESTS_HPP

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "memdecay/detail/column_vector.hpp"
#include "memdecay/detail/digest.hpp"
#include "memdecay/core/executor.hpp"
#include "memdecay/detail/error.hpp"
#include "memdecay/digests/digest_bounds_on.hpp"
#include "memdecay/simd/digest_bound.hpp"
#include "memdecay/simd/half.hpp"

namespace memdecay {

using simd::digest_kind;

/// The element type digests are kept in.
enum class digest_storage : std::uint8_t { f32, f16, bf16 };

[[nodiscard]] constexpr const char* to_string(digest_storage s) noexcept {
  return s == digest_storage::f32 ? "f32" : s == digest_storage::f16 ? "f16" : "bf16";
}
[[nodiscard]] constexpr const char* to_string(digest_kind k) noexcept {
  return k == digest_kind::min_max ? "min_max" : "mean_key";
}

/// The model's attention geometry and the digest form.
struct digest_layout {
  std::size_t kv_heads = 0;     ///< KV heads of the layer (or layers) the digests summarise
  std::size_t head_dim = 0;     ///< channels per head
  std::size_t query_heads = 0;  ///< query heads (a multiple of kv_heads: grouped-query attention); 0 = kv_heads
  digest_kind kind = digest_kind::min_max;
  digest_storage storage = digest_storage::f32;
  double scale = 0;  ///< the logit scale; 0 = 1 / sqrt(head_dim), the softmax scale of standard attention

  [[nodiscard]] std::size_t effective_query_heads() const noexcept { return query_heads == 0 ? kv_heads : query_heads; }
  [[nodiscard]] double effective_scale() const noexcept {
    return scale == 0 ? 1.0 / std::sqrt(static_cast<double>(head_dim)) : scale;
  }
  /// Values one page's digest holds (and that set_min_max's lo and hi, or set_mean_key's mean, each hold per
  /// vector: kv_heads x head_dim).
  [[nodiscard]] std::size_t values_per_page() const noexcept {
    return kv_heads * simd::vectors_per_head(kind) * head_dim;
  }
  [[nodiscard]] std::size_t values_per_vector() const noexcept { return kv_heads * head_dim; }
  /// Bytes a page's digest takes (values and the presence byte).
  [[nodiscard]] std::size_t bytes_per_page() const noexcept {
    return values_per_page() * (storage == digest_storage::f32 ? 4 : 2) + 1;
  }
  /// Floats a query holds: query heads x head_dim, head after head.
  [[nodiscard]] std::size_t query_size() const noexcept { return effective_query_heads() * head_dim; }

  /// config_error naming the field unless every field is valid.
  void validate() const {
    const std::string why = problem();
    if (!why.empty()) detail::raise_config(why);
  }
  /// What is invalid, naming the field (empty when every field is valid): validate's message, without throwing.
  [[nodiscard]] std::string problem() const {
    constexpr std::size_t limit = std::size_t{1} << 20;  // far above any model; keeps every product in range
    if (kv_heads == 0 || kv_heads > limit)
      return "digest_layout.kv_heads = " + detail::to_text(kv_heads) + " (must be in [1, 2^20])";
    if (head_dim == 0 || head_dim > limit)
      return "digest_layout.head_dim = " + detail::to_text(head_dim) + " (must be in [1, 2^20])";
    if (query_heads > limit || effective_query_heads() % kv_heads != 0)
      return "digest_layout.query_heads = " + detail::to_text(query_heads) +
             " (must be a multiple of kv_heads = " + detail::to_text(kv_heads) + ", at most 2^20)";
    if (kv_heads * head_dim > limit * 16)
      return "digest_layout: kv_heads x head_dim = " + detail::to_text(kv_heads * head_dim) + " exceeds 2^24";
    if (kind != digest_kind::min_max && kind != digest_kind::mean_key)
      return "digest_layout.kind = " + detail::to_text(static_cast<int>(kind)) + " is not a kind";
    if (storage != digest_storage::f32 && storage != digest_storage::f16 && storage != digest_storage::bf16)
      return "digest_layout.storage = " + detail::to_text(static_cast<int>(storage)) + " is not a storage type";
    if (!std::isfinite(scale) || scale < 0 || !(static_cast<float>(effective_scale()) > 0.0f) ||
        !std::isfinite(static_cast<float>(effective_scale())))
      return "digest_layout.scale = " + detail::to_text(scale) +
             " (must be finite and > 0 as a float; 0 for 1/sqrt(head_dim))";
    return {};
  }
  bool operator==(const digest_layout&) const = default;
};

/// Page digests in page order (see the header comment).
class page_digests {
 public:
  /// The value arrays: on a cache line (a large one at a page boundary), so that a page's digest vectors
  /// (2 x head_dim values of a KV head, a multiple of 64 bytes when head_dim is a multiple of 16 or 32) never
  /// straddle two lines. A std::vector's 16-byte alignment split every 64-byte load of the AVX-512 kernel in two
  /// (docs/tiers.md).
  using f32_values = detail::column_vector<float>;
  using half_values = detail::column_vector<std::uint16_t>;

  explicit page_digests(const digest_layout& layout) : layout_(validated(layout)) {}

  [[nodiscard]] const digest_layout& layout() const noexcept { return layout_; }
  [[nodiscard]] std::size_t num_pages() const noexcept { return present_.size(); }
  [[nodiscard]] bool has_digest(std::size_t page) const noexcept {
    return page < present_.size() && present_[page] != 0;
  }
  [[nodiscard]] std::size_t pages_with_digest() const noexcept {
    return static_cast<std::size_t>(std::count(present_.begin(), present_.end(), std::uint8_t{1}));
  }
  /// Bytes held now (values and presence bytes of every page, with or without a digest).
  [[nodiscard]] std::size_t memory_bytes() const noexcept { return num_pages() * layout_.bytes_per_page(); }

  /// Makes room for `pages` more pages' digests without allocating later (bad_alloc here, nothing changed).
  void reserve(std::size_t pages) {
    const std::size_t n = (num_pages() + pages) * layout_.values_per_page();
    if (layout_.storage == digest_storage::f32)
      f32_.reserve(n);
    else
      half_.reserve(n);
    present_.reserve(num_pages() + pages);
  }
  /// Grows (new pages have no digest) or shrinks (the last pages' digests go) to `pages` pages.
  void resize(std::size_t pages) {
    const std::size_t n = pages * layout_.values_per_page();
    if (layout_.storage == digest_storage::f32)
      f32_.resize(n, 0.0f);
    else
      half_.resize(n, 0);
    present_.resize(pages, 0);
  }

  /// Sets page `page`'s min/max digest: lo and hi hold kv_heads x head_dim values each (head after head).
  void set_min_max(std::size_t page, std::span<const float> lo, std::span<const float> hi) {
    check_kind(digest_kind::min_max, "set_min_max");
    check_page(page, "set_min_max");
    check_values(lo, "lo", half_rounding::toward_minus);
    check_values(hi, "hi", half_rounding::toward_plus);
    for (std::size_t i = 0; i < lo.size(); ++i)
      if (lo[i] > hi[i])
        detail::raise_input("digest lo[" + detail::to_text(i) + "] = " + detail::to_text(lo[i]) + " exceeds hi[" +
                            detail::to_text(i) + "] = " + detail::to_text(hi[i]) + " (head " +
                            detail::to_text(i / layout_.head_dim) + ", channel " +
                            detail::to_text(i % layout_.head_dim) + ")");
    write(page, lo, hi);
  }
  /// Sets page `page`'s mean-key digest: kv_heads x head_dim values.
  void set_mean_key(std::size_t page, std::span<const float> mean) {
    check_kind(digest_kind::mean_key, "set_mean_key");
    check_page(page, "set_mean_key");
    check_values(mean, "mean", half_rounding::nearest_even);
    write(page, mean, {});
  }
  /// Computes page `page`'s digest (of the layout's kind) from its keys: tokens x kv_heads x head_dim floats.
  void set_from_keys(std::size_t page, std::span<const float> keys) {
    check_page(page, "set_from_keys");
    const std::size_t row = layout_.values_per_vector();
    if (keys.empty() || keys.size() % row != 0)
      detail::raise_input("page keys have " + detail::to_text(keys.size()) +
                          " values, expected a positive multiple of kv_heads x head_dim = " + detail::to_text(row));
    for (std::size_t i = 0; i < keys.size(); ++i)
      if (!std::isfinite(keys[i]))
        detail::raise_input("keys[" + detail::to_text(i) + "] = " + detail::to_text(keys[i]) + " (token " +
                            detail::to_text(i / row) + "; keys must be finite)");
    const std::size_t tokens = keys.size() / row;
    std::vector<float> a(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(row));
    if (layout_.kind == digest_kind::min_max) {
      std::vector<float> b = a;
      for (std::size_t t = 1; t < tokens; ++t)
        for (std::size_t i = 0; i < row; ++i) {
          a[i] = std::min(a[i], keys[t * row + i]);
          b[i] = std::max(b[i], keys[t * row + i]);
        }
      check_values(a, "lo", half_rounding::toward_minus);
      check_values(b, "hi", half_rounding::toward_plus);
      write(page, a, b);
    } else {
      std::vector<double> sum(a.begin(), a.end());
      for (std::size_t t = 1; t < tokens; ++t)
        for (std::size_t i = 0; i < row; ++i) sum[i] += keys[t * row + i];
      for (std::size_t i = 0; i < row; ++i) a[i] = static_cast<float>(sum[i] / static_cast<double>(tokens));
      check_values(a, "mean", half_rounding::nearest_even);
      write(page, a, {});
    }
  }
  /// Forgets page `page`'s digest (its keys changed: the engine will send a new one).
  void clear(std::size_t page) {
    check_page(page, "clear");
    present_[page] = 0;
  }

  /// Removes the digests of `pages` (ascending, distinct, existing: the sequence's plan) and closes the gaps,
  /// as sequence_state::remove_pages does for the layout.
  void remove_pages(std::span<const std::size_t> pages) {
    for (std::size_t i = 0; i < pages.size(); ++i)
      if (pages[i] >= num_pages() || (i > 0 && pages[i] <= pages[i - 1]))
        detail::raise_input("digest removal: pages[" + detail::to_text(i) + "] = " + detail::to_text(pages[i]) +
                            " (must be ascending, distinct and below " + detail::to_text(num_pages()) + ")");
    if (pages.empty()) return;
    if (layout_.storage == digest_storage::f32)
      compact(f32_, layout_.values_per_page(), pages);
    else
      compact(half_, layout_.values_per_page(), pages);
    compact(present_, 1, pages);  // last: the others read num_pages() from it
  }

  /// Query head j's bound of page p into out[j * num_pages() + p] (out has query_heads x num_pages() entries):
  /// the scaled logit upper bound (min_max) or estimate (mean_key); +infinity for a page without a digest (it
  /// could hold anything). `query`: query_heads x head_dim floats, head after head, finite. `exec` (core/
  /// executor.hpp) runs the pages in tasks (digests/digest_bounds_on.hpp): the same bounds bit for bit for every
  /// executor and thread count.
  template <simd::isa A = simd::native_isa, executor Exec = inline_executor>
  void bounds(std::span<const float> query, std::span<float> out, Exec&& exec = Exec{}) const {
    bounds_in<A>(query, out, simd::head_major(num_pages()), exec);
  }
  /// The same bounds page after page: query head j's bound of page p into out[p * query_heads + j], a page's
  /// bounds together (one stream from the kernel, and contiguous for a reduction over the heads; the same bits).
  template <simd::isa A = simd::native_isa, executor Exec = inline_executor>
  void bounds_by_page(std::span<const float> query, std::span<float> out, Exec&& exec = Exec{}) const {
    bounds_in<A>(query, out, simd::page_major(layout_.effective_query_heads()), exec);
  }
  /// input_error unless `query` is a finite query of this layout.
  void check_query(std::span<const float> query) const {
    if (query.size() != layout_.query_size())
      detail::raise_input("query has " + detail::to_text(query.size()) +
                          " values, expected query_heads x head_dim = " + detail::to_text(layout_.query_size()));
    for (std::size_t i = 0; i < query.size(); ++i)
      if (!std::isfinite(query[i]))
        detail::raise_input("query[" + detail::to_text(i) + "] = " + detail::to_text(query[i]) + " (head " +
                            detail::to_text(i / layout_.head_dim) + "; a query must be finite)");
  }

  /// Page `page`'s stored digest widened to float: vector v (0: lo or mean, 1: hi), kv_heads x head_dim values.
  [[nodiscard]] std::vector<float> stored(std::size_t page, std::size_t vector = 0) const {
    check_page(page, "stored");
    const std::size_t V = simd::vectors_per_head(layout_.kind);
    if (vector >= V)
      detail::raise_input("digest vector " + detail::to_text(vector) + " does not exist (" + detail::to_text(V) +
                          " per head)");
    std::vector<float> out(layout_.values_per_vector());
    const std::size_t D = layout_.head_dim;
    for (std::size_t h = 0; h < layout_.kv_heads; ++h)
      for (std::size_t c = 0; c < D; ++c)
        out[h * D + c] = value_at(page * layout_.values_per_page() + h * V * D + offset_in_head(vector, c));
    return out;
  }
  /// The raw stored values of every page (f32: floats; f16/bf16: the 16-bit patterns), page after page, a KV
  /// head's min/max values in the kernels' layout (simd::interleave_min_max; stored() gives them in channel order).
  [[nodiscard]] std::span<const float> raw_f32() const noexcept { return f32_; }
  [[nodiscard]] std::span<const std::uint16_t> raw_half() const noexcept { return half_; }
  [[nodiscard]] std::span<const std::uint8_t> presence() const noexcept { return present_; }

  /// Digests from their stored form (io/snapshot.hpp checks the values first and puts them in the kernels' layout):
  /// a presence byte per page and the raw values of layout.storage, as raw_f32/raw_half give them. input_error
  /// unless the lengths fit the layout.
  [[nodiscard]] static page_digests restore(const digest_layout& layout, std::vector<std::uint8_t> presence,
                                            f32_values f32, half_values half) {
    page_digests d(layout);
    const std::size_t n = presence.size() * layout.values_per_page();
    const bool fits =
        layout.storage == digest_storage::f32 ? f32.size() == n && half.empty() : half.size() == n && f32.empty();
    if (!fits)
      detail::raise_input("page digests: the stored values do not fit " + detail::to_text(presence.size()) + " pages");
    d.present_ = std::move(presence);
    d.f32_ = std::move(f32);
    d.half_ = std::move(half);
    return d;
  }

  /// A digest of the layout, the presence bytes and every stored value.
  [[nodiscard]] std::uint64_t digest() const noexcept {
    detail::fnv1a64 h;
    h.add(static_cast<std::uint64_t>(layout_.kv_heads)).add(static_cast<std::uint64_t>(layout_.head_dim));
    h.add(static_cast<std::uint64_t>(layout_.effective_query_heads())).add(layout_.effective_scale());
    h.add(static_cast<std::uint8_t>(layout_.kind)).add(static_cast<std::uint8_t>(layout_.storage));
    h.add(std::span<const std::uint8_t>(present_)).add(std::span<const float>(f32_));
    h.add(std::span<const std::uint16_t>(half_));
    return h.value();
  }

 private:
  // bounds and bounds_by_page: `where` is simd::head_major(num_pages()) or simd::page_major(query_heads).
  template <simd::isa A, executor Exec>
  void bounds_in(std::span<const float> query, std::span<float> out, simd::bounds_layout where, Exec& exec) const {
    check_query(query);
    if (out.size() != layout_.effective_query_heads() * num_pages())
      detail::raise_input(
          "bounds output has " + detail::to_text(out.size()) +
          " entries, expected query_heads x pages = " + detail::to_text(layout_.effective_query_heads() * num_pages()));
    std::vector<float> prepared(layout_.query_size());
    simd::prepare_digest_query(query.data(), layout_.effective_query_heads(), layout_.head_dim,
                               static_cast<float>(layout_.effective_scale()), prepared.data());
    const simd::digest_shape shape{layout_.kv_heads, layout_.effective_query_heads(), layout_.head_dim, layout_.kind};
    const std::size_t n = num_pages();
    switch (layout_.storage) {
      case digest_storage::f32:
        digest_bounds_on<A>(exec, shape, f32_.data(), n, prepared.data(), out.data(), where);
        break;
      case digest_storage::f16:
        digest_bounds_on<A, std::uint16_t, half_format::f16>(exec, shape, half_.data(), n, prepared.data(),
                                                             out.data(), where);
        break;
      case digest_storage::bf16:
        digest_bounds_on<A, std::uint16_t, half_format::bf16>(exec, shape, half_.data(), n, prepared.data(),
                                                              out.data(), where);
        break;
    }
    for (std::size_t p = 0; p < n; ++p)
      if (present_[p] == 0)
        for (std::size_t j = 0; j < layout_.effective_query_heads(); ++j)
          out[j * where.head_stride + p * where.page_stride] = std::numeric_limits<float>::infinity();
  }
  static digest_layout validated(const digest_layout& l) {
    l.validate();
    return l;
  }
  void check_kind(digest_kind k, const char* call) const {
    if (layout_.kind != k)
      detail::raise_usage(std::string(call) + ": the digests are " + to_string(layout_.kind) + ", not " + to_string(k));
  }
  void check_page(std::size_t page, const char* call) const {
    if (page >= num_pages())
      detail::raise_input(std::string(call) + ": page " + detail::to_text(page) + " does not exist (" +
                          detail::to_text(num_pages()) + " pages)");
  }
  // Length, finiteness, and that the storage format can hold each value (rounded as write() will round it).
  void check_values(std::span<const float> v, const char* name, half_rounding r) const {
    if (v.size() != layout_.values_per_vector())
      detail::raise_input(std::string("digest ") + name + " has " + detail::to_text(v.size()) +
                          " values, expected kv_heads x head_dim = " + detail::to_text(layout_.values_per_vector()));
    for (std::size_t i = 0; i < v.size(); ++i) {
      const bool finite = std::isfinite(v[i]) && (layout_.storage == digest_storage::f32 ||
                                                  std::isfinite(simd::half_to_float(narrow(v[i], r), format())));
      if (!finite)
        detail::raise_input(std::string("digest ") + name + "[" + detail::to_text(i) + "] = " + detail::to_text(v[i]) +
                            (std::isfinite(v[i]) ? std::string(" is beyond the range of ") +
                                                       to_string(layout_.storage) + " storage (use f32 or bf16)"
                                                 : std::string(" (digests must be finite)")));
    }
  }
  [[nodiscard]] half_format format() const noexcept {
    return layout_.storage == digest_storage::bf16 ? half_format::bf16 : half_format::f16;
  }
  [[nodiscard]] std::uint16_t narrow(float x, half_rounding r) const noexcept {
    return simd::float_to_half(x, format(), r);
  }
  [[nodiscard]] float value_at(std::size_t i) const noexcept {
    return layout_.storage == digest_storage::f32 ? f32_[i] : simd::half_to_float(half_[i], format());
  }
  // Where vector v's (0: lo or mean, 1: hi) channel c sits among a KV head's stored values: min/max heads in the
  // kernels' layout (simd::digest_min_offset: the channels in runs of 64 bytes, a run's minima then its maxima).
  [[nodiscard]] std::size_t offset_in_head(std::size_t v, std::size_t c) const noexcept {
    if (layout_.kind == digest_kind::mean_key) return c;
    const std::size_t D = layout_.head_dim;
    if (layout_.storage == digest_storage::f32)
      return v == 0 ? simd::digest_min_offset<float>(c) : simd::digest_max_offset<float>(c, D);
    return v == 0 ? simd::digest_min_offset<std::uint16_t>(c) : simd::digest_max_offset<std::uint16_t>(c, D);
  }
  // Writes checked vectors (a = lo or mean, b = hi) into page `page`, head after head, in the kernels' layout.
  void write(std::size_t page, std::span<const float> a, std::span<const float> b) noexcept {
    const std::size_t V = simd::vectors_per_head(layout_.kind), D = layout_.head_dim;
    const std::size_t base = page * layout_.values_per_page();
    for (std::size_t h = 0; h < layout_.kv_heads; ++h)
      for (std::size_t v = 0; v < V; ++v) {
        const std::span<const float> src = v == 0 ? a : b;
        const half_rounding r =
            V == 1 ? half_rounding::nearest_even : (v == 0 ? half_rounding::toward_minus : half_rounding::toward_plus);
        for (std::size_t c = 0; c < D; ++c) {
          const std::size_t at = base + h * V * D + offset_in_head(v, c);
          if (layout_.storage == digest_storage::f32)
            f32_[at] = src[h * D + c];
          else
            half_[at] = narrow(src[h * D + c], r);
        }
      }
    present_[page] = 1;
  }
  // Closes the gaps of the removed pages in a page-major array of `per` values per page (sequence_state's
  // compaction, for the digests' arrays).
  template <class Values>
  void compact(Values& values, std::size_t per, std::span<const std::size_t> pages) const noexcept {
    std::size_t write_page = pages.front(), next = 0;
    for (std::size_t read_page = pages.front(); read_page < num_pages(); ++read_page) {
      if (next < pages.size() && pages[next] == read_page) {
        ++next;
        continue;
      }
      std::copy_n(values.begin() + static_cast<std::ptrdiff_t>(read_page * per), per,
                  values.begin() + static_cast<std::ptrdiff_t>(write_page * per));
      ++write_page;
    }
    values.resize(values.size() - pages.size() * per);
  }

  digest_layout layout_;
  f32_values f32_;
  half_values half_;
  std::vector<std::uint8_t> present_;
};

}  // namespace memdecay

#endif  // MEMDECAY_DIGESTS_PAGE_DIGESTS_HPP
