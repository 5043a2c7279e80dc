// lnav, the log viewer, reads the runtime's log files as glog logs: the
// real logging (real host, user, pid and build facts) writes INFO, WARNING
// and ERROR files, rotated, with multi-line messages, and lnav, run
// headless on each file with SQL queries, must
//  * detect the file as `glog_log` and count the lines it has,
//  * show libtpu's six header lines, as they are, ahead of the first
//    message, and nothing else it could not parse,
//  * parse every message — its level and its whole body, continuation
//    lines included — at the line where it starts.
// A broken header or line format fails it.

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <ostream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/civil_time.h"
#include "absl/time/time.h"
#include "env/os.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "logging/build_facts.h"
#include "logging/log.h"
#include "logging/log_files.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace tpushim::logging {
namespace {

using Json = nlohmann::json;
using ::testing::ElementsAreArray;
using ::testing::SizeIs;
using testutil::TempDir;

constexpr char kLnav[] = TPUSHIM_LNAV_PATH;

// One message as the test logs it and as lnav must show it.
struct Message {
  Severity severity;
  std::string text;

  bool operator==(const Message&) const = default;
};

void PrintTo(const Message& m, std::ostream* os) {
  *os << SeverityName(m.severity) << " \"" << m.text << "\"";
}

void Log(const Message& m) {
  switch (m.severity) {
    case Severity::kInfo:
      LOG(INFO) << m.text;
      break;
    case Severity::kWarning:
      LOG(WARNING) << m.text;
      break;
    case Severity::kError:
      LOG(ERROR) << m.text;
      break;
    case Severity::kFatal:
      break;
  }
}

// lnav's name for the level it parsed from the line's letter.
std::string LnavLevel(Severity severity) {
  switch (severity) {
    case Severity::kInfo:
      return "info";
    case Severity::kWarning:
      return "warning";
    case Severity::kError:
      return "error";
    case Severity::kFatal:
      return "fatal";
  }
  return "";
}

std::optional<Severity> SeverityOfLnavLevel(const std::string& level) {
  for (Severity s : {Severity::kInfo, Severity::kWarning, Severity::kError,
                     Severity::kFatal}) {
    if (LnavLevel(s) == level) return s;
  }
  return std::nullopt;
}

// What the test logs: every severity, a line with the characters glog's
// prefix uses (':' and "] "), multi-line messages, and enough bytes for the
// INFO and WARNING files to rotate at kMaxFileBytes.
constexpr uint64_t kMaxFileBytes = 2048;

std::vector<Message> Script() {
  std::vector<Message> messages = {
      {Severity::kInfo,
       "TPU premapped buffer enabled. Size: 8388608 Threshold: 8388608"},
      {Severity::kInfo,
       "Creating numa aware allocators, number of NUMA nodes 1"},
      {Severity::kWarning,
       "Could not point symlink /tmp/tpu_logs/tpu_driver.INFO at x: "
       "INTERNAL: a.cc:12] not a prefix"},
      {Severity::kInfo,
       "A multi-line message:\n  its second line\n  and its third"},
      {Severity::kError,
       "An error with a detail line\n  detail: errno 28 (No space left)"},
  };
  for (int i = 0; i < 60; ++i) {
    const Severity severity = i % 10 == 9  ? Severity::kError
                              : i % 4 == 3 ? Severity::kWarning
                                           : Severity::kInfo;
    messages.push_back(
        {severity, absl::StrCat("message ", i, " ", std::string(100, 'x'))});
  }
  messages.push_back({Severity::kInfo, "the last message"});
  return messages;
}

// The rows lnav's headless mode prints for `sql` on `file` alone, as JSON
// (`:write-json-to -`). lnav runs with `home` as its HOME, so no user
// configuration or format of this machine takes part.
absl::StatusOr<Json> LnavQuery(const std::string& home, const std::string& file,
                               const std::string& sql) {
  absl::StatusOr<testutil::SubprocessResult> r = testutil::RunSubprocess(
      kLnav,
      {"-n", "-c", absl::StrCat(";", sql), "-c", ":write-json-to -", file},
      {absl::StrCat("HOME=", home)}, absl::Seconds(60));
  if (!r.ok()) return r.status();
  if (r->exit_code != 0 || !r->err.empty()) {
    return absl::InternalError(
        absl::StrCat("lnav exited with ", r->exit_code, ", stderr:\n", r->err));
  }
  Json rows = Json::parse(r->out, nullptr, /*allow_exceptions=*/false);
  if (!rows.is_array()) {
    return absl::InternalError(
        absl::StrCat("lnav printed no JSON rows:\n", r->out));
  }
  return rows;
}

// The header libtpu writes, line by line, for a file created at `created`
// (its name's timestamp) — spelled out here, not taken from the code under
// test.
std::vector<std::string> ExpectedHeader(absl::Time created) {
  const BuildFacts build = ThisBuild();
  return {
      absl::StrCat("Log file created at: ",
                   absl::FormatTime("%Y/%m/%d %H:%M:%S", created,
                                    absl::LocalTimeZone())),
      absl::StrCat("Running on machine: ", Os::Default()->HostName()),
      absl::StrCat("Binary: Built on ",
                   absl::FormatTime("%b %d %Y %H:%M:%S", build.built,
                                    absl::UTCTimeZone()),
                   " (", absl::ToUnixSeconds(build.built), ")"),
      absl::StrCat("Binary: Built at ", build.user, "@", build.host, ":",
                   build.path),
      absl::StrCat("Binary: Built for ", build.target),
      "Log line format: [IWEF]mmdd hh:mm:ss.uuuuuu threadid file:line] msg",
  };
}

// A log file of the test: its name and the local time in it.
struct LogFile {
  std::string name;
  absl::Time created;
};

// The log files of `severity` in `dir`, oldest first.
std::vector<LogFile> FilesOf(const std::string& dir, Severity severity) {
  const std::string prefix = internal::LogFilePrefix(
      Os::Default()->HostName(), Os::Default()->UserName(), severity);
  std::vector<std::pair<internal::LogFileNameParts, std::string>> found;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    std::optional<internal::LogFileNameParts> parts =
        internal::ParseLogFileName(name, prefix);
    if (parts.has_value()) found.emplace_back(*std::move(parts), name);
  }
  absl::c_sort(found, [](const auto& a, const auto& b) {
    return std::tie(a.first.timestamp, a.first.suffix) <
           std::tie(b.first.timestamp, b.first.suffix);
  });
  std::vector<LogFile> files;
  for (const auto& [parts, name] : found) {
    // "YYYYMMDD-HHMMSS", local time (absl::ParseTime's %Y would take all
    // eight digits).
    int y = 0, mo = 0, d = 0, h = 0, mi = 0, sec = 0;
    EXPECT_EQ(std::sscanf(parts.timestamp.c_str(), "%4d%2d%2d-%2d%2d%2d", &y,
                          &mo, &d, &h, &mi, &sec),
              6)
        << name;
    const absl::Time created = absl::FromCivil(
        absl::CivilSecond(y, mo, d, h, mi, sec), absl::LocalTimeZone());
    files.push_back({name, created});
  }
  return files;
}

size_t CountNewlines(const std::string& text) {
  return static_cast<size_t>(absl::c_count(text, '\n'));
}

class LnavTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(kLnav))
        << "lnav not found (" << kLnav
        << "); scripts/setup.sh installs it (Debian package lnav)";
    std::filesystem::create_directory(home_.Join("home"));
  }

  // Checks one file as lnav reads it and appends the messages lnav parsed
  // to `parsed`.
  void CheckFile(const LogFile& file, std::vector<Message>& parsed) {
    SCOPED_TRACE(file.name);
    const std::string path = logs_.Join(file.name);
    const std::string text = testutil::ReadFileOrEmpty(path);
    const std::string home = home_.Join("home");

    absl::StatusOr<Json> facts =
        LnavQuery(home, path, "SELECT format, lines FROM lnav_file");
    ASSERT_TRUE(facts.ok()) << facts.status();
    ASSERT_THAT(*facts, SizeIs(1)) << facts->dump();
    EXPECT_EQ((*facts)[0]["format"].dump(), "\"glog_log\"");
    const size_t lines = (*facts)[0]["lines"].get<size_t>();
    EXPECT_EQ(lines, CountNewlines(text));

    absl::StatusOr<Json> rows = LnavQuery(
        home, path,
        "SELECT log_line, log_level, log_body FROM glog_log ORDER BY log_line");
    ASSERT_TRUE(rows.ok()) << rows.status();

    // The header: six lines lnav shows as they are, with no level, ahead
    // of the first message.
    const std::vector<std::string> header = ExpectedHeader(file.created);
    std::vector<std::string> unparsed;
    size_t next_line = 0;  // where the next row must start
    for (const Json& row : *rows) {
      const size_t line = row["log_line"].get<size_t>();
      const std::string level = row["log_level"].get<std::string>();
      const std::string body = row["log_body"].get<std::string>();
      EXPECT_EQ(line, next_line) << row.dump();
      next_line = line + 1 + CountNewlines(body);
      if (level == "unknown") {
        unparsed.push_back(body);
        continue;
      }
      const std::optional<Severity> severity = SeverityOfLnavLevel(level);
      EXPECT_TRUE(severity.has_value()) << row.dump();
      EXPECT_GE(line, header.size()) << "a message inside the header";
      parsed.push_back({severity.value_or(Severity::kFatal), body});
    }
    // Every line of the file is the header or a message (with its
    // continuation lines).
    EXPECT_EQ(next_line, lines);
    EXPECT_THAT(unparsed, ElementsAreArray(header));
  }

  TempDir logs_;
  TempDir home_;
};

TEST_F(LnavTest, ReadsEveryFileAsGlogWithEveryLineParsed) {
  LogConfig config;
  config.log_dir = logs_.path();
  config.stderr_level = Severity::kFatal;
  config.max_file_bytes = kMaxFileBytes;
  config.keep = 100;
  ASSERT_TRUE(InitLogging(config).ok());
  const std::vector<Message> script = Script();
  for (const Message& m : script) Log(m);
  ShutdownLogging();

  for (Severity file_severity :
       {Severity::kInfo, Severity::kWarning, Severity::kError}) {
    SCOPED_TRACE(SeverityName(file_severity));
    std::vector<Message> expected;
    for (const Message& m : script) {
      if (m.severity >= file_severity) expected.push_back(m);
    }
    const std::vector<LogFile> files = FilesOf(logs_.path(), file_severity);
    ASSERT_FALSE(files.empty());
    // The INFO and WARNING files rotated: lnav reads the later ones too.
    if (file_severity != Severity::kError) {
      EXPECT_GE(files.size(), 2u);
    }
    std::vector<Message> parsed;
    for (const LogFile& file : files) CheckFile(file, parsed);
    EXPECT_THAT(parsed, ElementsAreArray(expected));
  }
}

}  // namespace
}  // namespace tpushim::logging
