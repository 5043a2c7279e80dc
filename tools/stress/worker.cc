#include "tools/stress/worker.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "tools/cli/interrupt.h"
#include "tools/cli/pseudo_random.h"
#include "tools/stress/internal.h"
#include "tools/stress/record.h"
#include "tpushim/system.h"
#include "tpushim/transfer.h"

namespace tpushim::tools::stress_internal {

void Worker::Run() {
  if (mode_ == Mode::kReplay) {
    for (const RecordedOp& op : record_.ops) Step(op);
  } else {
    fill_seed_ = (static_cast<uint64_t>(index_) << 48) ^ rng_();
    for (uint64_t i = 0;; ++i) {
      if (deadline_.has_value() ? absl::Now() >= *deadline_ : i >= ops_) break;
      // SIGINT or SIGTERM: issue nothing more; what was issued is reaped,
      // checked and torn down as at the end of any run.
      if (InterruptSignal() != 0) break;
      // A fixed number of draws per operation, whatever the state.
      const uint64_t kind = rng_();
      Draws r;
      for (uint64_t& x : r) x = rng_();
      op_index_ = i;
      RecordedOp op = Plan(DrawOp(kind), r);
      // Numbered just before its first call into the runtime, so that the
      // numbers order the operations as they were issued.
      op.seq = s_.next_seq.fetch_add(1);
      if (mode_ == Mode::kRecord) {
        results_.push_back(kNoResult);
        record_.ops.push_back(std::move(op));
        Step(record_.ops.back());
      } else {
        Step(op);
      }
    }
  }
  Teardown();
}

RecordedOp Worker::Plan(Op kind, const Draws& r) {
  RecordedOp op;
  op.thread = index_;
  op.index = op_index_;
  op.op = kind;
  switch (kind) {
    case Op::kAllocPinned:
      PlanAllocPinned(op, r);
      break;
    case Op::kFreePinned:
      PlanFreePinned(op, r);
      break;
    case Op::kAllocDevice:
      PlanAllocDevice(op, r);
      break;
    case Op::kFreeDevice:
      PlanFreeDevice(op, r);
      break;
    case Op::kH2D:
      PlanH2D(op, r);
      break;
    case Op::kD2H:
      PlanD2H(op, r);
      break;
    case Op::kD2D:
      PlanD2D(op, r);
      break;
    case Op::kChain:
      PlanChain(op, r);
      break;
    case Op::kAwait:
      PlanAwait(op, r);
      break;
  }
  return op;
}

void Worker::Step(const RecordedOp& op) {
  op_ = op.op;
  op_index_ = op.index;
  ++c_.by_op[static_cast<int>(op_)].count;
  if (s_.turnstile != nullptr) s_.turnstile->Enter(op.seq, index_);
  Issue(op);
  if (s_.turnstile != nullptr) s_.turnstile->Leave();
  ++c_.ops;
  s_.ops_done.fetch_add(1, std::memory_order_relaxed);
  Reap(/*wait=*/false);
  while (pending_.size() > kMaxPending) {
    Pending p = std::move(pending_.front());
    pending_.pop_front();
    std::optional<absl::Status> st = p.event.AwaitWithTimeout(kHangBound);
    if (!st.has_value()) {
      const uint64_t saved = op_index_;
      op_index_ = p.op_index;
      Violate("event not ready within 30 s (hang)");
      op_index_ = saved;
      leaked_.push_back(std::move(p));
    } else {
      Finish(p, *st);
    }
  }
}

void Worker::Issue(const RecordedOp& op) {
  if (op.skipped()) return OpResult(kSkipped);
  switch (op.op) {
    case Op::kAllocPinned:
      return AllocPinned(op);
    case Op::kFreePinned:
      return FreePinned(op);
    case Op::kAllocDevice:
      return AllocDevice(op);
    case Op::kFreeDevice:
      return FreeDevice(op);
    case Op::kH2D:
      return H2D(op);
    case Op::kD2H:
      return D2H(op);
    case Op::kD2D:
      return D2D(op);
    case Op::kChain:
      return Chain(op);
    case Op::kAwait:
      return Await(op);
  }
}

void Worker::Finish(Pending& p, const absl::Status& s) {
  const uint64_t saved_index = op_index_;
  const Op saved_op = op_;
  op_index_ = p.op_index;
  op_ = p.op;
  Count(s, p.kind, absl::StrCat(OpName(p.op), " event"));
  if (p.op_result) OpResult(CodeIndex(s));
  if (s.ok() && p.verify) {
    // A test may plant a corruption here, which the check must catch.
    if (const ArrivedBytesHook& hook = ArrivedBytesTestHook()) {
      hook({index_, p.op_index, OpName(p.op), p.dst, p.size});
    }
    const uint64_t h = Hash(p.dst, p.size);
    if (h != p.hash) {
      Violate(absl::StrFormat(
          "hash mismatch: %d bytes arrived with XXH3 %016x, %016x was sent",
          p.size, h, p.hash));
    } else {
      c_.bytes_verified += p.size;
      ++c_.transfers_verified;
    }
  }
  if (p.pin != nullptr) p.pin->in_use = false;
  op_index_ = saved_index;
  op_ = saved_op;
}

void Worker::Reap(bool wait) {
  for (auto it = pending_.begin(); it != pending_.end();) {
    std::optional<absl::Status> st;
    if (wait) {
      st = it->event.AwaitWithTimeout(kHangBound);
      if (!st.has_value()) {
        const uint64_t saved = op_index_;
        op_index_ = it->op_index;
        Violate("event not ready within 30 s (hang)");
        op_index_ = saved;
        leaked_.push_back(std::move(*it));
        it = pending_.erase(it);
        continue;
      }
    } else if (it->event.IsReady()) {
      st = it->event.Await();
    }
    if (!st.has_value()) {
      ++it;
      continue;
    }
    Finish(*it, *st);
    it = pending_.erase(it);
  }
}

// ---- Planning (drawn runs) -------------------------------------------------

HostMemory Worker::ChooseHost(uint64_t size, bool want_pinned, uint64_t r,
                              const HostMemory& exclude) const {
  if (want_pinned && !pinned_.empty()) {
    for (size_t k = 0; k < pinned_.size(); ++k) {
      const PinBuf& b = *pinned_[(r + k) % pinned_.size()];
      if (b.id != exclude.pinned && b.buf.size() >= size && !b.in_use) {
        return HostMemory{b.id};
      }
    }
  }
  return HostMemory{};
}

std::vector<EventRef> Worker::Unfinished(
    const std::vector<const NamedEvent*>& follows) {
  std::vector<EventRef> refs;
  for (const NamedEvent* e : follows) {
    if (!e->event.IsReady()) refs.push_back(e->ref);
  }
  return refs;
}

void Worker::PlanAllocPinned(RecordedOp& op, const Draws& r) {
  if (pinned_.size() >= kMaxOwnedPinned) {
    op.result = kSkipped;
    return;
  }
  op.size = LogUniform(r[0], 1, kMaxPinnedAlloc);
  op.alignment = kMinPinnedAlignment << (r[1] % 7);  // 64 .. 4096
}

void Worker::PlanFreePinned(RecordedOp& op, const Draws& r) {
  if (pinned_.empty()) {
    op.result = kSkipped;
    return;
  }
  op.buffer = pinned_[r[0] % pinned_.size()]->id;
}

void Worker::PlanAllocDevice(RecordedOp& op, const Draws& r) {
  if (device_.size() >= kMaxOwnedDevice) {
    op.result = kSkipped;
    return;
  }
  op.device = static_cast<int>(r[0] % static_cast<uint64_t>(s_.devices));
  if (s_.threshold > 0 && r[1] % 8 == 0) {
    // Above the threshold: host transfers of all of it take the pinned path.
    op.size = Uniform(r[2], s_.threshold + 1, 2 * s_.threshold);
  } else {
    op.size = LogUniform(r[2], 1, kMaxSmallDeviceAlloc);
  }
  op.size = RoundUpTo(op.size, s_.block);
}

void Worker::PlanFreeDevice(RecordedOp& op, const Draws& r) {
  if (device_.empty()) {
    op.result = kSkipped;
    return;
  }
  const DevBuf& b = device_[r[0] % device_.size()];
  op.buffer = b.id;
  std::vector<const NamedEvent*> follows;
  AddFollows(b, /*write=*/true, follows);
  op.wait_for = Unfinished(follows);
}

void Worker::PlanH2D(RecordedOp& op, const Draws& r) {
  if (device_.empty()) {
    op.result = kSkipped;
    return;
  }
  DevBuf& b = device_[r[0] % device_.size()];
  PruneReads(b);
  op.buffer = b.id;
  std::tie(op.size, op.offset) =
      SizeAndOffset(b.buf.size(), r[1], r[2], s_.block);
  op.host = ChooseHost(op.size, r[3] % 2 == 0, r[4]);
  op.semantics = DrawSemantics(r[3] >> 1);
  op.fill_seed = ++fill_seed_;
  std::vector<const NamedEvent*> follows;
  AddFollows(b, /*write=*/true, follows);
  op.wait_for = Unfinished(follows);
}

void Worker::PlanD2H(RecordedOp& op, const Draws& r) {
  if (device_.empty()) {
    op.result = kSkipped;
    return;
  }
  DevBuf& b = device_[r[0] % device_.size()];
  PruneReads(b);
  op.buffer = b.id;
  if (RecordUsable(b)) {
    // Read back exactly what the last write put there, to verify it.
    op.size = b.size;
    op.offset = b.off;
  } else {
    std::tie(op.size, op.offset) =
        SizeAndOffset(b.buf.size(), r[1], r[2], s_.block);
  }
  op.host = ChooseHost(op.size, r[3] % 2 == 0, r[4]);
  op.semantics = DrawSemantics(r[3] >> 1);
  std::vector<const NamedEvent*> follows;
  AddFollows(b, /*write=*/false, follows);
  op.wait_for = Unfinished(follows);
}

void Worker::PlanD2D(RecordedOp& op, const Draws& r) {
  if (device_.size() < 2) {
    op.result = kSkipped;
    return;
  }
  const size_t i = r[0] % device_.size();
  const size_t j = (i + 1 + r[1] % (device_.size() - 1)) % device_.size();
  DevBuf& a = device_[i];
  DevBuf& b = device_[j];
  PruneReads(a);
  PruneReads(b);
  op.buffer = a.id;
  op.dst_buffer = b.id;
  if (RecordUsable(a) && a.size <= b.buf.size()) {
    // Copy what the last write put there, so that it stays verifiable.
    op.size = a.size;
    op.offset = a.off;
  } else {
    // Unknown content (or it does not fit): copy a piece, unverified.
    std::tie(op.size, op.offset) = SizeAndOffset(
        std::min(a.buf.size(), b.buf.size()), r[2], r[3], s_.block);
  }
  op.dst_offset =
      RoundDownTo(Uniform(r[4], 0, b.buf.size() - op.size), s_.block);
  std::vector<const NamedEvent*> follows;
  AddFollows(a, /*write=*/false, follows);
  AddFollows(b, /*write=*/true, follows);
  op.wait_for = Unfinished(follows);
}

void Worker::PlanChain(RecordedOp& op, const Draws& r) {
  if (s_.threshold > 0 && r[0] % 10 == 0) {
    op.size = Uniform(r[1], s_.threshold + 1, s_.threshold + s_.threshold / 2);
  } else {
    op.size = LogUniform(r[1], 1, kMaxSmallDeviceAlloc);
  }
  op.device = static_cast<int>(r[2] % static_cast<uint64_t>(s_.devices));
  op.dst_device =
      static_cast<int>((r[2] >> 8) % static_cast<uint64_t>(s_.devices));
  op.size = RoundUpTo(op.size, s_.block);
  op.slack = RoundDownTo(r[3] & kMaxChainSlack, s_.block);
  op.dst_slack = RoundDownTo((r[3] >> 12) & kMaxChainSlack, s_.block);
  op.offset = RoundDownTo(Uniform(r[4], 0, op.slack), s_.block);
  op.dst_offset = RoundDownTo(Uniform(r[4] >> 16, 0, op.dst_slack), s_.block);
  op.host = ChooseHost(op.size, r[5] % 2 == 0, r[5] >> 8);
  op.dst_host = ChooseHost(op.size, (r[5] >> 1) % 2 == 0, r[5] >> 16, op.host);
  op.semantics = DrawSemantics(r[5] >> 2);
  op.dst_semantics = DrawSemantics(r[5] >> 3);
  op.fill_seed = ++fill_seed_;
}

void Worker::PlanAwait(RecordedOp& op, const Draws& r) {
  if (pending_.empty()) {
    op.result = kSkipped;
    return;
  }
  op.event = pending_[r[0] % pending_.size()].ref;
  op.mode = static_cast<AwaitMode>(r[1] % 3);
  if (op.mode == AwaitMode::kTimed) {
    op.timeout_us = r[2] % (kMaxTimedAwaitMicros + 1);
  }
}

// ---- Issuing (drawn and replayed runs) -------------------------------------

std::vector<Event> Worker::Follow(const std::vector<const NamedEvent*>& follows,
                                  const std::vector<EventRef>& wait_for) {
  std::vector<Event> deps;
  for (const EventRef& ref : wait_for) {
    for (const NamedEvent* e : follows) {
      if (e->ref == ref) {
        deps.push_back(e->event);
        break;
      }
    }
  }
  for (const NamedEvent* e : follows) {
    if (std::find(wait_for.begin(), wait_for.end(), e->ref) != wait_for.end()) {
      continue;
    }
    if (!e->event.AwaitWithTimeout(kHangBound).has_value()) {
      Violate("dependency not ready within 30 s (hang)");
      deps.push_back(e->event);  // the call must not overtake it anyway
    }
  }
  return deps;
}

bool Worker::WaitIdle(PinBuf& b) {
  if (!b.in_use) return true;
  // Its transfer must finish and be checked first: wait for it (bounded),
  // then reap.
  if (!b.busy.AwaitWithTimeout(kHangBound).has_value()) {
    Violate("pinned buffer's transfer not ready within 30 s (hang)");
    return false;
  }
  Reap(/*wait=*/false);
  if (b.in_use) {
    Violate("pinned buffer still in use after its transfer was reaped");
    return false;
  }
  return true;
}

Worker::Host Worker::Acquire(const HostMemory& m, uint64_t size) {
  Host h;
  if (m.pinned.has_value()) {
    PinBuf* b = FindPinned(*m.pinned);
    if (b != nullptr && WaitIdle(*b)) {
      h.pin = b;
      h.p = static_cast<uint8_t*>(b->buf.data());
      return h;
    }
  }
  h.pageable =
      std::shared_ptr<uint8_t[]>(new uint8_t[std::max<uint64_t>(size, 1)]);
  h.p = h.pageable.get();
  return h;
}

std::optional<Event> Worker::AwaitTarget(const EventRef& ref) {
  if (mode_ != Mode::kReplay) {
    for (const Pending& p : pending_) {
      if (p.ref == ref) return p.event;
    }
    return std::nullopt;
  }
  const auto it = awaitable_.find(Key(ref));
  if (it == awaitable_.end()) return std::nullopt;
  std::optional<Event> event = it->second.event;
  if (it->second.last_await == op_index_) awaitable_.erase(it);
  return event;
}

void Worker::AllocPinned(const RecordedOp& op) {
  absl::StatusOr<PinnedHostBuffer> b =
      s_.system->AllocatePinnedHost(op.size, op.alignment);
  Count(b.status(), Shared::Kind::kPinnedAllocation, "AllocatePinnedHost");
  OpResult(CodeIndex(b.status()));
  if (!b.ok()) return;
  if (b->size() < op.size ||
      reinterpret_cast<uintptr_t>(b->data()) % op.alignment != 0) {
    Violate(absl::StrFormat("AllocatePinnedHost(%d, %d) gave %d bytes at %p",
                            op.size, op.alignment, b->size(), b->data()));
  }
  auto pin = std::make_unique<PinBuf>();
  pin->id = op.seq;
  pin->buf = *std::move(b);
  pinned_.push_back(std::move(pin));
}

void Worker::FreePinned(const RecordedOp& op) {
  PinBuf* b = FindPinned(op.buffer);
  // Only a replay can miss it: its allocation failed in this run.
  if (b == nullptr) return OpResult(kSkipped);
  // When still in use it is kept: its memory may still be in use.
  if (!WaitIdle(*b)) return OpResult(kNotReady);
  b->buf.Reset();
  std::erase_if(pinned_, [&op](const std::unique_ptr<PinBuf>& p) {
    return p->id == op.buffer;
  });
  OpResult(0);
}

void Worker::AllocDevice(const RecordedOp& op) {
  absl::StatusOr<DeviceBuffer> b =
      s_.system->AllocateDevice(op.device, op.size);
  Count(b.status(), Shared::Kind::kAllocation, "AllocateDevice");
  OpResult(CodeIndex(b.status()));
  if (!b.ok()) return;
  if (!b->valid() || b->size() != op.size || b->device() != op.device) {
    Violate(absl::StrFormat("AllocateDevice(%d, %d) gave %d bytes on %d",
                            op.device, op.size, b->size(), b->device()));
  }
  DevBuf d;
  d.id = op.seq;
  d.buf = *std::move(b);
  device_.push_back(std::move(d));
}

void Worker::FreeDevice(const RecordedOp& op) {
  DevBuf* b = FindDevice(op.buffer);
  if (b == nullptr) return OpResult(kSkipped);  // replay: allocation failed
  std::vector<const NamedEvent*> follows;
  AddFollows(*b, /*write=*/true, follows);
  const std::vector<Event> deps = Follow(follows, op.wait_for);
  absl::StatusOr<Event> e = s_.system->Deallocate(b->buf, deps);
  if (!e.ok()) {
    Count(e.status(), Shared::Kind::kOperation, "Deallocate");
    OpResult(CodeIndex(e.status()));
    return;  // still owned
  }
  AddPending(MakePending({{op.seq, 0}, *e}, true));
  std::erase_if(device_, [&op](const DevBuf& d) { return d.id == op.buffer; });
}

void Worker::H2D(const RecordedOp& op) {
  DevBuf* b = FindDevice(op.buffer);
  if (b == nullptr) return OpResult(kSkipped);  // replay: allocation failed
  std::vector<const NamedEvent*> follows;
  AddFollows(*b, /*write=*/true, follows);
  const std::vector<Event> deps = Follow(follows, op.wait_for);
  Host h = Acquire(op.host, op.size);
  FillPseudoRandom(h.p, op.size, op.fill_seed);
  const uint64_t hash = Hash(h.p, op.size);
  const HostBufferSemantics sem = ToHostBufferSemantics(op.semantics);
  absl::StatusOr<Event> e =
      s_.system->TransferToDevice(h.p, b->buf, op.offset, op.size, deps, sem);
  if (!e.ok()) {
    Count(e.status(), Shared::Kind::kOperation, "TransferToDevice");
    OpResult(CodeIndex(e.status()));
    b->valid = false;
    return;
  }
  if (sem == HostBufferSemantics::kImmutableOnlyDuringCall) {
    // The engine is done with the source: overwriting it must not matter.
    std::memset(h.p, 0xA5, op.size);
  }
  const NamedEvent done{{op.seq, 0}, *e};
  b->last_write = done;
  b->reads.clear();
  b->valid = true;
  b->off = op.offset;
  b->size = op.size;
  b->hash = hash;
  Pending p = MakePending(done, true, h.pageable);
  if (h.pin != nullptr) {
    h.pin->busy = *e;
    h.pin->in_use = true;
    p.pin = h.pin;
  }
  AddPending(std::move(p));
}

void Worker::D2H(const RecordedOp& op) {
  DevBuf* b = FindDevice(op.buffer);
  if (b == nullptr) return OpResult(kSkipped);  // replay: allocation failed
  std::vector<const NamedEvent*> follows;
  AddFollows(*b, /*write=*/false, follows);
  const std::vector<Event> deps = Follow(follows, op.wait_for);
  // Verified when this run knows what the last write put exactly there.
  const bool verify =
      RecordUsable(*b) && b->off == op.offset && b->size == op.size;
  Host h = Acquire(op.host, op.size);
  absl::StatusOr<Event> e =
      s_.system->TransferFromDevice(b->buf, op.offset, h.p, op.size, deps,
                                    ToHostBufferSemantics(op.semantics));
  if (!e.ok()) {
    Count(e.status(), Shared::Kind::kOperation, "TransferFromDevice");
    OpResult(CodeIndex(e.status()));
    return;
  }
  if (h.pin != nullptr) {
    h.pin->busy = *e;
    h.pin->in_use = true;
  }
  const NamedEvent done{{op.seq, 0}, *e};
  b->reads.push_back(done);
  AddPending(
      MakeVerified(done, h.p, op.size, b->hash, verify, h.pageable, h.pin));
}

void Worker::D2D(const RecordedOp& op) {
  DevBuf* a = FindDevice(op.buffer);
  DevBuf* b = FindDevice(op.dst_buffer);
  if (a == nullptr || b == nullptr) return OpResult(kSkipped);  // replay
  std::vector<const NamedEvent*> follows;
  AddFollows(*a, /*write=*/false, follows);
  AddFollows(*b, /*write=*/true, follows);
  const std::vector<Event> deps = Follow(follows, op.wait_for);
  // The copy stays verifiable when this run knows what it copies.
  const bool known =
      RecordUsable(*a) && a->off == op.offset && a->size == op.size;
  absl::StatusOr<Event> e = s_.system->TransferDeviceToDevice(
      a->buf, op.offset, b->buf, op.dst_offset, op.size, deps);
  if (!e.ok()) {
    Count(e.status(), Shared::Kind::kOperation, "TransferDeviceToDevice");
    OpResult(CodeIndex(e.status()));
    b->valid = false;
    return;
  }
  const NamedEvent done{{op.seq, 0}, *e};
  a->reads.push_back(done);
  b->last_write = done;
  b->reads.clear();
  b->valid = known;
  b->off = op.dst_offset;
  b->size = op.size;
  b->hash = a->hash;
  AddPending(MakePending(done, true));
}

void Worker::Chain(const RecordedOp& op) {
  auto name = [&op](ChainCall call) {
    return EventRef{op.seq, static_cast<int>(call)};
  };
  absl::StatusOr<DeviceBuffer> a =
      s_.system->AllocateDevice(op.device, op.size + op.slack);
  Count(a.status(), Shared::Kind::kAllocation, "AllocateDevice");
  if (!a.ok()) return OpResult(CodeIndex(a.status()));
  absl::StatusOr<DeviceBuffer> b =
      s_.system->AllocateDevice(op.dst_device, op.size + op.dst_slack);
  Count(b.status(), Shared::Kind::kAllocation, "AllocateDevice");
  auto free_now = [this](const DeviceBuffer& buf, std::vector<Event> deps,
                         EventRef ref) {
    absl::StatusOr<Event> e = s_.system->Deallocate(buf, deps);
    if (!e.ok()) {
      Count(e.status(), Shared::Kind::kOperation, "Deallocate");
    } else {
      AddPending(MakePending({ref, *e}, false));
    }
  };
  const EventRef free_a = name(ChainCall::kFreeSource);
  const EventRef free_b = name(ChainCall::kFreeDestination);
  if (!b.ok()) {
    free_now(*a, {}, free_a);
    return OpResult(CodeIndex(b.status()));
  }
  Host src = Acquire(op.host, op.size);
  Host dst = Acquire(op.dst_host, op.size);
  FillPseudoRandom(src.p, op.size, op.fill_seed);
  const uint64_t hash = Hash(src.p, op.size);
  const HostBufferSemantics sem_up = ToHostBufferSemantics(op.semantics);
  const HostBufferSemantics sem_down = ToHostBufferSemantics(op.dst_semantics);

  absl::StatusOr<Event> up =
      s_.system->TransferToDevice(src.p, *a, op.offset, op.size, {}, sem_up);
  if (!up.ok()) {
    Count(up.status(), Shared::Kind::kOperation, "TransferToDevice");
    free_now(*a, {}, free_a);
    free_now(*b, {}, free_b);
    return OpResult(CodeIndex(up.status()));
  }
  if (sem_up == HostBufferSemantics::kImmutableOnlyDuringCall) {
    std::memset(src.p, 0x5A, op.size);
  }
  {
    Pending p = MakePending({name(ChainCall::kUp), *up}, false, src.pageable);
    if (src.pin != nullptr) {
      src.pin->busy = *up;
      src.pin->in_use = true;
      p.pin = src.pin;
    }
    AddPending(std::move(p));
  }

  const Event up_e = *up;
  absl::StatusOr<Event> across = s_.system->TransferDeviceToDevice(
      *a, op.offset, *b, op.dst_offset, op.size, {&up_e, 1});
  if (!across.ok()) {
    Count(across.status(), Shared::Kind::kOperation, "TransferDeviceToDevice");
    free_now(*a, {up_e}, free_a);
    free_now(*b, {}, free_b);
    return OpResult(CodeIndex(across.status()));
  }
  AddPending(MakePending({name(ChainCall::kAcross), *across}, false));
  free_now(*a, {*across}, free_a);

  const Event across_e = *across;
  absl::StatusOr<Event> down = s_.system->TransferFromDevice(
      *b, op.dst_offset, dst.p, op.size, {&across_e, 1}, sem_down);
  if (!down.ok()) {
    Count(down.status(), Shared::Kind::kOperation, "TransferFromDevice");
    free_now(*b, {across_e}, free_b);
    return OpResult(CodeIndex(down.status()));
  }
  if (dst.pin != nullptr) {
    dst.pin->busy = *down;
    dst.pin->in_use = true;
  }
  AddPending(MakeVerified({name(ChainCall::kDown), *down}, dst.p, op.size, hash,
                          true, dst.pageable, dst.pin));
  free_now(*b, {*down}, free_b);
}

void Worker::Await(const RecordedOp& op) {
  const std::optional<Event> target = AwaitTarget(op.event);
  if (!target.has_value()) return OpResult(kSkipped);  // replay: never made
  const Event& e = *target;
  switch (op.mode) {
    case AwaitMode::kBlocking: {
      std::optional<absl::Status> st = e.AwaitWithTimeout(kHangBound);
      if (!st.has_value()) {
        Violate("event not ready within 30 s (hang)");
        return OpResult(kNotReady);
      }
      return OpResult(CodeIndex(*st));
    }
    case AwaitMode::kTimed: {
      std::optional<absl::Status> st = e.AwaitWithTimeout(
          absl::Microseconds(static_cast<int64_t>(op.timeout_us)));
      return OpResult(st.has_value() ? CodeIndex(*st) : kNotReady);
    }
    case AwaitMode::kCallback: {
      s_.callbacks_added.fetch_add(1);
      auto fired = std::make_shared<std::atomic<bool>>(false);
      Shared* s = &s_;
      e.AddCallback([s, e, fired](absl::Status status) {
        if (fired->exchange(true) || !e.IsReady() || e.Await() != status) {
          s->callbacks_wrong.fetch_add(1);
        }
        s->callbacks_run.fetch_add(1);
      });
      return OpResult(0);
    }
  }
}

void Worker::Teardown() {
  op_index_ = c_.ops > 0 ? c_.ops - 1 : 0;
  op_ = Op::kAwait;
  Reap(/*wait=*/true);
  // Teardown frees are calls into the runtime too: they take their turn.
  // A replay of a record whose start-up failed has no turn for them.
  std::optional<uint64_t> seq;
  if (mode_ == Mode::kReplay) {
    seq = record_.teardown_seq;
  } else {
    seq = s_.next_seq.fetch_add(1);
    if (mode_ == Mode::kRecord) record_.teardown_seq = seq;
  }
  Turnstile* turnstile = seq.has_value() ? s_.turnstile : nullptr;
  if (turnstile != nullptr) turnstile->Enter(*seq, index_);
  for (auto& p : pinned_) {
    if (p->in_use) {
      Violate("pinned buffer's transfer not ready within 30 s at teardown");
      p->buf = PinnedHostBuffer();  // must not be freed: leak it
      continue;
    }
    p->buf.Reset();
  }
  pinned_.clear();
  op_ = Op::kFreeDevice;
  for (DevBuf& b : device_) {
    // After the wait above, only a hung event can still be pending.
    std::vector<const NamedEvent*> follows;
    AddFollows(b, /*write=*/true, follows);
    std::vector<Event> deps;
    for (const NamedEvent* e : follows) {
      if (!e->event.IsReady()) deps.push_back(e->event);
    }
    absl::StatusOr<Event> e = s_.system->Deallocate(b.buf, deps);
    if (!e.ok()) {
      Count(e.status(), Shared::Kind::kOperation, "Deallocate");
      continue;
    }
    // Named after the teardown; no operation names them.
    AddPending(MakePending({{seq.value_or(0), 0}, *e}, false));
  }
  device_.clear();
  if (turnstile != nullptr) turnstile->Leave();
  Reap(/*wait=*/true);
}

}  // namespace tpushim::tools::stress_internal
