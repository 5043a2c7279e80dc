// chip_handover_bench: how long after a chip's holder is killed with
// SIGKILL another process owns the chip.
//
// Each try forks a holder (a System on sim chip 0) and a waiter that polls
// tpushim::ListChips until the chip is free and then creates its own
// System on it, as a launcher waiting for a chip would. The parent kills
// the holder and takes the time; the waiter reports when it saw the chip
// free and when its System::Create returned (CLOCK_MONOTONIC, the same
// clock in every process). Prints median and max over --tries.
//
//   chip_handover_bench [--tries=20]
//
// The parent itself never creates a System (it stays single-threaded, so
// its fork() children may).

#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tpushim/chips.h"
#include "tpushim/system.h"

namespace {

int64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

tpushim::OptionOverrides Chip0() {
  tpushim::OptionOverrides o;
  o.device = "sim://";
  o.premapped_buffer_size = 0;
  o.log_dir = "disabled";
  o.stderr_log_level = 3;
  return o;
}

bool ChipFree() {
  absl::StatusOr<std::vector<tpushim::ChipInfo>> chips =
      tpushim::ListChips(Chip0());
  return chips.ok() && !chips->empty() && !(*chips)[0].held;
}

struct Times {
  int64_t free_ns = 0;   // SIGKILL to the chip seen free
  int64_t owned_ns = 0;  // SIGKILL to System::Create having returned OK
};

bool OneTry(Times& t) {
  int ready[2], report[2];
  if (pipe(ready) != 0 || pipe(report) != 0) return false;
  const pid_t holder = fork();
  if (holder == 0) {
    auto system = tpushim::System::Create(Chip0());
    char c = system.ok() ? 1 : 0;
    (void)!write(ready[1], &c, 1);
    for (;;) pause();
  }
  char c = 0;
  if (read(ready[0], &c, 1) != 1 || c != 1) {
    kill(holder, SIGKILL);
    waitpid(holder, nullptr, 0);
    return false;
  }
  const pid_t waiter = fork();
  if (waiter == 0) {
    char go = 1;
    (void)!write(ready[1], &go, 1);  // polling from now on
    while (!ChipFree()) {
    }
    const int64_t free_at = NowNs();
    auto system = tpushim::System::Create(Chip0());
    int64_t times[2] = {free_at, system.ok() ? NowNs() : -1};
    (void)!write(report[1], times, sizeof(times));
    _exit(0);
  }
  (void)!read(ready[0], &c, 1);
  usleep(20'000);  // the waiter polls a busy chip for a while
  const int64_t killed_at = NowNs();
  kill(holder, SIGKILL);
  int64_t times[2] = {0, -1};
  const bool got = read(report[0], times, sizeof(times)) == sizeof(times);
  waitpid(holder, nullptr, 0);
  waitpid(waiter, nullptr, 0);
  for (int fd : {ready[0], ready[1], report[0], report[1]}) close(fd);
  if (!got || times[1] < 0) return false;
  t.free_ns = times[0] - killed_at;
  t.owned_ns = times[1] - killed_at;
  return true;
}

void Print(const char* what, std::vector<int64_t> ns) {
  std::sort(ns.begin(), ns.end());
  std::printf("%-40s median %8.3f ms   max %8.3f ms   (%zu tries)\n", what,
              ns[ns.size() / 2] / 1e6, ns.back() / 1e6, ns.size());
}

}  // namespace

int main(int argc, char** argv) {
  int tries = 20;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--tries=", 8) == 0) {
      tries = std::atoi(argv[i] + 8);
    } else {
      std::fprintf(stderr, "usage: chip_handover_bench [--tries=N]\n");
      return 2;
    }
  }
  if (tries < 1) return 2;
  std::vector<int64_t> free_ns, owned_ns;
  for (int i = 0; i < tries; ++i) {
    Times t;
    if (!OneTry(t)) {
      std::fprintf(stderr, "try %d failed\n", i);
      return 1;
    }
    free_ns.push_back(t.free_ns);
    owned_ns.push_back(t.owned_ns);
  }
  Print("SIGKILL -> chip seen free (ListChips)", free_ns);
  Print("SIGKILL -> new process owns the chip", owned_ns);
  return 0;
}
