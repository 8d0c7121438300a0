// SPDX-License-Identifier: Apache-2.0
// The C API's handles and the rules every entry point follows: the C++ exceptions become status codes and
// messages (per handle and per thread) inside guarded(), arrays go out through copy_out(), and nothing throws
// across the boundary.
#ifndef MEMDECAY_C_SRC_HANDLES_HPP
#define MEMDECAY_C_SRC_HANDLES_HPP

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include <memdecay/c/memdecay.h>
#include <memdecay/core/config.hpp>
#include <memdecay/detail/error.hpp>

#include "common/manager_handle.hpp"
#include "common/sequence_handle.hpp"

namespace memdecay_c {

namespace md = memdecay;
using memdecay_bindings::global_plan;
using memdecay_bindings::manager_handle;
using memdecay_bindings::plan_type;
using memdecay_bindings::pool_type;
using memdecay_bindings::sequence_handle;

/// An error the C layer raises itself (a NULL argument, a short buffer, a failed callback).
struct c_error {
  memdecay_status status;
  std::string message;
};

[[noreturn]] inline void raise(memdecay_status status, std::string message) {
  throw c_error{status, std::move(message)};
}

/// The thread count memdecay_*_set_threads takes: 1 (the caller's thread) up to this, which no engine host
/// reaches and a mistaken count (a negative int cast to size_t) does.
inline constexpr std::size_t max_threads = 1024;

/// `threads` if it is a thread count, else MEMDECAY_INVALID_ARGUMENT naming it.
inline std::size_t thread_count(std::size_t threads) {
  if (threads == 0 || threads > max_threads)
    raise(MEMDECAY_INVALID_ARGUMENT, "threads = " + std::to_string(threads) + " (1 to " +
                                         std::to_string(max_threads) + ")");
  return threads;
}

/// MEMDECAY_CALLBACK_ERROR unless the engine's callback returned 0 (the commits with a callback, before the state
/// changes).
inline void check_engine_answer(int rc) {
  if (rc != 0)
    raise(MEMDECAY_CALLBACK_ERROR,
          "commit: the engine's remove callback returned " + std::to_string(rc) + "; nothing was committed");
}

/// Records `message` as this thread's last error (and the handle's, when there is one).
void record_error(std::string* handle_error, const char* message) noexcept;

/// Runs fn(), turning every exception into its status and message; MEMDECAY_OK when fn returns.
template <class Fn>
memdecay_status guarded(std::string* handle_error, Fn&& fn) noexcept {
  memdecay_status status = MEMDECAY_INTERNAL_ERROR;
  try {
    fn();
    return MEMDECAY_OK;
  } catch (const c_error& e) {
    status = e.status;
    record_error(handle_error, e.message.c_str());
  } catch (const md::config_error& e) {
    status = MEMDECAY_CONFIG_ERROR;
    record_error(handle_error, e.what());
  } catch (const md::input_error& e) {
    status = MEMDECAY_INPUT_ERROR;
    record_error(handle_error, e.what());
  } catch (const md::usage_error& e) {
    status = MEMDECAY_USAGE_ERROR;
    record_error(handle_error, e.what());
  } catch (const std::bad_alloc&) {
    status = MEMDECAY_OUT_OF_MEMORY;
    record_error(handle_error, "out of memory");
  } catch (const std::exception& e) {
    record_error(handle_error, e.what());
  } catch (...) {
    record_error(handle_error, "an unknown exception");
  }
  return status;
}

/// MEMDECAY_INVALID_ARGUMENT naming `name` when p is NULL.
template <class T>
T* require(T* p, const char* name) {
  if (!p) raise(MEMDECAY_INVALID_ARGUMENT, std::string(name) + " is NULL");
  return p;
}

/// The C++ rule for a memdecay_recall_heads value; MEMDECAY_INVALID_ARGUMENT naming `heads` for another value.
inline md::head_bounds head_bounds_of(memdecay_recall_heads heads) {
  if (heads == MEMDECAY_RECALL_BEST_HEAD) return md::head_bounds::max;
  if (heads == MEMDECAY_RECALL_MEAN_OF_HEADS) return md::head_bounds::mean;
  if (heads == MEMDECAY_RECALL_ESTIMATED_ATTENTION) return md::head_bounds::attention;
  raise(MEMDECAY_INVALID_ARGUMENT, "heads = " + std::to_string(static_cast<int>(heads)) +
                                       " (MEMDECAY_RECALL_BEST_HEAD, MEMDECAY_RECALL_MEAN_OF_HEADS or "
                                       "MEMDECAY_RECALL_ESTIMATED_ATTENTION)");
}

/// A C array of `count` elements (NULL only when count is 0).
template <class T>
std::span<const T> array_of(const T* p, std::size_t count, const char* name) {
  if (count && !p)
    raise(MEMDECAY_INVALID_ARGUMENT, std::string(name) + " is NULL with a count of " + std::to_string(count));
  return {p, count};
}

/// Copies `values` out through the two-call rule: *count = values.size(); a NULL buffer only asks for it.
template <class T, class U = T, class Convert>
void copy_out(const std::vector<T>& values, U* out, std::size_t capacity, std::size_t* count, const char* name,
              Convert&& convert) {
  *require(count, "count") = values.size();
  if (!out) return;
  if (capacity < values.size())
    raise(MEMDECAY_BUFFER_TOO_SMALL, std::string(name) + ": capacity " + std::to_string(capacity) + ", " +
                                         std::to_string(values.size()) + " needed");
  for (std::size_t i = 0; i < values.size(); ++i) out[i] = convert(values[i]);
}
template <class T>
void copy_out(const std::vector<T>& values, T* out, std::size_t capacity, std::size_t* count, const char* name) {
  copy_out(values, out, capacity, count, name, [](const T& v) { return v; });
}

/// A new handle, or MEMDECAY_INVALID_ARGUMENT when `out` is NULL; *out is set only on success.
template <class Handle, class... Args>
void emit(Handle** out, Args&&... args) {
  require(out, "out");
  *out = new Handle{std::forward<Args>(args)...};
}

using table_variant = std::variant<pool_type, md::vllm_block_table, md::sglang_req_to_token, md::flashinfer_csr>;

}  // namespace memdecay_c

struct memdecay_config {
  memdecay::config config;
  std::string error;
};

struct memdecay_table {
  memdecay_c::table_variant table;
  std::string error;
};

struct memdecay_sequence {
  std::shared_ptr<memdecay_c::sequence_handle> handle;
  std::string policy;
  std::string error;
  std::size_t threads = 1;  // the digest bounds' (memdecay_sequence_set_threads)
};

struct memdecay_plan {
  memdecay_c::plan_type plan;
};

struct memdecay_recall_plan {
  memdecay::recall_plan plan;
};

struct memdecay_removal {
  memdecay::page_removal<std::int32_t> removal;
};

struct memdecay_manager {
  std::shared_ptr<memdecay_c::manager_handle> handle;
  std::string error;
  std::vector<std::byte> snapshot;  // the last memdecay_manager_save's bytes
  std::size_t threads = 1;          // the step's and the recall's (memdecay_manager_set_threads)
};

struct memdecay_checkpoint {
  memdecay::snapshot::checkpoint checkpoint;
};

struct memdecay_global_plan {
  memdecay_c::global_plan plan;
  std::vector<memdecay_global_victim> victims;
};

namespace memdecay_c {

/// A sequence handle for the C API (owned, or a manager's).
memdecay_sequence* wrap_sequence(std::shared_ptr<sequence_handle> handle);

/// Calls fn with the C++ table the handle holds.
template <class Fn>
decltype(auto) with_table(memdecay_table& t, Fn&& fn) {
  return std::visit(std::forward<Fn>(fn), t.table);
}

}  // namespace memdecay_c

#endif  // MEMDECAY_C_SRC_HANDLES_HPP
