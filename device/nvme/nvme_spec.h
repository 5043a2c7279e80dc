// The NVMe interface (NVM Express Base Specification 1.4) as far as
// tpushim uses it: controller register offsets and fields in BAR0, the
// submission and completion queue entry layouts (Sqe, Cqe) and Copy's
// source range entry (CopyRange), the admin and NVM opcodes, and decoding
// of a completion's status field (StatusName, CodeOf). It says nothing of
// how the engine drives a controller (device/nvme/nvme_device_internal.h
// does), so a fake controller can be built on it too.
//
//   Sqe sqe;
//   sqe.cdw0 = kAdminIdentify;
//   ...
//   if ((cqe.status >> 1) != 0) return absl::Status(CodeOf(cqe.status), ...);
//
// Thread-safety: constants, plain structs and pure functions.

#ifndef TPUSHIM_DEVICE_NVME_NVME_SPEC_H_
#define TPUSHIM_DEVICE_NVME_NVME_SPEC_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace tpushim::nvme_internal {

// Controller registers (BAR0).
inline constexpr uint32_t kRegCap = 0x00;  // 64-bit
inline constexpr uint32_t kRegVs = 0x08;
inline constexpr uint32_t kRegIntms = 0x0c;
inline constexpr uint32_t kRegCc = 0x14;
inline constexpr uint32_t kRegCsts = 0x1c;
inline constexpr uint32_t kRegAqa = 0x24;
inline constexpr uint32_t kRegAsq = 0x28;  // 64-bit
inline constexpr uint32_t kRegAcq = 0x30;  // 64-bit
inline constexpr uint32_t kDoorbells = 0x1000;

inline constexpr uint32_t kCcEnable = 1u << 0;
inline constexpr uint32_t kCcIosqes = 6u << 16;  // 64-byte SQ entries
inline constexpr uint32_t kCcIocqes = 4u << 20;  // 16-byte CQ entries
inline constexpr uint32_t kCcShnNormal = 1u << 14;
inline constexpr uint32_t kCstsReady = 1u << 0;
inline constexpr uint32_t kCstsFatal = 1u << 1;

// The memory page size: of PRP entries, queues and PRP lists.
inline constexpr uint64_t kPage = 4096;  // CC.MPS = 0

// Admin commands.
inline constexpr uint8_t kAdminDeleteSq = 0x00;
inline constexpr uint8_t kAdminCreateSq = 0x01;
inline constexpr uint8_t kAdminDeleteCq = 0x04;
inline constexpr uint8_t kAdminCreateCq = 0x05;
inline constexpr uint8_t kAdminIdentify = 0x06;
inline constexpr uint8_t kAdminSetFeatures = 0x09;
inline constexpr uint32_t kFeatureNumberOfQueues = 0x07;

// NVM commands.
inline constexpr uint8_t kNvmWrite = 0x01;
inline constexpr uint8_t kNvmRead = 0x02;
inline constexpr uint8_t kNvmCopy = 0x19;

struct Sqe {
  uint32_t cdw0 = 0;  // opcode [7:0], command id [31:16]
  uint32_t nsid = 0;
  uint32_t cdw2 = 0;
  uint32_t cdw3 = 0;
  uint64_t mptr = 0;
  uint64_t prp1 = 0;
  uint64_t prp2 = 0;
  uint32_t cdw10 = 0;
  uint32_t cdw11 = 0;
  uint32_t cdw12 = 0;
  uint32_t cdw13 = 0;
  uint32_t cdw14 = 0;
  uint32_t cdw15 = 0;
};
static_assert(sizeof(Sqe) == 64);

struct Cqe {
  uint32_t result = 0;
  uint32_t reserved = 0;
  uint16_t sq_head = 0;
  uint16_t sq_id = 0;
  uint16_t command_id = 0;
  uint16_t status = 0;  // phase [0], status field [15:1]
};
static_assert(sizeof(Cqe) == 16);

// Copy's source range entry, descriptor format 0.
struct CopyRange {
  uint64_t reserved0 = 0;
  uint64_t slba = 0;
  uint16_t nlb = 0;  // 0-based
  uint16_t reserved1 = 0;
  uint32_t reserved2 = 0;
  uint32_t eilbrt = 0;
  uint16_t elbat = 0;
  uint16_t elbatm = 0;
};
static_assert(sizeof(CopyRange) == 32);

// A completion's status (Cqe::status, phase bit included) for messages:
// the generic status's name when it is one tpushim meets, then its type
// and code, e.g. "LBA Out of Range (sct 0, sc 0x80)".
std::string StatusName(uint16_t status_field);

// The absl code a failed command's status becomes: OUT_OF_RANGE for LBA
// Out of Range and Capacity Exceeded, INVALID_ARGUMENT for Invalid Field
// in Command, else INTERNAL.
absl::StatusCode CodeOf(uint16_t status_field);

}  // namespace tpushim::nvme_internal

#endif  // TPUSHIM_DEVICE_NVME_NVME_SPEC_H_
