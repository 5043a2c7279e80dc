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
#include "driver/system_internal.h"
#include "env/device_url.h"
#include "env/fault_injection.h"
#include "env/options.h"
#include "logging/log.h"
#include "nlohmann/json.hpp"
#include "tools/pseudo_random.h"
#include "tools/text_table.h"
#include "tpushim/stats.h"
#include "tpushim/system.h"
#include "tpushim/transfer.h"

namespace tpushim::tools {
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
reproducing it are printed.

Exit status: 0 when no invariant was violated (expected failures included);
1 on any violation; 2 for a bad command line or invalid configuration.

Examples:
  tpushim stress                                   # 10000 ops, 4 threads
  tpushim stress --ops 1000000 --threads 8 --seed 1
  tpushim stress --seconds 60 --faults 'dma:rate=0.01,seed=7'
  tpushim stress --ops 20000 --faults 'mmap:rate=0.01,seed=1;madvise:rate=0.01,seed=2;mlock:rate=0.01,seed=3;numa:rate=0.01,seed=4;alloc:rate=0.01,seed=5;dma:rate=0.01,seed=6;pin:rate=0.01,seed=7;log_open:rate=0.01,seed=8'
  tpushim stress --faults 'mmap:nth=1'             # start-up fails cleanly
  tpushim stress --ops 5000 --json | jq '.by_code, .violations')footer";

constexpr uint64_t kDefaultOps = 10000;
constexpr int kDefaultThreads = 4;
constexpr char kDefaultDevice[] = "sim://?devices=2&hbm=256M";
constexpr uint64_t kDefaultRegionBytes = uint64_t{64} << 20;
constexpr uint64_t kDefaultThresholdBytes = uint64_t{4} << 20;
constexpr uint64_t kMaxPinnedAlloc = uint64_t{2} << 20;
constexpr uint64_t kMaxSmallDeviceAlloc = uint64_t{1} << 20;
constexpr size_t kMaxOwnedPinned = 6;
constexpr size_t kMaxOwnedDevice = 8;
constexpr size_t kMaxPending = 48;
constexpr size_t kMaxViolationsKept = 50;
constexpr absl::Duration kHangBound = absl::Seconds(30);

// ---- Operations and codes ---------------------------------------------------

enum class Op : int {
  kAllocPinned = 0,
  kFreePinned,
  kAllocDevice,
  kFreeDevice,
  kH2D,
  kD2H,
  kD2D,
  kChain,
  kAwait,
};
constexpr int kOpCount = 9;
constexpr std::array<const char*, kOpCount> kOpNames = {
    "alloc_pinned", "free_pinned", "alloc_device", "free_device", "h2d",
    "d2h",          "d2d",         "chain",        "await"};
// Relative weights of the mix.
constexpr std::array<int, kOpCount> kOpWeights = {8, 7, 8, 7, 20, 15, 12, 13,
                                                  10};

// absl codes 0..16, then two pseudo-codes for by_op.
constexpr int kAbslCodes = 17;
constexpr int kSkipped = 17;
constexpr int kNotReady = 18;
constexpr int kCodeSlots = 19;

std::string CodeName(int code) {
  if (code == kSkipped) return "SKIPPED";
  if (code == kNotReady) return "NOT_READY";
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

int CodeIndex(const absl::Status& status) {
  const int c = static_cast<int>(status.code());
  return c >= 0 && c < kAbslCodes ? c : static_cast<int>(absl::StatusCode::kUnknown);
}

// ---- Data ---------------------------------------------------------------------

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

// ---- Configuration and results ---------------------------------------------

struct StressFlags {
  uint64_t ops = kDefaultOps;
  double seconds = 0;
  int threads = kDefaultThreads;
  uint64_t seed = 0;
  std::string faults;
  std::string region_bytes;
  std::string threshold;
  bool json = false;
  bool csv = false;
  bool no_progress = false;
  // Filled from the command line's counts.
  bool ops_given = false;
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
      for (int c = 0; c < kCodeSlots; ++c) by_op[i].codes[c] += o.by_op[i].codes[c];
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

// What the whole run shares: the system, the expected codes, callbacks.
struct Shared {
  System* system = nullptr;
  int devices = 1;
  uint64_t threshold = 0;
  bool faults = false;
  std::vector<absl::StatusCode> rule_codes;
  std::atomic<uint64_t> ops_done{0};
  std::atomic<bool> stop{false};
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

// ---- A worker -------------------------------------------------------------------

struct PinBuf {
  PinnedHostBuffer buf;
  Event busy;  // the one outstanding transfer using it
  // True from that transfer's submission until its event is reaped (its
  // bytes verified): only then may the buffer be reused or freed.
  bool in_use = false;
};

struct DevBuf {
  DeviceBuffer buf;
  Event last_write;
  std::vector<Event> reads;  // since the last write
  // What the last write put at [off, off + size): valid when known.
  bool valid = false;
  uint64_t off = 0;
  uint64_t size = 0;
  uint64_t hash = 0;
};

// An event whose status is still to be counted.
struct Pending {
  Event event;
  Op op = Op::kAwait;
  bool op_result = false;  // its status is the op's result in by_op
  Shared::Kind kind = Shared::Kind::kOperation;
  uint64_t op_index = 0;
  // Verification on OK: XXH3 of [dst, dst + size) must be `hash`.
  bool verify = false;
  const uint8_t* dst = nullptr;
  uint64_t size = 0;
  uint64_t hash = 0;
  std::shared_ptr<uint8_t[]> keep;   // pageable memory the transfer uses
  PinBuf* pin = nullptr;             // the pinned buffer it uses
};

Pending MakePending(Event event, bool op_result,
                    std::shared_ptr<uint8_t[]> keep = nullptr) {
  Pending p;
  p.event = std::move(event);
  p.op_result = op_result;
  p.keep = std::move(keep);
  return p;
}

Pending MakeVerified(Event event, const uint8_t* dst, uint64_t size,
                     uint64_t hash, bool verify,
                     std::shared_ptr<uint8_t[]> keep, PinBuf* pin) {
  Pending p = MakePending(std::move(event), true, std::move(keep));
  p.pin = pin;
  p.verify = verify;
  p.dst = dst;
  p.size = size;
  p.hash = hash;
  return p;
}

class Worker {
 public:
  Worker(Shared& shared, int index, uint64_t seed, uint64_t ops,
         std::optional<absl::Time> deadline)
      : s_(shared),
        index_(index),
        ops_(ops),
        deadline_(deadline),
        rng_() {
    std::seed_seq seq{seed & 0xffffffffu, seed >> 32,
                      static_cast<uint64_t>(index)};
    rng_.seed(seq);
    int total = 0;
    for (int w : kOpWeights) total += w;
    total_weight_ = total;
  }

  void Run();
  Counters& counters() { return c_; }

 private:
  Op DrawOp(uint64_t r) const {
    int x = static_cast<int>(r % static_cast<uint64_t>(total_weight_));
    for (int i = 0; i < kOpCount; ++i) {
      if (x < kOpWeights[i]) return static_cast<Op>(i);
      x -= kOpWeights[i];
    }
    return Op::kAwait;
  }

  void DoOp(Op op, const std::array<uint64_t, 6>& r);
  void AllocPinned(const std::array<uint64_t, 6>& r);
  void FreePinned(const std::array<uint64_t, 6>& r);
  void AllocDevice(const std::array<uint64_t, 6>& r);
  void FreeDevice(const std::array<uint64_t, 6>& r);
  void H2D(const std::array<uint64_t, 6>& r);
  void D2H(const std::array<uint64_t, 6>& r);
  void D2D(const std::array<uint64_t, 6>& r);
  void Chain(const std::array<uint64_t, 6>& r);
  void Await(const std::array<uint64_t, 6>& r);
  void Teardown();

  // Host memory of `size` bytes: an idle pinned buffer when `want_pinned`
  // and one fits (choice by `r`), else fresh pageable memory.
  struct Host {
    uint8_t* p = nullptr;
    PinBuf* pin = nullptr;
    std::shared_ptr<uint8_t[]> pageable;
  };
  Host GetHost(uint64_t size, bool want_pinned, uint64_t r,
               const PinBuf* exclude = nullptr);

  bool RecordUsable(DevBuf& b) {
    if (!b.valid) return false;
    if (b.last_write.IsReady() && !b.last_write.Await().ok()) b.valid = false;
    return b.valid;
  }
  static void AddDep(std::vector<Event>& deps, const Event& e) {
    if (!e.IsReady()) deps.push_back(e);
  }
  static void WriteDeps(DevBuf& b, std::vector<Event>& deps) {
    AddDep(deps, b.last_write);
    for (const Event& e : b.reads) AddDep(deps, e);
  }
  static void PruneReads(DevBuf& b) {
    std::erase_if(b.reads, [](const Event& e) { return e.IsReady(); });
  }

  // Counts a call's status; true when expected.
  bool Count(const absl::Status& s, Shared::Kind kind, absl::string_view what) {
    ++c_.by_code[CodeIndex(s)];
    if (s_.Expected(s, kind)) return true;
    Violate(absl::StrCat(what, ": unexpected status ", s.ToString()));
    return false;
  }
  void OpResult(int code) { ++c_.by_op[static_cast<int>(op_)].codes[code]; }
  void Violate(std::string message) {
    ++c_.violation_count;
    if (c_.violations.size() < kMaxViolationsKept) {
      c_.violations.push_back(Violation{index_, op_index_,
                                        kOpNames[static_cast<int>(op_)],
                                        std::move(message)});
    }
  }
  void AddPending(Pending p) {
    p.op_index = op_index_;
    p.op = op_;
    pending_.push_back(std::move(p));
  }
  // Counts and checks the pending events that are ready; with `wait`, waits
  // for each (at most kHangBound) first.
  void Reap(bool wait);
  void Finish(Pending& p, const absl::Status& s);

  Shared& s_;
  const int index_;
  const uint64_t ops_;
  const std::optional<absl::Time> deadline_;
  std::mt19937_64 rng_;
  int total_weight_ = 0;
  Counters c_;
  Op op_ = Op::kAwait;
  uint64_t op_index_ = 0;
  uint64_t fill_seed_ = 0;
  std::vector<std::unique_ptr<PinBuf>> pinned_;
  std::vector<DevBuf> device_;
  std::deque<Pending> pending_;
  // Memory of transfers that never became ready: never freed.
  std::vector<Pending> leaked_;
};

void Worker::Run() {
  fill_seed_ = (static_cast<uint64_t>(index_) << 48) ^ rng_();
  for (op_index_ = 0;; ++op_index_) {
    if (deadline_.has_value()) {
      if (s_.stop.load(std::memory_order_relaxed) ||
          absl::Now() >= *deadline_) {
        break;
      }
    } else if (op_index_ >= ops_) {
      break;
    }
    // A fixed number of draws per operation, whatever the state.
    const uint64_t kind = rng_();
    std::array<uint64_t, 6> r;
    for (uint64_t& x : r) x = rng_();
    op_ = DrawOp(kind);
    ++c_.by_op[static_cast<int>(op_)].count;
    DoOp(op_, r);
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
  Teardown();
}

void Worker::DoOp(Op op, const std::array<uint64_t, 6>& r) {
  switch (op) {
    case Op::kAllocPinned: return AllocPinned(r);
    case Op::kFreePinned: return FreePinned(r);
    case Op::kAllocDevice: return AllocDevice(r);
    case Op::kFreeDevice: return FreeDevice(r);
    case Op::kH2D: return H2D(r);
    case Op::kD2H: return D2H(r);
    case Op::kD2D: return D2D(r);
    case Op::kChain: return Chain(r);
    case Op::kAwait: return Await(r);
  }
}

void Worker::Finish(Pending& p, const absl::Status& s) {
  const uint64_t saved_index = op_index_;
  const Op saved_op = op_;
  op_index_ = p.op_index;
  op_ = p.op;
  Count(s, p.kind, absl::StrCat(kOpNames[static_cast<int>(p.op)], " event"));
  if (p.op_result) OpResult(CodeIndex(s));
  if (s.ok() && p.verify) {
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

Worker::Host Worker::GetHost(uint64_t size, bool want_pinned, uint64_t r,
                             const PinBuf* exclude) {
  Host h;
  if (want_pinned && !pinned_.empty()) {
    for (size_t k = 0; k < pinned_.size(); ++k) {
      PinBuf* b = pinned_[(r + k) % pinned_.size()].get();
      if (b != exclude && b->buf.size() >= size && !b->in_use) {
        h.pin = b;
        h.p = static_cast<uint8_t*>(b->buf.data());
        return h;
      }
    }
  }
  h.pageable = std::shared_ptr<uint8_t[]>(new uint8_t[std::max<uint64_t>(size, 1)]);
  h.p = h.pageable.get();
  return h;
}

void Worker::AllocPinned(const std::array<uint64_t, 6>& r) {
  if (pinned_.size() >= kMaxOwnedPinned) return OpResult(kSkipped);
  const uint64_t size = LogUniform(r[0], 1, kMaxPinnedAlloc);
  const size_t alignment = size_t{64} << (r[1] % 7);  // 64 .. 4096
  absl::StatusOr<PinnedHostBuffer> b =
      s_.system->AllocatePinnedHost(size, alignment);
  Count(b.status(), Shared::Kind::kAllocation, "AllocatePinnedHost");
  OpResult(CodeIndex(b.status()));
  if (!b.ok()) return;
  if (b->size() < size ||
      reinterpret_cast<uintptr_t>(b->data()) % alignment != 0) {
    Violate(absl::StrFormat(
        "AllocatePinnedHost(%d, %d) gave %d bytes at %p", size, alignment,
        b->size(), b->data()));
  }
  auto pin = std::make_unique<PinBuf>();
  pin->buf = *std::move(b);
  pinned_.push_back(std::move(pin));
}

void Worker::FreePinned(const std::array<uint64_t, 6>& r) {
  if (pinned_.empty()) return OpResult(kSkipped);
  const size_t i = r[0] % pinned_.size();
  PinBuf& b = *pinned_[i];
  if (b.in_use) {
    // Its transfer must finish and be checked first: wait for it
    // (bounded), then reap.
    if (!b.busy.AwaitWithTimeout(kHangBound).has_value()) {
      Violate("pinned buffer's transfer not ready within 30 s (hang)");
      OpResult(kNotReady);
      return;  // kept: memory may still be in use
    }
    Reap(/*wait=*/false);
    if (b.in_use) {
      Violate("pinned buffer still in use after its transfer was reaped");
      return OpResult(kNotReady);
    }
  }
  b.buf.Reset();
  pinned_.erase(pinned_.begin() + static_cast<std::ptrdiff_t>(i));
  OpResult(0);
}

void Worker::AllocDevice(const std::array<uint64_t, 6>& r) {
  if (device_.size() >= kMaxOwnedDevice) return OpResult(kSkipped);
  const int device = static_cast<int>(r[0] % static_cast<uint64_t>(s_.devices));
  uint64_t size;
  if (s_.threshold > 0 && r[1] % 8 == 0) {
    // Above the threshold: host transfers of all of it take the pinned path.
    size = Uniform(r[2], s_.threshold + 1, 2 * s_.threshold);
  } else {
    size = LogUniform(r[2], 1, kMaxSmallDeviceAlloc);
  }
  absl::StatusOr<DeviceBuffer> b = s_.system->AllocateDevice(device, size);
  Count(b.status(), Shared::Kind::kAllocation, "AllocateDevice");
  OpResult(CodeIndex(b.status()));
  if (!b.ok()) return;
  if (!b->valid() || b->size() != size || b->device() != device) {
    Violate(absl::StrFormat("AllocateDevice(%d, %d) gave %d bytes on %d",
                            device, size, b->size(), b->device()));
  }
  DevBuf d;
  d.buf = *std::move(b);
  device_.push_back(std::move(d));
}

void Worker::FreeDevice(const std::array<uint64_t, 6>& r) {
  if (device_.empty()) return OpResult(kSkipped);
  const size_t i = r[0] % device_.size();
  DevBuf& b = device_[i];
  std::vector<Event> deps;
  WriteDeps(b, deps);
  absl::StatusOr<Event> e = s_.system->Deallocate(b.buf, deps);
  if (!e.ok()) {
    Count(e.status(), Shared::Kind::kOperation, "Deallocate");
    OpResult(CodeIndex(e.status()));
    return;  // still owned
  }
  AddPending(MakePending(*e, true));
  device_.erase(device_.begin() + static_cast<std::ptrdiff_t>(i));
}

// Picks a size and offset for a transfer into a buffer of `capacity` bytes.
std::pair<uint64_t, uint64_t> SizeAndOffset(uint64_t capacity, uint64_t r1,
                                            uint64_t r2) {
  const uint64_t size = r1 % 8 == 0 ? capacity : LogUniform(r1 >> 3, 1, capacity);
  return {size, Uniform(r2, 0, capacity - size)};
}

HostBufferSemantics Semantics(uint64_t r) {
  return r % 2 == 0 ? HostBufferSemantics::kImmutableUntilTransferCompletes
                    : HostBufferSemantics::kImmutableOnlyDuringCall;
}

void Worker::H2D(const std::array<uint64_t, 6>& r) {
  if (device_.empty()) return OpResult(kSkipped);
  DevBuf& b = device_[r[0] % device_.size()];
  PruneReads(b);
  const auto [size, off] = SizeAndOffset(b.buf.size(), r[1], r[2]);
  Host h = GetHost(size, r[3] % 2 == 0, r[4]);
  FillPseudoRandom(h.p, size, ++fill_seed_);
  const uint64_t hash = Hash(h.p, size);
  const HostBufferSemantics sem = Semantics(r[3] >> 1);
  std::vector<Event> deps;
  WriteDeps(b, deps);
  absl::StatusOr<Event> e =
      s_.system->TransferToDevice(h.p, b.buf, off, size, deps, sem);
  if (!e.ok()) {
    Count(e.status(), Shared::Kind::kOperation, "TransferToDevice");
    OpResult(CodeIndex(e.status()));
    b.valid = false;
    return;
  }
  if (sem == HostBufferSemantics::kImmutableOnlyDuringCall) {
    // The engine is done with the source: overwriting it must not matter.
    std::memset(h.p, 0xA5, size);
  }
  b.last_write = *e;
  b.reads.clear();
  b.valid = true;
  b.off = off;
  b.size = size;
  b.hash = hash;
  Pending p = MakePending(*e, true, h.pageable);
  if (h.pin != nullptr) {
    h.pin->busy = *e;
    h.pin->in_use = true;
    p.pin = h.pin;
  }
  AddPending(std::move(p));
}

void Worker::D2H(const std::array<uint64_t, 6>& r) {
  if (device_.empty()) return OpResult(kSkipped);
  DevBuf& b = device_[r[0] % device_.size()];
  PruneReads(b);
  const bool verify = RecordUsable(b);
  uint64_t size, off;
  if (verify) {
    size = b.size;
    off = b.off;
  } else {
    std::tie(size, off) = SizeAndOffset(b.buf.size(), r[1], r[2]);
  }
  Host h = GetHost(size, r[3] % 2 == 0, r[4]);
  std::vector<Event> deps;
  AddDep(deps, b.last_write);
  const HostBufferSemantics sem = Semantics(r[3] >> 1);
  absl::StatusOr<Event> e =
      s_.system->TransferFromDevice(b.buf, off, h.p, size, deps, sem);
  if (!e.ok()) {
    Count(e.status(), Shared::Kind::kOperation, "TransferFromDevice");
    OpResult(CodeIndex(e.status()));
    return;
  }
  if (h.pin != nullptr) {
    h.pin->busy = *e;
    h.pin->in_use = true;
  }
  b.reads.push_back(*e);
  AddPending(MakeVerified(*e, h.p, size, b.hash, verify, h.pageable, h.pin));
}

void Worker::D2D(const std::array<uint64_t, 6>& r) {
  if (device_.size() < 2) return OpResult(kSkipped);
  const size_t i = r[0] % device_.size();
  const size_t j = (i + 1 + r[1] % (device_.size() - 1)) % device_.size();
  DevBuf& a = device_[i];
  DevBuf& b = device_[j];
  PruneReads(a);
  PruneReads(b);
  bool known = RecordUsable(a) && a.size <= b.buf.size();
  uint64_t size, src_off;
  if (known) {
    size = a.size;
    src_off = a.off;
  } else {
    // Unknown content (or it does not fit): copy a piece, unverified.
    std::tie(size, src_off) = SizeAndOffset(
        std::min(a.buf.size(), b.buf.size()), r[2], r[3]);
  }
  const uint64_t dst_off = Uniform(r[4], 0, b.buf.size() - size);
  std::vector<Event> deps;
  AddDep(deps, a.last_write);
  WriteDeps(b, deps);
  absl::StatusOr<Event> e = s_.system->TransferDeviceToDevice(
      a.buf, src_off, b.buf, dst_off, size, deps);
  if (!e.ok()) {
    Count(e.status(), Shared::Kind::kOperation, "TransferDeviceToDevice");
    OpResult(CodeIndex(e.status()));
    b.valid = false;
    return;
  }
  a.reads.push_back(*e);
  b.last_write = *e;
  b.reads.clear();
  b.valid = known;
  b.off = dst_off;
  b.size = size;
  b.hash = a.hash;
  AddPending(MakePending(*e, true));
}

void Worker::Chain(const std::array<uint64_t, 6>& r) {
  uint64_t size;
  if (s_.threshold > 0 && r[0] % 10 == 0) {
    size = Uniform(r[1], s_.threshold + 1, s_.threshold + s_.threshold / 2);
  } else {
    size = LogUniform(r[1], 1, kMaxSmallDeviceAlloc);
  }
  const int da = static_cast<int>(r[2] % static_cast<uint64_t>(s_.devices));
  const int db =
      static_cast<int>((r[2] >> 8) % static_cast<uint64_t>(s_.devices));
  const uint64_t slack_a = (r[3] & 0xfff), slack_b = ((r[3] >> 12) & 0xfff);
  absl::StatusOr<DeviceBuffer> a = s_.system->AllocateDevice(da, size + slack_a);
  Count(a.status(), Shared::Kind::kAllocation, "AllocateDevice");
  if (!a.ok()) return OpResult(CodeIndex(a.status()));
  absl::StatusOr<DeviceBuffer> b = s_.system->AllocateDevice(db, size + slack_b);
  Count(b.status(), Shared::Kind::kAllocation, "AllocateDevice");
  auto free_now = [this](const DeviceBuffer& buf, std::vector<Event> deps) {
    absl::StatusOr<Event> e = s_.system->Deallocate(buf, deps);
    if (!e.ok()) {
      Count(e.status(), Shared::Kind::kOperation, "Deallocate");
    } else {
      AddPending(MakePending(*e, false));
    }
  };
  if (!b.ok()) {
    free_now(*a, {});
    return OpResult(CodeIndex(b.status()));
  }
  const uint64_t off_a = Uniform(r[4], 0, slack_a);
  const uint64_t off_b = Uniform(r[4] >> 16, 0, slack_b);
  Host src = GetHost(size, r[5] % 2 == 0, r[5] >> 8);
  Host dst = GetHost(size, (r[5] >> 1) % 2 == 0, r[5] >> 16, src.pin);
  FillPseudoRandom(src.p, size, ++fill_seed_);
  const uint64_t hash = Hash(src.p, size);
  const HostBufferSemantics sem_up = Semantics(r[5] >> 2);
  const HostBufferSemantics sem_down = Semantics(r[5] >> 3);

  absl::StatusOr<Event> up =
      s_.system->TransferToDevice(src.p, *a, off_a, size, {}, sem_up);
  if (!up.ok()) {
    Count(up.status(), Shared::Kind::kOperation, "TransferToDevice");
    free_now(*a, {});
    free_now(*b, {});
    return OpResult(CodeIndex(up.status()));
  }
  if (sem_up == HostBufferSemantics::kImmutableOnlyDuringCall) {
    std::memset(src.p, 0x5A, size);
  }
  {
    Pending p = MakePending(*up, false, src.pageable);
    if (src.pin != nullptr) {
      src.pin->busy = *up;
      src.pin->in_use = true;
      p.pin = src.pin;
    }
    AddPending(std::move(p));
  }

  const Event up_e = *up;
  absl::StatusOr<Event> across =
      s_.system->TransferDeviceToDevice(*a, off_a, *b, off_b, size, {&up_e, 1});
  if (!across.ok()) {
    Count(across.status(), Shared::Kind::kOperation, "TransferDeviceToDevice");
    free_now(*a, {up_e});
    free_now(*b, {});
    return OpResult(CodeIndex(across.status()));
  }
  AddPending(MakePending(*across, false));
  free_now(*a, {*across});

  const Event across_e = *across;
  absl::StatusOr<Event> down = s_.system->TransferFromDevice(
      *b, off_b, dst.p, size, {&across_e, 1}, sem_down);
  if (!down.ok()) {
    Count(down.status(), Shared::Kind::kOperation, "TransferFromDevice");
    free_now(*b, {across_e});
    return OpResult(CodeIndex(down.status()));
  }
  if (dst.pin != nullptr) {
    dst.pin->busy = *down;
    dst.pin->in_use = true;
  }
  AddPending(MakeVerified(*down, dst.p, size, hash, true, dst.pageable,
                          dst.pin));
  free_now(*b, {*down});
}

void Worker::Await(const std::array<uint64_t, 6>& r) {
  if (pending_.empty()) return OpResult(kSkipped);
  const Event e = pending_[r[0] % pending_.size()].event;
  switch (r[1] % 3) {
    case 0: {
      std::optional<absl::Status> st = e.AwaitWithTimeout(kHangBound);
      if (!st.has_value()) {
        Violate("event not ready within 30 s (hang)");
        return OpResult(kNotReady);
      }
      return OpResult(CodeIndex(*st));
    }
    case 1: {
      std::optional<absl::Status> st =
          e.AwaitWithTimeout(absl::Microseconds(r[2] % 200));
      return OpResult(st.has_value() ? CodeIndex(*st) : kNotReady);
    }
    default: {
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
  op_index_ = ops_ > 0 && !deadline_.has_value() ? ops_ - 1 : op_index_;
  op_ = Op::kAwait;
  Reap(/*wait=*/true);
  for (auto& p : pinned_) {
    if (p->in_use) {
      Violate("pinned buffer's transfer not ready within 30 s at teardown");
      p->buf = PinnedHostBuffer();  // must not be freed: leak it
      continue;
    }
    p->buf.Reset();
  }
  pinned_.clear();
  for (DevBuf& b : device_) {
    std::vector<Event> deps;
    WriteDeps(b, deps);
    absl::StatusOr<Event> e = s_.system->Deallocate(b.buf, deps);
    if (!e.ok()) {
      Count(e.status(), Shared::Kind::kOperation, "Deallocate");
      continue;
    }
    op_ = Op::kFreeDevice;
    AddPending(MakePending(*e, false));
  }
  device_.clear();
  Reap(/*wait=*/true);
}

// ---- Teardown checks ---------------------------------------------------------

std::vector<std::string> StatsFailures(const SystemStats& s) {
  std::vector<std::string> f;
  auto check = [&f](bool ok, std::string what) {
    if (!ok) f.push_back(std::move(what));
  };
  if (s.region.enabled) {
    check(s.region.bytes_in_use == 0,
          absl::StrCat("region bytes_in_use = ", s.region.bytes_in_use));
    check(s.region.live_allocations == 0,
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
  check(t.device_buffers_live == 0,
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

// ---- Progress ------------------------------------------------------------------

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
      frac = elapsed / std::max(1e-9, absl::ToDoubleSeconds(*deadline_ - start_));
    } else {
      frac = total_ > 0 ? static_cast<double>(done) / static_cast<double>(total_)
                        : 1.0;
    }
    frac = std::clamp(frac, 0.0, 1.0);
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(frac * kWidth);
    std::string bar(static_cast<size_t>(filled), '#');
    bar.append(static_cast<size_t>(kWidth - filled), '.');
    std::fprintf(stderr, "\r\033[Kstress [%s] %3.0f%% %llu ops, %.0f ops/s",
                 bar.c_str(), frac * 100,
                 static_cast<unsigned long long>(done),
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

// ---- Output ----------------------------------------------------------------------

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
  std::string reproduce_all;
  bool minimal_reproduction = false;

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
}

void PrintHuman(const Report& r, std::ostream& out) {
  out << "tpushim stress: seed " << r.seed << ", " << r.counters.ops
      << " ops on " << r.threads << " threads in "
      << absl::StrFormat("%.2f s (%.0f ops/s)", r.seconds,
                         r.seconds > 0 ? static_cast<double>(r.counters.ops) /
                                             r.seconds
                                       : 0.0)
      << "\n";
  TextTable setup;
  setup.AddRow({"device", r.device});
  setup.AddRow({"premapped region",
                absl::StrCat(HumanReadableBytes(r.region_bytes), ", threshold ",
                             HumanReadableBytes(r.threshold_bytes))});
  setup.AddRow({"faults", r.faults.empty() ? "none" : r.faults});
  setup.AddRow({"start-up",
                r.startup.ok() ? std::string("OK")
                               : absl::StrCat(r.startup_expected
                                                  ? "failed as expected: "
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
      for (int c : cols) row.push_back(absl::StrCat(r.counters.by_op[i].codes[c]));
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
    checks.AddRow({"bytes verified",
                   absl::StrCat(BytesWithHumanReadable(r.counters.bytes_verified),
                                " in ", r.counters.transfers_verified,
                                " transfers")});
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
      out << "  ... " << r.counters.violation_count - r.counters.violations.size()
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
}

// ---- The command -------------------------------------------------------------

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

void RunStress(StressFlags flags, CommandContext& context) {
  auto usage = [&](const absl::Status& s) {
    ReportError(s, "invalid configuration", flags.json, kExitUsage, context);
  };
  absl::StatusOr<Options> options = ResolveOptions(*context.os);
  if (!options.ok()) return usage(options.status());

  Report report;
  report.threads = flags.threads;
  report.seed = flags.seed_given
                    ? flags.seed
                    : static_cast<uint64_t>(
                          absl::ToUnixNanos(absl::Now()) & 0xffffffffffff);

  OptionOverrides overrides;
  if (options->device.source == OptionSource::kDefault) {
    overrides.device = kDefaultDevice;
  }
  const bool region_default =
      options->premapped_buffer_size.source == OptionSource::kDefault;
  if (!flags.region_bytes.empty()) {
    absl::StatusOr<uint64_t> b = ParseByteSize(flags.region_bytes, "--region-bytes");
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
    overrides.premapped_buffer_transfer_threshold_bytes = kDefaultThresholdBytes;
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
  report.threshold_bytes = resolved->premapped_buffer_transfer_threshold_bytes.value;

  Shared shared;
  shared.faults = !resolved->faults.value.empty();
  for (const FaultRule& rule : resolved->faults.value.rules) {
    if (rule.code.has_value()) shared.rule_codes.push_back(*rule.code);
  }

  FaultInjectingOs& os = TrackingOs(context.os);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<System>> system =
      SystemFactory::Create(overrides, &os);
  if (!system.ok()) {
    report.startup = system.status();
    if (absl::IsInvalidArgument(system.status()) &&
        !absl::StrContains(system.status().message(), "[injected: ")) {
      return usage(system.status());
    }
    report.startup_expected =
        shared.faults &&
        absl::StrContains(system.status().message(), "[injected: ");
    report.teardown_checked = true;
    report.teardown_failures = OsFailures(os);
  } else {
    report.threshold_bytes = (*system)->transfer_threshold_bytes();
    shared.system = system->get();
    shared.devices = (*system)->device_count();
    shared.threshold = report.threshold_bytes;
    LOG(INFO) << "tpushim stress: seed " << report.seed << ", "
              << (flags.seconds_given ? absl::StrCat(flags.seconds, " s")
                                      : absl::StrCat(flags.ops, " ops"))
              << ", " << flags.threads << " threads, faults \""
              << report.faults << "\"";

    std::optional<absl::Time> deadline;
    if (flags.seconds_given) deadline = start + absl::Seconds(flags.seconds);
    std::vector<std::unique_ptr<Worker>> workers;
    for (int t = 0; t < flags.threads; ++t) {
      const uint64_t share =
          flags.ops / static_cast<uint64_t>(flags.threads) +
          (static_cast<uint64_t>(t) < flags.ops % static_cast<uint64_t>(flags.threads)
               ? 1
               : 0);
      workers.push_back(
          std::make_unique<Worker>(shared, t, report.seed, share, deadline));
    }
    {
      Progress progress(!flags.no_progress && isatty(2) == 1, shared,
                        flags.seconds_given ? 0 : flags.ops, deadline, start);
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
  report.reproduce = ReproCommand(flags, report.seed,
                                  std::min(repro_ops, std::max<uint64_t>(
                                                          report.counters.ops,
                                                          flags.seconds_given
                                                              ? repro_ops
                                                              : flags.ops)),
                                  report.faults);

  if (flags.json) {
    WriteJson(ReportJson(report), *context.out);
  } else if (flags.csv) {
    WriteCsv(report, *context.out);
  } else {
    PrintHuman(report, *context.out);
  }
  if (report.violations() > 0) {
    *context.err << "tpushim stress: " << report.violations()
                 << " invariant violations; seed " << report.seed
                 << "; reproduce with: " << report.reproduce << "\n";
    context.exit_code = kExitFailure;
  } else {
    context.exit_code = kExitOk;
  }
}

}  // namespace

void RegisterStressCommand(CLI::App& app, CommandContext& context) {
  CLI::App* stress = app.add_subcommand("stress", kStressDescription);
  stress->footer(kStressFooter);
  auto flags = std::make_shared<StressFlags>();
  CLI::Option* ops =
      stress->add_option("--ops", flags->ops, "Operations to run in total")
          ->default_val(kDefaultOps)
          ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 40));
  CLI::Option* seconds =
      stress->add_option("--seconds", flags->seconds,
                         "Run for this many seconds instead of --ops")
          ->check(CLI::Range(0.001, 7.0 * 24 * 3600));
  ops->excludes(seconds);
  stress->add_option("--threads", flags->threads, "Worker threads")
      ->default_val(kDefaultThreads)
      ->check(CLI::Range(1, 256));
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
  stress->add_option("--region-bytes", flags->region_bytes,
                     "Premapped region size (K/M/G; default: "
                     "TPU_PREMAPPED_BUFFER_SIZE, else 64M)")
      ->check(byte_size("--region-bytes"));
  stress->add_option("--threshold", flags->threshold,
                     "Transfer threshold (K/M/G; default: "
                     "TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES, else 4M "
                     "with the default region)")
      ->check(byte_size("--threshold"));
  CLI::Option* json = stress->add_flag(
      "--json", flags->json, "Print one JSON object instead of tables");
  CLI::Option* csv =
      stress->add_flag("--csv", flags->csv, "Print CSV rows instead of tables");
  json->excludes(csv);
  stress->add_flag("--no-progress", flags->no_progress,
                   "No progress bar on stderr (there is none unless stderr "
                   "is a terminal)");
  stress->callback([flags, ops, seconds, seed, faults, &context] {
    flags->ops_given = ops->count() > 0;
    flags->seconds_given = seconds->count() > 0;
    flags->seed_given = seed->count() > 0;
    flags->faults_given = faults->count() > 0;
    RunStress(*flags, context);
  });
}

}  // namespace tpushim::tools
