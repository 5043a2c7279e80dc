#include "logging/glog_format.h"

#include <unistd.h>

#include <chrono>
#include <iterator>

#include "fmt/format.h"

namespace tpushim::logging::internal {

spdlog::level::level_enum ToSpdlogLevel(Severity severity) {
  switch (severity) {
    case Severity::kInfo:
      return spdlog::level::info;
    case Severity::kWarning:
      return spdlog::level::warn;
    case Severity::kError:
      return spdlog::level::err;
    case Severity::kFatal:
      return spdlog::level::critical;
  }
  return spdlog::level::info;
}

char SeverityLetter(spdlog::level::level_enum level) {
  switch (level) {
    case spdlog::level::warn:
      return 'W';
    case spdlog::level::err:
      return 'E';
    case spdlog::level::critical:
      return 'F';
    default:
      return 'I';
  }
}

absl::string_view BaseName(absl::string_view path) {
  const size_t slash = path.rfind('/');
  return slash == absl::string_view::npos ? path : path.substr(slash + 1);
}

void GlogFormatter::format(const spdlog::details::log_msg& msg,
                           spdlog::memory_buf_t& dest) {
  using std::chrono::duration_cast;
  const auto since_epoch = msg.time.time_since_epoch();
  const auto seconds = duration_cast<std::chrono::seconds>(since_epoch);
  const auto micros =
      duration_cast<std::chrono::microseconds>(since_epoch - seconds);
  const std::time_t second = static_cast<std::time_t>(seconds.count());
  if (second != cached_second_) {
    localtime_r(&second, &cached_tm_);
    cached_second_ = second;
  }
  const absl::string_view base = msg.source.filename != nullptr
                                     ? BaseName(msg.source.filename)
                                     : absl::string_view("unknown");
  const fmt::string_view file(base.data(), base.size());
  fmt::format_to(std::back_inserter(dest),
                 FMT_STRING("{}{:02d}{:02d} {:02d}:{:02d}:{:02d}.{:06d} {:7d} "
                            "{}:{}] "),
                 SeverityLetter(msg.level), cached_tm_.tm_mon + 1,
                 cached_tm_.tm_mday, cached_tm_.tm_hour, cached_tm_.tm_min,
                 cached_tm_.tm_sec, micros.count(), msg.thread_id, file,
                 msg.source.line);
  dest.append(msg.payload.data(), msg.payload.data() + msg.payload.size());
  if (msg.payload.size() == 0 ||
      msg.payload.data()[msg.payload.size() - 1] != '\n') {
    dest.push_back('\n');
  }
}

std::unique_ptr<spdlog::formatter> GlogFormatter::clone() const {
  return std::make_unique<GlogFormatter>();
}

void WriteToStderr(Os& os, const spdlog::details::log_msg& msg) {
  GlogFormatter formatter;
  spdlog::memory_buf_t line;
  formatter.format(msg, line);
  (void)os.WriteAll(STDERR_FILENO, line.data(), line.size());
}

void WriteDiagnosticToStderr(Os& os, Severity severity,
                             absl::string_view message, const char* file,
                             int line) {
  const spdlog::details::log_msg msg(
      spdlog::source_loc(file, line, nullptr),
      /*logger_name=*/"", ToSpdlogLevel(severity),
      spdlog::string_view_t(message.data(), message.size()));
  WriteToStderr(os, msg);
}

}  // namespace tpushim::logging::internal
