// Statistics snapshots: transfers per direction and path, queues,
// staging, the premapped region and its allocator, devices. Plain values.

#ifndef TPUSHIM_STATS_H_
#define TPUSHIM_STATS_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "tpushim/transfer.h"

namespace tpushim {

struct PathStats {
  uint64_t transfers = 0;  // completed, successfully or not
  uint64_t bytes = 0;      // of successful transfers
  uint64_t failed = 0;
  int64_t busy_ns = 0;  // summed submit-to-ready time
  // Summed start-to-ready time: without the wait for `wait_for` and for
  // earlier operations of the queue. bytes / active_ns is the mean rate of
  // one transfer once it runs (concurrent transfers each count their own
  // time, so it is not the aggregate rate).
  int64_t active_ns = 0;
};
struct QueueStats {
  int device = 0;
  DmaDirection direction = DmaDirection::kHostToDevice;
  uint64_t submitted = 0;  // operations accepted
  uint64_t completed = 0;  // ready with OK
  uint64_t failed = 0;     // ready with an error (cancel excluded)
  uint64_t cancelled = 0;
  uint64_t descriptors = 0;  // DMA descriptors completed
  uint64_t ring_full = 0;    // descriptors that waited for ring room
  uint64_t pending = 0;      // operations queued, not started
  uint64_t in_flight = 0;    // operations started, not finished
};
struct TransferStats {
  // [direction h2d/d2h][path]
  std::array<std::array<PathStats, kTransferPathCount>, 2> host;
  PathStats device_to_device;
  // Staging.
  uint64_t staging_bytes_in_flight = 0;
  uint64_t peak_staging_bytes = 0;
  uint64_t max_staging_bytes = 0;
  uint64_t staging_waits = 0;   // transfers that had to wait for room
  int64_t staging_wait_ns = 0;  // total time they waited
  // Why transfers were pinned.
  uint64_t pinned_over_threshold = 0;
  uint64_t pinned_region_off = 0;
  uint64_t pinned_staging_timeout = 0;
  // Pinned because staging space was not premapped yet
  // (TPUSHIM_PREMAP=background) or premapping stopped short of it.
  uint64_t pinned_not_premapped = 0;
  // Transfers staged whatever their size because the device cannot DMA the
  // caller's buffer where it is (not aligned to its host alignment).
  uint64_t staged_misaligned = 0;
  // With the premapped region off: transfers staged through the engine's
  // own pinned bounce pool instead of pinning the caller's pages (small
  // ones, and misaligned ones of any size), and the pool: its size (0 when
  // there is none) and whether it is locked in memory.
  uint64_t staged_bounce = 0;
  uint64_t bounce_pool_bytes = 0;
  bool bounce_pool_locked = false;
  // Caller pages pinned right now, registered host memory included.
  uint64_t pinned_bytes_now = 0;
  // Device memory.
  uint64_t device_buffers_live = 0;
  uint64_t device_bytes_live = 0;
  uint64_t events_pending = 0;  // operations not yet ready
  uint64_t callbacks_run = 0;
  std::vector<QueueStats> queues;  // device-major, then direction
  // Registered host memory (System::RegisterHostMemory): the zero-copy
  // transfers, per direction (h2d, d2h), whose host range lay in a
  // registration rather than the region (counted in host[d][kZeroCopy]
  // too: transfers completed, bytes of the successful ones), and the
  // registrations live now with their bytes.
  std::array<uint64_t, 2> zero_copy_registered_transfers{};
  std::array<uint64_t, 2> zero_copy_registered_bytes{};
  uint64_t registrations_live = 0;
  uint64_t registered_bytes = 0;
};

// The premapped region and its allocator.
struct RegionStats {
  bool enabled = false;  // TPU_PREMAPPED_BUFFER_SIZE > 0
  uint64_t capacity_bytes = 0;
  uint64_t threshold_bytes = 0;
  uint64_t bytes_in_use = 0;  // pinned host buffers and staging
  uint64_t peak_bytes_in_use = 0;
  uint64_t free_bytes = 0;
  uint64_t largest_free_block = 0;
  double fragmentation = 0.0;  // 1 - largest free block / free bytes
  uint64_t allocations = 0;
  uint64_t frees = 0;
  uint64_t failures = 0;  // RESOURCE_EXHAUSTED answers
  uint64_t live_allocations = 0;
  // What backs the region, as the kernel reports it after premapping
  // (not what was asked for): "4k", "thp" or "hugetlb", the page size,
  // and the bytes on huge pages (transparent huge pages may cover only
  // part of it).
  std::string page_kind;
  uint64_t page_bytes = 0;
  uint64_t huge_page_bytes = 0;
  std::string page_kind_asked;  // what TPUSHIM_HUGEPAGES led to ask for
  // In words, as the start-up log says it: "transparent huge pages",
  // "4 KiB pages (transparent huge pages advised but not given)", ...
  std::string page_description;
  int numa_node = 0;        // where its pages are
  std::string numa_policy;  // "bind", "default", ... or "unknown"
  int prefault_threads = 0;
  // Whether the kernel holds the region locked (mlock): the lock took and,
  // once the region is premapped, covers all of it. Locked-on-fault counts:
  // with TPUSHIM_PREMAP=background the region is locked from creation on,
  // each page as it is populated.
  bool locked = false;
  // Bytes the kernel holds resident and locked: read back once premapped;
  // until then the premapped prefix (`ready_bytes`) of a locked region.
  uint64_t locked_bytes = 0;
  // Why the region is not locked, with the status of what stopped it: the
  // memlock limit, the failed mlock call, or what the kernel holds after a
  // call that succeeded ("" when it is locked, and under
  // TPUSHIM_MLOCK=off, which does not try).
  std::string lock_error;
  // Until the region was premapped (with TPUSHIM_PREMAP=background, after
  // System::Create returned; zero until then).
  absl::Duration startup_time;
  // TPUSHIM_PREMAP=background: the region is premapped behind the caller.
  bool background = false;
  // Bytes from the start that are premapped and served (all of them once
  // premapping is done), and whether that is the whole region.
  uint64_t ready_bytes = 0;
  bool premapped = false;
  // Why background premapping stopped short ("" when it did not).
  std::string premap_error;
  // Allocations that waited for more of the region to be premapped, and
  // how long they waited in all.
  uint64_t ready_waits = 0;
  absl::Duration ready_wait_time;
};

struct DeviceStats {
  int id = 0;
  std::string name;
  uint64_t hbm_bytes = 0;
  uint64_t hbm_in_use = 0;  // what the device's allocator holds
  // Live device buffers: their sizes in their layouts (a byte buffer's
  // size) and the bytes of their data, with the peaks of both since
  // start-up. For byte buffers the two are equal.
  uint64_t buffers_live = 0;
  uint64_t padded_bytes_in_use = 0;
  uint64_t unpadded_bytes_in_use = 0;
  uint64_t peak_padded_bytes = 0;
  uint64_t peak_unpadded_bytes = 0;
  uint64_t hbm_free = 0;
  uint64_t largest_free_block = 0;
  double fragmentation = 0.0;  // 1 - largest free block / free bytes
  // Buffers allocated since start-up, and the largest (its size in its
  // layout), as PJRT's memory statistics count them.
  uint64_t num_allocs = 0;
  uint64_t largest_alloc_size = 0;
};

struct SystemStats {
  RegionStats region;
  TransferStats transfers;
  std::vector<DeviceStats> devices;
};

}  // namespace tpushim

#endif  // TPUSHIM_STATS_H_
