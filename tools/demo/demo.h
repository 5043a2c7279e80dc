// `tpushim demo`: the project's main job. Brings the runtime up from the
// environment (tpushim::System), runs an input-pipeline loop like a
// training job — producers fill batches, every batch goes to every device,
// a modelled device step, results come back — verifies every byte, prints
// a summary and says whether the run was input-bound.
//
//   tpushim demo                      defaults: 20 steps of 64M on 4 devices
//   tpushim demo --steps 0            bring the system up and down only
//   tpushim demo --json               one JSON object (see RegisterDemoCommand)
//
// The pipeline, per run:
//  * `--producers` threads fill batches of `--batch-bytes` with
//    pseudo-random bytes, alternately in pageable memory (the heap) and in
//    pinned host buffers from the premapped region
//    (System::AllocatePinnedHost; when the region is off, full or the batch
//    is above the threshold the batch falls back to pageable memory, and
//    that is counted). Each batch is split into one shard per device; for
//    each shard the producer records the XXH3 hash the shard's result must
//    have. A queue two batches deep sits between producers and the loop.
//  * The step loop takes a batch (the time it waits is the producers'
//    share of input wait) and transfers shard d to device d
//    (System::TransferToDevice; pageable shards take the staged or pinned
//    path, pinned host buffers the zero-copy path). Device buffers are
//    double-buffered, so step k+1's inputs travel while step k computes.
//  * Each device (one thread per device) waits for its shard — the time it
//    idles waiting is the input wait — sleeps `--step-ms` (the modelled
//    compute), then writes its result with two device→device copies: the
//    shard rotated left by a per-shard amount, into a buffer on the next
//    device. The result goes back device→host over the shard's host
//    memory, and a verifier thread checks its hash.
//  * The run is input-bound when the devices waited for input more than
//    10 % of the loop's time.
//
// Thread-safety: single-threaded entry point (it starts and joins its own
// threads).

#ifndef TPUSHIM_TOOLS_DEMO_DEMO_H_
#define TPUSHIM_TOOLS_DEMO_DEMO_H_

#include "CLI/CLI.hpp"
#include "tools/cli/command.h"

namespace tpushim::tools {

// Adds the `demo` subcommand to `app`. `context` must outlive the parse of
// `app`. Options:
//   --steps N          steps to run (default 20; 0 = start up, shut down)
//   --batch-bytes B    bytes per batch, split evenly across the devices
//                      (default 64M; K/M/G suffixes; at most 1G, at least
//                      64 bytes per device)
//   --devices N        simulated devices: sets `devices=` of TPUSHIM_DEVICE
//                      (the other parameters are kept), or uses
//                      sim://?devices=N when it is unset (default 4)
//   --step-ms F        modelled device compute per step, ms (default 5)
//   --producers N      producer threads (default 2)
//   --shapes           also hold a model-like set of shaped device buffers
//                      on every device (tools/demo/shapes.h) and report
//                      what they take in TPU's tiled layouts
//   --json             one JSON object instead of tables
//
// Exit status (in context.exit_code): kExitOk when the run had no error;
// kExitFailure when any shard failed to verify, any transfer failed or any
// allocation failed (the summary is still printed), or when the runtime
// cannot start; kExitUsage for an invalid configuration or command line.
//
// The --json object (ordered):
//   {"init_seconds", "create_seconds", "region_ready_seconds" (null when
//    the run ended before the region was premapped), "premapped_bytes",
//    "threshold_bytes", "device", "devices", "steps", "batch_bytes",
//    "shard_bytes", "step_ms", "producers", "loop_seconds", "step_seconds",
//    "batches": {"pageable", "pinned"},
//    "bytes_moved": {"h2d", "d2h", "d2d"},
//    "transfers": {"h2d"|"d2h": {"zero_copy"|"staged"|"pinned":
//                     {"transfers", "bytes", "failed", "busy_seconds",
//                      "gbps"}},
//                  "d2d": {same fields}},
//    "staging": {"waits", "wait_seconds", "peak_bytes", "max_bytes"},
//    "pinned_transfers": {"over_threshold", "region_off",
//                         "staging_timeout", "not_premapped"},
//    "pinned_host_fallbacks": {"total", "region_full", "over_threshold",
//                              "region_off"},
//    "input": {"device_wait_seconds", "producer_wait_seconds",
//              "result_wait_seconds", "compute_seconds",
//              "result_copy_seconds", "device_wait_share",
//              "producer_wait_share", "result_wait_share"},
//    "input_bound", "input_wait_share", "input_bound_threshold",
//    "input_bound_reason",     // one sentence, "input-bound: yes|no|n/a ..."
//    "shapes": null, or with --shapes {"arrays", "divisor",
//              "worst_padded": {"shape", "label", "size_bytes",
//                               "unpadded_bytes", "expansion", "padding"},
//              "array_transfers", "round_trips_exact",
//              "devices": [{"name", "hbm_bytes", "buffers_live",
//                           "padded_bytes_in_use", "unpadded_bytes_in_use",
//                           "peak_padded_bytes", "peak_unpadded_bytes"}],
//              "error"},
//    "errors", "error_detail": {"hash_mismatches", "failed_transfers",
//                               "failed_allocations", "first_error"},
//    "logs": {"directory", "info_file"}}
// Device times ("device_wait_seconds", "compute_seconds",
// "result_copy_seconds") are totals over
// the run, averaged over the devices; the step loop's waits are totals;
// shares are of "loop_seconds"; "input_wait_share" is the devices' share,
// input-bound above "input_bound_threshold" (0.1). "gbps" is bytes over the
// summed submit-to-ready time of those transfers (1 GB = 1e9 bytes), null
// when there were none. A failure to start is
// {"error": {"code", "message"}}.
void RegisterDemoCommand(CLI::App& app, CommandContext& context);

}  // namespace tpushim::tools

#endif  // TPUSHIM_TOOLS_DEMO_DEMO_H_
