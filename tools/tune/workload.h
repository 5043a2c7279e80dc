// The workload `tpushim tune` runs at every sweep point, and the child side
// of a point: `tpushim tune-point`, a hidden subcommand the sweep starts in
// a fresh process with TPU_PREMAPPED_BUFFER_SIZE, its threshold and
// TPUSHIM_DEVICE set in the child's environment, so that each point pays
// its real start-up cost and nothing carries over between points.
//
// A workload, as a JSON object (the --workload file of `tpushim tune`, the
// "workload" object of its --json output, and the argument of tune-point;
// every key optional, unknown keys rejected):
//
//   {"transfer_sizes": "loguniform:64K-64M",  size distribution, see below
//    "directions": ["h2d", "d2h"],            of h2d, d2h, d2d; uniform mix
//                                             (or "h2d,d2h", as the flag)
//    "streams": 2,                            concurrent transfer streams
//    "devices": 1,                            null: TPUSHIM_DEVICE's count
//    "link_gbps": null, "latency_us": null,   sim link model; null: keep
//                                             TPUSHIM_DEVICE's
//    "pinned_buffers": 0, "pinned_bytes": 0,  premapped buffers the
//                                             application keeps allocated
//    "zero_copy_share": 0,                    of h2d/d2h transfers that use
//                                             one of those buffers
//    "seconds": 2, "count": 0,                duration, or a transfer count
//                                             (count > 0 wins)
//    "step_ms": 0, "step_bytes": "64M",       modelled training step
//    "seed": 1}
//
// Transfer size distributions (`--transfer-sizes`):
//   16M                        fixed
//   uniform:1M-64M             uniform in [1M, 64M]
//   loguniform:4K-256M         log-uniform (each power of two equally likely)
//   histogram:4K=50,1M=30,64M=20   these sizes with these weights
// Sizes take K/M/G suffixes (1024 base); each in [1, 4G].
//
// What a stream does: picks a size and a direction, submits one transfer
// and awaits it, and again, until `seconds` pass or `count` transfers (over
// all streams) are done. Stream i works on device i % devices with its own
// pageable host buffer and device buffers of the largest size; a d2d copy
// goes to the next device. With pinned buffers and a zero-copy share, that
// share of a stream's host transfers (those that fit) uses pinned buffer
// i instead of pageable memory (streams beyond the buffers have none).
//
// Input-bound: when step_ms > 0, a step needs step_bytes of transfers; at
// the measured throughput they take step_input_ms; the run is input-bound
// when that exceeds step_ms.
//
// Thread-safety: the parsing functions are pure; tune-point is a
// single-threaded entry point that starts and joins its own threads.

#ifndef TPUSHIM_TOOLS_TUNE_WORKLOAD_H_
#define TPUSHIM_TOOLS_TUNE_WORKLOAD_H_

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "tools/cli/command.h"
#include "tpushim/transfer.h"

namespace tpushim::tools {

// Bounds of a workload's values (the file's keys and tune's flags alike).
inline constexpr uint64_t kMaxTransferBytes = uint64_t{4} << 30;
inline constexpr int kMaxStreams = 256;
inline constexpr int kMaxPinnedBuffers = 4096;

class SizeDistribution {
 public:
  enum class Kind { kFixed, kUniform, kLogUniform, kHistogram };

  // Parses the grammar above. INVALID_ARGUMENT naming `what` otherwise.
  static absl::StatusOr<SizeDistribution> Parse(absl::string_view text,
                                                absl::string_view what);

  uint64_t Draw(std::mt19937_64& rng) const;
  uint64_t max() const { return max_; }
  // The expected size.
  double Mean() const;
  // As given to Parse.
  const std::string& text() const { return text_; }

 private:
  Kind kind_ = Kind::kFixed;
  uint64_t min_ = 0;
  uint64_t max_ = 0;
  std::vector<std::pair<uint64_t, double>> histogram_;  // size, weight
  std::string text_;
};

struct Workload {
  SizeDistribution transfer_sizes;
  std::vector<DmaDirection> directions;
  int streams = 2;
  std::optional<int> devices;
  std::optional<double> link_gbps;
  std::optional<double> latency_us;
  int pinned_buffers = 0;
  uint64_t pinned_bytes = 0;
  double zero_copy_share = 0;
  double seconds = 2;
  uint64_t count = 0;
  double step_ms = 0;
  uint64_t step_bytes = uint64_t{64} << 20;
  uint64_t seed = 1;

  // The defaults above, with transfer_sizes "loguniform:64K-64M" and
  // directions h2d, d2h.
  static Workload Default();
};

// `base` with the keys of `json` applied (see above). INVALID_ARGUMENT
// naming the key on an unknown key, a wrong type or an out-of-range value.
absl::StatusOr<Workload> WorkloadFromJson(const nlohmann::ordered_json& json,
                                          Workload base);
// Every key, in the order above (null for unset optionals).
nlohmann::ordered_json WorkloadToJson(const Workload& workload);

// Parses "h2d,d2h" (no duplicates needed; order kept as h2d, d2h, d2d).
absl::StatusOr<std::vector<DmaDirection>> ParseDirectionList(
    absl::string_view text, absl::string_view what);

// Adds the hidden `tune-point` subcommand: `tpushim tune-point --workload
// JSON` brings the runtime up from its environment, runs the workload and
// writes one JSON object on stdout:
//   {"status": "ok", "startup_seconds", "init_seconds",
//    "region": {"enabled", "capacity_bytes", "threshold_bytes", "locked",
//               "page_kind"},
//    "device", "devices", "pinned_buffers_allocated",
//    "pinned_alloc_failures", "seconds", "transfers", "bytes", "gbps",
//    "paths": {"zero_copy", "staged", "pinned", "d2d"},
//    "staging_waits", "staging_wait_seconds", "fallbacks",
//    "over_threshold", "resource_exhausted", "failed_transfers",
//    "codes": {"<CODE>": n}, "peak_call_pinned_bytes",
//    "peak_region_bytes_in_use"}
// or, when the runtime cannot start, {"status": "failed", "error":
// {"code", "message"}, "startup_seconds"} with exit status 1 (2 for an
// invalid configuration). Not listed in `tpushim --help`: it is the
// sweep's protocol, not a user command.
void RegisterTunePointCommand(CLI::App& app, CommandContext& context);

}  // namespace tpushim::tools

#endif  // TPUSHIM_TOOLS_TUNE_WORKLOAD_H_
