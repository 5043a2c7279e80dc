// What the host uses behind a PCI function, and the advice vfio:// gives
// (or refuses to give) on binding it, against made-up sysfs and procfs
// trees: a root disk, LVM and md stacks, swap, network interfaces, a
// display, USB devices, a group with a busy sibling, unreadable sources.

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "device/vfio/host_use.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_tree.h"

namespace tpushim {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

constexpr char kStorage[] = "0000:00:02.0";
constexpr char kNic[] = "0000:00:03.0";

std::string Devices(const std::string& address) {
  return absl::StrCat("../../devices/pci0000:00/", address);
}

// A PCI function in the tree: its class, driver and IOMMU group.
void AddFunction(FakeTree& tree, const std::string& address,
                 const std::string& pci_class, const std::string& driver,
                 int group) {
  const std::string sysfs = absl::StrCat("/sys/bus/pci/devices/", address);
  tree.File(sysfs + "/class", pci_class + "\n")
      .Link(sysfs + "/iommu_group",
            absl::StrCat("../../../kernel/iommu_groups/", group))
      .Dir(absl::StrCat("/sys/kernel/iommu_groups/", group, "/devices/",
                        address));
  if (!driver.empty()) {
    tree.Link(sysfs + "/driver", "../../../bus/pci/drivers/" + driver);
  }
}

// A block device behind `address`: a disk, or a partition of `disk`.
void AddBlock(FakeTree& tree, const std::string& address,
              const std::string& name, const std::string& number,
              const std::string& disk = "") {
  const std::string path =
      disk.empty()
          ? absl::StrCat(Devices(address), "/virtio1/block/", name)
          : absl::StrCat(Devices(address), "/virtio1/block/", disk, "/", name);
  tree.Link("/sys/class/block/" + name, path)
      .File(absl::StrCat("/sys/class/block/", name, "/dev"), number + "\n")
      .Dir(absl::StrCat("/sys/class/block/", name, "/holders"));
  if (!disk.empty()) {
    tree.File(absl::StrCat("/sys/class/block/", name, "/partition"), "1\n");
  }
}

// A virtual block device (dm or md) built on `lower`.
void AddHolder(FakeTree& tree, const std::string& lower,
               const std::string& name, const std::string& number,
               const std::string& dm_name = "") {
  tree.Link("/sys/class/block/" + name, "../../devices/virtual/block/" + name)
      .File(absl::StrCat("/sys/class/block/", name, "/dev"), number + "\n")
      .Dir(absl::StrCat("/sys/class/block/", name, "/holders"))
      .Link(absl::StrCat("/sys/class/block/", lower, "/holders/", name),
            "../../" + name);
  if (!dm_name.empty()) {
    tree.File(absl::StrCat("/sys/class/block/", name, "/dm/name"),
              dm_name + "\n");
  }
}

void AddInterface(FakeTree& tree, const std::string& address,
                  const std::string& name, const std::string& flags) {
  tree.Link("/sys/class/net/" + name,
            absl::StrCat(Devices(address), "/net/", name))
      .File(absl::StrCat("/sys/class/net/", name, "/flags"), flags + "\n");
}

std::string Mount(const std::string& number, const std::string& point,
                  const std::string& source) {
  return absl::StrCat("30 22 ", number, " / ", point,
                      " rw,relatime shared:5 - ext4 ", source, " rw\n");
}

// The virtio storage controller of a VM, holding the root disk.
FakeTree RootDiskHost() {
  FakeTree tree = FakeTree::QuietHost();
  AddFunction(tree, kStorage, "0x010000", "virtio-pci", 5);
  AddBlock(tree, kStorage, "vda", "254:0");
  AddBlock(tree, kStorage, "vda1", "254:1", "vda");
  tree.File("/proc/self/mountinfo", Mount("254:1", "/", "/dev/vda1"));
  return tree;
}

absl::Status Check(FakeTree tree, const std::string& address = kStorage,
                   VfioHostCheck check = {}) {
  FakeTreeOs os(std::move(tree));
  return CheckVfioHost(os, address, check, nullptr);
}

// Advice with commands in it, or none.
MATCHER(GivesCommands, "") {
  const std::string message(arg.message());
  return message.find("echo") != std::string::npos ||
         message.find("driver_override") != std::string::npos;
}

// ---- Refused: the host uses the function -----------------------------------

TEST(VfioHostUseTest, RootDiskControllerIsRefusedWithoutCommands) {
  const absl::Status s = Check(RootDiskHost());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("0000:00:02.0 is bound to virtio-pci"),
                    HasSubstr("0000:00:02.0 is a storage controller; its "
                              "disk vda holds / (via vda1) — not suggesting "
                              "to unbind it")));
  EXPECT_THAT(s, Not(GivesCommands()));
}

TEST(VfioHostUseTest, WholeDiskMountedIsNamedWithoutAPath) {
  FakeTree tree = RootDiskHost();
  tree.File("/proc/self/mountinfo", Mount("254:0", "/", "/dev/vda"));
  EXPECT_THAT(std::string(Check(tree).message()),
              HasSubstr("its disk vda holds / — not suggesting"));
}

TEST(VfioHostUseTest, MountFoundBySourceWhenTheNumberIsAnonymous) {
  // btrfs shows an anonymous device number (0:NN): the source names it.
  FakeTree tree = RootDiskHost();
  tree.File("/proc/self/mountinfo",
            "30 22 0:33 / /data rw - btrfs /dev/vda1 rw\n");
  EXPECT_THAT(std::string(Check(tree).message()),
              HasSubstr("its disk vda holds /data (via vda1)"));
}

TEST(VfioHostUseTest, MountPointsWithSpacesAreUnescaped) {
  FakeTree tree = RootDiskHost();
  tree.File("/proc/self/mountinfo",
            Mount("254:1", "/mnt/my\\040disk", "/dev/vda1"));
  EXPECT_THAT(std::string(Check(tree).message()),
              HasSubstr("holds /mnt/my disk (via vda1)"));
}

TEST(VfioHostUseTest, LvmOnAPartitionIsFollowedToItsMount) {
  FakeTree tree = RootDiskHost();
  AddBlock(tree, kStorage, "vda2", "254:2", "vda");
  AddHolder(tree, "vda2", "dm-0", "253:0", "vg-root");
  tree.File("/proc/self/mountinfo", Mount("253:0", "/", "/dev/mapper/vg-root"));
  EXPECT_THAT(std::string(Check(tree).message()),
              HasSubstr("its disk vda holds / (via vda2 → vg-root)"));
}

TEST(VfioHostUseTest, UnmountedLvmVolumeStillBacksAnActiveDevice) {
  FakeTree tree = RootDiskHost();
  tree.File("/proc/self/mountinfo", Mount("8:1", "/", "/dev/sda1"));
  AddHolder(tree, "vda1", "dm-3", "253:3", "vg-vmdisk");
  const absl::Status s = Check(tree);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("its disk vda backs the active block device "
                        "vg-vmdisk (via vda1)"));
  EXPECT_THAT(s, Not(GivesCommands()));
}

TEST(VfioHostUseTest, MdArrayOverLvmIsFollowedThroughEveryLevel) {
  FakeTree tree = RootDiskHost();
  tree.File("/proc/self/mountinfo", Mount("253:1", "/srv", "/dev/dm-1"));
  AddHolder(tree, "vda1", "md0", "9:0");
  AddHolder(tree, "md0", "dm-1", "253:1", "vg-srv");
  EXPECT_THAT(std::string(Check(tree).message()),
              HasSubstr("its disk vda holds /srv (via vda1 → md0 → vg-srv)"));
}

// NVMe namespaces sit below their controller's character device in sysfs
// (no ".../block/" in the path): the partition is still named by its disk.
TEST(VfioHostUseTest, NvmePartitionIsNamedByItsNamespace) {
  FakeTree tree = FakeTree::QuietHost();
  AddFunction(tree, kStorage, "0x010802", "nvme", 5);
  tree.Link("/sys/class/block/nvme0n1",
            Devices(kStorage) + "/nvme/nvme0/nvme0n1")
      .File("/sys/class/block/nvme0n1/dev", "259:0\n")
      .Link("/sys/class/block/nvme0n1p2",
            Devices(kStorage) + "/nvme/nvme0/nvme0n1/nvme0n1p2")
      .File("/sys/class/block/nvme0n1p2/dev", "259:2\n")
      .File("/sys/class/block/nvme0n1p2/partition", "2\n")
      .File("/proc/self/mountinfo", Mount("259:2", "/home", "/dev/nvme0n1p2"));
  EXPECT_THAT(std::string(Check(tree).message()),
              HasSubstr("its disk nvme0n1 holds /home (via nvme0n1p2)"));
}

TEST(VfioHostUseTest, SwapPartitionIsInUse) {
  FakeTree tree = RootDiskHost();
  tree.File("/proc/self/mountinfo", Mount("8:1", "/", "/dev/sda1"));
  AddBlock(tree, kStorage, "vda3", "254:3", "vda");
  tree.File(
      "/proc/swaps",
      "Filename\tType\tSize\tUsed\tPriority\n"
      "/dev/vda3                               partition\t2097148\t0\t-2\n");
  EXPECT_THAT(std::string(Check(tree).message()),
              HasSubstr("its disk vda holds swap (via vda3)"));
}

TEST(VfioHostUseTest, InterfaceThatIsUpIsInUse) {
  FakeTree tree = FakeTree::QuietHost();
  AddFunction(tree, kNic, "0x020000", "e1000e", 6);
  AddInterface(tree, kNic, "eth0", "0x1003");
  const absl::Status s = Check(tree, kNic);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("0000:00:03.0 is a network controller; its interface "
                        "eth0 is up — not suggesting to unbind it"));
  EXPECT_THAT(s, Not(GivesCommands()));
}

TEST(VfioHostUseTest, InterfaceThatIsDownButAddressedIsInUse) {
  FakeTree tree = FakeTree::QuietHost();
  AddFunction(tree, kNic, "0x020000", "e1000e", 6);
  AddInterface(tree, kNic, "eth0", "0x1002");
  tree.File("/proc/net/if_inet6",
            "fe800000000000000000000000000001 02 40 20 80     eth0\n");
  EXPECT_THAT(std::string(Check(tree, kNic).message()),
              HasSubstr("its interface eth0 is down but has an address"));
}

TEST(VfioHostUseTest, InterfaceWithARouteAndUpSaysBoth) {
  FakeTree tree = FakeTree::QuietHost();
  AddFunction(tree, kNic, "0x020000", "e1000e", 6);
  AddInterface(tree, kNic, "enp0s3", "0x1003");
  tree.File("/proc/net/route",
            "Iface\tDestination\tGateway\tFlags\n"
            "enp0s3\t00000000\t0202000A\t0003\n");
  EXPECT_THAT(std::string(Check(tree, kNic).message()),
              HasSubstr("its interface enp0s3 is up with an address"));
}

TEST(VfioHostUseTest, BootDisplayConnectedMonitorAndConsoleAreInUse) {
  FakeTree tree = FakeTree::QuietHost();
  const std::string gpu = "0000:00:01.0";
  AddFunction(tree, gpu, "0x030000", "bochs-drm", 1);
  tree.File("/sys/bus/pci/devices/0000:00:01.0/boot_vga", "1\n")
      .Link("/sys/class/drm/card0", Devices(gpu) + "/drm/card0")
      .Link("/sys/class/drm/card0-Virtual-1",
            Devices(gpu) + "/drm/card0/card0-Virtual-1")
      .File("/sys/class/drm/card0-Virtual-1/status", "connected\n")
      .Link("/sys/class/graphics/fb0", Devices(gpu) + "/graphics/fb0");
  const absl::Status s = Check(tree, gpu);
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("0000:00:01.0 is a display controller"),
                    HasSubstr("it is the firmware's boot display"),
                    HasSubstr("its display output card0-Virtual-1 has a "
                              "monitor connected"),
                    HasSubstr("its framebuffer fb0 may carry the console")));
  EXPECT_THAT(s, Not(GivesCommands()));
}

TEST(VfioHostUseTest, UsbControllerWithAKeyboardIsInUse) {
  FakeTree tree = FakeTree::QuietHost();
  const std::string xhci = "0000:00:14.0";
  AddFunction(tree, xhci, "0x0c0330", "xhci_hcd", 3);
  tree.Link("/sys/bus/usb/devices/usb1", Devices(xhci) + "/usb1")
      .Link("/sys/bus/usb/devices/1-1", Devices(xhci) + "/usb1/1-1")
      .File("/sys/bus/usb/devices/1-1/product", "USB Keyboard\n")
      .Link("/sys/bus/usb/devices/1-1:1.0",
            Devices(xhci) + "/usb1/1-1/1-1:1.0");
  EXPECT_THAT(std::string(Check(tree, xhci).message()),
              HasSubstr("0000:00:14.0 is a USB controller; its USB bus has 1 "
                        "device attached (USB Keyboard at 1-1)"));
}

TEST(VfioHostUseTest, DisksBehindABridgeCountForTheBridge) {
  FakeTree tree = RootDiskHost();
  const std::string port = "0000:00:1c.0";
  AddFunction(tree, port, "0x060400", "pcieport", 8);
  tree.Link("/sys/class/block/vda",
            "../../devices/pci0000:00/0000:00:1c.0/0000:00:02.0/virtio1/block/"
            "vda")
      .Link("/sys/class/block/vda1",
            "../../devices/pci0000:00/0000:00:1c.0/0000:00:02.0/virtio1/block/"
            "vda/vda1");
  FakeTreeOs os(tree);
  EXPECT_THAT(HostUseOf(os, port).in_use,
              ElementsAre("its disk vda holds / (via vda1)"));
}

// Native NVMe multipath: the namespace the host mounts (nvme0n1) sits
// under the subsystem; only its path through this controller (nvme0c0n1)
// is behind the function.
TEST(VfioHostUseTest, NvmeMultipathHeadIsFollowedToItsController) {
  FakeTree tree = FakeTree::QuietHost();
  AddFunction(tree, kStorage, "0x010802", "nvme", 5);
  tree.Link("/sys/class/block/nvme0c0n1",
            Devices(kStorage) + "/nvme/nvme0/nvme0c0n1")
      .File("/sys/class/block/nvme0c0n1/dev", "259:1\n")
      .Link("/sys/class/block/nvme0n1",
            "../../devices/virtual/nvme-subsystem/nvme-subsys0/nvme0n1")
      .File("/sys/class/block/nvme0n1/dev", "259:0\n")
      .Link("/sys/class/block/nvme0n1/multipath/nvme0c0n1",
            "../../../../../pci0000:00/0000:00:02.0/nvme/nvme0/nvme0c0n1")
      .File("/proc/self/mountinfo", Mount("259:0", "/", "/dev/nvme0n1"));
  const absl::Status s = Check(tree);
  EXPECT_THAT(std::string(s.message()), HasSubstr("its disk nvme0n1 holds /"));
  EXPECT_THAT(s, Not(GivesCommands()));
}

// A ZFS pool mounts by its name, not by a device: udev's probe says the
// disk is a pool member, and a pool is mounted.
TEST(VfioHostUseTest, ZfsPoolMemberIsInUseWhenAPoolIsMounted) {
  FakeTree tree = FakeTree::QuietHost();
  AddFunction(tree, kStorage, "0x010000", "virtio-pci", 5);
  AddBlock(tree, kStorage, "vdb", "254:16");
  tree.File("/run/udev/data/b254:16",
            "S:disk/by-id/x\nE:ID_FS_TYPE=zfs_member\n")
      .File("/proc/self/mountinfo",
            "30 22 0:45 / /tank rw - zfs tank rw,xattr\n");
  const absl::Status s = Check(tree);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("its disk vdb carries a zfs_member filesystem"));
  EXPECT_THAT(s, Not(GivesCommands()));
}

TEST(VfioHostUseTest, VirtualFunctionsInUseKeepThePhysicalOneBusy) {
  FakeTree tree = FakeTree::QuietHost();
  AddFunction(tree, "0000:03:00.0", "0x020000", "ixgbe", 14);
  AddFunction(tree, "0000:03:10.0", "0x020000", "ixgbevf", 15);
  tree.Link("/sys/bus/pci/devices/0000:03:00.0/virtfn0", "../0000:03:10.0");
  AddInterface(tree, "0000:03:10.0", "eth5", "0x1003");
  const absl::Status s = Check(tree, "0000:03:00.0");
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("its virtual function 0000:03:10.0: its interface eth5 "
                        "is up"));
  EXPECT_THAT(s, Not(GivesCommands()));
}

TEST(VfioHostUseTest, PlainFilesAmongTheInterfacesAreSkipped) {
  FakeTree tree = FakeTree::QuietHost();
  AddFunction(tree, kNic, "0x020000", "e1000e", 6);
  AddInterface(tree, kNic, "eth1", "0x1002");
  tree.File("/sys/class/net/bonding_masters", "bond0\n");
  EXPECT_THAT(Check(tree, kNic), GivesCommands());
}

// ---- Refused: cannot tell ---------------------------------------------------

TEST(VfioHostUseTest, InAContainerTheHostsUseCannotBeTold) {
  FakeTree tree = FakeTree::QuietHost();
  AddFunction(tree, kStorage, "0x010802", "nvme", 5);
  tree.Link("/proc/self/ns/mnt", "mnt:[4026532200]")
      .Link("/proc/1/ns/mnt", "mnt:[4026531840]");
  const absl::Status s = Check(tree);
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("cannot tell whether the host uses"),
                    HasSubstr("mnt namespace of its own")));
  EXPECT_THAT(s, Not(GivesCommands()));
}

TEST(VfioHostUseTest, UnreadableMountinfoMeansNoAdvice) {
  FakeTree tree = RootDiskHost();
  tree.Fail("/proc/self/mountinfo",
            absl::PermissionDeniedError("open(/proc/self/mountinfo): denied"));
  const absl::Status s = Check(tree);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("cannot tell whether the host uses "
                              "0000:00:02.0 (a storage controller)"),
                    HasSubstr("mountinfo"), HasSubstr("not suggesting")));
  EXPECT_THAT(s, Not(GivesCommands()));
}

TEST(VfioHostUseTest, UnlistableBlockClassMeansNoAdvice) {
  FakeTree tree = FakeTree::QuietHost();
  AddFunction(tree, kStorage, "0x010802", "nvme", 5);
  tree.Fail("/sys/class/block", absl::PermissionDeniedError("denied"));
  const absl::Status s = Check(tree);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("cannot list /sys/class/block"));
  EXPECT_THAT(s, Not(GivesCommands()));
}

TEST(VfioHostUseTest, UnreadableGroupMembershipMeansNoAdvice) {
  FakeTree tree = FakeTree::QuietHost();
  AddFunction(tree, kStorage, "0x010802", "nvme", 5);
  tree.Fail("/sys/kernel/iommu_groups/5/devices",
            absl::PermissionDeniedError("denied"));
  const absl::Status s = Check(tree);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("cannot tell which other devices share its IOMMU "
                        "group 5"));
  EXPECT_THAT(s, Not(GivesCommands()));
}

// ---- Advised: nothing in use ------------------------------------------------

TEST(VfioHostUseTest, FreeNvmeControllerGetsTheBindCommands) {
  FakeTree tree = FakeTree::QuietHost();
  AddFunction(tree, kStorage, "0x010802", "nvme", 5);
  AddBlock(tree, kStorage, "nvme0n1", "259:0");
  const absl::Status s = Check(tree);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(
      std::string(s.message()),
      AllOf(HasSubstr("is bound to nvme, not to vfio-pci; the host uses "
                      "nothing behind it"),
            HasSubstr("echo vfio-pci > /sys/bus/pci/devices/0000:00:02.0/"
                      "driver_override; echo 0000:00:02.0 > "
                      "/sys/bus/pci/devices/0000:00:02.0/driver/unbind; echo "
                      "0000:00:02.0 > /sys/bus/pci/drivers_probe")));
}

TEST(VfioHostUseTest, InterfaceThatIsDownWithoutAddressIsFree) {
  FakeTree tree = FakeTree::QuietHost();
  AddFunction(tree, kNic, "0x020000", "e1000e", 6);
  AddInterface(tree, kNic, "eth1", "0x1002");
  FakeTreeOs os(tree);
  const PciFunctionUse use = HostUseOf(os, kNic);
  EXPECT_TRUE(use.free()) << use.Describe();
  EXPECT_EQ(use.kind, "network controller");
  EXPECT_EQ(use.driver, "e1000e");
  EXPECT_THAT(Check(tree, kNic), GivesCommands());
}

TEST(VfioHostUseTest, FreeGroupGetsCommandsForEveryMemberInTheWay) {
  FakeTree tree = FakeTree::QuietHost();
  AddFunction(tree, "0000:01:00.0", "0x030000", "nouveau", 9);
  AddFunction(tree, "0000:01:00.1", "0x040300", "snd_hda_intel", 9);
  AddFunction(tree, "0000:00:01.0", "0x060400", "pcieport", 9);
  const absl::Status s = Check(tree, "0000:01:00.0");
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("the host uses nothing behind it or the rest "
                              "of its IOMMU group"),
                    HasSubstr("echo 0000:01:00.0 > /sys/bus/pci/devices/"
                              "0000:01:00.0/driver/unbind"),
                    HasSubstr("echo 0000:01:00.1 > /sys/bus/pci/devices/"
                              "0000:01:00.1/driver/unbind")));
  // The root port's pcieport leaves the group viable: left alone.
  EXPECT_THAT(std::string(s.message()), Not(HasSubstr("0000:00:01.0")));
}

// ---- A group with a busy sibling --------------------------------------------

TEST(VfioHostUseTest, BusySiblingInTheGroupRefusesTheWholeAdvice) {
  FakeTree tree = FakeTree::QuietHost();
  AddFunction(tree, "0000:02:00.0", "0x010802", "nvme", 11);
  AddFunction(tree, "0000:02:00.1", "0x020000", "igb", 11);
  AddInterface(tree, "0000:02:00.1", "eno1", "0x1003");
  const absl::Status s = Check(tree, "0000:02:00.0");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("vfio-pci needs its whole IOMMU group 11"),
                    HasSubstr("0000:02:00.1 is a network controller; its "
                              "interface eno1 is up"),
                    HasSubstr("not suggesting to unbind any of them")));
  EXPECT_THAT(s, Not(GivesCommands()));
}

TEST(VfioHostUseTest, BoundFunctionWithABusySiblingIsNotViable) {
  FakeTree tree = FakeTree::QuietHost();
  AddFunction(tree, "0000:02:00.0", "0x010802", "vfio-pci", 11);
  AddFunction(tree, "0000:02:00.1", "0x020000", "igb", 11);
  AddInterface(tree, "0000:02:00.1", "eno1", "0x1003");
  // Start-up leaves viability to the kernel; info asks sysfs.
  EXPECT_TRUE(Check(tree, "0000:02:00.0").ok());
  const absl::Status s =
      Check(tree, "0000:02:00.0", VfioHostCheck{.check_group = true});
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("IOMMU group 11 of 0000:02:00.0 is not viable"),
                    HasSubstr("0000:02:00.1 (bound to igb) — 0000:02:00.1 is "
                              "a network controller; its interface eno1 is "
                              "up"),
                    HasSubstr("not suggesting to unbind anything")));
}

// ---- Ready ------------------------------------------------------------------

TEST(VfioHostUseTest, FunctionOnVfioPciIsReadyAndGivesItsGroup) {
  FakeTree tree = FakeTree::QuietHost();
  AddFunction(tree, kStorage, "0x010802", "vfio-pci", 5);
  AddFunction(tree, "0000:00:02.1", "0x010802", "", 5);
  FakeTreeOs os(tree);
  int group = -1;
  EXPECT_TRUE(CheckVfioHost(os, kStorage, {.check_group = true}, &group).ok());
  EXPECT_EQ(group, 5);
}

TEST(VfioHostUseTest, WithoutAnIommuGroupNoCommandIsGiven) {
  // vfio-pci cannot take a function the IOMMU does not cover.
  FakeTree tree = RootDiskHost();
  tree.Remove("/sys/bus/pci/devices/0000:00:02.0/iommu_group");
  const absl::Status s = Check(tree);
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("has no IOMMU group: the IOMMU is off"),
                    HasSubstr("its disk vda holds / (via vda1) — not "
                              "suggesting to unbind it")));
  EXPECT_THAT(s, Not(GivesCommands()));
  tree.Remove("/sys/class/block/vda").Remove("/sys/class/block/vda1");
  EXPECT_THAT(Check(tree), Not(GivesCommands()));
}

TEST(VfioHostUseTest, MissingFunctionIsNotFound) {
  EXPECT_EQ(Check(FakeTree::QuietHost(), "0000:09:00.0").code(),
            absl::StatusCode::kNotFound);
}

TEST(VfioHostUseTest, QuietHostUsesNothing) {
  FakeTree tree = FakeTree::QuietHost();
  AddFunction(tree, kStorage, "0x010802", "nvme", 5);
  FakeTreeOs os(tree);
  EXPECT_THAT(HostUseOf(os, kStorage).in_use, IsEmpty());
}

}  // namespace
}  // namespace tpushim
