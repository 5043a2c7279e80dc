// The fork guard (env/fork_guard.h): a fixed table of the ranges excluded
// from fork, read by a pthread_atfork child handler that reserves each of
// them with no access in the child, and the process id it keeps current.

#include "env/fork_guard.h"

#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000  // Linux 4.17
#endif

namespace tpushim {
namespace {

// Ranges a process excludes at once: one region, one bounce pool and a few
// device mappings per System; thousands of Systems alive at once is far
// beyond any real use.
constexpr size_t kMaxRanges = 4096;
constexpr uintptr_t kClaimed = 1;  // a slot being filled

struct Range {
  std::atomic<uintptr_t> start{0};  // 0 free, kClaimed being filled
  std::atomic<size_t> length{0};
};

std::array<Range, kMaxRanges> g_ranges;
std::atomic<pid_t> g_pid{0};
std::once_flag g_install_once;

// Descriptors closed in children, each stored as fd + 1 (0 = free slot).
constexpr size_t kMaxChildCloses = 256;
std::array<std::atomic<int>, kMaxChildCloses> g_child_closes;

// In the child, before fork() returns there; only system calls.
void OnForkChild() {
  g_pid.store(static_cast<pid_t>(getpid()), std::memory_order_relaxed);
  for (std::atomic<int>& slot : g_child_closes) {
    const int fd = slot.exchange(0, std::memory_order_acq_rel) - 1;
    if (fd >= 0) close(fd);
  }
  for (Range& r : g_ranges) {
    const uintptr_t start = r.start.load(std::memory_order_acquire);
    if (start <= kClaimed) continue;
    const size_t length = r.length.load(std::memory_order_relaxed);
    if (length == 0) continue;
    // MADV_DONTFORK left the child nothing there; keep it that way. A
    // failure leaves the hole, which is only less helpful.
    void* p =
        mmap(reinterpret_cast<void*>(start), length, PROT_NONE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE,
             -1, 0);
    if (p != MAP_FAILED && p != reinterpret_cast<void*>(start)) {
      munmap(p, length);  // a kernel without MAP_FIXED_NOREPLACE
    }
  }
}

}  // namespace

void CloseInForkChild(int fd) {
  (void)CurrentProcessId();  // the child handler is installed from here on
  for (std::atomic<int>& slot : g_child_closes) {
    int expected = 0;
    if (slot.compare_exchange_strong(expected, fd + 1,
                                     std::memory_order_acq_rel)) {
      return;
    }
  }
}

void ForgetCloseInForkChild(int fd) {
  for (std::atomic<int>& slot : g_child_closes) {
    int expected = fd + 1;
    if (slot.compare_exchange_strong(expected, 0, std::memory_order_acq_rel)) {
      return;
    }
  }
}

pid_t CurrentProcessId() {
  pid_t pid = g_pid.load(std::memory_order_relaxed);
  if (pid != 0) return pid;
  std::call_once(g_install_once,
                 [] { pthread_atfork(nullptr, nullptr, &OnForkChild); });
  pid = static_cast<pid_t>(getpid());
  g_pid.store(pid, std::memory_order_relaxed);
  return pid;
}

absl::Status ExcludeFromFork(Os& os, void* addr, size_t length,
                             absl::string_view what) {
  (void)CurrentProcessId();  // the child handler is installed from here on
  Range* slot = nullptr;
  for (Range& r : g_ranges) {
    uintptr_t expected = 0;
    if (r.start.compare_exchange_strong(expected, kClaimed,
                                        std::memory_order_acq_rel)) {
      slot = &r;
      break;
    }
  }
  if (slot == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("Cannot exclude ", what, " from fork(): ", kMaxRanges,
                     " ranges are excluded already in this process"));
  }
  absl::Status s = os.Madvise(addr, length, MADV_DONTFORK);
  if (!s.ok()) {
    slot->start.store(0, std::memory_order_release);
    return absl::Status(
        s.code(), absl::StrCat("Excluding ", what, " from fork() (",
                               "madvise MADV_DONTFORK) failed: ", s.message()));
  }
  slot->length.store(length, std::memory_order_relaxed);
  slot->start.store(reinterpret_cast<uintptr_t>(addr),
                    std::memory_order_release);
  return absl::OkStatus();
}

void ForgetForkExclusion(const void* addr) {
  const uintptr_t start = reinterpret_cast<uintptr_t>(addr);
  if (start <= kClaimed) return;
  for (Range& r : g_ranges) {
    if (r.start.load(std::memory_order_acquire) != start) continue;
    r.length.store(0, std::memory_order_relaxed);
    r.start.store(0, std::memory_order_release);
    return;
  }
}

bool IsExcludedFromFork(const void* addr) {
  const uintptr_t start = reinterpret_cast<uintptr_t>(addr);
  if (start <= kClaimed) return false;
  for (const Range& r : g_ranges) {
    if (r.start.load(std::memory_order_acquire) == start) return true;
  }
  return false;
}

absl::Status ForkedChildError(absl::string_view what, pid_t owner) {
  return absl::FailedPreconditionError(absl::StrCat(
      what, " was created by process ", owner, "; process ", CurrentProcessId(),
      " is a fork() child of it and cannot use it (its threads, pinned "
      "memory and devices stayed with the parent): create a System in the "
      "child, or fork before creating one"));
}

}  // namespace tpushim
