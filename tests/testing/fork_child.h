// Running a piece of a test in a real fork() child: the body runs in the
// child and its return value is the child's exit code (_exit, so nothing
// of the parent's is torn down there). The parent waits at most `timeout`,
// then kills the child with SIGKILL and reaps it: no test leaves a
// process behind.
//
//   ForkResult r = RunForkedChild([&] { return buffer[0] == 1 ? 0 : 1; });
//   EXPECT_TRUE(r.Exited(0)) << r.Describe();

#ifndef TPUSHIM_TESTS_TESTING_FORK_CHILD_H_
#define TPUSHIM_TESTS_TESTING_FORK_CHILD_H_

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <functional>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tpushim::testutil {

struct ForkResult {
  bool forked = false;
  bool timed_out = false;
  int status = 0;  // waitpid's

  bool Exited(int code) const {
    return forked && !timed_out && WIFEXITED(status) &&
           WEXITSTATUS(status) == code;
  }
  bool KilledBy(int signal) const {
    return forked && !timed_out && WIFSIGNALED(status) &&
           WTERMSIG(status) == signal;
  }
  std::string Describe() const {
    if (!forked) return "fork() failed";
    if (timed_out) return "the child did not finish in time (killed)";
    if (WIFEXITED(status)) {
      return absl::StrCat("the child exited with ", WEXITSTATUS(status));
    }
    if (WIFSIGNALED(status)) {
      return absl::StrCat("the child was killed by signal ", WTERMSIG(status));
    }
    return absl::StrCat("the child ended with status ", status);
  }
};

// Waits for `pid` at most `timeout`; kills and reaps it after that.
inline ForkResult WaitForChild(pid_t pid,
                               absl::Duration timeout = absl::Seconds(20)) {
  ForkResult r;
  r.forked = true;
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    const pid_t done = waitpid(pid, &r.status, WNOHANG);
    if (done == pid) return r;
    if (done < 0 && errno != EINTR) return r;
    if (absl::Now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &r.status, 0);
      r.timed_out = true;
      return r;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

// Forks; the child runs `body` and _exits with its result.
inline pid_t ForkChild(const std::function<int()>& body) {
  const pid_t pid = fork();
  if (pid == 0) _exit(body());
  return pid;
}

inline ForkResult RunForkedChild(const std::function<int()>& body,
                                 absl::Duration timeout = absl::Seconds(20)) {
  const pid_t pid = ForkChild(body);
  if (pid < 0) return ForkResult{};
  return WaitForChild(pid, timeout);
}

}  // namespace tpushim::testutil

#endif  // TPUSHIM_TESTS_TESTING_FORK_CHILD_H_
