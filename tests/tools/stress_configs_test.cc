// `tpushim stress` over every kind of valid configuration must report no
// violation: a run that counts a documented failure as one is the tool's
// bug, not the runtime's. The built tool runs as a subprocess, as in
// stress_test.cc.

#include <cstdint>
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
    // every host transfer takes the pinned path.
    EXPECT_GT(pinned["count"].get<uint64_t>(), 0u);
    EXPECT_EQ(pinned["codes"].value("FAILED_PRECONDITION", 0u) +
                  pinned["codes"].value("SKIPPED", 0u),
              pinned["count"].get<uint64_t>())
        << pinned.dump();
    for (const char* dir : {"h2d", "d2h"}) {
      EXPECT_EQ(j["paths"][dir]["zero_copy"], 0) << dir;
      EXPECT_EQ(j["paths"][dir]["staged"], 0) << dir;
      EXPECT_GT(j["paths"][dir]["pinned"].get<uint64_t>(), 0u) << dir;
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

}  // namespace
}  // namespace tpushim
