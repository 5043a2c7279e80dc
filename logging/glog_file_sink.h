// The spdlog sink behind one severity's libtpu-style glog log files: it
// creates `tpu_driver.<host>.<user>.log.<SEVERITY>.<YYYYMMDD-HHMMSS>.<pid>`
// lazily, writes libtpu's header, points `tpu_driver.<SEVERITY>` at it,
// applies retention, rotates at a size, and survives every file-system
// failure (see logging/log.h for the policy it implements).
//
// Which messages reach it is spdlog's sink level: info for the INFO file,
// warn for WARNING, err for ERROR (critical, i.e. FATAL, passes all three).
//
// Thread-safety: spdlog calls it under base_sink's mutex (from the writer
// thread, in practice); Close() takes the same mutex. Every file operation
// goes through the Os in LogFileSettings.
//
//   auto sink = std::make_shared<GlogFileSink>(Severity::kInfo, settings,
//                                              &lost_lines);
//   sink->set_level(spdlog::level::info);

#ifndef TPUSHIM_LOGGING_GLOG_FILE_SINK_H_
#define TPUSHIM_LOGGING_GLOG_FILE_SINK_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "env/os.h"
#include "logging/build_facts.h"
#include "logging/log.h"
#include "spdlog/details/log_msg.h"
#include "spdlog/sinks/base_sink.h"

namespace tpushim::logging::internal {

// What a file sink needs to name, start and retire its files.
struct LogFileSettings {
  Os* os = nullptr;  // not owned; must outlive the sink
  std::string directory;
  std::string host;
  std::string user;
  pid_t pid = 0;
  BuildFacts build;  // what the header's "Binary:" lines say
  uint64_t max_file_bytes = 0;
  int keep = 0;
};

class GlogFileSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  // After a file could not be created, the next attempt is made by the
  // first message at least this long afterwards (Os::MonotonicNanos).
  static constexpr absl::Duration kRecreateInterval = absl::Seconds(60);
  // Collision suffixes tried for one name before giving up.
  static constexpr int kMaxNameAttempts = 1000;

  // `lost_lines` (not owned, must outlive the sink) counts lines this sink
  // had to drop. REQUIRES: settings.os != nullptr, max_file_bytes > 0,
  // severity below FATAL.
  GlogFileSink(Severity severity, LogFileSettings settings,
               std::atomic<uint64_t>* lost_lines);
  // Closes the current file.
  ~GlogFileSink() override;

  // Closes the current file, if any; a later message starts a new one.
  void Close();

 protected:
  // Writes the formatted line, starting a file first if there is none.
  void sink_it_(const spdlog::details::log_msg& msg) override;
  // Nothing to do: every line reaches the kernel as it is written.
  void flush_() override {}

 private:
  // Starts a file unless one is open or a failed attempt was too recent.
  // True when a file is open afterwards.
  bool EnsureOpenLocked();
  // Creates the file under a free name; on success sets fd_ and path_.
  absl::Status CreateFileLocked(const std::string& stem);
  // Writes `data` to the open file; reports the first failure of a run.
  bool WriteLocked(absl::string_view data);
  void CloseLocked();
  void UpdateSymlinkLocked(const std::string& name);
  void DeleteOldFilesLocked(const std::string& current);

  // Constant after construction.
  const Severity severity_;
  const LogFileSettings settings_;
  std::atomic<uint64_t>* const lost_lines_;

  // Protected by base_sink::mutex_ (held by spdlog around sink_it_).
  int fd_ = -1;
  std::string path_;
  uint64_t bytes_ = 0;  // the file's size: what was written, whole lines
  // Stem of the last name tried and the next collision suffix for it.
  std::string last_stem_;
  uint64_t next_suffix_ = 0;
  // Set after a failed creation: no new attempt before this time.
  std::optional<int64_t> recreate_after_ns_;
  // One WARNING per run of failures of each kind.
  bool create_failure_reported_ = false;
  bool write_failure_reported_ = false;
  bool symlink_failure_reported_ = false;
};

}  // namespace tpushim::logging::internal

#endif  // TPUSHIM_LOGGING_GLOG_FILE_SINK_H_
