// The log checks the fault sweeps and hostile-environment tests rely on:
// each kind of damage they must catch is caught.

#include "tests/testing/log_check.h"

#include <unistd.h>

#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace tpushim::testutil {
namespace {

using ::testing::HasSubstr;

constexpr char kHeader[] =
    "Log file created at: 2025/01/02 03:04:05\n"
    "Running on machine: host\n"
    "Binary: Built on Jan 02 2025 03:04:05 (1735787045)\n"
    "Binary: Built at bob@builder:/src/tpushim\n"
    "Binary: Built for gcc-12.2.0 x86_64-linux-gnu\n"
    "Log line format: [IWEF]mmdd hh:mm:ss.uuuuuu threadid file:line] msg\n";

std::string Line(const std::string& message) {
  return "I0102 03:04:05.123456    4242 system.cc:160] " + message + "\n";
}

void Write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

constexpr char kInfo[] = "tpu_driver.host.user.log.INFO.20250102-030405.4242";

TEST(LogCheckTest, WholeFilesAndTheirSymlinkAreIntact) {
  TempDir dir;
  Write(dir.Join(kInfo), kHeader + Line("one") + Line("two"));
  ASSERT_EQ(symlink(kInfo, dir.Join("tpu_driver.INFO").c_str()), 0);
  // Created when nothing could be written any more: no partial line.
  Write(dir.Join("tpu_driver.host.user.log.WARNING.20250102-030405.4242"), "");
  EXPECT_EQ(LogDirectoryProblems(dir.path()), "");
  EXPECT_EQ(LogDirectoryProblems(dir.Join("missing")), "");
}

TEST(LogCheckTest, CatchesATornLastLine) {
  TempDir dir;
  Write(dir.Join(kInfo), kHeader + Line("whole") + "I0102 03:04:05.1234");
  EXPECT_THAT(LogDirectoryProblems(dir.path()),
              HasSubstr(std::string(kInfo) +
                        ": ends with a torn line \"I0102 03:04:05.1234\""));
}

TEST(LogCheckTest, CatchesAMissingHeaderAndALineOfAnotherFormat) {
  TempDir dir;
  Write(dir.Join(kInfo), Line("no header") + "continued without a prefix\n");
  const std::string problems = LogDirectoryProblems(dir.path());
  EXPECT_THAT(problems, HasSubstr("header line 1 is not"));
  Write(dir.Join(kInfo), kHeader + Line("fine") + "torn + joined\n");
  EXPECT_THAT(LogDirectoryProblems(dir.path()),
              HasSubstr("line 8 is not a whole glog line: \"torn + joined\""));
}

TEST(LogCheckTest, CatchesOpenGlogsHeaderInsteadOfLibtpus) {
  TempDir dir;
  Write(dir.Join(kInfo),
        std::string("Log file created at: 2025/01/02 03:04:05\n"
                    "Running on machine: host\n"
                    "Running duration (h:mm:ss): 0:00:00\n"
                    "Log line format: [IWEF]mmdd hh:mm:ss.uuuuuu threadid "
                    "file:line] msg\n") +
            Line("one"));
  const std::string problems = LogDirectoryProblems(dir.path());
  EXPECT_THAT(problems,
              HasSubstr("header line 3 is not \"Binary: Built on ...\""));
  EXPECT_THAT(problems,
              HasSubstr("header line 4 is not \"Binary: Built at ...\""));
}

// The INFO log of an 8 MiB region, threshold 2 MiB, two devices.
std::string StartupLog(bool with_mlock) {
  std::string log = kHeader;
  log += Line("TPU premapped buffer enabled. Size: 8388608 Threshold: 2097152");
  log += Line("Creating numa aware allocators, number of NUMA nodes 1");
  log += Line("Starting premapped memory manager initialization...");
  log += Line("Premapped buffer is using alignment 64");
  if (with_mlock) {
    log += Line(
        "mlock()-ed 8388608 bytes for premapped region, using 1 syscalls.");
  }
  log += Line(
      "Done premapping memory of size 8388608 in 0.004s (4 KiB pages, "
      "1 threads, NUMA node 0)");
  log += Line("Done allocating premapped memory of size 8388608");
  log += Line(
      "tpu::System initialized, current host id: 0, logical device "
      "ids: 0,1");
  log += Line(
      "CreateTpuSystemState: TPU initialization is successful and it "
      "took 0.012345678s");
  log += Line(
      "CreateTpuSystemState: using TPU host premapped buffer of size: "
      "8388608");
  return log;
}

constexpr StartupExpectation kLocked = {
    .region_bytes = 8 << 20, .threshold_bytes = 2 << 20, .devices = 2};

TEST(LogCheckTest, StartupLinesInOrderPass) {
  EXPECT_EQ(StartupLinesProblems(StartupLog(true), kLocked), "");
  StartupExpectation unlocked = kLocked;
  unlocked.locked = false;
  EXPECT_EQ(StartupLinesProblems(StartupLog(false), unlocked), "");
}

TEST(LogCheckTest, StartupLinesCatchAMissingOrUnexpectedMlockLine) {
  EXPECT_THAT(StartupLinesProblems(StartupLog(false), kLocked),
              HasSubstr("missing (in order): ^mlock"));
  StartupExpectation unlocked = kLocked;
  unlocked.locked = false;
  EXPECT_THAT(StartupLinesProblems(StartupLog(true), unlocked),
              HasSubstr("unexpected: mlock()-ed 8388608 bytes for premapped "
                        "region, using 1 syscalls."));
}

TEST(LogCheckTest, StartupLinesCatchTheMlockLineInItsOldWording) {
  std::string log = StartupLog(true);
  const std::string current =
      "mlock()-ed 8388608 bytes for premapped region, using 1 syscalls.";
  log.replace(log.find(current), current.size(), "mlock()-ed 8388608 bytes");
  EXPECT_THAT(StartupLinesProblems(log, kLocked),
              HasSubstr("missing (in order): ^mlock"));
}

TEST(LogCheckTest, StartupLinesCatchWrongNumbersAndOrder) {
  StartupExpectation three_devices = kLocked;
  three_devices.devices = 3;
  EXPECT_THAT(StartupLinesProblems(StartupLog(true), three_devices),
              HasSubstr("missing (in order): ^tpu::System initialized"));
  std::string six_decimals = StartupLog(true);
  six_decimals.replace(six_decimals.find("0.012345678s"), 12, "0.012345s");
  EXPECT_THAT(StartupLinesProblems(six_decimals, kLocked),
              HasSubstr("missing (in order): ^CreateTpuSystemState: TPU "
                        "initialization"));
  // The last line first: the others are found, it is not (in order).
  const std::string log = StartupLog(true);
  const std::string last = Line(
      "CreateTpuSystemState: using TPU host premapped buffer of size: "
      "8388608");
  const size_t header = std::string(kHeader).size();
  const std::string swapped =
      log.substr(0, header) + last +
      log.substr(header, log.size() - last.size() - header);
  EXPECT_THAT(StartupLinesProblems(swapped, kLocked),
              HasSubstr("missing (in order): ^CreateTpuSystemState: using"));
  // A torn start-up line is not a start-up line.
  const size_t at = log.find("tpu::System");
  const std::string torn = log.substr(0, at) + "\n" + log.substr(at);
  EXPECT_THAT(StartupLinesProblems(torn, kLocked),
              HasSubstr("missing (in order): ^tpu::System initialized"));
}

}  // namespace
}  // namespace tpushim::testutil
