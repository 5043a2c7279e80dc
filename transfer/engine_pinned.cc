#include "transfer/engine.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/human_bytes.h"
#include "logging/log.h"

namespace tpushim::transfer_internal {

void Engine::StartPinned(Op& op, int reason) {
  if (op.path == TransferPath::kStaged) op.path = TransferPath::kPinned;
  if (reason != 2) {
    pinned_reasons_[reason].fetch_add(1, std::memory_order_relaxed);
  }
  if (op.size == 0) {
    ChunkDone(op);
    return;
  }
  WarnPinned(op, reason);
  void* host = op.kind == OpKind::kToDevice
                   ? const_cast<char*>(op.src)
                   : static_cast<void*>(op.dst);
  absl::StatusOr<PinTracker::Lease> lease = pins_.Pin(host, op.size);
  if (!lease.ok()) {
    op.RecordError(absl::Status(
        lease.status().code(),
        absl::StrCat("Pinning ", HumanReadableBytes(op.size),
                     " of caller memory for a ",
                     DmaDirectionDescription(op.direction),
                     " transfer failed: ", lease.status().message(),
                     ". Raise the memlock limit (ulimit -l) or allocate the "
                     "buffer from the premapped region.")));
    ChunkDone(op);
    return;
  }
  absl::StatusOr<HostWindowId> window =
      devices_[op.device]->RegisterHostWindow(host, op.size);
  if (!window.ok()) {
    pins_.Unpin(*std::move(lease));
    op.RecordError(window.status());
    ChunkDone(op);
    return;
  }
  op.lease = *std::move(lease);
  op.window = *window;
  StartDescriptors(op, op.window, 0);
}

void Engine::WarnPinned(const Op& op, int reason) {
  const int64_t now = os_->MonotonicNanos();
  uint64_t suppressed;
  {
    MutexLock lock(&warn_mu_);
    if (last_warning_ns_ != 0 &&
        now - last_warning_ns_ <
            absl::ToInt64Nanoseconds(config_.fallback_warning_interval)) {
      ++suppressed_warnings_;
      return;
    }
    last_warning_ns_ = now;
    suppressed = suppressed_warnings_;
    suppressed_warnings_ = 0;
  }
  std::string why;
  switch (reason) {
    case 0:
      why = absl::StrCat(
          "it is larger than TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES=",
          threshold_, " (", HumanReadableBytes(threshold_), ")");
      break;
    case 1:
      why =
          "the premapped region is off (TPU_PREMAPPED_BUFFER_SIZE=0, so "
          "TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES is 0)";
      break;
    default:
      why = absl::StrCat(
          "no staging space in the premapped region freed up within ",
          absl::FormatDuration(config_.staging_wait), " (",
          HumanReadableBytes(
              staging_in_flight_.load(std::memory_order_relaxed)),
          " of ", HumanReadableBytes(max_staging_),
          " staging in flight; TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES=",
          threshold_, ")");
      break;
  }
  LOG(WARNING) << "Transfer of " << HumanReadableBytes(op.size) << " "
               << DmaDirectionDescription(op.direction) << " on "
               << devices_[op.device]->info().name
               << " pins the caller's memory for the transfer (slower): "
               << why << "."
               << (suppressed > 0
                       ? absl::StrCat(" ", suppressed,
                                      " more such transfers since the last "
                                      "message.")
                       : std::string());
}

}  // namespace tpushim::transfer_internal
