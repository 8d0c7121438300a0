// Tests for version.hpp: the macros, the constants and the CMake project version agree.
#include <gtest/gtest.h>

#include <memdecay/version.hpp>

#include <string>

TEST(Version, MacrosMatchTheCMakeProjectVersion) {
  const std::string from_macros = std::to_string(MEMDECAY_VERSION_MAJOR) + "." +
                                  std::to_string(MEMDECAY_VERSION_MINOR) + "." + std::to_string(MEMDECAY_VERSION_PATCH);
  EXPECT_EQ(from_macros, MEMDECAY_PROJECT_VERSION);
  EXPECT_EQ(std::string(MEMDECAY_VERSION_STRING), MEMDECAY_PROJECT_VERSION);
  EXPECT_EQ(std::string(memdecay::version_string), MEMDECAY_PROJECT_VERSION);
}

TEST(Version, ConstantsMatchTheMacros) {
  static_assert(memdecay::version.major == MEMDECAY_VERSION_MAJOR);
  static_assert(memdecay::version.minor == MEMDECAY_VERSION_MINOR);
  static_assert(memdecay::version.patch == MEMDECAY_VERSION_PATCH);
  EXPECT_EQ(memdecay::version.minor, MEMDECAY_VERSION_MINOR);
}
