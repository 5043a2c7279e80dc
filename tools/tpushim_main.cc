// The `tpushim` command-line tool: one CLI11 app whose subcommands each
// live in their own file (tools/<name>.cc) and register themselves through
// Register<Name>Command (see tools/command.h and tools/cli.h).

#include <iostream>

#include "env/os.h"
#include "tools/cli.h"
#include "tools/command.h"

int main(int argc, char** argv) {
  tpushim::tools::CommandContext context{tpushim::Os::Default(), &std::cout,
                                         &std::cerr};
  return tpushim::tools::RunCommandLine(argc, argv, context);
}
