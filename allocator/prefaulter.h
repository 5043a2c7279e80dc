// Prefaulter: populates freshly mapped memory from several threads, each
// bound to the region's NUMA node, with MADV_POPULATE_WRITE (a page-touch
// loop on kernels before 5.14), in chunks handed out from the low end;
// logs "Premapping memory: <done> of <total> bytes (<pct>%)" about once a
// second while it runs.
//
// It keeps the ready prefix: the bytes from the start of the range that
// are all populated. `on_ready` (optional) is called with each new prefix,
// in increasing order, so that a caller can use the low end of the range
// while the rest is still being populated. Every call comes from the
// thread that called Run (the workers only populate and record), with no
// prefaulter lock held: a slow `on_ready` (an IOMMU mapping) delays the
// next report, never the workers, which go on populating meanwhile;
// several chunks finished in the meantime come as one larger prefix.
//
// Thread-safety: Run is called once; Cancel and the accessors may be
// called from any thread at any time.
//
//   Prefaulter prefaulter(os, base, length, page_bytes, node);
//   TPUSHIM_RETURN_IF_ERROR(prefaulter.Run(prefaulter.ThreadsFor(8)));

#ifndef TPUSHIM_ALLOCATOR_PREFAULTER_H_
#define TPUSHIM_ALLOCATOR_PREFAULTER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "env/os.h"

namespace tpushim {

class Prefaulter {
 public:
  using ReadyCallback = std::function<void(uint64_t ready_bytes)>;

  // Populates [base, base + length) in chunks of whole `granule`s (the
  // page size backing it). `os` must outlive the prefaulter.
  Prefaulter(Os& os, char* base, uint64_t length, uint64_t granule, int node,
             ReadyCallback on_ready = nullptr);
  Prefaulter(const Prefaulter&) = delete;
  Prefaulter& operator=(const Prefaulter&) = delete;

  // Number of threads worth starting for `requested` (no more than there
  // are chunks).
  int ThreadsFor(int requested) const;

  // Populates the whole range with `threads` threads and returns when
  // they are done: OK, the first error, or CANCELLED after Cancel().
  // Meanwhile the calling thread reports each new ready prefix to
  // `on_ready` and logs progress.
  absl::Status Run(int threads);

  // Makes Run stop handing out chunks and return CANCELLED once the chunks
  // in progress are done.
  void Cancel();

  uint64_t length() const { return length_; }
  uint64_t done_bytes() const {
    return done_bytes_.load(std::memory_order_relaxed);
  }
  uint64_t ready_bytes() const {
    return ready_bytes_.load(std::memory_order_acquire);
  }

 private:
  void Work();
  absl::Status Populate(char* p, uint64_t len);
  void Fail(const absl::Status& status);
  // Marks chunk `index` populated and advances the ready prefix (waking
  // Run when it grew).
  void ChunkReady(uint64_t index);
  // The populated prefix, in bytes.
  uint64_t PrefixLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  Os& os_;
  char* const base_;
  const uint64_t length_;
  const uint64_t chunk_;
  const int node_;
  const ReadyCallback on_ready_;

  std::atomic<uint64_t> next_offset_{0};
  std::atomic<uint64_t> done_bytes_{0};
  std::atomic<uint64_t> ready_bytes_{0};
  std::atomic<bool> stop_{false};
  std::atomic<bool> touch_fallback_{false};

  Mutex mu_;
  int spawned_ ABSL_GUARDED_BY(mu_) = -1;  // -1 until all are started
  int finished_ ABSL_GUARDED_BY(mu_) = 0;
  // Signalled when a worker finishes or the prefix grows.
  CondVar changed_cv_;
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
  bool warned_bind_ ABSL_GUARDED_BY(mu_) = false;
  // Which chunks are populated, and the first one that is not.
  std::vector<bool> chunk_done_ ABSL_GUARDED_BY(mu_);
  uint64_t first_missing_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tpushim

#endif  // TPUSHIM_ALLOCATOR_PREFAULTER_H_
