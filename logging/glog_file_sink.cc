#include "logging/glog_file_sink.h"

#include <set>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/mutex.h"
#include "logging/glog_format.h"
#include "logging/log_files.h"

namespace tpushim::logging::internal {
namespace {

// The log files this process has open (or is creating), by full path, so
// that retention — possibly run by another configuration's sink in this
// process — never deletes one. Never destroyed.
class OpenLogFiles {
 public:
  static OpenLogFiles& Get() {
    static OpenLogFiles* const files = new OpenLogFiles();
    return *files;
  }

  void Add(const std::string& path) ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    paths_.insert(path);
  }
  void Remove(const std::string& path) ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    paths_.erase(path);
  }
  bool Contains(const std::string& path) ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    return paths_.count(path) != 0;
  }

 private:
  Mutex mu_;
  std::set<std::string> paths_ ABSL_GUARDED_BY(mu_);
};

std::string JoinPath(const std::string& dir, absl::string_view name) {
  return absl::StrCat(dir, "/", name);
}

// Distinguishes temporary symlink names of concurrent sinks in one process.
std::atomic<uint64_t> temp_symlink_counter{0};

}  // namespace

GlogFileSink::GlogFileSink(Severity severity, LogFileSettings settings,
                           std::atomic<uint64_t>* lost_lines)
    : spdlog::sinks::base_sink<std::mutex>(std::make_unique<GlogFormatter>()),
      severity_(severity),
      settings_(std::move(settings)),
      lost_lines_(lost_lines) {}

GlogFileSink::~GlogFileSink() { Close(); }

void GlogFileSink::Close() {
  std::lock_guard<std::mutex> lock(mutex_);
  CloseLocked();
}

void GlogFileSink::sink_it_(const spdlog::details::log_msg& msg) {
  if (!EnsureOpenLocked()) {
    lost_lines_->fetch_add(1, std::memory_order_relaxed);
    return;
  }
  spdlog::memory_buf_t line;
  formatter_->format(msg, line);
  if (!WriteLocked(absl::string_view(line.data(), line.size()))) {
    lost_lines_->fetch_add(1, std::memory_order_relaxed);
    return;
  }
  if (bytes_ >= settings_.max_file_bytes) CloseLocked();
}

bool GlogFileSink::EnsureOpenLocked() {
  if (fd_ >= 0) return true;
  Os& os = *settings_.os;
  const int64_t now_ns = os.MonotonicNanos();
  if (recreate_after_ns_.has_value() && now_ns < *recreate_after_ns_) {
    return false;
  }
  const absl::Time created = os.Now();
  const absl::Status status = CreateFileLocked(LogFileName(
      settings_.host, settings_.user, severity_, created, settings_.pid));
  if (!status.ok()) {
    recreate_after_ns_ = now_ns + absl::ToInt64Nanoseconds(kRecreateInterval);
    if (!create_failure_reported_) {
      create_failure_reported_ = true;
      WriteDiagnosticToStderr(
          os, Severity::kWarning,
          absl::StrCat("Could not create the ", SeverityName(severity_),
                       " log file in ", settings_.directory, ": ",
                       status.ToString(), "; ", SeverityName(severity_),
                       " log lines go to stderr only (at or above the stderr "
                       "level) until a new attempt, at most one every ",
                       absl::FormatDuration(kRecreateInterval), ", succeeds"),
          __FILE__, __LINE__);
    }
    return false;
  }
  recreate_after_ns_.reset();
  create_failure_reported_ = false;

  const std::string name(BaseName(path_));
  const std::string header =
      LogFileHeader(created, settings_.host, settings_.build);
  bytes_ = 0;
  // A header that cannot be written is reported like any failed write; the
  // lines after it may still get through.
  (void)WriteLocked(header);
  UpdateSymlinkLocked(name);
  DeleteOldFilesLocked(name);
  return true;
}

absl::Status GlogFileSink::CreateFileLocked(const std::string& stem) {
  if (stem != last_stem_) {
    last_stem_ = stem;
    next_suffix_ = 0;
  }
  absl::Status status;
  for (int attempt = 0; attempt < kMaxNameAttempts; ++attempt) {
    std::string path =
        JoinPath(settings_.directory, WithCollisionSuffix(stem, next_suffix_));
    ++next_suffix_;
    // Registered before it exists, so no retention pass can see it
    // unregistered.
    OpenLogFiles::Get().Add(path);
    absl::StatusOr<int> fd = settings_.os->CreateLogFile(path);
    if (fd.ok()) {
      fd_ = *fd;
      path_ = std::move(path);
      return absl::OkStatus();
    }
    OpenLogFiles::Get().Remove(path);
    status = fd.status();
    if (!absl::IsAlreadyExists(status)) break;
  }
  return status;
}

bool GlogFileSink::WriteLocked(absl::string_view data) {
  const absl::Status status =
      settings_.os->WriteAll(fd_, data.data(), data.size());
  if (!status.ok()) {
    // A full disk takes what fits of the line: cut that off, so the file
    // holds whole lines only and a later line does not continue a torn one.
    (void)settings_.os->Truncate(fd_, bytes_);
    if (!write_failure_reported_) {
      write_failure_reported_ = true;
      WriteDiagnosticToStderr(
          *settings_.os, Severity::kWarning,
          absl::StrCat("Could not write to log file ", path_, ": ",
                       status.ToString(),
                       "; dropping log lines until writes succeed again"),
          __FILE__, __LINE__);
    }
    return false;
  }
  write_failure_reported_ = false;
  bytes_ += data.size();
  return true;
}

void GlogFileSink::CloseLocked() {
  if (fd_ < 0) return;
  (void)settings_.os->Close(fd_);
  OpenLogFiles::Get().Remove(path_);
  fd_ = -1;
  path_.clear();
  bytes_ = 0;
}

void GlogFileSink::UpdateSymlinkLocked(const std::string& name) {
  Os& os = *settings_.os;
  const std::string link_name = LogSymlinkName(severity_);
  const std::string link = JoinPath(settings_.directory, link_name);
  // A hidden name of our own, renamed over the link so that readers always
  // find a link: the old one or the new one.
  const std::string temp =
      JoinPath(settings_.directory,
               absl::StrCat(".", link_name, ".", settings_.pid, ".",
                            temp_symlink_counter.fetch_add(1), ".tmp"));
  (void)os.Unlink(temp);  // left over by a crashed process with our pid
  absl::Status status = os.Symlink(name, temp);
  if (status.ok()) {
    status = os.Rename(temp, link);
    if (!status.ok()) (void)os.Unlink(temp);
  }
  if (!status.ok() && !symlink_failure_reported_) {
    symlink_failure_reported_ = true;
    WriteDiagnosticToStderr(os, Severity::kWarning,
                            absl::StrCat("Could not point symlink ", link,
                                         " at ", name, ": ", status.ToString()),
                            __FILE__, __LINE__);
  }
}

void GlogFileSink::DeleteOldFilesLocked(const std::string& current) {
  Os& os = *settings_.os;
  absl::StatusOr<std::vector<std::string>> names =
      os.ListDirectory(settings_.directory);
  if (!names.ok()) return;  // retention is best effort; logging goes on
  const std::vector<std::string> doomed = ChooseLogFilesToDelete(
      *names, LogFilePrefix(settings_.host, settings_.user, severity_), current,
      settings_.keep, [&](const std::string& name, pid_t pid) {
        if (pid != settings_.pid && os.ProcessExists(pid)) return false;
        return !OpenLogFiles::Get().Contains(
            JoinPath(settings_.directory, name));
      });
  for (const std::string& name : doomed) {
    (void)os.Unlink(JoinPath(settings_.directory, name));
  }
}

}  // namespace tpushim::logging::internal
