// End-to-end tests of `tpushim bench`: the built tool runs as a subprocess
// with an exact environment (a 16 MiB region, one simulated device with
// 64 MiB of HBM, logs in a temporary directory) on two small sizes with a
// short time per cell, and its exit status, JSON, CSV and tables are
// checked.

#include <cstdint>
#include <set>
#include <string>
#include <tuple>
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
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using testutil::RunSubprocess;
using testutil::SubprocessResult;
using testutil::TempDir;

using Json = nlohmann::ordered_json;

constexpr char kSmallRegion[] = "TPU_PREMAPPED_BUFFER_SIZE=16777216";
constexpr char kDevice[] = "TPUSHIM_DEVICE=sim://?hbm=64M";

// Two sizes, 20 ms per cell.
const std::vector<std::string> kQuick = {"bench", "--sizes", "4K,1M",
                                         "--seconds", "0.02"};

std::vector<std::string> With(std::vector<std::string> args,
                              const std::vector<std::string>& more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

// (direction, path or "-", bytes)
using CellKey = std::tuple<std::string, std::string, uint64_t>;

CellKey KeyOf(const Json& j) {
  return {j["direction"].get<std::string>(),
          j["path"].is_null() ? "-" : j["path"].get<std::string>(),
          j["bytes"].get<uint64_t>()};
}

std::set<CellKey> Keys(const Json& array) {
  std::set<CellKey> keys;
  for (const Json& j : array) keys.insert(KeyOf(j));
  return keys;
}

std::vector<std::string> KeyNames(const Json& object) {
  std::vector<std::string> names;
  for (auto it = object.begin(); it != object.end(); ++it) {
    names.push_back(it.key());
  }
  return names;
}

constexpr uint64_t k4K = 4096;
constexpr uint64_t k1M = 1048576;

class BenchTest : public ::testing::Test {
 protected:
  // Runs `tpushim <args>` in exactly `env` plus TPU_LOG_DIR.
  SubprocessResult RunTool(const std::vector<std::string>& args,
                           std::vector<std::string> env) {
    env.push_back(absl::StrCat("TPU_LOG_DIR=", log_dir_.path()));
    absl::StatusOr<SubprocessResult> result =
        RunSubprocess(TPUSHIM_TOOL_PATH, args, env, absl::Seconds(60));
    EXPECT_TRUE(result.ok()) << result.status();
    if (!result.ok()) return SubprocessResult{};
    EXPECT_EQ(result->term_signal, 0) << result->err;
    return *result;
  }
  SubprocessResult RunSmall(const std::vector<std::string>& args,
                            std::vector<std::string> extra_env = {}) {
    extra_env.push_back(kSmallRegion);
    extra_env.push_back(kDevice);
    return RunTool(args, extra_env);
  }
  Json RunJson(const std::vector<std::string>& args,
               std::vector<std::string> env) {
    SubprocessResult r = RunTool(With(args, {"--json"}), std::move(env));
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    Json j = Json::parse(r.out, nullptr, /*allow_exceptions=*/false);
    EXPECT_TRUE(j.is_object()) << "not one JSON object:\n" << r.out;
    return j;
  }

  TempDir log_dir_;
};

TEST_F(BenchTest, JsonFieldsAndPathsForTheConfiguration) {
  const Json j = RunJson(kQuick, {kSmallRegion, kDevice});
  ASSERT_TRUE(j.is_object());
  EXPECT_THAT(KeyNames(j),
              ElementsAre("memcpy_gbps", "memcpy_bytes", "config", "rows",
                          "skipped", "partial", "interrupted_by"));
  EXPECT_EQ(j["partial"], false);
  EXPECT_TRUE(j["interrupted_by"].is_null());
  ASSERT_TRUE(j["memcpy_gbps"].is_number_float());
  EXPECT_GT(j["memcpy_gbps"].get<double>(), 0.0);
  EXPECT_EQ(j["memcpy_bytes"], k1M);

  const Json& c = j["config"];
  EXPECT_THAT(KeyNames(c),
              ElementsAre("premapped_bytes", "threshold_bytes", "device",
                          "device_index", "hbm_bytes", "seconds_per_cell"));
  EXPECT_EQ(c["premapped_bytes"], 16777216u);
  EXPECT_EQ(c["threshold_bytes"], 16777216u);
  EXPECT_EQ(c["device"], "sim://?hbm=64M");
  EXPECT_EQ(c["device_index"], 0);
  EXPECT_EQ(c["hbm_bytes"], 64u << 20);
  EXPECT_DOUBLE_EQ(c["seconds_per_cell"].get<double>(), 0.02);

  // Region on, both sizes under the threshold: zero_copy and staged both
  // ways, d2d; pageable memory cannot take the pinned path.
  ASSERT_TRUE(j["rows"].is_array());
  const std::set<CellKey> expected_rows = {
      {"h2d", "zero_copy", k4K}, {"h2d", "zero_copy", k1M},
      {"h2d", "staged", k4K},    {"h2d", "staged", k1M},
      {"d2h", "zero_copy", k4K}, {"d2h", "zero_copy", k1M},
      {"d2h", "staged", k4K},    {"d2h", "staged", k1M},
      {"d2d", "-", k4K},         {"d2d", "-", k1M}};
  EXPECT_EQ(Keys(j["rows"]), expected_rows) << j["rows"];
  EXPECT_EQ(j["rows"].size(), expected_rows.size());
  std::vector<CellKey> order;
  for (const Json& row : j["rows"]) {
    EXPECT_THAT(KeyNames(row),
                ElementsAre("direction", "path", "bytes", "gbps", "p50_us",
                            "p99_us", "vs_memcpy", "iterations"));
    EXPECT_TRUE(row["direction"].is_string());
    EXPECT_TRUE(row["path"].is_string() || row["path"].is_null());
    EXPECT_EQ(row["path"].is_null(), row["direction"] == "d2d") << row;
    EXPECT_TRUE(row["bytes"].is_number_unsigned());
    EXPECT_GT(row["gbps"].get<double>(), 0.0) << row;
    EXPECT_GT(row["p50_us"].get<double>(), 0.0) << row;
    EXPECT_GE(row["p99_us"].get<double>(), row["p50_us"].get<double>());
    EXPECT_GT(row["vs_memcpy"].get<double>(), 0.0) << row;
    EXPECT_GE(row["iterations"].get<uint64_t>(), 3u) << row;
    // gbps is bytes over the median time.
    EXPECT_NEAR(
        row["gbps"].get<double>(),
        row["bytes"].get<double>() / (row["p50_us"].get<double>() * 1e3),
        row["gbps"].get<double>() * 1e-9);
    order.push_back(KeyOf(row));
  }
  // Ordered by direction, path, size.
  EXPECT_EQ(std::get<0>(order.front()), "h2d");
  EXPECT_EQ(order.front(), CellKey("h2d", "zero_copy", k4K));
  EXPECT_EQ(order.back(), CellKey("d2d", "-", k1M));

  ASSERT_TRUE(j["skipped"].is_array());
  EXPECT_EQ(Keys(j["skipped"]), (std::set<CellKey>{{"h2d", "pinned", k4K},
                                                   {"h2d", "pinned", k1M},
                                                   {"d2h", "pinned", k4K},
                                                   {"d2h", "pinned", k1M}}));
  for (const Json& s : j["skipped"]) {
    EXPECT_THAT(KeyNames(s),
                ElementsAre("direction", "path", "bytes", "reason"));
    EXPECT_THAT(s["reason"].get<std::string>(),
                HasSubstr("at or below the transfer threshold (16M)"));
  }
}

TEST_F(BenchTest, CsvHeaderAndRows) {
  SubprocessResult r = RunSmall(With(kQuick, {"--csv"}));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, IsEmpty());
  std::vector<std::string> lines =
      absl::StrSplit(r.out, '\n', absl::SkipEmpty());
  // The 10 cells measured, then the 4 pinned ones the 16M threshold rules
  // out, with their reason.
  ASSERT_EQ(lines.size(), 15u) << r.out;
  EXPECT_EQ(lines[0],
            "direction,path,bytes,gbps,vs_memcpy,p50_us,p99_us,iterations,"
            "skipped_reason");
  EXPECT_THAT(lines[1], HasSubstr("h2d,zero_copy,4096,"));
  EXPECT_THAT(lines[10], HasSubstr("d2d,-,1048576,"));
  for (size_t i = 1; i <= 10; ++i) {
    EXPECT_EQ(std::vector<std::string>(absl::StrSplit(lines[i], ',')).size(),
              9u)
        << lines[i];
    EXPECT_EQ(lines[i].back(), ',') << "a measured cell has no reason";
  }
  for (size_t i = 11; i < lines.size(); ++i) {
    EXPECT_THAT(lines[i],
                ::testing::MatchesRegex(
                    "(h2d|d2h),pinned,[0-9]+,,,,,,at or below the transfer "
                    "threshold.*"))
        << lines[i];
  }
}

TEST_F(BenchTest, ThresholdBelowASizeMeasuresThePinnedPath) {
  const Json j =
      RunJson(kQuick, {kSmallRegion, kDevice,
                       "TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES=65536"});
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j["config"]["threshold_bytes"], 65536u);
  const std::set<CellKey> rows = Keys(j["rows"]);
  const std::set<CellKey> expected_rows = {
      {"h2d", "zero_copy", k4K}, {"h2d", "staged", k4K}, {"h2d", "pinned", k1M},
      {"d2h", "zero_copy", k4K}, {"d2h", "staged", k4K}, {"d2h", "pinned", k1M},
      {"d2d", "-", k4K},         {"d2d", "-", k1M}};
  EXPECT_EQ(rows, expected_rows) << j["rows"];
  std::set<CellKey> skipped;
  for (const Json& s : j["skipped"]) {
    skipped.insert(KeyOf(s));
    const std::string reason = s["reason"].get<std::string>();
    if (s["path"] == "pinned") {
      EXPECT_THAT(reason, HasSubstr("takes the staged path"));
    } else {
      EXPECT_THAT(reason, HasSubstr("above the transfer threshold (64K)"));
    }
  }
  EXPECT_EQ(skipped, (std::set<CellKey>{{"h2d", "zero_copy", k1M},
                                        {"h2d", "staged", k1M},
                                        {"h2d", "pinned", k4K},
                                        {"d2h", "zero_copy", k1M},
                                        {"d2h", "staged", k1M},
                                        {"d2h", "pinned", k4K}}));
}

// With the region off, sizes up to 1M are staged through the bounce pool
// and larger ones pinned; zero-copy has no pinned host buffers.
TEST_F(BenchTest, RegionOffMeasuresTheBouncePoolPinnedAndDeviceToDevice) {
  const Json j = RunJson({"bench", "--sizes", "4K,1M,2M", "--seconds", "0.01"},
                         {"TPU_PREMAPPED_BUFFER_SIZE=0", kDevice});
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j["config"]["premapped_bytes"], 0u);
  EXPECT_EQ(Keys(j["rows"]), (std::set<CellKey>{{"h2d", "staged", k4K},
                                                {"h2d", "staged", k1M},
                                                {"h2d", "pinned", 2 * k1M},
                                                {"d2h", "staged", k4K},
                                                {"d2h", "staged", k1M},
                                                {"d2h", "pinned", 2 * k1M},
                                                {"d2d", "-", k4K},
                                                {"d2d", "-", k1M},
                                                {"d2d", "-", 2 * k1M}}));
  EXPECT_EQ(j["skipped"].size(), 12u) << j["skipped"];
  for (const Json& s : j["skipped"]) {
    EXPECT_THAT(s["reason"].get<std::string>(),
                HasSubstr("the premapped region is off"));
    if (s["path"] == "staged") {
      EXPECT_THAT(s["reason"].get<std::string>(),
                  HasSubstr("above the bounce pool's 1M"));
    } else if (s["path"] == "pinned") {
      EXPECT_THAT(s["reason"].get<std::string>(),
                  HasSubstr("staged through the bounce pool"));
    }
  }
}

TEST_F(BenchTest, SizesBeyondTheDeviceAreSkippedNotErrors) {
  const Json j = RunJson({"bench", "--sizes", "4K,2M", "--seconds", "0.01",
                          "--directions", "h2d,d2d", "--paths", "staged"},
                         {kSmallRegion, "TPUSHIM_DEVICE=sim://?hbm=1M"});
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(Keys(j["rows"]),
            (std::set<CellKey>{{"h2d", "staged", k4K}, {"d2d", "-", k4K}}));
  EXPECT_EQ(Keys(j["skipped"]), (std::set<CellKey>{{"h2d", "staged", 2 * k1M},
                                                   {"d2d", "-", 2 * k1M}}));
  for (const Json& s : j["skipped"]) {
    EXPECT_THAT(s["reason"].get<std::string>(),
                HasSubstr("device 0 cannot hold"));
  }
}

TEST_F(BenchTest, HumanTableWithoutProgressBarWhenStderrIsNotATerminal) {
  SubprocessResult r = RunSmall(kQuick);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  // stderr is a pipe here: no progress bar, nothing else either.
  EXPECT_THAT(r.err, IsEmpty());
  EXPECT_THAT(r.out, Not(HasSubstr("\r")));
  EXPECT_THAT(
      r.out,
      AllOf(HasSubstr("tpushim bench: device 0 (sim:0"),
            HasSubstr("transfer threshold 16777216 (16.00M)"),
            HasSubstr("memcpy (one thread, 1M, warm buffers): "),
            HasSubstr("DIRECTION  PATH       SIZE"), HasSubstr("GB/s"),
            HasSubstr("vs-memcpy"), HasSubstr("\n  h2d        zero_copy  4K"),
            HasSubstr("\n  d2d        -          1M"),
            HasSubstr("Skipped:\n  h2d pinned 4K,1M: at or below the "
                      "transfer threshold (16M)")));
}

// TPUSHIM_PREMAP=background: the bench waits for the region before it
// measures, so no staged cell is skipped for want of premapped staging
// room (nor measured while premapping competes). The region is large
// (1 GiB, one pre-fault thread, 4 KiB pages: a few hundred ms to premap)
// so that, without the wait, the staged cells would come first.
TEST_F(BenchTest, BackgroundPremappingIsAwaitedBeforeMeasuring) {
  const Json j =
      RunJson({"bench", "--sizes", "4K", "--seconds", "0.02", "--directions",
               "h2d,d2h", "--paths", "staged,zero_copy"},
              {"TPU_PREMAPPED_BUFFER_SIZE=1073741824",
               "TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES=16777216",
               kDevice, "TPUSHIM_PREMAP=background", "TPUSHIM_HUGEPAGES=off",
               "TPUSHIM_PREFAULT_THREADS=1"});
  ASSERT_TRUE(j.is_object());
  EXPECT_THAT(j["skipped"], IsEmpty()) << j["skipped"];
  std::set<CellKey> measured;
  for (const Json& row : j["rows"]) measured.insert(KeyOf(row));
  EXPECT_EQ(measured, (std::set<CellKey>{{"h2d", "staged", k4K},
                                         {"h2d", "zero_copy", k4K},
                                         {"d2h", "staged", k4K},
                                         {"d2h", "zero_copy", k4K}}));
}

TEST_F(BenchTest, FailedTransferExitsOne) {
  SubprocessResult r =
      RunSmall(With(kQuick, {"--json"}), {"TPUSHIM_FAULTS=dma:nth=3"});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  const Json j = Json::parse(r.out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << r.out;
  EXPECT_THAT(j["error"]["message"].get<std::string>(),
              HasSubstr("injected: dma:nth=3"));
}

TEST_F(BenchTest, BadFlagsExitTwo) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"bench", "--sizes", "12X"}, "--sizes"},
      {{"bench", "--sizes", "0"}, "--sizes"},
      {{"bench", "--sizes", "8G"}, "--sizes"},
      {{"bench", "--sizes", "4K,,1M"}, "--sizes"},
      {{"bench", "--directions", "h2x"}, "--directions"},
      {{"bench", "--paths", "fast"}, "--paths"},
      {{"bench", "--seconds", "-1"}, "--seconds"},
      {{"bench", "--device", "-1"}, "--device"},
      {{"bench", "--json", "--csv"}, "--csv"},
      {{"bench", "--no-such-flag"}, "--no-such-flag"},
      // One device configured.
      {{"bench", "--device", "3", "--sizes", "4K"}, "--device=3"},
  };
  for (const Case& c : cases) {
    SubprocessResult r = RunSmall(c.args);
    EXPECT_EQ(r.exit_code, 2) << absl::StrJoin(c.args, " ") << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr(c.message)) << absl::StrJoin(c.args, " ");
    EXPECT_THAT(r.out, IsEmpty()) << absl::StrJoin(c.args, " ");
  }
}

TEST_F(BenchTest, InvalidConfigurationExitsTwo) {
  SubprocessResult r =
      RunTool(With(kQuick, {"--json"}), {"TPU_PREMAPPED_BUFFER_SIZE=5000"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  const Json j = Json::parse(r.out, nullptr, false);
  EXPECT_EQ(j["error"]["code"], "INVALID_ARGUMENT") << r.out;
}

// A runtime that cannot start is exit 1 with its status code first, as the
// demo reports it; an invalid configuration found at start-up is exit 2.
TEST_F(BenchTest, StartupFailureNamesTheStatusCode) {
  SubprocessResult r =
      RunTool(kQuick, {"TPU_PREMAPPED_BUFFER_SIZE=1099511627776"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("tpushim: cannot start the runtime: "
                               "RESOURCE_EXHAUSTED: "));
  EXPECT_THAT(r.out, IsEmpty());

  r = RunTool(With(kQuick, {"--json"}),
              {"TPU_PREMAPPED_BUFFER_SIZE=1099511627776"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  const Json j = Json::parse(r.out, nullptr, false);
  EXPECT_EQ(j["error"]["code"], "RESOURCE_EXHAUSTED") << r.out;
}

TEST_F(BenchTest, HelpNamesTheFieldsAndExamples) {
  SubprocessResult r = RunTool({"bench", "--help"}, {});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(
      r.out,
      AllOf(HasSubstr("--sizes"), HasSubstr("--directions"),
            HasSubstr("--paths"), HasSubstr("--seconds"), HasSubstr("--device"),
            HasSubstr("--json"), HasSubstr("--csv"),
            HasSubstr("\"memcpy_gbps\""), HasSubstr("\"rows\""),
            HasSubstr("\"direction\""), HasSubstr("\"path\""),
            HasSubstr("\"bytes\""), HasSubstr("\"gbps\""),
            HasSubstr("\"p50_us\""), HasSubstr("\"p99_us\""),
            HasSubstr("\"vs_memcpy\""), HasSubstr("\"skipped\""),
            HasSubstr("\"reason\""), HasSubstr("null for d2d"),
            HasSubstr("direction,path,bytes,gbps"), HasSubstr("Examples"),
            HasSubstr("tpushim bench --json"), HasSubstr("Exit status: 0")));

  r = RunTool({"--help"}, {});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("bench"));
}

}  // namespace
}  // namespace tpushim
