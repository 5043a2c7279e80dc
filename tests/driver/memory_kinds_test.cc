// Memory kinds: the memories a System lists, buffers in each kind, copies
// between kinds (and the path each takes), per-memory statistics, the
// pinned_host out-of-memory text and report, and the zero-copy host-buffer
// semantics (tpushim/memory.h, docs/api.md "Memory kinds").

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "driver/system_internal.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/scoped_test_logging.h"
#include "tpushim/memory.h"
#include "tpushim/system.h"

namespace tpushim {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using testutil::ScopedTestLogging;

constexpr uint64_t kMiB = uint64_t{1} << 20;

OptionOverrides Small(uint64_t region = 8 * kMiB,
                      std::string device = "sim://?devices=2&hbm=32M") {
  OptionOverrides o;
  o.premapped_buffer_size = region;
  o.device = std::move(device);
  o.prefault_threads = 1;
  return o;
}

class MemoryKindsTest : public ::testing::Test {
 protected:
  void Start(OptionOverrides o = Small()) {
    auto s = SystemFactory::Create(o, &os_);
    ASSERT_TRUE(s.ok()) << s.status();
    system_ = *std::move(s);
  }
  int pinned() const {
    return system_->memory_of_kind(MemoryKind::kPinnedHost);
  }
  int unpinned() const {
    return system_->memory_of_kind(MemoryKind::kUnpinnedHost);
  }
  uint64_t Count(DmaDirection d, TransferPath p) const {
    return system_->GetStats()
        .transfers.host[static_cast<int>(d)][static_cast<int>(p)]
        .transfers;
  }
  static std::vector<char> Pattern(uint64_t n, int seed) {
    std::vector<char> v(n);
    for (uint64_t i = 0; i < n; ++i) v[i] = static_cast<char>(i * 7 + seed);
    return v;
  }

  ScopedTestLogging logs_;
  FixedEnvironmentOs os_{Os::Default()};
  std::unique_ptr<System> system_;
};

TEST_F(MemoryKindsTest, ListsDevicePinnedAndUnpinnedMemoriesWithStableIds) {
  Start();
  const std::vector<MemoryDescription> m = system_->memories();
  ASSERT_EQ(m.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(m[i].id, i);
  EXPECT_EQ(m[0].kind_name, "device");
  EXPECT_EQ(m[0].devices, std::vector<int>{0});
  EXPECT_EQ(m[0].capacity_bytes, 32 * kMiB);
  EXPECT_EQ(m[1].kind_name, "device");
  EXPECT_EQ(m[1].devices, std::vector<int>{1});
  EXPECT_EQ(m[1].description, "sim:1 HBM");
  EXPECT_EQ(m[2].kind, MemoryKind::kPinnedHost);
  EXPECT_EQ(m[2].kind_name, "pinned_host");
  EXPECT_EQ(m[2].devices, (std::vector<int>{0, 1}));
  EXPECT_EQ(m[2].capacity_bytes, 8 * kMiB);
  EXPECT_EQ(m[3].kind, MemoryKind::kUnpinnedHost);
  EXPECT_EQ(m[3].kind_name, "unpinned_host");
  EXPECT_EQ(m[3].devices, (std::vector<int>{0, 1}));
  EXPECT_EQ(pinned(), 2);
  EXPECT_EQ(unpinned(), 3);
  EXPECT_EQ(system_->memory_of_kind(MemoryKind::kDevice, 1), 1);
  EXPECT_EQ(MemoryKindName(MemoryKind::kUnpinnedHost), "unpinned_host");
}

TEST_F(MemoryKindsTest, EachDevicesDefaultMemoryIsItsHbm) {
  Start();
  EXPECT_EQ(*system_->DefaultMemory(0), 0);
  EXPECT_EQ(*system_->DefaultMemory(1), 1);
  absl::StatusOr<int> bad = system_->DefaultMemory(2);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("device 2 does not exist"));
  // A device buffer's memory is its device's.
  auto dev = system_->AllocateDevice(1, 4096);
  ASSERT_TRUE(dev.ok());
  EXPECT_EQ(system_->AsMemoryBuffer(*dev).memory(), 1);
  EXPECT_EQ(system_->AsMemoryBuffer(*dev).kind(), MemoryKind::kDevice);
}

TEST_F(MemoryKindsTest, RegionOffStillListsPinnedHostWithNoCapacity) {
  Start(Small(/*region=*/0));
  const std::vector<MemoryDescription> m = system_->memories();
  ASSERT_EQ(m.size(), 4u);
  EXPECT_EQ(m[2].kind_name, "pinned_host");
  EXPECT_EQ(m[2].capacity_bytes, 0u);
  EXPECT_THAT(m[2].description, HasSubstr("TPU_PREMAPPED_BUFFER_SIZE=0"));
  absl::StatusOr<MemoryBuffer> b = system_->AllocateInMemory(pinned(), 4096);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(b.status().message(),
              HasSubstr("memory 2 (pinned_host): Cannot allocate"));
  EXPECT_THAT(b.status().message(), HasSubstr("TPU_PREMAPPED_BUFFER_SIZE=0"));
  // unpinned_host works without the region.
  EXPECT_TRUE(system_->AllocateInMemory(unpinned(), 4096).ok());
}

TEST_F(MemoryKindsTest, BadMemoryIdsAndSizesAreNamedErrors) {
  Start();
  for (int bad : {-1, 4, 100}) {
    absl::StatusOr<MemoryBuffer> b = system_->AllocateInMemory(bad, 64);
    EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(b.status().message(),
                HasSubstr(absl::StrCat("memory ", bad, " does not exist")));
    EXPECT_THAT(b.status().message(), HasSubstr("2 pinned_host"));
    EXPECT_THAT(b.status().message(), HasSubstr("3 unpinned_host"));
    EXPECT_EQ(system_->GetMemoryStats(bad).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(system_->AllocateInMemory(pinned(), 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<MemoryBuffer> shaped =
      system_->AllocateInMemory(unpinned(), DeviceBufferSpec{.shape = "f32[2"});
  EXPECT_EQ(shaped.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(shaped.status().message()),
              StartsWith("AllocateInMemory: "));
  EXPECT_EQ(
      system_
          ->AllocateInMemory(unpinned(), DeviceBufferSpec{.shape = "(f32[2])"})
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
  // Nothing was allocated.
  EXPECT_EQ(system_->GetMemoryStats(unpinned())->num_allocs, 0u);
}

TEST_F(MemoryKindsTest, AllocatesInEveryKind) {
  Start();
  auto d = system_->AllocateInMemory(1, 8192);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->kind(), MemoryKind::kDevice);
  EXPECT_TRUE(d->device_buffer().valid());
  EXPECT_EQ(d->device_buffer().device(), 1);
  EXPECT_EQ(d->data(), nullptr);
  auto p = system_->AllocateInMemory(pinned(), 8192);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->kind(), MemoryKind::kPinnedHost);
  EXPECT_EQ(system_->PathFor(p->data(), 8192), TransferPath::kZeroCopy);
  EXPECT_FALSE(p->device_buffer().valid());
  auto u = system_->AllocateInMemory(unpinned(), 8192);
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->kind(), MemoryKind::kUnpinnedHost);
  EXPECT_NE(system_->PathFor(u->data(), 8192), TransferPath::kZeroCopy);
  // Zero-filled.
  const std::vector<char> zeros(8192, 0);
  EXPECT_EQ(std::memcmp(p->data(), zeros.data(), 8192), 0);
  EXPECT_EQ(std::memcmp(u->data(), zeros.data(), 8192), 0);
}

// The device's tiled image, in every memory: f32[16,10] is 16 x 128 floats.
TEST_F(MemoryKindsTest, ShapedHostBuffersHoldTheTiledImage) {
  Start();
  const DeviceBufferSpec spec{.shape = "f32[16,10]", .label = "activations"};
  auto dev = system_->AllocateInMemory(0, spec);
  ASSERT_TRUE(dev.ok()) << dev.status();
  for (int memory : {pinned(), unpinned()}) {
    auto h = system_->AllocateInMemory(memory, spec);
    ASSERT_TRUE(h.ok()) << h.status();
    EXPECT_EQ(h->size(), 16u * 128 * 4);
    EXPECT_EQ(h->size(), dev->size());
    EXPECT_EQ(h->unpadded_size(), 640u);
    EXPECT_EQ(h->host_size(), 640u);
    EXPECT_EQ(h->shape(), "f32[16,10]{1,0:T(8,128)}");
    EXPECT_EQ(h->shape(), dev->shape());
    EXPECT_EQ(h->label(), "activations");
  }
}

// device ↔ pinned_host: one DMA straight from/to the region bytes (the
// zero-copy path), never staged; the data survives the round trip.
TEST_F(MemoryKindsTest, DeviceToPinnedHostIsOneZeroCopyDma) {
  Start();
  const uint64_t n = 3 * kMiB + 100;  // over several descriptors
  const std::vector<char> data = Pattern(n, 3);
  auto dev = system_->AllocateDevice(0, n);
  ASSERT_TRUE(dev.ok());
  ASSERT_TRUE(system_->TransferToDevice(data.data(), *dev, 0, n)->Await().ok());
  const uint64_t zc =
      Count(DmaDirection::kDeviceToHost, TransferPath::kZeroCopy);
  const uint64_t staged =
      Count(DmaDirection::kDeviceToHost, TransferPath::kStaged);
  const uint64_t pinned_path =
      Count(DmaDirection::kDeviceToHost, TransferPath::kPinned);
  auto down = system_->CopyToMemory(system_->AsMemoryBuffer(*dev), pinned());
  ASSERT_TRUE(down.ok()) << down.status();
  ASSERT_TRUE(down->event.Await().ok());
  EXPECT_EQ(down->buffer.kind(), MemoryKind::kPinnedHost);
  EXPECT_EQ(down->buffer.memory(), pinned());
  ASSERT_EQ(down->buffer.size(), n);
  EXPECT_EQ(std::memcmp(down->buffer.data(), data.data(), n), 0);
  EXPECT_EQ(Count(DmaDirection::kDeviceToHost, TransferPath::kZeroCopy),
            zc + 1);
  EXPECT_EQ(Count(DmaDirection::kDeviceToHost, TransferPath::kStaged), staged);
  EXPECT_EQ(Count(DmaDirection::kDeviceToHost, TransferPath::kPinned),
            pinned_path);

  // And back, to the other device.
  const uint64_t zc_up =
      Count(DmaDirection::kHostToDevice, TransferPath::kZeroCopy);
  auto up = system_->CopyToMemory(down->buffer, 1);
  ASSERT_TRUE(up.ok()) << up.status();
  ASSERT_TRUE(up->event.Await().ok());
  EXPECT_EQ(up->buffer.memory(), 1);
  EXPECT_EQ(Count(DmaDirection::kHostToDevice, TransferPath::kZeroCopy),
            zc_up + 1);
  std::vector<char> back(n);
  ASSERT_TRUE(
      system_->TransferFromDevice(up->buffer.device_buffer(), 0, back.data(), n)
          ->Await()
          .ok());
  EXPECT_EQ(back, data);
}

// device ↔ unpinned_host: the ordinary paths (staged here: under the
// threshold).
TEST_F(MemoryKindsTest, DeviceToUnpinnedHostTakesTheOrdinaryPaths) {
  Start();
  const uint64_t n = 256 * 1024;
  const std::vector<char> data = Pattern(n, 5);
  auto made = system_->CreateMemoryBuffer(data.data(), n, 0);
  ASSERT_TRUE(made.ok()) << made.status();
  ASSERT_TRUE(made->event.Await().ok());
  const uint64_t staged =
      Count(DmaDirection::kDeviceToHost, TransferPath::kStaged);
  auto down = system_->CopyToMemory(made->buffer, unpinned());
  ASSERT_TRUE(down.ok()) << down.status();
  ASSERT_TRUE(down->event.Await().ok());
  EXPECT_EQ(down->buffer.kind(), MemoryKind::kUnpinnedHost);
  EXPECT_EQ(std::memcmp(down->buffer.data(), data.data(), n), 0);
  EXPECT_EQ(Count(DmaDirection::kDeviceToHost, TransferPath::kStaged),
            staged + 1);
  const uint64_t staged_up =
      Count(DmaDirection::kHostToDevice, TransferPath::kStaged);
  auto up = system_->CopyToMemory(down->buffer, 1);
  ASSERT_TRUE(up.ok());
  ASSERT_TRUE(up->event.Await().ok());
  EXPECT_EQ(Count(DmaDirection::kHostToDevice, TransferPath::kStaged),
            staged_up + 1);
}

TEST_F(MemoryKindsTest, HostToHostCopiesAndDeviceToDeviceCopies) {
  Start();
  const uint64_t n = 10000;
  const std::vector<char> data = Pattern(n, 9);
  auto u = system_->CreateMemoryBuffer(data.data(), n, unpinned());
  ASSERT_TRUE(u.ok());
  EXPECT_FALSE(u->buffer.aliases_caller_memory());
  const uint64_t transfers =
      Count(DmaDirection::kHostToDevice, TransferPath::kStaged) +
      Count(DmaDirection::kDeviceToHost, TransferPath::kStaged);
  auto p = system_->CopyToMemory(u->buffer, pinned());
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(p->event.Await().ok());
  EXPECT_EQ(std::memcmp(p->buffer.data(), data.data(), n), 0);
  auto u2 = system_->CopyToMemory(p->buffer, unpinned());
  ASSERT_TRUE(u2.ok());
  ASSERT_TRUE(u2->event.Await().ok());
  EXPECT_EQ(std::memcmp(u2->buffer.data(), data.data(), n), 0);
  // No DMA for host ↔ host.
  EXPECT_EQ(Count(DmaDirection::kHostToDevice, TransferPath::kStaged) +
                Count(DmaDirection::kDeviceToHost, TransferPath::kStaged),
            transfers);
  // device → device.
  auto d0 = system_->CopyToMemory(u2->buffer, 0);
  ASSERT_TRUE(d0.ok());
  auto d1 = system_->CopyToMemory(d0->buffer, 1, {d0->event});
  ASSERT_TRUE(d1.ok()) << d1.status();
  ASSERT_TRUE(d1->event.Await().ok());
  auto back = system_->CopyToMemory(d1->buffer, unpinned());
  ASSERT_TRUE(back.ok());
  ASSERT_TRUE(back->event.Await().ok());
  EXPECT_EQ(std::memcmp(back->buffer.data(), data.data(), n), 0);
}

// A host → host copy waits for its wait_for events, and fails with the
// first failed one, copying nothing.
TEST_F(MemoryKindsTest, HostCopyWaitsForItsDependencies) {
  Start();
  const uint64_t n = 2 * kMiB;
  const std::vector<char> data = Pattern(n, 11);
  auto dev = system_->AllocateDevice(0, n);
  ASSERT_TRUE(dev.ok());
  auto src = system_->AllocateInMemory(pinned(), n);
  ASSERT_TRUE(src.ok());
  // Fill the pinned buffer from the device, then copy it to unpinned_host
  // after that.
  ASSERT_TRUE(system_->TransferToDevice(data.data(), *dev, 0, n)->Await().ok());
  auto fill = system_->TransferFromDevice(*dev, 0, src->data(), n);
  ASSERT_TRUE(fill.ok());
  auto copy = system_->CopyToMemory(*src, unpinned(), {*fill});
  ASSERT_TRUE(copy.ok()) << copy.status();
  ASSERT_TRUE(copy->event.Await().ok());
  EXPECT_EQ(std::memcmp(copy->buffer.data(), data.data(), n), 0);

  auto failed = system_->CopyToMemory(
      *src, unpinned(), {Event::Ready(absl::DataLossError("upstream broke"))});
  ASSERT_TRUE(failed.ok());
  absl::Status s = failed->event.Await();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("upstream broke"));
}

TEST_F(MemoryKindsTest, ShapedDeviceToPinnedHostMovesTheImageAsItIs) {
  Start();
  const DeviceBufferSpec spec{.shape = "s32[3,5]"};
  auto dev = system_->AllocateDevice(0, spec);
  ASSERT_TRUE(dev.ok());
  std::vector<int32_t> dense(15);
  std::iota(dense.begin(), dense.end(), 1);
  ASSERT_TRUE(system_->TransferArrayToDevice(dense.data(), *dev)->Await().ok());
  auto host = system_->CopyToMemory(system_->AsMemoryBuffer(*dev), pinned());
  ASSERT_TRUE(host.ok()) << host.status();
  ASSERT_TRUE(host->event.Await().ok());
  EXPECT_EQ(host->buffer.shape(), dev->shape());
  ASSERT_EQ(host->buffer.size(), dev->size());
  // Tiled T(8,128): row r starts at r * 128 elements, padding is zero.
  const int32_t* image = static_cast<const int32_t*>(host->buffer.data());
  for (int r = 0; r < 3; ++r) {
    for (int c = 0; c < 5; ++c) EXPECT_EQ(image[r * 128 + c], r * 5 + c + 1);
    EXPECT_EQ(image[r * 128 + 5], 0);
  }
  // Back onto a device, and out as the dense array.
  auto again = system_->CopyToMemory(host->buffer, 1);
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE(again->event.Await().ok());
  EXPECT_EQ(again->buffer.shape(), dev->shape());
  std::vector<int32_t> out(15);
  ASSERT_TRUE(
      system_
          ->TransferArrayFromDevice(again->buffer.device_buffer(), out.data())
          ->Await()
          .ok());
  EXPECT_EQ(out, dense);
}

TEST_F(MemoryKindsTest, FreeReleasesHostBytesAndRejectsLaterUse) {
  Start();
  const uint64_t before = system_->GetStats().region.bytes_in_use;
  auto p = system_->AllocateInMemory(pinned(), kMiB);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(system_->GetStats().region.bytes_in_use, before + kMiB);
  MemoryBuffer copy = *p;  // handles share one buffer
  ASSERT_TRUE(system_->Free(*p)->Await().ok());
  EXPECT_EQ(system_->GetStats().region.bytes_in_use, before);
  absl::StatusOr<Event> twice = system_->Free(copy);
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(twice.status().message(), HasSubstr("was freed"));
  absl::StatusOr<MemoryCopy> use = system_->CopyToMemory(copy, 0);
  EXPECT_EQ(use.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(use.status().message(),
              HasSubstr("pinned_host buffer was freed"));
  EXPECT_EQ(system_->CopyToMemory(MemoryBuffer(), 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Device memory frees as Deallocate does.
  auto d = system_->AllocateInMemory(0, 4096);
  ASSERT_TRUE(d.ok());
  ASSERT_TRUE(system_->Free(*d)->Await().ok());
  EXPECT_EQ(system_->Free(*d).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Free while a copy out of the buffer is in flight: the copy keeps the
// bytes until it is done.
TEST_F(MemoryKindsTest, FreeDuringACopyKeepsTheBytesUntilItIsDone) {
  Start();
  const uint64_t n = 4 * kMiB;
  const std::vector<char> data = Pattern(n, 13);
  auto src = system_->CreateMemoryBuffer(data.data(), n, unpinned());
  ASSERT_TRUE(src.ok());
  auto up = system_->CopyToMemory(src->buffer, 0);
  ASSERT_TRUE(up.ok());
  ASSERT_TRUE(system_->Free(src->buffer)->Await().ok());
  ASSERT_TRUE(up->event.Await().ok());
  auto back = system_->CopyToMemory(up->buffer, unpinned());
  ASSERT_TRUE(back.ok());
  ASSERT_TRUE(back->event.Await().ok());
  EXPECT_EQ(std::memcmp(back->buffer.data(), data.data(), n), 0);
}

TEST_F(MemoryKindsTest, BuffersOfAnotherSystemAreRejected) {
  Start();
  // Another System of this process, on chips of its own (chips 0 and 1
  // are system_'s).
  OptionOverrides o = Small(8 * kMiB, "sim://?devices=4&hbm=32M");
  o.visible_chips = std::vector<int>{2, 3};
  auto other = SystemFactory::Create(o, &os_);
  ASSERT_TRUE(other.ok());
  auto b = (*other)->AllocateInMemory(
      (*other)->memory_of_kind(MemoryKind::kUnpinnedHost), 64);
  ASSERT_TRUE(b.ok());
  absl::StatusOr<MemoryCopy> c = system_->CopyToMemory(*b, 0);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("another system"));
}

TEST_F(MemoryKindsTest, PerMemoryStatsCountAllocationsAndTheLargest) {
  Start();
  ASSERT_TRUE(system_->AllocateInMemory(0, 4096).ok());
  ASSERT_TRUE(system_->AllocateDevice(0, 3 * 4096).ok());
  ASSERT_TRUE(
      system_->AllocateInMemory(0, DeviceBufferSpec{.shape = "f32[2,10]"})
          .ok());
  absl::StatusOr<MemoryStats> d = system_->GetMemoryStats(0);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->kind, MemoryKind::kDevice);
  EXPECT_EQ(d->num_allocs, 3u);
  EXPECT_EQ(d->largest_alloc_size, 3u * 4096);
  EXPECT_EQ(d->bytes_in_use, 4096u + 3 * 4096 + 2 * 128 * 4);  // T(2,128)
  EXPECT_EQ(d->peak_bytes_in_use, d->bytes_in_use);
  EXPECT_TRUE(d->has_bytes_limit);
  EXPECT_EQ(d->bytes_limit, 32 * kMiB);
  EXPECT_EQ(d->buffers_live, 3u);
  EXPECT_GT(d->largest_free_block_bytes, 0u);
  // The same figures in the device statistics.
  const DeviceStats ds = system_->GetStats().devices[0];
  EXPECT_EQ(ds.num_allocs, 3u);
  EXPECT_EQ(ds.largest_alloc_size, 3u * 4096);
  EXPECT_EQ(system_->GetMemoryStats(1)->num_allocs, 0u);

  // pinned_host: the region's bytes; AllocatePinnedHost counts too.
  auto a = system_->AllocateInMemory(pinned(), 2 * kMiB);
  ASSERT_TRUE(a.ok());
  auto b = system_->AllocatePinnedHost(kMiB);
  ASSERT_TRUE(b.ok());
  absl::StatusOr<MemoryStats> p = system_->GetMemoryStats(pinned());
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->kind, MemoryKind::kPinnedHost);
  EXPECT_EQ(p->num_allocs, 2u);
  EXPECT_EQ(p->largest_alloc_size, 2 * kMiB);
  EXPECT_EQ(p->bytes_in_use, 3 * kMiB);
  EXPECT_EQ(p->bytes_limit, 8 * kMiB);
  EXPECT_EQ(p->largest_free_block_bytes, 5 * kMiB);
  EXPECT_EQ(p->buffers_live, 1u);

  // unpinned_host: its buffers; no limit of its own.
  auto u = system_->AllocateInMemory(unpinned(), 5000);
  ASSERT_TRUE(u.ok());
  absl::StatusOr<MemoryStats> un = system_->GetMemoryStats(unpinned());
  ASSERT_TRUE(un.ok());
  EXPECT_EQ(un->num_allocs, 1u);
  EXPECT_EQ(un->largest_alloc_size, 5000u);
  EXPECT_EQ(un->bytes_in_use, 5000u);
  EXPECT_FALSE(un->has_bytes_limit);
  EXPECT_EQ(un->bytes_limit, 0u);
  ASSERT_TRUE(system_->Free(*u)->Await().ok());
  un = system_->GetMemoryStats(unpinned());
  EXPECT_EQ(un->bytes_in_use, 0u);
  EXPECT_EQ(un->peak_bytes_in_use, 5000u);
  EXPECT_EQ(un->buffers_live, 0u);
}

// libtpu's text, then the report of what holds pinned_host.
TEST_F(MemoryKindsTest, PinnedHostOutOfMemoryGivesLibtpuTextAndReport) {
  Start();
  auto held = system_->AllocateInMemory(
      pinned(), DeviceBufferSpec{.shape = "f32[1024,10]",
                                 .label = "kv_cache",
                                 .op_metadata = "op_name=\"offload\""});
  ASSERT_TRUE(held.ok()) << held.status();
  auto other = system_->AllocatePinnedHost(2 * kMiB);
  ASSERT_TRUE(other.ok());
  absl::StatusOr<MemoryBuffer> big =
      system_->AllocateInMemory(pinned(), 6 * kMiB);
  ASSERT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string m(big.status().message());
  EXPECT_THAT(m, StartsWith("Attempting to allocate 6.00M. That was not "
                            "possible. There are 5.50M free."));
  EXPECT_THAT(m, HasSubstr(" free."));
  EXPECT_THAT(m, HasSubstr("\nRan out of memory in memory space pinned_host. "
                           "Used 8.50M of 8.00M pinned_host. Exceeded "
                           "pinned_host capacity by 512.0K.\n"));
  EXPECT_THAT(m, HasSubstr("    pinned_host buffers 8.50M"));
  EXPECT_THAT(m, HasSubstr("Largest program allocations in pinned_host:"));
  EXPECT_THAT(m, HasSubstr("Shape: f32[1024,10]{1,0:T(8,128)}"));
  EXPECT_THAT(m, HasSubstr("XLA label: kv_cache"));
  EXPECT_THAT(m, HasSubstr("Operator: op_name=\"offload\""));
  EXPECT_THAT(m, HasSubstr("XLA label: (other use of the region"));
  EXPECT_THAT(m, HasSubstr("Allocation type: failed request"));
  // Logged at ERROR as libtpu does.
  EXPECT_THAT(logs_.File("ERROR"),
              HasSubstr("Allocating buffer from premapped region failed with: "
                        "RESOURCE_EXHAUSTED: Attempting to allocate 6.00M."));
  // Nothing changed.
  EXPECT_EQ(system_->GetMemoryStats(pinned())->buffers_live, 1u);
}

// ---- Zero-copy host-buffer semantics ------------------------------------

TEST_F(MemoryKindsTest, PinnedHostAliasesRegionMemoryImmutableOrMutable) {
  Start();
  auto region = system_->AllocatePinnedHost(kMiB);
  ASSERT_TRUE(region.ok());
  std::memset(region->data(), 0x5a, kMiB);
  const uint64_t in_use = system_->GetStats().region.bytes_in_use;
  for (HostBufferSemantics s : {HostBufferSemantics::kImmutableZeroCopy,
                                HostBufferSemantics::kMutableZeroCopy}) {
    auto b = system_->CreateMemoryBuffer(region->data(), kMiB, pinned(), s);
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_TRUE(b->event.IsReady());
    EXPECT_TRUE(b->buffer.aliases_caller_memory());
    EXPECT_EQ(b->buffer.mutable_alias(),
              s == HostBufferSemantics::kMutableZeroCopy);
    EXPECT_EQ(b->buffer.data(), region->data());
    EXPECT_EQ(b->buffer.kind(), MemoryKind::kPinnedHost);
    // Nothing allocated from the region.
    EXPECT_EQ(system_->GetStats().region.bytes_in_use, in_use);
    // A copy to the device DMAs straight from the caller's bytes.
    const uint64_t zc =
        Count(DmaDirection::kHostToDevice, TransferPath::kZeroCopy);
    auto up = system_->CopyToMemory(b->buffer, 0);
    ASSERT_TRUE(up.ok());
    ASSERT_TRUE(up->event.Await().ok());
    EXPECT_EQ(Count(DmaDirection::kHostToDevice, TransferPath::kZeroCopy),
              zc + 1);
    // Freeing it leaves the caller's bytes alone.
    ASSERT_TRUE(system_->Free(b->buffer)->Await().ok());
    EXPECT_EQ(static_cast<unsigned char*>(region->data())[kMiB - 1], 0x5a);
    EXPECT_EQ(system_->GetStats().region.bytes_in_use, in_use);
  }
}

// Outside the region: immutable zero-copy copies (PJRT allows it); mutable
// zero-copy cannot keep its promise and says so.
TEST_F(MemoryKindsTest, PinnedHostZeroCopyOutsideTheRegion) {
  Start();
  const std::vector<char> data = Pattern(8192, 17);
  auto b = system_->CreateMemoryBuffer(data.data(), data.size(), pinned(),
                                       HostBufferSemantics::kImmutableZeroCopy);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_FALSE(b->buffer.aliases_caller_memory());
  EXPECT_NE(b->buffer.data(), data.data());
  EXPECT_EQ(system_->PathFor(b->buffer.data(), 8192), TransferPath::kZeroCopy);
  EXPECT_EQ(std::memcmp(b->buffer.data(), data.data(), 8192), 0);

  const uint64_t allocs = system_->GetMemoryStats(pinned())->num_allocs;
  absl::StatusOr<MemoryCopy> m =
      system_->CreateMemoryBuffer(data.data(), data.size(), pinned(),
                                  HostBufferSemantics::kMutableZeroCopy);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(m.status().message(), HasSubstr("kMutableZeroCopy"));
  EXPECT_THAT(m.status().message(), HasSubstr("premapped region"));
  EXPECT_EQ(system_->GetMemoryStats(pinned())->num_allocs, allocs);
}

// Registered memory is memory every device DMAs directly, as the region
// is: a pinned_host buffer over it aliases it (mutably, if asked), and its
// copies to a device are zero-copy. Once unregistered, the alias still
// holds the right bytes; its copies take the ordinary paths.
TEST_F(MemoryKindsTest, PinnedHostAliasesRegisteredMemory) {
  Start();
  constexpr uint64_t n = 64 << 10;
  void* raw = nullptr;
  ASSERT_EQ(posix_memalign(&raw, 4096, n), 0);
  std::unique_ptr<char, decltype(&std::free)> host(static_cast<char*>(raw),
                                                   &std::free);
  const std::vector<char> data = Pattern(n, 37);
  std::memcpy(host.get(), data.data(), n);
  absl::StatusOr<HostRegistration> reg =
      system_->RegisterHostMemory(host.get(), n);
  ASSERT_TRUE(reg.ok()) << reg.status();

  auto alias = system_->CreateMemoryBuffer(
      host.get(), n, pinned(), HostBufferSemantics::kMutableZeroCopy);
  ASSERT_TRUE(alias.ok()) << alias.status();
  EXPECT_TRUE(alias->buffer.aliases_caller_memory());
  EXPECT_TRUE(alias->buffer.mutable_alias());
  EXPECT_EQ(alias->buffer.data(), host.get());

  const auto registered_h2d = [&] {
    return system_->GetStats().transfers.zero_copy_registered_transfers[0];
  };
  const uint64_t zero_copy_before = registered_h2d();
  auto dev = system_->CopyToMemory(alias->buffer, 0);
  ASSERT_TRUE(dev.ok()) << dev.status();
  ASSERT_TRUE(dev->event.Await().ok());
  EXPECT_EQ(registered_h2d(), zero_copy_before + 1);

  ASSERT_TRUE(reg->Unregister().ok());
  const std::vector<char> later = Pattern(n, 41);
  std::memcpy(host.get(), later.data(), n);
  auto again = system_->CopyToMemory(alias->buffer, 0);
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_TRUE(again->event.Await().ok());
  EXPECT_EQ(registered_h2d(), zero_copy_before + 1);
  auto back = system_->CopyToMemory(again->buffer, unpinned());
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_TRUE(back->event.Await().ok());
  EXPECT_EQ(std::memcmp(back->buffer.data(), later.data(), n), 0);
  ASSERT_TRUE(system_->Free(alias->buffer).ok());
}

TEST_F(MemoryKindsTest, UnpinnedHostAliasesAnyCallerMemory) {
  Start();
  std::vector<char> data = Pattern(8192, 19);
  auto b = system_->CreateMemoryBuffer(data.data(), data.size(), unpinned(),
                                       HostBufferSemantics::kMutableZeroCopy);
  ASSERT_TRUE(b.ok());
  EXPECT_TRUE(b->buffer.aliases_caller_memory());
  EXPECT_EQ(b->buffer.data(), data.data());
  EXPECT_EQ(system_->GetMemoryStats(unpinned())->bytes_in_use, 8192u);
  EXPECT_EQ(system_->GetMemoryStats(unpinned())->num_allocs, 0u);
  // A copy from a device lands in a new buffer; the alias is writable by
  // transfers into its bytes.
  auto dev = system_->CopyToMemory(b->buffer, 0);
  ASSERT_TRUE(dev.ok());
  ASSERT_TRUE(dev->event.Await().ok());
  std::memset(data.data(), 0, data.size());
  ASSERT_TRUE(system_
                  ->TransferFromDevice(dev->buffer.device_buffer(), 0,
                                       b->buffer.data(), 8192)
                  ->Await()
                  .ok());
  EXPECT_EQ(data, Pattern(8192, 19));
  ASSERT_TRUE(system_->Free(b->buffer)->Await().ok());
  EXPECT_EQ(system_->GetMemoryStats(unpinned())->bytes_in_use, 0u);
}

// Once a copy's event is ready, neither side's host bytes are held for it:
// freeing the source right after awaiting gives them back at once.
TEST_F(MemoryKindsTest, AfterACopyIsReadyFreeingItsSourceReturnsTheBytes) {
  Start();
  std::vector<char> data = Pattern(8192, 23);
  for (int r = 0; r < 300; ++r) {
    auto b = system_->CreateMemoryBuffer(data.data(), data.size(), unpinned(),
                                         HostBufferSemantics::kMutableZeroCopy);
    ASSERT_TRUE(b.ok()) << b.status();
    auto dev = system_->CopyToMemory(b->buffer, r % 2);
    ASSERT_TRUE(dev.ok()) << dev.status();
    ASSERT_TRUE(dev->event.Await().ok());
    ASSERT_TRUE(system_->Free(b->buffer)->Await().ok());
    ASSERT_EQ(system_->GetMemoryStats(unpinned())->bytes_in_use, 0u)
        << "round " << r;
    ASSERT_EQ(system_->GetMemoryStats(unpinned())->buffers_live, 0u);
    ASSERT_TRUE(system_->Free(dev->buffer)->Await().ok());
  }
}

// CreateMemoryBuffer of one array: the dense bytes in, the tiled image
// held; aliased only where the layout keeps the dense bytes as they are;
// host_released as PJRT's done_with_host_buffer.
TEST_F(MemoryKindsTest, CreateMemoryBufferFromADenseArray) {
  Start();
  // f32[8,128] with T(8,128) is one whole tile: its image is the dense
  // array, so the zero-copy semantics alias it.
  std::vector<float> whole(8 * 128);
  std::iota(whole.begin(), whole.end(), 0.0f);
  auto alias = system_->CreateMemoryBuffer(
      whole.data(), unpinned(),
      DeviceBufferSpec{.shape = "f32[8,128]{1,0:T(8,128)}", .label = "w"},
      HostBufferSemantics::kImmutableZeroCopy);
  ASSERT_TRUE(alias.ok()) << alias.status();
  EXPECT_TRUE(alias->buffer.aliases_caller_memory());
  EXPECT_EQ(alias->buffer.data(), whole.data());
  EXPECT_EQ(alias->buffer.shape(), "f32[8,128]{1,0:T(8,128)}");
  EXPECT_EQ(alias->buffer.label(), "w");
  EXPECT_TRUE(alias->event.IsReady());
  // The caller's bytes are the buffer's until it is freed.
  EXPECT_FALSE(alias->host_released.IsReady());
  ASSERT_TRUE(system_->Free(alias->buffer)->Await().ok());
  EXPECT_TRUE(alias->host_released.Await().ok());

  // f32[4,10] pads to 8 x 128: laid out into new bytes, never aliased.
  std::vector<float> dense(40);
  std::iota(dense.begin(), dense.end(), 1.0f);
  const DeviceBufferSpec padded{.shape = "f32[4,10]{1,0:T(8,128)}"};
  auto copy =
      system_->CreateMemoryBuffer(dense.data(), unpinned(), padded,
                                  HostBufferSemantics::kImmutableZeroCopy);
  ASSERT_TRUE(copy.ok()) << copy.status();
  EXPECT_FALSE(copy->buffer.aliases_caller_memory());
  ASSERT_EQ(copy->buffer.size(), 8u * 128 * 4);
  const float* image = static_cast<const float*>(copy->buffer.data());
  EXPECT_EQ(image[128 + 9], 20.0f);  // row 1, column 9
  EXPECT_EQ(image[10], 0.0f);        // padding
  EXPECT_TRUE(copy->host_released.Await().ok());
  auto mut = system_->CreateMemoryBuffer(dense.data(), unpinned(), padded,
                                         HostBufferSemantics::kMutableZeroCopy);
  EXPECT_EQ(mut.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(mut.status().message(), HasSubstr("layout keeps"));

  // Into device memory: the array transfer, with both its events; the
  // buffer's ready event answers through the MemoryBuffer.
  auto dev = system_->CreateMemoryBuffer(dense.data(), 0, padded);
  ASSERT_TRUE(dev.ok()) << dev.status();
  EXPECT_TRUE(dev->host_released.Await().ok());
  EXPECT_TRUE(dev->event.Await().ok());
  auto ready = system_->BufferReadyEvent(dev->buffer);
  ASSERT_TRUE(ready.ok());
  EXPECT_TRUE(ready->Await().ok());
  std::vector<float> back(40);
  ASSERT_TRUE(
      system_->TransferArrayFromDevice(dev->buffer.device_buffer(), back.data())
          ->Await()
          .ok());
  EXPECT_EQ(back, dense);
  auto bad = system_->CreateMemoryBuffer(dense.data(), 0,
                                         DeviceBufferSpec{.shape = "f32[4,"});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(MemoryKindsTest, CopyingSemanticsCopyIntoNewBytes) {
  Start();
  std::vector<char> data = Pattern(4096, 23);
  for (HostBufferSemantics s :
       {HostBufferSemantics::kImmutableOnlyDuringCall,
        HostBufferSemantics::kImmutableUntilTransferCompletes}) {
    for (int memory : {pinned(), unpinned()}) {
      auto b = system_->CreateMemoryBuffer(data.data(), 4096, memory, s);
      ASSERT_TRUE(b.ok());
      EXPECT_FALSE(b->buffer.aliases_caller_memory());
      EXPECT_NE(b->buffer.data(), data.data());
      EXPECT_EQ(std::memcmp(b->buffer.data(), data.data(), 4096), 0);
    }
  }
  // Into device memory, with every semantics (the zero-copy ones transfer
  // as kImmutableUntilTransferCompletes).
  for (HostBufferSemantics s :
       {HostBufferSemantics::kImmutableOnlyDuringCall,
        HostBufferSemantics::kImmutableUntilTransferCompletes,
        HostBufferSemantics::kImmutableZeroCopy,
        HostBufferSemantics::kMutableZeroCopy}) {
    auto b = system_->CreateMemoryBuffer(data.data(), 4096, 1, s);
    ASSERT_TRUE(b.ok()) << HostBufferSemanticsName(s);
    ASSERT_TRUE(b->event.Await().ok());
    EXPECT_EQ(b->buffer.memory(), 1);
  }
  EXPECT_EQ(
      system_->CreateMemoryBuffer(nullptr, 4096, unpinned()).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      system_->CreateMemoryBuffer(data.data(), 0, unpinned()).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HostBufferSemanticsName(HostBufferSemantics::kMutableZeroCopy),
            "mutable_zero_copy");
}

// An injected `alloc` fault behaves as a full region: libtpu's text and
// the pinned_host report, nothing allocated.
TEST_F(MemoryKindsTest, InjectedAllocFaultIsTheOutOfMemoryText) {
  OptionOverrides o = Small();
  o.faults = "alloc:nth=1";
  Start(o);
  absl::StatusOr<MemoryBuffer> b = system_->AllocateInMemory(pinned(), kMiB);
  ASSERT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(b.status().message()),
              StartsWith("Attempting to allocate 1.00M. That was not "
                         "possible."));
  EXPECT_THAT(b.status().message(),
              HasSubstr("Ran out of memory in memory space pinned_host."));
  EXPECT_EQ(system_->GetMemoryStats(pinned())->num_allocs, 0u);
  EXPECT_EQ(system_->GetMemoryStats(pinned())->bytes_in_use, 0u);
  // The next one is served.
  EXPECT_TRUE(system_->AllocateInMemory(pinned(), kMiB).ok());
}

TEST_F(MemoryKindsTest, AnEmptyDeviceBufferIsRefused) {
  Start();
  absl::StatusOr<MemoryCopy> c =
      system_->CopyToMemory(system_->AsMemoryBuffer(DeviceBuffer()), 0);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("refers to nothing"));
}

// A Free that waits for a copy's event has its bytes back when its own
// event is ready, even while the callback thread is busy: the copy lets go
// of them as it completes, not in a callback queued behind others.
TEST_F(MemoryKindsTest, FreeAfterACopyIsDoneWhenItsEventIsReady) {
  // Each DMA takes 0.3 s, so the blocker below is still pending when its
  // callback is added.
  Start(Small(8 * kMiB, "sim://?devices=1&hbm=32M&latency_us=300000"));
  const uint64_t n = 256 * 1024;
  const std::vector<char> data = Pattern(n, 29);
  // Hold the system's callback thread.
  auto dev = system_->AllocateDevice(0, 64);
  ASSERT_TRUE(dev.ok());
  std::vector<char> small(64);
  auto blocker = system_->TransferToDevice(small.data(), *dev, 0, 64);
  ASSERT_TRUE(blocker.ok());
  // Shared with the callback, which may still be leaving
  // WaitForNotification after this test has returned; released however
  // the test ends.
  auto started = std::make_shared<absl::Notification>();
  auto release = std::make_shared<absl::Notification>();
  auto ran_inline = std::make_shared<std::atomic<bool>>(false);
  absl::Cleanup let_go = [release] {
    if (!release->HasBeenNotified()) release->Notify();
  };
  const std::thread::id test_thread = std::this_thread::get_id();
  blocker->AddCallback(
      [started, release, ran_inline, test_thread](absl::Status) {
        *ran_inline = std::this_thread::get_id() == test_thread;
        started->Notify();
        if (!*ran_inline) release->WaitForNotification();
      });
  started->WaitForNotification();
  if (*ran_inline) {
    GTEST_SKIP() << "the blocker was done before its callback was added";
  }

  auto src = system_->CreateMemoryBuffer(data.data(), n, unpinned());
  ASSERT_TRUE(src.ok());
  auto up = system_->CopyToMemory(src->buffer, 0);
  ASSERT_TRUE(up.ok());
  auto freed = system_->Free(src->buffer, {up->event});
  ASSERT_TRUE(freed.ok());
  EXPECT_TRUE(freed->Await().ok());
  EXPECT_EQ(system_->GetMemoryStats(unpinned())->bytes_in_use, 0u);
  EXPECT_EQ(system_->GetMemoryStats(unpinned())->buffers_live, 0u);
}

// Threads copying through every kind and freeing at once: every byte
// arrives and the host memories end empty.
TEST_F(MemoryKindsTest, ConcurrentCopiesAndFreesKeepEveryByte) {
  Start(Small(16 * kMiB));
  constexpr int kThreads = 4;
  constexpr int kRounds = 8;
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < kRounds; ++r) {
        const uint64_t n = 64 * 1024 + 4096 * t + r;
        const std::vector<char> data = Pattern(n, t * 31 + r);
        auto u = system_->CreateMemoryBuffer(data.data(), n, unpinned());
        if (!u.ok()) {
          ++bad;
          continue;
        }
        auto d = system_->CopyToMemory(u->buffer, t % 2);
        if (!d.ok()) {
          ++bad;
          continue;
        }
        // Freed while the copy out of it may still run.
        absl::StatusOr<Event> freed = system_->Free(u->buffer, {d->event});
        auto p = system_->CopyToMemory(d->buffer, pinned(), {d->event});
        if (!freed.ok() || !p.ok()) {
          ++bad;
          continue;
        }
        auto back = system_->CopyToMemory(p->buffer, unpinned(), {p->event});
        if (!back.ok() || !back->event.Await().ok() ||
            std::memcmp(back->buffer.data(), data.data(), n) != 0) {
          ++bad;
        }
        for (const MemoryBuffer& b :
             {d->buffer, p->buffer,
              back.ok() ? back->buffer : MemoryBuffer()}) {
          if (!b.valid()) continue;
          absl::StatusOr<Event> f = system_->Free(b);
          if (!f.ok() || !f->Await().ok()) ++bad;
        }
        if (!freed->Await().ok()) ++bad;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(system_->GetMemoryStats(pinned())->buffers_live, 0u);
  EXPECT_EQ(system_->GetMemoryStats(unpinned())->buffers_live, 0u);
  EXPECT_EQ(system_->GetMemoryStats(unpinned())->bytes_in_use, 0u);
  EXPECT_EQ(system_->GetMemoryStats(0)->buffers_live +
                system_->GetMemoryStats(1)->buffers_live,
            0u);
}

// The pinned_host report lists the live buffers while other threads make
// new ones: a buffer is listed only once it is whole (its shape, label and
// whether it aliases), which the TSan job checks.
TEST_F(MemoryKindsTest, OutOfMemoryReportsWhileBuffersAreMadeSeeThemWhole) {
  Start();
  auto region = system_->AllocatePinnedHost(kMiB);
  ASSERT_TRUE(region.ok());
  std::atomic<bool> stop{false};
  std::atomic<int> bad{0};
  std::thread reporter([&] {
    while (!stop.load()) {
      absl::StatusOr<MemoryBuffer> big =
          system_->AllocateInMemory(pinned(), 64 * kMiB);
      if (big.status().code() != absl::StatusCode::kResourceExhausted) ++bad;
    }
  });
  for (int r = 0; r < 200; ++r) {
    auto alias =
        system_->CreateMemoryBuffer(region->data(), kMiB, pinned(),
                                    HostBufferSemantics::kImmutableZeroCopy);
    auto shaped = system_->AllocateInMemory(
        pinned(), DeviceBufferSpec{.shape = "f32[8,128]", .label = "kv"});
    if (!alias.ok() || !shaped.ok()) {
      ++bad;
      continue;
    }
    if (!system_->Free(alias->buffer)->Await().ok()) ++bad;
    if (!system_->Free(*shaped)->Await().ok()) ++bad;
  }
  stop = true;
  reporter.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(system_->GetMemoryStats(pinned())->buffers_live, 0u);
}

// Buffers left when the system goes are released with it, the region's
// bytes before the region.
TEST_F(MemoryKindsTest, LiveHostBuffersGoWithTheSystem) {
  Start();
  auto p = system_->AllocateInMemory(pinned(), kMiB);
  ASSERT_TRUE(p.ok());
  auto u = system_->AllocateInMemory(unpinned(), kMiB);
  ASSERT_TRUE(u.ok());
  system_.reset();
  EXPECT_EQ(p->data(), p->data());  // the handles stay safe to hold
  EXPECT_THAT(logs_.File("INFO"), ::testing::Not(HasSubstr("outlived")));
}

}  // namespace
}  // namespace tpushim
