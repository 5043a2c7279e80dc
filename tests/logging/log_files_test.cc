// glog file naming, headers and the retention choice; and the file sink's
// rule that a file this process has open is never deleted.

#include "logging/log_files.h"

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/civil_time.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "logging/glog_file_sink.h"
#include "logging/glog_format.h"
#include "spdlog/details/log_msg.h"
#include "tests/logging/log_test_util.h"

namespace tpushim::logging::internal {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::IsEmpty;
using ::testing::Optional;

absl::Time LocalTime(int y, int mo, int d, int h, int mi, int s) {
  return absl::FromCivil(absl::CivilSecond(y, mo, d, h, mi, s),
                         absl::LocalTimeZone());
}

TEST(LogFilesTest, NamesFollowGlog) {
  const absl::Time created = LocalTime(2024, 11, 21, 22, 12, 46);
  EXPECT_EQ(LogFileName("host1", "bob", Severity::kInfo, created, 62136),
            "tpu_driver.host1.bob.log.INFO.20241121-221246.62136");
  EXPECT_EQ(LogFileName("h", "u", Severity::kWarning, created, 1),
            "tpu_driver.h.u.log.WARNING.20241121-221246.1");
  EXPECT_EQ(LogFileName("h", "u", Severity::kError,
                        LocalTime(2025, 1, 2, 3, 4, 5), 7),
            "tpu_driver.h.u.log.ERROR.20250102-030405.7");
  EXPECT_EQ(LogFilePrefix("h", "u", Severity::kInfo),
            "tpu_driver.h.u.log.INFO.");
  EXPECT_EQ(WithCollisionSuffix("name", 0), "name");
  EXPECT_EQ(WithCollisionSuffix("name", 3), "name.3");
  EXPECT_EQ(LogSymlinkName(Severity::kWarning), "tpu_driver.WARNING");
}

BuildFacts TestBuild() {
  return BuildFacts{.built = absl::FromUnixSeconds(1687430275),
                    .user = "builder",
                    .host = "buildhost.example.com",
                    .path = "/src/tpushim",
                    .target = "gcc-12.2.0 x86_64-linux-gnu"};
}

TEST(LogFilesTest, HeaderHasLibtpusSixLines) {
  EXPECT_EQ(
      LogFileHeader(LocalTime(2024, 11, 21, 22, 12, 46), "host1", TestBuild()),
      "Log file created at: 2024/11/21 22:12:46\n"
      "Running on machine: host1\n"
      "Binary: Built on Jun 22 2023 10:37:55 (1687430275)\n"
      "Binary: Built at builder@buildhost.example.com:/src/tpushim\n"
      "Binary: Built for gcc-12.2.0 x86_64-linux-gnu\n"
      "Log line format: [IWEF]mmdd hh:mm:ss.uuuuuu threadid file:line] msg\n");
}

TEST(LogFilesTest, HeaderShowsTheBuildTimeInUtcWithTwoDigitDays) {
  BuildFacts build = TestBuild();
  // 2025-01-02 03:04:05 UTC: the day has a leading zero.
  build.built = absl::FromUnixSeconds(1735787045);
  EXPECT_THAT(LogFileHeader(absl::UnixEpoch(), "h", build),
              ::testing::HasSubstr(
                  "\nBinary: Built on Jan 02 2025 03:04:05 (1735787045)\n"));
  build.built = absl::FromUnixSeconds(0);
  EXPECT_THAT(
      LogFileHeader(absl::UnixEpoch(), "h", build),
      ::testing::HasSubstr("\nBinary: Built on Jan 01 1970 00:00:00 (0)\n"));
}

TEST(LogFilesTest, ThisBuildNamesTheCompilerThatBuiltIt) {
  const BuildFacts build = ThisBuild();
  // Compiled by the same compiler as the library.
#if defined(__clang__)
  const std::string compiler =
      absl::StrCat("clang-", __clang_major__, ".", __clang_minor__, ".",
                   __clang_patchlevel__, " ");
#else
  const std::string compiler = absl::StrCat(
      "gcc-", __GNUC__, ".", __GNUC_MINOR__, ".", __GNUC_PATCHLEVEL__, " ");
#endif
  EXPECT_THAT(build.target, ::testing::StartsWith(compiler));
  EXPECT_THAT(build.target, ::testing::HasSubstr("linux"));
  EXPECT_THAT(build.target, ::testing::Not(::testing::HasSubstr("\n")));
  // Configured before this test ran, after this code was written.
  EXPECT_GT(build.built, absl::FromUnixSeconds(1700000000));
  EXPECT_LE(build.built, absl::Now());
  EXPECT_NE(build.user, "");
  EXPECT_NE(build.host, "");
  // The source directory of the build is the one holding this test.
  EXPECT_TRUE(std::filesystem::exists(
      absl::StrCat(build.path, "/tests/logging/log_files_test.cc")))
      << build.path;
}

TEST(LogFilesTest, ParsesOnlyNamesOfThePrefix) {
  const std::string prefix = "tpu_driver.h.u.log.INFO.";
  struct Case {
    std::string name;
    bool parses;
    std::string timestamp;
    pid_t pid;
    uint64_t suffix;
  };
  const std::vector<Case> cases = {
      {prefix + "20241121-221246.62136", true, "20241121-221246", 62136, 0},
      {prefix + "20241121-221246.62136.12", true, "20241121-221246", 62136, 12},
      {prefix + "20241121-221246.62136.0", false, "", 0, 0},
      {prefix + "20241121-221246.62136.x", false, "", 0, 0},
      {prefix + "20241121-221246.", false, "", 0, 0},
      {prefix + "20241121_221246.1", false, "", 0, 0},
      {prefix + "2024112-221246.1", false, "", 0, 0},
      {prefix + "20241121-221246.99999999999", false, "", 0, 0},
      {prefix + "20241121-221246.1.2.3", false, "", 0, 0},
      {"tpu_driver.h.u.log.WARNING.20241121-221246.1", false, "", 0, 0},
      {"tpu_driver.h.other.log.INFO.20241121-221246.1", false, "", 0, 0},
      {"tpu_driver.INFO", false, "", 0, 0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::optional<LogFileNameParts> parts = ParseLogFileName(c.name, prefix);
    ASSERT_EQ(parts.has_value(), c.parses);
    if (!parts.has_value()) continue;
    EXPECT_EQ(parts->timestamp, c.timestamp);
    EXPECT_EQ(parts->pid, c.pid);
    EXPECT_EQ(parts->suffix, c.suffix);
  }
}

TEST(LogFilesTest, RetentionDeletesOldestDeletableBeyondKeep) {
  const std::string p = "tpu_driver.h.u.log.INFO.";
  const std::vector<std::string> names = {
      p + "20240101-000003.10",
      p + "20240101-000001.10.2",
      p + "20240101-000001.10",
      p + "20240101-000001.10.1",
      p + "20240101-000002.20",
      p + "20240101-000004.10",
      "tpu_driver.INFO",
      "tpu_driver.h.u.log.ERROR.20230101-000000.1",
      "notes.txt",
  };
  const std::string current = p + "20240101-000004.10";
  auto any = [](const std::string&, pid_t) { return true; };

  struct Case {
    int keep;
    std::vector<std::string> deleted;
  };
  const std::vector<Case> cases = {
      {10, {}},
      {4, {p + "20240101-000001.10"}},
      {2,
       {p + "20240101-000001.10", p + "20240101-000001.10.1",
        p + "20240101-000001.10.2"}},
      {0,
       {p + "20240101-000001.10", p + "20240101-000001.10.1",
        p + "20240101-000001.10.2", p + "20240101-000002.20",
        p + "20240101-000003.10"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.keep);
    EXPECT_THAT(ChooseLogFilesToDelete(names, p, current, c.keep, any),
                ElementsAreArray(c.deleted));
  }

  // Files the predicate refuses (pid 20: a live process) stay and count.
  auto spare_pid_20 = [](const std::string&, pid_t pid) { return pid != 20; };
  EXPECT_THAT(
      ChooseLogFilesToDelete(names, p, current, 1, spare_pid_20),
      ElementsAre(p + "20240101-000001.10", p + "20240101-000001.10.1",
                  p + "20240101-000001.10.2", p + "20240101-000003.10"));
  EXPECT_THAT(
      ChooseLogFilesToDelete(names, p, current, 0,
                             [](const std::string&, pid_t) { return false; }),
      IsEmpty());
}

// A file one sink has open survives another sink's retention pass even
// with keep = 0.
TEST(GlogFileSinkTest, RetentionNeverDeletesAFileThisProcessHasOpen) {
  log_test::TempDir dir;
  log_test::TestOs os;
  std::atomic<uint64_t> lost{0};
  LogFileSettings settings;
  settings.os = &os;
  settings.directory = dir.path();
  settings.host = "testhost";
  settings.user = os.user();
  settings.pid = log_test::TestOs::kPid;
  settings.build = TestBuild();
  settings.max_file_bytes = 1 << 20;
  settings.keep = 0;
  os.SetNow(LocalTime(2024, 1, 1, 0, 0, 0));
  auto first = std::make_shared<GlogFileSink>(Severity::kInfo, settings, &lost);
  auto second =
      std::make_shared<GlogFileSink>(Severity::kInfo, settings, &lost);
  const std::string text = "hello";
  const spdlog::details::log_msg msg(spdlog::source_loc("f.cc", 1, nullptr), "",
                                     spdlog::level::info, text);
  first->log(msg);
  os.SetNow(LocalTime(2024, 1, 1, 0, 0, 1));
  second->log(msg);
  const std::string prefix = log_test::FilePrefix(os, Severity::kInfo);
  EXPECT_THAT(log_test::ListDirWithPrefix(dir.path(), prefix),
              ElementsAre(prefix + "20240101-000000.4242",
                          prefix + "20240101-000001.4242"));

  // Closed, the older file is fair game for the next retention pass.
  first->Close();
  second->Close();
  os.SetNow(LocalTime(2024, 1, 1, 0, 0, 2));
  second->log(msg);
  EXPECT_THAT(log_test::ListDirWithPrefix(dir.path(), prefix),
              ElementsAre(prefix + "20240101-000002.4242"));
  EXPECT_EQ(lost.load(), 0u);
}

TEST(GlogFormatterTest, FormatsEveryFieldOfTheLine) {
  const absl::Time when =
      LocalTime(2024, 11, 21, 22, 12, 46) + absl::Microseconds(123456);
  const std::string text =
      "Starting premapped memory manager initialization...";
  spdlog::details::log_msg msg(
      std::chrono::system_clock::from_time_t(absl::ToTimeT(when)) +
          std::chrono::microseconds(123456),
      spdlog::source_loc("/src/allocator/premapped_region.cc", 88, nullptr), "",
      spdlog::level::info, text);
  msg.thread_id = 62136;
  GlogFormatter formatter;
  spdlog::memory_buf_t out;
  formatter.format(msg, out);
  EXPECT_EQ(std::string(out.data(), out.size()),
            "I1121 22:12:46.123456   62136 premapped_region.cc:88] Starting "
            "premapped memory manager initialization...\n");

  struct Case {
    spdlog::level::level_enum level;
    char letter;
  };
  for (const Case& c :
       {Case{spdlog::level::warn, 'W'}, Case{spdlog::level::err, 'E'},
        Case{spdlog::level::critical, 'F'}}) {
    msg.level = c.level;
    msg.thread_id = 12345678;  // wider than 7: not truncated
    spdlog::memory_buf_t line;
    formatter.clone()->format(msg, line);
    EXPECT_EQ(std::string(line.data(), line.size()),
              absl::StrCat(std::string(1, c.letter),
                           "1121 22:12:46.123456 12345678 "
                           "premapped_region.cc:88] ",
                           text, "\n"));
  }
}

}  // namespace
}  // namespace tpushim::logging::internal
