// A fake Linux kernel for VFIO, for tests of what runs on a PCI function
// through vfio:// without VFIO hardware: FakeHost describes the host (the
// function, its IOMMU group, VFIO, the IOMMU, the device's config space,
// BAR 0 and MSI-X) with knobs that break each the way Linux does, and
// FakeVfioOs answers the sysfs reads, the /dev/vfio opens and the VFIO
// ioctls as Linux does (include/uapi/linux/vfio.h, drivers/vfio/).
//
// A device model (tests/device/fake_nvme_controller.h) sits on top: it
// reads and writes BAR 0 (ordinary memory standing in for the registers),
// reaches host memory through the IOMMU's live mappings (Translate), and
// signals MSI-X vectors (SignalVector).
//
// Thread-safety: the IOMMU's mappings and the MSI-X eventfds are guarded,
// so a device model's thread may translate and signal while the code under
// test maps and unmaps; everything else is driven from the test's thread.

#ifndef TPUSHIM_TESTS_DEVICE_FAKE_VFIO_OS_H_
#define TPUSHIM_TESTS_DEVICE_FAKE_VFIO_OS_H_

#include <fcntl.h>
#include <linux/pci_regs.h>
#include <linux/vfio.h>
#include <sys/mman.h>

#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "env/device_url.h"
#include "env/os.h"
#include "tests/testing/fake_tree.h"

namespace tpushim::fake_vfio {

inline constexpr uint64_t kKiB = uint64_t{1} << 10;
inline constexpr uint64_t kMiB = uint64_t{1} << 20;
inline constexpr uint64_t kGiB = uint64_t{1} << 30;

// The host FakeVfioOs shows: one PCI function, its IOMMU group, VFIO, the
// IOMMU and the device, plus knobs that break each in the way Linux does.
struct FakeHost {
  // sysfs.
  std::string address = "0000:01:00.0";
  bool sysfs_node = true;               // /sys/bus/pci/devices/<address>
  std::string driver = "vfio-pci";      // "": no driver link
  std::optional<int> iommu_group = 12;  // nullopt: no iommu_group link
  std::string numa_node = "1\n";
  // The other functions in the group: address -> driver ("": none).
  std::map<std::string, std::string> other_members = {};

  // /dev/vfio.
  bool vfio_module = true;  // /dev/vfio/vfio exists
  int group_open_errno = 0;
  std::string user = "alice";

  // The container and the group.
  int api_version = VFIO_API_VERSION;
  bool type1v2 = true;
  bool viable = true;
  int set_iommu_errno = 0;
  uint64_t iova_pgsizes = 4 * kKiB | 2 * kMiB | kGiB;
  // The IOVA-range capability (none when empty).
  std::vector<vfio_iova_range> iova_ranges = {{0, 0xfedfffff},
                                              {0xfef00000, 0xffffffffffff}};
  // The DMA-avail capability (vfio_iommu_type1's dma_entry_limit left);
  // nullopt: none, and no limit.
  std::optional<uint32_t> dma_avail = 65535;

  // The device.
  uint32_t device_flags = VFIO_DEVICE_FLAGS_PCI | VFIO_DEVICE_FLAGS_RESET;
  uint32_t msix_vectors = 16;
  uint64_t bar0_size = 16 * kKiB;
  bool bar0_mmap = true;
  uint16_t vendor_id = 0x1b36;
  uint16_t device_id = 0x0010;
  uint32_t class_code = 0x010802;
  uint8_t revision = 0x02;
  uint16_t command = PCI_COMMAND_INTX_DISABLE;
  uint16_t command_keeps = 0xffff;  // command bits a write can set

  // IOMMU mappings.
  int map_dma_fails_at = 0;    // n > 0: the n-th MAP_DMA fails...
  int map_dma_errno = ENOMEM;  // ... with this
  int unmap_dma_failures = 0;  // the next n UNMAP_DMAs fail with EIO

  // The memlock limit.
  bool ipc_lock = false;
  uint64_t memlock_soft = ResourceLimit::kUnlimited;
  uint64_t vmlck_kib = 0;  // locked besides what the IOMMU pins

  // The rest of sysfs and procfs (disks, mounts, interfaces): what the host
  // uses behind the function, read before any advice to rebind it.
  FakeTree tree = FakeTree::QuietHost();
};

// Where the fake puts the config space and BAR 0 in the device descriptor
// (vfio-pci: region index << 40).
inline constexpr uint64_t kConfigOffset = uint64_t{VFIO_PCI_CONFIG_REGION_INDEX}
                                          << 40;
inline constexpr uint64_t kBar0Offset = uint64_t{VFIO_PCI_BAR0_REGION_INDEX}
                                        << 40;

// A fake Linux for VfioDevice. Every descriptor it hands out is a real
// eventfd (so that FaultInjectingOs tracks real numbers and Close works);
// anything it does not fake goes to Os::Default(). It keeps what a kernel
// keeps — the IOMMU's mappings, the mapping count left, interrupts, the
// command register — and records what the device asked. The IOMMU and
// MSI-X state is locked (see the top of this file); the rest is driven from
// one thread.
class FakeVfioOs : public OsWrapper {
 public:
  explicit FakeVfioOs(FakeHost host)
      : OsWrapper(Os::Default()),
        host_(std::move(host)),
        dma_avail_(host_.dma_avail.value_or(~0u)),
        unmap_failures_left_(host_.unmap_dma_failures) {
    Put16(PCI_VENDOR_ID, host_.vendor_id);
    Put16(PCI_DEVICE_ID, host_.device_id);
    Put16(PCI_COMMAND, host_.command);
    config_[PCI_REVISION_ID] = host_.revision;
    config_[PCI_CLASS_PROG] = host_.class_code & 0xff;
    config_[PCI_CLASS_DEVICE] = (host_.class_code >> 8) & 0xff;
    config_[PCI_CLASS_DEVICE + 1] = (host_.class_code >> 16) & 0xff;
  }

  // Releases whatever a failed test left, so that it leaks nothing.
  ~FakeVfioOs() override {
    for (const auto& [base, length] : bars_)
      (void)target()->Munmap(base, length);
    for (const std::set<int>* fds :
         {&container_fds_, &group_fds_, &device_fds_, &event_fds_}) {
      for (int fd : *fds) (void)target()->Close(fd);
    }
  }

  PciAddress address() const {
    return PciAddress::Parse(host_.address).value();
  }

  // ---- What the device did, and what the kernel holds -----------------------

  // Descriptors handed out (container, group, device, eventfds) and still
  // open.
  size_t open_fds() const {
    return container_fds_.size() + group_fds_.size() + device_fds_.size() +
           event_fds_.size();
  }
  // The IOMMU's live mappings: iova -> size.
  const std::map<uint64_t, uint64_t>& mappings() const { return mappings_; }
  // Every VFIO_IOMMU_MAP_DMA asked, the failed ones included.
  const std::vector<vfio_iommu_type1_dma_map>& map_calls() const {
    return map_calls_;
  }
  // Every VFIO_IOMMU_UNMAP_DMA asked: (iova, size).
  const std::vector<std::pair<uint64_t, uint64_t>>& unmap_calls() const {
    return unmap_calls_;
  }
  // Mappings the device left for the container's close to drop.
  size_t mappings_dropped_at_close() const { return dropped_at_close_; }
  uint32_t dma_avail() const { return dma_avail_; }
  int resets() const { return resets_; }
  uint16_t command() const { return Get16(PCI_COMMAND); }
  int config_writes() const { return config_writes_; }
  // BAR bytes mmapped right now.
  uint64_t bar_bytes() const {
    uint64_t total = 0;
    for (const auto& [base, length] : bars_) total += length;
    return total;
  }
  // The eventfds MSI-X vectors 0.. signal (empty: MSI-X off).
  const std::vector<int>& msix_fds() const { return msix_fds_; }
  int set_irqs_calls() const { return set_irqs_calls_; }
  bool is_event_fd(int fd) const { return event_fds_.contains(fd); }
  int iommu_info_calls() const { return iommu_info_calls_; }

  // ---- For a device model
  // ----------------------------------------------------

  // Where the device's DMA to [iova, iova + bytes) lands in this process,
  // or nullptr when the IOMMU has no single mapping covering it (the IOMMU
  // blocks such DMA).
  uint8_t* Translate(uint64_t iova, uint64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = mappings_.upper_bound(iova);
    if (it == mappings_.begin()) return nullptr;
    --it;
    const uint64_t offset = iova - it->first;
    if (offset >= it->second || bytes > it->second - offset) return nullptr;
    return reinterpret_cast<uint8_t*>(vaddrs_.at(it->first) + offset);
  }
  // Raises MSI-X vector `vector` when it has an eventfd; false otherwise.
  bool SignalVector(uint32_t vector) {
    std::lock_guard<std::mutex> lock(mu_);
    if (vector >= msix_fds_.size()) return false;
    return target()->SignalEventFd(msix_fds_[vector]).ok();
  }
  // Called when the code under test maps BAR 0 (before it reads a
  // register) and before it unmaps it: a device model starts and stops
  // there.
  void OnBar0(std::function<void(uint8_t* base, uint64_t size)> mapped,
              std::function<void()> unmapping) {
    bar_mapped_ = std::move(mapped);
    bar_unmapping_ = std::move(unmapping);
  }
  // BAR 0 as mapped by the code under test (nullptr before it maps it).
  uint8_t* bar0() {
    std::lock_guard<std::mutex> lock(mu_);
    return bars_.empty() ? nullptr
                         : static_cast<uint8_t*>(bars_.begin()->first);
  }

  // ---- sysfs, procfs and the memlock limit ----------------------------------

  absl::StatusOr<FileInfo> Stat(const std::string& path) override {
    if (host_.sysfs_node && path == Sysfs()) {
      return FileInfo{.type = FileInfo::Type::kDirectory, .mode = 0755};
    }
    return NoSuchFile("stat", path);
  }

  absl::StatusOr<std::string> ReadLink(const std::string& path) override {
    if (host_.sysfs_node && path == Sysfs() + "/driver" &&
        !host_.driver.empty()) {
      return DriverLink(host_.driver);
    }
    if (host_.sysfs_node && path == Sysfs() + "/iommu_group" &&
        host_.iommu_group.has_value()) {
      return absl::StrCat("../../../kernel/iommu_groups/", *host_.iommu_group);
    }
    for (const auto& [member, driver] : host_.other_members) {
      if (path == absl::StrCat("/sys/bus/pci/devices/", member, "/driver") &&
          !driver.empty()) {
        return DriverLink(driver);
      }
    }
    if (auto answer = host_.tree.ReadLink(path)) return *answer;
    return NoSuchFile("readlink", path);
  }

  absl::StatusOr<std::string> ReadFile(const std::string& path) override {
    if (host_.sysfs_node && path == Sysfs() + "/numa_node") {
      return host_.numa_node;
    }
    if (path == "/proc/self/status") {
      // The kernel charges the pages VFIO pins to locked_vm: VmLck.
      std::lock_guard<std::mutex> lock(mu_);
      uint64_t pinned = 0;
      for (const auto& [iova, size] : mappings_) pinned += size;
      return absl::StrCat("Name:\ttpushim_test\nVmPeak:\t  123456 kB\n",
                          "VmLck:\t", host_.vmlck_kib + pinned / kKiB,
                          " kB\nVmPin:\t       0 kB\n");
    }
    if (auto answer = host_.tree.ReadFile(path)) return *answer;
    return NoSuchFile("open", path);
  }

  absl::StatusOr<std::vector<std::string>> ListDirectory(
      const std::string& path) override {
    if (host_.iommu_group.has_value() &&
        path == absl::StrCat("/sys/kernel/iommu_groups/", *host_.iommu_group,
                             "/devices")) {
      // In no particular order, as readdir gives them.
      std::vector<std::string> names;
      for (const auto& [member, driver] : host_.other_members) {
        names.push_back(member);
      }
      names.push_back(host_.address);
      return names;
    }
    if (auto answer = host_.tree.ListDirectory(path)) return *answer;
    return NoSuchFile("opendir", path);
  }

  absl::StatusOr<ResourceLimit> GetMemlockLimit() override {
    return ResourceLimit{.soft = host_.memlock_soft,
                         .hard = host_.memlock_soft};
  }
  bool HasIpcLockCapability() override { return host_.ipc_lock; }
  std::string UserName() override { return host_.user; }

  // ---- Descriptors ----------------------------------------------------------

  absl::StatusOr<int> OpenDevice(const std::string& path, int flags) override {
    if ((flags & O_ACCMODE) != O_RDWR) {
      return absl::ErrnoToStatus(EINVAL, absl::StrCat("open(", path, ")"));
    }
    if (path == "/dev/vfio/vfio" && host_.vfio_module) {
      return NewFd(container_fds_);
    }
    if (host_.iommu_group.has_value() &&
        path == absl::StrCat("/dev/vfio/", *host_.iommu_group)) {
      if (host_.group_open_errno != 0) {
        return absl::ErrnoToStatus(host_.group_open_errno,
                                   absl::StrCat("open(", path, ")"));
      }
      // A group opens once at a time.
      if (!group_fds_.empty()) {
        return absl::ErrnoToStatus(EBUSY, absl::StrCat("open(", path, ")"));
      }
      return NewFd(group_fds_);
    }
    return NoSuchFile("open", path);
  }

  absl::StatusOr<int> CreateEventFd() override { return NewFd(event_fds_); }

  absl::Status Close(int fd) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (container_fds_.erase(fd) > 0) {
      // The last reference to the container: the IOMMU drops everything.
      dropped_at_close_ += mappings_.size();
      mappings_.clear();
      vaddrs_.clear();
      dma_avail_ = host_.dma_avail.value_or(~0u);
      group_in_container_ = false;
      iommu_set_ = false;
    } else if (group_fds_.erase(fd) > 0) {
      group_in_container_ = false;
    } else if (device_fds_.erase(fd) > 0) {
      msix_fds_.clear();
    } else if (event_fds_.erase(fd) == 0) {
      lock.unlock();
      return OsWrapper::Close(fd);
    }
    return target()->Close(fd);
  }

  // ---- The device descriptor: config space and BARs -------------------------

  absl::Status PreadAll(int fd, void* data, size_t size,
                        uint64_t offset) override {
    if (!device_fds_.contains(fd)) {
      return OsWrapper::PreadAll(fd, data, size, offset);
    }
    if (!InConfig(offset, size)) return absl::ErrnoToStatus(EINVAL, "pread");
    std::memcpy(data, &config_[offset - kConfigOffset], size);
    return absl::OkStatus();
  }

  absl::Status PwriteAll(int fd, const void* data, size_t size,
                         uint64_t offset) override {
    if (!device_fds_.contains(fd)) {
      return OsWrapper::PwriteAll(fd, data, size, offset);
    }
    if (!InConfig(offset, size)) return absl::ErrnoToStatus(EINVAL, "pwrite");
    ++config_writes_;
    std::memcpy(&config_[offset - kConfigOffset], data, size);
    Put16(PCI_COMMAND, Get16(PCI_COMMAND) & host_.command_keeps);
    return absl::OkStatus();
  }

  absl::StatusOr<void*> Mmap(void* addr, size_t length, int prot, int flags,
                             int fd, off_t offset) override {
    if (!device_fds_.contains(fd)) {
      return OsWrapper::Mmap(addr, length, prot, flags, fd, offset);
    }
    if (static_cast<uint64_t>(offset) != kBar0Offset || !host_.bar0_mmap ||
        length == 0 || length > host_.bar0_size || (flags & MAP_SHARED) == 0) {
      return absl::ErrnoToStatus(EINVAL, "mmap of the device");
    }
    // Ordinary memory stands in for the BAR.
    absl::StatusOr<void*> p = target()->Mmap(
        nullptr, length, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p.ok()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        bars_[*p] = length;
      }
      if (bar_mapped_) bar_mapped_(static_cast<uint8_t*>(*p), length);
    }
    return p;
  }

  absl::Status Munmap(void* addr, size_t length) override {
    bool bar = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      bar = bars_.erase(addr) > 0;
    }
    if (bar && bar_unmapping_) bar_unmapping_();
    return OsWrapper::Munmap(addr, length);
  }

  // ---- The ioctls -----------------------------------------------------------

  absl::StatusOr<int> Ioctl(int fd, unsigned long request, void* arg,
                            const char* name) override {
    const auto fail = [name](int err) {
      return absl::ErrnoToStatus(err, absl::StrCat("ioctl(", name, ")"));
    };
    std::lock_guard<std::mutex> lock(mu_);
    if (container_fds_.contains(fd)) return ContainerIoctl(request, arg, fail);
    if (group_fds_.contains(fd)) return GroupIoctl(request, arg, fail);
    if (device_fds_.contains(fd)) return DeviceIoctl(request, arg, fail);
    return fail(EBADF);
  }

 private:
  using Fail = std::function<absl::Status(int)>;

  absl::StatusOr<int> ContainerIoctl(unsigned long request, void* arg,
                                     const Fail& fail) {
    switch (request) {
      case VFIO_GET_API_VERSION:
        return host_.api_version;
      case VFIO_CHECK_EXTENSION: {
        const auto extension = reinterpret_cast<uintptr_t>(arg);
        if (extension == VFIO_TYPE1_IOMMU) return 1;
        if (extension == VFIO_TYPE1v2_IOMMU) return host_.type1v2 ? 1 : 0;
        return 0;
      }
      case VFIO_SET_IOMMU:
        if (!group_in_container_) return fail(EINVAL);
        if (iommu_set_) return fail(EBUSY);
        if (reinterpret_cast<uintptr_t>(arg) != VFIO_TYPE1v2_IOMMU ||
            !host_.type1v2) {
          return fail(ENODEV);
        }
        if (host_.set_iommu_errno != 0) return fail(host_.set_iommu_errno);
        iommu_set_ = true;
        return 0;
      case VFIO_IOMMU_GET_INFO:
        if (!iommu_set_) return fail(EINVAL);
        return GetIommuInfo(static_cast<uint8_t*>(arg), fail);
      case VFIO_IOMMU_MAP_DMA:
        if (!iommu_set_) return fail(EINVAL);
        return MapDma(static_cast<vfio_iommu_type1_dma_map*>(arg), fail);
      case VFIO_IOMMU_UNMAP_DMA:
        if (!iommu_set_) return fail(EINVAL);
        return UnmapDma(static_cast<vfio_iommu_type1_dma_unmap*>(arg), fail);
      default:
        return fail(ENOTTY);
    }
  }

  absl::StatusOr<int> GroupIoctl(unsigned long request, void* arg,
                                 const Fail& fail) {
    switch (request) {
      case VFIO_GROUP_GET_STATUS: {
        auto* status = static_cast<vfio_group_status*>(arg);
        if (status->argsz < sizeof(*status)) return fail(EINVAL);
        status->flags =
            (host_.viable ? VFIO_GROUP_FLAGS_VIABLE : 0) |
            (group_in_container_ ? VFIO_GROUP_FLAGS_CONTAINER_SET : 0);
        return 0;
      }
      case VFIO_GROUP_SET_CONTAINER: {
        const int container = *static_cast<const int*>(arg);
        if (!container_fds_.contains(container)) return fail(EBADF);
        if (!host_.viable) return fail(EPERM);
        if (group_in_container_) return fail(EBUSY);
        group_in_container_ = true;
        return 0;
      }
      case VFIO_GROUP_GET_DEVICE_FD: {
        if (!group_in_container_ || !iommu_set_) return fail(EINVAL);
        if (host_.address != static_cast<const char*>(arg)) {
          return fail(ENODEV);
        }
        absl::StatusOr<int> device = NewFd(device_fds_);
        if (!device.ok()) return device.status();
        return *device;
      }
      default:
        return fail(ENOTTY);
    }
  }

  absl::StatusOr<int> DeviceIoctl(unsigned long request, void* arg,
                                  const Fail& fail) {
    switch (request) {
      case VFIO_DEVICE_GET_INFO: {
        auto* info = static_cast<vfio_device_info*>(arg);
        if (info->argsz < offsetof(vfio_device_info, num_irqs) + 4) {
          return fail(EINVAL);
        }
        info->flags = host_.device_flags;
        info->num_regions = VFIO_PCI_NUM_REGIONS;
        info->num_irqs = VFIO_PCI_NUM_IRQS;
        return 0;
      }
      case VFIO_DEVICE_GET_REGION_INFO: {
        auto* region = static_cast<vfio_region_info*>(arg);
        if (region->argsz < offsetof(vfio_region_info, offset) + 8 ||
            region->index >= VFIO_PCI_NUM_REGIONS) {
          return fail(EINVAL);
        }
        region->offset = uint64_t{region->index} << 40;
        region->size = 0;
        region->flags = 0;
        region->cap_offset = 0;
        if (region->index == VFIO_PCI_CONFIG_REGION_INDEX) {
          region->size = config_.size();
          region->flags =
              VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE;
        } else if (region->index == VFIO_PCI_BAR0_REGION_INDEX &&
                   host_.bar0_size > 0) {
          region->size = host_.bar0_size;
          region->flags = VFIO_REGION_INFO_FLAG_READ |
                          VFIO_REGION_INFO_FLAG_WRITE |
                          (host_.bar0_mmap ? VFIO_REGION_INFO_FLAG_MMAP : 0);
        }
        return 0;
      }
      case VFIO_DEVICE_GET_IRQ_INFO: {
        auto* irq = static_cast<vfio_irq_info*>(arg);
        if (irq->argsz < sizeof(*irq) || irq->index >= VFIO_PCI_NUM_IRQS) {
          return fail(EINVAL);
        }
        irq->flags = 0;
        irq->count = 0;
        if (irq->index == VFIO_PCI_MSIX_IRQ_INDEX && host_.msix_vectors > 0) {
          irq->flags = VFIO_IRQ_INFO_EVENTFD | VFIO_IRQ_INFO_NORESIZE;
          irq->count = host_.msix_vectors;
        }
        return 0;
      }
      case VFIO_DEVICE_RESET:
        if ((host_.device_flags & VFIO_DEVICE_FLAGS_RESET) == 0) {
          return fail(EINVAL);
        }
        ++resets_;
        return 0;
      case VFIO_DEVICE_SET_IRQS:
        ++set_irqs_calls_;
        return SetIrqs(static_cast<const uint8_t*>(arg), fail);
      default:
        return fail(ENOTTY);
    }
  }

  // VFIO_IOMMU_GET_INFO as vfio_iommu_type1_get_info() answers it: the
  // capability chain only when argsz has room for all of it, else argsz
  // says how much is needed.
  absl::StatusOr<int> GetIommuInfo(uint8_t* arg, const Fail& fail) {
    ++iommu_info_calls_;
    vfio_iommu_type1_info info{};
    size_t minsz = offsetof(vfio_iommu_type1_info, iova_pgsizes) + 8;
    const size_t capsz = offsetof(vfio_iommu_type1_info, cap_offset) + 4;
    std::memcpy(&info, arg, minsz);
    if (info.argsz < minsz) return fail(EINVAL);
    if (info.argsz >= capsz) {
      minsz = capsz;
      info.cap_offset = 0;
    }
    info.flags = VFIO_IOMMU_INFO_PGSIZES;
    info.iova_pgsizes = host_.iova_pgsizes;
    const std::vector<uint8_t> caps = CapabilityChain(sizeof(info));
    if (!caps.empty()) {
      info.flags |= VFIO_IOMMU_INFO_CAPS;
      if (info.argsz < sizeof(info) + caps.size()) {
        info.argsz = static_cast<uint32_t>(sizeof(info) + caps.size());
      } else {
        std::memcpy(arg + sizeof(info), caps.data(), caps.size());
        info.cap_offset = sizeof(info);
      }
    }
    std::memcpy(arg, &info, minsz);
    return 0;
  }

  // The capabilities as the kernel chains them (migration, DMA-avail, IOVA
  // ranges), each 8-byte aligned, `next` counted from the start of the info
  // struct, which they follow at `base`.
  std::vector<uint8_t> CapabilityChain(size_t base) const {
    std::vector<uint8_t> chain;
    size_t last_header = SIZE_MAX;
    const auto add = [&](const void* cap, size_t size) {
      const size_t at = chain.size();
      if (last_header != SIZE_MAX) {
        vfio_info_cap_header header;
        std::memcpy(&header, &chain[last_header], sizeof(header));
        header.next = static_cast<uint32_t>(base + at);
        std::memcpy(&chain[last_header], &header, sizeof(header));
      }
      chain.resize(at + (size + 7) / 8 * 8, 0);
      std::memcpy(&chain[at], cap, size);
      last_header = at;
    };
    // One the device does not read: it must skip it.
    vfio_iommu_type1_info_cap_migration migration{};
    migration.header = {
        .id = VFIO_IOMMU_TYPE1_INFO_CAP_MIGRATION, .version = 1, .next = 0};
    migration.pgsize_bitmap = host_.iova_pgsizes;
    migration.max_dirty_bitmap_size = 256 * kMiB;
    add(&migration, sizeof(migration));
    if (host_.dma_avail.has_value()) {
      vfio_iommu_type1_info_dma_avail avail{};
      avail.header = {
          .id = VFIO_IOMMU_TYPE1_INFO_DMA_AVAIL, .version = 1, .next = 0};
      avail.avail = dma_avail_;
      add(&avail, sizeof(avail));
    }
    if (!host_.iova_ranges.empty()) {
      const size_t size = sizeof(vfio_iommu_type1_info_cap_iova_range) +
                          host_.iova_ranges.size() * sizeof(vfio_iova_range);
      std::vector<uint8_t> cap(size, 0);
      const vfio_info_cap_header header = {
          .id = VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE, .version = 1, .next = 0};
      const uint32_t count = static_cast<uint32_t>(host_.iova_ranges.size());
      std::memcpy(cap.data(), &header, sizeof(header));
      std::memcpy(
          &cap[offsetof(vfio_iommu_type1_info_cap_iova_range, nr_iovas)],
          &count, sizeof(count));
      std::memcpy(
          &cap[offsetof(vfio_iommu_type1_info_cap_iova_range, iova_ranges)],
          host_.iova_ranges.data(),
          host_.iova_ranges.size() * sizeof(vfio_iova_range));
      add(cap.data(), cap.size());
    }
    return chain;
  }

  // VFIO_IOMMU_MAP_DMA as type1 checks it: whole pages, inside a usable
  // range, overlapping nothing, within the mapping count and the memlock
  // limit.
  absl::StatusOr<int> MapDma(const vfio_iommu_type1_dma_map* map,
                             const Fail& fail) {
    if (map->argsz < sizeof(*map)) return fail(EINVAL);
    map_calls_.push_back(*map);
    if (static_cast<int>(map_calls_.size()) == host_.map_dma_fails_at) {
      return fail(host_.map_dma_errno);
    }
    const uint64_t page = host_.iova_pgsizes & ~(host_.iova_pgsizes - 1);
    if (map->size == 0 || map->iova % page != 0 || map->size % page != 0 ||
        map->vaddr % page != 0 ||
        map->flags != (VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE) ||
        map->iova + map->size < map->iova) {
      return fail(EINVAL);
    }
    if (!Usable(map->iova, map->size)) return fail(EINVAL);
    for (const auto& [iova, size] : mappings_) {
      if (iova < map->iova + map->size && map->iova < iova + size) {
        return fail(EEXIST);
      }
    }
    if (dma_avail_ == 0) return fail(ENOSPC);
    if (!host_.ipc_lock && host_.memlock_soft != ResourceLimit::kUnlimited) {
      uint64_t pinned = host_.vmlck_kib * kKiB;
      for (const auto& [iova, size] : mappings_) pinned += size;
      if (pinned + map->size > host_.memlock_soft) return fail(ENOMEM);
    }
    mappings_[map->iova] = map->size;
    vaddrs_[map->iova] = map->vaddr;
    --dma_avail_;
    return 0;
  }

  // VFIO_IOMMU_UNMAP_DMA as type1 (v2) does it: every mapping inside the
  // range goes; one only partly inside is EINVAL; the size unmapped is
  // written back.
  absl::StatusOr<int> UnmapDma(vfio_iommu_type1_dma_unmap* unmap,
                               const Fail& fail) {
    if (unmap->argsz < sizeof(*unmap) || unmap->flags != 0) {
      return fail(EINVAL);
    }
    unmap_calls_.emplace_back(unmap->iova, unmap->size);
    if (unmap_failures_left_ > 0) {
      --unmap_failures_left_;
      return fail(EIO);
    }
    const uint64_t begin = unmap->iova;
    const uint64_t end = unmap->iova + unmap->size;
    if (unmap->size == 0 || end < begin) return fail(EINVAL);
    for (const auto& [iova, size] : mappings_) {
      const bool overlaps = iova < end && begin < iova + size;
      if (overlaps && (iova < begin || iova + size > end)) return fail(EINVAL);
    }
    uint64_t unmapped = 0;
    for (auto it = mappings_.lower_bound(begin);
         it != mappings_.end() && it->first < end;) {
      unmapped += it->second;
      ++dma_avail_;
      vaddrs_.erase(it->first);
      it = mappings_.erase(it);
    }
    unmap->size = unmapped;
    return 0;
  }

  // VFIO_DEVICE_SET_IRQS for MSI-X: eventfds for vectors start.., or
  // DATA_NONE with count 0 to turn them all off.
  absl::StatusOr<int> SetIrqs(const uint8_t* arg, const Fail& fail) {
    vfio_irq_set set;
    std::memcpy(&set, arg, offsetof(vfio_irq_set, data));
    const uint32_t data = set.flags & VFIO_IRQ_SET_DATA_TYPE_MASK;
    const uint32_t action = set.flags & VFIO_IRQ_SET_ACTION_TYPE_MASK;
    if (set.argsz < offsetof(vfio_irq_set, data) ||
        set.index != VFIO_PCI_MSIX_IRQ_INDEX ||
        action != VFIO_IRQ_SET_ACTION_TRIGGER) {
      return fail(EINVAL);
    }
    if (data == VFIO_IRQ_SET_DATA_NONE && set.count == 0) {
      msix_fds_.clear();
      return 0;
    }
    if (data != VFIO_IRQ_SET_DATA_EVENTFD || set.start != 0 || set.count == 0 ||
        set.count > host_.msix_vectors ||
        set.argsz < offsetof(vfio_irq_set, data) + set.count * 4) {
      return fail(EINVAL);
    }
    std::vector<int> fds(set.count);
    std::memcpy(fds.data(), arg + offsetof(vfio_irq_set, data),
                set.count * sizeof(int32_t));
    for (int fd : fds) {
      if (!event_fds_.contains(fd)) return fail(EBADF);
    }
    msix_fds_ = std::move(fds);
    return 0;
  }

  bool Usable(uint64_t iova, uint64_t size) const {
    if (host_.iova_ranges.empty()) return true;
    for (const vfio_iova_range& r : host_.iova_ranges) {
      if (r.start <= iova && iova + size - 1 <= r.end) return true;
    }
    return false;
  }

  absl::StatusOr<int> NewFd(std::set<int>& kind) {
    absl::StatusOr<int> fd = target()->CreateEventFd();
    if (fd.ok()) kind.insert(*fd);
    return fd;
  }

  std::string Sysfs() const {
    return absl::StrCat("/sys/bus/pci/devices/", host_.address);
  }
  static std::string DriverLink(const std::string& driver) {
    return absl::StrCat("../../../bus/pci/drivers/", driver);
  }
  static absl::Status NoSuchFile(absl::string_view call,
                                 const std::string& path) {
    return absl::ErrnoToStatus(ENOENT, absl::StrCat(call, "(", path, ")"));
  }

  bool InConfig(uint64_t offset, size_t size) const {
    return offset >= kConfigOffset &&
           offset + size <= kConfigOffset + config_.size();
  }
  uint16_t Get16(size_t at) const {
    uint16_t v;
    std::memcpy(&v, &config_[at], sizeof(v));
    return v;
  }
  void Put16(size_t at, uint16_t v) {
    std::memcpy(&config_[at], &v, sizeof(v));
  }

  const FakeHost host_;
  std::set<int> container_fds_;
  std::set<int> group_fds_;
  std::set<int> device_fds_;
  std::set<int> event_fds_;
  bool group_in_container_ = false;
  bool iommu_set_ = false;
  uint32_t dma_avail_;
  int unmap_failures_left_;
  std::mutex mu_;  // the IOMMU and MSI-X state, for a device model's thread
  std::map<uint64_t, uint64_t> mappings_;
  std::map<uint64_t, uint64_t> vaddrs_;  // iova -> vaddr of each mapping
  std::vector<vfio_iommu_type1_dma_map> map_calls_;
  std::vector<std::pair<uint64_t, uint64_t>> unmap_calls_;
  size_t dropped_at_close_ = 0;
  int resets_ = 0;
  int config_writes_ = 0;
  int set_irqs_calls_ = 0;
  int iommu_info_calls_ = 0;
  std::array<uint8_t, 256> config_{};
  std::map<void*, size_t> bars_;
  std::vector<int> msix_fds_;
  std::function<void(uint8_t*, uint64_t)> bar_mapped_;
  std::function<void()> bar_unmapping_;
};

}  // namespace tpushim::fake_vfio

#endif  // TPUSHIM_TESTS_DEVICE_FAKE_VFIO_OS_H_
