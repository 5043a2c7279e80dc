// Choosing the log directory: the configured one if usable,
// else /tmp/tpu_logs_<user>, else none (stderr only), with one sentence
// saying what happened and why.
//
// Usable means: it exists (a missing leaf is created; its parent is not),
// lstat says a directory, or a symlink owned by the effective uid or root
// whose target stat says is a directory; the directory is owned by the
// effective uid or root; and access(W_OK|X_OK) succeeds. Every check goes
// through the Os, so tests fake owners and permissions.
//
// Thread-safety: thread-safe as the Os is.
//
//   LogDirectoryChoice choice = ChooseLogDirectory(*os, "/tmp/tpu_logs");
//   if (!choice.warning.empty()) { ... one WARNING ... }

#ifndef TPUSHIM_LOGGING_LOG_DIRECTORY_H_
#define TPUSHIM_LOGGING_LOG_DIRECTORY_H_

#include <sys/types.h>

#include <string>

#include "absl/status/status.h"
#include "env/os.h"

namespace tpushim::logging::internal {

// Checks that `dir` is usable, first creating it with `create_mode` when it
// does not exist. OK when usable; otherwise a status whose message is a
// sentence fragment starting with `dir` that says why, e.g.
// "/tmp/tpu_logs is owned by uid 1001, not by you (uid 0)":
// PERMISSION_DENIED for ownership and access, FAILED_PRECONDITION for
// something that is not a directory, the Os's status when a call fails.
absl::Status PrepareLogDirectory(Os& os, const std::string& dir,
                                 mode_t create_mode);

// "/tmp/tpu_logs_<user>".
std::string FallbackLogDirectory(Os& os);

struct LogDirectoryChoice {
  // Where the log files go; "" = no files.
  std::string directory;
  // Empty when `configured` was used (or was "", files disabled);
  // otherwise one sentence for the WARNING, e.g. "Log directory
  // /tmp/tpu_logs is owned by uid 1001, not by you (uid 0); logging to
  // /tmp/tpu_logs_bob instead".
  std::string warning;
};

// `configured` (mode 0755 if created) if usable, else the fallback (mode
// 0700 if created) if usable, else none. `configured` "" means files are
// disabled: no directory, no warning.
LogDirectoryChoice ChooseLogDirectory(Os& os, const std::string& configured);

}  // namespace tpushim::logging::internal

#endif  // TPUSHIM_LOGGING_LOG_DIRECTORY_H_
