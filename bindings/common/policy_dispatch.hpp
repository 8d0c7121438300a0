// SPDX-License-Identifier: Apache-2.0
// The shipped policies by name, for the bindings: the Python module and the C API build sequences and managers
// through it, and the Python cross-check driver (python/tests/driver) replays episodes through the same table.
#ifndef MEMDECAY_BINDINGS_COMMON_POLICY_DISPATCH_HPP
#define MEMDECAY_BINDINGS_COMMON_POLICY_DISPATCH_HPP

#include <string>
#include <vector>

#include <memdecay/core/sequence.hpp>
#include <memdecay/detail/error.hpp>
#include <memdecay/policies/all.hpp>

namespace memdecay_bindings {

namespace md = memdecay;

/// The type of each policy's sequence.
template <template <class> class P>
using seq_of = md::policy_sequence<P>;

inline const std::vector<std::string>& policy_names() {
  static const std::vector<std::string> names = {"memdecay",     "h2o",      "streaming_llm", "tova",  "snapkv",
                                                 "scissorhands", "norm_sum", "priority_lru",  "random"};
  return names;
}

/// Calls fn.template operator()<Policy>() for the policy named `name` (config_error for an unknown name).
template <class Fn>
decltype(auto) with_policy(const std::string& name, Fn&& fn) {
  namespace pol = md::policies;
  if (name == "memdecay") return fn.template operator()<pol::memdecay>();
  if (name == "h2o") return fn.template operator()<pol::h2o>();
  if (name == "streaming_llm") return fn.template operator()<pol::streaming_llm>();
  if (name == "tova") return fn.template operator()<pol::tova>();
  if (name == "snapkv") return fn.template operator()<pol::snapkv>();
  if (name == "scissorhands") return fn.template operator()<pol::scissorhands>();
  if (name == "norm_sum") return fn.template operator()<pol::norm_sum>();
  if (name == "priority_lru") return fn.template operator()<pol::priority_lru>();
  if (name == "random") return fn.template operator()<pol::random>();
  const auto& names = policy_names();
  std::string known;
  for (std::size_t i = 0; i < names.size(); ++i)
    known += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  throw md::config_error("policy = '" + name + "' (must be " + known + ")");
}

}  // namespace memdecay_bindings

#endif  // MEMDECAY_BINDINGS_COMMON_POLICY_DISPATCH_HPP
