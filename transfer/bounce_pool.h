// BouncePool: the transfer engine's own small pinned staging memory, for
// when the premapped region is off (TPU_PREMAPPED_BUFFER_SIZE=0).
//
// Without the region, every transfer from pageable memory would pin the
// caller's pages for its duration: tens of microseconds of system calls
// for a 4 KiB copy, and a wait behind whatever else is pinning. The pool is
// mapped, populated and locked once when the engine starts (mlock counts
// against RLIMIT_MEMLOCK, as the region does), excluded from fork() like
// the region, and registered with every device; small transfers are
// staged through it exactly as through the region's staging buffers.
// Allocation within it is the region's exact-size allocator
// (allocator/region_allocator.h), with TryAllocate only: a full pool is an
// ordinary wait, never an error or a log line.
//
// Errors from Create: the mmap or, with TPUSHIM_MLOCK=required, mlock
// failure, each naming the pool; with TPUSHIM_MLOCK=on a failed mlock
// leaves the pool unlocked (locked() is false), and a failed fork advice
// leaves it shared with fork() children (fork_error()): the caller says so
// at WARNING. Nothing is left mapped on error.
//
// Thread-safety: the allocator is thread-safe; the rest is constant after
// Create.
//
//   TPUSHIM_ASSIGN_OR_RETURN(std::unique_ptr<BouncePool> pool,
//       BouncePool::Create(os, 4 << 20, MlockMode::kOn));
//   char* p = static_cast<char*>(pool->allocator().TryAllocate(4096));

#ifndef TPUSHIM_TRANSFER_BOUNCE_POOL_H_
#define TPUSHIM_TRANSFER_BOUNCE_POOL_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "allocator/region_allocator.h"
#include "env/options.h"
#include "env/os.h"

namespace tpushim {

class BouncePool {
 public:
  // `bytes` (rounded up to whole pages) of pinned memory; `mlock` as
  // TPUSHIM_MLOCK says. `os` must outlive the pool.
  static absl::StatusOr<std::unique_ptr<BouncePool>> Create(Os* os,
                                                            uint64_t bytes,
                                                            MlockMode mlock);

  BouncePool(const BouncePool&) = delete;
  BouncePool& operator=(const BouncePool&) = delete;
  // Unlocks and unmaps. REQUIRES: nothing allocated, no device window left.
  ~BouncePool();

  char* base() const { return base_; }
  uint64_t size() const { return size_; }
  // Whether the pages are locked in memory (mlock succeeded).
  bool locked() const { return locked_; }
  // Why they are not, when mlock was tried and failed (OK otherwise).
  const absl::Status& lock_error() const { return lock_error_; }
  // Why the pool is shared with fork() children after all (OK otherwise).
  const absl::Status& fork_error() const { return fork_error_; }
  RegionAllocator& allocator() { return *allocator_; }

 private:
  BouncePool(Os* os, char* base, uint64_t size);

  // Constant after Create.
  Os* const os_;
  char* const base_;
  const uint64_t size_;
  bool locked_ = false;
  absl::Status lock_error_;
  absl::Status fork_error_;
  std::unique_ptr<RegionAllocator> allocator_;
};

}  // namespace tpushim

#endif  // TPUSHIM_TRANSFER_BOUNCE_POOL_H_
