// Operations on one device buffer run in the order they were issued, with
// no `wait_for`: a read waits for the writes issued before it, a write for
// the reads and writes issued before it, on every path (staged, bounce,
// pinned, zero-copy, registered, relayout, chunked, device to device,
// polled small transfers), on sim:// and on the NVMe engine over a fake
// controller. And a queue never holds operations up behind one still
// waiting for its dependencies: the deadlocks the old strict queue order
// had, with events that covered writes not yet queued, as tests that fail
// (time out) rather than hang.
//
// The held operations wait for a caller event (a "gate") the test sets
// later, so what runs before what is decided, not raced: without the
// ordering, a read held behind a gated write would complete at once with
// the old bytes.

#include "transfer/buffer_order.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "device/nvme/nvme_device.h"
#include "env/device_url.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/device/fake_nvme_controller.h"
#include "tests/device/fake_vfio_os.h"
#include "tests/testing/transfer_rig.h"
#include "transfer/event.h"
#include "transfer/transfer_engine.h"

namespace tpushim {
namespace {

using testutil::TransferRig;
using transfer_internal::BufferOrder;
using transfer_internal::EventState;

constexpr uint64_t kKiB = uint64_t{1} << 10;
constexpr uint64_t kMiB = uint64_t{1} << 20;
// Long enough for any transfer here on a loaded 2-core machine; a test
// that reaches it has hung.
constexpr absl::Duration kHang = absl::Seconds(60);
// How long a held operation is watched for running too early.
constexpr absl::Duration kHeld = absl::Milliseconds(30);

// ---- BufferOrder on its own ------------------------------------------------

std::shared_ptr<EventState> Pending() {
  return std::make_shared<EventState>(nullptr);
}

std::vector<EventState*> Events(const std::vector<BufferOrder::Wait>& waits) {
  std::vector<EventState*> out;
  for (const BufferOrder::Wait& w : waits) out.push_back(w.event.get());
  return out;
}

TEST(BufferOrderTest, AReadWaitsForEarlierWritesOfItsBytesOnly) {
  BufferOrder order;
  auto w1 = Pending(), w2 = Pending(), r = Pending();
  std::vector<BufferOrder::Wait> after;
  order.Conflicts({0, 100}, BufferOrder::Access::kWrite, &after);
  EXPECT_TRUE(after.empty());
  order.Record({0, 100}, BufferOrder::Access::kWrite, w1, 7);
  order.Conflicts({200, 300}, BufferOrder::Access::kWrite, &after);
  order.Record({200, 300}, BufferOrder::Access::kWrite, w2, 8);
  EXPECT_TRUE(after.empty()) << "disjoint writes do not wait for each other";
  order.Conflicts({50, 250}, BufferOrder::Access::kRead, &after);
  EXPECT_THAT(Events(after),
              ::testing::UnorderedElementsAre(w1.get(), w2.get()));
  ASSERT_EQ(after.size(), 2u);
  EXPECT_TRUE(after[0].tag == 7 || after[0].tag == 8);
  order.Record({50, 250}, BufferOrder::Access::kRead, r, 9);
  after.clear();
  order.Conflicts({0, 10}, BufferOrder::Access::kRead, &after);
  EXPECT_THAT(Events(after), ::testing::ElementsAre(w1.get()))
      << "reads do not wait for reads";
  after.clear();
  order.Conflicts({100, 200}, BufferOrder::Access::kRead, &after);
  EXPECT_TRUE(after.empty()) << "nothing wrote [100, 200)";
  after.clear();
  order.Conflicts({100, 200}, BufferOrder::Access::kWrite, &after);
  EXPECT_THAT(Events(after), ::testing::ElementsAre(r.get()))
      << "a write waits for the reads of its bytes";
  // Finished accesses are forgotten.
  w1->Resolve(absl::OkStatus());
  after.clear();
  order.Conflicts({0, 10}, BufferOrder::Access::kRead, &after);
  EXPECT_TRUE(after.empty());
  EXPECT_EQ(order.size(), 2u);
}

TEST(BufferOrderTest, AWriteCoveringEarlierAccessesStandsForThem) {
  BufferOrder order;
  auto w1 = Pending(), r1 = Pending(), w2 = Pending();
  std::vector<BufferOrder::Wait> after;
  order.Record({0, 64}, BufferOrder::Access::kWrite, w1, -1);
  order.Conflicts({16, 32}, BufferOrder::Access::kRead, &after);
  order.Record({16, 32}, BufferOrder::Access::kRead, r1, -1);
  after.clear();
  order.Conflicts({0, 64}, BufferOrder::Access::kWrite, &after);
  EXPECT_THAT(Events(after),
              ::testing::UnorderedElementsAre(w1.get(), r1.get()));
  order.Record({0, 64}, BufferOrder::Access::kWrite, w2, -1);
  // Later accesses wait for w2 alone, which waits for the rest ...
  after.clear();
  order.Conflicts({0, 64}, BufferOrder::Access::kWrite, &after);
  EXPECT_THAT(Events(after), ::testing::ElementsAre(w2.get()));
  // ... but the buffer's readiness is every write not ready.
  EXPECT_THAT(order.PendingWrites(), ::testing::UnorderedElementsAre(w1, w2));
}

TEST(BufferOrderTest, TheFirstFailedWriteStaysAndReadsNeverFailIt) {
  BufferOrder order;
  auto w = Pending(), r = Pending(), w2 = Pending();
  order.Record({0, 8}, BufferOrder::Access::kWrite, w, -1);
  order.Record({8, 16}, BufferOrder::Access::kRead, r, -1);
  r->Resolve(absl::InternalError("a read failed"));
  w->Resolve(absl::DataLossError("the write failed"));
  EXPECT_TRUE(order.PendingWrites().empty());
  EXPECT_EQ(order.failed_write().code(), absl::StatusCode::kDataLoss);
  order.Record({0, 8}, BufferOrder::Access::kWrite, w2, -1);
  w2->Resolve(absl::OkStatus());
  EXPECT_TRUE(order.PendingWrites().empty());
  EXPECT_EQ(order.failed_write().code(), absl::StatusCode::kDataLoss);
}

TEST(BufferOrderTest, AWriteReadyBeforeItsEndIsReadinessNotOrder) {
  // A chunked transfer: aborted (its readiness fails at once) while a
  // chunk still runs (its end is later).
  BufferOrder order;
  auto end = Pending(), ready = Pending();
  order.Record({0, 100}, BufferOrder::Access::kWrite, end, -1, ready);
  ready->Resolve(absl::AbortedError("the producer gave up"));
  EXPECT_TRUE(order.PendingWrites().empty());
  EXPECT_EQ(order.failed_write().code(), absl::StatusCode::kAborted);
  std::vector<BufferOrder::Wait> after;
  order.Conflicts({10, 20}, BufferOrder::Access::kRead, &after);
  EXPECT_THAT(Events(after), ::testing::ElementsAre(end.get()));
  end->Resolve(absl::OkStatus());
  EXPECT_EQ(order.size(), 0u);
}

// ---- Rigs: sim:// and the NVMe engine on a fake controller ---------------

enum class Backend { kSim, kNvme };

std::string BackendName(const ::testing::TestParamInfo<Backend>& info) {
  return info.param == Backend::kSim ? "Sim" : "Nvme";
}

// A rig on one backend. The NVMe device is a fake controller on the fake
// VFIO kernel with an 8 MiB namespace, one queue pair and 512-byte blocks.
class Rig {
 public:
  static std::unique_ptr<Rig> Make(Backend backend,
                                   TransferRig::Params params = {}) {
    auto rig = std::unique_ptr<Rig>(new Rig());
    if (backend == Backend::kNvme) {
      rig->vfio_ =
          std::make_unique<fake_vfio::FakeVfioOs>(fake_vfio::FakeHost{});
      rig->controller_ = std::make_unique<fake_vfio::FakeNvmeController>(
          *rig->vfio_, fake_vfio::FakeNvmeConfig{.blocks = 16384});
      fake_vfio::FakeVfioOs* vfio = rig->vfio_.get();
      params.open_devices =
          [vfio]() -> absl::StatusOr<std::vector<std::unique_ptr<Device>>> {
        absl::StatusOr<DeviceUrl> url =
            ParseDeviceUrl("vfio://0000:01:00.0?engine=nvme");
        if (!url.ok()) return url.status();
        return OpenNvmeDevices(*url, vfio, nullptr);
      };
    }
    absl::StatusOr<std::unique_ptr<TransferRig>> r =
        TransferRig::Create(std::move(params));
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return nullptr;
    rig->rig_ = *std::move(r);
    return rig;
  }
  ~Rig() { rig_.reset(); }  // before the fake controller and kernel

  TransferEngine& engine() { return rig_->engine(); }
  TransferRig& rig() { return *rig_; }

 private:
  Rig() = default;
  std::unique_ptr<fake_vfio::FakeVfioOs> vfio_;
  std::unique_ptr<fake_vfio::FakeNvmeController> controller_;
  std::unique_ptr<TransferRig> rig_;
};

// Page-aligned host bytes (NVMe DMAs 4-byte aligned memory; registration
// wants whole pages).
struct HostBytes {
  explicit HostBytes(uint64_t n)
      : data(static_cast<char*>(
            std::aligned_alloc(4096, (n + 4095) / 4096 * 4096))),
        size(n) {
    std::memset(data, 0, n);
  }
  ~HostBytes() { std::free(data); }
  HostBytes(const HostBytes&) = delete;
  HostBytes& operator=(const HostBytes&) = delete;
  char* data;
  uint64_t size;
};

void Fill(char* p, uint64_t n, int seed) {
  for (uint64_t i = 0; i < n; ++i) {
    p[i] = static_cast<char>((i * 131 + seed * 7 + (i >> 9)) & 0xff);
  }
}

bool Same(const char* a, const char* b, uint64_t n) {
  return std::memcmp(a, b, n) == 0;
}

// The event's status, or DEADLINE_EXCEEDED naming `what` when it hangs.
absl::Status Within(const Event& e, const std::string& what) {
  std::optional<absl::Status> s = e.AwaitWithTimeout(kHang);
  if (!s.has_value()) {
    return absl::DeadlineExceededError(
        absl::StrCat(what, " never completed (hung)"));
  }
  return *s;
}

// Fills `b` with `bytes` and waits.
void Put(TransferEngine& engine, const DeviceBuffer& b, const char* bytes,
         uint64_t n) {
  absl::StatusOr<Event> up = engine.TransferToDevice(bytes, b, 0, n);
  ASSERT_TRUE(up.ok()) << up.status();
  ASSERT_TRUE(Within(*up, "the fill").ok());
}

// Where the host side of a transfer lives, which picks its path.
enum class HostSide {
  kPageableStaged,  // region on, size under the threshold
  kPageableBounce,  // region off: the bounce pool
  kPageablePinned,  // size over the threshold
  kRegion,          // an allocation of the region: zero-copy
  kRegistered,      // registered host memory: zero-copy
};

struct PathCase {
  const char* name;
  Backend backend;
  HostSide side;
  uint64_t bytes;
};

void PrintTo(const PathCase& c, std::ostream* os) { *os << c.name; }
void PrintTo(Backend b, std::ostream* os) {
  *os << (b == Backend::kSim ? "sim://" : "NVMe");
}

std::string PathCaseName(const ::testing::TestParamInfo<PathCase>& info) {
  return info.param.name;
}

// The rig and host memory for one PathCase.
class PathRig {
 public:
  explicit PathRig(const PathCase& c) : case_(c) {
    TransferRig::Params params;
    params.region_bytes = c.side == HostSide::kPageableBounce ? 0 : 16 * kMiB;
    if (c.side == HostSide::kPageablePinned) params.threshold = 4 * kKiB;
    rig_ = Rig::Make(c.backend, params);
  }
  bool ok() const { return rig_ != nullptr; }
  TransferEngine& engine() { return rig_->engine(); }

  // Host memory of `n` bytes on this case's side (kept until the rig).
  char* Host(uint64_t n) {
    switch (case_.side) {
      case HostSide::kRegion: {
        absl::StatusOr<void*> p = rig_->rig().region()->allocator().Allocate(n);
        EXPECT_TRUE(p.ok()) << p.status();
        if (!p.ok()) return nullptr;
        region_.push_back(*p);
        std::memset(*p, 0, n);
        return static_cast<char*>(*p);
      }
      case HostSide::kRegistered: {
        auto bytes = std::make_unique<HostBytes>(n);
        absl::StatusOr<uint64_t> id =
            engine().RegisterHostMemory(bytes->data, (n + 4095) / 4096 * 4096);
        EXPECT_TRUE(id.ok()) << id.status();
        if (id.ok()) registrations_.push_back(*id);
        heap_.push_back(std::move(bytes));
        return heap_.back()->data;
      }
      default:
        heap_.push_back(std::make_unique<HostBytes>(n));
        return heap_.back()->data;
    }
  }

  TransferPath ExpectedPath() const {
    switch (case_.side) {
      case HostSide::kRegion:
      case HostSide::kRegistered:
        return TransferPath::kZeroCopy;
      case HostSide::kPageablePinned:
        return TransferPath::kPinned;
      default:
        return TransferPath::kStaged;
    }
  }

  ~PathRig() {
    if (rig_ == nullptr) return;
    for (uint64_t id : registrations_) {
      EXPECT_TRUE(engine().UnregisterHostMemory(id).ok());
    }
    for (void* p : region_) {
      (void)rig_->rig().region()->allocator().Free(p);
    }
    rig_.reset();
  }

 private:
  PathCase case_;
  std::unique_ptr<Rig> rig_;
  std::vector<std::unique_ptr<HostBytes>> heap_;
  std::vector<void*> region_;
  std::vector<uint64_t> registrations_;
};

class SameBufferPathTest : public ::testing::TestWithParam<PathCase> {};

TEST_P(SameBufferPathTest, AReadIssuedRightAfterAWriteReturnsTheWrite) {
  PathRig rig(GetParam());
  ASSERT_TRUE(rig.ok());
  TransferEngine& engine = rig.engine();
  const uint64_t n = GetParam().bytes;
  char* old_bytes = rig.Host(n);
  char* new_bytes = rig.Host(n);
  char* out = rig.Host(n);
  ASSERT_TRUE(old_bytes && new_bytes && out);
  Fill(old_bytes, n, 1);
  Fill(new_bytes, n, 2);
  EXPECT_EQ(engine.PathFor(new_bytes, n), rig.ExpectedPath());
  absl::StatusOr<DeviceBuffer> b = engine.Allocate(0, n);
  ASSERT_TRUE(b.ok()) << b.status();
  Put(engine, *b, old_bytes, n);

  absl::StatusOr<CallerEvent> gate = engine.CreateEvent();
  ASSERT_TRUE(gate.ok());
  absl::StatusOr<Event> write =
      engine.TransferToDevice(new_bytes, *b, 0, n, {gate->event()});
  ASSERT_TRUE(write.ok()) << write.status();
  absl::StatusOr<Event> read = engine.TransferFromDevice(*b, 0, out, n);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_FALSE(read->AwaitWithTimeout(kHeld).has_value())
      << "the read ran before the write issued ahead of it";
  ASSERT_TRUE(gate->Set(absl::OkStatus()).ok());
  ASSERT_TRUE(Within(*read, "the read").ok());
  EXPECT_TRUE(write->IsReady());
  EXPECT_TRUE(Same(out, new_bytes, n)) << "the read returned stale bytes";
  ASSERT_TRUE(engine.Deallocate(*b).ok());
}

TEST_P(SameBufferPathTest, AWriteIssuedRightAfterAReadWaitsForIt) {
  PathRig rig(GetParam());
  ASSERT_TRUE(rig.ok());
  TransferEngine& engine = rig.engine();
  const uint64_t n = GetParam().bytes;
  char* old_bytes = rig.Host(n);
  char* new_bytes = rig.Host(n);
  char* out = rig.Host(n);
  char* back = rig.Host(n);
  ASSERT_TRUE(old_bytes && new_bytes && out && back);
  Fill(old_bytes, n, 3);
  Fill(new_bytes, n, 4);
  absl::StatusOr<DeviceBuffer> b = engine.Allocate(0, n);
  ASSERT_TRUE(b.ok()) << b.status();
  Put(engine, *b, old_bytes, n);

  absl::StatusOr<CallerEvent> gate = engine.CreateEvent();
  ASSERT_TRUE(gate.ok());
  absl::StatusOr<Event> read =
      engine.TransferFromDevice(*b, 0, out, n, {gate->event()});
  ASSERT_TRUE(read.ok()) << read.status();
  absl::StatusOr<Event> write = engine.TransferToDevice(new_bytes, *b, 0, n);
  ASSERT_TRUE(write.ok()) << write.status();
  EXPECT_FALSE(write->AwaitWithTimeout(kHeld).has_value())
      << "the write ran before the read issued ahead of it";
  ASSERT_TRUE(gate->Set(absl::OkStatus()).ok());
  ASSERT_TRUE(Within(*write, "the write").ok());
  EXPECT_TRUE(read->IsReady());
  EXPECT_TRUE(Same(out, old_bytes, n)) << "the write changed what the read got";
  absl::StatusOr<Event> again = engine.TransferFromDevice(*b, 0, back, n);
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE(Within(*again, "the read back").ok());
  EXPECT_TRUE(Same(back, new_bytes, n));
  ASSERT_TRUE(engine.Deallocate(*b).ok());
}

TEST_P(SameBufferPathTest, WritesOfOneBufferLandInIssueOrder) {
  PathRig rig(GetParam());
  ASSERT_TRUE(rig.ok());
  TransferEngine& engine = rig.engine();
  const uint64_t n = GetParam().bytes;
  char* first = rig.Host(n);
  char* second = rig.Host(n);
  char* out = rig.Host(n);
  ASSERT_TRUE(first && second && out);
  Fill(first, n, 5);
  Fill(second, n, 6);
  absl::StatusOr<DeviceBuffer> b = engine.Allocate(0, n);
  ASSERT_TRUE(b.ok()) << b.status();
  absl::StatusOr<CallerEvent> gate = engine.CreateEvent();
  ASSERT_TRUE(gate.ok());
  // The first write is held; the second, issued after it, must not land
  // first (and be overwritten by it).
  absl::StatusOr<Event> w1 =
      engine.TransferToDevice(first, *b, 0, n, {gate->event()});
  absl::StatusOr<Event> w2 = engine.TransferToDevice(second, *b, 0, n);
  ASSERT_TRUE(w1.ok() && w2.ok());
  EXPECT_FALSE(w2->AwaitWithTimeout(kHeld).has_value());
  ASSERT_TRUE(gate->Set(absl::OkStatus()).ok());
  ASSERT_TRUE(Within(*w2, "the second write").ok());
  absl::StatusOr<Event> read = engine.TransferFromDevice(*b, 0, out, n);
  ASSERT_TRUE(read.ok());
  ASSERT_TRUE(Within(*read, "the read").ok());
  EXPECT_TRUE(Same(out, second, n));
  ASSERT_TRUE(engine.Deallocate(*b).ok());
}

INSTANTIATE_TEST_SUITE_P(
    Paths, SameBufferPathTest,
    ::testing::Values(
        PathCase{"SimStaged", Backend::kSim, HostSide::kPageableStaged,
                 1 * kMiB},
        PathCase{"SimBounce", Backend::kSim, HostSide::kPageableBounce,
                 64 * kKiB},
        PathCase{"SimPinned", Backend::kSim, HostSide::kPageablePinned,
                 64 * kKiB},
        PathCase{"SimZeroCopy", Backend::kSim, HostSide::kRegion, 1 * kMiB},
        PathCase{"SimRegistered", Backend::kSim, HostSide::kRegistered,
                 64 * kKiB},
        PathCase{"SimSmall", Backend::kSim, HostSide::kPageableStaged,
                 4 * kKiB},
        PathCase{"NvmeStaged", Backend::kNvme, HostSide::kPageableStaged,
                 64 * kKiB},
        PathCase{"NvmeBounce", Backend::kNvme, HostSide::kPageableBounce,
                 64 * kKiB},
        PathCase{"NvmePinned", Backend::kNvme, HostSide::kPageablePinned,
                 64 * kKiB},
        PathCase{"NvmeZeroCopy", Backend::kNvme, HostSide::kRegion, 64 * kKiB},
        PathCase{"NvmeRegistered", Backend::kNvme, HostSide::kRegistered,
                 64 * kKiB}),
    PathCaseName);

// ---- Beyond byte transfers: arrays, copies, chunks, small round trips ----

class SameBufferTest : public ::testing::TestWithParam<Backend> {};

TEST_P(SameBufferTest, AnArrayReadAfterAnArrayWriteGetsItLaidOutBack) {
  auto rig = Rig::Make(GetParam());
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  // Tiled: the staging copy lays it out (relayout), both ways.
  absl::StatusOr<DeviceBuffer> b =
      engine.Allocate(0, DeviceBufferSpec{.shape = "f32[64,300]"});
  ASSERT_TRUE(b.ok()) << b.status();
  const uint64_t n = b->host_size();
  HostBytes old_bytes(n), new_bytes(n), out(n);
  Fill(old_bytes.data, n, 7);
  Fill(new_bytes.data, n, 8);
  absl::StatusOr<Event> fill = engine.TransferArrayToDevice(old_bytes.data, *b);
  ASSERT_TRUE(fill.ok());
  ASSERT_TRUE(Within(*fill, "the fill").ok());
  absl::StatusOr<CallerEvent> gate = engine.CreateEvent();
  ASSERT_TRUE(gate.ok());
  absl::StatusOr<Event> write =
      engine.TransferArrayToDevice(new_bytes.data, *b, {gate->event()});
  absl::StatusOr<Event> read = engine.TransferArrayFromDevice(*b, out.data);
  ASSERT_TRUE(write.ok() && read.ok());
  EXPECT_FALSE(read->AwaitWithTimeout(kHeld).has_value());
  ASSERT_TRUE(gate->Set(absl::OkStatus()).ok());
  ASSERT_TRUE(Within(*read, "the array read").ok());
  EXPECT_TRUE(Same(out.data, new_bytes.data, n));
}

TEST_P(SameBufferTest, DeviceToDeviceCopiesTakeTheirPlaceOnBothBuffers) {
  auto rig = Rig::Make(GetParam());
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  const uint64_t n = 64 * kKiB;
  absl::StatusOr<DeviceBuffer> a = engine.Allocate(0, n);
  absl::StatusOr<DeviceBuffer> c = engine.Allocate(0, n);
  ASSERT_TRUE(a.ok() && c.ok());
  HostBytes old_bytes(n), new_bytes(n), out(n), held(n);
  Fill(old_bytes.data, n, 9);
  Fill(new_bytes.data, n, 10);
  Put(engine, *a, old_bytes.data, n);
  Put(engine, *c, old_bytes.data, n);
  absl::StatusOr<CallerEvent> gate = engine.CreateEvent();
  ASSERT_TRUE(gate.ok());
  // A copy out of `a` issued after a held write into `a` copies the write;
  // a read of `c` held before the copy into `c` sees `c` as it was.
  absl::StatusOr<Event> write =
      engine.TransferToDevice(new_bytes.data, *a, 0, n, {gate->event()});
  absl::StatusOr<Event> read_c =
      engine.TransferFromDevice(*c, 0, held.data, n, {gate->event()});
  absl::StatusOr<Event> copy = engine.TransferDeviceToDevice(*a, 0, *c, 0, n);
  ASSERT_TRUE(write.ok() && read_c.ok() && copy.ok());
  EXPECT_FALSE(copy->AwaitWithTimeout(kHeld).has_value());
  ASSERT_TRUE(gate->Set(absl::OkStatus()).ok());
  ASSERT_TRUE(Within(*copy, "the copy").ok());
  ASSERT_TRUE(Within(*read_c, "the held read").ok());
  EXPECT_TRUE(Same(held.data, old_bytes.data, n));
  absl::StatusOr<Event> read = engine.TransferFromDevice(*c, 0, out.data, n);
  ASSERT_TRUE(read.ok());
  ASSERT_TRUE(Within(*read, "the read").ok());
  EXPECT_TRUE(Same(out.data, new_bytes.data, n));
}

TEST_P(SameBufferTest, AReadAfterBeginWaitsForEveryChunkGivenLater) {
  auto rig = Rig::Make(GetParam());
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  const uint64_t n = 64 * kKiB;
  absl::StatusOr<DeviceBuffer> b = engine.Allocate(0, n);
  ASSERT_TRUE(b.ok());
  HostBytes old_bytes(n), new_bytes(n), out(n), before(n);
  Fill(old_bytes.data, n, 11);
  Fill(new_bytes.data, n, 12);
  Put(engine, *b, old_bytes.data, n);
  // A read held from before the chunked transfer began: its chunks wait
  // for it; a read issued after the begin waits for all of them.
  absl::StatusOr<CallerEvent> gate = engine.CreateEvent();
  ASSERT_TRUE(gate.ok());
  absl::StatusOr<Event> earlier =
      engine.TransferFromDevice(*b, 0, before.data, n, {gate->event()});
  ASSERT_TRUE(earlier.ok());
  ASSERT_TRUE(engine.BeginChunkedTransfer(*b).ok());
  absl::StatusOr<Event> read = engine.TransferFromDevice(*b, 0, out.data, n);
  ASSERT_TRUE(read.ok());
  absl::StatusOr<TransferEvents> c1 = engine.TransferChunk(
      new_bytes.data + n / 2, *b, n / 2, n / 2, /*is_last=*/false);
  ASSERT_TRUE(c1.ok()) << c1.status();
  EXPECT_FALSE(c1->ready.AwaitWithTimeout(kHeld).has_value())
      << "a chunk ran before a read issued ahead of its transfer";
  ASSERT_TRUE(gate->Set(absl::OkStatus()).ok());
  ASSERT_TRUE(Within(c1->ready, "the first chunk").ok());
  EXPECT_FALSE(read->AwaitWithTimeout(kHeld).has_value())
      << "the read ran before the chunked transfer's last chunk";
  absl::StatusOr<TransferEvents> c0 =
      engine.TransferChunk(new_bytes.data, *b, 0, n / 2, /*is_last=*/true);
  ASSERT_TRUE(c0.ok()) << c0.status();
  ASSERT_TRUE(Within(*read, "the read").ok());
  EXPECT_TRUE(Same(before.data, old_bytes.data, n));
  EXPECT_TRUE(Same(out.data, new_bytes.data, n));
}

TEST_P(SameBufferTest, SmallRoundTripsWithoutWaitingBetweenAreExact) {
  // PJRT's device_put then np.asarray: no event between the two. The
  // waiter of the read runs the write's descriptor itself where it can.
  auto rig = Rig::Make(GetParam());
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  const uint64_t n = 4 * kKiB;
  absl::StatusOr<DeviceBuffer> b = engine.Allocate(0, n);
  ASSERT_TRUE(b.ok());
  HostBytes src(n), out(n);
  for (int round = 0; round < 300; ++round) {
    Fill(src.data, n, round);
    absl::StatusOr<Event> up = engine.TransferToDevice(src.data, *b, 0, n);
    absl::StatusOr<Event> down = engine.TransferFromDevice(*b, 0, out.data, n);
    ASSERT_TRUE(up.ok() && down.ok());
    ASSERT_TRUE(Within(*down, "the read").ok());
    ASSERT_TRUE(Same(out.data, src.data, n)) << "round " << round;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, SameBufferTest,
                         ::testing::Values(Backend::kSim, Backend::kNvme),
                         BackendName);

// ---- No operation waiting for a dependency holds a queue up ----------------

class QueueOrderTest : public ::testing::TestWithParam<Backend> {};

TEST_P(QueueOrderTest, AnOperationWaitingForAnEventHoldsUpNothingBehindIt) {
  auto rig = Rig::Make(GetParam());
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  const uint64_t n = 4 * kKiB;
  absl::StatusOr<DeviceBuffer> a = engine.Allocate(0, n);
  absl::StatusOr<DeviceBuffer> c = engine.Allocate(0, n);
  ASSERT_TRUE(a.ok() && c.ok());
  HostBytes bytes(n), out_a(n), out_c(n);
  Fill(bytes.data, n, 13);
  Put(engine, *c, bytes.data, n);
  absl::StatusOr<CallerEvent> gate = engine.CreateEvent();
  ASSERT_TRUE(gate.ok());
  // Both directions: an operation held by the gate, then one on another
  // buffer with nothing to wait for, in the same queue.
  absl::StatusOr<Event> held_up =
      engine.TransferToDevice(bytes.data, *a, 0, n, {gate->event()});
  absl::StatusOr<Event> free_up = engine.TransferToDevice(bytes.data, *c, 0, n);
  absl::StatusOr<Event> held_down =
      engine.TransferFromDevice(*a, 0, out_a.data, n, {gate->event()});
  absl::StatusOr<Event> free_down =
      engine.TransferFromDevice(*c, 0, out_c.data, n);
  ASSERT_TRUE(held_up.ok() && free_up.ok() && held_down.ok() && free_down.ok());
  EXPECT_TRUE(Within(*free_up, "the host→device transfer behind").ok());
  EXPECT_TRUE(Within(*free_down, "the device→host transfer behind").ok());
  EXPECT_FALSE(held_up->IsReady());
  EXPECT_FALSE(held_down->IsReady());
  EXPECT_TRUE(Same(out_c.data, bytes.data, n));
  ASSERT_TRUE(gate->Set(absl::OkStatus()).ok());
  EXPECT_TRUE(Within(*held_down, "the held read").ok());
  EXPECT_TRUE(Same(out_a.data, bytes.data, n));
}

TEST_P(QueueOrderTest, ConsumersOfAStreamingBufferNeverBlockItsChunks) {
  // PJRT's async host-to-device pattern, on one thread: a transfer into Y
  // waits for X's ready event while X's chunks are still to come.
  auto rig = Rig::Make(GetParam());
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  const uint64_t n = 4 * kKiB;
  absl::StatusOr<DeviceBuffer> x = engine.Allocate(0, n);
  absl::StatusOr<DeviceBuffer> y = engine.Allocate(0, n);
  ASSERT_TRUE(x.ok() && y.ok());
  HostBytes bytes(n), out(n);
  Fill(bytes.data, n, 14);
  ASSERT_TRUE(engine.BeginChunkedTransfer(*x).ok());
  absl::StatusOr<Event> x_ready = engine.BufferReadyEvent(*x);
  ASSERT_TRUE(x_ready.ok());
  absl::StatusOr<Event> into_y =
      engine.TransferToDevice(bytes.data, *y, 0, n, {*x_ready});
  ASSERT_TRUE(into_y.ok());
  absl::StatusOr<TransferEvents> chunk =
      engine.TransferChunk(bytes.data, *x, 0, n, /*is_last=*/true);
  ASSERT_TRUE(chunk.ok()) << chunk.status();
  EXPECT_TRUE(Within(chunk->ready, "X's only chunk").ok());
  EXPECT_TRUE(Within(*x_ready, "X's ready event").ok());
  EXPECT_TRUE(Within(*into_y, "the transfer into Y").ok());
  absl::StatusOr<Event> read = engine.TransferFromDevice(*y, 0, out.data, n);
  ASSERT_TRUE(read.ok());
  ASSERT_TRUE(Within(*read, "the read of Y").ok());
  EXPECT_TRUE(Same(out.data, bytes.data, n));
}

TEST_P(QueueOrderTest, ThreadsWritingOneBufferBehindItsReadyEventNeverHang) {
  // Each thread writes the buffer after its ready event, the buffer handle
  // shared under a mutex: every write waits for the writes issued before,
  // and an event never covers a write that is not queued.
  auto rig = Rig::Make(GetParam());
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  const uint64_t n = 4 * kKiB;
  absl::StatusOr<DeviceBuffer> made = engine.Allocate(0, n);
  ASSERT_TRUE(made.ok());
  std::mutex mu;
  DeviceBuffer shared = *made;
  constexpr int kThreads = 2;
  constexpr int kRounds = 400;
  std::vector<std::vector<Event>> events(kThreads);
  std::vector<std::unique_ptr<HostBytes>> src;
  for (int t = 0; t < kThreads; ++t) {
    src.push_back(std::make_unique<HostBytes>(n));
    Fill(src.back()->data, n, 15 + t);
  }
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kRounds; ++i) {
        DeviceBuffer b;
        {
          std::lock_guard<std::mutex> lock(mu);
          b = shared;
        }
        absl::StatusOr<Event> ready = engine.BufferReadyEvent(b);
        if (!ready.ok()) {
          ++errors;
          return;
        }
        absl::StatusOr<Event> up =
            engine.TransferToDevice(src[t]->data, b, 0, n, {*ready});
        if (!up.ok()) {
          ++errors;
          return;
        }
        events[t].push_back(*up);
      }
    });
  }
  for (std::thread& th : threads) th.join();
  ASSERT_EQ(errors.load(), 0);
  for (int t = 0; t < kThreads; ++t) {
    for (const Event& e : events[t]) {
      ASSERT_TRUE(Within(e, absl::StrCat("a write of thread ", t)).ok());
    }
  }
  const TransferEngine::Stats stats = engine.GetStats();
  for (const auto& q : stats.queues) EXPECT_EQ(q.pending, 0u);
}

TEST_P(QueueOrderTest, ConcurrentWholeBufferWritesNeverInterleave) {
  // Two threads write the whole buffer at once, many times: one from the
  // host (the host→device queue), one by copying another buffer into it
  // (the device→device queue). One of the two writes is issued first and
  // the other waits for it, so afterwards the buffer holds one of the two
  // contents, never a mix of the descriptors of both (each write is
  // several descriptors, and the two queues run side by side).
  TransferRig::Params params;
  params.device_url = "sim://?hbm=64M&dma_engines=4";
  auto rig = Rig::Make(GetParam(), params);
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  const uint64_t n = 2 * kMiB;
  absl::StatusOr<DeviceBuffer> b = engine.Allocate(0, n);
  absl::StatusOr<DeviceBuffer> twos_on_device = engine.Allocate(0, n);
  ASSERT_TRUE(b.ok() && twos_on_device.ok());
  HostBytes ones(n), twos(n), out(n);
  std::memset(ones.data, 1, n);
  std::memset(twos.data, 2, n);
  Put(engine, *twos_on_device, twos.data, n);
  for (int round = 0; round < 40; ++round) {
    std::atomic<int> go{0};
    absl::StatusOr<Event> e1, e2;
    std::thread t1([&] {
      go.fetch_add(1);
      while (go.load() < 2) {
      }
      e1 = engine.TransferToDevice(ones.data, *b, 0, n);
    });
    std::thread t2([&] {
      go.fetch_add(1);
      while (go.load() < 2) {
      }
      e2 = engine.TransferDeviceToDevice(*twos_on_device, 0, *b, 0, n);
    });
    t1.join();
    t2.join();
    ASSERT_TRUE(e1.ok() && e2.ok());
    absl::StatusOr<Event> read = engine.TransferFromDevice(*b, 0, out.data, n);
    ASSERT_TRUE(read.ok());
    ASSERT_TRUE(Within(*read, "the read").ok());
    EXPECT_TRUE(e1->IsReady() && e2->IsReady());
    const char first = out.data[0];
    ASSERT_TRUE(first == 1 || first == 2);
    ASSERT_EQ(std::count(out.data, out.data + n, first),
              static_cast<std::ptrdiff_t>(n))
        << "round " << round << ": the two writes interleaved";
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, QueueOrderTest,
                         ::testing::Values(Backend::kSim, Backend::kNvme),
                         BackendName);

}  // namespace
}  // namespace tpushim
