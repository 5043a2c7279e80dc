#include "tools/memory/memory.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/human_bytes.h"
#include "common/saturating.h"
#include "device/hbm_report.h"
#include "device/xla_shape.h"
#include "tools/cli/gnuplot.h"
#include "tools/memory/profile_reader.h"

namespace tpushim::tools {
namespace {

using Json = nlohmann::ordered_json;

constexpr char kMemoryDescription[] =
    "Show what a TPUSHIM_MEMORY_PROFILE recorded: the peak device memory per "
    "device with its largest buffers, failed requests, and (--plot) padded "
    "and unpadded bytes in use over time";

constexpr char kMemoryFooter[] = R"(
Record a profile by setting TPUSHIM_MEMORY_PROFILE=<file> for any program
that uses the runtime, e.g.
  TPUSHIM_MEMORY_PROFILE=/tmp/mem.jsonl tpushim demo --shapes
  tpushim memory /tmp/mem.jsonl --plot mem.png

Exit status: 0; 1 when the file cannot be read or the plot not written;
2 for a bad flag or a file that is not a well-formed profile.)";

// Buffers listed per device, as XLA's report lists them.
constexpr int kListed = kHbmReportListed;
// Panels in a plot, and the samples a panel draws before it keeps only
// the highest of each stretch of time.
constexpr size_t kMaxPanels = 8;
constexpr size_t kMaxSamples = 4000;

struct MemoryFlags {
  std::string profile;
  std::string plot;
  bool json = false;
};

double Utilization(uint64_t unpadded, uint64_t padded) {
  return padded == 0 ? 100.0
                     : 100.0 * static_cast<double>(unpadded) /
                           static_cast<double>(padded);
}

HbmBuffer ReportBuffer(const ProfiledBuffer& b, uint64_t granule) {
  HbmBuffer h;
  h.padded_bytes = b.padded_bytes;
  h.unpadded_bytes = b.unpadded_bytes;
  h.held_bytes = (b.device_bytes + granule - 1) / granule * granule;
  if (!b.shape.empty()) {
    absl::StatusOr<ArrayShape> shape = ParseArrayShape(b.shape);
    if (shape.ok()) h.shape = *std::move(shape);
  }
  h.label = b.label;
  h.op_metadata = b.op_metadata;
  return h;
}

std::string Describe(const ProfiledBuffer& b) {
  std::string text = HumanReadableBytes(b.padded_bytes);
  if (!b.shape.empty()) absl::StrAppend(&text, " ", b.shape);
  if (!b.label.empty()) absl::StrAppend(&text, " (", b.label, ")");
  return text;
}

Json BufferJson(const ProfiledBuffer& b) {
  auto text = [](const std::string& s) {
    return s.empty() ? Json(nullptr) : Json(s);
  };
  return {{"t", b.t},
          {"size_bytes", b.padded_bytes},
          {"unpadded_bytes", b.unpadded_bytes},
          {"device_bytes", b.device_bytes},
          {"shape", text(b.shape)},
          {"label", text(b.label)},
          {"op", text(b.op_metadata)}};
}

void PrintDevice(const DeviceMemoryProfile& d, std::ostream& out) {
  out << "\n" << d.name << " (" << HumanReadableBytes(d.hbm_bytes) << " hbm): ";
  if (d.allocations == 0 && d.failed.empty()) {
    out << "no allocations.\n";
    return;
  }
  out << d.allocations
      << (d.allocations == 1 ? " allocation, " : " allocations, ") << d.frees
      << (d.frees == 1 ? " free" : " frees");
  if (!d.failed.empty()) {
    out << ", " << d.failed.size()
        << (d.failed.size() == 1 ? " failed request" : " failed requests");
  }
  out << "\n";
  if (d.peak_padded_bytes > 0) {
    out << absl::StrFormat(
        "  Peak: %s padded, %s unpadded (%.1f%% utilization) in %d "
        "buffer%s at %.3f s; %.1f%% of the hbm\n",
        HumanReadableBytes(d.peak_padded_bytes),
        HumanReadableBytes(d.peak_unpadded_bytes),
        Utilization(d.peak_unpadded_bytes, d.peak_padded_bytes),
        d.at_peak.size(), d.at_peak.size() == 1 ? "" : "s", d.peak_t,
        d.hbm_bytes == 0 ? 0.0
                         : 100.0 * static_cast<double>(d.peak_padded_bytes) /
                               static_cast<double>(d.hbm_bytes));
    std::vector<HbmBuffer> buffers;
    for (const ProfiledBuffer& b : d.at_peak) {
      buffers.push_back(ReportBuffer(b, d.granule));
    }
    std::vector<size_t> shown;
    for (size_t i = 0; i < buffers.size() && i < kListed; ++i) {
      shown.push_back(i);
    }
    out << "  Largest allocations at the peak"
        << (buffers.size() > shown.size()
                ? absl::StrCat(" (", shown.size(), " of ", buffers.size(), ")")
                : std::string())
        << ":\n"
        << FormatHbmBufferList(buffers, shown) << "\n";  // ends the list
  }
  if (!d.failed.empty()) {
    out << "  Failed requests:\n";
    for (size_t i = 0; i < d.failed.size() && i < kListed; ++i) {
      out << absl::StrFormat("    at %.3f s: %s\n", d.failed[i].t,
                             Describe(d.failed[i]));
    }
    if (d.failed.size() > kListed) {
      out << "    ... and " << d.failed.size() - kListed << " more\n";
    }
  }
  out << "  At the end: " << d.end.buffers
      << (d.end.buffers == 1 ? " buffer" : " buffers");
  if (d.end.buffers > 0) {
    out << ", " << HumanReadableBytes(d.end.padded_bytes) << " padded, "
        << HumanReadableBytes(d.end.unpadded_bytes) << " unpadded";
  }
  out << ".\n";
}

Json SummaryJson(const ProfileSummary& s, const MemoryFlags& flags,
                 bool plotted) {
  Json devices = Json::array();
  for (const DeviceMemoryProfile& d : s.devices) {
    Json peak = nullptr;
    if (d.peak_padded_bytes > 0) {
      Json largest = Json::array();
      for (size_t i = 0; i < d.at_peak.size() && i < kListed; ++i) {
        largest.push_back(BufferJson(d.at_peak[i]));
      }
      peak = {{"t", d.peak_t},
              {"padded_bytes", d.peak_padded_bytes},
              {"unpadded_bytes", d.peak_unpadded_bytes},
              {"buffers", d.at_peak.size()},
              {"utilization",
               Utilization(d.peak_unpadded_bytes, d.peak_padded_bytes) / 100},
              {"largest", largest}};
    }
    Json failed = Json::array();
    for (const ProfiledBuffer& b : d.failed) failed.push_back(BufferJson(b));
    devices.push_back({{"name", d.name},
                       {"hbm_bytes", d.hbm_bytes},
                       {"allocations", d.allocations},
                       {"frees", d.frees},
                       {"peak", peak},
                       {"max_unpadded_bytes", d.max_unpadded_bytes},
                       {"failed_requests", failed},
                       {"end",
                        {{"buffers", d.end.buffers},
                         {"padded_bytes", d.end.padded_bytes},
                         {"unpadded_bytes", d.end.unpadded_bytes}}}});
  }
  return {{"profile", flags.profile},
          {"pid", s.pid},
          {"started", s.started},
          {"duration_seconds", s.duration},
          {"complete", s.complete},
          {"cut_short", s.cut_short},
          {"devices", devices},
          {"plot", plotted ? Json(flags.plot) : Json(nullptr)}};
}

// The samples a panel draws: all of them, or for long runs the highest
// padded and unpadded figures of each of kMaxSamples stretches of time, so
// that no peak is lost.
std::vector<MemorySample> PlotSamples(const DeviceMemoryProfile& d,
                                      double duration) {
  std::vector<MemorySample> samples;
  samples.push_back({});  // starts empty at t = 0
  if (d.samples.size() <= kMaxSamples || duration <= 0) {
    samples.insert(samples.end(), d.samples.begin(), d.samples.end());
  } else {
    const double step = duration / static_cast<double>(kMaxSamples);
    for (const MemorySample& m : d.samples) {
      const double bucket = std::floor(m.t / step) * step;
      if (samples.size() > 1 && samples.back().t == bucket) {
        samples.back().padded_bytes =
            std::max(samples.back().padded_bytes, m.padded_bytes);
        samples.back().unpadded_bytes =
            std::max(samples.back().unpadded_bytes, m.unpadded_bytes);
      } else {
        MemorySample s = m;
        s.t = bucket;
        samples.push_back(s);
      }
    }
  }
  MemorySample last = samples.back();
  last.t = std::max(duration, last.t);
  samples.push_back(last);  // holds until the end
  return samples;
}

absl::Status Plot(const ProfileSummary& s, const MemoryFlags& flags,
                  const std::string& gnuplot, std::string& note) {
  std::vector<const DeviceMemoryProfile*> panels;
  size_t active = 0;
  for (const DeviceMemoryProfile& d : s.devices) {
    if (d.allocations == 0 && d.failed.empty()) continue;
    ++active;
    if (panels.size() < kMaxPanels) panels.push_back(&d);
  }
  if (panels.empty()) {
    return absl::FailedPreconditionError(
        "the profile has no device allocations, so there is nothing to plot");
  }
  if (active > panels.size()) {
    note = absl::StrCat("The plot shows the first ", panels.size(), " of the ",
                        active, " devices that allocated.");
  }
  // Each panel in MiB or GiB by what it shows: its data, and the capacity
  // when that is within reach (a device far larger than its data would
  // flatten the curves; the key then gives the capacity as a number).
  struct Scale {
    double unit = 1048576.0;
    const char* name = "MiB";
    bool capacity_shown = true;
    double ymax = 0;
  };
  std::vector<Scale> scales;
  std::vector<std::pair<std::string, std::string>> data;
  for (size_t p = 0; p < panels.size(); ++p) {
    const DeviceMemoryProfile& d = *panels[p];
    uint64_t top = d.peak_padded_bytes;
    for (const ProfiledBuffer& b : d.failed) {
      top = std::max(top, b.padded_bytes);
    }
    Scale scale;
    scale.capacity_shown = d.hbm_bytes <= 4 * std::max<uint64_t>(top, 1);
    if (scale.capacity_shown) top = std::max(top, d.hbm_bytes);
    if (top >= (uint64_t{1} << 30)) {
      scale.unit = 1073741824.0;
      scale.name = "GiB";
    }
    std::ostringstream samples;
    samples << "# t padded unpadded (" << scale.name << ")\n";
    for (const MemorySample& m : PlotSamples(d, s.duration)) {
      samples << absl::StrFormat(
          "%.6f %.6f %.6f\n", m.t,
          static_cast<double>(m.padded_bytes) / scale.unit,
          static_cast<double>(m.unpadded_bytes) / scale.unit);
    }
    std::ostringstream failed;
    failed << "# t bytes_wanted (" << scale.name << ")\n";
    for (const ProfiledBuffer& b : d.failed) {
      // Where the request would have taken the device: what was in use
      // then plus the request.
      auto after = std::upper_bound(
          d.samples.begin(), d.samples.end(), b.t,
          [](double t, const MemorySample& m) { return t < m.t; });
      const uint64_t in_use =
          after == d.samples.begin() ? 0 : std::prev(after)->padded_bytes;
      const uint64_t wanted = SaturatingAdd(in_use, b.padded_bytes);
      top = std::max(top, wanted);
      failed << absl::StrFormat("%.6f %.6f\n", b.t,
                                static_cast<double>(wanted) / scale.unit);
    }
    // Headroom above the data for the key.
    scale.ymax = static_cast<double>(top) / scale.unit * 1.45;
    scales.push_back(scale);
    data.emplace_back(absl::StrCat("samples", p, ".dat"), samples.str());
    data.emplace_back(absl::StrCat("failed", p, ".dat"), failed.str());
  }

  auto script = [&](const std::string& dir) {
    std::ostringstream gp;
    gp << "set multiplot layout " << panels.size() << ",1 title "
       << GnuplotString(absl::StrCat("tpushim memory: ", flags.profile))
       << " font ',11'\n"
       << "set grid\n"
       << "set key top left inside horizontal opaque\n"
       << "set xlabel 'time (s)'\n"
       << "set xrange [0:" << std::max(s.duration, 1e-3) << "]\n";
    for (size_t p = 0; p < panels.size(); ++p) {
      const DeviceMemoryProfile& d = *panels[p];
      const Scale& scale = scales[p];
      const std::string hbm = absl::StrCat(
          "hbm ", HumanReadableBytes(d.hbm_bytes),
          scale.capacity_shown ? "" : " (far above: not to scale)");
      gp << "set title "
         << GnuplotString(absl::StrCat(
                d.name, ": peak ", HumanReadableBytes(d.peak_padded_bytes),
                " padded, ", HumanReadableBytes(d.peak_unpadded_bytes),
                " unpadded at ", absl::StrFormat("%.3f", d.peak_t), " s"))
         << "\n"
         << "set ylabel '" << scale.name << " in use'\n"
         << "set yrange [0:" << scale.ymax << "]\n"
         << "plot " << GnuplotString(absl::StrCat(dir, "/samples", p, ".dat"))
         << " using 1:2 with fillsteps fs solid 0.35 lc rgb '#4477aa' "
            "title 'padded (what the device holds)', "
         << "'' using 1:3 with steps lw 2 lc rgb '#228833' "
            "title 'unpadded (the data)', ";
      if (scale.capacity_shown) {
        gp << static_cast<double>(d.hbm_bytes) / scale.unit
           << " with lines dt 2 lw 2 lc rgb '#cc3311' title '" << hbm << "'";
      } else {
        gp << "NaN with lines dt 2 lw 2 lc rgb '#cc3311' title '" << hbm << "'";
      }
      if (!d.failed.empty()) {
        gp << ", " << GnuplotString(absl::StrCat(dir, "/failed", p, ".dat"))
           << " using 1:2 with points pt 2 ps 2 lw 2 lc rgb '#cc3311' "
              "title 'failed request (in use + request)'";
      }
      gp << "\n";
    }
    gp << "unset multiplot\n";
    return gp.str();
  };
  const int height = static_cast<int>(std::max<size_t>(2, panels.size())) * 360;
  return RenderPlot(gnuplot, flags.plot, PlotSize{1100, height}, data, script);
}

void RunMemory(const MemoryFlags& flags, CommandContext& context) {
  std::optional<std::string> gnuplot;
  if (!flags.plot.empty()) {
    absl::StatusOr<std::string> found = GnuplotForPlot(flags.plot);
    if (!found.ok()) {
      ReportError(found.status(), "bad --plot", flags.json, kExitUsage,
                  context);
      return;
    }
    gnuplot = *found;
  }
  absl::StatusOr<std::string> text = context.os->ReadFile(flags.profile);
  if (!text.ok()) {
    ReportError(text.status(),
                absl::StrCat("cannot read the profile ", flags.profile),
                flags.json, kExitFailure, context);
    return;
  }
  absl::StatusOr<ProfileSummary> summary = ReadMemoryProfile(*text);
  if (!summary.ok()) {
    ReportError(summary.status(),
                absl::StrCat(flags.profile, " is not a well-formed profile"),
                flags.json, kExitUsage, context);
    return;
  }
  std::string plot_note;
  absl::Status plotted;
  if (gnuplot) plotted = Plot(*summary, flags, *gnuplot, plot_note);
  if (!plotted.ok()) {
    ReportError(plotted, absl::StrCat("cannot plot to ", flags.plot),
                flags.json, kExitFailure, context);
    return;
  }

  std::ostream& out = *context.out;
  if (flags.json) {
    WriteJson(SummaryJson(*summary, flags, gnuplot.has_value()), out);
    return;
  }
  const ProfileSummary& s = *summary;
  out << "Memory profile " << flags.profile << ": pid " << s.pid << ", started "
      << s.started << absl::StrFormat(", %.3f s, ", s.duration)
      << s.devices.size()
      << (s.devices.size() == 1 ? " device.\n" : " devices.\n");
  if (s.cut_short) {
    out << "Its last line is incomplete and was skipped: the process ended "
           "while writing it.\n";
  }
  if (!s.complete) {
    out << "It has no end record: the process ended without shutting the "
           "runtime down, so the figures stop at its last record.\n";
  }
  for (const DeviceMemoryProfile& d : s.devices) PrintDevice(d, out);
  if (gnuplot) {
    out << "\nPlot: " << flags.plot << "\n";
    if (!plot_note.empty()) out << plot_note << "\n";
  }
}

}  // namespace

void RegisterMemoryCommand(CLI::App& app, CommandContext& context) {
  CLI::App* memory = app.add_subcommand("memory", kMemoryDescription);
  memory->footer(kMemoryFooter);
  auto flags = std::make_shared<MemoryFlags>();
  memory
      ->add_option("PROFILE", flags->profile,
                   "A file TPUSHIM_MEMORY_PROFILE wrote")
      ->required();
  memory->add_option(
      "--plot", flags->plot,
      "Draw padded and unpadded bytes in use over time per device into this "
      ".png or .svg (needs gnuplot)");
  memory->add_flag("--json", flags->json, "Print one JSON object");
  memory->callback([flags, &context] { RunMemory(*flags, context); });
}

}  // namespace tpushim::tools
