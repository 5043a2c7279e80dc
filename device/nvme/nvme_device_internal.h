// The NVMe engine's inside (device/nvme/nvme_device.h is its face): the
// constants both halves of the engine use, what Identify told (Identity),
// 32-bit MMIO access to BAR0, and the class NvmeDevice, whose methods are
// defined by job:
//
//   nvme_device.cc   bring-up and teardown: VFIO and BAR0, controller
//                    disable and enable, the admin queue, Identify, I/O
//                    queue creation, the shutdown notification; device
//                    memory and host windows; OpenNvmeDevices
//   nvme_io.cc       the I/O path: Submit, checking a descriptor (Start),
//                    PRP lists, issuing commands, reaping completions, the
//                    worker threads, Shutdown
//
// The NVMe interface itself (registers, entry layouts, opcodes) is in
// device/nvme/nvme_spec.h, the DMA memory in device/nvme/dma_arena.h.
//
// Thread-safety: as Device. The admin queue and the members set by Open are
// used by one thread at a time (start-up, teardown); each I/O Queue's
// members say which lock guards them.

#ifndef TPUSHIM_DEVICE_NVME_NVME_DEVICE_INTERNAL_H_
#define TPUSHIM_DEVICE_NVME_NVME_DEVICE_INTERNAL_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "allocator/region_allocator.h"
#include "common/mutex.h"
#include "device/device.h"
#include "device/host_window_table.h"
#include "device/mmio.h"
#include "device/nvme/dma_arena.h"
#include "device/nvme/nvme_device.h"
#include "device/nvme/nvme_spec.h"
#include "device/vfio/vfio.h"
#include "env/device_url.h"
#include "env/fault_injection.h"
#include "env/os.h"

namespace tpushim::nvme_internal {

// Namespace 1 plays the device's memory.
inline constexpr uint32_t kNamespace = 1;
// Largest command we build: its PRP list fits one page (512 entries).
inline constexpr uint64_t kMaxCommandBytes = uint64_t{1} << 20;
// How often a worker with commands out reads CSTS for a failed controller.
inline constexpr int64_t kHealthCheckNs = 100'000'000;

// What Identify told.
struct Identity {
  std::string model;
  std::string serial;
  uint64_t max_command_bytes = kMaxCommandBytes;
  bool copy = false;  // ONCS bit 8
  uint32_t block_bytes = 512;
  uint64_t blocks = 0;
  uint32_t copy_max_blocks = 0;  // min(MSSRL, MCL), 0 = no limit known
};

class NvmeDevice final : public Device {
 public:
  NvmeDevice(const DeviceUrl& url, Os* os, FaultInjector* faults,
             NvmeTuning tuning);
  ~NvmeDevice() override;

  absl::Status Open();

  const DeviceInfo& info() const override { return info_; }
  void SetCompletionSink(DmaCompletionSink* sink) override {
    sink_.store(sink, std::memory_order_release);
  }
  absl::StatusOr<uint64_t> AllocateMemory(uint64_t size) override;
  absl::Status FreeMemory(uint64_t device_address) override;
  uint64_t MemoryInUse() const override {
    return allocator_ ? allocator_->GetStats().bytes_in_use : 0;
  }
  DeviceMemoryStats GetMemoryStats() const override {
    // Allocations are whole logical blocks (at least 512 bytes).
    return allocator_
               ? DeviceMemoryStatsOf(allocator_->GetStats(), id_.block_bytes)
               : DeviceMemoryStats{};
  }
  absl::StatusOr<HostWindowId> RegisterHostWindow(const void* base,
                                                  uint64_t length) override;
  absl::Status UnregisterHostWindow(HostWindowId window) override;
  // The IOVA range of the whole window is taken at once; its IOMMU
  // mapping grows with ExtendHostWindow, one MAP_DMA per call, and a
  // descriptor beyond what is mapped fails with OUT_OF_RANGE before it
  // reaches the controller.
  absl::StatusOr<HostWindowId> ReserveHostWindow(const void* base,
                                                 uint64_t length) override;
  absl::Status ExtendHostWindow(HostWindowId window, uint64_t usable) override;
  size_t Submit(DmaDirection direction,
                absl::Span<const DmaDescriptor> descriptors) override;
  uint32_t InFlight(DmaDirection direction) const override {
    return queues_[static_cast<int>(direction)]->in_flight.load(
        std::memory_order_acquire);
  }
  void Shutdown() override;

 private:
  // A descriptor being carried out.
  struct Pending {
    DmaDescriptor d;
    uint64_t host_iova = 0;    // of byte 0 of the descriptor's host range
    uint64_t issued = 0;       // bytes whose commands are issued
    uint32_t outstanding = 0;  // commands issued and not completed
    bool started = false;
    bool queued = false;  // in Queue::to_issue
    // Device to device with overlapping source and destination (and not
    // the same range): its commands go one at a time, from the end when
    // the destination lies above the source, each Copy no longer than the
    // distance between them (so that its own ranges do not overlap).
    bool overlapping = false;
    bool from_end = false;
    absl::Status status;
    int64_t start_ns = 0;
  };
  enum class Stage : uint8_t { kData, kBounceRead, kBounceWrite };
  struct Command {
    uint32_t slot = 0;  // Pending slot
    Stage stage = Stage::kData;
    uint64_t lba = 0;
    uint64_t dest_lba = 0;  // kBounceRead: where the Write goes
    uint32_t blocks = 0;
    uint32_t bounce = 0;    // bounce slot
    std::string injected;   // the iommu fault's note, if one fired
    int64_t issued_ns = 0;  // when it went out; 0 while the id is free
  };
  struct Queue {
    Queue(DmaDirection d, uint16_t id) : direction(d), qid(id) {}
    const DmaDirection direction;
    const uint16_t qid;
    uint32_t depth = 0;
    uint32_t max_outstanding = 0;
    Sqe* sq = nullptr;
    uint64_t sq_iova = 0;
    Cqe* cq = nullptr;
    uint64_t cq_iova = 0;
    char* prp_lists = nullptr;  // one page per command id
    uint64_t prp_lists_iova = 0;
    int irq_fd = -1;  // MSI-X eventfd, -1 when polling
    int wake_fd = -1;
    std::atomic<uint32_t> in_flight{0};
    std::thread worker;

    Mutex mu;
    std::vector<Pending> slots ABSL_GUARDED_BY(mu);
    std::vector<uint32_t> free_slots ABSL_GUARDED_BY(mu);
    std::deque<uint32_t> to_issue ABSL_GUARDED_BY(mu);  // ring order
    std::vector<Command> commands ABSL_GUARDED_BY(mu);  // by command id
    std::vector<uint16_t> free_cids ABSL_GUARDED_BY(mu);
    std::vector<uint32_t> free_bounce ABSL_GUARDED_BY(mu);
    uint32_t outstanding ABSL_GUARDED_BY(mu) = 0;
    uint32_t sq_tail ABSL_GUARDED_BY(mu) = 0;
    uint32_t cq_head ABSL_GUARDED_BY(mu) = 0;
    uint16_t phase ABSL_GUARDED_BY(mu) = 1;
    bool idle ABSL_GUARDED_BY(mu) = true;
    bool shutdown ABSL_GUARDED_BY(mu) = false;
    std::vector<DmaCompletion> done ABSL_GUARDED_BY(mu);
  };
  // What a host window is in the IOMMU.
  struct Mapping {
    uint64_t iova = 0;         // of the window's first byte
    uint64_t mapped_iova = 0;  // of the page hull MapDma mapped
    uint64_t mapped_bytes = 0;
    // A reserved window (ReserveHostWindow): the bytes from its start that
    // are mapped so far; null for a window mapped whole. Owned by
    // growing_windows_, freed when the window is unregistered.
    std::atomic<uint64_t>* usable = nullptr;
  };

  // Start-up steps.
  absl::Status DisableController();
  absl::StatusOr<Cqe> AdminCommand(Sqe sqe, absl::string_view what);
  absl::Status Identify();
  absl::Status CreateQueues();
  absl::Status WaitReady(bool ready, absl::string_view why);

  // The I/O path; REQUIRES q.mu.
  void Issue(Queue& q) ABSL_EXCLUSIVE_LOCKS_REQUIRED(q.mu);
  bool IssueOne(Queue& q, uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(q.mu);
  void WriteCommand(Queue& q, uint16_t cid, const Sqe& sqe)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(q.mu);
  void Reap(Queue& q) ABSL_EXCLUSIVE_LOCKS_REQUIRED(q.mu);
  void Finish(Queue& q, uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(q.mu);
  void Fail(Pending& p, absl::Status status);
  absl::Status Start(Queue& q, Pending& p);
  uint64_t BuildPrp(Queue& q, uint16_t cid, uint64_t iova, uint64_t bytes,
                    uint64_t* prp2) ABSL_EXCLUSIVE_LOCKS_REQUIRED(q.mu);
  void Worker(Queue& q);
  // Stops the controller under commands that never completed, once for
  // every queue: clears CC.EN and waits (CAP.TO) for CSTS.RDY = 0, after
  // which it moves no more data. True when it stopped.
  bool AbortController();
  // OK while the controller works; once CSTS says it failed (CFS), reset
  // itself (RDY = 0 without our disable) or left the bus (all ones), the
  // reason, for good: every later descriptor fails with it at once.
  absl::Status ControllerHealth();
  // The error every descriptor gets once the controller is broken.
  absl::Status Unusable();
  // DEADLINE_EXCEEDED (and the controller broken for good) when a command
  // of `q` has been out longer than the command timeout.
  absl::Status CheckCommandAges(Queue& q);
  // Stops the controller (AbortController) and fails every command `q`
  // has out with `why`.
  void AbortOutstanding(Queue& q, const absl::Status& why);
  // The controller's registers (BAR0), with the ordering device/mmio.h
  // gives: a doorbell write comes after the entries it publishes.
  Mmio regs() const { return Mmio(bar_.base, bar_.size); }
  // Rings queue `qid`'s submission (tail) or completion (head) doorbell.
  void RingDoorbell(uint16_t qid, bool completion, uint32_t value) const {
    regs().Write32(
        static_cast<uint32_t>(kDoorbells + (2 * qid + (completion ? 1 : 0)) *
                                               doorbell_stride_),
        value);
  }

  const DeviceUrl url_;
  Os* const os_;
  FaultInjector* const faults_;
  const int64_t command_timeout_ns_;
  DeviceInfo info_;
  std::unique_ptr<VfioDevice> vfio_;
  VfioDevice::Bar bar_;
  uint64_t cap_ = 0;
  uint32_t doorbell_stride_ = 4;
  int64_t ready_timeout_ns_ = 0;
  bool enabled_ = false;
  Identity id_;
  bool use_copy_ = false;
  std::unique_ptr<DmaArena> arena_;
  // The admin queue: used by one thread at a time (start-up, teardown).
  Sqe* admin_sq_ = nullptr;
  Cqe* admin_cq_ = nullptr;
  char* admin_buffer_ = nullptr;  // one page for Identify data
  uint64_t admin_buffer_iova_ = 0;
  uint32_t admin_sq_tail_ = 0;
  uint32_t admin_cq_head_ = 0;
  uint16_t admin_phase_ = 1;
  uint16_t admin_cid_ = 0;
  uint64_t bounce_iova_ = 0;
  std::vector<int> irq_fds_;
  bool created_queues_ = false;
  // Set when a worker disabled the controller to stop commands that never
  // completed: teardown then skips the orderly admin commands.
  std::atomic<bool> controller_disabled_{false};
  Mutex abort_mu_;  // held across AbortController's wait
  std::optional<bool> abort_stopped_ ABSL_GUARDED_BY(abort_mu_);
  // Why the controller is unusable (OK while it works); broken_set_ says it
  // is not OK without taking the lock.
  Mutex broken_mu_;
  absl::Status broken_ ABSL_GUARDED_BY(broken_mu_);
  std::atomic<bool> broken_set_{false};

  std::atomic<DmaCompletionSink*> sink_{nullptr};
  std::unique_ptr<RegionAllocator> allocator_;
  HostWindowTable<Mapping> windows_;
  Mutex growing_mu_;
  std::map<HostWindowId, std::unique_ptr<std::atomic<uint64_t>>>
      growing_windows_ ABSL_GUARDED_BY(growing_mu_);
  std::array<std::unique_ptr<Queue>, kDmaDirectionCount> queues_;
  Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
};

}  // namespace tpushim::nvme_internal

#endif  // TPUSHIM_DEVICE_NVME_NVME_DEVICE_INTERNAL_H_
