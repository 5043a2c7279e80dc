// Event: the completion of one asynchronous operation (a transfer, a
// deallocation), with tpu_driver's semantics: it becomes ready exactly once,
// with a status; it can be awaited, with or without a timeout; callbacks
// added to it run once it is ready.
//
// Where callbacks run: a callback added to a pending event runs, after the
// event becomes ready, on the engine's callback thread — never on a DMA
// thread and never under an engine lock — in the order callbacks became
// runnable. A callback added to an event that is already ready runs at
// once on the calling thread. Callbacks should be short: they share one
// thread.
//
// Awaiting spins for a few microseconds before it sleeps, so a short
// transfer's waiter does not pay a futex wake-up.
//
// Thread-safety: Event is a cheap, copyable, shared handle; every method is
// thread-safe. A default-constructed Event is ready with OK (convenient in
// `wait_for` lists).
//
//   Event e = engine.TransferToDevice(src, buffer, 0, n, {}).value();
//   e.AddCallback([](absl::Status s) { if (!s.ok()) LOG(ERROR) << s; });
//   if (std::optional<absl::Status> s = e.AwaitWithTimeout(absl::Seconds(1)))
//     ... done, *s says how ...

#ifndef TPUSHIM_TRANSFER_EVENT_H_
#define TPUSHIM_TRANSFER_EVENT_H_

#include <atomic>
#include <deque>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/mutex.h"

namespace tpushim {

namespace transfer_internal {

// Runs callbacks, in FIFO order, on one thread of its own.
class CallbackExecutor {
 public:
  CallbackExecutor();
  CallbackExecutor(const CallbackExecutor&) = delete;
  CallbackExecutor& operator=(const CallbackExecutor&) = delete;
  // Runs everything queued, then stops the thread.
  ~CallbackExecutor();

  void Post(absl::AnyInvocable<void() &&> fn);
  // Blocks until everything posted before the call has run. Called from a
  // callback on the executor's thread, runs the queued callbacks itself
  // (the running one is the caller) and returns.
  void Drain();
  // Callbacks run so far.
  uint64_t executed() const { return executed_.load(std::memory_order_relaxed); }

 private:
  void Loop();

  Mutex mu_;
  CondVar cv_;
  CondVar idle_cv_;
  std::deque<absl::AnyInvocable<void() &&>> queue_ ABSL_GUARDED_BY(mu_);
  bool running_ ABSL_GUARDED_BY(mu_) = false;  // a callback is running
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<uint64_t> executed_{0};
  std::thread thread_;
};

// The shared state behind Event.
class EventState {
 public:
  // `executor` runs the user callbacks of this event; it must outlive the
  // event's resolution (the engine resolves every event before it goes).
  explicit EventState(CallbackExecutor* executor) : executor_(executor) {}
  EventState(const EventState&) = delete;
  EventState& operator=(const EventState&) = delete;

  // How long Await polls before it sleeps: long enough to cover a small
  // transfer's round trip, and 0 for operations that take far longer
  // (polling would only take the CPU from the threads doing the work).
  static constexpr int64_t kDefaultAwaitSpinNs = 20'000;
  void set_await_spin_ns(int64_t ns) {
    await_spin_ns_.store(ns, std::memory_order_relaxed);
  }

  bool IsReady() const { return ready_.load(std::memory_order_acquire); }
  // REQUIRES: IsReady().
  const absl::Status& status() const { return status_; }

  // Makes the event ready with `status`. Wakes waiters, runs the internal
  // continuations inline (they must not block) and posts the user
  // callbacks to the executor. Returns false (and changes nothing) when the
  // event was already ready.
  bool Resolve(absl::Status status);

  absl::Status Await();
  std::optional<absl::Status> AwaitWithTimeout(absl::Duration timeout);
  void AddCallback(absl::AnyInvocable<void(absl::Status) &&> callback);
  // Engine-internal continuation: runs inline on the resolving thread (a
  // DMA thread, typically), so it must be short and must not block. Runs
  // at once on this thread when the event is already ready.
  void AddContinuation(absl::AnyInvocable<void(const absl::Status&) &&> fn);

 private:
  // Spins briefly for readiness; true when ready.
  bool SpinUntilReady(int64_t spin_ns) const;

  std::atomic<bool> ready_{false};
  std::atomic<int64_t> await_spin_ns_{kDefaultAwaitSpinNs};
  absl::Status status_;  // written once, before ready_ is released

  mutable Mutex mu_;
  CondVar cv_;
  int waiters_ ABSL_GUARDED_BY(mu_) = 0;
  CallbackExecutor* executor_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::AnyInvocable<void(absl::Status) &&>> callbacks_
      ABSL_GUARDED_BY(mu_);
  std::vector<absl::AnyInvocable<void(const absl::Status&) &&>>
      continuations_ ABSL_GUARDED_BY(mu_);
};

}  // namespace transfer_internal

class Event {
 public:
  // Ready, with OK.
  Event();
  explicit Event(std::shared_ptr<transfer_internal::EventState> state)
      : state_(std::move(state)) {}

  // An event that is already ready with `status`.
  static Event Ready(absl::Status status);

  bool IsReady() const { return state_->IsReady(); }
  // Blocks until ready; returns the status.
  absl::Status Await() const { return state_->Await(); }
  // The status if the event became ready within `timeout`, else nullopt.
  std::optional<absl::Status> AwaitWithTimeout(absl::Duration timeout) const {
    return state_->AwaitWithTimeout(timeout);
  }
  // Runs `callback(status)` once the event is ready (see the file comment
  // for where).
  void AddCallback(absl::AnyInvocable<void(absl::Status) &&> callback) const {
    state_->AddCallback(std::move(callback));
  }

  const std::shared_ptr<transfer_internal::EventState>& state() const {
    return state_;
  }

 private:
  std::shared_ptr<transfer_internal::EventState> state_;
};

}  // namespace tpushim

#endif  // TPUSHIM_TRANSFER_EVENT_H_
