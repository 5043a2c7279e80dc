#include "device/nvme/nvme_device.h"

#include <pthread.h>
#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <deque>
#include <thread>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/region_allocator.h"
#include "common/human_bytes.h"
#include "common/mutex.h"
#include "common/status_macros.h"
#include "device/host_window_table.h"
#include "device/vfio/vfio.h"
#include "logging/log.h"

namespace tpushim {
namespace {

// ---- The NVMe interface (NVM Express Base Specification 1.4) ----------------

// Controller registers (BAR0).
constexpr uint32_t kRegCap = 0x00;  // 64-bit
constexpr uint32_t kRegVs = 0x08;
constexpr uint32_t kRegIntms = 0x0c;
constexpr uint32_t kRegCc = 0x14;
constexpr uint32_t kRegCsts = 0x1c;
constexpr uint32_t kRegAqa = 0x24;
constexpr uint32_t kRegAsq = 0x28;  // 64-bit
constexpr uint32_t kRegAcq = 0x30;  // 64-bit
constexpr uint32_t kDoorbells = 0x1000;

constexpr uint32_t kCcEnable = 1u << 0;
constexpr uint32_t kCcIosqes = 6u << 16;  // 64-byte SQ entries
constexpr uint32_t kCcIocqes = 4u << 20;  // 16-byte CQ entries
constexpr uint32_t kCcShnNormal = 1u << 14;
constexpr uint32_t kCstsReady = 1u << 0;
constexpr uint32_t kCstsFatal = 1u << 1;

// Admin commands.
constexpr uint8_t kAdminDeleteSq = 0x00;
constexpr uint8_t kAdminCreateSq = 0x01;
constexpr uint8_t kAdminDeleteCq = 0x04;
constexpr uint8_t kAdminCreateCq = 0x05;
constexpr uint8_t kAdminIdentify = 0x06;
constexpr uint8_t kAdminSetFeatures = 0x09;
constexpr uint32_t kFeatureNumberOfQueues = 0x07;

// NVM commands.
constexpr uint8_t kNvmWrite = 0x01;
constexpr uint8_t kNvmRead = 0x02;
constexpr uint8_t kNvmCopy = 0x19;

constexpr uint32_t kNamespace = 1;
constexpr uint64_t kPage = 4096;  // CC.MPS = 0
constexpr uint32_t kAdminDepth = 32;
// Largest command we build: its PRP list fits one page (512 entries).
constexpr uint64_t kMaxCommandBytes = uint64_t{1} << 20;
// Device-to-device bounce buffers (d2d=bounce or no Copy support).
constexpr uint32_t kBounceSlots = 8;
// IOMMU-map large host windows in chunks of this size, with progress.
constexpr uint64_t kMapChunkBytes = uint64_t{256} << 20;
// Descriptors per queue ring (DeviceInfo::ring_entries).
constexpr uint32_t kRingEntries = 1024;

struct Sqe {
  uint32_t cdw0 = 0;  // opcode [7:0], command id [31:16]
  uint32_t nsid = 0;
  uint32_t cdw2 = 0;
  uint32_t cdw3 = 0;
  uint64_t mptr = 0;
  uint64_t prp1 = 0;
  uint64_t prp2 = 0;
  uint32_t cdw10 = 0;
  uint32_t cdw11 = 0;
  uint32_t cdw12 = 0;
  uint32_t cdw13 = 0;
  uint32_t cdw14 = 0;
  uint32_t cdw15 = 0;
};
static_assert(sizeof(Sqe) == 64);

struct Cqe {
  uint32_t result = 0;
  uint32_t reserved = 0;
  uint16_t sq_head = 0;
  uint16_t sq_id = 0;
  uint16_t command_id = 0;
  uint16_t status = 0;  // phase [0], status field [15:1]
};
static_assert(sizeof(Cqe) == 16);

// Copy's source range entry, descriptor format 0.
struct CopyRange {
  uint64_t reserved0 = 0;
  uint64_t slba = 0;
  uint16_t nlb = 0;  // 0-based
  uint16_t reserved1 = 0;
  uint32_t reserved2 = 0;
  uint32_t eilbrt = 0;
  uint16_t elbat = 0;
  uint16_t elbatm = 0;
};
static_assert(sizeof(CopyRange) == 32);

std::string StatusName(uint16_t status_field) {
  const uint32_t sc = (status_field >> 1) & 0xff;
  const uint32_t sct = (status_field >> 9) & 0x7;
  absl::string_view name = "";
  if (sct == 0) {
    switch (sc) {
      case 0x01:
        name = "Invalid Command Opcode";
        break;
      case 0x02:
        name = "Invalid Field in Command";
        break;
      case 0x04:
        name = "Data Transfer Error";
        break;
      case 0x06:
        name = "Internal Error";
        break;
      case 0x07:
        name = "Command Abort Requested";
        break;
      case 0x08:
        name = "Command Aborted due to SQ Deletion";
        break;
      case 0x0b:
        name = "Invalid Namespace or Format";
        break;
      case 0x13:
        name = "Invalid PRP Offset";
        break;
      case 0x80:
        name = "LBA Out of Range";
        break;
      case 0x81:
        name = "Capacity Exceeded";
        break;
      default:
        break;
    }
  }
  return absl::StrFormat("%s%ssct %d, sc 0x%02x", name,
                         name.empty() ? "" : " (", sct, sc) +
         (name.empty() ? "" : ")");
}

absl::StatusCode CodeOf(uint16_t status_field) {
  const uint32_t sc = (status_field >> 1) & 0xff;
  const uint32_t sct = (status_field >> 9) & 0x7;
  if (sct == 0 && (sc == 0x80 || sc == 0x81)) {
    return absl::StatusCode::kOutOfRange;
  }
  if (sct == 0 && sc == 0x02) return absl::StatusCode::kInvalidArgument;
  return absl::StatusCode::kInternal;
}

// MMIO: 32-bit accesses only (64-bit registers as two halves, low first).
uint32_t Read32(volatile uint8_t* bar, uint32_t offset) {
  return *reinterpret_cast<volatile uint32_t*>(bar + offset);
}
void Write32(volatile uint8_t* bar, uint32_t offset, uint32_t value) {
  *reinterpret_cast<volatile uint32_t*>(bar + offset) = value;
}
uint64_t Read64(volatile uint8_t* bar, uint32_t offset) {
  const uint64_t low = Read32(bar, offset);
  return low | (uint64_t{Read32(bar, offset + 4)} << 32);
}
void Write64(volatile uint8_t* bar, uint32_t offset, uint64_t value) {
  Write32(bar, offset, static_cast<uint32_t>(value));
  Write32(bar, offset + 4, static_cast<uint32_t>(value >> 32));
}

// Device memory addresses as the allocator sees them: offsets from this
// made-up base (the allocator only does arithmetic on it).
char* const kDeviceMemoryBase = reinterpret_cast<char*>(uintptr_t{1} << 44);

// Memory the controller reaches by DMA, IOMMU-mapped once: queues, PRP
// lists, Copy ranges, bounce buffers. Carved by a bump pointer at start-up.
class DmaArena {
 public:
  DmaArena(Os* os, VfioDevice* vfio) : os_(os), vfio_(vfio) {}
  DmaArena(const DmaArena&) = delete;
  DmaArena& operator=(const DmaArena&) = delete;
  ~DmaArena() {
    if (base_ == nullptr) return;
    if (mapped_) {
      absl::Status s = vfio_->UnmapDma(iova_, size_);
      if (!s.ok()) LOG(WARNING) << "Unmapping the NVMe DMA arena: " << s;
    }
    absl::Status s = os_->Munmap(base_, size_);
    if (!s.ok()) LOG(WARNING) << "Unmapping the NVMe DMA arena: " << s;
  }

  absl::Status Create(uint64_t size) {
    size_ = (size + kPage - 1) / kPage * kPage;
    TPUSHIM_ASSIGN_OR_RETURN(
        void* p, os_->Mmap(nullptr, size_, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0));
    base_ = static_cast<char*>(p);
    absl::StatusOr<uint64_t> iova = vfio_->MapDma(base_, size_);
    if (!iova.ok()) {
      (void)os_->Munmap(base_, size_);
      base_ = nullptr;
      return iova.status();
    }
    iova_ = *iova;
    mapped_ = true;
    return absl::OkStatus();
  }

  // `bytes` rounded up to whole pages, zeroed.
  struct Slice {
    char* host = nullptr;
    uint64_t iova = 0;
  };
  absl::StatusOr<Slice> Take(uint64_t bytes) {
    bytes = (bytes + kPage - 1) / kPage * kPage;
    if (used_ + bytes > size_) {
      return absl::InternalError("NVMe DMA arena is too small");
    }
    Slice s{base_ + used_, iova_ + used_};
    used_ += bytes;
    std::memset(s.host, 0, bytes);
    return s;
  }

 private:
  Os* const os_;
  VfioDevice* const vfio_;
  char* base_ = nullptr;
  uint64_t size_ = 0;
  uint64_t iova_ = 0;
  bool mapped_ = false;
  uint64_t used_ = 0;
};

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
  NvmeDevice(const DeviceUrl& url, Os* os, FaultInjector* faults);
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
  absl::StatusOr<HostWindowId> RegisterHostWindow(const void* base,
                                                  uint64_t length) override;
  absl::Status UnregisterHostWindow(HostWindowId window) override;
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
    uint32_t bounce = 0;   // bounce slot
    std::string injected;  // the iommu fault's note, if one fired
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
  uint32_t* Doorbell(uint16_t qid, bool completion) const {
    return reinterpret_cast<uint32_t*>(
        const_cast<uint8_t*>(bar_.base) + kDoorbells +
        (2 * qid + (completion ? 1 : 0)) * doorbell_stride_);
  }

  const DeviceUrl url_;
  Os* const os_;
  FaultInjector* const faults_;
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

  std::atomic<DmaCompletionSink*> sink_{nullptr};
  std::unique_ptr<RegionAllocator> allocator_;
  HostWindowTable<Mapping> windows_;
  std::array<std::unique_ptr<Queue>, kDmaDirectionCount> queues_;
  Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
};

NvmeDevice::NvmeDevice(const DeviceUrl& url, Os* os, FaultInjector* faults)
    : url_(url),
      os_(os),
      faults_(faults),
      windows_(absl::StrCat("vfio:", url.pci_address.ToString())) {
  for (int d = 0; d < kDmaDirectionCount; ++d) {
    queues_[d] = std::make_unique<Queue>(static_cast<DmaDirection>(d),
                                         static_cast<uint16_t>(d + 1));
  }
}

absl::Status NvmeDevice::WaitReady(bool ready, absl::string_view why) {
  const int64_t deadline = os_->MonotonicNanos() + ready_timeout_ns_;
  while (true) {
    const uint32_t csts = Read32(bar_.base, kRegCsts);
    if (csts == 0xffffffff) {
      return absl::UnavailableError(absl::StrCat(
          "NVMe controller ", vfio_->name(),
          " reads as all ones: it is gone from the bus (surprise removal or "
          "a failed reset)"));
    }
    if (((csts & kCstsReady) != 0) == ready) return absl::OkStatus();
    if (ready && (csts & kCstsFatal) != 0) {
      return absl::InternalError(absl::StrCat(
          "NVMe controller ", vfio_->name(), " reports a fatal status while ",
          why, " (CSTS=0x", absl::Hex(csts), ")"));
    }
    if (os_->MonotonicNanos() > deadline) {
      return absl::DeadlineExceededError(absl::StrFormat(
          "NVMe controller %s did not become %s within %.1f s (CAP.TO) while "
          "%s (CSTS=0x%x)",
          vfio_->name(), ready ? "ready" : "disabled",
          static_cast<double>(ready_timeout_ns_) / 1e9, why, csts));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

absl::Status NvmeDevice::DisableController() {
  const uint32_t cc = Read32(bar_.base, kRegCc);
  if ((cc & kCcEnable) != 0) Write32(bar_.base, kRegCc, cc & ~kCcEnable);
  enabled_ = false;
  return WaitReady(false, "disabling it");
}

absl::StatusOr<Cqe> NvmeDevice::AdminCommand(Sqe sqe, absl::string_view what) {
  const uint16_t cid = admin_cid_++;
  sqe.cdw0 = (sqe.cdw0 & 0xffff) | (uint32_t{cid} << 16);
  admin_sq_[admin_sq_tail_] = sqe;
  admin_sq_tail_ = (admin_sq_tail_ + 1) % kAdminDepth;
  std::atomic_thread_fence(std::memory_order_release);
  *Doorbell(0, false) = admin_sq_tail_;
  const int64_t deadline = os_->MonotonicNanos() + ready_timeout_ns_;
  while (true) {
    volatile Cqe* slot = &admin_cq_[admin_cq_head_];
    if ((slot->status & 1) == admin_phase_) {
      std::atomic_thread_fence(std::memory_order_acquire);
      Cqe cqe;
      cqe.result = slot->result;
      cqe.command_id = slot->command_id;
      cqe.status = slot->status;
      admin_cq_head_ = (admin_cq_head_ + 1) % kAdminDepth;
      if (admin_cq_head_ == 0) admin_phase_ ^= 1;
      *Doorbell(0, true) = admin_cq_head_;
      const uint16_t status = cqe.status >> 1;
      if (status != 0) {
        return absl::Status(
            CodeOf(cqe.status),
            absl::StrCat("NVMe admin command ", what, " on ", vfio_->name(),
                         " failed: ", StatusName(cqe.status)));
      }
      return cqe;
    }
    if (os_->MonotonicNanos() > deadline) {
      return absl::DeadlineExceededError(absl::StrFormat(
          "NVMe admin command %s on %s did not complete within %.1f s", what,
          vfio_->name(), static_cast<double>(ready_timeout_ns_) / 1e9));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

std::string Trimmed(const char* p, size_t n) {
  return std::string(absl::StripAsciiWhitespace(absl::string_view(p, n)));
}

absl::Status NvmeDevice::Identify() {
  // Identify Controller (CNS 1).
  Sqe sqe;
  sqe.cdw0 = kAdminIdentify;
  sqe.prp1 = admin_buffer_iova_;
  sqe.cdw10 = 1;
  TPUSHIM_RETURN_IF_ERROR(AdminCommand(sqe, "Identify Controller").status());
  const auto* ctrl = reinterpret_cast<const uint8_t*>(admin_buffer_);
  id_.serial = Trimmed(admin_buffer_ + 4, 20);
  id_.model = Trimmed(admin_buffer_ + 24, 40);
  const uint8_t mdts = ctrl[77];
  const uint32_t mps_min_bytes = 4096u << ((cap_ >> 48) & 0xf);
  if (mdts != 0) {
    id_.max_command_bytes =
        std::min<uint64_t>(kMaxCommandBytes, uint64_t{mps_min_bytes} << mdts);
  }
  uint16_t oncs;
  std::memcpy(&oncs, admin_buffer_ + 520, sizeof(oncs));
  id_.copy = (oncs & (1u << 8)) != 0;

  // Identify Namespace 1 (CNS 0).
  std::memset(admin_buffer_, 0, kPage);
  sqe = Sqe{};
  sqe.cdw0 = kAdminIdentify;
  sqe.nsid = kNamespace;
  sqe.prp1 = admin_buffer_iova_;
  sqe.cdw10 = 0;
  TPUSHIM_RETURN_IF_ERROR(AdminCommand(sqe, "Identify Namespace").status());
  uint64_t nsze;
  std::memcpy(&nsze, admin_buffer_, sizeof(nsze));
  const uint8_t flbas = static_cast<uint8_t>(admin_buffer_[26]) & 0xf;
  uint32_t lbaf;
  std::memcpy(&lbaf, admin_buffer_ + 128 + 4 * flbas, sizeof(lbaf));
  const uint32_t lbads = (lbaf >> 16) & 0xff;
  if (nsze == 0 || lbads < 9 || lbads > 16) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "NVMe controller %s has no usable namespace 1 (%d blocks of 2^%d "
        "bytes)",
        vfio_->name(), nsze, lbads));
  }
  id_.blocks = nsze;
  id_.block_bytes = 1u << lbads;
  // Copy's limits (NVM Command Set Identify Namespace): MSSRL, the blocks
  // one source range may hold, at bytes 74-75; MCL, the blocks one command
  // may copy, at 76-79. A namespace that leaves them 0 cannot copy (QEMU's
  // built-in namespace of `-device nvme,drive=` does, while advertising
  // Copy).
  uint16_t mssrl;
  uint32_t mcl;
  std::memcpy(&mssrl, admin_buffer_ + 74, sizeof(mssrl));
  std::memcpy(&mcl, admin_buffer_ + 76, sizeof(mcl));
  id_.copy_max_blocks = std::min<uint32_t>(mssrl, mcl);
  if (id_.copy && id_.copy_max_blocks == 0) id_.copy = false;
  // The command size cap in whole blocks (NLB is 16 bits).
  id_.max_command_bytes =
      std::min<uint64_t>(id_.max_command_bytes,
                         uint64_t{65536} * id_.block_bytes) /
      id_.block_bytes * id_.block_bytes;
  return absl::OkStatus();
}

absl::Status NvmeDevice::CreateQueues() {
  // Number of Queues: ask for one pair per direction.
  Sqe sqe;
  sqe.cdw0 = kAdminSetFeatures;
  sqe.cdw10 = kFeatureNumberOfQueues;
  sqe.cdw11 = ((kDmaDirectionCount - 1) << 16) | (kDmaDirectionCount - 1);
  TPUSHIM_ASSIGN_OR_RETURN(
      Cqe granted, AdminCommand(sqe, "Set Features (Number of Queues)"));
  const uint32_t sqs = (granted.result & 0xffff) + 1;
  const uint32_t cqs = (granted.result >> 16) + 1;
  if (sqs < kDmaDirectionCount || cqs < kDmaDirectionCount) {
    return absl::FailedPreconditionError(
        absl::StrCat("NVMe controller ", vfio_->name(), " grants ", sqs,
                     " I/O submission and ", cqs,
                     " completion queues; tpushim needs ", kDmaDirectionCount));
  }
  for (auto& qp : queues_) {
    Queue& q = *qp;
    sqe = Sqe{};
    sqe.cdw0 = kAdminCreateCq;
    sqe.prp1 = q.cq_iova;
    sqe.cdw10 = ((q.depth - 1) << 16) | q.qid;
    // Physically contiguous; interrupts on vector qid when they are used.
    sqe.cdw11 = q.irq_fd >= 0 ? (uint32_t{q.qid} << 16) | 2u | 1u : 1u;
    TPUSHIM_RETURN_IF_ERROR(
        AdminCommand(sqe, absl::StrCat("Create I/O Completion Queue ", q.qid))
            .status());
    sqe = Sqe{};
    sqe.cdw0 = kAdminCreateSq;
    sqe.prp1 = q.sq_iova;
    sqe.cdw10 = ((q.depth - 1) << 16) | q.qid;
    sqe.cdw11 = (uint32_t{q.qid} << 16) | 1u;
    TPUSHIM_RETURN_IF_ERROR(
        AdminCommand(sqe, absl::StrCat("Create I/O Submission Queue ", q.qid))
            .status());
  }
  created_queues_ = true;
  return absl::OkStatus();
}

absl::Status NvmeDevice::Open() {
  const std::string name = url_.pci_address.ToString();
  TPUSHIM_ASSIGN_OR_RETURN(vfio_, VfioDevice::Open(url_.pci_address, os_, {}));
  if (vfio_->class_code() != 0x010802) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s is not an NVMe controller (PCI class 0x%06x, vendor %04x device "
        "%04x; NVMe is 0x010802): engine=nvme cannot drive it",
        name, vfio_->class_code(), vfio_->vendor_id(), vfio_->device_id()));
  }
  TPUSHIM_RETURN_IF_ERROR(vfio_->EnableBusMastering());
  TPUSHIM_ASSIGN_OR_RETURN(bar_, vfio_->MapBar(0));
  if (bar_.size < kDoorbells + 8 * (kDmaDirectionCount + 1)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "BAR0 of ", name, " is ", bar_.size, " bytes, too small for NVMe"));
  }
  cap_ = Read64(bar_.base, kRegCap);
  const uint32_t vs = Read32(bar_.base, kRegVs);
  doorbell_stride_ = 4u << ((cap_ >> 32) & 0xf);
  ready_timeout_ns_ = std::max<int64_t>(1, (cap_ >> 24) & 0xff) * 500'000'000;
  if (((cap_ >> 37) & 1) == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "NVMe controller ", name, " does not support the NVM command set"));
  }
  if (((cap_ >> 48) & 0xf) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("NVMe controller ", name,
                     " does not support 4 KiB memory pages (CAP.MPSMIN > 0)"));
  }
  const uint32_t mqes = static_cast<uint32_t>(cap_ & 0xffff) + 1;
  const uint32_t depth = std::min(url_.queue_depth, mqes);
  if (depth < 2) {
    return absl::FailedPreconditionError(absl::StrCat(
        "NVMe controller ", name, " offers queues of ", mqes, " entries"));
  }
  TPUSHIM_RETURN_IF_ERROR(DisableController());

  // The arena: admin queues and buffer, then per I/O queue its SQ, CQ and
  // one PRP-list page per command id, then the bounce buffers.
  const uint64_t per_queue = (depth * sizeof(Sqe) + kPage - 1) / kPage * kPage +
                             (depth * sizeof(Cqe) + kPage - 1) / kPage * kPage +
                             uint64_t{depth} * kPage;
  arena_ = std::make_unique<DmaArena>(os_, vfio_.get());
  TPUSHIM_RETURN_IF_ERROR(
      arena_->Create(3 * kPage + kDmaDirectionCount * per_queue +
                     uint64_t{kBounceSlots} * kMaxCommandBytes));
  TPUSHIM_ASSIGN_OR_RETURN(DmaArena::Slice asq, arena_->Take(kPage));
  TPUSHIM_ASSIGN_OR_RETURN(DmaArena::Slice acq, arena_->Take(kPage));
  TPUSHIM_ASSIGN_OR_RETURN(DmaArena::Slice abuf, arena_->Take(kPage));
  admin_sq_ = reinterpret_cast<Sqe*>(asq.host);
  admin_cq_ = reinterpret_cast<Cqe*>(acq.host);
  admin_buffer_ = abuf.host;
  admin_buffer_iova_ = abuf.iova;
  for (auto& qp : queues_) {
    Queue& q = *qp;
    q.depth = depth;
    TPUSHIM_ASSIGN_OR_RETURN(DmaArena::Slice sq,
                             arena_->Take(depth * sizeof(Sqe)));
    TPUSHIM_ASSIGN_OR_RETURN(DmaArena::Slice cq,
                             arena_->Take(depth * sizeof(Cqe)));
    TPUSHIM_ASSIGN_OR_RETURN(DmaArena::Slice prp,
                             arena_->Take(uint64_t{depth} * kPage));
    q.sq = reinterpret_cast<Sqe*>(sq.host);
    q.sq_iova = sq.iova;
    q.cq = reinterpret_cast<Cqe*>(cq.host);
    q.cq_iova = cq.iova;
    q.prp_lists = prp.host;
    q.prp_lists_iova = prp.iova;
  }
  TPUSHIM_ASSIGN_OR_RETURN(
      DmaArena::Slice bounce,
      arena_->Take(uint64_t{kBounceSlots} * kMaxCommandBytes));
  bounce_iova_ = bounce.iova;

  // Enable with the admin queue.
  Write32(bar_.base, kRegAqa, ((kAdminDepth - 1) << 16) | (kAdminDepth - 1));
  Write64(bar_.base, kRegAsq, asq.iova);
  Write64(bar_.base, kRegAcq, acq.iova);
  Write32(bar_.base, kRegIntms, 0xffffffff);  // no pin/MSI interrupts
  Write32(bar_.base, kRegCc, kCcIosqes | kCcIocqes | kCcEnable);
  enabled_ = true;
  TPUSHIM_RETURN_IF_ERROR(WaitReady(true, "enabling it"));
  TPUSHIM_RETURN_IF_ERROR(Identify());

  // Interrupts: vector 0 is the admin queue's (unused: admin commands
  // poll), vector qid is I/O queue qid's.
  const uint32_t vectors = kDmaDirectionCount + 1;
  std::string completions = "polling";
  if (url_.irq == DeviceUrl::Irq::kMsix) {
    if (vfio_->msix_vectors() >= vectors) {
      TPUSHIM_ASSIGN_OR_RETURN(irq_fds_, vfio_->EnableMsix(vectors));
      for (auto& qp : queues_) qp->irq_fd = irq_fds_[qp->qid];
      completions = absl::StrCat("MSI-X (", vectors, " vectors)");
    } else {
      LOG(WARNING) << "NVMe controller " << name << " offers "
                   << vfio_->msix_vectors() << " MSI-X vectors, fewer than "
                   << vectors << ": completions are polled";
    }
  }
  TPUSHIM_RETURN_IF_ERROR(CreateQueues());

  use_copy_ = id_.copy && url_.d2d != DeviceUrl::D2d::kBounce;
  if (url_.d2d == DeviceUrl::D2d::kCopy && !id_.copy) {
    return absl::FailedPreconditionError(absl::StrCat(
        "d2d=copy: NVMe controller ", name,
        " cannot copy: it lacks the Copy command (ONCS bit 8) or namespace 1 "
        "allows no blocks per copy (MSSRL or MCL is 0); use d2d=auto or "
        "d2d=bounce"));
  }
  const uint64_t ns_bytes = id_.blocks * id_.block_bytes;
  allocator_ = std::make_unique<RegionAllocator>(
      kDeviceMemoryBase, ns_bytes,
      RegionAllocator::Config{.kind = RegionAllocator::Kind::kDeviceMemory,
                              .memory_name = "0x0x0_HBM0",
                              .threshold = 0,
                              .dump_on_oom = false,
                              .faults = nullptr});

  info_.id = 0;
  info_.name = absl::StrCat("vfio:", name);
  info_.backend = "vfio-nvme";
  info_.hbm_bytes = ns_bytes;
  info_.dma_engines = 1;
  info_.ring_entries = kRingEntries;
  info_.numa_node = vfio_->numa_node();
  info_.block_bytes = id_.block_bytes;

  for (auto& qp : queues_) {
    Queue& q = *qp;
    TPUSHIM_ASSIGN_OR_RETURN(q.wake_fd, os_->CreateEventFd());
    const bool bounced =
        q.direction == DmaDirection::kDeviceToDevice && !use_copy_;
    q.max_outstanding = bounced ? std::min(kBounceSlots, depth - 1) : depth - 1;
    MutexLock lock(&q.mu);
    q.slots.resize(kRingEntries);
    for (uint32_t i = kRingEntries; i > 0; --i) q.free_slots.push_back(i - 1);
    q.commands.resize(depth);
    for (uint32_t i = depth; i > 0; --i) {
      q.free_cids.push_back(static_cast<uint16_t>(i - 1));
    }
    if (bounced) {
      for (uint32_t i = kBounceSlots; i > 0; --i)
        q.free_bounce.push_back(i - 1);
    }
  }
  for (auto& qp : queues_) {
    Queue* q = qp.get();
    q->worker = std::thread([this, q] { Worker(*q); });
  }
  LOG(INFO) << "Opened NVMe controller " << name
            << " through VFIO: " << id_.model << " (serial " << id_.serial
            << ", NVMe " << (vs >> 16) << "." << ((vs >> 8) & 0xff)
            << "), namespace 1 " << HumanReadableBytes(ns_bytes) << " in "
            << id_.block_bytes << "-byte blocks, " << kDmaDirectionCount
            << " I/O queue pairs of " << depth << ", commands up to "
            << HumanReadableBytes(id_.max_command_bytes)
            << ", device-to-device by "
            << (use_copy_ ? "Copy" : "Read+Write through a bounce buffer")
            << ", completions by " << completions << ", IOMMU group "
            << vfio_->iommu_group()
            << (vfio_->can_reset() ? ", function reset" : ", no reset");
  return absl::OkStatus();
}

NvmeDevice::~NvmeDevice() {
  Shutdown();
  if (created_queues_ && enabled_ &&
      !controller_disabled_.load(std::memory_order_acquire)) {
    // Orderly: delete the I/O queues, then a normal shutdown notification.
    for (auto& qp : queues_) {
      Sqe sqe;
      sqe.cdw0 = kAdminDeleteSq;
      sqe.cdw10 = qp->qid;
      (void)AdminCommand(sqe, "Delete I/O Submission Queue");
      sqe.cdw0 = kAdminDeleteCq;
      (void)AdminCommand(sqe, "Delete I/O Completion Queue");
    }
    Write32(bar_.base, kRegCc, Read32(bar_.base, kRegCc) | kCcShnNormal);
    // Wait (at most CAP.TO) for CSTS.SHST to say the shutdown is complete.
    const int64_t deadline = os_->MonotonicNanos() + ready_timeout_ns_;
    while (((Read32(bar_.base, kRegCsts) >> 2) & 3) != 2) {
      if (os_->MonotonicNanos() > deadline) {
        LOG(WARNING) << info_.name
                     << ": the controller did not finish its shutdown "
                        "within CAP.TO; disabling it anyway";
        break;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
  if (bar_.base != nullptr && vfio_ != nullptr) (void)DisableController();
  for (auto& qp : queues_) {
    if (qp->wake_fd >= 0) (void)os_->Close(qp->wake_fd);
  }
  if (vfio_ != nullptr) vfio_->DisableMsix();
  windows_.Clear([&](const HostWindowTable<Mapping>::Window& w) {
    absl::Status s = vfio_->UnmapDma(w.extra.mapped_iova, w.extra.mapped_bytes);
    if (!s.ok()) LOG(WARNING) << "Closing " << info_.name << ": " << s;
  });
  arena_.reset();
  vfio_.reset();  // resets the function, closes everything
}

absl::StatusOr<uint64_t> NvmeDevice::AllocateMemory(uint64_t size) {
  if (size == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AllocateMemory(0) on ", info_.name, ": size must be at least 1"));
  }
  const uint64_t block = id_.block_bytes;
  const uint64_t rounded = (size + block - 1) / block * block;
  TPUSHIM_ASSIGN_OR_RETURN(void* p, allocator_->Allocate(rounded, block));
  return static_cast<uint64_t>(static_cast<char*>(p) - kDeviceMemoryBase);
}

absl::Status NvmeDevice::FreeMemory(uint64_t device_address) {
  if (device_address >= info_.hbm_bytes ||
      allocator_->AllocationSize(kDeviceMemoryBase + device_address) == 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("FreeMemory(0x%x): not a live allocation of %s",
                        device_address, info_.name));
  }
  return allocator_->Free(kDeviceMemoryBase + device_address);
}

absl::StatusOr<HostWindowId> NvmeDevice::RegisterHostWindow(const void* base,
                                                            uint64_t length) {
  TPUSHIM_RETURN_IF_ERROR(windows_.Check(base, length));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(base) & ~(kPage - 1);
  const uintptr_t end =
      (reinterpret_cast<uintptr_t>(base) + length + kPage - 1) & ~(kPage - 1);
  const uint64_t bytes = end - begin;
  // Long mappings (the premapped region) report progress about once a
  // second, as pre-faulting does.
  const int64_t start_ns = os_->MonotonicNanos();
  int64_t last_report = start_ns;
  const VfioDevice::Progress progress = [&](uint64_t done, uint64_t total) {
    const int64_t now = os_->MonotonicNanos();
    if (done < total && now - last_report >= 1'000'000'000) {
      last_report = now;
      LOG(INFO) << "IOMMU-mapping memory for " << info_.name << ": " << done
                << " of " << total << " bytes ("
                << (total == 0 ? 100 : done * 100 / total) << "%)";
    }
  };
  TPUSHIM_ASSIGN_OR_RETURN(const uint64_t iova,
                           vfio_->MapDma(reinterpret_cast<const void*>(begin),
                                         bytes, kMapChunkBytes, progress));
  if (bytes >= kMapChunkBytes) {
    LOG(INFO) << "IOMMU-mapped " << bytes << " bytes for " << info_.name
              << " in "
              << absl::StrFormat("%.3f",
                                 (os_->MonotonicNanos() - start_ns) / 1e9)
              << "s (" << (bytes + kMapChunkBytes - 1) / kMapChunkBytes
              << " mappings, IOVA " << absl::StrFormat("0x%x", iova) << ")";
  }
  absl::StatusOr<HostWindowId> id = windows_.Add(
      base, length,
      Mapping{.iova = iova + (reinterpret_cast<uintptr_t>(base) - begin),
              .mapped_iova = iova,
              .mapped_bytes = bytes});
  if (!id.ok()) (void)vfio_->UnmapDma(iova, bytes);
  return id;
}

absl::Status NvmeDevice::UnregisterHostWindow(HostWindowId window) {
  TPUSHIM_ASSIGN_OR_RETURN(const HostWindowTable<Mapping>::Window w,
                           windows_.Remove(window));
  return vfio_->UnmapDma(w.extra.mapped_iova, w.extra.mapped_bytes);
}

size_t NvmeDevice::Submit(DmaDirection direction,
                          absl::Span<const DmaDescriptor> descriptors) {
  const int dir = static_cast<int>(direction);
  if (dir < 0 || dir >= kDmaDirectionCount || descriptors.empty()) return 0;
  Queue& q = *queues_[dir];
  bool wake = false;
  size_t accepted = 0;
  {
    MutexLock lock(&q.mu);
    if (q.shutdown) return 0;
    accepted = std::min(q.free_slots.size(), descriptors.size());
    for (size_t i = 0; i < accepted; ++i) {
      const uint32_t slot = q.free_slots.back();
      q.free_slots.pop_back();
      q.slots[slot] = Pending{};
      q.slots[slot].d = descriptors[i];
      q.slots[slot].queued = true;
      q.to_issue.push_back(slot);
    }
    q.in_flight.fetch_add(static_cast<uint32_t>(accepted),
                          std::memory_order_acq_rel);
    Issue(q);
    // Failed-at-start descriptors complete on the worker, and a polling
    // worker sleeps while nothing is outstanding.
    wake = q.idle || !q.done.empty();
    q.idle = false;
  }
  if (wake && accepted > 0) (void)os_->SignalEventFd(q.wake_fd);
  return accepted;
}

void NvmeDevice::Fail(Pending& p, absl::Status status) {
  if (p.status.ok()) p.status = std::move(status);
  p.issued = p.d.length;  // issue nothing more for it
}

absl::Status NvmeDevice::Start(Queue& q, Pending& p) {
  const DmaDescriptor& d = p.d;
  const uint64_t block = id_.block_bytes;
  const bool d2d = q.direction == DmaDirection::kDeviceToDevice;
  if (d.length == 0 || d.length % block != 0 || d.device_address % block != 0 ||
      (d2d && d.peer_address % block != 0)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s moves whole %d-byte logical blocks: descriptor 0x%x has length %d "
        "at device address 0x%x%s; device addresses and lengths must be "
        "multiples of %d",
        info_.name, block, d.user_data, d.length, d.device_address,
        d2d ? absl::StrFormat(" to 0x%x", d.peer_address) : "", block));
  }
  const uint64_t ns_bytes = info_.hbm_bytes;
  for (uint64_t address : {d.device_address, d2d ? d.peer_address : 0}) {
    if (address > ns_bytes || d.length > ns_bytes - address) {
      return absl::OutOfRangeError(absl::StrFormat(
          "DMA fault on %s: [0x%x, +%d) lies outside device memory of %d "
          "bytes",
          info_.name, address, d.length, ns_bytes));
    }
  }
  if (d2d) {
    if (d.peer_device != static_cast<uint32_t>(info_.id)) {
      return absl::InvalidArgumentError(
          absl::StrCat(info_.name,
                       " copies device to device only within itself, not to "
                       "device ",
                       d.peer_device));
    }
    return absl::OkStatus();
  }
  TPUSHIM_ASSIGN_OR_RETURN(
      const HostWindowTable<Mapping>::Window w,
      windows_.Find(d.host_window, d.host_offset, d.length));
  p.host_iova = w.extra.iova + d.host_offset;
  if (p.host_iova % 4 != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s DMAs host memory at 4-byte aligned addresses (NVMe PRP entries "
        "are dword aligned): descriptor 0x%x starts at host address %p",
        info_.name, d.user_data, w.base + d.host_offset));
  }
  return absl::OkStatus();
}

uint64_t NvmeDevice::BuildPrp(Queue& q, uint16_t cid, uint64_t iova,
                              uint64_t bytes, uint64_t* prp2) {
  const uint64_t first = kPage - (iova % kPage);
  if (bytes <= first) {
    *prp2 = 0;
  } else if (bytes <= first + kPage) {
    *prp2 = iova + first;
  } else {
    auto* list = reinterpret_cast<uint64_t*>(q.prp_lists + cid * kPage);
    uint64_t page = iova + first;
    size_t n = 0;
    for (uint64_t covered = first; covered < bytes; covered += kPage) {
      list[n++] = page;
      page += kPage;
    }
    *prp2 = q.prp_lists_iova + cid * kPage;
  }
  return iova;
}

void NvmeDevice::WriteCommand(Queue& q, uint16_t cid, const Sqe& sqe) {
  Sqe entry = sqe;
  entry.cdw0 = (entry.cdw0 & 0xffff) | (uint32_t{cid} << 16);
  entry.nsid = kNamespace;
  q.sq[q.sq_tail] = entry;
  q.sq_tail = (q.sq_tail + 1) % q.depth;
  ++q.outstanding;
}

bool NvmeDevice::IssueOne(Queue& q, uint32_t slot) {
  Pending& p = q.slots[slot];
  const DmaDescriptor& d = p.d;
  if (!p.started) {
    p.started = true;
    p.start_ns = os_->MonotonicNanos();
    absl::Status valid = Start(q, p);
    if (valid.ok() && faults_ != nullptr) {
      valid = faults_->Check(FaultPoint::kDma, [&] {
        return absl::InternalError(absl::StrFormat(
            "DMA error on %s (%s): descriptor 0x%x of %d bytes did not "
            "complete",
            info_.name, DmaDirectionName(d.direction), d.user_data, d.length));
      });
    }
    if (!valid.ok()) Fail(p, std::move(valid));
  }
  if (p.issued >= d.length) return false;
  const bool d2d = q.direction == DmaDirection::kDeviceToDevice;
  const uint64_t block = id_.block_bytes;
  uint64_t max = id_.max_command_bytes;
  if (d2d && use_copy_) {
    max = std::min<uint64_t>(max, uint64_t{id_.copy_max_blocks} * block);
  }
  const uint64_t n = std::min(max, d.length - p.issued);
  const uint16_t cid = q.free_cids.back();
  Command& c = q.commands[cid];
  c = Command{};
  c.slot = slot;
  c.lba = (d.device_address + p.issued) / block;
  c.blocks = static_cast<uint32_t>(n / block);
  Sqe sqe;
  sqe.cdw12 = c.blocks - 1;
  if (d2d && use_copy_) {
    auto* range =
        reinterpret_cast<CopyRange*>(q.prp_lists + uint64_t{cid} * kPage);
    *range = CopyRange{};
    range->slba = c.lba;
    range->nlb = static_cast<uint16_t>(c.blocks - 1);
    c.dest_lba = (d.peer_address + p.issued) / block;
    sqe.cdw0 = kNvmCopy;
    sqe.prp1 = q.prp_lists_iova + uint64_t{cid} * kPage;
    sqe.cdw10 = static_cast<uint32_t>(c.dest_lba);
    sqe.cdw11 = static_cast<uint32_t>(c.dest_lba >> 32);
    sqe.cdw12 = 0;  // one range, format 0
  } else {
    uint64_t iova;
    if (d2d) {
      if (q.free_bounce.empty()) return false;
      c.stage = Stage::kBounceRead;
      c.bounce = q.free_bounce.back();
      q.free_bounce.pop_back();
      c.dest_lba = (d.peer_address + p.issued) / block;
      iova = bounce_iova_ + uint64_t{c.bounce} * kMaxCommandBytes;
    } else {
      iova = p.host_iova + p.issued;
    }
    if (faults_ != nullptr) {
      absl::Status injected = faults_->Check(FaultPoint::kIommu, [&] {
        return absl::InternalError("DMA through an unmapped IOVA");
      });
      if (!injected.ok()) {
        iova = vfio_->unmapped_iova();
        c.injected = std::string(injected.message());
      }
    }
    sqe.cdw0 =
        q.direction == DmaDirection::kHostToDevice ? kNvmWrite : kNvmRead;
    sqe.prp1 = BuildPrp(q, cid, iova, n, &sqe.prp2);
    if (!c.injected.empty() && sqe.prp2 != 0) {
      // Every page at the unmapped IOVA, and a PRP list there too: the
      // controller's first DMA (the list fetch, or the data) is blocked.
      sqe.prp2 = iova;
    }
    sqe.cdw10 = static_cast<uint32_t>(c.lba);
    sqe.cdw11 = static_cast<uint32_t>(c.lba >> 32);
  }
  q.free_cids.pop_back();
  WriteCommand(q, cid, sqe);
  p.issued += n;
  ++p.outstanding;
  return true;
}

void NvmeDevice::Issue(Queue& q) {
  bool wrote = false;
  while (!q.to_issue.empty()) {
    const uint32_t slot = q.to_issue.front();
    Pending& p = q.slots[slot];
    if (q.shutdown && !p.started) {
      p.started = true;
      p.start_ns = os_->MonotonicNanos();
      Fail(p, absl::CancelledError(absl::StrCat(
                  info_.name, " shut down before the descriptor started")));
    }
    if (p.started && p.issued >= p.d.length) {
      q.to_issue.pop_front();
      p.queued = false;
      if (p.outstanding == 0) Finish(q, slot);
      continue;
    }
    if (q.outstanding >= q.max_outstanding || q.free_cids.empty()) break;
    if (!IssueOne(q, slot)) {
      if (p.issued < p.d.length) break;  // waiting for a bounce buffer
      continue;
    }
    wrote = true;
  }
  if (wrote) {
    std::atomic_thread_fence(std::memory_order_release);
    *Doorbell(q.qid, false) = q.sq_tail;
  }
}

void NvmeDevice::Finish(Queue& q, uint32_t slot) {
  Pending& p = q.slots[slot];
  // A descriptor that failed before all its commands were issued is still
  // queued (rarely: the queue is searched only then).
  if (p.queued) {
    q.to_issue.erase(std::find(q.to_issue.begin(), q.to_issue.end(), slot));
    p.queued = false;
  }
  q.done.push_back(DmaCompletion{.user_data = p.d.user_data,
                                 .status = std::move(p.status),
                                 .start_ns = p.start_ns,
                                 .end_ns = os_->MonotonicNanos()});
  q.free_slots.push_back(slot);
}

void NvmeDevice::Reap(Queue& q) {
  bool reaped = false;
  while (true) {
    volatile Cqe* entry = &q.cq[q.cq_head];
    if ((entry->status & 1) != q.phase) break;
    std::atomic_thread_fence(std::memory_order_acquire);
    const uint16_t status = entry->status;
    const uint16_t cid = entry->command_id;
    q.cq_head = (q.cq_head + 1) % q.depth;
    if (q.cq_head == 0) q.phase ^= 1;
    reaped = true;
    if (cid >= q.depth) {
      LOG(ERROR) << info_.name << ": completion for unknown command id " << cid;
      continue;
    }
    Command& c = q.commands[cid];
    Pending& p = q.slots[c.slot];
    --q.outstanding;
    const bool failed = (status >> 1) != 0;
    if (failed) {
      const char* what = c.stage == Stage::kBounceRead    ? "Read (bounce)"
                         : c.stage == Stage::kBounceWrite ? "Write (bounce)"
                         : q.direction == DmaDirection::kHostToDevice ? "Write"
                         : q.direction == DmaDirection::kDeviceToHost ? "Read"
                                                                      : "Copy";
      std::string message = absl::StrFormat(
          "NVMe %s of %d blocks at LBA %d on %s failed: %s (descriptor 0x%x)",
          what, c.blocks, c.lba, info_.name, StatusName(status), p.d.user_data);
      if (!c.injected.empty()) {
        absl::StrAppend(&message, "; the command's data pointer was IOVA 0x",
                        absl::Hex(vfio_->unmapped_iova()),
                        ", which nothing is mapped at, so the IOMMU blocked "
                        "the DMA: ",
                        c.injected);
      }
      Fail(p, absl::Status(CodeOf(status), message));
    }
    if (c.stage == Stage::kBounceRead && !failed && p.status.ok()) {
      // Second half: write the bounce buffer to the destination.
      c.stage = Stage::kBounceWrite;
      Sqe sqe;
      sqe.cdw0 = kNvmWrite;
      sqe.prp1 =
          BuildPrp(q, cid, bounce_iova_ + uint64_t{c.bounce} * kMaxCommandBytes,
                   uint64_t{c.blocks} * id_.block_bytes, &sqe.prp2);
      sqe.cdw10 = static_cast<uint32_t>(c.dest_lba);
      sqe.cdw11 = static_cast<uint32_t>(c.dest_lba >> 32);
      sqe.cdw12 = c.blocks - 1;
      c.lba = c.dest_lba;
      WriteCommand(q, cid, sqe);
      std::atomic_thread_fence(std::memory_order_release);
      *Doorbell(q.qid, false) = q.sq_tail;
      continue;
    }
    if (c.stage != Stage::kData) q.free_bounce.push_back(c.bounce);
    q.free_cids.push_back(cid);
    --p.outstanding;
    if (p.outstanding == 0 && p.issued >= p.d.length) {
      Finish(q, c.slot);
    }
  }
  if (reaped) *Doorbell(q.qid, true) = q.cq_head;
}

void NvmeDevice::Worker(Queue& q) {
  {
    const std::string name =
        absl::StrFormat("nvme-%s", DmaDirectionName(q.direction));
    pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
  }
  std::vector<DmaCompletion> done;
  int64_t stuck_since = 0;
  std::vector<int> fds = {q.wake_fd};
  if (q.irq_fd >= 0) fds.push_back(q.irq_fd);
  for (;;) {
    bool stop;
    bool busy;
    {
      MutexLock lock(&q.mu);
      Reap(q);
      Issue(q);
      done.swap(q.done);
      busy = q.outstanding > 0;
      stop = q.shutdown && q.to_issue.empty() && !busy;
      if (!busy && q.to_issue.empty()) q.idle = true;
    }
    if (!done.empty()) {
      q.in_flight.fetch_sub(static_cast<uint32_t>(done.size()),
                            std::memory_order_acq_rel);
      DmaCompletionSink* sink = sink_.load(std::memory_order_acquire);
      if (sink != nullptr) sink->OnDmaComplete(q.direction, done);
      done.clear();
      continue;
    }
    if (stop) return;
    if (busy && q.irq_fd < 0) {
      // Polling: the commands in flight take microseconds to milliseconds.
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    } else {
      // With commands out, wake now and then even without an interrupt.
      (void)os_->WaitReadable(fds, busy ? 100 : -1);
      (void)os_->DrainEventFd(q.wake_fd);
      if (q.irq_fd >= 0) (void)os_->DrainEventFd(q.irq_fd);
    }
    bool shutting_down;
    {
      MutexLock lock(&q.mu);
      shutting_down = q.shutdown;
    }
    if (!shutting_down || !busy) {
      stuck_since = 0;
      continue;
    }
    // Shutting down with commands out: give them CAP.TO, then disable the
    // controller, which aborts them (its DMA stops), and fail them.
    const int64_t now = os_->MonotonicNanos();
    if (stuck_since == 0) stuck_since = now;
    if (now - stuck_since < ready_timeout_ns_) continue;
    LOG(ERROR) << info_.name << ": commands still outstanding "
               << (now - stuck_since) / 1'000'000
               << " ms into shut-down; disabling the controller";
    Write32(bar_.base, kRegCc, Read32(bar_.base, kRegCc) & ~kCcEnable);
    controller_disabled_.store(true, std::memory_order_release);
    MutexLock lock(&q.mu);
    for (uint32_t cid = 0; cid < q.depth; ++cid) {
      if (std::find(q.free_cids.begin(), q.free_cids.end(), cid) !=
          q.free_cids.end()) {
        continue;
      }
      Command& c = q.commands[cid];
      Pending& p = q.slots[c.slot];
      Fail(p, absl::AbortedError(
                  absl::StrCat(info_.name,
                               " did not complete the command in time; the "
                               "controller was disabled")));
      q.free_cids.push_back(static_cast<uint16_t>(cid));
      --q.outstanding;
      if (--p.outstanding == 0) Finish(q, c.slot);
    }
  }
}

void NvmeDevice::Shutdown() {
  {
    MutexLock lock(&shutdown_mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  for (auto& q : queues_) {
    {
      MutexLock lock(&q->mu);
      q->shutdown = true;
    }
    if (q->wake_fd >= 0) (void)os_->SignalEventFd(q->wake_fd);
  }
  for (auto& q : queues_) {
    if (q->worker.joinable()) q->worker.join();
  }
}

}  // namespace

absl::StatusOr<std::vector<std::unique_ptr<Device>>> OpenNvmeDevices(
    const DeviceUrl& url, Os* os, FaultInjector* faults) {
  if (url.scheme != DeviceUrl::Scheme::kVfio ||
      url.engine != DeviceUrl::Engine::kNvme) {
    return absl::InvalidArgumentError(absl::StrCat(
        "OpenNvmeDevices: \"", url.text, "\" is not vfio://…?engine=nvme"));
  }
  auto device = std::make_unique<NvmeDevice>(url, os, faults);
  absl::Status opened = device->Open();
  if (!opened.ok()) {
    return absl::Status(
        opened.code(),
        absl::StrCat("Opening ", url.text, " failed: ", opened.message()));
  }
  std::vector<std::unique_ptr<Device>> devices;
  devices.push_back(std::move(device));
  return devices;
}

}  // namespace tpushim
