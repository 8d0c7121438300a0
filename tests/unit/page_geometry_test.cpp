// Tests for page_geometry.hpp: compile-time and run-time page sizes agree; invalid sizes are rejected.
#include <gtest/gtest.h>

#include <memdecay/core/page_geometry.hpp>

namespace md = memdecay;

static_assert(md::page_geometry<16>::size() == 16);
static_assert(md::page_geometry<16>::shift() == 4);
static_assert(md::page_geometry<16>::page_of(31) == 1);
static_assert(md::page_geometry<16>::pages_for(33) == 3);
static_assert(md::page_geometry<1>::pages_for(5) == 5);

TEST(PageGeometry, StaticAndDynamicAgree) {
  for (std::size_t p : {1u, 2u, 16u, 64u, 256u}) {
    const md::page_geometry<md::dynamic_page_size> g(p);
    EXPECT_EQ(g.size(), p);
    for (std::size_t n = 0; n < 600; n += 7) {
      EXPECT_EQ(g.pages_for(n), (n + p - 1) / p);
      EXPECT_EQ(g.page_of(n), n / p);
    }
  }
  const md::page_geometry<32> s;
  const md::page_geometry<md::dynamic_page_size> d(32);
  for (std::size_t n = 0; n < 1000; ++n) EXPECT_EQ(s.pages_for(n), d.pages_for(n));
}

TEST(PageGeometry, RejectsSizesThatAreNotPowersOfTwo) {
  EXPECT_THROW(md::page_geometry<md::dynamic_page_size>(0), md::config_error);
  EXPECT_THROW(md::page_geometry<md::dynamic_page_size>(24), md::config_error);
  EXPECT_THROW(md::page_geometry<16>(32), md::config_error);  // a config that disagrees with the compiled size
  EXPECT_NO_THROW(md::page_geometry<16>(16));
}
