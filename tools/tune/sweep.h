// The points of a `tpushim tune` sweep (tools/tune/tune.cc): the environment
// a point's child process runs in, the order the repeats run in, running a
// point (`tpushim tune-point`) and folding its repeats into figures, and
// the recommendation over the points. Internal to the tool; the
// aggregation and the recommendation are pure functions of the points, so
// tests feed them made-up runs (tests/tools/tune_recommend_test.cc).

#ifndef TPUSHIM_TOOLS_TUNE_SWEEP_H_
#define TPUSHIM_TOOLS_TUNE_SWEEP_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "tools/cli/text_table.h"
#include "tools/tune/workload.h"

namespace tpushim::tools::tune_internal {

using Json = nlohmann::ordered_json;

constexpr char kSizeVariable[] = "TPU_PREMAPPED_BUFFER_SIZE";
constexpr char kThresholdVariable[] =
    "TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES";

// A smaller setting is recommended over the best point only when its
// slowest run reaches this fraction of the best point's median throughput.
inline constexpr double kGoodEnough = 0.95;

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
  // The slowest and fastest of its runs (both the one run's with one).
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

// The value of environment variable `name`, if set.
std::optional<std::string> GetEnv(const char* name);
// The device URL every point runs on: TPUSHIM_DEVICE (default sim://)
// with the workload's device count and link model applied.
absl::StatusOr<std::string> PointDeviceUrl(const Workload& w);
// INVALID_ARGUMENT when LIBTPU_INIT_ARGS sets either swept variable (it
// would override the point's environment).
absl::Status CheckInitArgs();
// This executable, which runs each point as `tpushim tune-point`.
absl::StatusOr<std::string> SelfPath();

// Points in size order, thresholds ascending then `default`; combinations
// the runtime would clamp (threshold >= size) fold into `default`, and are
// counted in `dropped`.
std::vector<Point> MakePoints(
    const std::vector<std::optional<uint64_t>>& sizes,
    const std::vector<std::optional<uint64_t>>& thresholds, int& dropped);
// One child run of `point`: appends its JSON, or records why it failed.
// A readable `cancel_fd` (if >= 0) kills the child and leaves the point as
// it was: the run simply did not happen.
void RunOnce(const std::string& self, const Workload& w,
             const std::string& device_url, absl::Duration timeout,
             Point& point, int cancel_fd = -1);
// The order the sweep runs its points in, as indices into them: `repeats`
// rounds over all `points`, the first in sweep order, each later one in a
// new order shuffled with `seed`; a shuffled round that would start with
// the point the previous round ended with has its first and last swapped,
// so that no point runs twice in a row (given two points or more).
std::vector<size_t> RunOrder(size_t points, int repeats, uint64_t seed);
// Folds a point's runs into its figures: medians of the rates and times,
// "gbps_range" = [slowest, fastest], the worst run's failure counts, and
// the other figures from the run whose throughput is closest to the median
// (the slower one on a tie). Only "first_error" depends on the order of the
// runs (the earliest run's, as they ran); no other figure does.
void Aggregate(const Workload& w, bool mlock_off, Point& p);

// The recommendation over a sweep, chosen as tools/tune/tune.h says.
struct Recommendation {
  // The "recommendation" object of --json; null when no point ran cleanly.
  Json json = nullptr;
  // When `json` is null, one sentence saying why.
  std::string why_none;
};
// Does not depend on the order of `points` or of their runs.
Recommendation Recommend(const std::vector<Point>& points);
// The last `lines` lines of `text`, without its trailing newlines.
std::string Tail(absl::string_view text, int lines);

}  // namespace tpushim::tools::tune_internal

#endif  // TPUSHIM_TOOLS_TUNE_SWEEP_H_
