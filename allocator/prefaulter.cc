#include "allocator/prefaulter.h"

#include <sys/mman.h>

#include <algorithm>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "logging/log.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

namespace tpushim {
namespace {

// Work is handed out in chunks of at most this size, so that threads
// finish together and progress can be reported. The last chunk runs on
// one thread while the others may have nothing left: with 64 MiB chunks
// that tail put a 4 GiB start-up at 1.13 of the kernel's best populate
// (fresh processes, 15 rounds), with 16 MiB at 1.07 and with 8 MiB at
// 1.06; 16 MiB keeps a region premapped in the background to at most 256
// IOMMU mapping steps for 4 GiB (fewer when chunks finish during a step).
constexpr uint64_t kMaxChunk = uint64_t{16} << 20;
constexpr uint64_t kSmallPage = 4096;

uint64_t RoundUp(uint64_t value, uint64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

}  // namespace

Prefaulter::Prefaulter(Os& os, char* base, uint64_t length, uint64_t granule,
                       int node, ReadyCallback on_ready)
    : os_(os),
      base_(base),
      length_(length),
      chunk_(
          std::max(granule, std::min(kMaxChunk, RoundUp(length / 8, granule)))),
      node_(node),
      on_ready_(std::move(on_ready)) {
  MutexLock lock(&mu_);
  chunk_done_.assign((length_ + chunk_ - 1) / chunk_, false);
}

int Prefaulter::ThreadsFor(int requested) const {
  const uint64_t chunks = (length_ + chunk_ - 1) / chunk_;
  return static_cast<int>(
      std::max<uint64_t>(1, std::min<uint64_t>(requested, chunks)));
}

absl::Status Prefaulter::Run(int threads) {
  std::vector<std::thread> workers;
  workers.reserve(threads);
  for (int i = 0; i < threads; ++i) {
    try {
      workers.emplace_back([this] { Work(); });
    } catch (const std::system_error& e) {
      Fail(absl::ResourceExhaustedError(
          absl::StrCat("cannot start a pre-fault thread: ", e.what())));
      break;
    }
  }
  {
    MutexLock lock(&mu_);
    spawned_ = static_cast<int>(workers.size());
  }
  // This thread is the one ready point: it reports each new prefix, with
  // no lock held, while the workers go on populating.
  uint64_t told = 0;
  absl::Time next_log = absl::Now() + absl::Seconds(1);
  for (;;) {
    uint64_t prefix;
    bool finished;
    {
      MutexLock lock(&mu_);
      while (finished_ != spawned_ && PrefixLocked() <= told) {
        if (changed_cv_.WaitWithDeadline(&mu_, next_log)) break;
      }
      prefix = PrefixLocked();
      finished = finished_ == spawned_;
    }
    if (prefix > told) {
      told = prefix;
      ready_bytes_.store(prefix, std::memory_order_release);
      if (on_ready_) on_ready_(prefix);
    }
    if (finished) break;  // that prefix was the last one
    if (absl::Now() >= next_log) {
      const uint64_t done = done_bytes();
      LOG(INFO) << "Premapping memory: " << done << " of " << length_
                << " bytes (" << done * 100 / length_ << "%)";
      next_log = absl::Now() + absl::Seconds(1);
    }
  }
  for (std::thread& t : workers) t.join();
  MutexLock lock(&mu_);
  if (first_error_.ok() && done_bytes() < length_) {
    return absl::CancelledError("premapping was stopped before it finished");
  }
  return first_error_;
}

void Prefaulter::Cancel() { stop_.store(true, std::memory_order_relaxed); }

void Prefaulter::Work() {
  // Thread placement only affects speed: a failure is worth one warning.
  absl::Status bound = os_.NumaRunOnNode(node_);
  if (!bound.ok()) {
    MutexLock lock(&mu_);
    if (!warned_bind_) {
      warned_bind_ = true;
      LOG(WARNING) << "Cannot bind pre-fault threads to NUMA node " << node_
                   << ": " << bound << "; pre-faulting unbound";
    }
  }
  for (;;) {
    if (stop_.load(std::memory_order_relaxed)) break;
    const uint64_t offset =
        next_offset_.fetch_add(chunk_, std::memory_order_relaxed);
    if (offset >= length_) break;
    const uint64_t len = std::min(chunk_, length_ - offset);
    absl::Status status = Populate(base_ + offset, len);
    if (!status.ok()) {
      Fail(status);
      break;
    }
    done_bytes_.fetch_add(len, std::memory_order_relaxed);
    ChunkReady(offset / chunk_);
  }
  MutexLock lock(&mu_);
  ++finished_;
  changed_cv_.SignalAll();
}

void Prefaulter::ChunkReady(uint64_t index) {
  MutexLock lock(&mu_);
  chunk_done_[index] = true;
  if (index != first_missing_) return;
  while (first_missing_ < chunk_done_.size() && chunk_done_[first_missing_]) {
    ++first_missing_;
  }
  changed_cv_.SignalAll();
}

uint64_t Prefaulter::PrefixLocked() const {
  return std::min(length_, first_missing_ * chunk_);
}

absl::Status Prefaulter::Populate(char* p, uint64_t len) {
  if (!touch_fallback_.load(std::memory_order_relaxed)) {
    absl::Status s = os_.Madvise(p, len, MADV_POPULATE_WRITE);
    if (s.ok()) return s;
    if (s.code() != absl::StatusCode::kInvalidArgument) return s;
    // Kernels before 5.14 do not know MADV_POPULATE_WRITE.
    touch_fallback_.store(true, std::memory_order_relaxed);
  }
  for (uint64_t off = 0; off < len; off += kSmallPage) {
    reinterpret_cast<volatile char*>(p)[off] = 0;
  }
  return absl::OkStatus();
}

void Prefaulter::Fail(const absl::Status& status) {
  MutexLock lock(&mu_);
  if (first_error_.ok()) first_error_ = status;
  stop_.store(true, std::memory_order_relaxed);
}

}  // namespace tpushim
