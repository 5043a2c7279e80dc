// The absl/glog line format, byte for byte, and the spdlog formatter that
// writes it:
//
//   I1121 22:12:46.123456   62136 premapped_region.cc:88] Starting ...
//
// severity letter, local month and day, local time with microseconds, the
// kernel thread id of the logging thread right-aligned to 7, the base name
// of the source file, the line, "] " and the message, ending in '\n'.
//
// Thread-safety: a GlogFormatter keeps a one-second local-time cache and is
// used by one thread at a time (spdlog sinks call it under their mutex;
// clone() one per sink). The free functions are thread-safe.
//
//   GlogFormatter formatter;
//   spdlog::memory_buf_t line;
//   formatter.format(msg, line);

#ifndef TPUSHIM_LOGGING_GLOG_FORMAT_H_
#define TPUSHIM_LOGGING_GLOG_FORMAT_H_

#include <ctime>
#include <memory>

#include "absl/strings/string_view.h"
#include "env/os.h"
#include "logging/log.h"
#include "spdlog/common.h"
#include "spdlog/details/log_msg.h"
#include "spdlog/formatter.h"

namespace tpushim::logging::internal {

// funcname tags on spdlog::source_loc that the sinks recognise by pointer.
// A message tagged kNotOnStderrTag goes to the log files only (it was
// already written to stderr by the caller); one tagged kFlushBarrierTag is a
// flush barrier (logging/log_state.h), never written anywhere.
inline constexpr char kNotOnStderrTag[] = "tpushim-not-on-stderr";
inline constexpr char kFlushBarrierTag[] = "tpushim-flush-barrier";

// INFO -> info, WARNING -> warn, ERROR -> err, FATAL -> critical.
spdlog::level::level_enum ToSpdlogLevel(Severity severity);
// 'I', 'W', 'E' or 'F' for a spdlog level (trace and debug are 'I').
char SeverityLetter(spdlog::level::level_enum level);

// The part of `path` after its last '/'.
absl::string_view BaseName(absl::string_view path);

class GlogFormatter final : public spdlog::formatter {
 public:
  GlogFormatter() = default;

  // Appends the full line for `msg` to `dest`: the prefix, the payload and a
  // '\n' unless the payload already ends with one. `msg.source.filename`
  // may be a path or null ("unknown"); `msg.time` is shown in local time.
  void format(const spdlog::details::log_msg& msg,
              spdlog::memory_buf_t& dest) override;
  std::unique_ptr<spdlog::formatter> clone() const override;

 private:
  // localtime_r of `cached_second_`.
  std::time_t cached_second_ = -1;
  std::tm cached_tm_{};
};

// Formats `msg` as one line and writes it to stderr through `os`. A failed
// write is ignored: there is nowhere left to report it.
void WriteToStderr(Os& os, const spdlog::details::log_msg& msg);

// A diagnostic about logging itself: one line at `severity`, stamped now,
// with the calling thread's id and attributed to `file` (__FILE__) and
// `line`, written straight to stderr through `os`.
void WriteDiagnosticToStderr(Os& os, Severity severity,
                             absl::string_view message, const char* file,
                             int line);

}  // namespace tpushim::logging::internal

#endif  // TPUSHIM_LOGGING_GLOG_FORMAT_H_
