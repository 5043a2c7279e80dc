// Naming, headers and the retention choice for libtpu's glog-format log
// files. Pure functions; the sink that uses them is
// logging/glog_file_sink.h.
//
//   tpu_driver.<host>.<user>.log.<SEVERITY>.<YYYYMMDD-HHMMSS>.<pid>[.<n>]
//
// `.<n>` (n >= 1) is appended when the plain name is already taken.
//
// Thread-safety: pure functions of their arguments (the local time zone is
// read from the process environment).
//
//   std::string name = LogFileName("host", "bob", Severity::kInfo, now, 42);
//   // "tpu_driver.host.bob.log.INFO.20241121-221246.42"

#ifndef TPUSHIM_LOGGING_LOG_FILES_H_
#define TPUSHIM_LOGGING_LOG_FILES_H_

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "logging/build_facts.h"
#include "logging/log.h"

namespace tpushim::logging::internal {

// "tpu_driver.<host>.<user>.log.<SEVERITY>." — what every file name of that
// severity starts with.
std::string LogFilePrefix(absl::string_view host, absl::string_view user,
                          Severity severity);

// The name of a file started at `created` (local time): the prefix, then
// "YYYYMMDD-HHMMSS.<pid>".
std::string LogFileName(absl::string_view host, absl::string_view user,
                        Severity severity, absl::Time created, pid_t pid);

// `name` with the collision suffix `suffix` (0 = none, else ".<suffix>").
std::string WithCollisionSuffix(absl::string_view name, uint64_t suffix);

// "tpu_driver.<SEVERITY>", the symlink to the newest file.
std::string LogSymlinkName(Severity severity);

// libtpu's file header (open glog's, with its "Running duration" line
// replaced by three lines about the binary), six lines each ending in '\n':
//   Log file created at: YYYY/MM/DD HH:MM:SS                (local time)
//   Running on machine: <host>
//   Binary: Built on Mon DD YYYY HH:MM:SS (<Unix seconds>)  (UTC)
//   Binary: Built at <user>@<host>:<path>                   (of `build`)
//   Binary: Built for <target>
//   Log line format: [IWEF]mmdd hh:mm:ss.uuuuuu threadid file:line] msg
// The month is English whatever the locale ("Jan" ... "Dec"), the day two
// digits.
std::string LogFileHeader(absl::Time created, absl::string_view host,
                          const BuildFacts& build);

// What a file name says after LogFilePrefix.
struct LogFileNameParts {
  std::string timestamp;  // "YYYYMMDD-HHMMSS"
  pid_t pid = 0;
  uint64_t suffix = 0;  // the `.n` collision suffix, 0 without one
};

// Parses `name` as `prefix` + "YYYYMMDD-HHMMSS.<pid>[.<n>]". nullopt for
// any other name (another severity, host or user, the symlink, a stray
// file).
std::optional<LogFileNameParts> ParseLogFileName(absl::string_view name,
                                                 absl::string_view prefix);

// Retention: of the `names` in a log directory, which log files of `prefix`
// to delete so that at most `keep` remain besides `current` (which is never
// chosen). Candidates are taken oldest first — by timestamp, then suffix,
// then pid, then name — and one is chosen only if `may_delete(name, pid)`;
// the ones it refuses still count as remaining.
std::vector<std::string> ChooseLogFilesToDelete(
    const std::vector<std::string>& names, absl::string_view prefix,
    absl::string_view current, int keep,
    absl::FunctionRef<bool(const std::string& name, pid_t pid)> may_delete);

}  // namespace tpushim::logging::internal

#endif  // TPUSHIM_LOGGING_LOG_FILES_H_
