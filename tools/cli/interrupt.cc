#include "tools/cli/interrupt.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"

namespace tpushim::tools {
namespace {

struct State {
  std::atomic<int> signal{0};
  int pipe_read = -1;
  int pipe_write = -1;
  std::mutex mu;
  std::condition_variable cv;
};

State& GetState() {
  static auto* state = new State();
  return *state;
}

void Deliver(int signal) {
  State& s = GetState();
  int expected = 0;
  if (!s.signal.compare_exchange_strong(expected, signal)) return;
  if (s.pipe_write >= 0) {
    const char byte = 1;
    (void)!write(s.pipe_write, &byte, 1);
  }
  std::lock_guard<std::mutex> lock(s.mu);
  s.cv.notify_all();
}

void WatchSignals(sigset_t set) {
  for (;;) {
    int signal = 0;
    if (sigwait(&set, &signal) != 0) continue;
    if (GetState().signal.load() == 0) {
      Deliver(signal);
      continue;
    }
    // A second signal: the user does not want to wait for the tear-down.
    const std::string line = absl::StrCat(
        "\ntpushim: ", InterruptSignalName(signal), " again; exiting now\n");
    (void)!write(STDERR_FILENO, line.data(), line.size());
    _exit(128 + signal);
  }
}

}  // namespace

void InstallInterruptHandling() {
  static std::once_flag once;
  std::call_once(once, [] {
    State& s = GetState();
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) == 0) {
      s.pipe_read = fds[0];
      s.pipe_write = fds[1];
    }
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    std::thread(WatchSignals, set).detach();
  });
}

int InterruptSignal() { return GetState().signal.load(); }

int InterruptFd() { return GetState().pipe_read; }

bool WaitForInterrupt(absl::Duration timeout) {
  State& s = GetState();
  std::unique_lock<std::mutex> lock(s.mu);
  return s.cv.wait_for(lock, absl::ToChronoNanoseconds(timeout),
                       [&s] { return s.signal.load() != 0; });
}

std::string InterruptSignalName(int signal) {
  switch (signal) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    default:
      return absl::StrCat("signal ", signal);
  }
}

void SimulateInterruptForTesting(int signal) {
  if (signal == 0) {
    GetState().signal.store(0);
    return;
  }
  Deliver(signal);
}

}  // namespace tpushim::tools
