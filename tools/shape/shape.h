// `tpushim shape`: what XLA shapes take in TPU device memory.
//
//   tpushim shape 's32[29360128,10]=one_hot' 'bf16[4096,4096]'
//   tpushim shape --json 'f32[1000,1000]'
//   tpushim shape --hbm 16G 'f32[65536,8192]=weights' 's32[29360128,10]'
//
// For each SHAPE[=LABEL] (an array or a tuple; without a layout TPU's
// default, device/xla_shape.h): the layout used and XLA's report lines
// `Size:`, `Unpadded size:` and `Extra memory due to padding:`, and which
// dimension causes the padding with the nearest sizes that avoid it. With
// --hbm (from 1M to 1T: what a simulated device takes, env/device_url.h)
// the arrays (a tuple's elements one by one) are allocated in order on one
// simulated device of that capacity, as a runtime would; if they do not
// all fit it prints the runtime's RESOURCE_EXHAUSTED message with XLA's
// HBM report and exits 1. A mistyped element type gets a did-you-mean.
//
// Thread-safety: single-threaded, like the tool.

#ifndef TPUSHIM_TOOLS_SHAPE_SHAPE_H_
#define TPUSHIM_TOOLS_SHAPE_SHAPE_H_

#include "CLI/CLI.hpp"
#include "tools/cli/command.h"

namespace tpushim::tools {

// Adds the `shape` subcommand. Exit status: kExitOk when every shape
// parsed (and, with --hbm, fits); kExitUsage for a malformed shape
// ("tpushim shape: <text>: <what> at column <n>") or flag (--hbm out of
// its range included, before anything runs); kExitFailure
// when the shapes do not fit in --hbm or the simulated device cannot start.
//
// The --json object, shapes in argument order:
//   {"shapes": [{"shape": as given, "label": string or null,
//                "layout": with the layout used, "layout_given": bool,
//                "size_bytes", "unpadded_bytes", "padding_bytes",
//                "expansion": size / unpadded (null when unpadded is 0),
//                "padding": the hint line,
//                "padded_dimensions": [{"dimensions", "size",
//                  "padded_size", "granule", "smaller", "larger"}...],
//                "elements": [the same, per element] (tuples only)}...],
//    "hbm": {"capacity_bytes", "fits", "used_bytes", "allocated",
//            "error": the RESOURCE_EXHAUSTED message or null}  (--hbm only)}
void RegisterShapeCommand(CLI::App& app, CommandContext& context);

}  // namespace tpushim::tools

#endif  // TPUSHIM_TOOLS_SHAPE_SHAPE_H_
