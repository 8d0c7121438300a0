// SPDX-License-Identifier: Apache-2.0
// memdecay: attention as the engine's kernel wrote it (fp32, fp16 or bf16; heads x tokens with a leading dimension).
//
// An engine that materialises attention (or the column sums of it) holds a heads x tokens block in its own
// element type, rows `stride` elements apart. observe_tokens wants one float per token: building that vector is a
// pass over the rows and a float copy of the result before the observation reads it again. attention_rows names
// the engine's memory as it is, and basic_sequence::observe_rows reduces and widens it a block of tokens at a time
// into a buffer that stays in the L1 cache, feeding each block to the policy's fused observation
// (policies/memdecay.hpp, on_observe_blocks): no whole-sequence float copy is ever made.
//
// The reduction is the specification (reduce_rows_reference below): mass[t] = the sum over rows r = 0, 1, ... in
// that order of widen(row r, token t), in Float arithmetic, then times 1 / rows for a mean. The
// widening of fp16 and bf16 is exact, and the SIMD path (simd/reduce_rows.hpp) adds in the same order, so both
// give the same bits (tests/unit/attention_rows_test.cpp), and observe_rows(rows) is observe_tokens(reduced).
//
// Every element must be finite and >= 0 (a negative entry hidden by a larger one in the sum is still bad input),
// and every reduced mass finite; the error names the row and the token of the first bad element.
#ifndef MEMDECAY_CORE_ATTENTION_ROWS_HPP
#define MEMDECAY_CORE_ATTENTION_ROWS_HPP

#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "memdecay/core/attention.hpp"
#include "memdecay/detail/error.hpp"
#include "memdecay/simd/half.hpp"

namespace memdecay {

/// The element type of an attention_rows block.
enum class mass_format : std::uint8_t {
  f32,   ///< IEEE binary32
  f16,   ///< IEEE binary16 (half_format::f16)
  bf16,  ///< bfloat16 (half_format::bf16)
};

[[nodiscard]] constexpr const char* to_string(mass_format f) noexcept {
  switch (f) {
    case mass_format::f32: return "f32";
    case mass_format::f16: return "f16";
    case mass_format::bf16: return "bf16";
  }
  return "?";
}

/// A view of `rows` attention rows (heads, or layers x heads) of `tokens` masses each, row r starting at element
/// r x stride of the engine's buffer. Nothing is copied; the buffer must outlive the view. The constructors check
/// the shape against the span (input_error naming the field), so a view that exists is in bounds.
class attention_rows {
 public:
  /// float32 rows. `stride` is the leading dimension in elements (>= tokens); 0 means tokens (packed rows).
  attention_rows(std::span<const float> data, std::size_t rows, std::size_t tokens, std::size_t stride = 0,
                 head_reduction how = head_reduction::sum)
      : attention_rows(data.data(), data.size(), mass_format::f32, rows, tokens, stride, how) {}
  /// fp16 or bf16 rows, as their bits (std::uint16_t: what a torch.float16 / torch.bfloat16 buffer holds).
  attention_rows(std::span<const std::uint16_t> data, half_format format, std::size_t rows, std::size_t tokens,
                 std::size_t stride = 0, head_reduction how = head_reduction::sum)
      : attention_rows(data.data(), data.size(), format == half_format::f16 ? mass_format::f16 : mass_format::bf16,
                       rows, tokens, stride, how) {}
  /// One row of per-token float32 mass: the same as observe_tokens(mass).
  static attention_rows tokens_of(std::span<const float> mass) { return {mass, 1, mass.size()}; }

  [[nodiscard]] mass_format format() const noexcept { return format_; }
  [[nodiscard]] std::size_t rows() const noexcept { return rows_; }
  [[nodiscard]] std::size_t tokens() const noexcept { return tokens_; }
  [[nodiscard]] std::size_t stride() const noexcept { return stride_; }
  [[nodiscard]] head_reduction reduction() const noexcept { return how_; }
  /// Bytes of one element (4 or 2).
  [[nodiscard]] std::size_t element_bytes() const noexcept { return format_ == mass_format::f32 ? 4 : 2; }

  /// Row r's first element, as the format's type (the other accessors return nullptr).
  [[nodiscard]] const float* f32_row(std::size_t r) const noexcept {
    return format_ == mass_format::f32 ? static_cast<const float*>(data_) + r * stride_ : nullptr;
  }
  [[nodiscard]] const std::uint16_t* half_row(std::size_t r) const noexcept {
    return format_ == mass_format::f32 ? nullptr : static_cast<const std::uint16_t*>(data_) + r * stride_;
  }
  /// Element (r, t) widened to float (exact).
  [[nodiscard]] float element(std::size_t r, std::size_t t) const noexcept {
    switch (format_) {
      case mass_format::f32: return f32_row(r)[t];
      case mass_format::f16: return simd::f16_to_float(half_row(r)[t]);
      case mass_format::bf16: return simd::bf16_to_float(half_row(r)[t]);
    }
    return 0;
  }

 private:
  attention_rows(const void* data, std::size_t size, mass_format format, std::size_t rows, std::size_t tokens,
                 std::size_t stride, head_reduction how)
      : data_(data), format_(format), rows_(rows), tokens_(tokens), stride_(stride == 0 ? tokens : stride),
        how_(how) {
    const std::string what = std::string("attention rows (") + to_string(format) + "): ";
    if (rows == 0) detail::raise_input(what + "rows = 0 (at least one row)");
    if (stride_ < tokens)
      detail::raise_input(what + "stride = " + detail::to_text(stride_) + " is below tokens = " +
                          detail::to_text(tokens) + " (rows would overlap)");
    // The last row ends at (rows - 1) x stride + tokens; checked without overflow.
    if (tokens > 0 && (tokens > size || (rows - 1) > (size - tokens) / stride_))
      detail::raise_input(what + "the buffer holds " + detail::to_text(size) + " elements, " + detail::to_text(rows) +
                          " rows of " + detail::to_text(tokens) + " tokens " + detail::to_text(stride_) +
                          " apart need " + detail::to_text((rows - 1) * stride_ + tokens));
  }

  const void* data_;
  mass_format format_;
  std::size_t rows_;
  std::size_t tokens_;
  std::size_t stride_;
  head_reduction how_;
};

/// The reduction's specification: the mass of tokens [begin, begin + count) into out[0, count), summed over the
/// rows in order in Float, times 1 / rows() for a mean (simd::reduce_rows gives the same bits).
template <std::floating_point Float>
void reduce_rows_reference(const attention_rows& rows, std::size_t begin, std::size_t count, Float* out) noexcept {
  const Float inv_rows = Float{1} / static_cast<Float>(rows.rows());
  for (std::size_t t = 0; t < count; ++t) {
    Float sum = static_cast<Float>(rows.element(0, begin + t));
    for (std::size_t r = 1; r < rows.rows(); ++r) sum += static_cast<Float>(rows.element(r, begin + t));
    out[t] = rows.reduction() == head_reduction::mean ? sum * inv_rows : sum;
  }
}

/// The whole reduced mass as a vector (what observe_rows observes; a copy, for policies that take a whole vector).
template <std::floating_point Float>
[[nodiscard]] std::vector<Float> reduce_rows(const attention_rows& rows) {
  std::vector<Float> out(rows.tokens());
  reduce_rows_reference<Float>(rows, 0, rows.tokens(), out.data());
  return out;
}

/// One element of attention_rows: where it is and its value (widened).
struct row_element {
  std::size_t row = 0;
  std::size_t token = 0;
  float value = 0;
};

/// The first element of tokens [begin, begin + count) (in token order, then row order) that is not finite and
/// >= 0, if there is one.
[[nodiscard]] inline std::optional<row_element> first_bad_element(const attention_rows& rows, std::size_t begin,
                                                                  std::size_t count) noexcept {
  for (std::size_t t = begin; t < begin + count; ++t)
    for (std::size_t r = 0; r < rows.rows(); ++r) {
      const float m = rows.element(r, t);
      if (!std::isfinite(m) || m < 0.0f) return row_element{r, t, m};
    }
  return std::nullopt;
}

/// Throws input_error naming the row and token of first_bad_element; returns if there is none.
inline void check_row_elements(const attention_rows& rows, std::size_t begin, std::size_t count) {
  if (const auto bad = first_bad_element(rows, begin, count))
    detail::raise_input(std::string("attention rows (") + to_string(rows.format()) + "): row " +
                        detail::to_text(bad->row) + ", token " + detail::to_text(bad->token) + " = " +
                        detail::to_text(bad->value) + " (attention mass must be finite and >= 0)");
}

}  // namespace memdecay

#endif  // MEMDECAY_CORE_ATTENTION_ROWS_HPP
