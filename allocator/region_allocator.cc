#include "allocator/region_allocator.h"

#include <algorithm>
#include <bit>
#include <functional>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/human_bytes.h"
#include "logging/log.h"

namespace tpushim {
namespace {

constexpr uint64_t kUnit = RegionAllocator::kAlignment;

uint64_t RoundUp(uint64_t value, uint64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

std::string Percent(double fraction) {
  return absl::StrFormat("%.1f%%", fraction * 100.0);
}

}  // namespace

struct RegionAllocator::Snapshot {
  uint64_t free_bytes = 0;
  uint64_t largest_free = 0;
  uint64_t live = 0;
  uint64_t ready = 0;
  bool growing = false;
  absl::Status stopped;
};

RegionAllocator::RegionAllocator(void* base, uint64_t capacity, Config config)
    : kind_(config.kind),
      memory_name_(std::move(config.memory_name)),
      base_(reinterpret_cast<uintptr_t>(base)),
      capacity_(capacity / kUnit * kUnit),
      threshold_(config.threshold == 0 ? capacity_
                                       : std::min(config.threshold, capacity_)),
      dump_on_oom_(config.dump_on_oom),
      faults_(config.faults) {
  MutexLock lock(&mu_);
  for (auto& row : free_heads_) row.fill(kNil);
  const uint32_t whole = NewBlock();
  blocks_[whole].offset = 0;
  blocks_[whole].size = capacity_;
  if (config.grows) {
    unready_block_ = whole;
    growing_ = true;
    growing_atomic_.store(true, std::memory_order_release);
    return;
  }
  ready_ = capacity_;
  ready_atomic_.store(capacity_, std::memory_order_release);
  InsertFree(whole);
}

RegionAllocator::~RegionAllocator() = default;

void RegionAllocator::Mapping(uint64_t units, int* fl, int* sl) {
  if (units < kSecondLevelCount) {
    *fl = 0;
    *sl = static_cast<int>(units);
    return;
  }
  const int msb = 63 - std::countl_zero(units);
  *fl = msb - kSecondLevelLog2 + 1;
  *sl = static_cast<int>((units >> (msb - kSecondLevelLog2)) &
                         (kSecondLevelCount - 1));
}

uint32_t RegionAllocator::NewBlock() {
  if (!spare_blocks_.empty()) {
    const uint32_t b = spare_blocks_.back();
    spare_blocks_.pop_back();
    blocks_[b] = Block{};
    return b;
  }
  blocks_.emplace_back();
  return static_cast<uint32_t>(blocks_.size() - 1);
}

void RegionAllocator::ReleaseBlock(uint32_t b) { spare_blocks_.push_back(b); }

void RegionAllocator::InsertFree(uint32_t b) {
  Block& block = blocks_[b];
  int fl, sl;
  Mapping(block.size / kUnit, &fl, &sl);
  block.free = true;
  block.prev_free = kNil;
  block.next_free = free_heads_[fl][sl];
  if (block.next_free != kNil) blocks_[block.next_free].prev_free = b;
  free_heads_[fl][sl] = b;
  first_level_bitmap_ |= uint64_t{1} << fl;
  second_level_bitmap_[fl] |= 1u << sl;
  ++free_block_count_;
}

void RegionAllocator::RemoveFree(uint32_t b) {
  Block& block = blocks_[b];
  int fl, sl;
  Mapping(block.size / kUnit, &fl, &sl);
  if (block.prev_free != kNil) {
    blocks_[block.prev_free].next_free = block.next_free;
  } else {
    free_heads_[fl][sl] = block.next_free;
  }
  if (block.next_free != kNil) {
    blocks_[block.next_free].prev_free = block.prev_free;
  }
  if (free_heads_[fl][sl] == kNil) {
    second_level_bitmap_[fl] &= ~(1u << sl);
    if (second_level_bitmap_[fl] == 0) {
      first_level_bitmap_ &= ~(uint64_t{1} << fl);
    }
  }
  block.free = false;
  block.prev_free = block.next_free = kNil;
  --free_block_count_;
}

uint32_t RegionAllocator::FindFree(uint64_t size) {
  int fl, sl;
  Mapping(size / kUnit, &fl, &sl);
  // Best fit among the first few blocks of the request's own class.
  uint32_t best = kNil;
  int probed = 0;
  for (uint32_t b = free_heads_[fl][sl]; b != kNil && probed < kBestFitProbe;
       b = blocks_[b].next_free, ++probed) {
    const uint64_t s = blocks_[b].size;
    if (s >= size && (best == kNil || s < blocks_[best].size)) {
      best = b;
      if (s == size) break;
    }
  }
  if (best != kNil) return best;
  // Any block of a higher class fits.
  uint32_t sl_map = sl + 1 < kSecondLevelCount
                        ? second_level_bitmap_[fl] & (~0u << (sl + 1))
                        : 0;
  if (sl_map == 0) {
    const uint64_t fl_map =
        fl + 1 < 64 ? first_level_bitmap_ & (~uint64_t{0} << (fl + 1)) : 0;
    if (fl_map == 0) return kNil;
    fl = std::countr_zero(fl_map);
    sl_map = second_level_bitmap_[fl];
  }
  return free_heads_[fl][std::countr_zero(sl_map)];
}

uint32_t RegionAllocator::FindAlignedFit(uint64_t size, size_t alignment) {
  int fl, sl;
  Mapping(size / kUnit, &fl, &sl);
  for (int f = fl; f < kFirstLevelCount; ++f) {
    if ((first_level_bitmap_ >> f & 1) == 0) continue;
    for (int s = f == fl ? sl : 0; s < kSecondLevelCount; ++s) {
      if ((second_level_bitmap_[f] >> s & 1) == 0) continue;
      for (uint32_t b = free_heads_[f][s]; b != kNil;
           b = blocks_[b].next_free) {
        const uint64_t address = base_ + blocks_[b].offset;
        const uint64_t pad = RoundUp(address, alignment) - address;
        if (blocks_[b].size >= size && blocks_[b].size - size >= pad) {
          return b;
        }
      }
    }
  }
  return kNil;
}

uint32_t RegionAllocator::SplitAt(uint32_t b, uint64_t size) {
  const uint32_t rest = NewBlock();
  Block& block = blocks_[b];  // NewBlock may have moved blocks_
  Block& tail = blocks_[rest];
  tail.offset = block.offset + size;
  tail.size = block.size - size;
  tail.prev_phys = b;
  tail.next_phys = block.next_phys;
  if (block.next_phys != kNil) blocks_[block.next_phys].prev_phys = rest;
  block.next_phys = rest;
  block.size = size;
  return rest;
}

std::string RegionAllocator::What() const {
  return kind_ == Kind::kPremappedHost
             ? std::string("the premapped region")
             : absl::StrCat("device memory ", memory_name_);
}

void RegionAllocator::LogFailure(const absl::Status& status) const {
  if (kind_ == Kind::kPremappedHost) {
    LOG(ERROR) << "Allocating buffer from premapped region failed with: "
               << status;
  } else {
    Snapshot s;
    {
      MutexLock lock(&mu_);
      s = TakeSnapshot();
    }
    LOG(ERROR) << status << " Device memory " << memory_name_
               << ": largest free block " << HumanReadableBytes(s.largest_free)
               << ", capacity " << HumanReadableBytes(capacity_) << ", "
               << s.live << " live allocations.";
  }
  if (dump_on_oom_) LOG(INFO) << DebugDump();
}

void* RegionAllocator::TakeBlockLocked(uint64_t size, size_t alignment) {
  if (size > capacity_) return nullptr;  // also keeps RoundUp from wrapping
  const uint64_t rounded = RoundUp(size, kUnit);
  // Any block of `search` bytes holds the request at any alignment: O(1).
  // When there is none, a block that happens to be aligned well enough
  // may still hold it (the region's base is page-aligned, so an N-byte
  // region holds one N-byte buffer at any alignment up to 4096).
  const uint64_t search = rounded + (alignment - kUnit);
  uint32_t b = search > capacity_ ? kNil : FindFree(search);
  if (b == kNil && alignment > kUnit) b = FindAlignedFit(rounded, alignment);
  if (b == kNil) return nullptr;
  RemoveFree(b);
  const uint64_t address = base_ + blocks_[b].offset;
  const uint64_t pad = RoundUp(address, alignment) - address;
  if (pad > 0) {
    // The block keeps the leading pad, which goes back to the free lists;
    // the aligned remainder becomes the allocation.
    const uint32_t aligned = SplitAt(b, pad);
    InsertFree(b);
    b = aligned;
  }
  if (blocks_[b].size - rounded >= kUnit) InsertFree(SplitAt(b, rounded));
  live_.emplace(blocks_[b].offset, b);
  bytes_in_use_ += blocks_[b].size;
  peak_bytes_in_use_ = std::max(peak_bytes_in_use_, bytes_in_use_);
  ++allocations_;
  return reinterpret_cast<void*>(base_ + blocks_[b].offset);
}

absl::StatusOr<void*> RegionAllocator::Allocate(uint64_t size, size_t alignment,
                                                IfNotReady if_not_ready) {
  if (size == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Attempting to allocate 0 bytes from ", What(),
                     "; sizes must be at least 1"));
  }
  if (alignment == 0 || (alignment & (alignment - 1)) != 0 ||
      alignment > kMaxAlignment) {
    return absl::InvalidArgumentError(
        absl::StrCat("alignment ", alignment,
                     " is not a power of two between 1 and 4096 for a buffer "
                     "from ",
                     What()));
  }
  alignment = std::max<size_t>(alignment, kUnit);

  // Device memory has no threshold: a request larger than all of it is
  // ordinary exhaustion, in XLA's words, below.
  if (kind_ == Kind::kPremappedHost && size > threshold_) {
    {
      MutexLock lock(&mu_);
      ++failures_;
    }
    std::string hint =
        threshold_ < capacity_
            ? absl::StrCat(
                  " Raise TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES to at "
                  "least ",
                  RoundUp(size, 4096),
                  " (at most TPU_PREMAPPED_BUFFER_SIZE=", capacity_,
                  "), or allocate this buffer outside the region.")
            : absl::StrCat(
                  " The threshold already equals TPU_PREMAPPED_BUFFER_SIZE; "
                  "raise TPU_PREMAPPED_BUFFER_SIZE to at least ",
                  RoundUp(size, 4096),
                  ", or allocate this buffer outside the region.");
    return absl::ResourceExhaustedError(absl::StrCat(
        "Attempting to allocate ", HumanReadableBytes(size),
        ", which is larger than TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES=",
        threshold_, " (", HumanReadableBytes(threshold_),
        "), the largest buffer the premapped region serves.", hint));
  }

  if (faults_ != nullptr) {
    absl::Status injected =
        faults_->Check(FaultPoint::kAlloc, [&] { return OutOfMemory(size); });
    if (!injected.ok()) {
      {
        MutexLock lock(&mu_);
        ++failures_;
      }
      LogFailure(injected);
      return injected;
    }
  }

  void* result = nullptr;
  int64_t waited_ns = -1;  // -1: no wait
  uint64_t ready = 0;
  bool not_ready = false;  // kFail, and growth would serve it
  absl::Status stopped;    // why growth ended while this waited
  {
    MutexLock lock(&mu_);
    // A growing range: wait for more of it while none of the ready part
    // serves the request, and only if growing can.
    int64_t wait_start_ns = 0;
    for (;;) {
      result = TakeBlockLocked(size, alignment);
      if (result != nullptr || !growing_) break;
      if (!FitsOnceGrownLocked(size, alignment)) break;
      if (if_not_ready == IfNotReady::kFail) {
        not_ready = true;
        break;
      }
      if (wait_start_ns == 0) wait_start_ns = absl::GetCurrentTimeNanos();
      ready_cv_.Wait(&mu_);
    }
    if (wait_start_ns != 0) {
      waited_ns = absl::GetCurrentTimeNanos() - wait_start_ns;
      ++ready_waits_;
      ready_wait_ns_ += waited_ns;
      if (result == nullptr && !growing_) stopped = growth_stopped_;
    }
    ready = ready_;
    if (result == nullptr) ++failures_;
  }
  if (waited_ns >= 0) {
    VLOG(1) << "Allocating " << HumanReadableBytes(size) << " from " << What()
            << " waited " << absl::StrFormat("%.3f", waited_ns / 1e6)
            << " ms for it to be premapped (" << ready << " of " << capacity_
            << " bytes ready)";
  }
  if (result != nullptr) return result;
  if (not_ready) {
    return absl::UnavailableError(absl::StrCat(
        "Attempting to allocate ", HumanReadableBytes(size), " from ", What(),
        ": not premapped yet (", ready, " of ", capacity_,
        " bytes ready, TPUSHIM_PREMAP=background) and the call asked not to "
        "wait; it fits once more of the region is premapped"));
  }
  if (stopped.code() == absl::StatusCode::kCancelled) {
    // The owner is going away: not an out-of-memory worth a report.
    return absl::CancelledError(absl::StrCat(
        "Attempting to allocate ", HumanReadableBytes(size), " from ", What(),
        ": premapping the region was stopped while the allocation waited for "
        "it (",
        stopped.message(), ")"));
  }
  absl::Status status = OutOfMemory(size);
  LogFailure(status);
  return status;
}

void* RegionAllocator::TryAllocate(uint64_t size, size_t alignment) {
  alignment = std::max<size_t>(alignment, kUnit);
  if (size == 0 || size > threshold_) return nullptr;
  if (faults_ != nullptr &&
      !faults_->Check(FaultPoint::kAlloc, [&] { return OutOfMemory(size); })
           .ok()) {
    return nullptr;
  }
  MutexLock lock(&mu_);
  return TakeBlockLocked(size, alignment);
}

absl::Status RegionAllocator::Free(void* ptr) {
  if (ptr == nullptr || !Contains(ptr, 1)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Free(%p): the pointer is not inside %s [%p, %p)", ptr, What(), base(),
        reinterpret_cast<void*>(base_ + capacity_)));
  }
  const uint64_t offset = reinterpret_cast<uintptr_t>(ptr) - base_;
  bool freed = false;
  bool growing = false;
  {
    MutexLock lock(&mu_);
    auto it = live_.find(offset);
    if (it != live_.end()) {
      uint32_t b = it->second;
      live_.erase(it);
      bytes_in_use_ -= blocks_[b].size;
      ++frees_;
      FreeBlockLocked(b);
      freed = true;
      growing = growing_;
    }
  }
  if (freed) {
    // An Allocate waiting for the region to grow may fit in this block.
    if (growing) ready_cv_.SignalAll();
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "Free(%p): not a live allocation of %s (freed twice, or a pointer "
      "into the middle of a buffer)",
      ptr, What()));
}

void RegionAllocator::FreeBlockLocked(uint32_t b) {
  // Coalesce with free neighbours; the lower block absorbs the upper.
  const uint32_t next = blocks_[b].next_phys;
  if (next != kNil && blocks_[next].free) {
    RemoveFree(next);
    blocks_[b].size += blocks_[next].size;
    blocks_[b].next_phys = blocks_[next].next_phys;
    if (blocks_[next].next_phys != kNil) {
      blocks_[blocks_[next].next_phys].prev_phys = b;
    }
    ReleaseBlock(next);
  }
  const uint32_t prev = blocks_[b].prev_phys;
  if (prev != kNil && blocks_[prev].free) {
    RemoveFree(prev);
    blocks_[prev].size += blocks_[b].size;
    blocks_[prev].next_phys = blocks_[b].next_phys;
    if (blocks_[b].next_phys != kNil) {
      blocks_[blocks_[b].next_phys].prev_phys = prev;
    }
    ReleaseBlock(b);
    b = prev;
  }
  InsertFree(b);
}

void RegionAllocator::Grow(uint64_t ready) {
  {
    MutexLock lock(&mu_);
    ready = std::min(capacity_, ready / kUnit * kUnit);
    if (unready_block_ == kNil || !growing_ || ready <= ready_) return;
    uint32_t b = unready_block_;
    if (ready < capacity_) {
      unready_block_ = SplitAt(b, ready - ready_);
    } else {
      unready_block_ = kNil;
      growing_ = false;
      growing_atomic_.store(false, std::memory_order_release);
    }
    ready_ = ready;
    ready_atomic_.store(ready, std::memory_order_release);
    FreeBlockLocked(b);
  }
  ready_cv_.SignalAll();
}

void RegionAllocator::StopGrowing(const absl::Status& why) {
  {
    MutexLock lock(&mu_);
    if (!growing_) return;
    growing_ = false;
    growing_atomic_.store(false, std::memory_order_release);
    growth_stopped_ = why;
  }
  ready_cv_.SignalAll();
}

uint64_t RegionAllocator::AllocationSize(const void* ptr) const {
  if (!Contains(ptr, 1)) return 0;
  MutexLock lock(&mu_);
  auto it = live_.find(reinterpret_cast<uintptr_t>(ptr) - base_);
  return it == live_.end() ? 0 : blocks_[it->second].size;
}

uint64_t RegionAllocator::LargestFreeLocked() const {
  if (first_level_bitmap_ == 0) return 0;
  const int fl = 63 - std::countl_zero(first_level_bitmap_);
  const int sl = 31 - std::countl_zero(second_level_bitmap_[fl]);
  uint64_t largest = 0;
  for (uint32_t b = free_heads_[fl][sl]; b != kNil; b = blocks_[b].next_free) {
    largest = std::max(largest, blocks_[b].size);
  }
  return largest;
}

bool RegionAllocator::FitsOnceGrownLocked(uint64_t size,
                                          size_t alignment) const {
  if (unready_block_ == kNil) return false;
  uint64_t start = ready_;
  const uint32_t before = blocks_[unready_block_].prev_phys;
  if (before != kNil && blocks_[before].free) start = blocks_[before].offset;
  const uint64_t aligned = RoundUp(base_ + start, alignment) - base_;
  return aligned <= capacity_ && RoundUp(size, kUnit) <= capacity_ - aligned;
}

RegionAllocator::Snapshot RegionAllocator::TakeSnapshot() const {
  return Snapshot{.free_bytes = ready_ - bytes_in_use_,
                  .largest_free = LargestFreeLocked(),
                  .live = live_.size(),
                  .ready = ready_,
                  .growing = growing_,
                  .stopped = growth_stopped_};
}

absl::Status RegionAllocator::OutOfMemory(uint64_t size) {
  Snapshot s;
  {
    MutexLock lock(&mu_);
    s = TakeSnapshot();
  }
  if (kind_ == Kind::kDeviceMemory) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "Error allocating device buffer: Attempting to allocate ",
        HumanReadableBytes(size), ". That was not possible. There are ",
        HumanReadableBytes(s.free_bytes), " free.; (", memory_name_, ")"));
  }
  const double fragmentation =
      s.free_bytes == 0 ? 0.0
                        : 1.0 - static_cast<double>(s.largest_free) /
                                    static_cast<double>(s.free_bytes);
  // Space a larger region adds is page-aligned: it holds any alignment.
  const uint64_t needed = RoundUp(size, kUnit);
  std::string hint;
  if (s.ready < capacity_ && !s.growing) {
    // A region that stopped short (a growing one waits, unless this is an
    // injected failure).
    hint = absl::StrCat(
        "Premapping the region stopped after ", s.ready, " of its ", capacity_,
        " bytes (",
        s.stopped.ok() ? std::string("stopped") : s.stopped.ToString(),
        "); the rest of it is not used. ");
  }
  // While the range grows, its part not ready yet is free space too.
  const uint64_t free_once_whole =
      s.free_bytes + (s.growing ? capacity_ - s.ready : 0);
  if (s.growing) {
    absl::StrAppend(&hint, "The region is still being premapped (", s.ready,
                    " of ", capacity_,
                    " bytes ready; the sizes below count the rest as free). ");
  }
  if (needed <= free_once_whole) {
    absl::StrAppend(
        &hint,
        "The free space is fragmented: no single free block is large "
        "enough. Free buffers in the order they were allocated, reuse "
        "buffers of one size, or raise TPU_PREMAPPED_BUFFER_SIZE above ",
        capacity_, ".");
  } else {
    absl::StrAppend(
        &hint,
        "With the buffers now live, TPU_PREMAPPED_BUFFER_SIZE would have to "
        "be at least ",
        RoundUp(capacity_ + (needed - free_once_whole), 4096), " (it is ",
        capacity_, "); or free pinned host buffers that are no longer used.");
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "Attempting to allocate ", HumanReadableBytes(size),
      ". That was not possible. There are ", HumanReadableBytes(s.free_bytes),
      " free. Largest free block: ", HumanReadableBytes(s.largest_free),
      " (fragmentation ", Percent(fragmentation), "); region size ",
      HumanReadableBytes(capacity_), " (TPU_PREMAPPED_BUFFER_SIZE=", capacity_,
      "), threshold ", threshold_, " bytes, ", s.live, " live allocations. ",
      hint));
}

RegionAllocator::Stats RegionAllocator::GetStats() const {
  MutexLock lock(&mu_);
  Stats stats;
  stats.capacity_bytes = capacity_;
  stats.threshold_bytes = threshold_;
  stats.bytes_in_use = bytes_in_use_;
  stats.peak_bytes_in_use = peak_bytes_in_use_;
  stats.free_bytes = ready_ - bytes_in_use_;
  stats.largest_free_block = LargestFreeLocked();
  stats.fragmentation =
      stats.free_bytes == 0
          ? 0.0
          : 1.0 - static_cast<double>(stats.largest_free_block) /
                      static_cast<double>(stats.free_bytes);
  stats.allocations = allocations_;
  stats.frees = frees_;
  stats.failures = failures_;
  stats.live_allocations = live_.size();
  stats.free_blocks = free_block_count_;
  stats.ready_bytes = ready_;
  stats.growing = growing_;
  stats.ready_waits = ready_waits_;
  stats.ready_wait_ns = ready_wait_ns_;
  return stats;
}

void RegionAllocator::ResetPeak() {
  MutexLock lock(&mu_);
  peak_bytes_in_use_ = bytes_in_use_;
}

std::string RegionAllocator::DebugDump() const {
  // Copy the block list under the lock; format without it.
  std::vector<Block> blocks;
  uint64_t ready;
  {
    MutexLock lock(&mu_);
    ready = ready_;
    blocks.reserve(live_.size() + free_block_count_ + 1);
    for (uint32_t b = 0; b != kNil; b = blocks_[b].next_phys) {
      if (b != unready_block_) blocks.push_back(blocks_[b]);
    }
  }

  struct ClassTotals {
    uint64_t free_count = 0, free_bytes = 0, used_count = 0, used_bytes = 0;
  };
  std::map<std::pair<int, int>, ClassTotals> classes;
  std::vector<uint64_t> free_sizes;
  for (const Block& block : blocks) {
    int fl, sl;
    Mapping(block.size / kUnit, &fl, &sl);
    ClassTotals& totals = classes[{fl, sl}];
    if (block.free) {
      ++totals.free_count;
      totals.free_bytes += block.size;
      free_sizes.push_back(block.size);
    } else {
      ++totals.used_count;
      totals.used_bytes += block.size;
    }
  }

  std::string out = absl::StrCat(
      "Premapped region dump: ", HumanReadableBytes(capacity_), " at ",
      absl::StrFormat("%p", base()), ", ", blocks.size(), " blocks\n");
  if (ready < capacity_) {
    absl::StrAppend(&out, "  not premapped (not served): the last ",
                    HumanReadableBytes(capacity_ - ready), "\n");
  }
  for (const auto& [cls, t] : classes) {
    const uint64_t lo =
        cls.first == 0
            ? uint64_t(cls.second) * kUnit
            : (uint64_t(kSecondLevelCount + cls.second) << (cls.first - 1)) *
                  kUnit;
    absl::StrAppend(&out, "  class >= ", HumanReadableBytes(lo), ": free ",
                    t.free_count, " blocks ", HumanReadableBytes(t.free_bytes),
                    ", in use ", t.used_count, " blocks ",
                    HumanReadableBytes(t.used_bytes), "\n");
  }
  std::sort(free_sizes.begin(), free_sizes.end(), std::greater<>());
  absl::StrAppend(&out, "  largest free blocks:");
  for (size_t i = 0; i < free_sizes.size() && i < 10; ++i) {
    absl::StrAppend(&out, " ", HumanReadableBytes(free_sizes[i]));
  }
  if (free_sizes.empty()) absl::StrAppend(&out, " none");
  absl::StrAppend(&out, "\n  occupancy ('#' used, '+' partly, '.' free",
                  ready < capacity_ ? ", ' ' not premapped" : "", "): ");

  // 100 cells, each the used fraction of capacity/100 bytes.
  constexpr int kCells = 100;
  std::array<uint64_t, kCells> used{};
  auto cell_begin = [&](int c) { return capacity_ * c / kCells; };
  for (const Block& block : blocks) {
    if (block.free) continue;
    const uint64_t begin = block.offset, end = block.offset + block.size;
    int c = static_cast<int>(begin * kCells / capacity_);
    for (; c < kCells && cell_begin(c) < end; ++c) {
      const uint64_t lo = std::max(begin, cell_begin(c));
      const uint64_t hi = std::min(end, cell_begin(c + 1));
      if (hi > lo) used[c] += hi - lo;
    }
  }
  for (int c = 0; c < kCells; ++c) {
    const uint64_t cell = cell_begin(c + 1) - cell_begin(c);
    if (cell_begin(c) >= ready) {
      out += ' ';
      continue;
    }
    out += used[c] == 0 ? '.' : (used[c] >= cell ? '#' : '+');
  }
  return out;
}

absl::Status RegionAllocator::CheckInvariantsLocked() const {
  uint64_t expected_offset = 0;
  uint64_t used = 0;
  uint64_t free_blocks = 0;
  uint64_t live_blocks = 0;
  uint32_t prev = kNil;
  bool prev_free = false;
  for (uint32_t b = 0; b != kNil; b = blocks_[b].next_phys) {
    const Block& block = blocks_[b];
    if (block.offset != expected_offset || block.prev_phys != prev ||
        block.size == 0 || block.size % kUnit != 0) {
      return absl::InternalError(absl::StrCat("block ", b, " at offset ",
                                              block.offset, " is misplaced"));
    }
    if (block.free && prev_free) {
      return absl::InternalError(
          absl::StrCat("free blocks not coalesced at offset ", block.offset));
    }
    if (block.free) {
      int fl, sl;
      Mapping(block.size / kUnit, &fl, &sl);
      if (!(second_level_bitmap_[fl] & (1u << sl)) ||
          !(first_level_bitmap_ & (uint64_t{1} << fl))) {
        return absl::InternalError(absl::StrCat(
            "free block at offset ", block.offset, " has no bitmap bit"));
      }
      ++free_blocks;
    } else if (b == unready_block_) {
      if (block.offset != ready_ || block.next_phys != kNil) {
        return absl::InternalError("the unready block is not the tail");
      }
    } else {
      auto it = live_.find(block.offset);
      if (it == live_.end() || it->second != b) {
        return absl::InternalError(absl::StrCat("used block at offset ",
                                                block.offset, " is not live"));
      }
      ++live_blocks;
      used += block.size;
    }
    expected_offset += block.size;
    prev = b;
    prev_free = block.free;
  }
  uint64_t listed = 0;
  for (int fl = 0; fl < kFirstLevelCount; ++fl) {
    for (int sl = 0; sl < kSecondLevelCount; ++sl) {
      for (uint32_t b = free_heads_[fl][sl]; b != kNil;
           b = blocks_[b].next_free) {
        int f, s;
        Mapping(blocks_[b].size / kUnit, &f, &s);
        if (!blocks_[b].free || f != fl || s != sl) {
          return absl::InternalError(
              absl::StrCat("block ", b, " is in the wrong free list"));
        }
        ++listed;
      }
    }
  }
  if (expected_offset != capacity_ || used != bytes_in_use_ ||
      free_blocks != free_block_count_ || listed != free_blocks ||
      live_blocks != live_.size()) {
    return absl::InternalError("allocator totals do not reconcile");
  }
  return absl::OkStatus();
}

}  // namespace tpushim
