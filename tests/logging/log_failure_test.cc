// Logging survives its failures: a log file that cannot be created (fault
// point log_open), a full disk, a symlink that cannot be updated and a
// queue that overflows — each with one WARNING on stderr and no crash.

#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/mutex.h"
#include "env/fault_injection.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "logging/log.h"
#include "tests/logging/log_test_util.h"

namespace tpushim::logging {
namespace {

using log_test::BodyLines;
using log_test::FilePrefix;
using log_test::LinesContaining;
using log_test::ListDirWithPrefix;
using log_test::Messages;
using log_test::OnlyLogFile;
using log_test::StderrCapture;
using log_test::TempDir;
using log_test::TestConfig;
using log_test::TestOs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

class LogFailureTest : public ::testing::Test {
 protected:
  void TearDown() override { ShutdownLogging(); }

  // An Os over os_ that fails CreateLogFile as `spec` says. It lives until
  // after TearDown has shut logging down.
  FaultInjectingOs* FaultyOs(absl::string_view spec) {
    absl::StatusOr<FaultSpec> parsed = ParseFaultSpec(spec);
    EXPECT_TRUE(parsed.ok()) << parsed.status();
    faults_ = std::make_unique<FaultInjector>(*std::move(parsed));
    faulty_os_ = std::make_unique<FaultInjectingOs>(&os_, faults_.get());
    return faulty_os_.get();
  }

  TempDir dir_;
  TestOs os_;
  std::unique_ptr<FaultInjector> faults_;
  std::unique_ptr<FaultInjectingOs> faulty_os_;
};

TEST_F(LogFailureTest, LogOpenFaultLeavesThatSeverityWithoutAFileForAWhile) {
  FaultInjectingOs* os = FaultyOs("log_open:nth=1");
  const FaultInjector& faults = *faults_;
  os_.SetMonotonicNanos(0);

  StderrCapture stderr_capture;
  ASSERT_TRUE(InitLogging(TestConfig(dir_.path()), os).ok());
  LOG(INFO) << "lost: its file cannot be created";
  LOG(WARNING) << "kept in the WARNING file";
  for (int i = 0; i < 10; ++i) LOG(INFO) << "lost: no retry yet " << i;
  ASSERT_TRUE(FlushLogs());

  // One failed creation, one for WARNING, no retry storm.
  EXPECT_EQ(faults.calls(FaultPoint::kLogOpen), 2u);
  EXPECT_EQ(faults.injected(FaultPoint::kLogOpen), 1u);
  EXPECT_THAT(ListDirWithPrefix(dir_.path(), FilePrefix(os_, Severity::kInfo)),
              IsEmpty());
  EXPECT_THAT(
      Messages(BodyLines(OnlyLogFile(dir_.path(), os_, Severity::kWarning))),
      ElementsAre("kept in the WARNING file"));
  EXPECT_EQ(FileWriteErrorCount(), 12u);
  const std::vector<std::string> warnings = stderr_capture.Lines();
  ASSERT_THAT(warnings, SizeIs(1));
  EXPECT_EQ(warnings[0][0], 'W');
  EXPECT_THAT(warnings[0],
              HasSubstr(absl::StrCat("Could not create the INFO log file in ",
                                     dir_.path(), ": PERMISSION_DENIED")));
  EXPECT_THAT(warnings[0], HasSubstr("[injected: log_open:nth=1]"));

  // A minute later the next INFO message creates the file.
  os_.SetMonotonicNanos(absl::ToInt64Nanoseconds(absl::Seconds(61)));
  LOG(INFO) << "after the retry interval";
  ASSERT_TRUE(FlushLogs());
  EXPECT_EQ(faults.calls(FaultPoint::kLogOpen), 3u);
  EXPECT_THAT(
      Messages(BodyLines(OnlyLogFile(dir_.path(), os_, Severity::kInfo))),
      ElementsAre("after the retry interval"));
  EXPECT_THAT(stderr_capture.Lines(), SizeIs(1));
  ShutdownLogging();
  EXPECT_EQ(os->open_files(), 0u);
}

TEST_F(LogFailureTest, LogOpenFaultRecoversAtNextInit) {
  FaultInjectingOs* os = FaultyOs("log_open:nth=1");
  os_.SetMonotonicNanos(0);
  StderrCapture stderr_capture;
  ASSERT_TRUE(InitLogging(TestConfig(dir_.path()), os).ok());
  LOG(INFO) << "lost";
  ASSERT_TRUE(FlushLogs());
  EXPECT_EQ(FileWriteErrorCount(), 1u);
  ASSERT_TRUE(InitLogging(TestConfig(dir_.path()), os).ok());
  LOG(INFO) << "kept";
  ASSERT_TRUE(FlushLogs());
  EXPECT_THAT(
      Messages(BodyLines(OnlyLogFile(dir_.path(), os_, Severity::kInfo))),
      ElementsAre("kept"));
  EXPECT_EQ(FileWriteErrorCount(), 0u);  // counts since the last init
}

TEST_F(LogFailureTest, DiskFullDropsLinesWithOneWarningThenResumes) {
  StderrCapture stderr_capture;
  ASSERT_TRUE(InitLogging(TestConfig(dir_.path()), &os_).ok());
  LOG(INFO) << "written before the disk fills";
  ASSERT_TRUE(FlushLogs());
  os_.SetDiskFull(true);
  for (int i = 0; i < 5; ++i) LOG(INFO) << "lost " << i;
  ASSERT_TRUE(FlushLogs());
  EXPECT_EQ(FileWriteErrorCount(), 5u);
  std::vector<std::string> warnings = stderr_capture.Lines();
  ASSERT_THAT(warnings, SizeIs(1));
  EXPECT_EQ(warnings[0][0], 'W');
  EXPECT_THAT(warnings[0], HasSubstr("Could not write to log file "));
  EXPECT_THAT(warnings[0], HasSubstr("RESOURCE_EXHAUSTED"));

  os_.SetDiskFull(false);
  LOG(INFO) << "written after space is freed";
  ASSERT_TRUE(FlushLogs());
  // Whole glog lines only: the halves the full disk took were cut off
  // again, so none is left torn or joined to the next one.
  EXPECT_THAT(
      Messages(BodyLines(OnlyLogFile(dir_.path(), os_, Severity::kInfo))),
      ElementsAre("written before the disk fills",
                  "written after space is freed"));

  // A new run of failures gets its own single warning.
  os_.SetDiskFull(true);
  LOG(INFO) << "lost again";
  LOG(INFO) << "lost again too";
  ASSERT_TRUE(FlushLogs());
  EXPECT_THAT(
      LinesContaining(stderr_capture.Lines(), "Could not write to log file"),
      SizeIs(2));
  EXPECT_EQ(FileWriteErrorCount(), 7u);
  os_.SetDiskFull(false);
}

TEST_F(LogFailureTest, DiskFullFromTheStartStillGivesOneWarning) {
  os_.SetDiskFull(true);
  StderrCapture stderr_capture;
  ASSERT_TRUE(InitLogging(TestConfig(dir_.path()), &os_).ok());
  for (int i = 0; i < 20; ++i) LOG(ERROR) << "lost " << i;
  ASSERT_TRUE(FlushLogs());
  // One per file (INFO, WARNING, ERROR), whatever the number of lines.
  EXPECT_THAT(
      LinesContaining(stderr_capture.Lines(), "Could not write to log file"),
      SizeIs(3));
  EXPECT_EQ(FileWriteErrorCount(), 60u);
  os_.SetDiskFull(false);
}

TEST_F(LogFailureTest, SymlinkFailureIsOneWarningAndLoggingGoesOn) {
  os_.FailSymlinks(absl::PermissionDeniedError("symlink: denied"));
  StderrCapture stderr_capture;
  LogConfig config = TestConfig(dir_.path());
  config.max_file_bytes = 4096;
  config.keep = 1000;
  ASSERT_TRUE(InitLogging(config, &os_).ok());
  for (int i = 0; i < 100; ++i)
    LOG(INFO) << "line " << i << std::string(100, 'x');
  ASSERT_TRUE(FlushLogs());
  EXPECT_GT(
      ListDirWithPrefix(dir_.path(), FilePrefix(os_, Severity::kInfo)).size(),
      1u);
  EXPECT_FALSE(std::filesystem::exists(dir_.Join("tpu_driver.INFO")));
  const std::vector<std::string> warnings = stderr_capture.Lines();
  ASSERT_THAT(warnings, SizeIs(1));
  EXPECT_THAT(warnings[0], HasSubstr("Could not point symlink "));
  EXPECT_EQ(FileWriteErrorCount(), 0u);
}

TEST_F(LogFailureTest, FullQueueDropsOldestMessagesCountsAndReportsThem) {
  constexpr size_t kQueueSize = 8;
  constexpr int kExtra = 10;
  Notification writer_blocked;
  Notification release_writer;
  os_.BlockFirstFileWrite(&writer_blocked, &release_writer);
  LogConfig config = TestConfig(dir_.path());
  config.queue_size = kQueueSize;
  ASSERT_TRUE(InitLogging(config, &os_).ok());

  // The writer takes message 0 and blocks writing the INFO file's header;
  // the queue then holds kQueueSize messages and the rest overrun it.
  LOG(INFO) << "message 0";
  writer_blocked.WaitForNotification();
  for (int i = 1; i <= static_cast<int>(kQueueSize) + kExtra; ++i) {
    LOG(INFO) << "message " << i;
  }
  EXPECT_EQ(DroppedMessageCount(), static_cast<uint64_t>(kExtra));
  release_writer.Notify();
  ASSERT_TRUE(FlushLogs());

  std::vector<std::string> expected = {"message 0"};
  for (int i = kExtra + 1; i <= static_cast<int>(kQueueSize) + kExtra; ++i) {
    expected.push_back(absl::StrCat("message ", i));
  }
  expected.push_back(absl::StrCat("Dropped ", kExtra,
                                  " log messages because the log queue (",
                                  kQueueSize, " messages) was full"));
  EXPECT_THAT(
      Messages(BodyLines(OnlyLogFile(dir_.path(), os_, Severity::kInfo))),
      ::testing::ElementsAreArray(expected));
  // The report is a WARNING, so it is in the WARNING file too.
  EXPECT_THAT(
      Messages(BodyLines(OnlyLogFile(dir_.path(), os_, Severity::kWarning))),
      ElementsAre(HasSubstr("Dropped 10 log messages")));
  EXPECT_EQ(DroppedMessageCount(), static_cast<uint64_t>(kExtra));
}

}  // namespace
}  // namespace tpushim::logging
