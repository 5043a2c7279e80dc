// The record of a `tpushim stress` run (--record FILE / --replay FILE): the
// run's configuration and every operation its workers issued, in the order
// they issued them, with all the parameters the generator drew, so that a
// replay needs neither the seed nor the generator. Also the vocabulary the
// run and its record share: operation kinds, result codes and the
// generator's limits.
//
// File format: JSON lines (UTF-8). Line 1 is the header:
//   {"format": "tpushim-stress-record", "version": 1, "tpushim": "0.1.0",
//    "config": {"seed": 11, "threads": 4, "ops": 2000, "seconds": null,
//               "faults": "", "device": "sim://?devices=2&hbm=256M",
//               "region_bytes": 67108864, "threshold_bytes": 4194304},
//    "lines": 2004}
// ("ops" is null for a --seconds run, "seconds" for an --ops run; "lines"
// counts the lines after the header, so a truncated file is recognised).
// Then one line per operation, in the global order of their sequence
// numbers ("seq", strictly increasing; a worker takes the next number just
// before the operation's first call into the runtime):
//   {"seq": 7, "thread": 1, "index": 3, "op": "h2d", <parameters>,
//    "result": "OK"}
// "index" counts the thread's operations from 0. "result" is what the run
// counted for the operation in "by_op": a status code name, SKIPPED (it did
// not apply; then there are no parameters) or NOT_READY (a timed await that
// timed out); null when it never finished (its event hung). Parameters:
//   alloc_pinned   "size", "alignment"
//   free_pinned    "pinned"
//   alloc_device   "device", "size"
//   free_device    "buffer", "wait_for"
//   h2d            "buffer", "offset", "size", "host", "semantics",
//                  "fill_seed", "wait_for"
//   d2h            "buffer", "offset", "size", "host", "semantics",
//                  "wait_for"
//   d2d            "src", "src_offset", "dst", "dst_offset", "size",
//                  "wait_for"
//   chain          "size", "devices": [a, b], "slack": [a, b],
//                  "offsets": [a, b], "hosts": [source, destination],
//                  "semantics": [up, down], "fill_seed"
//   await          "event", "mode" (blocking | timed | callback),
//                  "timeout_us" (timed only)
// A buffer is named by the "seq" of the operation of the same thread that
// allocated it ("pinned", "buffer", "src", "dst"); a chain allocates its
// two device buffers of size + slack on devices a and b and transfers at
// the offsets into them. An event is named [seq, call]: the operation that
// produced it and which of its calls (0 for the one call of free_device,
// h2d, d2h and d2d; a chain's are enum ChainCall). "wait_for" lists the
// events the call was given; the operation's other dependencies (a write
// follows the buffer's last write and its reads since, a read its last
// write) had completed when it issued. "host" is "pageable" (fresh memory)
// or {"pinned": seq}; "semantics" is "until_completes" or "during_call"
// (HostBufferSemantics); the bytes sent are FillPseudoRandom(fill_seed).
// Each thread ends with {"seq", "thread", "index", "op": "teardown"}: it
// frees what it still owns (its index is its operation count).
//
// Thread-safety: pure functions over values.

#ifndef TPUSHIM_TOOLS_STRESS_RECORD_H_
#define TPUSHIM_TOOLS_STRESS_RECORD_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tpushim::tools::stress_internal {

// ---- What the run and its record share -------------------------------------

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
inline constexpr int kOpCount = 9;
inline constexpr std::array<const char*, kOpCount> kOpNames = {
    "alloc_pinned", "free_pinned", "alloc_device", "free_device", "h2d",
    "d2h",          "d2d",         "chain",        "await"};

// Result codes: absl codes 0..16, then pseudo-codes (see "result" above).
inline constexpr int kAbslCodes = 17;
inline constexpr int kSkipped = 17;
inline constexpr int kNotReady = 18;
inline constexpr int kCodeSlots = 19;
inline constexpr int kNoResult = -1;
// "OK", ..., "SKIPPED", "NOT_READY". REQUIRES: 0 <= code < kCodeSlots.
std::string CodeName(int code);

// The generator's limits, which a replayed record must respect too.
inline constexpr uint64_t kMaxPinnedAlloc = uint64_t{2} << 20;
inline constexpr uint64_t kMinPinnedAlignment = 64;
inline constexpr uint64_t kMaxPinnedAlignment = 4096;
// Device buffers are at most this, or twice the threshold when that is
// more (so host transfers of a whole buffer take the pinned path).
inline constexpr uint64_t kMaxSmallDeviceAlloc = uint64_t{1} << 20;
// A chain moves at most kMaxSmallDeviceAlloc, or 1.5 thresholds.
inline constexpr uint64_t kMaxChainSlack = 0xfff;
inline constexpr uint64_t kMaxTimedAwaitMicros = 199;
inline constexpr int kMaxThreads = 256;

// The calls of a chain that produce events, in the order a chain makes them.
enum class ChainCall : int {
  kUp = 0,
  kAcross,
  kDown,
  kFreeSource,
  kFreeDestination
};
inline constexpr int kMaxCallsPerOp = 5;

// An event, named by the operation that produced it and which of its calls.
struct EventRef {
  uint64_t seq = 0;
  int call = 0;
  friend bool operator==(const EventRef&, const EventRef&) = default;
};

enum class Semantics : int { kUntilCompletes = 0, kDuringCall };

// Where an operation's host memory comes from: a pinned host buffer (named
// by the seq of its alloc_pinned), else fresh pageable memory.
struct HostMemory {
  std::optional<uint64_t> pinned;
  friend bool operator==(const HostMemory&, const HostMemory&) = default;
};

enum class AwaitMode : int { kBlocking = 0, kTimed, kCallback };

// One operation as issued. Which fields apply depends on `op` (see the
// format above); the others stay zero. A chain's "source" fields are its
// first buffer's, the "dst_" ones its second's.
struct RecordedOp {
  uint64_t seq = 0;
  int thread = 0;
  uint64_t index = 0;
  Op op = Op::kAwait;
  int result = kNoResult;  // a code slot; kSkipped: no parameters

  uint64_t buffer = 0;      // pinned (free_pinned), device (free_device, h2d,
                            // d2h), source (d2d)
  uint64_t dst_buffer = 0;  // d2d
  int device = 0;           // alloc_device; chain: a
  int dst_device = 0;       // chain: b
  uint64_t size = 0;
  uint64_t alignment = 0;   // alloc_pinned
  uint64_t offset = 0;      // h2d, d2h; d2d, chain: source
  uint64_t dst_offset = 0;  // d2d, chain
  uint64_t slack = 0;       // chain
  uint64_t dst_slack = 0;   // chain
  HostMemory host;          // h2d, d2h; chain: source
  HostMemory dst_host;      // chain
  Semantics semantics = Semantics::kUntilCompletes;      // h2d, d2h; chain: up
  Semantics dst_semantics = Semantics::kUntilCompletes;  // chain: down
  uint64_t fill_seed = 0;                                // h2d, chain
  std::vector<EventRef> wait_for;  // free_device, h2d, d2h, d2d
  EventRef event;                  // await
  AwaitMode mode = AwaitMode::kBlocking;
  uint64_t timeout_us = 0;  // timed await

  bool skipped() const { return result == kSkipped; }
};

// How the recorded run was configured: everything a replay sets up again.
struct StressConfig {
  uint64_t seed = 0;
  int threads = 1;
  std::optional<uint64_t> ops;    // --ops, or
  std::optional<double> seconds;  // --seconds
  std::string faults;             // the TPUSHIM_FAULTS spec in effect
  std::string device;             // the device URL in effect
  uint64_t region_bytes = 0;
  uint64_t threshold_bytes = 0;  // the system's transfer threshold
};

// One worker's part of the record.
struct ThreadRecord {
  std::vector<RecordedOp> ops;  // by index
  // The seq of its teardown; nullopt when the run never started (start-up
  // failed).
  std::optional<uint64_t> teardown_seq;
};

struct StressRecord {
  std::string tpushim_version;
  StressConfig config;
  std::vector<ThreadRecord> threads;  // config.threads of them
};

inline constexpr int kStressRecordVersion = 1;

// Writes `record` in the format above, in chunks of about 1 MiB, each
// through `write`; stops at, and returns, the first failure of `write`.
absl::Status WriteStressRecord(
    const StressRecord& record,
    absl::FunctionRef<absl::Status(absl::string_view)> write);

// Parses and checks a record: the JSON, every field's type and range, the
// order (seq strictly increasing; each thread's indices 0, 1, ... then its
// teardown), that every buffer or event named is one the same thread made
// earlier with an operation of the right kind and that every transfer fits
// its buffers, and the line count of the header. INVALID_ARGUMENT naming
// the line and the problem ("... is truncated ..." when lines are missing or
// the last is cut); UNIMPLEMENTED for another format version.
absl::StatusOr<StressRecord> ParseStressRecord(absl::string_view text);

// ---- Parts of a record (--shrink) ------------------------------------------

// The seqs of the operations of `record` (teardowns aside), sorted; without
// `skipped`, those whose result is SKIPPED are left out (they call nothing).
std::vector<uint64_t> OperationSeqs(const StressRecord& record, bool skipped);

// The consistent part of `record` made of the operations whose seq is in
// `keep` (sorted), less every one that names a buffer or event of an
// operation not in it: dropping an allocation drops the operations that use
// its buffer (and the awaits of their events), dropping an await's
// operation drops the await. A "wait_for" keeps only the events of
// operations still there; each thread's operations are numbered again from
// 0; every teardown stays. The result writes and parses like a recorded
// run, and replays as one.
StressRecord SubsetRecord(const StressRecord& record,
                          const std::vector<uint64_t>& keep);

// The operations that operation `seq` needs through its arguments, itself
// included, sorted: the allocations of the buffers it names; for one that
// reads a device buffer (d2h, the source of a d2d), the last earlier
// operation of its thread that wrote it (h2d, d2d), and what that one
// needs in turn; for an await, the operation that made its event. Empty
// when `seq` is no operation of `record`.
std::vector<uint64_t> DependencySlice(const StressRecord& record, uint64_t seq);

}  // namespace tpushim::tools::stress_internal

#endif  // TPUSHIM_TOOLS_STRESS_RECORD_H_
