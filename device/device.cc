#include "device/device.h"

namespace tpushim {

absl::string_view DmaDirectionName(DmaDirection direction) {
  switch (direction) {
    case DmaDirection::kHostToDevice:
      return "h2d";
    case DmaDirection::kDeviceToHost:
      return "d2h";
    case DmaDirection::kDeviceToDevice:
      return "d2d";
  }
  return "unknown";
}

absl::string_view DmaDirectionDescription(DmaDirection direction) {
  switch (direction) {
    case DmaDirection::kHostToDevice:
      return "host→device";
    case DmaDirection::kDeviceToHost:
      return "device→host";
    case DmaDirection::kDeviceToDevice:
      return "device→device";
  }
  return "unknown";
}

}  // namespace tpushim
