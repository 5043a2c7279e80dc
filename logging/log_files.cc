#include "logging/log_files.h"

#include <algorithm>
#include <limits>
#include <tuple>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/time/civil_time.h"

namespace tpushim::logging::internal {
namespace {

constexpr absl::string_view kProgram = "tpu_driver";
// "YYYYMMDD-HHMMSS"
constexpr size_t kTimestampLength = 15;

bool AllDigits(absl::string_view text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return absl::ascii_isdigit(c);
  });
}

bool IsTimestamp(absl::string_view text) {
  return text.size() == kTimestampLength && text[8] == '-' &&
         AllDigits(text.substr(0, 8)) && AllDigits(text.substr(9));
}

}  // namespace

std::string LogFilePrefix(absl::string_view host, absl::string_view user,
                          Severity severity) {
  return absl::StrCat(kProgram, ".", host, ".", user, ".log.",
                      SeverityName(severity), ".");
}

std::string LogFileName(absl::string_view host, absl::string_view user,
                        Severity severity, absl::Time created, pid_t pid) {
  return absl::StrCat(
      LogFilePrefix(host, user, severity),
      absl::FormatTime("%Y%m%d-%H%M%S", created, absl::LocalTimeZone()), ".",
      pid);
}

std::string WithCollisionSuffix(absl::string_view name, uint64_t suffix) {
  if (suffix == 0) return std::string(name);
  return absl::StrCat(name, ".", suffix);
}

std::string LogSymlinkName(Severity severity) {
  return absl::StrCat(kProgram, ".", SeverityName(severity));
}

std::string LogFileHeader(absl::Time created, absl::string_view host,
                          const BuildFacts& build) {
  static constexpr absl::string_view kMonths[] = {"Jan", "Feb", "Mar", "Apr",
                                                  "May", "Jun", "Jul", "Aug",
                                                  "Sep", "Oct", "Nov", "Dec"};
  const absl::CivilSecond built =
      absl::ToCivilSecond(build.built, absl::UTCTimeZone());
  return absl::StrFormat(
      "Log file created at: %s\n"
      "Running on machine: %s\n"
      "Binary: Built on %s %02d %04d %02d:%02d:%02d (%d)\n"
      "Binary: Built at %s@%s:%s\n"
      "Binary: Built for %s\n"
      "Log line format: [IWEF]mmdd hh:mm:ss.uuuuuu threadid file:line] msg\n",
      absl::FormatTime("%Y/%m/%d %H:%M:%S", created, absl::LocalTimeZone()),
      host, kMonths[built.month() - 1], built.day(), built.year(), built.hour(),
      built.minute(), built.second(), absl::ToUnixSeconds(build.built),
      build.user, build.host, build.path, build.target);
}

std::optional<LogFileNameParts> ParseLogFileName(absl::string_view name,
                                                 absl::string_view prefix) {
  if (!absl::ConsumePrefix(&name, prefix)) return std::nullopt;
  if (name.size() < kTimestampLength + 2) return std::nullopt;
  LogFileNameParts parts;
  const absl::string_view timestamp = name.substr(0, kTimestampLength);
  if (!IsTimestamp(timestamp) || name[kTimestampLength] != '.') {
    return std::nullopt;
  }
  parts.timestamp = std::string(timestamp);
  name.remove_prefix(kTimestampLength + 1);

  const size_t dot = name.find('.');
  const absl::string_view pid_text = name.substr(0, dot);
  uint64_t pid = 0;
  if (!AllDigits(pid_text) || !absl::SimpleAtoi(pid_text, &pid) ||
      pid > static_cast<uint64_t>(std::numeric_limits<pid_t>::max())) {
    return std::nullopt;
  }
  parts.pid = static_cast<pid_t>(pid);
  if (dot != absl::string_view::npos) {
    const absl::string_view suffix_text = name.substr(dot + 1);
    if (!AllDigits(suffix_text) ||
        !absl::SimpleAtoi(suffix_text, &parts.suffix) || parts.suffix == 0) {
      return std::nullopt;
    }
  }
  return parts;
}

std::vector<std::string> ChooseLogFilesToDelete(
    const std::vector<std::string>& names, absl::string_view prefix,
    absl::string_view current, int keep,
    absl::FunctionRef<bool(const std::string& name, pid_t pid)> may_delete) {
  struct Candidate {
    LogFileNameParts parts;
    const std::string* name;
  };
  std::vector<Candidate> candidates;
  for (const std::string& name : names) {
    if (name == current) continue;
    std::optional<LogFileNameParts> parts = ParseLogFileName(name, prefix);
    if (parts.has_value()) candidates.push_back({*std::move(parts), &name});
  }
  const size_t kept = static_cast<size_t>(std::max(keep, 0));
  if (candidates.size() <= kept) return {};
  std::sort(candidates.begin(), candidates.end(),
            [](const Candidate& a, const Candidate& b) {
              return std::tie(a.parts.timestamp, a.parts.suffix, a.parts.pid,
                              *a.name) < std::tie(b.parts.timestamp,
                                                  b.parts.suffix, b.parts.pid,
                                                  *b.name);
            });
  size_t excess = candidates.size() - kept;
  std::vector<std::string> chosen;
  for (const Candidate& candidate : candidates) {
    if (excess == 0) break;
    if (may_delete(*candidate.name, candidate.parts.pid)) {
      chosen.push_back(*candidate.name);
      --excess;
    }
  }
  return chosen;
}

}  // namespace tpushim::logging::internal
