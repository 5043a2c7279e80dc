#include "tools/tune/tune.h"

#include <string.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "env/device_url.h"
#include "nlohmann/json.hpp"
#include "tools/cli/flags.h"
#include "tools/cli/gnuplot.h"
#include "tools/cli/interrupt.h"
#include "tools/cli/progress.h"
#include "tools/cli/text_table.h"
#include "tools/tune/report.h"
#include "tools/tune/sweep.h"
#include "tools/tune/workload.h"

namespace tpushim::tools {
namespace {

using tune_internal::Aggregate;
using tune_internal::CheckInitArgs;
using tune_internal::GetEnv;
using tune_internal::Json;
using tune_internal::kSizeVariable;
using tune_internal::MakePoints;
using tune_internal::Plot;
using tune_internal::Point;
using tune_internal::PointDeviceUrl;
using tune_internal::PointJson;
using tune_internal::PrintCsv;
using tune_internal::PrintTable;
using tune_internal::Recommend;
using tune_internal::Recommendation;
using tune_internal::RunOnce;
using tune_internal::RunOrder;
using tune_internal::SelfPath;

constexpr char kTuneDescription[] =
    "Sweep TPU_PREMAPPED_BUFFER_SIZE x threshold for a workload, each point "
    "in a fresh process, and recommend a setting";

constexpr char kTuneFooter[] = R"footer(
Each point runs in a fresh child process with TPU_PREMAPPED_BUFFER_SIZE,
TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES and TPUSHIM_DEVICE set in its
environment (the rest of the environment is passed on, TPUSHIM_FAULTS
included), so start-up and pinning costs are real and nothing leaks between
points.

Sweep lists: comma-separated sizes (K/M/G/T), ranges A..B (doubling),
A..B:xK (times K), A..B:+S (plus S). --sizes may hold 0 (region off);
--thresholds may hold `default` (unset: the threshold equals the size).
Thresholds above a size are dropped (the runtime would clamp them).

Workload (options win over --workload FILE, a JSON object with the keys
transfer_sizes, directions, streams, devices, link_gbps, latency_us,
pinned_buffers, pinned_bytes, zero_copy_share, seconds, count, step_ms,
step_bytes, seed). Transfer sizes: 16M | uniform:1M-64M |
loguniform:4K-256M | histogram:4K=50,1M=30,64M=20. Each stream submits one
transfer at a time and awaits it; stream i uses device i % devices.

Per point: start-up time, pinned host bytes, GB/s (1 GB = 1e9 bytes),
share of host transfers per path, staging wait, RESOURCE_EXHAUSTED (the
application's pinned buffers the region could not hold, plus failed
transfers), fallbacks from staging to per-call pinning, input-bound (with
--step-ms: moving --step-bytes at the measured GB/s takes longer than a
step). Statuses: ok, failed, invalid, crashed, timeout.

Repeats: --repeats N (default 3) runs every point N times, in N rounds
over the whole sweep: the first round in sweep order, each later round in a
new seeded random order that never starts with the point the last round
ended with. A point's GB/s is the median of its runs and gbps_range their
[slowest, fastest] (in the table: GB/s and RANGE); other rates and times
are medians, failure counts the worst run's.

Recommendation: among the clean points (no RESOURCE_EXHAUSTED, no failed
transfer, a locked region unless TPUSHIM_MLOCK=off), the best is the one
with the highest median GB/s. A smaller size is recommended instead only
when its slowest run reaches 95% of the best median; of the points that
qualify (the best always does) the smallest size, and at that size the
highest median. "Within noise" (within_noise: true) means at least two
points ran cleanly and every clean point's gbps_range overlaps the best
point's: this sweep cannot tell them apart. When no point ran cleanly there
is no recommendation ("recommendation": null, and one sentence in
"no_recommendation_reason" says why) and the exit status is 1.

--json: {"workload", "device", "repeats", "dropped_combinations",
         "points": [{"size_bytes", "threshold_bytes", "threshold_set",
                     "status", "error", "startup_seconds", "init_seconds",
                     "pinned_host_bytes", "region_locked",
                     "peak_call_pinned_bytes", "gbps", "gbps_range",
                     "transfers", "bytes",
                     "path_share", "path_counts", "staging_waits",
                     "staging_wait_seconds", "resource_exhausted",
                     "pinned_alloc_failures", "failed_transfers",
                     "fallbacks", "over_threshold", "input_bound",
                     "step_input_ms", "peak_rss_bytes", "wall_seconds"}],
         "recommendation": null | {"size_bytes", "threshold_bytes",
                                   "environment", "gbps", "gbps_range",
                                   "fraction_of_best", "best_gbps",
                                   "within_noise", "reason"},
         "no_recommendation_reason", "plot"}
--csv: one line per point (header: size_bytes,threshold_bytes,...), with
the range as gbps_min,gbps_max.
--plot FILE.svg|FILE.png: throughput and start-up time against the size,
one line per threshold (needs gnuplot: apt-get install gnuplot-nox).
A progress bar goes to stderr only when it is a terminal.

Exit status: 0 when there is a recommendation (failed points included); 1
when no point ran cleanly or the plot failed; 2 for a bad command line, an
invalid workload, or --plot without gnuplot.

Examples:
  tpushim tune                                   # 256M..4G, default threshold
  tpushim tune --sizes 1G,4G,16G --thresholds 1M,16M,default
  tpushim tune --sizes 512M..8G --pinned-buffers 8 --pinned-bytes 64M \
      --transfer-sizes histogram:4K=50,1M=30,64M=20 --streams 4 --seconds 5
  tpushim tune --devices 4 --link-gbps 25 --step-ms 50 --step-bytes 256M
  tpushim tune --workload job.json --repeats 5 --json > sweep.json
  tpushim tune --sizes 256M..2G --plot sweep.svg)footer";

constexpr char kDefaultSizes[] = "256M..4G";
constexpr char kDefaultThresholds[] = "default";
constexpr int kMaxSweepValues = 256;
constexpr int kDefaultRepeats = 3;

// ---- Sweep lists
// ----------------------------------------------------------------

absl::Status ListError(absl::string_view what, absl::string_view item,
                       absl::string_view problem) {
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": \"", item, "\" ", problem));
}

absl::StatusOr<std::vector<uint64_t>> ExpandRange(absl::string_view item,
                                                  absl::string_view what) {
  const size_t dots = item.find("..");
  absl::string_view hi_text = item.substr(dots + 2);
  absl::string_view step_text;
  if (const size_t colon = hi_text.find(':');
      colon != absl::string_view::npos) {
    step_text = hi_text.substr(colon + 1);
    hi_text = hi_text.substr(0, colon);
  }
  absl::StatusOr<uint64_t> lo = ParseByteSize(item.substr(0, dots), what);
  if (!lo.ok()) return lo.status();
  absl::StatusOr<uint64_t> hi = ParseByteSize(hi_text, what);
  if (!hi.ok()) return hi.status();
  if (*lo == 0 || *lo > *hi) {
    return ListError(what, item, "is not a range A..B with 0 < A <= B");
  }
  uint64_t factor = 2;
  uint64_t add = 0;
  if (!step_text.empty()) {
    if (step_text[0] == 'x') {
      absl::StatusOr<uint64_t> k = ParseDecimal(
          step_text.substr(1), absl::StrCat(what, " step"), 2, 1024);
      if (!k.ok()) return k.status();
      factor = *k;
    } else if (step_text[0] == '+') {
      absl::StatusOr<uint64_t> s = ParseByteSize(step_text.substr(1), what);
      if (!s.ok()) return s.status();
      if (*s == 0) return ListError(what, item, "has a zero step");
      add = *s;
      factor = 1;
    } else {
      return ListError(what, item, "has a step that is not xK or +SIZE");
    }
  }
  std::vector<uint64_t> values;
  for (uint64_t v = *lo; v <= *hi;) {
    values.push_back(v);
    if (values.size() > static_cast<size_t>(kMaxSweepValues)) {
      return ListError(
          what, item,
          absl::StrCat("expands to more than ", kMaxSweepValues, " values"));
    }
    const uint64_t next = add > 0 ? v + add : v * factor;
    if (next <= v) break;  // overflow
    v = next;
  }
  return values;
}

}  // namespace

absl::StatusOr<std::vector<std::optional<uint64_t>>> ParseSweepList(
    absl::string_view text, absl::string_view what, bool allow_zero,
    bool allow_default) {
  std::set<uint64_t> values;
  bool with_default = false;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    if (item == "default") {
      if (!allow_default) {
        return ListError(what, item,
                         "is not allowed here (only in --thresholds)");
      }
      with_default = true;
      continue;
    }
    if (absl::StrContains(item, "..")) {
      absl::StatusOr<std::vector<uint64_t>> range = ExpandRange(item, what);
      if (!range.ok()) return range.status();
      values.insert(range->begin(), range->end());
    } else {
      absl::StatusOr<uint64_t> v = ParseByteSize(item, what);
      if (!v.ok()) return v.status();
      if (*v == 0 && !allow_zero) return ListError(what, item, "must be > 0");
      values.insert(*v);
    }
    if (values.size() > static_cast<size_t>(kMaxSweepValues)) {
      return ListError(
          what, text,
          absl::StrCat("has more than ", kMaxSweepValues, " values"));
    }
  }
  std::vector<std::optional<uint64_t>> out(values.begin(), values.end());
  if (with_default) out.push_back(std::nullopt);
  return out;
}

namespace {

// ---- Flags
// --------------------------------------------------------------------------

struct TuneFlags {
  std::string sizes = kDefaultSizes;
  std::string thresholds = kDefaultThresholds;
  std::string workload_file;
  // Workload options as given (applied over the file when given).
  std::string transfer_sizes, directions, pinned_bytes, step_bytes;
  int streams = 0, devices = 0, pinned_buffers = 0;
  double link_gbps = 0, latency_us = 0, zero_copy_share = 0, seconds = 0,
         step_ms = 0;
  uint64_t count = 0, seed = 0;
  std::map<std::string, CLI::Option*> given;  // workload key → its option

  int repeats = kDefaultRepeats;
  double point_timeout = 600;
  std::string plot;
  bool json = false;
  bool csv = false;
};

// The workload: defaults, then --workload FILE, then the options given.
absl::StatusOr<Workload> ResolveWorkload(const TuneFlags& flags) {
  Workload w = Workload::Default();
  if (!flags.workload_file.empty()) {
    std::ifstream in(flags.workload_file);
    if (!in) {
      return absl::InvalidArgumentError(
          absl::StrCat("--workload: cannot read \"", flags.workload_file,
                       "\": ", strerror(errno)));
    }
    const Json file = Json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (file.is_discarded()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--workload: \"", flags.workload_file, "\" is not valid JSON"));
    }
    absl::StatusOr<Workload> from_file = WorkloadFromJson(file, w);
    if (!from_file.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--workload \"", flags.workload_file,
                       "\": ", from_file.status().message()));
    }
    w = *std::move(from_file);
  }
  Json options = Json::object();
  auto given = [&](const char* key) {
    auto it = flags.given.find(key);
    return it != flags.given.end() && it->second->count() > 0;
  };
  if (given("transfer_sizes")) options["transfer_sizes"] = flags.transfer_sizes;
  if (given("directions")) {
    options["directions"] = Json::array();
    for (absl::string_view d : absl::StrSplit(flags.directions, ',')) {
      options["directions"].push_back(std::string(d));
    }
  }
  if (given("streams")) options["streams"] = flags.streams;
  if (given("devices")) options["devices"] = flags.devices;
  if (given("link_gbps")) options["link_gbps"] = flags.link_gbps;
  if (given("latency_us")) options["latency_us"] = flags.latency_us;
  if (given("pinned_buffers")) options["pinned_buffers"] = flags.pinned_buffers;
  if (given("pinned_bytes")) options["pinned_bytes"] = flags.pinned_bytes;
  if (given("zero_copy_share"))
    options["zero_copy_share"] = flags.zero_copy_share;
  if (given("seconds")) options["seconds"] = flags.seconds;
  if (given("count")) options["count"] = flags.count;
  if (given("step_ms")) options["step_ms"] = flags.step_ms;
  if (given("step_bytes")) options["step_bytes"] = flags.step_bytes;
  if (given("seed")) options["seed"] = flags.seed;
  absl::StatusOr<Workload> resolved = WorkloadFromJson(options, w);
  if (!resolved.ok()) {
    // Name the option rather than the JSON key.
    std::string message(resolved.status().message());
    if (absl::StartsWith(message, "workload \"")) {
      const size_t end = message.find('"', 10);
      std::string flag = absl::StrCat("--", message.substr(10, end - 10));
      std::replace(flag.begin(), flag.end(), '_', '-');
      message = absl::StrCat(flag, message.substr(end + 1));
    }
    return absl::InvalidArgumentError(message);
  }
  return resolved;
}

// ---- The command
// -------------------------------------------------------------------------

void RunTune(const TuneFlags& flags, CommandContext& context) {
  auto usage = [&](const absl::Status& status) {
    ReportError(status, "invalid command line", flags.json, kExitUsage,
                context);
  };
  absl::StatusOr<std::vector<std::optional<uint64_t>>> sizes =
      ParseSweepList(flags.sizes, "--sizes", /*allow_zero=*/true,
                     /*allow_default=*/false);
  if (!sizes.ok()) return usage(sizes.status());
  for (const std::optional<uint64_t>& s : *sizes) {
    if (*s % 4096 != 0) {
      return usage(absl::InvalidArgumentError(
          absl::StrCat("--sizes: ", *s, " is not a multiple of 4096, which ",
                       kSizeVariable, " must be (nearest: ", *s / 4096 * 4096,
                       " or ", (*s / 4096 + 1) * 4096, ")")));
    }
  }
  absl::StatusOr<std::vector<std::optional<uint64_t>>> thresholds =
      ParseSweepList(flags.thresholds, "--thresholds", /*allow_zero=*/false,
                     /*allow_default=*/true);
  if (!thresholds.ok()) return usage(thresholds.status());
  absl::StatusOr<Workload> w = ResolveWorkload(flags);
  if (!w.ok()) return usage(w.status());
  if (absl::Status s = CheckInitArgs(); !s.ok()) return usage(s);
  absl::StatusOr<std::string> device = PointDeviceUrl(*w);
  if (!device.ok()) return usage(device.status());
  std::optional<std::string> gnuplot;
  if (!flags.plot.empty()) {
    absl::StatusOr<std::string> found = GnuplotForPlot(flags.plot);
    if (!found.ok()) return usage(found.status());
    gnuplot = *found;
  }
  absl::StatusOr<std::string> self = SelfPath();
  if (!self.ok()) {
    return ReportError(self.status(), "cannot find the tpushim executable",
                       flags.json, kExitFailure, context);
  }
  const bool mlock_off = GetEnv("TPUSHIM_MLOCK").value_or("") == "off";

  int dropped = 0;
  std::vector<Point> points = MakePoints(*sizes, *thresholds, dropped);
  const int total = static_cast<int>(points.size()) * flags.repeats;
  ProgressBar progress(*context.err, "tune", total);
  const absl::Duration timeout = absl::Seconds(flags.point_timeout);
  // Repeats go in rounds over all points, the first in sweep order, the
  // others in a seeded random order: what one child leaves behind in the
  // machine weighs on the next one's start-up (on this project's VM a 2G
  // point started in 0.3 s after a point like itself and in 3 s after
  // another), so a fixed order, even alternating, would pin that cost on
  // the same points every round. Runs of one point are spread over the
  // sweep rather than back to back, so that a burst of load on the machine
  // lands on many points once rather than on one point's every run.
  const std::vector<size_t> order =
      RunOrder(points.size(), flags.repeats, w->seed);
  for (size_t done = 0; done < order.size(); ++done) {
    Point& p = points[order[done]];
    const size_t round = done / points.size();
    progress.Show(
        static_cast<int>(done),
        absl::StrCat("size=", SizeName(p.size), " threshold=",
                     p.size == 0       ? "-"
                     : p.threshold_set ? SizeName(*p.threshold_set)
                                       : "default",
                     flags.repeats > 1 ? absl::StrCat(" round ", round + 1, "/",
                                                      flags.repeats)
                                       : ""));
    // SIGINT or SIGTERM: the running child is killed (its group, through
    // the cancel fd) and no other starts.
    if (InterruptSignal() != 0) break;
    RunOnce(*self, *w, *device, timeout, p, InterruptFd());
  }
  const int interrupted_by = InterruptSignal();
  for (Point& p : points) {
    if (interrupted_by != 0 && p.ok() && p.runs.empty()) {
      p.status = "interrupted";
      p.error = {
          {"code", "CANCELLED"},
          {"message", absl::StrCat("not run: the sweep was interrupted "
                                   "by ",
                                   InterruptSignalName(interrupted_by))}};
    }
    Aggregate(*w, mlock_off, p);
  }
  progress.Clear();

  // An interrupted sweep is not complete enough to recommend from.
  Recommendation recommendation =
      interrupted_by == 0
          ? Recommend(points)
          : Recommendation{.json = nullptr,
                           .why_none = absl::StrCat(
                               "The sweep was interrupted by ",
                               InterruptSignalName(interrupted_by),
                               " before every point ran, so there is no "
                               "recommendation.")};
  std::string plot_error;
  if (gnuplot && interrupted_by == 0) {
    absl::Status s = Plot(points, *w, *device, *gnuplot, flags.plot);
    if (!s.ok()) plot_error = std::string(s.message());
  }

  if (flags.json) {
    Json j;
    j["workload"] = WorkloadToJson(*w);
    j["device"] = *device;
    j["repeats"] = flags.repeats;
    j["dropped_combinations"] = dropped;
    j["points"] = Json::array();
    for (const Point& p : points) j["points"].push_back(PointJson(p));
    j["recommendation"] = recommendation.json;
    j["no_recommendation_reason"] = recommendation.json.is_null()
                                        ? Json(recommendation.why_none)
                                        : Json(nullptr);
    j["plot"] = flags.plot.empty() || !plot_error.empty() || !gnuplot ||
                        interrupted_by != 0
                    ? Json(nullptr)
                    : Json(flags.plot);
    j["partial"] = interrupted_by != 0;
    j["interrupted_by"] = interrupted_by != 0
                              ? Json(InterruptSignalName(interrupted_by))
                              : Json(nullptr);
    WriteJson(j, *context.out);
  } else if (flags.csv) {
    PrintCsv(points, *context.out);
    // CSV has no place for it; the reason goes with the exit status.
    if (recommendation.json.is_null()) {
      *context.err << "tpushim tune: " << recommendation.why_none << "\n";
    }
  } else {
    PrintTable(points, *w, *device, flags.repeats, dropped, recommendation,
               plot_error.empty() ? flags.plot : "", *context.out);
  }
  if (!plot_error.empty()) {
    *context.err << "tpushim: --plot " << flags.plot << ": " << plot_error
                 << "\n";
  }
  context.exit_code = !recommendation.json.is_null() && plot_error.empty()
                          ? kExitOk
                          : kExitFailure;
}

}  // namespace

void RegisterTuneCommand(CLI::App& app, CommandContext& context) {
  CLI::App* tune = app.add_subcommand("tune", kTuneDescription);
  tune->footer(kTuneFooter);
  auto flags = std::make_shared<TuneFlags>();
  auto sweep_check = [](bool zero, bool dflt, const char* what) {
    return ParsingValidator(
        [=](const std::string& text) {
          return ParseSweepList(text, what, zero, dflt);
        },
        "LIST");
  };
  tune->add_option("--sizes", flags->sizes,
                   "TPU_PREMAPPED_BUFFER_SIZE values: sizes and ranges "
                   "(256M..4G doubles; :x4, :+512M steps); 0 = region off")
      ->default_val(kDefaultSizes)
      ->check(sweep_check(true, false, "--sizes"));
  tune->add_option("--thresholds", flags->thresholds,
                   "TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES values, "
                   "like --sizes; `default` = unset (equal to the size)")
      ->default_val(kDefaultThresholds)
      ->check(sweep_check(false, true, "--thresholds"));
  tune->add_option("--workload", flags->workload_file,
                   "A JSON file describing the workload (options below win)")
      ->check(CLI::ExistingFile);

  auto& given = flags->given;
  given["transfer_sizes"] = tune->add_option(
      "--transfer-sizes", flags->transfer_sizes,
      "Transfer size distribution: 16M, uniform:1M-64M, loguniform:4K-256M, "
      "histogram:4K=50,1M=30 (default loguniform:64K-64M)");
  given["directions"] = tune->add_option(
      "--directions", flags->directions,
      "Transfer directions, a uniform mix of h2d, d2h, d2d (default h2d,d2h)");
  // Each workload option: its range is the workload file's for that key
  // (tools/tune/workload.h), and its default is the workload's, shown in
  // the help text (the flag's own default is not used).
  given["streams"] = AddWholeFlag(
      tune, "--streams", &flags->streams,
      {.unit = "streams", .min = 1, .max = kMaxStreams},
      "Concurrent transfer streams, one transfer in flight each (default 2)");
  given["devices"] =
      AddWholeFlag(tune, "--devices", &flags->devices,
                   {.unit = "devices", .min = 1, .max = 64},
                   "Simulated devices (sets devices= of TPUSHIM_DEVICE)");
  given["link_gbps"] = AddDecimalFlag(
      tune, "--link-gbps", &flags->link_gbps,
      {.unit = "Gb/s", .min = 0, .max = 1e6},
      "Simulated link speed in Gb/s per direction (sets link_gbps=; 0 = "
      "unthrottled)");
  given["latency_us"] =
      AddDecimalFlag(tune, "--latency-us", &flags->latency_us,
                     {.unit = "microseconds", .min = 0, .max = 1e6},
                     "Simulated per-descriptor latency (sets latency_us=)");
  given["pinned_buffers"] = AddWholeFlag(
      tune, "--pinned-buffers", &flags->pinned_buffers,
      {.unit = "buffers", .min = 0, .max = kMaxPinnedBuffers},
      "Pinned premapped buffers the application keeps allocated (default 0)");
  given["pinned_bytes"] =
      AddByteFlag(tune, "--pinned-bytes", &flags->pinned_bytes,
                  {.min = 0, .max = kMaxTransferBytes},
                  "Size of each of those buffers (K/M/G)");
  given["zero_copy_share"] = AddDecimalFlag(
      tune, "--zero-copy-share", &flags->zero_copy_share,
      {.unit = "", .min = 0, .max = 1},
      "Share of h2d/d2h transfers that use the stream's pinned buffer, 0..1 "
      "(default 0)");
  given["seconds"] = AddDecimalFlag(tune, "--seconds", &flags->seconds,
                                    {.unit = "seconds", .min = 0, .max = 86400},
                                    "Workload time per run (default 2)");
  given["count"] =
      AddWholeFlag(tune, "--count", &flags->count,
                   {.unit = "transfers", .min = 0, .max = int64_t{1} << 40},
                   "Transfers per run instead of --seconds (over all streams)");
  given["step_ms"] = AddDecimalFlag(
      tune, "--step-ms", &flags->step_ms,
      {.unit = "milliseconds", .min = 0, .max = 3.6e6},
      "Modelled step (compute) time, for the input-bound verdict");
  given["step_bytes"] =
      AddByteFlag(tune, "--step-bytes", &flags->step_bytes, {.min = 1},
                  "Input bytes a step needs (default 64M)");
  given["seed"] =
      AddWholeFlag(tune, "--seed", &flags->seed, {.unit = "", .min = 0},
                   "Seed of the size and direction draws");
  for (auto& [key, option] : given) option->default_str("");
  AddWholeFlag(tune, "--repeats", &flags->repeats,
               {.unit = "runs", .min = 1, .max = 100},
               "Runs per point, in rounds over all points; figures are "
               "medians, with the GB/s range (default 3)");
  AddDecimalFlag(tune, "--point-timeout", &flags->point_timeout,
                 {.unit = "seconds", .min = 1, .max = 86400},
                 "Seconds a run may take, start-up included, before it is "
                 "killed and reported as timeout");
  tune->add_option("--plot", flags->plot,
                   "Draw throughput and start-up time against the size into "
                   "FILE.svg or FILE.png (needs gnuplot)");
  CLI::Option* json = tune->add_flag("--json", flags->json,
                                     "Print one JSON object instead of tables");
  CLI::Option* csv = tune->add_flag("--csv", flags->csv,
                                    "Print CSV (a header, one line per point)");
  json->excludes(csv);
  tune->callback([flags, &context] { RunTune(*flags, context); });

  RegisterTunePointCommand(app, context);
}

}  // namespace tpushim::tools
