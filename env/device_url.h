// Device URLs (TPUSHIM_DEVICE): which devices a system drives.
//
//   sim://                                   one simulated device, 16G HBM
//   sim://?devices=4&hbm=8G&link_gbps=25&latency_us=2&dma_engines=2
//   vfio://0000:01:00.0?engine=nvme          a PCI function bound to vfio-pci
//
// Query parameters of sim://:
//   devices=N       1 .. 64                      (default 1)
//   hbm=B           bytes, or with a K/M/G/T suffix (1024 base, optional
//                   "iB"), at least 1M, at most 1T  (default 16G)
//   link_gbps=F     0 = unthrottled, or 0.001 .. 1000000 Gb/s (default 0)
//   latency_us=F    0 .. 10000000 (10 s)            (default 0)
// The link bounds keep the link model's times meaningful: below 1 Mb/s a
// single 512 KiB descriptor holds the link for seconds and a transfer of
// any size for hours; 1 Pb/s is far above any host link, where a
// descriptor takes well under a nanosecond already. Ten seconds of latency
// models any stall worth modelling (timeouts, a hung link) without
// transfers that outlive the process.
//   dma_engines=N   1 .. 64 per direction           (default 1)
//
// Query parameters of vfio://<pci address> (docs/vfio.md):
//   engine=nvme     required: the driver of the device's class
//   d2d=auto|copy|bounce   device-to-device by NVMe Copy, or by Read+Write
//                   through a bounce buffer (auto: Copy when supported)
//   irq=msix|poll   completions by MSI-X interrupts or by polling
//                   (default msix; polling when the device has no MSI-X)
//   queue_depth=N   2 .. 4096 commands per I/O queue    (default 256)
//
// Parsing is strict: the URL starts with exactly `sim://` or `vfio://`
// (lower case), nothing but (for vfio://) the PCI address stands between
// `//` and the optional `?<name>=<value>&...`, and every parameter is
// non-empty. An unknown scheme (the message lists the
// supported ones) or parameter, a repeated parameter, a malformed or
// out-of-range value is INVALID_ARGUMENT naming the parameter and the value,
// e.g. `devices="0" is out of range [1, 64]`. Integers are strict decimals
// (see ParseDecimal); floats are `[0-9]+(.[0-9]+)?` (no sign, exponent, inf
// or nan).
//
// This header also holds the strict value parsers that env/options.cc
// shares. Their errors read `<what>="<text>" <problem>`, the value quoted so
// that stray spaces show.
//
// Pure functions; thread-safe.

#ifndef TPUSHIM_ENV_DEVICE_URL_H_
#define TPUSHIM_ENV_DEVICE_URL_H_

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tpushim {

// The ranges of sim://'s hbm=, link_gbps= (besides 0) and latency_us=;
// tools that set them from flags check their flags against these.
inline constexpr uint64_t kSimMinHbmBytes = uint64_t{1} << 20;
inline constexpr uint64_t kSimMaxHbmBytes = uint64_t{1} << 40;
inline constexpr double kSimMinLinkGbps = 0.001;
inline constexpr double kSimMaxLinkGbps = 1'000'000;
inline constexpr double kSimMaxLatencyUs = 10'000'000;

// A PCI function address, "DDDD:BB:DD.F" (the domain may be left out:
// "01:00.0" is domain 0), hexadecimal as `lspci -D` prints it.
struct PciAddress {
  uint32_t domain = 0;
  uint32_t bus = 0;
  uint32_t device = 0;
  uint32_t function = 0;

  // INVALID_ARGUMENT naming the text for anything else (domain > ffff,
  // bus > ff, device > 1f, function > 7).
  static absl::StatusOr<PciAddress> Parse(absl::string_view text);
  // "0000:01:00.0".
  std::string ToString() const;
};

struct DeviceUrl {
  enum class Scheme { kSim, kVfio };
  enum class Engine { kNvme };
  enum class D2d { kAuto, kCopy, kBounce };
  enum class Irq { kMsix, kPoll };

  Scheme scheme = Scheme::kSim;
  // sim://
  int devices = 1;
  uint64_t hbm_bytes = uint64_t{16} << 30;
  double link_gbps = 0.0;
  double latency_us = 0.0;
  int dma_engines = 1;
  // vfio://
  PciAddress pci_address;
  Engine engine = Engine::kNvme;
  D2d d2d = D2d::kAuto;
  Irq irq = Irq::kMsix;
  uint32_t queue_depth = 256;

  std::string text = "sim://";  // as given

  static DeviceUrl Default() { return DeviceUrl{}; }
};

absl::StatusOr<DeviceUrl> ParseDeviceUrl(absl::string_view url);

// `url` with its query parameter `name` set to `value`: replaced in place
// when present, else appended (after "?" or "&"); the other parameters
// keep their order. `url` should be valid; the result is not re-validated.
//   WithUrlParameter("sim://?hbm=8G", "devices", "2") == "sim://?hbm=8G&devices=2"
std::string WithUrlParameter(absl::string_view url, absl::string_view name,
                             absl::string_view value);

// Parses a byte count written as decimal bytes or with a K/M/G/T suffix
// (1024 base, upper case, optionally followed by "iB": "16G", "16GiB",
// "512M", "4096"). INVALID_ARGUMENT on anything else or on overflow.
// `what` names the value in the message.
absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text,
                                       absl::string_view what);

// Parses a strict decimal: one or more ASCII digits, leading zeros allowed,
// nothing else (no sign, space, "0x", unit or exponent), in [min, max].
// INVALID_ARGUMENT `<what>="<text>" is not a valid decimal number: <why>`
// or `<what>="<text>" is out of range [<min>, <max>]`.
absl::StatusOr<uint64_t> ParseDecimal(
    absl::string_view text, absl::string_view what, uint64_t min = 0,
    uint64_t max = std::numeric_limits<uint64_t>::max());

// INVALID_ARGUMENT `<what>="<text>" <problem>`.
absl::Status InvalidValueError(absl::string_view what, absl::string_view text,
                               absl::string_view problem);

}  // namespace tpushim

#endif  // TPUSHIM_ENV_DEVICE_URL_H_
