#include "tools/main/cli.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/closest_match.h"
#include "tools/bench/bench.h"
#include "tools/cli/interrupt.h"
#include "tools/demo/demo.h"
#include "tools/info/info.h"
#include "tools/memory/memory.h"
#include "tools/shape/shape.h"
#include "tools/stress/stress.h"
#include "tools/tune/tune.h"

namespace tpushim::tools {
namespace {

constexpr char kDescription[] =
    "tpushim: a libtpu-compatible host runtime.\n"
    "Every subcommand has --help, prints tables by default and one JSON\n"
    "object with --json.";

constexpr char kFooter[] = R"(
Exit status: 0 on success, 1 when a command fails, 2 for a bad command line
or an invalid configuration. Run `tpushim <subcommand> --help` for details.)";

// " or " between the last two: "demo", "demo or info", "a, b or c".
std::string Alternatives(const std::vector<std::string>& words) {
  if (words.size() <= 1) return absl::StrJoin(words, "");
  return absl::StrCat(absl::StrJoin(words.begin(), words.end() - 1, ", "),
                      " or ", words.back());
}

// The long flags of `app` ("--step-ms"), --help included.
std::vector<std::string> FlagNames(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::Option* option : app.get_options()) {
    for (const std::string& name : option->get_lnames()) {
      names.push_back("--" + name);
    }
  }
  return names;
}

// One line per argument the parse left over, with the closest known
// subcommand or flag when one is close. Empty when nothing was left over.
std::vector<std::string> Hints(CLI::App& app) {
  std::vector<CLI::App*> chosen = app.get_subcommands();
  CLI::App* scope = chosen.empty() ? &app : chosen.back();
  const std::string who =
      chosen.empty() ? "tpushim" : absl::StrCat("tpushim ", scope->get_name());
  std::vector<std::string> lines;
  for (const std::string& arg : scope->remaining()) {
    if (absl::StartsWith(arg, "-")) {
      const std::string flag = arg.substr(0, arg.find('='));
      const std::vector<std::string> close =
          ClosestMatches(flag, FlagNames(*scope));
      lines.push_back(absl::StrCat(
          who, ": unknown flag ", flag,
          close.empty()
              ? ""
              : absl::StrCat("; did you mean ", Alternatives(close), "?")));
    } else if (chosen.empty()) {
      std::vector<std::string> names;
      for (const CLI::App* sub : app.get_subcommands({})) {
        if (!sub->get_group().empty()) names.push_back(sub->get_name());
      }
      const std::vector<std::string> close = ClosestMatches(arg, names);
      lines.push_back(absl::StrCat(
          who, ": unknown subcommand \"", arg, "\"",
          close.empty()
              ? absl::StrCat(" (subcommands: ", absl::StrJoin(names, ", "), ")")
              : absl::StrCat("; did you mean ", Alternatives(close), "?")));
    }
  }
  return lines;
}

// Results that never reached their reader are a failure: a full disk or a
// closed pipe must not look like success to a script.
int CheckOutput(CommandContext& context) {
  errno = 0;
  context.out->flush();
  if (context.out == &std::cout && std::fflush(stdout) != 0) {
    context.out->setstate(std::ios::badbit);
  }
  if (!context.out->fail()) return context.exit_code;
  const int e = errno;  // the failed write's, when it failed just now
  *context.err << "tpushim: writing the results to standard output failed"
               << (e != 0 ? absl::StrCat(": ", std::strerror(e)) : "") << "\n";
  return kExitFailure;
}

}  // namespace

void AddCommands(CLI::App& app, CommandContext& context) {
  app.description(kDescription);
  app.name("tpushim");
  app.set_version_flag("--version", "tpushim " TPUSHIM_VERSION_STRING);
  app.require_subcommand(1);
  app.footer(kFooter);
  RegisterInfoCommand(app, context);
  RegisterDemoCommand(app, context);
  RegisterBenchCommand(app, context);
  RegisterTuneCommand(app, context);
  RegisterStressCommand(app, context);
  RegisterShapeCommand(app, context);
  RegisterMemoryCommand(app, context);
}

int RunCommandLine(int argc, char** argv, CommandContext& context) {
  InstallInterruptHandling();
  CLI::App app;
  AddCommands(app, context);
  if (argc <= 1) {
    *context.err << app.help();
    return kExitUsage;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version come here too, with exit code 0.
    if (e.get_exit_code() == 0) {
      app.exit(e, *context.out, *context.err);
      return kExitOk;
    }
    const std::vector<std::string> hints = Hints(app);
    if (hints.empty()) {
      *context.err << "tpushim: " << e.what() << "\n";
    } else {
      for (const std::string& line : hints) *context.err << line << "\n";
    }
    *context.err << "Run with --help for more information.\n";
    return kExitUsage;
  }
  const int status = CheckOutput(context);
  if (const int signal = InterruptSignal(); signal != 0) {
    *context.err << "tpushim: interrupted by " << InterruptSignalName(signal)
                 << "\n";
    return 128 + signal;
  }
  return status;
}

}  // namespace tpushim::tools
