// Tests of the subprocess helper the tool tests are built on.

#include "tests/testing/subprocess.h"

#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpushim::testutil {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kShell[] = "/bin/sh";

TEST(RunSubprocessTest, CapturesStdoutStderrAndExitCode) {
  absl::StatusOr<SubprocessResult> r =
      RunSubprocess(kShell, {"-c", "echo out; echo err >&2; exit 3"}, {});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 3);
  EXPECT_EQ(r->term_signal, 0);
  EXPECT_EQ(r->out, "out\n");
  EXPECT_EQ(r->err, "err\n");
}

TEST(RunSubprocessTest, PassesExactlyTheGivenEnvironment) {
  absl::StatusOr<SubprocessResult> r =
      RunSubprocess("/usr/bin/env", {}, {"TPUSHIM_A=1", "TPUSHIM_B=two words"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 0);
  // Nothing else, but the sanitizer options a sanitizer job sets (see
  // PassesOnTheCallersSanitizerOptionsOnly) and the chip run directory.
  std::string others;
  for (absl::string_view line :
       absl::StrSplit(r->out, '\n', absl::SkipEmpty())) {
    const absl::string_view name = line.substr(0, line.find('='));
    if (!absl::StrContains(name, "SAN_OPTIONS") && name != "TPUSHIM_RUN_DIR") {
      absl::StrAppend(&others, line, "\n");
    }
  }
  EXPECT_EQ(others, "TPUSHIM_A=1\nTPUSHIM_B=two words\n");
}

TEST(RunSubprocessTest, PassesOnTheCallersChipRunDirectory) {
  // Every test process has one (tests/testing/private_run_dir.cc).
  const char* run_dir = getenv("TPUSHIM_RUN_DIR");
  ASSERT_NE(run_dir, nullptr);
  absl::StatusOr<SubprocessResult> r = RunSubprocess("/usr/bin/env", {}, {});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->out, HasSubstr(absl::StrCat("TPUSHIM_RUN_DIR=", run_dir)));
  r = RunSubprocess("/usr/bin/env", {}, {"TPUSHIM_RUN_DIR=/elsewhere"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->out, HasSubstr("TPUSHIM_RUN_DIR=/elsewhere\n"));
  EXPECT_THAT(r->out, Not(HasSubstr(run_dir)));
}

TEST(RunSubprocessTest, DrainsLargeOutputOnBothStreams) {
  // 1 MiB on each stream: far more than a pipe buffer holds.
  absl::StatusOr<SubprocessResult> r = RunSubprocess(
      kShell,
      {"-c",
       "head -c 1048576 /dev/zero; head -c 1048576 /dev/zero >&2; exit 0"},
      {"PATH=/usr/bin:/bin"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 0) << r->err.substr(0, 200);
  EXPECT_EQ(r->out.size(), 1u << 20);
  EXPECT_EQ(r->err.size(), 1u << 20);
}

TEST(RunSubprocessTest, ReportsTheSignalThatEndedTheChild) {
  absl::StatusOr<SubprocessResult> r =
      RunSubprocess(kShell, {"-c", "kill -TERM $$"}, {});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, -1);
  EXPECT_EQ(r->term_signal, SIGTERM);
}

TEST(RunSubprocessTest, MissingProgramIsNotFound) {
  absl::StatusOr<SubprocessResult> r =
      RunSubprocess("/nonexistent/tpushim", {}, {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("/nonexistent/tpushim"));
}

TEST(RunSubprocessTest, KillsAChildThatOutlivesTheTimeout) {
  absl::StatusOr<SubprocessResult> r =
      RunSubprocess(kShell, {"-c", "echo started; exec sleep 30"},
                    {"PATH=/usr/bin:/bin"}, absl::Milliseconds(300));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("started"));
}

// True while a process with that pid exists (a zombie counts as gone).
bool Alive(pid_t pid) {
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() &&
         line[paren + 2] != 'Z';
}

// The child leads its own process group, and what it starts in that group
// dies with it: a grandchild left sleeping in the background is killed
// once the child exits.
TEST(RunSubprocessTest, ChildLeadsAGroupThatIsKilledWhenItEnds) {
  absl::StatusOr<SubprocessResult> r =
      RunSubprocess(kShell,
                    {"-c",
                     "read -r _ _ _ _ pgid _ < /proc/$$/stat; echo $$ $pgid; "
                     "sleep 30 >/dev/null 2>&1 & echo $!"},
                    {"PATH=/usr/bin:/bin"}, absl::Seconds(10));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 0) << r->err;
  std::vector<std::string> words =
      absl::StrSplit(r->out, absl::ByAnyChar(" \n"), absl::SkipEmpty());
  ASSERT_EQ(words.size(), 3u) << r->out;
  EXPECT_EQ(words[0], words[1]) << "the child is not its group's leader";
  const pid_t grandchild = std::stoi(words[2]);
  for (int i = 0; i < 100 && Alive(grandchild); ++i)
    absl::SleepFor(absl::Milliseconds(10));
  EXPECT_FALSE(Alive(grandchild)) << "the background sleep outlived the call";
}

// A readable cancel fd ends the wait at once: the child and its group are
// killed and the call is CANCELLED.
TEST(RunSubprocessTest, CancelFdKillsTheChildAndItsGroup) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  std::thread canceller([&] {
    absl::SleepFor(absl::Milliseconds(200));
    ASSERT_EQ(write(fds[1], "x", 1), 1);
  });
  const absl::Time start = absl::Now();
  absl::StatusOr<SubprocessResult> r =
      RunSubprocess(kShell, {"-c", "sleep 30 & echo $!; wait"},
                    {"PATH=/usr/bin:/bin"}, absl::Seconds(20), fds[0]);
  canceller.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled) << r.status();
  close(fds[0]);
  close(fds[1]);
}

// A caller that blocks SIGINT and SIGTERM (as the tool does, to wait for
// them on one thread) does not pass that on: the child can be interrupted.
TEST(RunSubprocessTest, ChildStartsWithNoSignalBlocked) {
  sigset_t block, old;
  sigemptyset(&block);
  sigaddset(&block, SIGINT);
  sigaddset(&block, SIGTERM);
  ASSERT_EQ(pthread_sigmask(SIG_BLOCK, &block, &old), 0);
  absl::StatusOr<SubprocessResult> r =
      RunSubprocess(kShell, {"-c", "grep SigBlk /proc/self/status"},
                    {"PATH=/usr/bin:/bin"}, absl::Seconds(10));
  ASSERT_EQ(pthread_sigmask(SIG_SETMASK, &old, nullptr), 0);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->out, HasSubstr("SigBlk:\t0000000000000000"));
}

TEST(RunSubprocessTest, PassesOnTheCallersSanitizerOptionsOnly) {
  // The one test here that sets a variable: a sanitizer option, saved and
  // restored, since a sanitizer job sets them for the whole run.
  const char* saved = getenv("UBSAN_OPTIONS");
  const std::string saved_value = saved != nullptr ? saved : "";
  ASSERT_EQ(setenv("UBSAN_OPTIONS", "print_stacktrace=1", 1), 0);
  absl::StatusOr<SubprocessResult> inherited =
      RunSubprocess("/usr/bin/env", {}, {"A=1"});
  absl::StatusOr<SubprocessResult> overridden =
      RunSubprocess("/usr/bin/env", {}, {"UBSAN_OPTIONS=halt_on_error=1"});
  if (saved != nullptr) {
    setenv("UBSAN_OPTIONS", saved_value.c_str(), 1);
  } else {
    unsetenv("UBSAN_OPTIONS");
  }
  ASSERT_TRUE(inherited.ok()) << inherited.status();
  EXPECT_THAT(inherited->out, HasSubstr("A=1\n"));
  EXPECT_THAT(inherited->out, HasSubstr("UBSAN_OPTIONS=print_stacktrace=1\n"));
  EXPECT_THAT(inherited->out, Not(HasSubstr("PATH=")));
  ASSERT_TRUE(overridden.ok()) << overridden.status();
  EXPECT_THAT(overridden->out, HasSubstr("UBSAN_OPTIONS=halt_on_error=1\n"));
  EXPECT_THAT(overridden->out, Not(HasSubstr("print_stacktrace")));
}

}  // namespace
}  // namespace tpushim::testutil
