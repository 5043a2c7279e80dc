#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>

#include "env/options.h"
#include "fuzz/capi_sequence_internal.h"
#include "fuzz/fuzz_check.h"
#include "tpushim/c_api.h"

namespace tpushim::fuzz::capi_sequence_internal {
namespace {

// The largest host range the program allocates; larger sizes are all
// outside every device buffer, and must be rejected without a touch.
constexpr uint64_t kMaxHostBytes = kMiB;

// Bytes nobody else would write: xorshift64 from `seed`.
void FillPattern(uint8_t* p, uint64_t n, uint64_t seed) {
  uint64_t x = (seed * 0x9E3779B97F4A7C15ull) | 1;
  for (uint64_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    p[i] = static_cast<uint8_t>(x >> 56);
  }
}

// `offset` and `size` lie within `total` (no wrap-around).
bool InRange(uint64_t offset, uint64_t size, uint64_t total) {
  return offset <= total && size <= total - offset;
}

}  // namespace

// ---- Transfers ----

// A transfer size, and an offset for it within a buffer of `total`
// bytes (0 when there is no buffer).
std::pair<uint64_t, uint64_t> Program::PickRange(uint64_t total) {
  static constexpr uint64_t kSizes[] = {
      0, 1, 13, 4 * kKiB, 16 * kKiB + 5, 64 * kKiB, 256 * kKiB, kHuge};
  const uint8_t offset_choice = in_.Byte();
  const uint64_t size = kSizes[in_.Below(8)];
  return {size, PickOffset(offset_choice, total, size)};
}

uint64_t Program::PickOffset(uint8_t choice, uint64_t total, uint64_t size) {
  switch (choice % 8) {
    case 0:
      return 0;
    case 1:
      return 1;
    case 2:
      return 7;
    case 3:
      return 4 * kKiB;
    case 4:
      return size <= total ? total - size : 0;  // at the end
    case 5:
      return total;
    case 6:
      return total == 0 ? 0 : total - 1;
    default:
      return kHuge;
  }
}

// Host memory for a transfer of `size` bytes (see HOST in the file
// comment): a pinned host buffer's (settled: the operation will be the
// only one using it), else the heap's; null for the NULL choice.
uint8_t* Program::PickHost(Operation& op, uint64_t size) {
  const uint8_t where = in_.Byte() % 4;
  if (where == 3) return nullptr;
  if (where == 2) {
    const uint64_t id = PickHandle(Kind::kHostBuffer);
    const auto it = host_buffers_.find(id);
    if (it != host_buffers_.end() && size <= it->second.size) {
      SettleHostBuffer(id);
      op.host_buffer = id;
      it->second.users.push_back(&op);
      // At the buffer's end, so that a range overrun crosses it.
      return it->second.data + (it->second.size - size);
    }
  }
  op.heap = std::make_unique_for_overwrite<uint8_t[]>(
      std::max<uint64_t>(1, std::min(size, kMaxHostBytes)));
  return op.heap.get();
}

// The host memory of an operation whose call failed is no one's.
void Program::Untrack(Operation& op) {
  if (op.host_buffer != 0) {
    Remove(host_buffers_.at(op.host_buffer).users, &op);
  }
}

int32_t Program::PickSemantics() {
  static constexpr int32_t kSemantics[] = {
      TPUSHIM_HOST_BUFFER_IMMUTABLE_ONLY_DURING_CALL,
      TPUSHIM_HOST_BUFFER_IMMUTABLE_UNTIL_TRANSFER_COMPLETES,
      TPUSHIM_HOST_BUFFER_IMMUTABLE_UNTIL_TRANSFER_COMPLETES, 7};
  return kSemantics[in_.Below(4)];
}

// IMMUTABLE_ONLY_DURING_CALL: the transfer is over when the call returns
// unless it was staged host→device (through the region or, with the region
// off, the bounce pool).
void Program::CheckReadyOnReturn(uint64_t event) {
  TpuShim_Event_IsReady_Args args = {};
  args.struct_size = TPUSHIM_EVENT_ISREADY_ARGS_STRUCT_SIZE;
  args.event.id = event;
  const Result r = Take(api->Event_IsReady(&args));
  TPUSHIM_FUZZ_CHECK(r.ok() && args.is_ready)
      << "an IMMUTABLE_ONLY_DURING_CALL transfer returned before it was "
         "done: "
      << r;
}

void Program::ToDevice() {
  const uint64_t system_id = PickHandle(Kind::kSystem);
  const uint64_t dst = PickHandle(Kind::kDeviceBuffer);
  auto op = std::make_unique<Operation>();
  op->kind = OpKind::kToDevice;
  op->system = system_id;
  DeviceBufferModel* buffer = FindDeviceBuffer(dst);
  const std::pair<uint64_t, uint64_t> range =
      PickRange(buffer != nullptr ? buffer->size : 0);
  op->size = range.first;
  const uint64_t offset = range.second;
  uint8_t* src = PickHost(*op, op->size);
  const int32_t semantics = PickSemantics();
  const WaitList wait = PickWaitList(system_id);
  const SystemModel* system = LiveSystem(system_id);
  const bool dst_ok = IsLiveIn(dst, Kind::kDeviceBuffer, system_id);
  const Verdict verdict{
      .bad_handle = system == nullptr || !dst_ok || wait.bad_handle,
      .bad_argument = src == nullptr || semantics == 7 || wait.null_pointer ||
                      op->size == 0 ||
                      (dst_ok && !InRange(offset, op->size, buffer->size))};
  // A range the program could not back with memory is never valid.
  TPUSHIM_FUZZ_CHECK(verdict.invalid() || op->size <= kMaxHostBytes);
  const uint64_t serial = ++serial_;
  if (src != nullptr) {
    FillPattern(src, std::min(op->size, kMaxHostBytes), serial);
  }
  TpuShim_Transfer_ToDevice_Args args = {};
  args.struct_size = TPUSHIM_TRANSFER_TODEVICE_ARGS_STRUCT_SIZE;
  args.system.id = system_id;
  args.src = src;
  args.dst.id = dst;
  args.dst_offset = offset;
  args.size = op->size;
  args.wait_for = wait.data();
  args.num_wait_for = wait.events.size();
  args.semantics = semantics;
  const Result r = Take(api->Transfer_ToDevice(&args));
  if (verdict.invalid()) {
    Untrack(*op);
    return CheckRejected("Transfer_ToDevice", r, verdict);
  }
  TPUSHIM_FUZZ_CHECK(r.ok()) << "Transfer_ToDevice: " << r;
  op->deps = wait.deps;
  op->data.assign(src, src + op->size);
  op->data_known = true;
  StartWrite(op.get(), dst, offset);
  if (semantics == TPUSHIM_HOST_BUFFER_IMMUTABLE_ONLY_DURING_CALL) {
    // The source may be reused at once: the device must have its bytes.
    std::fill_n(src, op->size, kPoison);
    const bool zero_copy =
        op->host_buffer != 0 &&
        host_buffers_.at(op->host_buffer).system == system_id;
    // Staged through the region's staging, or with the region off
    // through the engine's bounce pool.
    const bool staged =
        !zero_copy && (system->region != 0 ? op->size <= system->threshold
                                           : op->size <= kBounceMaxBytes);
    if (!staged) CheckReadyOnReturn(args.event.id);
  }
  Track(std::move(op), args.event.id);
}

void Program::FromDevice() {
  const uint64_t system_id = PickHandle(Kind::kSystem);
  const uint64_t src_id = PickHandle(Kind::kDeviceBuffer);
  auto op = std::make_unique<Operation>();
  op->kind = OpKind::kFromDevice;
  op->system = system_id;
  DeviceBufferModel* buffer = FindDeviceBuffer(src_id);
  const std::pair<uint64_t, uint64_t> range =
      PickRange(buffer != nullptr ? buffer->size : 0);
  op->size = range.first;
  const uint64_t offset = range.second;
  uint8_t* dst = PickHost(*op, op->size);
  const int32_t semantics = PickSemantics();
  const WaitList wait = PickWaitList(system_id);
  const SystemModel* system = LiveSystem(system_id);
  const bool src_ok = IsLiveIn(src_id, Kind::kDeviceBuffer, system_id);
  const Verdict verdict{
      .bad_handle = system == nullptr || !src_ok || wait.bad_handle,
      .bad_argument = dst == nullptr || semantics == 7 || wait.null_pointer ||
                      op->size == 0 ||
                      (src_ok && !InRange(offset, op->size, buffer->size))};
  TPUSHIM_FUZZ_CHECK(verdict.invalid() || op->size <= kMaxHostBytes);
  if (dst != nullptr) {
    std::fill_n(dst, std::min(op->size, kMaxHostBytes), kPoison);
  }
  TpuShim_Transfer_FromDevice_Args args = {};
  args.struct_size = TPUSHIM_TRANSFER_FROMDEVICE_ARGS_STRUCT_SIZE;
  args.system.id = system_id;
  args.src.id = src_id;
  args.src_offset = offset;
  args.dst = dst;
  args.size = op->size;
  args.wait_for = wait.data();
  args.num_wait_for = wait.events.size();
  args.semantics = semantics;
  const Result r = Take(api->Transfer_FromDevice(&args));
  if (verdict.invalid()) {
    Untrack(*op);
    return CheckRejected("Transfer_FromDevice", r, verdict);
  }
  TPUSHIM_FUZZ_CHECK(r.ok()) << "Transfer_FromDevice: " << r;
  op->deps = wait.deps;
  op->host = dst;
  StartRead(op.get(), src_id, offset);
  if (semantics == TPUSHIM_HOST_BUFFER_IMMUTABLE_ONLY_DURING_CALL) {
    CheckReadyOnReturn(args.event.id);
  }
  Track(std::move(op), args.event.id);
}

void Program::DeviceToDevice() {
  const uint64_t system_id = PickHandle(Kind::kSystem);
  const uint64_t src_id = PickHandle(Kind::kDeviceBuffer);
  const uint64_t dst_id = PickHandle(Kind::kDeviceBuffer);
  DeviceBufferModel* src = FindDeviceBuffer(src_id);
  DeviceBufferModel* dst = FindDeviceBuffer(dst_id);
  const uint64_t src_size = src != nullptr ? src->size : 0;
  const uint64_t dst_size = dst != nullptr ? dst->size : 0;
  const uint8_t src_choice = in_.Byte();
  const uint8_t dst_choice = in_.Byte();
  static constexpr uint64_t kSizes[] = {
      0, 1, 13, 4 * kKiB, 16 * kKiB + 5, 64 * kKiB, 256 * kKiB, kHuge};
  const uint64_t size = kSizes[in_.Below(8)];
  const uint64_t src_offset = PickOffset(src_choice, src_size, size);
  const uint64_t dst_offset = PickOffset(dst_choice, dst_size, size);
  const WaitList wait = PickWaitList(system_id);
  const bool src_ok = IsLiveIn(src_id, Kind::kDeviceBuffer, system_id);
  const bool dst_ok = IsLiveIn(dst_id, Kind::kDeviceBuffer, system_id);
  const Verdict verdict{
      .bad_handle = !IsLive(system_id, Kind::kSystem) || !src_ok || !dst_ok ||
                    wait.bad_handle,
      .bad_argument = wait.null_pointer || size == 0 ||
                      (src_ok && !InRange(src_offset, size, src_size)) ||
                      (dst_ok && !InRange(dst_offset, size, dst_size))};
  TpuShim_Transfer_DeviceToDevice_Args args = {};
  args.struct_size = TPUSHIM_TRANSFER_DEVICETODEVICE_ARGS_STRUCT_SIZE;
  args.system.id = system_id;
  args.src.id = src_id;
  args.src_offset = src_offset;
  args.dst.id = dst_id;
  args.dst_offset = dst_offset;
  args.size = size;
  args.wait_for = wait.data();
  args.num_wait_for = wait.events.size();
  const Result r = Take(api->Transfer_DeviceToDevice(&args));
  if (verdict.invalid()) {
    return CheckRejected("Transfer_DeviceToDevice", r, verdict);
  }
  TPUSHIM_FUZZ_CHECK(r.ok()) << "Transfer_DeviceToDevice: " << r;
  auto op = std::make_unique<Operation>();
  op->kind = OpKind::kDeviceToDevice;
  op->system = system_id;
  op->size = size;
  op->deps = wait.deps;
  // Read first: a copy onto an overlapping range of the same buffer is
  // then in conflict with itself, and its bytes unknown.
  StartRead(op.get(), src_id, src_offset);
  StartWrite(op.get(), dst_id, dst_offset);
  Track(std::move(op), args.event.id);
}

}  // namespace tpushim::fuzz::capi_sequence_internal
