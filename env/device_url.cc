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
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"

namespace tpushim {
namespace {

constexpr absl::string_view kDigits = "0123456789";
constexpr absl::string_view kSimScheme = "sim://";
// What the "unsupported scheme" message offers instead.
constexpr absl::string_view kSupportedSchemes = "sim://";

constexpr uint64_t kMinHbmBytes = uint64_t{1} << 20;
constexpr uint64_t kMaxHbmBytes = uint64_t{1} << 40;
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
  if (bytes < kMinHbmBytes || bytes > kMaxHbmBytes) {
    return InvalidValueError("hbm", value, "is out of range [1M, 1T]");
  }
  url.hbm_bytes = bytes;
  return absl::OkStatus();
}

absl::Status SetLinkGbps(absl::string_view value, DeviceUrl& url) {
  TPUSHIM_ASSIGN_OR_RETURN(url.link_gbps,
                           ParseNonNegativeFloat(value, "link_gbps"));
  return absl::OkStatus();
}

absl::Status SetLatencyUs(absl::string_view value, DeviceUrl& url) {
  TPUSHIM_ASSIGN_OR_RETURN(url.latency_us,
                           ParseNonNegativeFloat(value, "latency_us"));
  return absl::OkStatus();
}

absl::Status SetDmaEngines(absl::string_view value, DeviceUrl& url) {
  TPUSHIM_ASSIGN_OR_RETURN(
      const uint64_t engines,
      ParseDecimal(value, "dma_engines", 1, kMaxDmaEngines));
  url.dma_engines = static_cast<int>(engines);
  return absl::OkStatus();
}

// The query parameters of sim://, in the order the header documents them.
struct SimParameter {
  absl::string_view name;
  absl::Status (*set)(absl::string_view value, DeviceUrl& url);
};
constexpr SimParameter kSimParameters[] = {
    {"devices", SetDevices},        {"hbm", SetHbm},
    {"link_gbps", SetLinkGbps},     {"latency_us", SetLatencyUs},
    {"dma_engines", SetDmaEngines},
};

const SimParameter* FindSimParameter(absl::string_view name) {
  for (const SimParameter& parameter : kSimParameters) {
    if (parameter.name == name) return &parameter;
  }
  return nullptr;
}

std::string SimParameterNames() {
  return absl::StrJoin(kSimParameters, ", ",
                       [](std::string* out, const SimParameter& parameter) {
                         out->append(parameter.name.data(),
                                     parameter.name.size());
                       });
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
  if (!absl::StartsWith(url, kSimScheme)) return UnsupportedScheme(url);
  DeviceUrl result;
  result.text = std::string(url);
  const absl::string_view rest = url.substr(kSimScheme.size());
  if (rest.empty()) return result;
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
          "sim:// has an empty parameter (a stray '?' or '&')");
    }
    const size_t equals = parameter.find('=');
    if (equals == parameter.npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("sim:// parameter \"", parameter,
                       "\" has no value; expected <name>=<value>"));
    }
    const absl::string_view name = parameter.substr(0, equals);
    const SimParameter* known = FindSimParameter(name);
    if (known == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown sim:// parameter \"", parameter,
                       "\"; known parameters: ", SimParameterNames()));
    }
    const auto [earlier, first] = seen.emplace(name, parameter);
    if (!first) {
      return absl::InvalidArgumentError(
          absl::StrCat("sim:// parameter ", name, " is given twice: \"",
                       earlier->second, "\" and \"", parameter, "\""));
    }
    TPUSHIM_RETURN_IF_ERROR(known->set(parameter.substr(equals + 1), result));
  }
  return result;
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
