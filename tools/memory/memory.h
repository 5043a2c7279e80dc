// `tpushim memory`: what a TPUSHIM_MEMORY_PROFILE says about device memory.
//
//   TPUSHIM_MEMORY_PROFILE=/tmp/mem.jsonl tpushim demo --shapes
//   tpushim memory /tmp/mem.jsonl
//   tpushim memory /tmp/mem.jsonl --plot mem.png
//   tpushim memory /tmp/mem.jsonl --json | jq '.devices[0].peak'
//
// Per device: the peak of padded bytes in use with the unpadded bytes at
// that moment, when it was, and the largest buffers live then in the
// words of XLA's HBM report; the failed requests; what was live at the
// end. --plot draws the memory viewer TensorBoard users know: padded and
// unpadded bytes in use over time, one panel per device that allocated,
// with the HBM capacity and the failed requests marked.
//
// Thread-safety: single-threaded, like the tool.

#ifndef TPUSHIM_TOOLS_MEMORY_MEMORY_H_
#define TPUSHIM_TOOLS_MEMORY_MEMORY_H_

#include "CLI/CLI.hpp"
#include "tools/cli/command.h"

namespace tpushim::tools {

// Adds the `memory` subcommand. Exit status: kExitOk; kExitUsage for a bad
// flag or a file that is not a well-formed profile ("line N: ..."),
// kExitFailure when the file cannot be read or the plot not written.
//
// The --json object:
//   {"profile": path, "pid", "started", "duration_seconds",
//    "complete": the end record is there, "cut_short": a last line was
//    incomplete,
//    "devices": [{"name", "hbm_bytes", "allocations", "frees",
//      "peak": {"t", "padded_bytes", "unpadded_bytes", "buffers",
//               "utilization", "largest": [buffer...]} or null,
//      "max_unpadded_bytes",
//      "failed_requests": [buffer...],
//      "end": {"buffers", "padded_bytes", "unpadded_bytes"}}...],
//    "plot": the file written, or null}
// where a buffer is {"t", "size_bytes" (padded), "unpadded_bytes",
// "device_bytes", "shape", "label", "op"} (the last three null when not
// given).
void RegisterMemoryCommand(CLI::App& app, CommandContext& context);

}  // namespace tpushim::tools

#endif  // TPUSHIM_TOOLS_MEMORY_MEMORY_H_
