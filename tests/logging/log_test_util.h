// Helpers shared by the logging tests: a temporary directory and stderr
// capture (from tests/testing/), a fake OS layer, and readers for log files
// and lines.
//
// Thread-safety: TestOs is thread-safe (the log writer thread calls it while
// the test changes its fakes); the other helpers belong to the test thread.

#ifndef TPUSHIM_TESTS_LOGGING_LOG_TEST_UTIL_H_
#define TPUSHIM_TESTS_LOGGING_LOG_TEST_UTIL_H_

#include <regex.h>
#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "env/os.h"
#include "logging/log.h"
#include "tests/testing/stderr_capture.h"
#include "tests/testing/temp_dir.h"

namespace tpushim::logging::log_test {

// The glog prefix, byte for byte as libtpu writes it,
//   ^[IWEF]\d{4} \d{2}:\d{2}:\d{2}\.\d{6} [ \d]{7} [^ :]+:\d+\]
// written as a POSIX extended regular expression (\d is [0-9]).
inline constexpr char kPrefixPattern[] =
    "^[IWEF][0-9]{4} [0-9]{2}:[0-9]{2}:[0-9]{2}[.][0-9]{6} [ 0-9]{7} "
    "[^ :]+:[0-9]+] ";
// A whole line, with groups 1 letter, 2 tid field (7 wide), 3 file, 4 line,
// 5 message.
inline constexpr char kLinePattern[] =
    "^([IWEF])[0-9]{4} [0-9]{2}:[0-9]{2}:[0-9]{2}[.][0-9]{6} ([ 0-9]{7}) "
    "([^ :]+):([0-9]+)] (.*)$";

// A POSIX extended regular expression (regcomp; std::regex trips GCC 12's
// -Wmaybe-uninitialized under sanitizers).
class Regex {
 public:
  // A pattern that does not compile is a test failure and matches nothing.
  explicit Regex(const char* pattern);
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  ~Regex();

  // True when the pattern matches somewhere in `text` (use ^ and $ to pin
  // it); then `groups`, if not null, gets the whole match and each group.
  bool Search(const std::string& text,
              std::vector<std::string>* groups = nullptr) const;

 private:
  regex_t regex_;
  bool compiled_ = false;
};

using ::tpushim::testutil::StderrCapture;
using ::tpushim::testutil::TempDir;

// An Os over the real one with a fake identity (host "testhost", a user
// name unique to this object, pid 4242, euid 0 unless set) and fakes for
// clocks, file metadata, permissions and failures. ProcessExists is true
// only for pids marked live.
class TestOs : public OsWrapper {
 public:
  static constexpr pid_t kPid = 4242;
  static constexpr char kHost[] = "testhost";

  TestOs();

  // ---- Fakes (each thread-safe) ----
  // Wall clock; real time until set.
  void SetNow(absl::Time now);
  // Monotonic clock; real until set.
  void SetMonotonicNanos(int64_t nanos);
  void SetProcessId(pid_t pid);
  void SetEffectiveUid(uid_t uid);
  void SetLivePids(std::set<pid_t> pids);
  // Lstat/Stat of `path` return `info` (the real call is not made).
  void FakeLstat(const std::string& path, FileInfo info);
  void FakeStat(const std::string& path, FileInfo info);
  // Access/MakeDirectory of `path` fail with `status`.
  void FailAccess(const std::string& path, absl::Status status);
  void FailMakeDirectory(const std::string& path, absl::Status status);
  // Every Symlink fails with `status` (OK: real again).
  void FailSymlinks(absl::Status status);
  // While set, WriteAll to any descriptor but stderr fails with ENOSPC
  // after writing the first half of its bytes, as a full disk takes what
  // fits.
  void SetDiskFull(bool full);
  // The first WriteAll to a descriptor other than stderr notifies
  // `entered` and waits for `release` before writing. Both must outlive
  // that call.
  void BlockFirstFileWrite(Notification* entered, Notification* release);

  std::string user() const { return user_; }
  // "/tmp/tpu_logs_<user>".
  std::string fallback_dir() const;

  // ---- Os ----
  absl::Time Now() override;
  int64_t MonotonicNanos() override;
  pid_t ProcessId() override;
  uid_t EffectiveUid() override;
  std::string UserName() override { return user_; }
  std::string HostName() override { return kHost; }
  bool ProcessExists(pid_t pid) override;
  absl::StatusOr<FileInfo> Lstat(const std::string& path) override;
  absl::StatusOr<FileInfo> Stat(const std::string& path) override;
  absl::Status Access(const std::string& path, int mode) override;
  absl::Status MakeDirectory(const std::string& path, mode_t mode) override;
  absl::Status Symlink(const std::string& target,
                       const std::string& link) override;
  absl::Status WriteAll(int fd, const void* data, size_t size) override;

 private:
  const std::string user_;

  mutable Mutex mu_;
  std::optional<absl::Time> now_ ABSL_GUARDED_BY(mu_);
  std::optional<int64_t> monotonic_ ABSL_GUARDED_BY(mu_);
  pid_t pid_ ABSL_GUARDED_BY(mu_) = kPid;
  uid_t euid_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<pid_t> live_pids_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, FileInfo> lstat_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, FileInfo> stat_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, absl::Status> access_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, absl::Status> mkdir_ ABSL_GUARDED_BY(mu_);
  absl::Status symlink_status_ ABSL_GUARDED_BY(mu_);
  bool disk_full_ ABSL_GUARDED_BY(mu_) = false;
  Notification* block_entered_ ABSL_GUARDED_BY(mu_) = nullptr;
  Notification* block_release_ ABSL_GUARDED_BY(mu_) = nullptr;
};

// A LogConfig for tests: files in `dir`, nothing on stderr below FATAL,
// everything else default.
LogConfig TestConfig(const std::string& dir);

// Contents of a file; "" (and a test failure) when it cannot be read.
std::string ReadFile(const std::string& path);
// Lines of `text` (without the '\n's).
std::vector<std::string> SplitLines(absl::string_view text);
// Names in `dir` (not "." and ".."), sorted.
std::vector<std::string> ListDir(const std::string& dir);
// Names in `dir` that start with `prefix`, sorted.
std::vector<std::string> ListDirWithPrefix(const std::string& dir,
                                           absl::string_view prefix);
// The target of the symlink `path`; nullopt when it is not one.
std::optional<std::string> ReadLink(const std::string& path);
// The messages (text after "] ") of the lines of `lines` that match
// kLinePattern, in order.
std::vector<std::string> Messages(const std::vector<std::string>& lines);
// Lines of `lines` whose message contains `needle`.
std::vector<std::string> LinesContaining(const std::vector<std::string>& lines,
                                         absl::string_view needle);
// The glog file prefix "tpu_driver.testhost.<user>.log.<SEVERITY>.".
std::string FilePrefix(const TestOs& os, Severity severity);
// The log file of `severity` in `dir` for `os`'s identity: the only one
// (a test failure and "" when there is not exactly one).
std::string OnlyLogFile(const std::string& dir, const TestOs& os,
                        Severity severity);
// The lines after the six header lines of a log file.
std::vector<std::string> BodyLines(const std::string& path);
// gettid(2) of the calling thread.
pid_t CurrentTid();

}  // namespace tpushim::logging::log_test

#endif  // TPUSHIM_TESTS_LOGGING_LOG_TEST_UTIL_H_
