#include "common/subprocess.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tpushim {
namespace {

// Closes the descriptors it holds when it goes out of scope.
class Pipe {
 public:
  Pipe() = default;
  Pipe(const Pipe&) = delete;
  Pipe& operator=(const Pipe&) = delete;
  ~Pipe() {
    CloseRead();
    CloseWrite();
  }

  absl::Status Open() {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return absl::ErrnoToStatus(errno, "pipe2");
    read_fd_ = fds[0];
    write_fd_ = fds[1];
    return absl::OkStatus();
  }
  int read_fd() const { return read_fd_; }
  int write_fd() const { return write_fd_; }
  void CloseRead() { CloseFd(read_fd_); }
  void CloseWrite() { CloseFd(write_fd_); }

 private:
  static void CloseFd(int& fd) {
    if (fd >= 0) close(fd);
    fd = -1;
  }

  int read_fd_ = -1;
  int write_fd_ = -1;
};

// posix_spawn_file_actions_t with its destroy.
class FileActions {
 public:
  FileActions() { posix_spawn_file_actions_init(&actions_); }
  FileActions(const FileActions&) = delete;
  FileActions& operator=(const FileActions&) = delete;
  ~FileActions() { posix_spawn_file_actions_destroy(&actions_); }
  posix_spawn_file_actions_t* get() { return &actions_; }

 private:
  posix_spawn_file_actions_t actions_;
};

// A NULL-terminated char* array over `strings`, which must outlive it.
std::vector<char*> CStringArray(const std::vector<std::string>& strings) {
  std::vector<char*> array;
  array.reserve(strings.size() + 1);
  for (const std::string& s : strings) {
    array.push_back(const_cast<char*>(s.c_str()));
  }
  array.push_back(nullptr);
  return array;
}

// `env` plus the caller's sanitizer runtime options that `env` does not
// set: in a sanitizer build the child is instrumented too, and a job's
// settings (suppressions, halt_on_error, leak checking) must reach it.
// Likewise the caller's chip run directory (TPUSHIM_RUN_DIR): a child sees
// the chips of its parent's host, held by the same processes.
std::vector<std::string> WithSanitizerOptions(
    const std::vector<std::string>& env) {
  std::vector<std::string> out = env;
  for (const char* name : {"ASAN_OPTIONS", "LSAN_OPTIONS", "UBSAN_OPTIONS",
                           "TSAN_OPTIONS", "MSAN_OPTIONS", "TPUSHIM_RUN_DIR"}) {
    const char* value = getenv(name);
    if (value == nullptr) continue;
    const std::string prefix = absl::StrCat(name, "=");
    const bool set = std::any_of(env.begin(), env.end(), [&](const auto& e) {
      return absl::StartsWith(e, prefix);
    });
    if (!set) out.push_back(absl::StrCat(prefix, value));
  }
  return out;
}

absl::Status WaitForChild(pid_t pid, int* wait_status, rusage* usage) {
  while (wait4(pid, wait_status, 0, usage) < 0) {
    if (errno != EINTR) return absl::ErrnoToStatus(errno, "waitpid");
  }
  return absl::OkStatus();
}

enum class Drained { kEnd, kTimeout, kCancelled };

// Reads both pipes until the child closes them, `deadline` passes or
// `cancel_fd` (when >= 0) becomes readable.
absl::StatusOr<Drained> DrainUntil(
    int out_fd, int err_fd, int cancel_fd,
    std::chrono::steady_clock::time_point deadline, SubprocessResult& result) {
  struct Stream {
    int fd;
    std::string* sink;
  };
  std::vector<Stream> open_streams = {{out_fd, &result.out},
                                      {err_fd, &result.err}};
  char buffer[65536];
  while (!open_streams.empty()) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return Drained::kTimeout;
    std::vector<pollfd> fds;
    for (const Stream& s : open_streams) fds.push_back({s.fd, POLLIN, 0});
    if (cancel_fd >= 0) fds.push_back({cancel_fd, POLLIN, 0});
    const int ready = poll(fds.data(), fds.size(),
                           static_cast<int>(std::min<int64_t>(
                               left.count(), int64_t{60} * 60 * 1000)));
    if (ready < 0) {
      if (errno == EINTR) continue;
      return absl::ErrnoToStatus(errno, "poll");
    }
    if (cancel_fd >= 0 && fds.back().revents != 0) return Drained::kCancelled;
    for (size_t i = open_streams.size(); i-- > 0;) {
      if (fds[i].revents == 0) continue;
      const ssize_t n = read(fds[i].fd, buffer, sizeof(buffer));
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (n < 0) return absl::ErrnoToStatus(errno, "read");
      if (n == 0) {
        open_streams.erase(open_streams.begin() + static_cast<ptrdiff_t>(i));
        continue;
      }
      open_streams[i].sink->append(buffer, static_cast<size_t>(n));
    }
  }
  return Drained::kEnd;
}

// posix_spawnattr_t with its destroy.
class SpawnAttributes {
 public:
  SpawnAttributes() { posix_spawnattr_init(&attr_); }
  SpawnAttributes(const SpawnAttributes&) = delete;
  SpawnAttributes& operator=(const SpawnAttributes&) = delete;
  ~SpawnAttributes() { posix_spawnattr_destroy(&attr_); }
  posix_spawnattr_t* get() { return &attr_; }

 private:
  posix_spawnattr_t attr_;
};

}  // namespace

absl::StatusOr<SubprocessResult> RunSubprocess(
    const std::string& path, const std::vector<std::string>& args,
    const std::vector<std::string>& env, absl::Duration timeout,
    int cancel_fd) {
  const absl::Time start = absl::Now();
  const auto deadline =
      std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(timeout);
  Pipe out_pipe;
  Pipe err_pipe;
  if (absl::Status s = out_pipe.Open(); !s.ok()) return s;
  if (absl::Status s = err_pipe.Open(); !s.ok()) return s;

  // dup2 clears FD_CLOEXEC on the child's 1 and 2; every pipe end opened
  // above is close-on-exec, so the child holds only those.
  FileActions actions;
  posix_spawn_file_actions_addopen(actions.get(), STDIN_FILENO, "/dev/null",
                                   O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(actions.get(), out_pipe.write_fd(),
                                   STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(actions.get(), err_pipe.write_fd(),
                                   STDERR_FILENO);

  std::vector<std::string> argv_strings = {path};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv = CStringArray(argv_strings);
  std::vector<std::string> env_strings = WithSanitizerOptions(env);
  std::vector<char*> envp = CStringArray(env_strings);

  // The child leads a process group of its own, so that killing the group
  // ends whatever it started too; it starts with no signal blocked and
  // SIGINT and SIGTERM at their defaults, whatever the caller does with them
  // (a tool that waits for them with sigwait blocks them in every thread).
  SpawnAttributes attributes;
  sigset_t none;
  sigemptyset(&none);
  sigset_t defaults;
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGINT);
  sigaddset(&defaults, SIGTERM);
  posix_spawnattr_setpgroup(attributes.get(), 0);
  posix_spawnattr_setsigmask(attributes.get(), &none);
  posix_spawnattr_setsigdefault(attributes.get(), &defaults);
  posix_spawnattr_setflags(attributes.get(), POSIX_SPAWN_SETPGROUP |
                                                 POSIX_SPAWN_SETSIGMASK |
                                                 POSIX_SPAWN_SETSIGDEF);

  pid_t pid = 0;
  const int spawn_error =
      posix_spawn(&pid, path.c_str(), actions.get(), attributes.get(),
                  argv.data(), envp.data());
  if (spawn_error != 0) {
    return absl::ErrnoToStatus(spawn_error,
                               absl::StrCat("posix_spawn(", path, ")"));
  }
  // Only the child writes now: the read ends see EOF when it exits.
  out_pipe.CloseWrite();
  err_pipe.CloseWrite();

  SubprocessResult result;
  absl::StatusOr<Drained> finished = DrainUntil(
      out_pipe.read_fd(), err_pipe.read_fd(), cancel_fd, deadline, result);
  if (!finished.ok() || *finished != Drained::kEnd) kill(-pid, SIGKILL);
  // Once the child has ended, and before it is reaped (its pid, the
  // group's id, cannot be reused until then), whatever else is left in
  // its group goes too.
  siginfo_t ended{};
  while (waitid(P_PID, static_cast<id_t>(pid), &ended, WEXITED | WNOWAIT) < 0 &&
         errno == EINTR) {
  }
  kill(-pid, SIGKILL);
  int wait_status = 0;
  rusage usage{};
  if (absl::Status s = WaitForChild(pid, &wait_status, &usage); !s.ok()) {
    return s;
  }
  result.wall_time = absl::Now() - start;
  result.max_rss_bytes = static_cast<uint64_t>(usage.ru_maxrss) * 1024;
  if (!finished.ok()) return finished.status();
  if (*finished == Drained::kCancelled) {
    return absl::CancelledError(absl::StrCat(
        "`", absl::StrJoin(argv_strings, " "), "` was cancelled and killed"));
  }
  if (*finished == Drained::kTimeout) {
    return absl::DeadlineExceededError(absl::StrCat(
        "`", absl::StrJoin(argv_strings, " "), "` ran longer than ",
        absl::FormatDuration(timeout), "; killed. stdout so far:\n", result.out,
        "\nstderr so far:\n", result.err));
  }
  if (WIFEXITED(wait_status)) {
    result.exit_code = WEXITSTATUS(wait_status);
  } else if (WIFSIGNALED(wait_status)) {
    result.term_signal = WTERMSIG(wait_status);
  }
  return result;
}

}  // namespace tpushim
