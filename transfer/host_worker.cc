#include "transfer/host_worker.h"

#include <pthread.h>

#include <utility>

#include "common/cpu_relax.h"

namespace tpushim::transfer_internal {

HostWorker::HostWorker(const std::string& name) {
  thread_ = std::thread([this, name] {
    pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
    Loop();
  });
}

HostWorker::~HostWorker() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  thread_.join();
}

void HostWorker::Post(absl::AnyInvocable<void() &&> fn) {
  bool wake;
  {
    MutexLock lock(&mu_);
    queue_.push_back(std::move(fn));
    posted_.fetch_add(1, std::memory_order_release);
    wake = sleeping_;
  }
  if (wake) cv_.Signal();
}

void HostWorker::Loop() {
  MutexLock lock(&mu_);
  for (;;) {
    if (queue_.empty() && !stop_) {
      const uint64_t seen = posted_.load(std::memory_order_acquire);
      mu_.Unlock();
      SpinFor(kIdleSpinNs,
              [&] { return posted_.load(std::memory_order_acquire) != seen; });
      mu_.Lock();
      sleeping_ = true;
      while (queue_.empty() && !stop_) cv_.Wait(&mu_);
      sleeping_ = false;
    }
    if (queue_.empty()) return;
    absl::AnyInvocable<void()&&> fn = std::move(queue_.front());
    queue_.pop_front();
    mu_.Unlock();
    std::move(fn)();
    mu_.Lock();
  }
}

}  // namespace tpushim::transfer_internal
