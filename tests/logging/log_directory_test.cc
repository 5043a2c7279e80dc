// Choice of the log directory: every way the configured
// directory can be unusable, the fallback to /tmp/tpu_logs_<user> and to
// stderr only, each with exactly one WARNING on stderr.

#include "logging/log_directory.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "logging/log.h"
#include "tests/logging/log_test_util.h"

namespace tpushim::logging {
namespace {

using log_test::BodyLines;
using log_test::Messages;
using log_test::OnlyLogFile;
using log_test::StderrCapture;
using log_test::TempDir;
using log_test::TestOs;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

constexpr uid_t kOtherUid = 1001;

FileInfo Info(FileInfo::Type type, uid_t owner) {
  FileInfo info;
  info.type = type;
  info.owner = owner;
  info.mode = 0755;
  return info;
}

// Every path under `dir`, relative, sorted; symlinks are not followed.
std::vector<std::string> Tree(const std::string& dir) {
  std::vector<std::string> paths;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    paths.push_back(std::filesystem::relative(entry.path(), dir).string());
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

enum class Where { kConfigured, kFallback, kStderrOnly };

struct Case {
  const char* name;
  // Prepares the world under `dir` and in `os`; returns the configured
  // directory.
  std::function<std::string(const TempDir& dir, TestOs& os)> setup;
  Where where;
  // What the single WARNING says about the configured (and fallback)
  // directory; empty when no warning is expected. "{dir}" and "{fallback}"
  // stand for the paths.
  std::string warning;
};

// Keeps gtest (and the CTest names derived from it) from printing the
// bytes of the struct.
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::string Expand(std::string text, const std::string& dir,
                   const std::string& fallback) {
  for (auto [key, value] : {std::pair<std::string, std::string>{"{dir}", dir},
                            {"{fallback}", fallback}}) {
    for (size_t at = text.find(key); at != std::string::npos;
         at = text.find(key)) {
      text.replace(at, key.size(), value);
    }
  }
  return text;
}

const std::vector<Case>& Cases() {
  static const std::vector<Case>* const cases = new std::vector<Case>{
      {"existing directory",
       [](const TempDir& dir, TestOs&) {
         std::filesystem::create_directory(dir.Join("logs"));
         return dir.Join("logs");
       },
       Where::kConfigured, ""},
      {"missing but creatable",
       [](const TempDir& dir, TestOs&) { return dir.Join("logs"); },
       Where::kConfigured, ""},
      {"own symlink to a directory",
       [](const TempDir& dir, TestOs&) {
         std::filesystem::create_directory(dir.Join("real"));
         std::filesystem::create_directory_symlink(dir.Join("real"),
                                                   dir.Join("link"));
         return dir.Join("link");
       },
       Where::kConfigured, ""},
      {"root-owned directory while not root",
       [](const TempDir& dir, TestOs& os) {
         os.SetEffectiveUid(1000);
         os.FakeLstat(dir.Join("logs"), Info(FileInfo::Type::kDirectory, 0));
         std::filesystem::create_directory(dir.Join("logs"));
         return dir.Join("logs");
       },
       Where::kConfigured, ""},
      {"missing parent",
       [](const TempDir& dir, TestOs&) { return dir.Join("missing/logs"); },
       Where::kFallback,
       "Log directory {dir} does not exist and cannot be created "
       "(NOT_FOUND: "},
      {"regular file",
       [](const TempDir& dir, TestOs&) {
         std::ofstream(dir.Join("file")) << "not a directory\n";
         return dir.Join("file");
       },
       Where::kFallback, "Log directory {dir} is not a directory; "},
      {"symlink planted by another user",
       [](const TempDir& dir, TestOs& os) {
         std::filesystem::create_directory(dir.Join("real"));
         std::filesystem::create_directory_symlink(dir.Join("real"),
                                                   dir.Join("link"));
         os.FakeLstat(dir.Join("link"),
                      Info(FileInfo::Type::kSymlink, kOtherUid));
         return dir.Join("link");
       },
       Where::kFallback,
       "Log directory {dir} is a symlink owned by uid 1001, not by you "
       "(uid 0) or root; "},
      {"own symlink to a file",
       [](const TempDir& dir, TestOs&) {
         std::ofstream(dir.Join("file")) << "not a directory\n";
         std::filesystem::create_symlink(dir.Join("file"), dir.Join("link"));
         return dir.Join("link");
       },
       Where::kFallback,
       "Log directory {dir} is a symlink to something that is not a "
       "directory; "},
      {"directory owned by another user",
       [](const TempDir& dir, TestOs& os) {
         std::filesystem::create_directory(dir.Join("logs"));
         os.FakeLstat(dir.Join("logs"),
                      Info(FileInfo::Type::kDirectory, kOtherUid));
         return dir.Join("logs");
       },
       Where::kFallback,
       "Log directory {dir} is owned by uid 1001, not by you (uid 0); "},
      {"directory owned by another user while not root",
       [](const TempDir& dir, TestOs& os) {
         os.SetEffectiveUid(1000);
         std::filesystem::create_directory(dir.Join("logs"));
         os.FakeLstat(dir.Join("logs"),
                      Info(FileInfo::Type::kDirectory, kOtherUid));
         // The fallback is created by the real (root) process: fake ours.
         os.FakeLstat(os.fallback_dir(),
                      Info(FileInfo::Type::kDirectory, 1000));
         std::filesystem::create_directory(os.fallback_dir());
         return dir.Join("logs");
       },
       Where::kFallback,
       "Log directory {dir} is owned by uid 1001, not by you (uid 1000); "},
      {"directory not writable",
       [](const TempDir& dir, TestOs& os) {
         std::filesystem::create_directory(dir.Join("logs"));
         os.FailAccess(dir.Join("logs"), absl::PermissionDeniedError(
                                             "access: Permission denied"));
         return dir.Join("logs");
       },
       Where::kFallback,
       "Log directory {dir} is not writable (PERMISSION_DENIED: access: "
       "Permission denied); "},
      {"fallback cannot be created either",
       [](const TempDir& dir, TestOs& os) {
         os.FailMakeDirectory(os.fallback_dir(),
                              absl::PermissionDeniedError("mkdir: denied"));
         return dir.Join("missing/logs");
       },
       Where::kStderrOnly,
       "Log directory {dir} does not exist and cannot be created (NOT_FOUND: "
       "mkdir({dir}): No such file or directory); fallback log directory "
       "{fallback} does not exist and cannot be created (PERMISSION_DENIED: "
       "mkdir: denied); logging to stderr only"},
      {"fallback is a symlink planted by another user",
       [](const TempDir& dir, TestOs& os) {
         std::ofstream(dir.Join("file")) << "not a directory\n";
         os.FakeLstat(os.fallback_dir(),
                      Info(FileInfo::Type::kSymlink, kOtherUid));
         return dir.Join("file");
       },
       Where::kStderrOnly,
       "Log directory {dir} is not a directory; fallback log directory "
       "{fallback} is a symlink owned by uid 1001, not by you (uid 0) or "
       "root; logging to stderr only"},
  };
  return *cases;
}

class LogDirectoryTest : public ::testing::TestWithParam<Case> {
 protected:
  void TearDown() override {
    ShutdownLogging();
    std::error_code ignored;
    std::filesystem::remove_all(os_.fallback_dir(), ignored);
  }

  TempDir dir_;
  TestOs os_;
};

TEST_P(LogDirectoryTest, ChoosesUsableDirectoryWithOneWarning) {
  const Case& c = GetParam();
  const std::string configured = c.setup(dir_, os_);
  const std::vector<std::string> before = Tree(dir_.path());
  const std::string fallback = os_.fallback_dir();
  std::string expected_dir;
  switch (c.where) {
    case Where::kConfigured:
      expected_dir = configured;
      break;
    case Where::kFallback:
      expected_dir = fallback;
      break;
    case Where::kStderrOnly:
      break;
  }

  StderrCapture stderr_capture;
  LogConfig config = log_test::TestConfig(configured);
  config.stderr_level = Severity::kError;
  ASSERT_TRUE(InitLogging(config, &os_).ok());
  EXPECT_EQ(ActiveLogDirectory(), expected_dir);
  LOG(ERROR) << "after init";
  ASSERT_TRUE(FlushLogs());

  // stderr: the one WARNING (if any), then the ERROR.
  const std::vector<std::string> lines = stderr_capture.Lines();
  const log_test::Regex whole(log_test::kLinePattern);
  std::vector<std::string> warnings;
  for (const std::string& line : lines) {
    EXPECT_TRUE(whole.Search(line)) << line;
    if (line[0] == 'W') warnings.push_back(line);
  }
  EXPECT_THAT(Messages(lines), Contains("after init"));
  const std::string warning = Expand(c.warning, configured, fallback);
  if (c.where == Where::kConfigured) {
    EXPECT_THAT(warnings, IsEmpty());
  } else {
    ASSERT_THAT(warnings, SizeIs(1));
    EXPECT_THAT(warnings[0], HasSubstr(" log.cc:"));
    EXPECT_THAT(warnings[0], HasSubstr(warning));
    EXPECT_THAT(warnings[0],
                ::testing::EndsWith(
                    c.where == Where::kFallback
                        ? absl::StrCat("; logging to ", fallback, " instead")
                        : std::string("; logging to stderr only")));
  }

  if (c.where == Where::kStderrOnly) {
    EXPECT_FALSE(std::filesystem::exists(fallback) &&
                 !std::filesystem::is_empty(fallback));
  } else {
    const std::vector<std::string> info_messages =
        Messages(BodyLines(OnlyLogFile(expected_dir, os_, Severity::kInfo)));
    ASSERT_FALSE(info_messages.empty());
    EXPECT_EQ(info_messages.back(), "after init");
    if (c.where == Where::kFallback) {
      // The warning is in the files too.
      EXPECT_THAT(info_messages, ElementsAre(HasSubstr(warning), "after init"));
    }
  }
  if (c.where != Where::kConfigured) {
    // Nothing was written where the configured directory pointed.
    EXPECT_EQ(Tree(dir_.path()), before);
  }
}

INSTANTIATE_TEST_SUITE_P(AllCases, LogDirectoryTest,
                         ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& param_info) {
                           std::string name = param_info.param.name;
                           for (char& ch : name) {
                             if (!std::isalnum(static_cast<unsigned char>(ch)))
                               ch = '_';
                           }
                           return name;
                         });

TEST(LogDirectoryCheckTest, CreatesTheMissingLeafWithTheGivenMode) {
  TempDir dir;
  TestOs os;
  const mode_t old_umask = umask(0);
  EXPECT_TRUE(internal::PrepareLogDirectory(os, dir.Join("made"), 0700).ok());
  umask(old_umask);
  struct stat st;
  ASSERT_EQ(stat(dir.Join("made").c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0700u);
}

TEST(LogDirectoryCheckTest, DisabledMeansNoDirectoryAndNoWarning) {
  TestOs os;
  const internal::LogDirectoryChoice choice =
      internal::ChooseLogDirectory(os, "");
  EXPECT_EQ(choice.directory, "");
  EXPECT_EQ(choice.warning, "");
}

}  // namespace
}  // namespace tpushim::logging
