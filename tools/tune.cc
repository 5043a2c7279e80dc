#include "tools/tune.h"

#include <string.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
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
#include "tools/progress.h"
#include "tools/text_table.h"
#include "tools/tune_report.h"
#include "tools/tune_sweep.h"
#include "tools/tune_workload.h"

namespace tpushim::tools {
namespace {

using tune_internal::Aggregate;
using tune_internal::CheckInitArgs;
using tune_internal::FindGnuplot;
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
using tune_internal::RunOnce;
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

Recommendation: the smallest size (then the best threshold at it) with no
RESOURCE_EXHAUSTED, no failed transfer, a locked region (unless
TPUSHIM_MLOCK=off) and at least 95% of the best throughput of such points.
Machines are noisy: --repeats 3 takes the median of three runs per point,
and a point whose fastest run reaches the best point's slowest also counts
as good enough (gbps_range = [slowest, fastest]).

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
         "recommendation": {"found", "size_bytes", "threshold_bytes",
                            "environment", "gbps", "fraction_of_best",
                            "best_gbps", "reason"},
         "plot"}
--csv: one line per point (header: size_bytes,threshold_bytes,...).
--plot FILE.svg|FILE.png: throughput and start-up time against the size,
one line per threshold (needs gnuplot: apt-get install gnuplot-nox).
A progress bar goes to stderr only when it is a terminal.

Exit status: 0 when the sweep ran (failed points included); 1 when no
point could run or the plot failed; 2 for a bad command line, an invalid
workload, or --plot without gnuplot.

Examples:
  tpushim tune                                   # 256M..4G, default threshold
  tpushim tune --sizes 1G,4G,16G --thresholds 1M,16M,default
  tpushim tune --sizes 512M..8G --pinned-buffers 8 --pinned-bytes 64M \
      --transfer-sizes histogram:4K=50,1M=30,64M=20 --streams 4 --seconds 5
  tpushim tune --devices 4 --link-gbps 25 --step-ms 50 --step-bytes 256M
  tpushim tune --workload job.json --repeats 3 --json > sweep.json
  tpushim tune --sizes 256M..2G --plot sweep.svg)footer";

constexpr char kDefaultSizes[] = "256M..4G";
constexpr char kDefaultThresholds[] = "default";
constexpr int kMaxSweepValues = 256;

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

  int repeats = 1;
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
    if (!absl::EndsWith(flags.plot, ".svg") &&
        !absl::EndsWith(flags.plot, ".png")) {
      return usage(absl::InvalidArgumentError(absl::StrCat(
          "--plot=", flags.plot, ": the file must end in .svg or .png")));
    }
    gnuplot = FindGnuplot();
    if (!gnuplot) {
      return usage(absl::FailedPreconditionError(
          "--plot needs gnuplot, which is not installed (not found on PATH); "
          "install it with `apt-get install gnuplot-nox` (scripts/setup.sh "
          "does) or drop --plot"));
    }
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
  int done = 0;
  // Repeats go in rounds over all points, the first in sweep order, the
  // others in a seeded random order: what one child leaves behind in the
  // machine weighs on the next one's start-up (on this project's VM a 2G
  // point started in 0.3 s after a point like itself and in 3 s after
  // another), so a fixed order, even alternating, would pin that cost on
  // the same points every round.
  std::mt19937_64 order_rng(w->seed);
  std::vector<size_t> order(points.size());
  for (int r = 0; r < flags.repeats; ++r) {
    std::iota(order.begin(), order.end(), 0);
    if (r > 0) std::shuffle(order.begin(), order.end(), order_rng);
    for (size_t i : order) {
      Point& p = points[i];
      progress.Show(
          done,
          absl::StrCat("size=", SizeName(p.size), " threshold=",
                       p.size == 0       ? "-"
                       : p.threshold_set ? SizeName(*p.threshold_set)
                                         : "default",
                       flags.repeats > 1
                           ? absl::StrCat(" round ", r + 1, "/", flags.repeats)
                           : ""));
      RunOnce(*self, *w, *device, timeout, p);
      ++done;
    }
  }
  for (Point& p : points) Aggregate(*w, mlock_off, p);
  progress.Clear();

  const Json recommendation = Recommend(points);
  std::string plot_error;
  if (gnuplot) {
    absl::Status s = Plot(points, *w, *device, *gnuplot, flags.plot);
    if (!s.ok()) plot_error = std::string(s.message());
  }
  const bool any_ran = std::any_of(points.begin(), points.end(),
                                   [](const Point& p) { return p.ok(); });

  if (flags.json) {
    Json j;
    j["workload"] = WorkloadToJson(*w);
    j["device"] = *device;
    j["repeats"] = flags.repeats;
    j["dropped_combinations"] = dropped;
    j["points"] = Json::array();
    for (const Point& p : points) j["points"].push_back(PointJson(p));
    j["recommendation"] = recommendation;
    j["plot"] = flags.plot.empty() || !plot_error.empty() ? Json(nullptr)
                                                          : Json(flags.plot);
    WriteJson(j, *context.out);
  } else if (flags.csv) {
    PrintCsv(points, *context.out);
  } else {
    PrintTable(points, *w, *device, flags.repeats, dropped, recommendation,
               plot_error.empty() ? flags.plot : "", *context.out);
  }
  if (!plot_error.empty()) {
    *context.err << "tpushim: --plot " << flags.plot << ": " << plot_error
                 << "\n";
  }
  context.exit_code = any_ran && plot_error.empty() ? kExitOk : kExitFailure;
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
  given["streams"] = tune->add_option(
      "--streams", flags->streams,
      "Concurrent transfer streams, one transfer in flight each (default 2)");
  given["devices"] =
      tune->add_option("--devices", flags->devices,
                       "Simulated devices (sets devices= of TPUSHIM_DEVICE)");
  given["link_gbps"] = tune->add_option(
      "--link-gbps", flags->link_gbps,
      "Simulated link speed in Gb/s per direction (sets link_gbps=; 0 = "
      "unthrottled)");
  given["latency_us"] =
      tune->add_option("--latency-us", flags->latency_us,
                       "Simulated per-descriptor latency (sets latency_us=)");
  given["pinned_buffers"] = tune->add_option(
      "--pinned-buffers", flags->pinned_buffers,
      "Pinned premapped buffers the application keeps allocated (default 0)");
  given["pinned_bytes"] =
      tune->add_option("--pinned-bytes", flags->pinned_bytes,
                       "Size of each of those buffers (K/M/G)");
  given["zero_copy_share"] = tune->add_option(
      "--zero-copy-share", flags->zero_copy_share,
      "Share of h2d/d2h transfers that use the stream's pinned buffer, 0..1 "
      "(default 0)");
  given["seconds"] = tune->add_option("--seconds", flags->seconds,
                                      "Workload time per run (default 2)");
  given["count"] = tune->add_option(
      "--count", flags->count,
      "Transfers per run instead of --seconds (over all streams)");
  given["step_ms"] = tune->add_option(
      "--step-ms", flags->step_ms,
      "Modelled step (compute) time, for the input-bound verdict");
  given["step_bytes"] =
      tune->add_option("--step-bytes", flags->step_bytes,
                       "Input bytes a step needs (default 64M)");
  given["seed"] = tune->add_option("--seed", flags->seed,
                                   "Seed of the size and direction draws");
  tune->add_option("--repeats", flags->repeats,
                   "Runs per point; figures are medians (default 1)")
      ->default_val(1)
      ->check(CLI::Range(1, 100));
  tune->add_option("--point-timeout", flags->point_timeout,
                   "Seconds a run may take, start-up included, before it is "
                   "killed and reported as timeout")
      ->default_val(600)
      ->check(CLI::Range(1.0, 86400.0));
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
