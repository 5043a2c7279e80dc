#include "tools/stress/stress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "driver/system_internal.h"
#include "env/fault_injection.h"
#include "env/options.h"
#include "logging/log.h"
#include "nlohmann/json.hpp"
#include "tools/cli/flags.h"
#include "tools/cli/interrupt.h"
#include "tools/stress/internal.h"
#include "tools/stress/processes.h"
#include "tools/stress/record.h"
#include "tools/stress/report.h"
#include "tools/stress/shrink.h"
#include "tools/stress/worker.h"
#include "tpushim/stats.h"
#include "tpushim/system.h"
#include "tpushim/transfer.h"

// The implementation lives in the module's internal namespace, next to
// its record format (tools/stress/record.h) and test seam
// (tools/stress/internal.h).
namespace tpushim::tools {
namespace stress_internal {
namespace {

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
any code= of a rule, or a status marked "[injected: ...]"; with the region
off, pinned host allocations fail with FAILED_PRECONDITION and nothing
else); every event is awaited within 30 s. At the end every buffer is
freed, the system's stats must reconcile to zero (region, queues, pinned
bytes, HBM) and, once it is destroyed, nothing may stay mapped, locked or
pinned.

Stress defaults (when the environment does not set them): TPUSHIM_DEVICE
sim://?devices=2&hbm=256M, a 64M premapped region with a 4M transfer
threshold, so transfers take all three paths (zero-copy from pinned host
buffers, staged up to the threshold, pinned above it). --region-bytes and
--threshold override the environment: the region is whole 4K pages (a
multiple of 4096 bytes), 0 for no region; the threshold is at least 1
while there is a region, and one above the region is clamped to it.
--faults wins over TPUSHIM_FAULTS; a start-up that fails with an injected
fault (e.g. --faults 'mmap:nth=1') is an expected, clean failure. Any
other failed start-up (e.g. a region the host cannot hold) is an error,
printed with its code ("tpushim: cannot start the runtime:
RESOURCE_EXHAUSTED: ..."), exit 1. Unless TPU_STDERR_LOG_LEVEL is set, only
FATAL log lines go to stderr (expected failures are logged at ERROR, to the
log files in TPU_LOG_DIR).

Output: tables of operations by status code and the checks; --json one
object, --csv rows section,name,code,count. A progress bar goes to stderr
when it is a terminal. On a violation the seed and the shortest prefix of
the run that reaches it (--seed and --ops; with several threads timing may
change what it meets) are printed; with --record also the commands that
replay and shrink the record.

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

--replay FILE --shrink SMALL finds the fewest operations of the record that
still produce its first violation (the same violation: one of the same
operation kind whose message is of the same kind, i.e. equal up to its
first colon, or up to the code of an "unexpected status", with numbers
left out). It replays subsets of the record in this process, each in a
fresh system: first what the violating operation needs by its arguments,
then the operations up to it, then delta debugging (ddmin) until no single
operation can go or --shrink-seconds (default 60) have passed, which the
output then says. An operation whose buffer's allocation or event's
operation is dropped is dropped too. It writes SMALL, a record like any
other, and replays it once more to check that it reproduces the violation.
Exit 0 when it does; 1 when it does not, when the record replays without
a violation (nothing to shrink) or SMALL cannot be written.

Many processes: --processes N runs N such stress processes at once on one
simulated host of N chips (sim://?devices=N), process i on host chip i
(TPU_VISIBLE_CHIPS=i), each for --seconds (default 3) with --threads
threads, and kills --kills of them (default half) with SIGKILL at random
moments. A killed process's chip must be free again within 100 ms, the
others must end without an error or violation, and no chip may stay held.
It prints each process's outcome and how long each killed chip took to be
free. Exit 1 when any of that fails.

Exit status: 0 when no invariant was violated (expected failures included);
1 on any violation, or when the runtime cannot start; 2 for a bad command
line or invalid configuration.

Examples:
  tpushim stress                                   # 10000 ops, 4 threads
  tpushim stress --ops 1000000 --threads 8 --seed 1
  tpushim stress --seconds 60 --faults 'dma:rate=0.01,seed=7'
  tpushim stress --ops 20000 --faults 'mmap:rate=0.01,seed=1;madvise:rate=0.01,seed=2;mlock:rate=0.01,seed=3;numa:rate=0.01,seed=4;alloc:rate=0.01,seed=5;dma:rate=0.01,seed=6;pin:rate=0.01,seed=7;log_open:rate=0.01,seed=8'
  tpushim stress --faults 'mmap:nth=1'             # start-up fails cleanly
  tpushim stress --ops 20000 --record run.jsonl    # then, after a violation:
  tpushim stress --replay run.jsonl                # the same calls, in order
  tpushim stress --replay run.jsonl --shrink run.small.jsonl   # fewest ops
  tpushim stress --ops 5000 --json | jq '.by_code, .violations'
  tpushim stress --processes 4 --seconds 2 --seed 1   # 4 processes, 2 killed)footer";

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

// The command that shrinks the record `file` (--shrink), writing next to it.
std::string ShrinkCommand(const std::string& file) {
  std::string shrunk = file;
  if (absl::EndsWith(shrunk, ".jsonl")) {
    shrunk.resize(shrunk.size() - 6);
    shrunk += ".small.jsonl";
  } else {
    shrunk += ".small";
  }
  return absl::StrCat("tpushim stress --replay ", ShellQuote(file),
                      " --shrink ", ShellQuote(shrunk));
}

// ---- Configuration ---------------------------------------------------------

// How a run starts its system, and what it expects to fail.
struct RunConfig {
  OptionOverrides overrides;
  bool faults = false;
  bool region = true;
  std::vector<absl::StatusCode> rule_codes;
};

// --region-bytes, a byte size the flag's parser accepted: the runtime takes
// whole 4 KiB pages, or 0 for no region.
absl::StatusOr<uint64_t> RegionBytesFlag(const std::string& text) {
  TPUSHIM_ASSIGN_OR_RETURN(const uint64_t bytes,
                           ParseByteSize(text, "--region-bytes"));
  const uint64_t below = bytes - bytes % kPremappedSizeMultiple;
  if (below == bytes) return bytes;
  std::string message = absl::StrCat(
      "--region-bytes must be a multiple of ", kPremappedSizeMultiple,
      " bytes (4 KiB pages), got \"", text, "\"");
  if (text != absl::StrCat(bytes)) {
    absl::StrAppend(&message, " (", bytes, " bytes)");
  }
  if (below > std::numeric_limits<uint64_t>::max() - kPremappedSizeMultiple) {
    absl::StrAppend(&message, "; the nearest valid value is ", below);
  } else {
    absl::StrAppend(&message, "; the nearest valid values are ", below, " and ",
                    below + kPremappedSizeMultiple);
  }
  absl::StrAppend(&message, "; 0 turns the region off");
  return absl::InvalidArgumentError(message);
}

// --threshold, a byte size the flag's parser accepted, with a region of
// `region_bytes`. Above the region it is clamped to it, as the runtime
// does.
absl::StatusOr<uint64_t> ThresholdFlag(const std::string& text,
                                       uint64_t region_bytes) {
  TPUSHIM_ASSIGN_OR_RETURN(const uint64_t bytes,
                           ParseByteSize(text, "--threshold"));
  if (bytes > 0 || region_bytes == 0) return bytes;
  return absl::InvalidArgumentError(absl::StrCat(
      "--threshold must be at least 1 byte while the premapped region is on "
      "(it is the largest allocation from the region, and host transfers "
      "above it take the pinned path), got \"",
      text, "\""));
}

// Fills `config` and the configuration fields of `report` (faults, device,
// region, threshold) from the flags and `options` (the environment); a
// replay's device is the recorded one. INVALID_ARGUMENT for a bad
// --region-bytes or --threshold, or a setting the runtime refuses.
absl::Status Configure(const StressFlags& flags, const Options& options,
                       const StressRecord* replay, Os& os, RunConfig& config,
                       Report& report) {
  OptionOverrides& overrides = config.overrides;
  if (replay != nullptr) {
    overrides.device = replay->config.device;
  } else if (options.device.source == OptionSource::kDefault) {
    overrides.device = kDefaultDevice;
  }
  const bool region_default =
      options.premapped_buffer_size.source == OptionSource::kDefault;
  if (!flags.region_bytes.empty()) {
    TPUSHIM_ASSIGN_OR_RETURN(overrides.premapped_buffer_size,
                             RegionBytesFlag(flags.region_bytes));
  } else if (region_default) {
    overrides.premapped_buffer_size = kDefaultRegionBytes;
  }
  if (!flags.threshold.empty()) {
    TPUSHIM_ASSIGN_OR_RETURN(
        overrides.premapped_buffer_transfer_threshold_bytes,
        ThresholdFlag(flags.threshold,
                      overrides.premapped_buffer_size.value_or(
                          options.premapped_buffer_size.value)));
  } else if (region_default && flags.region_bytes.empty() &&
             options.premapped_buffer_transfer_threshold_bytes.source ==
                 OptionSource::kDefault) {
    overrides.premapped_buffer_transfer_threshold_bytes =
        kDefaultThresholdBytes;
  }
  if (flags.faults_given) overrides.faults = flags.faults;
  // Expected failures are logged at ERROR; keep them in the log files, off
  // the terminal, unless TPU_STDERR_LOG_LEVEL says otherwise.
  if (options.stderr_log_level.source == OptionSource::kDefault) {
    overrides.stderr_log_level = 3;
  }
  // Resolve once more to validate what the flags set and learn the faults.
  TPUSHIM_ASSIGN_OR_RETURN(const Options resolved,
                           ResolveOptions(os, overrides));
  report.faults = resolved.faults.value.text;
  report.device = resolved.device.value.text;
  report.region_bytes = resolved.premapped_buffer_size.value;
  report.threshold_bytes =
      resolved.premapped_buffer_transfer_threshold_bytes.value;
  config.faults = !resolved.faults.value.empty();
  config.region = resolved.premapped_region_enabled();
  for (const FaultRule& rule : resolved.faults.value.rules) {
    if (rule.code.has_value()) config.rule_codes.push_back(*rule.code);
  }
  return absl::OkStatus();
}

// ---- One run ---------------------------------------------------------------

// How a failed start-up counts: an invalid configuration (exit 2), the
// expected, clean failure an injected fault causes (a report, exit 0), or
// the runtime cannot start here (exit 1).
enum class StartupFailure { kInvalid, kInjected, kCannotStart };

StartupFailure ClassifyStartup(const absl::Status& status, bool faults) {
  const bool injected = absl::StrContains(status.message(), "[injected: ");
  if (injected && faults) return StartupFailure::kInjected;
  if (absl::IsInvalidArgument(status) && !injected) {
    return StartupFailure::kInvalid;
  }
  return StartupFailure::kCannotStart;
}

// Reports a start-up that failed without an injected fault as the status
// prints itself (its code first, for scripts), with whatever start-up left
// mapped, locked or pinned, and sets exit status 1.
void ReportCannotStart(const absl::Status& status, const FaultInjectingOs& os,
                       bool json, CommandContext& context) {
  absl::Status s = status;
  const std::vector<std::string> left = OsFailures(os);
  if (!left.empty()) {
    s = absl::Status(status.code(),
                     absl::StrCat(status.message(), "; and start-up left: ",
                                  absl::StrJoin(left, ", ")));
  }
  if (json) {
    return ReportError(s, "cannot start the runtime", json, kExitFailure,
                       context);
  }
  *context.err << "tpushim: cannot start the runtime: " << s << "\n";
  context.exit_code = kExitFailure;
}

// One run on `system`, whose start-up succeeded or failed cleanly under
// faults: the workers (drawn, recording, or replaying `*replay`, whose
// threads' parts move into them), the callbacks and the teardown checks,
// into `report`, whose configuration fields are set. `start` is when
// start-up began. Returns the workers, which hold each thread's record and
// results (none when start-up failed).
std::vector<std::unique_ptr<Worker>> Execute(
    absl::StatusOr<std::unique_ptr<System>> system, const RunConfig& config,
    const StressFlags& flags, StressRecord* replay, bool progress_bar,
    absl::Time start, FaultInjectingOs& os, Report& report) {
  std::vector<std::unique_ptr<Worker>> workers;
  if (!system.ok()) {
    report.startup = system.status();
    report.teardown_checked = true;
    report.teardown_failures = OsFailures(os);
    return workers;
  }
  Shared shared;
  shared.faults = config.faults;
  shared.region = config.region;
  shared.rule_codes = config.rule_codes;
  report.threshold_bytes = (*system)->transfer_threshold_bytes();
  shared.system = system->get();
  shared.devices = (*system)->device_count();
  for (int d = 0; d < shared.devices; ++d) {
    shared.block =
        std::max<uint64_t>(shared.block, (*system)->device(d).block_bytes);
  }
  shared.threshold = report.threshold_bytes;
  LOG(INFO) << "tpushim stress: seed " << report.seed << ", "
            << (flags.seconds_given ? absl::StrCat(flags.seconds, " s")
                                    : absl::StrCat(flags.ops, " ops"))
            << ", " << flags.threads << " threads, faults \"" << report.faults
            << "\""
            << (replay != nullptr ? absl::StrCat(", replaying ", flags.replay)
                                  : "");

  std::optional<absl::Time> deadline;
  std::unique_ptr<Turnstile> turnstile;
  uint64_t total_ops = flags.seconds_given ? 0 : flags.ops;
  if (replay != nullptr) {
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
    Progress progress(progress_bar, shared, total_ops, deadline, start);
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
  report.interrupted_by = InterruptSignal();
  for (std::string& f : stats_failures) {
    report.teardown_failures.push_back(std::move(f));
  }
  for (std::string& f : OsFailures(os)) {
    report.teardown_failures.push_back(std::move(f));
  }
  report.teardown_checked = true;
  return workers;
}

// Each worker's part of the record, taken from it, with every operation's
// result the one it had in this run.
std::vector<ThreadRecord> TakeRecords(
    std::vector<std::unique_ptr<Worker>>& workers) {
  std::vector<ThreadRecord> threads;
  for (auto& w : workers) {
    ThreadRecord thread = std::move(w->record());
    for (RecordedOp& op : thread.ops) op.result = w->results()[op.index];
    threads.push_back(std::move(thread));
  }
  return threads;
}

// ---- Shrinking -------------------------------------------------------------

// Replays `record` in this process, in a fresh system.
Replayed ReplayOnce(StressRecord record, const RunConfig& config,
                    const StressFlags& flags, const Report& header,
                    FaultInjectingOs& os) {
  Replayed r;
  Report report = header;
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<System>> system =
      SystemFactory::Create(config.overrides, &os);
  if (!system.ok() && ClassifyStartup(system.status(), config.faults) !=
                          StartupFailure::kInjected) {
    r.cannot_start = system.status();
    return r;
  }
  std::vector<std::unique_ptr<Worker>> workers =
      Execute(std::move(system), config, flags, &record,
              /*progress_bar=*/false, start, os, report);
  RecordReport compared;
  for (size_t t = 0; t < workers.size(); ++t) {
    CompareResults(workers[t]->record(), workers[t]->results(), compared);
  }
  r.diverged = compared.diverged;
  r.threads =
      workers.empty() ? std::move(record.threads) : TakeRecords(workers);
  for (const Violation& v : report.counters.violations) {
    Found f{v, ViolationKind(v.message), std::nullopt};
    if (v.thread >= 0 && static_cast<size_t>(v.thread) < r.threads.size() &&
        v.op_index < r.threads[v.thread].ops.size()) {
      const RecordedOp& op = r.threads[v.thread].ops[v.op_index];
      if (v.op == OpName(op.op)) f.seq = op.seq;
    }
    r.found.push_back(std::move(f));
  }
  std::stable_sort(
      r.found.begin(), r.found.end(), [](const Found& a, const Found& b) {
        return a.seq.value_or(UINT64_MAX) < b.seq.value_or(UINT64_MAX);
      });
  for (const std::string& f : report.teardown_failures) {
    r.found.push_back({Violation{0, 0, "teardown", f}, ViolationKind(f), {}});
  }
  return r;
}

// --shrink: replays `record` to find its first violation, then subsets of
// its operations (DeltaDebug, tools/stress/shrink.h), each in a fresh
// system in this process, keeping those that still produce the same
// violation (ViolationKind, tools/stress/report.h) until none can lose
// another operation or --shrink-seconds have passed; writes the smallest
// to --shrink FILE and replays that file once more to check it.
void RunShrink(const StressFlags& flags, const RunConfig& config,
               StressRecord record, const Report& header,
               CommandContext& context) {
  Os& files = *context.os;
  FaultInjectingOs& os = TrackingOs(context.os);
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + absl::Seconds(flags.shrink_seconds);
  absl::StatusOr<int> fd = files.CreateOutputFile(flags.shrink);
  if (!fd.ok()) {
    return ReportError(fd.status(), "cannot create the shrunk record",
                       flags.json, kExitUsage, context);
  }
  auto discard = [&files, &flags, fd = *fd] {
    (void)files.Close(fd);
    (void)files.Unlink(flags.shrink);
  };
  ShrinkReport shrink;
  shrink.from = flags.replay;
  shrink.file = flags.shrink;
  shrink.command =
      absl::StrCat("tpushim stress --replay ", ShellQuote(flags.shrink));
  shrink.budget_seconds = flags.shrink_seconds;
  const std::vector<uint64_t> all = OperationSeqs(record, /*skipped=*/true);
  shrink.ops_before = all.size();

  Replayed full = ReplayOnce(record, config, flags, header, os);
  if (!full.cannot_start.ok()) {
    discard();
    return ReportCannotStart(full.cannot_start, os, flags.json, context);
  }
  if (full.found.empty()) {
    discard();
    return ReportError(
        absl::FailedPreconditionError(absl::StrCat(
            flags.replay, " replays without a violation: nothing to shrink")),
        "cannot shrink", flags.json, kExitFailure, context);
  }
  const Found target = full.found.front();
  shrink.violation = target.violation;
  shrink.kind = target.kind;
  const bool tty = !flags.no_progress && isatty(2) == 1;
  ShrinkSearch search = SearchSmallest(
      record, target, std::move(full.threads),
      [&](StressRecord part) {
        return ReplayOnce(std::move(part), config, flags, header, os);
      },
      deadline,
      [tty](size_t smallest, uint64_t replays) {
        if (!tty) return;
        std::fprintf(stderr, "\r\033[Kshrink: %zu operations, %llu replays",
                     smallest, static_cast<unsigned long long>(replays));
      });
  if (tty) std::fputs("\r\033[K", stderr);
  shrink.replays = search.replays;
  shrink.budget_exhausted = search.budget_exhausted;
  shrink.minimal = search.minimal;
  shrink.ops_after = search.items.size();

  StressRecord shrunk;
  shrunk.tpushim_version = record.tpushim_version;
  shrunk.config = record.config;
  shrunk.threads = std::move(search.threads);
  const absl::Status written = WriteRecordFile(files, *fd, shrunk);
  if (!written.ok()) shrink.error = written.ToString();

  // The check: the file as written, read back and replayed.
  if (written.ok()) {
    absl::StatusOr<StressRecord> reread = LoadRecord(files, flags.shrink);
    if (!reread.ok()) {
      shrink.error = absl::StrCat("written, but it does not read back: ",
                                  reread.status().ToString());
    } else {
      Replayed check =
          ReplayOnce(*std::move(reread), config, flags, header, os);
      shrink.checked = check.cannot_start.ok();
      shrink.diverged = check.diverged;
      const Found* found = FindSame(target, check);
      if (found != nullptr) shrink.reproduced = found->violation;
      for (const Found& f : check.found) {
        if (&f != found && shrink.other.size() < 10) {
          shrink.other.push_back(f.violation);
        }
      }
    }
  }
  shrink.seconds = absl::ToDoubleSeconds(absl::Now() - start);

  if (flags.json) {
    WriteJson(ShrinkJson(shrink), *context.out);
  } else {
    PrintShrink(shrink, *context.out);
  }
  if (!shrink.error.empty()) {
    *context.err << "tpushim stress: cannot write the shrunk record "
                 << flags.shrink << ": " << shrink.error << "\n";
  } else if (!shrink.reproduced.has_value()) {
    *context.err << "tpushim stress: the shrunk record " << flags.shrink
                 << " does not reproduce the violation when replayed"
                 << (shrink.checked ? "" : " (the runtime did not start)")
                 << "\n";
  }
  context.exit_code = shrink.ok() ? kExitOk : kExitFailure;
}

// ---- Running the command ---------------------------------------------------

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
  RunConfig config;
  const absl::Status configured =
      Configure(flags, *options, replay.has_value() ? &*replay : nullptr,
                *context.os, config, report);
  if (!configured.ok()) {
    // A bad --region-bytes or --threshold is the command line's fault.
    return ReportError(configured,
                       absl::StartsWith(configured.message(), "--")
                           ? "invalid command line"
                           : "invalid configuration",
                       flags.json, kExitUsage, context);
  }
  if (!flags.shrink.empty()) {
    return RunShrink(flags, config, *std::move(replay), report, context);
  }

  FaultInjectingOs& os = TrackingOs(context.os);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<System>> system =
      SystemFactory::Create(config.overrides, &os);
  if (!system.ok()) {
    switch (ClassifyStartup(system.status(), config.faults)) {
      case StartupFailure::kInvalid:
        return usage(system.status());
      case StartupFailure::kCannotStart:
        return ReportCannotStart(system.status(), os, flags.json, context);
      case StartupFailure::kInjected:
        break;  // reported, with the checks that it left nothing behind
    }
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
  std::vector<std::unique_ptr<Worker>> workers = Execute(
      std::move(system), config, flags, replay.has_value() ? &*replay : nullptr,
      !flags.no_progress && isatty(2) == 1, start, os, report);

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
    if (!workers.empty()) record.threads = TakeRecords(workers);
    for (const ThreadRecord& thread : record.threads) {
      rec.lines += thread.ops.size() + (thread.teardown_seq ? 1 : 0);
    }
    const absl::Status written =
        WriteRecordFile(*context.os, record_fd, record);
    if (!written.ok()) rec.error = written.ToString();
    report.record = std::move(rec);
  }

  // After a violation, a record that can be read can be shrunk.
  if (report.violations() > 0 && report.record.has_value() &&
      report.record->error.empty()) {
    report.record->shrink_command = ShrinkCommand(report.record->file);
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
      *context.err << "; or replay the run: " << report.record->command
                   << "; shrink it with: " << report.record->shrink_command;
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
      AddWholeFlag(stress, "--ops", &flags->ops,
                   {.unit = "operations", .min = 1, .max = int64_t{1} << 40},
                   "Operations to run in total");
  CLI::Option* seconds =
      AddDecimalFlag(stress, "--seconds", &flags->seconds,
                     {.unit = "seconds", .min = 0.001, .max = 7.0 * 24 * 3600},
                     "Run for this many seconds instead of --ops");
  ops->excludes(seconds);
  CLI::Option* threads = AddWholeFlag(
      stress, "--threads", &flags->threads,
      {.unit = "threads", .min = 1, .max = kMaxThreads}, "Worker threads");
  CLI::Option* seed =
      AddUnsignedFlag(stress, "--seed", &flags->seed, "",
                      "Seed (default: from the clock; printed)");
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
  CLI::Option* region =
      AddByteFlag(stress, "--region-bytes", &flags->region_bytes, {},
                  "Premapped region size (K/M/G; default: "
                  "TPU_PREMAPPED_BUFFER_SIZE, else 64M)");
  CLI::Option* threshold =
      AddByteFlag(stress, "--threshold", &flags->threshold, {},
                  "Transfer threshold (K/M/G; default: "
                  "TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES, else "
                  "4M with the default region)");
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
  CLI::Option* shrink =
      stress
          ->add_option("--shrink", flags->shrink,
                       "With --replay: shrink the record to the fewest "
                       "operations that still produce its first violation "
                       "and write them to FILE")
          ->type_name("FILE");
  shrink->needs(replay);
  shrink->excludes(csv);
  AddDecimalFlag(stress, "--shrink-seconds", &flags->shrink_seconds,
                 {.unit = "seconds", .min = 0, .max = 7.0 * 24 * 3600},
                 "Time budget of --shrink")
      ->needs(shrink);
  auto processes = std::make_shared<StressProcessesFlags>();
  CLI::Option* processes_flag = AddWholeFlag(
      stress, "--processes", &processes->processes,
      {.unit = "processes", .min = 1, .max = 64},
      "Run N stress processes at once, process i on host chip i of "
      "sim://?devices=N (TPU_VISIBLE_CHIPS), killing some with SIGKILL; "
      "checks that a killed process's chip is free within 100 ms and that "
      "the others see no error");
  AddWholeFlag(stress, "--kills", &processes->kills,
               {.unit = "processes", .min = 0, .max = 64},
               "With --processes: how many to kill (default: half)")
      ->needs(processes_flag);
  for (CLI::Option* single_process : {ops, replay, record, faults, shrink}) {
    processes_flag->excludes(single_process);
  }
  processes_flag->excludes(csv);
  stress->callback(
      [flags, processes, processes_flag, seconds, seed, faults, &context] {
        flags->seconds_given = seconds->count() > 0;
        flags->seed_given = seed->count() > 0;
        flags->faults_given = faults->count() > 0;
        if (processes_flag->count() > 0) {
          processes->seconds = flags->seconds_given ? flags->seconds : 3;
          processes->threads = flags->threads;
          processes->seed =
              flags->seed_given
                  ? flags->seed
                  : static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
          processes->json = flags->json;
          RunStressProcesses(*processes, context);
          return;
        }
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
