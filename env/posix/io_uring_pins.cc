#include "env/posix/io_uring_pins.h"

#include <errno.h>
#include <linux/io_uring.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace tpushim {
namespace {

int Register(int fd, unsigned op, void* arg, unsigned nr) {
  return static_cast<int>(syscall(__NR_io_uring_register, fd, op, arg, nr));
}

// VmPin of /proc/self/status, in KiB; -1 when it cannot be read.
int64_t PinnedKiB(Os* os) {
  absl::StatusOr<std::string> status = os->ReadFile("/proc/self/status");
  if (!status.ok()) return -1;
  for (absl::string_view line : absl::StrSplit(*status, '\n')) {
    if (!absl::ConsumePrefix(&line, "VmPin:")) continue;
    line = absl::StripAsciiWhitespace(line);
    absl::ConsumeSuffix(&line, "kB");
    int64_t kib = 0;
    return absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &kib) ? kib : -1;
  }
  return -1;
}

}  // namespace

std::unique_ptr<IoUringPins> IoUringPins::Open(Os* os, std::string* why,
                                               UnpinFault unpin_fault) {
  auto fail = [why](absl::string_view what, int err) {
    if (why != nullptr) {
      *why = err == 0 ? std::string(what)
                      : absl::StrCat(what, ": ", std::strerror(err));
    }
    return nullptr;
  };
  io_uring_params params{};
  const int fd = static_cast<int>(syscall(__NR_io_uring_setup, 1, &params));
  if (fd < 0) return fail("io_uring_setup", errno);
  io_uring_rsrc_register table{};
  table.nr = kSlots;
  table.flags = IORING_RSRC_REGISTER_SPARSE;
  if (Register(fd, IORING_REGISTER_BUFFERS2, &table, sizeof(table)) != 0) {
    const int err = errno;
    close(fd);
    return fail("io_uring_register(IORING_REGISTER_BUFFERS2, sparse)", err);
  }
  auto pins =
      std::unique_ptr<IoUringPins>(new IoUringPins(fd, std::move(unpin_fault)));
  // Kernels from 5.19 to about 6.3 release an emptied slot's pages from a
  // delayed work item, up to a second later: pins would pile up past the
  // bound on pinned bytes and into the memlock limit. Pin one page and
  // check that the kernel counts it (VmPin) and stops counting it at once.
  // The page is a mapping of its own, never part of a transparent huge
  // page (which would count 2 MiB); the rise may be more than 4 KiB (64
  // KiB pages) and other pins of the process may come and go meanwhile,
  // so the test is a rise of at least a page and a fall of at least as
  // much, tried a few times.
  const size_t page_size = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const int64_t page_kib = static_cast<int64_t>(page_size / 1024);
  void* mapped = mmap(nullptr, page_size, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapped == MAP_FAILED) return fail("mmap of a page for the probe", errno);
  std::unique_ptr<char, std::function<void(char*)>> page(
      static_cast<char*>(mapped),
      [page_size](char* p) { munmap(p, page_size); });
  (void)madvise(page.get(), page_size, MADV_NOHUGEPAGE);  // EINVAL: no THP
  page.get()[0] = 1;
  std::string last;
  for (int attempt = 0; attempt < 3; ++attempt) {
    const int64_t before = PinnedKiB(os);
    absl::StatusOr<uint32_t> slot = pins->Pin(page.get(), page_size);
    if (!slot.ok()) {
      return fail(absl::StrCat("io_uring buffer registration probe: ",
                               slot.status().message()),
                  0);
    }
    const int64_t during = PinnedKiB(os);
    const absl::Status unpinned = pins->Unpin(*slot);
    const int64_t after = PinnedKiB(os);
    if (!unpinned.ok()) {
      return fail(absl::StrCat("io_uring buffer registration probe: ",
                               unpinned.message()),
                  0);
    }
    if (before < 0 || during < 0 || after < 0) {
      return fail(
          "io_uring buffer registration probe: no VmPin in "
          "/proc/self/status",
          0);
    }
    if (during - before >= page_kib && during - after >= page_kib) {
      return pins;
    }
    last = absl::StrFormat(
        "io_uring buffer registration probe: VmPin %d kB, %d kB while one "
        "%d KiB page was pinned, %d kB after it was unpinned, in each of 3 "
        "tries: the kernel does not count this pin or releases it late",
        before, during, page_kib, after);
  }
  return fail(last, 0);
}

IoUringPins::IoUringPins(int ring_fd, UnpinFault unpin_fault)
    : ring_fd_(ring_fd), unpin_fault_(std::move(unpin_fault)) {
  MutexLock lock(&mu_);
  free_slots_.reserve(kSlots);
  for (uint32_t s = kSlots; s > 0; --s) free_slots_.push_back(s - 1);
}

IoUringPins::~IoUringPins() {
  // Unregistered now: the ring's own teardown after close() runs later,
  // on a kernel worker, and would keep the pages pinned until then.
  (void)Register(ring_fd_, IORING_UNREGISTER_BUFFERS, nullptr, 0);
  close(ring_fd_);
}

int IoUringPins::Update(uint32_t slot, const void* addr, size_t length) {
  iovec iov{const_cast<void*>(addr), length};
  io_uring_rsrc_update2 update{};
  update.offset = slot;
  update.data = reinterpret_cast<uintptr_t>(&iov);
  update.nr = 1;
  const int r = Register(ring_fd_, IORING_REGISTER_BUFFERS_UPDATE, &update,
                         sizeof(update));
  return r == 1 ? 0 : (r < 0 ? errno : EIO);
}

absl::StatusOr<uint32_t> IoUringPins::Pin(const void* addr, size_t length) {
  RetryPendingUnpins();
  uint32_t slot;
  {
    MutexLock lock(&mu_);
    if (free_slots_.empty()) {
      return absl::UnavailableError(
          absl::StrCat("all ", kSlots, " io_uring pin slots are in use"));
    }
    slot = free_slots_.back();
    free_slots_.pop_back();
  }
  const int err = Update(slot, addr, length);
  if (err != 0) {
    MutexLock lock(&mu_);
    free_slots_.push_back(slot);
    return absl::ErrnoToStatus(
        err, absl::StrFormat("io_uring buffer registration of %p, %d bytes "
                             "to pin a transfer buffer",
                             addr, length));
  }
  return slot;
}

int IoUringPins::Empty(uint32_t slot) {
  if (unpin_fault_ != nullptr) {
    if (const int err = unpin_fault_(slot); err != 0) return err;
  }
  return Update(slot, nullptr, 0);
}

void IoUringPins::RetryPendingUnpins() {
  std::vector<uint32_t> retry;
  {
    MutexLock lock(&mu_);
    if (pending_.empty()) return;
    const size_t n = std::min(pending_.size(), size_t{kRetriesPerCall});
    retry.assign(pending_.begin(), pending_.begin() + n);
    pending_.erase(pending_.begin(), pending_.begin() + n);
  }
  std::vector<uint32_t> released;
  std::vector<uint32_t> still;
  for (uint32_t slot : retry) {
    (Empty(slot) == 0 ? released : still).push_back(slot);
  }
  MutexLock lock(&mu_);
  free_slots_.insert(free_slots_.end(), released.begin(), released.end());
  // To the back: the next call tries the others first.
  pending_.insert(pending_.end(), still.begin(), still.end());
}

absl::Status IoUringPins::Unpin(uint32_t slot) {
  const int err = Empty(slot);
  if (err != 0) {
    {
      MutexLock lock(&mu_);
      pending_.push_back(slot);
    }
    return absl::ErrnoToStatus(
        err, absl::StrCat("emptying io_uring pin slot ", slot,
                          " to unpin a transfer buffer (the pages stay "
                          "pinned until a later pin or unpin retries it)"));
  }
  {
    MutexLock lock(&mu_);
    free_slots_.push_back(slot);
  }
  RetryPendingUnpins();
  return absl::OkStatus();
}

size_t IoUringPins::pending_unpins() const {
  MutexLock lock(&mu_);
  return pending_.size();
}

}  // namespace tpushim
