// Runs a program as a child process with an exact argv and environment and
// captures what it writes: `tpushim tune` runs each sweep point this way,
// and the end-to-end tests of the `tpushim` tool run the tool this way.
//
// The child is started with posix_spawn and an explicit envp: it inherits
// no environment variable from the caller (sanitizer options and the chip run
// directory aside, see
// RunSubprocess), and the caller never needs setenv. Its stdin is /dev/null;
// stdout and stderr are read through pipes, concurrently, so neither can fill
// up and stall the child.
//
//   absl::StatusOr<SubprocessResult> r = RunSubprocess(
//       TPUSHIM_TOOL_PATH, {"info", "--json"},
//       {"TPU_PREMAPPED_BUFFER_SIZE=8589934592"});
//   ASSERT_TRUE(r.ok()) << r.status();
//   EXPECT_EQ(r->exit_code, 0) << r->err;
//
// Thread-safety: thread-safe; each call owns its child and pipes.

#ifndef TPUSHIM_COMMON_SUBPROCESS_H_
#define TPUSHIM_COMMON_SUBPROCESS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tpushim {

struct SubprocessResult {
  // The child's exit status, or -1 when a signal ended it.
  int exit_code = -1;
  // The signal that ended the child, else 0.
  int term_signal = 0;
  std::string out;  // everything written to stdout
  std::string err;  // everything written to stderr
  // From start to reaped, and the child's peak resident set (wait4's
  // ru_maxrss).
  absl::Duration wall_time;
  uint64_t max_rss_bytes = 0;
};

// Runs `path` with argv[0] = `path` followed by `args`, in the environment
// `env` ("NAME=value" strings, nothing else but the caller's sanitizer
// options ASAN_/LSAN_/UBSAN_/TSAN_/MSAN_OPTIONS that `env` does not set, so
// that a sanitizer job's settings reach instrumented children, and its
// TPUSHIM_RUN_DIR, so that the child meets the same chip locks), and waits
// for it to end.
//
// Returns the result whatever the child's exit status. Errors: the status
// of a failed pipe/posix_spawn/poll/waitpid (e.g. NOT_FOUND for a missing
// program); DEADLINE_EXCEEDED, naming the command and what it had written,
// when the child runs longer than `timeout`; CANCELLED when `cancel_fd`
// (if >= 0) becomes readable first. The child leads a process group of its
// own and starts with no signal blocked; when it ends, times out or is
// cancelled, the whole group is killed with SIGKILL and the child reaped,
// so nothing it started outlives the call.
absl::StatusOr<SubprocessResult> RunSubprocess(
    const std::string& path, const std::vector<std::string>& args,
    const std::vector<std::string>& env,
    absl::Duration timeout = absl::Seconds(120), int cancel_fd = -1);

}  // namespace tpushim

#endif  // TPUSHIM_COMMON_SUBPROCESS_H_
