// End-to-end tests of `tpushim demo`: the built tool runs as a subprocess
// with an exact environment (a 16 MiB region, two small simulated devices,
// logs in a temporary directory), and its exit status, summary, JSON and
// log file are checked.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/trace_check.h"

namespace tpushim {
namespace {

using ::testing::AllOf;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using testutil::ReadFileOrEmpty;
using testutil::RunSubprocess;
using testutil::SubprocessResult;
using testutil::TempDir;

using Json = nlohmann::json;

constexpr char kSmallRegion[] = "TPU_PREMAPPED_BUFFER_SIZE=16777216";
constexpr char kTwoDevices[] = "TPUSHIM_DEVICE=sim://?devices=2&hbm=64M";

// A small, quick run: 6 steps of 256 KiB, 1 ms per step.
const std::vector<std::string> kSmallRun = {
    "demo", "--steps", "6", "--batch-bytes", "256K", "--step-ms", "1"};

class DemoTest : public ::testing::Test {
 protected:
  // Runs `tpushim <args>` with the small configuration plus `extra_env`.
  SubprocessResult RunTool(const std::vector<std::string>& args,
                           std::vector<std::string> env = {}) {
    env.push_back(absl::StrCat("TPU_LOG_DIR=", log_dir_.path()));
    absl::StatusOr<SubprocessResult> result =
        RunSubprocess(TPUSHIM_TOOL_PATH, args, env, absl::Seconds(60));
    EXPECT_TRUE(result.ok()) << result.status();
    if (!result.ok()) return SubprocessResult{};
    EXPECT_EQ(result->term_signal, 0) << result->err;
    return *result;
  }
  SubprocessResult RunSmall(std::vector<std::string> args,
                            std::vector<std::string> extra_env = {}) {
    extra_env.push_back(kSmallRegion);
    extra_env.push_back(kTwoDevices);
    return RunTool(args, extra_env);
  }

  std::string InfoLog() const {
    return ReadFileOrEmpty(log_dir_.Join("tpu_driver.INFO"));
  }

  TempDir log_dir_;
};

Json ParseJson(const std::string& text) {
  Json json = Json::parse(text, /*cb=*/nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(json.is_discarded()) << "not one JSON value:\n" << text;
  return json;
}

std::vector<std::string> WithJson(std::vector<std::string> args) {
  args.push_back("--json");
  return args;
}

// The start-up lines, in libtpu's wording, that a 2-device system with a
// region logs, in order.
const std::vector<std::string> kStartupLines = {
    "TPU premapped buffer enabled. Size: 16777216 Threshold: 16777216",
    "Starting premapped memory manager initialization...",
    "Done allocating premapped memory of size 16777216",
    "tpu::System initialized, current host id: 0, logical device ids: 0,1",
    "CreateTpuSystemState: TPU initialization is successful and it took",
    "CreateTpuSystemState: using TPU host premapped buffer of size: 16777216",
};

// Checks that each of `lines` occurs in `log`, each after the previous.
void ExpectInOrder(const std::string& log,
                   const std::vector<std::string>& lines) {
  size_t from = 0;
  for (const std::string& line : lines) {
    const size_t at = log.find(line, from);
    ASSERT_NE(at, std::string::npos)
        << "\"" << line << "\" missing (or out of order) in:\n"
        << log;
    from = at + line.size();
  }
}

TEST_F(DemoTest, StepsZeroBringsTheSystemUpAndDown) {
  SubprocessResult r = RunSmall({"demo", "--steps", "0"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, IsEmpty());
  EXPECT_THAT(
      r.out,
      AllOf(HasSubstr("init time"),
            HasSubstr("premapped region    16777216 (16.00M)"),
            HasSubstr("2 (sim://?devices=2&hbm=64M)"),
            HasSubstr(absl::StrCat("Logs: ", log_dir_.Join("tpu_driver.INFO"))),
            HasSubstr("input-bound: n/a (no steps ran)"),
            EndsWith("errors = 0\n")));
  ExpectInOrder(InfoLog(), kStartupLines);
}

TEST_F(DemoTest, SmallRunVerifiesEveryByteAndEndsWithZeroErrors) {
  SubprocessResult r = RunSmall(kSmallRun);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(
      r.out,
      AllOf(HasSubstr("Transfers"), HasSubstr("zero_copy"), HasSubstr("staged"),
            HasSubstr("staging waits"), HasSubstr("pinned-host fallbacks"),
            HasSubstr("\ninput-bound: "), EndsWith("errors = 0\n")));
  const std::string log = InfoLog();
  ExpectInOrder(log, kStartupLines);
  EXPECT_THAT(log, HasSubstr("tpushim demo: done: 0 errors"));
}

// TPUSHIM_PREMAP=background: creation returns before the region is
// premapped; the run goes on meanwhile; the region is ready later (or the
// run ends first, and the JSON says null).
TEST_F(DemoTest, BackgroundPremappingIsTimedApartFromCreation) {
  SubprocessResult r =
      RunSmall(WithJson({"demo", "--steps", "4", "--batch-bytes", "256K",
                         "--step-ms", "50"}),
               {"TPUSHIM_PREMAP=background"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  const Json j = ParseJson(r.out);
  ASSERT_TRUE(j.is_object()) << r.out;
  const double created = j["create_seconds"].get<double>();
  EXPECT_GT(created, 0.0);
  // 16 MiB premap in well under the 200 ms of modelled steps.
  ASSERT_TRUE(j["region_ready_seconds"].is_number()) << j;
  EXPECT_GE(j["region_ready_seconds"].get<double>(), created);
  EXPECT_TRUE(j["pinned_transfers"]["not_premapped"].is_number());
  EXPECT_EQ(j["errors"], 0) << j;

  SubprocessResult text =
      RunSmall({"demo", "--steps", "2", "--batch-bytes", "256K"},
               {"TPUSHIM_PREMAP=background"});
  EXPECT_EQ(text.exit_code, 0) << text.out << text.err;
  EXPECT_THAT(text.out, HasSubstr("region ready"));
  EXPECT_THAT(text.out, HasSubstr(" not premapped yet"));

  // Pre-faulting fails behind the run (every madvise fails: the fork
  // advice on the devices' memory and the region is tolerated, the first
  // pre-fault chunk is not): the region never becomes whole, the JSON says
  // null, every byte still arrives (pinned).
  SubprocessResult failed =
      RunSmall(WithJson({"demo", "--steps", "2", "--batch-bytes", "256K"}),
               {"TPUSHIM_PREMAP=background", "TPUSHIM_HUGEPAGES=off",
                "TPUSHIM_FAULTS=madvise:every=1"});
  EXPECT_EQ(failed.exit_code, 0) << failed.out << failed.err;
  const Json f = ParseJson(failed.out);
  ASSERT_TRUE(f.is_object()) << failed.out;
  EXPECT_TRUE(f["region_ready_seconds"].is_null()) << f;
  EXPECT_GT(f["pinned_transfers"]["not_premapped"].get<uint64_t>(), 0u) << f;
  EXPECT_EQ(f["errors"], 0) << f;
  SubprocessResult failed_text =
      RunSmall({"demo", "--steps", "2", "--batch-bytes", "256K"},
               {"TPUSHIM_PREMAP=background", "TPUSHIM_HUGEPAGES=off",
                "TPUSHIM_FAULTS=madvise:every=1"});
  EXPECT_THAT(failed_text.out,
              HasSubstr("never: premapping stopped at 0B of 16.00M ("));
}

TEST_F(DemoTest, JsonHasTheSummaryFields) {
  SubprocessResult r = RunSmall(WithJson(kSmallRun));
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  const Json j = ParseJson(r.out);
  ASSERT_TRUE(j.is_object()) << r.out;
  EXPECT_GT(j["init_seconds"].get<double>(), 0.0);
  // Premapped in the foreground: ready when creation returned.
  EXPECT_EQ(j["create_seconds"], j["init_seconds"]);
  EXPECT_GE(j["region_ready_seconds"].get<double>(),
            j["create_seconds"].get<double>());
  EXPECT_EQ(j["pinned_transfers"]["not_premapped"], 0u);
  EXPECT_EQ(j["premapped_bytes"], 16777216u);
  EXPECT_EQ(j["threshold_bytes"], 16777216u);
  EXPECT_EQ(j["device"], "sim://?devices=2&hbm=64M");
  EXPECT_EQ(j["devices"], 2);
  EXPECT_EQ(j["steps"], 6);
  EXPECT_EQ(j["batch_bytes"], 262144u);
  EXPECT_EQ(j["shard_bytes"], 131072u);
  EXPECT_TRUE(j["input_bound"].is_boolean()) << j;
  EXPECT_TRUE(j["input_wait_share"].is_number()) << j;
  EXPECT_THAT(j["input_bound_reason"].get<std::string>(),
              HasSubstr(j["input_bound"].get<bool>() ? "input-bound: yes"
                                                     : "input-bound: no"));
  EXPECT_EQ(j["errors"], 0u) << j["error_detail"];
  EXPECT_EQ(j["error_detail"]["hash_mismatches"], 0u);
  EXPECT_TRUE(j["error_detail"]["first_error"].is_null());

  // Batches alternate between pageable memory and pinned host buffers:
  // staged and zero-copy transfers both ways, every byte of every step.
  EXPECT_EQ(j["batches"]["pageable"], 3u);
  EXPECT_EQ(j["batches"]["pinned"], 3u);
  EXPECT_EQ(j["pinned_host_fallbacks"]["total"], 0u);
  const Json& t = j["transfers"];
  for (const char* dir : {"h2d", "d2h"}) {
    EXPECT_EQ(t[dir]["zero_copy"]["bytes"], 3u * 262144u) << dir;
    EXPECT_EQ(t[dir]["staged"]["bytes"], 3u * 262144u) << dir;
    EXPECT_EQ(t[dir]["pinned"]["transfers"], 0u) << dir;
    EXPECT_GT(t[dir]["zero_copy"]["gbps"].get<double>(), 0.0) << dir;
    EXPECT_EQ(t[dir]["staged"]["failed"], 0u) << dir;
  }
  EXPECT_TRUE(t["h2d"]["pinned"]["gbps"].is_null());
  EXPECT_EQ(t["d2d"]["bytes"], 6u * 262144u);
  EXPECT_EQ(j["bytes_moved"]["h2d"], 6u * 262144u);
  EXPECT_EQ(j["bytes_moved"]["d2h"], 6u * 262144u);
  EXPECT_TRUE(j["staging"]["waits"].is_number_unsigned());
  EXPECT_GT(j["staging"]["peak_bytes"].get<uint64_t>(), 0u);
  EXPECT_GT(j["input"]["compute_seconds"].get<double>(), 0.0);
  EXPECT_EQ(j["logs"]["info_file"], log_dir_.Join("tpu_driver.INFO"));
}

// What backs the region is said as the kernel reports it (never the plan,
// "thp pages"); a region left unlocked says why and what to do.
TEST_F(DemoTest, RegionPagesAndWhyItIsNotLocked) {
  SubprocessResult r =
      RunTool({"demo", "--steps", "0"},
              {kSmallRegion, "TPUSHIM_MLOCK=off", "TPUSHIM_HUGEPAGES=off"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(
      r.out,
      AllOf(HasSubstr("4 KiB pages, not mlocked"), Not(HasSubstr("thp pages")),
            HasSubstr("The region is not mlocked: "
                      "TPUSHIM_MLOCK=off asks not to lock it.")));
  r = RunTool({"demo", "--steps", "0", "--json"},
              {kSmallRegion, "TPUSHIM_MLOCK=off"});
  const Json j = ParseJson(r.out);
  EXPECT_EQ(j["region"]["locked"], false);
  EXPECT_EQ(j["region"]["not_locked_reason"],
            "TPUSHIM_MLOCK=off asks not to lock it.");
}

// With TPUSHIM_PREMAP=background the region is locked on fault from
// creation on (tests run as root, with CAP_IPC_LOCK): the summary says
// "mlocked" even when it is read before premapping has finished (no steps,
// a region of 4 KiB pages populated by one thread).
TEST_F(DemoTest, BackgroundRegionIsMlockedBeforeItIsPremapped) {
  const std::vector<std::string> env = {
      "TPU_PREMAPPED_BUFFER_SIZE=134217728", kTwoDevices,
      "TPUSHIM_PREMAP=background", "TPUSHIM_HUGEPAGES=off",
      "TPUSHIM_PREFAULT_THREADS=1"};
  SubprocessResult r = RunTool({"demo", "--steps", "0"}, env);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, AllOf(HasSubstr(", mlocked, NUMA node"),
                           Not(HasSubstr("not mlocked"))));
  r = RunTool({"demo", "--steps", "0", "--json"}, env);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const Json j = ParseJson(r.out);
  EXPECT_EQ(j["region"]["locked"], true);
  EXPECT_TRUE(j["region"]["not_locked_reason"].is_null());
}

// A failed mlock() is reported with the failing call's status, not guessed
// from the memlock limit: as root (CAP_IPC_LOCK held) an injected mlock
// failure does not advise getting CAP_IPC_LOCK.
TEST_F(DemoTest, WhyNotLockedNamesTheFailedCall) {
  SubprocessResult r = RunSmall(WithJson({"demo", "--steps", "0"}),
                                {"TPUSHIM_FAULTS=mlock:nth=1"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const Json j = ParseJson(r.out);
  EXPECT_EQ(j["region"]["locked"], false);
  ASSERT_TRUE(j["region"]["not_locked_reason"].is_string()) << r.out;
  EXPECT_THAT(
      j["region"]["not_locked_reason"].get<std::string>(),
      AllOf(HasSubstr("mlock() of the premapped region failed: "),
            HasSubstr("[injected: mlock:nth=1]"),
            Not(HasSubstr("CAP_IPC_LOCK")), Not(HasSubstr("RLIMIT_MEMLOCK"))));
  r = RunSmall({"demo", "--steps", "0"}, {"TPUSHIM_FAULTS=mlock:nth=1"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("The region is not mlocked: RESOURCE_EXHAUSTED: "
                               "mlock() of the premapped region failed: "));
}

// With TPU_MIN_LOG_LEVEL=3 no INFO file is written: the summary does not
// name one.
TEST_F(DemoTest, LogsLineNamesOnlyAFileThatIsWritten) {
  SubprocessResult r =
      RunTool({"demo", "--steps", "0"}, {kSmallRegion, "TPU_MIN_LOG_LEVEL=3"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(
      r.out, HasSubstr(absl::StrCat("Logs: ", log_dir_.path(),
                                    " (TPU_MIN_LOG_LEVEL=3: only FATAL lines, ",
                                    log_dir_.Join("tpu_driver.FATAL"),
                                    " once there is one)")));
  EXPECT_THAT(r.out, Not(HasSubstr("tpu_driver.INFO")));
}

// The trace of a real demo run opens in Chrome DevTools and Perfetto with
// every DMA flow drawn and every track a proper stack of slices.
TEST_F(DemoTest, TraceOfADemoRunShowsEveryFlowInBothViewers) {
  const std::string trace = log_dir_.Join("demo_trace.json");
  SubprocessResult r = RunSmall(kSmallRun, {"TPUSHIM_TRACE_FILE=" + trace});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Json root = Json::parse(ReadFileOrEmpty(trace), nullptr, false);
  ASSERT_FALSE(root.is_discarded()) << "the trace is not JSON";
  const testutil::TraceViewCheck c = testutil::CheckTraceView(root);
  // 6 steps × (h2d + d2d + d2h) on 2 devices: dozens of descriptors.
  EXPECT_GT(c.flows, 30u);
  EXPECT_EQ(c.flows_drawn_devtools, c.flows);
  EXPECT_EQ(c.flows_drawn_perfetto, c.flows);
  EXPECT_THAT(c.problems, IsEmpty());
}

TEST_F(DemoTest, DefaultDeviceIsFourSimulatedDevices) {
  SubprocessResult r =
      RunTool({"demo", "--steps", "0", "--json"}, {kSmallRegion});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const Json j = ParseJson(r.out);
  EXPECT_EQ(j["device"], "sim://?devices=4");
  EXPECT_EQ(j["devices"], 4);
  EXPECT_THAT(InfoLog(), HasSubstr("logical device ids: 0,1,2,3\n"));
}

TEST_F(DemoTest, DevicesFlagWithoutTpushimDevice) {
  SubprocessResult r = RunTool(
      {"demo", "--steps", "0", "--devices", "3", "--json"}, {kSmallRegion});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(ParseJson(r.out)["device"], "sim://?devices=3");
  EXPECT_THAT(InfoLog(), HasSubstr("logical device ids: 0,1,2\n"));
}

TEST_F(DemoTest, DevicesFlagSetsOnlyTheDeviceCountOfTpushimDevice) {
  SubprocessResult r =
      RunSmall({"demo", "--steps", "2", "--devices", "3", "--batch-bytes",
                "96K", "--step-ms", "0", "--json"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const Json j = ParseJson(r.out);
  EXPECT_EQ(j["device"], "sim://?devices=3&hbm=64M");
  EXPECT_EQ(j["devices"], 3);
  EXPECT_EQ(j["shard_bytes"], 32768u);
  EXPECT_EQ(j["errors"], 0u) << j["error_detail"];
}

TEST_F(DemoTest, RegionOffFallsBackToPageableBatches) {
  SubprocessResult r = RunTool(WithJson(kSmallRun),
                               {"TPU_PREMAPPED_BUFFER_SIZE=0", kTwoDevices});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  const Json j = ParseJson(r.out);
  EXPECT_EQ(j["errors"], 0u) << j["error_detail"];
  EXPECT_EQ(j["batches"]["pinned"], 0u);
  EXPECT_EQ(j["pinned_host_fallbacks"]["region_off"], 3u);
  EXPECT_EQ(j["transfers"]["h2d"]["zero_copy"]["transfers"], 0u);
  // The 256 KiB shards go through the runtime's bounce pool, not pinned.
  EXPECT_EQ(j["transfers"]["h2d"]["staged"]["bytes"], 6u * 262144u);
  EXPECT_EQ(j["transfers"]["h2d"]["pinned"]["bytes"], 0u);
}

TEST_F(DemoTest, InjectedDmaFailureIsCountedAndFailsTheRun) {
  SubprocessResult r =
      RunSmall(WithJson(kSmallRun), {"TPUSHIM_FAULTS=dma:nth=3"});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  const Json j = ParseJson(r.out);
  ASSERT_TRUE(j.is_object()) << r.out;
  EXPECT_GT(j["errors"].get<uint64_t>(), 0u) << j;
  EXPECT_GT(j["error_detail"]["failed_transfers"].get<uint64_t>(), 0u);
  EXPECT_THAT(j["error_detail"]["first_error"].get<std::string>(),
              HasSubstr("injected: dma:nth=3"));
}

TEST_F(DemoTest, InjectedDmaFailureInHumanOutput) {
  SubprocessResult r = RunSmall(kSmallRun, {"TPUSHIM_FAULTS=dma:every=5"});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_THAT(r.out, AllOf(HasSubstr("failed transfers"),
                           Not(EndsWith("errors = 0\n"))));
  EXPECT_THAT(r.err, HasSubstr("injected: dma:every=5"));
}

TEST_F(DemoTest, DeviceMemoryTooSmallIsAFailedAllocation) {
  // Four 512 KiB buffers per device do not fit in 1 MiB of HBM.
  SubprocessResult r =
      RunTool({"demo", "--steps", "4", "--batch-bytes", "1M", "--json"},
              {kSmallRegion, "TPUSHIM_DEVICE=sim://?devices=2&hbm=1M"});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  const Json j = ParseJson(r.out);
  EXPECT_EQ(j["error_detail"]["failed_allocations"], 1u) << j;
  EXPECT_EQ(j["errors"], 1u);
  EXPECT_THAT(j["error_detail"]["first_error"].get<std::string>(),
              HasSubstr("Error allocating device buffer"));
}

TEST_F(DemoTest, InvalidFlagsExitTwoWithAMessage) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"demo", "--steps", "-1"}, "--steps"},
      {{"demo", "--steps", "many"}, "--steps"},
      {{"demo", "--batch-bytes", "12X"}, "--batch-bytes"},
      {{"demo", "--batch-bytes", "2G"}, "--batch-bytes"},
      {{"demo", "--devices", "0"}, "--devices"},
      {{"demo", "--step-ms", "-5"}, "--step-ms"},
      {{"demo", "--no-such-flag"}, "--no-such-flag"},
      // 100 bytes over 2 devices: shards below 64 bytes.
      {{"demo", "--batch-bytes", "100"}, "--batch-bytes=100"},
  };
  for (const Case& c : cases) {
    SubprocessResult r = RunSmall(c.args);
    EXPECT_EQ(r.exit_code, 2) << absl::StrJoin(c.args, " ") << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr(c.message)) << absl::StrJoin(c.args, " ");
    EXPECT_THAT(r.out, IsEmpty()) << absl::StrJoin(c.args, " ");
  }
}

TEST_F(DemoTest, InvalidConfigurationExitsTwo) {
  SubprocessResult r =
      RunTool({"demo", "--steps", "0"},
              {kSmallRegion, "TPUSHIM_DEVICE=sim://?devices=0"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, AllOf(HasSubstr("tpushim: invalid configuration: "),
                           HasSubstr("TPUSHIM_DEVICE")));
  EXPECT_THAT(r.out, IsEmpty());

  r = RunTool({"demo", "--steps", "0", "--json"},
              {"TPU_PREMAPPED_BUFFER_SIZE=5000"});
  EXPECT_EQ(r.exit_code, 2);
  const Json j = ParseJson(r.out);
  EXPECT_EQ(j["error"]["code"], "INVALID_ARGUMENT");
}

// A runtime that cannot start is exit 1, and its status prints as it prints
// itself, code first: scripts grep for RESOURCE_EXHAUSTED.
TEST_F(DemoTest, StartupFailureNamesTheStatusCode) {
  SubprocessResult r = RunTool({"demo", "--steps", "0"},
                               {"TPU_PREMAPPED_BUFFER_SIZE=1099511627776"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("tpushim: cannot start the runtime: "
                               "RESOURCE_EXHAUSTED: "));
}

TEST_F(DemoTest, HelpListsTheOptionsAndExamples) {
  SubprocessResult r = RunTool({"demo", "--help"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, AllOf(HasSubstr("--steps"), HasSubstr("--batch-bytes"),
                           HasSubstr("--devices"), HasSubstr("--step-ms"),
                           HasSubstr("--producers"), HasSubstr("--json"),
                           HasSubstr("input-bound"), HasSubstr("Examples"),
                           HasSubstr("tpushim demo --json | jq"),
                           HasSubstr("Exit status: 0")));

  r = RunTool({"--help"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("demo"));
}

}  // namespace
}  // namespace tpushim
