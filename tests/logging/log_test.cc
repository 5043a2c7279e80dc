// End-to-end tests of libtpu-compatible logging: line format, file names,
// headers, symlinks, routing, levels, rotation, retention, flushing, FATAL
// and concurrency.

#include "logging/log.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/civil_time.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "logging/log_files.h"
#include "tests/logging/log_test_util.h"

namespace tpushim::logging {
namespace {

using log_test::BodyLines;
using log_test::CurrentTid;
using log_test::FilePrefix;
using log_test::ListDir;
using log_test::ListDirWithPrefix;
using log_test::Messages;
using log_test::OnlyLogFile;
using log_test::ReadFile;
using log_test::ReadLink;
using log_test::SplitLines;
using log_test::StderrCapture;
using log_test::TempDir;
using log_test::TestConfig;
using log_test::TestOs;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

class LogTest : public ::testing::Test {
 protected:
  void TearDown() override {
    ShutdownLogging();
    std::error_code ignored;
    std::filesystem::remove_all(os_.fallback_dir(), ignored);
  }

  void Init(const LogConfig& config) {
    const absl::Status status = InitLogging(config, &os_);
    ASSERT_TRUE(status.ok()) << status;
  }

  std::string LogFile(Severity severity) {
    return OnlyLogFile(dir_.path(), os_, severity);
  }

  TempDir dir_;
  TestOs os_;
};

// Files of one severity, oldest first, by the timestamp in their name and
// then the collision suffix.
std::vector<std::string> FilesOldestFirst(const std::string& dir,
                                          const std::string& prefix) {
  std::vector<std::string> names = ListDirWithPrefix(dir, prefix);
  auto key = [&](const std::string& name) {
    std::optional<internal::LogFileNameParts> parts =
        internal::ParseLogFileName(name, prefix);
    EXPECT_TRUE(parts.has_value()) << name;
    return parts.has_value() ? std::make_tuple(parts->timestamp, parts->suffix)
                             : std::make_tuple(std::string(), uint64_t{0});
  };
  std::sort(names.begin(), names.end(),
            [&](const std::string& a, const std::string& b) {
              return key(a) < key(b);
            });
  return names;
}

// The local time a line's prefix names, taking the year from `year_of`.
absl::Time LineTime(const std::string& line, absl::Time year_of) {
  int month = 0, day = 0, hour = 0, minute = 0, second = 0, micros = 0;
  EXPECT_EQ(std::sscanf(line.c_str() + 1, "%2d%2d %2d:%2d:%2d.%6d", &month,
                        &day, &hour, &minute, &second, &micros),
            6)
      << line;
  const absl::TimeZone local = absl::LocalTimeZone();
  const absl::CivilSecond civil(absl::ToCivilYear(year_of, local).year(), month,
                                day, hour, minute, second);
  return absl::FromCivil(civil, local) + absl::Microseconds(micros);
}

TEST_F(LogTest, LinePrefixIsGlogFormatWithLocalTimeAndLoggingThreadId) {
  Init(TestConfig(dir_.path()));
  const absl::Time before = absl::Now();
  const int main_line = __LINE__ + 1;
  LOG(INFO) << "from the main thread";
  pid_t worker_tid = 0;
  int worker_line = 0;
  std::thread worker([&] {
    worker_tid = CurrentTid();
    worker_line = __LINE__ + 1;
    LOG(WARNING) << "from a worker thread";
  });
  worker.join();
  ASSERT_TRUE(FlushLogs());
  const absl::Time after = absl::Now();

  const std::vector<std::string> lines = BodyLines(LogFile(Severity::kInfo));
  ASSERT_THAT(lines, SizeIs(2));
  const log_test::Regex prefix(log_test::kPrefixPattern);
  const log_test::Regex whole(log_test::kLinePattern);
  struct Expected {
    std::string letter;
    pid_t tid;
    int line;
    std::string message;
  };
  const Expected expected[] = {
      {"I", CurrentTid(), main_line, "from the main thread"},
      {"W", worker_tid, worker_line, "from a worker thread"},
  };
  for (size_t i = 0; i < lines.size(); ++i) {
    SCOPED_TRACE(lines[i]);
    EXPECT_TRUE(prefix.Search(lines[i]));
    std::vector<std::string> match;
    ASSERT_TRUE(whole.Search(lines[i], &match));
    EXPECT_EQ(match[1], expected[i].letter);
    EXPECT_EQ(match[2], absl::StrFormat("%7d", expected[i].tid));
    EXPECT_EQ(match[3], "log_test.cc");
    EXPECT_EQ(match[4], absl::StrCat(expected[i].line));
    EXPECT_EQ(match[5], expected[i].message);
    const absl::Time stamped = LineTime(lines[i], before);
    EXPECT_GE(stamped, absl::FromUnixMicros(absl::ToUnixMicros(before)));
    EXPECT_LE(stamped, after);
  }
  EXPECT_NE(worker_tid, CurrentTid());
}

TEST_F(LogTest, FileNamesAndHeadersFollowLibtpu) {
  const absl::TimeZone local = absl::LocalTimeZone();
  const absl::Time start =
      absl::FromCivil(absl::CivilSecond(2024, 11, 21, 22, 12, 46), local);
  os_.SetNow(start);
  LogConfig config = TestConfig(dir_.path());
  config.build = {.built = absl::FromUnixSeconds(1687430275),
                  .user = "builder",
                  .host = "buildhost",
                  .path = "/src/tpushim",
                  .target = "gcc-12.2.0 x86_64-linux-gnu"};
  Init(config);
  // The files are created by the first message, 1:02:03 later.
  os_.SetNow(start + absl::Hours(1) + absl::Minutes(2) + absl::Seconds(3));
  LOG(ERROR) << "goes to every file";
  ASSERT_TRUE(FlushLogs());

  for (Severity severity :
       {Severity::kInfo, Severity::kWarning, Severity::kError}) {
    SCOPED_TRACE(SeverityName(severity));
    const std::string name =
        absl::StrCat("tpu_driver.testhost.", os_.user(), ".log.",
                     SeverityName(severity), ".20241121-231449.4242");
    ASSERT_TRUE(std::filesystem::exists(dir_.Join(name)));
    const std::vector<std::string> lines =
        SplitLines(ReadFile(dir_.Join(name)));
    ASSERT_THAT(lines, SizeIs(7));
    EXPECT_EQ(lines[0], "Log file created at: 2024/11/21 23:14:49");
    EXPECT_EQ(lines[1], "Running on machine: testhost");
    EXPECT_EQ(lines[2], "Binary: Built on Jun 22 2023 10:37:55 (1687430275)");
    EXPECT_EQ(lines[3], "Binary: Built at builder@buildhost:/src/tpushim");
    EXPECT_EQ(lines[4], "Binary: Built for gcc-12.2.0 x86_64-linux-gnu");
    EXPECT_EQ(lines[5],
              "Log line format: [IWEF]mmdd hh:mm:ss.uuuuuu threadid "
              "file:line] msg");
    EXPECT_THAT(lines[6], HasSubstr("] goes to every file"));
  }
  EXPECT_THAT(ListDirWithPrefix(dir_.path(), "tpu_driver.testhost"), SizeIs(3));
}

TEST_F(LogTest, HeaderDescribesThisBuildByDefault) {
  Init(TestConfig(dir_.path()));
  LOG(INFO) << "one line";
  ASSERT_TRUE(FlushLogs());
  const BuildFacts build = ThisBuild();
  const std::vector<std::string> lines =
      SplitLines(ReadFile(LogFile(Severity::kInfo)));
  ASSERT_THAT(lines, SizeIs(7));
  EXPECT_EQ(lines[2],
            absl::StrCat("Binary: Built on ",
                         absl::FormatTime("%b %d %Y %H:%M:%S", build.built,
                                          absl::UTCTimeZone()),
                         " (", absl::ToUnixSeconds(build.built), ")"));
  EXPECT_EQ(lines[3], absl::StrCat("Binary: Built at ", build.user, "@",
                                   build.host, ":", build.path));
  EXPECT_EQ(lines[4], absl::StrCat("Binary: Built for ", build.target));
}

TEST_F(LogTest, FilesAreCreatedOnlyWhenNeeded) {
  Init(TestConfig(dir_.path()));
  LOG(INFO) << "info only";
  ASSERT_TRUE(FlushLogs());
  EXPECT_THAT(ListDirWithPrefix(dir_.path(), "tpu_driver.testhost"), SizeIs(1));
  struct stat st;
  ASSERT_EQ(lstat(LogFile(Severity::kInfo).c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
}

TEST_F(LogTest, SymlinkOfEachSeverityPointsAtItsFile) {
  Init(TestConfig(dir_.path()));
  LOG(ERROR) << "everywhere";
  ASSERT_TRUE(FlushLogs());
  for (Severity severity :
       {Severity::kInfo, Severity::kWarning, Severity::kError}) {
    SCOPED_TRACE(SeverityName(severity));
    const std::optional<std::string> target = ReadLink(
        dir_.Join(absl::StrCat("tpu_driver.", SeverityName(severity))));
    ASSERT_TRUE(target.has_value());
    // Relative: the base name of the file, in the same directory.
    EXPECT_EQ(dir_.Join(*target), LogFile(severity));
  }
  EXPECT_FALSE(std::filesystem::exists(dir_.Join("tpu_driver.FATAL")));
  // No temporary symlink is left behind.
  for (const std::string& name : ListDir(dir_.path())) {
    EXPECT_FALSE(name.starts_with(".")) << name;
  }
}

TEST_F(LogTest, RoutesEachSeverityToItsFileAndThoseBelow) {
  Init(TestConfig(dir_.path()));
  LOG(INFO) << "info message";
  LOG(WARNING) << "warning message";
  LOG(ERROR) << "error message";
  ASSERT_TRUE(FlushLogs());

  struct Case {
    Severity file;
    std::vector<std::string> messages;
  };
  const Case cases[] = {
      {Severity::kInfo, {"info message", "warning message", "error message"}},
      {Severity::kWarning, {"warning message", "error message"}},
      {Severity::kError, {"error message"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(SeverityName(c.file));
    EXPECT_THAT(Messages(BodyLines(LogFile(c.file))),
                ElementsAreArray(c.messages));
  }
}

TEST_F(LogTest, MessageEndingInNewlineIsOneLine) {
  Init(TestConfig(dir_.path()));
  LOG(INFO) << "ends in a newline\n";
  LOG(INFO) << "next";
  ASSERT_TRUE(FlushLogs());
  EXPECT_THAT(Messages(BodyLines(LogFile(Severity::kInfo))),
              ElementsAre("ends in a newline", "next"));
}

// Logs one message per severity below FATAL.
void LogOneOfEach() {
  LOG(INFO) << "message I";
  LOG(WARNING) << "message W";
  LOG(ERROR) << "message E";
}

TEST_F(LogTest, MinLevelSuppressesEverythingBelowItEverywhere) {
  struct Case {
    Severity min_level;
    std::vector<std::string> expected;
  };
  const Case cases[] = {
      {Severity::kInfo, {"message I", "message W", "message E"}},
      {Severity::kWarning, {"message W", "message E"}},
      {Severity::kError, {"message E"}},
      {Severity::kFatal, {}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(SeverityName(c.min_level));
    TempDir dir;
    StderrCapture stderr_capture;
    LogConfig config = TestConfig(dir.path());
    config.min_level = c.min_level;
    config.stderr_level = Severity::kInfo;
    ASSERT_TRUE(InitLogging(config, &os_).ok());
    LogOneOfEach();
    ASSERT_TRUE(FlushLogs());
    ShutdownLogging();

    const std::vector<std::string> info_files =
        ListDirWithPrefix(dir.path(), FilePrefix(os_, Severity::kInfo));
    const std::vector<std::string> in_file =
        info_files.empty() ? std::vector<std::string>()
                           : Messages(BodyLines(dir.Join(info_files.front())));
    EXPECT_THAT(in_file, ElementsAreArray(c.expected));
    EXPECT_THAT(Messages(stderr_capture.Lines()), ElementsAreArray(c.expected));
  }
}

TEST_F(LogTest, DisabledMessageDoesNotEvaluateItsArguments) {
  LogConfig config = TestConfig(dir_.path());
  config.min_level = Severity::kWarning;
  Init(config);
  int evaluations = 0;
  auto count = [&] { return ++evaluations; };
  LOG(INFO) << count();
  EXPECT_EQ(evaluations, 0);
  LOG(WARNING) << count();
  EXPECT_EQ(evaluations, 1);
}

TEST_F(LogTest, StderrLevelCopiesMessagesAtOrAboveItToStderr) {
  struct Case {
    Severity stderr_level;
    std::vector<std::string> expected;
  };
  const Case cases[] = {
      {Severity::kInfo, {"message I", "message W", "message E"}},
      {Severity::kWarning, {"message W", "message E"}},
      {Severity::kError, {"message E"}},
      {Severity::kFatal, {}},
  };
  const log_test::Regex whole(log_test::kLinePattern);
  for (const Case& c : cases) {
    SCOPED_TRACE(SeverityName(c.stderr_level));
    TempDir dir;
    StderrCapture stderr_capture;
    LogConfig config = TestConfig(dir.path());
    config.stderr_level = c.stderr_level;
    ASSERT_TRUE(InitLogging(config, &os_).ok());
    LogOneOfEach();
    ASSERT_TRUE(FlushLogs());
    ShutdownLogging();

    const std::vector<std::string> lines = stderr_capture.Lines();
    for (const std::string& line : lines) {
      EXPECT_TRUE(whole.Search(line)) << line;  // no header
    }
    EXPECT_THAT(Messages(lines), ElementsAreArray(c.expected));
    // The files are unaffected by the stderr level.
    EXPECT_THAT(
        Messages(BodyLines(OnlyLogFile(dir.path(), os_, Severity::kInfo))),
        ElementsAre("message I", "message W", "message E"));
  }
}

TEST_F(LogTest, BeforeInitAndAfterShutdownOnlyErrorsReachStderr) {
  StderrCapture stderr_capture;
  LogOneOfEach();
  EXPECT_TRUE(FlushLogs());
  EXPECT_EQ(ActiveLogDirectory(), "");
  EXPECT_EQ(DroppedMessageCount(), 0u);

  Init(TestConfig(dir_.path()));
  EXPECT_EQ(ActiveLogDirectory(), dir_.path());
  ShutdownLogging();
  EXPECT_EQ(ActiveLogDirectory(), "");
  LogOneOfEach();

  const std::vector<std::string> lines = stderr_capture.Lines();
  const log_test::Regex whole(log_test::kLinePattern);
  for (const std::string& line : lines) {
    EXPECT_TRUE(whole.Search(line)) << line;
  }
  EXPECT_THAT(Messages(lines), ElementsAre("message E", "message E"));
}

TEST_F(LogTest, ShutdownWritesEverythingQueuedAndClosesTheFiles) {
  Init(TestConfig(dir_.path()));
  for (int i = 0; i < 1000; ++i) LOG(INFO) << "line " << i;
  ShutdownLogging();
  const std::vector<std::string> messages =
      Messages(BodyLines(LogFile(Severity::kInfo)));
  ASSERT_THAT(messages, SizeIs(1000));
  EXPECT_EQ(messages.back(), "line 999");
  // Closed: nothing of this process holds it open.
  bool open = false;
  for (const auto& fd : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code error;
    const auto target = std::filesystem::read_symlink(fd.path(), error);
    if (!error && target.string() == LogFile(Severity::kInfo)) open = true;
  }
  EXPECT_FALSE(open);
}

TEST_F(LogTest, ReinitStartsNewFilesInTheNewDirectory) {
  Init(TestConfig(dir_.path()));
  LOG(INFO) << "first configuration";
  TempDir second;
  Init(TestConfig(second.path()));
  LOG(INFO) << "second configuration";
  ASSERT_TRUE(FlushLogs());
  EXPECT_THAT(Messages(BodyLines(LogFile(Severity::kInfo))),
              ElementsAre("first configuration"));
  EXPECT_THAT(
      Messages(BodyLines(OnlyLogFile(second.path(), os_, Severity::kInfo))),
      ElementsAre("second configuration"));
}

TEST_F(LogTest, SameSecondNamesGetCollisionSuffixes) {
  os_.SetNow(absl::FromUnixSeconds(1700000000));
  for (int i = 0; i < 3; ++i) {
    Init(TestConfig(dir_.path()));
    LOG(INFO) << "configuration " << i;
    ASSERT_TRUE(FlushLogs());
  }
  const std::string prefix = FilePrefix(os_, Severity::kInfo);
  const std::string stem = absl::StrCat(
      prefix,
      absl::FormatTime("%Y%m%d-%H%M%S", absl::FromUnixSeconds(1700000000),
                       absl::LocalTimeZone()),
      ".4242");
  EXPECT_THAT(ListDirWithPrefix(dir_.path(), prefix),
              ElementsAre(stem, stem + ".1", stem + ".2"));
  EXPECT_EQ(ReadLink(dir_.Join("tpu_driver.INFO")), stem + ".2");
  EXPECT_THAT(Messages(BodyLines(dir_.Join(stem + ".2"))),
              ElementsAre("configuration 2"));
}

TEST_F(LogTest, RotatesAtMaxFileBytesAndSymlinkFollowsTheNewestFile) {
  constexpr uint64_t kMaxBytes = 16 << 10;
  constexpr int kMessages = 400;
  LogConfig config = TestConfig(dir_.path());
  config.max_file_bytes = kMaxBytes;
  config.keep = 1000;
  Init(config);
  const std::string padding(200, 'x');
  for (int i = 0; i < kMessages; ++i) LOG(INFO) << "message " << i << padding;
  ASSERT_TRUE(FlushLogs());

  const std::string prefix = FilePrefix(os_, Severity::kInfo);
  const std::vector<std::string> files = FilesOldestFirst(dir_.path(), prefix);
  // About 260 bytes a line: at least 6 files of 16 KiB.
  ASSERT_GE(files.size(), 6u);
  std::vector<std::string> all_messages;
  for (const std::string& name : files) {
    SCOPED_TRACE(name);
    const std::string contents = ReadFile(dir_.Join(name));
    EXPECT_TRUE(contents.starts_with("Log file created at: "));
    // Closed once it reached the limit, so at most one line beyond it.
    EXPECT_LT(contents.size(), kMaxBytes + 300);
    const std::vector<std::string> messages =
        Messages(BodyLines(dir_.Join(name)));
    all_messages.insert(all_messages.end(), messages.begin(), messages.end());
  }
  for (size_t i = 0; i + 1 < files.size(); ++i) {
    EXPECT_GE(ReadFile(dir_.Join(files[i])).size(), kMaxBytes) << files[i];
  }
  ASSERT_THAT(all_messages, SizeIs(kMessages));
  for (int i = 0; i < kMessages; ++i) {
    EXPECT_EQ(all_messages[i], absl::StrCat("message ", i, padding));
  }
  EXPECT_EQ(ReadLink(dir_.Join("tpu_driver.INFO")), files.back());
}

TEST_F(LogTest, RetentionKeepsTheNewestFilesAndSparesOthers) {
  const std::string prefix = FilePrefix(os_, Severity::kInfo);
  const std::string live_other = prefix + "20200101-000000.777";
  const std::string dead_other = prefix + "20200101-000000.778";
  const std::string dead_other_newer = prefix + "20200101-000001.778.1";
  const std::string other_user = absl::StrCat(
      "tpu_driver.testhost.someoneelse.log.INFO.20200101-000000.778");
  const std::string other_severity =
      FilePrefix(os_, Severity::kWarning) + "20200101-000000.778";
  for (const std::string& name :
       {live_other, dead_other, dead_other_newer, other_user, other_severity,
        std::string("unrelated.txt")}) {
    std::ofstream(dir_.Join(name)) << "planted\n";
  }
  os_.SetLivePids({777});

  LogConfig config = TestConfig(dir_.path());
  config.max_file_bytes = 16 << 10;
  config.keep = 2;
  Init(config);
  const std::string padding(200, 'x');
  for (int i = 0; i < 400; ++i) LOG(INFO) << "message " << i << padding;
  ASSERT_TRUE(FlushLogs());

  // Two besides the current one: the live process's file (never deleted)
  // and our newest rotated file.
  const std::vector<std::string> files = FilesOldestFirst(dir_.path(), prefix);
  ASSERT_THAT(files, SizeIs(3));
  EXPECT_EQ(files[0], live_other);
  EXPECT_THAT(files[1], HasSubstr(".4242"));
  EXPECT_EQ(ReadLink(dir_.Join("tpu_driver.INFO")), files[2]);
  // The current file ends with the last message, and the newest rotated
  // file holds the messages just before the current one's.
  const std::vector<std::string> current =
      Messages(BodyLines(dir_.Join(files[2])));
  const std::vector<std::string> previous =
      Messages(BodyLines(dir_.Join(files[1])));
  ASSERT_FALSE(previous.empty());
  ASSERT_FALSE(current.empty());
  EXPECT_THAT(current.back(), HasSubstr("message 399"));
  int last_previous = -1, first_current = -1;
  ASSERT_TRUE(
      absl::SimpleAtoi(previous.back().substr(8, previous.back().find('x') - 8),
                       &last_previous));
  ASSERT_TRUE(
      absl::SimpleAtoi(current.front().substr(8, current.front().find('x') - 8),
                       &first_current));
  EXPECT_EQ(last_previous + 1, first_current);

  for (const std::string& survivor :
       {other_user, other_severity, std::string("unrelated.txt")}) {
    EXPECT_TRUE(std::filesystem::exists(dir_.Join(survivor))) << survivor;
  }
  EXPECT_FALSE(std::filesystem::exists(dir_.Join(dead_other)));
  EXPECT_FALSE(std::filesystem::exists(dir_.Join(dead_other_newer)));
}

TEST_F(LogTest, FlushLogsWaitsForEveryEarlierMessage) {
  Init(TestConfig(dir_.path()));
  for (int round = 0; round < 5; ++round) {
    for (int i = 0; i < 200; ++i) LOG(INFO) << "round " << round << " " << i;
    ASSERT_TRUE(FlushLogs());
    const std::vector<std::string> messages =
        Messages(BodyLines(LogFile(Severity::kInfo)));
    ASSERT_THAT(messages, SizeIs((round + 1) * 200));
    EXPECT_EQ(messages.back(), absl::StrCat("round ", round, " 199"));
  }
  EXPECT_EQ(DroppedMessageCount(), 0u);
}

TEST_F(LogTest, ConfigFromOptions) {
  Options options;
  options.log_dir.value = "/var/log/tpu";
  options.min_log_level.value = 1;
  options.stderr_log_level.value = 0;
  options.vmodule.value = {{"premapped_*", 2}, {"queue", 1}};
  options.max_log_size_mb.value = 3;
  options.log_keep.value = 7;
  const LogConfig config = LogConfig::FromOptions(options);
  EXPECT_EQ(config.log_dir, "/var/log/tpu");
  EXPECT_EQ(config.min_level, Severity::kWarning);
  EXPECT_EQ(config.stderr_level, Severity::kInfo);
  EXPECT_EQ(config.vmodule, options.vmodule.value);
  EXPECT_EQ(config.max_file_bytes, uint64_t{3} << 20);
  EXPECT_EQ(config.keep, 7);

  options.log_dir.value = "disabled";
  EXPECT_EQ(LogConfig::FromOptions(options).log_dir, "");

  const LogConfig defaults = LogConfig::FromOptions(Options());
  EXPECT_EQ(defaults.log_dir, "/tmp/tpu_logs");
  EXPECT_EQ(defaults.min_level, Severity::kInfo);
  EXPECT_EQ(defaults.stderr_level, Severity::kError);
  EXPECT_EQ(defaults.max_file_bytes, uint64_t{1024} << 20);
  EXPECT_EQ(defaults.keep, 5);
}

TEST_F(LogTest, RejectsUnusableConfigAndKeepsThePreviousOne) {
  Init(TestConfig(dir_.path()));
  struct Case {
    const char* name;
    void (*mutate)(LogConfig&);
  };
  const Case cases[] = {
      {"queue_size 0", [](LogConfig& c) { c.queue_size = 0; }},
      {"max_file_bytes 0", [](LogConfig& c) { c.max_file_bytes = 0; }},
      {"keep -1", [](LogConfig& c) { c.keep = -1; }},
      {"min_level 4",
       [](LogConfig& c) { c.min_level = static_cast<Severity>(4); }},
      {"stderr_level -1",
       [](LogConfig& c) { c.stderr_level = static_cast<Severity>(-1); }},
  };
  TempDir other;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    LogConfig config = TestConfig(other.path());
    c.mutate(config);
    EXPECT_EQ(InitLogging(config, &os_).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(ActiveLogDirectory(), dir_.path());
  }
  EXPECT_EQ(InitLogging(TestConfig(other.path()), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(LogTest, DisabledFilesMeanStderrOnlyWithoutWarning) {
  StderrCapture stderr_capture;
  LogConfig config = TestConfig("");
  config.stderr_level = Severity::kWarning;
  Init(config);
  EXPECT_EQ(ActiveLogDirectory(), "");
  LogOneOfEach();
  ASSERT_TRUE(FlushLogs());
  EXPECT_THAT(Messages(stderr_capture.Lines()),
              ElementsAre("message W", "message E"));
  EXPECT_FALSE(std::filesystem::exists(os_.fallback_dir()));
}

// LOG(FATAL) ends a value-returning function: compiling this with
// -Werror=return-type is the test that its destructor is [[noreturn]].
int FatalInsteadOfReturning(int x) {
  if (x > 0) return x;
  LOG(FATAL) << "no positive value: " << x;
}

// The death tests use the "fast" style: the child is a fork of the test
// process, so it shares the temporary directory the parent then reads. The
// parent holds no logging state at that point (each test shuts it down), so
// the child starts its own writer thread.
using LogDeathTest = LogTest;

TEST_F(LogDeathTest, FatalWritesFilesAndStderrThenAborts) {
  GTEST_FLAG_SET(death_test_style, "fast");
  LogConfig config = TestConfig(dir_.path());
  EXPECT_DEATH(
      {
        if (!InitLogging(config, &os_).ok()) return;
        LOG(INFO) << "before the fatal one";
        LOG(FATAL) << "fatal message " << 42;
      },
      "F[0-9]{4} [0-9:.]+ +[0-9]+ log_test\\.cc:[0-9]+] fatal message 42");
  // The child wrote the files before aborting.
  EXPECT_THAT(Messages(BodyLines(LogFile(Severity::kInfo))),
              ElementsAre("before the fatal one", "fatal message 42"));
  for (Severity severity : {Severity::kWarning, Severity::kError}) {
    EXPECT_THAT(Messages(BodyLines(LogFile(severity))),
                ElementsAre("fatal message 42"));
  }
}

TEST_F(LogDeathTest, FatalBeforeInitStillReachesStderr) {
  GTEST_FLAG_SET(death_test_style, "fast");
  EXPECT_DEATH(FatalInsteadOfReturning(0),
               "F[0-9]{4} .*log_test\\.cc:[0-9]+] no positive value: 0");
  EXPECT_EQ(FatalInsteadOfReturning(3), 3);
}

TEST_F(LogDeathTest, FatalAtRuntimeSeverityAborts) {
  GTEST_FLAG_SET(death_test_style, "fast");
  const Severity severity = Severity::kFatal;
  EXPECT_DEATH(TPUSHIM_LOG_AT(__FILE__, __LINE__, severity) << "dynamic",
               "F[0-9]{4} .*] dynamic");
}

TEST_F(LogTest, ConcurrentLoggingWhileReinitializingKeepsLinesWellFormed) {
  constexpr int kLoggers = 4;
  constexpr int kMessagesPerLogger = 3000;
  constexpr int kMinReinits = 20;
  LogConfig config = TestConfig(dir_.path());
  config.max_file_bytes = 64 << 10;
  config.keep = 100000;
  config.vmodule = {{"log_test", 1}};
  Init(config);

  std::atomic<int> loggers_running{kLoggers};
  std::vector<std::thread> loggers;
  for (int t = 0; t < kLoggers; ++t) {
    loggers.emplace_back([t, &loggers_running] {
      for (int i = 0; i < kMessagesPerLogger; ++i) {
        LOG(INFO) << "logger " << t << " message " << i;
        if (i % 3 == 0) LOG(WARNING) << "logger " << t << " warning " << i;
        VLOG(1) << "logger " << t << " vlog " << i;
        if (i % 100 == 0) (void)FlushLogs(absl::Seconds(30));
      }
      --loggers_running;
    });
  }
  // Reconfigures for as long as the loggers run, and at least kMinReinits
  // times.
  int reinits = 0;
  std::thread reinit([&] {
    for (; reinits < kMinReinits || loggers_running > 0; ++reinits) {
      if (reinits % 5 == 4) {
        ShutdownLogging();
      } else {
        LogConfig next = config;
        next.vmodule = {{"log_test", reinits % 2}};
        EXPECT_TRUE(InitLogging(next, &os_).ok());
      }
      (void)DroppedMessageCount();
      (void)ActiveLogDirectory();
    }
  });
  for (std::thread& logger : loggers) logger.join();
  reinit.join();
  ShutdownLogging();
  EXPECT_GE(reinits, kMinReinits);

  const log_test::Regex whole(log_test::kLinePattern);
  const log_test::Regex header(
      "^(Log file created at: .*|Running on machine: .*|"
      "Binary: Built (on|at|for) .*|Log line format: .*)$");
  size_t lines_checked = 0;
  for (const std::string& name :
       ListDirWithPrefix(dir_.path(), "tpu_driver.testhost")) {
    const std::string contents = ReadFile(dir_.Join(name));
    ASSERT_TRUE(contents.empty() || contents.back() == '\n') << name;
    for (const std::string& line : SplitLines(contents)) {
      ++lines_checked;
      ASSERT_TRUE(whole.Search(line) || header.Search(line))
          << name << ": " << line;
    }
  }
  EXPECT_GT(lines_checked, 0u);
}

}  // namespace
}  // namespace tpushim::logging
