// End-to-end tests of `tpushim info`: the built tool runs as a subprocess
// with an exact environment (nothing inherited from the test's), and its
// exit status, tables and JSON are checked.

#include <stdlib.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace tpushim {
namespace {

using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using testutil::RunSubprocess;
using testutil::SubprocessResult;

using Json = nlohmann::json;

// Runs `tpushim <args>` with exactly `env`.
SubprocessResult RunTool(const std::vector<std::string>& args,
                         const std::vector<std::string>& env = {}) {
  absl::StatusOr<SubprocessResult> result =
      RunSubprocess(TPUSHIM_TOOL_PATH, args, env);
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() ? *result : SubprocessResult{};
}

// The whitespace-separated cells of the line of `table` whose first cell is
// `name`; empty when there is none.
std::vector<std::string> RowOf(absl::string_view table,
                               absl::string_view name) {
  for (absl::string_view line : absl::StrSplit(table, '\n')) {
    std::vector<std::string> cells =
        absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (!cells.empty() && cells[0] == name) return cells;
  }
  return {};
}

// The lines of `text` that start (after indentation) with `prefix`.
std::vector<std::string> LinesStartingWith(absl::string_view text,
                                           absl::string_view prefix) {
  std::vector<std::string> lines;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(absl::StripLeadingAsciiWhitespace(line), prefix)) {
      lines.emplace_back(line);
    }
  }
  return lines;
}

Json ParseJson(const std::string& text) {
  Json json = Json::parse(text, /*cb=*/nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(json.is_discarded()) << "not one JSON value:\n" << text;
  return json;
}

// The config entry named `name` in `info --json` output; null when absent.
Json ConfigEntry(const Json& info, const std::string& name) {
  for (const Json& entry : info["config"]) {
    if (entry["name"] == name) return entry;
  }
  return nullptr;
}

bool IsCountOrNull(const Json& value) {
  return value.is_null() || value.is_number_unsigned();
}

TEST(InfoTest, DefaultsAreShownWithTheirSource) {
  SubprocessResult r = RunTool({"info"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, IsEmpty());
  EXPECT_THAT(RowOf(r.out, "TPU_PREMAPPED_BUFFER_SIZE"),
              ElementsAre("TPU_PREMAPPED_BUFFER_SIZE", "4294967296", "4.00G",
                          "default"));
  EXPECT_THAT(RowOf(r.out, "TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES"),
              ElementsAre("TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES",
                          "4294967296", "4.00G", "default"));
  EXPECT_THAT(RowOf(r.out, "TPU_LOG_DIR"),
              ElementsAre("TPU_LOG_DIR", "/tmp/tpu_logs", "default"));
  EXPECT_THAT(r.out, AllOf(HasSubstr("Configuration\n"), HasSubstr("\nHost\n"),
                           HasSubstr("\nChecks\n"), HasSubstr("MemAvailable"),
                           HasSubstr("RLIMIT_MEMLOCK soft"),
                           HasSubstr("CAP_IPC_LOCK"), HasSubstr("NUMA node 0"),
                           HasSubstr("online CPUs"), HasSubstr("page size")));
}

TEST(InfoTest, EnvironmentValueHasSourceEnv) {
  SubprocessResult r =
      RunTool({"info"}, {"TPU_PREMAPPED_BUFFER_SIZE=8589934592"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(
      RowOf(r.out, "TPU_PREMAPPED_BUFFER_SIZE"),
      ElementsAre("TPU_PREMAPPED_BUFFER_SIZE", "8589934592", "8.00G", "env"));
}

TEST(InfoTest, LibtpuInitArgsFlagHasSourceLibtpuInitArgs) {
  SubprocessResult r =
      RunTool({"info"}, {"LIBTPU_INIT_ARGS=--tpu_premapped_buffer_size=8192",
                         "TPU_PREMAPPED_BUFFER_SIZE=8589934592"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(RowOf(r.out, "TPU_PREMAPPED_BUFFER_SIZE"),
              ElementsAre("TPU_PREMAPPED_BUFFER_SIZE", "8192", "8.0K",
                          "LIBTPU_INIT_ARGS"));
}

TEST(InfoTest, ResolutionWarningsAreShown) {
  SubprocessResult r = RunTool(
      {"info"}, {"TPU_PREMAPPED_BUFFER_SIZE=8192",
                 "TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES=16384"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(
      LinesStartingWith(r.out, "WARNING: "),
      Contains(HasSubstr("TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES")));
}

TEST(InfoTest, RegionOffFitsAnyHost) {
  SubprocessResult r = RunTool({"info"}, {"TPU_PREMAPPED_BUFFER_SIZE=0"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("OK: the configuration fits this host"));
  EXPECT_THAT(LinesStartingWith(r.out, "ERROR: "), IsEmpty());
}

// With the region off, the bounce pool is the pinned memory start-up
// takes: its size, what goes through it and the memlock it needs.
TEST(InfoTest, RegionOffShowsTheBouncePool) {
  SubprocessResult r = RunTool({"info"}, {"TPU_PREMAPPED_BUFFER_SIZE=0"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("Pinned host memory"));
  EXPECT_THAT(LinesStartingWith(r.out, "bounce pool"),
              ElementsAre(AllOf(HasSubstr("4194304 (4.00M)"),
                                HasSubstr("transfers up to 1.00M"))));
  EXPECT_THAT(LinesStartingWith(r.out, "memlock needed"),
              ElementsAre(HasSubstr("4194304")));
  SubprocessResult j =
      RunTool({"info", "--json"}, {"TPU_PREMAPPED_BUFFER_SIZE=0"});
  const Json pinned = ParseJson(j.out)["pinned"];
  EXPECT_EQ(pinned["region_bytes"], 0);
  EXPECT_EQ(pinned["bounce_pool_bytes"], 4194304);
  EXPECT_EQ(pinned["bounce_max_bytes"], 1048576);
  EXPECT_EQ(pinned["memlock_needed_bytes"], 4194304);
  EXPECT_EQ(pinned["inherited_by_fork"], false);
  // With the region on, there is no pool.
  SubprocessResult on =
      RunTool({"info", "--json"}, {"TPU_PREMAPPED_BUFFER_SIZE=8388608"});
  EXPECT_EQ(ParseJson(on.out)["pinned"]["bounce_pool_bytes"], 0);
  EXPECT_EQ(ParseJson(on.out)["pinned"]["memlock_needed_bytes"], 8388608);
}

TEST(InfoTest, JsonHasEveryFieldWithItsType) {
  SubprocessResult r = RunTool({"info", "--json"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const Json info = ParseJson(r.out);
  ASSERT_TRUE(info.is_object()) << r.out;

  ASSERT_TRUE(info["config"].is_array());
  for (const Json& entry : info["config"]) {
    EXPECT_TRUE(entry["name"].is_string()) << entry;
    EXPECT_TRUE(entry["value"].is_string()) << entry;
    EXPECT_TRUE(entry["source"].is_string()) << entry;
  }
  EXPECT_EQ(ConfigEntry(info, "TPU_PREMAPPED_BUFFER_SIZE"),
            Json({{"name", "TPU_PREMAPPED_BUFFER_SIZE"},
                  {"value", "4294967296"},
                  {"source", "default"}}));
  EXPECT_FALSE(ConfigEntry(info, "TPUSHIM_MLOCK").is_null());
  EXPECT_TRUE(info["warnings"].is_array());

  const Json& host = info["host"];
  ASSERT_TRUE(host.is_object());
  EXPECT_TRUE(host["mem_total_bytes"].is_number_unsigned());
  EXPECT_TRUE(host["mem_available_bytes"].is_number_unsigned());
  EXPECT_GT(host["mem_available_bytes"].get<uint64_t>(), 0u);
  const Json& cgroup = host["cgroup"];
  EXPECT_TRUE(cgroup["version"].is_number_integer());
  EXPECT_TRUE(cgroup["path"].is_string());
  EXPECT_TRUE(IsCountOrNull(cgroup["memory_limit_bytes"])) << cgroup;
  EXPECT_TRUE(IsCountOrNull(cgroup["memory_usage_bytes"])) << cgroup;
  EXPECT_TRUE(IsCountOrNull(host["memlock"]["soft"])) << host["memlock"];
  EXPECT_TRUE(IsCountOrNull(host["memlock"]["hard"])) << host["memlock"];
  EXPECT_TRUE(host["cap_ipc_lock"].is_boolean());
  EXPECT_TRUE(host["thp"]["enabled"].is_string());
  EXPECT_TRUE(host["thp"]["defrag"].is_string());
  ASSERT_TRUE(host["hugepage_pools"].is_array());
  for (const Json& pool : host["hugepage_pools"]) {
    for (const char* key : {"page_bytes", "total", "free", "reserved"}) {
      EXPECT_TRUE(pool[key].is_number_unsigned()) << key << " in " << pool;
    }
  }
  ASSERT_TRUE(host["numa_nodes"].is_array());
  EXPECT_FALSE(host["numa_nodes"].empty());
  for (const Json& node : host["numa_nodes"]) {
    EXPECT_TRUE(node["node"].is_number_integer()) << node;
    EXPECT_TRUE(node["total_bytes"].is_number_unsigned()) << node;
    EXPECT_TRUE(node["free_bytes"].is_number_unsigned()) << node;
  }
  EXPECT_GE(host["online_cpus"].get<int>(), 1);
  EXPECT_GT(host["page_size"].get<uint64_t>(), 0u);

  ASSERT_TRUE(info["checks"].is_array());
  for (const Json& check : info["checks"]) {
    EXPECT_THAT(check["level"].get<std::string>(), AnyOf("warning", "error"));
    EXPECT_TRUE(check["message"].is_string());
  }
}

// An unset text option is an empty JSON string, not the table's `""`.
TEST(InfoTest, JsonShowsAnEmptyValueAsAnEmptyString) {
  SubprocessResult r = RunTool({"info", "--json"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const Json entry = ConfigEntry(ParseJson(r.out), "TPU_VMODULE");
  ASSERT_FALSE(entry.is_null());
  EXPECT_EQ(entry["value"], "");
  EXPECT_THAT(RunTool({"info"}).out, HasSubstr("TPU_VMODULE"));
}

// A TPU_LOG_DIR that is a regular file is not OK: start-up would fall back
// to another directory, and info says so without creating anything.
TEST(InfoTest, LogDirectoryThatIsAFileIsAWarningNotOk) {
  testutil::TempDir dir;
  const std::string file = dir.Join("not_a_dir");
  {
    std::ofstream out(file);
    out << "x";
  }
  SubprocessResult r = RunTool({"info"}, {"TPU_LOG_DIR=" + file});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(
      r.out,
      AllOf(HasSubstr(absl::StrCat("WARNING: TPU_LOG_DIR=", file,
                                   " is a regular file, not a directory; "
                                   "start-up would log to /tmp/tpu_logs_")),
            Not(HasSubstr("OK: the configuration fits"))));
  r = RunTool({"info", "--json"}, {"TPU_LOG_DIR=" + file});
  bool found = false;
  const Json j = ParseJson(r.out);
  for (const Json& c : j["checks"]) {
    found |= c["message"].get<std::string>().find("TPU_LOG_DIR=") !=
             std::string::npos;
  }
  EXPECT_TRUE(found) << r.out;
  EXPECT_EQ(testutil::ReadFileOrEmpty(file), "x") << "info changed the file";
}

TEST(InfoTest, JsonCarriesResolutionWarnings) {
  SubprocessResult r =
      RunTool({"info", "--json"},
              {"TPU_PREMAPPED_BUFFER_SIZE=8192",
               "TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES=16384"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const Json info = ParseJson(r.out);
  ASSERT_EQ(info["warnings"].size(), 1u) << info["warnings"];
  EXPECT_THAT(info["warnings"][0].get<std::string>(),
              HasSubstr("TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES"));
}

TEST(InfoTest, InvalidConfigurationExitsTwoNamingTheValue) {
  SubprocessResult r = RunTool({"info"}, {"TPU_PREMAPPED_BUFFER_SIZE=5000"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err,
              AllOf(HasSubstr("tpushim: invalid configuration: "
                              "INVALID_ARGUMENT: "),
                    HasSubstr("TPU_PREMAPPED_BUFFER_SIZE"), HasSubstr("5000")));
  EXPECT_THAT(r.out, IsEmpty());
}

TEST(InfoTest, InvalidConfigurationWithJsonIsAnErrorObject) {
  SubprocessResult r =
      RunTool({"info", "--json"}, {"TPU_PREMAPPED_BUFFER_SIZE=5000"});
  EXPECT_EQ(r.exit_code, 2);
  const Json json = ParseJson(r.out);
  ASSERT_TRUE(json.is_object()) << r.out;
  ASSERT_EQ(json.size(), 1u) << json;
  EXPECT_EQ(json["error"]["code"], "INVALID_ARGUMENT");
  EXPECT_THAT(json["error"]["message"].get<std::string>(),
              AllOf(HasSubstr("TPU_PREMAPPED_BUFFER_SIZE"), HasSubstr("5000")));
}

// 1000 TiB, a multiple of 4096: more than any test host has.
constexpr char kHugeRegion[] = "TPU_PREMAPPED_BUFFER_SIZE=1099511627776000";

TEST(InfoTest, RegionLargerThanTheHostIsAnErrorCheckButExitsZero) {
  SubprocessResult r = RunTool({"info"}, {kHugeRegion});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(LinesStartingWith(r.out, "ERROR: "),
              Contains(AllOf(HasSubstr("RESOURCE_EXHAUSTED"),
                             HasSubstr("1099511627776000"))));
  EXPECT_THAT(r.out, Not(HasSubstr("OK: the configuration fits")));
}

TEST(InfoTest, RegionLargerThanTheHostIsAnErrorCheckInJson) {
  SubprocessResult r = RunTool({"info", "--json"}, {kHugeRegion});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const Json info = ParseJson(r.out);
  bool found = false;
  for (const Json& check : info["checks"]) {
    found |=
        check["level"] == "error" && check["code"] == "RESOURCE_EXHAUSTED" &&
        absl::StrContains(check["message"].get<std::string>(), "Cannot premap");
  }
  EXPECT_TRUE(found) << info["checks"];
}

TEST(InfoTest, CreatesNoLogFiles) {
  char dir_template[] = "/tmp/tpushim_info_test.XXXXXX";
  const char* dir = mkdtemp(dir_template);
  ASSERT_NE(dir, nullptr);
  SubprocessResult r = RunTool(
      {"info"}, {std::string("TPU_LOG_DIR=") + dir, "TPU_STDERR_LOG_LEVEL=0"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, IsEmpty());
  // rmdir succeeds only on an empty directory.
  EXPECT_EQ(rmdir(dir), 0) << "tpushim info wrote into " << dir;
}

TEST(InfoTest, InfoHelpExitsZeroAndDocumentsJsonAndExamples) {
  SubprocessResult r = RunTool({"info", "--help"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, AllOf(HasSubstr("--json"), HasSubstr("Examples"),
                           HasSubstr("tpushim info --json | jq"),
                           HasSubstr("Exit status: 0")));
}

TEST(InfoTest, NoSubcommandPrintsHelpAndFails) {
  SubprocessResult r = RunTool({});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, AllOf(HasSubstr("Usage:"), HasSubstr("info")));
}

TEST(InfoTest, UnknownOptionIsAUsageError) {
  SubprocessResult r = RunTool({"info", "--no-such-option"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--no-such-option"));
}

TEST(InfoTest, VersionExitsZero) {
  SubprocessResult r = RunTool({"--version"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("tpushim "));
}

}  // namespace
}  // namespace tpushim
