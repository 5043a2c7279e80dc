// End-to-end tests of `tpushim stress`: the built tool runs as a subprocess
// with an exact environment (logs in a temporary directory, the stress
// defaults: two small simulated devices, a 64 MiB region with a 4 MiB
// threshold), and its exit status and JSON/CSV/table output are checked.

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

using ::testing::HasSubstr;
using ::testing::StartsWith;
using testutil::RunSubprocess;
using testutil::SubprocessResult;
using testutil::TempDir;

using Json = nlohmann::ordered_json;

constexpr char kAllPoints[] =
    "mmap:rate=0.01,seed=1;madvise:rate=0.01,seed=2;mlock:rate=0.01,seed=3;"
    "numa:rate=0.01,seed=4;alloc:rate=0.01,seed=5;dma:rate=0.01,seed=6;"
    "pin:rate=0.01,seed=7;log_open:rate=0.01,seed=8";

class StressTest : public ::testing::Test {
 protected:
  SubprocessResult RunTool(std::vector<std::string> args) {
    args.insert(args.begin(), "stress");
    absl::StatusOr<SubprocessResult> result = RunSubprocess(
        TPUSHIM_TOOL_PATH, args,
        {absl::StrCat("TPU_LOG_DIR=", log_dir_.path())}, absl::Seconds(60));
    EXPECT_TRUE(result.ok()) << result.status();
    if (!result.ok()) return SubprocessResult{};
    EXPECT_EQ(result->term_signal, 0) << result->err;
    return *result;
  }
  Json RunJson(std::vector<std::string> args, int expected_exit = 0) {
    args.push_back("--json");
    SubprocessResult r = RunTool(args);
    EXPECT_EQ(r.exit_code, expected_exit) << r.out << r.err;
    Json json = Json::parse(r.out, nullptr, /*allow_exceptions=*/false);
    EXPECT_FALSE(json.is_discarded()) << r.out;
    return json;
  }

  TempDir log_dir_;
};

uint64_t NonOk(const Json& by_code) {
  uint64_t n = 0;
  for (const auto& [code, count] : by_code.items()) {
    if (code != "OK") n += count.get<uint64_t>();
  }
  return n;
}

TEST_F(StressTest, CleanRunVerifiesBytesAndReconciles) {
  Json j = RunJson({"--ops", "2000", "--threads", "4", "--seed", "11"});
  EXPECT_EQ(j["seed"], 11);
  EXPECT_EQ(j["ops"], 2000);
  EXPECT_EQ(j["threads"], 4);
  EXPECT_EQ(j["faults"], "");
  EXPECT_EQ(j["startup"]["ok"], true);
  EXPECT_TRUE(j["violations"].empty()) << j["violations"].dump();
  EXPECT_GT(j["by_code"]["OK"].get<uint64_t>(), 0u);
  EXPECT_GT(j["bytes_verified"].get<uint64_t>(), 0u);
  EXPECT_EQ(j["teardown"]["checked"], true);
  EXPECT_TRUE(j["teardown"]["failures"].empty());
  EXPECT_EQ(j["callbacks"]["added"], j["callbacks"]["run"]);
  // All three paths, both directions.
  for (const char* dir : {"h2d", "d2h"}) {
    for (const char* path : {"zero_copy", "staged", "pinned"}) {
      EXPECT_GT(j["paths"][dir][path].get<uint64_t>(), 0u) << dir << path;
    }
  }
  EXPECT_GT(j["paths"]["d2d"].get<uint64_t>(), 0u);
  EXPECT_EQ(j["reproduce"], "tpushim stress --seed 11 --ops 2000 --threads 4");
}

TEST_F(StressTest, JsonFieldNamesAreExact) {
  Json j = RunJson({"--ops", "200", "--threads", "2", "--seed", "1"});
  std::vector<std::string> keys;
  for (const auto& [k, v] : j.items()) keys.push_back(k);
  const std::vector<std::string> expected_keys = {"seed",
                                                  "ops",
                                                  "threads",
                                                  "seconds",
                                                  "ops_per_second",
                                                  "faults",
                                                  "device",
                                                  "region_bytes",
                                                  "threshold_bytes",
                                                  "startup",
                                                  "by_op",
                                                  "by_code",
                                                  "bytes_verified",
                                                  "transfers_verified",
                                                  "callbacks",
                                                  "paths",
                                                  "teardown",
                                                  "violations",
                                                  "reproduce",
                                                  "partial",
                                                  "interrupted_by",
                                                  "record"};
  EXPECT_EQ(keys, expected_keys);
  std::vector<std::string> ops;
  uint64_t total = 0;
  for (const auto& [k, v] : j["by_op"].items()) {
    ops.push_back(k);
    total += v["count"].get<uint64_t>();
    uint64_t by_code = 0;
    for (const auto& [c, n] : v["codes"].items()) by_code += n.get<uint64_t>();
    EXPECT_EQ(by_code, v["count"].get<uint64_t>()) << k;
  }
  EXPECT_EQ(ops, (std::vector<std::string>{"alloc_pinned", "free_pinned",
                                           "alloc_device", "free_device", "h2d",
                                           "d2h", "d2d", "chain", "await"}));
  EXPECT_EQ(total, 200u);
  EXPECT_EQ(j["device"], "sim://?devices=2&hbm=256M");
  EXPECT_EQ(j["region_bytes"], 64u << 20);
  EXPECT_EQ(j["threshold_bytes"], 4u << 20);
  EXPECT_EQ(j["record"], nullptr);  // neither --record nor --replay
}

TEST_F(StressTest, SameSeedSameOperations) {
  auto counts = [](const Json& j) {
    std::vector<uint64_t> c;
    for (const auto& [k, v] : j["by_op"].items()) {
      c.push_back(v["count"].get<uint64_t>());
    }
    return c;
  };
  Json a = RunJson({"--ops", "1500", "--threads", "1", "--seed", "77"});
  Json b = RunJson({"--ops", "1500", "--threads", "1", "--seed", "77"});
  Json c = RunJson({"--ops", "1500", "--threads", "1", "--seed", "78"});
  EXPECT_EQ(counts(a), counts(b));
  EXPECT_NE(counts(a), counts(c));
}

TEST_F(StressTest, DmaFaultsAreCleanFailures) {
  Json j = RunJson({"--ops", "2000", "--threads", "4", "--seed", "5",
                    "--faults", "dma:rate=0.05,seed=3"});
  EXPECT_EQ(j["faults"], "dma:rate=0.05,seed=3");
  EXPECT_TRUE(j["violations"].empty()) << j["violations"].dump();
  EXPECT_GT(NonOk(j["by_code"]), 0u) << j["by_code"].dump();
  EXPECT_THAT(j["reproduce"].get<std::string>(),
              HasSubstr("--faults 'dma:rate=0.05,seed=3'"));
}

TEST_F(StressTest, FaultsOnEveryPoint) {
  Json j = RunJson({"--ops", "2000", "--threads", "4", "--seed", "2",
                    "--faults", kAllPoints});
  EXPECT_TRUE(j["violations"].empty()) << j["violations"].dump();
  EXPECT_TRUE(j["teardown"]["failures"].empty());
}

TEST_F(StressTest, CodeNamedByARuleIsExpected) {
  Json j = RunJson({"--ops", "1000", "--threads", "2", "--seed", "4",
                    "--faults", "dma:every=7,code=UNAVAILABLE"});
  EXPECT_TRUE(j["violations"].empty()) << j["violations"].dump();
  EXPECT_GT(j["by_code"].value("UNAVAILABLE", 0u), 0u);
}

TEST_F(StressTest, StartupFailureUnderFaultsIsExpected) {
  Json j = RunJson({"--ops", "100", "--faults", "mmap:nth=1"});
  EXPECT_EQ(j["startup"]["ok"], false);
  EXPECT_EQ(j["startup"]["code"], "RESOURCE_EXHAUSTED");
  EXPECT_THAT(j["startup"]["message"].get<std::string>(),
              HasSubstr("[injected: mmap:nth=1]"));
  EXPECT_TRUE(j["violations"].empty());
  EXPECT_EQ(j["ops"], 0);

  SubprocessResult r = RunTool({"--ops", "100", "--faults", "mmap:nth=1"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.out, HasSubstr("failed as expected"));
}

TEST_F(StressTest, HumanAndCsvOutput) {
  SubprocessResult r = RunTool({"--ops", "300", "--seed", "3"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("Operations by result"));
  EXPECT_THAT(r.out, HasSubstr("violations = 0"));
  EXPECT_THAT(r.out, HasSubstr("seed = 3"));
  // No progress bar: stderr is not a terminal.
  EXPECT_EQ(r.err, "");

  r = RunTool({"--ops", "300", "--seed", "3", "--csv"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out,
              StartsWith("section,name,code,count\nby_op,alloc_pinned,count,"));
  EXPECT_THAT(r.out, HasSubstr("\nby_code,,OK,"));
  EXPECT_THAT(r.out, HasSubstr("\nsummary,violations,,0\n"));
}

TEST_F(StressTest, SecondsMode) {
  Json j = RunJson({"--seconds", "0.3", "--threads", "2", "--seed", "8"});
  EXPECT_GT(j["ops"].get<uint64_t>(), 0u);
  EXPECT_TRUE(j["violations"].empty());
  EXPECT_THAT(j["reproduce"].get<std::string>(),
              StartsWith("tpushim stress --seed 8 --ops "));
}

TEST_F(StressTest, BadFlagsExitTwo) {
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"--ops", "0"},
                                             {"--ops", "10", "--seconds", "1"},
                                             {"--threads", "0"},
                                             {"--faults", "bogus:nth=1"},
                                             {"--faults", "dma:rate=2,seed=1"},
                                             {"--region-bytes", "12Q"},
                                             {"--json", "--csv"},
                                             {"--no-such-flag"}}) {
    SubprocessResult r = RunTool(args);
    EXPECT_EQ(r.exit_code, 2) << args[0] << "\n" << r.err;
  }
  // An invalid configuration (a region size that is not page-aligned).
  SubprocessResult r = RunTool({"--ops", "10", "--region-bytes", "1000"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
}

TEST_F(StressTest, HelpHasExamples) {
  SubprocessResult r = RunTool({"--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.out, HasSubstr("Examples:"));
  EXPECT_THAT(r.out, HasSubstr("sim://?devices=2&hbm=256M"));
  EXPECT_THAT(r.out, HasSubstr("--record FILE"));
  EXPECT_THAT(r.out, HasSubstr("tpushim stress --replay run.jsonl"));
}

}  // namespace
}  // namespace tpushim
