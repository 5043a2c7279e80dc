#include "transfer/bounce_pool.h"

#include <sys/mman.h>

#include <cstring>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/human_bytes.h"
#include "env/fork_guard.h"

namespace tpushim {

BouncePool::BouncePool(Os* os, char* base, uint64_t size)
    : os_(os), base_(base), size_(size) {}

absl::StatusOr<std::unique_ptr<BouncePool>> BouncePool::Create(
    Os* os, uint64_t bytes, MlockMode mlock) {
  const uint64_t page = os->PageSize();
  const uint64_t size = (bytes + page - 1) / page * page;
  if (size == 0) {
    return absl::InvalidArgumentError("the bounce pool needs at least a page");
  }
  const std::string what = absl::StrCat(
      "the transfer engine's ", HumanReadableBytes(size), " bounce pool");
  absl::StatusOr<void*> mapped = os->Mmap(nullptr, size, PROT_READ | PROT_WRITE,
                                          MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (!mapped.ok()) {
    return absl::Status(
        mapped.status().code(),
        absl::StrCat("Mapping ", what, " failed: ", mapped.status().message()));
  }
  char* base = static_cast<char*>(*mapped);
  absl::Cleanup unmap = [&] { (void)os->Munmap(base, size); };
  auto pool = std::unique_ptr<BouncePool>(new BouncePool(os, base, size));
  // Tolerated (the caller says so at WARNING): the pool works, forks are
  // only slower.
  pool->fork_error_ = ExcludeFromFork(*os, base, size, what);
  absl::Cleanup forget = [&] { ForgetForkExclusion(base); };
  if (mlock != MlockMode::kOff) {
    absl::Status locked = os->Mlock(base, size, Os::LockWhen::kNow);
    if (locked.ok()) {
      pool->locked_ = true;
    } else if (mlock == MlockMode::kRequired) {
      return absl::Status(
          locked.code(), absl::StrCat("Locking ", what,
                                      " in memory failed: ", locked.message()));
    } else {
      pool->lock_error_ = locked;
    }
  }
  if (!pool->locked_) {
    // Populated all the same: no page fault on the transfer path.
    std::memset(base, 0, size);
  }
  pool->allocator_ = std::make_unique<RegionAllocator>(
      base, size, RegionAllocator::Config{.threshold = size});
  std::move(forget).Cancel();
  std::move(unmap).Cancel();
  return pool;
}

BouncePool::~BouncePool() {
  allocator_.reset();
  if (locked_) (void)os_->Munlock(base_, size_);
  ForgetForkExclusion(base_);
  (void)os_->Munmap(base_, size_);
}

}  // namespace tpushim
