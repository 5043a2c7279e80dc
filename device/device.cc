#include "device/device.h"

namespace tpushim {

DeviceMemoryStats DeviceMemoryStatsOf(const RegionAllocator::Stats& stats,
                                      uint64_t granule) {
  return DeviceMemoryStats{.capacity_bytes = stats.capacity_bytes,
                           .bytes_in_use = stats.bytes_in_use,
                           .free_bytes = stats.free_bytes,
                           .largest_free_block = stats.largest_free_block,
                           .fragmentation = stats.fragmentation,
                           .granule = granule};
}

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
