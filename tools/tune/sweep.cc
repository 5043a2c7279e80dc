#include "tools/tune/sweep.h"

#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/subprocess.h"
#include "env/device_url.h"
#include "nlohmann/json.hpp"
#include "tools/cli/text_table.h"
#include "tools/tune/workload.h"

extern char** environ;

namespace tpushim::tools::tune_internal {

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

// LIBTPU_INIT_ARGS outranks the environment variables: a flag there would
// silently pin every point to one setting.
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
// ---- Points
// ---------------------------------------------------------------------------

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
             Point& point, int cancel_fd) {
  const std::string workload = WorkloadToJson(w).dump();
  absl::StatusOr<SubprocessResult> r = RunSubprocess(
      self, {"tune-point", "--workload", workload},
      PointEnvironment(point.size, point.threshold_set, device_url), timeout,
      cancel_fd);
  if (absl::IsCancelled(r.status())) return;
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

std::vector<size_t> RunOrder(size_t points, int repeats, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<size_t> order;
  std::vector<size_t> round(points);
  for (int r = 0; r < repeats; ++r) {
    std::iota(round.begin(), round.end(), 0);
    if (r > 0) {
      std::shuffle(round.begin(), round.end(), rng);
      // A point that ran last must not run again straight away: after a
      // run like itself its start-up is cheaper (see RunTune).
      if (points > 1 && round.front() == order.back()) {
        std::swap(round.front(), round.back());
      }
    }
    order.insert(order.end(), round.begin(), round.end());
  }
  return order;
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
  // The run whose throughput is closest to the median supplies the other
  // figures; on a tie (an even number of runs) the slower one, so that the
  // order of the runs does not matter.
  const double median_gbps = Median(gbps).get<double>();
  const Json* mid = &p.runs.front();
  for (const Json& run : p.runs) {
    const double g = run["gbps"].get<double>();
    const double mid_g = (*mid)["gbps"].get<double>();
    const double d = std::abs(g - median_gbps);
    const double mid_d = std::abs(mid_g - median_gbps);
    if (d < mid_d || (d == mid_d && g < mid_g)) mid = &run;
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
      (locked ? region["capacity_bytes"].get<uint64_t>() : 0) +
      m.value("bounce_pool_bytes", uint64_t{0});
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

// Why a point may not be recommended. The first that applies counts.
enum class Flaw {
  kNone,
  kDidNotRun,  // failed, invalid, crashed or timeout
  kResourceExhausted,
  kFailedTransfers,
  kUnlocked,  // its region could not be locked (and TPUSHIM_MLOCK != off)
};

Flaw FlawOf(const Point& p) {
  if (!p.ok()) return Flaw::kDidNotRun;
  if (p.Count("resource_exhausted") > 0) return Flaw::kResourceExhausted;
  if (p.Count("failed_transfers") > 0) return Flaw::kFailedTransfers;
  if (p.figures["unlocked"].get<bool>()) return Flaw::kUnlocked;
  return Flaw::kNone;
}

// Why a point cannot be recommended, or "" when it ran cleanly.
std::string Disqualified(const Point& p) {
  switch (FlawOf(p)) {
    case Flaw::kNone:
      return "";
    case Flaw::kDidNotRun:
      return p.status;
    case Flaw::kResourceExhausted:
      return absl::StrCat(p.Count("resource_exhausted"), " RESOURCE_EXHAUSTED");
    case Flaw::kFailedTransfers:
      return absl::StrCat(p.Count("failed_transfers"), " failed transfers");
    case Flaw::kUnlocked:
      return "its region could not be locked";
  }
  return "";
}

// Sweep order: size, then thresholds ascending, `default` last.
bool SweepLess(const Point* a, const Point* b) {
  if (a->size != b->size) return a->size < b->size;
  if (a->threshold_set.has_value() != b->threshold_set.has_value()) {
    return a->threshold_set.has_value();
  }
  return a->threshold_set.value_or(0) < b->threshold_set.value_or(0);
}

// "a", "a and b", "a, b and c".
std::string JoinAnd(const std::vector<std::string>& items) {
  if (items.size() <= 1) return absl::StrJoin(items, "");
  return absl::StrCat(absl::StrJoin(items.begin(), items.end() - 1, ", "),
                      " and ", items.back());
}

// The one sentence that says why no point could be recommended.
std::string WhyNone(const std::vector<const Point*>& points) {
  int exhausted = 0, failed_transfers = 0, unlocked = 0;
  std::map<std::string, int> statuses;  // of the points that did not run
  for (const Point* p : points) {
    switch (FlawOf(*p)) {
      case Flaw::kNone:
        break;
      case Flaw::kDidNotRun:
        ++statuses[p->status];
        break;
      case Flaw::kResourceExhausted:
        ++exhausted;
        break;
      case Flaw::kFailedTransfers:
        ++failed_transfers;
        break;
      case Flaw::kUnlocked:
        ++unlocked;
        break;
    }
  }
  // (count, what they had), e.g. (2, "had RESOURCE_EXHAUSTED").
  std::vector<std::pair<int, std::string>> counts;
  if (exhausted > 0) counts.emplace_back(exhausted, "had RESOURCE_EXHAUSTED");
  if (failed_transfers > 0) {
    counts.emplace_back(failed_transfers, "had failed transfers");
  }
  if (unlocked > 0) counts.emplace_back(unlocked, "could not lock the region");
  for (const auto& [status, n] : statuses) {
    counts.emplace_back(n, status == "timeout"   ? "timed out"
                           : status == "crashed" ? "crashed"
                           : status == "invalid" ? "had an invalid setting"
                                                 : "failed to run");
  }
  std::vector<std::string> parts;
  for (const auto& [n, what] : counts) {
    parts.push_back(points.size() == 1 ? what : absl::StrCat(n, " ", what));
  }
  std::string sentence = absl::StrCat(
      "No point ran cleanly, so there is nothing to recommend (",
      points.size() == 1 ? "the one point "
                         : absl::StrCat("of the ", points.size(), " points, "),
      JoinAnd(parts), ")");
  if (exhausted > 0) {
    absl::StrAppend(&sentence,
                    "; larger sizes or fewer pinned buffers may fit");
  }
  absl::StrAppend(&sentence, ".");
  return sentence;
}

Recommendation Recommend(const std::vector<Point>& points) {
  // Everything below walks the points in sweep order, whatever order they
  // came in, so that ties and the reason's wording do not depend on it.
  std::vector<const Point*> sorted;
  for (const Point& p : points) sorted.push_back(&p);
  std::stable_sort(sorted.begin(), sorted.end(), SweepLess);
  // Only clean points: a point whose application buffers fell back
  // (RESOURCE_EXHAUSTED) may run faster by doing less, and must not set the
  // bar.
  std::vector<const Point*> clean;
  for (const Point* p : sorted) {
    if (FlawOf(*p) == Flaw::kNone) clean.push_back(p);
  }
  if (clean.empty()) return {.json = nullptr, .why_none = WhyNone(sorted)};

  // The best: the highest median; on a tie the one whose slowest run is
  // faster (the steadier), then the first in sweep order.
  const Point* best = clean.front();
  for (const Point* p : clean) {
    if (p->gbps() > best->gbps() ||
        (p->gbps() == best->gbps() && p->gbps_min() > best->gbps_min())) {
      best = p;
    }
  }
  const double best_gbps = best->gbps();
  const double bar = kGoodEnough * best_gbps;
  // A smaller setting replaces the best only when even its slowest run
  // reaches the bar: a median above it may be one lucky run.
  auto eligible = [&](const Point* p) {
    return p == best || p->gbps_min() >= bar;
  };
  // The smallest eligible size (clean is in size order), and at it the
  // highest median.
  const Point* chosen = nullptr;
  for (const Point* p : clean) {
    if (!eligible(p)) continue;
    if (chosen == nullptr ||
        (p->size == chosen->size && p->gbps() > chosen->gbps())) {
      chosen = p;
    }
  }
  // Within noise: at least two clean points, and every clean point's range
  // of runs overlaps the best point's, so none can be told from the best.
  const bool within_noise =
      clean.size() > 1 &&
      std::all_of(clean.begin(), clean.end(), [&](const Point* p) {
        return p->gbps_max() >= best->gbps_min() &&
               p->gbps_min() <= best->gbps_max();
      });
  const bool repeated = best->runs.size() > 1;

  // Why each smaller size lost: its clean point with the fastest slowest
  // run, or, when none ran cleanly, its least bad point.
  std::vector<std::string> losers;
  for (size_t i = 0; i < sorted.size(); ++i) {
    const uint64_t size = sorted[i]->size;
    if (size >= chosen->size) break;
    if (i > 0 && sorted[i - 1]->size == size) continue;
    const Point* best_here = nullptr;
    const Point* least_bad = nullptr;
    int at_size = 0;
    auto badness = [](const Point* q) {
      return q->ok()
                 ? q->Count("resource_exhausted") + q->Count("failed_transfers")
                 : std::numeric_limits<uint64_t>::max();
    };
    for (size_t j = i; j < sorted.size() && sorted[j]->size == size; ++j) {
      const Point* q = sorted[j];
      ++at_size;
      if (FlawOf(*q) == Flaw::kNone) {
        if (best_here == nullptr || q->gbps_min() > best_here->gbps_min()) {
          best_here = q;
        }
      } else if (least_bad == nullptr || badness(q) < badness(least_bad)) {
        least_bad = q;
      }
    }
    if (best_here != nullptr) {
      // Rounded down: a point just under the bar must not read "95%".
      const double pct = std::floor(100 * best_here->gbps_min() / best_gbps);
      losers.push_back(
          repeated
              ? absl::StrFormat(
                    "%s's slowest run reached only %.0f%% of the best "
                    "median (%.2f GB/s)",
                    SizeName(size), pct, best_here->gbps_min())
              : absl::StrFormat("%s reached only %.0f%% of the best throughput",
                                SizeName(size), pct));
    } else {
      losers.push_back(absl::StrCat(SizeName(size), " had ",
                                    Disqualified(*least_bad),
                                    at_size > 1 ? " at best" : ""));
    }
  }

  std::string reason = absl::StrCat(
      SizeName(chosen->size), " with ", ThresholdText(*chosen),
      " is the smallest size that ran without RESOURCE_EXHAUSTED or failed "
      "transfers and ");
  if (chosen == best) {
    absl::StrAppend(&reason,
                    absl::StrFormat("it had the best %sthroughput (%.2f GB/s)",
                                    repeated ? "median " : "", best_gbps));
  } else if (repeated) {
    absl::StrAppend(
        &reason, absl::StrFormat(
                     "whose slowest run reached %.0f%% of the best median "
                     "throughput (%.2f of %.2f GB/s, at %s with %s)",
                     100 * chosen->gbps_min() / best_gbps, chosen->gbps_min(),
                     best_gbps, SizeName(best->size), ThresholdText(*best)));
  } else {
    absl::StrAppend(
        &reason,
        absl::StrFormat("reached %.0f%% of the best throughput (%.2f of %.2f "
                        "GB/s, at %s with %s)",
                        100 * chosen->gbps() / best_gbps, chosen->gbps(),
                        best_gbps, SizeName(best->size), ThresholdText(*best)));
  }
  if (!losers.empty()) {
    absl::StrAppend(&reason, "; ", absl::StrJoin(losers, ", "));
  }
  absl::StrAppend(&reason, ".");
  if (within_noise) {
    absl::StrAppend(
        &reason,
        absl::StrFormat(
            " Within noise: every clean point's runs overlap the best "
            "point's (%.2f-%.2f GB/s), so this sweep cannot tell them apart; "
            "more --repeats or a longer --seconds may.",
            best->gbps_min(), best->gbps_max()));
  }

  Json env = {{kSizeVariable, absl::StrCat(chosen->size)}};
  if (chosen->threshold_set) {
    env[kThresholdVariable] = absl::StrCat(*chosen->threshold_set);
  }
  return {.json = {{"size_bytes", chosen->size},
                   {"threshold_bytes", chosen->figures["threshold_bytes"]},
                   {"environment", std::move(env)},
                   {"gbps", chosen->gbps()},
                   {"gbps_range", chosen->figures["gbps_range"]},
                   {"fraction_of_best", chosen->gbps() / best_gbps},
                   {"best_gbps", best_gbps},
                   {"within_noise", within_noise},
                   {"reason", reason}},
          .why_none = {}};
}

}  // namespace tpushim::tools::tune_internal
