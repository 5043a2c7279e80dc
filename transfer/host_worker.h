// HostWorker: a thread that runs posted work in FIFO order — the slow,
// host-side parts of DMA completions (copies out of staging that should
// overlap the next DMA, unregistering and unpinning caller memory, freeing
// device memory), kept off the devices' DMA threads.
//
// Thread-safety: Post is thread-safe, from any thread, the worker's own
// included. The destructor runs everything posted before it, then joins.
//
//   HostWorker worker("tpushim-host");
//   worker.Post([&] { pins.Unpin(std::move(lease)); });

#ifndef TPUSHIM_TRANSFER_HOST_WORKER_H_
#define TPUSHIM_TRANSFER_HOST_WORKER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <string>
#include <thread>

#include "absl/functional/any_invocable.h"
#include "common/mutex.h"

namespace tpushim::transfer_internal {

class HostWorker {
 public:
  // `name` names the thread (at most 15 characters are kept).
  explicit HostWorker(const std::string& name);
  HostWorker(const HostWorker&) = delete;
  HostWorker& operator=(const HostWorker&) = delete;
  ~HostWorker();

  void Post(absl::AnyInvocable<void() &&> fn);

 private:
  // Idle, the worker polls this long before it sleeps: copies out of
  // staging come every few tens of microseconds in a large transfer.
  static constexpr int64_t kIdleSpinNs = 30'000;

  void Loop();

  Mutex mu_;
  CondVar cv_;
  std::deque<absl::AnyInvocable<void() &&>> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool sleeping_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<uint64_t> posted_{0};
  std::thread thread_;
};

}  // namespace tpushim::transfer_internal

#endif  // TPUSHIM_TRANSFER_HOST_WORKER_H_
