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

std::map<uintptr_t, PinTracker::Segment>::iterator
PinTracker::FirstOverlapLocked(uintptr_t begin) {
  auto it = segments_.upper_bound(begin);
  if (it != segments_.begin() && std::prev(it)->second.end > begin) --it;
  return it;
}

absl::StatusOr<PinTracker::Lease> PinTracker::Pin(const void* addr,
                                                  uint64_t length) {
  const PageHull hull = PageHull::Of(addr, length, os_->PageSize());
  const uintptr_t begin = hull.begin;
  const uintptr_t end = hull.end;
  MutexLock lock(&mu_);
  // Wait until no segment of the range is in transition.
  for (;;) {
    bool busy = false;
    for (auto it = FirstOverlapLocked(begin);
         it != segments_.end() && it->first < end; ++it) {
      busy |= it->second.state != State::kPinned;
    }
    if (!busy) break;
    settled_.Wait(&mu_);
  }
  // Claim the range: gaps become segments being pinned by this call, and
  // pinned segments gain a user.
  Lease lease;
  std::vector<std::pair<uintptr_t, uintptr_t>> gaps;
  auto it = FirstOverlapLocked(begin);
  uintptr_t cursor = begin;
  while (cursor < end) {
    const uintptr_t gap_end =
        (it == segments_.end() || it->first >= end) ? end : it->first;
    if (cursor < gap_end) {
      it = segments_.emplace_hint(it, cursor,
                                  Segment{gap_end, 1, State::kPinning});
      gaps.emplace_back(cursor, gap_end);
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
  if (gaps.empty()) return lease;

  mu_.Unlock();
  absl::Status status;
  size_t pinned = 0;
  for (; pinned < gaps.size(); ++pinned) {
    const auto& [b, e] = gaps[pinned];
    status = os_->PinRange(reinterpret_cast<const void*>(b), e - b);
    if (!status.ok()) break;
  }
  // Said once per process, at INFO: mlock pins as well, only slower.
  if (std::string note = os_->TakePinNote(); !note.empty()) {
    LOG(INFO) << note;
  }
  mu_.Lock();
  for (size_t i = 0; i < gaps.size(); ++i) {
    Segment& segment = segments_.at(gaps[i].first);
    if (i < pinned) {
      segment.state = State::kPinned;
      pinned_bytes_ += gaps[i].second - gaps[i].first;
    } else {
      // Never pinned: gone again before anyone could use it.
      segments_.erase(gaps[i].first);
      std::erase(lease.segments, gaps[i].first);
    }
  }
  settled_.SignalAll();
  if (status.ok()) return lease;
  ReleaseLocked(lease.segments);
  return status;
}

void PinTracker::Unpin(Lease lease) {
  MutexLock lock(&mu_);
  ReleaseLocked(lease.segments);
}

void PinTracker::ReleaseLocked(const std::vector<uintptr_t>& begins) {
  std::vector<std::pair<uintptr_t, uintptr_t>> unpin;
  for (uintptr_t b : begins) {
    auto it = segments_.find(b);
    if (it == segments_.end() || it->second.state != State::kPinned) {
      LOG(ERROR) << "PinTracker: releasing a segment that is not pinned";
      continue;
    }
    if (--it->second.users > 0) continue;
    it->second.state = State::kUnpinning;
    pinned_bytes_ -= it->second.end - b;
    unpin.emplace_back(b, it->second.end);
  }
  if (unpin.empty()) return;
  mu_.Unlock();
  for (const auto& [b, e] : unpin) {
    absl::Status s = os_->UnpinRange(reinterpret_cast<const void*>(b), e - b);
    if (!s.ok()) LOG(ERROR) << "Unpinning transfer memory failed: " << s;
  }
  mu_.Lock();
  for (const auto& [b, e] : unpin) segments_.erase(b);
  settled_.SignalAll();
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
