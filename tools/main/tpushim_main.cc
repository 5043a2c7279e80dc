// The `tpushim` command-line tool: one CLI11 app whose subcommands each
// live in their own folder (tools/<name>/) and register themselves through
// Register<Name>Command (see tools/cli/command.h and tools/main/cli.h).

#include <iostream>

#include "env/os.h"
#include "tools/cli/command.h"
#include "tools/main/cli.h"

int main(int argc, char** argv) {
  tpushim::tools::CommandContext context{tpushim::Os::Default(), &std::cout,
                                         &std::cerr};
  return tpushim::tools::RunCommandLine(argc, argv, context);
}
