#include "env/posix/io_uring_pins.h"

#include <errno.h>
#include <linux/io_uring.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tpushim {
namespace {

int Register(int fd, unsigned op, void* arg, unsigned nr) {
  return static_cast<int>(syscall(__NR_io_uring_register, fd, op, arg, nr));
}

// VmPin of /proc/self/status, in KiB; -1 when it cannot be read.
int64_t PinnedKiB() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmPin:", 0) == 0) {
      return std::strtoll(line.c_str() + 6, nullptr, 10);
    }
  }
  return -1;
}

}  // namespace

std::unique_ptr<IoUringPins> IoUringPins::Open(std::string* why) {
  auto fail = [why](absl::string_view what, int err) {
    if (why != nullptr) {
      *why = absl::StrCat(what, ": ", std::strerror(err));
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
  auto pins = std::unique_ptr<IoUringPins>(new IoUringPins(fd));
  // Kernels from 5.19 to about 6.3 release an emptied slot's pages from a
  // delayed work item, up to a second later: pins would pile up past the
  // bound on pinned bytes and into the memlock limit. Pin one page and
  // check that the kernel counts it (VmPin) and stops counting it at once.
  std::unique_ptr<char, void (*)(void*)> page(
      static_cast<char*>(std::aligned_alloc(4096, 4096)), std::free);
  if (page == nullptr) return fail("a page for the probe", ENOMEM);
  page.get()[0] = 1;
  const int64_t before = PinnedKiB();
  absl::StatusOr<uint32_t> slot = pins->Pin(page.get(), 4096);
  const int64_t during = PinnedKiB();
  const bool unpinned = slot.ok() && pins->Unpin(*slot).ok();
  const int64_t after = PinnedKiB();
  if (!slot.ok() || !unpinned || before < 0 || during != before + 4 ||
      after != before) {
    return fail(absl::StrFormat(
                    "io_uring buffer registration probe: VmPin %d, %d while "
                    "one page was pinned, %d after it was unpinned",
                    before, during, after),
                slot.ok() ? EAGAIN : ENOMEM);
  }
  return pins;
}

IoUringPins::IoUringPins(int ring_fd) : ring_fd_(ring_fd) {
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

absl::Status IoUringPins::Unpin(uint32_t slot) {
  const int err = Update(slot, nullptr, 0);
  if (err != 0) {
    // The slot keeps its pages; it is not handed out again.
    return absl::ErrnoToStatus(
        err, absl::StrCat("emptying io_uring pin slot ", slot,
                          " to unpin a transfer buffer"));
  }
  MutexLock lock(&mu_);
  free_slots_.push_back(slot);
  return absl::OkStatus();
}

}  // namespace tpushim
