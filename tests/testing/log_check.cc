#include "tests/testing/log_check.h"

#include <regex.h>

#include <filesystem>
#include <iterator>
#include <optional>
#include <system_error>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "tests/testing/temp_dir.h"

namespace tpushim::testutil {
namespace {

// The glog line prefix, byte for byte as libtpu writes it,
//   <L><MMDD> <HH:MM:SS.uuuuuu> <tid right-aligned to 7> <file>:<line>] ,
// as a POSIX extended regular expression (regcomp: std::regex trips GCC
// 12's -Wmaybe-uninitialized under sanitizers).
constexpr char kLinePrefix[] =
    "^[IWEF][0-9]{4} [0-9]{2}:[0-9]{2}:[0-9]{2}[.][0-9]{6} [ 0-9]{7} "
    "[^ :]+:[0-9]+] ";

// The six header lines of a libtpu log file; all but the last start this
// way.
constexpr absl::string_view kHeaderStarts[] = {
    "Log file created at: ", "Running on machine: ", "Binary: Built on ",
    "Binary: Built at ", "Binary: Built for "};
constexpr size_t kHeaderLines = std::size(kHeaderStarts) + 1;
constexpr absl::string_view kHeaderFormatLine =
    "Log line format: [IWEF]mmdd hh:mm:ss.uuuuuu threadid file:line] msg";

// Problems reported per file at most, so one broken file stays readable.
constexpr int kMaxProblemsPerFile = 3;

class Regex {
 public:
  explicit Regex(const std::string& pattern)
      : compiled_(regcomp(&regex_, pattern.c_str(), REG_EXTENDED) == 0) {}
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  ~Regex() {
    if (compiled_) regfree(&regex_);
  }

  // Where the match of the whole pattern in `text` ends; nullopt when it
  // does not match (or did not compile).
  std::optional<size_t> MatchEnd(const std::string& text) const {
    regmatch_t match;
    if (!compiled_ || regexec(&regex_, text.c_str(), 1, &match, 0) != 0) {
      return std::nullopt;
    }
    return static_cast<size_t>(match.rm_eo);
  }

 private:
  regex_t regex_;
  const bool compiled_;
};

// Up to 60 characters of `line`, quoted, for a problem report.
std::string Quote(absl::string_view line) {
  return absl::StrCat("\"", line.substr(0, 60), line.size() > 60 ? "..." : "",
                      "\"");
}

void CheckLogFile(const std::string& path, const std::string& name,
                  std::vector<std::string>& problems) {
  const std::string text = ReadFileOrEmpty(path);
  if (text.empty()) return;
  int found = 0;
  auto problem = [&](const std::string& what) {
    if (++found <= kMaxProblemsPerFile) {
      problems.push_back(absl::StrCat(name, ": ", what));
    }
  };
  if (text.back() != '\n') {
    const size_t last = text.rfind('\n');
    problem(absl::StrCat(
        "ends with a torn line ",
        Quote(last == std::string::npos ? text : text.substr(last + 1))));
  }
  const std::vector<std::string> lines =
      absl::StrSplit(text.substr(0, text.rfind('\n')), '\n');
  for (size_t i = 0; i < std::size(kHeaderStarts); ++i) {
    if (i >= lines.size() || !absl::StartsWith(lines[i], kHeaderStarts[i])) {
      problem(absl::StrCat("header line ", i + 1, " is not \"",
                           kHeaderStarts[i], "...\""));
    }
  }
  if (lines.size() < kHeaderLines ||
      lines[kHeaderLines - 1] != kHeaderFormatLine) {
    problem(absl::StrCat("header line ", kHeaderLines, " is not \"",
                         kHeaderFormatLine, "\""));
  }
  const Regex glog_line(kLinePrefix);
  for (size_t i = kHeaderLines; i < lines.size(); ++i) {
    if (!glog_line.MatchEnd(lines[i])) {
      problem(absl::StrCat("line ", i + 1,
                           " is not a whole glog line: ", Quote(lines[i])));
    }
  }
}

void CheckSymlink(const std::string& dir, const std::string& name,
                  std::vector<std::string>& problems) {
  std::error_code error;
  const std::filesystem::path target =
      std::filesystem::read_symlink(std::filesystem::path(dir) / name, error);
  if (error) {
    problems.push_back(absl::StrCat(name, ": unreadable symlink"));
    return;
  }
  if (target.has_parent_path() ||
      !std::filesystem::is_regular_file(std::filesystem::path(dir) / target,
                                        error)) {
    problems.push_back(absl::StrCat(name, ": symlink to ", target.string(),
                                    ", not to a log file beside it"));
  }
}

}  // namespace

std::string LogDirectoryProblems(const std::string& dir) {
  std::vector<std::string> problems;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    if (!absl::StartsWith(name, "tpu_driver.")) continue;
    if (entry.is_symlink(error)) {
      CheckSymlink(dir, name, problems);
    } else {
      CheckLogFile(entry.path().string(), name, problems);
    }
  }
  return absl::StrJoin(problems, "\n");
}

std::string StartupLinesProblems(const std::string& info,
                                 const StartupExpectation& expected) {
  const std::string size = absl::StrCat(expected.region_bytes);
  const std::string threshold =
      absl::StrCat(expected.threshold_bytes != 0 ? expected.threshold_bytes
                                                 : expected.region_bytes);
  std::vector<std::string> ids;
  for (int d = 0; d < expected.devices; ++d) ids.push_back(absl::StrCat(d));
  // Messages, as anchored extended regular expressions.
  std::vector<std::string> wanted = {
      absl::StrCat("^TPU premapped buffer enabled[.] Size: ", size,
                   " Threshold: ", threshold, "$"),
      "^Creating numa aware allocators, number of NUMA nodes [0-9]+$",
      "^Starting premapped memory manager initialization[.][.][.]$",
      "^Premapped buffer is using alignment 64$"};
  const std::string mlocked =
      "^mlock[(][)]-ed [0-9]+ bytes for premapped region, using [1-9][0-9]* "
      "syscalls[.]$";
  std::vector<std::string> premapped;
  if (expected.locked) premapped.push_back(mlocked);
  premapped.push_back(absl::StrCat("^Done premapping memory of size ", size,
                                   " in [0-9]+[.][0-9]{3}s [(][^)]+[)]$"));
  premapped.push_back(
      absl::StrCat("^Done allocating premapped memory of size ", size, "$"));
  std::vector<std::string> created = {
      absl::StrCat("^tpu::System initialized, current host id: 0, "
                   "logical device ids: ",
                   absl::StrJoin(ids, ","), "$"),
      "^CreateTpuSystemState: TPU initialization is successful and it "
      "took [0-9]+[.][0-9]{9}s$",
      absl::StrCat("^CreateTpuSystemState: using TPU host premapped "
                   "buffer of size: ",
                   size, "$")};
  for (const auto* part : expected.background
                              ? std::vector{&created, &premapped}
                              : std::vector{&premapped, &created}) {
    wanted.insert(wanted.end(), part->begin(), part->end());
  }

  // The messages of the whole glog lines, in order.
  const Regex glog_line(kLinePrefix);
  std::vector<std::string> messages;
  for (absl::string_view line : absl::StrSplit(info, '\n')) {
    const std::string text(line);
    if (const std::optional<size_t> end = glog_line.MatchEnd(text)) {
      messages.push_back(text.substr(*end));
    }
  }
  std::vector<std::string> problems;
  size_t next = 0;
  for (const std::string& pattern : wanted) {
    const Regex want(pattern);
    size_t at = next;
    while (at < messages.size() && !want.MatchEnd(messages[at])) ++at;
    if (at == messages.size()) {
      problems.push_back(absl::StrCat("missing (in order): ", pattern));
    } else {
      next = at + 1;
    }
  }
  if (!expected.locked) {
    const Regex unexpected(mlocked);
    for (const std::string& m : messages) {
      if (unexpected.MatchEnd(m)) {
        problems.push_back(absl::StrCat("unexpected: ", m));
      }
    }
  }
  if (problems.empty()) return "";
  return absl::StrCat(absl::StrJoin(problems, "\n"), "\nmessages:\n",
                      absl::StrJoin(messages, "\n"));
}

}  // namespace tpushim::testutil
