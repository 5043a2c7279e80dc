// What `tpushim demo` (tools/demo/demo.cc) reports once its loop ends: the
// run's figures, whether it was input-bound and why, as --json or as tables.
// Internal to the tool.

#ifndef TPUSHIM_TOOLS_DEMO_SUMMARY_H_
#define TPUSHIM_TOOLS_DEMO_SUMMARY_H_

#include <algorithm>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "tools/demo/pipeline.h"
#include "tools/demo/shapes.h"
#include "tpushim/stats.h"
#include "tpushim/system.h"

namespace tpushim::tools::demo_internal {

using Json = nlohmann::ordered_json;

// ---- The summary
// -------------------------------------------------------------

struct Summary {
  DemoConfig config;
  std::string device_url;
  double init_seconds = 0;
  // Until System::Create returned, and until the whole region was
  // premapped (after it, with TPUSHIM_PREMAP=background; unset when the
  // run ended first).
  double create_seconds = 0;
  std::optional<double> region_ready_seconds;
  uint64_t premapped_bytes = 0;
  uint64_t threshold_bytes = 0;
  RegionStats region;
  std::vector<DeviceDescription> devices;
  RunCounters run;
  TransferStats transfers;
  std::string log_directory;
  // --steps as given; config.steps is the steps that ran (fewer when a
  // signal stopped the loop, run.interrupted_by).
  int64_t steps_requested = 0;
  // --shapes: the shaped device buffers and what they took.
  std::optional<ShapesReport> shapes;

  // Mean over devices.
  double DeviceWaitSeconds() const { return Mean(run.device_wait_ns); }
  double ComputeSeconds() const { return Mean(run.device_compute_ns); }
  double ResultSeconds() const { return Mean(run.device_result_ns); }
  double LoopSeconds() const { return Seconds(run.loop_ns); }
  double Share(double seconds) const {
    return run.loop_ns > 0 ? seconds / LoopSeconds() : 0.0;
  }
  double InputWaitShare() const { return Share(DeviceWaitSeconds()); }
  bool InputBound() const {
    return config.steps > 0 && InputWaitShare() > kInputBoundShare;
  }
  uint64_t BytesMoved(int direction) const {
    uint64_t bytes = 0;
    for (const PathStats& p : transfers.host[direction]) bytes += p.bytes;
    return bytes;
  }
  // TPU_MIN_LOG_LEVEL: 0 INFO ... 3 FATAL; the lowest-level file written.
  int min_log_level = 0;
  // Why the region is not locked and how to change that; "" when it is.
  std::string not_locked_reason;
  std::string InfoFile() const {
    static constexpr const char* kLevels[] = {"INFO", "WARNING", "ERROR",
                                              "FATAL"};
    return log_directory.empty()
               ? ""
               : absl::StrCat(log_directory, "/tpu_driver.",
                              kLevels[std::clamp(min_log_level, 0, 3)]);
  }

  // One sentence on whether the run was input-bound and why.
  std::string InputBoundReason() const {
    if (config.steps == 0 || run.loop_ns == 0) {
      return "input-bound: n/a (no steps ran).";
    }
    const double share = InputWaitShare();
    if (!InputBound()) {
      return absl::StrFormat(
          "input-bound: no (the devices waited for input %.0f%% of the run, "
          "within the %.0f%% bound); the modelled device step (--step-ms) "
          "set the pace.",
          share * 100, kInputBoundShare * 100);
    }
    // Attribute the devices' wait to what the step loop waited for: a
    // batch from the producers, earlier results coming back (their device
    // buffers are reused), or else the host-to-device transfers.
    const double producers = Seconds(run.producer_wait_ns);
    const double results = Seconds(run.result_wait_ns);
    const double uploads =
        std::max(0.0, DeviceWaitSeconds() - producers - results);
    absl::string_view cause;
    if (producers >= results && producers >= uploads) {
      cause =
          "mostly for the producers to fill batches; more producer threads "
          "(--producers) or cheaper preprocessing would help";
    } else if (results >= uploads) {
      cause =
          "mostly for earlier results to come back device-to-host before "
          "their buffers could be reused; a longer --step-ms or smaller "
          "batches would hide it";
    } else {
      cause =
          "mostly for host-to-device transfers; pinned (premapped) host "
          "buffers, which take the zero-copy path, would help";
    }
    return absl::StrFormat(
        "input-bound: yes (the devices waited for input %.0f%% of the run, "
        "above the %.0f%% bound), %s.",
        share * 100, kInputBoundShare * 100, cause);
  }

 private:
  static double Mean(const std::vector<int64_t>& ns) {
    if (ns.empty()) return 0.0;
    int64_t sum = 0;
    for (int64_t v : ns) sum += v;
    return Seconds(sum) / static_cast<double>(ns.size());
  }
};

// The run as the one object of --json.
Json SummaryJson(const Summary& s);
// The run as tables and sentences.
void PrintSummary(const Summary& s, std::ostream& out);

}  // namespace tpushim::tools::demo_internal

#endif  // TPUSHIM_TOOLS_DEMO_SUMMARY_H_
