#include "transfer/buffer_order.h"

#include <algorithm>
#include <utility>

namespace tpushim::transfer_internal {
namespace {

bool Overlap(BufferOrder::Range a, BufferOrder::Range b) {
  return a.begin < b.end && b.begin < a.end;
}

bool Covers(BufferOrder::Range outer, BufferOrder::Range inner) {
  return outer.begin <= inner.begin && inner.end <= outer.end;
}

}  // namespace

void BufferOrder::Prune() {
  entries_.erase(std::remove_if(entries_.begin(), entries_.end(),
                                [this](const Entry& e) {
                                  if (!Finished(e)) return false;
                                  const EventState& r =
                                      e.ready ? *e.ready : *e.done;
                                  if (e.access == Access::kWrite &&
                                      !r.status().ok() && failed_write_.ok()) {
                                    failed_write_ = r.status();
                                  }
                                  return true;
                                }),
                 entries_.end());
}

void BufferOrder::Conflicts(Range range, Access access,
                            std::vector<Wait>* after) {
  if (range.begin >= range.end) return;
  Prune();
  for (const Entry& e : entries_) {
    if (e.shadowed || !Overlap(e.range, range)) continue;
    if (access == Access::kRead && e.access == Access::kRead) continue;
    after->push_back(Wait{e.done, e.tag});
  }
}

void BufferOrder::Record(Range range, Access access,
                         std::shared_ptr<EventState> done, int tag,
                         std::shared_ptr<EventState> ready) {
  if (range.begin >= range.end) return;
  if (access == Access::kWrite) {
    // What this write covers whole, it stands for from now on: it waits
    // for those accesses, so whoever conflicts with them conflicts with it
    // and waits for it. Reads go; writes stay for the buffer's readiness.
    entries_.erase(std::remove_if(entries_.begin(), entries_.end(),
                                  [range](const Entry& e) {
                                    return e.access == Access::kRead &&
                                           Covers(range, e.range);
                                  }),
                   entries_.end());
    for (Entry& e : entries_) {
      if (Covers(range, e.range)) e.shadowed = true;
    }
  }
  entries_.push_back(Entry{range, access, /*shadowed=*/false, tag,
                           std::move(done), std::move(ready)});
}

std::vector<std::shared_ptr<EventState>> BufferOrder::PendingWrites() {
  Prune();
  std::vector<std::shared_ptr<EventState>> writes;
  for (const Entry& e : entries_) {
    if (e.access != Access::kWrite) continue;
    const std::shared_ptr<EventState>& r = e.ready ? e.ready : e.done;
    if (!r->IsReady()) {
      writes.push_back(r);
    } else if (!r->status().ok() && failed_write_.ok()) {
      // Ready before its end (an aborted chunked transfer).
      failed_write_ = r->status();
    }
  }
  return writes;
}

size_t BufferOrder::size() {
  Prune();
  return entries_.size();
}

}  // namespace tpushim::transfer_internal
