// Numeric command-line flags (tools/cli/flags.h) and the command line as a
// whole (tools/main/cli.h): the parse functions' messages, and, end to end,
// every flag of every subcommand that takes a number given values a user
// may type by mistake. The flags are enumerated from the parser itself, so
// a new flag without a row in kFlags fails here.

#include "tools/cli/flags.h"

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "env/os.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "tools/cli/command.h"
#include "tools/main/cli.h"

namespace tpushim::tools {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using testutil::RunSubprocess;

// How a flag that takes a value reads it.
enum class Kind {
  kNumber,  // one number or byte size (tools/cli/flags.h)
  kList,    // a list of numbers or names, checked by its own parser
  kText,    // a file, a spec or a name: not a number
};

// Every flag that takes a value, by subcommand. Flags without a value
// (--json, --csv, --help, --no-progress) are not listed.
const std::map<std::pair<std::string, std::string>, Kind>& Flags() {
  static const auto* flags =
      new std::map<std::pair<std::string, std::string>, Kind>{
          {{"demo", "--steps"}, Kind::kNumber},
          {{"demo", "--batch-bytes"}, Kind::kNumber},
          {{"demo", "--devices"}, Kind::kNumber},
          {{"demo", "--step-ms"}, Kind::kNumber},
          {{"demo", "--producers"}, Kind::kNumber},
          {{"bench", "--sizes"}, Kind::kList},
          {{"bench", "--directions"}, Kind::kList},
          {{"bench", "--paths"}, Kind::kList},
          {{"bench", "--seconds"}, Kind::kNumber},
          {{"bench", "--device"}, Kind::kNumber},
          {{"tune", "--sizes"}, Kind::kList},
          {{"tune", "--thresholds"}, Kind::kList},
          {{"tune", "--workload"}, Kind::kText},
          {{"tune", "--transfer-sizes"}, Kind::kText},
          {{"tune", "--directions"}, Kind::kText},
          {{"tune", "--streams"}, Kind::kNumber},
          {{"tune", "--devices"}, Kind::kNumber},
          {{"tune", "--link-gbps"}, Kind::kNumber},
          {{"tune", "--latency-us"}, Kind::kNumber},
          {{"tune", "--pinned-buffers"}, Kind::kNumber},
          {{"tune", "--pinned-bytes"}, Kind::kNumber},
          {{"tune", "--zero-copy-share"}, Kind::kNumber},
          {{"tune", "--seconds"}, Kind::kNumber},
          {{"tune", "--count"}, Kind::kNumber},
          {{"tune", "--step-ms"}, Kind::kNumber},
          {{"tune", "--step-bytes"}, Kind::kNumber},
          {{"tune", "--seed"}, Kind::kNumber},
          {{"tune", "--repeats"}, Kind::kNumber},
          {{"tune", "--point-timeout"}, Kind::kNumber},
          {{"tune", "--plot"}, Kind::kText},
          {{"tune-point", "--workload"}, Kind::kText},
          {{"stress", "--ops"}, Kind::kNumber},
          {{"stress", "--seconds"}, Kind::kNumber},
          {{"stress", "--threads"}, Kind::kNumber},
          {{"stress", "--processes"}, Kind::kNumber},
          {{"stress", "--kills"}, Kind::kNumber},
          {{"stress", "--seed"}, Kind::kNumber},
          {{"stress", "--faults"}, Kind::kText},
          {{"stress", "--region-bytes"}, Kind::kNumber},
          {{"stress", "--threshold"}, Kind::kNumber},
          {{"stress", "--record"}, Kind::kText},
          {{"stress", "--replay"}, Kind::kText},
          {{"stress", "--shrink"}, Kind::kText},
          {{"stress", "--shrink-seconds"}, Kind::kNumber},
          {{"shape", "--hbm"}, Kind::kNumber},
          {{"memory", "--plot"}, Kind::kText},
      };
  return *flags;
}

// What the issue that asked for this found users typing.
const std::vector<std::string> kBadValues = {
    "nan", "inf", "-inf", "-1", "1e400", "18446744073709551616", "", "12abc"};

bool IsNumericType(const std::string& type) {
  for (absl::string_view t : kNumericTypeNames) {
    if (type == t) return true;
  }
  return false;
}

// (subcommand, flag) → the option's type name, for every option of every
// subcommand that takes a value.
std::map<std::pair<std::string, std::string>, std::string> ParserFlags() {
  CommandContext context{Os::Default(), nullptr, nullptr};
  CLI::App app;
  AddCommands(app, context);
  std::map<std::pair<std::string, std::string>, std::string> flags;
  for (const CLI::App* sub : app.get_subcommands({})) {
    for (const CLI::Option* option : sub->get_options()) {
      // A flag without a value (--json, --help) takes no items.
      if (option->get_items_expected_max() == 0) continue;
      for (const std::string& name : option->get_lnames()) {
        flags[{sub->get_name(), "--" + name}] = option->get_type_name();
      }
    }
  }
  return flags;
}

TEST(FlagsTest, EveryFlagWithAValueHasARow) {
  const auto parsed = ParserFlags();
  std::set<std::pair<std::string, std::string>> in_parser, in_table;
  for (const auto& [key, type] : parsed) in_parser.insert(key);
  for (const auto& [key, kind] : Flags()) in_table.insert(key);
  for (const auto& key : in_parser) {
    EXPECT_TRUE(in_table.count(key))
        << "tpushim " << key.first << " " << key.second
        << " takes a value but has no row in this test: add one, and if it "
           "is a number, declare it with tools/cli/flags.h";
  }
  for (const auto& key : in_table) {
    EXPECT_TRUE(in_parser.count(key))
        << key.first << " " << key.second << " is no longer a flag";
  }
}

TEST(FlagsTest, NumberRowsAreDeclaredThroughTheFlagsModule) {
  const auto parsed = ParserFlags();
  for (const auto& [key, kind] : Flags()) {
    auto it = parsed.find(key);
    if (it == parsed.end()) continue;  // reported by the test above
    EXPECT_EQ(kind == Kind::kNumber, IsNumericType(it->second))
        << key.first << " " << key.second << " has type " << it->second;
  }
}

// The tool itself, given each bad value of each number and list flag: exit
// 2 within 5 s, with a message naming the flag, and never CLI11's own
// wording ("not in range", "Could not convert").
TEST(FlagsTest, EveryNumberFlagRejectsBadValuesEndToEnd) {
  int runs = 0;
  for (const auto& [key, kind] : Flags()) {
    if (kind == Kind::kText) continue;
    const auto& [sub, flag] = key;
    for (const std::string& value : kBadValues) {
      if (kind == Kind::kList && value == "-1") continue;  // see below
      // As typed: `--flag value`, or `--flag=-1` (a value that starts with
      // a dash would read as a flag).
      std::vector<std::string> args = {sub, flag, value};
      if (absl::StartsWith(value, "-")) {
        args = {sub, absl::StrCat(flag, "=", value)};
      }
      const std::string arg = absl::StrJoin(args, " ");
      absl::StatusOr<SubprocessResult> r = RunSubprocess(
          TPUSHIM_TOOL_PATH, args, {"TPU_LOG_DIR=disabled"}, absl::Seconds(5));
      ASSERT_TRUE(r.ok()) << sub << " " << arg << ": " << r.status();
      ++runs;
      EXPECT_EQ(r->exit_code, 2) << "tpushim " << arg << "\n" << r->err;
      EXPECT_THAT(r->err, AllOf(HasSubstr(flag), Not(HasSubstr("not in range")),
                                Not(HasSubstr("Could not convert"))))
          << "tpushim " << arg;
      if (kind == Kind::kNumber) {
        EXPECT_THAT(r->err, HasSubstr(absl::StrCat(flag, " must be ")))
            << "tpushim " << arg;
      }
      EXPECT_THAT(r->out, Not(HasSubstr("tpushim " + sub)))
          << "the command ran: tpushim " << arg;
    }
  }
  EXPECT_GT(runs, 200);
}

// `--steps=` with nothing after it names the flag too.
TEST(FlagsTest, MissingValueNamesTheFlag) {
  absl::StatusOr<SubprocessResult> r =
      RunSubprocess(TPUSHIM_TOOL_PATH, {"demo", "--steps="},
                    {"TPU_LOG_DIR=disabled"}, absl::Seconds(5));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 2);
  EXPECT_THAT(r->err, HasSubstr("--steps"));
}

// The space-separated form a user types most: `--step-ms nan`.
TEST(FlagsTest, SpaceSeparatedValueIsCheckedToo) {
  absl::StatusOr<SubprocessResult> r =
      RunSubprocess(TPUSHIM_TOOL_PATH, {"demo", "--step-ms", "nan"},
                    {"TPU_LOG_DIR=disabled"}, absl::Seconds(5));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 2);
  EXPECT_THAT(r->err,
              HasSubstr("--step-ms must be a finite number of milliseconds "
                        "from 0 to 60000, got \"nan\""));
}

TEST(FlagsTest, DecimalMessages) {
  const DecimalRange ms{.unit = "milliseconds", .min = 0};
  EXPECT_EQ(ParseDecimalFlag("--step-ms", "nan", ms).status().message(),
            "--step-ms must be a finite number of milliseconds ≥ 0, got "
            "\"nan\"");
  EXPECT_EQ(ParseDecimalFlag("--share", "2", {.unit = "", .min = 0, .max = 1})
                .status()
                .message(),
            "--share must be a finite number from 0 to 1, got \"2\"");
  EXPECT_EQ(*ParseDecimalFlag("--step-ms", "2.5", ms), 2.5);
  EXPECT_EQ(*ParseDecimalFlag("--step-ms", "+2", ms), 2.0);
  EXPECT_EQ(*ParseDecimalFlag("--step-ms", "1e3", ms), 1000.0);
  for (const char* bad : {"inf", "-inf", "infinity", "-1", "1e400", "", "12abc",
                          " 1", "1 ", "0x10", "++1", "+-1", "+"}) {
    EXPECT_FALSE(ParseDecimalFlag("--step-ms", bad, ms).ok()) << bad;
  }
}

TEST(FlagsTest, WholeMessages) {
  const WholeRange threads{.unit = "threads", .min = 1, .max = 256};
  EXPECT_EQ(ParseWholeFlag("--threads", "1.5", threads).status().message(),
            "--threads must be a whole number of threads from 1 to 256, got "
            "\"1.5\"");
  EXPECT_EQ(*ParseWholeFlag("--threads", "256", threads), 256);
  EXPECT_EQ(ParseWholeFlag("--ops", "0", {.unit = "operations", .min = 1})
                .status()
                .message(),
            "--ops must be a whole number of operations ≥ 1, got \"0\"");
  for (const char* bad : {"257", "0", "-1", "1e3", "18446744073709551616",
                          "9223372036854775808", "", "nan", "4x"}) {
    EXPECT_FALSE(ParseWholeFlag("--threads", bad, threads).ok()) << bad;
  }
  EXPECT_EQ(*ParseUnsignedFlag("--seed", "18446744073709551615", ""),
            UINT64_MAX);
  EXPECT_EQ(ParseUnsignedFlag("--seed", "18446744073709551616", "")
                .status()
                .message(),
            "--seed must be a whole number from 0 to 18446744073709551615, "
            "got \"18446744073709551616\"");
}

TEST(FlagsTest, ByteMessages) {
  const ByteRange batch{.min = 1, .max = uint64_t{1} << 30};
  EXPECT_EQ(*ParseByteFlag("--batch-bytes", "512M", batch), 512u << 20);
  EXPECT_EQ(ParseByteFlag("--batch-bytes", "2G", batch).status().message(),
            "--batch-bytes must be a byte size from 1 to 1G, e.g. 4096, 512M "
            "or 16GiB, got \"2G\"");
  EXPECT_EQ(ParseByteFlag("--threshold", "-1", {}).status().message(),
            "--threshold must be a byte size ≥ 0, e.g. 4096, 512M or 16GiB, "
            "got \"-1\"");
}

TEST(FlagsTest, DefaultsStayUnlessGiven) {
  CLI::App app;
  double ms = 5;
  int threads = 4;
  std::string bytes = "64M";
  AddDecimalFlag(&app, "--step-ms", &ms, {.unit = "milliseconds"}, "");
  AddWholeFlag(&app, "--threads", &threads, {.unit = "threads", .min = 1}, "");
  AddByteFlag(&app, "--bytes", &bytes, {}, "");
  app.parse(std::vector<std::string>{"--threads=8"});  // reversed argv
  EXPECT_EQ(ms, 5);
  EXPECT_EQ(threads, 8);
  EXPECT_EQ(bytes, "64M");
  EXPECT_THAT(app.help(), AllOf(HasSubstr("NUMBER=5"), HasSubstr("WHOLE=4"),
                                HasSubstr("BYTES=64M")));
  EXPECT_THROW(app.parse(std::vector<std::string>{"--step-ms=nan"}),
               CLI::ValidationError);
  EXPECT_EQ(ms, 5);
}

struct DidYouMeanCase {
  std::vector<std::string> args;
  std::string expected;
};

TEST(CliTest, UnknownSubcommandsAndFlagsGetADidYouMean) {
  const std::vector<DidYouMeanCase> cases = {
      {{"dmeo"}, "tpushim: unknown subcommand \"dmeo\"; did you mean demo?"},
      {{"stres"},
       "tpushim: unknown subcommand \"stres\"; did you mean stress?"},
      {{"frobnicate"},
       "tpushim: unknown subcommand \"frobnicate\" (subcommands: info, demo, "
       "bench, tune, stress, shape, memory)"},
      {{"demo", "--step-m", "3"},
       "tpushim demo: unknown flag --step-m; did you mean --step-ms?"},
      {{"bench", "--secnods=1"},
       "tpushim bench: unknown flag --secnods; did you mean --seconds?"},
      {{"stress", "--thread", "2"},
       "tpushim stress: unknown flag --thread; did you mean --threads?"},
      {{"tune", "--xyzzy"}, "tpushim tune: unknown flag --xyzzy\n"},
  };
  for (const DidYouMeanCase& c : cases) {
    absl::StatusOr<SubprocessResult> r = RunSubprocess(
        TPUSHIM_TOOL_PATH, c.args, {"TPU_LOG_DIR=disabled"}, absl::Seconds(5));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->exit_code, 2) << c.args[0];
    EXPECT_THAT(r->err, HasSubstr(c.expected)) << c.args[0];
  }
}

}  // namespace
}  // namespace tpushim::tools

namespace tpushim::tools {
namespace {

// Results that cannot be written are a failure (exit 1, saying what
// failed), whatever the subcommand printed them with.
TEST(CliTest, ResultsWrittenToAFullDiskFailWithExit1) {
  const std::vector<std::string> commands = {
      "info", "info --json", "demo --steps 1 --batch-bytes 64K --devices 1",
      "demo --steps 0 --json",
      "bench --sizes 4K --seconds 0.01 --directions h2d --paths staged --csv"};
  for (const std::string& command : commands) {
    absl::StatusOr<SubprocessResult> r = RunSubprocess(
        "/bin/sh",
        {"-c", absl::StrCat("exec \"$0\" ", command, " > /dev/full"),
         TPUSHIM_TOOL_PATH},
        {"TPU_LOG_DIR=disabled", "TPU_PREMAPPED_BUFFER_SIZE=16777216",
         "TPUSHIM_DEVICE=sim://?hbm=64M", "PATH=/usr/bin:/bin"},
        absl::Seconds(60));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->exit_code, 1) << command << "\n" << r->err;
    EXPECT_THAT(r->err,
                HasSubstr("writing the results to standard output failed: "
                          "No space left on device"))
        << command;
  }
}

}  // namespace
}  // namespace tpushim::tools
