#include "tests/logging/log_test_util.h"

#include <errno.h>
#include <limits.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/mutex.h"
#include "gtest/gtest.h"

namespace tpushim::logging::log_test {

namespace {
std::atomic<int> test_os_counter{0};
}  // namespace

TestOs::TestOs()
    : OsWrapper(Os::Default()),
      user_(absl::StrCat("tpushimtest", getpid(), "x",
                         test_os_counter.fetch_add(1))) {}

void TestOs::SetNow(absl::Time now) {
  MutexLock lock(&mu_);
  now_ = now;
}

void TestOs::SetMonotonicNanos(int64_t nanos) {
  MutexLock lock(&mu_);
  monotonic_ = nanos;
}

void TestOs::SetProcessId(pid_t pid) {
  MutexLock lock(&mu_);
  pid_ = pid;
}

void TestOs::SetEffectiveUid(uid_t uid) {
  MutexLock lock(&mu_);
  euid_ = uid;
}

void TestOs::SetLivePids(std::set<pid_t> pids) {
  MutexLock lock(&mu_);
  live_pids_ = std::move(pids);
}

void TestOs::FakeLstat(const std::string& path, FileInfo info) {
  MutexLock lock(&mu_);
  lstat_[path] = info;
}

void TestOs::FakeStat(const std::string& path, FileInfo info) {
  MutexLock lock(&mu_);
  stat_[path] = info;
}

void TestOs::FailAccess(const std::string& path, absl::Status status) {
  MutexLock lock(&mu_);
  access_[path] = std::move(status);
}

void TestOs::FailMakeDirectory(const std::string& path, absl::Status status) {
  MutexLock lock(&mu_);
  mkdir_[path] = std::move(status);
}

void TestOs::FailSymlinks(absl::Status status) {
  MutexLock lock(&mu_);
  symlink_status_ = std::move(status);
}

void TestOs::SetDiskFull(bool full) {
  MutexLock lock(&mu_);
  disk_full_ = full;
}

void TestOs::BlockFirstFileWrite(Notification* entered, Notification* release) {
  MutexLock lock(&mu_);
  block_entered_ = entered;
  block_release_ = release;
}

std::string TestOs::fallback_dir() const {
  return absl::StrCat("/tmp/tpu_logs_", user_);
}

absl::Time TestOs::Now() {
  {
    MutexLock lock(&mu_);
    if (now_.has_value()) return *now_;
  }
  return OsWrapper::Now();
}

int64_t TestOs::MonotonicNanos() {
  {
    MutexLock lock(&mu_);
    if (monotonic_.has_value()) return *monotonic_;
  }
  return OsWrapper::MonotonicNanos();
}

pid_t TestOs::ProcessId() {
  MutexLock lock(&mu_);
  return pid_;
}

uid_t TestOs::EffectiveUid() {
  MutexLock lock(&mu_);
  return euid_;
}

bool TestOs::ProcessExists(pid_t pid) {
  MutexLock lock(&mu_);
  return live_pids_.count(pid) != 0;
}

absl::StatusOr<FileInfo> TestOs::Lstat(const std::string& path) {
  {
    MutexLock lock(&mu_);
    auto it = lstat_.find(path);
    if (it != lstat_.end()) return it->second;
  }
  return OsWrapper::Lstat(path);
}

absl::StatusOr<FileInfo> TestOs::Stat(const std::string& path) {
  {
    MutexLock lock(&mu_);
    auto it = stat_.find(path);
    if (it != stat_.end()) return it->second;
  }
  return OsWrapper::Stat(path);
}

absl::Status TestOs::Access(const std::string& path, int mode) {
  {
    MutexLock lock(&mu_);
    auto it = access_.find(path);
    if (it != access_.end()) return it->second;
  }
  return OsWrapper::Access(path, mode);
}

absl::Status TestOs::MakeDirectory(const std::string& path, mode_t mode) {
  {
    MutexLock lock(&mu_);
    auto it = mkdir_.find(path);
    if (it != mkdir_.end()) return it->second;
  }
  return OsWrapper::MakeDirectory(path, mode);
}

absl::Status TestOs::Symlink(const std::string& target,
                             const std::string& link) {
  {
    MutexLock lock(&mu_);
    if (!symlink_status_.ok()) return symlink_status_;
  }
  return OsWrapper::Symlink(target, link);
}

absl::Status TestOs::WriteAll(int fd, const void* data, size_t size) {
  if (fd != STDERR_FILENO) {
    Notification* entered = nullptr;
    Notification* release = nullptr;
    {
      MutexLock lock(&mu_);
      if (disk_full_) {
        (void)OsWrapper::WriteAll(fd, data, size / 2);
        return absl::ErrnoToStatus(ENOSPC, "write");
      }
      std::swap(entered, block_entered_);
      std::swap(release, block_release_);
    }
    if (entered != nullptr) {
      entered->Notify();
      release->WaitForNotification();
    }
  }
  return OsWrapper::WriteAll(fd, data, size);
}

LogConfig TestConfig(const std::string& dir) {
  LogConfig config;
  config.log_dir = dir;
  config.stderr_level = Severity::kFatal;
  return config;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    ADD_FAILURE() << "cannot read " << path;
    return "";
  }
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

std::vector<std::string> SplitLines(absl::string_view text) {
  std::vector<std::string> lines =
      absl::StrSplit(text, '\n', absl::SkipEmpty());
  return lines;
}

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<std::string> ListDirWithPrefix(const std::string& dir,
                                           absl::string_view prefix) {
  std::vector<std::string> names;
  for (std::string& name : ListDir(dir)) {
    if (absl::StartsWith(name, prefix)) names.push_back(std::move(name));
  }
  return names;
}

std::optional<std::string> ReadLink(const std::string& path) {
  char buffer[PATH_MAX];
  const ssize_t n = readlink(path.c_str(), buffer, sizeof(buffer));
  if (n < 0) return std::nullopt;
  return std::string(buffer, static_cast<size_t>(n));
}

Regex::Regex(const char* pattern) {
  const int error = regcomp(&regex_, pattern, REG_EXTENDED);
  if (error != 0) {
    char message[256];
    regerror(error, &regex_, message, sizeof(message));
    ADD_FAILURE() << "regcomp(" << pattern << "): " << message;
    return;
  }
  compiled_ = true;
}

Regex::~Regex() {
  if (compiled_) regfree(&regex_);
}

bool Regex::Search(const std::string& text,
                   std::vector<std::string>* groups) const {
  if (!compiled_) return false;
  std::vector<regmatch_t> matches(regex_.re_nsub + 1);
  if (regexec(&regex_, text.c_str(), matches.size(), matches.data(), 0) != 0) {
    return false;
  }
  if (groups != nullptr) {
    groups->clear();
    for (const regmatch_t& m : matches) {
      groups->push_back(m.rm_so < 0 ? std::string()
                                    : text.substr(m.rm_so, m.rm_eo - m.rm_so));
    }
  }
  return true;
}

std::vector<std::string> Messages(const std::vector<std::string>& lines) {
  static const Regex* const line_regex = new Regex(kLinePattern);
  std::vector<std::string> messages;
  std::vector<std::string> groups;
  for (const std::string& line : lines) {
    if (line_regex->Search(line, &groups)) messages.push_back(groups[5]);
  }
  return messages;
}

std::vector<std::string> LinesContaining(const std::vector<std::string>& lines,
                                         absl::string_view needle) {
  std::vector<std::string> found;
  for (const std::string& line : lines) {
    if (absl::StrContains(line, needle)) found.push_back(line);
  }
  return found;
}

std::string FilePrefix(const TestOs& os, Severity severity) {
  return absl::StrCat("tpu_driver.", TestOs::kHost, ".", os.user(), ".log.",
                      SeverityName(severity), ".");
}

std::string OnlyLogFile(const std::string& dir, const TestOs& os,
                        Severity severity) {
  const std::vector<std::string> files =
      ListDirWithPrefix(dir, FilePrefix(os, severity));
  if (files.size() != 1) {
    ADD_FAILURE() << "expected one " << SeverityName(severity)
                  << " log file in " << dir << ", found " << files.size();
    return "";
  }
  return absl::StrCat(dir, "/", files[0]);
}

std::vector<std::string> BodyLines(const std::string& path) {
  std::vector<std::string> lines = SplitLines(ReadFile(path));
  constexpr size_t kHeaderLines = 6;
  if (lines.size() < kHeaderLines) {
    ADD_FAILURE() << path << " has no complete header";
    return {};
  }
  lines.erase(lines.begin(), lines.begin() + kHeaderLines);
  return lines;
}

pid_t CurrentTid() { return static_cast<pid_t>(syscall(SYS_gettid)); }

}  // namespace tpushim::logging::log_test
