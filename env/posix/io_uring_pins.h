// IoUringPins: pins caller memory for a transfer the way the kernel pins
// memory for DMA — a long-term pin of the pages (pin_user_pages with
// FOLL_LONGTERM, what VFIO's MAP_DMA and RDMA registration take), charged
// to RLIMIT_MEMLOCK for a process without CAP_IPC_LOCK — through io_uring's
// registered buffers: one ring with a sparse buffer table, a buffer
// registered into a free slot to pin and the slot emptied to unpin. No I/O
// is ever submitted to the ring.
//
// Against mlock()/munlock() of the same 4 KiB pages it is about 4x cheaper
// (256 MiB: 7 ms against 30 ms on the project's 2-core VM, per page: no
// LRU moves to and from the unevictable list, no VMA split and merge), which
// is what lets pinning run beside a transfer's DMA instead of behind it.
//
// Open returns null where it cannot be used: kernels before 5.19 (no
// sparse registration), kernels that release an emptied slot's pages only
// later from a work item (5.19 to about 6.3), io_uring turned off
// (kernel.io_uring_disabled, a seccomp filter), or any other failure of
// the ring's set-up. To tell the late-release kernels apart, Open pins one
// page of a mapping of its own (MADV_NOHUGEPAGE, so no transparent huge
// page makes it count 2 MiB) and checks that VmPin in /proc/self/status
// (read through Os::ReadFile) rises by at least a page while it is pinned
// and falls by at least as much once it is unpinned: any page size, and
// tolerant of other pins of the process coming and going meanwhile; it
// tries three times before it gives up. Pin fails with the kernel's
// errno: ENOMEM over the
// memlock limit (which io_uring counts for all of the user's processes
// together, not per process as mlock does), EFAULT or EOPNOTSUPP for
// memory it does not pin long-term (file-backed mappings), and UNAVAILABLE
// when every slot is in use. The caller then pins some other way.
//
// An unpin the kernel refuses (ENOMEM while it allocates the emptied
// slot's record) returns that error once and keeps the slot, still
// pinned, on a list that every later Pin and Unpin call works off (at
// most kRetriesPerCall slots a call) until the kernel lets it go; the
// slot is handed out again only then. The destructor releases them all.
//
// Thread-safety: thread-safe; the slot table is guarded by a mutex, the
// registration calls run outside it.
//
//   std::string why;
//   std::unique_ptr<IoUringPins> pins = IoUringPins::Open(os, &why);
//   if (pins) {
//     TPUSHIM_ASSIGN_OR_RETURN(uint32_t slot, pins->Pin(p, n));
//     ... DMA ...
//     TPUSHIM_RETURN_IF_ERROR(pins->Unpin(slot));
//   }

#ifndef TPUSHIM_ENV_POSIX_IO_URING_PINS_H_
#define TPUSHIM_ENV_POSIX_IO_URING_PINS_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "env/os.h"

namespace tpushim {

class IoUringPins {
 public:
  // Slots in the sparse table: pieces pinned at once by every transfer of
  // the process (each piece of a pinned transfer is one, 4 MiB by
  // default; a host memory registration is one per GiB). 1024 pieces of
  // 4 MiB are 128 transfers at their full 32 MiB of pins; past that a pin
  // is an mlock. Not more: for every huge page of a buffer it pins, the
  // kernel looks through the whole table for another slot holding that
  // page, so the table's size is paid per 2 MiB pinned. Registering 1 GiB
  // of huge pages took a median 9.8 ms with 4096 slots against 2.3 ms with
  // 1024 and 1.6 ms with one (docs/performance.md).
  static constexpr uint32_t kSlots = 1024;

  // Slots whose unpin failed that one Pin or Unpin call tries again.
  static constexpr int kRetriesPerCall = 4;

  // Tests only: called before the kernel empties `slot`; a nonzero errno
  // it returns fails that unpin as the kernel would.
  using UnpinFault = std::function<int(uint32_t slot)>;

  // Null when io_uring cannot pin here; `why` (may be null) says why. `os`
  // reads VmPin for the probe (see above) and must outlive the call.
  static std::unique_ptr<IoUringPins> Open(Os* os, std::string* why,
                                           UnpinFault unpin_fault = nullptr);

  IoUringPins(const IoUringPins&) = delete;
  IoUringPins& operator=(const IoUringPins&) = delete;
  ~IoUringPins();  // unpins whatever is still pinned, closes the ring

  // Pins the pages of [addr, addr + length) and returns the slot that
  // holds them. REQUIRES: length >= 1 and at most 1 GiB (io_uring's
  // largest buffer).
  absl::StatusOr<uint32_t> Pin(const void* addr, size_t length);
  // Unpins what Pin returned `slot` for. On failure the slot stays pinned
  // and is retried by later calls (see above).
  absl::Status Unpin(uint32_t slot);

  // Slots whose unpin failed and is still to be retried.
  size_t pending_unpins() const;

 private:
  IoUringPins(int ring_fd, UnpinFault unpin_fault);
  // Registers iov (or, null, empties) `slot`.
  int Update(uint32_t slot, const void* addr, size_t length);
  // Empties `slot`; 0 or the errno.
  int Empty(uint32_t slot);
  // Retries up to kRetriesPerCall slots of pending_.
  void RetryPendingUnpins();

  const int ring_fd_;
  const UnpinFault unpin_fault_;
  mutable Mutex mu_;
  std::vector<uint32_t> free_slots_ ABSL_GUARDED_BY(mu_);
  // Slots still pinned because their unpin failed.
  std::vector<uint32_t> pending_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tpushim

#endif  // TPUSHIM_ENV_POSIX_IO_URING_PINS_H_
