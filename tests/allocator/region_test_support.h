// What the allocator tests share: real, 4 KiB-aligned memory for a region
// under test, and a check of the allocator's internal invariants.

#ifndef TPUSHIM_TESTS_ALLOCATOR_REGION_TEST_SUPPORT_H_
#define TPUSHIM_TESTS_ALLOCATOR_REGION_TEST_SUPPORT_H_

#include <cstdint>
#include <cstdlib>

#include "absl/status/status.h"
#include "allocator/region_allocator.h"
#include "gtest/gtest.h"

namespace tpushim {

class RegionAllocatorTestPeer {
 public:
  static absl::Status CheckInvariants(const RegionAllocator& allocator) {
    MutexLock lock(&allocator.mu_);
    return allocator.CheckInvariantsLocked();
  }
};

namespace testutil {

// Real, 4 KiB-aligned memory for a region under test.
class TestRegion {
 public:
  explicit TestRegion(uint64_t size)
      // aligned_alloc wants a multiple of the alignment (ASan insists).
      : size_(size),
        memory_(std::aligned_alloc(4096, (size + 4095) / 4096 * 4096)) {}
  ~TestRegion() { std::free(memory_); }
  TestRegion(const TestRegion&) = delete;
  TestRegion& operator=(const TestRegion&) = delete;
  void* base() const { return memory_; }
  uint64_t size() const { return size_; }

 private:
  uint64_t size_;
  void* memory_;
};

inline void ExpectConsistent(const RegionAllocator& allocator) {
  const absl::Status s = RegionAllocatorTestPeer::CheckInvariants(allocator);
  EXPECT_TRUE(s.ok()) << s;
}

}  // namespace testutil
}  // namespace tpushim

#endif  // TPUSHIM_TESTS_ALLOCATOR_REGION_TEST_SUPPORT_H_
