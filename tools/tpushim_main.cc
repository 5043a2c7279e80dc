// The `tpushim` command-line tool: one CLI11 app whose subcommands each
// live in their own file (tools/<name>.cc) and register themselves through
// Register<Name>Command (see tools/command.h).

#include <iostream>

#include "CLI/CLI.hpp"
#include "env/os.h"
#include "tools/bench.h"
#include "tools/command.h"
#include "tools/demo.h"
#include "tools/info.h"
#include "tools/stress.h"
#include "tools/tune.h"

namespace tpushim::tools {
namespace {

constexpr char kDescription[] =
    "tpushim: a libtpu-compatible host runtime.\n"
    "Every subcommand has --help, prints tables by default and one JSON\n"
    "object with --json.";

constexpr char kFooter[] = R"(
Exit status: 0 on success, 1 when a command fails, 2 for a bad command line
or an invalid configuration. Run `tpushim <subcommand> --help` for details.)";

int Main(int argc, char** argv) {
  CLI::App app(kDescription, "tpushim");
  app.set_version_flag("--version", "tpushim " TPUSHIM_VERSION_STRING);
  app.require_subcommand(1);
  app.footer(kFooter);

  CommandContext context{Os::Default(), &std::cout, &std::cerr};
  RegisterInfoCommand(app, context);
  RegisterDemoCommand(app, context);
  RegisterBenchCommand(app, context);
  RegisterTuneCommand(app, context);
  RegisterStressCommand(app, context);

  if (argc <= 1) {
    std::cerr << app.help();
    return kExitUsage;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version come here too, with exit code 0.
    const int code = app.exit(e);
    return code == 0 ? kExitOk : kExitUsage;
  }
  return context.exit_code;
}

}  // namespace
}  // namespace tpushim::tools

int main(int argc, char** argv) { return tpushim::tools::Main(argc, argv); }
