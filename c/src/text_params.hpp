// SPDX-License-Identifier: Apache-2.0
// A policy's parameters as the C API takes them: "key=value,key=value" text (a list is colon-separated:
// "region_priority=100:60:50"). Each value is parsed whole when its key is taken; a malformed one is a config_error
// naming the policy's key.
#ifndef MEMDECAY_C_SRC_TEXT_PARAMS_HPP
#define MEMDECAY_C_SRC_TEXT_PARAMS_HPP

#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/policy_params.hpp"

namespace memdecay_c {

class text_params final : public memdecay_bindings::param_source {
 public:
  /// Splits `text` (NULL: no parameters); config_error for an entry without '=' or a key given twice.
  explicit text_params(const char* text);
  [[nodiscard]] bool has(const std::string& key) const override { return values_.contains(key); }
  void take(const std::string& key, bool& out) override;
  void take(const std::string& key, std::uint64_t& out) override;
  void take(const std::string& key, double& out) override;
  void take(const std::string& key, std::string& out) override;
  void take(const std::string& key, std::vector<int>& out) override;
  [[nodiscard]] std::vector<std::string> unused() const override;

 private:
  const std::string* find(const std::string& key);
  std::map<std::string, std::string> values_;
  std::set<std::string> taken_;
};

}  // namespace memdecay_c

#endif  // MEMDECAY_C_SRC_TEXT_PARAMS_HPP
