#include "transfer/poll_gate.h"

namespace tpushim::transfer_internal {

bool PollGate::Poll(int device, DmaDirection direction, uint64_t max_length) {
  if (!open_.load(std::memory_order_acquire)) return false;
  ReaderMutexLock lock(&mu_);
  // Looked at again under the lock: a Poll that got past the first look
  // while Close ran must not reach the device after Close returned.
  if (!open_.load(std::memory_order_acquire)) return false;
  return devices_[static_cast<size_t>(device)]->Poll(direction, max_length);
}

void PollGate::Close() {
  // Closed first, so that no new Poll takes the lock (a stream of them
  // would keep a writer out); then wait for those holding it.
  open_.store(false, std::memory_order_release);
  WriterMutexLock lock(&mu_);
}

}  // namespace tpushim::transfer_internal
