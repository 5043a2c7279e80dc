#include "tools/stress.h"

#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/human_bytes.h"
#include "common/mutex.h"
#include "driver/system_internal.h"
#include "env/device_url.h"
#include "env/fault_injection.h"
#include "env/options.h"
#include "logging/log.h"
#include "nlohmann/json.hpp"
#include "tools/pseudo_random.h"
#include "tools/stress_internal.h"
#include "tools/stress_record.h"
#include "tools/text_table.h"
#include "tpushim/stats.h"
#include "tpushim/system.h"
#include "tpushim/transfer.h"

// The implementation lives in the module's internal namespace, next to
// its record format (tools/stress_record.h) and test seam
// (tools/stress_internal.h).
namespace tpushim::tools {
namespace stress_internal {
namespace {

using Json = nlohmann::ordered_json;

constexpr char kStressDescription[] =
    "Run a randomized, seeded, multi-threaded mix of every operation and "
    "check the runtime's invariants";

constexpr char kStressFooter[] = R"footer(
Each of --threads workers draws operations from its own generator seeded
with (--seed, worker): allocate/free pinned host buffers (1B-2M,
log-uniform), allocate/free device buffers (free with wait_for), host->device
from pageable or pinned memory with either host-buffer semantics, device->host,
device->device (same device and across devices), chains
h2d -> d2d -> d2h with wait_for on temporary buffers, and awaits (blocking,
timed, callbacks). Every byte read back is hash-checked (XXH3) against what
was sent; every failure must be a clean status of an expected code
(RESOURCE_EXHAUSTED, CANCELLED; with --faults also INTERNAL, UNAVAILABLE,
any code= of a rule, or a status marked "[injected: ...]"); every event is
awaited within 30 s. At the end every buffer is freed, the system's stats
must reconcile to zero (region, queues, pinned bytes, HBM) and, once it is
destroyed, nothing may stay mapped, locked or pinned.

Stress defaults (when the environment does not set them): TPUSHIM_DEVICE
sim://?devices=2&hbm=256M, a 64M premapped region with a 4M transfer
threshold, so transfers take all three paths (zero-copy from pinned host
buffers, staged up to the threshold, pinned above it). --region-bytes and
--threshold override the environment. --faults wins over TPUSHIM_FAULTS;
a start-up that fails with an injected fault (e.g. --faults 'mmap:nth=1')
is an expected, clean failure. Unless TPU_STDERR_LOG_LEVEL is set, only
FATAL log lines go to stderr (expected failures are logged at ERROR, to the
log files in TPU_LOG_DIR).

Output: tables of operations by status code and the checks; --json one
object, --csv rows section,name,code,count. A progress bar goes to stderr
when it is a terminal. On a violation the seed and the smallest command
reproducing it are printed (with --record, also the replay command).

--record FILE writes, once the run ends (pass or fail), its configuration
and every operation each worker issued, as JSON lines: the global order,
thread, kind, every parameter (buffers, sizes, offsets, host memory,
semantics, wait_for events, await mode and timeout, data seed) and the
result it had; about 210 bytes per operation stay in memory until then.
--replay FILE runs a record again with its configuration, so it excludes
--ops, --seconds, --threads, --seed, --faults, --region-bytes and
--threshold (other settings still come from the environment). Each
recorded operation is issued on its recorded worker thread with its
recorded arguments, one operation at a time across all threads, in the
recorded order, after waiting for any dependency the recorded run had seen
complete. Not replayed: device and DMA timing, and which call a fault rule
hits where the runtime's own calls at a fault point follow timing (DMA
descriptors run on device threads, staging chunks are taken as earlier
ones come back, overlapping transfers share pins). So an operation may end
differently: the replay counts those ("diverged"; timed awaits aside) and
names the first. It checks the same invariants. A malformed, truncated or
other-version record is refused (exit 2).

Exit status: 0 when no invariant was violated (expected failures included);
1 on any violation; 2 for a bad command line or invalid configuration.

Examples:
  tpushim stress                                   # 10000 ops, 4 threads
  tpushim stress --ops 1000000 --threads 8 --seed 1
  tpushim stress --seconds 60 --faults 'dma:rate=0.01,seed=7'
  tpushim stress --ops 20000 --faults 'mmap:rate=0.01,seed=1;madvise:rate=0.01,seed=2;mlock:rate=0.01,seed=3;numa:rate=0.01,seed=4;alloc:rate=0.01,seed=5;dma:rate=0.01,seed=6;pin:rate=0.01,seed=7;log_open:rate=0.01,seed=8'
  tpushim stress --faults 'mmap:nth=1'             # start-up fails cleanly
  tpushim stress --ops 20000 --record run.jsonl    # then, after a violation:
  tpushim stress --replay run.jsonl                # the same calls, in order
  tpushim stress --ops 5000 --json | jq '.by_code, .violations')footer";

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

// ---- Operations and codes --------------------------------------------------

// Relative weights of the mix, by Op.
constexpr std::array<int, kOpCount> kOpWeights = {8,  7,  8,  7, 20,
                                                  15, 12, 13, 10};

int CodeIndex(const absl::Status& status) {
  const int c = static_cast<int>(status.code());
  return c >= 0 && c < kAbslCodes
             ? c
             : static_cast<int>(absl::StatusCode::kUnknown);
}

const char* OpName(Op op) { return kOpNames[static_cast<int>(op)]; }

// ---- Data ------------------------------------------------------------------

uint64_t Hash(const void* p, uint64_t n) { return XXH3_64bits(p, n); }

// A value in [lo, hi], log-uniform, from the 64-bit draw `r`.
uint64_t LogUniform(uint64_t r, uint64_t lo, uint64_t hi) {
  if (hi <= lo) return lo;
  const double u = static_cast<double>(r >> 11) * 0x1.0p-53;
  const double v = std::exp(std::log(static_cast<double>(lo)) +
                            u * (std::log(static_cast<double>(hi) + 1.0) -
                                 std::log(static_cast<double>(lo))));
  return std::clamp<uint64_t>(static_cast<uint64_t>(v), lo, hi);
}
// A value in [lo, hi], uniform.
uint64_t Uniform(uint64_t r, uint64_t lo, uint64_t hi) {
  if (hi <= lo) return lo;
  return lo + r % (hi - lo + 1);
}

std::string ShellQuote(absl::string_view s) {
  return absl::StrCat("'", absl::StrReplaceAll(s, {{"'", "'\\''"}}), "'");
}

// The test hook (tools/stress_internal.h); empty unless a test set it.
ArrivedBytesHook& ArrivedBytesTestHook() {
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

  enum class Kind { kAllocation, kOperation };
  bool Expected(const absl::Status& s, Kind kind) const {
    if (s.ok()) return true;
    if (s.code() == absl::StatusCode::kResourceExhausted) return true;
    if (kind == Kind::kAllocation) {
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

Pending MakePending(NamedEvent done, bool op_result,
                    std::shared_ptr<uint8_t[]> keep = nullptr) {
  Pending p;
  p.ref = done.ref;
  p.event = std::move(done.event);
  p.op_result = op_result;
  p.keep = std::move(keep);
  return p;
}

Pending MakeVerified(NamedEvent done, uint8_t* dst, uint64_t size,
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
void AddFollows(const DevBuf& b, bool write,
                std::vector<const NamedEvent*>& follows) {
  if (b.last_write.has_value()) follows.push_back(&*b.last_write);
  if (!write) return;
  for (const NamedEvent& e : b.reads) follows.push_back(&e);
}

// Multiples of a device's block (DeviceDescription::block_bytes; 1 on
// sim://): NVMe devices move whole logical blocks.
uint64_t RoundUpTo(uint64_t n, uint64_t block) {
  return (n + block - 1) / block * block;
}
uint64_t RoundDownTo(uint64_t n, uint64_t block) { return n / block * block; }

// Picks a size and offset, whole `block`s, for a transfer into a buffer of
// `capacity` bytes (a multiple of `block`).
std::pair<uint64_t, uint64_t> SizeAndOffset(uint64_t capacity, uint64_t r1,
                                            uint64_t r2, uint64_t block) {
  const uint64_t size =
      r1 % 8 == 0 ? capacity
                  : RoundUpTo(LogUniform(r1 >> 3, 1, capacity), block);
  return {size, RoundDownTo(Uniform(r2, 0, capacity - size), block)};
}

Semantics DrawSemantics(uint64_t r) {
  return r % 2 == 0 ? Semantics::kUntilCompletes : Semantics::kDuringCall;
}
HostBufferSemantics ToHostBufferSemantics(Semantics s) {
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

void Worker::Run() {
  if (mode_ == Mode::kReplay) {
    for (const RecordedOp& op : record_.ops) Step(op);
  } else {
    fill_seed_ = (static_cast<uint64_t>(index_) << 48) ^ rng_();
    for (uint64_t i = 0;; ++i) {
      if (deadline_.has_value() ? absl::Now() >= *deadline_ : i >= ops_) break;
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
  std::tie(op.size, op.offset) = SizeAndOffset(b.buf.size(), r[1], r[2], s_.block);
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
    std::tie(op.size, op.offset) = SizeAndOffset(b.buf.size(), r[1], r[2], s_.block);
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
    std::tie(op.size, op.offset) =
        SizeAndOffset(std::min(a.buf.size(), b.buf.size()), r[2], r[3],
                      s_.block);
  }
  op.dst_offset = RoundDownTo(Uniform(r[4], 0, b.buf.size() - op.size),
                              s_.block);
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
  Count(b.status(), Shared::Kind::kAllocation, "AllocatePinnedHost");
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

// ---- Teardown checks -------------------------------------------------------

std::vector<std::string> StatsFailures(const SystemStats& s) {
  std::vector<std::string> f;
  auto check = [&f](bool ok, std::string what) {
    if (!ok) f.push_back(std::move(what));
  };
  if (s.region.enabled) {
    check(s.region.bytes_in_use == 0,
          absl::StrCat("region bytes_in_use = ", s.region.bytes_in_use));
    check(
        s.region.live_allocations == 0,
        absl::StrCat("region live_allocations = ", s.region.live_allocations));
  }
  const TransferStats& t = s.transfers;
  check(t.events_pending == 0,
        absl::StrCat("transfers.events_pending = ", t.events_pending));
  check(t.pinned_bytes_now == 0,
        absl::StrCat("transfers.pinned_bytes_now = ", t.pinned_bytes_now));
  check(t.staging_bytes_in_flight == 0,
        absl::StrCat("transfers.staging_bytes_in_flight = ",
                     t.staging_bytes_in_flight));
  check(
      t.device_buffers_live == 0,
      absl::StrCat("transfers.device_buffers_live = ", t.device_buffers_live));
  check(t.device_bytes_live == 0,
        absl::StrCat("transfers.device_bytes_live = ", t.device_bytes_live));
  for (const QueueStats& q : t.queues) {
    const std::string name =
        absl::StrCat("queue ", q.device, "/", DmaDirectionName(q.direction));
    check(q.pending == 0, absl::StrCat(name, " pending = ", q.pending));
    check(q.in_flight == 0, absl::StrCat(name, " in_flight = ", q.in_flight));
    check(q.submitted == q.completed + q.failed + q.cancelled,
          absl::StrCat(name, " submitted ", q.submitted, " != completed ",
                       q.completed, " + failed ", q.failed, " + cancelled ",
                       q.cancelled));
  }
  for (const DeviceStats& d : s.devices) {
    check(d.hbm_in_use == 0,
          absl::StrCat("device ", d.id, " hbm_in_use = ", d.hbm_in_use));
  }
  return f;
}

std::vector<std::string> OsFailures(const FaultInjectingOs& os) {
  std::vector<std::string> f;
  if (os.mapped_bytes() != 0) {
    f.push_back(absl::StrCat("bytes still mapped: ", os.mapped_bytes()));
  }
  if (os.locked_bytes() != 0) {
    f.push_back(absl::StrCat("bytes still locked: ", os.locked_bytes()));
  }
  if (os.pinned_bytes() != 0) {
    f.push_back(absl::StrCat("bytes still pinned: ", os.pinned_bytes()));
  }
  return f;
}

// ---- Progress --------------------------------------------------------------

class Progress {
 public:
  Progress(bool enabled, const Shared& shared, uint64_t total_ops,
           std::optional<absl::Time> deadline, absl::Time start)
      : shared_(shared), total_(total_ops), deadline_(deadline), start_(start) {
    if (enabled) thread_ = std::thread([this] { Loop(); });
  }
  ~Progress() { Stop(); }
  void Stop() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
    std::fputs("\r\033[K", stderr);
    std::fflush(stderr);
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!done_) {
      Draw();
      cv_.wait_for(lock, std::chrono::milliseconds(200));
    }
  }
  void Draw() {
    const uint64_t done = shared_.ops_done.load(std::memory_order_relaxed);
    const double elapsed = absl::ToDoubleSeconds(absl::Now() - start_);
    double frac;
    if (deadline_.has_value()) {
      frac =
          elapsed / std::max(1e-9, absl::ToDoubleSeconds(*deadline_ - start_));
    } else {
      frac = total_ > 0
                 ? static_cast<double>(done) / static_cast<double>(total_)
                 : 1.0;
    }
    frac = std::clamp(frac, 0.0, 1.0);
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(frac * kWidth);
    std::string bar(static_cast<size_t>(filled), '#');
    bar.append(static_cast<size_t>(kWidth - filled), '.');
    std::fprintf(stderr, "\r\033[Kstress [%s] %3.0f%% %llu ops, %.0f ops/s",
                 bar.c_str(), frac * 100, static_cast<unsigned long long>(done),
                 elapsed > 0 ? static_cast<double>(done) / elapsed : 0.0);
    std::fflush(stderr);
  }

  const Shared& shared_;
  const uint64_t total_;
  const std::optional<absl::Time> deadline_;
  const absl::Time start_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

// ---- Output ----------------------------------------------------------------

// Replay: an operation that ended differently than recorded.
struct Divergence {
  uint64_t seq = 0;
  int thread = 0;
  uint64_t op_index = 0;
  Op op = Op::kAwait;
  int recorded = kNoResult;  // code slots
  int replayed = kNoResult;
};

// What --record wrote or --replay read.
struct RecordReport {
  bool replay = false;
  std::string file;
  uint64_t lines = 0;           // after the header
  std::string tpushim_version;  // of the tpushim that recorded it
  std::string command;          // tpushim stress --replay FILE
  // Replay: operations that ended differently than recorded.
  uint64_t diverged = 0;
  std::optional<Divergence> first_divergence;  // the first issued
  std::string error;  // recording: why the file could not be written
};

std::string ResultName(int code) {
  return code == kNoResult ? "none" : CodeName(code);
}

std::string DivergenceText(const Divergence& d) {
  return absl::StrCat("seq ", d.seq, " (thread ", d.thread, " op ", d.op_index,
                      ", ", OpName(d.op), "): recorded ",
                      ResultName(d.recorded), ", replayed ",
                      ResultName(d.replayed));
}

Json RecordJson(const RecordReport& r) {
  Json first = nullptr;
  if (r.first_divergence.has_value()) {
    const Divergence& d = *r.first_divergence;
    auto code = [](int c) {
      return c == kNoResult ? Json(nullptr) : Json(CodeName(c));
    };
    first = {{"seq", d.seq},
             {"thread", d.thread},
             {"op_index", d.op_index},
             {"op", OpName(d.op)},
             {"recorded", code(d.recorded)},
             {"replayed", code(d.replayed)}};
  }
  return {{"mode", r.replay ? "replay" : "record"},
          {"file", r.file},
          {"lines", r.lines},
          {"tpushim", r.tpushim_version},
          {"replay", r.command},
          {"diverged", r.diverged},
          {"first_divergence", first},
          {"error", r.error.empty() ? Json(nullptr) : Json(r.error)}};
}

struct Report {
  uint64_t seed = 0;
  int threads = 0;
  double seconds = 0;
  std::string faults;
  std::string device;
  uint64_t region_bytes = 0;
  uint64_t threshold_bytes = 0;
  absl::Status startup;
  bool startup_expected = true;
  Counters counters;
  uint64_t callbacks_added = 0;
  uint64_t callbacks_run = 0;
  // Transfers per direction and path, from the system's stats.
  std::array<std::array<uint64_t, kTransferPathCount>, 2> paths{};
  uint64_t d2d_transfers = 0;
  bool teardown_checked = false;
  std::vector<std::string> teardown_failures;
  std::string reproduce;
  std::optional<RecordReport> record;  // with --record or --replay

  uint64_t violations() const {
    return counters.violation_count + teardown_failures.size() +
           (startup_expected ? 0 : 1);
  }
};

Json ReportJson(const Report& r) {
  Json by_op = Json::object();
  for (int i = 0; i < kOpCount; ++i) {
    Json codes = Json::object();
    for (int c = 0; c < kCodeSlots; ++c) {
      if (r.counters.by_op[i].codes[c] > 0) {
        codes[CodeName(c)] = r.counters.by_op[i].codes[c];
      }
    }
    by_op[kOpNames[i]] = {{"count", r.counters.by_op[i].count},
                          {"codes", codes}};
  }
  Json by_code = Json::object();
  for (int c = 0; c < kAbslCodes; ++c) {
    if (r.counters.by_code[c] > 0) by_code[CodeName(c)] = r.counters.by_code[c];
  }
  Json violations = Json::array();
  for (const Violation& v : r.counters.violations) {
    violations.push_back({{"thread", v.thread},
                          {"op_index", v.op_index},
                          {"op", v.op},
                          {"message", v.message}});
  }
  if (!r.startup_expected) {
    violations.push_back({{"thread", nullptr},
                          {"op_index", nullptr},
                          {"op", "startup"},
                          {"message", r.startup.ToString()}});
  }
  for (const std::string& f : r.teardown_failures) {
    violations.push_back({{"thread", nullptr},
                          {"op_index", nullptr},
                          {"op", "teardown"},
                          {"message", f}});
  }
  Json paths = Json::object();
  for (int d = 0; d < 2; ++d) {
    Json p = Json::object();
    for (int k = 0; k < kTransferPathCount; ++k) {
      p[std::string(TransferPathName(static_cast<TransferPath>(k)))] =
          r.paths[d][k];
    }
    paths[std::string(DmaDirectionName(static_cast<DmaDirection>(d)))] = p;
  }
  paths["d2d"] = r.d2d_transfers;
  return {
      {"seed", r.seed},
      {"ops", r.counters.ops},
      {"threads", r.threads},
      {"seconds", r.seconds},
      {"ops_per_second",
       r.seconds > 0 ? static_cast<double>(r.counters.ops) / r.seconds : 0.0},
      {"faults", r.faults},
      {"device", r.device},
      {"region_bytes", r.region_bytes},
      {"threshold_bytes", r.threshold_bytes},
      {"startup",
       {{"ok", r.startup.ok()},
        {"code", absl::StatusCodeToString(r.startup.code())},
        {"message", std::string(r.startup.message())}}},
      {"by_op", by_op},
      {"by_code", by_code},
      {"bytes_verified", r.counters.bytes_verified},
      {"transfers_verified", r.counters.transfers_verified},
      {"callbacks", {{"added", r.callbacks_added}, {"run", r.callbacks_run}}},
      {"paths", paths},
      {"teardown",
       {{"checked", r.teardown_checked}, {"failures", r.teardown_failures}}},
      {"violations", violations},
      {"reproduce", r.reproduce},
      {"record", r.record.has_value() ? RecordJson(*r.record) : Json(nullptr)},
  };
}

void WriteCsv(const Report& r, std::ostream& out) {
  out << "section,name,code,count\n";
  for (int i = 0; i < kOpCount; ++i) {
    out << "by_op," << kOpNames[i] << ",count," << r.counters.by_op[i].count
        << "\n";
    for (int c = 0; c < kCodeSlots; ++c) {
      if (r.counters.by_op[i].codes[c] > 0) {
        out << "by_op," << kOpNames[i] << "," << CodeName(c) << ","
            << r.counters.by_op[i].codes[c] << "\n";
      }
    }
  }
  for (int c = 0; c < kAbslCodes; ++c) {
    if (r.counters.by_code[c] > 0) {
      out << "by_code,," << CodeName(c) << "," << r.counters.by_code[c] << "\n";
    }
  }
  out << "summary,seed,," << r.seed << "\n";
  out << "summary,ops,," << r.counters.ops << "\n";
  out << "summary,threads,," << r.threads << "\n";
  out << "summary,bytes_verified,," << r.counters.bytes_verified << "\n";
  out << "summary,transfers_verified,," << r.counters.transfers_verified
      << "\n";
  out << "summary,violations,," << r.violations() << "\n";
  if (r.record.has_value() && r.record->replay) {
    out << "summary,diverged,," << r.record->diverged << "\n";
  }
}

void PrintHuman(const Report& r, std::ostream& out) {
  out << "tpushim stress: seed " << r.seed << ", " << r.counters.ops
      << " ops on " << r.threads << " threads in "
      << absl::StrFormat("%.2f s (%.0f ops/s)", r.seconds,
                         r.seconds > 0
                             ? static_cast<double>(r.counters.ops) / r.seconds
                             : 0.0)
      << "\n";
  TextTable setup;
  setup.AddRow({"device", r.device});
  setup.AddRow({"premapped region",
                absl::StrCat(HumanReadableBytes(r.region_bytes), ", threshold ",
                             HumanReadableBytes(r.threshold_bytes))});
  setup.AddRow({"faults", r.faults.empty() ? "none" : r.faults});
  if (r.record.has_value()) {
    const RecordReport& rec = *r.record;
    if (rec.replay) {
      setup.AddRow(
          {"replay",
           absl::StrCat(
               rec.file, ": ", rec.lines, " lines recorded by tpushim ",
               rec.tpushim_version, "; ",
               rec.diverged == 0
                   ? std::string("every operation ended as recorded")
                   : absl::StrCat(rec.diverged, " ended differently, first ",
                                  DivergenceText(*rec.first_divergence)))});
    } else {
      setup.AddRow(
          {"record",
           rec.error.empty()
               ? absl::StrCat(rec.file, ": ", rec.lines, " lines")
               : absl::StrCat(rec.file, ": NOT WRITTEN: ", rec.error)});
    }
  }
  setup.AddRow({"start-up",
                r.startup.ok()
                    ? std::string("OK")
                    : absl::StrCat(r.startup_expected ? "failed as expected: "
                                                      : "FAILED (violation): ",
                                   r.startup.ToString())});
  setup.Print(out);

  if (r.startup.ok()) {
    // Columns: the codes that occur in by_op.
    std::vector<int> cols;
    for (int c = 0; c < kCodeSlots; ++c) {
      for (int i = 0; i < kOpCount; ++i) {
        if (r.counters.by_op[i].codes[c] > 0) {
          cols.push_back(c);
          break;
        }
      }
    }
    out << "\nOperations by result\n";
    std::vector<std::string> header = {"OP", "COUNT"};
    for (int c : cols) header.push_back(CodeName(c));
    TextTable ops(header);
    for (int i = 0; i < kOpCount; ++i) {
      std::vector<std::string> row = {kOpNames[i],
                                      absl::StrCat(r.counters.by_op[i].count)};
      for (int c : cols) {
        row.push_back(absl::StrCat(r.counters.by_op[i].codes[c]));
      }
      ops.AddRow(row);
    }
    ops.Print(out);

    out << "\nStatuses returned or carried by events\n";
    TextTable codes({"CODE", "COUNT"});
    for (int c = 0; c < kAbslCodes; ++c) {
      if (r.counters.by_code[c] > 0) {
        codes.AddRow({CodeName(c), absl::StrCat(r.counters.by_code[c])});
      }
    }
    codes.Print(out);

    out << "\nChecks\n";
    TextTable checks;
    checks.AddRow(
        {"bytes verified",
         absl::StrCat(BytesWithHumanReadable(r.counters.bytes_verified), " in ",
                      r.counters.transfers_verified, " transfers")});
    auto path_row = [&r](int d) {
      return absl::StrCat(r.paths[d][0], " zero-copy, ", r.paths[d][1],
                          " staged, ", r.paths[d][2], " pinned");
    };
    checks.AddRow({"h2d transfers", path_row(0)});
    checks.AddRow({"d2h transfers", path_row(1)});
    checks.AddRow({"d2d transfers", absl::StrCat(r.d2d_transfers)});
    checks.AddRow({"callbacks", absl::StrCat(r.callbacks_run, " of ",
                                             r.callbacks_added, " ran")});
    checks.AddRow({"teardown", !r.teardown_checked ? std::string("not checked")
                               : r.teardown_failures.empty()
                                   ? std::string("stats reconcile to zero, "
                                                 "nothing left mapped/pinned")
                                   : absl::StrCat(r.teardown_failures.size(),
                                                  " failures")});
    checks.Print(out);
  }
  const uint64_t v = r.violations();
  if (v > 0) {
    out << "\nViolations\n";
    for (const Violation& x : r.counters.violations) {
      out << "  thread " << x.thread << " op " << x.op_index << " (" << x.op
          << "): " << x.message << "\n";
    }
    if (r.counters.violation_count > r.counters.violations.size()) {
      out << "  ... "
          << r.counters.violation_count - r.counters.violations.size()
          << " more\n";
    }
    if (!r.startup_expected) out << "  start-up: " << r.startup << "\n";
    for (const std::string& f : r.teardown_failures) {
      out << "  teardown: " << f << "\n";
    }
  }
  out << "\nviolations = " << v << "\n";
  out << "seed = " << r.seed << "\n";
  out << "reproduce: " << r.reproduce << "\n";
  if (r.record.has_value() && r.record->error.empty()) {
    out << "replay: " << r.record->command << "\n";
  }
}

// ---- The command -----------------------------------------------------------

std::string ReproCommand(const StressFlags& f, uint64_t seed, uint64_t ops,
                         const std::string& faults) {
  std::string cmd = absl::StrCat("tpushim stress --seed ", seed, " --ops ", ops,
                                 " --threads ", f.threads);
  if (!faults.empty()) absl::StrAppend(&cmd, " --faults ", ShellQuote(faults));
  if (!f.region_bytes.empty()) {
    absl::StrAppend(&cmd, " --region-bytes ", f.region_bytes);
  }
  if (!f.threshold.empty()) absl::StrAppend(&cmd, " --threshold ", f.threshold);
  return cmd;
}

// The tracking Os under every system the tool creates. Logging keeps the
// Os it was set up with for the life of the process, so it is never
// destroyed.
FaultInjectingOs& TrackingOs(Os* base) {
  static FaultInjectingOs* os = new FaultInjectingOs(base, nullptr);
  return *os;
}

// Reads and checks the record at `path` for --replay.
absl::StatusOr<StressRecord> LoadRecord(Os& os, const std::string& path) {
  absl::StatusOr<std::string> text = os.ReadFile(path);
  if (!text.ok()) return text.status();
  absl::StatusOr<StressRecord> record = ParseStressRecord(*text);
  if (!record.ok()) {
    return absl::Status(record.status().code(),
                        absl::StrCat(path, ": ", record.status().message()));
  }
  return record;
}

// A replay runs with the recorded run's configuration.
void UseRecordedConfig(const StressConfig& c, StressFlags& f) {
  f.seed = c.seed;
  f.seed_given = true;
  f.threads = c.threads;
  f.seconds_given = c.seconds.has_value();
  if (c.seconds.has_value()) {
    f.seconds = *c.seconds;
  } else {
    f.ops = *c.ops;
  }
  f.faults = c.faults;
  f.faults_given = true;
  f.region_bytes = absl::StrCat(c.region_bytes);
  // With the region off there is no threshold to set.
  f.threshold = c.region_bytes > 0 ? absl::StrCat(c.threshold_bytes) : "";
}

// Every seq of `record` with its thread, in seq order: the turnstile's
// tickets.
std::vector<std::pair<uint64_t, int>> Tickets(const StressRecord& record) {
  std::vector<std::pair<uint64_t, int>> tickets;
  for (size_t t = 0; t < record.threads.size(); ++t) {
    const ThreadRecord& thread = record.threads[t];
    for (const RecordedOp& op : thread.ops) {
      tickets.emplace_back(op.seq, static_cast<int>(t));
    }
    if (thread.teardown_seq.has_value()) {
      tickets.emplace_back(*thread.teardown_seq, static_cast<int>(t));
    }
  }
  std::sort(tickets.begin(), tickets.end());
  return tickets;
}

// Replay: counts the operations of `recorded` (a thread's part of the
// record) whose result in this run, `replayed` (by index; empty when the
// run never started), differs, and keeps the first issued of them. Timed
// awaits are left out: whether one times out is timing, and it changes
// nothing that follows.
void CompareResults(const ThreadRecord& recorded,
                    const std::vector<int>& replayed, RecordReport& report) {
  for (const RecordedOp& op : recorded.ops) {
    if (op.op == Op::kAwait && op.mode == AwaitMode::kTimed) continue;
    const int now = op.index < replayed.size() ? replayed[op.index] : kNoResult;
    if (now == op.result) continue;
    ++report.diverged;
    if (!report.first_divergence.has_value() ||
        op.seq < report.first_divergence->seq) {
      report.first_divergence =
          Divergence{op.seq, op.thread, op.index, op.op, op.result, now};
    }
  }
}

// Writes `record` to `fd` and closes it.
absl::Status WriteRecordFile(Os& os, int fd, const StressRecord& record) {
  absl::Status status =
      WriteStressRecord(record, [&os, fd](absl::string_view chunk) {
        return os.WriteAll(fd, chunk.data(), chunk.size());
      });
  absl::Status closed = os.Close(fd);
  return status.ok() ? closed : status;
}

void RunStress(StressFlags flags, CommandContext& context) {
  auto usage = [&](const absl::Status& s) {
    ReportError(s, "invalid configuration", flags.json, kExitUsage, context);
  };
  absl::StatusOr<Options> options = ResolveOptions(*context.os);
  if (!options.ok()) return usage(options.status());

  std::optional<StressRecord> replay;
  if (!flags.replay.empty()) {
    absl::StatusOr<StressRecord> loaded = LoadRecord(*context.os, flags.replay);
    if (!loaded.ok()) {
      return ReportError(loaded.status(), "cannot replay", flags.json,
                         kExitUsage, context);
    }
    replay = *std::move(loaded);
    UseRecordedConfig(replay->config, flags);
  }

  Report report;
  report.threads = flags.threads;
  report.seed = flags.seed_given
                    ? flags.seed
                    : static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()) &
                                            0xffffffffffff);

  OptionOverrides overrides;
  if (replay.has_value()) {
    overrides.device = replay->config.device;
  } else if (options->device.source == OptionSource::kDefault) {
    overrides.device = kDefaultDevice;
  }
  const bool region_default =
      options->premapped_buffer_size.source == OptionSource::kDefault;
  if (!flags.region_bytes.empty()) {
    absl::StatusOr<uint64_t> b =
        ParseByteSize(flags.region_bytes, "--region-bytes");
    if (!b.ok()) return usage(b.status());
    overrides.premapped_buffer_size = *b;
  } else if (region_default) {
    overrides.premapped_buffer_size = kDefaultRegionBytes;
  }
  if (!flags.threshold.empty()) {
    absl::StatusOr<uint64_t> b = ParseByteSize(flags.threshold, "--threshold");
    if (!b.ok()) return usage(b.status());
    overrides.premapped_buffer_transfer_threshold_bytes = *b;
  } else if (region_default && flags.region_bytes.empty() &&
             options->premapped_buffer_transfer_threshold_bytes.source ==
                 OptionSource::kDefault) {
    overrides.premapped_buffer_transfer_threshold_bytes =
        kDefaultThresholdBytes;
  }
  if (flags.faults_given) overrides.faults = flags.faults;
  // Expected failures are logged at ERROR; keep them in the log files, off
  // the terminal, unless TPU_STDERR_LOG_LEVEL says otherwise.
  if (options->stderr_log_level.source == OptionSource::kDefault) {
    overrides.stderr_log_level = 3;
  }
  // Resolve once more to validate what the flags set and learn the faults.
  absl::StatusOr<Options> resolved = ResolveOptions(*context.os, overrides);
  if (!resolved.ok()) return usage(resolved.status());
  report.faults = resolved->faults.value.text;
  report.device = resolved->device.value.text;
  report.region_bytes = resolved->premapped_buffer_size.value;
  report.threshold_bytes =
      resolved->premapped_buffer_transfer_threshold_bytes.value;

  Shared shared;
  shared.faults = !resolved->faults.value.empty();
  for (const FaultRule& rule : resolved->faults.value.rules) {
    if (rule.code.has_value()) shared.rule_codes.push_back(*rule.code);
  }

  FaultInjectingOs& os = TrackingOs(context.os);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<System>> system =
      SystemFactory::Create(overrides, &os);
  if (!system.ok() && absl::IsInvalidArgument(system.status()) &&
      !absl::StrContains(system.status().message(), "[injected: ")) {
    return usage(system.status());
  }
  // Opened once the configuration proved valid, before the run: a record
  // that cannot be written fails at once, not after a long run.
  int record_fd = -1;
  if (!flags.record.empty()) {
    absl::StatusOr<int> fd = context.os->CreateOutputFile(flags.record);
    if (!fd.ok()) {
      return ReportError(fd.status(), "cannot create the record", flags.json,
                         kExitUsage, context);
    }
    record_fd = *fd;
  }

  std::vector<std::unique_ptr<Worker>> workers;
  if (!system.ok()) {
    report.startup = system.status();
    report.startup_expected =
        shared.faults &&
        absl::StrContains(system.status().message(), "[injected: ");
    report.teardown_checked = true;
    report.teardown_failures = OsFailures(os);
  } else {
    report.threshold_bytes = (*system)->transfer_threshold_bytes();
    shared.system = system->get();
    shared.devices = (*system)->device_count();
    for (int d = 0; d < shared.devices; ++d) {
      shared.block = std::max<uint64_t>(shared.block,
                                        (*system)->device(d).block_bytes);
    }
    shared.threshold = report.threshold_bytes;
    LOG(INFO) << "tpushim stress: seed " << report.seed << ", "
              << (flags.seconds_given ? absl::StrCat(flags.seconds, " s")
                                      : absl::StrCat(flags.ops, " ops"))
              << ", " << flags.threads << " threads, faults \"" << report.faults
              << "\""
              << (replay.has_value()
                      ? absl::StrCat(", replaying ", flags.replay)
                      : "");

    std::optional<absl::Time> deadline;
    std::unique_ptr<Turnstile> turnstile;
    uint64_t total_ops = flags.seconds_given ? 0 : flags.ops;
    if (replay.has_value()) {
      turnstile = std::make_unique<Turnstile>(Tickets(*replay), flags.threads);
      shared.turnstile = turnstile.get();
      total_ops = 0;
      for (int t = 0; t < flags.threads; ++t) {
        total_ops += replay->threads[t].ops.size();
        workers.push_back(
            std::make_unique<Worker>(shared, t, std::move(replay->threads[t])));
      }
    } else {
      // --seconds is the time for operations: counted from here, after
      // start-up, which a sanitizer build can slow to a good part of a
      // short run.
      if (flags.seconds_given) {
        deadline = absl::Now() + absl::Seconds(flags.seconds);
      }
      const Worker::Mode mode =
          flags.record.empty() ? Worker::Mode::kDraw : Worker::Mode::kRecord;
      for (int t = 0; t < flags.threads; ++t) {
        const uint64_t share =
            flags.ops / static_cast<uint64_t>(flags.threads) +
            (static_cast<uint64_t>(t) <
                     flags.ops % static_cast<uint64_t>(flags.threads)
                 ? 1
                 : 0);
        workers.push_back(std::make_unique<Worker>(shared, t, mode, report.seed,
                                                   share, deadline));
      }
    }
    {
      Progress progress(!flags.no_progress && isatty(2) == 1, shared, total_ops,
                        deadline, start);
      std::vector<std::thread> threads;
      for (auto& w : workers) threads.emplace_back([&w] { w->Run(); });
      for (std::thread& t : threads) t.join();
    }
    for (auto& w : workers) report.counters.Merge(w->counters());

    // Callbacks run on the callback thread once their event is ready.
    const absl::Time cb_deadline = absl::Now() + kHangBound;
    while (shared.callbacks_run.load() < shared.callbacks_added.load() &&
           absl::Now() < cb_deadline) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    report.callbacks_added = shared.callbacks_added.load();
    report.callbacks_run = shared.callbacks_run.load();
    if (report.callbacks_run != report.callbacks_added) {
      report.teardown_failures.push_back(
          absl::StrCat(report.callbacks_added - report.callbacks_run,
                       " callbacks did not run within 30 s"));
    }
    if (shared.callbacks_wrong.load() > 0) {
      report.teardown_failures.push_back(
          absl::StrCat(shared.callbacks_wrong.load(),
                       " callbacks ran with a status other than their "
                       "event's, before it was ready, or twice"));
    }

    // Stats may trail the last event by a moment: poll briefly.
    std::vector<std::string> stats_failures;
    const absl::Time stats_deadline = absl::Now() + absl::Seconds(5);
    do {
      const SystemStats stats = (*system)->GetStats();
      for (int d = 0; d < 2; ++d) {
        for (int k = 0; k < kTransferPathCount; ++k) {
          report.paths[d][k] = stats.transfers.host[d][k].transfers;
        }
      }
      report.d2d_transfers = stats.transfers.device_to_device.transfers;
      stats_failures = StatsFailures(stats);
      if (stats_failures.empty()) break;
      absl::SleepFor(absl::Milliseconds(5));
    } while (absl::Now() < stats_deadline);
    system->reset();
    report.seconds = absl::ToDoubleSeconds(absl::Now() - start);
    for (std::string& f : stats_failures) {
      report.teardown_failures.push_back(std::move(f));
    }
    for (std::string& f : OsFailures(os)) {
      report.teardown_failures.push_back(std::move(f));
    }
    report.teardown_checked = true;
  }

  // Reproduction: every worker runs the same first operations with
  // --ops = per-worker ops * threads, so the shortest run that reaches the
  // first violation has (its op index + 1) ops per worker.
  const uint64_t per_worker_all =
      flags.seconds_given
          ? (report.counters.ops + flags.threads - 1) / flags.threads
          : (flags.ops + flags.threads - 1) / flags.threads;
  uint64_t per_worker = per_worker_all;
  if (!report.counters.violations.empty()) {
    uint64_t first = per_worker_all;
    for (const Violation& v : report.counters.violations) {
      first = std::min(first, v.op_index + 1);
    }
    per_worker = first;
  }
  const uint64_t repro_ops =
      flags.seconds_given || !report.counters.violations.empty()
          ? std::max<uint64_t>(per_worker, 1) * flags.threads
          : flags.ops;
  report.reproduce = ReproCommand(
      flags, report.seed,
      std::min(repro_ops,
               std::max<uint64_t>(report.counters.ops,
                                  flags.seconds_given ? repro_ops : flags.ops)),
      report.faults);

  if (replay.has_value()) {
    RecordReport rec;
    rec.replay = true;
    rec.file = flags.replay;
    rec.tpushim_version = replay->tpushim_version;
    rec.command =
        absl::StrCat("tpushim stress --replay ", ShellQuote(flags.replay));
    for (size_t t = 0; t < replay->threads.size(); ++t) {
      // The workers hold the threads' records once they ran.
      const ThreadRecord& recorded =
          workers.empty() ? replay->threads[t] : workers[t]->record();
      rec.lines += recorded.ops.size() + (recorded.teardown_seq ? 1 : 0);
      CompareResults(
          recorded,
          workers.empty() ? std::vector<int>{} : workers[t]->results(), rec);
    }
    report.record = std::move(rec);
  } else if (record_fd >= 0) {
    StressRecord record;
    record.tpushim_version = TPUSHIM_VERSION_STRING;
    record.config = StressConfig{
        report.seed,
        flags.threads,
        flags.seconds_given ? std::nullopt : std::optional<uint64_t>(flags.ops),
        flags.seconds_given ? std::optional<double>(flags.seconds)
                            : std::nullopt,
        report.faults,
        report.device,
        report.region_bytes,
        report.threshold_bytes};
    record.threads.resize(static_cast<size_t>(flags.threads));
    RecordReport rec;
    rec.file = flags.record;
    rec.tpushim_version = record.tpushim_version;
    rec.command =
        absl::StrCat("tpushim stress --replay ", ShellQuote(flags.record));
    for (size_t t = 0; t < workers.size(); ++t) {
      ThreadRecord& thread = record.threads[t];
      thread = std::move(workers[t]->record());
      for (RecordedOp& op : thread.ops) {
        op.result = workers[t]->results()[op.index];
      }
      rec.lines += thread.ops.size() + (thread.teardown_seq ? 1 : 0);
    }
    const absl::Status written =
        WriteRecordFile(*context.os, record_fd, record);
    if (!written.ok()) rec.error = written.ToString();
    report.record = std::move(rec);
  }

  if (flags.json) {
    WriteJson(ReportJson(report), *context.out);
  } else if (flags.csv) {
    WriteCsv(report, *context.out);
  } else {
    PrintHuman(report, *context.out);
  }
  const bool record_failed =
      report.record.has_value() && !report.record->error.empty();
  if (record_failed) {
    *context.err << "tpushim stress: cannot write the record " << flags.record
                 << ": " << report.record->error << "\n";
  }
  if (report.violations() > 0) {
    *context.err << "tpushim stress: " << report.violations()
                 << " invariant violations; seed " << report.seed
                 << "; reproduce with: " << report.reproduce;
    if (report.record.has_value() && !record_failed) {
      *context.err << "; or replay the run: " << report.record->command;
    }
    *context.err << "\n";
    context.exit_code = kExitFailure;
  } else {
    context.exit_code = record_failed ? kExitFailure : kExitOk;
  }
}

void RegisterStress(CLI::App& app, CommandContext& context) {
  CLI::App* stress = app.add_subcommand("stress", kStressDescription);
  stress->footer(kStressFooter);
  auto flags = std::make_shared<StressFlags>();
  CLI::Option* ops =
      stress->add_option("--ops", flags->ops, "Operations to run in total")
          ->default_val(kDefaultOps)
          ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 40));
  CLI::Option* seconds =
      stress
          ->add_option("--seconds", flags->seconds,
                       "Run for this many seconds instead of --ops")
          ->check(CLI::Range(0.001, 7.0 * 24 * 3600));
  ops->excludes(seconds);
  CLI::Option* threads =
      stress->add_option("--threads", flags->threads, "Worker threads")
          ->default_val(kDefaultThreads)
          ->check(CLI::Range(1, kMaxThreads));
  CLI::Option* seed = stress->add_option(
      "--seed", flags->seed, "Seed (default: from the clock; printed)");
  CLI::Option* faults =
      stress
          ->add_option("--faults", flags->faults,
                       "Faults to inject, TPUSHIM_FAULTS grammar, e.g. "
                       "'dma:rate=0.01,seed=7;alloc:every=50'")
          ->check(CLI::Validator(
              [](const std::string& text) -> std::string {
                absl::StatusOr<FaultSpec> spec = ParseFaultSpec(text);
                return spec.ok() ? "" : std::string(spec.status().message());
              },
              "SPEC", "fault spec"));
  auto byte_size = [](const char* what) {
    return CLI::Validator(
        [what](const std::string& text) -> std::string {
          absl::StatusOr<uint64_t> b = ParseByteSize(text, what);
          return b.ok() ? "" : std::string(b.status().message());
        },
        "BYTES", "byte size");
  };
  CLI::Option* region =
      stress
          ->add_option("--region-bytes", flags->region_bytes,
                       "Premapped region size (K/M/G; default: "
                       "TPU_PREMAPPED_BUFFER_SIZE, else 64M)")
          ->check(byte_size("--region-bytes"));
  CLI::Option* threshold =
      stress
          ->add_option("--threshold", flags->threshold,
                       "Transfer threshold (K/M/G; default: "
                       "TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES, else "
                       "4M with the default region)")
          ->check(byte_size("--threshold"));
  CLI::Option* record =
      stress
          ->add_option(
              "--record", flags->record,
              "Write the run's configuration and every operation it issues, in "
              "order, to FILE (JSON lines), for --replay")
          ->type_name("FILE");
  CLI::Option* replay = stress
                            ->add_option("--replay", flags->replay,
                                         "Replay the operations recorded in "
                                         "FILE, in their recorded order, "
                                         "with the recorded configuration")
                            ->type_name("FILE");
  record->excludes(replay);
  for (CLI::Option* defines_the_run :
       {ops, seconds, threads, seed, faults, region, threshold}) {
    replay->excludes(defines_the_run);
  }
  CLI::Option* json = stress->add_flag(
      "--json", flags->json, "Print one JSON object instead of tables");
  CLI::Option* csv =
      stress->add_flag("--csv", flags->csv, "Print CSV rows instead of tables");
  json->excludes(csv);
  stress->add_flag("--no-progress", flags->no_progress,
                   "No progress bar on stderr (there is none unless stderr "
                   "is a terminal)");
  stress->callback([flags, seconds, seed, faults, &context] {
    flags->seconds_given = seconds->count() > 0;
    flags->seed_given = seed->count() > 0;
    flags->faults_given = faults->count() > 0;
    RunStress(*flags, context);
  });
}

}  // namespace

void SetArrivedBytesHookForTesting(ArrivedBytesHook hook) {
  ArrivedBytesTestHook() = std::move(hook);
}

}  // namespace stress_internal

void RegisterStressCommand(CLI::App& app, CommandContext& context) {
  stress_internal::RegisterStress(app, context);
}

}  // namespace tpushim::tools
