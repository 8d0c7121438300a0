// SPDX-License-Identifier: Apache-2.0
// Building a Python Sequence: a policy by name, its parameters from keyword arguments.
#ifndef MEMDECAY_PYTHON_SEQUENCE_HPP
#define MEMDECAY_PYTHON_SEQUENCE_HPP

#include <memory>
#include <string>

#include "common/sequence_handle.hpp"

#include "bindings.hpp"
#include "tables.hpp"

namespace memdecay_python {

/// A policy's parameters from Python keyword arguments (a bool, int, float, str or list of int each).
class kwargs_source final : public param_source {
 public:
  explicit kwargs_source(const py::dict& kwargs) : kwargs_(kwargs) {}
  [[nodiscard]] bool has(const std::string& key) const override { return kwargs_.contains(key); }
  void take(const std::string& key, bool& out) override { take_as(key, out); }
  void take(const std::string& key, std::uint64_t& out) override { take_as(key, out); }
  void take(const std::string& key, double& out) override { take_as(key, out); }
  void take(const std::string& key, std::string& out) override { take_as(key, out); }
  void take(const std::string& key, std::vector<int>& out) override { take_as(key, out); }
  [[nodiscard]] std::vector<std::string> unused() const override;

 private:
  template <class T>
  void take_as(const std::string& key, T& out) {
    if (!kwargs_.contains(key)) return;
    out = kwargs_[py::str(key)].cast<T>();
    taken_.push_back(key);
  }
  const py::dict& kwargs_;
  std::vector<std::string> taken_;
};

/// A new sequence of `policy` (config_error for an unknown policy or parameter).
// Any float array (any shape) as contiguous float32 values: the caller's memory when it already is, one copy
// otherwise; ValueError naming `name` for what NumPy cannot make floats of.
py::array_t<float> float_values(const py::handle& obj, const char* name);
std::span<const float> values_of(const py::array_t<float>& a);
// How select_recall combines a page's bounds over the query heads, from its Python name ("max", "mean" or
// "attention"); ValueError
// naming `heads` otherwise.
md::head_bounds head_bounds_of(const std::string& heads);
std::shared_ptr<sequence_handle> make_sequence(const std::string& policy, const md::config& cfg,
                                               const py::dict& params);

}  // namespace memdecay_python

#endif  // MEMDECAY_PYTHON_SEQUENCE_HPP
