// hostile_launcher: runs a program in a hostile environment that its
// command line sets up step by step, for the tests in tests/hostile/.
//
//   hostile_launcher [STEP...] -- PROGRAM [ARG...]
//
// Steps, applied in the order given (they need root):
//   --private-tmp=DIR    a private mount namespace (unshare(CLONE_NEWNS),
//                        every mount made private) with DIR bind-mounted
//                        over /tmp: the program's /tmp is DIR, and nothing
//                        it does there reaches the machine's /tmp.
//   --tmpfs=PATH:BYTES   mounts a tmpfs of BYTES bytes at PATH (a full disk
//                        in the making; after --private-tmp).
//   --memlock=BYTES      sets RLIMIT_MEMLOCK, soft and hard.
//   --user=UID:GID       becomes UID and GID with no supplementary group,
//                        and checks that no capability is left (root's
//                        CAP_IPC_LOCK is what ignores RLIMIT_MEMLOCK).
//   --copy-back=FROM:TO  once PROGRAM has ended, copies the directory FROM
//                        to TO (symlinks as symlinks): how a test sees what
//                        was left in a tmpfs that goes with the namespace.
// Then PROGRAM runs as a child, with the launcher's environment (the test
// sets it exactly), under PR_SET_PDEATHSIG so that it dies with the
// launcher (a test's timeout kills the launcher). The launcher ends as the
// program did: with its exit status, or by the same signal.
//
// A step that fails ends the launcher with status 125 and one line,
//   hostile_launcher: --private-tmp=/tmp/x: unshare(CLONE_NEWNS): Operation not
//   permitted
// so a test can tell a machine that cannot host it from a failing program;
// a program that cannot be started ends it with 127.

#include <errno.h>
#include <grp.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace {

constexpr int kSetupFailed = 125;
constexpr int kCannotRun = 127;

[[noreturn]] void Fail(const std::string& step, const std::string& what,
                       int error = 0) {
  std::fprintf(stderr, "hostile_launcher: %s: %s%s%s\n", step.c_str(),
               what.c_str(), error != 0 ? ": " : "",
               error != 0 ? strerror(error) : "");
  std::exit(kSetupFailed);
}

// "A:B" → {"A", "B"}; a step without the colon is malformed.
std::pair<std::string, std::string> SplitPair(const std::string& step,
                                              const std::string& value) {
  const size_t colon = value.rfind(':');
  if (colon == std::string::npos) Fail(step, "expected <a>:<b>");
  return {value.substr(0, colon), value.substr(colon + 1)};
}

uint64_t ParseNumber(const std::string& step, const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0) {
    Fail(step, "\"" + text + "\" is not a decimal number");
  }
  return v;
}

void PrivateTmp(const std::string& step, const std::string& dir) {
  if (unshare(CLONE_NEWNS) != 0) Fail(step, "unshare(CLONE_NEWNS)", errno);
  // Without this, the mounts below would propagate to the machine's
  // namespace on systems where / is a shared mount (systemd's default).
  if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    Fail(step, "making every mount private", errno);
  }
  if (mount(dir.c_str(), "/tmp", nullptr, MS_BIND | MS_REC, nullptr) != 0) {
    Fail(step, "bind-mounting it over /tmp", errno);
  }
}

void Tmpfs(const std::string& step, const std::string& value) {
  const auto [path, bytes] = SplitPair(step, value);
  const std::string options =
      "size=" + std::to_string(ParseNumber(step, bytes)) + ",mode=0755";
  if (mount("tmpfs", path.c_str(), "tmpfs", MS_NOSUID | MS_NODEV,
            options.c_str()) != 0) {
    Fail(step, "mount -t tmpfs -o " + options, errno);
  }
}

void Memlock(const std::string& step, const std::string& value) {
  const rlim_t bytes = ParseNumber(step, value);
  const rlimit limit = {bytes, bytes};
  if (setrlimit(RLIMIT_MEMLOCK, &limit) != 0) {
    Fail(step, "setrlimit(RLIMIT_MEMLOCK)", errno);
  }
}

// The hex mask of `field` ("CapEff") in /proc/self/status.
std::string CapabilityMask(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field + ":", 0) == 0) {
      const size_t start = line.find_first_not_of(" \t", field.size() + 1);
      return start == std::string::npos ? "" : line.substr(start);
    }
  }
  return "";
}

void BecomeUser(const std::string& step, const std::string& value) {
  const auto [uid_text, gid_text] = SplitPair(step, value);
  const uid_t uid = static_cast<uid_t>(ParseNumber(step, uid_text));
  const gid_t gid = static_cast<gid_t>(ParseNumber(step, gid_text));
  // Groups and group first: once the uid is not 0 they cannot change.
  if (setgroups(0, nullptr) != 0) Fail(step, "setgroups(0)", errno);
  if (setgid(gid) != 0) Fail(step, "setgid", errno);
  if (setuid(uid) != 0) Fail(step, "setuid", errno);
  if (getuid() != uid || geteuid() != uid || getgid() != gid) {
    Fail(step, "the ids did not change");
  }
  // Leaving uid 0 for good clears the permitted and effective sets (no
  // SECBIT_KEEP_CAPS here); a launcher that kept CAP_IPC_LOCK would make
  // the memlock tests pass for the wrong reason.
  for (const char* field : {"CapPrm", "CapEff", "CapAmb"}) {
    const std::string mask = CapabilityMask(field);
    if (mask.find_first_not_of('0') != std::string::npos) {
      Fail(step, std::string(field) + " is " + mask + ", not empty");
    }
  }
}

void CopyBack(const std::string& step, const std::string& value) {
  const auto [from, to] = SplitPair(step, value);
  std::error_code error;
  std::filesystem::copy(from, to,
                        std::filesystem::copy_options::recursive |
                            std::filesystem::copy_options::copy_symlinks,
                        error);
  if (error) Fail(step, "copying: " + error.message());
}

}  // namespace

int main(int argc, char** argv) {
  int i = 1;
  std::vector<std::string> copy_backs;
  for (; i < argc && std::string(argv[i]) != "--"; ++i) {
    const std::string step = argv[i];
    const size_t equals = step.find('=');
    const std::string name = step.substr(0, equals);
    const std::string value =
        equals == std::string::npos ? "" : step.substr(equals + 1);
    if (name == "--private-tmp") {
      PrivateTmp(step, value);
    } else if (name == "--tmpfs") {
      Tmpfs(step, value);
    } else if (name == "--memlock") {
      Memlock(step, value);
    } else if (name == "--user") {
      BecomeUser(step, value);
    } else if (name == "--copy-back") {
      copy_backs.push_back(step);
    } else {
      Fail(step, "unknown step");
    }
  }
  if (i + 1 >= argc) Fail("command line", "expected -- PROGRAM [ARG...]");
  char** program = argv + i + 1;

  const pid_t parent = getpid();
  const pid_t child = fork();
  if (child < 0) Fail(program[0], "fork", errno);
  if (child == 0) {
    // Set after the credential changes, which clear it.
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) {
      _exit(kCannotRun);
    }
    execv(program[0], program);
    std::fprintf(stderr, "hostile_launcher: %s: %s\n", program[0],
                 strerror(errno));
    _exit(kCannotRun);
  }
  int status = 0;
  while (waitpid(child, &status, 0) < 0) {
    if (errno != EINTR) Fail(program[0], "waitpid", errno);
  }
  for (const std::string& step : copy_backs) {
    CopyBack(step, step.substr(step.find('=') + 1));
  }
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    signal(sig, SIG_DFL);
    raise(sig);
    return 128 + sig;
  }
  return WEXITSTATUS(status);
}
