// SPDX-License-Identifier: Apache-2.0
// The translation unit that owns the test programs' shared precompiled header (tests/CMakeLists.txt,
// MEMDECAY_TEST_PCH): CMake builds the header with this target's flags, and the tests reuse it.
