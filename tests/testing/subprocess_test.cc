// Tests of the subprocess helper the tool tests are built on.

#include "tests/testing/subprocess.h"

#include <signal.h>

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpushim::testutil {
namespace {

using ::testing::HasSubstr;

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
  EXPECT_EQ(r->out, "TPUSHIM_A=1\nTPUSHIM_B=two words\n");
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

}  // namespace
}  // namespace tpushim::testutil
