#include "tools/tune/report.h"

#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <fstream>
#include <map>
#include <ostream>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/time/time.h"
#include "common/human_bytes.h"
#include "common/subprocess.h"
#include "nlohmann/json.hpp"
#include "tools/cli/gnuplot.h"
#include "tools/cli/text_table.h"
#include "tools/tune/workload.h"

namespace tpushim::tools::tune_internal {

constexpr char kCsvHeader[] =
    "size_bytes,threshold_bytes,threshold_set,status,startup_seconds,"
    "pinned_host_bytes,region_locked,gbps,gbps_min,gbps_max,transfers,"
    "zero_copy_share,"
    "staged_share,pinned_share,staging_wait_seconds,resource_exhausted,"
    "failed_transfers,fallbacks,input_bound,error";

// ---- Output
// ---------------------------------------------------------------------------

Json PointJson(const Point& p) {
  const Json& f = p.figures;
  auto fig = [&](const char* key) -> Json {
    return p.ok() && f.contains(key) ? f[key] : Json(nullptr);
  };
  Json j = {{"size_bytes", p.size},
            {"threshold_bytes", fig("threshold_bytes")},
            {"threshold_set",
             p.threshold_set ? Json(*p.threshold_set) : Json(nullptr)},
            {"status", p.status},
            {"error", p.error}};
  for (const char* key : {"startup_seconds",
                          "init_seconds",
                          "pinned_host_bytes",
                          "region_locked",
                          "peak_call_pinned_bytes",
                          "gbps",
                          "gbps_range",
                          "transfers",
                          "bytes",
                          "path_share",
                          "path_counts",
                          "staging_waits",
                          "staging_wait_seconds",
                          "resource_exhausted",
                          "pinned_alloc_failures",
                          "failed_transfers",
                          "fallbacks",
                          "over_threshold",
                          "input_bound",
                          "step_input_ms"}) {
    j[key] = fig(key);
  }
  j["peak_rss_bytes"] = p.peak_rss_bytes;
  j["wall_seconds"] = p.wall_seconds;
  return j;
}

std::string Csv(const Json& v) {
  if (v.is_null()) return "";
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  if (v.is_number_float()) return absl::StrFormat("%.4f", v.get<double>());
  if (v.is_string()) {
    std::string s = v.get<std::string>();
    if (s.find_first_of(",\"\n") == std::string::npos) return s;
    std::string quoted = "\"";
    for (char c : s) {
      if (c == '"') quoted += '"';
      quoted += c == '\n' ? ' ' : c;
    }
    return quoted + "\"";
  }
  return v.dump();
}

void PrintCsv(const std::vector<Point>& points, std::ostream& out) {
  out << kCsvHeader << "\n";
  for (const Point& p : points) {
    const Json j = PointJson(p);
    const Json& share = j["path_share"];
    auto s = [&](const char* k) {
      return share.is_null() ? Json(nullptr) : share[k];
    };
    const Json& range = j["gbps_range"];
    auto r = [&](int i) { return range.is_null() ? Json(nullptr) : range[i]; };
    out << absl::StrJoin(
               {Csv(j["size_bytes"]),
                Csv(j["threshold_bytes"]),
                Csv(j["threshold_set"]),
                Csv(j["status"]),
                Csv(j["startup_seconds"]),
                Csv(j["pinned_host_bytes"]),
                Csv(j["region_locked"]),
                Csv(j["gbps"]),
                Csv(r(0)),
                Csv(r(1)),
                Csv(j["transfers"]),
                Csv(s("zero_copy")),
                Csv(s("staged")),
                Csv(s("pinned")),
                Csv(j["staging_wait_seconds"]),
                Csv(j["resource_exhausted"]),
                Csv(j["failed_transfers"]),
                Csv(j["fallbacks"]),
                Csv(j["input_bound"]),
                Csv(p.error.is_null() ? Json(nullptr) : p.error["message"])},
               ",")
        << "\n";
  }
}

std::string Percent(const Json& share) {
  return share.is_null() ? "-"
                         : absl::StrFormat("%.0f%%", 100 * share.get<double>());
}

std::string WorkloadSummary(const Workload& w, const std::string& device) {
  std::vector<std::string> parts = {
      absl::StrCat("transfers ", w.transfer_sizes.text())};
  std::vector<std::string> dirs;
  for (DmaDirection d : w.directions) dirs.emplace_back(DmaDirectionName(d));
  parts.push_back(absl::StrJoin(dirs, ","));
  parts.push_back(
      absl::StrCat(w.streams, w.streams == 1 ? " stream" : " streams"));
  if (w.pinned_buffers > 0) {
    parts.push_back(absl::StrCat(w.pinned_buffers, " pinned buffers of ",
                                 SizeName(w.pinned_bytes)));
  }
  if (w.zero_copy_share > 0) {
    parts.push_back(
        absl::StrFormat("%.0f%% zero-copy", 100 * w.zero_copy_share));
  }
  parts.push_back(w.count > 0 ? absl::StrCat(w.count, " transfers per point")
                              : absl::StrFormat("%g s per point", w.seconds));
  if (w.step_ms > 0) {
    parts.push_back(absl::StrFormat("steps of %g ms needing %s", w.step_ms,
                                    SizeName(w.step_bytes)));
  }
  parts.push_back(device);
  return absl::StrJoin(parts, ", ");
}

void PrintTable(const std::vector<Point>& points, const Workload& w,
                const std::string& device, int repeats, int dropped,
                const Recommendation& recommendation, const std::string& plot,
                std::ostream& out) {
  out << "tpushim tune: " << points.size()
      << (points.size() == 1 ? " point, " : " points, ") << repeats
      << (repeats == 1 ? " run" : " runs")
      << " each, every run in a fresh process\n";
  out << "workload: " << WorkloadSummary(w, device) << "\n";
  if (dropped > 0) {
    out << dropped << " threshold(s) at or above a size were dropped: the "
        << "runtime clamps them to the size (the default threshold).\n";
  }
  out << "\n";
  TextTable table({"SIZE", "THRESHOLD", "STATUS", "START-UP", "PINNED", "GB/s",
                   "RANGE", "ZERO-COPY", "STAGED", "PINNED-PATH",
                   "STAGING-WAIT", "RES-EXH", "FALLBACKS", "INPUT-BOUND"});
  for (const Point& p : points) {
    const std::string threshold = p.size == 0       ? "-"
                                  : p.threshold_set ? SizeName(*p.threshold_set)
                                                    : "default";
    if (!p.ok()) {
      table.AddRow({SizeName(p.size), threshold, p.status});
      continue;
    }
    const Json& f = p.figures;
    std::string pinned =
        HumanReadableBytes(f["pinned_host_bytes"].get<uint64_t>());
    if (f["unlocked"].get<bool>()) pinned = "unlocked";
    table.AddRow(
        {SizeName(p.size), threshold, "ok",
         absl::StrFormat("%.2f s", f["startup_seconds"].get<double>()), pinned,
         absl::StrFormat("%.2f", p.gbps()),
         p.runs.size() > 1
             ? absl::StrFormat("%.2f-%.2f", p.gbps_min(), p.gbps_max())
             : "-",
         Percent(f["path_share"]["zero_copy"]),
         Percent(f["path_share"]["staged"]), Percent(f["path_share"]["pinned"]),
         absl::StrFormat("%.3f s", f["staging_wait_seconds"].get<double>()),
         absl::StrCat(p.Count("resource_exhausted")),
         absl::StrCat(p.Count("fallbacks")),
         f["input_bound"].is_null() ? "-"
         : f["input_bound"].get<bool>()
             ? absl::StrFormat("yes (%.1f ms)",
                               f["step_input_ms"].get<double>())
             : absl::StrFormat("no (%.1f ms)",
                               f["step_input_ms"].get<double>())});
  }
  table.Print(out);

  bool header = false;
  for (const Point& p : points) {
    std::string note;
    if (!p.ok()) {
      note =
          absl::StrCat(p.status, ": ", p.error["message"].get<std::string>());
    } else if (p.Count("failed_transfers") > 0) {
      note = absl::StrCat(p.Count("failed_transfers"),
                          " transfers failed; the first: ",
                          p.figures["first_error"].get<std::string>());
    }
    if (note.empty()) continue;
    if (!header) out << "\nProblems:\n";
    header = true;
    out << "  " << p.Name() << ": " << note << "\n";
  }

  out << "\nPINNED = the region when locked + peak per-call pinned memory; "
         "GB/s = bytes moved / seconds (1 GB = 1e9 bytes)"
      << (repeats > 1 ? ", the median of the runs; RANGE = slowest-fastest run"
                      : "")
      << "; path shares are of host transfers.\n\n";
  const Json& rec = recommendation.json;
  if (rec.is_null()) {
    out << "Recommendation: none.\n  " << recommendation.why_none << "\n";
  } else {
    out << "Recommendation: " << kSizeVariable << "="
        << rec["environment"][kSizeVariable].get<std::string>();
    if (rec["environment"].contains(kThresholdVariable)) {
      out << " " << kThresholdVariable << "="
          << rec["environment"][kThresholdVariable].get<std::string>();
    }
    if (rec["within_noise"].get<bool>()) out << " (within noise)";
    out << "\n  " << rec["reason"].get<std::string>() << "\n";
  }
  if (!plot.empty()) out << "\nPlot: " << plot << "\n";
}

// ---- Plot
// ------------------------------------------------------------------------------

// Writes `file` (.svg or .png) with gnuplot: throughput and start-up time
// against the size (log2 axis), one line per threshold, RESOURCE_EXHAUSTED
// points marked. Region-off and failed points are left out.
absl::Status Plot(const std::vector<Point>& points, const Workload& w,
                  const std::string& device, const std::string& gnuplot,
                  const std::string& file) {
  std::vector<std::string> labels;  // one data block per threshold setting
  std::map<std::string, std::vector<const Point*>> blocks;
  std::vector<std::pair<uint64_t, std::string>> tics;
  std::set<uint64_t> tic_sizes;
  bool any_marks = false;
  std::ostringstream marks_text;
  for (const Point& p : points) {
    if (!p.ok() || p.size == 0) continue;
    const std::string label =
        p.threshold_set ? absl::StrCat("threshold ", SizeName(*p.threshold_set))
                        : "default threshold";
    if (blocks.count(label) == 0) labels.push_back(label);
    blocks[label].push_back(&p);
    if (tic_sizes.insert(p.size).second)
      tics.emplace_back(p.size, SizeName(p.size));
    if (p.Count("resource_exhausted") > 0) {
      any_marks = true;
      marks_text << p.size << " " << p.gbps() << " "
                 << p.figures["startup_seconds"].get<double>() << "\n";
    }
  }
  std::ostringstream data_text;
  for (const std::string& label : labels) {
    data_text << "\"" << label << "\" gbps startup\n";
    for (const Point* p : blocks[label]) {
      data_text << p->size << " " << p->gbps() << " "
                << p->figures["startup_seconds"].get<double>() << "\n";
    }
    data_text << "\n\n";
  }
  if (labels.empty()) {
    return absl::FailedPreconditionError(
        "no point with the region on ran, so there is nothing to plot");
  }

  std::vector<std::string> tic_list;
  for (const auto& [bytes, name] : tics) {
    tic_list.push_back(absl::StrCat("\"", name, "\" ", bytes));
  }
  auto script = [&](const std::string& dir) {
    const std::string data = dir + "/points.dat";
    const std::string marks = dir + "/exhausted.dat";
    std::ostringstream gp;
    gp << "set multiplot layout 2,1 title \"tpushim tune\\n"
       << absl::StrReplaceAll(WorkloadSummary(w, device), {{"\"", "'"}})
       << "\" font ',10'\n"
       << "set logscale x 2\n"
       << "set xtics (" << absl::StrJoin(tic_list, ", ")
       << ")\n"
       // Room on both sides so the end points and their labels show.
       << "set xrange [" << tics.front().first / 1.5 << ":"
       << static_cast<double>(tics.back().first) * 1.5 << "]\n"
       << "set xlabel 'TPU_PREMAPPED_BUFFER_SIZE'\n"
       << "set grid\n"
       << "set key top left inside opaque box Left reverse\n"
       << "set yrange [0:*]\n";
    for (const auto& [column, ylabel] :
         {std::pair<int, const char*>{2, "throughput (GB/s)"},
          std::pair<int, const char*>{3, "start-up (s)"}}) {
      gp << "set ylabel '" << ylabel << "'\n"
         << "plot for [i=0:" << labels.size() - 1 << "] " << GnuplotString(data)
         << " index i using 1:" << column
         << " with linespoints lw 2 pt 7 title columnheader(1)";
      if (any_marks) {
        gp << ", " << GnuplotString(marks) << " using 1:" << column
           << " with points pt 2 ps 2 lw 2 lc rgb 'red' title "
              "'RESOURCE_EXHAUSTED'";
      }
      gp << "\n";
    }
    gp << "unset multiplot\n";
    return gp.str();
  };
  return RenderPlot(
      gnuplot, file, PlotSize{1000, 800},
      {{"points.dat", data_text.str()}, {"exhausted.dat", marks_text.str()}},
      script);
}

}  // namespace tpushim::tools::tune_internal
