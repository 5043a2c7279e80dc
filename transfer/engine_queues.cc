#include <algorithm>
#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "logging/log.h"
#include "transfer/engine.h"

namespace tpushim::transfer_internal {

// ---- Submission ------------------------------------------------------------

PathChoice Engine::PathFor(const void* host, uint64_t size, int device,
                           bool registrations) const {
  PathChoice c;
  const uint32_t align = devices_[device]->info().host_alignment;
  const bool misaligned =
      size > 0 && align > 1 && reinterpret_cast<uintptr_t>(host) % align != 0;
  // Inside the caller's registered memory: the device DMAs it where it is,
  // whatever the size (unless it cannot at that address: then as below).
  if (registrations && size > 0 && !misaligned &&
      live_registrations_.load(std::memory_order_acquire) > 0) {
    MutexLock lock(&reg_mu_);
    if (FindRegistrationLocked(host, size) != nullptr) {
      c.path = TransferPath::kZeroCopy;
      c.registered = true;
      return c;
    }
  }
  if (region_ == nullptr) {
    // Small transfers, and any the device cannot DMA where they are, go
    // through the bounce pool: pinning the caller's pages costs tens of
    // microseconds a call.
    if (bounce_ != nullptr && size > 0 &&
        (size <= config_.bounce_max_bytes || misaligned)) {
      c.path = TransferPath::kStaged;
      c.bounce = true;
      c.misaligned = misaligned;
      c.rerouted = misaligned && size > config_.bounce_max_bytes;
      return c;
    }
    c.pin_reason = PinReason::kRegionOff;
    c.misaligned = misaligned;
    return c;
  }
  if (ClassifyHostRange(host, size) == HostRange::kPremappedRegion) {
    c.path = TransferPath::kZeroCopy;
  } else if (size <= threshold_) {
    c.path = TransferPath::kStaged;
    // Premapped behind the caller: no staging until its room is ready.
    if (!StagingReady()) {
      c.path = TransferPath::kPinned;
      c.pin_reason = PinReason::kNotPremapped;
    }
  }
  // A buffer the device cannot DMA where it is goes through staging, whose
  // buffers are page-aligned, whatever its size.
  // (A small one is staged anyway; it must not fall back to pinning.)
  if (misaligned) {
    c.misaligned = true;
    c.rerouted = c.path != TransferPath::kStaged;
    c.path = TransferPath::kStaged;
  }
  return c;
}

HostRange Engine::ClassifyHostRange(const void* host, uint64_t size) const {
  if (size > 0 && region_ != nullptr &&
      region_->allocator().Contains(host, size)) {
    return HostRange::kPremappedRegion;
  }
  if (size > 0 && live_registrations_.load(std::memory_order_acquire) > 0) {
    MutexLock lock(&reg_mu_);
    if (FindRegistrationLocked(host, size)) return HostRange::kRegistered;
  }
  return HostRange::kPageable;
}

absl::StatusOr<std::shared_ptr<Op>> Engine::NewHostOp(
    OpKind kind, const DeviceBuffer& buffer, uint64_t offset, const void* host,
    uint64_t size, HostBufferSemantics semantics) {
  const bool to_device = kind == OpKind::kToDevice;
  const char* what = to_device ? "TransferToDevice" : "TransferFromDevice";
  TPUSHIM_RETURN_IF_ERROR(CheckOpen());
  if (host == nullptr && size > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": the host buffer is null"));
  }
  if (size > 0 && reinterpret_cast<uintptr_t>(host) + size <
                      reinterpret_cast<uintptr_t>(host)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": the host range wraps around the address space"));
  }
  TPUSHIM_ASSIGN_OR_RETURN(std::shared_ptr<Allocation> a,
                           UseBuffer(buffer, offset, size, what));
  auto op = std::make_shared<Op>();
  op->kind = kind;
  op->direction =
      to_device ? DmaDirection::kHostToDevice : DmaDirection::kDeviceToHost;
  op->device = a->device;
  PathChoice choice = PathFor(host, size, op->device);
  if (choice.registered) {
    // Held until the transfer completes: Unregister waits for it.
    op->registration = TakeRegistrationUse(host, size);
    if (!op->registration) {
      // Unregistered since PathFor looked.
      choice = PathFor(host, size, op->device, /*registrations=*/false);
    }
  }
  op->registered = choice.registered && op->registration;
  op->path = choice.path;
  op->pin_reason = choice.pin_reason;
  op->misaligned = choice.misaligned;
  op->bounce = choice.bounce;
  if (choice.misaligned && op->path != TransferPath::kStaged) {
    const uint32_t align = devices_[op->device]->info().host_alignment;
    ReleaseBufferUse(a);
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": the host buffer at 0x",
        absl::Hex(reinterpret_cast<uintptr_t>(host)), " is not ", align,
        "-byte aligned, which ", devices_[op->device]->info().name,
        " needs for DMA, and with the premapped region off "
        "(TPU_PREMAPPED_BUFFER_SIZE=0) there is no staging to copy it "
        "through; align the buffer or turn the region on"));
  }
  if (to_device) {
    op->src = static_cast<const char*>(host);
  } else {
    op->dst = static_cast<char*>(const_cast<void*>(host));
  }
  op->size = size;
  if (choice.bounce) staged_bounce_.fetch_add(1, std::memory_order_relaxed);
  if (choice.rerouted) {
    staged_misaligned_.fetch_add(1, std::memory_order_relaxed);
    WarnMisaligned(*op, host);
  }
  op->buffer = std::move(a);
  op->buffer_offset = offset;
  op->semantics = semantics;
  op->staging_chunk = std::min(chunk_bytes_[to_device ? 0 : 1], size);
  return op;
}

absl::StatusOr<std::shared_ptr<Op>> Engine::NewArrayOp(
    OpKind kind, const DeviceBuffer& buffer, const void* host,
    HostBufferSemantics semantics) {
  const bool to_device = kind == OpKind::kToDevice;
  const char* what =
      to_device ? "TransferArrayToDevice" : "TransferArrayFromDevice";
  TPUSHIM_RETURN_IF_ERROR(CheckOpen());
  const std::shared_ptr<Allocation> peek = AllocationOf(buffer);
  if (peek != nullptr && peek->shape == nullptr) {
    // A byte buffer: its bytes are the array.
    return NewHostOp(kind, buffer, 0, host, peek->size, semantics);
  }
  // A layout whose device image is the dense array itself (no padding,
  // one tile spanning the minor dimensions): no relayout to do, so the
  // array's bytes are the image and move as a byte transfer, on the paths
  // byte transfers take (in place from the premapped region or registered
  // memory).
  if (peek != nullptr && host != nullptr &&
      peek->shape->plan.kernel() == RelayoutPlan::Kernel::kIdentity &&
      peek->size == peek->shape->host_bytes) {
    return NewHostOp(kind, buffer, 0, host, peek->size, semantics);
  }
  const uint64_t image_bytes = peek != nullptr ? peek->size : 0;
  TPUSHIM_ASSIGN_OR_RETURN(std::shared_ptr<Allocation> a,
                           UseBuffer(buffer, 0, image_bytes, what));
  const BufferShape& shape = *a->shape;
  if (host == nullptr || reinterpret_cast<uintptr_t>(host) + shape.host_bytes <
                             reinterpret_cast<uintptr_t>(host)) {
    ReleaseBufferUse(a);
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": the host array of ", shape.text, " (", shape.host_bytes,
        " bytes) ",
        host == nullptr ? "is null" : "wraps around the address space"));
  }
  auto op = std::make_shared<Op>();
  op->kind = kind;
  op->direction =
      to_device ? DmaDirection::kHostToDevice : DmaDirection::kDeviceToHost;
  op->device = a->device;
  // Staged whatever the size: the copy through staging is the relayout,
  // the one copy any path needs. With the region off the staging is the
  // bounce pool's, as for byte transfers the device cannot take where they
  // are. Only without staging (none premapped yet, or no bounce pool) does
  // the pinned path DMA a heap image.
  if (region_ != nullptr ? StagingReady() : bounce_ != nullptr) {
    op->path = TransferPath::kStaged;
    op->bounce = region_ == nullptr;
    if (op->bounce) staged_bounce_.fetch_add(1, std::memory_order_relaxed);
  } else {
    op->path = TransferPath::kPinned;
    op->pin_reason =
        region_ == nullptr ? PinReason::kRegionOff : PinReason::kNotPremapped;
  }
  op->relayout = &shape.plan;
  op->image_bytes = a->image_bytes;
  if (to_device) {
    op->dense_src = static_cast<const char*>(host);
  } else {
    op->dense_dst = static_cast<char*>(const_cast<void*>(host));
  }
  op->size = a->size;
  op->buffer = std::move(a);
  op->semantics = semantics;
  op->staging_chunk = std::min(chunk_bytes_[to_device ? 0 : 1], op->size);
  return op;
}

absl::StatusOr<std::shared_ptr<Op>> Engine::NewDeviceToDeviceOp(
    const DeviceBuffer& src, uint64_t src_offset, const DeviceBuffer& dst,
    uint64_t dst_offset, uint64_t size) {
  TPUSHIM_RETURN_IF_ERROR(CheckOpen());
  TPUSHIM_ASSIGN_OR_RETURN(
      std::shared_ptr<Allocation> s,
      UseBuffer(src, src_offset, size, "TransferDeviceToDevice (source)"));
  absl::StatusOr<std::shared_ptr<Allocation>> d =
      UseBuffer(dst, dst_offset, size, "TransferDeviceToDevice (destination)");
  if (!d.ok()) {
    ReleaseBufferUse(s);
    return d.status();
  }
  auto op = std::make_shared<Op>();
  op->kind = OpKind::kDeviceToDevice;
  op->direction = DmaDirection::kDeviceToDevice;
  op->device = s->device;
  op->size = size;
  op->buffer = std::move(s);
  op->buffer_offset = src_offset;
  op->peer = *std::move(d);
  op->peer_offset = dst_offset;
  // Overlapping ranges of one device's memory: chained, so that no
  // descriptor overwrites a source byte another has still to read.
  const uint64_t from = op->buffer->address + src_offset;
  const uint64_t to = op->peer->address + dst_offset;
  if (op->peer->device == op->device && from != to && size > 0 &&
      from < to + size && to < from + size) {
    op->copy_order =
        to > from ? CopyOrder::kChainedDown : CopyOrder::kChainedUp;
  }
  return op;
}

namespace {

// Starts run by this thread now (StartHere): an operation made ready by a
// completion inside one is handed to its queue's worker instead of being
// started here too, so a chain of dependants never grows the stack.
thread_local int t_starting = 0;

// A thread waiting for a small transfer polls these queues (at most one
// per direction of a device, and a few devices).
struct PollTargets {
  static constexpr int kMax = 4;
  int tags[kMax];
  int n = 0;
  void Add(int tag) {
    if (tag < 0 || n == kMax) return;
    for (int i = 0; i < n; ++i) {
      if (tags[i] == tag) return;
    }
    tags[n++] = tag;
  }
};

}  // namespace

int Engine::QueueTag(int device, DmaDirection d) {
  return device * kDmaDirectionCount + static_cast<int>(d);
}

void Engine::PlaceInOrder(Op& op, std::vector<BufferOrder::Wait>* after) {
  using Access = BufferOrder::Access;
  Allocation& a = *op.buffer;
  const BufferOrder::Range range{op.buffer_offset, op.buffer_offset + op.size};
  switch (op.kind) {
    case OpKind::kToDevice:
      if (op.chunk) {
        // Part of the chunked transfer, whose place in the order was taken
        // when it began: what it waited for then, and the chunks before
        // this one that wrote the same bytes.
        for (const BufferOrder::Wait& w : a.chunked_after) {
          if (!w.event->IsReady()) after->push_back(w);
        }
        a.chunk_order.Conflicts(range, Access::kWrite, after);
      } else {
        a.order.Conflicts(range, Access::kWrite, after);
      }
      break;
    case OpKind::kFromDevice:
      a.order.Conflicts(range, Access::kRead, after);
      break;
    case OpKind::kDeviceToDevice:
      a.order.Conflicts(range, Access::kRead, after);
      op.peer->order.Conflicts({op.peer_offset, op.peer_offset + op.size},
                               Access::kWrite, after);
      break;
  }
}

void Engine::RecordInOrder(Op& op) {
  using Access = BufferOrder::Access;
  Allocation& a = *op.buffer;
  const BufferOrder::Range range{op.buffer_offset, op.buffer_offset + op.size};
  const int tag = QueueTag(op.device, op.direction);
  switch (op.kind) {
    case OpKind::kToDevice:
      (op.chunk ? a.chunk_order : a.order)
          .Record(range, Access::kWrite, op.event, tag);
      break;
    case OpKind::kFromDevice:
      a.order.Record(range, Access::kRead, op.event, tag);
      break;
    case OpKind::kDeviceToDevice:
      a.order.Record(range, Access::kRead, op.event, tag);
      op.peer->order.Record({op.peer_offset, op.peer_offset + op.size},
                            Access::kWrite, op.event, tag);
      break;
  }
}

absl::StatusOr<Event> Engine::Submit(std::shared_ptr<Op> op,
                                     absl::Span<const Event> wait_for) {
  op->event = std::make_shared<EventState>(&callbacks_, this);
  // Awaiting a large transfer sleeps at once; a small one polls (below).
  if (op->size > kSpinAwaitMaxBytes) op->event->set_await_spin_ns(0);
  op->submit_ns = os_->MonotonicNanos();
  Queue& q = QueueOf(op->device, op->direction);
  {
    MutexLock lock(&idle_mu_);
    ++unfinished_;
  }
  events_not_ready_.fetch_add(1, std::memory_order_acq_rel);
  q.submitted.fetch_add(1, std::memory_order_relaxed);

  // The operation's place in the order of the buffers it touches and in
  // its queue, taken at once: no event handed out for a buffer (its
  // readiness, an order another operation waits for) ever covers an
  // operation that is not queued yet. Two buffers lock in address order.
  std::vector<BufferOrder::Wait> after;
  bool stopped;
  {
    Allocation* first = op->buffer.get();
    Allocation* second = op->peer.get();
    if (second == first) second = nullptr;
    if (second != nullptr && second < first) std::swap(first, second);
    MutexLock lock_first(&first->mu);
    std::optional<MutexLock> lock_second;
    if (second != nullptr) lock_second.emplace(&second->mu);
    PlaceInOrder(*op, &after);
    if (op->size <= kSpinAwaitMaxBytes) {
      // A waiter runs what waits in the rings of the transfer and of the
      // earlier operations on its buffers, rather than wait for a DMA
      // thread to wake. Set before the event can reach another thread
      // (RecordInOrder below hands it to whoever asks for the buffer).
      PollTargets targets;
      targets.Add(QueueTag(op->device, op->direction));
      for (const BufferOrder::Wait& w : after) targets.Add(w.tag);
      op->event->set_poller([gate = poll_gate_, targets] {
        for (int i = 0; i < targets.n; ++i) {
          const int tag = targets.tags[i];
          if (gate->Poll(tag / kDmaDirectionCount,
                         static_cast<DmaDirection>(tag % kDmaDirectionCount),
                         kSpinAwaitMaxBytes)) {
            return true;
          }
        }
        return false;
      });
    }
    op->deps_pending.store(static_cast<int>(wait_for.size() + after.size()) + 1,
                           std::memory_order_relaxed);
    {
      MutexLock lock(&q.mu);
      op->id = next_op_id_.fetch_add(1, std::memory_order_relaxed);
      stopped = q.stop;
      if (!stopped) q.waiting.emplace(op->id, op);
    }
    if (!stopped) RecordInOrder(*op);
  }
  if (stopped) {
    // Lost the race with Shutdown, which has already emptied the queue.
    CancelUnstarted(
        op, absl::CancelledError("the transfer engine shut down before the "
                                 "transfer started"));
    return Event(op->event);
  }
  for (const Event& e : wait_for) {
    e.state()->AddContinuation([this, op](const absl::Status& s) {
      if (!s.ok()) op->RecordError(s);
      DepDone(op, MayStart::kSmall);
    });
  }
  // The buffers' order waits for the earlier operations to end, not for
  // their success: a failed write does not fail the reads after it.
  for (const BufferOrder::Wait& w : after) {
    w.event->AddContinuation(
        [this, op](const absl::Status&) { DepDone(op, MayStart::kSmall); });
  }
  // Drop Submit's hold on the dependencies. When they are all done and the
  // queue is idle, start here, on the caller's thread, if that cannot
  // block: no thread hop for the common small transfer.
  Event event(op->event);
  DepDone(op, MayStart::kAny);
  if (op->semantics == HostBufferSemantics::kImmutableOnlyDuringCall) {
    op->host_released.WaitForNotification();
  }
  return event;
}

void Engine::DepDone(const std::shared_ptr<Op>& op, MayStart may_start) {
  if (op->deps_pending.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  Queue& q = QueueOf(op->device, op->direction);
  // Started here only what cannot block, and not inside another start on
  // this thread. A dependency resolved on another thread (a DMA thread, a
  // waiter's poll, a caller setting its event) starts only small
  // operations that pin nothing: the rest is the worker's, off that thread.
  const bool here =
      may_start != MayStart::kNo && t_starting == 0 && InlineStartable(*op) &&
      (may_start == MayStart::kAny || (op->size <= kSpinAwaitMaxBytes &&
                                       (op->kind == OpKind::kDeviceToDevice ||
                                        op->path != TransferPath::kPinned)));
  bool start = false;
  bool wake = false;
  {
    MutexLock lock(&q.mu);
    auto it = q.waiting.find(op->id);
    if (it == q.waiting.end()) return;  // cancelled by Shutdown
    q.waiting.erase(it);
    q.ready.emplace(op->id, op);
    if (here && NextReady(q) == op) {
      q.ready.erase(op->id);
      q.starting = true;
      start = true;
    } else {
      wake = !q.starting;
    }
  }
  if (start) {
    StartHere(q, op);
  } else if (wake) {
    q.cv.Signal();
  }
}

std::shared_ptr<Op> Engine::NextReady(Queue& q) {
  if (q.starting || q.ready.empty()) return nullptr;
  // The first of the ready ones in submission order; one still waiting
  // for its dependencies holds none of them up.
  return q.ready.begin()->second;
}

void Engine::StartHere(Queue& q, const std::shared_ptr<Op>& op) {
  ++t_starting;
  const bool started = StartOp(op, /*may_block=*/false);
  --t_starting;
  bool wake;
  bool cancel = false;
  {
    MutexLock lock(&q.mu);
    if (!started) {
      if (q.stop) {
        cancel = true;
      } else {
        q.ready.emplace(op->id, op);
      }
    }
    q.starting = false;
    wake = !q.ready.empty();
  }
  if (cancel) {
    CancelUnstarted(op, absl::CancelledError("the transfer engine shut down "
                                             "before the transfer started"));
  }
  if (wake) q.cv.Signal();
}

void Engine::WorkerLoop(Queue& q) {
  MutexLock lock(&q.mu);
  for (;;) {
    while (!q.stop && NextReady(q) == nullptr) q.cv.Wait(&q.mu);
    if (q.stop) return;
    std::shared_ptr<Op> op = NextReady(q);
    q.ready.erase(op->id);
    q.starting = true;
    q.mu.Unlock();
    StartOp(op, /*may_block=*/true);
    q.mu.Lock();
    q.starting = false;
  }
}

bool Engine::InlineStartable(const Op& op) const {
  if (op.kind == OpKind::kDeviceToDevice) return true;
  switch (op.path) {
    case TransferPath::kZeroCopy:
      return true;
    case TransferPath::kStaged:
      return op.size <= op.staging_chunk * StagingDepth(op);
    case TransferPath::kPinned:
      return op.size <= config_.descriptor_bytes;
  }
  return false;
}

// ---- Starting --------------------------------------------------------------

// Why PathFor chose `op`'s path, for the VLOG(1) line of each transfer.
std::string Engine::PathReason(const Op& op) const {
  switch (op.path) {
    case TransferPath::kZeroCopy:
      return op.registered ? "the host buffer is in registered host memory"
                           : "the host buffer is in the premapped region";
    case TransferPath::kStaged:
      if (op.relayout != nullptr) {
        return op.bounce ? "an array transfer: the copy through the engine's "
                           "bounce pool (the premapped region is off) lays "
                           "it out"
                         : "an array transfer: the copy through staging lays "
                           "it out";
      }
      if (op.misaligned) {
        return absl::StrCat("the host buffer is not ",
                            devices_[op.device]->info().host_alignment,
                            "-byte aligned for the device's DMA",
                            op.bounce ? "; through the bounce pool, the "
                                        "premapped region is off"
                                      : "");
      }
      if (op.bounce) {
        return absl::StrCat(
            "the premapped region is off: through the engine's bounce pool, "
            "for caller memory of at most ",
            config_.bounce_max_bytes, " bytes");
      }
      return absl::StrCat("caller memory of at most the threshold, ",
                          threshold_, " bytes");
    case TransferPath::kPinned:
      switch (op.pin_reason) {
        case PinReason::kRegionOff:
          return bounce_ != nullptr
                     ? absl::StrCat(
                           "the premapped region is off and the "
                           "transfer is larger than the bounce "
                           "pool takes, ",
                           config_.bounce_max_bytes, " bytes")
                     : std::string("the premapped region is off");
        case PinReason::kNotPremapped:
          return "staging space not premapped yet";
        case PinReason::kStagingTimeout:
          return "no staging space freed up in time";
        case PinReason::kOverThreshold:
          break;
      }
      return absl::StrCat("caller memory above the threshold, ", threshold_,
                          " bytes");
  }
  return "";
}

bool Engine::StartOp(const std::shared_ptr<Op>& op, bool may_block) {
  Op& o = *op;
  absl::Status dep_error = o.Error();
  if (!dep_error.ok() || closing_.load(std::memory_order_acquire)) {
    CancelUnstarted(op, dep_error.ok()
                            ? absl::CancelledError(
                                  "the transfer engine shut down before the "
                                  "transfer started")
                            : dep_error);
    return true;
  }
  QueueOf(o.device, o.direction)
      .in_flight.fetch_add(1, std::memory_order_relaxed);
  o.start_ns = os_->MonotonicNanos();
  if (o.kind != OpKind::kDeviceToDevice) {
    VLOG(1) << "Transfer " << o.id << ": " << DmaDirectionName(o.direction)
            << " of " << o.size << " bytes on device " << o.device
            << " takes the " << TransferPathName(o.path) << " path ("
            << PathReason(o) << ")";
  }

  if (o.kind == OpKind::kDeviceToDevice || o.path != TransferPath::kStaged) {
    o.self = op;
    if (o.kind == OpKind::kDeviceToDevice) {
      StartDescriptors(o, kInvalidHostWindow, 0);
    } else if (o.path == TransferPath::kZeroCopy) {
      const uint64_t host = reinterpret_cast<uintptr_t>(
          o.kind == OpKind::kToDevice ? static_cast<const void*>(o.src)
                                      : static_cast<const void*>(o.dst));
      if (const Registration* r = o.registration.get(); r != nullptr) {
        StartDescriptors(o, r->windows[o.device], host - r->begin);
      } else {
        const uint64_t base = reinterpret_cast<uintptr_t>(region_->base());
        StartDescriptors(o, region_windows_[o.device], host - base);
      }
    } else {
      StartPinned(o, o.pin_reason);
    }
    return true;
  }

  o.self = op;
  char* first = nullptr;
  if (o.size > 0) {
    switch (AcquireFirstStaging(o, may_block, &first)) {
      case FirstStaging::kAcquired:
        break;
      case FirstStaging::kWouldBlock:
        o.self.reset();
        QueueOf(o.device, o.direction)
            .in_flight.fetch_sub(1, std::memory_order_relaxed);
        return false;
      case FirstStaging::kHandled:
        return true;
    }
  }
  if (o.kind == OpKind::kToDevice) {
    StartStagedToDevice(o, first);
  } else {
    StartStagedFromDevice(o, first);
  }
  return true;
}

void Engine::StartDescriptors(Op& op, HostWindowId window, uint64_t host_base) {
  op.LayOutChunks(std::max<uint64_t>(config_.descriptor_bytes, 1));
  if (op.copy_order != CopyOrder::kParallel && !op.chunks.empty()) {
    // The first of a chained copy; NextChainedCopy submits the others.
    Chunk& first = op.copy_order == CopyOrder::kChainedDown ? op.chunks.back()
                                                            : op.chunks.front();
    SubmitChunk(op, first, window, host_base + first.offset);
  } else {
    for (Chunk& c : op.chunks) {
      SubmitChunk(op, c, window, host_base + c.offset);
    }
  }
  ChunkDone(op);  // the starter's hold
}

void Engine::SubmitChunk(Op& op, Chunk& c, HostWindowId window,
                         uint64_t host_offset) {
  DmaDescriptor d;
  d.user_data = reinterpret_cast<uintptr_t>(&c);
  d.length = c.length;
  d.host_offset = host_offset;
  d.device_address = op.buffer->address + op.buffer_offset + c.offset;
  d.host_window = window;
  d.direction = op.direction;
  // Staged: the host copies the chunk out of staging next; an array's
  // pinned image: the host lays it out next.
  d.host_reads_next = op.direction == DmaDirection::kDeviceToHost &&
                      (op.path == TransferPath::kStaged || op.image != nullptr);
  if (op.kind == OpKind::kDeviceToDevice) {
    d.peer_device = static_cast<uint32_t>(op.peer->device);
    d.peer_address = op.peer->address + op.peer_offset + c.offset;
  }
  c.submit_ns = trace_ ? os_->MonotonicNanos() : 0;
  SubmitDescriptors(QueueOf(op.device, op.direction), {&d, 1});
}

void Engine::SubmitDescriptors(Queue& q, absl::Span<const DmaDescriptor> d) {
  MutexLock lock(&q.ring_mu);
  size_t accepted = 0;
  if (q.overflow.empty()) accepted = q.dev->Submit(q.direction, d);
  if (accepted < d.size()) {
    q.overflow.insert(q.overflow.end(), d.begin() + accepted, d.end());
    q.ring_full.fetch_add(d.size() - accepted, std::memory_order_relaxed);
    // Publish the overflow, then try the ring again: a completion that
    // freed a slot before it could see the flag left that slot for us
    // (Dekker, with the fence in OnDmaComplete), so the overflow is never
    // stranded with nothing in flight to drain it.
    q.has_overflow.store(true, std::memory_order_seq_cst);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    SubmitOverflowLocked(q);
  }
}

void Engine::SubmitOverflowLocked(Queue& q) {
  while (!q.overflow.empty()) {
    DmaDescriptor batch[32];
    const size_t n = std::min<size_t>(q.overflow.size(), 32);
    std::copy_n(q.overflow.begin(), n, batch);
    const size_t accepted = q.dev->Submit(q.direction, {batch, n});
    q.overflow.erase(q.overflow.begin(), q.overflow.begin() + accepted);
    if (accepted < n) break;
  }
  q.has_overflow.store(!q.overflow.empty(), std::memory_order_seq_cst);
}

void Engine::DrainOverflow(Queue& q) {
  // The device freed ring slots before calling us; see SubmitDescriptors.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (!q.has_overflow.load(std::memory_order_seq_cst)) return;
  MutexLock lock(&q.ring_mu);
  SubmitOverflowLocked(q);
}

}  // namespace tpushim::transfer_internal
