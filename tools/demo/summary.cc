#include "tools/demo/summary.h"

#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <new>
#include <optional>
#include <ostream>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "common/human_bytes.h"
#include "common/mutex.h"
#include "env/options.h"
#include "logging/log.h"
#include "nlohmann/json.hpp"
#include "tools/cli/interrupt.h"
#include "tools/cli/pseudo_random.h"
#include "tools/cli/text_table.h"
#include "tpushim/stats.h"
#include "tpushim/system.h"
#include "tpushim/transfer.h"

namespace tpushim::tools::demo_internal {

constexpr DmaDirection kHostDirections[] = {DmaDirection::kHostToDevice,
                                            DmaDirection::kDeviceToHost};
constexpr TransferPath kPaths[] = {
    TransferPath::kZeroCopy, TransferPath::kStaged, TransferPath::kPinned};

std::optional<double> Gbps(const PathStats& p) {
  if (p.active_ns <= 0 || p.bytes == 0) return std::nullopt;
  return static_cast<double>(p.bytes) / static_cast<double>(p.active_ns);
}

Json PathJson(const PathStats& p) {
  const std::optional<double> gbps = Gbps(p);
  return {{"transfers", p.transfers},
          {"bytes", p.bytes},
          {"failed", p.failed},
          {"busy_seconds", Seconds(p.busy_ns)},
          {"active_seconds", Seconds(p.active_ns)},
          {"gbps", gbps.has_value() ? Json(*gbps) : Json(nullptr)}};
}

// --shapes as JSON: what the shaped buffers took per device.
Json ShapesJson(const ShapesReport& r) {
  Json devices = Json::array();
  for (const DeviceStats& d : r.devices) {
    devices.push_back({{"name", d.name},
                       {"hbm_bytes", d.hbm_bytes},
                       {"buffers_live", d.buffers_live},
                       {"padded_bytes_in_use", d.padded_bytes_in_use},
                       {"unpadded_bytes_in_use", d.unpadded_bytes_in_use},
                       {"peak_padded_bytes", d.peak_padded_bytes},
                       {"peak_unpadded_bytes", d.peak_unpadded_bytes}});
  }
  return {{"arrays", r.arrays},
          {"divisor", r.divisor},
          {"worst_padded",
           {{"shape", r.worst_shape},
            {"label", r.worst_label},
            {"size_bytes", r.worst_padded},
            {"unpadded_bytes", r.worst_unpadded},
            {"expansion", r.worst_unpadded == 0
                              ? Json(nullptr)
                              : Json(static_cast<double>(r.worst_padded) /
                                     static_cast<double>(r.worst_unpadded))},
            {"padding", r.worst_hint}}},
          {"array_transfers", r.array_transfers},
          {"round_trips_exact", r.round_trips_exact},
          {"devices", devices},
          {"error", r.error.empty() ? Json(nullptr) : Json(r.error)}};
}

Json SummaryJson(const Summary& s) {
  Json transfers = Json::object();
  for (DmaDirection dir : kHostDirections) {
    Json paths = Json::object();
    for (TransferPath path : kPaths) {
      paths[std::string(TransferPathName(path))] = PathJson(
          s.transfers.host[static_cast<int>(dir)][static_cast<int>(path)]);
    }
    transfers[std::string(DmaDirectionName(dir))] = paths;
  }
  transfers[std::string(DmaDirectionName(DmaDirection::kDeviceToDevice))] =
      PathJson(s.transfers.device_to_device);
  const RunCounters& run = s.run;
  const double steps =
      static_cast<double>(std::max<int64_t>(s.config.steps, 1));
  return {
      {"init_seconds", s.init_seconds},
      {"create_seconds", s.create_seconds},
      {"region_ready_seconds",
       s.region_ready_seconds ? Json(*s.region_ready_seconds) : Json(nullptr)},
      {"premapped_bytes", s.premapped_bytes},
      {"threshold_bytes", s.threshold_bytes},
      {"region",
       {{"pages", s.region.page_description},
        {"locked", s.region.locked},
        {"not_locked_reason", s.not_locked_reason.empty()
                                  ? Json(nullptr)
                                  : Json(s.not_locked_reason)}}},
      {"device", s.device_url},
      {"devices", s.config.devices},
      {"steps", s.config.steps},
      {"partial", run.interrupted_by != 0},
      {"interrupted_by", run.interrupted_by != 0
                             ? Json(InterruptSignalName(run.interrupted_by))
                             : Json(nullptr)},
      {"steps_requested", s.steps_requested},
      {"batch_bytes", s.config.batch_bytes},
      {"shard_bytes", s.config.shard_bytes},
      {"step_ms", s.config.step_ms},
      {"producers", s.config.producers},
      {"loop_seconds", s.LoopSeconds()},
      {"step_seconds", s.config.steps > 0 ? s.LoopSeconds() / steps : 0.0},
      {"batches",
       {{"pageable", run.batches_pageable}, {"pinned", run.batches_pinned}}},
      {"bytes_moved",
       {{"h2d", s.BytesMoved(0)},
        {"d2h", s.BytesMoved(1)},
        {"d2d", s.transfers.device_to_device.bytes}}},
      {"transfers", transfers},
      {"staging",
       {{"waits", s.transfers.staging_waits},
        {"wait_seconds", Seconds(s.transfers.staging_wait_ns)},
        {"peak_bytes", s.transfers.peak_staging_bytes},
        {"max_bytes", s.transfers.max_staging_bytes}}},
      {"pinned_transfers",
       {{"over_threshold", s.transfers.pinned_over_threshold},
        {"region_off", s.transfers.pinned_region_off},
        {"staging_timeout", s.transfers.pinned_staging_timeout},
        {"not_premapped", s.transfers.pinned_not_premapped}}},
      {"pinned_host_fallbacks",
       {{"total", run.fallbacks()},
        {"region_full", run.fallback_region_full},
        {"over_threshold", run.fallback_over_threshold},
        {"region_off", run.fallback_region_off}}},
      {"input",
       {{"device_wait_seconds", s.DeviceWaitSeconds()},
        {"producer_wait_seconds", Seconds(run.producer_wait_ns)},
        {"result_wait_seconds", Seconds(run.result_wait_ns)},
        {"compute_seconds", s.ComputeSeconds()},
        {"result_copy_seconds", s.ResultSeconds()},
        {"device_wait_share", s.InputWaitShare()},
        {"producer_wait_share", s.Share(Seconds(run.producer_wait_ns))},
        {"result_wait_share", s.Share(Seconds(run.result_wait_ns))}}},
      {"input_bound", s.InputBound()},
      {"input_wait_share", s.InputWaitShare()},
      {"input_bound_threshold", kInputBoundShare},
      {"input_bound_reason", s.InputBoundReason()},
      {"shapes", s.shapes ? ShapesJson(*s.shapes) : Json(nullptr)},
      {"errors", run.errors()},
      {"error_detail",
       {{"hash_mismatches", run.hash_mismatches},
        {"failed_transfers", run.failed_transfers},
        {"failed_allocations", run.failed_allocations},
        {"first_error",
         run.first_error.empty() ? Json(nullptr) : Json(run.first_error)}}},
      {"logs",
       {{"directory",
         s.log_directory.empty() ? Json(nullptr) : Json(s.log_directory)},
        {"info_file",
         s.log_directory.empty() ? Json(nullptr) : Json(s.InfoFile())}}},
  };
}

std::string Ms(double seconds) {
  return absl::StrFormat("%.1f ms", seconds * 1e3);
}
std::string Percent(double share) {
  return absl::StrFormat("%.0f%%", share * 100);
}

// The run, the transfers and the input waits (when steps ran).
void PrintRun(const Summary& s, std::ostream& out) {
  const RunCounters& run = s.run;
  const DemoConfig& c = s.config;
  {
    out << "\nRun\n";
    TextTable table;
    table.AddRow(
        {"loop time",
         absl::StrFormat("%.3f s (%s per step)", s.LoopSeconds(),
                         Ms(s.LoopSeconds() / static_cast<double>(c.steps)))});
    table.AddRow({"batches",
                  absl::StrCat(run.batches_pageable, " pageable, ",
                               run.batches_pinned, " in pinned host buffers")});
    table.AddRow(
        {"pinned-host fallbacks",
         absl::StrCat(run.fallbacks(), " to pageable (",
                      run.fallback_region_full, " region full, ",
                      run.fallback_over_threshold, " above the threshold, ",
                      run.fallback_region_off, " region off)")});
    const uint64_t h2d = s.BytesMoved(0), d2h = s.BytesMoved(1),
                   d2d = s.transfers.device_to_device.bytes;
    table.AddRow(
        {"bytes moved",
         absl::StrFormat(
             "%s h2d, %s d2h, %s d2d (%.2f GB/s over the loop)",
             HumanReadableBytes(h2d), HumanReadableBytes(d2h),
             HumanReadableBytes(d2d),
             s.LoopSeconds() > 0
                 ? static_cast<double>(h2d + d2h + d2d) * 1e-9 / s.LoopSeconds()
                 : 0.0)});
    table.Print(out);
  }

  out << "\nTransfers (GB/s: the mean rate of one transfer once started, "
         "bytes\n"
         "over summed start-to-ready time)\n";
  TextTable transfers(
      {"DIRECTION", "PATH", "TRANSFERS", "BYTES", "FAILED", "GB/s"});
  auto add = [&transfers](absl::string_view dir, absl::string_view path,
                          const PathStats& p) {
    const std::optional<double> gbps = Gbps(p);
    transfers.AddRow({std::string(dir), std::string(path),
                      absl::StrCat(p.transfers), HumanReadableBytes(p.bytes),
                      absl::StrCat(p.failed),
                      gbps.has_value() ? absl::StrFormat("%.2f", *gbps) : "-"});
  };
  for (DmaDirection dir : kHostDirections) {
    for (TransferPath path : kPaths) {
      add(DmaDirectionName(dir), TransferPathName(path),
          s.transfers.host[static_cast<int>(dir)][static_cast<int>(path)]);
    }
  }
  add(DmaDirectionName(DmaDirection::kDeviceToDevice), "-",
      s.transfers.device_to_device);
  transfers.Print(out);
  TextTable staging;
  staging.AddRow(
      {"staging waits",
       absl::StrCat(s.transfers.staging_waits, " (",
                    Ms(Seconds(s.transfers.staging_wait_ns)),
                    " in total), peak ",
                    HumanReadableBytes(s.transfers.peak_staging_bytes), " of ",
                    HumanReadableBytes(s.transfers.max_staging_bytes))});
  staging.AddRow(
      {"pinned transfers",
       absl::StrCat(s.transfers.pinned_over_threshold, " above the threshold, ",
                    s.transfers.pinned_region_off, " region off, ",
                    s.transfers.pinned_staging_timeout, " staging timeout, ",
                    s.transfers.pinned_not_premapped, " not premapped yet")});
  staging.Print(out);

  {
    const double steps = static_cast<double>(c.steps);
    out << "\nInput (per step; device times are means over the devices)\n";
    TextTable input;
    input.AddRow({"device input wait",
                  absl::StrCat(Ms(s.DeviceWaitSeconds() / steps), " (",
                               Percent(s.InputWaitShare()), " of the run)")});
    input.AddRow({"device compute", Ms(s.ComputeSeconds() / steps)});
    input.AddRow({"device result copies (d2d)", Ms(s.ResultSeconds() / steps)});
    input.AddRow({"loop waiting for producers",
                  absl::StrCat(Ms(Seconds(run.producer_wait_ns) / steps), " (",
                               Percent(s.Share(Seconds(run.producer_wait_ns))),
                               " of the run)")});
    input.AddRow({"loop waiting for results",
                  absl::StrCat(Ms(Seconds(run.result_wait_ns) / steps), " (",
                               Percent(s.Share(Seconds(run.result_wait_ns))),
                               " of the run)")});
    input.Print(out);
  }
}

// --shapes: device memory as a TPU's, per device.
void PrintShapes(const ShapesReport& r, std::ostream& out) {
  out << "\nShaped device memory (--shapes: " << r.arrays
      << " arrays per device in TPU's default layouts";
  if (r.divisor > 1) {
    out << ", leading dimensions / " << r.divisor << " to fit the HBM";
  }
  out << ", and activations each step)\n";
  TextTable table({"DEVICE", "BUFFERS", "PADDED IN USE", "UNPADDED",
                   "PEAK PADDED", "PEAK UNPADDED", "HBM"});
  for (const DeviceStats& d : r.devices) {
    table.AddRow({d.name, absl::StrCat(d.buffers_live),
                  HumanReadableBytes(d.padded_bytes_in_use),
                  HumanReadableBytes(d.unpadded_bytes_in_use),
                  HumanReadableBytes(d.peak_padded_bytes),
                  HumanReadableBytes(d.peak_unpadded_bytes),
                  HumanReadableBytes(d.hbm_bytes)});
  }
  table.Print(out);
  if (!r.worst_shape.empty()) {
    out << "The worst padded: " << r.worst_shape << " (" << r.worst_label
        << ") takes " << HumanReadableBytes(r.worst_padded) << " for "
        << HumanReadableBytes(r.worst_unpadded) << " of data ("
        << absl::StrFormat("%.1fx", static_cast<double>(r.worst_padded) /
                                        static_cast<double>(std::max<uint64_t>(
                                            1, r.worst_unpadded)))
        << "): " << r.worst_hint << ".\n";
  }
  out << "Array transfers (dense host bytes <-> tiles): " << r.array_transfers
      << ", round trips "
      << (r.round_trips_exact ? "bit-exact" : "NOT bit-exact") << ".\n";
  if (!r.error.empty()) out << "Failed: " << r.error << "\n";
  out << "Over time: TPUSHIM_MEMORY_PROFILE=/tmp/mem.jsonl tpushim demo "
         "--shapes, then tpushim memory /tmp/mem.jsonl --plot mem.png\n";
}

void PrintSummary(const Summary& s, std::ostream& out) {
  const RunCounters& run = s.run;
  const DemoConfig& c = s.config;
  if (run.interrupted_by != 0) {
    out << "tpushim demo: interrupted by "
        << InterruptSignalName(run.interrupted_by) << " after " << c.steps
        << " of " << s.steps_requested
        << " steps; the figures below are partial\n";
  }
  if (c.steps == 0 && run.interrupted_by == 0) {
    out << "tpushim demo: start-up and shut-down only (--steps 0)\n";
  } else {
    out << "tpushim demo: " << c.steps << " steps, batch "
        << HumanReadableBytes(c.batch_bytes) << " = " << c.devices << " x "
        << HumanReadableBytes(c.shard_bytes) << ", "
        << absl::StrFormat("%g", c.step_ms) << " ms modelled step, "
        << c.producers << " producers\n";
  }

  out << "\nStart-up\n";
  TextTable startup;
  startup.AddRow({"init time", absl::StrFormat("%.3f s", s.init_seconds)});
  if (s.region.background) {
    startup.AddRow(
        {"region ready",
         s.region_ready_seconds
             ? absl::StrFormat("%.3f s, premapped behind the run "
                               "(TPUSHIM_PREMAP=background)",
                               *s.region_ready_seconds)
         : !s.region.premap_error.empty()
             ? absl::StrCat("never: premapping stopped at ",
                            HumanReadableBytes(s.region.ready_bytes), " of ",
                            HumanReadableBytes(s.premapped_bytes), " (",
                            s.region.premap_error, ")")
             : absl::StrCat("not before the run ended (",
                            HumanReadableBytes(s.region.ready_bytes), " of ",
                            HumanReadableBytes(s.premapped_bytes), ")")});
  }
  if (s.premapped_bytes == 0) {
    startup.AddRow({"premapped region", "off (TPU_PREMAPPED_BUFFER_SIZE=0)"});
  } else {
    startup.AddRow(
        {"premapped region",
         absl::StrCat(BytesWithHumanReadable(s.premapped_bytes), ", ",
                      s.region.page_description,
                      s.region.locked ? ", mlocked" : ", not mlocked",
                      ", NUMA node ", s.region.numa_node)});
    startup.AddRow(
        {"transfer threshold", BytesWithHumanReadable(s.threshold_bytes)});
  }
  startup.AddRow({"devices", absl::StrCat(c.devices, " (", s.device_url, ")")});
  if (!s.devices.empty()) {
    const DeviceDescription& d = s.devices.front();
    startup.AddRow(
        {"device HBM, link",
         absl::StrCat(HumanReadableBytes(d.hbm_bytes), ", ",
                      d.link_gbps > 0 ? absl::StrFormat("%g Gb/s", d.link_gbps)
                                      : std::string("unthrottled"),
                      ", ", absl::StrFormat("%g", d.latency_us),
                      " us latency, ", d.dma_engines, " DMA engine(s)")});
  }
  startup.Print(out);
  if (!s.not_locked_reason.empty()) {
    out << "The region is not mlocked: " << s.not_locked_reason << "\n";
  }
  if (c.steps > 0 && run.loop_ns > 0) PrintRun(s, out);
  if (s.shapes) PrintShapes(*s.shapes, out);
  out << "\n" << s.InputBoundReason() << "\n";

  out << "\nErrors\n";
  TextTable errors;
  errors.AddRow({"hash mismatches", absl::StrCat(run.hash_mismatches)});
  errors.AddRow({"failed transfers", absl::StrCat(run.failed_transfers)});
  errors.AddRow({"failed allocations", absl::StrCat(run.failed_allocations)});
  if (!run.first_error.empty()) errors.AddRow({"first", run.first_error});
  errors.Print(out);

  out << "\nLogs: ";
  if (s.log_directory.empty()) {
    out << "none (TPU_LOG_DIR=disabled or unusable)";
  } else if (s.min_log_level >= 3) {
    out << s.log_directory << " (TPU_MIN_LOG_LEVEL=3: only FATAL lines, "
        << s.InfoFile() << " once there is one)";
  } else {
    out << s.InfoFile();
  }
  out << "\n";
  out << "errors = " << run.errors() << "\n";
}

}  // namespace tpushim::tools::demo_internal
