// The engine's events beyond one per operation: host_released, caller
// events, buffer readiness and chunked host→device transfers.

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "transfer/engine.h"

namespace tpushim::transfer_internal {
namespace {

// `buffer`'s allocation when it is a live buffer of the engine `serial`.
absl::StatusOr<std::shared_ptr<Allocation>> LiveAllocation(
    const DeviceBuffer& buffer, uint64_t serial, absl::string_view what) {
  std::shared_ptr<Allocation> a = Engine::AllocationOf(buffer);
  if (a == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": the device buffer handle is empty"));
  }
  if (a->engine_serial != serial) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": the device buffer belongs to another transfer engine"));
  }
  MutexLock lock(&a->mu);
  if (a->deallocating || a->freed) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: the device buffer (device %d, address 0x%x) has been "
        "deallocated",
        what, a->device, a->address));
  }
  return a;
}

// Adds [offset, offset + size) to the sorted, merged `ranges`.
void AddRange(std::vector<std::pair<uint64_t, uint64_t>>& ranges,
              uint64_t offset, uint64_t size) {
  uint64_t begin = offset;
  uint64_t end = offset + size;
  std::vector<std::pair<uint64_t, uint64_t>> merged;
  merged.reserve(ranges.size() + 1);
  bool placed = false;
  for (const auto& [b, e] : ranges) {
    if (e < begin) {
      merged.emplace_back(b, e);
    } else if (end < b) {
      if (!placed) merged.emplace_back(begin, end);
      placed = true;
      merged.emplace_back(b, e);
    } else {
      begin = std::min(begin, b);
      end = std::max(end, e);
    }
  }
  if (!placed) merged.emplace_back(begin, end);
  ranges = std::move(merged);
}

// What an unfinished chunked transfer into `a` lacks, for its error:
// "3072 of the buffer's 4096 bytes never came (1 chunk gave 1024 bytes)".
std::string MissingBytes(const Allocation& a)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(a.mu) {
  uint64_t covered = 0;
  for (const auto& [b, e] : a.chunk_ranges) covered += e - b;
  return absl::StrFormat(
      "%d of the buffer's %d bytes never came (%d chunk%s gave %d bytes)",
      a.size - covered, a.size, a.chunks_given, a.chunks_given == 1 ? "" : "s",
      covered);
}

}  // namespace

absl::StatusOr<TransferEvents> Engine::SubmitWithRelease(
    std::shared_ptr<Op> op, absl::Span<const Event> wait_for) {
  op->released = std::make_shared<EventState>(&callbacks_, this);
  Event released(op->released);
  TPUSHIM_ASSIGN_OR_RETURN(Event ready, Submit(std::move(op), wait_for));
  return TransferEvents{std::move(ready), std::move(released)};
}

absl::StatusOr<CallerEvent> Engine::CreateEvent() {
  TPUSHIM_RETURN_IF_ERROR(CheckOpen());
  TPUSHIM_ASSIGN_OR_RETURN(std::shared_ptr<EventState> state,
                           caller_events_->Create());
  return CallerEvent(caller_events_, Event(std::move(state)));
}

absl::StatusOr<Event> Engine::BufferReadyEvent(const DeviceBuffer& buffer) {
  TPUSHIM_RETURN_IF_ERROR(CheckOpen());
  TPUSHIM_ASSIGN_OR_RETURN(std::shared_ptr<Allocation> a,
                           LiveAllocation(buffer, serial_, "BufferReadyEvent"));
  std::vector<std::shared_ptr<EventState>> writes;
  absl::Status failed;
  {
    MutexLock lock(&a->mu);
    writes = a->order.PendingWrites();
    failed = a->order.failed_write();
  }
  if (writes.empty()) return Event::Ready(std::move(failed));
  return Event(WhenAll(writes, std::move(failed), &callbacks_, this));
}

absl::Status Engine::BeginChunkedTransfer(const DeviceBuffer& dst) {
  TPUSHIM_RETURN_IF_ERROR(CheckOpen());
  TPUSHIM_ASSIGN_OR_RETURN(
      std::shared_ptr<Allocation> a,
      LiveAllocation(dst, serial_, "BeginChunkedTransfer"));
  TPUSHIM_ASSIGN_OR_RETURN(std::shared_ptr<EventState> done,
                           caller_events_->Create());
  TPUSHIM_ASSIGN_OR_RETURN(std::shared_ptr<EventState> end,
                           caller_events_->Create());
  {
    MutexLock lock(&a->mu);
    if (a->chunked == Allocation::Chunked::kOpen) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "BeginChunkedTransfer: a chunked transfer into the device buffer "
          "(device %d, address 0x%x) is already open; give its last chunk "
          "(is_last) first",
          a->device, a->address));
    }
    a->chunked = Allocation::Chunked::kOpen;
    a->chunks_running = 0;
    a->chunk_error = absl::OkStatus();
    a->chunked_done = done;
    a->chunked_end = end;
    a->chunk_ranges.clear();
    a->chunks_given = 0;
    // One write of the whole buffer, in the order from now: what comes
    // after waits for its chunks, however late they are given; the chunks
    // wait for what came before.
    const BufferOrder::Range whole{0, a->size};
    a->chunked_after.clear();
    a->order.Conflicts(whole, BufferOrder::Access::kWrite, &a->chunked_after);
    a->order.Record(whole, BufferOrder::Access::kWrite, end,
                    QueueTag(a->device, DmaDirection::kHostToDevice), done);
    a->chunk_order.Clear();
  }
  return absl::OkStatus();
}

absl::StatusOr<TransferEvents> Engine::TransferChunk(
    const void* src, const DeviceBuffer& dst, uint64_t dst_offset,
    uint64_t size, bool is_last, absl::Span<const Event> wait_for,
    HostBufferSemantics semantics) {
  TPUSHIM_RETURN_IF_ERROR(CheckOpen());
  TPUSHIM_ASSIGN_OR_RETURN(std::shared_ptr<Allocation> a,
                           LiveAllocation(dst, serial_, "TransferChunk"));
  if (dst_offset > a->size || size > a->size - dst_offset) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "TransferChunk: the chunk [%d, +%d) overlaps the end of the device "
        "buffer of %d bytes",
        dst_offset, size, a->size));
  }
  // Counted before the operation exists, so the chunked transfer cannot
  // finish between its last chunk's submission and its run.
  {
    MutexLock lock(&a->mu);
    if (a->chunked != Allocation::Chunked::kOpen) {
      return absl::FailedPreconditionError(
          a->chunked == Allocation::Chunked::kClosed
              ? "TransferChunk: the chunked transfer into this device "
                "buffer already had its last chunk (is_last); begin another "
                "one to write the buffer again"
              : "TransferChunk: no chunked transfer into this device buffer "
                "is open; call BeginChunkedTransfer first");
    }
    ++a->chunks_running;
    ++a->chunks_given;
    if (is_last) a->chunked = Allocation::Chunked::kClosed;
  }
  absl::StatusOr<TransferEvents> events =
      [&]() -> absl::StatusOr<TransferEvents> {
    TPUSHIM_ASSIGN_OR_RETURN(
        std::shared_ptr<Op> op,
        NewHostOp(OpKind::kToDevice, dst, dst_offset, src, size, semantics));
    op->chunk = true;
    return SubmitWithRelease(std::move(op), wait_for);
  }();
  if (!events.ok()) {
    // Nothing was queued: as if the call had not been made.
    std::shared_ptr<EventState> done;
    std::shared_ptr<EventState> end;
    absl::Status status;
    {
      MutexLock lock(&a->mu);
      --a->chunks_running;
      --a->chunks_given;
      if (is_last && a->chunked == Allocation::Chunked::kClosed &&
          a->chunked_done != nullptr) {
        a->chunked = Allocation::Chunked::kOpen;
      }
      // Abandoned meanwhile (deallocated): this was the chunk it waited for.
      if (a->chunks_running == 0 &&
          a->chunked == Allocation::Chunked::kClosed) {
        done = std::move(a->chunked_done);
        status = a->chunk_error;
        end = TakeChunkedEnd(*a);
      }
    }
    if (done != nullptr) (void)caller_events_->Set(*done, std::move(status));
    if (end != nullptr) (void)caller_events_->Set(*end, absl::OkStatus());
    return events.status();
  }
  {
    MutexLock lock(&a->mu);
    AddRange(a->chunk_ranges, dst_offset, size);
  }
  events->ready.state()->AddContinuation(
      [this, a](const absl::Status& s) { ChunkFinished(a, s); });
  return events;
}

std::shared_ptr<EventState> Engine::TakeChunkedEnd(Allocation& a) {
  if (a.chunked == Allocation::Chunked::kOpen || a.chunks_running > 0) {
    return nullptr;
  }
  return std::move(a.chunked_end);
}

void Engine::ChunkFinished(const std::shared_ptr<Allocation>& a,
                           const absl::Status& s) {
  std::shared_ptr<EventState> done;
  std::shared_ptr<EventState> end;
  absl::Status status;
  {
    MutexLock lock(&a->mu);
    if (!s.ok() && a->chunk_error.ok()) a->chunk_error = s;
    if (--a->chunks_running == 0 &&
        a->chunked == Allocation::Chunked::kClosed) {
      done = std::move(a->chunked_done);
      status = a->chunk_error;
      end = TakeChunkedEnd(*a);
    }
  }
  // Shutdown may have failed them already (CANCELLED): that stands. The
  // readiness first, then the order: what waits for the buffer after the
  // transfer may start.
  if (done != nullptr) (void)caller_events_->Set(*done, std::move(status));
  if (end != nullptr) (void)caller_events_->Set(*end, absl::OkStatus());
}

bool Engine::AbandonChunked(Allocation& a, const absl::Status& status) {
  std::shared_ptr<EventState> done;
  std::shared_ptr<EventState> end;
  absl::Status failed;
  {
    MutexLock lock(&a.mu);
    if (a.chunked != Allocation::Chunked::kOpen) return false;
    a.chunked = Allocation::Chunked::kClosed;
    done = std::move(a.chunked_done);
    end = TakeChunkedEnd(a);
    failed = absl::Status(
        status.code(), absl::StrCat(status.message(), "; ", MissingBytes(a)));
  }
  // Chunks still running finish as they would (the last one to finish
  // ends the transfer's place in the buffer's order); the transfer's
  // readiness (and so the buffer's ready event) fails now. Shutdown may
  // have failed them already (CANCELLED): that stands.
  if (done != nullptr) (void)caller_events_->Set(*done, std::move(failed));
  if (end != nullptr) (void)caller_events_->Set(*end, absl::OkStatus());
  return true;
}

absl::Status Engine::AbortChunkedTransfer(const DeviceBuffer& dst,
                                          absl::Status error) {
  TPUSHIM_RETURN_IF_ERROR(CheckOpen());
  if (error.ok()) {
    return absl::InvalidArgumentError(
        "AbortChunkedTransfer: the error is OK; give the failure the "
        "buffer's waiters are to see (ABORTED, CANCELLED, ...)");
  }
  TPUSHIM_ASSIGN_OR_RETURN(
      std::shared_ptr<Allocation> a,
      LiveAllocation(dst, serial_, "AbortChunkedTransfer"));
  const absl::Status aborted(
      error.code(),
      absl::StrFormat("%s (the chunked transfer into the device buffer "
                      "(device %d, address 0x%x) was aborted before its last "
                      "chunk)",
                      error.message(), a->device, a->address));
  if (!AbandonChunked(*a, aborted)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "AbortChunkedTransfer: no chunked transfer into the device buffer "
        "(device %d, address 0x%x) is open (never begun, or its last chunk "
        "was given)",
        a->device, a->address));
  }
  return absl::OkStatus();
}

}  // namespace tpushim::transfer_internal
