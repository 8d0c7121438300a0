// SPDX-License-Identifier: Apache-2.0
// The library's three error tiers as Python exceptions, each carrying the C++ message:
//   ConfigError (ValueError)   an invalid configuration or region table
//   InputError  (ValueError)   bad data: wrong lengths, NaN or negative attention, inconsistent page tables
//   UsageError  (RuntimeError) a misuse of the API: a stale plan, time going backwards, an unknown sequence
// The state is unchanged after any of them, as in C++.
#include <memdecay/detail/error.hpp>

#include "bindings.hpp"

namespace memdecay_python {

void bind_errors(py::module_& m) {
  py::register_exception<memdecay::config_error>(m, "ConfigError", PyExc_ValueError);
  py::register_exception<memdecay::input_error>(m, "InputError", PyExc_ValueError);
  py::register_exception<memdecay::usage_error>(m, "UsageError", PyExc_RuntimeError);
}

}  // namespace memdecay_python
