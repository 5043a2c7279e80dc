#include "device/vfio/vfio.h"

#include <fcntl.h>
#include <linux/pci_regs.h>
#include <linux/vfio.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/human_bytes.h"
#include "common/status_macros.h"
#include "device/vfio/host_use.h"
#include "env/chips.h"
#include "logging/log.h"

namespace tpushim {
namespace {

constexpr char kContainerPath[] = "/dev/vfio/vfio";

// Adds context in front of a status's message, keeping its code.
absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  return absl::Status(status.code(),
                      absl::StrCat(context, ": ", status.message()));
}

// VmLck of this process in bytes: what RLIMIT_MEMLOCK is charged with.
uint64_t LockedBytes(Os& os) {
  absl::StatusOr<std::string> status = os.ReadFile("/proc/self/status");
  if (!status.ok()) return 0;
  for (absl::string_view line : absl::StrSplit(*status, '\n')) {
    if (!absl::ConsumePrefix(&line, "VmLck:")) continue;
    line = absl::StripAsciiWhitespace(line);
    absl::ConsumeSuffix(&line, " kB");
    uint64_t kib = 0;
    if (absl::SimpleAtoi(line, &kib)) return kib * 1024;
  }
  return 0;
}

}  // namespace

// ---- IovaSpace
// ------------------------------------------------------------------

IovaSpace::IovaSpace(const std::vector<Range>& usable, uint64_t page)
    : page_(page) {
  std::vector<Range> sorted = usable;
  std::sort(sorted.begin(), sorted.end(),
            [](const Range& a, const Range& b) { return a.first < b.first; });
  bool guarded = false;
  for (const Range& r : sorted) {
    if (r.last < r.first) continue;
    const uint64_t begin = RoundUp(r.first);
    // One past the last whole page (careful at the top of the space).
    const uint64_t end = r.last == ~uint64_t{0} ? ~uint64_t{0} & ~(page_ - 1)
                                                : (r.last + 1) & ~(page_ - 1);
    if (begin >= end || begin < r.first) continue;
    uint64_t b = begin;
    if (!guarded) {
      guard_ = b;
      guarded = true;
      b += page_;
      if (b >= end) continue;
    }
    free_[b] = end;
  }
}

absl::StatusOr<uint64_t> IovaSpace::Allocate(uint64_t bytes) {
  if (bytes > ~uint64_t{0} - page_ + 1) {
    return absl::ResourceExhaustedError(
        absl::StrCat("no IOVA range of ", bytes, " bytes can exist"));
  }
  const uint64_t need = RoundUp(std::max<uint64_t>(bytes, 1));
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second - it->first < need) continue;
    const uint64_t iova = it->first;
    const uint64_t end = it->second;
    free_.erase(it);
    if (iova + need < end) free_[iova + need] = end;
    return iova;
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("no free IOVA range of ", HumanReadableBytes(need), " (",
                   HumanReadableBytes(free_bytes()), " free in all)"));
}

void IovaSpace::Free(uint64_t iova, uint64_t bytes) {
  uint64_t begin = iova;
  uint64_t end = iova + RoundUp(std::max<uint64_t>(bytes, 1));
  auto next = free_.lower_bound(begin);
  if (next != free_.end() && next->first == end) {
    end = next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->second == begin) {
      begin = prev->first;
      free_.erase(prev);
    }
  }
  free_[begin] = end;
}

uint64_t IovaSpace::free_bytes() const {
  uint64_t total = 0;
  for (const auto& [begin, end] : free_) total += end - begin;
  return total;
}

// ---- VfioDevice
// -----------------------------------------------------------------

VfioDevice::VfioDevice(const PciAddress& address, Os* os)
    : address_(address), os_(os) {}

absl::StatusOr<std::unique_ptr<VfioDevice>> VfioDevice::Open(
    const PciAddress& address, Os* os, const Options& options) {
  std::unique_ptr<VfioDevice> device(new VfioDevice(address, os));
  // On failure the destructor undoes whatever Setup got to.
  TPUSHIM_RETURN_IF_ERROR(device->Setup(options));
  return device;
}

absl::Status VfioDevice::CheckHost() {
  // The sysfs side: the function, its driver, its group, and advice to
  // rebind only when the host uses nothing behind it.
  return CheckVfioHost(*os_, name(), {}, &group_number_);
}

absl::Status VfioDevice::Setup(const Options& options) {
  const std::string bdf = name();
  const std::string sysfs = absl::StrCat("/sys/bus/pci/devices/", bdf);
  TPUSHIM_RETURN_IF_ERROR(CheckHost());
  if (absl::StatusOr<std::string> node = os_->ReadFile(sysfs + "/numa_node");
      node.ok()) {
    int n = -1;
    if (absl::SimpleAtoi(absl::StripAsciiWhitespace(*node), &n) && n >= 0) {
      numa_node_ = n;
    }
  }

  // The container.
  absl::StatusOr<int> container = os_->OpenDevice(kContainerPath, O_RDWR);
  if (!container.ok()) {
    if (absl::IsNotFound(container.status())) {
      return absl::FailedPreconditionError(
          absl::StrCat(kContainerPath,
                       " does not exist: load the vfio-pci module "
                       "(modprobe vfio-pci)"));
    }
    return Annotate(
        container.status(),
        absl::StrCat("cannot open the VFIO container ", kContainerPath));
  }
  container_fd_ = *container;
  TPUSHIM_ASSIGN_OR_RETURN(
      int api, os_->Ioctl(container_fd_, VFIO_GET_API_VERSION, nullptr,
                          "VFIO_GET_API_VERSION"));
  if (api != VFIO_API_VERSION) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the kernel's VFIO API version is ", api, ", not ", VFIO_API_VERSION));
  }
  TPUSHIM_ASSIGN_OR_RETURN(
      int type1v2,
      os_->Ioctl(container_fd_, VFIO_CHECK_EXTENSION,
                 reinterpret_cast<void*>(uintptr_t{VFIO_TYPE1v2_IOMMU}),
                 "VFIO_CHECK_EXTENSION"));
  if (type1v2 != 1) {
    return absl::FailedPreconditionError(
        "the kernel's VFIO has no TYPE1v2 IOMMU (vfio_iommu_type1 is not "
        "loaded, or this IOMMU is not supported)");
  }

  // The group.
  const std::string group_path = absl::StrCat("/dev/vfio/", group_number_);
  absl::StatusOr<int> group = os_->OpenDevice(group_path, O_RDWR);
  if (!group.ok()) {
    std::string why(group.status().message());
    if (absl::IsPermissionDenied(group.status())) {
      why = absl::StrCat(
          why, "; run as root or give this user the group's node: chown ",
          os_->UserName(), " ", group_path,
          " (a udev rule makes it stick; see docs/vfio.md)");
    } else if (group.status().code() == absl::StatusCode::kUnavailable ||
               absl::StrContains(why, "busy")) {
      const std::vector<std::string> holders =
          ProcessesHolding(*os_, group_path);
      why = absl::StrCat(
          why, "; the group is open elsewhere",
          holders.empty()
              ? absl::StrCat(": by another process this user cannot see "
                             "(`sudo fuser -v ",
                             group_path, "` names it: a VM, another tpushim)")
              : absl::StrCat(" by ", absl::StrJoin(holders, ", ")),
          ", or in another tpushim System of this process (a vfio:// "
          "device serves one System at a time)");
    }
    return absl::Status(group.status().code(),
                        absl::StrCat("cannot open IOMMU group ", group_number_,
                                     " of ", bdf, ": ", why));
  }
  group_fd_ = *group;
  vfio_group_status group_status{};
  group_status.argsz = sizeof(group_status);
  TPUSHIM_RETURN_IF_ERROR(os_->Ioctl(group_fd_, VFIO_GROUP_GET_STATUS,
                                     &group_status, "VFIO_GROUP_GET_STATUS")
                              .status());
  if ((group_status.flags & VFIO_GROUP_FLAGS_VIABLE) == 0) {
    // The kernel says the group is not viable; sysfs says who is in the way.
    std::string message = GroupNotViable(*os_, group_number_, bdf);
    if (message.empty()) {
      message = absl::StrCat(
          "IOMMU group ", group_number_, " of ", bdf,
          " is not viable: every device in it must be bound to vfio-pci or "
          "to no driver, and some are not");
    }
    return absl::FailedPreconditionError(message);
  }
  if ((group_status.flags & VFIO_GROUP_FLAGS_CONTAINER_SET) == 0) {
    TPUSHIM_RETURN_IF_ERROR(os_->Ioctl(group_fd_, VFIO_GROUP_SET_CONTAINER,
                                       &container_fd_,
                                       "VFIO_GROUP_SET_CONTAINER")
                                .status());
  }
  absl::StatusOr<int> iommu = os_->Ioctl(
      container_fd_, VFIO_SET_IOMMU,
      reinterpret_cast<void*>(uintptr_t{VFIO_TYPE1v2_IOMMU}), "VFIO_SET_IOMMU");
  if (!iommu.ok()) {
    if (absl::IsPermissionDenied(iommu.status())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the IOMMU refuses ", bdf, " (", iommu.status().message(),
          "): it has no interrupt remapping; enable it (Intel: intremap=on, "
          "the default) or, knowing the risk, load vfio_iommu_type1 with "
          "allow_unsafe_interrupts=1"));
    }
    return iommu.status();
  }

  // The IOMMU's usable IOVA ranges, page sizes and mapping limit.
  std::vector<IovaSpace::Range> ranges;
  {
    std::vector<uint8_t> buffer(sizeof(vfio_iommu_type1_info));
    auto* info = reinterpret_cast<vfio_iommu_type1_info*>(buffer.data());
    info->argsz = static_cast<uint32_t>(buffer.size());
    TPUSHIM_RETURN_IF_ERROR(os_->Ioctl(container_fd_, VFIO_IOMMU_GET_INFO, info,
                                       "VFIO_IOMMU_GET_INFO")
                                .status());
    if (info->argsz > buffer.size()) {
      buffer.assign(info->argsz, 0);
      info = reinterpret_cast<vfio_iommu_type1_info*>(buffer.data());
      info->argsz = static_cast<uint32_t>(buffer.size());
      TPUSHIM_RETURN_IF_ERROR(os_->Ioctl(container_fd_, VFIO_IOMMU_GET_INFO,
                                         info, "VFIO_IOMMU_GET_INFO")
                                  .status());
    }
    if ((info->flags & VFIO_IOMMU_INFO_PGSIZES) != 0 && info->iova_pgsizes) {
      // The smallest page the IOMMU maps.
      iova_page_ = info->iova_pgsizes & ~(info->iova_pgsizes - 1);
    }
    if ((info->flags & VFIO_IOMMU_INFO_CAPS) != 0) {
      uint32_t offset = info->cap_offset;
      // The chain moves forward through the buffer (the kernel lays it out
      // so); anything else ends the walk.
      uint32_t previous = 0;
      while (offset > previous &&
             offset + sizeof(vfio_info_cap_header) <= buffer.size()) {
        previous = offset;
        const auto* header =
            reinterpret_cast<const vfio_info_cap_header*>(&buffer[offset]);
        if (header->id == VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE &&
            offset + sizeof(vfio_iommu_type1_info_cap_iova_range) <=
                buffer.size()) {
          const auto* cap =
              reinterpret_cast<const vfio_iommu_type1_info_cap_iova_range*>(
                  header);
          const uint64_t fit = (buffer.size() - offset -
                                sizeof(vfio_iommu_type1_info_cap_iova_range)) /
                               sizeof(vfio_iova_range);
          for (uint32_t i = 0; i < cap->nr_iovas && i < fit; ++i) {
            ranges.push_back(
                {cap->iova_ranges[i].start, cap->iova_ranges[i].end});
          }
        } else if (header->id == VFIO_IOMMU_TYPE1_INFO_DMA_AVAIL &&
                   offset + sizeof(vfio_iommu_type1_info_dma_avail) <=
                       buffer.size()) {
          dma_mappings_left_ =
              reinterpret_cast<const vfio_iommu_type1_info_dma_avail*>(header)
                  ->avail;
        }
        offset = header->next;
      }
    }
  }
  if (ranges.empty()) ranges.push_back({0, ~uint64_t{0}});
  const uint64_t dma_limit =
      options.dma_address_bits >= 64
          ? ~uint64_t{0}
          : (uint64_t{1} << options.dma_address_bits) - 1;
  for (IovaSpace::Range& r : ranges) r.last = std::min(r.last, dma_limit);
  {
    MutexLock lock(&mu_);
    iova_ = std::make_unique<IovaSpace>(ranges, iova_page_);
    iova_guard_ = iova_->guard_page();
  }

  // The device.
  absl::StatusOr<int> device_fd =
      os_->Ioctl(group_fd_, VFIO_GROUP_GET_DEVICE_FD,
                 const_cast<char*>(bdf.c_str()), "VFIO_GROUP_GET_DEVICE_FD");
  if (!device_fd.ok()) {
    return Annotate(
        device_fd.status(),
        absl::StrCat("cannot get ", bdf, " from IOMMU group ", group_number_));
  }
  device_fd_ = *device_fd;
  vfio_device_info device_info{};
  device_info.argsz = sizeof(device_info);
  TPUSHIM_RETURN_IF_ERROR(os_->Ioctl(device_fd_, VFIO_DEVICE_GET_INFO,
                                     &device_info, "VFIO_DEVICE_GET_INFO")
                              .status());
  if ((device_info.flags & VFIO_DEVICE_FLAGS_PCI) == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(bdf, " is not a PCI device to VFIO"));
  }
  can_reset_ = (device_info.flags & VFIO_DEVICE_FLAGS_RESET) != 0;
  vfio_region_info config{};
  config.argsz = sizeof(config);
  config.index = VFIO_PCI_CONFIG_REGION_INDEX;
  TPUSHIM_RETURN_IF_ERROR(os_->Ioctl(device_fd_, VFIO_DEVICE_GET_REGION_INFO,
                                     &config, "VFIO_DEVICE_GET_REGION_INFO")
                              .status());
  config_offset_ = config.offset;
  TPUSHIM_ASSIGN_OR_RETURN(vendor_id_, ReadConfig16(PCI_VENDOR_ID));
  TPUSHIM_ASSIGN_OR_RETURN(device_id_, ReadConfig16(PCI_DEVICE_ID));
  TPUSHIM_ASSIGN_OR_RETURN(uint32_t class_rev,
                           ReadConfig32(PCI_CLASS_REVISION));
  class_code_ = class_rev >> 8;
  vfio_irq_info irq{};
  irq.argsz = sizeof(irq);
  irq.index = VFIO_PCI_MSIX_IRQ_INDEX;
  if (device_info.num_irqs > VFIO_PCI_MSIX_IRQ_INDEX) {
    TPUSHIM_RETURN_IF_ERROR(os_->Ioctl(device_fd_, VFIO_DEVICE_GET_IRQ_INFO,
                                       &irq, "VFIO_DEVICE_GET_IRQ_INFO")
                                .status());
    if ((irq.flags & VFIO_IRQ_INFO_EVENTFD) != 0) msix_vectors_ = irq.count;
  }
  bars_.resize(VFIO_PCI_ROM_REGION_INDEX);
  if (options.reset && can_reset_) {
    TPUSHIM_RETURN_IF_ERROR(Reset());
    reset_on_close_ = true;
  }
  return absl::OkStatus();
}

VfioDevice::~VfioDevice() {
  DisableMsix();
  std::map<uint64_t, uint64_t> left;
  {
    MutexLock lock(&mu_);
    for (const auto& [iova, m] : mappings_) left[iova] = m.length;
  }
  // Every step is undone even if one fails: closing the container below
  // drops whatever the IOMMU still holds, and closing the device turns its
  // interrupts off.
  for (const auto& [iova, length] : left) {
    absl::Status s = UnmapDma(iova, length);
    if (!s.ok()) LOG(WARNING) << "Closing " << name() << ": " << s;
  }
  if (reset_on_close_) {
    absl::Status s = Reset();
    if (!s.ok()) LOG(WARNING) << "Closing " << name() << ": " << s;
  }
  for (const Bar& bar : bars_) {
    if (bar.base != nullptr) {
      (void)os_->Munmap(const_cast<uint8_t*>(bar.base), bar.size);
    }
  }
  if (device_fd_ >= 0) (void)os_->Close(device_fd_);
  if (group_fd_ >= 0) (void)os_->Close(group_fd_);
  if (container_fd_ >= 0) (void)os_->Close(container_fd_);
}

absl::StatusOr<uint16_t> VfioDevice::ReadConfig16(uint32_t offset) {
  uint16_t value = 0;
  TPUSHIM_RETURN_IF_ERROR(os_->PreadAll(device_fd_, &value, sizeof(value),
                                        config_offset_ + offset));
  return value;
}

absl::StatusOr<uint32_t> VfioDevice::ReadConfig32(uint32_t offset) {
  uint32_t value = 0;
  TPUSHIM_RETURN_IF_ERROR(os_->PreadAll(device_fd_, &value, sizeof(value),
                                        config_offset_ + offset));
  return value;
}

absl::Status VfioDevice::WriteConfig16(uint32_t offset, uint16_t value) {
  return os_->PwriteAll(device_fd_, &value, sizeof(value),
                        config_offset_ + offset);
}

absl::Status VfioDevice::EnableBusMastering() {
  TPUSHIM_ASSIGN_OR_RETURN(uint16_t command, ReadConfig16(PCI_COMMAND));
  const uint16_t wanted = command | PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER;
  if (wanted == command) return absl::OkStatus();
  TPUSHIM_RETURN_IF_ERROR(WriteConfig16(PCI_COMMAND, wanted));
  TPUSHIM_ASSIGN_OR_RETURN(command, ReadConfig16(PCI_COMMAND));
  if ((command & PCI_COMMAND_MASTER) == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        name(),
        " does not keep Bus Master Enable set in its command register"));
  }
  return absl::OkStatus();
}

absl::StatusOr<VfioDevice::Bar> VfioDevice::MapBar(int index) {
  if (index < 0 || index >= static_cast<int>(bars_.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("BAR ", index, " does not exist (0..5)"));
  }
  if (bars_[index].base != nullptr) return bars_[index];
  vfio_region_info region{};
  region.argsz = sizeof(region);
  region.index = static_cast<uint32_t>(index);
  TPUSHIM_RETURN_IF_ERROR(os_->Ioctl(device_fd_, VFIO_DEVICE_GET_REGION_INFO,
                                     &region, "VFIO_DEVICE_GET_REGION_INFO")
                              .status());
  if (region.size == 0 || (region.flags & VFIO_REGION_INFO_FLAG_MMAP) == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "BAR ", index, " of ", name(),
        region.size == 0 ? " is not implemented" : " cannot be mmapped"));
  }
  TPUSHIM_ASSIGN_OR_RETURN(
      void* base,
      os_->Mmap(nullptr, region.size, PROT_READ | PROT_WRITE, MAP_SHARED,
                device_fd_, static_cast<off_t>(region.offset)));
  bars_[index] =
      Bar{.base = static_cast<volatile uint8_t*>(base), .size = region.size};
  return bars_[index];
}

absl::StatusOr<std::vector<int>> VfioDevice::EnableMsix(uint32_t count) {
  if (count == 0 || count > msix_vectors_) {
    return absl::InvalidArgumentError(absl::StrCat("MSI-X vectors: asked for ",
                                                   count, ", ", name(), " has ",
                                                   msix_vectors_));
  }
  DisableMsix();
  std::vector<int> fds;
  absl::Cleanup close_fds = [&] {
    for (int fd : fds) (void)os_->Close(fd);
  };
  for (uint32_t i = 0; i < count; ++i) {
    TPUSHIM_ASSIGN_OR_RETURN(int fd, os_->CreateEventFd());
    fds.push_back(fd);
  }
  std::vector<uint8_t> buffer(sizeof(vfio_irq_set) + count * sizeof(int32_t));
  auto* set = reinterpret_cast<vfio_irq_set*>(buffer.data());
  set->argsz = static_cast<uint32_t>(buffer.size());
  set->flags = VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER;
  set->index = VFIO_PCI_MSIX_IRQ_INDEX;
  set->start = 0;
  set->count = count;
  std::memcpy(set->data, fds.data(), count * sizeof(int32_t));
  TPUSHIM_RETURN_IF_ERROR(
      os_->Ioctl(device_fd_, VFIO_DEVICE_SET_IRQS, set, "VFIO_DEVICE_SET_IRQS")
          .status());
  std::move(close_fds).Cancel();
  msix_fds_ = fds;
  return fds;
}

void VfioDevice::DisableMsix() {
  if (msix_fds_.empty()) return;
  vfio_irq_set set{};
  set.argsz = sizeof(set);
  set.flags = VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_TRIGGER;
  set.index = VFIO_PCI_MSIX_IRQ_INDEX;
  set.start = 0;
  set.count = 0;
  absl::Status s =
      os_->Ioctl(device_fd_, VFIO_DEVICE_SET_IRQS, &set, "VFIO_DEVICE_SET_IRQS")
          .status();
  if (!s.ok()) {
    LOG(WARNING) << "Turning the MSI-X vectors of " << name() << " off: " << s
                 << " (closing the device turns them off)";
  }
  for (int fd : msix_fds_) (void)os_->Close(fd);
  msix_fds_.clear();
}

absl::Status VfioDevice::Reset() {
  if (!can_reset_) {
    return absl::FailedPreconditionError(
        absl::StrCat(name(), " supports no reset through VFIO"));
  }
  return os_->Ioctl(device_fd_, VFIO_DEVICE_RESET, nullptr, "VFIO_DEVICE_RESET")
      .status();
}

absl::Status VfioDevice::CheckMemlock(uint64_t more_bytes) {
  if (os_->HasIpcLockCapability()) return absl::OkStatus();
  TPUSHIM_ASSIGN_OR_RETURN(ResourceLimit limit, os_->GetMemlockLimit());
  if (limit.soft == ResourceLimit::kUnlimited) return absl::OkStatus();
  const uint64_t locked = LockedBytes(*os_);
  if (locked + more_bytes <= limit.soft) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "the memlock limit (", BytesWithHumanReadable(limit.soft),
      ") cannot cover IOMMU-mapping ", BytesWithHumanReadable(more_bytes),
      " for ", name(), " on top of the ", BytesWithHumanReadable(locked),
      " this process has locked: VFIO pins mapped pages and charges them to "
      "RLIMIT_MEMLOCK; raise it (ulimit -l, LimitMEMLOCK= for a systemd "
      "service, memlock in /etc/security/limits.conf) or run with "
      "CAP_IPC_LOCK"));
}

absl::Status VfioDevice::CheckWholePages(const void* vaddr,
                                         uint64_t length) const {
  const auto address = reinterpret_cast<uintptr_t>(vaddr);
  if (length != 0 && address % iova_page_ == 0 && length % iova_page_ == 0) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "IOMMU mapping of %p, %d bytes for %s: both must be whole %d-byte "
      "IOMMU pages",
      vaddr, length, name(), iova_page_));
}

absl::StatusOr<uint64_t> VfioDevice::MapDma(const void* vaddr, uint64_t length,
                                            uint64_t chunk,
                                            const Progress& progress) {
  const auto address = reinterpret_cast<uintptr_t>(vaddr);
  TPUSHIM_RETURN_IF_ERROR(CheckWholePages(vaddr, length));
  if (chunk == 0 || chunk > length) chunk = length;
  chunk = (chunk + iova_page_ - 1) / iova_page_ * iova_page_;
  const uint64_t calls = (length + chunk - 1) / chunk;
  TPUSHIM_RETURN_IF_ERROR(CheckMemlock(length));
  uint64_t iova = 0;
  {
    MutexLock lock(&mu_);
    // Each MAP_DMA call is one of the kernel's entries: reserve them all.
    if (dma_entries_ + calls > dma_mappings_left_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the IOMMU of ", name(), " takes no more than ", dma_mappings_left_,
          " DMA mappings (vfio_iommu_type1 dma_entry_limit); ", dma_entries_,
          " are in use and this one needs ", calls));
    }
    absl::StatusOr<uint64_t> got = iova_->Allocate(length);
    if (!got.ok()) {
      return Annotate(got.status(), absl::StrCat("IOMMU mapping of ",
                                                 HumanReadableBytes(length),
                                                 " for ", name()));
    }
    iova = *got;
    dma_entries_ += calls;
  }
  uint64_t done = 0;
  absl::Status status;
  while (done < length) {
    const uint64_t n = std::min(chunk, length - done);
    vfio_iommu_type1_dma_map map{};
    map.argsz = sizeof(map);
    map.flags = VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE;
    map.vaddr = address + done;
    map.iova = iova + done;
    map.size = n;
    status = os_->Ioctl(container_fd_, VFIO_IOMMU_MAP_DMA, &map,
                        "VFIO_IOMMU_MAP_DMA")
                 .status();
    if (!status.ok()) break;
    done += n;
    if (progress) progress(done, length);
  }
  if (!status.ok()) {
    bool undone = true;
    if (done > 0) {
      vfio_iommu_type1_dma_unmap unmap{};
      unmap.argsz = sizeof(unmap);
      unmap.iova = iova;
      unmap.size = done;
      absl::Status s = os_->Ioctl(container_fd_, VFIO_IOMMU_UNMAP_DMA, &unmap,
                                  "VFIO_IOMMU_UNMAP_DMA")
                           .status();
      if (!s.ok()) {
        undone = false;
        LOG(WARNING) << "Undoing a failed IOMMU mapping of " << name() << ": "
                     << s << "; its IOVA range stays out of use";
      }
    }
    MutexLock lock(&mu_);
    if (undone) {
      iova_->Free(iova, length);
      dma_entries_ -= calls;
    } else {
      // What is still mapped keeps its IOVAs and its kernel entries (the
      // container's close drops them); the rest is given back.
      dma_entries_ -= calls - (done + chunk - 1) / chunk;
    }
    return Annotate(status,
                    absl::StrFormat("IOMMU mapping of %p, %s for %s", vaddr,
                                    HumanReadableBytes(length), name()));
  }
  MutexLock lock(&mu_);
  mappings_[iova] = Mapping{
      .length = length, .entries = calls, .vaddr = address, .mapped = length};
  mapped_bytes_ += length;
  return iova;
}

absl::StatusOr<uint64_t> VfioDevice::ReserveDma(const void* vaddr,
                                                uint64_t length) {
  const auto address = reinterpret_cast<uintptr_t>(vaddr);
  TPUSHIM_RETURN_IF_ERROR(CheckWholePages(vaddr, length));
  // The limit must cover all of it, as for MapDma: a start-up error now,
  // not premapping that stops part-way.
  TPUSHIM_RETURN_IF_ERROR(CheckMemlock(length));
  MutexLock lock(&mu_);
  absl::StatusOr<uint64_t> iova = iova_->Allocate(length);
  if (!iova.ok()) {
    return Annotate(iova.status(),
                    absl::StrCat("IOMMU mapping of ",
                                 HumanReadableBytes(length), " for ", name()));
  }
  mappings_[*iova] = Mapping{.length = length, .vaddr = address};
  return *iova;
}

absl::Status VfioDevice::GrowDma(uint64_t iova, uint64_t mapped) {
  uint64_t from;
  uintptr_t vaddr;
  {
    MutexLock lock(&mu_);
    auto it = mappings_.find(iova);
    if (it == mappings_.end()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "no IOMMU mapping at IOVA 0x%x on %s to grow", iova, name()));
    }
    mapped = std::min(it->second.length,
                      (mapped + iova_page_ - 1) / iova_page_ * iova_page_);
    from = it->second.mapped;
    if (mapped <= from) return absl::OkStatus();
    if (dma_entries_ + 1 > dma_mappings_left_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the IOMMU of ", name(), " takes no more than ", dma_mappings_left_,
          " DMA mappings (vfio_iommu_type1 dma_entry_limit); ", dma_entries_,
          " are in use"));
    }
    ++dma_entries_;  // reserved for this call
    vaddr = it->second.vaddr;
  }
  absl::Status status = CheckMemlock(mapped - from);
  if (status.ok()) {
    vfio_iommu_type1_dma_map map{};
    map.argsz = sizeof(map);
    map.flags = VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE;
    map.vaddr = vaddr + from;
    map.iova = iova + from;
    map.size = mapped - from;
    status = os_->Ioctl(container_fd_, VFIO_IOMMU_MAP_DMA, &map,
                        "VFIO_IOMMU_MAP_DMA")
                 .status();
  }
  MutexLock lock(&mu_);
  if (!status.ok()) {
    --dma_entries_;
    return Annotate(
        status, absl::StrFormat("IOMMU mapping of %s more at IOVA 0x%x for %s",
                                HumanReadableBytes(mapped - from), iova + from,
                                name()));
  }
  // REQUIRES (header): no UnmapDma of this mapping meanwhile.
  Mapping& m = mappings_.at(iova);
  ++m.entries;
  m.mapped = mapped;
  mapped_bytes_ += mapped - from;
  return absl::OkStatus();
}

absl::Status VfioDevice::UnmapDma(uint64_t iova, uint64_t length) {
  uint64_t entries;
  uint64_t mapped;
  {
    MutexLock lock(&mu_);
    auto it = mappings_.find(iova);
    if (it == mappings_.end() || it->second.length != length) {
      return absl::InvalidArgumentError(
          absl::StrFormat("no IOMMU mapping of %d bytes at IOVA 0x%x on %s",
                          length, iova, name()));
    }
    entries = it->second.entries;
    mapped = it->second.mapped;
    mappings_.erase(it);
    mapped_bytes_ -= mapped;
  }
  absl::Status status;
  if (mapped > 0) {  // a reserved mapping may have nothing mapped yet
    vfio_iommu_type1_dma_unmap unmap{};
    unmap.argsz = sizeof(unmap);
    unmap.iova = iova;
    unmap.size = mapped;
    status = os_->Ioctl(container_fd_, VFIO_IOMMU_UNMAP_DMA, &unmap,
                        "VFIO_IOMMU_UNMAP_DMA")
                 .status();
  }
  // The IOVA range and the kernel entries are given back only when the
  // IOMMU no longer maps them; otherwise they stay out of use until the
  // container's close drops them.
  if (status.ok()) {
    MutexLock lock(&mu_);
    iova_->Free(iova, length);
    dma_entries_ -= entries;
  }
  return status;
}

uint64_t VfioDevice::mapped_bytes() const {
  MutexLock lock(&mu_);
  return mapped_bytes_;
}

}  // namespace tpushim
