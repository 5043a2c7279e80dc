// PollGate: lets threads waiting for small transfers run their queue's
// descriptors (Device::Poll) for as long as the devices are there.
//
// A waiter may hold its event long after the engine is gone (an Event
// outlives its System), so the poller an event keeps holds the gate, not
// the engine: Close(), at the start of the engine's shutdown, makes every
// later Poll a no-op and waits for those running to return, before the
// devices shut down.
//
// Thread-safety: Poll from any thread; Close once, not from inside a
// Poll (it waits for them).
//
//   auto gate = std::make_shared<PollGate>(devices);
//   event->set_poller([gate, device, direction] {
//     return gate->Poll(device, direction, kMaxBytes);
//   });
//   ...
//   gate->Close();  // then shut the devices down

#ifndef TPUSHIM_TRANSFER_POLL_GATE_H_
#define TPUSHIM_TRANSFER_POLL_GATE_H_

#include <atomic>
#include <cstdint>
#include <vector>

#include "common/mutex.h"
#include "device/device.h"

namespace tpushim::transfer_internal {

class PollGate {
 public:
  explicit PollGate(std::vector<Device*> devices)
      : devices_(std::move(devices)) {}
  PollGate(const PollGate&) = delete;
  PollGate& operator=(const PollGate&) = delete;

  // Device::Poll of `device`, while the gate is open; false once closed.
  bool Poll(int device, DmaDirection direction, uint64_t max_length);
  void Close();

 private:
  const std::vector<Device*> devices_;
  std::atomic<bool> open_{true};
  // Held shared by each Poll, exclusively by Close.
  SharedMutex mu_;
};

}  // namespace tpushim::transfer_internal

#endif  // TPUSHIM_TRANSFER_POLL_GATE_H_
