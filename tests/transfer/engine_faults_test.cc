// TransferEngine behaviour (transfer/transfer_engine.h, docs/transfers.md):
// device memory exhaustion, an injected DMA fault at every descriptor,
// and pin faults: each fails its transfer and leaves nothing behind.
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

// ---- Device memory ---------------------------------------------------------

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

// ---- Injected DMA faults at every descriptor -------------------------------

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

// ---- Pin faults ------------------------------------------------------------

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

}  // namespace
}  // namespace tpushim::engine_test
