#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cpu_relax.h"
#include "common/human_bytes.h"
#include "logging/log.h"
#include "transfer/engine.h"

namespace tpushim::transfer_internal {

char* Engine::TakeRegionStaging(uint64_t bytes) {
  uint64_t cur = staging_in_flight_.load(std::memory_order_relaxed);
  bool reserved = false;
  while (cur + bytes <= max_staging_) {
    if (staging_in_flight_.compare_exchange_weak(cur, cur + bytes,
                                                 std::memory_order_acq_rel)) {
      reserved = true;
      break;
    }
  }
  if (!reserved) return nullptr;
  char* p = static_cast<char*>(region_->allocator().TryAllocate(bytes));
  if (p == nullptr) {
    staging_in_flight_.fetch_sub(bytes, std::memory_order_acq_rel);
    return nullptr;
  }
  const uint64_t now_in_flight = cur + bytes;
  uint64_t peak = staging_peak_.load(std::memory_order_relaxed);
  while (now_in_flight > peak &&
         !staging_peak_.compare_exchange_weak(peak, now_in_flight)) {
  }
  if (trace_) trace_->StagingBytes(os_->MonotonicNanos(), now_in_flight);
  return p;
}

char* Engine::AcquireStaging(const Op& op, uint64_t bytes, int64_t deadline_ns,
                             bool* waited) {
  int64_t wait_start = 0;
  for (;;) {
    char* p = op.bounce
                  ? static_cast<char*>(bounce_->allocator().TryAllocate(bytes))
                  : TakeRegionStaging(bytes);
    if (p != nullptr) {
      if (wait_start != 0) {
        staging_wait_ns_.fetch_add(os_->MonotonicNanos() - wait_start,
                                   std::memory_order_relaxed);
      }
      return p;
    }
    const int64_t now = os_->MonotonicNanos();
    if (now >= deadline_ns || closing_.load(std::memory_order_acquire)) {
      if (wait_start != 0) {
        staging_wait_ns_.fetch_add(now - wait_start, std::memory_order_relaxed);
      }
      return nullptr;
    }
    if (wait_start == 0) {
      wait_start = now;
      if (waited != nullptr && !*waited) {
        *waited = true;
        staging_waits_.fetch_add(1, std::memory_order_relaxed);
      }
    }
    MutexLock lock(&staging_mu_);
    ++staging_waiters_;
    // Re-check under the lock: a release between the attempt and here
    // signalled nobody. A short bounded wait covers the allocator side
    // (space freed by Free of a user buffer signals no one).
    const int64_t until = std::min(deadline_ns, now + 1'000'000);
    if (!op.bounce && staging_in_flight_.load(std::memory_order_acquire) +
                              bytes >
                          max_staging_) {
      staging_cv_.WaitUntilMonotonicNanos(&staging_mu_, until);
    } else {
      staging_cv_.WaitUntilMonotonicNanos(&staging_mu_,
                                          std::min(until, now + 200'000));
    }
    --staging_waiters_;
  }
}

void Engine::ReleaseStaging(const Op& op, char* p, uint64_t bytes) {
  if (op.bounce) {
    absl::Status s = bounce_->allocator().Free(p);
    if (!s.ok()) LOG(ERROR) << "Freeing a bounce buffer failed: " << s;
  } else {
    absl::Status s = region_->allocator().Free(p);
    if (!s.ok()) LOG(ERROR) << "Freeing a staging buffer failed: " << s;
    const uint64_t now_in_flight =
        staging_in_flight_.fetch_sub(bytes, std::memory_order_acq_rel) - bytes;
    if (trace_) trace_->StagingBytes(os_->MonotonicNanos(), now_in_flight);
  }
  bool wake;
  {
    MutexLock lock(&staging_mu_);
    wake = staging_waiters_ > 0;
  }
  if (wake) staging_cv_.SignalAll();
}

Engine::FirstStaging Engine::AcquireFirstStaging(Op& op, bool may_block,
                                                 char** first) {
  const int64_t deadline =
      may_block ? os_->MonotonicNanos() +
                      absl::ToInt64Nanoseconds(config_.staging_wait)
                : 0;
  bool waited = false;
  const int64_t asked_ns = may_block ? os_->MonotonicNanos() : 0;
  *first = AcquireStaging(op, op.staging_chunk, deadline, &waited);
  if (waited) {
    VLOG(1) << "Transfer " << op.id << " waited "
            << (os_->MonotonicNanos() - asked_ns) / 1000
            << " us for staging memory"
            << (*first == nullptr ? " and takes the pinned path instead" : "");
  }
  if (*first != nullptr) return FirstStaging::kAcquired;
  if (!may_block) return FirstStaging::kWouldBlock;
  if (closing_.load(std::memory_order_acquire)) {
    op.RecordError(absl::CancelledError(
        "the transfer engine shut down before the transfer started"));
    ChunkDone(op);  // the starter's hold: the operation completes
    return FirstStaging::kHandled;
  }
  if (op.misaligned) {
    // The device cannot DMA the caller's buffer, so pinning is no way out:
    // wait on while staging is in flight (it comes back as its DMA
    // completes) or the region is still being premapped (it grows); with
    // neither, the region is full of the application's buffers and
    // waiting would never end.
    while (*first == nullptr && !closing_.load(std::memory_order_acquire) &&
           (op.bounce ? bounce_->allocator().GetStats().bytes_in_use > 0
                      : (staging_in_flight_.load(std::memory_order_acquire) >
                             0 ||
                         region_->allocator().growing()))) {
      *first = AcquireStaging(op, op.staging_chunk,
                              os_->MonotonicNanos() + absl::ToInt64Nanoseconds(
                                                          config_.staging_wait),
                              &waited);
    }
    if (*first != nullptr) return FirstStaging::kAcquired;
    if (closing_.load(std::memory_order_acquire)) {
      op.RecordError(absl::CancelledError(
          "the transfer engine shut down before the transfer started"));
    } else if (op.bounce) {
      op.RecordError(absl::ResourceExhaustedError(absl::StrCat(
          "the host buffer is not aligned for ",
          devices_[op.device]->info().name,
          "'s DMA, so it must be staged, and the engine's ",
          HumanReadableBytes(bounce_->size()), " bounce pool has no room for a ",
          HumanReadableBytes(op.staging_chunk), " staging buffer")));
    } else {
      op.RecordError(absl::ResourceExhaustedError(absl::StrCat(
          "the host buffer is not aligned for ",
          devices_[op.device]->info().name,
          "'s DMA, so it must be staged, and the premapped region has "
          "no room for a ",
          HumanReadableBytes(op.staging_chunk),
          " staging buffer with nothing in flight to free one ",
          region_->allocator().ready_bytes() < region_->size()
              ? absl::StrCat(
                    "(premapping the region stopped after ",
                    HumanReadableBytes(region_->allocator().ready_bytes()),
                    " of ", HumanReadableBytes(region_->size()), ")")
              : std::string("(the application's buffers fill it)"))));
    }
    ChunkDone(op);
    return FirstStaging::kHandled;
  }
  // No staging room in time (the bounce pool's included): pin instead.
  op.bounce = false;
  StartPinned(op, PinReason::kStagingTimeout);
  return FirstStaging::kHandled;
}

void Engine::StartStagedToDevice(Op& op, char* first) {
  const uint64_t step = op.staging_chunk;
  op.LayOutChunks(step);
  const uint64_t n = op.chunks.size();
  int held = first != nullptr ? 1 : 0;
  char* buf = first;
  uint64_t i = 0;
  for (; i < n; ++i) {
    if (buf == nullptr) {
      {
        MutexLock lock(&op.mu);
        if (!op.free_staging.empty()) {
          buf = op.free_staging.back();
          op.free_staging.pop_back();
          op.recycled.fetch_sub(1, std::memory_order_relaxed);
        }
      }
      if (buf == nullptr && held < StagingDepth(op)) {
        buf = AcquireStaging(op, step, 0, nullptr);
        if (buf != nullptr) ++held;
      }
      if (buf == nullptr) {
        // Our own chunks in flight come back: wait for one, polling first
        // (a chunk's DMA takes tens of microseconds).
        SpinFor(kCopierSpinNs, [&op] {
          return op.recycled.load(std::memory_order_acquire) > 0;
        });
        MutexLock lock(&op.mu);
        op.copier_sleeping = true;
        while (op.free_staging.empty()) op.staging_cv.Wait(&op.mu);
        op.copier_sleeping = false;
        buf = op.free_staging.back();
        op.free_staging.pop_back();
        op.recycled.fetch_sub(1, std::memory_order_relaxed);
      }
    }
    // A started transfer finishes, shutdown or not; a failed chunk ends it
    // (the transfer has its status).
    if (!op.Error().ok()) {
      MutexLock lock(&op.mu);
      op.free_staging.push_back(buf);
      buf = nullptr;
      break;
    }
    Chunk& c = op.chunks[i];
    c.staging = buf;
    if (op.relayout != nullptr) {
      PackRange(op, c.offset, c.length, buf);
    } else {
      std::memcpy(buf, op.src + c.offset, c.length);
    }
    buf = nullptr;
    SubmitChunk(op, c, StagingWindow(op), StagingOffset(op, c.staging));
  }
  // Done copying: the caller's buffer is free (host_released resolves
  // now, before the DMA ends), spare buffers go back.
  ReleaseHost(op, i < n ? op.Error() : absl::OkStatus());
  std::vector<char*> spare;
  {
    MutexLock lock(&op.mu);
    op.copying = false;
    spare.swap(op.free_staging);
    op.recycled.store(0, std::memory_order_relaxed);
  }
  for (char* p : spare) ReleaseStaging(op, p, step);
  if (i < n) ChunkDone(op, n - i);  // never submitted
  ChunkDone(op);                    // the starter's hold
}

void Engine::StartStagedFromDevice(Op& op, char* first) {
  const uint64_t step = op.staging_chunk;
  op.LayOutChunks(step);
  const uint64_t n = op.chunks.size();
  std::vector<char*> bufs;
  if (first != nullptr) {
    bufs.push_back(first);
    while (bufs.size() < std::min<uint64_t>(n, StagingDepth(op))) {
      char* p = AcquireStaging(op, step, 0, nullptr);
      if (p == nullptr) break;
      bufs.push_back(p);
    }
  }
  {
    MutexLock lock(&op.mu);
    op.next_chunk = static_cast<uint32_t>(bufs.size());
  }
  for (size_t i = 0; i < bufs.size(); ++i) {
    Chunk& c = op.chunks[i];
    c.staging = bufs[i];
    SubmitChunk(op, c, StagingWindow(op), StagingOffset(op, c.staging));
  }
  ChunkDone(op);  // the starter's hold
}

void Engine::NextFromDevice(Op& op, Chunk& chunk, bool ok) {
  char* buf = chunk.staging;
  chunk.staging = nullptr;
  Chunk* next = nullptr;
  uint64_t abandoned = 0;
  {
    MutexLock lock(&op.mu);
    const uint32_t n = static_cast<uint32_t>(op.chunks.size());
    // A started transfer finishes, shutdown or not; a failed chunk ends it.
    if (!ok || !op.error.ok()) {
      abandoned = n - op.next_chunk;
      op.next_chunk = n;
    } else if (op.next_chunk < n) {
      next = &op.chunks[op.next_chunk++];
    }
  }
  if (next != nullptr) {
    next->staging = buf;
    SubmitChunk(op, *next, StagingWindow(op), StagingOffset(op, buf));
  } else {
    ReleaseStaging(op, buf, op.staging_chunk);
  }
  ChunkDone(op, 1 + abandoned);
}

}  // namespace tpushim::transfer_internal
