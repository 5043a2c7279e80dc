#include "device/nvme/nvme_device.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/human_bytes.h"
#include "common/page_hull.h"
#include "common/status_macros.h"
#include "device/nvme/nvme_device_internal.h"
#include "logging/log.h"

namespace tpushim::nvme_internal {
namespace {

constexpr uint32_t kAdminDepth = 32;
// Device-to-device bounce buffers (d2d=bounce or no Copy support).
constexpr uint32_t kBounceSlots = 8;
// IOMMU-map large host windows in chunks of this size, with progress.
constexpr uint64_t kMapChunkBytes = uint64_t{256} << 20;
// Descriptors per queue ring (DeviceInfo::ring_entries).
constexpr uint32_t kRingEntries = 1024;

// Device memory addresses as the allocator sees them: offsets from this
// made-up base (the allocator only does arithmetic on it).
char* const kDeviceMemoryBase = reinterpret_cast<char*>(uintptr_t{1} << 44);

std::string Trimmed(const char* p, size_t n) {
  return std::string(absl::StripAsciiWhitespace(absl::string_view(p, n)));
}

}  // namespace

NvmeDevice::NvmeDevice(const DeviceUrl& url, Os* os, FaultInjector* faults,
                       NvmeTuning tuning)
    : url_(url),
      os_(os),
      faults_(faults),
      command_timeout_ns_(absl::ToInt64Nanoseconds(tuning.command_timeout)),
      windows_(absl::StrCat("vfio:", url.pci_address.ToString())) {
  for (int d = 0; d < kDmaDirectionCount; ++d) {
    queues_[d] = std::make_unique<Queue>(static_cast<DmaDirection>(d),
                                         static_cast<uint16_t>(d + 1));
  }
}

absl::Status NvmeDevice::WaitReady(bool ready, absl::string_view why) {
  const int64_t deadline = os_->MonotonicNanos() + ready_timeout_ns_;
  while (true) {
    const uint32_t csts = regs().Read32(kRegCsts);
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
  const uint32_t cc = regs().Read32(kRegCc);
  if ((cc & kCcEnable) != 0) regs().Write32(kRegCc, cc & ~kCcEnable);
  enabled_ = false;
  return WaitReady(false, "disabling it");
}

absl::StatusOr<Cqe> NvmeDevice::AdminCommand(Sqe sqe, absl::string_view what) {
  const uint16_t cid = admin_cid_++;
  sqe.cdw0 = (sqe.cdw0 & 0xffff) | (uint32_t{cid} << 16);
  admin_sq_[admin_sq_tail_] = sqe;
  admin_sq_tail_ = (admin_sq_tail_ + 1) % kAdminDepth;
  RingDoorbell(0, false, admin_sq_tail_);
  const int64_t deadline = os_->MonotonicNanos() + ready_timeout_ns_;
  while (true) {
    volatile Cqe* slot = &admin_cq_[admin_cq_head_];
    const uint16_t status_field = LoadDmaField(&slot->status);
    if ((status_field & 1) == admin_phase_) {
      DmaReadBarrier();
      Cqe cqe;
      cqe.result = slot->result;
      cqe.command_id = slot->command_id;
      cqe.status = status_field;
      admin_cq_head_ = (admin_cq_head_ + 1) % kAdminDepth;
      if (admin_cq_head_ == 0) admin_phase_ ^= 1;
      RingDoorbell(0, true, admin_cq_head_);
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
  cap_ = regs().Read64(kRegCap);
  const uint32_t vs = regs().Read32(kRegVs);
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
  regs().Write32(kRegAqa, ((kAdminDepth - 1) << 16) | (kAdminDepth - 1));
  regs().Write64(kRegAsq, asq.iova);
  regs().Write64(kRegAcq, acq.iova);
  regs().Write32(kRegIntms, 0xffffffff);  // no pin/MSI interrupts
  regs().Write32(kRegCc, kCcIosqes | kCcIocqes | kCcEnable);
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
  info_.host_alignment = 4;  // PRP entries are dword aligned
  info_.window_alignment = kPage;  // the IOMMU maps whole pages

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
    regs().Write32(kRegCc, regs().Read32(kRegCc) | kCcShnNormal);
    // Wait (at most CAP.TO) for CSTS.SHST to say the shutdown is complete.
    const int64_t deadline = os_->MonotonicNanos() + ready_timeout_ns_;
    while (((regs().Read32(kRegCsts) >> 2) & 3) != 2) {
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
  const PageHull hull = PageHull::Of(base, length, kPage);
  const uintptr_t begin = hull.begin;
  const uint64_t bytes = hull.length();
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
  TPUSHIM_ASSIGN_OR_RETURN(
      const uint64_t iova,
      vfio_->MapDma(hull.start(), bytes, kMapChunkBytes, progress));
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
  if (w.extra.usable != nullptr) {
    MutexLock lock(&growing_mu_);
    growing_windows_.erase(window);
  }
  return vfio_->UnmapDma(w.extra.mapped_iova, w.extra.mapped_bytes);
}

absl::StatusOr<HostWindowId> NvmeDevice::ReserveHostWindow(const void* base,
                                                           uint64_t length) {
  TPUSHIM_RETURN_IF_ERROR(windows_.Check(base, length));
  const PageHull hull = PageHull::Of(base, length, kPage);
  TPUSHIM_ASSIGN_OR_RETURN(const uint64_t iova,
                           vfio_->ReserveDma(hull.start(), hull.length()));
  auto usable = std::make_unique<std::atomic<uint64_t>>(0);
  absl::StatusOr<HostWindowId> id = windows_.Add(
      base, length,
      Mapping{.iova = iova + (reinterpret_cast<uintptr_t>(base) - hull.begin),
              .mapped_iova = iova,
              .mapped_bytes = hull.length(),
              .usable = usable.get()});
  if (!id.ok()) {
    (void)vfio_->UnmapDma(iova, hull.length());
    return id;
  }
  MutexLock lock(&growing_mu_);
  growing_windows_[*id] = std::move(usable);
  return id;
}

absl::Status NvmeDevice::ExtendHostWindow(HostWindowId window,
                                          uint64_t usable) {
  TPUSHIM_ASSIGN_OR_RETURN(const HostWindowTable<Mapping>::Window w,
                           windows_.Find(window, 0, 1));
  if (w.extra.usable == nullptr) return absl::OkStatus();  // mapped whole
  usable = std::min(usable, w.length);
  if (usable <= w.extra.usable->load(std::memory_order_acquire)) {
    return absl::OkStatus();
  }
  // The window starts `lead` bytes into its first IOMMU page.
  const uint64_t lead = w.extra.iova - w.extra.mapped_iova;
  TPUSHIM_RETURN_IF_ERROR(vfio_->GrowDma(w.extra.mapped_iova, lead + usable));
  // Only the grower writes it (ExtendHostWindow calls of one window are
  // not concurrent); descriptors read it.
  w.extra.usable->store(usable, std::memory_order_release);
  VLOG(1) << "IOMMU-mapped host window " << window << " of " << info_.name
          << " up to " << usable << " of its " << w.length << " bytes";
  return absl::OkStatus();
}

}  // namespace tpushim::nvme_internal

namespace tpushim {

absl::StatusOr<std::vector<std::unique_ptr<Device>>> OpenNvmeDevices(
    const DeviceUrl& url, Os* os, FaultInjector* faults, NvmeTuning tuning) {
  if (url.scheme != DeviceUrl::Scheme::kVfio ||
      url.engine != DeviceUrl::Engine::kNvme) {
    return absl::InvalidArgumentError(absl::StrCat(
        "OpenNvmeDevices: \"", url.text, "\" is not vfio://…?engine=nvme"));
  }
  auto device =
      std::make_unique<nvme_internal::NvmeDevice>(url, os, faults, tuning);
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
