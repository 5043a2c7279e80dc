// `tpushim stress`: a randomized, seeded, multi-threaded mix of every
// runtime operation — pinned host buffers and device buffers allocated and
// freed, transfers on all three paths (zero-copy, staged, pinned) in all
// directions with `wait_for` dependencies, deallocations with `wait_for`,
// awaits, timed awaits and callbacks — optionally under injected faults
// (--faults, the TPUSHIM_FAULTS grammar), with invariants checked as it
// runs and at the end:
//
//  * every byte that arrives is the byte that was sent: each device buffer
//    region written from the host remembers the XXH3 hash of what was sent
//    (computed at submission); reading it back, directly or after
//    device→device copies, must give the same hash;
//  * every failure is a clean status of an expected code:
//      allocations                 RESOURCE_EXHAUSTED; with --faults also
//                                  any status carrying the marker below;
//                                  with the region off, AllocatePinnedHost
//                                  FAILED_PRECONDITION and nothing else
//      transfers, deallocations    RESOURCE_EXHAUSTED, CANCELLED; with
//                                  --faults also INTERNAL, UNAVAILABLE, any
//                                  code= a rule names, and any status
//                                  carrying an "[injected: ...]" marker
//    (a dependant of a failed operation carries the same status);
//  * nothing hangs: every event is awaited with a 30 s bound;
//  * callbacks run exactly once, with the event's status;
//  * after every buffer is freed, SystemStats reconcile to zero (region
//    bytes and live allocations, pending events, every queue's pending and
//    in-flight operations and submitted = completed + failed + cancelled,
//    pinned bytes, device buffers and HBM in use), and once the system is
//    destroyed nothing it mapped, locked or pinned is left (tracked through
//    a FaultInjectingOs under the system).
//
// A start-up failure under --faults is an expected, clean failure (exit 0)
// when its status carries the injected marker and start-up left nothing
// mapped, locked or pinned (else that is a violation). Any other failed
// start-up is the runtime's error, not a run: INVALID_ARGUMENT exits
// kExitUsage as an invalid configuration, anything else (RESOURCE_EXHAUSTED
// for a region the host cannot hold) kExitFailure, printed as
//   tpushim: cannot start the runtime: RESOURCE_EXHAUSTED: <message>
// (with --json the {"error": {"code", "message"}} of tools/cli/command.h).
//
// Reproducibility: worker t draws its operations from
// std::mt19937_64 seeded with (seed, t), a fixed number of draws per
// operation, so the sequence of operation kinds of every worker depends
// only on --seed (with --ops, worker t runs ops/threads operations, the
// first ops % threads workers one more). What each operation meets (a full
// region, an injected fault) may vary with timing when threads > 1.
//
// Record and replay (--record FILE, --replay FILE; the format is in
// tools/stress/record.h): a worker takes a global sequence number just
// before each operation's first call into the runtime (two operations
// issued at the same moment may have reached it in the other order), and
// the record keeps, in that order, every operation with its thread and every
// parameter it was issued with, buffers and wait_for events named by the
// operations that made them. A replay issues exactly those calls with
// exactly those arguments on the recorded worker threads, one operation at
// a time (a turnstile admits only the next sequence number), each after
// the dependencies the recorded run had seen complete; its teardown frees
// take their recorded turn too. That is deterministic as long as every
// operation ends as recorded. Timing is not replayed: DMA completion, and
// with it the results of timed awaits and which call a rate/nth/every rule
// hits where the runtime reaches a fault point on its own threads or a
// timing-dependent number of times (dma, staging allocations, shared pins).
// An operation that ends differently is counted ("diverged") and the first
// named; later ones may then find a buffer or event missing, and are
// skipped or issued without it. The invariants are checked as in any run.
//
// Shrinking (--replay FILE --shrink SMALL): the replay's first violation
// (the first issued; a teardown failure after every operation's) is the
// target; the same violation is one of the same operation kind whose
// message is of the same kind (ViolationKind, tools/stress/report.h).
// Subsets of the record's operations are replayed in this process, each in
// a fresh system, as tools/stress/shrink.h describes, until no single
// operation can go or --shrink-seconds have passed; the smallest that
// still produced the violation is written to SMALL (a record like any
// other, the results those of its replay) and replayed once more from the
// file, as the check.
//
// Thread-safety: single-threaded entry point (it starts and joins its own
// threads).

#ifndef TPUSHIM_TOOLS_STRESS_STRESS_H_
#define TPUSHIM_TOOLS_STRESS_STRESS_H_

#include "CLI/CLI.hpp"
#include "tools/cli/command.h"

namespace tpushim::tools {

// Adds the `stress` subcommand to `app`. `context` must outlive the parse
// of `app`. Options:
//   --ops N            operations to run in total (default 10000)
//   --seconds S        run for S seconds instead (excludes --ops)
//   --threads N        worker threads (default 4, 1..256)
//   --seed N           seed (default: derived from the clock; printed)
//   --faults SPEC      faults to inject (TPUSHIM_FAULTS grammar; wins over
//                      TPUSHIM_FAULTS)
//   --region-bytes B   premapped region, a multiple of 4096, 0 for none
//                      (default: TPU_PREMAPPED_BUFFER_SIZE, else 64M)
//   --threshold B      transfer threshold, at least 1 with a region; above
//                      the region it is clamped to it (default: the
//                      variable, else 4M when the region is the stress
//                      default)
//   --record FILE      write the record of the run to FILE at its end
//   --replay FILE      replay FILE with its configuration (excludes --ops,
//                      --seconds, --threads, --seed, --faults,
//                      --region-bytes, --threshold; and --record)
//   --shrink SMALL     with --replay: write the fewest operations of FILE
//                      that still produce its first violation to SMALL
//   --shrink-seconds S the time budget of --shrink (default 60)
//   --json / --csv     machine-readable output instead of tables
//   --no-progress      no progress bar (there is none when stderr is not a
//                      terminal anyway)
// When TPUSHIM_DEVICE is unset the devices are sim://?devices=2&hbm=256M.
//
// Exit status: kExitOk when no invariant was violated (expected failures
// included, a cleanly failed start-up under --faults too); kExitFailure on
// any violation (the seed and the shortest prefix of the run that reaches
// the first violation are printed; with --record or --replay also the
// commands that replay and shrink the record), when the runtime cannot
// start, or when the record could not be written; kExitUsage for a bad
// command line or invalid configuration (a bad --region-bytes or
// --threshold names the flag: "--region-bytes must be a multiple of 4096
// bytes (4 KiB pages), got \"4097\"; ..."), a record file that cannot be
// created, or a --replay file that cannot be read or is malformed,
// truncated or of another format version. With --shrink: kExitOk when
// SMALL was written and its check reproduces the violation, kExitFailure
// when it does not, when FILE replays without a violation (nothing to
// shrink; then no SMALL is left) or SMALL could not be written,
// kExitUsage as above or when SMALL cannot be created.
//
// The --json object (ordered):
//   {"seed", "ops", "threads", "seconds", "ops_per_second", "faults",
//    "device", "region_bytes", "threshold_bytes",
//    "startup": {"ok", "code", "message"},
//    "by_op": {"<op>": {"count", "codes": {"<CODE>": n}}},
//    "by_code": {"<CODE>": n},
//    "bytes_verified", "transfers_verified", "callbacks": {"added", "run"},
//    "paths": {"h2d"|"d2h": {"zero_copy", "staged", "pinned"}, "d2d"},
//    "teardown": {"checked", "failures": [...]},
//    "violations": [{"thread", "op_index", "op", "message"}],
//    "reproduce",
//    "record": null | {"mode": "record" | "replay", "file", "lines",
//                      "tpushim", "replay", "diverged",
//                      "first_divergence": null | {"seq", "thread",
//                          "op_index", "op", "recorded", "replayed"},
//                      "error", "shrink"}}
// <op> is one of alloc_pinned, free_pinned, alloc_device, free_device,
// h2d, d2h, d2d, chain, await; an operation's code is the status of its
// call, or of its event once ready (for a chain, the final d2h's), or
// SKIPPED when it did not apply (nothing to free, a cap reached), or
// NOT_READY for a timed await that timed out. "by_code" counts every
// status the runtime returned or an event carried, once each.
// "reproduce" is a command line that reruns the run, or, after a
// violation, the shortest prefix of it that reaches the first violation
// (every worker runs the same first operations; with several threads what
// they meet may differ with timing: --shrink gives a smaller, exact one).
// "record" is null without --record and --replay; "lines" counts the
// record's lines after its header, "tpushim" is the version that recorded
// it, "replay" the command that replays it, "diverged" (replay) the
// operations whose result differs from the recorded one, timed awaits
// aside, "error" (record) why the file could not be written, and "shrink"
// the command that shrinks it after a violation (else null).
//
// With --shrink, --json prints instead (ordered):
//   {"shrink": {"from", "file", "violation": {"thread", "op_index", "op",
//               "message"}, "same": {"op", "kind"}, "ops_before",
//               "ops_after", "replays", "seconds", "budget_seconds",
//               "budget_exhausted", "minimal", "error",
//               "check": {"checked", "reproduced", "violation",
//                         "other_violations", "diverged"},
//               "replay"}}
// "violation" is the target, "same" what another must match to be the same
// ("kind": ViolationKind of its message), "replays" the subsets replayed,
// "minimal" true when no single operation of SMALL can go, "check" the
// replay of SMALL as written ("violation": the same one it found, or
// null).
//
// --csv writes `section,name,code,count` rows: section "by_op" (name = the
// op, code = a code or "count" for the total) and "by_code" (name empty),
// then "summary" rows (name = ops, violations, bytes_verified, ...;
// diverged when replaying).
void RegisterStressCommand(CLI::App& app, CommandContext& context);

}  // namespace tpushim::tools

#endif  // TPUSHIM_TOOLS_STRESS_STRESS_H_
