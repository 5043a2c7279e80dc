#include <algorithm>
#include <cstring>
#include <memory>
#include <utility>

#include "logging/log.h"
#include "transfer/engine.h"

namespace tpushim::transfer_internal {

// ---- Completion ------------------------------------------------------------

void Engine::OnDmaComplete(int device, DmaDirection direction,
                           absl::Span<const DmaCompletion> completions) {
  // Counted before any of the completions can finish an operation (and so
  // before unfinished_ can reach 0), uncounted last.
  in_completion_.fetch_add(1, std::memory_order_relaxed);
  Queue& q = QueueOf(device, direction);
  for (const DmaCompletion& c : completions) {
    Chunk& chunk = *reinterpret_cast<Chunk*>(c.user_data);
    Op& op = *chunk.op;
    q.descriptors.fetch_add(1, std::memory_order_relaxed);
    if (trace_) {
      trace_->Descriptor(
          device, static_cast<int>(direction),
          // The names are literals: .data() is NUL-terminated.
          op.kind == OpKind::kDeviceToDevice ? "copy"
                                             : TransferPathName(op.path).data(),
          DmaDirectionName(direction).data(), op.id, chunk.index, chunk.length,
          chunk.submit_ns, c.start_ns, c.end_ns, !c.status.ok());
    }
    if (!c.status.ok()) op.RecordError(c.status);
    if (PinnedPiece* piece = chunk.piece; piece != nullptr) {
      // The piece's last descriptor: unregistering and unpinning are
      // system calls, off the DMA thread.
      if (piece->running.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        Op* o = &op;
        host_workers_[device]->Post(
            [this, o, piece] { ReleasePiece(*o, *piece); });
      }
      ChunkDone(op);
      continue;
    }
    if (op.copy_order != CopyOrder::kParallel) {
      NextChainedCopy(op, chunk, c.status.ok());
      continue;
    }
    if (op.path == TransferPath::kStaged &&
        op.kind != OpKind::kDeviceToDevice) {
      if (op.kind == OpKind::kToDevice) {
        bool reuse;
        bool wake = false;
        {
          MutexLock lock(&op.mu);
          reuse = op.copying;
          if (reuse) {
            op.free_staging.push_back(chunk.staging);
            op.recycled.fetch_add(1, std::memory_order_release);
            wake = op.copier_sleeping;
          }
        }
        if (reuse) {
          if (wake) op.staging_cv.Signal();
        } else {
          ReleaseStaging(op, chunk.staging, op.staging_chunk);
        }
        chunk.staging = nullptr;
      } else {
        if (c.status.ok() && chunk.length > config_.inline_copy_bytes) {
          Chunk* cp = &chunk;
          host_workers_[device]->Post([this, cp] {
            CopyOut(*cp->op, *cp);
            NextFromDevice(*cp->op, *cp, true);
          });
          continue;
        }
        if (c.status.ok()) CopyOut(op, chunk);
        NextFromDevice(op, chunk, c.status.ok());
        continue;
      }
    }
    ChunkDone(op);
  }
  DrainOverflow(q);
  in_completion_.fetch_sub(1, std::memory_order_release);
}

void Engine::NextChainedCopy(Op& op, const Chunk& chunk, bool ok) {
  const bool down = op.copy_order == CopyOrder::kChainedDown;
  const uint32_t count = static_cast<uint32_t>(op.chunks.size());
  // Descriptors of the copy after this one, in its order.
  const uint32_t after = down ? chunk.index : count - 1 - chunk.index;
  if (ok && after > 0) {
    // Submitted before this one is counted done, so the operation cannot
    // finish in between. It goes on through shutdown: a started copy ends
    // whole, or with the first failure.
    Chunk& next = op.chunks[down ? chunk.index - 1 : chunk.index + 1];
    SubmitChunk(op, next, kInvalidHostWindow, 0);
    ChunkDone(op);
  } else {
    ChunkDone(op, 1 + (ok ? 0 : after));
  }
}

void Engine::ChunkDone(Op& op, uint64_t n) {
  if (op.outstanding.fetch_sub(n, std::memory_order_acq_rel) == n) {
    CompleteOp(op);
  }
}

void Engine::PackRange(const Op& op, uint64_t offset, uint64_t n, char* dst) {
  const uint64_t in_image =
      offset >= op.image_bytes ? 0 : std::min(n, op.image_bytes - offset);
  // Cannot fail: the range lies inside the image.
  if (in_image > 0)
    (void)op.relayout->Pack(op.dense_src, offset, in_image, dst);
  if (in_image < n) std::memset(dst + in_image, 0, n - in_image);
}

void Engine::UnpackRange(const Op& op, const char* src, uint64_t offset,
                         uint64_t n) {
  const uint64_t in_image =
      offset >= op.image_bytes ? 0 : std::min(n, op.image_bytes - offset);
  if (in_image > 0) {
    (void)op.relayout->Unpack(src, offset, in_image, op.dense_dst);
  }
}

void Engine::CopyOut(Op& op, const Chunk& chunk) {
  if (op.relayout != nullptr) {
    UnpackRange(op, chunk.staging, chunk.offset, chunk.length);
  } else {
    std::memcpy(op.dst + chunk.offset, chunk.staging, chunk.length);
  }
}

void Engine::CompleteOp(Op& op) {
  std::shared_ptr<Op> keep = std::move(op.self);
  if (op.image != nullptr && op.kind == OpKind::kFromDevice &&
      op.Error().ok()) {
    UnpackRange(op, op.image.get(), 0, op.size);
  }
  op.image.reset();
  const absl::Status status = op.Error();
  Queue& q = QueueOf(op.device, op.direction);
  q.in_flight.fetch_sub(1, std::memory_order_relaxed);
  if (status.ok()) {
    q.completed.fetch_add(1, std::memory_order_relaxed);
  } else if (absl::IsCancelled(status)) {
    q.cancelled.fetch_add(1, std::memory_order_relaxed);
  } else {
    q.failed.fetch_add(1, std::memory_order_relaxed);
  }
  PathCounters& stats = op.kind == OpKind::kDeviceToDevice
                            ? d2d_stats_
                            : host_stats_[static_cast<int>(op.direction)]
                                         [static_cast<int>(op.path)];
  stats.transfers.fetch_add(1, std::memory_order_relaxed);
  if (status.ok()) {
    stats.bytes.fetch_add(op.size, std::memory_order_relaxed);
  } else {
    stats.failed.fetch_add(1, std::memory_order_relaxed);
  }
  const int64_t now = os_->MonotonicNanos();
  stats.busy_ns.fetch_add(now - op.submit_ns, std::memory_order_relaxed);
  if (op.start_ns != 0) {
    stats.active_ns.fetch_add(now - op.start_ns, std::memory_order_relaxed);
  }
  if (op.registered) {
    const int d = static_cast<int>(op.direction);
    registered_transfers_[d].fetch_add(1, std::memory_order_relaxed);
    if (status.ok()) {
      registered_bytes_[d].fetch_add(op.size, std::memory_order_relaxed);
    }
  }
  // Not ready for stats from here on (see events_not_ready_).
  events_not_ready_.fetch_sub(1, std::memory_order_acq_rel);
  // host_released is never ready later than ready (the staged path has
  // resolved it already, when it was done copying).
  if (op.released != nullptr) op.released->Resolve(status);
  op.event->Resolve(status);
  // After Resolve: an Unregister waiting for this transfer returns with
  // its event ready (the device is done with the registered memory).
  op.registration.Reset();
  // After Resolve: a Deallocate waiting for this operation must not free
  // the buffer (and report it free) while the operation's event is still
  // pending, and a kImmutableOnlyDuringCall caller that returns on
  // host_released must find its event ready.
  ReleaseBufferUse(op.buffer);
  if (op.peer) ReleaseBufferUse(op.peer);
  op.host_released.Notify();
  MutexLock lock(&idle_mu_);
  if (--unfinished_ == 0) idle_cv_.SignalAll();
}

void Engine::CancelUnstarted(const std::shared_ptr<Op>& op,
                             absl::Status status) {
  op->RecordError(status);
  op->self = op;
  QueueOf(op->device, op->direction)
      .in_flight.fetch_add(1, std::memory_order_relaxed);
  CompleteOp(*op);
}

void Engine::ReleaseHost(Op& op, const absl::Status& status) {
  if (op.released != nullptr) op.released->Resolve(status);
  op.host_released.Notify();
}

}  // namespace tpushim::transfer_internal
