// TransferEngine behaviour (transfer/transfer_engine.h, docs/transfers.md):
// deallocation, argument checks, shutdown with work in flight (and
// from a callback, and racing submitters), zero-byte transfers,
// overlapping pins and the engine's configuration.
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

// ---- Deallocation and argument checks --------------------------------------

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

// ---- Shutdown --------------------------------------------------------------

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

// ---- Zero-byte transfers ---------------------------------------------------

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
}  // namespace tpushim::engine_test
