// The `tpushim` command line as a whole: the app with every subcommand
// (each registers itself, see tools/cli/command.h), and running it the way the
// executable does, mapping CLI11's errors to exit statuses and adding a
// "did you mean" to unknown subcommands and misspelled flags:
//
//   $ tpushim dmeo
//   tpushim: unknown subcommand "dmeo"; did you mean demo?
//   $ tpushim demo --step-m 3
//   tpushim demo: unknown flag --step-m; did you mean --step-ms?
//
// Thread-safety: single-threaded, like the tool.

#ifndef TPUSHIM_TOOLS_MAIN_CLI_H_
#define TPUSHIM_TOOLS_MAIN_CLI_H_

#include "CLI/CLI.hpp"
#include "tools/cli/command.h"

namespace tpushim::tools {

// Sets up `app` as the `tpushim` command: description, --version, and every
// subcommand. `context` must outlive the parse of `app`.
void AddCommands(CLI::App& app, CommandContext& context);

// Parses `argv` and runs the chosen subcommand; returns the process exit
// status (kExitOk, kExitFailure, or kExitUsage for a bad command line).
int RunCommandLine(int argc, char** argv, CommandContext& context);

}  // namespace tpushim::tools

#endif  // TPUSHIM_TOOLS_MAIN_CLI_H_
