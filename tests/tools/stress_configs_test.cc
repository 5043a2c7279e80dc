// `tpushim stress` over every kind of valid configuration must report no
// violation: a run that counts a documented failure as one is the tool's
// bug, not the runtime's. Also the configurations that are not valid: a bad
// --region-bytes or --threshold names the flag (exit 2), and a region the
// host cannot hold is the runtime's start-up error (exit 1), not a
// violation. The built tool runs as a subprocess, as in stress_test.cc.

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace tpushim {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;
using testutil::RunSubprocess;
using testutil::SubprocessResult;
using testutil::TempDir;

using Json = nlohmann::ordered_json;

constexpr char kAllPoints[] =
    "mmap:rate=0.01,seed=1;madvise:rate=0.01,seed=2;mlock:rate=0.01,seed=3;"
    "numa:rate=0.01,seed=4;alloc:rate=0.01,seed=5;dma:rate=0.01,seed=6;"
    "pin:rate=0.01,seed=7;log_open:rate=0.01,seed=8";

// Runs `tpushim stress <args>` with the logs in `logs` and, when given,
// TPUSHIM_DEVICE=`device` (else the stress default devices).
SubprocessResult RunStress(const TempDir& logs, std::vector<std::string> args,
                           const std::string& device = "") {
  args.insert(args.begin(), "stress");
  std::vector<std::string> env = {absl::StrCat("TPU_LOG_DIR=", logs.path())};
  if (!device.empty()) env.push_back(absl::StrCat("TPUSHIM_DEVICE=", device));
  absl::StatusOr<SubprocessResult> result =
      RunSubprocess(TPUSHIM_TOOL_PATH, args, env, absl::Seconds(60));
  EXPECT_TRUE(result.ok()) << result.status();
  if (!result.ok()) return SubprocessResult{};
  EXPECT_EQ(result->term_signal, 0) << result->err;
  return *result;
}

Json ParseJson(const std::string& text) {
  Json json = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(json.is_discarded()) << text;
  return json;
}

// ---- Valid configurations: no violation ------------------------------------

struct ValidConfig {
  std::string name;
  std::vector<std::string> args;
  std::string device;  // TPUSHIM_DEVICE; empty: the stress default
  uint64_t region_bytes = 0;
  uint64_t threshold_bytes = 0;
};

// For test names and failure messages: the row's name, not its bytes.
void PrintTo(const ValidConfig& c, std::ostream* os) { *os << c.name; }

class StressValidConfigTest : public ::testing::TestWithParam<ValidConfig> {};

TEST_P(StressValidConfigTest, RunsWithoutViolations) {
  const ValidConfig& c = GetParam();
  TempDir logs;
  std::vector<std::string> args = {"--ops",  "1200", "--threads", "4",
                                   "--seed", "7",    "--json"};
  args.insert(args.end(), c.args.begin(), c.args.end());
  const SubprocessResult r = RunStress(logs, args, c.device);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  const Json j = ParseJson(r.out);
  EXPECT_TRUE(j["violations"].empty()) << j["violations"].dump(2);
  EXPECT_EQ(j["startup"]["ok"], true) << j["startup"].dump();
  EXPECT_EQ(j["ops"], 1200);
  EXPECT_EQ(j["region_bytes"], c.region_bytes);
  EXPECT_EQ(j["threshold_bytes"], c.threshold_bytes);
  EXPECT_TRUE(j["teardown"]["failures"].empty());
  EXPECT_GT(j["transfers_verified"].get<uint64_t>(), 0u);
  if (!c.device.empty()) {
    EXPECT_EQ(j["device"], c.device);
  }
  const Json& pinned = j["by_op"]["alloc_pinned"];
  if (c.region_bytes == 0) {
    // Every pinned host allocation fails as documented, none succeeds, and
    // host transfers go through the bounce pool (staged) or pin: never
    // zero-copy.
    EXPECT_GT(pinned["count"].get<uint64_t>(), 0u);
    EXPECT_EQ(pinned["codes"].value("FAILED_PRECONDITION", 0u) +
                  pinned["codes"].value("SKIPPED", 0u),
              pinned["count"].get<uint64_t>())
        << pinned.dump();
    for (const char* dir : {"h2d", "d2h"}) {
      EXPECT_EQ(j["paths"][dir]["zero_copy"], 0) << dir;
      EXPECT_GT(j["paths"][dir]["staged"].get<uint64_t>(), 0u) << dir;
    }
  } else {
    EXPECT_EQ(pinned["codes"].value("FAILED_PRECONDITION", 0u), 0u)
        << pinned.dump();
  }
}

constexpr uint64_t kM = uint64_t{1} << 20;

INSTANTIATE_TEST_SUITE_P(
    Configs, StressValidConfigTest,
    ::testing::Values(
        ValidConfig{"RegionOff", {"--region-bytes", "0"}, "", 0, 0},
        ValidConfig{"RegionOffUnderFaults",
                    {"--region-bytes", "0", "--faults", kAllPoints},
                    "",
                    0,
                    0},
        ValidConfig{
            "TinyRegion", {"--region-bytes", "64K"}, "", 64 << 10, 64 << 10},
        ValidConfig{"ThresholdOne", {"--threshold", "1"}, "", 64 * kM, 1},
        ValidConfig{"ThresholdIsTheRegion",
                    {"--region-bytes", "8M", "--threshold", "8M"},
                    "",
                    8 * kM,
                    8 * kM},
        ValidConfig{"ThresholdAboveTheRegionIsClamped",
                    {"--region-bytes", "1M", "--threshold", "4M"},
                    "",
                    kM,
                    kM},
        ValidConfig{
            "OneDevice", {}, "sim://?devices=1&hbm=256M", 64 * kM, 4 * kM},
        ValidConfig{
            "EightDevices", {}, "sim://?devices=8&hbm=64M", 64 * kM, 4 * kM},
        ValidConfig{"DmaFaults",
                    {"--faults", "dma:rate=0.01,seed=1"},
                    "",
                    64 * kM,
                    4 * kM}),
    [](const ::testing::TestParamInfo<ValidConfig>& param) {
      return param.param.name;
    });

// ---- Start-up ---------------------------------------------------------------

TEST(StressStartupTest, RegionTheHostCannotHoldIsTheRuntimesError) {
  TempDir logs;
  SubprocessResult r =
      RunStress(logs, {"--ops", "100", "--region-bytes", "1T"});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  // As the status prints itself: its code first, for scripts to match.
  EXPECT_THAT(r.err, StartsWith("tpushim: cannot start the runtime: "
                                "RESOURCE_EXHAUSTED: "));
  EXPECT_THAT(r.err, HasSubstr("TPU_PREMAPPED_BUFFER_SIZE=1099511627776"));
  EXPECT_THAT(r.err, Not(HasSubstr("violation")));
  EXPECT_EQ(r.out, "");

  r = RunStress(logs, {"--ops", "100", "--region-bytes", "1T", "--json"});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  const Json j = ParseJson(r.out);
  EXPECT_EQ(j["error"]["code"], "RESOURCE_EXHAUSTED") << r.out;
  EXPECT_FALSE(j.contains("violations"));
}

TEST(StressStartupTest, InjectedStartupFailureStaysACleanOutcome) {
  TempDir logs;
  const SubprocessResult r =
      RunStress(logs, {"--ops", "100", "--region-bytes", "1M", "--faults",
                       "mmap:nth=1", "--json"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  const Json j = ParseJson(r.out);
  EXPECT_EQ(j["startup"]["ok"], false);
  EXPECT_THAT(j["startup"]["message"].get<std::string>(),
              HasSubstr("[injected: mmap:nth=1]"));
  EXPECT_TRUE(j["violations"].empty()) << j["violations"].dump();
}

// ---- Bad --region-bytes and --threshold -------------------------------------

TEST(StressFlagValuesTest, BadRegionOrThresholdNamesTheFlag) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--region-bytes", "4097"},
       "--region-bytes must be a multiple of 4096 bytes (4 KiB pages), got "
       "\"4097\"; the nearest valid values are 4096 and 8192; 0 turns the "
       "region off"},
      {{"--region-bytes", "5K"},
       "--region-bytes must be a multiple of 4096 bytes (4 KiB pages), got "
       "\"5K\" (5120 bytes); the nearest valid values are 4096 and 8192"},
      {{"--region-bytes", "1000"},
       "got \"1000\"; the nearest valid values are 0 and 4096"},
      {{"--threshold", "0"},
       "--threshold must be at least 1 byte while the premapped region is "
       "on (it is the largest allocation from the region, and host "
       "transfers above it take the pinned path), got \"0\""},
      {{"--region-bytes", "8M", "--threshold", "0"},
       "--threshold must be at least 1 byte"},
  };
  TempDir logs;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.args.back());
    std::vector<std::string> args = {"--ops", "10"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    SubprocessResult r = RunStress(logs, args);
    EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
    EXPECT_THAT(r.err, StartsWith("tpushim: invalid command line: "));
    EXPECT_THAT(r.err, HasSubstr(c.message));
    EXPECT_THAT(r.err, Not(HasSubstr("API option")));

    args.push_back("--json");
    r = RunStress(logs, args);
    EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
    const Json j = ParseJson(r.out);
    EXPECT_EQ(j["error"]["code"], "INVALID_ARGUMENT");
    EXPECT_THAT(j["error"]["message"].get<std::string>(), HasSubstr(c.message));
  }
  // With the region off there is no threshold: 0 is fine.
  const SubprocessResult r = RunStress(
      logs, {"--ops", "10", "--region-bytes", "0", "--threshold", "0"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
}

}  // namespace
}  // namespace tpushim
