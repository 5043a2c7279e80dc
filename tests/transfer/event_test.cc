// Event and its building blocks (transfer_internal::EventState and
// CallbackExecutor): readiness exactly once, awaiting with and without a
// timeout, and where callbacks and continuations run.

#include "transfer/event.h"

#include <pthread.h>
#include <time.h>

#include <atomic>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/scoped_test_logging.h"

namespace tpushim {
namespace {

using transfer_internal::CallbackExecutor;
using transfer_internal::EventState;

std::string CurrentThreadName() {
  char name[32] = {};
  if (pthread_getname_np(pthread_self(), name, sizeof(name)) != 0) return "?";
  return name;
}

int64_t ThreadCpuNanos() {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

// Waits (bounded) until `pred` holds; false when it never did.
template <typename Pred>
bool Eventually(Pred pred, absl::Duration limit = absl::Seconds(5)) {
  const absl::Time deadline = absl::Now() + limit;
  while (!pred()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Microseconds(100));
  }
  return true;
}

// ---- Event basics ------------------------------------------------------

TEST(EventTest, DefaultIsReadyWithOk) {
  Event e;
  EXPECT_TRUE(e.IsReady());
  EXPECT_TRUE(e.Await().ok());
  std::optional<absl::Status> s = e.AwaitWithTimeout(absl::ZeroDuration());
  ASSERT_TRUE(s.has_value());
  EXPECT_TRUE(s->ok());
  // A default event's status cannot be changed by anyone.
  EXPECT_FALSE(e.state()->Resolve(absl::InternalError("no")));
  EXPECT_TRUE(Event().Await().ok());
}

TEST(EventTest, ReadyCarriesItsStatus) {
  Event ok = Event::Ready(absl::OkStatus());
  EXPECT_TRUE(ok.IsReady());
  EXPECT_TRUE(ok.Await().ok());

  Event bad = Event::Ready(absl::DataLossError("bad bytes"));
  EXPECT_TRUE(bad.IsReady());
  EXPECT_EQ(bad.Await().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(bad.Await().message(), "bad bytes");
  auto s = bad.AwaitWithTimeout(absl::Milliseconds(1));
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->code(), absl::StatusCode::kDataLoss);
  // Copies share the state.
  Event copy = bad;
  EXPECT_EQ(copy.state(), bad.state());
}

TEST(EventTest, ResolvesExactlyOnce) {
  CallbackExecutor executor;
  auto state = std::make_shared<EventState>(&executor);
  Event e(state);
  EXPECT_FALSE(e.IsReady());
  EXPECT_TRUE(state->Resolve(absl::AbortedError("first")));
  EXPECT_TRUE(e.IsReady());
  EXPECT_FALSE(state->Resolve(absl::OkStatus()));
  EXPECT_FALSE(state->Resolve(absl::InternalError("third")));
  EXPECT_EQ(e.Await().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(e.Await().message(), "first");
  EXPECT_EQ(state->status().code(), absl::StatusCode::kAborted);
}

TEST(EventTest, ConcurrentResolversOneWins) {
  CallbackExecutor executor;
  for (int round = 0; round < 50; ++round) {
    auto state = std::make_shared<EventState>(&executor);
    std::atomic<int> wins{0};
    std::atomic<int> callbacks{0};
    state->AddCallback([&](absl::Status) { callbacks.fetch_add(1); });
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        if (state->Resolve(absl::Status(absl::StatusCode::kUnknown,
                                        std::to_string(t)))) {
          wins.fetch_add(1);
        }
      });
    }
    for (auto& t : threads) t.join();
    EXPECT_EQ(wins.load(), 1);
    executor.Drain();
    EXPECT_EQ(callbacks.load(), 1);
  }
}

// ---- Awaiting ------------------------------------------------------------

TEST(EventTest, AwaitFromManyThreadsAllWake) {
  CallbackExecutor executor;
  auto state = std::make_shared<EventState>(&executor);
  Event e(state);
  constexpr int kThreads = 8;
  std::atomic<int> started{0};
  std::atomic<int> woke{0};
  std::vector<absl::Status> seen(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      started.fetch_add(1);
      seen[i] = e.Await();
      woke.fetch_add(1);
    });
  }
  ASSERT_TRUE(Eventually([&] { return started.load() == kThreads; }));
  // Let them get past the spin phase and sleep.
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(woke.load(), 0);
  EXPECT_TRUE(state->Resolve(absl::UnavailableError("link down")));
  for (auto& t : threads) t.join();
  EXPECT_EQ(woke.load(), kThreads);
  for (const absl::Status& s : seen) {
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
    EXPECT_EQ(s.message(), "link down");
  }
}

TEST(EventTest, AwaitWithTimeoutBeforeAndAfter) {
  CallbackExecutor executor;
  auto state = std::make_shared<EventState>(&executor);
  Event e(state);
  const absl::Time t0 = absl::Now();
  EXPECT_EQ(e.AwaitWithTimeout(absl::Milliseconds(30)), std::nullopt);
  const absl::Duration waited = absl::Now() - t0;
  EXPECT_GE(waited, absl::Milliseconds(29));
  EXPECT_LT(waited, absl::Seconds(2));
  EXPECT_EQ(e.AwaitWithTimeout(absl::Microseconds(5)), std::nullopt);

  ASSERT_TRUE(state->Resolve(absl::ResourceExhaustedError("full")));
  auto s = e.AwaitWithTimeout(absl::Milliseconds(30));
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->code(), absl::StatusCode::kResourceExhausted);
}

TEST(EventTest, AwaitWithTimeoutWakesOnResolve) {
  CallbackExecutor executor;
  auto state = std::make_shared<EventState>(&executor);
  Event e(state);
  std::thread resolver([&] {
    absl::SleepFor(absl::Milliseconds(30));
    state->Resolve(absl::OkStatus());
  });
  const absl::Time t0 = absl::Now();
  auto s = e.AwaitWithTimeout(absl::Seconds(20));
  const absl::Duration waited = absl::Now() - t0;
  resolver.join();
  ASSERT_TRUE(s.has_value());
  EXPECT_TRUE(s->ok());
  // Woken by the resolution, not by the timeout.
  EXPECT_LT(waited, absl::Seconds(5));
}

TEST(EventTest, ZeroAndNegativeTimeouts) {
  CallbackExecutor executor;
  auto state = std::make_shared<EventState>(&executor);
  Event e(state);
  const absl::Time t0 = absl::Now();
  EXPECT_EQ(e.AwaitWithTimeout(absl::ZeroDuration()), std::nullopt);
  EXPECT_EQ(e.AwaitWithTimeout(absl::Nanoseconds(-1)), std::nullopt);
  EXPECT_EQ(e.AwaitWithTimeout(absl::Seconds(-10)), std::nullopt);
  EXPECT_EQ(e.AwaitWithTimeout(-absl::InfiniteDuration()), std::nullopt);
  EXPECT_LT(absl::Now() - t0, absl::Milliseconds(500));

  ASSERT_TRUE(state->Resolve(absl::CancelledError("gone")));
  for (absl::Duration d : {absl::ZeroDuration(), absl::Nanoseconds(-1),
                           absl::Seconds(-10), -absl::InfiniteDuration()}) {
    auto s = e.AwaitWithTimeout(d);
    ASSERT_TRUE(s.has_value()) << d;
    EXPECT_EQ(s->code(), absl::StatusCode::kCancelled);
  }
}

// An infinite (or huge) timeout is an Await: it sleeps until the event is
// ready, rather than timing out at once, busy-waiting or (with a deadline
// that overflowed) spinning with the event's lock held so that nobody can
// resolve it. The waiter and the resolver run on their own threads so that
// such a hang fails the test instead of hanging it (they are then leaked).
TEST(EventTest, InfiniteTimeoutSleepsUntilReady) {
  for (absl::Duration timeout :
       {absl::InfiniteDuration(),
        absl::Nanoseconds(std::numeric_limits<int64_t>::max()),
        absl::Hours(24 * 365 * 200)}) {
    struct Shared {
      CallbackExecutor executor;
      std::shared_ptr<EventState> state =
          std::make_shared<EventState>(&executor);
      std::optional<absl::Status> got;
      int64_t cpu_ns = 0;
      absl::Duration waited;
      Notification waiter_done;
      Notification resolver_done;
    };
    auto shared = std::make_shared<Shared>();
    std::thread waiter([shared, timeout] {
      const absl::Time t0 = absl::Now();
      const int64_t cpu0 = ThreadCpuNanos();
      shared->got = Event(shared->state).AwaitWithTimeout(timeout);
      shared->cpu_ns = ThreadCpuNanos() - cpu0;
      shared->waited = absl::Now() - t0;
      shared->waiter_done.Notify();
    });
    std::thread resolver([shared] {
      absl::SleepFor(absl::Milliseconds(150));
      shared->state->Resolve(absl::InternalError("late"));
      shared->resolver_done.Notify();
    });
    if (!shared->waiter_done.WaitForNotificationWithTimeout(
            absl::Seconds(5)) ||
        !shared->resolver_done.WaitForNotificationWithTimeout(
            absl::Seconds(1))) {
      ADD_FAILURE() << "AwaitWithTimeout(" << timeout
                    << ") did not return after the event became ready "
                       "(resolver done: "
                    << shared->resolver_done.HasBeenNotified() << ")";
      waiter.detach();
      resolver.detach();
      new std::shared_ptr<Shared>(shared);  // leaked: threads still use it
      return;
    }
    waiter.join();
    resolver.join();
    ASSERT_TRUE(shared->got.has_value()) << timeout;
    EXPECT_EQ(shared->got->code(), absl::StatusCode::kInternal);
    EXPECT_GE(shared->waited, absl::Milliseconds(100));
    // Sleeping, not spinning: far less CPU than wall time.
    EXPECT_LT(shared->cpu_ns, 50'000'000)
        << "the waiter spun for " << shared->cpu_ns << " ns of CPU";
  }
}

TEST(EventTest, WithoutSpinningAwaitsStillWork) {
  CallbackExecutor executor;
  auto state = std::make_shared<EventState>(&executor);
  state->set_await_spin_ns(0);
  Event e(state);
  EXPECT_EQ(e.AwaitWithTimeout(absl::ZeroDuration()), std::nullopt);
  EXPECT_EQ(e.AwaitWithTimeout(absl::Nanoseconds(1)), std::nullopt);
  EXPECT_EQ(e.AwaitWithTimeout(absl::Milliseconds(5)), std::nullopt);
  std::atomic<int> woke{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back([&] {
      if (e.Await().code() == absl::StatusCode::kAborted) woke.fetch_add(1);
    });
    threads.emplace_back([&] {
      auto s = e.AwaitWithTimeout(absl::Seconds(20));
      if (s.has_value() && s->code() == absl::StatusCode::kAborted) {
        woke.fetch_add(1);
      }
    });
  }
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(woke.load(), 0);
  ASSERT_TRUE(state->Resolve(absl::AbortedError("stop")));
  for (auto& t : threads) t.join();
  EXPECT_EQ(woke.load(), 6);
  auto s = e.AwaitWithTimeout(absl::ZeroDuration());
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->code(), absl::StatusCode::kAborted);
}

TEST(EventTest, AwaitSleepsRatherThanSpins) {
  CallbackExecutor executor;
  auto state = std::make_shared<EventState>(&executor);
  Event e(state);
  std::thread resolver([&] {
    absl::SleepFor(absl::Milliseconds(150));
    state->Resolve(absl::OkStatus());
  });
  const int64_t cpu0 = ThreadCpuNanos();
  EXPECT_TRUE(e.Await().ok());
  EXPECT_LT(ThreadCpuNanos() - cpu0, 50'000'000);
  resolver.join();
}

// ---- Callbacks -----------------------------------------------------------

TEST(EventTest, CallbackOnPendingEventRunsOnExecutorThreadAfterResolve) {
  CallbackExecutor executor;
  auto state = std::make_shared<EventState>(&executor);
  Event e(state);
  Mutex mu;
  std::string thread_name;
  std::thread::id thread_id;
  absl::Status got;
  Notification ran;
  // Holds the callback until Resolve has returned: if Resolve ran it
  // inline, Resolve would not return (the test would then time out below).
  Notification resolve_returned;
  e.AddCallback([&](absl::Status s) {
    resolve_returned.WaitForNotificationWithTimeout(absl::Seconds(5));
    MutexLock lock(&mu);
    thread_name = CurrentThreadName();
    thread_id = std::this_thread::get_id();
    got = std::move(s);
    ran.Notify();
  });
  absl::SleepFor(absl::Milliseconds(5));
  EXPECT_FALSE(ran.HasBeenNotified()) << "ran before the event was ready";
  const std::thread::id resolver = std::this_thread::get_id();
  ASSERT_TRUE(state->Resolve(absl::NotFoundError("x")));
  {
    // Resolve returned without the callback having finished.
    MutexLock lock(&mu);
    EXPECT_EQ(thread_name, "");
  }
  resolve_returned.Notify();
  ASSERT_TRUE(ran.WaitForNotificationWithTimeout(absl::Seconds(5)));
  MutexLock lock(&mu);
  EXPECT_EQ(thread_name, "tpushim-cb");
  EXPECT_NE(thread_id, resolver);
  EXPECT_EQ(got.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(got.message(), "x");
}

TEST(EventTest, CallbackNotRunInlineByResolveOnAnotherThread) {
  CallbackExecutor executor;
  auto state = std::make_shared<EventState>(&executor);
  std::atomic<bool> on_resolver{false};
  std::string name;
  Notification ran;
  std::thread::id resolver_id;
  state->AddCallback([&](absl::Status) {
    on_resolver = std::this_thread::get_id() == resolver_id;
    name = CurrentThreadName();
    ran.Notify();
  });
  std::thread resolver([&] {
    resolver_id = std::this_thread::get_id();
    pthread_setname_np(pthread_self(), "dma-resolver");
    state->Resolve(absl::OkStatus());
  });
  resolver.join();
  ASSERT_TRUE(ran.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_FALSE(on_resolver.load());
  EXPECT_EQ(name, "tpushim-cb");
}

TEST(EventTest, CallbackOnReadyEventRunsInlineOnCallingThread) {
  CallbackExecutor executor;
  auto state = std::make_shared<EventState>(&executor);
  ASSERT_TRUE(state->Resolve(absl::OutOfRangeError("oor")));
  Event e(state);
  bool ran = false;
  std::thread::id where;
  absl::Status got;
  e.AddCallback([&](absl::Status s) {
    ran = true;
    where = std::this_thread::get_id();
    got = std::move(s);
  });
  // Inline: done before AddCallback returned.
  EXPECT_TRUE(ran);
  EXPECT_EQ(where, std::this_thread::get_id());
  EXPECT_EQ(got.code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(executor.executed(), 0u);

  // Also for Event::Ready and the default event.
  bool ran2 = false;
  Event::Ready(absl::OkStatus()).AddCallback([&](absl::Status s) {
    ran2 = s.ok();
  });
  EXPECT_TRUE(ran2);
  bool ran3 = false;
  Event().AddCallback([&](absl::Status s) { ran3 = s.ok(); });
  EXPECT_TRUE(ran3);
}

TEST(EventTest, CallbacksRunInFifoOrder) {
  CallbackExecutor executor;
  std::vector<int> order;  // only touched on the executor thread
  auto a = std::make_shared<EventState>(&executor);
  auto b = std::make_shared<EventState>(&executor);
  for (int i = 0; i < 50; ++i) {
    a->AddCallback([&order, i](absl::Status) { order.push_back(i); });
  }
  for (int i = 100; i < 150; ++i) {
    b->AddCallback([&order, i](absl::Status) { order.push_back(i); });
  }
  // b becomes ready first: its callbacks became runnable first.
  ASSERT_TRUE(b->Resolve(absl::OkStatus()));
  ASSERT_TRUE(a->Resolve(absl::OkStatus()));
  executor.Drain();
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(order[i], 100 + i);
    EXPECT_EQ(order[50 + i], i);
  }
  EXPECT_EQ(executor.executed(), 100u);
}

TEST(EventTest, ContinuationsRunInlineOnResolvingThread) {
  CallbackExecutor executor;
  auto state = std::make_shared<EventState>(&executor);
  std::vector<int> order;
  std::vector<std::thread::id> where;
  for (int i = 0; i < 3; ++i) {
    state->AddContinuation([&, i](const absl::Status& s) {
      EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
      order.push_back(i);
      where.push_back(std::this_thread::get_id());
    });
  }
  EXPECT_TRUE(order.empty());
  std::thread::id resolver_id;
  std::thread resolver([&] {
    resolver_id = std::this_thread::get_id();
    state->Resolve(absl::DeadlineExceededError("late"));
    // Done by the time Resolve returns.
    EXPECT_EQ(order.size(), 3u);
  });
  resolver.join();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2}));
  for (const auto& id : where) EXPECT_EQ(id, resolver_id);
  EXPECT_EQ(executor.executed(), 0u);

  // On a ready event: at once, on this thread.
  bool ran = false;
  const std::thread::id caller = std::this_thread::get_id();
  state->AddContinuation([&](const absl::Status& s) {
    ran = true;
    EXPECT_EQ(std::this_thread::get_id(), caller);
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  });
  EXPECT_TRUE(ran);
}

TEST(EventTest, ContinuationsRunBeforeResolveReturnsCallbacksLater) {
  CallbackExecutor executor;
  auto state = std::make_shared<EventState>(&executor);
  std::atomic<bool> continuation{false};
  std::atomic<bool> callback_saw_continuation{false};
  Notification done;
  state->AddCallback([&](absl::Status) {
    callback_saw_continuation = continuation.load();
    done.Notify();
  });
  state->AddContinuation([&](const absl::Status&) { continuation = true; });
  ASSERT_TRUE(state->Resolve(absl::OkStatus()));
  EXPECT_TRUE(continuation.load());
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_TRUE(callback_saw_continuation.load());
}

TEST(EventTest, CallbackAddingAnotherCallbackWorks) {
  CallbackExecutor executor;
  auto first = std::make_shared<EventState>(&executor);
  auto second = std::make_shared<EventState>(&executor);
  std::vector<std::string> log;  // executor thread, or inline
  Notification nested_ran;
  first->AddCallback([&](absl::Status) {
    log.push_back("first");
    // A pending event: queued, runs later on this same executor.
    second->AddCallback([&](absl::Status s) {
      log.push_back(absl::StrCat("second:", s.ToString()));
      nested_ran.Notify();
    });
    // A ready event: runs inline here.
    first->AddCallback([&](absl::Status) { log.push_back("inline"); });
    log.push_back("first done");
  });
  ASSERT_TRUE(first->Resolve(absl::OkStatus()));
  executor.Drain();
  EXPECT_EQ(log, (std::vector<std::string>{"first", "inline", "first done"}));
  ASSERT_TRUE(second->Resolve(absl::OkStatus()));
  ASSERT_TRUE(nested_ran.WaitForNotificationWithTimeout(absl::Seconds(5)));
  executor.Drain();
  ASSERT_EQ(log.size(), 4u);
  EXPECT_EQ(log[3], "second:OK");
}

TEST(EventTest, CallbackResolvingAnotherEventFromExecutor) {
  CallbackExecutor executor;
  auto a = std::make_shared<EventState>(&executor);
  auto b = std::make_shared<EventState>(&executor);
  std::vector<std::string> log;
  a->AddCallback([&](absl::Status) {
    log.push_back("a");
    b->Resolve(absl::OkStatus());  // posts b's callback behind us
    log.push_back("a done");
  });
  b->AddCallback([&](absl::Status) { log.push_back("b"); });
  ASSERT_TRUE(a->Resolve(absl::OkStatus()));
  executor.Drain();
  EXPECT_EQ(log, (std::vector<std::string>{"a", "a done", "b"}));
}

// ---- CallbackExecutor ------------------------------------------------------

TEST(CallbackExecutorTest, RunsOnItsOwnNamedThread) {
  CallbackExecutor executor;
  std::string name;
  std::thread::id id;
  executor.Post([&] {
    name = CurrentThreadName();
    id = std::this_thread::get_id();
  });
  executor.Drain();
  EXPECT_EQ(name, "tpushim-cb");
  EXPECT_NE(id, std::this_thread::get_id());
  EXPECT_EQ(executor.executed(), 1u);
}

TEST(CallbackExecutorTest, DrainWaitsForEverythingPosted) {
  CallbackExecutor executor;
  std::atomic<int> done{0};
  for (int i = 0; i < 20; ++i) {
    executor.Post([&, i] {
      if (i % 5 == 0) absl::SleepFor(absl::Milliseconds(2));
      done.fetch_add(1);
    });
  }
  executor.Drain();
  EXPECT_EQ(done.load(), 20);
  EXPECT_EQ(executor.executed(), 20u);
  // Drain with nothing queued returns at once; and again after more work.
  executor.Drain();
  executor.Post([&] {
    absl::SleepFor(absl::Milliseconds(20));
    done.fetch_add(1);
  });
  executor.Drain();
  EXPECT_EQ(done.load(), 21);
}

TEST(CallbackExecutorTest, DrainWaitsForTheRunningCallback) {
  CallbackExecutor executor;
  Notification started;
  std::atomic<bool> finished{false};
  executor.Post([&] {
    started.Notify();
    absl::SleepFor(absl::Milliseconds(50));
    finished = true;
  });
  // The queue is empty once the callback is taken; Drain must still wait.
  ASSERT_TRUE(started.WaitForNotificationWithTimeout(absl::Seconds(5)));
  executor.Drain();
  EXPECT_TRUE(finished.load());
}

TEST(CallbackExecutorTest, DrainFromManyThreadsWhilePosting) {
  CallbackExecutor executor;
  std::atomic<int> ran{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        std::atomic<bool> mine{false};
        executor.Post([&] {
          mine = true;
          ran.fetch_add(1);
        });
        // Drain returns only after this thread's own callback ran (and
        // `mine` must outlive it anyway).
        executor.Drain();
        EXPECT_TRUE(mine.load());
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ran.load(), 800);
}

TEST(CallbackExecutorTest, DestructionRunsQueuedCallbacks) {
  std::atomic<int> ran{0};
  std::vector<int> order;
  {
    // Declared first so that it outlives ~CallbackExecutor: the blocked
    // callback is still inside WaitForNotificationWithTimeout after Notify.
    Notification release;
    CallbackExecutor executor;
    // Block the thread so that the rest stays queued.
    executor.Post([&] {
      release.WaitForNotificationWithTimeout(absl::Seconds(5));
      order.push_back(-1);
    });
    for (int i = 0; i < 100; ++i) {
      executor.Post([&, i] {
        order.push_back(i);
        ran.fetch_add(1);
      });
    }
    // A callback posted by a callback while the executor is stopping runs
    // too.
    executor.Post([&] {
      executor.Post([&] {
        order.push_back(1000);
        ran.fetch_add(1);
      });
    });
    release.Notify();
  }  // ~CallbackExecutor
  EXPECT_EQ(ran.load(), 101);
  ASSERT_EQ(order.size(), 102u);
  EXPECT_EQ(order.front(), -1);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i + 1], i);
  EXPECT_EQ(order.back(), 1000);
}

TEST(CallbackExecutorTest, DestructionRunsEventCallbacksQueuedByResolve) {
  std::atomic<int> ran{0};
  {
    Notification release;  // outlives ~CallbackExecutor, as above
    CallbackExecutor executor;
    executor.Post([&] {
      release.WaitForNotificationWithTimeout(absl::Seconds(5));
    });
    auto state = std::make_shared<EventState>(&executor);
    for (int i = 0; i < 10; ++i) {
      state->AddCallback([&](absl::Status s) {
        if (s.ok()) ran.fetch_add(1);
      });
    }
    ASSERT_TRUE(state->Resolve(absl::OkStatus()));
    EXPECT_EQ(ran.load(), 0);
    release.Notify();
  }
  EXPECT_EQ(ran.load(), 10);
}

// ---- Callbacks that throw --------------------------------------------------
//
// A callback's exception is logged at ERROR and dropped, wherever the
// callback runs: the callback thread goes on with the next callback, and a
// caller adding a callback to a ready event sees no exception.

TEST(ThrowingCallbackTest, OnAPendingEventIsLoggedAndLaterCallbacksRun) {
  testutil::ScopedTestLogging logs;
  std::atomic<int> ran{0};
  {
    CallbackExecutor executor;
    auto state = std::make_shared<EventState>(&executor);
    state->AddCallback(
        [](absl::Status) { throw std::runtime_error("pending boom"); });
    state->AddCallback([](absl::Status) { throw 42; });
    state->AddCallback([&](absl::Status s) {
      if (s.ok()) ran.fetch_add(1);
    });
    ASSERT_TRUE(state->Resolve(absl::OkStatus()));
    executor.Drain();
    EXPECT_EQ(ran.load(), 1);
    EXPECT_EQ(executor.executed(), 3u);
    // The thread still runs what comes next.
    executor.Post([&] { ran.fetch_add(1); });
    executor.Drain();
    EXPECT_EQ(ran.load(), 2);
  }
  const std::string errors = logs.File("ERROR");
  EXPECT_THAT(errors, ::testing::HasSubstr(
                          "An event callback threw an exception, ignored "
                          "(callbacks must not throw): pending boom"));
  EXPECT_THAT(errors, ::testing::HasSubstr("not a std::exception"));
}

TEST(ThrowingCallbackTest, OnAReadyEventIsLoggedAndNotThrownToTheCaller) {
  testutil::ScopedTestLogging logs;
  CallbackExecutor executor;
  auto state = std::make_shared<EventState>(&executor);
  ASSERT_TRUE(state->Resolve(absl::OkStatus()));
  int ran = 0;
  EXPECT_NO_THROW(state->AddCallback(
      [](absl::Status) { throw std::runtime_error("ready boom"); }));
  state->AddCallback([&](absl::Status s) { ran += s.ok() ? 1 : 0; });
  EXPECT_EQ(ran, 1);
  // The public handle behaves the same.
  const Event ready = Event::Ready(absl::InternalError("failed"));
  EXPECT_NO_THROW(ready.AddCallback(
      [](absl::Status) { throw std::runtime_error("public boom"); }));
  const std::string errors = logs.File("ERROR");
  EXPECT_THAT(errors, ::testing::HasSubstr("ignored (callbacks must not "
                                           "throw): ready boom"));
  EXPECT_THAT(errors, ::testing::HasSubstr("public boom"));
}

// Drain called from a callback runs the queued callbacks itself: one that
// throws there is logged too, and Drain finishes the queue and returns
// with its lock as it should be.
TEST(ThrowingCallbackTest, InADrainFromACallbackIsLoggedAndTheRestRun) {
  testutil::ScopedTestLogging logs;
  std::atomic<int> ran{0};
  std::atomic<bool> drained{false};
  Notification release;  // outlives ~CallbackExecutor
  {
    CallbackExecutor executor;
    executor.Post([&] {
      release.WaitForNotificationWithTimeout(absl::Seconds(5));
      executor.Drain();  // runs the two below, here
      drained = true;
    });
    executor.Post([] { throw std::runtime_error("drained boom"); });
    executor.Post([&] { ran.fetch_add(1); });
    release.Notify();
    executor.Drain();
    EXPECT_TRUE(drained.load());
    EXPECT_EQ(ran.load(), 1);
    executor.Post([&] { ran.fetch_add(1); });
    executor.Drain();
    EXPECT_EQ(ran.load(), 2);
  }
  EXPECT_THAT(logs.File("ERROR"), ::testing::HasSubstr("drained boom"));
}

TEST(CallbackExecutorTest, IdleDestructionIsPrompt) {
  const absl::Time t0 = absl::Now();
  for (int i = 0; i < 20; ++i) {
    CallbackExecutor executor;
  }
  EXPECT_LT(absl::Now() - t0, absl::Seconds(2));
}

}  // namespace
}  // namespace tpushim
