#include "device/vfio/host_use.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace tpushim {
namespace {

constexpr char kPciDevices[] = "/sys/bus/pci/devices/";
// How deep block devices are stacked on each other (partition, md, LVM,
// dm-crypt, ...): far more than any real stack, and an end to a loop.
constexpr int kMaxHolderDepth = 16;

std::string Basename(absl::string_view path) {
  const size_t slash = path.rfind('/');
  return std::string(slash == absl::string_view::npos ? path
                                                      : path.substr(slash + 1));
}

// True when the sysfs link target `link` (a path into /sys/devices) lies
// below the PCI function `address` in the device tree.
bool Behind(absl::string_view link, absl::string_view address) {
  return absl::StrContains(absl::StrCat(link, "/"),
                           absl::StrCat("/", address, "/"));
}

std::string Cannot(absl::string_view what, absl::string_view path,
                   const absl::Status& status) {
  return absl::StrCat("cannot ", what, " ", path, " (", status.message(), ")");
}

std::vector<std::string> Sorted(std::vector<std::string> names) {
  std::sort(names.begin(), names.end());
  return names;
}

std::string Trimmed(absl::StatusOr<std::string> text) {
  return text.ok() ? std::string(absl::StripAsciiWhitespace(*text)) : "";
}

// mountinfo and /proc/swaps write a space, tab, newline and backslash in a
// path as \040, \011, \012 and \134.
std::string Unescape(absl::string_view field) {
  std::string out;
  for (size_t i = 0; i < field.size(); ++i) {
    if (field[i] == '\\' && i + 3 < field.size() &&
        absl::ascii_isdigit(field[i + 1])) {
      int value = 0;
      if (absl::SimpleAtoi(field.substr(i + 1, 3), &value)) {
        const int octal =
            (value / 100) * 64 + ((value / 10) % 10) * 8 + value % 10;
        out.push_back(static_cast<char>(octal));
        i += 3;
        continue;
      }
    }
    out.push_back(field[i]);
  }
  return out;
}

std::string KindOf(Os& os, const std::string& sysfs) {
  const std::string text = Trimmed(os.ReadFile(sysfs + "/class"));
  uint32_t code = 0;
  if (!absl::SimpleHexAtoi(text, &code)) return "PCI function";
  switch (code >> 16) {
    case 0x01:
      return "storage controller";
    case 0x02:
      return "network controller";
    case 0x03:
      return "display controller";
    case 0x04:
      return "multimedia device";
    case 0x06:
      return "PCI bridge";
    case 0x0c:
      if (((code >> 8) & 0xff) == 0x03) return "USB controller";
      return "serial bus controller";
    default:
      return absl::StrCat("PCI function of class ", text);
  }
}

std::string DriverOf(Os& os, const std::string& sysfs) {
  absl::StatusOr<std::string> link = os.ReadLink(sysfs + "/driver");
  return link.ok() ? Basename(*link) : "";
}

// ---- Block devices ----------------------------------------------------------

// Where each block device is mounted or swapped on, by device number
// ("254:2") and by the source path mountinfo gives ("/dev/vda2").
struct BlockUsers {
  std::multimap<std::string, std::string> mounts_by_number;
  std::multimap<std::string, std::string> mounts_by_source;
  std::set<std::string> swaps;     // /proc/swaps file names
  std::set<std::string> fs_types;  // of every mount
};

absl::Status ReadBlockUsers(Os& os, BlockUsers& users) {
  absl::StatusOr<std::string> mountinfo = os.ReadFile("/proc/self/mountinfo");
  if (!mountinfo.ok()) return mountinfo.status();
  for (absl::string_view line : absl::StrSplit(*mountinfo, '\n')) {
    // 36 35 98:0 /mnt1 /mnt/parent rw,noatime master:1 - ext3 /dev/root rw
    const std::vector<absl::string_view> fields =
        absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (fields.size() < 5) continue;
    const std::string mount_point = Unescape(fields[4]);
    users.mounts_by_number.emplace(std::string(fields[2]), mount_point);
    const auto dash = std::find(fields.begin() + 5, fields.end(), "-");
    if (dash != fields.end() && dash + 2 < fields.end()) {
      users.mounts_by_source.emplace(Unescape(*(dash + 2)), mount_point);
      users.fs_types.insert(std::string(*(dash + 1)));
    }
  }
  absl::StatusOr<std::string> swaps = os.ReadFile("/proc/swaps");
  if (!swaps.ok()) return swaps.status();
  bool header = true;
  for (absl::string_view line : absl::StrSplit(*swaps, '\n')) {
    if (std::exchange(header, false)) continue;
    const std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (!fields.empty()) users.swaps.insert(Unescape(fields[0]));
  }
  return absl::OkStatus();
}

class BlockWalk {
 public:
  BlockWalk(Os& os, const BlockUsers& users, PciFunctionUse& use)
      : os_(os), users_(users), use_(use) {}

  // Follows `name` (on disk `disk`) and everything built on it. `via` is
  // the chain from the disk's partition down to `name`'s parent. False when
  // a holders directory could not be read.
  bool Walk(const std::string& name, const std::string& disk,
            std::vector<std::string> via, int depth) {
    const std::string dir = absl::StrCat("/sys/class/block/", name);
    const std::string dm_name = Trimmed(os_.ReadFile(dir + "/dm/name"));
    if (name != disk) via.push_back(dm_name.empty() ? name : dm_name);
    const std::string via_text =
        via.empty() ? ""
                    : absl::StrCat(" (via ", absl::StrJoin(via, " → "), ")");

    bool used = false;
    std::vector<std::string> sources = {absl::StrCat("/dev/", name)};
    if (!dm_name.empty()) {
      sources.push_back(absl::StrCat("/dev/mapper/", dm_name));
    }
    std::set<std::string> mount_points;
    const std::string number = Trimmed(os_.ReadFile(dir + "/dev"));
    if (!number.empty()) {
      auto [first, last] = users_.mounts_by_number.equal_range(number);
      for (auto it = first; it != last; ++it) mount_points.insert(it->second);
    }
    for (const std::string& source : sources) {
      auto [first, last] = users_.mounts_by_source.equal_range(source);
      for (auto it = first; it != last; ++it) mount_points.insert(it->second);
      if (users_.swaps.contains(source)) {
        Add(absl::StrCat("its disk ", disk, " holds swap", via_text));
        used = true;
      }
    }
    for (const std::string& mount_point : mount_points) {
      Add(absl::StrCat("its disk ", disk, " holds ", mount_point, via_text));
      used = true;
    }
    // ZFS pools and multi-device btrfs mount through one device (or a pool
    // name), so their other members show no mount of their own: udev's
    // probe of the device says what it carries.
    if (!used) {
      const std::string type = UdevFsType(number);
      if ((type == "zfs_member" && users_.fs_types.contains("zfs")) ||
          (type == "btrfs" && users_.fs_types.contains("btrfs"))) {
        Add(absl::StrCat("its disk ", disk, " carries a ", type, " filesystem",
                         via_text,
                         ", and one is mounted: a pool or multi-device "
                         "filesystem mounts through another device"));
        used = true;
      }
    }

    absl::StatusOr<std::vector<std::string>> holders =
        os_.ListDirectory(dir + "/holders");
    if (!holders.ok() && !absl::IsNotFound(holders.status())) {
      use_.unknown = Cannot("list", dir + "/holders", holders.status());
      return false;
    }
    if (holders.ok() && !holders->empty() && depth < kMaxHolderDepth) {
      for (const std::string& holder : Sorted(*holders)) {
        if (!Walk(holder, disk, via, depth + 1)) return false;
      }
      return true;
    }
    // The top of a stack nothing mounts: an md array or a dm volume still
    // serves whoever opened it (a VM's disk, a database), so it is in use.
    if (!used && !via.empty() && name != disk &&
        (!dm_name.empty() || absl::StartsWith(name, "md"))) {
      const std::vector<std::string> below(via.begin(), via.end() - 1);
      Add(absl::StrCat(
          "its disk ", disk, " backs the active block device ", via.back(),
          below.empty()
              ? ""
              : absl::StrCat(" (via ", absl::StrJoin(below, " → "), ")")));
    }
    return true;
  }

 private:
  // ID_FS_TYPE from udev's database for block device `number` ("8:16"),
  // "" when udev does not run or did not probe it.
  std::string UdevFsType(const std::string& number) const {
    if (number.empty()) return "";
    absl::StatusOr<std::string> data =
        os_.ReadFile(absl::StrCat("/run/udev/data/b", number));
    if (!data.ok()) return "";
    for (absl::string_view line : absl::StrSplit(*data, '\n')) {
      if (absl::ConsumePrefix(&line, "E:ID_FS_TYPE=")) {
        return std::string(absl::StripAsciiWhitespace(line));
      }
    }
    return "";
  }

  void Add(std::string phrase) {
    if (std::find(use_.in_use.begin(), use_.in_use.end(), phrase) ==
        use_.in_use.end()) {
      use_.in_use.push_back(std::move(phrase));
    }
  }

  Os& os_;
  const BlockUsers& users_;
  PciFunctionUse& use_;
};

// The disk a block device belongs to: itself, or for a partition (it has a
// `partition` attribute) the device above it in sysfs, as in
// ".../block/vda/vda2" and ".../nvme/nvme0/nvme0n1/nvme0n1p2".
std::string DiskOf(Os& os, absl::string_view link, const std::string& name) {
  if (!os.ReadFile(absl::StrCat("/sys/class/block/", name, "/partition"))
           .ok()) {
    return name;
  }
  const size_t last = link.rfind('/');
  if (last == absl::string_view::npos || last == 0) return name;
  const size_t before = link.rfind('/', last - 1);
  return std::string(link.substr(before + 1, last - before - 1));
}

void ReadBlockUse(Os& os, const std::string& address, PciFunctionUse& use) {
  absl::StatusOr<std::vector<std::string>> names =
      os.ListDirectory("/sys/class/block");
  if (!names.ok()) {
    use.unknown = Cannot("list", "/sys/class/block", names.status());
    return;
  }
  std::vector<std::pair<std::string, std::string>> ours;  // name, disk
  for (const std::string& name : Sorted(*names)) {
    const std::string path = absl::StrCat("/sys/class/block/", name);
    absl::StatusOr<std::string> link = os.ReadLink(path);
    if (absl::IsInvalidArgument(link.status())) continue;  // not a link
    if (!link.ok()) {
      use.unknown = Cannot("read the link", path, link.status());
      return;
    }
    if (Behind(*link, address)) {
      ours.emplace_back(name, DiskOf(os, *link, name));
      continue;
    }
    // An NVMe multipath head (nvme0n1) lives under the subsystem, not the
    // controller; the paths it uses (nvme0c0n1) are behind the controller.
    absl::StatusOr<std::vector<std::string>> paths =
        os.ListDirectory(path + "/multipath");
    if (!paths.ok()) continue;
    for (const std::string& entry : *paths) {
      absl::StatusOr<std::string> target =
          os.ReadLink(absl::StrCat(path, "/multipath/", entry));
      if (target.ok() && Behind(*target, address)) {
        ours.emplace_back(name, name);
        break;
      }
    }
  }
  if (ours.empty()) return;
  BlockUsers users;
  if (absl::Status read = ReadBlockUsers(os, users); !read.ok()) {
    use.unknown = absl::StrCat("cannot read the host's mounts and swap (",
                               read.message(), ")");
    return;
  }
  BlockWalk walk(os, users, use);
  for (const auto& [name, disk] : ours) {
    if (!walk.Walk(name, disk, {}, 0)) return;
  }
}

// ---- Network interfaces -----------------------------------------------------

// The interfaces named in the first column (after `skip` header lines) of
// a /proc/net table, or of its last column with `last`.
absl::StatusOr<std::set<std::string>> InterfacesIn(Os& os,
                                                   const std::string& path,
                                                   int skip, bool last) {
  absl::StatusOr<std::string> text = os.ReadFile(path);
  if (absl::IsNotFound(text.status())) return std::set<std::string>();
  if (!text.ok()) return text.status();
  std::set<std::string> names;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    if (skip > 0) {
      --skip;
      continue;
    }
    const std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (!fields.empty()) {
      names.insert(std::string(last ? fields.back() : fields.front()));
    }
  }
  return names;
}

void ReadNetworkUse(Os& os, const std::string& address, PciFunctionUse& use) {
  absl::StatusOr<std::vector<std::string>> names =
      os.ListDirectory("/sys/class/net");
  if (!names.ok()) {
    use.unknown = Cannot("list", "/sys/class/net", names.status());
    return;
  }
  std::optional<std::set<std::string>> addressed;
  for (const std::string& name : Sorted(*names)) {
    const std::string path = absl::StrCat("/sys/class/net/", name);
    absl::StatusOr<std::string> link = os.ReadLink(path);
    // Plain files live there too (bonding_masters).
    if (absl::IsInvalidArgument(link.status())) continue;
    if (!link.ok()) {
      use.unknown = Cannot("read the link", path, link.status());
      return;
    }
    if (!Behind(*link, address)) continue;
    absl::StatusOr<std::string> flags_text = os.ReadFile(path + "/flags");
    uint32_t flags = 0;
    if (!flags_text.ok() ||
        !absl::SimpleHexAtoi(absl::StripAsciiWhitespace(*flags_text), &flags)) {
      use.unknown = Cannot("read", path + "/flags", flags_text.status());
      return;
    }
    if (!addressed.has_value()) {
      absl::StatusOr<std::set<std::string>> v6 =
          InterfacesIn(os, "/proc/net/if_inet6", 0, /*last=*/true);
      absl::StatusOr<std::set<std::string>> v4 =
          InterfacesIn(os, "/proc/net/route", 1, /*last=*/false);
      if (!v6.ok() || !v4.ok()) {
        use.unknown =
            absl::StrCat("cannot read the host's addresses and routes (",
                         (!v6.ok() ? v6.status() : v4.status()).message(), ")");
        return;
      }
      addressed = std::move(*v6);
      addressed->insert(v4->begin(), v4->end());
    }
    const bool up = (flags & 0x1) != 0;  // IFF_UP
    const bool has_address = addressed->contains(name);
    if (up || has_address) {
      use.in_use.push_back(absl::StrCat(
          "its interface ", name, " is ",
          up && has_address ? "up with an address"
                            : (up ? "up" : "down but has an address")));
    }
  }
}

// ---- Display and USB --------------------------------------------------------

// Entries of an optional class directory (absent when no driver of the
// class is loaded); false when it exists but cannot be read.
bool ListOptional(Os& os, const std::string& dir,
                  std::vector<std::string>& names, PciFunctionUse& use) {
  absl::StatusOr<std::vector<std::string>> listed = os.ListDirectory(dir);
  if (absl::IsNotFound(listed.status())) return true;
  if (!listed.ok()) {
    use.unknown = Cannot("list", dir, listed.status());
    return false;
  }
  names = Sorted(*std::move(listed));
  return true;
}

bool EntryBehind(Os& os, const std::string& path, const std::string& address) {
  absl::StatusOr<std::string> link = os.ReadLink(path);
  return link.ok() && Behind(*link, address);
}

void ReadDisplayUse(Os& os, const std::string& address, PciFunctionUse& use) {
  if (Trimmed(os.ReadFile(absl::StrCat(kPciDevices, address, "/boot_vga"))) ==
      "1") {
    use.in_use.push_back("it is the firmware's boot display");
  }
  std::vector<std::string> drm;
  if (!ListOptional(os, "/sys/class/drm", drm, use)) return;
  for (const std::string& name : drm) {
    // Connectors are card<N>-<type>-<n>; their status says "connected".
    if (!absl::StartsWith(name, "card") || !absl::StrContains(name, '-')) {
      continue;
    }
    const std::string path = absl::StrCat("/sys/class/drm/", name);
    if (!EntryBehind(os, path, address)) continue;
    if (Trimmed(os.ReadFile(path + "/status")) == "connected") {
      use.in_use.push_back(absl::StrCat("its display output ", name,
                                        " has a monitor connected"));
    }
  }
  std::vector<std::string> framebuffers;
  if (!ListOptional(os, "/sys/class/graphics", framebuffers, use)) return;
  for (const std::string& name : framebuffers) {
    if (!absl::StartsWith(name, "fb")) continue;
    if (EntryBehind(os, absl::StrCat("/sys/class/graphics/", name), address)) {
      use.in_use.push_back(
          absl::StrCat("its framebuffer ", name, " may carry the console"));
    }
  }
}

void ReadUsbUse(Os& os, const std::string& address, PciFunctionUse& use) {
  std::vector<std::string> names;
  if (!ListOptional(os, "/sys/bus/usb/devices", names, use)) return;
  std::vector<std::string> attached;
  for (const std::string& name : names) {
    // usb<N> is a root hub and <bus>-<port>:<config>.<interface> an
    // interface; <bus>-<port>[.<port>...] is a device.
    if (absl::StartsWith(name, "usb") || absl::StrContains(name, ':')) continue;
    const std::string path = absl::StrCat("/sys/bus/usb/devices/", name);
    if (!EntryBehind(os, path, address)) continue;
    const std::string product = Trimmed(os.ReadFile(path + "/product"));
    attached.push_back(product.empty() ? name
                                       : absl::StrCat(product, " at ", name));
  }
  if (!attached.empty()) {
    use.in_use.push_back(
        absl::StrCat("its USB bus has ", attached.size(),
                     attached.size() == 1 ? " device" : " devices",
                     " attached (", absl::StrJoin(attached, ", "), ")"));
  }
}

// ---- Binding advice ---------------------------------------------------------

std::string IommuOff() {
  return "the IOMMU is off; boot the kernel with intel_iommu=on (Intel) or "
         "amd_iommu=on (AMD) and check that /sys/kernel/iommu_groups is not "
         "empty";
}

struct Member {
  std::string address;
  std::string driver;
};

// Members of `group` other than `address` whose drivers keep it from being
// viable. Unreadable membership is an error: it cannot be told who they are.
absl::StatusOr<std::vector<Member>> MembersInTheWay(
    Os& os, int group, const std::string& address) {
  const std::string dir =
      absl::StrCat("/sys/kernel/iommu_groups/", group, "/devices");
  absl::StatusOr<std::vector<std::string>> names = os.ListDirectory(dir);
  if (!names.ok()) {
    return absl::Status(names.status().code(),
                        Cannot("list", dir, names.status()));
  }
  std::vector<Member> members;
  for (const std::string& other : Sorted(*names)) {
    if (other == address) continue;
    const std::string sysfs = absl::StrCat(kPciDevices, other);
    const std::string driver = DriverOf(os, sysfs);
    // Drivers that manage DMA themselves (vfio-pci, pci-stub, pcieport)
    // leave a group viable, as bridges (PCI class 0x0604) did on older
    // kernels, and so does having no driver.
    const bool bridge =
        absl::StartsWith(Trimmed(os.ReadFile(sysfs + "/class")), "0x0604");
    if (!driver.empty() && driver != "vfio-pci" && driver != "pci-stub" &&
        driver != "pcieport" && !bridge) {
      members.push_back({other, driver});
    }
  }
  return members;
}

std::string BindHint(const Member& member) {
  const std::string sysfs = absl::StrCat(kPciDevices, member.address);
  std::string hint =
      absl::StrCat("echo vfio-pci > ", sysfs, "/driver_override; ");
  if (!member.driver.empty()) {
    absl::StrAppend(&hint, "echo ", member.address, " > ", sysfs,
                    "/driver/unbind; ");
  }
  absl::StrAppend(&hint, "echo ", member.address,
                  " > /sys/bus/pci/drivers_probe");
  return hint;
}

// The refusal for functions the host uses (or may use), or OK.
absl::Status RefuseWhenUsed(Os& os, const std::vector<Member>& members,
                            absl::string_view context) {
  std::vector<std::string> busy;
  for (const Member& member : members) {
    const PciFunctionUse use = HostUseOf(os, member.address);
    if (!use.free()) busy.push_back(use.Describe());
  }
  if (busy.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(context, absl::StrJoin(busy, "; and "),
                   busy.size() == 1 && members.size() == 1
                       ? " — not suggesting to unbind it"
                       : " — not suggesting to unbind any of them"));
}

}  // namespace

std::string PciFunctionUse::Describe() const {
  if (in_use.empty()) {
    return absl::StrCat("cannot tell whether the host uses ", address, " (a ",
                        kind, "): ", unknown);
  }
  return absl::StrCat(address, " is a ", kind, "; ",
                      absl::StrJoin(in_use, "; "));
}

PciFunctionUse HostUseOf(Os& os, const std::string& address) {
  const std::string sysfs = absl::StrCat(kPciDevices, address);
  PciFunctionUse use;
  use.address = address;
  use.kind = KindOf(os, sysfs);
  use.driver = DriverOf(os, sysfs);
  // In a container the mounts and interfaces seen are the container's, not
  // the host's: what the host uses cannot be told from here.
  for (const char* ns : {"mnt", "net"}) {
    absl::StatusOr<std::string> own =
        os.ReadLink(absl::StrCat("/proc/self/ns/", ns));
    absl::StatusOr<std::string> host =
        os.ReadLink(absl::StrCat("/proc/1/ns/", ns));
    if (own.ok() && host.ok() && *own != *host) {
      use.unknown = absl::StrCat(
          "this process runs in a ", ns,
          " namespace of its own (a container?), so it does not see the "
          "host's ",
          std::string(ns) == "mnt" ? "mounts" : "network interfaces");
      return use;
    }
  }
  ReadBlockUse(os, address, use);
  ReadNetworkUse(os, address, use);
  ReadDisplayUse(os, address, use);
  ReadUsbUse(os, address, use);
  // Unbinding an SR-IOV physical function removes its virtual functions
  // and whatever the host runs on them.
  if (absl::StatusOr<std::vector<std::string>> entries =
          os.ListDirectory(sysfs);
      entries.ok()) {
    for (const std::string& entry : Sorted(*entries)) {
      if (!absl::StartsWith(entry, "virtfn")) continue;
      absl::StatusOr<std::string> vf =
          os.ReadLink(absl::StrCat(sysfs, "/", entry));
      if (!vf.ok()) continue;
      const PciFunctionUse vf_use = HostUseOf(os, Basename(*vf));
      for (const std::string& phrase : vf_use.in_use) {
        use.in_use.push_back(absl::StrCat("its virtual function ",
                                          vf_use.address, ": ", phrase));
      }
      if (!vf_use.unknown.empty() && use.unknown.empty()) {
        use.unknown = absl::StrCat("about its virtual function ",
                                   vf_use.address, ": ", vf_use.unknown);
      }
    }
  }
  return use;
}

std::string GroupNotViable(Os& os, int group, const std::string& address) {
  std::vector<std::string> described;
  bool used = false;
  if (absl::StatusOr<std::vector<Member>> members =
          MembersInTheWay(os, group, address);
      members.ok()) {
    for (const Member& member : *members) {
      std::string text =
          absl::StrCat(member.address, " (bound to ", member.driver, ")");
      const PciFunctionUse use = HostUseOf(os, member.address);
      if (!use.free()) {
        used = true;
        absl::StrAppend(&text, " — ", use.Describe());
      }
      described.push_back(std::move(text));
    }
  }
  if (described.empty()) return "";
  std::string message = absl::StrCat(
      "IOMMU group ", group, " of ", address,
      " is not viable: every device in it must be bound to vfio-pci or to "
      "no driver, and ",
      absl::StrJoin(described, "; "),
      described.size() == 1 ? " is not" : " are not");
  if (used) {
    absl::StrAppend(&message,
                    "; the host uses what is behind them, so vfio:// cannot "
                    "have this group — not suggesting to unbind anything");
  }
  return message;
}

absl::Status CheckVfioHost(Os& os, const std::string& address,
                           const VfioHostCheck& check, int* group_out) {
  const std::string sysfs = absl::StrCat(kPciDevices, address);
  if (!os.Stat(sysfs).ok()) {
    return absl::NotFoundError(
        absl::StrCat("no PCI function ", address, " on this host (", sysfs,
                     " does not exist; lspci -D lists the functions)"));
  }
  const std::string driver = DriverOf(os, sysfs);
  std::optional<int> group;
  if (absl::StatusOr<std::string> link = os.ReadLink(sysfs + "/iommu_group");
      link.ok()) {
    int number = 0;
    if (!absl::SimpleAtoi(Basename(*link), &number)) {
      return absl::InternalError(absl::StrCat("cannot read the IOMMU group of ",
                                              address, " from ", *link));
    }
    group = number;
  }

  if (driver != "vfio-pci") {
    const std::string bound =
        absl::StrCat("PCI function ", address, " is ",
                     driver.empty() ? "not bound to any driver"
                                    : absl::StrCat("bound to ", driver),
                     ", not to vfio-pci");
    if (!group.has_value()) {
      // vfio-pci cannot take a function without a group: no command would
      // work, so none is given; what the host uses is said all the same.
      const PciFunctionUse use = HostUseOf(os, address);
      return absl::FailedPreconditionError(absl::StrCat(
          bound, ", and it has no IOMMU group: ", IommuOff(),
          use.free() ? ""
                     : absl::StrCat("; besides, ", use.Describe(),
                                    " — not suggesting to unbind it")));
    }
    // vfio-pci needs the whole IOMMU group: the advice moves every member
    // in the way, so every one of them must be free.
    std::vector<Member> members = {{address, driver}};
    absl::StatusOr<std::vector<Member>> others =
        MembersInTheWay(os, *group, address);
    if (!others.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          bound, "; cannot tell which other devices share its IOMMU group ",
          *group, " (", others.status().message(),
          ") — not suggesting to unbind anything"));
    }
    members.insert(members.end(), others->begin(), others->end());
    if (absl::Status used = RefuseWhenUsed(
            os, members,
            absl::StrCat(bound,
                         members.size() > 1
                             ? absl::StrCat("; vfio-pci needs its whole IOMMU "
                                            "group ",
                                            *group, ", and ")
                             : "; "));
        !used.ok()) {
      return used;
    }
    std::vector<std::string> hints;
    for (const Member& member : members) hints.push_back(BindHint(member));
    return absl::FailedPreconditionError(absl::StrCat(
        bound, "; the host uses nothing behind ",
        members.size() == 1 ? "it" : "it or the rest of its IOMMU group",
        " (no disk mounted, swapped on or held, no interface up or "
        "addressed, no display, no USB device); bind ",
        members.size() == 1 ? "it" : "them",
        " with: ", absl::StrJoin(hints, "; ")));
  }
  if (!group.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "PCI function ", address, " has no IOMMU group: ", IommuOff()));
  }
  if (check.check_group) {
    if (std::string message = GroupNotViable(os, *group, address);
        !message.empty()) {
      return absl::FailedPreconditionError(message);
    }
  }
  if (group_out != nullptr) *group_out = *group;
  return absl::OkStatus();
}

}  // namespace tpushim
