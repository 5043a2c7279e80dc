#include "common/page_hull.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace tpushim {
namespace {

const void* At(uintptr_t a) { return reinterpret_cast<const void*>(a); }

TEST(PageHullTest, AlignedRangeIsItsOwnHull) {
  const PageHull h = PageHull::Of(At(0x10000), 0x2000, 4096);
  EXPECT_EQ(h.begin, 0x10000u);
  EXPECT_EQ(h.end, 0x12000u);
  EXPECT_EQ(h.length(), 0x2000u);
  EXPECT_EQ(h.start(), At(0x10000));
}

TEST(PageHullTest, UnalignedRangeRoundsOutBothEnds) {
  // One byte before a page boundary to one byte after the next: 3 pages.
  const PageHull h = PageHull::Of(At(0x10fff), 0x1002, 4096);
  EXPECT_EQ(h.begin, 0x10000u);
  EXPECT_EQ(h.end, 0x13000u);
}

TEST(PageHullTest, OneByteIsOnePage) {
  const PageHull h = PageHull::Of(At(0x10123), 1, 4096);
  EXPECT_EQ(h.begin, 0x10000u);
  EXPECT_EQ(h.length(), 4096u);
}

TEST(PageHullTest, HugePages) {
  const PageHull h = PageHull::Of(At((2u << 20) + 5), 3u << 20, 2u << 20);
  EXPECT_EQ(h.begin, 2u << 20);
  EXPECT_EQ(h.end, 6u << 20);
}

}  // namespace
}  // namespace tpushim
