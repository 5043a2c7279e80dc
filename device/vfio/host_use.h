// What the host itself uses behind a PCI function, checked before vfio://
// suggests taking the function (and the rest of its IOMMU group) away from
// its driver.
//
// Unbinding the controller that holds the root disk, the network card the
// user is logged in over, or the console's display takes the machine away,
// so the error that tells the user how to bind a function to vfio-pci first
// looks, through the Os layer (sysfs and procfs only), for:
//   * block devices behind the function: its disks, their partitions and,
//     following `holders`, the dm (LVM, dm-crypt) and md devices built on
//     them; one is in use when it is mounted (/proc/self/mountinfo), is swap
//     (/proc/swaps) or is held by another block device;
//   * network interfaces behind it that are up, or carry an IPv6 address or
//     an IPv4 route (/sys/class/net, /proc/net/if_inet6, /proc/net/route);
//   * a display: a DRM card with a connected monitor, a framebuffer (the
//     console may be on it), or the firmware's boot display (boot_vga);
//   * USB devices on a USB controller (a keyboard, a disk).
// "Behind" means below the function in the device tree, so a bridge counts
// everything downstream of it. When a source that must be read cannot be
// (mountinfo, swaps, the block or network class), the answer is "cannot
// tell", which the caller treats as in use: no advice is better than
// advice that detaches the root disk.
//
//   PciFunctionUse use = HostUseOf(*os, "0000:00:02.0");
//   if (!use.free()) return absl::FailedPreconditionError(use.Describe());

#ifndef TPUSHIM_DEVICE_VFIO_HOST_USE_H_
#define TPUSHIM_DEVICE_VFIO_HOST_USE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "env/os.h"

namespace tpushim {

struct PciFunctionUse {
  std::string address;  // "0000:00:02.0"
  std::string kind;     // "storage controller", from the PCI class code
  std::string driver;   // the bound driver, "" for none
  // What the host uses, a phrase each: "its disk vda holds /".
  std::vector<std::string> in_use;
  // Why the host's use cannot be told, "" when it can.
  std::string unknown;

  bool free() const { return in_use.empty() && unknown.empty(); }
  // "0000:00:02.0 is a storage controller; its disk vda holds /", or
  // "cannot tell whether the host uses 0000:00:02.0 (...)".
  std::string Describe() const;
};

// Reads what the host uses behind the function at `address`.
PciFunctionUse HostUseOf(Os& os, const std::string& address);

// The verdict sysfs gives on opening `address` through vfio://, before
// anything is opened; start-up and `tpushim info` share it:
//   NOT_FOUND            no such PCI function;
//   FAILED_PRECONDITION  not bound to vfio-pci: with the commands that bind
//                        it (and the other members of its IOMMU group that
//                        would keep the group from being usable) when the
//                        host uses none of them, else naming what the host
//                        uses and giving no command;
//   FAILED_PRECONDITION  no IOMMU group (the IOMMU is off);
//   FAILED_PRECONDITION  with `check_group`: another member of the group is
//                        bound to a driver that keeps the group from being
//                        viable (start-up asks the kernel instead).
// On success `*group` (when not null) is the function's IOMMU group.
struct VfioHostCheck {
  bool check_group = false;
};
absl::Status CheckVfioHost(Os& os, const std::string& address,
                           const VfioHostCheck& check, int* group);

// Why IOMMU group `group` of `address` is not viable as sysfs tells it:
// the other members bound to a driver other than vfio-pci, pci-stub or
// pcieport (and not PCI bridges), each with what the host uses behind it;
// when the host uses any, the message says that no unbinding is suggested.
// "" when no member is in the way (or the group cannot be listed).
std::string GroupNotViable(Os& os, int group, const std::string& address);

}  // namespace tpushim

#endif  // TPUSHIM_DEVICE_VFIO_HOST_USE_H_
