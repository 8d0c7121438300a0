// SPDX-License-Identifier: Apache-2.0
// memdecay: the one way a multi-step commit takes back its earlier steps when a later one fails.
#ifndef MEMDECAY_DETAIL_UNDO_HPP
#define MEMDECAY_DETAIL_UNDO_HPP

#include "memdecay/detail/error.hpp"

namespace memdecay::detail {

/// Runs `step` and returns what it returns; if it throws, runs `undo` (which takes back the steps before it) and
/// rethrows. An undo that throws itself replaces the exception, so the caller still hears of the failure. Built
/// with -fno-exceptions a failing step aborts, and this is `step()`.
template <class Step, class Undo>
decltype(auto) or_undo(Step&& step, Undo&& undo) {
#if MEMDECAY_HAS_EXCEPTIONS
  try {
    return step();
  } catch (...) {
    undo();
    throw;
  }
#else
  (void)undo;
  return step();
#endif
}

}  // namespace memdecay::detail

#endif  // MEMDECAY_DETAIL_UNDO_HPP
