#include "common/human_bytes.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tpushim {

std::string HumanReadableBytes(uint64_t bytes) {
  if (bytes < 1024) return absl::StrFormat("%dB", bytes);
  static constexpr char kUnits[] = "KMGTPE";
  const char* unit = kUnits;
  while (bytes >= uint64_t{1024} * 1024) {
    bytes /= 1024;
    ++unit;
  }
  const double value = static_cast<double>(bytes) / 1024.0;
  return *unit == 'K' ? absl::StrFormat("%.1f%c", value, *unit)
                      : absl::StrFormat("%.2f%c", value, *unit);
}

std::string BytesWithHumanReadable(uint64_t bytes) {
  return absl::StrCat(bytes, " (", HumanReadableBytes(bytes), ")");
}

}  // namespace tpushim
