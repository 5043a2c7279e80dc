// TransferEngine behaviour (transfer/transfer_engine.h, docs/transfers.md):
// staging backpressure, the pinned fallback when no staging room frees
// up in time (and its rate-limited WARNING), and the host buffer
// semantics.
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

// ---- Staging backpressure --------------------------------------------------

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

// ---- Staging timeout → pinned fallback -------------------------------------

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

// ---- Host buffer semantics -------------------------------------------------

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

}  // namespace
}  // namespace tpushim::engine_test
