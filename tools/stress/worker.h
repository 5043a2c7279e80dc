// The workers of `tpushim stress` (tools/stress/stress.cc) and what they share:
// the run's flags, counters and violations, the replay turnstile, and the
// Worker that plans, issues and checks one thread's operations. Internal to
// the tool.

#ifndef TPUSHIM_TOOLS_STRESS_WORKER_H_
#define TPUSHIM_TOOLS_STRESS_WORKER_H_

#include <xxhash.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "tools/stress/internal.h"
#include "tools/stress/record.h"
#include "tpushim/system.h"
#include "tpushim/transfer.h"

namespace tpushim::tools::stress_internal {

constexpr uint64_t kDefaultOps = 10000;
constexpr int kDefaultThreads = 4;
constexpr char kDefaultDevice[] = "sim://?devices=2&hbm=256M";
constexpr uint64_t kDefaultRegionBytes = uint64_t{64} << 20;
constexpr uint64_t kDefaultThresholdBytes = uint64_t{4} << 20;
constexpr size_t kMaxOwnedPinned = 6;
constexpr size_t kMaxOwnedDevice = 8;
constexpr size_t kMaxPending = 48;
constexpr size_t kMaxViolationsKept = 50;
constexpr absl::Duration kHangBound = absl::Seconds(30);
constexpr double kDefaultShrinkSeconds = 60;

// ---- Operations and codes --------------------------------------------------

// Relative weights of the mix, by Op.
constexpr std::array<int, kOpCount> kOpWeights = {8,  7,  8,  7, 20,
                                                  15, 12, 13, 10};

inline int CodeIndex(const absl::Status& status) {
  const int c = static_cast<int>(status.code());
  return c >= 0 && c < kAbslCodes
             ? c
             : static_cast<int>(absl::StatusCode::kUnknown);
}

inline const char* OpName(Op op) { return kOpNames[static_cast<int>(op)]; }

// ---- Data ------------------------------------------------------------------

inline uint64_t Hash(const void* p, uint64_t n) { return XXH3_64bits(p, n); }

// A value in [lo, hi], log-uniform, from the 64-bit draw `r`.
inline uint64_t LogUniform(uint64_t r, uint64_t lo, uint64_t hi) {
  if (hi <= lo) return lo;
  const double u = static_cast<double>(r >> 11) * 0x1.0p-53;
  const double v = std::exp(std::log(static_cast<double>(lo)) +
                            u * (std::log(static_cast<double>(hi) + 1.0) -
                                 std::log(static_cast<double>(lo))));
  return std::clamp<uint64_t>(static_cast<uint64_t>(v), lo, hi);
}
// A value in [lo, hi], uniform.
inline uint64_t Uniform(uint64_t r, uint64_t lo, uint64_t hi) {
  if (hi <= lo) return lo;
  return lo + r % (hi - lo + 1);
}

inline std::string ShellQuote(absl::string_view s) {
  return absl::StrCat("'", absl::StrReplaceAll(s, {{"'", "'\\''"}}), "'");
}

// The test hook (tools/stress/internal.h); empty unless a test set it.
inline ArrivedBytesHook& ArrivedBytesTestHook() {
  static auto* hook = new ArrivedBytesHook();
  return *hook;
}

// ---- Configuration and results ---------------------------------------------

struct StressFlags {
  uint64_t ops = kDefaultOps;
  double seconds = 0;
  int threads = kDefaultThreads;
  uint64_t seed = 0;
  std::string faults;
  std::string region_bytes;
  std::string threshold;
  std::string record;  // --record FILE
  std::string replay;  // --replay FILE
  std::string shrink;  // --shrink FILE
  double shrink_seconds = kDefaultShrinkSeconds;
  bool json = false;
  bool csv = false;
  bool no_progress = false;
  // Filled from the command line's counts.
  bool seconds_given = false;
  bool seed_given = false;
  bool faults_given = false;
};

struct Violation {
  int thread = 0;
  uint64_t op_index = 0;  // within its thread
  std::string op;
  std::string message;
};

struct OpCounts {
  uint64_t count = 0;
  std::array<uint64_t, kCodeSlots> codes{};
};

// One worker's counts; merged after the workers are joined.
struct Counters {
  std::array<OpCounts, kOpCount> by_op{};
  std::array<uint64_t, kAbslCodes> by_code{};
  uint64_t bytes_verified = 0;
  uint64_t transfers_verified = 0;
  uint64_t violation_count = 0;
  std::vector<Violation> violations;
  uint64_t ops = 0;

  void Merge(const Counters& o) {
    for (int i = 0; i < kOpCount; ++i) {
      by_op[i].count += o.by_op[i].count;
      for (int c = 0; c < kCodeSlots; ++c) {
        by_op[i].codes[c] += o.by_op[i].codes[c];
      }
    }
    for (int c = 0; c < kAbslCodes; ++c) by_code[c] += o.by_code[c];
    bytes_verified += o.bytes_verified;
    transfers_verified += o.transfers_verified;
    violation_count += o.violation_count;
    ops += o.ops;
    for (const Violation& v : o.violations) {
      if (violations.size() < kMaxViolationsKept) violations.push_back(v);
    }
  }
};

// Replay: lets the recorded operations issue one at a time, in the order of
// their sequence numbers, each on its recorded worker thread: only the
// thread whose operation holds the next number runs it, the others wait.
class Turnstile {
 public:
  // `tickets`: every seq of the record with its thread, in seq order.
  Turnstile(std::vector<std::pair<uint64_t, int>> tickets, int threads)
      : tickets_(std::move(tickets)) {
    for (int t = 0; t < threads; ++t) {
      turn_.push_back(std::make_unique<CondVar>());
    }
  }

  // Blocks until `seq` is next. REQUIRES: `seq` is the next ticket of the
  // calling worker `thread`.
  void Enter(uint64_t seq, int thread) {
    MutexLock lock(&mu_);
    while (tickets_[next_].first != seq) turn_[thread]->Wait(&mu_);
  }
  // Lets the next ticket's thread go.
  void Leave() {
    MutexLock lock(&mu_);
    ++next_;
    if (next_ < tickets_.size()) turn_[tickets_[next_].second]->Signal();
  }

 private:
  // Constant after construction
  const std::vector<std::pair<uint64_t, int>> tickets_;
  std::vector<std::unique_ptr<CondVar>> turn_;  // one per worker thread

  Mutex mu_;
  // Protected by mu_
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;  // index into tickets_
};

// What the whole run shares: the system, the expected codes, callbacks.
struct Shared {
  System* system = nullptr;
  int devices = 1;
  // The largest block_bytes of the devices: every device buffer, transfer
  // size and offset is a multiple of it.
  uint64_t block = 1;
  uint64_t threshold = 0;
  // False when the premapped region is off (TPU_PREMAPPED_BUFFER_SIZE=0).
  bool region = true;
  bool faults = false;
  std::vector<absl::StatusCode> rule_codes;
  std::atomic<uint64_t> ops_done{0};
  // Drawn runs: the next operation's sequence number, taken just before its
  // first call into the runtime, so that the numbers order the operations
  // as they were issued.
  std::atomic<uint64_t> next_seq{0};
  // Replays: the order the operations issue in. Null in drawn runs.
  Turnstile* turnstile = nullptr;
  // Callbacks added, run, and run wrongly (not ready, other status, twice).
  std::atomic<uint64_t> callbacks_added{0};
  std::atomic<uint64_t> callbacks_run{0};
  std::atomic<uint64_t> callbacks_wrong{0};

  // kPinnedAllocation is AllocatePinnedHost, kAllocation AllocateDevice.
  enum class Kind { kAllocation, kPinnedAllocation, kOperation };
  bool Expected(const absl::Status& s, Kind kind) const {
    // With the region off AllocatePinnedHost fails with FAILED_PRECONDITION
    // before it reaches any fault point (tpushim/system.h): nothing else,
    // not even OK, is right.
    if (kind == Kind::kPinnedAllocation && !region) {
      return s.code() == absl::StatusCode::kFailedPrecondition;
    }
    if (s.ok()) return true;
    if (s.code() == absl::StatusCode::kResourceExhausted) return true;
    if (kind != Kind::kOperation) {
      return faults && absl::StrContains(s.message(), "[injected: ");
    }
    if (s.code() == absl::StatusCode::kCancelled) return true;
    if (!faults) return false;
    if (s.code() == absl::StatusCode::kInternal ||
        s.code() == absl::StatusCode::kUnavailable) {
      return true;
    }
    for (absl::StatusCode c : rule_codes) {
      if (s.code() == c) return true;
    }
    return absl::StrContains(s.message(), "[injected: ");
  }
};

// ---- A worker --------------------------------------------------------------

// An event the worker holds, under the name the record gives it.
struct NamedEvent {
  EventRef ref;
  Event event;
};

struct PinBuf {
  uint64_t id = 0;  // the seq of the alloc_pinned that made it
  PinnedHostBuffer buf;
  Event busy;  // the one outstanding transfer using it
  // True from that transfer's submission until its event is reaped (its
  // bytes verified): only then may the buffer be reused or freed.
  bool in_use = false;
};

struct DevBuf {
  uint64_t id = 0;  // the seq of the alloc_device that made it
  DeviceBuffer buf;
  std::optional<NamedEvent> last_write;
  // Since the last write; a drawn run drops the complete ones as it plans.
  std::vector<NamedEvent> reads;
  // What the last write put at [off, off + size): valid when known.
  bool valid = false;
  uint64_t off = 0;
  uint64_t size = 0;
  uint64_t hash = 0;
};

// An event whose status is still to be counted.
struct Pending {
  EventRef ref;
  Event event;
  Op op = Op::kAwait;
  bool op_result = false;  // its status is the op's result in by_op
  Shared::Kind kind = Shared::Kind::kOperation;
  uint64_t op_index = 0;
  // Verification on OK: XXH3 of [dst, dst + size) must be `hash`.
  bool verify = false;
  uint8_t* dst = nullptr;
  uint64_t size = 0;
  uint64_t hash = 0;
  std::shared_ptr<uint8_t[]> keep;  // pageable memory the transfer uses
  PinBuf* pin = nullptr;            // the pinned buffer it uses
};

inline Pending MakePending(NamedEvent done, bool op_result,
                           std::shared_ptr<uint8_t[]> keep = nullptr) {
  Pending p;
  p.ref = done.ref;
  p.event = std::move(done.event);
  p.op_result = op_result;
  p.keep = std::move(keep);
  return p;
}

inline Pending MakeVerified(NamedEvent done, uint8_t* dst, uint64_t size,
                            uint64_t hash, bool verify,
                            std::shared_ptr<uint8_t[]> keep, PinBuf* pin) {
  Pending p = MakePending(std::move(done), true, std::move(keep));
  p.pin = pin;
  p.verify = verify;
  p.dst = dst;
  p.size = size;
  p.hash = hash;
  return p;
}

// The events an operation on `b` must follow: a read follows the buffer's
// last write; a write (`write`) also every read since.
inline void AddFollows(const DevBuf& b, bool write,
                       std::vector<const NamedEvent*>& follows) {
  if (b.last_write.has_value()) follows.push_back(&*b.last_write);
  if (!write) return;
  for (const NamedEvent& e : b.reads) follows.push_back(&e);
}

// Multiples of a device's block (DeviceDescription::block_bytes; 1 on
// sim://): NVMe devices move whole logical blocks.
inline uint64_t RoundUpTo(uint64_t n, uint64_t block) {
  return (n + block - 1) / block * block;
}
inline uint64_t RoundDownTo(uint64_t n, uint64_t block) {
  return n / block * block;
}

// Picks a size and offset, whole `block`s, for a transfer into a buffer of
// `capacity` bytes (a multiple of `block`): all of it one time in eight
// (the low 3 bits of `r1`), else log-uniform (its top 53 bits, which is
// what LogUniform reads).
inline std::pair<uint64_t, uint64_t> SizeAndOffset(uint64_t capacity,
                                                   uint64_t r1, uint64_t r2,
                                                   uint64_t block) {
  const uint64_t size =
      r1 % 8 == 0 ? capacity : RoundUpTo(LogUniform(r1, 1, capacity), block);
  return {size, RoundDownTo(Uniform(r2, 0, capacity - size), block)};
}

inline Semantics DrawSemantics(uint64_t r) {
  return r % 2 == 0 ? Semantics::kUntilCompletes : Semantics::kDuringCall;
}
inline HostBufferSemantics ToHostBufferSemantics(Semantics s) {
  return s == Semantics::kUntilCompletes
             ? HostBufferSemantics::kImmutableUntilTransferCompletes
             : HostBufferSemantics::kImmutableOnlyDuringCall;
}

// Runs one worker thread's operations. Drawn, it draws each operation from
// its generator (plan: the generator and the worker's state decide every
// parameter) and then issues it; with recording it also keeps each one as
// issued. Replaying, it issues its part of a record, each operation when the
// turnstile lets it. Issuing is the same code either way.
class Worker {
 public:
  enum class Mode { kDraw, kRecord, kReplay };

  // Draws `ops` operations, or until `deadline`, from a generator seeded
  // with (seed, index). `mode` is kDraw or kRecord.
  Worker(Shared& shared, int index, Mode mode, uint64_t seed, uint64_t ops,
         std::optional<absl::Time> deadline)
      : s_(shared), index_(index), mode_(mode), ops_(ops), deadline_(deadline) {
    std::seed_seq seq{seed & 0xffffffffu, seed >> 32,
                      static_cast<uint64_t>(index)};
    rng_.seed(seq);
    int total = 0;
    for (int w : kOpWeights) total += w;
    total_weight_ = total;
    // No reallocation of a large record in the middle of the run.
    if (mode_ == Mode::kRecord && !deadline_.has_value()) {
      record_.ops.reserve(ops_);
      results_.reserve(ops_);
    }
  }
  // Replays `record`, worker `index`'s part of a record.
  Worker(Shared& shared, int index, ThreadRecord record)
      : s_(shared),
        index_(index),
        mode_(Mode::kReplay),
        ops_(record.ops.size()),
        record_(std::move(record)),
        results_(record_.ops.size(), kNoResult) {
    // Keep each event an await names until its last await.
    for (const RecordedOp& op : record_.ops) {
      if (op.op == Op::kAwait && !op.skipped()) {
        awaitable_[Key(op.event)].last_await = op.index;
      }
    }
  }

  void Run();
  Counters& counters() { return c_; }
  // Recording: what it issued, each operation's result included.
  // Replaying: the record it replayed.
  ThreadRecord& record() { return record_; }
  // Recording and replaying: each operation's result in this run, by index.
  const std::vector<int>& results() const { return results_; }

 private:
  using Draws = std::array<uint64_t, 6>;

  // An event the replay keeps for an await that names it.
  struct Awaitable {
    uint64_t last_await = 0;     // index of the last await naming it
    std::optional<Event> event;  // once made
  };
  static uint64_t Key(const EventRef& e) {
    return e.seq * kMaxCallsPerOp + static_cast<uint64_t>(e.call);
  }

  Op DrawOp(uint64_t r) const {
    int x = static_cast<int>(r % static_cast<uint64_t>(total_weight_));
    for (int i = 0; i < kOpCount; ++i) {
      if (x < kOpWeights[i]) return static_cast<Op>(i);
      x -= kOpWeights[i];
    }
    return Op::kAwait;
  }

  // Decides the parameters of an operation of kind `op` from the draws `r`
  // and the worker's state; result kSkipped when it does not apply.
  RecordedOp Plan(Op op, const Draws& r);
  void PlanAllocPinned(RecordedOp& op, const Draws& r);
  void PlanFreePinned(RecordedOp& op, const Draws& r);
  void PlanAllocDevice(RecordedOp& op, const Draws& r);
  void PlanFreeDevice(RecordedOp& op, const Draws& r);
  void PlanH2D(RecordedOp& op, const Draws& r);
  void PlanD2H(RecordedOp& op, const Draws& r);
  void PlanD2D(RecordedOp& op, const Draws& r);
  void PlanChain(RecordedOp& op, const Draws& r);
  void PlanAwait(RecordedOp& op, const Draws& r);
  // Host memory for `size` bytes: when `want_pinned`, an idle pinned buffer
  // that fits (which, by `r`) other than `exclude`, else pageable memory.
  HostMemory ChooseHost(uint64_t size, bool want_pinned, uint64_t r,
                        const HostMemory& exclude = {}) const;
  // The names of the events of `follows` that are not complete yet.
  static std::vector<EventRef> Unfinished(
      const std::vector<const NamedEvent*>& follows);

  // Issues `op` and counts what it can count at once; the rest is counted
  // as its events are reaped.
  void Step(const RecordedOp& op);
  void Issue(const RecordedOp& op);
  void AllocPinned(const RecordedOp& op);
  void FreePinned(const RecordedOp& op);
  void AllocDevice(const RecordedOp& op);
  void FreeDevice(const RecordedOp& op);
  void H2D(const RecordedOp& op);
  void D2H(const RecordedOp& op);
  void D2D(const RecordedOp& op);
  void Chain(const RecordedOp& op);
  void Await(const RecordedOp& op);
  void Teardown();

  PinBuf* FindPinned(uint64_t id) {
    for (auto& p : pinned_) {
      if (p->id == id) return p.get();
    }
    return nullptr;
  }
  DevBuf* FindDevice(uint64_t id) {
    for (DevBuf& d : device_) {
      if (d.id == id) return &d;
    }
    return nullptr;
  }
  // The events of `follows` that `wait_for` names, in its order, for the
  // call. The others must be complete before the call issues: drawn they
  // are (that is why they were left out); replayed, the worker waits for
  // them, so that the call meets what the recorded one met. A name with no
  // event here (a replay in which the call that made it failed) is dropped.
  std::vector<Event> Follow(const std::vector<const NamedEvent*>& follows,
                            const std::vector<EventRef>& wait_for);
  // Waits (at most kHangBound) until the transfer using `b` finished and
  // was reaped. False, after counting a violation, when it did not.
  bool WaitIdle(PinBuf& b);

  // Host memory an operation uses.
  struct Host {
    uint8_t* p = nullptr;
    PinBuf* pin = nullptr;
    std::shared_ptr<uint8_t[]> pageable;
  };
  // The memory `m` names for `size` bytes: its pinned buffer once idle, or
  // fresh pageable memory (also when a replay does not have that buffer).
  Host Acquire(const HostMemory& m, uint64_t size);
  // The pending event an await names; a replay keeps those separately, as
  // its reaping follows its own timing. Nullopt when this run never made it.
  std::optional<Event> AwaitTarget(const EventRef& ref);

  bool RecordUsable(DevBuf& b) {
    if (!b.valid) return false;
    if (b.last_write->event.IsReady() && !b.last_write->event.Await().ok()) {
      b.valid = false;
    }
    return b.valid;
  }
  static void PruneReads(DevBuf& b) {
    std::erase_if(b.reads,
                  [](const NamedEvent& e) { return e.event.IsReady(); });
  }

  // Counts a call's status; true when expected.
  bool Count(const absl::Status& s, Shared::Kind kind, absl::string_view what) {
    ++c_.by_code[CodeIndex(s)];
    if (s_.Expected(s, kind)) return true;
    Violate(absl::StrCat(what, ": unexpected status ", s.ToString()));
    return false;
  }
  void OpResult(int code) {
    ++c_.by_op[static_cast<int>(op_)].codes[code];
    if (mode_ != Mode::kDraw) results_[op_index_] = code;
  }
  void Violate(std::string message) {
    ++c_.violation_count;
    if (c_.violations.size() < kMaxViolationsKept) {
      c_.violations.push_back(
          Violation{index_, op_index_, OpName(op_), std::move(message)});
    }
  }
  void AddPending(Pending p) {
    p.op_index = op_index_;
    p.op = op_;
    if (mode_ == Mode::kReplay) {
      const auto it = awaitable_.find(Key(p.ref));
      if (it != awaitable_.end()) it->second.event = p.event;
    }
    pending_.push_back(std::move(p));
  }
  // Counts and checks the pending events that are ready; with `wait`, waits
  // for each (at most kHangBound) first.
  void Reap(bool wait);
  void Finish(Pending& p, const absl::Status& s);

  Shared& s_;
  const int index_;
  const Mode mode_;
  const uint64_t ops_;
  const std::optional<absl::Time> deadline_;
  std::mt19937_64 rng_;
  int total_weight_ = 0;
  Counters c_;
  Op op_ = Op::kAwait;
  uint64_t op_index_ = 0;
  uint64_t fill_seed_ = 0;
  ThreadRecord record_;
  std::vector<int> results_;
  std::unordered_map<uint64_t, Awaitable> awaitable_;  // replay, by Key
  std::vector<std::unique_ptr<PinBuf>> pinned_;
  std::vector<DevBuf> device_;
  std::deque<Pending> pending_;
  // Memory of transfers that never became ready: never freed.
  std::vector<Pending> leaked_;
};

}  // namespace tpushim::tools::stress_internal

#endif  // TPUSHIM_TOOLS_STRESS_WORKER_H_
