// SPDX-License-Identifier: Apache-2.0
// The _memdecay extension module; python/memdecay/__init__.py re-exports it.
#include "bindings.hpp"

PYBIND11_MODULE(_memdecay, m) {
  m.doc() = "memdecay: region-aware KV-cache eviction (C++ library bindings)";
  m.attr("__version__") = MEMDECAY_PROJECT_VERSION;
  memdecay_python::bind_errors(m);
  memdecay_python::bind_config(m);
  memdecay_python::bind_tables(m);
  memdecay_python::bind_sequence(m);
  memdecay_python::bind_manager(m);
  memdecay_python::bind_exports(m);
}
