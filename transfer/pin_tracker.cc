#include "transfer/pin_tracker.h"

#include <utility>

#include "common/page_hull.h"
#include "logging/log.h"

namespace tpushim {

PinTracker::~PinTracker() {
  MutexLock lock(&mu_);
  for (const auto& [begin, segment] : segments_) {
    absl::Status s = os_->UnpinRange(reinterpret_cast<const void*>(begin),
                                     segment.end - begin);
    if (!s.ok()) LOG(ERROR) << "Unpinning transfer memory failed: " << s;
  }
  segments_.clear();
  pinned_bytes_ = 0;
}

absl::StatusOr<PinTracker::Lease> PinTracker::Pin(const void* addr,
                                                  uint64_t length) {
  const PageHull hull = PageHull::Of(addr, length, os_->PageSize());
  const uintptr_t begin = hull.begin;
  const uintptr_t end = hull.end;
  Lease lease;
  MutexLock lock(&mu_);
  // The first segment that may overlap: the one starting at or before
  // `begin`, if it reaches past it.
  auto it = segments_.upper_bound(begin);
  if (it != segments_.begin() && std::prev(it)->second.end > begin) --it;
  uintptr_t cursor = begin;
  while (cursor < end) {
    const uintptr_t gap_end =
        (it == segments_.end() || it->first >= end) ? end : it->first;
    if (cursor < gap_end) {
      absl::Status s = os_->PinRange(reinterpret_cast<const void*>(cursor),
                                     gap_end - cursor);
      if (!s.ok()) {
        for (uintptr_t b : lease.segments) ReleaseLocked(b);
        return s;
      }
      it = segments_.emplace_hint(it, cursor, Segment{gap_end, 1});
      pinned_bytes_ += gap_end - cursor;
      lease.segments.push_back(cursor);
      cursor = gap_end;
      ++it;
      continue;
    }
    // `it` starts at or before the cursor and overlaps the range.
    ++it->second.users;
    lease.segments.push_back(it->first);
    cursor = it->second.end;
    ++it;
  }
  return lease;
}

void PinTracker::Unpin(Lease lease) {
  MutexLock lock(&mu_);
  for (uintptr_t b : lease.segments) ReleaseLocked(b);
}

void PinTracker::ReleaseLocked(uintptr_t begin) {
  auto it = segments_.find(begin);
  if (it == segments_.end()) {
    LOG(ERROR) << "PinTracker: releasing a segment that is not pinned";
    return;
  }
  if (--it->second.users > 0) return;
  const uint64_t length = it->second.end - begin;
  absl::Status s =
      os_->UnpinRange(reinterpret_cast<const void*>(begin), length);
  if (!s.ok()) LOG(ERROR) << "Unpinning transfer memory failed: " << s;
  pinned_bytes_ -= length;
  segments_.erase(it);
}

uint64_t PinTracker::pinned_bytes() const {
  MutexLock lock(&mu_);
  return pinned_bytes_;
}

size_t PinTracker::segments() const {
  MutexLock lock(&mu_);
  return segments_.size();
}

}  // namespace tpushim
