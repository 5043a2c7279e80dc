// RegionAllocator: exact-size allocation from the premapped host region.
//
// A TLSF-style allocator (Masmano et al., "TLSF: a New Dynamic Memory
// Allocator for Real-Time Systems") over a fixed byte range it does not own:
// free blocks sit in size classes found in O(1) through a two-level bitmap;
// a request first looks for the best fit among the few blocks of its own
// class, then takes any block of the next non-empty class up, which is
// guaranteed to fit; freed blocks coalesce with free neighbours at once.
//
// Sizes are exact, rounded only up to the 64-byte alignment libtpu reports
// ("Premapped buffer is using alignment 64"); a call may ask for a larger
// power-of-two alignment up to 4096. All metadata lives outside the region
// (device DMA into the region can never corrupt allocator state).
//
// Errors, each RESOURCE_EXHAUSTED:
//   * size above the threshold:
//     "Attempting to allocate 8.00M, which is larger than
//      TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES=4194304 (4.00M). ..."
//   * no free block can serve it — logged at ERROR as
//     "Allocating buffer from premapped region failed with:
//      RESOURCE_EXHAUSTED: Attempting to allocate 8.00M. That was not
//      possible. There are 6.43M free." followed by details (largest free
//     block, fragmentation, region size, threshold, live allocations, a
//     hint), and, with TPUSHIM_DUMP_ON_OOM=1, a dump of the allocator.
// A size of 0, an alignment that is not a power of two in [1, 4096], and
// Free of a pointer that is not a live allocation (foreign pointer, double
// free) are INVALID_ARGUMENT and change nothing.
//
// A region populated behind the caller (TPUSHIM_PREMAP=background) is
// served from its low end as it becomes ready: the allocator is made with
// `grows`, serves nothing until Grow() says how many bytes from the start
// are ready, and an Allocate that finds no block in the ready part waits
// for more (counted in Stats) until it fits, the region is whole or
// StopGrowing() says it never will be (then: CANCELLED when the growth was
// cancelled, else the RESOURCE_EXHAUSTED text). It does not wait when
// even the whole region could not hold it with the buffers now live
// (RESOURCE_EXHAUSTED at once), nor with IfNotReady::kFail (UNAVAILABLE at
// once). TryAllocate never waits.
//
// Thread-safety: all methods are thread-safe. One Mutex guards the
// free lists; the critical sections are a few bitmap operations and one
// hash-map update, and nothing slow (logging, formatting, system calls)
// runs under it. Contains() takes no lock.
//
//   RegionAllocator alloc(base, size, {.threshold = size});
//   TPUSHIM_ASSIGN_OR_RETURN(void* p, alloc.Allocate(8 << 20));
//   ...
//   TPUSHIM_RETURN_IF_ERROR(alloc.Free(p));

#ifndef TPUSHIM_ALLOCATOR_REGION_ALLOCATOR_H_
#define TPUSHIM_ALLOCATOR_REGION_ALLOCATOR_H_

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "env/fault_injection.h"

namespace tpushim {

class RegionAllocator {
 public:
  static constexpr size_t kAlignment = 64;
  static constexpr size_t kMaxAlignment = 4096;

  // What the allocator serves, which decides its error texts.
  enum class Kind {
    // The premapped host region: errors name the TPU_PREMAPPED_* variables
    // and are logged as "Allocating buffer from premapped region failed
    // with: ...".
    kPremappedHost,
    // A device's memory: running out is XLA's
    // "Error allocating device buffer: Attempting to allocate 8.00M. That
    // was not possible. There are 6.43M free.; (0x0x1_HBM0)", with the
    // details logged at ERROR on a line of their own.
    kDeviceMemory,
  };

  struct Config {
    Kind kind = Kind::kPremappedHost;
    // kDeviceMemory: the memory's name as XLA prints it, e.g. "0x0x1_HBM0".
    std::string memory_name{};
    // Largest single allocation; 0 means the capacity.
    uint64_t threshold = 0;
    // TPUSHIM_DUMP_ON_OOM: also log a dump of the allocator on failure.
    bool dump_on_oom = false;
    // Consulted at fault point `alloc` on every Allocate; may be null.
    // Must outlive the allocator.
    FaultInjector* faults = nullptr;
    // The range is populated behind the allocator: nothing is served until
    // Grow() (see the class comment).
    bool grows = false;
  };

  struct Stats {
    uint64_t capacity_bytes = 0;
    uint64_t threshold_bytes = 0;
    uint64_t bytes_in_use = 0;       // sum of (64-byte rounded) live sizes
    uint64_t peak_bytes_in_use = 0;  // since construction or ResetPeak
    uint64_t free_bytes = 0;
    uint64_t largest_free_block = 0;
    // 1 - largest free block / total free; 0 when nothing is free.
    double fragmentation = 0.0;
    uint64_t allocations = 0;  // successful Allocate calls
    uint64_t frees = 0;        // successful Free calls
    uint64_t failures = 0;     // Allocate calls that returned an error
    uint64_t live_allocations = 0;
    uint64_t free_blocks = 0;
    // Bytes from the start that can be served: the capacity, except while
    // a growing range is populated (or after it stopped short).
    uint64_t ready_bytes = 0;
    bool growing = false;  // Grow() is still expected
    // Allocate calls that waited for the range to grow, and how long.
    uint64_t ready_waits = 0;
    int64_t ready_wait_ns = 0;
  };

  // Manages [base, base + capacity). `base` must be 4096-aligned and
  // `capacity` a multiple of 64; the allocator never reads or writes the
  // range. REQUIRES: capacity > 0.
  RegionAllocator(void* base, uint64_t capacity, Config config);
  RegionAllocator(const RegionAllocator&) = delete;
  RegionAllocator& operator=(const RegionAllocator&) = delete;
  ~RegionAllocator();

  // What Allocate does when a growing range cannot serve a request yet
  // but could once more of it is ready.
  enum class IfNotReady {
    kWait,  // wait for Grow() or StopGrowing()
    kFail,  // UNAVAILABLE at once, naming how much is ready; not logged
  };

  // Returns `size` bytes aligned to `alignment` (at least 64). The memory
  // stays valid until Free; its contents are whatever was there before.
  absl::StatusOr<void*> Allocate(uint64_t size, size_t alignment = kAlignment,
                                 IfNotReady if_not_ready = IfNotReady::kWait);

  // Like Allocate, for transient buffers whose caller has a fallback (the
  // transfer engine's staging): returns null instead of an error when the
  // request cannot be served now (no free block, above the threshold, or an
  // injected `alloc` fault), logs nothing and counts no failure.
  // REQUIRES: size >= 1, alignment a power of two <= 4096.
  void* TryAllocate(uint64_t size, size_t alignment = kAlignment);

  // Returns a block from Allocate to the region. INVALID_ARGUMENT (and no
  // change) for anything else.
  absl::Status Free(void* ptr);

  // A growing allocator: the first `ready` bytes (rounded down to 64) can
  // be served from now on. Smaller values than before are ignored; the
  // capacity ends the growth.
  void Grow(uint64_t ready);
  // A growing allocator: no more Grow() is coming (`why` says why, e.g.
  // the premapping failed); waiting Allocate calls return at once with
  // what the ready part can give: CANCELLED naming `why` when `why` is
  // CANCELLED (the owner is going away), else RESOURCE_EXHAUSTED whose
  // text names `why`.
  void StopGrowing(const absl::Status& why);
  // Bytes from the start that can be served. Lock-free.
  uint64_t ready_bytes() const {
    return ready_atomic_.load(std::memory_order_acquire);
  }
  // Whether more is still to come from Grow(). Lock-free.
  bool growing() const {
    return growing_atomic_.load(std::memory_order_acquire);
  }

  // True when [ptr, ptr + length) lies inside the region. O(1), lock-free.
  bool Contains(const void* ptr, uint64_t length) const {
    const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
    return p >= base_ && length <= capacity_ && p - base_ <= capacity_ - length;
  }

  // The usable size of a live allocation (its size rounded up to 64), or 0
  // for anything that is not one.
  uint64_t AllocationSize(const void* ptr) const;

  Stats GetStats() const;
  void ResetPeak();

  // A BFC-style dump: per size class counts and bytes of free and used
  // blocks, the largest free blocks, and a 100-character occupancy map
  // ('#' used, '.' free, '+' partly used).
  std::string DebugDump() const;

  void* base() const { return reinterpret_cast<void*>(base_); }
  uint64_t capacity() const { return capacity_; }
  uint64_t threshold() const { return threshold_; }

 private:
  // Second-level classes per first-level class: 2^5 = 32 (worst-case
  // internal waste of a class 1/32).
  static constexpr int kSecondLevelLog2 = 5;
  static constexpr int kSecondLevelCount = 1 << kSecondLevelLog2;
  static constexpr int kFirstLevelCount = 64 - 6 - kSecondLevelLog2 + 2;
  static constexpr uint32_t kNil = ~uint32_t{0};
  // How many blocks of the request's own class are examined for a best fit
  // before taking the next class up.
  static constexpr int kBestFitProbe = 8;

  struct Block {
    uint64_t offset = 0;
    uint64_t size = 0;          // bytes, multiple of 64
    uint32_t prev_phys = kNil;  // neighbours by address
    uint32_t next_phys = kNil;
    uint32_t prev_free = kNil;  // links in its free list
    uint32_t next_free = kNil;
    bool free = false;
  };

  struct Snapshot;  // numbers for an error message, taken under mu_

  static void Mapping(uint64_t units, int* fl, int* sl);

  // Takes a block for `size` bytes at `alignment` (>= 64) and returns its
  // address, or null when no free block can serve it.
  void* TakeBlockLocked(uint64_t size, size_t alignment)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // "the premapped region" or "device memory <name>", for messages.
  std::string What() const;
  // Logs a failed Allocate at ERROR in the form of its Kind.
  void LogFailure(const absl::Status& status) const;

  uint32_t NewBlock() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks `b` free, merged with its free neighbours.
  void FreeBlockLocked(uint32_t b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseBlock(uint32_t b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void InsertFree(uint32_t b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RemoveFree(uint32_t b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A free block of at least `size` bytes, or kNil.
  uint32_t FindFree(uint64_t size) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A free block that holds `size` bytes at `alignment` once its leading
  // pad is split off, or kNil: every free block of `size`'s class and up
  // is looked at, so it runs only when FindFree's O(1) answer failed.
  uint32_t FindAlignedFit(uint64_t size, size_t alignment)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Splits `b` after its first `size` bytes and returns the new block
  // holding the rest, which is in no free list yet.
  // REQUIRES: 0 < size < blocks_[b].size, both multiples of 64.
  uint32_t SplitAt(uint32_t b, uint64_t size)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t LargestFreeLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A growing range: whether the free space at its growing end, once the
  // range is whole, holds `size` bytes at `alignment` (the only block that
  // growth enlarges; the others already failed to serve it).
  bool FitsOnceGrownLocked(uint64_t size, size_t alignment) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Snapshot TakeSnapshot() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status OutOfMemory(uint64_t size);
  // Walks every block and free list; INTERNAL naming the first defect.
  absl::Status CheckInvariantsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  friend class RegionAllocatorTestPeer;

  // Constant after construction.
  const Kind kind_;
  const std::string memory_name_;
  const uintptr_t base_;
  const uint64_t capacity_;
  const uint64_t threshold_;
  const bool dump_on_oom_;
  FaultInjector* const faults_;

  mutable Mutex mu_;
  // Protected by mu_.
  std::vector<Block> blocks_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> spare_blocks_ ABSL_GUARDED_BY(mu_);
  std::array<std::array<uint32_t, kSecondLevelCount>, kFirstLevelCount>
      free_heads_ ABSL_GUARDED_BY(mu_);
  uint64_t first_level_bitmap_ ABSL_GUARDED_BY(mu_) = 0;
  std::array<uint32_t, kFirstLevelCount> second_level_bitmap_
      ABSL_GUARDED_BY(mu_){};
  // Live allocations: offset of the returned pointer -> block.
  absl::flat_hash_map<uint64_t, uint32_t> live_ ABSL_GUARDED_BY(mu_);
  uint64_t bytes_in_use_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t peak_bytes_in_use_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t allocations_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t frees_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t failures_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t free_block_count_ ABSL_GUARDED_BY(mu_) = 0;
  // Growth: [ready_, capacity_) is one block, unready_block_, neither free
  // nor live, until it is ready.
  uint64_t ready_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t unready_block_ ABSL_GUARDED_BY(mu_) = kNil;
  bool growing_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status growth_stopped_ ABSL_GUARDED_BY(mu_);
  uint64_t ready_waits_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t ready_wait_ns_ ABSL_GUARDED_BY(mu_) = 0;
  CondVar ready_cv_;
  std::atomic<uint64_t> ready_atomic_{0};
  std::atomic<bool> growing_atomic_{false};
};

}  // namespace tpushim

#endif  // TPUSHIM_ALLOCATOR_REGION_ALLOCATOR_H_
