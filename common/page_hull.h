// PageHull: the smallest run of whole pages that covers a byte range — what
// mlock, munlock, madvise and an IOMMU mapping act on when given a range
// that does not start or end on a page boundary.
//
// Thread-safety: pure functions.
//
//   const PageHull hull = PageHull::Of(p, n, 4096);
//   mlock(hull.start(), hull.length());

#ifndef TPUSHIM_COMMON_PAGE_HULL_H_
#define TPUSHIM_COMMON_PAGE_HULL_H_

#include <cstdint>

namespace tpushim {

struct PageHull {
  uintptr_t begin = 0;  // page-aligned, <= the range's first byte
  uintptr_t end = 0;    // page-aligned, > the range's last byte

  // [addr, addr + length) rounded out to whole pages of `page` bytes.
  // REQUIRES: `page` is a power of two; the range does not wrap around
  // the address space once rounded up.
  static PageHull Of(const void* addr, uint64_t length, uint64_t page) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
    return PageHull{a & ~(page - 1), (a + length + page - 1) & ~(page - 1)};
  }

  void* start() const { return reinterpret_cast<void*>(begin); }
  uint64_t length() const { return end - begin; }
};

}  // namespace tpushim

#endif  // TPUSHIM_COMMON_PAGE_HULL_H_
