// Helpers the TransferEngine tests share (transfer_engine_test.cc and the
// engine_*_test.cc files beside it): seeded random sizes and bytes, a
// bounded wait, rigs, host memory in or out of the region, uploads,
// downloads and the checks that queues and statistics reconcile.

#ifndef TPUSHIM_TESTS_TRANSFER_ENGINE_TEST_UTIL_H_
#define TPUSHIM_TESTS_TRANSFER_ENGINE_TEST_UTIL_H_

#include <pthread.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/scoped_test_logging.h"
#include "tests/testing/transfer_rig.h"

namespace tpushim::engine_test {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using testutil::TransferRig;

// Long enough that only a hang exceeds it.
constexpr absl::Duration kHangTimeout = absl::Seconds(30);

constexpr uint64_t KiB = uint64_t{1} << 10;
constexpr uint64_t MiB = uint64_t{1} << 20;

constexpr int kH2D = 0;
constexpr int kD2H = 1;
constexpr int P(TransferPath p) { return static_cast<int>(p); }

inline uint64_t TestSeed() {
  uint64_t seed;
  if (const char* s = std::getenv("TPUSHIM_TEST_SEED");
      s != nullptr && absl::SimpleAtoi(s, &seed)) {
    return seed;
  }
  std::random_device rd;
  return (uint64_t{rd()} << 32) ^ rd();
}

inline uint64_t Hash(const void* p, size_t n) { return XXH3_64bits(p, n); }

inline void FillRandom(std::mt19937_64& rng, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t v = rng();
    std::memcpy(c + i, &v, 8);
  }
  if (i < n) {
    const uint64_t v = rng();
    std::memcpy(c + i, &v, n - i);
  }
}

// A size in [lo, hi], spread over orders of magnitude so that single
// bytes, a few KiB and several MiB all come up.
inline uint64_t RandomSize(std::mt19937_64& rng, uint64_t lo, uint64_t hi) {
  const int lo_bits = std::bit_width(lo);
  const int hi_bits = std::bit_width(hi);
  const int bits = lo_bits + static_cast<int>(rng() % (hi_bits - lo_bits + 1));
  const uint64_t from = std::max(lo, bits == 0 ? 0 : uint64_t{1} << (bits - 1));
  const uint64_t to = std::min(hi, bits >= 64 ? hi : (uint64_t{1} << bits) - 1);
  if (to <= from) return from;
  return from + rng() % (to - from + 1);
}

// The event's status once ready; a test failure (and an ABORTED stand-in
// status) when it is not ready within kHangTimeout.
inline absl::Status Wait(const Event& e) {
  std::optional<absl::Status> s = e.AwaitWithTimeout(kHangTimeout);
  if (!s.has_value()) {
    ADD_FAILURE() << "event not ready after " << kHangTimeout
                  << ": the engine hangs";
    return absl::AbortedError("test: event never became ready");
  }
  return *s;
}

inline std::string ThreadName() {
  char name[32] = {};
  pthread_getname_np(pthread_self(), name, sizeof(name));
  return name;
}

inline std::unique_ptr<TransferRig> MakeRig(TransferRig::Params params) {
  absl::StatusOr<std::unique_ptr<TransferRig>> rig =
      TransferRig::Create(std::move(params));
  EXPECT_TRUE(rig.ok()) << rig.status();
  if (!rig.ok()) return nullptr;
  return *std::move(rig);
}

// Host memory for a transfer: ordinary heap memory, or (with a region) an
// allocation from the premapped region, which the zero-copy path serves.
class HostMem {
 public:
  HostMem(PremappedRegion* region, size_t n) : region_(region), n_(n) {
    if (region_ != nullptr) {
      absl::StatusOr<void*> p =
          region_->allocator().Allocate(std::max<size_t>(n, 1));
      EXPECT_TRUE(p.ok()) << p.status();
      if (p.ok()) data_ = static_cast<char*>(*p);
    } else {
      heap_.reset(new char[std::max<size_t>(n, 1)]);
      data_ = heap_.get();
    }
  }
  HostMem(const HostMem&) = delete;
  HostMem& operator=(const HostMem&) = delete;
  ~HostMem() {
    if (region_ != nullptr && data_ != nullptr) {
      EXPECT_TRUE(region_->allocator().Free(data_).ok());
    }
  }
  char* data() const { return data_; }
  size_t size() const { return n_; }
  bool ok() const { return data_ != nullptr; }

 private:
  PremappedRegion* const region_;
  const size_t n_;
  std::unique_ptr<char[]> heap_;
  char* data_ = nullptr;
};

// Heap memory filled with random bytes.
inline std::vector<char> RandomBytes(std::mt19937_64& rng, size_t n) {
  std::vector<char> v(n);
  FillRandom(rng, v.data(), n);
  return v;
}

// Uploads `data` into a new buffer on `device` and waits.
inline DeviceBuffer Upload(TransferEngine& engine, int device,
                           const std::vector<char>& data) {
  absl::StatusOr<DeviceBuffer> b = engine.Allocate(device, data.size());
  EXPECT_TRUE(b.ok()) << b.status();
  if (!b.ok()) return DeviceBuffer();
  absl::StatusOr<Event> up =
      engine.TransferToDevice(data.data(), *b, 0, data.size());
  EXPECT_TRUE(up.ok()) << up.status();
  if (up.ok()) {
    EXPECT_TRUE(Wait(*up).ok());
  }
  return *b;
}

// Reads [offset, +n) of `buffer` back (waiting) and returns its hash.
inline uint64_t DownloadHash(TransferEngine& engine, const DeviceBuffer& buffer,
                             uint64_t offset, uint64_t n) {
  std::vector<char> out(std::max<uint64_t>(n, 1));
  absl::StatusOr<Event> down =
      engine.TransferFromDevice(buffer, offset, out.data(), n);
  EXPECT_TRUE(down.ok()) << down.status();
  if (down.ok()) {
    EXPECT_TRUE(Wait(*down).ok());
  }
  return Hash(out.data(), n);
}

inline void Free(TransferEngine& engine, const DeviceBuffer& buffer,
                 std::vector<Event> wait_for = {}) {
  absl::StatusOr<Event> freed = engine.Deallocate(buffer, wait_for);
  ASSERT_TRUE(freed.ok()) << freed.status();
  EXPECT_TRUE(Wait(*freed).ok());
}

inline uint64_t TotalSubmitted(const TransferEngine::Stats& s) {
  uint64_t n = 0;
  for (const auto& q : s.queues) n += q.submitted;
  return n;
}

// Every queue idle and accounted for: nothing pending or in flight, and
// each accepted operation finished exactly one way.
inline void ExpectQueuesReconcile(const TransferEngine::Stats& s) {
  EXPECT_EQ(s.events_pending, 0u);
  for (const auto& q : s.queues) {
    SCOPED_TRACE(
        absl::StrCat("queue ", q.device, "/", DmaDirectionName(q.direction)));
    EXPECT_EQ(q.pending, 0u);
    EXPECT_EQ(q.in_flight, 0u);
    EXPECT_EQ(q.submitted, q.completed + q.failed + q.cancelled);
  }
}

inline const TransferEngine::QueueStats& QueueOf(const TransferEngine::Stats& s,
                                                 int device, DmaDirection d) {
  return s.queues[device * kDmaDirectionCount + static_cast<int>(d)];
}

inline TransferEngine::Config PatientStaging() {
  // Staging never times out into the pinned path here: the path counters
  // are exact even on a loaded machine.
  TransferEngine::Config c;
  c.staging_wait = absl::Seconds(20);
  return c;
}

inline int CountLines(const std::string& text, absl::string_view needle) {
  int n = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StrContains(line, needle)) ++n;
  }
  return n;
}

// Fills the whole region with one user allocation; returns it.
inline void* FillRegion(PremappedRegion& region) {
  absl::StatusOr<void*> p = region.allocator().Allocate(region.size());
  EXPECT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(region.allocator().TryAllocate(64), nullptr);
  return p.ok() ? *p : nullptr;
}

}  // namespace tpushim::engine_test

#endif  // TPUSHIM_TESTS_TRANSFER_ENGINE_TEST_UTIL_H_
