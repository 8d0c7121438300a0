// SPDX-License-Identifier: Apache-2.0
// memdecay: the error tiers and the out-of-line functions that raise them.
//
// Three tiers, each its own exception type so an engine can tell them apart:
//   config_error  (std::invalid_argument): a configuration or region table is invalid. Raised on construction.
//   input_error   (std::invalid_argument): a call's data is bad (wrong length, NaN or negative mass, unknown
//                 region id, a clock that goes backwards). The call is rejected and the state is unchanged.
//   usage_error   (std::logic_error): the API is used out of order (committing a stale or forged selection,
//                 a page table that disagrees with the state). The call is rejected and the state is unchanged.
// The throws live in [[noreturn]] out-of-line functions so the callers stay small and inlinable. Built with
// -fno-exceptions, each prints its message to stderr and calls std::abort().
#ifndef MEMDECAY_DETAIL_ERROR_HPP
#define MEMDECAY_DETAIL_ERROR_HPP

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

#if defined(__cpp_exceptions) || defined(__EXCEPTIONS) || defined(_CPPUNWIND)
#define MEMDECAY_HAS_EXCEPTIONS 1
#else
#define MEMDECAY_HAS_EXCEPTIONS 0
#endif

#if defined(__GNUC__) || defined(__clang__)
#define MEMDECAY_NOINLINE __attribute__((noinline))
#else
#define MEMDECAY_NOINLINE
#endif

namespace memdecay {

/// A configuration, region table or budget is invalid. The message names the field and the value.
class config_error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// The data passed to a call is invalid. The call changed nothing.
class input_error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// The API was used out of order or with a stale handle. The call changed nothing.
class usage_error : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

namespace detail {

template <class Error>
[[noreturn]] MEMDECAY_NOINLINE inline void raise(const std::string& message) {
#if MEMDECAY_HAS_EXCEPTIONS
  throw Error(message);
#else
  std::fprintf(stderr, "memdecay: fatal: %s\n", message.c_str());
  std::abort();
#endif
}

[[noreturn]] inline void raise_config(const std::string& message) { raise<config_error>("invalid config: " + message); }
/// What every input_error's message starts with (a caller that adds context to one strips it first).
inline constexpr std::string_view input_error_prefix = "invalid input: ";
[[noreturn]] inline void raise_input(const std::string& message) {
  raise<input_error>(std::string(input_error_prefix) + message);
}
[[noreturn]] inline void raise_usage(const std::string& message) { raise<usage_error>("invalid use: " + message); }

/// Formats a number for an error message without dragging <format> (not in g++ 12) or iostreams in.
template <class T>
std::string to_text(T value) {
  if constexpr (std::is_floating_point_v<T>) {
    char buffer[64];
    std::snprintf(buffer, sizeof buffer, "%.9g", static_cast<double>(value));
    return buffer;
  } else {
    return std::to_string(value);
  }
}

}  // namespace detail
}  // namespace memdecay

#endif  // MEMDECAY_DETAIL_ERROR_HPP
