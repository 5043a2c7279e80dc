// BufferOrder: the order of the operations on one buffer — a device
// buffer of the transfer engine, or a host-memory buffer of the driver.
//
// Operations on one buffer run in the order they were issued, with no
// `wait_for`: an operation that reads bytes of the buffer waits for the
// unfinished writes of those bytes issued before it; one that writes them
// waits for the unfinished reads and writes of them issued before it.
// Operations on disjoint byte ranges do not wait for each other, nor do
// reads for reads. The wait is for completion only: a failed write does
// not fail the operations after it (the buffer's ready event carries the
// failure; `wait_for` carries failures between operations).
//
// An operation takes its place in two steps under the owner's lock:
// Conflicts (what it must wait for) then Record (it becomes what later
// operations wait for). The owner records an operation in the same
// critical section in which it queues it, so an event the order hands out
// (Conflicts, Writes) never covers an operation that is not queued yet.
//
// Thread-safety: none of its own; the owner guards it with its lock. No
// method blocks or resolves an event.
//
//   // under the buffer's lock:
//   std::vector<BufferOrder::Wait> after;
//   order.Conflicts({0, n}, BufferOrder::Access::kRead, &after);
//   ... queue the operation, waiting for `after` ...
//   order.Record({0, n}, BufferOrder::Access::kRead, op_event, queue);

#ifndef TPUSHIM_TRANSFER_BUFFER_ORDER_H_
#define TPUSHIM_TRANSFER_BUFFER_ORDER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "transfer/event.h"

namespace tpushim::transfer_internal {

class BufferOrder {
 public:
  enum class Access : uint8_t { kRead, kWrite };
  // Bytes [begin, end) of the buffer.
  struct Range {
    uint64_t begin = 0;
    uint64_t end = 0;
  };
  // An event to wait for, and where the operation behind it runs (the
  // owner's tag: the engine's queue index; -1 when it has none), so that a
  // waiter can help it along.
  struct Wait {
    std::shared_ptr<EventState> event;
    int tag = -1;
  };

  BufferOrder() = default;
  BufferOrder(const BufferOrder&) = delete;
  BufferOrder& operator=(const BufferOrder&) = delete;

  // Appends to `after` the events an access of `access` to `range` must
  // wait for: the unfinished accesses issued before it that overlap it,
  // unless both read. An empty range waits for nothing. Drops the finished
  // accesses it meets.
  void Conflicts(Range range, Access access, std::vector<Wait>* after);

  // Records an access of `access` to `range` by an operation whose
  // `done` event resolves once it has finished with the buffer. `ready`
  // (null: `done`) is what the buffer's readiness waits for when the
  // access is a write whose readiness differs from its end (a chunked
  // transfer: failed at once by an abort, finished when its chunks are).
  // REQUIRES: Conflicts was asked for the same access under the same lock
  // hold (a write that covers an earlier access relies on waiting for it).
  void Record(Range range, Access access, std::shared_ptr<EventState> done,
              int tag, std::shared_ptr<EventState> ready = nullptr);

  // The readiness events of the writes issued so far and not yet ready
  // (PJRT's buffer readiness: every write issued before the call).
  std::vector<std::shared_ptr<EventState>> PendingWrites();
  // The failure of the first write found failed (OK while none has): a
  // failed write leaves bytes of the buffer undefined, so the buffer stays
  // failed. Up to date for the writes finished before the last
  // PendingWrites or Conflicts call.
  const absl::Status& failed_write() const { return failed_write_; }

  // Forgets every access (the buffer is gone).
  void Clear() { entries_.clear(); }
  // Unfinished accesses recorded (for tests and statistics); drops the
  // finished ones first.
  size_t size();

 private:
  struct Entry {
    Range range;
    Access access = Access::kRead;
    // A later write covered this write's whole range: later operations
    // wait for that write, which waits for this one. Kept for readiness.
    bool shadowed = false;
    int tag = -1;
    std::shared_ptr<EventState> done;
    std::shared_ptr<EventState> ready;  // null: done
  };
  static bool Finished(const Entry& e) {
    return e.done->IsReady() && (e.ready == nullptr || e.ready->IsReady());
  }
  // Drops the finished accesses, noting a failed write's status.
  void Prune();

  std::vector<Entry> entries_;  // in issue order
  absl::Status failed_write_;
};

}  // namespace tpushim::transfer_internal

#endif  // TPUSHIM_TRANSFER_BUFFER_ORDER_H_
