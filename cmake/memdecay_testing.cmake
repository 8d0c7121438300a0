# SPDX-License-Identifier: Apache-2.0
# What every directory of test programs includes (tests/, and tests/fuzz/, which the top-level CMakeLists.txt adds
# first). GoogleTest is found here only: consumers of the library never need it. find_package's targets are
# visible in the including directory only, so each directory includes this file.
find_package(GTest REQUIRED)
include(GoogleTest)

# One executable per test file (tests/<topic>_test.cpp), each one CTest test that runs all its GoogleTest cases in
# one process (--output-on-failure shows the failing cases; run the program with --gtest_filter=... for one case).
# Registering every case as its own CTest (gtest_discover_tests) started ~850 processes, 0.1-0.2 s each under the
# sanitizers: about a minute and a half of CI.
function(memdecay_add_gtest target label)
  add_test(NAME ${target} COMMAND ${target} --gtest_brief=1)
  set_tests_properties(${target} PROPERTIES LABELS ${label})
endfunction()
