// Locks for tpushim: Mutex (an adaptive pthread mutex), SharedMutex (a
// pthread rwlock), their scoped holders, CondVar and Notification, all with
// clang thread-safety annotations, in the shape of absl's.
//
// Debian's abseil 20220623 is built with absl::Mutex deadlock detection on,
// which puts a graph-cycle lookup into every Lock(): about 40 % of an
// allocate+free pair in the region allocator. Hot paths therefore lock a
// glibc PTHREAD_MUTEX_ADAPTIVE_NP mutex (it spins briefly before sleeping
// on a futex, as absl::Mutex does, and ThreadSanitizer understands it),
// annotated so that -Wthread-safety checks the fields it guards exactly as
// it would for absl::Mutex. The same library's absl::Mutex is also invisible
// to ThreadSanitizer (its atomics are not instrumented), which then reports
// every handoff it guards as a race; pthread primitives are intercepted.
// So tpushim uses these everywhere instead of absl's.
//
//   mutable Mutex mu_;
//   int count_ ABSL_GUARDED_BY(mu_);
//   void Add() { MutexLock lock(&mu_); ++count_; }
//
// Thread-safety: as pthread_mutex_t. Not recursive.

#ifndef TPUSHIM_COMMON_MUTEX_H_
#define TPUSHIM_COMMON_MUTEX_H_

#include <pthread.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tpushim {

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() {
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_ADAPTIVE_NP);
    pthread_mutex_init(&mu_, &attr);
    pthread_mutexattr_destroy(&attr);
  }
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;
  ~Mutex() { pthread_mutex_destroy(&mu_); }

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { pthread_mutex_lock(&mu_); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { pthread_mutex_unlock(&mu_); }
  bool TryLock() ABSL_EXCLUSIVE_TRYLOCK_FUNCTION(true) {
    return pthread_mutex_trylock(&mu_) == 0;
  }
  // For the analysis only: documents that the caller holds the lock.
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {}

 private:
  friend class CondVar;
  pthread_mutex_t mu_;
};

// Holds `mu` for the scope.
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) {
    mu_->Lock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }

 private:
  Mutex* const mu_;
};

// A reader-writer lock: many readers or one writer.
class ABSL_LOCKABLE SharedMutex {
 public:
  SharedMutex() { pthread_rwlock_init(&mu_, nullptr); }
  SharedMutex(const SharedMutex&) = delete;
  SharedMutex& operator=(const SharedMutex&) = delete;
  ~SharedMutex() { pthread_rwlock_destroy(&mu_); }

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { pthread_rwlock_wrlock(&mu_); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { pthread_rwlock_unlock(&mu_); }
  void ReaderLock() ABSL_SHARED_LOCK_FUNCTION() { pthread_rwlock_rdlock(&mu_); }
  void ReaderUnlock() ABSL_UNLOCK_FUNCTION() { pthread_rwlock_unlock(&mu_); }

 private:
  pthread_rwlock_t mu_;
};

class ABSL_SCOPED_LOCKABLE ReaderMutexLock {
 public:
  explicit ReaderMutexLock(SharedMutex* mu) ABSL_SHARED_LOCK_FUNCTION(mu)
      : mu_(mu) {
    mu_->ReaderLock();
  }
  ReaderMutexLock(const ReaderMutexLock&) = delete;
  ReaderMutexLock& operator=(const ReaderMutexLock&) = delete;
  ~ReaderMutexLock() ABSL_UNLOCK_FUNCTION() { mu_->ReaderUnlock(); }

 private:
  SharedMutex* const mu_;
};

class ABSL_SCOPED_LOCKABLE WriterMutexLock {
 public:
  explicit WriterMutexLock(SharedMutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu)
      : mu_(mu) {
    mu_->Lock();
  }
  WriterMutexLock(const WriterMutexLock&) = delete;
  WriterMutexLock& operator=(const WriterMutexLock&) = delete;
  ~WriterMutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }

 private:
  SharedMutex* const mu_;
};

// A condition variable on CLOCK_MONOTONIC, used with a Mutex the caller
// holds. Wakeups may be spurious: wait in a loop on the condition.
class CondVar {
 public:
  CondVar() {
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&cv_, &attr);
    pthread_condattr_destroy(&attr);
  }
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;
  ~CondVar() { pthread_cond_destroy(&cv_); }

  void Wait(Mutex* mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    pthread_cond_wait(&cv_, &mu->mu_);
  }
  // Returns true when `timeout` passed first (as absl::CondVar does).
  bool WaitWithTimeout(Mutex* mu, absl::Duration timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    const absl::Duration until = absl::DurationFromTimespec(now) +
                                 std::max(timeout, absl::ZeroDuration());
    const struct timespec deadline = absl::ToTimespec(until);
    return pthread_cond_timedwait(&cv_, &mu->mu_, &deadline) == ETIMEDOUT;
  }
  // Returns true when CLOCK_MONOTONIC reached `deadline_ns` first.
  bool WaitUntilMonotonicNanos(Mutex* mu, int64_t deadline_ns)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    struct timespec deadline;
    deadline.tv_sec = static_cast<time_t>(deadline_ns / 1'000'000'000);
    deadline.tv_nsec = static_cast<long>(deadline_ns % 1'000'000'000);
    return pthread_cond_timedwait(&cv_, &mu->mu_, &deadline) == ETIMEDOUT;
  }
  // Returns true when `deadline` (wall clock) passed first.
  bool WaitWithDeadline(Mutex* mu, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return WaitWithTimeout(mu, deadline - absl::Now());
  }
  void Signal() { pthread_cond_signal(&cv_); }
  void SignalAll() { pthread_cond_broadcast(&cv_); }

 private:
  pthread_cond_t cv_;
};

// A one-shot event: Notify() once, wait for it from any thread.
class Notification {
 public:
  Notification() = default;
  Notification(const Notification&) = delete;
  Notification& operator=(const Notification&) = delete;

  void Notify() {
    MutexLock lock(&mu_);
    notified_ = true;
    cv_.SignalAll();
  }
  bool HasBeenNotified() const {
    MutexLock lock(&mu_);
    return notified_;
  }
  void WaitForNotification() const {
    MutexLock lock(&mu_);
    while (!notified_) cv_.Wait(&mu_);
  }
  // True when notified before `timeout` passed.
  bool WaitForNotificationWithTimeout(absl::Duration timeout) const {
    const absl::Time deadline = absl::Now() + timeout;
    MutexLock lock(&mu_);
    while (!notified_) {
      if (cv_.WaitWithDeadline(&mu_, deadline)) return notified_;
    }
    return true;
  }

 private:
  mutable Mutex mu_;
  mutable CondVar cv_;
  bool notified_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tpushim

#endif  // TPUSHIM_COMMON_MUTEX_H_
