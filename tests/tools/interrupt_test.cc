// SIGINT and SIGTERM sent to a running subcommand (tools/cli/interrupt.h): the
// tool stops at its next step, prints what it has marked as partial, exits
// 128 + the signal, and leaves no process behind. The test process is a
// child subreaper, so that anything the tool started and left running
// would become its child and be seen.

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/temp_dir.h"

extern char** environ;

namespace tpushim {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;

struct Interrupted {
  int exit_code = -1;
  std::string out;
  std::string err;
  std::vector<pid_t> left_behind;  // processes still alive a second later
};

std::string ReadAll(const std::string& path) {
  return testutil::ReadFileOrEmpty(path);
}

// Live processes whose parent is this process (zombies are reaped).
std::vector<pid_t> LiveChildren() {
  while (waitpid(-1, nullptr, WNOHANG) > 0) {
  }
  std::vector<pid_t> children;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    int pid = 0;
    if (!absl::SimpleAtoi(entry.path().filename().string(), &pid)) continue;
    const std::string stat = ReadAll(absl::StrCat("/proc/", pid, "/stat"));
    const size_t paren = stat.rfind(')');
    if (paren == std::string::npos) continue;
    char state = 0;
    int ppid = 0;
    if (std::sscanf(stat.c_str() + paren + 1, " %c %d", &state, &ppid) != 2) {
      continue;
    }
    if (ppid == getpid() && state != 'Z') children.push_back(pid);
  }
  return children;
}

// Runs the tool with `args` in `env`, sends `signal` after `after`, and
// waits (at most 60 s) for it to end.
Interrupted RunAndInterrupt(const std::vector<std::string>& args,
                            const std::vector<std::string>& env, int signal,
                            absl::Duration after) {
  Interrupted result;
  testutil::TempDir dir;
  const std::string out = dir.Join("out"), err = dir.Join("err");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, out.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, 2, err.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::vector<std::string> argv_strings = {TPUSHIM_TOOL_PATH};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv, envp;
  for (std::string& s : argv_strings) argv.push_back(s.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_strings = env;
  // The test process's chip run directory (tests/testing/private_run_dir.cc):
  // tests running side by side never hold each other's chips.
  if (const char* run_dir = getenv("TPUSHIM_RUN_DIR")) {
    env_strings.push_back(std::string("TPUSHIM_RUN_DIR=") + run_dir);
  }
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  pid_t pid = 0;
  EXPECT_EQ(posix_spawn(&pid, TPUSHIM_TOOL_PATH, &actions, nullptr, argv.data(),
                        envp.data()),
            0);
  posix_spawn_file_actions_destroy(&actions);
  absl::SleepFor(after);
  kill(pid, signal);
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (absl::Now() > deadline) {
      ADD_FAILURE() << "the tool did not end within 60 s of the signal";
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  absl::SleepFor(absl::Seconds(1));
  result.left_behind = LiveChildren();
  for (pid_t p : result.left_behind) kill(p, SIGKILL);
  result.out = ReadAll(out);
  result.err = ReadAll(err);
  return result;
}

class InterruptTest : public ::testing::TestWithParam<int> {
 protected:
  static void SetUpTestSuite() {
    ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  }
  int signal() const { return GetParam(); }
  std::vector<std::string> Env() const {
    return {"TPU_LOG_DIR=" + logs_.path(), "TPU_PREMAPPED_BUFFER_SIZE=16777216",
            "TPUSHIM_DEVICE=sim://?devices=2&hbm=256M", "PATH=/usr/bin:/bin"};
  }
  void ExpectEndedBySignal(const Interrupted& r) {
    EXPECT_EQ(r.exit_code, 128 + signal()) << r.err;
    EXPECT_THAT(r.err, HasSubstr(absl::StrCat(
                           "tpushim: interrupted by ",
                           signal() == SIGINT ? "SIGINT" : "SIGTERM")));
    EXPECT_TRUE(r.left_behind.empty())
        << "left running: " << absl::StrJoin(r.left_behind, ", ");
  }

  testutil::TempDir logs_;
};

TEST_P(InterruptTest, Demo) {
  const Interrupted r =
      RunAndInterrupt({"demo", "--steps", "1000000", "--batch-bytes", "1M",
                       "--step-ms", "1", "--json"},
                      Env(), signal(), absl::Milliseconds(1500));
  ExpectEndedBySignal(r);
  const Json j = Json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["partial"], true);
  EXPECT_EQ(j["steps_requested"], 1000000);
  EXPECT_LT(j["steps"].get<int64_t>(), 1000000);
  EXPECT_EQ(j["errors"], 0) << r.out;
}

TEST_P(InterruptTest, DemoTables) {
  const Interrupted r = RunAndInterrupt(
      {"demo", "--steps", "1000000", "--batch-bytes", "1M", "--step-ms", "1"},
      Env(), signal(), absl::Milliseconds(1500));
  ExpectEndedBySignal(r);
  EXPECT_THAT(r.out, HasSubstr("of 1000000 steps; the figures below are "
                               "partial"));
}

TEST_P(InterruptTest, Bench) {
  const Interrupted r = RunAndInterrupt(
      {"bench", "--sizes", "4K,64K,1M", "--seconds", "2", "--csv"}, Env(),
      signal(), absl::Milliseconds(1500));
  ExpectEndedBySignal(r);
  EXPECT_THAT(r.out, HasSubstr(",interrupted\n"));
}

TEST_P(InterruptTest, BenchJson) {
  const Interrupted r = RunAndInterrupt(
      {"bench", "--sizes", "4K,64K,1M", "--seconds", "2", "--json"}, Env(),
      signal(), absl::Milliseconds(1500));
  ExpectEndedBySignal(r);
  const Json j = Json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["partial"], true);
  bool interrupted = false;
  for (const Json& s : j["skipped"])
    interrupted |= s["reason"] == "interrupted";
  EXPECT_TRUE(interrupted) << r.out;
}

// The sweep's children (tune-point, each holding a region) are stopped
// with it; the points not run are reported as interrupted. The devices
// hold the streams' buffers (2 x 64 MiB each), so the points run.
TEST_P(InterruptTest, Tune) {
  const Interrupted r =
      RunAndInterrupt({"tune", "--sizes", "16M,32M,64M", "--repeats", "1",
                       "--seconds", "3", "--json"},
                      Env(), signal(), absl::Milliseconds(2500));
  ExpectEndedBySignal(r);
  const Json j = Json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["partial"], true);
  bool interrupted = false;
  for (const Json& p : j["points"]) interrupted |= p["status"] == "interrupted";
  EXPECT_TRUE(interrupted) << r.out;
}

// SIGKILL cannot be handled: the tune-point children must still go, by
// themselves (PR_SET_PDEATHSIG), instead of holding pinned memory. The
// device is large enough for the streams, so a point is running when the
// sweep is killed.
TEST(InterruptKillTest, TuneChildrenDieWithAKilledSweep) {
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  testutil::TempDir logs;
  const Interrupted r = RunAndInterrupt(
      {"tune", "--sizes", "16M,32M", "--repeats", "1", "--seconds", "5"},
      {"TPU_LOG_DIR=" + logs.path(), "TPUSHIM_DEVICE=sim://?hbm=512M",
       "PATH=/usr/bin:/bin"},
      SIGKILL, absl::Milliseconds(2500));
  EXPECT_TRUE(r.left_behind.empty())
      << "left running: " << absl::StrJoin(r.left_behind, ", ");
}

TEST_P(InterruptTest, Stress) {
  const Interrupted r =
      RunAndInterrupt({"stress", "--seconds", "60", "--json"}, Env(), signal(),
                      absl::Milliseconds(1500));
  ExpectEndedBySignal(r);
  const Json j = Json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["partial"], true);
  EXPECT_EQ(j["violations"].size(), 0u) << r.out;
}

// Many processes: the signal reaches every stress process, each stops and
// frees its chip, and none is left running.
TEST_P(InterruptTest, StressProcesses) {
  const Interrupted r =
      RunAndInterrupt({"stress", "--processes", "2", "--kills", "0",
                       "--seconds", "60", "--json"},
                      Env(), signal(), absl::Milliseconds(2500));
  ExpectEndedBySignal(r);
  const Json j = Json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["partial"], true);
  EXPECT_EQ(j["problems"], 0) << r.out;
  EXPECT_EQ(j["chips_left_held"], "") << r.out;
  for (const Json& c : j["children"]) {
    EXPECT_EQ(c["violations"], 0) << r.out;
    EXPECT_GT(c["ops"].get<uint64_t>(), 0u) << r.out;
  }
}

// SIGKILL cannot be passed on: the stress processes go by themselves
// (PR_SET_PDEATHSIG) instead of holding their chips and pinned memory.
TEST(InterruptKillTest, StressProcessesDieWithAKilledParent) {
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  testutil::TempDir logs;
  const Interrupted r = RunAndInterrupt(
      {"stress", "--processes", "2", "--kills", "0", "--seconds", "60"},
      {"TPU_LOG_DIR=" + logs.path(), "PATH=/usr/bin:/bin"}, SIGKILL,
      absl::Milliseconds(2500));
  EXPECT_TRUE(r.left_behind.empty())
      << "left running: " << absl::StrJoin(r.left_behind, ", ");
}

INSTANTIATE_TEST_SUITE_P(Signals, InterruptTest,
                         ::testing::Values(SIGINT, SIGTERM), [](const auto& p) {
                           return p.param == SIGINT ? "Sigint" : "Sigterm";
                         });

}  // namespace
}  // namespace tpushim
