#include "env/device_url.h"

#include <charconv>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <system_error>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"

namespace tpushim {
namespace {

constexpr absl::string_view kDigits = "0123456789";
constexpr absl::string_view kSimScheme = "sim://";
constexpr absl::string_view kVfioScheme = "vfio://";
// What the "unsupported scheme" message offers instead.
constexpr absl::string_view kSupportedSchemes = "sim://, vfio://";

constexpr uint64_t kMaxDevices = 64;
constexpr uint64_t kMaxDmaEngines = 64;

// The units ParseByteSize accepts, as left shifts.
struct ByteUnit {
  absl::string_view suffix;
  int shift;
};
constexpr ByteUnit kByteUnits[] = {
    {"", 0},   {"K", 10},   {"KiB", 10}, {"M", 20},   {"MiB", 20},
    {"G", 30}, {"GiB", 30}, {"T", 40},   {"TiB", 40},
};

bool AllDigits(absl::string_view text) {
  return !text.empty() && text.find_first_not_of(kDigits) == text.npos;
}

// A non-negative decimal fraction, `[0-9]+(.[0-9]+)?`.
absl::StatusOr<double> ParseNonNegativeFloat(absl::string_view text,
                                             absl::string_view what) {
  const size_t dot = text.find('.');
  if (AllDigits(text.substr(0, dot)) &&
      (dot == text.npos || AllDigits(text.substr(dot + 1)))) {
    double value = 0;
    const std::from_chars_result result =
        std::from_chars(text.data(), text.data() + text.size(), value);
    if (result.ec == std::errc() && result.ptr == text.data() + text.size()) {
      return value;
    }
  }
  return InvalidValueError(
      what, text,
      "is not a valid number: expected digits with an optional decimal "
      "point, e.g. 25 or 2.5 (no sign, exponent, inf or nan)");
}

absl::Status SetDevices(absl::string_view value, DeviceUrl& url) {
  TPUSHIM_ASSIGN_OR_RETURN(const uint64_t devices,
                           ParseDecimal(value, "devices", 1, kMaxDevices));
  url.devices = static_cast<int>(devices);
  return absl::OkStatus();
}

absl::Status SetHbm(absl::string_view value, DeviceUrl& url) {
  TPUSHIM_ASSIGN_OR_RETURN(const uint64_t bytes, ParseByteSize(value, "hbm"));
  if (bytes < kSimMinHbmBytes || bytes > kSimMaxHbmBytes) {
    return InvalidValueError("hbm", value, "is out of range [1M, 1T]");
  }
  url.hbm_bytes = bytes;
  return absl::OkStatus();
}

absl::Status SetLinkGbps(absl::string_view value, DeviceUrl& url) {
  TPUSHIM_ASSIGN_OR_RETURN(const double gbps,
                           ParseNonNegativeFloat(value, "link_gbps"));
  if (gbps != 0 && (gbps < kSimMinLinkGbps || gbps > kSimMaxLinkGbps)) {
    return InvalidValueError(
        "link_gbps", value,
        absl::StrFormat("is out of range: 0 (unthrottled) or %.3f to %.0f Gb/s",
                        kSimMinLinkGbps, kSimMaxLinkGbps));
  }
  url.link_gbps = gbps;
  return absl::OkStatus();
}

absl::Status SetLatencyUs(absl::string_view value, DeviceUrl& url) {
  TPUSHIM_ASSIGN_OR_RETURN(const double us,
                           ParseNonNegativeFloat(value, "latency_us"));
  if (us > kSimMaxLatencyUs) {
    return InvalidValueError(
        "latency_us", value,
        absl::StrFormat("is out of range [0, %.0f] microseconds (10 s)",
                        kSimMaxLatencyUs));
  }
  url.latency_us = us;
  return absl::OkStatus();
}

absl::Status SetDmaEngines(absl::string_view value, DeviceUrl& url) {
  TPUSHIM_ASSIGN_OR_RETURN(
      const uint64_t engines,
      ParseDecimal(value, "dma_engines", 1, kMaxDmaEngines));
  url.dma_engines = static_cast<int>(engines);
  return absl::OkStatus();
}

absl::Status SetEngine(absl::string_view value, DeviceUrl& url) {
  if (value != "nvme") {
    return InvalidValueError("engine", value,
                             "is not a known engine; known engines: nvme");
  }
  url.engine = DeviceUrl::Engine::kNvme;
  return absl::OkStatus();
}

absl::Status SetD2d(absl::string_view value, DeviceUrl& url) {
  if (value == "auto") {
    url.d2d = DeviceUrl::D2d::kAuto;
  } else if (value == "copy") {
    url.d2d = DeviceUrl::D2d::kCopy;
  } else if (value == "bounce") {
    url.d2d = DeviceUrl::D2d::kBounce;
  } else {
    return InvalidValueError("d2d", value, "is not one of auto, copy, bounce");
  }
  return absl::OkStatus();
}

absl::Status SetIrq(absl::string_view value, DeviceUrl& url) {
  if (value == "msix") {
    url.irq = DeviceUrl::Irq::kMsix;
  } else if (value == "poll") {
    url.irq = DeviceUrl::Irq::kPoll;
  } else {
    return InvalidValueError("irq", value, "is not one of msix, poll");
  }
  return absl::OkStatus();
}

absl::Status SetQueueDepth(absl::string_view value, DeviceUrl& url) {
  TPUSHIM_ASSIGN_OR_RETURN(const uint64_t depth,
                           ParseDecimal(value, "queue_depth", 2, 4096));
  url.queue_depth = static_cast<uint32_t>(depth);
  return absl::OkStatus();
}

// The query parameters of each scheme, in the order the header documents
// them.
struct UrlParameter {
  absl::string_view name;
  absl::Status (*set)(absl::string_view value, DeviceUrl& url);
};
constexpr UrlParameter kSimParameters[] = {
    {"devices", SetDevices},        {"hbm", SetHbm},
    {"link_gbps", SetLinkGbps},     {"latency_us", SetLatencyUs},
    {"dma_engines", SetDmaEngines},
};
constexpr UrlParameter kVfioParameters[] = {
    {"engine", SetEngine},
    {"d2d", SetD2d},
    {"irq", SetIrq},
    {"queue_depth", SetQueueDepth},
};

template <size_t N>
const UrlParameter* FindParameter(const UrlParameter (&table)[N],
                                  absl::string_view name) {
  for (const UrlParameter& parameter : table) {
    if (parameter.name == name) return &parameter;
  }
  return nullptr;
}

template <size_t N>
std::string ParameterNames(const UrlParameter (&table)[N]) {
  return absl::StrJoin(
      table, ", ", [](std::string* out, const UrlParameter& parameter) {
        out->append(parameter.name.data(), parameter.name.size());
      });
}

bool ParseHexField(absl::string_view text, size_t digits, uint32_t max,
                   uint32_t* out) {
  if (text.empty() || text.size() > digits ||
      text.find_first_not_of("0123456789abcdefABCDEF") != text.npos) {
    return false;
  }
  uint32_t value = 0;
  for (char c : text) {
    value = value * 16 +
            static_cast<uint32_t>(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
  }
  if (value > max) return false;
  *out = value;
  return true;
}

absl::Status UnsupportedScheme(absl::string_view url) {
  const size_t separator = url.find("://");
  if (separator == url.npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", url,
                     "\" is not a device URL (<scheme>://...); supported "
                     "schemes: ",
                     kSupportedSchemes));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unsupported device URL scheme \"", url.substr(0, separator + 3),
      "\"; supported schemes: ", kSupportedSchemes));
}

}  // namespace

absl::Status InvalidValueError(absl::string_view what, absl::string_view text,
                               absl::string_view problem) {
  return absl::InvalidArgumentError(
      absl::StrCat(what, "=\"", text, "\" ", problem));
}

absl::StatusOr<uint64_t> ParseDecimal(absl::string_view text,
                                      absl::string_view what, uint64_t min,
                                      uint64_t max) {
  if (text.empty()) {
    return InvalidValueError(what, text,
                             "is not a valid decimal number: it is empty");
  }
  const size_t bad = text.find_first_not_of(kDigits);
  if (bad != text.npos) {
    return InvalidValueError(
        what, text,
        absl::StrCat("is not a valid decimal number: only the digits 0-9 are "
                     "allowed, found '",
                     text.substr(bad, 1), "' at offset ", bad));
  }
  uint64_t value = 0;
  const std::from_chars_result result =
      std::from_chars(text.data(), text.data() + text.size(), value);
  if (result.ec == std::errc::result_out_of_range) {
    return InvalidValueError(
        what, text,
        absl::StrCat("is not a valid decimal number: it is larger than ",
                     std::numeric_limits<uint64_t>::max()));
  }
  if (value < min || value > max) {
    return InvalidValueError(
        what, text, absl::StrCat("is out of range [", min, ", ", max, "]"));
  }
  return value;
}

absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text,
                                       absl::string_view what) {
  const absl::string_view number =
      text.substr(0, text.find_first_not_of(kDigits));
  const absl::string_view suffix = text.substr(number.size());
  const ByteUnit* unit = nullptr;
  for (const ByteUnit& candidate : kByteUnits) {
    if (candidate.suffix == suffix) unit = &candidate;
  }
  if (number.empty() || unit == nullptr) {
    return InvalidValueError(
        what, text,
        "is not a valid byte size: expected decimal bytes, or a number with "
        "a K, M, G or T suffix (1024 base, optionally followed by iB), e.g. "
        "4096, 512M or 16GiB");
  }
  uint64_t value = 0;
  const std::from_chars_result result =
      std::from_chars(number.data(), number.data() + number.size(), value);
  if (result.ec == std::errc::result_out_of_range ||
      value > (std::numeric_limits<uint64_t>::max() >> unit->shift)) {
    return InvalidValueError(
        what, text,
        absl::StrCat("is not a valid byte size: it is larger than ",
                     std::numeric_limits<uint64_t>::max(), " bytes"));
  }
  return value << unit->shift;
}

absl::StatusOr<DeviceUrl> ParseDeviceUrl(absl::string_view url) {
  const bool sim = absl::StartsWith(url, kSimScheme);
  const bool vfio = absl::StartsWith(url, kVfioScheme);
  if (!sim && !vfio) return UnsupportedScheme(url);
  const absl::string_view scheme = sim ? kSimScheme : kVfioScheme;
  DeviceUrl result;
  result.text = std::string(url);
  absl::string_view rest = url.substr(scheme.size());
  if (vfio) {
    result.scheme = DeviceUrl::Scheme::kVfio;
    const absl::string_view address = rest.substr(0, rest.find('?'));
    TPUSHIM_ASSIGN_OR_RETURN(result.pci_address, PciAddress::Parse(address));
    rest.remove_prefix(address.size());
  }
  if (rest.empty()) {
    if (vfio) {
      return absl::InvalidArgumentError(
          "vfio:// needs ?engine=<engine>: the driver of the device's class; "
          "known engines: nvme");
    }
    return result;
  }
  if (rest.front() != '?') {
    return absl::InvalidArgumentError(absl::StrCat(
        "sim:// takes no host or path, only ?<name>=<value>&...; found \"",
        rest.substr(0, rest.find('?')), "\""));
  }
  // Parameter name -> the whole `name=value` that set it.
  std::map<absl::string_view, absl::string_view> seen;
  for (const absl::string_view parameter :
       absl::StrSplit(rest.substr(1), '&')) {
    if (parameter.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(scheme, " has an empty parameter (a stray '?' or '&')"));
    }
    const size_t equals = parameter.find('=');
    if (equals == parameter.npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(scheme, " parameter \"", parameter,
                       "\" has no value; expected <name>=<value>"));
    }
    const absl::string_view name = parameter.substr(0, equals);
    const UrlParameter* known = sim ? FindParameter(kSimParameters, name)
                                    : FindParameter(kVfioParameters, name);
    if (known == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown ", scheme, " parameter \"", parameter,
                       "\"; known parameters: ",
                       sim ? ParameterNames(kSimParameters)
                           : ParameterNames(kVfioParameters)));
    }
    const auto [earlier, first] = seen.emplace(name, parameter);
    if (!first) {
      return absl::InvalidArgumentError(
          absl::StrCat(scheme, " parameter ", name, " is given twice: \"",
                       earlier->second, "\" and \"", parameter, "\""));
    }
    TPUSHIM_RETURN_IF_ERROR(known->set(parameter.substr(equals + 1), result));
  }
  if (vfio && !seen.contains("engine")) {
    return absl::InvalidArgumentError(
        "vfio:// needs engine=<engine>: the driver of the device's class; "
        "known engines: nvme");
  }
  return result;
}

absl::StatusOr<PciAddress> PciAddress::Parse(absl::string_view text) {
  const auto invalid = [&] {
    return InvalidValueError(
        "PCI address", text,
        "is not a PCI function address: expected DDDD:BB:DD.F or BB:DD.F in "
        "hexadecimal, e.g. 0000:01:00.0");
  };
  std::vector<absl::string_view> parts = absl::StrSplit(text, ':');
  if (parts.size() == 2) parts.insert(parts.begin(), "0000");
  if (parts.size() != 3) return invalid();
  std::vector<absl::string_view> dev_fn = absl::StrSplit(parts[2], '.');
  if (dev_fn.size() != 2) return invalid();
  PciAddress a;
  if (!ParseHexField(parts[0], 4, 0xffff, &a.domain) ||
      !ParseHexField(parts[1], 2, 0xff, &a.bus) ||
      !ParseHexField(dev_fn[0], 2, 0x1f, &a.device) ||
      !ParseHexField(dev_fn[1], 1, 7, &a.function)) {
    return invalid();
  }
  return a;
}

std::string PciAddress::ToString() const {
  return absl::StrFormat("%04x:%02x:%02x.%x", domain, bus, device, function);
}

std::string WithUrlParameter(absl::string_view url, absl::string_view name,
                             absl::string_view value) {
  const size_t q = url.find('?');
  const std::string assignment = absl::StrCat(name, "=", value);
  std::vector<std::string> params;
  bool replaced = false;
  if (q != absl::string_view::npos) {
    for (absl::string_view p :
         absl::StrSplit(url.substr(q + 1), '&', absl::SkipEmpty())) {
      const size_t eq = p.find('=');
      if (p.substr(0, eq) == name) {
        if (!replaced) params.push_back(assignment);
        replaced = true;
      } else {
        params.emplace_back(p);
      }
    }
  }
  if (!replaced) params.push_back(assignment);
  return absl::StrCat(url.substr(0, q), "?", absl::StrJoin(params, "&"));
}

}  // namespace tpushim
