// `tpushim bench`: a quick transfer table for the current configuration.
// Brings the runtime up from the environment exactly as a framework would
// (TPU_PREMAPPED_BUFFER_SIZE, its threshold, TPUSHIM_DEVICE, ...), then
// measures, one transfer at a time (submit, Await), the throughput and
// submit-to-ready latency of every direction, path and size asked for, and
// the machine's one-thread memcpy bandwidth in the same run as the
// reference column.
//
//   tpushim bench                        4K,64K,1M,16M,256M; all cells
//   tpushim bench --sizes 1M --json      one JSON object (see below)
//   tpushim bench --csv                  header + one line per row
//
// Cells, per size n on device --device:
//  * h2d / d2h zero_copy: the host side is a PinnedHostBuffer from
//    System::AllocatePinnedHost (possible when the region is on and
//    n <= the transfer threshold, and the region has room);
//  * h2d / d2h staged: pageable memory, n <= threshold, region on;
//  * h2d / d2h pinned: pageable memory, n > threshold or region off;
//  * d2d: one device buffer to another on the same device; it has no host
//    path (JSON "path": null, "-" in tables and CSV).
// A cell the configuration cannot measure (wrong side of the threshold,
// region off, region or HBM too small, host memory short) is skipped with
// a reason, never an error. Every measured cell is checked against
// System::PathFor. The device buffers are written once before measuring
// (simulated HBM is backed lazily), and each cell has one untimed
// transfer first.
//
// Per cell: transfers repeat for --seconds (at least 3); "p50_us" and
// "p99_us" are percentiles of submit-to-ready time (nearest rank), "gbps"
// is bytes / median time (1 GB = 1e9 bytes), "vs_memcpy" is gbps /
// memcpy_gbps. memcpy_gbps: the median of one-thread memcpy timings
// between two warm heap buffers of the largest size asked for (at most
// 256 MiB), taken half before and half after the cells.
//
// Thread-safety: single-threaded entry point.

#ifndef TPUSHIM_TOOLS_BENCH_BENCH_H_
#define TPUSHIM_TOOLS_BENCH_BENCH_H_

#include "CLI/CLI.hpp"
#include "tools/cli/command.h"

namespace tpushim::tools {

// Adds the `bench` subcommand to `app`. `context` must outlive the parse of
// `app`. Options:
//   --sizes LIST       byte sizes, K/M/G suffixes (default
//                      4K,64K,1M,16M,256M; each in [1, 4G])
//   --directions LIST  of h2d, d2h, d2d (default all)
//   --paths LIST       of zero_copy, staged, pinned (default all; d2d has
//                      no path and is not filtered by it)
//   --seconds F        measuring time per cell (default 0.2; at least 3
//                      transfers)
//   --device N         the device (default 0)
//   --json | --csv     machine-readable output instead of tables
//
// A progress bar (cells done / total) goes to stderr only when stderr is a
// terminal, and is erased before the results are written.
//
// Exit status (in context.exit_code): kExitOk when every cell measured or
// was skipped; kExitFailure when a transfer failed or the runtime cannot
// start; kExitUsage for a bad command line (or --device beyond the
// configured devices) or an invalid configuration.
//
// The --json object (ordered):
//   {"memcpy_gbps", "memcpy_bytes",
//    "config": {"premapped_bytes", "threshold_bytes", "device",
//               "device_index", "hbm_bytes", "seconds_per_cell"},
//    "rows": [{"direction", "path", "bytes", "gbps", "p50_us", "p99_us",
//              "vs_memcpy", "iterations"}],
//    "skipped": [{"direction", "path", "bytes", "reason"}]}
// "direction" is "h2d", "d2h" or "d2d"; "path" is "zero_copy", "staged",
// "pinned", or null for d2d. Rows and skipped cells are ordered by
// direction, path, then size. The CSV header is
//   direction,path,bytes,gbps,vs_memcpy,p50_us,p99_us,iterations
// A failure is {"error": {"code", "message"}}.
void RegisterBenchCommand(CLI::App& app, CommandContext& context);

}  // namespace tpushim::tools

#endif  // TPUSHIM_TOOLS_BENCH_BENCH_H_
