// SPDX-License-Identifier: Apache-2.0
// Versions, status names and the per-thread last error.
#include <cstring>

#include "handles.hpp"

#ifndef MEMDECAY_PROJECT_VERSION
#error "the build defines MEMDECAY_PROJECT_VERSION (c/CMakeLists.txt)"
#endif

namespace {
thread_local std::string thread_error;
}

void memdecay_c::record_error(std::string* handle_error, const char* message) noexcept {
  try {
    thread_error = message;
    if (handle_error) *handle_error = message;
  } catch (...) {  // out of memory for the message itself: keep what fits
    thread_error.clear();
    if (handle_error) handle_error->clear();
  }
}

extern "C" {

uint32_t memdecay_abi_version(void) { return MEMDECAY_C_ABI_VERSION; }

const char* memdecay_version(void) { return MEMDECAY_PROJECT_VERSION; }

const char* memdecay_status_name(memdecay_status status) {
  switch (status) {
    case MEMDECAY_OK: return "ok";
    case MEMDECAY_CONFIG_ERROR: return "config_error";
    case MEMDECAY_INPUT_ERROR: return "input_error";
    case MEMDECAY_USAGE_ERROR: return "usage_error";
    case MEMDECAY_BUFFER_TOO_SMALL: return "buffer_too_small";
    case MEMDECAY_CALLBACK_ERROR: return "callback_error";
    case MEMDECAY_INVALID_ARGUMENT: return "invalid_argument";
    case MEMDECAY_OUT_OF_MEMORY: return "out_of_memory";
    case MEMDECAY_INTERNAL_ERROR: return "internal_error";
    case MEMDECAY_STATUS_MAX_ENUM: break;
  }
  return "unknown_status";
}

const char* memdecay_last_error(void) { return thread_error.c_str(); }

}  // extern "C"
