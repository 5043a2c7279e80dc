// TransferEngine behaviour (transfer/transfer_engine.h, docs/transfers.md):
// data integrity on every path (zero-copy, staged, pinned, the region
// off, unaligned addresses, ring overflow, VLOG of the path) and many
// submitters at once.
//
// Random sizes and contents come from a seeded std::mt19937_64; the seed is
// printed with every failure and can be forced with TPUSHIM_TEST_SEED=<n>.
// Timing is never asserted as performance: a link model
// (`link_gbps`/`latency_us`) makes a transfer slow where a test needs an
// operation still pending, and every wait has a generous bound that only
// detects hangs. Shared helpers: engine_test_util.h.

#include "tests/transfer/engine_test_util.h"

namespace tpushim::engine_test {
namespace {

// ---- Integrity on every path -----------------------------------------------

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

// ---- Concurrency -----------------------------------------------------------

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

}  // namespace
}  // namespace tpushim::engine_test
