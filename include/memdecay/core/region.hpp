// SPDX-License-Identifier: Apache-2.0
// memdecay: regions and their parameters.
//
// The orchestrator labels every token with the region it belongs to (system prompt, plan, a user turn, a tool
// call, a tool's output, a retrieved document, scratchpad reasoning). Regions differ in how long the model keeps
// attending to them, so each has its own base priority b_r, its own decay rate lambda_r and a pinned flag.
// Ids are std::uint8_t: a token's label costs one byte and a page's regions fit one cache line.
#ifndef MEMDECAY_CORE_REGION_HPP
#define MEMDECAY_CORE_REGION_HPP

#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numbers>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "memdecay/detail/error.hpp"

namespace memdecay {

/// A region label. The default set uses 0..6; user-defined sets may use up to 255 ids.
using region_id = std::uint8_t;

/// The ids of the default region set, in the order default_region_table() lists them.
namespace regions {
inline constexpr region_id system = 0;      ///< system instructions; pinned by default
inline constexpr region_id plan = 1;        ///< the agent's plan; pinnable by config
inline constexpr region_id user = 2;        ///< user turns
inline constexpr region_id tool_in = 3;     ///< tool-call arguments
inline constexpr region_id tool_out = 4;    ///< tool outputs (often long)
inline constexpr region_id retrieval = 5;   ///< retrieved documents
inline constexpr region_id scratchpad = 6;  ///< scratchpad / reasoning tokens
inline constexpr std::size_t default_count = 7;
}  // namespace regions

/// Converts a half-life in decay steps to a decay rate: exp(-lambda * h) = 1/2  <=>  lambda = ln 2 / h.
constexpr double decay_rate_from_half_life(double half_life_steps) noexcept {
  return std::numbers::ln2 / half_life_steps;
}
/// The inverse of decay_rate_from_half_life; infinite for a rate of zero (no decay).
constexpr double half_life_from_decay_rate(double decay_rate) noexcept {
  return decay_rate == 0.0 ? std::numeric_limits<double>::infinity() : std::numbers::ln2 / decay_rate;
}

/// The parameters of one region.
struct region_params {
  std::string name;            ///< unique, non-empty; how configs and calibration files refer to the region
  double base_priority = 1.0;  ///< b_r >= 0, finite: the score of a token that was just refreshed (before attention)
  double decay_rate = 0.0;     ///< lambda_r >= 0, finite, per step: how fast the b_r term fades after a refresh
  bool pinned = false;         ///< a page holding any token of a pinned region is never evicted

  /// The half-life of the b_r term in steps (infinite when decay_rate is 0).
  [[nodiscard]] double half_life() const noexcept { return half_life_from_decay_rate(decay_rate); }
  /// Sets decay_rate from a half-life in steps (must be > 0).
  region_params& set_half_life(double half_life_steps) {
    if (!(half_life_steps > 0.0) || !std::isfinite(half_life_steps))
      detail::raise_config("region '" + name + "': half_life = " + detail::to_text(half_life_steps) +
                           " (must be finite and > 0 steps)");
    decay_rate = decay_rate_from_half_life(half_life_steps);
    return *this;
  }
};

/// A change to one region of a table, addressed by name (configs carry these, so that a typo is an error,
/// not a silently ignored setting). Unset fields keep the table's value.
struct region_override {
  std::string region;                     ///< the region's name; an unknown name is rejected
  std::optional<double> base_priority{};  ///< new b_r
  std::optional<double> decay_rate{};     ///< new lambda_r (per step); exclusive with half_life
  std::optional<double> half_life{};      ///< new half-life in steps; exclusive with decay_rate
  std::optional<bool> pinned{};           ///< pin or unpin the region
};

/// What the scorer needs from a region set. region_table is the run-time model; an engine with a fixed region set
/// may supply a constexpr type of its own.
template <class T>
concept region_table_like = requires(const T& table, region_id r) {
  { table.size() } -> std::convertible_to<std::size_t>;
  { table.base_priority(r) } -> std::convertible_to<double>;
  { table.decay_rate(r) } -> std::convertible_to<double>;
  { table.pinned(r) } -> std::convertible_to<bool>;
};

/// A validated set of regions: ids 0..size()-1, each with a unique name and valid parameters.
class region_table {
 public:
  region_table() = default;

  /// Builds a table from the parameters of ids 0, 1, ...; throws config_error when any is invalid.
  explicit region_table(std::vector<region_params> params) : params_(std::move(params)) { validate(); }

  [[nodiscard]] std::size_t size() const noexcept { return params_.size(); }
  [[nodiscard]] bool contains(region_id r) const noexcept { return r < params_.size(); }
  [[nodiscard]] const region_params& operator[](region_id r) const noexcept { return params_[r]; }
  [[nodiscard]] const region_params& at(region_id r) const {
    if (!contains(r))
      detail::raise_input("unknown region id " + detail::to_text(int{r}) + " (table has " + detail::to_text(size()) +
                          " regions)");
    return params_[r];
  }
  [[nodiscard]] double base_priority(region_id r) const noexcept { return params_[r].base_priority; }
  [[nodiscard]] double decay_rate(region_id r) const noexcept { return params_[r].decay_rate; }
  [[nodiscard]] bool pinned(region_id r) const noexcept { return params_[r].pinned; }
  [[nodiscard]] const std::vector<region_params>& params() const noexcept { return params_; }

  /// The id of the region called `name`, if there is one.
  [[nodiscard]] std::optional<region_id> find(std::string_view name) const noexcept {
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (params_[i].name == name) return static_cast<region_id>(i);
    return std::nullopt;
  }
  /// The id of the region called `name`; throws config_error when there is none.
  [[nodiscard]] region_id id_of(std::string_view name) const {
    if (auto id = find(name)) return *id;
    detail::raise_config("unknown region name '" + std::string(name) + "'" + known_names());
  }

  /// Appends a user-defined region and returns its id; throws config_error (and changes nothing) when invalid.
  region_id add(region_params params) {
    region_table candidate = *this;
    candidate.params_.push_back(std::move(params));
    candidate.validate();
    *this = std::move(candidate);
    return static_cast<region_id>(params_.size() - 1);
  }

  /// Returns a copy with the overrides applied; throws config_error (naming the field) when one is invalid.
  [[nodiscard]] region_table with_overrides(const std::vector<region_override>& overrides) const {
    region_table result = *this;
    for (const auto& o : overrides) {
      region_params& p = result.params_[result.id_of(o.region)];
      if (o.decay_rate && o.half_life)
        detail::raise_config("override of region '" + o.region + "' sets both decay_rate and half_life");
      if (o.base_priority) p.base_priority = *o.base_priority;
      if (o.decay_rate) p.decay_rate = *o.decay_rate;
      if (o.half_life) p.set_half_life(*o.half_life);
      if (o.pinned) p.pinned = *o.pinned;
    }
    result.validate();
    return result;
  }

  /// Throws config_error naming the region and field when the table is invalid.
  void validate() const {
    if (params_.empty()) detail::raise_config("region table is empty");
    if (params_.size() > std::size_t{std::numeric_limits<region_id>::max()} + 1)
      detail::raise_config("region table has " + detail::to_text(params_.size()) + " regions (at most 256)");
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const auto& p = params_[i];
      const std::string where = "region " + detail::to_text(i) + " ('" + p.name + "'): ";
      if (p.name.empty()) detail::raise_config(where + "name is empty");
      for (std::size_t j = 0; j < i; ++j)
        if (params_[j].name == p.name) detail::raise_config(where + "duplicate name");
      if (!(p.base_priority >= 0.0) || !std::isfinite(p.base_priority))
        detail::raise_config(where + "base_priority = " + detail::to_text(p.base_priority) +
                             " (must be finite and >= 0)");
      if (!(p.decay_rate >= 0.0) || !std::isfinite(p.decay_rate))
        detail::raise_config(where + "decay_rate = " + detail::to_text(p.decay_rate) + " (must be finite and >= 0)");
    }
  }

 private:
  [[nodiscard]] std::string known_names() const {
    std::string names = " (known:";
    for (const auto& p : params_) names += " " + p.name;
    return names + ")";
  }

  std::vector<region_params> params_;
};

static_assert(region_table_like<region_table>);

/// The default region set with the paper's lifetimes: system ~170 steps (measured 148-189), scratchpad ~15
/// (14-16), retrieval the longest-lived movable region. Base priorities rank regions by how much an agent loses
/// when they are gone. System is pinned; plan is pinnable through a region_override{.region = "plan",
/// .pinned = true}. Calibration (docs/calibration.md) replaces the decay rates with fitted ones.
inline region_table default_region_table() {
  auto region = [](const char* name, double base, double half_life, bool pinned) {
    return region_params{name, base, decay_rate_from_half_life(half_life), pinned};
  };
  return region_table({
      region("system", 1.00, 170.0, true),
      region("plan", 0.90, 120.0, false),
      region("user", 0.80, 80.0, false),
      region("tool_in", 0.50, 30.0, false),
      region("tool_out", 0.40, 40.0, false),
      region("retrieval", 0.60, 100.0, false),
      region("scratchpad", 0.30, 15.0, false),
  });
}

}  // namespace memdecay

#endif  // MEMDECAY_CORE_REGION_HPP
