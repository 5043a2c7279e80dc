// The NVMe engine's DMA memory (DmaArena): one anonymous mapping,
// IOMMU-mapped once at start-up and carved into page-aligned slices for
// the queues, PRP lists, Copy ranges and bounce buffers. Slices live as
// long as the arena; its destructor undoes both mappings. `os` and `vfio`
// must outlive it.
//
//   DmaArena arena(os, vfio);
//   TPUSHIM_RETURN_IF_ERROR(arena.Create(3 * kPage));
//   TPUSHIM_ASSIGN_OR_RETURN(DmaArena::Slice sq, arena.Take(kPage));
//   // sq.host for the CPU, sq.iova for the controller
//
// Thread-safety: none; the engine carves it during start-up only.

#ifndef TPUSHIM_DEVICE_NVME_DMA_ARENA_H_
#define TPUSHIM_DEVICE_NVME_DMA_ARENA_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "device/vfio/vfio.h"
#include "env/os.h"

namespace tpushim::nvme_internal {

// Memory the controller reaches by DMA, IOMMU-mapped once: queues, PRP
// lists, Copy ranges, bounce buffers. Carved by a bump pointer at start-up.
class DmaArena {
 public:
  DmaArena(Os* os, VfioDevice* vfio) : os_(os), vfio_(vfio) {}
  DmaArena(const DmaArena&) = delete;
  DmaArena& operator=(const DmaArena&) = delete;
  ~DmaArena();

  absl::Status Create(uint64_t size);

  // `bytes` rounded up to whole pages, zeroed.
  struct Slice {
    char* host = nullptr;
    uint64_t iova = 0;
  };
  absl::StatusOr<Slice> Take(uint64_t bytes);

 private:
  Os* const os_;
  VfioDevice* const vfio_;
  char* base_ = nullptr;
  uint64_t size_ = 0;
  uint64_t iova_ = 0;
  bool mapped_ = false;
  uint64_t used_ = 0;
};

}  // namespace tpushim::nvme_internal

#endif  // TPUSHIM_DEVICE_NVME_DMA_ARENA_H_
