#include "tools/tune.h"

#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <ostream>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/human_bytes.h"
#include "common/subprocess.h"
#include "env/device_url.h"
#include "nlohmann/json.hpp"
#include "tools/progress.h"
#include "tools/text_table.h"
#include "tools/tune_workload.h"

extern char** environ;

namespace tpushim::tools {
namespace {

using Json = nlohmann::ordered_json;

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
constexpr double kGoodEnough = 0.95;
constexpr char kCsvHeader[] =
    "size_bytes,threshold_bytes,threshold_set,status,startup_seconds,"
    "pinned_host_bytes,region_locked,gbps,transfers,zero_copy_share,"
    "staged_share,pinned_share,staging_wait_seconds,resource_exhausted,"
    "failed_transfers,fallbacks,input_bound,error";
constexpr char kSizeVariable[] = "TPU_PREMAPPED_BUFFER_SIZE";
constexpr char kThresholdVariable[] =
    "TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES";

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

// ---- The environment of a point
// ---------------------------------------------------------

std::optional<std::string> GetEnv(const char* name) {
  const char* v = getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

// The device URL the children get: TPUSHIM_DEVICE (or sim://) with the
// workload's devices, link_gbps and latency_us set.
absl::StatusOr<std::string> PointDeviceUrl(const Workload& w) {
  std::string url = GetEnv("TPUSHIM_DEVICE").value_or("sim://");
  if (w.devices)
    url = WithUrlParameter(url, "devices", absl::StrCat(*w.devices));
  if (w.link_gbps) {
    url =
        WithUrlParameter(url, "link_gbps", absl::StrFormat("%g", *w.link_gbps));
  }
  if (w.latency_us) {
    url = WithUrlParameter(url, "latency_us",
                           absl::StrFormat("%g", *w.latency_us));
  }
  absl::StatusOr<DeviceUrl> parsed = ParseDeviceUrl(url);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the device URL for the sweep, ", url,
                     ", is invalid: ", parsed.status().message()));
  }
  return url;
}

// LIBTPU_INIT_ARGS outranks the environment (CONTRACTS §1): a flag there
// would silently pin every point to one setting.
absl::Status CheckInitArgs() {
  const std::string args = GetEnv("LIBTPU_INIT_ARGS").value_or("");
  for (const char* flag : {"--tpu_premapped_buffer_size",
                           "--tpu_premapped_buffer_transfer_threshold_bytes"}) {
    if (absl::StrContains(args, flag)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "LIBTPU_INIT_ARGS sets ", flag,
          ", which outranks the environment variables the sweep sets; "
          "remove it for the sweep"));
    }
  }
  return absl::OkStatus();
}

std::vector<std::string> PointEnvironment(uint64_t size,
                                          std::optional<uint64_t> threshold,
                                          const std::string& device_url) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const absl::string_view entry(*e);
    const absl::string_view name = entry.substr(0, entry.find('='));
    if (name == kSizeVariable || name == kThresholdVariable ||
        name == "TPUSHIM_DEVICE") {
      continue;
    }
    env.emplace_back(entry);
  }
  env.push_back(absl::StrCat(kSizeVariable, "=", size));
  if (threshold)
    env.push_back(absl::StrCat(kThresholdVariable, "=", *threshold));
  env.push_back(absl::StrCat("TPUSHIM_DEVICE=", device_url));
  return env;
}

absl::StatusOr<std::string> SelfPath() {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n < 0) return absl::ErrnoToStatus(errno, "readlink(/proc/self/exe)");
  return std::string(buf, static_cast<size_t>(n));
}

// The executable gnuplot on PATH, if any.
std::optional<std::string> FindGnuplot() {
  const std::string path = GetEnv("PATH").value_or("/usr/bin:/bin");
  for (absl::string_view dir : absl::StrSplit(path, ':', absl::SkipEmpty())) {
    std::string candidate = absl::StrCat(dir, "/gnuplot");
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return std::nullopt;
}

// ---- Points
// ---------------------------------------------------------------------------

struct Point {
  uint64_t size = 0;
  std::optional<uint64_t> threshold_set{};  // nullopt: default
  std::vector<Json> runs{};  // the children's JSON, one per repeat
  std::string status = "ok";
  Json error = nullptr;
  double wall_seconds = 0;
  uint64_t peak_rss_bytes = 0;
  Json figures{};  // the aggregated figures of an "ok" point

  std::string Name() const {
    return absl::StrCat(SizeName(size), "/",
                        size == 0       ? "-"
                        : threshold_set ? SizeName(*threshold_set)
                                        : "default");
  }
  bool ok() const { return status == "ok"; }
  double gbps() const { return ok() ? figures["gbps"].get<double>() : 0.0; }
  // The slowest and fastest of its runs.
  double gbps_min() const {
    return ok() ? figures["gbps_range"][0].get<double>() : 0.0;
  }
  double gbps_max() const {
    return ok() ? figures["gbps_range"][1].get<double>() : 0.0;
  }
  uint64_t Count(const char* key) const {
    return ok() ? figures[key].get<uint64_t>() : 0;
  }
};

// Points in size order, thresholds ascending then `default`; combinations
// the runtime would clamp (threshold >= size) fold into `default`.
std::vector<Point> MakePoints(
    const std::vector<std::optional<uint64_t>>& sizes,
    const std::vector<std::optional<uint64_t>>& thresholds, int& dropped) {
  std::vector<Point> points;
  dropped = 0;
  for (const std::optional<uint64_t>& size : sizes) {
    if (*size == 0) {
      points.push_back({.size = 0});
      dropped += static_cast<int>(thresholds.size()) - 1;
      continue;
    }
    bool have_default = false;
    int kept = 0;
    for (const std::optional<uint64_t>& t : thresholds) {
      if (t && *t < *size) {
        points.push_back({.size = *size, .threshold_set = *t});
        ++kept;
      } else if (!have_default) {
        points.push_back({.size = *size});
        have_default = true;
        ++kept;
      }
    }
    dropped += static_cast<int>(thresholds.size()) - kept;
  }
  return points;
}

Json Median(std::vector<double> v) {
  if (v.empty()) return nullptr;
  std::sort(v.begin(), v.end());
  return v.size() % 2 == 1 ? v[v.size() / 2]
                           : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

const char* SignalName(int sig) {
  switch (sig) {
    case SIGKILL:
      return "SIGKILL";
    case SIGSEGV:
      return "SIGSEGV";
    case SIGABRT:
      return "SIGABRT";
    case SIGBUS:
      return "SIGBUS";
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    case SIGXCPU:
      return "SIGXCPU";
    default:
      return "signal";
  }
}

// The last `lines` lines of `text`, without its trailing newlines.
std::string Tail(absl::string_view text, int lines) {
  while (!text.empty() && text.back() == '\n') text.remove_suffix(1);
  size_t start = text.size();
  for (int i = 0; i < lines && start > 0; ++i) {
    const size_t newline = text.rfind('\n', start - 1);
    start = newline == absl::string_view::npos ? 0 : newline;
    if (newline == absl::string_view::npos) break;
  }
  if (start < text.size() && text[start] == '\n') ++start;
  return std::string(text.substr(start));
}

// One child run of `point`: appends its JSON, or records why it failed.
void RunOnce(const std::string& self, const Workload& w,
             const std::string& device_url, absl::Duration timeout,
             Point& point) {
  const std::string workload = WorkloadToJson(w).dump();
  absl::StatusOr<SubprocessResult> r = RunSubprocess(
      self, {"tune-point", "--workload", workload},
      PointEnvironment(point.size, point.threshold_set, device_url), timeout);
  auto fail = [&](absl::string_view status, absl::StatusCode code,
                  const std::string& message) {
    if (!point.ok()) return;  // the first failure is the point's
    point.status = std::string(status);
    point.error = {{"code", absl::StatusCodeToString(code)},
                   {"message", message}};
  };
  if (!r.ok()) {
    if (absl::IsDeadlineExceeded(r.status())) {
      fail("timeout", absl::StatusCode::kDeadlineExceeded,
           absl::StrCat("the point ran longer than --point-timeout=",
                        absl::FormatDuration(timeout), " and was killed"));
    } else {
      fail("failed", r.status().code(), std::string(r.status().message()));
    }
    return;
  }
  point.wall_seconds += absl::ToDoubleSeconds(r->wall_time);
  point.peak_rss_bytes = std::max(point.peak_rss_bytes, r->max_rss_bytes);
  if (r->term_signal != 0) {
    std::string message =
        absl::StrCat("the child was killed by ", SignalName(r->term_signal),
                     " (", r->term_signal, ")");
    if (r->term_signal == SIGKILL) {
      absl::StrAppend(&message,
                      ", as the kernel's OOM killer or a hard resource limit "
                      "does");
    }
    const std::string tail = Tail(r->err, 3);
    if (!tail.empty()) absl::StrAppend(&message, "; its stderr ends: ", tail);
    fail("crashed", absl::StatusCode::kInternal, message);
    return;
  }
  Json result = Json::parse(r->out, nullptr, /*allow_exceptions=*/false);
  if (result.is_discarded() || !result.is_object() ||
      !result.contains("status")) {
    fail("failed", absl::StatusCode::kInternal,
         absl::StrCat(
             "the child exited with ", r->exit_code,
             " and wrote no result; its stderr ends: ", Tail(r->err, 3)));
    return;
  }
  const std::string status = result["status"].get<std::string>();
  if (status != "ok") {
    const Json& e = result["error"];
    if (point.ok()) {
      point.status = status;
      point.error = e;
    }
    return;
  }
  point.runs.push_back(std::move(result));
}

// Folds a point's runs into its figures: medians of the rates and times,
// the worst run's failure counts.
void Aggregate(const Workload& w, bool mlock_off, Point& p) {
  if (!p.ok() || p.runs.empty()) return;
  std::vector<double> gbps, startup, init;
  for (const Json& run : p.runs) {
    gbps.push_back(run["gbps"].get<double>());
    startup.push_back(run["startup_seconds"].get<double>());
    init.push_back(run["init_seconds"].get<double>());
  }
  // The run whose throughput is the median supplies the other figures.
  const double median_gbps = Median(gbps).get<double>();
  const Json* mid = &p.runs.front();
  for (const Json& run : p.runs) {
    if (std::abs(run["gbps"].get<double>() - median_gbps) <
        std::abs((*mid)["gbps"].get<double>() - median_gbps)) {
      mid = &run;
    }
  }
  auto worst = [&](const char* key) {
    uint64_t m = 0;
    for (const Json& run : p.runs) m = std::max(m, run[key].get<uint64_t>());
    return m;
  };
  const Json& m = *mid;
  Json first_error = nullptr;
  for (const Json& run : p.runs) {
    if (first_error.is_null()) first_error = run["first_error"];
  }
  const Json& region = m["region"];
  const bool locked = region["locked"].get<bool>();
  const uint64_t region_pinned =
      locked ? region["capacity_bytes"].get<uint64_t>() : 0;
  const Json& paths = m["paths"];
  const double host_transfers = static_cast<double>(
      paths["zero_copy"].get<uint64_t>() + paths["staged"].get<uint64_t>() +
      paths["pinned"].get<uint64_t>());
  auto share = [&](const char* key) -> Json {
    if (host_transfers == 0) return nullptr;
    return static_cast<double>(paths[key].get<uint64_t>()) / host_transfers;
  };
  Json input_bound = nullptr;
  Json step_input_ms = nullptr;
  if (w.step_ms > 0 && median_gbps > 0) {
    const double ms =
        static_cast<double>(w.step_bytes) / (median_gbps * 1e9) * 1e3;
    step_input_ms = ms;
    input_bound = ms > w.step_ms;
  }
  p.figures = {
      {"startup_seconds", Median(startup)},
      {"init_seconds", Median(init)},
      {"pinned_host_bytes", region_pinned + worst("peak_call_pinned_bytes")},
      {"region_locked",
       region["enabled"].get<bool>() ? Json(locked) : Json(nullptr)},
      {"threshold_bytes", region["enabled"].get<bool>()
                              ? Json(region["threshold_bytes"])
                              : Json(nullptr)},
      {"peak_call_pinned_bytes", worst("peak_call_pinned_bytes")},
      {"gbps", median_gbps},
      {"gbps_range",
       Json::array({*std::min_element(gbps.begin(), gbps.end()),
                    *std::max_element(gbps.begin(), gbps.end())})},
      {"transfers", m["transfers"]},
      {"bytes", m["bytes"]},
      {"path_share",
       {{"zero_copy", share("zero_copy")},
        {"staged", share("staged")},
        {"pinned", share("pinned")}}},
      {"path_counts", paths},
      {"staging_waits", m["staging_waits"]},
      {"staging_wait_seconds", m["staging_wait_seconds"]},
      {"resource_exhausted", worst("resource_exhausted")},
      {"pinned_alloc_failures", worst("pinned_alloc_failures")},
      {"failed_transfers", worst("failed_transfers")},
      {"fallbacks", worst("fallbacks")},
      {"over_threshold", m["over_threshold"]},
      {"input_bound", input_bound},
      {"step_input_ms", step_input_ms},
      {"first_error", first_error},
      // Whether the recommendation may take it (see Recommend).
      {"unlocked", region["enabled"].get<bool>() && !locked && !mlock_off},
  };
}

// ---- Recommendation
// ------------------------------------------------------------------

std::string ThresholdText(const Point& p) {
  if (p.size == 0) return "region off";
  return p.threshold_set
             ? absl::StrCat("threshold ", SizeName(*p.threshold_set))
             : "the default threshold";
}

// Why a point cannot be recommended, or "" when it can (throughput aside).
std::string Disqualified(const Point& p) {
  if (!p.ok()) return absl::StrCat(p.status);
  if (p.Count("resource_exhausted") > 0) {
    return absl::StrCat(p.Count("resource_exhausted"), " RESOURCE_EXHAUSTED");
  }
  if (p.Count("failed_transfers") > 0) {
    return absl::StrCat(p.Count("failed_transfers"), " failed transfers");
  }
  if (p.figures["unlocked"].get<bool>())
    return "its region could not be locked";
  return "";
}

Json Recommend(const std::vector<Point>& points) {
  // The best throughput of the points that could be recommended: a point
  // whose application buffers fell back (RESOURCE_EXHAUSTED) may run faster
  // by doing less, and must not disqualify every correct setting.
  double best = 0;
  const Point* best_point = nullptr;
  for (const Point& p : points) {
    if (Disqualified(p).empty() && p.gbps() > best) {
      best = p.gbps();
      best_point = &p;
    }
  }
  if (best_point == nullptr) {
    return {{"found", false},
            {"best_gbps", nullptr},
            {"reason",
             "No point ran without RESOURCE_EXHAUSTED or failed transfers "
             "(and with a locked region); try larger sizes or fewer pinned "
             "buffers."}};
  }
  // Good enough: within 95% of the best, or, with repeats, not
  // distinguishable from it (its fastest run at least the best point's
  // slowest): on a noisy machine a median below the bar may be noise.
  const bool repeated = best_point->runs.size() > 1;
  auto within_spread = [&](const Point& p) {
    return repeated && p.gbps_max() >= best_point->gbps_min();
  };
  auto good_enough = [&](const Point& p) {
    return p.gbps() >= kGoodEnough * best || within_spread(p);
  };
  const Point* chosen = nullptr;
  for (const Point& p : points) {
    if (!Disqualified(p).empty() || !good_enough(p)) continue;
    if (chosen == nullptr || p.size < chosen->size ||
        (p.size == chosen->size && p.gbps() > chosen->gbps())) {
      chosen = &p;
    }
  }
  // Why each smaller size lost: its best qualifying point's shortfall, or,
  // when none qualified, its first point's disqualification.
  std::vector<std::string> losers;
  std::set<uint64_t> seen;
  for (const Point& p : points) {
    if (p.size >= chosen->size || !seen.insert(p.size).second) continue;
    const Point* best_here = nullptr;
    // Else the least bad point at this size: fewest failures, not crashed.
    const Point* least_bad = nullptr;
    int at_size = 0;
    auto badness = [](const Point& q) {
      return q.ok()
                 ? q.Count("resource_exhausted") + q.Count("failed_transfers")
                 : std::numeric_limits<uint64_t>::max();
    };
    for (const Point& q : points) {
      if (q.size != p.size) continue;
      ++at_size;
      if (Disqualified(q).empty()) {
        if (best_here == nullptr || q.gbps() > best_here->gbps())
          best_here = &q;
      } else if (least_bad == nullptr || badness(q) < badness(*least_bad)) {
        least_bad = &q;
      }
    }
    if (best_here != nullptr) {
      // Rounded down: a point just under the bar must not read "95%".
      losers.push_back(absl::StrFormat(
          "%s reached only %.0f%% of the best throughput%s", SizeName(p.size),
          std::floor(100 * best_here->gbps() / best),
          repeated ? absl::StrFormat(" (its fastest run %.2f GB/s)",
                                     best_here->gbps_max())
                   : ""));
    } else {
      losers.push_back(absl::StrCat(SizeName(p.size), " had ",
                                    Disqualified(*least_bad),
                                    at_size > 1 ? " at best" : ""));
    }
  }
  std::string reason = absl::StrCat(
      SizeName(chosen->size), " with ", ThresholdText(*chosen),
      " is the smallest size that ran without RESOURCE_EXHAUSTED or failed "
      "transfers and ");
  if (chosen == best_point) {
    absl::StrAppend(
        &reason,
        absl::StrFormat("it had the best throughput (%.2f GB/s)", best));
  } else {
    absl::StrAppend(
        &reason, absl::StrFormat(
                     "reached %.0f%% of the best throughput (%.2f of %.2f "
                     "GB/s, at %s with %s)",
                     100 * chosen->gbps() / best, chosen->gbps(), best,
                     SizeName(best_point->size), ThresholdText(*best_point)));
    if (chosen->gbps() < kGoodEnough * best) {
      absl::StrAppend(
          &reason,
          absl::StrFormat(", within the run-to-run spread of the best (its "
                          "runs: %.2f-%.2f GB/s)",
                          best_point->gbps_min(), best_point->gbps_max()));
    }
  }
  if (!losers.empty()) {
    absl::StrAppend(&reason, "; ", absl::StrJoin(losers, ", "));
  }
  absl::StrAppend(&reason, ".");

  Json env = {{kSizeVariable, absl::StrCat(chosen->size)}};
  if (chosen->threshold_set) {
    env[kThresholdVariable] = absl::StrCat(*chosen->threshold_set);
  }
  return {{"found", true},
          {"size_bytes", chosen->size},
          {"threshold_bytes", chosen->figures["threshold_bytes"]},
          {"environment", std::move(env)},
          {"gbps", chosen->gbps()},
          {"fraction_of_best", chosen->gbps() / best},
          {"best_gbps", best},
          {"reason", reason}};
}

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
    out << absl::StrJoin(
               {Csv(j["size_bytes"]), Csv(j["threshold_bytes"]),
                Csv(j["threshold_set"]), Csv(j["status"]),
                Csv(j["startup_seconds"]), Csv(j["pinned_host_bytes"]),
                Csv(j["region_locked"]), Csv(j["gbps"]), Csv(j["transfers"]),
                Csv(s("zero_copy")), Csv(s("staged")), Csv(s("pinned")),
                Csv(j["staging_wait_seconds"]), Csv(j["resource_exhausted"]),
                Csv(j["failed_transfers"]), Csv(j["fallbacks"]),
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
                const Json& recommendation, const std::string& plot,
                std::ostream& out) {
  out << "tpushim tune: " << points.size() << " points, " << repeats
      << (repeats == 1 ? " run" : " runs")
      << " each, every run in a fresh process\n";
  out << "workload: " << WorkloadSummary(w, device) << "\n";
  if (dropped > 0) {
    out << dropped << " threshold(s) at or above a size were dropped: the "
        << "runtime clamps them to the size (the default threshold).\n";
  }
  out << "\n";
  TextTable table({"SIZE", "THRESHOLD", "STATUS", "START-UP", "PINNED", "GB/s",
                   "ZERO-COPY", "STAGED", "PINNED-PATH", "STAGING-WAIT",
                   "RES-EXH", "FALLBACKS", "INPUT-BOUND"});
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
         "GB/s = bytes moved / seconds (1 GB = 1e9 bytes); path shares are "
         "of host transfers.\n\n";
  if (recommendation["found"].get<bool>()) {
    out << "Recommendation: " << kSizeVariable << "="
        << recommendation["environment"][kSizeVariable].get<std::string>();
    if (recommendation["environment"].contains(kThresholdVariable)) {
      out << " " << kThresholdVariable << "="
          << recommendation["environment"][kThresholdVariable]
                 .get<std::string>();
    }
    out << "\n";
  } else {
    out << "Recommendation: none.\n";
  }
  out << "  " << recommendation["reason"].get<std::string>() << "\n";
  if (!plot.empty()) out << "\nPlot: " << plot << "\n";
}

// ---- Plot
// ------------------------------------------------------------------------------

absl::Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot write ", path));
  }
  return absl::OkStatus();
}

// Writes `file` (.svg or .png) with gnuplot: throughput and start-up time
// against the size (log2 axis), one line per threshold, RESOURCE_EXHAUSTED
// points marked. Region-off and failed points are left out.
absl::Status Plot(const std::vector<Point>& points, const Workload& w,
                  const std::string& device, const std::string& gnuplot,
                  const std::string& file) {
  std::string dir_template = absl::StrCat(GetEnv("TMPDIR").value_or("/tmp"),
                                          "/tpushim-tune-plot.XXXXXX");
  if (mkdtemp(dir_template.data()) == nullptr) {
    return absl::ErrnoToStatus(errno,
                               absl::StrCat("mkdtemp(", dir_template, ")"));
  }
  const std::string dir = dir_template;
  const std::string data = dir + "/points.dat";
  const std::string marks = dir + "/exhausted.dat";
  const std::string script = dir + "/plot.gp";

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
    rmdir(dir.c_str());
    return absl::FailedPreconditionError(
        "no point with the region on ran, so there is nothing to plot");
  }

  std::vector<std::string> tic_list;
  for (const auto& [bytes, name] : tics) {
    tic_list.push_back(absl::StrCat("\"", name, "\" ", bytes));
  }
  const bool png = absl::EndsWith(file, ".png");
  std::ostringstream gp;
  gp << (png ? "set terminal pngcairo size 1000,800 font 'sans,10'\n"
             : "set terminal svg size 1000,800 dynamic font 'sans,11' "
               "background '#ffffff'\n");
  gp << "set output '" << file << "'\n"
     << "set termoption noenhanced\n"
     << "set multiplot layout 2,1 title \"tpushim tune\\n"
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
       << "plot for [i=0:" << labels.size() - 1 << "] '" << data
       << "' index i using 1:" << column
       << " with linespoints lw 2 pt 7 title columnheader(1)";
    if (any_marks) {
      gp << ", '" << marks << "' using 1:" << column
         << " with points pt 2 ps 2 lw 2 lc rgb 'red' title "
            "'RESOURCE_EXHAUSTED'";
    }
    gp << "\n";
  }
  gp << "unset multiplot\n";

  absl::Status status = WriteFile(data, data_text.str());
  if (status.ok()) status = WriteFile(marks, marks_text.str());
  if (status.ok()) status = WriteFile(script, gp.str());
  if (status.ok()) {
    absl::StatusOr<SubprocessResult> r = RunSubprocess(
        gnuplot, {script}, {absl::StrCat("PATH=", GetEnv("PATH").value_or(""))},
        absl::Seconds(60));
    if (!r.ok()) {
      status = r.status();
    } else if (r->exit_code != 0) {
      status = absl::InternalError(absl::StrCat(
          "gnuplot failed (exit ", r->exit_code, "): ", Tail(r->err, 5)));
    }
  }
  for (const std::string& f : {data, marks, script}) unlink(f.c_str());
  rmdir(dir.c_str());
  return status;
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
