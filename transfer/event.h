// The machinery behind tpushim::Event (declared, with its contract, in the
// public tpushim/transfer.h): the shared state an event resolves once, and
// the executor that runs user callbacks off the DMA threads.
//
// Thread-safety: EventState and CallbackExecutor are thread-safe.
//
//   auto state = std::make_shared<EventState>(&executor);
//   Event event(state);             // handed to the caller
//   ...
//   state->Resolve(absl::OkStatus());  // wakes waiters, posts callbacks

#ifndef TPUSHIM_TRANSFER_EVENT_H_
#define TPUSHIM_TRANSFER_EVENT_H_

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "env/fork_guard.h"
#include "tpushim/transfer.h"

namespace tpushim {

namespace transfer_internal {

// Runs callbacks, in FIFO order, on one thread of its own. A callback
// that throws has its exception logged at ERROR and dropped; the thread
// goes on with the next.
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
  uint64_t executed() const {
    return executed_.load(std::memory_order_relaxed);
  }

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
  // `owner` identifies the engine that resolves the event (null for
  // events made ready at once): an engine refuses to wait for a pending
  // event of another engine, which could outlive it.
  explicit EventState(CallbackExecutor* executor, const void* owner = nullptr)
      : owner_(owner), executor_(executor) {}

  const void* owner() const { return owner_; }
  EventState(const EventState&) = delete;
  EventState& operator=(const EventState&) = delete;

  // How long Await polls before it sleeps: long enough to cover a small
  // transfer's round trip, and 0 for operations that take far longer
  // (polling would only take the CPU from the threads doing the work).
  static constexpr int64_t kDefaultAwaitSpinNs = 20'000;
  // Descriptors one waiter runs before it starts polling (set_poller).
  static constexpr int kMaxPolledDescriptors = 8;
  void set_await_spin_ns(int64_t ns) {
    await_spin_ns_.store(ns, std::memory_order_relaxed);
  }
  // What a waiter does while it polls, besides looking at the event: for a
  // small transfer, run a descriptor waiting in its queue (true when it ran
  // one), so that the transfer need not wait for a DMA thread to wake. Set
  // once, before the event reaches another thread; called concurrently by
  // every waiter.
  void set_poller(std::function<bool()> poller) { poller_ = std::move(poller); }

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
  // Wherever `callback` runs (the executor, or inline when the event is
  // ready), an exception it throws is logged at ERROR and goes no further.
  void AddCallback(absl::AnyInvocable<void(absl::Status) &&> callback);
  // Engine-internal continuation: runs inline on the resolving thread (a
  // DMA thread, typically), so it must be short and must not block. Runs
  // at once on this thread when the event is already ready.
  void AddContinuation(absl::AnyInvocable<void(const absl::Status&) &&> fn);

 private:
  // Spins briefly for readiness; true when ready.
  bool SpinUntilReady(int64_t spin_ns) const;

  const void* const owner_;
  // The process the event belongs to: awaiting a pending one in a fork()
  // child (where nothing will ever resolve it) is FAILED_PRECONDITION.
  const pid_t pid_ = CurrentProcessId();
  std::atomic<bool> ready_{false};
  std::atomic<int64_t> await_spin_ns_{kDefaultAwaitSpinNs};
  std::function<bool()> poller_;
  absl::Status status_;  // written once, before ready_ is released

  mutable Mutex mu_;
  CondVar cv_;
  int waiters_ ABSL_GUARDED_BY(mu_) = 0;
  CallbackExecutor* executor_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::AnyInvocable<void(absl::Status) &&>> callbacks_
      ABSL_GUARDED_BY(mu_);
  std::vector<absl::AnyInvocable<void(const absl::Status&) &&>> continuations_
      ABSL_GUARDED_BY(mu_);
};

// An event ready once every one of `events` is, with the first failure
// among them (or `first_error` when that is not OK, whatever they do).
// Ready at once when `events` is empty. Its callbacks run on `executor`;
// `owner` as for EventState.
std::shared_ptr<EventState> WhenAll(
    const std::vector<std::shared_ptr<EventState>>& events,
    absl::Status first_error, CallbackExecutor* executor, const void* owner);

// An event ready with OK once `event` is ready, whatever its status: what
// waits for an operation's end without taking on its failure (the order of
// one buffer's operations). `event` itself when it is ready with OK.
std::shared_ptr<EventState> EndOf(const std::shared_ptr<EventState>& event);

// The events of one engine that callers set (CallerEvent): it makes them,
// sets them, and at shutdown fails every one not yet set, so that nothing
// waits for them forever and no callback is posted to an executor that is
// gone. Shared by the engine and every CallerEvent it made, which may
// outlive it (setting one then is FAILED_PRECONDITION).
//
// Thread-safety: thread-safe. No lock is held while an event resolves.
class CallerEventHub {
 public:
  // `executor` runs the events' callbacks; it must live until Close
  // returns. `owner` is the engine (see EventState).
  CallerEventHub(CallbackExecutor* executor, const void* owner)
      : executor_(executor), owner_(owner) {}
  CallerEventHub(const CallerEventHub&) = delete;
  CallerEventHub& operator=(const CallerEventHub&) = delete;

  // A pending event. FAILED_PRECONDITION once closed.
  absl::StatusOr<std::shared_ptr<EventState>> Create();
  // Makes `state` (from Create) ready with `status`. FAILED_PRECONDITION,
  // changing nothing, when it is ready already: set before, or failed by
  // Close (the message says which); or in a fork() child.
  absl::Status Set(EventState& state, absl::Status status);
  // Fails every pending event with `status` (CANCELLED), waits for the
  // Sets under way, and refuses every later Create and Set.
  void Close(const absl::Status& status);

 private:
  CallbackExecutor* const executor_;
  const void* const owner_;
  // In a fork() child nothing may be set: waking the parent's engine
  // there would take locks another parent thread may have held.
  const pid_t pid_ = CurrentProcessId();
  Mutex mu_;
  CondVar idle_cv_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status close_status_ ABSL_GUARDED_BY(mu_);
  int setting_ ABSL_GUARDED_BY(mu_) = 0;  // Sets resolving outside mu_
  std::vector<std::weak_ptr<EventState>> made_ ABSL_GUARDED_BY(mu_);
};

}  // namespace transfer_internal

}  // namespace tpushim

#endif  // TPUSHIM_TRANSFER_EVENT_H_
