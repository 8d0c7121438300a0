// SPDX-License-Identifier: Apache-2.0
// memdecay: attention observations: validation, normalisation and reduction of head/layer matrices.
//
// An engine reports the attention mass each resident token received in one step, in one of three shapes:
//   * per token  : a vector of kv_len() masses, in page order;
//   * per page   : a vector of num_pages() masses, already reduced by the engine (cheapest to copy off a GPU);
//                  each page's mass is shared evenly among its resident tokens;
//   * matrices   : heads x tokens, or layers x (heads x tokens), reduced here with Eigen by sum or mean.
// Masses must be finite and >= 0. Validation happens before anything changes, and the error names the index of
// the first bad value.
#ifndef MEMDECAY_CORE_ATTENTION_HPP
#define MEMDECAY_CORE_ATTENTION_HPP

#include <Eigen/Core>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <ranges>
#include <span>
#include <string>
#include <vector>

#include "memdecay/core/config.hpp"
#include "memdecay/detail/error.hpp"
#include "memdecay/simd/mass_check.hpp"

namespace memdecay {

/// How a heads x tokens (or layers x heads x tokens) matrix is reduced to one mass per token.
enum class head_reduction : std::uint8_t {
  sum,   ///< total mass over heads (and layers): n_heads for rows that each sum to 1
  mean,  ///< mean over heads (and layers): each token's share of one average attention row
};

/// Throws input_error unless `mass` has `expected` entries, each finite and >= 0. `what` names the observation.
template <std::floating_point Float>
void validate_mass(std::span<const Float> mass, std::size_t expected, const char* what) {
  if (mass.size() != expected)
    detail::raise_input(std::string(what) + " has " + detail::to_text(mass.size()) + " entries, expected " +
                        detail::to_text(expected));
  if (simd::mass_is_valid(mass.data(), mass.size(), Float{1})) return;  // one branch-free pass (mass_check.hpp)
  for (std::size_t i = 0; i < mass.size(); ++i) {
    const Float m = mass[i];
    if (!std::isfinite(m) || m < Float{0})
      detail::raise_input(std::string(what) + "[" + detail::to_text(i) + "] = " + detail::to_text(m) +
                          " (attention mass must be finite and >= 0)");
  }
}

/// The factor that turns a raw mass into the normalised x_i for a sequence of `resident` tokens (`zscore` is not
/// a scale: see zscore_normalize).
template <std::floating_point Float>
[[nodiscard]] constexpr Float normalization_scale(attention_normalization mode, std::size_t resident) noexcept {
  return mode == attention_normalization::uniform || mode == attention_normalization::lifetime
             ? static_cast<Float>(resident)
             : Float{1};
}

/// The mean and population standard deviation of one observation (two passes, in double).
struct mass_moments {
  double mean = 0;
  double stddev = 0;
};
template <std::floating_point Float>
[[nodiscard]] mass_moments moments_of(std::span<const Float> mass) noexcept {
  const std::size_t n = mass.size();
  if (n == 0) return {};
  double mean = 0, var = 0;
  for (Float m : mass) mean += static_cast<double>(m);
  mean /= static_cast<double>(n);
  for (Float m : mass) var += (static_cast<double>(m) - mean) * (static_cast<double>(m) - mean);
  return {mean, std::sqrt(var / static_cast<double>(n))};
}
/// `zscore` normalisation of one mass: (m - mean) / std, or 0 when std = 0. For the moments of the observation
/// the mass belongs to, |result| <= sqrt(n), so it is always finite.
template <std::floating_point Float>
[[nodiscard]] inline Float zscore_of(Float m, const mass_moments& mo) noexcept {
  return mo.stddev > 0 ? static_cast<Float>((static_cast<double>(m) - mo.mean) / mo.stddev) : Float{0};
}
/// `zscore` normalisation of a whole observation into `out` (same length; may alias `mass`).
template <std::floating_point Float>
void zscore_normalize(std::span<const Float> mass, std::span<Float> out) noexcept {
  const auto mo = moments_of(mass);
  for (std::size_t i = 0; i < mass.size(); ++i) out[i] = zscore_of(mass[i], mo);
}

/// `lifetime` normalisation of an EWMA: a / (1 - beta^k), where k is the number of observations since the token
/// was appended. 1 - beta^k is the total weight the EWMA gave to observations the token was resident for, so the
/// result is the weighted mean of its normalised attention over its lifetime in the cache; bounded by the
/// largest x it saw. Zero when k = 0 (never observed: the EWMA is still 0).
template <std::floating_point Float>
[[nodiscard]] inline Float lifetime_normalize(Float ewma, Float beta, std::uint64_t observations) noexcept {
  if (observations == 0) return Float{0};
  const double weight = std::pow(static_cast<double>(beta), static_cast<double>(observations));
  const Float seen = Float{1} - static_cast<Float>(weight);
  return seen > Float{0} ? ewma / seen : ewma;
}

/// Reduces a heads x tokens matrix to one mass per token (column sums, or means over the rows).
template <class Derived>
[[nodiscard]] std::vector<typename Derived::Scalar> reduce_heads(const Eigen::MatrixBase<Derived>& heads_by_tokens,
                                                                 head_reduction how) {
  using Float = typename Derived::Scalar;
  static_assert(std::floating_point<Float>, "attention matrices hold floating-point masses");
  std::vector<Float> out(static_cast<std::size_t>(heads_by_tokens.cols()));
  Eigen::Map<Eigen::Matrix<Float, 1, Eigen::Dynamic>> row(out.data(), heads_by_tokens.cols());
  row = heads_by_tokens.colwise().sum();
  if (how == head_reduction::mean && heads_by_tokens.rows() > 0) row /= static_cast<Float>(heads_by_tokens.rows());
  return out;
}

/// Reduces layers x (heads x tokens) to one mass per token. Every layer must have the same number of tokens
/// (input_error otherwise); the mean divides by the total number of rows (layers x heads).
template <std::ranges::forward_range Layers>
[[nodiscard]] auto reduce_layers(const Layers& layers, head_reduction how) {
  using Matrix = std::ranges::range_value_t<Layers>;
  using Float = typename Matrix::Scalar;
  std::vector<Float> out;
  Eigen::Index rows = 0;
  std::size_t layer = 0;
  for (const auto& m : layers) {
    if (layer == 0) {
      out.assign(static_cast<std::size_t>(m.cols()), Float{0});
    } else if (static_cast<std::size_t>(m.cols()) != out.size()) {
      detail::raise_input("layer " + detail::to_text(layer) + " has " + detail::to_text(m.cols()) +
                          " token columns, layer 0 has " + detail::to_text(out.size()));
    }
    Eigen::Map<Eigen::Matrix<Float, 1, Eigen::Dynamic>> acc(out.data(), m.cols());
    acc += m.colwise().sum();
    rows += m.rows();
    ++layer;
  }
  if (how == head_reduction::mean && rows > 0)
    for (auto& v : out) v /= static_cast<Float>(rows);
  return out;
}

}  // namespace memdecay

#endif  // MEMDECAY_CORE_ATTENTION_HPP
