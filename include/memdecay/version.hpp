// SPDX-License-Identifier: Apache-2.0
// memdecay: the library version. Kept in step with project(VERSION ...) in CMakeLists.txt;
// tests/unit/version_test.cpp checks that the two agree.
#ifndef MEMDECAY_VERSION_HPP
#define MEMDECAY_VERSION_HPP

#define MEMDECAY_VERSION_MAJOR 0  // incompatible API changes
#define MEMDECAY_VERSION_MINOR 1  // backwards-compatible additions
#define MEMDECAY_VERSION_PATCH 0  // backwards-compatible fixes
#define MEMDECAY_VERSION_STRING "0.1.0"

namespace memdecay {
/// The library version as numbers, for run-time checks (e.g. a calibration file's provenance).
struct version_info {
  int major;
  int minor;
  int patch;
};
inline constexpr version_info version{MEMDECAY_VERSION_MAJOR, MEMDECAY_VERSION_MINOR, MEMDECAY_VERSION_PATCH};
inline constexpr const char* version_string = MEMDECAY_VERSION_STRING;
}  // namespace memdecay

#endif  // MEMDECAY_VERSION_HPP
