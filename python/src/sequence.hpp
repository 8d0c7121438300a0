// SPDX-License-Identifier: Apache-2.0
// Building a Python Sequence: a policy by name, its parameters from keyword arguments.
#ifndef MEMDECAY_PYTHON_SEQUENCE_HPP
#define MEMDECAY_PYTHON_SEQUENCE_HPP

#include <memory>
#include <string>

#include "sequence_handle.hpp"

namespace memdecay_python {

/// A new sequence of `policy` (config_error for an unknown policy or parameter).
std::shared_ptr<sequence_handle> make_sequence(const std::string& policy, const md::config& cfg,
                                               const py::dict& params);

}  // namespace memdecay_python

#endif  // MEMDECAY_PYTHON_SEQUENCE_HPP
