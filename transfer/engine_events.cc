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

// The first failure of several events, once all are ready.
struct AllOf {
  explicit AllOf(uint64_t n, absl::Status first)
      : left(n), first_error(std::move(first)) {}
  std::atomic<uint64_t> left;
  Mutex mu;
  absl::Status first_error ABSL_GUARDED_BY(mu);
};

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

void Engine::TrackWrite(const std::shared_ptr<Allocation>& a,
                        const std::shared_ptr<EventState>& event) {
  {
    MutexLock lock(&a->mu);
    a->writes.push_back(event);
  }
  std::weak_ptr<Allocation> weak = a;
  EventState* raw = event.get();
  event->AddContinuation([weak, raw](const absl::Status& s) {
    std::shared_ptr<Allocation> alloc = weak.lock();
    if (alloc == nullptr) return;
    MutexLock lock(&alloc->mu);
    auto& w = alloc->writes;
    w.erase(std::remove_if(w.begin(), w.end(),
                           [raw](const std::shared_ptr<EventState>& e) {
                             return e.get() == raw;
                           }),
            w.end());
    if (!s.ok() && alloc->write_error.ok()) alloc->write_error = s;
  });
}

absl::StatusOr<Event> Engine::BufferReadyEvent(const DeviceBuffer& buffer) {
  TPUSHIM_RETURN_IF_ERROR(CheckOpen());
  TPUSHIM_ASSIGN_OR_RETURN(std::shared_ptr<Allocation> a,
                           LiveAllocation(buffer, serial_, "BufferReadyEvent"));
  std::vector<std::shared_ptr<EventState>> writes;
  absl::Status failed;
  {
    MutexLock lock(&a->mu);
    writes = a->writes;
    failed = a->write_error;
  }
  if (writes.empty()) return Event::Ready(std::move(failed));
  auto ready = std::make_shared<EventState>(&callbacks_, this);
  auto all = std::make_shared<AllOf>(writes.size(), std::move(failed));
  for (const std::shared_ptr<EventState>& w : writes) {
    w->AddContinuation([all, ready](const absl::Status& s) {
      if (!s.ok()) {
        MutexLock lock(&all->mu);
        if (all->first_error.ok()) all->first_error = s;
      }
      if (all->left.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
      absl::Status status;
      {
        MutexLock lock(&all->mu);
        status = all->first_error;
      }
      ready->Resolve(std::move(status));
    });
  }
  return Event(std::move(ready));
}

absl::Status Engine::BeginChunkedTransfer(const DeviceBuffer& dst) {
  TPUSHIM_RETURN_IF_ERROR(CheckOpen());
  TPUSHIM_ASSIGN_OR_RETURN(
      std::shared_ptr<Allocation> a,
      LiveAllocation(dst, serial_, "BeginChunkedTransfer"));
  TPUSHIM_ASSIGN_OR_RETURN(std::shared_ptr<EventState> done,
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
    a->chunk_ranges.clear();
    a->chunks_given = 0;
  }
  TrackWrite(a, done);
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
    return SubmitWithRelease(std::move(op), wait_for);
  }();
  if (!events.ok()) {
    // Nothing was queued: as if the call had not been made.
    {
      MutexLock lock(&a->mu);
      --a->chunks_running;
      --a->chunks_given;
      if (is_last && a->chunked == Allocation::Chunked::kClosed &&
          a->chunked_done != nullptr) {
        a->chunked = Allocation::Chunked::kOpen;
      }
    }
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

void Engine::ChunkFinished(const std::shared_ptr<Allocation>& a,
                           const absl::Status& s) {
  std::shared_ptr<EventState> done;
  absl::Status status;
  {
    MutexLock lock(&a->mu);
    if (!s.ok() && a->chunk_error.ok()) a->chunk_error = s;
    if (--a->chunks_running == 0 &&
        a->chunked == Allocation::Chunked::kClosed) {
      done = std::move(a->chunked_done);
      status = a->chunk_error;
    }
  }
  // Shutdown may have failed it already (CANCELLED): that stands.
  if (done != nullptr) (void)caller_events_->Set(*done, std::move(status));
}

bool Engine::AbandonChunked(Allocation& a, const absl::Status& status) {
  std::shared_ptr<EventState> done;
  absl::Status failed;
  {
    MutexLock lock(&a.mu);
    if (a.chunked != Allocation::Chunked::kOpen) return false;
    a.chunked = Allocation::Chunked::kClosed;
    done = std::move(a.chunked_done);
    failed = absl::Status(
        status.code(), absl::StrCat(status.message(), "; ", MissingBytes(a)));
  }
  // Chunks still running finish as they would; the transfer's event (and
  // so the buffer's ready event) fails now. Shutdown may have failed it
  // already (CANCELLED): that stands.
  if (done != nullptr) (void)caller_events_->Set(*done, std::move(failed));
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
