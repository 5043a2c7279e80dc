#include "transfer/event.h"

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <limits>
#include <utility>

#include "common/cpu_relax.h"
#include "logging/log.h"

namespace tpushim {
namespace transfer_internal {
namespace {

int64_t SteadyNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Runs `fn`; an exception it throws is logged at ERROR and goes no further.
template <typename F>
void RunCatching(F&& fn) noexcept {
  try {
    std::forward<F>(fn)();
  } catch (const std::exception& e) {
    LOG(ERROR) << "An event callback threw an exception, ignored (callbacks "
                  "must not throw): "
               << e.what();
  } catch (...) {
    LOG(ERROR) << "An event callback threw an exception that is not a "
                  "std::exception, ignored (callbacks must not throw)";
  }
}

}  // namespace

CallbackExecutor::CallbackExecutor() {
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "tpushim-cb");
    Loop();
  });
}

CallbackExecutor::~CallbackExecutor() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  thread_.join();
}

void CallbackExecutor::Post(absl::AnyInvocable<void() &&> fn) {
  {
    MutexLock lock(&mu_);
    queue_.push_back(std::move(fn));
  }
  cv_.Signal();
}

void CallbackExecutor::Drain() {
  MutexLock lock(&mu_);
  if (std::this_thread::get_id() == thread_.get_id()) {
    // Called from a callback (Shutdown from a callback): waiting for the
    // running callback would wait for ourselves. Run the rest here.
    while (!queue_.empty()) {
      absl::AnyInvocable<void()&&> fn = std::move(queue_.front());
      queue_.pop_front();
      mu_.Unlock();
      RunCatching(std::move(fn));
      executed_.fetch_add(1, std::memory_order_relaxed);
      mu_.Lock();
    }
    return;
  }
  while (!queue_.empty() || running_) idle_cv_.Wait(&mu_);
}

void CallbackExecutor::Loop() {
  MutexLock lock(&mu_);
  for (;;) {
    while (queue_.empty() && !stop_) cv_.Wait(&mu_);
    if (queue_.empty()) return;  // stop_, and nothing left
    absl::AnyInvocable<void()&&> fn = std::move(queue_.front());
    queue_.pop_front();
    running_ = true;
    mu_.Unlock();
    RunCatching(std::move(fn));
    executed_.fetch_add(1, std::memory_order_relaxed);
    mu_.Lock();
    running_ = false;
    if (queue_.empty()) idle_cv_.SignalAll();
  }
}

bool EventState::Resolve(absl::Status status) {
  std::vector<absl::AnyInvocable<void(absl::Status) &&>> callbacks;
  std::vector<absl::AnyInvocable<void(const absl::Status&) &&>> continuations;
  CallbackExecutor* executor;
  bool wake;
  {
    MutexLock lock(&mu_);
    if (ready_.load(std::memory_order_relaxed)) return false;
    status_ = std::move(status);
    ready_.store(true, std::memory_order_release);
    callbacks.swap(callbacks_);
    continuations.swap(continuations_);
    executor = executor_;
    executor_ = nullptr;
    wake = waiters_ > 0;
  }
  if (wake) cv_.SignalAll();
  for (auto& fn : continuations) std::move(fn)(status_);
  for (auto& cb : callbacks) {
    if (executor != nullptr) {
      executor->Post([cb = std::move(cb), s = status_]() mutable {
        std::move(cb)(std::move(s));
      });
    } else {
      RunCatching([&] { std::move(cb)(status_); });
    }
  }
  return true;
}

bool EventState::SpinUntilReady(int64_t spin_ns) const {
  // At most half the CPUs (at least one) poll at a time: the threads that
  // make events ready need the rest. With eight awaiting threads on two
  // CPUs, unbounded polling starved the DMA threads and took the median
  // 4 KiB device→host latency from 3 us to 136 us.
  static const int max_spinners =
      std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / 2);
  static std::atomic<int> spinners{0};
  if (IsReady()) return true;
  if (spin_ns <= 0) return false;
  // First run what waits in the transfer's queue (a few descriptors at
  // most: another thread's stream of them is not this waiter's to run).
  // This does work rather than take a CPU from it, so it is not limited
  // like the polling below.
  if (poller_) {
    for (int i = 0; i < kMaxPolledDescriptors && !IsReady() && poller_(); ++i) {
    }
    if (IsReady()) return true;
  }
  if (spinners.fetch_add(1, std::memory_order_acq_rel) >= max_spinners) {
    spinners.fetch_sub(1, std::memory_order_acq_rel);
    return false;
  }
  const bool ready = SpinFor(spin_ns, [this] {
    // The descriptor may reach the queue while we poll (a transfer
    // started by another thread, after a dependency).
    return IsReady() || (poller_ && poller_() && IsReady());
  });
  spinners.fetch_sub(1, std::memory_order_acq_rel);
  return ready;
}

absl::Status EventState::Await() {
  if (!ready_.load(std::memory_order_acquire) && ForkedChildOf(pid_)) {
    return ForkedChildError("This event", pid_);
  }
  if (!SpinUntilReady(await_spin_ns_.load(std::memory_order_relaxed))) {
    MutexLock lock(&mu_);
    ++waiters_;
    while (!ready_.load(std::memory_order_acquire)) cv_.Wait(&mu_);
    --waiters_;
  }
  return status_;
}

std::optional<absl::Status> EventState::AwaitWithTimeout(
    absl::Duration timeout) {
  if (!ready_.load(std::memory_order_acquire) && ForkedChildOf(pid_)) {
    return ForkedChildError("This event", pid_);
  }
  const int64_t timeout_ns =
      timeout <= absl::ZeroDuration() ? 0 : absl::ToInt64Nanoseconds(timeout);
  const int64_t spin_ns =
      std::min(timeout_ns, await_spin_ns_.load(std::memory_order_relaxed));
  if (SpinUntilReady(spin_ns)) return status_;
  if (timeout_ns <= spin_ns) return std::nullopt;
  // Saturate: an infinite (or huge) timeout must not overflow into a
  // deadline in the past, which pthread_cond_timedwait rejects (EINVAL)
  // without releasing the mutex, so that Resolve could never take it.
  const int64_t now = SteadyNanos();
  const int64_t rest = timeout_ns - spin_ns;
  const int64_t deadline = rest > std::numeric_limits<int64_t>::max() - now
                               ? std::numeric_limits<int64_t>::max()
                               : now + rest;
  MutexLock lock(&mu_);
  ++waiters_;
  while (!ready_.load(std::memory_order_acquire)) {
    if (cv_.WaitUntilMonotonicNanos(&mu_, deadline)) break;
  }
  --waiters_;
  if (!ready_.load(std::memory_order_acquire)) return std::nullopt;
  return status_;
}

void EventState::AddCallback(
    absl::AnyInvocable<void(absl::Status) &&> callback) {
  {
    MutexLock lock(&mu_);
    if (!ready_.load(std::memory_order_relaxed)) {
      callbacks_.push_back(std::move(callback));
      return;
    }
  }
  // As on the callback thread: what the callback throws is logged, and
  // the caller goes on.
  RunCatching([&] { std::move(callback)(status_); });
}

void EventState::AddContinuation(
    absl::AnyInvocable<void(const absl::Status&) &&> fn) {
  {
    MutexLock lock(&mu_);
    if (!ready_.load(std::memory_order_relaxed)) {
      continuations_.push_back(std::move(fn));
      return;
    }
  }
  std::move(fn)(status_);
}

std::shared_ptr<EventState> WhenAll(
    const std::vector<std::shared_ptr<EventState>>& events,
    absl::Status first_error, CallbackExecutor* executor, const void* owner) {
  auto all = std::make_shared<EventState>(executor, owner);
  if (events.empty()) {
    all->Resolve(std::move(first_error));
    return all;
  }
  struct Join {
    Join(size_t n, absl::Status error) : left(n), first(std::move(error)) {}
    std::atomic<size_t> left;
    Mutex mu;
    absl::Status first ABSL_GUARDED_BY(mu);
  };
  auto join = std::make_shared<Join>(events.size(), std::move(first_error));
  for (const std::shared_ptr<EventState>& e : events) {
    e->AddContinuation([join, all](const absl::Status& s) {
      if (!s.ok()) {
        MutexLock lock(&join->mu);
        if (join->first.ok()) join->first = s;
      }
      if (join->left.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
      absl::Status status;
      {
        MutexLock lock(&join->mu);
        status = join->first;
      }
      all->Resolve(std::move(status));
    });
  }
  return all;
}

std::shared_ptr<EventState> EndOf(const std::shared_ptr<EventState>& event) {
  if (event->IsReady() && event->status().ok()) return event;
  auto end = std::make_shared<EventState>(nullptr, event->owner());
  event->AddContinuation(
      [end](const absl::Status&) { end->Resolve(absl::OkStatus()); });
  return end;
}

absl::StatusOr<std::shared_ptr<EventState>> CallerEventHub::Create() {
  auto state = std::make_shared<EventState>(executor_, owner_);
  MutexLock lock(&mu_);
  if (closed_) {
    return absl::FailedPreconditionError(
        "cannot create an event: the system has shut down");
  }
  // Forget the events that are set or gone, now and then, so the list
  // stays about as long as the events pending.
  if (made_.size() >= 64 && (made_.size() & (made_.size() - 1)) == 0) {
    made_.erase(std::remove_if(made_.begin(), made_.end(),
                               [](const std::weak_ptr<EventState>& w) {
                                 auto s = w.lock();
                                 return s == nullptr || s->IsReady();
                               }),
                made_.end());
  }
  made_.push_back(state);
  return state;
}

absl::Status CallerEventHub::Set(EventState& state, absl::Status status) {
  if (ForkedChildOf(pid_)) return ForkedChildError("This event", pid_);
  {
    MutexLock lock(&mu_);
    if (state.IsReady() && !(closed_ && state.status() == close_status_)) {
      return absl::FailedPreconditionError(
          "the event was already set (an event is set once)");
    }
    if (closed_) {
      return absl::FailedPreconditionError(
          "the event cannot be set: the system shut down first, and failed "
          "it with CANCELLED");
    }
    ++setting_;
  }
  const bool set = state.Resolve(std::move(status));
  {
    MutexLock lock(&mu_);
    if (--setting_ == 0) idle_cv_.SignalAll();
  }
  if (!set) {
    return absl::FailedPreconditionError(
        "the event was already set (an event is set once)");
  }
  return absl::OkStatus();
}

void CallerEventHub::Close(const absl::Status& status) {
  std::vector<std::weak_ptr<EventState>> made;
  {
    MutexLock lock(&mu_);
    if (closed_) return;
    closed_ = true;
    close_status_ = status;
    made.swap(made_);
    while (setting_ > 0) idle_cv_.Wait(&mu_);
  }
  for (const std::weak_ptr<EventState>& w : made) {
    if (std::shared_ptr<EventState> s = w.lock()) s->Resolve(status);
  }
}

}  // namespace transfer_internal

Event::Event() {
  // One shared ready state: nothing about it changes any more.
  static const std::shared_ptr<transfer_internal::EventState>* const kOk =
      new std::shared_ptr<transfer_internal::EventState>(
          Ready(absl::OkStatus()).state_);
  state_ = *kOk;
}

bool Event::IsReady() const { return state_->IsReady(); }
absl::Status Event::Await() const { return state_->Await(); }
std::optional<absl::Status> Event::AwaitWithTimeout(
    absl::Duration timeout) const {
  return state_->AwaitWithTimeout(timeout);
}
void Event::AddCallback(
    absl::AnyInvocable<void(absl::Status) &&> callback) const {
  state_->AddCallback(std::move(callback));
}

Event Event::Ready(absl::Status status) {
  auto state = std::make_shared<transfer_internal::EventState>(nullptr);
  state->Resolve(std::move(status));
  return Event(std::move(state));
}

CallerEvent& CallerEvent::operator=(CallerEvent&& other) noexcept {
  if (this != &other) {
    Abandon();
    hub_ = std::move(other.hub_);
    event_ = std::move(other.event_);
  }
  return *this;
}

CallerEvent::~CallerEvent() { Abandon(); }

void CallerEvent::Abandon() {
  if (hub_ == nullptr || event_.IsReady()) return;
  // Already set or failed by shutdown: the error is not news.
  (void)hub_->Set(*event_.state(),
                  absl::CancelledError("the caller's event was destroyed "
                                       "before it was set"));
}

absl::Status CallerEvent::Set(absl::Status status) {
  if (hub_ == nullptr) {
    return absl::FailedPreconditionError(
        "this CallerEvent refers to no event (default-constructed or moved "
        "from); make one with CreateEvent");
  }
  return hub_->Set(*event_.state(), std::move(status));
}

}  // namespace tpushim
