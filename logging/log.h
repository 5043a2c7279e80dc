// libtpu-compatible logging: glog/absl line format, glog file names,
// libtpu's file header, `tpu_driver.<SEVERITY>` symlinks, per-severity
// files, stderr threshold, TPU_VMODULE, size rotation and retention — on
// spdlog's asynchronous logger, so no caller ever waits for the disk.
//
//   LOG(INFO) << "Starting premapped memory manager initialization...";
//   LOG(WARNING) << "mlock failed: " << status;
//   VLOG(2) << "descriptor " << id << " done";   // on with TPU_VMODULE
//   LOG(FATAL) << "corrupt allocator state";      // logs, flushes, aborts
//
// Lines look like
//   I1121 22:12:46.123456   62136 premapped_region.cc:88] Starting ...
// with the kernel thread id of the logging thread right-aligned to 7.
//
// Logging is process-wide. Before InitLogging (or after ShutdownLogging)
// messages at or above ERROR go to stderr in the same format, and the rest
// are dropped. InitLogging may be called again to reconfigure (tests do);
// it flushes and replaces the previous configuration.
//
// Thread-safety: LOG/VLOG are safe from any thread at any time, including
// concurrently with InitLogging/ShutdownLogging. They never block on disk
// I/O: when the queue to the writer thread is full, the oldest queued
// messages are dropped and counted (DroppedMessageCount), and a WARNING
// saying how many is logged when the queue drains (unless WARNING is below
// min_level).
//
// Files (one set per InitLogging, created lazily by the first message that
// goes to them, always with Os::CreateLogFile, which never follows a
// symlink):
//  * `tpu_driver.<host>.<user>.log.<SEVERITY>.<YYYYMMDD-HHMMSS>.<pid>` for
//    SEVERITY in INFO (every message), WARNING (WARNING and above) and ERROR
//    (ERROR and above); FATAL goes to all three. When that name is taken
//    (two files of one severity started in the same second, e.g. fast
//    rotation or a re-InitLogging), `.1`, `.2`, ... is appended.
//  * Each starts with libtpu's six header lines: when it was created, the
//    host, three "Binary:" lines about the build (LogConfig::build), and
//    the line format (logging/log_files.h, LogFileHeader).
//  * After a file is started, `tpu_driver.<SEVERITY>` (a relative symlink,
//    replaced atomically through rename) points at it (if that fails,
//    logging goes on, with one WARNING per severity and InitLogging), and
//    older files of the same severity, host and user are deleted, oldest
//    first (by the timestamp in the name, then the `.N` suffix), until at
//    most `LogConfig::keep` remain besides the current one — except files
//    of other live processes and files this process still has open.
//  * A file that reaches `max_file_bytes` is closed; the next message of
//    that severity starts a new one.
//  * A file that cannot be created leaves its severity without a file
//    (its messages still reach stderr if at or above `stderr_level`) with
//    one WARNING on stderr; creation is retried on the first message at
//    least 60 s (Os::MonotonicNanos) after the failure, or at the next
//    InitLogging.
//  * A failed write (disk full) drops that line — none of it stays in the
//    file — and counts it (FileWriteErrorCount); the first failure after a
//    success writes one WARNING to stderr, and later lines are tried again
//    as they come.
//
// Diagnostics about logging itself (a directory fallback, a file that
// cannot be created or written, a symlink that cannot be updated) are
// glog-format WARNING lines written straight to stderr whatever the levels;
// the directory fallback one also goes to the files (if min_level allows).

#ifndef TPUSHIM_LOGGING_LOG_H_
#define TPUSHIM_LOGGING_LOG_H_

#include <atomic>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "env/options.h"
#include "env/os.h"
#include "logging/build_facts.h"

namespace tpushim::logging {

enum class Severity : int { kInfo = 0, kWarning = 1, kError = 2, kFatal = 3 };

// "INFO", "WARNING", "ERROR", "FATAL".
absl::string_view SeverityName(Severity severity);

struct LogConfig {
  // Directory for log files; empty = no files (TPU_LOG_DIR=disabled).
  std::string log_dir = "/tmp/tpu_logs";
  Severity min_level = Severity::kInfo;      // below it nothing is logged
  Severity stderr_level = Severity::kError;  // at or above also on stderr
  std::vector<VmoduleEntry> vmodule;
  uint64_t max_file_bytes = uint64_t{1024} << 20;  // rotate at this size
  int keep = 5;  // rotated files kept per severity
  // Queue between callers and the writer thread, in messages.
  size_t queue_size = 8192;
  // What the files' "Binary:" header lines say; tests put their own.
  BuildFacts build = ThisBuild();

  static LogConfig FromOptions(const Options& options);
};

// Configures process-wide logging, all file and stderr I/O through `os`
// (which must outlive logging; Os::Default() does). Chooses the directory:
// the configured one if usable (creating it, mode 0755, when only
// the leaf is missing), else /tmp/tpu_logs_<user> (created 0700), else
// stderr only. Usable means: a directory, or a symlink owned by the
// effective uid or root that leads to one; owned by the effective uid or
// root; writable and searchable (Os::Access). On a fallback it writes one
// WARNING saying what happened and why to stderr, and into the log files
// when there are any. Never fails because of the directory; returns
// INVALID_ARGUMENT only for a config it cannot use (queue_size 0,
// max_file_bytes 0, keep < 0, a level outside INFO..FATAL) or a null `os`,
// keeping the previous configuration then; INTERNAL when the writer thread
// cannot start. The first successful call also registers an
// atexit() handler that flushes whatever is queued at exit.
absl::Status InitLogging(const LogConfig& config, Os* os = Os::Default());

// Writes everything queued, closes the files and returns to the pre-init
// state. Safe to call when not initialized.
void ShutdownLogging();

// Blocks until every message logged before the call is written (or
// `timeout` passes: returns false then).
bool FlushLogs(absl::Duration timeout = absl::Seconds(10));

// True between a successful InitLogging and ShutdownLogging.
bool LoggingInitialized();

// The directory log files go to, "" when there are none (disabled, or
// fallen back to stderr only).
std::string ActiveLogDirectory();

// Messages dropped because the writer's queue was full, since InitLogging;
// 0 when not initialized.
uint64_t DroppedMessageCount();

// Lines a log file should have received but did not, because the file could
// not be created or the write failed, since InitLogging; 0 when not
// initialized.
uint64_t FileWriteErrorCount();

// True when VLOG(level) is on for the source file `file` (a path or base
// name): the first TPU_VMODULE entry whose glob (`*` any run of characters,
// `?` any one character, matched against the whole name) matches the base
// name without extension (up to its first '.') or the base name with it
// has a level >= `level`, and INFO is at or above the minimum level. With no
// matching entry VLOG is off, VLOG(0) included. Not cached (see VLOG_IS_ON).
bool VlogIsOn(int level, const char* file);

namespace internal {

// One message being streamed; submits it on destruction. `file` must be a
// string that lives forever (__FILE__). For FATAL (when the severity is
// only known at run time) the destructor does what ~LogMessageFatal does.
class LogMessage {
 public:
  LogMessage(const char* file, int line, Severity severity);
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  ~LogMessage();

  std::ostream& stream() { return stream_; }

 protected:
  const char* const file_;
  const int line_;
  const Severity severity_;
  std::ostringstream stream_;
};

// LOG(FATAL): on destruction writes the message to the log files, waits
// (bounded) until everything logged before it is written, writes it to
// stderr and calls abort(). The destructor never returns, so LOG(FATAL) may
// end a value-returning function.
class LogMessageFatal : public LogMessage {
 public:
  LogMessageFatal(const char* file, int line);
  [[noreturn]] ~LogMessageFatal();
};

// Writes a FATAL message as ~LogMessageFatal describes, then aborts.
[[noreturn]] void LogFatalAndAbort(const char* file, int line,
                                   absl::string_view message);

// True when a message of `severity` would go anywhere (min level).
bool SeverityEnabled(Severity severity);

// Per-call-site cache of the VLOG level; revalidated when the vmodule
// configuration changes (InitLogging and ShutdownLogging bump a generation
// counter). `level` -1 means off.
struct VlogSite {
  std::atomic<int> level{-1};
  std::atomic<uint64_t> generation{0};
};
bool VlogSiteIsOn(VlogSite& site, int level, const char* file);

// Lets `LOG(...) << x` appear as a statement in a conditional.
struct Voidify {
  void operator&(std::ostream&) {}
};

}  // namespace internal
}  // namespace tpushim::logging

#define TPUSHIM_LOG_SEVERITY_INFO ::tpushim::logging::Severity::kInfo
#define TPUSHIM_LOG_SEVERITY_WARNING ::tpushim::logging::Severity::kWarning
#define TPUSHIM_LOG_SEVERITY_ERROR ::tpushim::logging::Severity::kError
#define TPUSHIM_LOG_SEVERITY_FATAL ::tpushim::logging::Severity::kFatal

// A message at a severity known at run time (FATAL aborts, but the
// compiler does not know it).
#define TPUSHIM_LOG_AT(file, line, severity)                               \
  !::tpushim::logging::internal::SeverityEnabled(severity)                 \
      ? (void)0                                                            \
      : ::tpushim::logging::internal::Voidify() &                          \
            ::tpushim::logging::internal::LogMessage(file, line, severity) \
                .stream()

#define TPUSHIM_LOG_INFO \
  TPUSHIM_LOG_AT(__FILE__, __LINE__, TPUSHIM_LOG_SEVERITY_INFO)
#define TPUSHIM_LOG_WARNING \
  TPUSHIM_LOG_AT(__FILE__, __LINE__, TPUSHIM_LOG_SEVERITY_WARNING)
#define TPUSHIM_LOG_ERROR \
  TPUSHIM_LOG_AT(__FILE__, __LINE__, TPUSHIM_LOG_SEVERITY_ERROR)
// FATAL is always enabled and unconditional, so that the compiler sees the
// [[noreturn]] destructor on every path.
#define TPUSHIM_LOG_FATAL                                               \
  ::tpushim::logging::internal::Voidify() &                             \
      ::tpushim::logging::internal::LogMessageFatal(__FILE__, __LINE__) \
          .stream()

// LOG(INFO|WARNING|ERROR|FATAL) << ...;
#define LOG(severity) TPUSHIM_LOG_##severity

// True when VLOG(level) is on at this call site. The lambda gives every
// call site its own cached level.
#define VLOG_IS_ON(level)                                                      \
  ([](int vlog_level_, const char* vlog_file_) {                               \
    static ::tpushim::logging::internal::VlogSite vlog_site_;                  \
    return ::tpushim::logging::internal::VlogSiteIsOn(vlog_site_, vlog_level_, \
                                                      vlog_file_);             \
  }((level), __FILE__))

// VLOG(n) << ...; logged at INFO when TPU_VMODULE enables level n for this
// source file.
#define VLOG(level)                                                      \
  !VLOG_IS_ON(level)                                                     \
      ? (void)0                                                          \
      : ::tpushim::logging::internal::Voidify() &                        \
            ::tpushim::logging::internal::LogMessage(                    \
                __FILE__, __LINE__, ::tpushim::logging::Severity::kInfo) \
                .stream()

#endif  // TPUSHIM_LOGGING_LOG_H_
