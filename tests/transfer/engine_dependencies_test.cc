// TransferEngine behaviour (transfer/transfer_engine.h, docs/transfers.md):
// dependencies across queues and devices, a queue that no waiting
// operation holds up and that starts ready ones in order, failed
// dependencies, callbacks and AwaitWithTimeout.
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

// ---- Dependencies and ordering ---------------------------------------------

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

// ---- Failed dependencies ---------------------------------------------------

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

// ---- Callbacks -------------------------------------------------------------

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

// ---- AwaitWithTimeout ------------------------------------------------------

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

}  // namespace
}  // namespace tpushim::engine_test
