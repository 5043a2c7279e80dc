// Numeric command-line flags of the `tpushim` subcommands, checked the way
// a user reads them. A value that is not a number (`12abc`, ``), not finite
// (`nan`, `inf`), out of range (`-1` where only positive values mean
// something) or too large to hold (`1e400`, `18446744073709551616`) stops
// the parse with a message that names the flag and what it accepts, in the
// user's words:
//
//   --step-ms must be a finite number of milliseconds ≥ 0, got "nan"
//   --threads must be a whole number of threads from 1 to 256, got "1.5"
//   --batch-bytes must be a byte size from 1 to 1G, e.g. 4096, 512M or
//   16GiB, got "12abc"
//
// CLI11 reports it as a CLI::ValidationError, which `tpushim` turns into
// exit status 2 (tools/main/cli.h). The variable keeps its default unless the
// flag is given with a valid value.
//
//   AddDecimalFlag(demo, "--step-ms", &flags->step_ms,
//                  {.unit = "milliseconds", .min = 0, .max = 60000},
//                  "Modelled device compute per step");
//
// Every option these functions add has a type name (`--help` shows it)
// from kNumericTypeNames, so that a test can find every numeric flag of
// the parser and try it with bad values.
//
// Thread-safety: like CLI11, single-threaded.

#ifndef TPUSHIM_TOOLS_CLI_FLAGS_H_
#define TPUSHIM_TOOLS_CLI_FLAGS_H_

#include <cstdint>
#include <limits>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tpushim::tools {

// The type names the functions below give their options.
inline constexpr absl::string_view kNumericTypeNames[] = {"NUMBER", "WHOLE",
                                                          "BYTES"};

// What a flag's number means: "a finite number of <unit>" in messages
// (no unit: "a finite number"), in [min, max]; an infinite max is "≥ min".
struct DecimalRange {
  absl::string_view unit;
  double min = 0;
  double max = std::numeric_limits<double>::infinity();
};

// A whole number of <unit> in [min, max].
struct WholeRange {
  absl::string_view unit;
  int64_t min = 0;
  int64_t max = std::numeric_limits<int64_t>::max();
};

// A byte size (decimal bytes, or a number with a K/M/G/T suffix, 1024 base,
// optionally followed by iB) in [min, max].
struct ByteRange {
  uint64_t min = 0;
  uint64_t max = std::numeric_limits<uint64_t>::max();
};

// Parse functions: the value, or INVALID_ARGUMENT with the message above
// naming `flag`.
absl::StatusOr<double> ParseDecimalFlag(absl::string_view flag,
                                        absl::string_view text,
                                        const DecimalRange& range);
absl::StatusOr<int64_t> ParseWholeFlag(absl::string_view flag,
                                       absl::string_view text,
                                       const WholeRange& range);
absl::StatusOr<uint64_t> ParseUnsignedFlag(absl::string_view flag,
                                           absl::string_view text,
                                           absl::string_view unit);
absl::StatusOr<uint64_t> ParseByteFlag(absl::string_view flag,
                                       absl::string_view text,
                                       const ByteRange& range);

// Adds `name` to `app`, storing into `*value`, which must outlive the
// parse; its current value is the default `--help` shows.
CLI::Option* AddDecimalFlag(CLI::App* app, const std::string& name,
                            double* value, const DecimalRange& range,
                            const std::string& help);
CLI::Option* AddWholeFlag(CLI::App* app, const std::string& name, int* value,
                          const WholeRange& range, const std::string& help);
CLI::Option* AddWholeFlag(CLI::App* app, const std::string& name,
                          int64_t* value, const WholeRange& range,
                          const std::string& help);
CLI::Option* AddWholeFlag(CLI::App* app, const std::string& name,
                          uint64_t* value, const WholeRange& range,
                          const std::string& help);
// Any value a uint64_t holds (a seed).
CLI::Option* AddUnsignedFlag(CLI::App* app, const std::string& name,
                             uint64_t* value, absl::string_view unit,
                             const std::string& help);
// Keeps the text as given in `*text` (the command parses it again where it
// is used, e.g. to tell a default from a value given).
CLI::Option* AddByteFlag(CLI::App* app, const std::string& name,
                         std::string* text, const ByteRange& range,
                         const std::string& help);

}  // namespace tpushim::tools

#endif  // TPUSHIM_TOOLS_CLI_FLAGS_H_
