// TransferEngine behaviour (transfer/transfer_engine.h, docs/transfers.md):
// data integrity on every path, ordering and dependencies, failure
// propagation, callbacks, timeouts, device memory, fault injection at every
// DMA descriptor and pin, staging backpressure and fallback, host buffer
// semantics, deallocation and shutdown.
//
// Random sizes and contents come from a seeded std::mt19937_64; the seed is
// printed with every failure and can be forced with TPUSHIM_TEST_SEED=<n>.
// Timing is never asserted as performance: a link model
// (`link_gbps`/`latency_us`) makes a transfer slow where a test needs an
// operation still pending, and every wait has a generous bound that only
// detects hangs.

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

namespace tpushim {
namespace {

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

uint64_t TestSeed() {
  uint64_t seed;
  if (const char* s = std::getenv("TPUSHIM_TEST_SEED");
      s != nullptr && absl::SimpleAtoi(s, &seed)) {
    return seed;
  }
  std::random_device rd;
  return (uint64_t{rd()} << 32) ^ rd();
}

uint64_t Hash(const void* p, size_t n) { return XXH3_64bits(p, n); }

void FillRandom(std::mt19937_64& rng, void* p, size_t n) {
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
uint64_t RandomSize(std::mt19937_64& rng, uint64_t lo, uint64_t hi) {
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
absl::Status Wait(const Event& e) {
  std::optional<absl::Status> s = e.AwaitWithTimeout(kHangTimeout);
  if (!s.has_value()) {
    ADD_FAILURE() << "event not ready after " << kHangTimeout
                  << ": the engine hangs";
    return absl::AbortedError("test: event never became ready");
  }
  return *s;
}

std::string ThreadName() {
  char name[32] = {};
  pthread_getname_np(pthread_self(), name, sizeof(name));
  return name;
}

std::unique_ptr<TransferRig> MakeRig(TransferRig::Params params) {
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
std::vector<char> RandomBytes(std::mt19937_64& rng, size_t n) {
  std::vector<char> v(n);
  FillRandom(rng, v.data(), n);
  return v;
}

// Uploads `data` into a new buffer on `device` and waits.
DeviceBuffer Upload(TransferEngine& engine, int device,
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
uint64_t DownloadHash(TransferEngine& engine, const DeviceBuffer& buffer,
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

void Free(TransferEngine& engine, const DeviceBuffer& buffer,
          std::vector<Event> wait_for = {}) {
  absl::StatusOr<Event> freed = engine.Deallocate(buffer, wait_for);
  ASSERT_TRUE(freed.ok()) << freed.status();
  EXPECT_TRUE(Wait(*freed).ok());
}

uint64_t TotalSubmitted(const TransferEngine::Stats& s) {
  uint64_t n = 0;
  for (const auto& q : s.queues) n += q.submitted;
  return n;
}

// Every queue idle and accounted for: nothing pending or in flight, and
// each accepted operation finished exactly one way.
void ExpectQueuesReconcile(const TransferEngine::Stats& s) {
  EXPECT_EQ(s.events_pending, 0u);
  for (const auto& q : s.queues) {
    SCOPED_TRACE(
        absl::StrCat("queue ", q.device, "/", DmaDirectionName(q.direction)));
    EXPECT_EQ(q.pending, 0u);
    EXPECT_EQ(q.in_flight, 0u);
    EXPECT_EQ(q.submitted, q.completed + q.failed + q.cancelled);
  }
}

const TransferEngine::QueueStats& QueueOf(const TransferEngine::Stats& s,
                                          int device, DmaDirection d) {
  return s.queues[device * kDmaDirectionCount + static_cast<int>(d)];
}

// ---- 1. Integrity on every path --------------------------------------------

struct RoundTripSpec {
  TransferPath path;
  bool region_memory;  // host buffers inside the premapped region
  uint64_t min_size;
  uint64_t max_size;
  int iterations;
};

// Per iteration, with a random size n, unaligned host pointers and an
// unaligned device offset: fills a device buffer with a random background
// (whole buffer), uploads n bytes into its middle, reads the n bytes back
// into a buffer with guard bytes around it, and reads the whole buffer back.
// Every host transfer takes `spec.path`. Checks the data with xxhash and the
// engine's per-path counters.
void CheckRoundTrips(TransferRig& rig, const RoundTripSpec& spec) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(absl::StrCat("seed=", seed, " (TPUSHIM_TEST_SEED) path=",
                            TransferPathName(spec.path)));
  std::mt19937_64 rng(seed);
  TransferEngine& engine = rig.engine();
  PremappedRegion* mem_region = spec.region_memory ? rig.region() : nullptr;
  uint64_t h2d_bytes = 0;
  for (int it = 0; it < spec.iterations; ++it) {
    const uint64_t n = it == 0 ? spec.min_size
                       : it == 1
                           ? spec.max_size
                           : RandomSize(rng, spec.min_size, spec.max_size);
    const uint64_t src_off = rng() % 64;
    const uint64_t dst_off = 1 + rng() % 63;
    const uint64_t dev_off = rng() % 4096;
    const uint64_t tail = rng() % 256;
    const uint64_t whole = dev_off + n + tail;
    SCOPED_TRACE(absl::StrCat("iteration ", it, ": n=", n, " src_off=", src_off,
                              " dst_off=", dst_off, " dev_off=", dev_off,
                              " whole=", whole));
    HostMem src(mem_region, src_off + n);
    HostMem background(mem_region, whole);
    HostMem dst(mem_region, dst_off + n + 64);
    HostMem back(mem_region, whole);
    ASSERT_TRUE(src.ok() && background.ok() && dst.ok() && back.ok());
    FillRandom(rng, src.data(), src.size());
    FillRandom(rng, background.data(), background.size());
    FillRandom(rng, dst.data(), dst.size());
    const uint64_t guard_before = Hash(dst.data(), dst_off);
    const uint64_t guard_after = Hash(dst.data() + dst_off + n, 64);
    const char* up_src = src.data() + src_off;
    char* down_dst = dst.data() + dst_off;
    EXPECT_EQ(engine.PathFor(up_src, n), spec.path);
    EXPECT_EQ(engine.PathFor(down_dst, n), spec.path);
    EXPECT_EQ(engine.PathFor(background.data(), whole), spec.path);

    absl::StatusOr<DeviceBuffer> buf = engine.Allocate(0, whole);
    ASSERT_TRUE(buf.ok()) << buf.status();
    absl::StatusOr<Event> fill =
        engine.TransferToDevice(background.data(), *buf, 0, whole);
    ASSERT_TRUE(fill.ok()) << fill.status();
    absl::StatusOr<Event> up =
        engine.TransferToDevice(up_src, *buf, dev_off, n, {*fill});
    ASSERT_TRUE(up.ok()) << up.status();
    absl::StatusOr<Event> down =
        engine.TransferFromDevice(*buf, dev_off, down_dst, n, {*up});
    ASSERT_TRUE(down.ok()) << down.status();
    absl::StatusOr<Event> all =
        engine.TransferFromDevice(*buf, 0, back.data(), whole, {*up});
    ASSERT_TRUE(all.ok()) << all.status();
    absl::StatusOr<Event> freed = engine.Deallocate(*buf, {*down, *all});
    ASSERT_TRUE(freed.ok()) << freed.status();
    ASSERT_TRUE(Wait(*down).ok()) << Wait(*down);
    ASSERT_TRUE(Wait(*all).ok()) << Wait(*all);
    EXPECT_TRUE(Wait(*freed).ok());
    EXPECT_TRUE(fill->IsReady() && fill->Await().ok());
    EXPECT_TRUE(up->IsReady() && up->Await().ok());
    h2d_bytes += whole + n;

    EXPECT_EQ(Hash(down_dst, n), Hash(up_src, n)) << "device→host data";
    EXPECT_EQ(Hash(dst.data(), dst_off), guard_before)
        << "bytes before the destination range were written";
    EXPECT_EQ(Hash(down_dst + n, 64), guard_after)
        << "bytes after the destination range were written";
    EXPECT_EQ(Hash(back.data(), dev_off), Hash(background.data(), dev_off))
        << "device bytes before the uploaded range changed";
    EXPECT_EQ(Hash(back.data() + dev_off, n), Hash(up_src, n))
        << "uploaded range on the device";
    EXPECT_EQ(Hash(back.data() + dev_off + n, tail),
              Hash(background.data() + dev_off + n, tail))
        << "device bytes after the uploaded range changed";
    if (testing::Test::HasFailure()) return;
  }

  const TransferEngine::Stats s = engine.GetStats();
  const uint64_t ops = 2 * static_cast<uint64_t>(spec.iterations);
  for (int dir : {kH2D, kD2H}) {
    SCOPED_TRACE(dir == kH2D ? "h2d" : "d2h");
    for (int p = 0; p < kTransferPathCount; ++p) {
      SCOPED_TRACE(TransferPathName(static_cast<TransferPath>(p)));
      const TransferEngine::PathStats& ps = s.host[dir][p];
      if (p == P(spec.path)) {
        EXPECT_EQ(ps.transfers, ops);
        EXPECT_EQ(ps.bytes, h2d_bytes);  // both directions move the same
        EXPECT_EQ(ps.failed, 0u);
      } else {
        EXPECT_EQ(ps.transfers, 0u);
        EXPECT_EQ(ps.bytes, 0u);
      }
    }
  }
  EXPECT_EQ(s.device_to_device.transfers, 0u);
  EXPECT_EQ(s.pinned_staging_timeout, 0u);
  EXPECT_EQ(s.pinned_bytes_now, 0u);
  EXPECT_EQ(s.staging_bytes_in_flight, 0u);
  EXPECT_EQ(s.device_buffers_live, 0u);
  ExpectQueuesReconcile(s);
}

TransferEngine::Config PatientStaging() {
  // Staging never times out into the pinned path here: the path counters
  // are exact even on a loaded machine.
  TransferEngine::Config c;
  c.staging_wait = absl::Seconds(20);
  return c;
}

TEST(TransferEngineTest, ZeroCopyRoundTripsPreserveDataAtUnalignedAddresses) {
  auto rig = MakeRig({.region_bytes = 16 * MiB, .engine = PatientStaging()});
  ASSERT_NE(rig, nullptr);
  CheckRoundTrips(*rig, {.path = TransferPath::kZeroCopy,
                         .region_memory = true,
                         .min_size = 1,
                         .max_size = 3 * MiB,
                         .iterations = 12});
  EXPECT_EQ(rig->TearDownAndReport(), "");
}

TEST(TransferEngineTest, StagedRoundTripsPreserveDataAtUnalignedAddresses) {
  auto rig = MakeRig({.region_bytes = 16 * MiB, .engine = PatientStaging()});
  ASSERT_NE(rig, nullptr);
  CheckRoundTrips(*rig, {.path = TransferPath::kStaged,
                         .region_memory = false,
                         .min_size = 1,
                         .max_size = 5 * MiB,
                         .iterations = 12});
  EXPECT_EQ(rig->TearDownAndReport(), "");
}

TEST(TransferEngineTest,
     StagedRoundTripsWithSmallChunksAndShallowPipelinePreserveData) {
  // Many chunks per transfer, two staging buffers each, a staging budget of
  // four chunks, device→host chunks copied on the completing thread.
  TransferEngine::Config config = PatientStaging();
  config.chunk_bytes = 64 * KiB;
  config.from_device_chunk_bytes = 64 * KiB;
  config.descriptor_bytes = 64 * KiB;
  config.staging_depth = 2;
  config.max_staging_bytes = 256 * KiB;
  auto rig = MakeRig({.region_bytes = 4 * MiB, .engine = config});
  ASSERT_NE(rig, nullptr);
  CheckRoundTrips(*rig, {.path = TransferPath::kStaged,
                         .region_memory = false,
                         .min_size = 1,
                         .max_size = 2 * MiB,
                         .iterations = 10});
  const TransferEngine::Stats s = rig->engine().GetStats();
  EXPECT_LE(s.peak_staging_bytes, 256 * KiB);
  EXPECT_GT(s.peak_staging_bytes, 0u);
  EXPECT_EQ(rig->TearDownAndReport(), "");
}

TEST(TransferEngineTest, PinnedRoundTripsAboveThresholdPreserveData) {
  auto rig = MakeRig({.region_bytes = 4 * MiB,
                      .threshold = 1 * MiB,
                      .engine = PatientStaging()});
  ASSERT_NE(rig, nullptr);
  CheckRoundTrips(*rig, {.path = TransferPath::kPinned,
                         .region_memory = false,
                         .min_size = 1 * MiB + 1,
                         .max_size = 5 * MiB,
                         .iterations = 8});
  const TransferEngine::Stats s = rig->engine().GetStats();
  EXPECT_EQ(s.pinned_over_threshold, 4u * 8);
  EXPECT_EQ(s.pinned_region_off, 0u);
  EXPECT_EQ(rig->os().pinned_bytes(), 0u);
  EXPECT_EQ(rig->TearDownAndReport(), "");
}

TEST(TransferEngineTest, PinnedRoundTripsWithRegionOffPreserveData) {
  // No bounce pool: every size pins (bounce_pool_test.cc has the pool).
  TransferEngine::Config config = PatientStaging();
  config.bounce_pool_bytes = 0;
  auto rig = MakeRig({.region_bytes = 0, .engine = config});
  ASSERT_NE(rig, nullptr);
  ASSERT_EQ(rig->region(), nullptr);
  CheckRoundTrips(*rig, {.path = TransferPath::kPinned,
                         .region_memory = false,
                         .min_size = 1,
                         .max_size = 3 * MiB,
                         .iterations = 10});
  const TransferEngine::Stats s = rig->engine().GetStats();
  EXPECT_EQ(s.pinned_region_off, 4u * 10);
  EXPECT_EQ(s.pinned_over_threshold, 0u);
  EXPECT_EQ(rig->TearDownAndReport(), "");
}

// TPU_VMODULE=engine_queues=1 names each transfer's path and why, the
// decision users tune with the two premapped-buffer variables.
TEST(TransferEngineTest, VlogOneNamesEachTransfersPathAndWhy) {
  testutil::ScopedTestLogging logs({{"engine_queues", 1}});
  auto rig = MakeRig({.region_bytes = 4 * MiB, .threshold = 1 * MiB});
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  absl::StatusOr<DeviceBuffer> buffer = engine.Allocate(0, 2 * MiB);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  std::vector<char> host(2 * MiB, 1);
  absl::StatusOr<void*> pinned = rig->region()->allocator().Allocate(4096);
  ASSERT_TRUE(pinned.ok()) << pinned.status();
  for (auto [p, n] : {std::pair<const void*, uint64_t>{host.data(), 4096},
                      {host.data(), 2 * MiB},
                      {*pinned, 4096}}) {
    absl::StatusOr<Event> e = engine.TransferToDevice(p, *buffer, 0, n);
    ASSERT_TRUE(e.ok() && e->Await().ok());
  }
  const std::string info = logs.File("INFO");
  EXPECT_THAT(info, HasSubstr("h2d of 4096 bytes on device 0 takes the staged "
                              "path (caller memory of at most the "
                              "threshold, 1048576 bytes)"));
  EXPECT_THAT(info, HasSubstr("h2d of 2097152 bytes on device 0 takes the "
                              "pinned path (caller memory above the "
                              "threshold, 1048576 bytes)"));
  EXPECT_THAT(info, HasSubstr("h2d of 4096 bytes on device 0 takes the "
                              "zero_copy path (the host buffer is in the "
                              "premapped region)"));
  ASSERT_TRUE(rig->region()->allocator().Free(*pinned).ok());
  ASSERT_TRUE(engine.Deallocate(*buffer).ok());
  EXPECT_EQ(rig->TearDownAndReport(), "");
}

TEST(TransferEngineTest, RingOverflowKeepsDescriptorOrderAndData) {
  // 1 KiB descriptors and a 20 ms modelled latency: a 2 MiB zero-copy
  // transfer is 2048 descriptors, twice a device ring, so half of them wait
  // in the engine's overflow queue for ring room.
  TransferEngine::Config config = PatientStaging();
  config.chunk_bytes = 1 * KiB;
  config.from_device_chunk_bytes = 1 * KiB;
  config.descriptor_bytes = 1 * KiB;
  auto rig = MakeRig({.region_bytes = 8 * MiB,
                      .device_url = "sim://?hbm=16M&latency_us=20000",
                      .engine = config});
  ASSERT_NE(rig, nullptr);
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(absl::StrCat("seed=", seed));
  std::mt19937_64 rng(seed);
  TransferEngine& engine = rig->engine();
  const uint64_t n = 2 * MiB + 333;
  {
    HostMem src(rig->region(), n), dst(rig->region(), n);
    ASSERT_TRUE(src.ok() && dst.ok());
    FillRandom(rng, src.data(), n);
    std::memset(dst.data(), 0, n);
    absl::StatusOr<DeviceBuffer> b = engine.Allocate(0, n);
    ASSERT_TRUE(b.ok()) << b.status();
    absl::StatusOr<Event> up = engine.TransferToDevice(src.data(), *b, 0, n);
    ASSERT_TRUE(up.ok());
    absl::StatusOr<Event> down =
        engine.TransferFromDevice(*b, 0, dst.data(), n, {*up});
    ASSERT_TRUE(down.ok());
    ASSERT_TRUE(Wait(*down).ok()) << Wait(*down);
    EXPECT_EQ(Hash(dst.data(), n), Hash(src.data(), n));
    Free(engine, *b);
  }
  const TransferEngine::Stats s = engine.GetStats();
  const auto& h2d = QueueOf(s, 0, DmaDirection::kHostToDevice);
  EXPECT_EQ(h2d.descriptors, (n + KiB - 1) / KiB);
  EXPECT_GT(h2d.ring_full, 0u);
  EXPECT_EQ(s.host[kH2D][P(TransferPath::kZeroCopy)].transfers, 1u);
  ExpectQueuesReconcile(s);
  EXPECT_EQ(rig->TearDownAndReport(), "");
}

TEST(TransferEngineTest,
     DeviceToDeviceCopiesPreserveDataOnOneDeviceAndAcrossDevices) {
  auto rig = MakeRig({.region_bytes = 8 * MiB,
                      .device_url = "sim://?devices=2&hbm=64M",
                      .engine = PatientStaging()});
  ASSERT_NE(rig, nullptr);
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(absl::StrCat("seed=", seed, " (TPUSHIM_TEST_SEED)"));
  std::mt19937_64 rng(seed);
  TransferEngine& engine = rig->engine();
  const int iterations = 8;
  uint64_t copied = 0;
  for (int it = 0; it < iterations; ++it) {
    const uint64_t n = it == 0 ? 1 : RandomSize(rng, 1, 5 * MiB);
    const uint64_t src_off = rng() % 4096;
    SCOPED_TRACE(
        absl::StrCat("iteration ", it, ": n=", n, " src_off=", src_off));
    std::vector<char> data = RandomBytes(rng, src_off + n + 7);
    DeviceBuffer src = Upload(engine, 0, data);
    ASSERT_TRUE(src.valid());
    for (int target : {0, 1}) {
      SCOPED_TRACE(absl::StrCat("to device ", target));
      const uint64_t dst_off = rng() % 4096;
      const uint64_t whole = dst_off + n + rng() % 100;
      std::vector<char> background = RandomBytes(rng, whole);
      DeviceBuffer dst = Upload(engine, target, background);
      ASSERT_TRUE(dst.valid());
      absl::StatusOr<Event> copy =
          engine.TransferDeviceToDevice(src, src_off, dst, dst_off, n);
      ASSERT_TRUE(copy.ok()) << copy.status();
      std::vector<char> back(whole);
      absl::StatusOr<Event> down =
          engine.TransferFromDevice(dst, 0, back.data(), whole, {*copy});
      ASSERT_TRUE(down.ok()) << down.status();
      ASSERT_TRUE(Wait(*down).ok()) << Wait(*down);
      EXPECT_TRUE(copy->IsReady() && copy->Await().ok());
      copied += n;
      EXPECT_EQ(Hash(back.data() + dst_off, n), Hash(data.data() + src_off, n));
      EXPECT_EQ(Hash(back.data(), dst_off), Hash(background.data(), dst_off));
      EXPECT_EQ(Hash(back.data() + dst_off + n, whole - dst_off - n),
                Hash(background.data() + dst_off + n, whole - dst_off - n));
      Free(engine, dst);
    }
    // The source is untouched by the copies.
    EXPECT_EQ(DownloadHash(engine, src, 0, data.size()),
              Hash(data.data(), data.size()));
    Free(engine, src);
    if (testing::Test::HasFailure()) return;
  }
  const TransferEngine::Stats s = engine.GetStats();
  EXPECT_EQ(s.device_to_device.transfers, 2u * iterations);
  EXPECT_EQ(s.device_to_device.bytes, copied);
  EXPECT_EQ(s.device_to_device.failed, 0u);
  EXPECT_EQ(QueueOf(s, 0, DmaDirection::kDeviceToDevice).completed,
            2u * iterations);
  EXPECT_EQ(QueueOf(s, 1, DmaDirection::kDeviceToDevice).submitted, 0u);
  ExpectQueuesReconcile(s);
  EXPECT_EQ(rig->TearDownAndReport(), "");
}

// ---- 2. Concurrency --------------------------------------------------------

TEST(TransferEngineTest, ConcurrentSubmittersKeepDataIntactAndStatsReconcile) {
  TransferEngine::Config config = PatientStaging();
  config.chunk_bytes = 128 * KiB;
  config.from_device_chunk_bytes = 128 * KiB;
  config.descriptor_bytes = 128 * KiB;
  auto rig = MakeRig({.region_bytes = 8 * MiB,
                      .threshold = 512 * KiB,
                      .device_url = "sim://?devices=2&hbm=64M&dma_engines=2",
                      .engine = config});
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(absl::StrCat("seed=", seed, " (TPUSHIM_TEST_SEED)"));
  constexpr int kThreads = 8;
  constexpr int kRounds = 12;
  std::atomic<uint64_t> host_ops{0}, d2d_ops{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(seed + t);
      const int device = t % 2;
      for (int r = 0; r < kRounds; ++r) {
        const int kind = static_cast<int>(rng() % 4);
        const uint64_t n = kind == 1
                               ? RandomSize(rng, 512 * KiB + 1, 1536 * KiB)
                           : kind == 2 ? RandomSize(rng, 1, 128 * KiB)
                                       : RandomSize(rng, 1, 512 * KiB);
        SCOPED_TRACE(
            absl::StrCat("thread ", t, " round ", r, " kind ", kind, " n=", n));
        PremappedRegion* mem = kind == 2 ? rig->region() : nullptr;
        HostMem src(mem, n), dst(mem, n);
        if (!src.ok() || !dst.ok()) return;
        FillRandom(rng, src.data(), n);
        std::memset(dst.data(), 0, n);
        absl::StatusOr<DeviceBuffer> a = engine.Allocate(device, n);
        if (!a.ok()) {
          ADD_FAILURE() << a.status();
          return;
        }
        absl::StatusOr<Event> up =
            engine.TransferToDevice(src.data(), *a, 0, n);
        if (!up.ok()) {
          ADD_FAILURE() << up.status();
          return;
        }
        DeviceBuffer from = *a;
        Event last = *up;
        std::optional<DeviceBuffer> b;
        if (kind == 3) {
          absl::StatusOr<DeviceBuffer> bb = engine.Allocate(1 - device, n);
          if (!bb.ok()) {
            ADD_FAILURE() << bb.status();
            return;
          }
          b = *bb;
          absl::StatusOr<Event> copy =
              engine.TransferDeviceToDevice(*a, 0, *b, 0, n, {*up});
          if (!copy.ok()) {
            ADD_FAILURE() << copy.status();
            return;
          }
          from = *b;
          last = *copy;
          d2d_ops.fetch_add(1);
        }
        absl::StatusOr<Event> down =
            engine.TransferFromDevice(from, 0, dst.data(), n, {last});
        if (!down.ok()) {
          ADD_FAILURE() << down.status();
          return;
        }
        host_ops.fetch_add(2);
        absl::StatusOr<Event> fa = engine.Deallocate(*a, {*down});
        EXPECT_TRUE(fa.ok()) << fa.status();
        std::optional<absl::StatusOr<Event>> fb;
        if (b) fb = engine.Deallocate(*b, {*down});
        EXPECT_TRUE(Wait(*down).ok());
        EXPECT_EQ(Hash(dst.data(), n), Hash(src.data(), n));
        if (fa.ok()) {
          EXPECT_TRUE(Wait(*fa).ok());
        }
        if (fb) {
          EXPECT_TRUE(fb->ok());
          if (fb->ok()) {
            EXPECT_TRUE(Wait(**fb).ok());
          }
        }
      }
    });
  }
  // Meanwhile, stats are read concurrently and stay within their bounds.
  std::atomic<bool> stop_polling{false};
  std::thread poller([&] {
    while (!stop_polling.load()) {
      const TransferEngine::Stats s = engine.GetStats();
      EXPECT_LE(s.staging_bytes_in_flight, s.max_staging_bytes);
      EXPECT_LE(s.peak_staging_bytes, s.max_staging_bytes);
      EXPECT_EQ(s.queues.size(), 2u * kDmaDirectionCount);
      absl::SleepFor(absl::Microseconds(500));
    }
  });
  for (std::thread& th : threads) th.join();
  stop_polling = true;
  poller.join();
  const TransferEngine::Stats s = engine.GetStats();
  uint64_t host_transfers = 0;
  for (int dir : {kH2D, kD2H}) {
    for (int p = 0; p < kTransferPathCount; ++p) {
      host_transfers += s.host[dir][p].transfers;
      EXPECT_EQ(s.host[dir][p].failed, 0u);
    }
  }
  EXPECT_EQ(host_transfers, host_ops.load());
  EXPECT_EQ(s.device_to_device.transfers, d2d_ops.load());
  uint64_t submitted = 0, completed = 0;
  for (const auto& q : s.queues) {
    submitted += q.submitted;
    completed += q.completed;
    EXPECT_EQ(q.failed, 0u);
    EXPECT_EQ(q.cancelled, 0u);
  }
  EXPECT_EQ(submitted, host_ops.load() + d2d_ops.load());
  EXPECT_EQ(completed, submitted);
  ExpectQueuesReconcile(s);
  EXPECT_EQ(s.staging_bytes_in_flight, 0u);
  EXPECT_EQ(s.pinned_bytes_now, 0u);
  EXPECT_EQ(s.device_buffers_live, 0u);
  EXPECT_EQ(s.device_bytes_live, 0u);
  EXPECT_EQ(rig->TearDownAndReport(), "");
}

// ---- 3. Dependencies and ordering ------------------------------------------

TEST(TransferEngineTest, DependencyChainsAcrossQueuesAndDevicesDeliverData) {
  auto rig = MakeRig({.region_bytes = 8 * MiB,
                      .device_url = "sim://?devices=2&hbm=64M",
                      .engine = PatientStaging()});
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(absl::StrCat("seed=", seed, " (TPUSHIM_TEST_SEED)"));
  std::mt19937_64 rng(seed);

  // Six chains h2d → d2d → d2d → d2h, all submitted before any is awaited.
  struct Chain {
    std::vector<char> src, dst;
    std::vector<DeviceBuffer> buffers;
    std::vector<Event> events;
  };
  std::vector<Chain> chains(6);
  for (size_t i = 0; i < chains.size(); ++i) {
    Chain& c = chains[i];
    const uint64_t n = RandomSize(rng, 1, 2 * MiB);
    c.src = RandomBytes(rng, n);
    c.dst.assign(n, 0);
    const int first = static_cast<int>(i % 2);
    for (int d : {first, 1 - first, first}) {
      absl::StatusOr<DeviceBuffer> b = engine.Allocate(d, n);
      ASSERT_TRUE(b.ok()) << b.status();
      c.buffers.push_back(*b);
    }
    absl::StatusOr<Event> e =
        engine.TransferToDevice(c.src.data(), c.buffers[0], 0, n);
    ASSERT_TRUE(e.ok());
    c.events.push_back(*e);
    for (int k = 1; k < 3; ++k) {
      e = engine.TransferDeviceToDevice(c.buffers[k - 1], 0, c.buffers[k], 0, n,
                                        {c.events.back()});
      ASSERT_TRUE(e.ok()) << e.status();
      c.events.push_back(*e);
    }
    e = engine.TransferFromDevice(c.buffers[2], 0, c.dst.data(), n,
                                  {c.events.back()});
    ASSERT_TRUE(e.ok());
    c.events.push_back(*e);
  }
  for (size_t i = 0; i < chains.size(); ++i) {
    Chain& c = chains[i];
    SCOPED_TRACE(absl::StrCat("chain ", i, " n=", c.src.size()));
    ASSERT_TRUE(Wait(c.events.back()).ok());
    for (const Event& e : c.events) {
      EXPECT_TRUE(e.IsReady());
      EXPECT_TRUE(e.Await().ok());
    }
    EXPECT_EQ(Hash(c.dst.data(), c.dst.size()),
              Hash(c.src.data(), c.src.size()));
    for (const DeviceBuffer& b : c.buffers) Free(engine, b);
  }
  ExpectQueuesReconcile(engine.GetStats());
  EXPECT_EQ(rig->TearDownAndReport(), "");
}

TEST(TransferEngineTest, FanInOperationStartsOnlyAfterEveryDependency) {
  // 20 ms of modelled latency per descriptor: the dependencies are pending
  // for a while, on three different queues of two devices.
  auto rig = MakeRig({.region_bytes = 8 * MiB,
                      .device_url = "sim://?devices=2&hbm=32M&latency_us=20000",
                      .engine = PatientStaging()});
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(absl::StrCat("seed=", seed, " (TPUSHIM_TEST_SEED)"));
  std::mt19937_64 rng(seed);
  constexpr int kParts = 8;
  constexpr uint64_t kPart = 48 * KiB + 17;
  std::vector<char> src = RandomBytes(rng, kParts * kPart);
  absl::StatusOr<DeviceBuffer> whole = engine.Allocate(0, kParts * kPart);
  absl::StatusOr<DeviceBuffer> other = engine.Allocate(1, kPart);
  ASSERT_TRUE(whole.ok() && other.ok());
  std::vector<Event> deps;
  // Parts 0..6 straight into the buffer (h2d queue of device 0).
  for (int i = 0; i < kParts - 1; ++i) {
    absl::StatusOr<Event> e = engine.TransferToDevice(src.data() + i * kPart,
                                                      *whole, i * kPart, kPart);
    ASSERT_TRUE(e.ok());
    deps.push_back(*e);
  }
  // The last part through device 1 and back (h2d of device 1, then the d2d
  // queue of device 1).
  absl::StatusOr<Event> up1 = engine.TransferToDevice(
      src.data() + (kParts - 1) * kPart, *other, 0, kPart);
  ASSERT_TRUE(up1.ok());
  absl::StatusOr<Event> copy = engine.TransferDeviceToDevice(
      *other, 0, *whole, (kParts - 1) * kPart, kPart, {*up1});
  ASSERT_TRUE(copy.ok());
  deps.push_back(*copy);
  deps.push_back(Event());  // an already-ready event among them
  deps.push_back(deps[0]);  // and one event twice
  std::vector<char> dst(kParts * kPart, 0);
  absl::StatusOr<Event> down =
      engine.TransferFromDevice(*whole, 0, dst.data(), dst.size(), deps);
  ASSERT_TRUE(down.ok());
  // Whenever the fan-in is ready, so is every dependency (read in that
  // order, the check cannot race).
  std::atomic<bool> deps_ready_in_callback{false};
  Notification callback_ran;
  down->AddCallback([&](absl::Status) {
    bool all = true;
    for (const Event& e : deps) all = all && e.IsReady();
    deps_ready_in_callback = all;
    callback_ran.Notify();
  });
  while (!down->IsReady()) {
    const bool down_ready = down->IsReady();
    bool all = true;
    for (const Event& e : deps) all = all && e.IsReady();
    if (down_ready) {
      EXPECT_TRUE(all);
    }
    absl::SleepFor(absl::Microseconds(200));
  }
  ASSERT_TRUE(Wait(*down).ok());
  for (const Event& e : deps) EXPECT_TRUE(e.IsReady());
  EXPECT_EQ(Hash(dst.data(), dst.size()), Hash(src.data(), src.size()));
  Free(engine, *whole);
  Free(engine, *other);
  ASSERT_TRUE(callback_ran.WaitForNotificationWithTimeout(kHangTimeout));
  EXPECT_TRUE(deps_ready_in_callback.load());
  EXPECT_EQ(rig->TearDownAndReport(), "");
}

TEST(TransferEngineTest, OperationWaitingOnSlowEventHoldsUpNoLaterOps) {
  // 0.1 Gbit/s: 512 KiB occupy the host→device link for about 42 ms.
  auto rig = MakeRig({.region_bytes = 4 * MiB,
                      .device_url = "sim://?hbm=64M&link_gbps=0.1",
                      .engine = PatientStaging()});
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  std::mt19937_64 rng(1);
  std::vector<char> big = RandomBytes(rng, 512 * KiB);
  std::vector<char> small = RandomBytes(rng, 4 * KiB);
  absl::StatusOr<DeviceBuffer> a = engine.Allocate(0, big.size());
  ASSERT_TRUE(a.ok());
  DeviceBuffer c = Upload(engine, 0, small);
  ASSERT_TRUE(c.valid());

  absl::StatusOr<Event> slow =
      engine.TransferToDevice(big.data(), *a, 0, big.size());
  ASSERT_TRUE(slow.ok());
  std::vector<char> out_blocked(4 * KiB, 0), out_later(4 * KiB, 0);
  // On the device→host queue: one op waiting for the slow upload, then one
  // with no dependencies at all, which does not wait for the first.
  absl::StatusOr<Event> blocked = engine.TransferFromDevice(
      *a, 0, out_blocked.data(), out_blocked.size(), {*slow});
  ASSERT_TRUE(blocked.ok());
  absl::StatusOr<Event> later =
      engine.TransferFromDevice(c, 0, out_later.data(), out_later.size());
  ASSERT_TRUE(later.ok());
  ASSERT_TRUE(Wait(*later).ok());
  EXPECT_FALSE(blocked->IsReady())
      << "the op waiting for the slow upload finished first";
  EXPECT_TRUE(Wait(*blocked).ok());
  EXPECT_TRUE(slow->IsReady());
  EXPECT_EQ(Hash(out_later.data(), out_later.size()),
            Hash(small.data(), small.size()));
  EXPECT_EQ(Hash(out_blocked.data(), out_blocked.size()),
            Hash(big.data(), out_blocked.size()));
  Free(engine, *a);
  Free(engine, c);
  EXPECT_EQ(rig->TearDownAndReport(), "");
}

TEST(TransferEngineTest,
     OpsInOneQueueCompleteInSubmissionOrderWithOneDmaEngine) {
  auto rig = MakeRig({.region_bytes = 4 * MiB,
                      .device_url = "sim://?hbm=16M&latency_us=300",
                      .engine = PatientStaging()});
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  std::mt19937_64 rng(2);
  constexpr int kOps = 24;
  std::vector<char> src = RandomBytes(rng, 8 * KiB);
  absl::StatusOr<DeviceBuffer> b = engine.Allocate(0, kOps * 8 * KiB);
  ASSERT_TRUE(b.ok());
  // A pending event of the test's own gates every op, so every op is still
  // queued when its callback is added (none runs inline), and all become
  // ready at once: they start in submission order.
  const Event gate(std::make_shared<transfer_internal::EventState>(nullptr));
  std::mutex mu;
  std::vector<int> order;
  std::vector<Event> events;
  for (int i = 0; i < kOps; ++i) {
    const uint64_t n = 1 + rng() % (8 * KiB);
    // Each op its own range of the buffer, so that only the queue orders
    // them.
    absl::StatusOr<Event> e =
        engine.TransferToDevice(src.data(), *b, i * 8 * KiB, n, {gate});
    ASSERT_TRUE(e.ok());
    EXPECT_FALSE(e->IsReady());
    e->AddCallback([&, i](absl::Status s) {
      EXPECT_TRUE(s.ok()) << s;
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(i);
    });
    events.push_back(*e);
  }
  gate.state()->Resolve(absl::OkStatus());
  for (const Event& e : events) ASSERT_TRUE(Wait(e).ok());
  Free(engine, *b, events);
  // Callbacks run on their own thread: wait for them.
  const absl::Time deadline = absl::Now() + kHangTimeout;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (order.size() == kOps) break;
    }
    ASSERT_LT(absl::Now(), deadline) << "callbacks never ran";
    absl::SleepFor(absl::Milliseconds(1));
  }
  std::vector<int> expected(kOps);
  for (int i = 0; i < kOps; ++i) expected[i] = i;
  EXPECT_EQ(order, expected);
  EXPECT_EQ(rig->TearDownAndReport(), "");
}

// ---- 4. Failed dependencies ------------------------------------------------

TEST(TransferEngineTest, FailedDependencyFailsDependantsWithSameStatus) {
  auto rig = MakeRig({.region_bytes = 4 * MiB,
                      .device_url = "sim://?devices=2&hbm=16M",
                      .faults = "dma:nth=1,code=UNAVAILABLE",
                      .engine = PatientStaging()});
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  std::mt19937_64 rng(3);
  constexpr uint64_t n = 200 * KiB;

  // The spec's first DMA fails: spend it on a throwaway transfer.
  {
    std::vector<char> tmp(64, 1);
    absl::StatusOr<DeviceBuffer> t = engine.Allocate(0, tmp.size());
    ASSERT_TRUE(t.ok());
    absl::StatusOr<Event> e =
        engine.TransferToDevice(tmp.data(), *t, 0, tmp.size());
    ASSERT_TRUE(e.ok());
    const absl::Status s = Wait(*e);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    EXPECT_THAT(s.message(), HasSubstr("[injected: dma:nth=1"));
    Free(engine, *t);
  }
  // Known contents everywhere.
  const std::vector<char> pat_x = RandomBytes(rng, n);
  const std::vector<char> pat_y = RandomBytes(rng, n);
  DeviceBuffer x = Upload(engine, 0, pat_x);
  DeviceBuffer y = Upload(engine, 1, pat_y);
  ASSERT_TRUE(x.valid() && y.valid());
  absl::StatusOr<DeviceBuffer> spare = engine.Allocate(0, 4096);
  ASSERT_TRUE(spare.ok());
  const std::vector<char> fresh = RandomBytes(rng, n);
  const std::vector<char> fresh2 = RandomBytes(rng, n);
  std::vector<char> host_b = RandomBytes(rng, n);
  std::vector<char> host_d = RandomBytes(rng, n);
  std::vector<char> host_f = RandomBytes(rng, 16);
  const uint64_t hash_b = Hash(host_b.data(), n);
  const uint64_t hash_d = Hash(host_d.data(), n);
  const uint64_t hash_f = Hash(host_f.data(), 16);
  const TransferEngine::Stats before = engine.GetStats();

  // The next DMA is call 1 again: it fails.
  rig->faults().Reset();
  absl::StatusOr<Event> a = engine.TransferToDevice(fresh.data(), x, 0, n);
  ASSERT_TRUE(a.ok());
  absl::StatusOr<Event> b =
      engine.TransferFromDevice(x, 0, host_b.data(), n, {*a});
  absl::StatusOr<Event> c = engine.TransferDeviceToDevice(x, 0, y, 0, n, {*a});
  ASSERT_TRUE(b.ok() && c.ok());
  absl::StatusOr<Event> d =
      engine.TransferFromDevice(y, 0, host_d.data(), n, {*c});  // transitive
  absl::StatusOr<Event> e = engine.TransferToDevice(
      fresh2.data(), y, 0, n, {Event(), *b, Event()});  // fan-in
  absl::StatusOr<Event> f =
      engine.TransferFromDevice(x, 7, host_f.data(), 0, {*a});  // zero bytes
  absl::StatusOr<Event> g = engine.Deallocate(*spare, {*d});
  ASSERT_TRUE(d.ok() && e.ok() && f.ok() && g.ok());

  const absl::Status failed = Wait(*a);
  EXPECT_EQ(failed.code(), absl::StatusCode::kUnavailable) << failed;
  EXPECT_THAT(failed.message(), HasSubstr("DMA error on sim:0 (h2d)"));
  for (const auto& [name, ev] :
       std::vector<std::pair<const char*, Event>>{{"b d2h", *b},
                                                  {"c d2d", *c},
                                                  {"d d2h after c", *d},
                                                  {"e h2d fan-in", *e},
                                                  {"f zero-byte", *f},
                                                  {"g deallocate", *g}}) {
    SCOPED_TRACE(name);
    const absl::Status s = Wait(ev);
    EXPECT_EQ(s.code(), failed.code());
    EXPECT_EQ(s.message(), failed.message());
    EXPECT_EQ(s, failed);
  }
  // Only the failing descriptor ever reached a device.
  EXPECT_EQ(rig->faults().calls(FaultPoint::kDma), 1u);
  EXPECT_EQ(rig->faults().injected(FaultPoint::kDma), 1u);
  EXPECT_EQ(Hash(host_b.data(), n), hash_b) << "a failed dependant wrote";
  EXPECT_EQ(Hash(host_d.data(), n), hash_d) << "a failed dependant wrote";
  EXPECT_EQ(Hash(host_f.data(), 16), hash_f);
  EXPECT_EQ(DownloadHash(engine, x, 0, n), Hash(pat_x.data(), n));
  EXPECT_EQ(DownloadHash(engine, y, 0, n), Hash(pat_y.data(), n));

  const TransferEngine::Stats s = engine.GetStats();
  auto failed_delta = [&](int dev, DmaDirection dir) {
    return QueueOf(s, dev, dir).failed - QueueOf(before, dev, dir).failed;
  };
  EXPECT_EQ(failed_delta(0, DmaDirection::kHostToDevice), 1u);    // a
  EXPECT_EQ(failed_delta(0, DmaDirection::kDeviceToHost), 2u);    // b, f
  EXPECT_EQ(failed_delta(0, DmaDirection::kDeviceToDevice), 1u);  // c
  EXPECT_EQ(failed_delta(1, DmaDirection::kDeviceToHost), 1u);    // d
  EXPECT_EQ(failed_delta(1, DmaDirection::kHostToDevice), 1u);    // e
  EXPECT_EQ(s.device_to_device.failed, 1u);
  EXPECT_EQ(s.device_buffers_live, 2u);  // `spare` was freed regardless
  Free(engine, x);
  Free(engine, y);
  ExpectQueuesReconcile(engine.GetStats());
  EXPECT_EQ(rig->TearDownAndReport(), "");
}

// ---- 5. Callbacks ----------------------------------------------------------

struct CallbackRecord {
  std::mutex mu;
  bool ran = false;
  int runs = 0;
  std::string thread_name;
  std::thread::id thread;
  bool event_ready = false;
  absl::Status status;
};

TEST(TransferEngineTest, CallbacksOnPendingEventsRunAfterReadyOffDmaThreads) {
  auto rig = MakeRig({.region_bytes = 4 * MiB,
                      .device_url = "sim://?hbm=64M&link_gbps=0.1",
                      .engine = PatientStaging()});
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  std::mt19937_64 rng(4);
  std::vector<char> src = RandomBytes(rng, 512 * KiB);
  absl::StatusOr<DeviceBuffer> b = engine.Allocate(0, src.size());
  ASSERT_TRUE(b.ok());
  const uint64_t callbacks_before = engine.GetStats().callbacks_run;
  absl::StatusOr<Event> slow =
      engine.TransferToDevice(src.data(), *b, 0, src.size());  // ~42 ms
  ASSERT_TRUE(slow.ok());
  ASSERT_FALSE(slow->IsReady());

  CallbackRecord rec;
  std::vector<int> order;
  std::vector<char> out(src.size(), 0);
  std::optional<absl::StatusOr<Event>> nested;
  Notification nested_submitted;
  slow->AddCallback([&, ev = *slow](absl::Status s) {
    {
      std::lock_guard<std::mutex> lock(rec.mu);
      ++rec.runs;
      rec.ran = true;
      rec.thread_name = ThreadName();
      rec.thread = std::this_thread::get_id();
      rec.event_ready = ev.IsReady();
      rec.status = s;
      order.push_back(0);
    }
    // No engine lock is held while a callback runs: it may submit work.
    nested = engine.TransferFromDevice(*b, 0, out.data(), out.size());
    nested_submitted.Notify();
  });
  slow->AddCallback([&](absl::Status) {
    std::lock_guard<std::mutex> lock(rec.mu);
    order.push_back(1);
  });
  slow->AddCallback([&](absl::Status) {
    std::lock_guard<std::mutex> lock(rec.mu);
    order.push_back(2);
  });
  ASSERT_TRUE(Wait(*slow).ok());
  ASSERT_TRUE(nested_submitted.WaitForNotificationWithTimeout(kHangTimeout));
  ASSERT_TRUE(nested->ok()) << nested->status();
  ASSERT_TRUE(Wait(**nested).ok());
  EXPECT_EQ(Hash(out.data(), out.size()), Hash(src.data(), src.size()));
  {
    std::lock_guard<std::mutex> lock(rec.mu);
    EXPECT_EQ(rec.runs, 1);
    EXPECT_TRUE(rec.event_ready) << "callback ran before the event was ready";
    EXPECT_TRUE(rec.status.ok()) << rec.status;
    EXPECT_THAT(rec.thread_name, ::testing::Not(StartsWith("dma")));
    EXPECT_NE(rec.thread, std::this_thread::get_id());
    EXPECT_EQ(order, (std::vector<int>{0, 1, 2}));
  }
  // callbacks_run counts each once it returned; poll briefly for the last.
  const absl::Time deadline = absl::Now() + kHangTimeout;
  while (engine.GetStats().callbacks_run < callbacks_before + 3 &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(engine.GetStats().callbacks_run, callbacks_before + 3);

  // On a ready event: inline, on this thread, before AddCallback returns.
  bool inline_ran = false;
  std::thread::id inline_thread;
  slow->AddCallback([&](absl::Status s) {
    EXPECT_TRUE(s.ok());
    inline_ran = true;
    inline_thread = std::this_thread::get_id();
  });
  EXPECT_TRUE(inline_ran);
  EXPECT_EQ(inline_thread, std::this_thread::get_id());
  bool default_ran = false;
  Event().AddCallback([&](absl::Status s) {
    EXPECT_TRUE(s.ok());
    default_ran = true;
  });
  EXPECT_TRUE(default_ran);
  absl::Status seen;
  Event::Ready(absl::DataLossError("boom")).AddCallback([&](absl::Status s) {
    seen = s;
  });
  EXPECT_EQ(seen, absl::DataLossError("boom"));
  Free(engine, *b);
  EXPECT_EQ(rig->TearDownAndReport(), "");
}

TEST(TransferEngineTest, CallbacksSeeTheFailedStatus) {
  // The first descriptor fails after 20 ms of modelled latency; callbacks
  // were added while it was pending, on it and on a dependant.
  auto rig = MakeRig({.region_bytes = 4 * MiB,
                      .device_url = "sim://?hbm=16M&latency_us=20000",
                      .faults = "dma:nth=1,code=UNAVAILABLE"});
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  std::vector<char> src(4096, 5), dst(4096, 0);
  absl::StatusOr<DeviceBuffer> b = engine.Allocate(0, src.size());
  ASSERT_TRUE(b.ok());
  absl::StatusOr<Event> up =
      engine.TransferToDevice(src.data(), *b, 0, src.size());
  ASSERT_TRUE(up.ok());
  absl::StatusOr<Event> down =
      engine.TransferFromDevice(*b, 0, dst.data(), dst.size(), {*up});
  ASSERT_TRUE(down.ok());
  ASSERT_FALSE(up->IsReady());
  std::mutex mu;
  std::vector<std::pair<std::string, absl::Status>> seen;
  for (const Event& e : {*up, *down}) {
    e.AddCallback([&](absl::Status s) {
      std::lock_guard<std::mutex> lock(mu);
      seen.emplace_back(ThreadName(), s);
    });
  }
  const absl::Status up_status = Wait(*up);
  EXPECT_EQ(up_status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Wait(*down), up_status);
  Free(engine, *b);  // a Deallocate after the events drains their callbacks
  const absl::Time deadline = absl::Now() + kHangTimeout;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (seen.size() == 2) break;
    }
    ASSERT_LT(absl::Now(), deadline);
    absl::SleepFor(absl::Milliseconds(1));
  }
  for (const auto& [thread, s] : seen) {
    EXPECT_EQ(s, up_status);
    EXPECT_THAT(thread, ::testing::Not(StartsWith("dma")));
  }
  EXPECT_EQ(rig->TearDownAndReport(), "");
}

// ---- 6. AwaitWithTimeout ---------------------------------------------------

TEST(TransferEngineTest, AwaitWithTimeoutReturnsNulloptUntilReadyThenStatus) {
  auto rig = MakeRig({.region_bytes = 4 * MiB,
                      .device_url = "sim://?hbm=64M&link_gbps=0.1",
                      .engine = PatientStaging()});
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  std::vector<char> src(1 * MiB, 9);
  absl::StatusOr<DeviceBuffer> b = engine.Allocate(0, src.size());
  ASSERT_TRUE(b.ok());
  // 1 MiB over 0.1 Gbit/s: the model completes it no sooner than ~84 ms.
  absl::StatusOr<Event> slow =
      engine.TransferToDevice(src.data(), *b, 0, src.size());
  ASSERT_TRUE(slow.ok());
  EXPECT_EQ(slow->AwaitWithTimeout(absl::ZeroDuration()), std::nullopt);
  EXPECT_EQ(slow->AwaitWithTimeout(absl::Milliseconds(1)), std::nullopt);
  EXPECT_EQ(slow->AwaitWithTimeout(-absl::Seconds(1)), std::nullopt);
  // A bound far beyond the transfer.
  std::optional<absl::Status> done = slow->AwaitWithTimeout(kHangTimeout);
  ASSERT_TRUE(done.has_value()) << "hang";
  EXPECT_TRUE(done->ok()) << *done;
  // An infinite timeout on a pending event waits for it (a second slow
  // transfer), and on a ready one returns at once.
  absl::StatusOr<Event> slow2 =
      engine.TransferToDevice(src.data(), *b, 0, 256 * KiB);
  ASSERT_TRUE(slow2.ok());
  EXPECT_EQ(slow2->AwaitWithTimeout(absl::InfiniteDuration()),
            std::optional<absl::Status>(absl::OkStatus()));
  EXPECT_EQ(slow->AwaitWithTimeout(absl::InfiniteDuration()),
            std::optional<absl::Status>(absl::OkStatus()));
  EXPECT_EQ(slow->AwaitWithTimeout(absl::ZeroDuration()),
            std::optional<absl::Status>(absl::OkStatus()));
  EXPECT_EQ(slow->AwaitWithTimeout(-absl::Seconds(1)),
            std::optional<absl::Status>(absl::OkStatus()));
  const std::optional<absl::Status> failed =
      Event::Ready(absl::AbortedError("x"))
          .AwaitWithTimeout(absl::ZeroDuration());
  EXPECT_EQ(failed, std::optional<absl::Status>(absl::AbortedError("x")));
  Free(engine, *b);
  EXPECT_EQ(rig->TearDownAndReport(), "");
}

// ---- 7. Device memory ------------------------------------------------------

TEST(TransferEngineTest, AllocateBeyondHbmIsResourceExhaustedWithXlaText) {
  auto rig =
      MakeRig({.region_bytes = 0, .device_url = "sim://?devices=2&hbm=16M"});
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  // Leave exactly 6584 KiB free on device 1: 6584 / 1024 = 6.43 MiB.
  const uint64_t free_bytes = 6584 * KiB;
  absl::StatusOr<DeviceBuffer> big = engine.Allocate(1, 16 * MiB - free_bytes);
  ASSERT_TRUE(big.ok()) << big.status();
  const TransferEngine::Stats before = engine.GetStats();
  absl::StatusOr<DeviceBuffer> too_big = engine.Allocate(1, 8 * MiB);
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted);
  // XLA's line, then its report of what holds the memory.
  EXPECT_THAT(std::string(too_big.status().message()),
              StartsWith("Error allocating device buffer: Attempting to "
                         "allocate 8.00M. That was not possible. There are "
                         "6.43M free.; (0x0x1_HBM0)\nRan out of memory in "
                         "memory space hbm. Used 17.57M of 16.00M hbm."));
  const TransferEngine::Stats after = engine.GetStats();
  EXPECT_EQ(after.device_buffers_live, before.device_buffers_live);
  EXPECT_EQ(after.device_bytes_live, before.device_bytes_live);
  // The other device is not affected; device 0 names itself.
  absl::StatusOr<DeviceBuffer> on0 = engine.Allocate(0, 8 * MiB);
  ASSERT_TRUE(on0.ok()) << on0.status();
  absl::StatusOr<DeviceBuffer> too_big0 = engine.Allocate(0, 9 * MiB);
  ASSERT_FALSE(too_big0.ok());
  EXPECT_THAT(std::string(too_big0.status().message()),
              StartsWith("Error allocating device buffer: Attempting to "
                         "allocate 9.00M. That was not possible. There are "
                         "8.00M free.; (0x0x0_HBM0)\n"));
  // Once freed, the memory is there again.
  Free(engine, *big);
  absl::StatusOr<DeviceBuffer> fits = engine.Allocate(1, 8 * MiB);
  EXPECT_TRUE(fits.ok()) << fits.status();
  // Not RESOURCE_EXHAUSTED: bad arguments.
  EXPECT_EQ(engine.Allocate(0, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine.Allocate(2, 64).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine.Allocate(-1, 64).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rig->TearDownAndReport(), "");
}

// ---- 8. Injected DMA faults at every descriptor ----------------------------

// A self-contained scenario over all paths and d2d, with dependencies, on
// `rig` (region 4 MiB, threshold 256 KiB, 64 KiB chunks, two devices). At
// most one DMA descriptor fails (the armed counted fault). Checks: every
// event becomes ready; every failure is the injected one, with the same
// status for every dependant; data that arrived is right; nothing stays
// allocated, pinned or staged.
void RunFaultScenario(TransferRig& rig, uint64_t n_armed, uint64_t seed) {
  SCOPED_TRACE(absl::StrCat("counted DMA fault at call ", n_armed));
  TransferEngine& engine = rig.engine();
  std::mt19937_64 rng(seed + n_armed);
  const std::string injected_tag =
      absl::StrCat("[injected: counted failure at call ", n_armed, "]");

  const std::vector<char> src_a = RandomBytes(rng, 200 * KiB);  // staged
  const std::vector<char> src_c = RandomBytes(rng, 300 * KiB);  // pinned
  std::vector<char> dst_b(src_a.size(), 0), dst_c(src_c.size(), 0);
  HostMem src_z(rig.region(), 100 * KiB), dst_z(rig.region(), 100 * KiB);
  ASSERT_TRUE(src_z.ok() && dst_z.ok());
  FillRandom(rng, src_z.data(), src_z.size());
  std::memset(dst_z.data(), 0, dst_z.size());

  absl::StatusOr<DeviceBuffer> a = engine.Allocate(0, src_a.size());
  absl::StatusOr<DeviceBuffer> b = engine.Allocate(1, src_a.size());
  absl::StatusOr<DeviceBuffer> c = engine.Allocate(0, src_c.size());
  absl::StatusOr<DeviceBuffer> z = engine.Allocate(1, src_z.size());
  ASSERT_TRUE(a.ok() && b.ok() && c.ok() && z.ok());

  struct Op {
    std::string name;
    Event event;
    std::vector<std::string> deps;  // names
  };
  std::vector<Op> ops;
  auto add = [&](std::string name, absl::StatusOr<Event> e,
                 std::vector<std::string> deps) {
    ASSERT_TRUE(e.ok()) << name << ": " << e.status();
    ops.push_back({std::move(name), *e, std::move(deps)});
  };
  auto ev = [&](const std::string& name) {
    for (const Op& op : ops) {
      if (op.name == name) return op.event;
    }
    ADD_FAILURE() << "no op " << name;
    return Event();
  };
  add("up_a", engine.TransferToDevice(src_a.data(), *a, 0, src_a.size()), {});
  add("copy_ab",
      engine.TransferDeviceToDevice(*a, 0, *b, 0, src_a.size(), {ev("up_a")}),
      {"up_a"});
  add("down_b",
      engine.TransferFromDevice(*b, 0, dst_b.data(), dst_b.size(),
                                {ev("copy_ab")}),
      {"copy_ab"});
  add("up_c", engine.TransferToDevice(src_c.data(), *c, 0, src_c.size()), {});
  add("down_c",
      engine.TransferFromDevice(*c, 0, dst_c.data(), dst_c.size(),
                                {ev("up_c")}),
      {"up_c"});
  add("up_z", engine.TransferToDevice(src_z.data(), *z, 0, src_z.size()), {});
  add("down_z",
      engine.TransferFromDevice(*z, 0, dst_z.data(), dst_z.size(),
                                {ev("up_z")}),
      {"up_z"});
  add("free_a", engine.Deallocate(*a, {ev("copy_ab")}), {"copy_ab"});
  add("free_b", engine.Deallocate(*b, {ev("down_b")}), {"down_b"});
  add("free_c", engine.Deallocate(*c, {ev("down_c")}), {"down_c"});
  add("free_z", engine.Deallocate(*z, {ev("down_z")}), {"down_z"});
  if (testing::Test::HasFatalFailure()) return;

  std::optional<absl::Status> injected;
  for (const Op& op : ops) {
    SCOPED_TRACE(op.name);
    const absl::Status s = Wait(op.event);
    if (s.ok()) {
      for (const std::string& d : op.deps) {
        EXPECT_TRUE(ev(d).Await().ok())
            << "OK although dependency " << d << " failed";
      }
      continue;
    }
    EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
    EXPECT_THAT(s.message(), HasSubstr(injected_tag));
    // One fault, one status: every failed event carries it exactly.
    if (!injected) injected = s;
    EXPECT_EQ(s, *injected);
    // A dependant of a failed op has its status; an op whose dependencies
    // all succeeded failed because its own descriptor did.
    for (const std::string& d : op.deps) {
      const absl::Status ds = ev(d).Await();
      if (!ds.ok()) {
        EXPECT_EQ(s, ds);
      }
    }
  }
  if (ev("down_b").Await().ok()) {
    EXPECT_EQ(Hash(dst_b.data(), dst_b.size()),
              Hash(src_a.data(), src_a.size()));
  }
  if (ev("down_c").Await().ok()) {
    EXPECT_EQ(Hash(dst_c.data(), dst_c.size()),
              Hash(src_c.data(), src_c.size()));
  }
  if (ev("down_z").Await().ok()) {
    EXPECT_EQ(Hash(dst_z.data(), dst_z.size()),
              Hash(src_z.data(), src_z.size()));
  }
  const bool fired = rig.faults().counted_fault_fired();
  EXPECT_EQ(injected.has_value(), fired)
      << "the injected fault must fail exactly the ops it hit";
  const TransferEngine::Stats s = engine.GetStats();
  ExpectQueuesReconcile(s);
  EXPECT_EQ(s.device_buffers_live, 0u);
  EXPECT_EQ(s.pinned_bytes_now, 0u);
  EXPECT_EQ(s.staging_bytes_in_flight, 0u);
  EXPECT_EQ(rig.os().pinned_bytes(), 0u);
}

TransferRig::Params FaultRigParams() {
  TransferEngine::Config config = PatientStaging();
  config.chunk_bytes = 64 * KiB;
  config.from_device_chunk_bytes = 64 * KiB;
  config.descriptor_bytes = 64 * KiB;
  return {.region_bytes = 4 * MiB,
          .threshold = 256 * KiB,
          .device_url = "sim://?devices=2&hbm=16M",
          .engine = config};
}

TEST(TransferEngineTest, DmaFaultAtEveryDescriptorFailsCleanlyWithFreshRigs) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(absl::StrCat("seed=", seed, " (TPUSHIM_TEST_SEED)"));
  uint64_t runs = 0;
  for (uint64_t n = 1; n <= 200; ++n) {
    auto rig = MakeRig(FaultRigParams());
    ASSERT_NE(rig, nullptr);
    rig->faults().ArmNthAcross(FaultPointSet{FaultPoint::kDma}, n);
    RunFaultScenario(*rig, n, seed);
    const bool fired = rig->faults().counted_fault_fired();
    EXPECT_EQ(rig->TearDownAndReport(), "")
        << "after a fault at DMA call " << n;
    runs = n;
    if (testing::Test::HasFailure() || !fired) break;
  }
  // 4+4+4 (staged, d2d, staged) + 5+5 (pinned) + 2+2 (zero-copy)
  // descriptors, then one clean run.
  EXPECT_EQ(runs, 27u);
}

TEST(TransferEngineTest, DmaFaultAtEveryDescriptorLeavesOneEngineHealthy) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(absl::StrCat("seed=", seed, " (TPUSHIM_TEST_SEED)"));
  auto rig = MakeRig(FaultRigParams());
  ASSERT_NE(rig, nullptr);
  absl::StatusOr<uint64_t> runs = RunWithCountedFailures(
      rig->faults(), FaultPointSet{FaultPoint::kDma},
      [&](uint64_t n) { RunFaultScenario(*rig, n, seed); }, 200);
  ASSERT_TRUE(runs.ok()) << runs.status();
  EXPECT_EQ(*runs, 27u);
  EXPECT_EQ(rig->TearDownAndReport(), "");
}

// ---- 9. Pin faults ---------------------------------------------------------

TEST(TransferEngineTest, PinFaultFailsTransferAndLeavesNothingPinned) {
  auto rig = MakeRig({.region_bytes = 4 * MiB,
                      .threshold = 1 * MiB,
                      .faults = "pin:nth=1",
                      .engine = PatientStaging()});
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  std::mt19937_64 rng(5);
  const std::vector<char> src = RandomBytes(rng, 2 * MiB + 5);
  std::vector<char> dst(src.size(), 0);
  ASSERT_EQ(engine.PathFor(src.data(), src.size()), TransferPath::kPinned);
  absl::StatusOr<DeviceBuffer> b = engine.Allocate(0, src.size());
  ASSERT_TRUE(b.ok());
  absl::StatusOr<Event> up =
      engine.TransferToDevice(src.data(), *b, 0, src.size());
  ASSERT_TRUE(up.ok());
  const absl::Status s = Wait(*up);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(s.message(), HasSubstr("Pinning"));
  EXPECT_THAT(s.message(), HasSubstr("[injected: pin:nth=1]"));
  TransferEngine::Stats st = engine.GetStats();
  EXPECT_EQ(st.pinned_bytes_now, 0u);
  EXPECT_EQ(rig->os().pinned_bytes(), 0u);
  EXPECT_EQ(st.host[kH2D][P(TransferPath::kPinned)].failed, 1u);
  EXPECT_EQ(rig->faults().calls(FaultPoint::kDma), 0u)
      << "DMA after a failed pin";

  // The next transfers work.
  absl::StatusOr<Event> again =
      engine.TransferToDevice(src.data(), *b, 0, src.size());
  ASSERT_TRUE(again.ok());
  absl::StatusOr<Event> down =
      engine.TransferFromDevice(*b, 0, dst.data(), dst.size(), {*again});
  ASSERT_TRUE(down.ok());
  EXPECT_TRUE(Wait(*again).ok());
  ASSERT_TRUE(Wait(*down).ok());
  EXPECT_EQ(Hash(dst.data(), dst.size()), Hash(src.data(), src.size()));
  Free(engine, *b);
  st = engine.GetStats();
  EXPECT_EQ(st.host[kH2D][P(TransferPath::kPinned)].transfers, 2u);
  EXPECT_EQ(st.host[kD2H][P(TransferPath::kPinned)].transfers, 1u);
  EXPECT_EQ(st.pinned_bytes_now, 0u);
  EXPECT_EQ(rig->os().pinned_bytes(), 0u);
  ExpectQueuesReconcile(st);
  EXPECT_EQ(rig->TearDownAndReport(), "");
}

// ---- 10. Staging backpressure ----------------------------------------------

TEST(TransferEngineTest, StagingBackpressureWaitsInsteadOfFailing) {
  TransferEngine::Config config;
  config.chunk_bytes = 64 * KiB;
  config.from_device_chunk_bytes = 64 * KiB;
  config.descriptor_bytes = 64 * KiB;
  config.staging_depth = 4;
  config.max_staging_bytes = 128 * KiB;  // two chunks for everyone
  config.staging_wait = absl::Seconds(20);
  auto rig = MakeRig({.region_bytes = 4 * MiB,
                      .device_url = "sim://?devices=2&hbm=32M&latency_us=500",
                      .engine = config});
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(absl::StrCat("seed=", seed, " (TPUSHIM_TEST_SEED)"));
  constexpr int kThreads = 6;
  constexpr int kRounds = 5;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(seed + t);
      for (int r = 0; r < kRounds; ++r) {
        const uint64_t n = RandomSize(rng, 100 * KiB, 300 * KiB);
        std::vector<char> src = RandomBytes(rng, n), dst(n, 0);
        absl::StatusOr<DeviceBuffer> b = engine.Allocate(t % 2, n);
        if (!b.ok()) {
          ADD_FAILURE() << b.status();
          return;
        }
        absl::StatusOr<Event> up =
            engine.TransferToDevice(src.data(), *b, 0, n);
        absl::StatusOr<Event> down =
            up.ok() ? engine.TransferFromDevice(*b, 0, dst.data(), n, {*up})
                    : absl::StatusOr<Event>(up.status());
        if (!down.ok()) {
          ADD_FAILURE() << down.status();
          return;
        }
        EXPECT_TRUE(Wait(*up).ok());
        EXPECT_TRUE(Wait(*down).ok());
        EXPECT_EQ(Hash(dst.data(), n), Hash(src.data(), n));
        Free(engine, *b);
      }
    });
  }
  for (std::thread& th : threads) th.join();
  const TransferEngine::Stats s = engine.GetStats();
  EXPECT_EQ(s.max_staging_bytes, 128 * KiB);
  EXPECT_LE(s.peak_staging_bytes, s.max_staging_bytes);
  EXPECT_GT(s.peak_staging_bytes, 0u);
  EXPECT_GT(s.staging_waits, 0u);
  EXPECT_EQ(s.pinned_staging_timeout, 0u);
  EXPECT_EQ(s.host[kH2D][P(TransferPath::kStaged)].transfers,
            uint64_t{kThreads} * kRounds);
  EXPECT_EQ(s.host[kD2H][P(TransferPath::kStaged)].transfers,
            uint64_t{kThreads} * kRounds);
  EXPECT_EQ(s.host[kH2D][P(TransferPath::kStaged)].failed, 0u);
  EXPECT_EQ(s.host[kD2H][P(TransferPath::kStaged)].failed, 0u);
  EXPECT_EQ(s.staging_bytes_in_flight, 0u);
  ExpectQueuesReconcile(s);
  EXPECT_EQ(rig->TearDownAndReport(), "");
}

// ---- 11. Staging timeout → pinned fallback ---------------------------------

int CountLines(const std::string& text, absl::string_view needle) {
  int n = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StrContains(line, needle)) ++n;
  }
  return n;
}

// Fills the whole region with one user allocation; returns it.
void* FillRegion(PremappedRegion& region) {
  absl::StatusOr<void*> p = region.allocator().Allocate(region.size());
  EXPECT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(region.allocator().TryAllocate(64), nullptr);
  return p.ok() ? *p : nullptr;
}

TEST(TransferEngineTest, StagingTimeoutFallsBackToPinnedWithOneWarning) {
  testutil::ScopedTestLogging logs;
  TransferEngine::Config config;
  config.staging_wait = absl::Milliseconds(5);
  auto rig = MakeRig({.region_bytes = 2 * MiB, .engine = config});
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  void* hog = FillRegion(*rig->region());
  ASSERT_NE(hog, nullptr);
  std::mt19937_64 rng(6);
  const std::vector<char> src = RandomBytes(rng, 100 * KiB);
  std::vector<char> dst(src.size(), 0);
  ASSERT_EQ(engine.PathFor(src.data(), src.size()), TransferPath::kStaged);
  absl::StatusOr<DeviceBuffer> b = engine.Allocate(0, src.size());
  ASSERT_TRUE(b.ok());
  absl::StatusOr<Event> up =
      engine.TransferToDevice(src.data(), *b, 0, src.size());
  ASSERT_TRUE(up.ok());
  ASSERT_TRUE(Wait(*up).ok()) << Wait(*up);
  TransferEngine::Stats s = engine.GetStats();
  EXPECT_EQ(s.pinned_staging_timeout, 1u);
  EXPECT_EQ(s.host[kH2D][P(TransferPath::kPinned)].transfers, 1u);
  EXPECT_EQ(s.host[kH2D][P(TransferPath::kStaged)].transfers, 0u);

  absl::StatusOr<Event> down =
      engine.TransferFromDevice(*b, 0, dst.data(), dst.size());
  ASSERT_TRUE(down.ok());
  ASSERT_TRUE(Wait(*down).ok()) << Wait(*down);
  EXPECT_EQ(Hash(dst.data(), dst.size()), Hash(src.data(), src.size()));
  // A few more in a row, both directions.
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<Event> e =
        i % 2 == 0 ? engine.TransferToDevice(src.data(), *b, 0, src.size())
                   : engine.TransferFromDevice(*b, 0, dst.data(), dst.size());
    ASSERT_TRUE(e.ok());
    EXPECT_TRUE(Wait(*e).ok());
  }
  s = engine.GetStats();
  EXPECT_EQ(s.pinned_staging_timeout, 6u);
  EXPECT_EQ(s.host[kH2D][P(TransferPath::kPinned)].transfers, 3u);
  EXPECT_EQ(s.host[kD2H][P(TransferPath::kPinned)].transfers, 3u);
  EXPECT_EQ(s.pinned_bytes_now, 0u);
  EXPECT_GT(s.staging_waits, 0u);
  const std::string warnings = logs.File("WARNING");
  EXPECT_EQ(
      CountLines(warnings, "TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES"), 1)
      << warnings;
  EXPECT_EQ(CountLines(warnings, "pins the caller's memory"), 1) << warnings;
  Free(engine, *b);
  EXPECT_TRUE(rig->region()->allocator().Free(hog).ok());
  // With room again, the same transfer is staged.
  absl::StatusOr<DeviceBuffer> b2 = engine.Allocate(0, src.size());
  ASSERT_TRUE(b2.ok());
  absl::StatusOr<Event> staged =
      engine.TransferToDevice(src.data(), *b2, 0, src.size());
  ASSERT_TRUE(staged.ok());
  EXPECT_TRUE(Wait(*staged).ok());
  EXPECT_EQ(engine.GetStats().host[kH2D][P(TransferPath::kStaged)].transfers,
            1u);
  Free(engine, *b2);
  EXPECT_EQ(rig->TearDownAndReport(), "");
}

TEST(TransferEngineTest, RateLimitedFallbackWarningsCountWhatTheySuppressed) {
  testutil::ScopedTestLogging logs;
  TransferEngine::Config config;
  config.staging_wait = absl::Milliseconds(2);
  config.fallback_warning_interval = absl::Milliseconds(300);
  auto rig = MakeRig({.region_bytes = 1 * MiB, .engine = config});
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  void* hog = FillRegion(*rig->region());
  ASSERT_NE(hog, nullptr);
  std::vector<char> src(10 * KiB, 3);
  absl::StatusOr<DeviceBuffer> b = engine.Allocate(0, src.size());
  ASSERT_TRUE(b.ok());
  auto fallback = [&] {
    absl::StatusOr<Event> e =
        engine.TransferToDevice(src.data(), *b, 0, src.size());
    ASSERT_TRUE(e.ok());
    EXPECT_TRUE(Wait(*e).ok());
  };
  int total = 0;
  for (int i = 0; i < 6; ++i, ++total) fallback();
  absl::SleepFor(absl::Milliseconds(350));
  fallback();  // past the interval: prints, with the count it held back
  ++total;
  EXPECT_EQ(engine.GetStats().pinned_staging_timeout,
            static_cast<uint64_t>(total));
  const std::string warnings = logs.File("WARNING");
  // Every fallback is either a line of its own or counted in the next line.
  int lines = 0, suppressed = 0;
  for (absl::string_view line : absl::StrSplit(warnings, '\n')) {
    if (!absl::StrContains(line, "pins the caller's memory")) continue;
    ++lines;
    const size_t at = line.find(" more such transfers since the last message");
    if (at == absl::string_view::npos) continue;
    const size_t start = line.rfind(' ', at - 1) + 1;
    int k = 0;
    EXPECT_TRUE(absl::SimpleAtoi(line.substr(start, at - start), &k)) << line;
    suppressed += k;
  }
  EXPECT_GE(lines, 2) << warnings;
  EXPECT_LT(lines, total) << "not rate-limited:\n" << warnings;
  EXPECT_EQ(lines + suppressed, total) << warnings;
  Free(engine, *b);
  EXPECT_TRUE(rig->region()->allocator().Free(hog).ok());
  EXPECT_EQ(rig->TearDownAndReport(), "");
}

// ---- 12. Host buffer semantics ---------------------------------------------

TEST(TransferEngineTest,
     ImmutableOnlyDuringCallLetsCallerReuseBufferWhenCallReturns) {
  auto rig = MakeRig({.region_bytes = 4 * MiB,
                      .threshold = 1 * MiB,
                      .device_url = "sim://?hbm=64M&link_gbps=0.1",
                      .engine = PatientStaging()});
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  std::mt19937_64 rng(7);
  constexpr auto kDuringCall = HostBufferSemantics::kImmutableOnlyDuringCall;

  // A slow device→host transfer (~42 ms) gates the upload under test (Q),
  // so it can only start — and copy the caller's bytes — once the gate is
  // ready.
  const std::vector<char> gate_data = RandomBytes(rng, 512 * KiB);
  DeviceBuffer gate_buf = Upload(engine, 0, gate_data);
  ASSERT_TRUE(gate_buf.valid());
  std::vector<char> gate_out(gate_data.size());
  absl::StatusOr<Event> gate =
      engine.TransferFromDevice(gate_buf, 0, gate_out.data(), gate_out.size());
  ASSERT_TRUE(gate.ok());

  const uint64_t n = 300 * KiB;  // staged
  std::vector<char> q_src = RandomBytes(rng, n);
  const uint64_t q_hash = Hash(q_src.data(), n);
  absl::StatusOr<DeviceBuffer> q_buf = engine.Allocate(0, n);
  ASSERT_TRUE(q_buf.ok());
  ASSERT_EQ(engine.PathFor(q_src.data(), n), TransferPath::kStaged);
  absl::StatusOr<Event> q =
      engine.TransferToDevice(q_src.data(), *q_buf, 0, n, {*gate}, kDuringCall);
  ASSERT_TRUE(q.ok());
  EXPECT_TRUE(gate->IsReady()) << "Q returned before it could have started";
  // The caller reuses its buffer at once.
  std::memset(q_src.data(), 0xEE, n);
  ASSERT_TRUE(Wait(*q).ok());
  EXPECT_EQ(DownloadHash(engine, *q_buf, 0, n), q_hash)
      << "the device got bytes written after the call returned";

  // Device→host: the data is there when the call returns, on every path.
  std::optional<HostMem> region_dst;
  region_dst.emplace(rig->region(), n);
  ASSERT_TRUE(region_dst->ok());
  std::vector<char> heap_dst(n);
  const std::vector<char> big = RandomBytes(rng, 1 * MiB + 100);  // pinned
  DeviceBuffer big_buf = Upload(engine, 0, big);
  ASSERT_TRUE(big_buf.valid());
  std::vector<char> big_dst(big.size());
  struct Case {
    const char* name;
    const DeviceBuffer* buffer;
    char* dst;
    uint64_t size;
    uint64_t expect;
    TransferPath path;
  };
  for (const Case& c :
       {Case{"staged", &*q_buf, heap_dst.data(), n, q_hash,
             TransferPath::kStaged},
        Case{"zero_copy", &*q_buf, region_dst->data(), n, q_hash,
             TransferPath::kZeroCopy},
        Case{"pinned", &big_buf, big_dst.data(), big.size(),
             Hash(big.data(), big.size()), TransferPath::kPinned}}) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(engine.PathFor(c.dst, c.size), c.path);
    std::memset(c.dst, 0, c.size);
    // Behind a slow upload of the same buffer, so it certainly waits.
    absl::StatusOr<Event> slow_up =
        c.buffer == &big_buf
            ? engine.TransferToDevice(big.data(), big_buf, 0, 256 * KiB)
            : engine.TransferToDevice(gate_data.data(), gate_buf, 0, 256 * KiB);
    ASSERT_TRUE(slow_up.ok());
    absl::StatusOr<Event> down = engine.TransferFromDevice(
        *c.buffer, 0, c.dst, c.size, {*slow_up}, kDuringCall);
    ASSERT_TRUE(down.ok());
    EXPECT_TRUE(slow_up->IsReady());
    EXPECT_TRUE(down->IsReady()) << "returned before the transfer completed";
    EXPECT_EQ(Hash(c.dst, c.size), c.expect);
    EXPECT_TRUE(Wait(*down).ok());
  }
  // Pinned host→device also completes before the call returns.
  absl::StatusOr<Event> pinned_up = engine.TransferToDevice(
      big.data(), big_buf, 0, big.size(), {}, kDuringCall);
  ASSERT_TRUE(pinned_up.ok());
  EXPECT_TRUE(pinned_up->IsReady());
  Free(engine, gate_buf);
  Free(engine, *q_buf);
  Free(engine, big_buf);
  region_dst.reset();
  EXPECT_EQ(rig->TearDownAndReport(), "");
}

// ---- 13. Deallocation and argument checks ----------------------------------

TEST(TransferEngineTest, DeallocateFreesMemoryOnlyAfterItsEvents) {
  auto rig = MakeRig({.region_bytes = 4 * MiB,
                      .device_url = "sim://?hbm=16M&link_gbps=0.1",
                      .engine = PatientStaging()});
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  Device& dev = rig->device(0);
  const uint64_t base_use = dev.MemoryInUse();
  std::vector<char> src(512 * KiB, 4);

  // Implicitly: every operation already submitted on the buffer.
  absl::StatusOr<DeviceBuffer> b = engine.Allocate(0, 1 * MiB);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(dev.MemoryInUse(), base_use + 1 * MiB);
  absl::StatusOr<Event> t =
      engine.TransferToDevice(src.data(), *b, 0, src.size());
  ASSERT_TRUE(t.ok());
  absl::StatusOr<Event> d = engine.Deallocate(*b);
  ASSERT_TRUE(d.ok());
  // Rejected at once, even before the memory is actually free.
  EXPECT_EQ(engine.TransferToDevice(src.data(), *b, 0, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  while (!d->IsReady()) {
    const uint64_t in_use = dev.MemoryInUse();
    const bool t_ready = t->IsReady();
    if (in_use == base_use) {
      EXPECT_TRUE(t_ready) << "freed under a transfer";
    }
    absl::SleepFor(absl::Microseconds(200));
  }
  EXPECT_TRUE(Wait(*d).ok());
  EXPECT_TRUE(t->IsReady());
  EXPECT_EQ(dev.MemoryInUse(), base_use);

  // Explicitly: wait_for events of other buffers.
  absl::StatusOr<DeviceBuffer> b2 = engine.Allocate(0, 64 * KiB);
  absl::StatusOr<DeviceBuffer> other = engine.Allocate(0, src.size());
  ASSERT_TRUE(b2.ok() && other.ok());
  const uint64_t use2 = dev.MemoryInUse();
  absl::StatusOr<Event> slow =
      engine.TransferToDevice(src.data(), *other, 0, src.size());
  ASSERT_TRUE(slow.ok());
  absl::StatusOr<Event> d2 = engine.Deallocate(*b2, {*slow});
  ASSERT_TRUE(d2.ok());
  while (!d2->IsReady()) {
    const uint64_t in_use = dev.MemoryInUse();
    const bool slow_ready = slow->IsReady();
    if (in_use < use2) {
      EXPECT_TRUE(slow_ready) << "freed before its wait_for";
    }
    absl::SleepFor(absl::Microseconds(200));
  }
  EXPECT_TRUE(Wait(*d2).ok());
  EXPECT_TRUE(slow->IsReady());
  EXPECT_EQ(dev.MemoryInUse(), use2 - 64 * KiB);

  // With a failed dependency: its status, and the memory is freed anyway.
  absl::StatusOr<DeviceBuffer> b3 = engine.Allocate(0, 4096);
  ASSERT_TRUE(b3.ok());
  const uint64_t use3 = dev.MemoryInUse();
  absl::StatusOr<Event> d3 = engine.Deallocate(
      *b3, {Event(), Event::Ready(absl::UnavailableError("dep failed"))});
  ASSERT_TRUE(d3.ok());
  EXPECT_EQ(Wait(*d3), absl::UnavailableError("dep failed"));
  EXPECT_EQ(dev.MemoryInUse(), use3 - 4096);

  // A buffer that is only the destination of a (slow) device→device copy.
  absl::StatusOr<DeviceBuffer> peer = engine.Allocate(0, src.size());
  ASSERT_TRUE(peer.ok());
  const uint64_t use4 = dev.MemoryInUse();
  absl::StatusOr<Event> copy =
      engine.TransferDeviceToDevice(*other, 0, *peer, 0, src.size());
  ASSERT_TRUE(copy.ok());
  absl::StatusOr<Event> d4 = engine.Deallocate(*peer);
  ASSERT_TRUE(d4.ok());
  while (!d4->IsReady()) {
    const uint64_t in_use = dev.MemoryInUse();
    const bool copy_ready = copy->IsReady();
    if (in_use < use4) {
      EXPECT_TRUE(copy_ready) << "freed under a copy into it";
    }
    absl::SleepFor(absl::Microseconds(200));
  }
  EXPECT_TRUE(Wait(*d4).ok());
  EXPECT_TRUE(copy->IsReady());
  EXPECT_EQ(dev.MemoryInUse(), use4 - src.size());

  Free(engine, *other);
  const TransferEngine::Stats s = engine.GetStats();
  EXPECT_EQ(s.device_buffers_live, 0u);
  EXPECT_EQ(s.device_bytes_live, 0u);
  EXPECT_EQ(rig->TearDownAndReport(), "");
}

TEST(TransferEngineTest, InvalidBuffersAndRangesAreRejectedWithNothingQueued) {
  auto rig = MakeRig(
      {.region_bytes = 4 * MiB, .device_url = "sim://?devices=2&hbm=16M"});
  auto other_rig = MakeRig({.region_bytes = 0, .device_url = "sim://?hbm=16M"});
  ASSERT_NE(rig, nullptr);
  ASSERT_NE(other_rig, nullptr);
  TransferEngine& engine = rig->engine();
  std::vector<char> host(8192, 1);
  absl::StatusOr<DeviceBuffer> live = engine.Allocate(0, 4096);
  absl::StatusOr<DeviceBuffer> peer = engine.Allocate(1, 4096);
  absl::StatusOr<DeviceBuffer> dead = engine.Allocate(0, 4096);
  absl::StatusOr<DeviceBuffer> foreign = other_rig->engine().Allocate(0, 4096);
  ASSERT_TRUE(live.ok() && peer.ok() && dead.ok() && foreign.ok());
  Free(engine, *dead);
  const DeviceBuffer empty;
  EXPECT_FALSE(empty.valid());
  const TransferEngine::Stats before = engine.GetStats();
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();

  auto expect_invalid = [&](const absl::Status& s, const std::string& what) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument)
        << what << ": " << s;
  };
  for (const auto& [name, bad] :
       std::vector<std::pair<std::string, DeviceBuffer>>{
           {"deallocated", *dead},
           {"other engine", *foreign},
           {"empty", empty}}) {
    SCOPED_TRACE(name);
    expect_invalid(engine.TransferToDevice(host.data(), bad, 0, 16).status(),
                   "h2d");
    expect_invalid(engine.TransferFromDevice(bad, 0, host.data(), 16).status(),
                   "d2h");
    expect_invalid(engine.TransferDeviceToDevice(bad, 0, *live, 0, 16).status(),
                   "d2d source");
    expect_invalid(engine.TransferDeviceToDevice(*live, 0, bad, 0, 16).status(),
                   "d2d destination");
    expect_invalid(engine.Deallocate(bad).status(), "deallocate");
  }
  // Out of range, including offsets and sizes that overflow.
  for (const auto& [off, size] :
       std::vector<std::pair<uint64_t, uint64_t>>{{4097, 0},
                                                  {4096, 1},
                                                  {4000, 97},
                                                  {0, 4097},
                                                  {kMax, 1},
                                                  {1, kMax},
                                                  {kMax, kMax}}) {
    SCOPED_TRACE(absl::StrCat("offset ", off, " size ", size));
    expect_invalid(
        engine.TransferToDevice(host.data(), *live, off, size).status(), "h2d");
    expect_invalid(
        engine.TransferFromDevice(*live, off, host.data(), size).status(),
        "d2h");
    expect_invalid(
        engine.TransferDeviceToDevice(*live, off, *peer, 0, size).status(),
        "d2d source range");
    expect_invalid(
        engine.TransferDeviceToDevice(*peer, 0, *live, off, size).status(),
        "d2d destination range");
  }
  expect_invalid(engine.TransferToDevice(nullptr, *live, 0, 16).status(),
                 "null host source");
  expect_invalid(engine.TransferFromDevice(*live, 0, nullptr, 16).status(),
                 "null host destination");
  expect_invalid(engine.Deallocate(*dead).status(), "double deallocate");
  // Nothing was queued, and no use of `live` or `peer` leaked: they are
  // still usable and free at once.
  const TransferEngine::Stats after = engine.GetStats();
  EXPECT_EQ(TotalSubmitted(after), TotalSubmitted(before));
  EXPECT_EQ(after.events_pending, 0u);
  absl::StatusOr<Event> ok =
      engine.TransferDeviceToDevice(*live, 0, *peer, 0, 4096);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(Wait(*ok).ok());
  Free(engine, *live);
  Free(engine, *peer);
  // The foreign buffer is untouched in its own engine.
  absl::StatusOr<Event> own =
      other_rig->engine().TransferToDevice(host.data(), *foreign, 0, 4096);
  ASSERT_TRUE(own.ok());
  EXPECT_TRUE(Wait(*own).ok());
  EXPECT_EQ(other_rig->TearDownAndReport(), "");
  EXPECT_EQ(rig->TearDownAndReport(), "");
}

// ---- 14. Shutdown ----------------------------------------------------------

TEST(TransferEngineTest, ShutdownWithWorkInFlightResolvesEveryEvent) {
  TransferEngine::Config config;
  config.chunk_bytes = 64 * KiB;
  config.from_device_chunk_bytes = 64 * KiB;
  config.descriptor_bytes = 64 * KiB;
  auto rig = MakeRig({.region_bytes = 4 * MiB,
                      .threshold = 256 * KiB,
                      .device_url = "sim://?devices=2&hbm=32M&link_gbps=0.1",
                      .engine = config});
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  std::mt19937_64 rng(8);
  // 64 KiB over 0.1 Gbit/s: ~5 ms per descriptor, ~130 ms of uploads per
  // device in all; everything that waits on the last of them is certainly
  // still queued when Shutdown comes.
  std::vector<std::vector<char>> host;
  std::vector<DeviceBuffer> buffers;
  std::vector<Event> events;
  std::atomic<int> callbacks{0};
  std::optional<HostMem> zc;
  zc.emplace(rig->region(), 128 * KiB);
  ASSERT_TRUE(zc->ok());
  auto track = [&](absl::StatusOr<Event> e) {
    ASSERT_TRUE(e.ok()) << e.status();
    e->AddCallback([&](absl::Status) { callbacks.fetch_add(1); });
    events.push_back(*e);
  };
  for (int dev = 0; dev < 2; ++dev) {
    for (int i = 0; i < 9; ++i) {
      const uint64_t n = i < 6 ? 128 * KiB : i < 8 ? 320 * KiB : 128 * KiB;
      host.push_back(RandomBytes(rng, n));
      host.push_back(std::vector<char>(n));
      const char* src = i == 8 ? zc->data() : host[host.size() - 2].data();
      absl::StatusOr<DeviceBuffer> b = engine.Allocate(dev, n);
      ASSERT_TRUE(b.ok());
      buffers.push_back(*b);
      track(engine.TransferToDevice(src, *b, 0, n));
      const Event up = events.back();
      track(engine.TransferFromDevice(*b, 0, host.back().data(), n, {up}));
      if (i == 0 || i == 7) {
        absl::StatusOr<DeviceBuffer> peer = engine.Allocate(1 - dev, n);
        ASSERT_TRUE(peer.ok());
        buffers.push_back(*peer);
        track(engine.TransferDeviceToDevice(*b, 0, *peer, 0, n, {up}));
      }
      if (i == 3) track(engine.Deallocate(*b, {events.back()}));
    }
  }
  const int total = static_cast<int>(events.size());
  engine.Shutdown();
  int ok = 0, cancelled = 0;
  for (size_t i = 0; i < events.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("event ", i));
    ASSERT_TRUE(events[i].IsReady()) << "not ready after Shutdown returned";
    const absl::Status s = events[i].Await();
    if (s.ok()) {
      ++ok;
    } else {
      EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
      ++cancelled;
    }
  }
  EXPECT_EQ(ok + cancelled, total);
  EXPECT_GT(cancelled, 0) << "everything finished before Shutdown?";
  EXPECT_EQ(callbacks.load(), total) << "Shutdown left callbacks unrun";

  // Everything after Shutdown is FAILED_PRECONDITION.
  std::vector<char> tmp(16);
  const auto kFailedPrecondition = absl::StatusCode::kFailedPrecondition;
  EXPECT_EQ(engine.Allocate(0, 64).status().code(), kFailedPrecondition);
  EXPECT_EQ(
      engine.TransferToDevice(tmp.data(), buffers[0], 0, 16).status().code(),
      kFailedPrecondition);
  EXPECT_EQ(
      engine.TransferFromDevice(buffers[0], 0, tmp.data(), 16).status().code(),
      kFailedPrecondition);
  EXPECT_EQ(engine.TransferDeviceToDevice(buffers[0], 0, buffers[1], 0, 16)
                .status()
                .code(),
            kFailedPrecondition);
  EXPECT_EQ(engine.Deallocate(buffers[0]).status().code(), kFailedPrecondition);
  engine.Shutdown();  // idempotent

  const TransferEngine::Stats s = engine.GetStats();
  ExpectQueuesReconcile(s);
  uint64_t queue_cancelled = 0;
  for (const auto& q : s.queues) {
    EXPECT_EQ(q.failed, 0u);
    queue_cancelled += q.cancelled;
  }
  EXPECT_GT(queue_cancelled, 0u);
  EXPECT_EQ(s.device_buffers_live, 0u);
  EXPECT_EQ(s.pinned_bytes_now, 0u);
  EXPECT_EQ(s.staging_bytes_in_flight, 0u);
  zc.reset();
  EXPECT_EQ(rig->TearDownAndReport(), "");
}

// ---- 15. Zero-byte transfers -----------------------------------------------

TEST(TransferEngineTest, ZeroByteTransfersCompleteOkWithoutDescriptors) {
  for (uint64_t region_bytes : {uint64_t{4} * MiB, uint64_t{0}}) {
    SCOPED_TRACE(absl::StrCat("region_bytes=", region_bytes));
    auto rig = MakeRig({.region_bytes = region_bytes,
                        .device_url = "sim://?devices=2&hbm=16M"});
    ASSERT_NE(rig, nullptr);
    TransferEngine& engine = rig->engine();
    absl::StatusOr<DeviceBuffer> a = engine.Allocate(0, 256);
    absl::StatusOr<DeviceBuffer> b = engine.Allocate(1, 256);
    ASSERT_TRUE(a.ok() && b.ok());
    std::vector<char> heap(16, 7);
    std::optional<HostMem> in_region;
    if (rig->region() != nullptr) in_region.emplace(rig->region(), 16);
    std::vector<Event> events;
    auto add = [&](absl::StatusOr<Event> e) {
      ASSERT_TRUE(e.ok()) << e.status();
      events.push_back(*e);
    };
    for (uint64_t off : {uint64_t{0}, uint64_t{100}, uint64_t{256}}) {
      add(engine.TransferToDevice(heap.data(), *a, off, 0));
      add(engine.TransferFromDevice(*a, off, heap.data(), 0));
      add(engine.TransferToDevice(nullptr, *a, off, 0));
      add(engine.TransferFromDevice(*a, off, nullptr, 0));
      if (in_region) {
        add(engine.TransferToDevice(in_region->data(), *a, off, 0));
        add(engine.TransferFromDevice(*a, off, in_region->data(), 0));
      }
      add(engine.TransferDeviceToDevice(*a, off, *b, 256 - off, 0));
      add(engine.TransferDeviceToDevice(*a, off, *a, 0, 0));
      // With a dependency, too.
      add(engine.TransferFromDevice(*b, off, heap.data(), 0, {events.back()}));
    }
    for (const Event& e : events) EXPECT_TRUE(Wait(e).ok());
    EXPECT_EQ(heap, std::vector<char>(16, 7));
    const TransferEngine::Stats s = engine.GetStats();
    uint64_t descriptors = 0, completed = 0;
    for (const auto& q : s.queues) {
      descriptors += q.descriptors;
      completed += q.completed;
    }
    EXPECT_EQ(descriptors, 0u);
    EXPECT_EQ(completed, events.size());
    EXPECT_EQ(s.pinned_bytes_now, 0u);
    Free(engine, *a);
    Free(engine, *b);
    in_region.reset();
    ExpectQueuesReconcile(engine.GetStats());
    EXPECT_EQ(rig->TearDownAndReport(), "");
  }
}

// ---- More shutdown, pinning and configuration ------------------------------

TEST(TransferEngineTest, ShutdownCancelsTransfersWaitingForStagingRoom) {
  TransferEngine::Config config;
  config.staging_wait = absl::Seconds(60);  // they would wait a minute
  auto rig = MakeRig({.region_bytes = 1 * MiB, .engine = config});
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  void* hog = FillRegion(*rig->region());
  ASSERT_NE(hog, nullptr);
  std::vector<char> src(10 * KiB, 1), dst(10 * KiB, 0);
  absl::StatusOr<DeviceBuffer> b = engine.Allocate(0, src.size());
  ASSERT_TRUE(b.ok());
  absl::StatusOr<Event> up =
      engine.TransferToDevice(src.data(), *b, 0, src.size());
  absl::StatusOr<Event> down =
      engine.TransferFromDevice(*b, 0, dst.data(), dst.size());
  absl::StatusOr<Event> up2 =
      engine.TransferToDevice(src.data(), *b, 0, src.size());
  ASSERT_TRUE(up.ok() && down.ok() && up2.ok());
  absl::SleepFor(absl::Milliseconds(10));
  EXPECT_FALSE(up->IsReady());
  const absl::Time start = absl::Now();
  engine.Shutdown();
  EXPECT_LT(absl::Now() - start, absl::Seconds(30))
      << "Shutdown waited out the staging wait";
  for (const Event& e : {*up, *down, *up2}) {
    ASSERT_TRUE(e.IsReady());
    EXPECT_EQ(e.Await().code(), absl::StatusCode::kCancelled) << e.Await();
  }
  EXPECT_EQ(dst, std::vector<char>(dst.size(), 0));
  const TransferEngine::Stats s = engine.GetStats();
  EXPECT_EQ(s.pinned_staging_timeout, 0u);
  ExpectQueuesReconcile(s);
  EXPECT_TRUE(rig->region()->allocator().Free(hog).ok());
  EXPECT_EQ(rig->TearDownAndReport(), "");
}

TEST(TransferEngineTest, OverlappingPinnedTransfersPinEachPageOnce) {
  // Two concurrent pinned uploads from overlapping parts of one host
  // buffer (1 Gbit/s: ~25 ms each): the shared pages are pinned once, and
  // released only when both are done.
  auto rig =
      MakeRig({.region_bytes = 0, .device_url = "sim://?hbm=32M&link_gbps=1"});
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  std::mt19937_64 rng(9);
  const std::vector<char> src = RandomBytes(rng, 4 * MiB);
  const uint64_t off2 = 1 * MiB + 100;
  const uint64_t n1 = 3 * MiB, n2 = src.size() - off2;
  absl::StatusOr<DeviceBuffer> a = engine.Allocate(0, n1);
  absl::StatusOr<DeviceBuffer> b = engine.Allocate(0, n2);
  ASSERT_TRUE(a.ok() && b.ok());
  absl::StatusOr<Event> e1 = engine.TransferToDevice(src.data(), *a, 0, n1);
  absl::StatusOr<Event> e2 =
      engine.TransferToDevice(src.data() + off2, *b, 0, n2);
  ASSERT_TRUE(e1.ok() && e2.ok());
  const uintptr_t begin = reinterpret_cast<uintptr_t>(src.data());
  const uint64_t union_pages =
      ((begin + src.size() + 4095) & ~uintptr_t{4095}) -
      (begin & ~uintptr_t{4095});
  uint64_t peak = 0;
  while (!e1->IsReady() || !e2->IsReady()) {
    const uint64_t now = engine.GetStats().pinned_bytes_now;
    peak = std::max(peak, now);
    EXPECT_LE(now, union_pages) << "a page pinned twice";
    EXPECT_LE(rig->os().pinned_bytes(), union_pages);
    absl::SleepFor(absl::Microseconds(300));
  }
  EXPECT_GT(peak, 0u);
  EXPECT_TRUE(Wait(*e1).ok());
  EXPECT_TRUE(Wait(*e2).ok());
  EXPECT_EQ(DownloadHash(engine, *a, 0, n1), Hash(src.data(), n1));
  EXPECT_EQ(DownloadHash(engine, *b, 0, n2), Hash(src.data() + off2, n2));
  EXPECT_EQ(engine.GetStats().pinned_bytes_now, 0u);
  EXPECT_EQ(rig->os().pinned_bytes(), 0u);
  EXPECT_EQ(rig->TearDownAndReport(), "");
}

TEST(TransferEngineTest, ShutdownRacingSubmittersLeavesEveryEventReady) {
  for (int round = 0; round < 8; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    auto rig = MakeRig({.region_bytes = 2 * MiB,
                        .threshold = 64 * KiB,
                        .device_url = "sim://?devices=2&hbm=32M"});
    ASSERT_NE(rig, nullptr);
    TransferEngine& engine = rig->engine();
    std::atomic<bool> stop{false};
    std::mutex mu;
    std::vector<Event> events;
    std::vector<std::thread> threads;
    // The host buffers outlive Shutdown: a thread that stops on
    // FAILED_PRECONDITION (or after a CANCELLED download) may leave its
    // upload in flight, reading `src`, until Shutdown has finished it.
    std::vector<std::vector<char>> srcs(4, std::vector<char>(100 * KiB, 1));
    std::vector<std::vector<char>> dsts(4, std::vector<char>(100 * KiB));
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        std::vector<char>& src = srcs[t];
        std::vector<char>& dst = dsts[t];
        std::mt19937_64 rng(round * 10 + t);
        // Every call either works or, once shut down, is
        // FAILED_PRECONDITION.
        auto accepted = [](const absl::Status& s) {
          EXPECT_TRUE(s.ok() || absl::IsFailedPrecondition(s)) << s;
          return s.ok();
        };
        while (!stop.load()) {
          const uint64_t n = 1 + rng() % (100 * KiB);  // staged and pinned
          absl::StatusOr<DeviceBuffer> b = engine.Allocate(t % 2, n);
          if (!accepted(b.status())) break;
          absl::StatusOr<Event> up =
              engine.TransferToDevice(src.data(), *b, 0, n);
          if (!accepted(up.status())) break;
          absl::StatusOr<Event> down =
              engine.TransferFromDevice(*b, 0, dst.data(), n, {*up});
          if (!accepted(down.status())) break;
          absl::StatusOr<Event> freed = engine.Deallocate(*b, {*down});
          {
            std::lock_guard<std::mutex> lock(mu);
            events.push_back(*up);
            events.push_back(*down);
            if (freed.ok()) events.push_back(*freed);
          }
          if (!accepted(freed.status())) break;
          (void)Wait(*down);
        }
      });
    }
    absl::SleepFor(absl::Milliseconds(2 + 2 * round));
    engine.Shutdown();
    stop = true;
    for (std::thread& th : threads) th.join();
    for (const Event& e : events) {
      ASSERT_TRUE(e.IsReady());
      const absl::Status s = e.Await();
      EXPECT_TRUE(s.ok() || absl::IsCancelled(s)) << s;
    }
    ExpectQueuesReconcile(engine.GetStats());
    EXPECT_EQ(rig->TearDownAndReport(), "");
    if (testing::Test::HasFailure()) return;
  }
}

TEST(TransferEngineTest, InvalidConfigIsRejectedAtCreation) {
  for (const auto& [name, config] :
       std::vector<std::pair<std::string, TransferEngine::Config>>{
           {"chunk_bytes=0", {.chunk_bytes = 0}},
           {"staging_depth=0", {.staging_depth = 0}},
           {"staging_depth=65", {.staging_depth = 65}},
           {"max_staging_bytes below a chunk",
            {.chunk_bytes = 1 * MiB, .max_staging_bytes = 4096}}}) {
    SCOPED_TRACE(name);
    absl::StatusOr<std::unique_ptr<TransferRig>> rig =
        TransferRig::Create({.region_bytes = 4 * MiB, .engine = config});
    ASSERT_FALSE(rig.ok());
    EXPECT_EQ(rig.status().code(), absl::StatusCode::kInvalidArgument)
        << rig.status();
  }
}

// Calling Shutdown from an event callback: Shutdown drains the callback
// executor, which must not wait for the very callback it is called from.
// On failure the rig is leaked so that the process does not hang in its
// destructor.
TEST(TransferEngineTest, ShutdownFromACallbackDoesNotDeadlock) {
  auto rig = MakeRig({.region_bytes = 1 * MiB,
                      .device_url = "sim://?hbm=16M&latency_us=5000"});
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  std::vector<char> src(4096, 1);
  absl::StatusOr<DeviceBuffer> b = engine.Allocate(0, src.size());
  ASSERT_TRUE(b.ok());
  absl::StatusOr<Event> e =
      engine.TransferToDevice(src.data(), *b, 0, src.size());
  ASSERT_TRUE(e.ok());
  auto done = std::make_shared<Notification>();
  e->AddCallback([&engine, done](absl::Status) {
    engine.Shutdown();
    done->Notify();
  });
  if (!done->WaitForNotificationWithTimeout(absl::Seconds(5))) {
    (void)rig.release();  // stuck in Shutdown: do not join it
    FAIL() << "Shutdown called from a callback did not return";
  }
  EXPECT_EQ(rig->TearDownAndReport(), "");
}

}  // namespace
}  // namespace tpushim
