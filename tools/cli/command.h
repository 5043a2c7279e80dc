// What every `tpushim` subcommand shares: exit statuses, the context a
// subcommand runs in, how JSON is written and how a failure is reported in
// human or JSON form.
//
// Each subcommand lives in its own folder and registers itself on the
// top-level CLI11 app with a `Register<Name>Command(CLI::App&,
// CommandContext&)` function declared in its header (tools/info/info.h, ...).
// Registration adds the subcommand, its options and a callback; CLI11 runs
// the callback once the command line parsed, and the callback stores the
// process exit status in `CommandContext::exit_code`:
//
//   CommandContext context{Os::Default(), &std::cout, &std::cerr};
//   RegisterInfoCommand(app, context);
//   app.parse(argc, argv);          // runs the chosen subcommand
//   return context.exit_code;
//
// Thread-safety: single-threaded, like the tool.

#ifndef TPUSHIM_TOOLS_CLI_COMMAND_H_
#define TPUSHIM_TOOLS_CLI_COMMAND_H_

#include <ostream>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "env/os.h"
#include "nlohmann/json.hpp"

namespace tpushim::tools {

// Process exit statuses of `tpushim`.
inline constexpr int kExitOk = 0;
// The command ran and failed (e.g. the host facts could not be read).
inline constexpr int kExitFailure = 1;
// Bad command line or invalid configuration: nothing was run.
inline constexpr int kExitUsage = 2;

// Where a subcommand reads the OS and writes its output. The pointers are
// not owned and must outlive the parse that runs the subcommand.
struct CommandContext {
  Os* os = nullptr;
  std::ostream* out = nullptr;  // results (tables or JSON)
  std::ostream* err = nullptr;  // diagnostics
  int exit_code = kExitOk;      // set by the subcommand that ran
};

// Writes `value` to `out` indented by two, then a newline. Strings that are
// not valid UTF-8 (a path or variable from the environment may be
// anything) get U+FFFD for their bad bytes instead of throwing.
void WriteJson(const nlohmann::ordered_json& value, std::ostream& out);

// Reports a failed `status` and sets `context.exit_code` to `exit_code`.
// Human form, on `err`:  tpushim: <what>: <ABSL_CODE>: <status message>
// JSON form, on `out`:   {"error": {"code": "<ABSL_CODE>",
//                                   "message": "<status message>"}}
// e.g. what = "invalid configuration", code "INVALID_ARGUMENT".
// REQUIRES: !status.ok().
void ReportError(const absl::Status& status, absl::string_view what, bool json,
                 int exit_code, CommandContext& context);

// Reports a runtime that did not start (System::Create failed) through
// ReportError: INVALID_ARGUMENT is the configuration's fault ("invalid
// configuration", kExitUsage), any other code "cannot start the runtime"
// (kExitFailure).
// REQUIRES: !status.ok().
void ReportStartupError(const absl::Status& status, bool json,
                        CommandContext& context);

// A CLI11 validator that runs `parse` (text -> absl::StatusOr<T>) on the
// option's text and rejects it with the status message. `what` names the
// option's type in --help ("SIZES").
template <typename F>
CLI::Validator ParsingValidator(F parse, const std::string& what) {
  return CLI::Validator(
      [parse](const std::string& text) -> std::string {
        auto parsed = parse(text);
        return parsed.ok() ? "" : std::string(parsed.status().message());
      },
      what, what);
}

}  // namespace tpushim::tools

#endif  // TPUSHIM_TOOLS_CLI_COMMAND_H_
