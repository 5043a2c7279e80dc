// End-to-end tests of `tpushim tune`: the built tool runs as a subprocess
// with an exact environment (logs in a temporary directory, small
// simulated devices), sweeps small regions with a fixed transfer count per
// point, and its JSON, CSV and table output, its recommendation, plot and
// the reports of failed points are checked.

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace tpushim {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;
using testutil::ReadFileOrEmpty;
using testutil::RunSubprocess;
using testutil::SubprocessResult;
using testutil::TempDir;

using Json = nlohmann::ordered_json;

// A quick workload: 200 transfers of 64K..1M per point.
const std::vector<std::string> kQuick = {"--transfer-sizes",
                                         "loguniform:64K-1M", "--count", "200"};

bool Has(const std::vector<std::string>& args, const std::string& flag) {
  return std::find(args.begin(), args.end(), flag) != args.end();
}

// `args` with the quick workload unless they set their own length, and one
// run per point unless they set --repeats (the default, 3, is tested on
// its own).
std::vector<std::string> Quick(std::vector<std::string> args) {
  if (!Has(args, "--count"))
    args.insert(args.end(), kQuick.begin(), kQuick.end());
  if (!Has(args, "--repeats")) args.insert(args.end(), {"--repeats", "1"});
  return args;
}

class TuneTest : public ::testing::Test {
 protected:
  std::vector<std::string> Env() const {
    return {absl::StrCat("TPU_LOG_DIR=", dir_.path()),
            "TPUSHIM_DEVICE=sim://?hbm=64M", "PATH=/usr/bin:/bin"};
  }
  // Runs `tpushim tune args...` in Env() with `env` added (an entry of
  // `env` replaces Env()'s variable of the same name).
  SubprocessResult Run(std::vector<std::string> args,
                       std::vector<std::string> env = {}) {
    args.insert(args.begin(), "tune");
    std::vector<std::string> full_env = env;
    for (const std::string& e : Env()) {
      const std::string name = e.substr(0, e.find('=') + 1);
      bool replaced = false;
      for (const std::string& x : env) replaced |= x.rfind(name, 0) == 0;
      if (!replaced) full_env.push_back(e);
    }
    absl::StatusOr<SubprocessResult> r =
        RunSubprocess(TPUSHIM_TOOL_PATH, args, full_env, absl::Seconds(120));
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return SubprocessResult{};
    EXPECT_EQ(r->term_signal, 0) << r->err;
    return *r;
  }
  Json RunJson(std::vector<std::string> args, int expected_exit = 0,
               std::vector<std::string> env = {}) {
    args = Quick(std::move(args));
    args.push_back("--json");
    SubprocessResult r = Run(args, env);
    EXPECT_EQ(r.exit_code, expected_exit) << r.out << r.err;
    Json j = Json::parse(r.out, nullptr, /*allow_exceptions=*/false);
    EXPECT_FALSE(j.is_discarded()) << r.out << r.err;
    return j;
  }

  TempDir dir_;
};

std::vector<std::string> Keys(const Json& object) {
  std::vector<std::string> keys;
  for (const auto& [key, value] : object.items()) keys.push_back(key);
  return keys;
}

// The acceptance sweep: three sizes; the application keeps three 4 MiB
// pinned buffers, which an 8 MiB region cannot hold.
TEST_F(TuneTest, ThreePointSweepReportsResourceExhaustedAtTheSmallestSize) {
  const Json j = RunJson({"--sizes", "8M,32M,64M", "--pinned-buffers", "3",
                          "--pinned-bytes", "4M"});
  EXPECT_THAT(Keys(j),
              ::testing::ElementsAre(
                  "workload", "device", "repeats", "dropped_combinations",
                  "points", "recommendation", "no_recommendation_reason",
                  "plot", "partial", "interrupted_by"));
  ASSERT_EQ(j["points"].size(), 3u);
  const Json& small = j["points"][0];
  EXPECT_EQ(small["size_bytes"], 8u << 20);
  EXPECT_EQ(small["status"], "ok");
  EXPECT_GE(small["resource_exhausted"].get<uint64_t>(), 1u);
  EXPECT_EQ(small["resource_exhausted"], small["pinned_alloc_failures"]);
  for (int i = 1; i < 3; ++i) {
    const Json& p = j["points"][i];
    EXPECT_EQ(p["status"], "ok") << p.dump();
    EXPECT_EQ(p["resource_exhausted"], 0) << p.dump();
    EXPECT_EQ(p["failed_transfers"], 0) << p.dump();
    EXPECT_EQ(p["transfers"], 200);
  }
  EXPECT_THAT(
      Keys(small),
      ::testing::ElementsAre(
          "size_bytes", "threshold_bytes", "threshold_set", "status", "error",
          "startup_seconds", "init_seconds", "pinned_host_bytes",
          "region_locked", "peak_call_pinned_bytes", "gbps", "gbps_range",
          "transfers", "bytes", "path_share", "path_counts", "staging_waits",
          "staging_wait_seconds", "resource_exhausted", "pinned_alloc_failures",
          "failed_transfers", "fallbacks", "over_threshold", "input_bound",
          "step_input_ms", "peak_rss_bytes", "wall_seconds"));
  // The region is locked (root has CAP_IPC_LOCK) and counted as pinned.
  EXPECT_EQ(small["region_locked"], true);
  EXPECT_GE(small["pinned_host_bytes"].get<uint64_t>(), 8u << 20);
  EXPECT_GT(small["startup_seconds"].get<double>(), 0);
  EXPECT_GT(small["gbps"].get<double>(), 0);
  EXPECT_GT(small["peak_rss_bytes"].get<uint64_t>(), 0u);
  // Two of the three 4 MiB pinned buffers fill the 8 MiB region, which
  // leaves no staging room: the pageable transfers fall back to pinning.
  EXPECT_EQ(small["pinned_alloc_failures"], 1);
  EXPECT_EQ(small["path_share"]["pinned"], 1.0);
  // With room, pageable memory below the default threshold is all staged.
  EXPECT_EQ(j["points"][1]["path_share"]["staged"], 1.0);

  const Json& rec = j["recommendation"];
  ASSERT_TRUE(rec.is_object()) << j.dump();
  EXPECT_TRUE(j["no_recommendation_reason"].is_null());
  EXPECT_THAT(Keys(rec), ::testing::ElementsAre(
                             "size_bytes", "threshold_bytes", "environment",
                             "gbps", "gbps_range", "fraction_of_best",
                             "best_gbps", "within_noise", "reason"));
  EXPECT_TRUE(rec["within_noise"].is_boolean());
  EXPECT_NE(rec["size_bytes"], 8u << 20);
  EXPECT_EQ(rec["environment"]["TPU_PREMAPPED_BUFFER_SIZE"],
            absl::StrCat(rec["size_bytes"].get<uint64_t>()));
  EXPECT_GE(rec["fraction_of_best"].get<double>(), 0.95);
  EXPECT_THAT(
      rec["reason"].get<std::string>(),
      AllOf(HasSubstr("is the smallest size"),
            ::testing::ContainsRegex("8M had [0-9]+ RESOURCE_EXHAUSTED")));
  EXPECT_EQ(j["workload"]["pinned_buffers"], 3);
  EXPECT_EQ(j["device"], "sim://?hbm=64M");
}

TEST_F(TuneTest, TableShowsEveryPointAndTheRecommendation) {
  SubprocessResult r = Run(Quick(
      {"--sizes", "8M,16M", "--pinned-buffers", "3", "--pinned-bytes", "4M"}));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(
      r.out,
      AllOf(HasSubstr("tpushim tune: 2 points, 1 run each"),
            HasSubstr("3 pinned buffers of 4M"), HasSubstr("RES-EXH"),
            HasSubstr("\n  8M    default"),
            HasSubstr("Recommendation: TPU_PREMAPPED_BUFFER_SIZE=16777216\n")));
  // stderr is a pipe: no progress bar.
  EXPECT_THAT(r.err, Not(HasSubstr("\r")));
}

TEST_F(TuneTest, CsvHasTheDocumentedHeaderAndOneLinePerPoint) {
  SubprocessResult r = Run(
      Quick({"--sizes", "8M,16M", "--thresholds", "256K,default", "--csv"}));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::vector<std::string> lines;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 5u) << r.out;
  EXPECT_EQ(lines[0],
            "size_bytes,threshold_bytes,threshold_set,status,startup_seconds,"
            "pinned_host_bytes,region_locked,gbps,gbps_min,gbps_max,transfers,"
            "zero_copy_share,staged_share,pinned_share,staging_wait_seconds,"
            "resource_exhausted,failed_transfers,fallbacks,input_bound,error");
  EXPECT_THAT(lines[1], StartsWith("8388608,262144,262144,ok,"));
  // One run: gbps, gbps_min and gbps_max are that run's.
  const std::vector<std::string> cells = absl::StrSplit(lines[1], ',');
  ASSERT_GE(cells.size(), 10u);
  EXPECT_NE(cells[7], "");
  EXPECT_EQ(cells[8], cells[7]);
  EXPECT_EQ(cells[9], cells[7]);
  EXPECT_THAT(lines[2], StartsWith("8388608,8388608,,ok,"));
  EXPECT_THAT(lines[4], StartsWith("16777216,16777216,,ok,"));
}

TEST_F(TuneTest, ThresholdsAtOrAboveASizeFoldIntoTheDefault) {
  const Json j =
      RunJson({"--sizes", "16M", "--thresholds", "256K,16M,32M,default"});
  ASSERT_EQ(j["points"].size(), 2u);
  EXPECT_EQ(j["dropped_combinations"], 2);
  EXPECT_EQ(j["points"][0]["threshold_set"], 256u << 10);
  EXPECT_EQ(j["points"][0]["threshold_bytes"], 256u << 10);
  EXPECT_TRUE(j["points"][1]["threshold_set"].is_null());
  EXPECT_EQ(j["points"][1]["threshold_bytes"], 16u << 20);
  // Above 256K the transfers go pinned; at the default none do.
  EXPECT_GT(j["points"][0]["path_share"]["pinned"].get<double>(), 0);
  EXPECT_GT(j["points"][0]["over_threshold"].get<uint64_t>(), 0u);
  EXPECT_EQ(j["points"][1]["path_share"]["pinned"], 0.0);
}

TEST_F(TuneTest, RangesExpand) {
  Json j = RunJson(
      {"--sizes", "8M..32M", "--count", "20", "--transfer-sizes", "64K"});
  ASSERT_EQ(j["points"].size(), 3u);
  EXPECT_EQ(j["points"][2]["size_bytes"], 32u << 20);
  j = RunJson(
      {"--sizes", "4M..12M:+4M", "--count", "20", "--transfer-sizes", "64K"});
  ASSERT_EQ(j["points"].size(), 3u);
  EXPECT_EQ(j["points"][1]["size_bytes"], 8u << 20);
}

// With the region off, transfers up to 1 MiB go through the runtime's
// bounce pool (staged) and larger ones pin; the pinned memory of the point
// is the pool plus what the calls pinned.
TEST_F(TuneTest, RegionOffIsAPointThroughTheBouncePoolAndPinned) {
  const Json j = RunJson({"--sizes", "0,8M"});
  ASSERT_EQ(j["points"].size(), 2u);
  const Json& off = j["points"][0];
  EXPECT_EQ(off["status"], "ok");
  EXPECT_TRUE(off["threshold_bytes"].is_null());
  EXPECT_TRUE(off["region_locked"].is_null());
  EXPECT_EQ(off["path_share"]["zero_copy"], 0.0);
  EXPECT_DOUBLE_EQ(off["path_share"]["staged"].get<double>() +
                       off["path_share"]["pinned"].get<double>(),
                   1.0);
  EXPECT_GE(off["pinned_host_bytes"].get<uint64_t>(),
            off["peak_call_pinned_bytes"].get<uint64_t>());
  EXPECT_LE(off["pinned_host_bytes"].get<uint64_t>(),
            off["peak_call_pinned_bytes"].get<uint64_t>() + (4u << 20));
}

// With TPUSHIM_PREMAP=background each point's region is locked on fault
// from creation on (tests run as root, with CAP_IPC_LOCK): its points run
// clean, count the region as pinned, and one is recommended.
TEST_F(TuneTest, BackgroundPremappingPointsAreLockedAndRecommended) {
  const Json j = RunJson({"--sizes", "8M,16M"}, 0,
                         {"TPUSHIM_PREMAP=background", "TPUSHIM_HUGEPAGES=off",
                          "TPUSHIM_PREFAULT_THREADS=1"});
  ASSERT_EQ(j["points"].size(), 2u) << j.dump();
  for (const Json& p : j["points"]) {
    EXPECT_EQ(p["status"], "ok") << p.dump();
    EXPECT_EQ(p["region_locked"], true) << p.dump();
    EXPECT_GE(p["pinned_host_bytes"].get<uint64_t>(),
              p["size_bytes"].get<uint64_t>());
  }
  EXPECT_FALSE(j["recommendation"].is_null()) << j["no_recommendation_reason"];
}

TEST_F(TuneTest, APointThatCannotStartIsReportedAndTheSweepGoesOn) {
  // 64 TiB is more than MemAvailable: the runtime refuses it before
  // touching memory.
  const Json j = RunJson({"--sizes", "8M,64T"});
  ASSERT_EQ(j["points"].size(), 2u);
  EXPECT_EQ(j["points"][0]["status"], "ok");
  const Json& big = j["points"][1];
  EXPECT_EQ(big["status"], "failed");
  EXPECT_EQ(big["error"]["code"], "RESOURCE_EXHAUSTED");
  EXPECT_THAT(big["error"]["message"].get<std::string>(),
              HasSubstr("MemAvailable"));
  EXPECT_TRUE(big["gbps"].is_null());
  EXPECT_EQ(j["recommendation"]["size_bytes"], 8u << 20);
}

TEST_F(TuneTest, APointOverItsTimeLimitIsKilledAndReported) {
  const Json j = RunJson({"--sizes", "8M", "--seconds", "60", "--count", "0",
                          "--point-timeout", "2", "--transfer-sizes", "64K"},
                         /*expected_exit=*/1);
  ASSERT_EQ(j["points"].size(), 1u);
  EXPECT_EQ(j["points"][0]["status"], "timeout");
  EXPECT_EQ(j["points"][0]["error"]["code"], "DEADLINE_EXCEEDED");
  EXPECT_TRUE(j["recommendation"].is_null());
  EXPECT_EQ(j["no_recommendation_reason"],
            "No point ran cleanly, so there is nothing to recommend (the one "
            "point timed out).");
}

TEST_F(TuneTest, ACrashedChildIsReportedWithItsSignal) {
  // A soft one-second CPU limit, inherited by the children: a busy
  // workload gets SIGXCPU while the sweep itself, mostly waiting, does not.
  absl::StatusOr<SubprocessResult> r = RunSubprocess(
      "/bin/sh",
      {"-c", absl::StrCat("ulimit -S -t 1; exec ", TPUSHIM_TOOL_PATH,
                          " tune --sizes 8M --seconds 30 --streams 2 "
                          "--transfer-sizes 1M --repeats 1 --json")},
      Env(), absl::Seconds(120));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 1) << r->out << r->err;
  const Json j = Json::parse(r->out);
  EXPECT_EQ(j["points"][0]["status"], "crashed");
  EXPECT_THAT(j["points"][0]["error"]["message"].get<std::string>(),
              HasSubstr("SIGXCPU"));
}

TEST_F(TuneTest, WorkloadFileAndOptionsCombine) {
  const std::string file = absl::StrCat(dir_.path(), "/workload.json");
  std::ofstream(file) << R"({"transfer_sizes": "histogram:64K=3,256K=1",
                             "directions": ["h2d", "d2d"], "streams": 3,
                             "devices": 2, "step_ms": 1000,
                             "step_bytes": "1M", "seed": 7})";
  const Json j =
      RunJson({"--sizes", "8M", "--workload", file, "--streams", "1"});
  const Json& w = j["workload"];
  EXPECT_EQ(w["transfer_sizes"], "loguniform:64K-1M");  // the option wins
  EXPECT_EQ(w["directions"], Json::array({"h2d", "d2d"}));
  EXPECT_EQ(w["streams"], 1);
  EXPECT_EQ(w["devices"], 2);
  EXPECT_EQ(w["seed"], 7);
  EXPECT_EQ(j["device"], "sim://?hbm=64M&devices=2");
  const Json& p = j["points"][0];
  EXPECT_GT(p["path_counts"]["d2d"].get<uint64_t>(), 0u);
  EXPECT_EQ(p["path_counts"]["zero_copy"].get<uint64_t>() +
                p["path_counts"]["staged"].get<uint64_t>() +
                p["path_counts"]["pinned"].get<uint64_t>() +
                p["path_counts"]["d2d"].get<uint64_t>(),
            200u);
  // 1M per step at GB/s takes far less than a second.
  EXPECT_EQ(p["input_bound"], false);
  EXPECT_LT(p["step_input_ms"].get<double>(), 1000);
}

TEST_F(TuneTest, AWorkloadTooBigForTheDeviceFailsItsPointsSayingSo) {
  // Two streams of 64M transfers need 256M of HBM; the device has 64M.
  const Json j =
      RunJson({"--sizes", "8M", "--transfer-sizes", "64M", "--count", "4"},
              /*expected_exit=*/1);
  const Json& p = j["points"][0];
  EXPECT_EQ(p["status"], "failed");
  EXPECT_EQ(p["error"]["code"], "RESOURCE_EXHAUSTED");
  EXPECT_THAT(p["error"]["message"].get<std::string>(),
              AllOf(StartsWith("setting up the workload's streams: "),
                    HasSubstr("Error allocating device buffer")));
}

TEST_F(TuneTest, RepeatsRunEachPointThatManyTimes) {
  const Json j = RunJson({"--sizes", "8M", "--repeats", "2"});
  EXPECT_EQ(j["repeats"], 2);
  const Json& p = j["points"][0];
  EXPECT_EQ(p["status"], "ok");
  EXPECT_EQ(p["transfers"], 200);
  // The median of two runs lies in their range.
  const Json& range = p["gbps_range"];
  EXPECT_LE(range[0].get<double>(), p["gbps"].get<double>());
  EXPECT_LE(p["gbps"].get<double>(), range[1].get<double>());
  EXPECT_EQ(j["recommendation"]["gbps_range"], range);
}

// Without --repeats every point runs three times, and the table shows each
// point's median and range.
TEST_F(TuneTest, ThreeRunsPerPointByDefaultWithTheRangeInTheTable) {
  const SubprocessResult r =
      Run({"--sizes", "8M,16M", "--count", "20", "--transfer-sizes", "64K"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, AllOf(HasSubstr("tpushim tune: 2 points, 3 runs each"),
                           HasSubstr(" RANGE "),
                           ::testing::ContainsRegex(
                               "\n  8M +default +ok .* "
                               "[0-9]+\\.[0-9]{2}-[0-9]+\\.[0-9]{2} "),
                           HasSubstr("the median of the runs; RANGE = "
                                     "slowest-fastest run")));
}

// Every point had RESOURCE_EXHAUSTED: the application's three 4M buffers
// fit neither a 4M nor an 8M region. No recommendation, exit status 1.
// Twenty transfers: with no staging room each waits out the staging
// timeout before it falls back to per-call pinning.
TEST_F(TuneTest, NoCleanPointMeansNoRecommendationAndExitStatusOne) {
  const std::vector<std::string> args = {
      "--sizes",          "4M,8M",
      "--pinned-buffers", "3",
      "--pinned-bytes",   "4M",
      "--count",          "20",
      "--transfer-sizes", "loguniform:64K-1M"};
  const Json j = RunJson(args, /*expected_exit=*/1);
  ASSERT_EQ(j["points"].size(), 2u);
  for (const Json& p : j["points"]) {
    EXPECT_EQ(p["status"], "ok");
    EXPECT_GE(p["resource_exhausted"].get<uint64_t>(), 1u) << p.dump();
  }
  EXPECT_TRUE(j["recommendation"].is_null());
  const std::string why =
      "No point ran cleanly, so there is nothing to recommend (of the 2 "
      "points, 2 had RESOURCE_EXHAUSTED); larger sizes or fewer pinned "
      "buffers may fit.";
  EXPECT_EQ(j["no_recommendation_reason"], why);
  SubprocessResult table = Run(Quick(args));
  EXPECT_EQ(table.exit_code, 1) << table.err;
  EXPECT_THAT(table.out,
              HasSubstr(absl::StrCat("Recommendation: none.\n  ", why, "\n")));
  std::vector<std::string> csv_args = Quick(args);
  csv_args.push_back("--csv");
  SubprocessResult csv = Run(csv_args);
  EXPECT_EQ(csv.exit_code, 1);
  EXPECT_THAT(csv.err, HasSubstr(absl::StrCat("tpushim tune: ", why, "\n")));
}

TEST_F(TuneTest, PlotWritesAnSvgWithBothPanels) {
  const std::string svg = absl::StrCat(dir_.path(), "/sweep.svg");
  const Json j =
      RunJson({"--sizes", "8M,16M", "--thresholds", "256K,default",
               "--pinned-buffers", "3", "--pinned-bytes", "4M", "--plot", svg});
  EXPECT_EQ(j["plot"], svg);
  const std::string text = ReadFileOrEmpty(svg);
  EXPECT_THAT(
      text,
      AllOf(HasSubstr("<svg"), HasSubstr("throughput (GB/s)"),
            HasSubstr("start-up (s)"), HasSubstr("threshold 256K"),
            HasSubstr("default threshold"), HasSubstr("RESOURCE_EXHAUSTED")));
}

// A plot that cannot be written is a failure naming the file and why,
// even though gnuplot itself does not notice a full disk.
TEST_F(TuneTest, PlotToAFullDiskFailsWithExit1) {
  const std::string svg = absl::StrCat(dir_.path(), "/full.svg");
  ASSERT_EQ(symlink("/dev/full", svg.c_str()), 0);
  const Json j =
      RunJson({"--sizes", "8M", "--thresholds", "default", "--pinned-buffers",
               "3", "--pinned-bytes", "4M", "--plot", svg},
              /*expected_exit=*/1);
  EXPECT_TRUE(j["plot"].is_null());
  std::vector<std::string> args =
      Quick({"--sizes", "8M", "--thresholds", "default", "--pinned-buffers",
             "3", "--pinned-bytes", "4M", "--plot", svg});
  SubprocessResult r = Run(args);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, AllOf(HasSubstr(absl::StrCat("--plot ", svg)),
                           HasSubstr("No space left on device")));
  EXPECT_THAT(r.out, Not(HasSubstr(absl::StrCat("Plot: ", svg))));
}

TEST_F(TuneTest, PlotWithoutGnuplotSaysSoBeforeRunning) {
  SubprocessResult r =
      Run({"--sizes", "8M", "--plot", "x.svg"}, {"PATH=/nonexistent"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, AllOf(HasSubstr("--plot needs gnuplot"),
                           HasSubstr("not installed")));
  EXPECT_THAT(r.out, Not(HasSubstr("SIZE")));
}

TEST_F(TuneTest, BadInputIsAUsageErrorNamingIt) {
  struct Case {
    std::vector<std::string> args;
    std::vector<std::string> env;
    const char* message;
  };
  const Case cases[] = {
      {{"--sizes", "5000"}, {}, "not a multiple of 4096"},
      {{"--sizes", "8M..4M"}, {}, "0 < A <= B"},
      {{"--thresholds", "0"}, {}, "must be > 0"},
      {{"--sizes", "default"}, {}, "only in --thresholds"},
      {{"--transfer-sizes", "normal:1M"}, {}, "--transfer-sizes"},
      {{"--directions", "h2x"}, {}, "unknown direction \"h2x\""},
      {{"--pinned-buffers", "2"}, {}, "--pinned-bytes"},
      {{"--zero-copy-share", "2"}, {}, "--zero-copy-share"},
      {{"--plot", "x.pdf"}, {}, ".svg or .png"},
      {{"--sizes", "8M"},
       {"LIBTPU_INIT_ARGS=--tpu_premapped_buffer_size=4096"},
       "LIBTPU_INIT_ARGS sets --tpu_premapped_buffer_size"},
      {{"--sizes", "8M"}, {"TPUSHIM_DEVICE=gpu://"}, "device URL"},
      {{"--sizes", "8M", "--workload", "/nonexistent.json"}, {}, "--workload"},
  };
  for (const Case& c : cases) {
    SubprocessResult r = Run(c.args, c.env);
    EXPECT_EQ(r.exit_code, 2) << absl::StrJoin(c.args, " ") << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr(c.message)) << absl::StrJoin(c.args, " ");
  }
}

TEST_F(TuneTest, HelpNamesTheJsonFields) {
  SubprocessResult r = Run({"--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_THAT(
      r.out,
      AllOf(HasSubstr("--pinned-buffers"), HasSubstr("\"recommendation\""),
            HasSubstr("resource_exhausted"), HasSubstr("Examples:"),
            HasSubstr("--repeats N (default 3)"),
            HasSubstr("slowest run reaches 95% of the best median"),
            HasSubstr("within_noise"), HasSubstr("no_recommendation_reason"),
            HasSubstr("gbps_min,gbps_max")));
}

}  // namespace
}  // namespace tpushim
