// The pinned path in pieces: a transfer that pins the caller's memory pins,
// registers, moves and unpins it piece by piece, with the pinned bytes
// bounded, pinning the next piece while the device moves this one — and
// stays correct for buffers that do not start on a page, and when pinning
// fails part-way.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/mutex.h"
#include "device/devices.h"
#include "env/fault_injection.h"
#include "env/options.h"
#include "env/os.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/temp_dir.h"
#include "transfer/transfer_engine.h"

namespace tpushim {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kMiB = uint64_t{1} << 20;

// Keeps the pinned bytes over time: now, the most at once, and when each
// pin started.
class PinWatchingOs : public OsWrapper {
 public:
  explicit PinWatchingOs(Os* target) : OsWrapper(target) {}
  absl::Status PinRange(const void* addr, size_t length) override {
    const int64_t now = MonotonicNanos();
    absl::Status s = OsWrapper::PinRange(addr, length);
    MutexLock lock(&mu_);
    pin_starts_ns_.push_back(now);
    if (s.ok()) {
      now_ += length;
      most_ = std::max(most_, now_);
    }
    return s;
  }
  absl::Status UnpinRange(const void* addr, size_t length) override {
    absl::Status s = OsWrapper::UnpinRange(addr, length);
    MutexLock lock(&mu_);
    now_ -= length;
    return s;
  }
  uint64_t now() const {
    MutexLock lock(&mu_);
    return now_;
  }
  uint64_t most() const {
    MutexLock lock(&mu_);
    return most_;
  }
  std::vector<int64_t> pin_starts_ns() const {
    MutexLock lock(&mu_);
    return pin_starts_ns_;
  }

 private:
  mutable Mutex mu_;
  uint64_t now_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t most_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<int64_t> pin_starts_ns_ ABSL_GUARDED_BY(mu_);
};

// No region (every transfer pinned), simulated devices, an engine; every
// OS call through a FaultInjectingOs (faults from `faults`) and the
// PinWatchingOs.
struct Rig {
  explicit Rig(const std::string& url, TransferEngine::Config config,
               const std::string& faults = "") {
    absl::StatusOr<FaultSpec> spec = ParseFaultSpec(faults);
    EXPECT_TRUE(spec.ok()) << spec.status();
    injector = std::make_unique<FaultInjector>(*spec);
    fos = std::make_unique<FaultInjectingOs>(&env_os, injector.get());
    os = std::make_unique<PinWatchingOs>(fos.get());
    absl::StatusOr<DeviceUrl> parsed = ParseDeviceUrl(url);
    EXPECT_TRUE(parsed.ok()) << parsed.status();
    auto d = OpenDevices(*parsed, os.get(), injector.get());
    EXPECT_TRUE(d.ok()) << d.status();
    devices = *std::move(d);
    std::vector<Device*> raw;
    for (auto& dev : devices) raw.push_back(dev.get());
    auto e = TransferEngine::Create(raw, nullptr, os.get(), std::move(config));
    EXPECT_TRUE(e.ok()) << e.status();
    engine = *std::move(e);
  }
  ~Rig() {
    engine.reset();
    devices.clear();
  }
  FixedEnvironmentOs env_os{Os::Default()};
  std::unique_ptr<FaultInjector> injector;
  std::unique_ptr<FaultInjectingOs> fos;
  std::unique_ptr<PinWatchingOs> os;
  std::vector<std::unique_ptr<Device>> devices;
  std::unique_ptr<TransferEngine> engine;
};

std::vector<char> Pattern(size_t n, int seed) {
  std::vector<char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<char>(i * 131 + seed);
  return v;
}

TransferEngine::Config Pieces(uint64_t piece, uint64_t in_flight) {
  TransferEngine::Config config;
  config.pinned_piece_bytes = piece;
  config.pinned_in_flight_bytes = in_flight;
  return config;
}

TEST(PinnedPipelineTest, UnalignedBuffersRoundTripWithPinnedBytesBounded) {
  Rig rig("sim://?hbm=64M", Pieces(1 * kMiB, 3 * kMiB));
  TransferEngine& engine = *rig.engine;
  const uint64_t page = Os::Default()->PageSize();
  for (uint64_t misalign : {uint64_t{0}, uint64_t{1}, page - 3}) {
    const uint64_t n = 16 * kMiB + 123;
    std::vector<char> src_storage = Pattern(n + 2 * page, 3);
    std::vector<char> dst_storage(n + 2 * page, 0);
    // Both buffers start `misalign` bytes past a page boundary.
    auto at = [&](std::vector<char>& v) {
      const uintptr_t p = reinterpret_cast<uintptr_t>(v.data());
      return v.data() + ((page - p % page) % page) + misalign;
    };
    char* src = at(src_storage);
    char* dst = at(dst_storage);
    ASSERT_EQ(engine.PathFor(src, n), TransferPath::kPinned);
    auto buffer = engine.Allocate(0, n);
    ASSERT_TRUE(buffer.ok()) << buffer.status();
    auto up = engine.TransferToDevice(src, *buffer, 0, n);
    ASSERT_TRUE(up.ok()) << up.status();
    auto down = engine.TransferFromDevice(*buffer, 0, dst, n, {*up});
    ASSERT_TRUE(down.ok()) << down.status();
    ASSERT_TRUE(down->Await().ok()) << down->Await();
    EXPECT_EQ(std::memcmp(src, dst, n), 0) << "misaligned by " << misalign;
    // Each event was ready only once its pieces were unpinned.
    EXPECT_EQ(rig.os->now(), 0u);
    EXPECT_EQ(engine.GetStats().pinned_bytes_now, 0u);
    auto freed = engine.Deallocate(*buffer);
    ASSERT_TRUE(freed.ok() && freed->Await().ok());
  }
  // At most three pieces at once, each pinned as its page hull.
  EXPECT_LE(rig.os->most(), 3 * kMiB + 2 * page);
  EXPECT_GE(rig.os->most(), 1 * kMiB);
  EXPECT_EQ(rig.fos->pinned_bytes(), 0u);
}

TEST(PinnedPipelineTest, TheNextPieceIsPinnedWhileTheDeviceMovesThisOne) {
  // A 1 Gbit/s link: each 1 MiB piece's DMA takes about 8 ms, far longer
  // than pinning it.
  testutil::TempDir dir;
  TransferEngine::Config config = Pieces(1 * kMiB, 4 * kMiB);
  config.trace_file = dir.Join("trace.json");
  const uint64_t n = 8 * kMiB;
  std::vector<char> src = Pattern(n, 5);
  int64_t first_piece_end_ns = 0;
  std::vector<int64_t> pins;
  {
    Rig rig("sim://?hbm=64M&link_gbps=1", config);
    auto buffer = rig.engine->Allocate(0, n);
    ASSERT_TRUE(buffer.ok());
    auto up = rig.engine->TransferToDevice(src.data(), *buffer, 0, n);
    ASSERT_TRUE(up.ok() && up->Await().ok());
    pins = rig.os->pin_starts_ns();
    rig.engine->Shutdown();  // writes the trace
    // The trace's times are microseconds since the engine's start; its
    // origin is not exported, so compare durations: the end of the first
    // piece's DMA, relative to the start of its first descriptor.
    nlohmann::json root = nlohmann::json::parse(
        testutil::ReadFileOrEmpty(config.trace_file), nullptr, false);
    ASSERT_TRUE(root.is_object());
    double first_start = -1, first_end = -1;
    for (auto& e : root["traceEvents"]) {
      if (e["ph"] != "X" || e["name"] == "submit") continue;
      const uint64_t chunk = e["args"]["chunk"];
      const double start = e["ts"], end = start + e["dur"].get<double>();
      if (chunk == 0) first_start = start;
      if (chunk == 1) first_end = end;  // 512 KiB descriptors: 2 a piece
    }
    ASSERT_GE(first_start, 0);
    ASSERT_GE(first_end, first_start);
    first_piece_end_ns =
        static_cast<int64_t>((first_end - first_start) * 1000.0);
  }
  ASSERT_GE(pins.size(), 2u);
  // The second piece's pin began before the first piece's DMA was done
  // (measured from the first pin, which came just before that DMA).
  EXPECT_LT(pins[1] - pins[0], first_piece_end_ns);
}

TEST(PinnedPipelineTest, PinFailingPartWayFailsTheTransferAndLeavesNothing) {
  // The third piece's pin fails (after two pieces were pinned and moving).
  Rig rig("sim://?hbm=64M", Pieces(1 * kMiB, 2 * kMiB), "pin:nth=3");
  TransferEngine& engine = *rig.engine;
  const uint64_t n = 8 * kMiB;
  std::vector<char> src = Pattern(n, 7), dst(n, 0);
  auto buffer = engine.Allocate(0, n);
  ASSERT_TRUE(buffer.ok());
  auto up = engine.TransferToDevice(src.data(), *buffer, 0, n);
  ASSERT_TRUE(up.ok());
  const absl::Status s = up->Await();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(s.message(), HasSubstr("Pinning 8.00M of caller memory"));
  EXPECT_THAT(s.message(), HasSubstr("[injected: pin:nth=3]"));
  EXPECT_EQ(rig.os->now(), 0u);
  EXPECT_EQ(rig.fos->pinned_bytes(), 0u);
  EXPECT_EQ(engine.GetStats().pinned_bytes_now, 0u);
  // The engine goes on: the next transfers work.
  auto again = engine.TransferToDevice(src.data(), *buffer, 0, n);
  ASSERT_TRUE(again.ok());
  auto down = engine.TransferFromDevice(*buffer, 0, dst.data(), n, {*again});
  ASSERT_TRUE(down.ok() && down->Await().ok());
  EXPECT_EQ(src, dst);
  EXPECT_EQ(rig.fos->pinned_bytes(), 0u);
}

}  // namespace
}  // namespace tpushim
