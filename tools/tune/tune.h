// `tpushim tune`: chooses TPU_PREMAPPED_BUFFER_SIZE and
// TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES for a workload by
// measuring, the way users tune: every point of the size × threshold sweep
// runs in a fresh child process (`tpushim tune-point`, see
// tools/tune/workload.h) with the two variables set in its environment, so
// that start-up, pinning and the workload are real and nothing leaks from
// one point to the next.
//
//   tpushim tune --sizes 1G,4G,16G --thresholds 1M,default
//   tpushim tune --sizes 256M..4G --pinned-buffers 8 --pinned-bytes 64M
//   tpushim tune --workload my_job.json --json > sweep.json
//   tpushim tune --plot sweep.svg
//
// Sweep lists (--sizes, --thresholds): comma-separated items, each a byte
// size (K/M/G/T suffixes), a range A..B (doubling from A up to B), A..B:xK
// (multiplying by K) or A..B:+S (adding S); --sizes may hold 0 (the region
// off), --thresholds may hold `default` (the variable unset: the threshold
// equals the size). A threshold above a size would be clamped to the size
// by the runtime, so that combination is dropped as a duplicate (and
// counted in the output). Sizes must be multiples of 4096 (the rule for
// TPU_PREMAPPED_BUFFER_SIZE), checked before anything runs.
//
// Repeats: every point runs --repeats times (default 3), in rounds over
// the whole sweep, the first in sweep order, each later one shuffled
// (seeded by the workload's --seed) and never starting with the point the
// previous round ended with (tune_internal::RunOrder). Per point (figures
// are medians over its runs, "gbps_range" the slowest and fastest run's
// throughput, failure counts the worst run's): start-up time (System
// creation in the child), pinned host bytes (the region when locked, plus
// the peak of per-call pinned transfer memory), throughput, the share of
// host transfers per path, staging waits, RESOURCE_EXHAUSTED count (the
// application's pinned buffers the region could not hold, and failed
// transfers), fallbacks from staging to per-call pinning, and whether the
// run would be input-bound (see the workload's step model). A point whose
// child crashes, exceeds --point-timeout, cannot start (e.g.
// TPUSHIM_MLOCK=required and mlock fails) or is rejected as invalid is
// reported with its status and error; the sweep goes on.
//
// Recommendation (tune_internal::Recommend). A point is clean when it ran
// with no RESOURCE_EXHAUSTED, no failed transfer and (unless
// TPUSHIM_MLOCK=off) a locked region; only clean points count. (A point
// whose application buffers could not be allocated may run faster by
// doing less; it does not set the bar.) The best point is the clean one
// with the highest median throughput. A clean point qualifies when it is
// the best or when its slowest run reaches kGoodEnough (95 %) of the best
// point's median: a median above the bar may be one lucky run, the slowest
// run is what the setting can be counted on for. The recommendation is
// the smallest qualifying size, and at that size the qualifying threshold
// with the highest median. The result does not depend on the order of the
// points or of their runs (ties go to the first in sweep order). One
// sentence says why, and why the smaller sizes lost.
//
// Within noise: at least two points ran cleanly and every clean point's
// range [slowest, fastest] overlaps the best point's range. Then no clean
// setting can be told from the best on this machine; the recommendation
// still follows the rule above, and is marked "(within noise)" in the
// table and "within_noise": true in --json.
//
// No recommendation: when no point ran cleanly (every point failed to run,
// had RESOURCE_EXHAUSTED or failed transfers, or could not lock its
// region), "recommendation" is null, one sentence says why, and the exit
// status is kExitFailure.
//
// Thread-safety: single-threaded entry point.

#ifndef TPUSHIM_TOOLS_TUNE_TUNE_H_
#define TPUSHIM_TOOLS_TUNE_TUNE_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tools/cli/command.h"

namespace tpushim::tools {

// Parses a sweep list (grammar above) into ascending, distinct values;
// nullopt stands for `default` (only when `allow_default`). `allow_zero`
// admits 0. INVALID_ARGUMENT naming `what` and the item otherwise, and for
// lists of more than 256 values.
absl::StatusOr<std::vector<std::optional<uint64_t>>> ParseSweepList(
    absl::string_view text, absl::string_view what, bool allow_zero,
    bool allow_default);

// Adds the `tune` subcommand (and the hidden `tune-point` it runs) to
// `app`. `context` must outlive the parse of `app`. Options: see
// `tpushim tune --help`.
//
// Exit status: kExitOk when there is a recommendation (failed points
// included); kExitFailure when no point ran cleanly, or the plot could not
// be drawn; kExitUsage for a bad command line, an invalid workload, a
// LIBTPU_INIT_ARGS that would override the swept variables, or --plot
// without gnuplot installed (checked before anything runs).
//
// --json (ordered):
//   {"workload": {...},                      tools/tune/workload.h
//    "device", "repeats", "dropped_combinations",
//    "points": [{"size_bytes", "threshold_bytes", "threshold_set",
//                "status", "error", "startup_seconds", "init_seconds",
//                "pinned_host_bytes", "region_locked",
//                "peak_call_pinned_bytes", "gbps", "gbps_range", "transfers",
//                "bytes",
//                "path_share": {"zero_copy", "staged", "pinned"},
//                "path_counts": {"zero_copy", "staged", "pinned", "d2d"},
//                "staging_waits", "staging_wait_seconds",
//                "resource_exhausted", "pinned_alloc_failures",
//                "failed_transfers", "fallbacks", "over_threshold",
//                "input_bound", "step_input_ms", "peak_rss_bytes",
//                "wall_seconds"}],
//    "recommendation": null | {"size_bytes", "threshold_bytes",
//                       "environment": {"TPU_PREMAPPED_BUFFER_SIZE", ...},
//                       "gbps", "gbps_range", "fraction_of_best",
//                       "best_gbps", "within_noise", "reason"},
//    "no_recommendation_reason",
//    "plot", "partial", "interrupted_by"}
// "gbps" is the median of the point's runs, "gbps_range" their [slowest,
// fastest]; in "recommendation", "gbps" and "gbps_range" are the chosen
// point's and "fraction_of_best" its median over the best median.
// "no_recommendation_reason" is the sentence when "recommendation" is
// null, and null otherwise.
// "partial" is true, "interrupted_by" "SIGINT" or "SIGTERM", when a signal
// stopped the sweep: the running child is killed, the points not run have
// status "interrupted", there is no recommendation, and the exit status is
// 130 or 143.
// "status" is "ok", "failed", "invalid", "crashed", "timeout" or
// "interrupted"; "error"
// is null or {"code", "message"}; a point that did not run has null
// figures. "threshold_bytes" is the threshold in force (null with the
// region off), "threshold_set" what the sweep set (null: `default`).
// --csv: one line per point under the header
//   size_bytes,threshold_bytes,threshold_set,status,startup_seconds,
//   pinned_host_bytes,region_locked,gbps,gbps_min,gbps_max,transfers,
//   zero_copy_share,staged_share,pinned_share,staging_wait_seconds,
//   resource_exhausted,failed_transfers,fallbacks,input_bound,error
// (gbps the median, gbps_min and gbps_max the range).
void RegisterTuneCommand(CLI::App& app, CommandContext& context);

}  // namespace tpushim::tools

#endif  // TPUSHIM_TOOLS_TUNE_TUNE_H_
