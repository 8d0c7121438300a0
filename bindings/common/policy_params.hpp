// SPDX-License-Identifier: Apache-2.0
// A policy's parameters by name, for the bindings: each policy's parameters are listed once (visit_params), and a
// param_source (Python keyword arguments, the C API's "key=value,..." text) supplies them. Every key must be one of
// the policy's; an unknown key or a value of the wrong kind is a config_error naming it.
#ifndef MEMDECAY_BINDINGS_COMMON_POLICY_PARAMS_HPP
#define MEMDECAY_BINDINGS_COMMON_POLICY_PARAMS_HPP

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <memdecay/detail/error.hpp>
#include <memdecay/policies/all.hpp>

namespace memdecay_bindings {

namespace md = memdecay;

/// Where parameter values come from. Each take() reads `key` into `out` when the source has it (and marks it
/// used); a value that is not of out's kind is a config_error naming `policy.key`.
class param_source {
 public:
  virtual ~param_source() = default;
  [[nodiscard]] virtual bool has(const std::string& key) const = 0;
  virtual void take(const std::string& key, bool& out) = 0;
  virtual void take(const std::string& key, std::uint64_t& out) = 0;
  virtual void take(const std::string& key, double& out) = 0;
  virtual void take(const std::string& key, std::string& out) = 0;
  virtual void take(const std::string& key, std::vector<int>& out) = 0;
  /// The keys given but never taken.
  [[nodiscard]] virtual std::vector<std::string> unused() const = 0;
};

/// A named choice among an enum's values.
template <class Enum>
struct choice {
  std::initializer_list<std::pair<const char*, Enum>> values;
  Enum& out;
};

/// Calls visit(name, member) for each of policy P's parameters (a choice<Enum> for an enum member), in the order
/// the docs list them.
template <template <class> class P, class Visit>
void visit_params(typename P<float>::params_type& p, Visit&& visit) {
  namespace pol = md::policies;
  if constexpr (std::is_same_v<P<float>, pol::memdecay<float>>) {
    using agg = pol::memdecay<float>::page_aggregation;
    visit("exp_free_scores", p.exp_free_scores);
    visit("aggregation", choice<agg>{{{"mean", agg::mean}, {"max", agg::max}}, p.aggregation});
  } else if constexpr (std::is_same_v<P<float>, pol::h2o<float>>) {
    visit("recent_tokens", p.recent_tokens);
    visit("recent_fraction", p.recent_fraction);
  } else if constexpr (std::is_same_v<P<float>, pol::streaming_llm<float>>) {
    visit("sink_tokens", p.sink_tokens);
  } else if constexpr (std::is_same_v<P<float>, pol::snapkv<float>>) {
    using pooling = pol::snapkv<float>::pooling;
    visit("window", p.window);
    visit("kernel_size", p.kernel_size);
    visit("pooling", choice<pooling>{{{"avg", pooling::avg}, {"max", pooling::max}}, p.pool});
  } else if constexpr (std::is_same_v<P<float>, pol::scissorhands<float>>) {
    visit("history_window", p.history_window);
    visit("recent_tokens", p.recent_tokens);
  } else if constexpr (std::is_same_v<P<float>, pol::priority_lru<float>>) {
    visit("region_priority", p.region_priority);
    visit("refresh_threshold", p.refresh_threshold);
  } else if constexpr (std::is_same_v<P<float>, pol::random<float>>) {
    visit("seed", p.seed);
  } else {
    static_assert(std::is_empty_v<typename P<float>::params_type>, "a policy's parameters are missing here");
  }
}

/// Policy P's parameters from `source` (defaults for what it omits); config_error for a key P does not have.
template <template <class> class P>
typename P<float>::params_type params_from(param_source& source) {
  typename P<float>::params_type p{};
  const std::string policy(P<float>::name);
  std::string known;
  visit_params<P>(p, [&](const char* key, auto&& member) {
    known += (known.empty() ? "" : ", ") + std::string(key);
    using M = std::remove_cvref_t<decltype(member)>;
    if constexpr (requires { member.values; }) {
      if (!source.has(key)) return;
      std::string given;
      source.take(key, given);
      std::string names;
      for (const auto& [name, value] : member.values) {
        if (given == name) {
          member.out = value;
          return;
        }
        names += (names.empty() ? "" : " or ") + std::string(name);
      }
      throw md::config_error(policy + " " + key + " = '" + given + "' (" + names + ")");
    } else if constexpr (std::is_unsigned_v<M> && !std::is_same_v<M, bool>) {
      std::uint64_t value = member;  // every unsigned parameter (counts, sizes, seeds) as one kind
      source.take(key, value);
      member = static_cast<M>(value);
    } else {
      source.take(key, member);
    }
  });
  const auto rest = source.unused();
  if (!rest.empty()) {
    std::string names;
    for (const auto& k : rest) names += (names.empty() ? "" : ", ") + k;
    throw md::config_error("policy " + policy + " has no parameter " + names +
                           " (its parameters: " + (known.empty() ? std::string("none") : known) + ")");
  }
  return p;
}

}  // namespace memdecay_bindings

#endif  // MEMDECAY_BINDINGS_COMMON_POLICY_PARAMS_HPP
