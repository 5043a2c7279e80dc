#include "device/nvme/dma_arena.h"

#include <sys/mman.h>

#include <cstring>

#include "common/status_macros.h"
#include "device/nvme/nvme_spec.h"
#include "env/fork_guard.h"
#include "logging/log.h"

namespace tpushim::nvme_internal {

DmaArena::~DmaArena() {
  if (base_ == nullptr) return;
  if (mapped_) {
    absl::Status s = vfio_->UnmapDma(iova_, size_);
    if (!s.ok()) LOG(WARNING) << "Unmapping the NVMe DMA arena: " << s;
  }
  ForgetForkExclusion(base_);
  absl::Status s = os_->Munmap(base_, size_);
  if (!s.ok()) LOG(WARNING) << "Unmapping the NVMe DMA arena: " << s;
}

absl::Status DmaArena::Create(uint64_t size) {
  size_ = (size + kPage - 1) / kPage * kPage;
  TPUSHIM_ASSIGN_OR_RETURN(
      void* p, os_->Mmap(nullptr, size_, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0));
  base_ = static_cast<char*>(p);
  // Pinned by its IOMMU mapping: a fork() child would get a copy of every
  // page at fork() itself.
  absl::Status excluded =
      ExcludeFromFork(*os_, base_, size_, "the NVMe DMA arena");
  if (!excluded.ok()) {
    LOG(WARNING) << excluded
                 << "; a fork() child will get a copy of it at fork()";
  }
  absl::StatusOr<uint64_t> iova = vfio_->MapDma(base_, size_);
  if (!iova.ok()) {
    ForgetForkExclusion(base_);
    (void)os_->Munmap(base_, size_);
    base_ = nullptr;
    return iova.status();
  }
  iova_ = *iova;
  mapped_ = true;
  return absl::OkStatus();
}

absl::StatusOr<DmaArena::Slice> DmaArena::Take(uint64_t bytes) {
  bytes = (bytes + kPage - 1) / kPage * kPage;
  if (used_ + bytes > size_) {
    return absl::InternalError("NVMe DMA arena is too small");
  }
  Slice s{base_ + used_, iova_ + used_};
  used_ += bytes;
  std::memset(s.host, 0, bytes);
  return s;
}

}  // namespace tpushim::nvme_internal
