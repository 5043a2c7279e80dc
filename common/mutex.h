// tpushim::Mutex: an adaptive pthread mutex with clang thread-safety
// annotations.
//
// Debian's abseil 20220623 is built with absl::Mutex deadlock detection on,
// which puts a graph-cycle lookup into every Lock(): about 40 % of an
// allocate+free pair in the region allocator. Hot paths therefore lock a
// glibc PTHREAD_MUTEX_ADAPTIVE_NP mutex (it spins briefly before sleeping
// on a futex, as absl::Mutex does, and ThreadSanitizer understands it),
// annotated so that -Wthread-safety checks the fields it guards exactly as
// it would for absl::Mutex.
//
//   mutable Mutex mu_;
//   int count_ ABSL_GUARDED_BY(mu_);
//   void Add() { MutexLock lock(&mu_); ++count_; }
//
// Thread-safety: as pthread_mutex_t. Not recursive.

#ifndef TPUSHIM_COMMON_MUTEX_H_
#define TPUSHIM_COMMON_MUTEX_H_

#include <pthread.h>

#include "absl/base/thread_annotations.h"

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

}  // namespace tpushim

#endif  // TPUSHIM_COMMON_MUTEX_H_
