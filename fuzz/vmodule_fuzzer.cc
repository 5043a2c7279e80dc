// Fuzz target for TPU_VMODULE (env/options.h ParseVmodule,
// logging/vmodule.h, logging/log.h VlogIsOn and VLOG_IS_ON): parsing, glob
// matching against source file names, and the levels logging then answers.
//
// Input: text lines separated by '\n'. The first line is the TPU_VMODULE
// value (e.g. `premapped_*=2, *=1`); each further line is a source file
// path to ask about (e.g. `allocator/premapped_region.cc`).
//
// Asserted, beyond "no crash, leak or undefined behaviour":
//  * Parsing never fails. Each non-blank comma-separated entry gives, in
//    order, either one entry — when it is `<glob>=<level>` with a non-empty
//    glob and a decimal level in [0, INT_MAX], glob and level trimmed — or
//    one warning naming it (`TPU_VMODULE entry "<entry>" ignored: ...`);
//    blank entries give neither. ResolveOptions gives the same entries and
//    warnings, and logging's configuration the same entries.
//  * Parsing is deterministic, the same with or without a warnings vector,
//    and the entries written back as `glob=level,...` parse to the same
//    entries without warnings.
//  * GlobMatch agrees with a reference matcher (dynamic programming over
//    pattern and text, a different algorithm), so VmoduleLevel is the level
//    of the first entry whose glob matches the file's base name without
//    extension, or with it, and -1 when none does.
//  * With logging configured from the entries, VlogIsOn(n, file) is true
//    exactly for n <= that level, and VLOG_IS_ON at a call site of this
//    file follows each new configuration (its cached level is refreshed).

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "env/device_url.h"
#include "env/options.h"
#include "env/os.h"
#include "fuzz/fuzz_check.h"
#include "logging/log.h"
#include "logging/vmodule.h"

namespace tpushim {
namespace {

using logging::internal::GlobMatch;
using logging::internal::VmoduleLevel;

// Whether `pattern` matches all of `text`, with '*' any run of characters
// and '?' any one: the textbook dynamic program, row by pattern character.
bool ReferenceGlobMatch(absl::string_view pattern, absl::string_view text) {
  // matches[j]: the pattern so far matches text[0, j).
  std::vector<bool> matches(text.size() + 1, false);
  matches[0] = true;
  std::vector<bool> next(text.size() + 1);
  for (const char p : pattern) {
    if (p == '*') {
      next[0] = matches[0];
      for (size_t j = 1; j <= text.size(); ++j) {
        next[j] = next[j - 1] || matches[j];
      }
    } else {
      next[0] = false;
      for (size_t j = 1; j <= text.size(); ++j) {
        next[j] = matches[j - 1] && (p == '?' || p == text[j - 1]);
      }
    }
    matches.swap(next);
  }
  return matches[text.size()];
}

// VmoduleLevel as logging/vmodule.h documents it, over ReferenceGlobMatch.
int ReferenceLevel(const std::vector<VmoduleEntry>& entries,
                   absl::string_view file) {
  const absl::string_view base = file.substr(file.rfind('/') + 1);
  const absl::string_view stem = base.substr(0, base.find('.'));
  for (const VmoduleEntry& entry : entries) {
    if (ReferenceGlobMatch(entry.glob, stem) ||
        ReferenceGlobMatch(entry.glob, base)) {
      return entry.level;
    }
  }
  return -1;
}

// The entry a well-formed `<glob>=<level>` (already trimmed) stands for.
std::optional<VmoduleEntry> ExpectedEntry(absl::string_view entry) {
  const size_t equals = entry.find('=');
  if (equals == entry.npos) return std::nullopt;
  const absl::string_view glob =
      absl::StripAsciiWhitespace(entry.substr(0, equals));
  const absl::StatusOr<uint64_t> level =
      ParseDecimal(absl::StripAsciiWhitespace(entry.substr(equals + 1)),
                   "level", 0, INT_MAX);
  if (glob.empty() || !level.ok()) return std::nullopt;
  return VmoduleEntry{std::string(glob), static_cast<int>(*level)};
}

std::string Canonical(const std::vector<VmoduleEntry>& entries) {
  return absl::StrJoin(entries, ",",
                       [](std::string* out, const VmoduleEntry& entry) {
                         absl::StrAppend(out, entry.glob, "=", entry.level);
                       });
}

std::vector<VmoduleEntry> CheckParse(absl::string_view text) {
  std::vector<std::string> warnings;
  const std::vector<VmoduleEntry> entries = ParseVmodule(text, &warnings);

  // Entry by entry, in order.
  size_t next_entry = 0;
  size_t next_warning = 0;
  for (absl::string_view piece : absl::StrSplit(text, ',')) {
    piece = absl::StripAsciiWhitespace(piece);
    if (piece.empty()) continue;
    if (const std::optional<VmoduleEntry> expected = ExpectedEntry(piece)) {
      TPUSHIM_FUZZ_CHECK(next_entry < entries.size() &&
                         entries[next_entry] == *expected)
          << "entry \"" << piece << "\" of \"" << text << "\"";
      ++next_entry;
    } else {
      TPUSHIM_FUZZ_CHECK(next_warning < warnings.size() &&
                         absl::StartsWith(warnings[next_warning],
                                          absl::StrCat("TPU_VMODULE entry \"",
                                                       piece, "\" ignored: ")))
          << "entry \"" << piece << "\" of \"" << text << "\"";
      ++next_warning;
    }
  }
  TPUSHIM_FUZZ_CHECK(next_entry == entries.size()) << text;
  TPUSHIM_FUZZ_CHECK(next_warning == warnings.size()) << text;
  for (const VmoduleEntry& entry : entries) {
    // Every character of a glob matches itself, '*' and '?' included.
    TPUSHIM_FUZZ_CHECK(GlobMatch(entry.glob, entry.glob)) << entry.glob;
  }

  TPUSHIM_FUZZ_CHECK(ParseVmodule(text, nullptr) == entries) << text;
  std::vector<std::string> again_warnings;
  TPUSHIM_FUZZ_CHECK(ParseVmodule(text, &again_warnings) == entries &&
                     again_warnings == warnings)
      << "ParseVmodule is not deterministic: " << text;

  const std::string canonical = Canonical(entries);
  std::vector<std::string> canonical_warnings;
  TPUSHIM_FUZZ_CHECK(ParseVmodule(canonical, &canonical_warnings) == entries &&
                     canonical_warnings.empty())
      << text << " vs " << canonical;

  // Through the configuration, as start-up reads it.
  FixedEnvironmentOs os(Os::Default(), {{"TPU_VMODULE", std::string(text)}});
  const absl::StatusOr<Options> options = ResolveOptions(os);
  TPUSHIM_FUZZ_CHECK(options.ok()) << options.status();
  TPUSHIM_FUZZ_CHECK(options->vmodule.value == entries &&
                     options->warnings == warnings)
      << text;
  TPUSHIM_FUZZ_CHECK(logging::LogConfig::FromOptions(*options).vmodule ==
                     entries);
  return entries;
}

// Logging configured with `entries`: no files, nothing on stderr below
// FATAL, INFO kept (so only TPU_VMODULE decides), and a short queue:
// nothing is logged, and allocating the default one took most of an
// input's time.
void ConfigureLogging(const std::vector<VmoduleEntry>& entries) {
  logging::LogConfig config;
  config.log_dir = "";
  config.min_level = logging::Severity::kInfo;
  config.stderr_level = logging::Severity::kFatal;
  config.vmodule = entries;
  config.queue_size = 16;
  const absl::Status status = logging::InitLogging(config);
  TPUSHIM_FUZZ_CHECK(status.ok()) << status;
}

void CheckLevels(const std::vector<VmoduleEntry>& entries,
                 absl::string_view file) {
  const int level = ReferenceLevel(entries, file);
  TPUSHIM_FUZZ_CHECK(VmoduleLevel(entries, file) == level)
      << "\"" << file << "\" with " << Canonical(entries);
  // VlogIsOn takes a C string: the name ends at a NUL.
  const std::string name(file);
  const int c_level = ReferenceLevel(entries, name.c_str());
  // Levels around the answer; VLOG levels are never negative.
  for (const int n : {0, 1, std::max(c_level, 0),
                      c_level == INT_MAX ? INT_MAX : c_level + 1}) {
    TPUSHIM_FUZZ_CHECK(logging::VlogIsOn(n, name.c_str()) == (n <= c_level))
        << "VlogIsOn(" << n << ", \"" << name << "\") with "
        << Canonical(entries);
  }
}

void FuzzOneInput(absl::string_view data) {
  const std::vector<absl::string_view> lines = absl::StrSplit(data, '\n');
  const std::vector<VmoduleEntry> entries = CheckParse(lines[0]);
  ConfigureLogging(entries);
  for (size_t i = 1; i < lines.size(); ++i) CheckLevels(entries, lines[i]);
  const int here = ReferenceLevel(entries, __FILE__);
  for (const int n : {0, 1, 2, 3}) {
    TPUSHIM_FUZZ_CHECK(VLOG_IS_ON(n) == (n <= here))
        << "VLOG_IS_ON(" << n << ") in " << __FILE__ << " with "
        << Canonical(entries);
  }
}

}  // namespace
}  // namespace tpushim

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tpushim::FuzzOneInput(
      absl::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
