// Test helper shared by the in-process stress suites
// (stress_replay_test.cc, stress_shrink_test.cc): runs `tpushim stress`
// inside the test process against the library the tool links, with log
// files off, and parses its JSON.
//
//   const StressOutcome o = RunStressInProcess({"--ops", "200", "--json"});
//   EXPECT_EQ(o.exit_code, kExitOk) << o.err;
//   const nlohmann::ordered_json j = ParseStressJson(o.out);

#ifndef TPUSHIM_TESTS_TOOLS_STRESS_IN_PROCESS_H_
#define TPUSHIM_TESTS_TOOLS_STRESS_IN_PROCESS_H_

#include <sstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "env/os.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tools/cli/command.h"
#include "tools/stress/stress.h"

namespace tpushim::tools {

struct StressOutcome {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// The process's environment but with TPU_LOG_DIR=disabled.
inline Os* StressTestOs() {
  static auto* os =
      new FixedEnvironmentOs(Os::Default(), {{"TPU_LOG_DIR", "disabled"}});
  return os;
}

// Runs `tpushim stress <args>` in this process, mapping a bad command line
// to kExitUsage as the tool does.
inline StressOutcome RunStressInProcess(std::vector<std::string> args) {
  std::ostringstream out;
  std::ostringstream err;
  CommandContext context{StressTestOs(), &out, &err};
  CLI::App app("tpushim", "tpushim");
  RegisterStressCommand(app, context);
  args.insert(args.begin(), {"tpushim", "stress"});
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  StressOutcome outcome;
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
    outcome.exit_code = context.exit_code;
  } catch (const CLI::ParseError& e) {
    outcome.exit_code = app.exit(e, out, err) == 0 ? kExitOk : kExitUsage;
  }
  outcome.out = out.str();
  outcome.err = err.str();
  return outcome;
}

inline nlohmann::ordered_json ParseStressJson(const std::string& text) {
  nlohmann::ordered_json json =
      nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(json.is_discarded()) << text;
  return json;
}

}  // namespace tpushim::tools

#endif  // TPUSHIM_TESTS_TOOLS_STRESS_IN_PROCESS_H_
