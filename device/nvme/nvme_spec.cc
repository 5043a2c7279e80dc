#include "device/nvme/nvme_spec.h"

#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"

namespace tpushim::nvme_internal {

std::string StatusName(uint16_t status_field) {
  const uint32_t sc = (status_field >> 1) & 0xff;
  const uint32_t sct = (status_field >> 9) & 0x7;
  absl::string_view name = "";
  if (sct == 0) {
    switch (sc) {
      case 0x01:
        name = "Invalid Command Opcode";
        break;
      case 0x02:
        name = "Invalid Field in Command";
        break;
      case 0x04:
        name = "Data Transfer Error";
        break;
      case 0x06:
        name = "Internal Error";
        break;
      case 0x07:
        name = "Command Abort Requested";
        break;
      case 0x08:
        name = "Command Aborted due to SQ Deletion";
        break;
      case 0x0b:
        name = "Invalid Namespace or Format";
        break;
      case 0x13:
        name = "Invalid PRP Offset";
        break;
      case 0x80:
        name = "LBA Out of Range";
        break;
      case 0x81:
        name = "Capacity Exceeded";
        break;
      default:
        break;
    }
  }
  return absl::StrFormat("%s%ssct %d, sc 0x%02x", name,
                         name.empty() ? "" : " (", sct, sc) +
         (name.empty() ? "" : ")");
}

absl::StatusCode CodeOf(uint16_t status_field) {
  const uint32_t sc = (status_field >> 1) & 0xff;
  const uint32_t sct = (status_field >> 9) & 0x7;
  if (sct == 0 && (sc == 0x80 || sc == 0x81)) {
    return absl::StatusCode::kOutOfRange;
  }
  if (sct == 0 && sc == 0x02) return absl::StatusCode::kInvalidArgument;
  return absl::StatusCode::kInternal;
}

}  // namespace tpushim::nvme_internal
