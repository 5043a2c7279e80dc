// PinTracker: reference-counted pinning of caller memory for the pinned
// transfer path.
//
// mlock() does not nest: one munlock() undoes any number of mlock()s of a
// page. Two transfers over the same page (two halves of one tensor, say)
// would unpin each other's pages. The tracker pins each page once, through
// Os::PinRange (fault point `pin`), keeps a count of the transfers that use
// it, and unpins with exactly the (address, length) pairs it pinned, once
// no transfer uses them.
//
// A pinned segment is never split: a transfer overlapping part of a
// segment keeps the whole segment pinned until every user is done.
//
// Where a pin is recorded, and why in three places, each for its own job:
//   * here: which transfers use a page range (reference counts), so that
//     overlapping transfers pin a page once and unpin it last;
//   * the OS layer (env/posix/posix_os.cc): how each range it pinned was
//     pinned — an io_uring slot or mlock() — so that it is undone the
//     same way;
//   * io_uring's slot table (env/posix/io_uring_pins.h): which registered
//     buffer slots are free, and the unpins the kernel refused, to retry.
// None knows the others' records: the tracker hands the OS layer exactly
// the ranges it pinned, and the OS layer hands io_uring exactly its slots.
//
// Thread-safety: thread-safe. The mlock/munlock calls run outside the
// tracker's mutex — pinning a large buffer for one device must not hold up
// another device's small pin — so a segment is in one of three states:
// being pinned, pinned, or being unpinned. A call that meets a segment
// in transition waits for it (a short wait: the segment's own syscall);
// calls over other segments go ahead.
//
// The first Pin after the Os found the kernel's long-term pin unavailable
// logs why, once, at INFO (Os::TakePinNote): pins still work, with mlock.
//
//   TPUSHIM_ASSIGN_OR_RETURN(PinTracker::Lease lease, pins.Pin(p, n));
//   ... DMA from [p, p + n) ...
//   pins.Unpin(std::move(lease));

#ifndef TPUSHIM_TRANSFER_PIN_TRACKER_H_
#define TPUSHIM_TRANSFER_PIN_TRACKER_H_

#include <cstdint>
#include <map>
#include <vector>

#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "env/os.h"

namespace tpushim {

class PinTracker {
 public:
  // Which segments one Pin call counted on (their start addresses).
  struct Lease {
    std::vector<uintptr_t> segments;
  };

  // `os` must outlive the tracker.
  explicit PinTracker(Os* os) : os_(os) {}
  PinTracker(const PinTracker&) = delete;
  PinTracker& operator=(const PinTracker&) = delete;
  // Unpins whatever is still pinned (a REQUIRES violation by the caller,
  // but nothing must stay locked).
  ~PinTracker();

  // Pins the pages of [addr, addr + length) that are not pinned yet and
  // counts one more user of every segment the range touches. On error
  // (the first failing Os::PinRange), undoes what this call did and
  // returns that error. Waits while a segment the range touches is being
  // pinned or unpinned by another call. REQUIRES: length >= 1.
  absl::StatusOr<Lease> Pin(const void* addr, uint64_t length);
  // Ends a lease: segments that lose their last user are unpinned.
  void Unpin(Lease lease);

  // Bytes pinned now (whole pages), and the number of pinned segments.
  uint64_t pinned_bytes() const;
  size_t segments() const;

 private:
  enum class State { kPinning, kPinned, kUnpinning };
  struct Segment {
    uintptr_t end = 0;
    uint64_t users = 0;
    State state = State::kPinning;
  };
  // The first segment that may overlap [begin, ...): the one starting at or
  // before `begin` if it reaches past it, else the first starting after.
  std::map<uintptr_t, Segment>::iterator FirstOverlapLocked(uintptr_t begin)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops one user of each segment in `begins`; those left without users
  // are unpinned (the lock is released around the munlock calls).
  void ReleaseLocked(const std::vector<uintptr_t>& begins)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Os* const os_;
  mutable Mutex mu_;
  // Signalled whenever a segment leaves kPinning or kUnpinning.
  CondVar settled_;
  std::map<uintptr_t, Segment> segments_ ABSL_GUARDED_BY(mu_);  // by begin
  uint64_t pinned_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // kPinned segments
};

}  // namespace tpushim

#endif  // TPUSHIM_TRANSFER_PIN_TRACKER_H_
