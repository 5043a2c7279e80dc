// Shaped device buffers on the transfer engine: the device reserves the
// padded size, stats count padded and unpadded bytes, running out of
// device memory adds XLA's HBM report, and array transfers lay the dense
// host array out into the tiled image and back — bit-exact for every
// element type, through staging (region on, any threshold) and through a
// pinned heap image (no staging room), with several threads at once.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "allocator/premapped_region.h"
#include "device/xla_shape.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/transfer_rig.h"
#include "transfer/relayout.h"
#include "transfer/transfer_engine.h"

namespace tpushim {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using testutil::TransferRig;

std::unique_ptr<TransferRig> MakeRig(TransferRig::Params params) {
  absl::StatusOr<std::unique_ptr<TransferRig>> rig =
      TransferRig::Create(params);
  EXPECT_TRUE(rig.ok()) << rig.status();
  return rig.ok() ? *std::move(rig) : nullptr;
}

// A host array of `shape` with random elements, each in the low bits its
// type uses (the bits a device element keeps).
std::vector<uint8_t> RandomArray(const ArrayShape& shape, uint64_t seed) {
  std::vector<uint8_t> v(HostBytes(shape));
  std::mt19937_64 rng(seed);
  for (uint8_t& b : v) b = static_cast<uint8_t>(rng());
  const int bits = ElementBitWidth(shape.type);
  if (bits < 8) {
    for (uint8_t& b : v) b &= static_cast<uint8_t>((1u << bits) - 1);
  }
  return v;
}

TEST(ShapedBufferTest, ReservesThePaddedSizeAndCountsBoth) {
  auto rig = MakeRig({.device_url = "sim://?hbm=64M"});
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  absl::StatusOr<DeviceBuffer> b = engine.Allocate(
      0, DeviceBufferSpec{.shape = "s32[1000,10]", .label = "one_hot"});
  ASSERT_TRUE(b.ok()) << b.status();
  // 1000 rows padded to 1000 (a multiple of 8), 10 columns to 128.
  EXPECT_EQ(b->size(), 1000u * 128 * 4);
  EXPECT_EQ(b->unpadded_size(), 1000u * 10 * 4);
  EXPECT_EQ(b->host_size(), 1000u * 10 * 4);
  EXPECT_EQ(b->shape(), "s32[1000,10]{1,0:T(8,128)}");
  EXPECT_EQ(b->label(), "one_hot");
  EXPECT_EQ(rig->device(0).MemoryInUse(), 1000u * 128 * 4);

  absl::StatusOr<DeviceBuffer> bytes = engine.Allocate(0, 1000);
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(bytes->shape(), "");
  EXPECT_EQ(bytes->unpadded_size(), 1000u);
  EXPECT_EQ(bytes->host_size(), 1000u);

  std::vector<DeviceMemoryUse> use = engine.GetMemoryUse();
  ASSERT_EQ(use.size(), 1u);
  EXPECT_EQ(use[0].buffers, 2u);
  EXPECT_EQ(use[0].padded_bytes, 1000u * 128 * 4 + 1000);
  EXPECT_EQ(use[0].unpadded_bytes, 1000u * 10 * 4 + 1000);
  ASSERT_TRUE(engine.Deallocate(*b).value().Await().ok());
  use = engine.GetMemoryUse();
  EXPECT_EQ(use[0].buffers, 1u);
  EXPECT_EQ(use[0].padded_bytes, 1000u);
  EXPECT_EQ(use[0].unpadded_bytes, 1000u);
  EXPECT_EQ(use[0].peak_padded_bytes, 1000u * 128 * 4 + 1000);
  EXPECT_EQ(use[0].peak_unpadded_bytes, 1000u * 10 * 4 + 1000);
}

TEST(ShapedBufferTest, BadShapesAreNamedAndAllocateNothing) {
  auto rig = MakeRig({});
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  struct Case {
    std::string shape;
    std::string error;
  };
  for (const Case& c : std::vector<Case>{
           {"f32[128,256", "f32[128,256: expected ',' or ']' at column 12"},
           {"f33[2]", "column 1"},
           {"(f32[2], s8[3])",
            "is a tuple; each of its elements is a device "
            "buffer of its own"},
           {"f32[0,5]", "has no elements"},
           {"f32[4611686018427387904,4]", "64 bits"},
       }) {
    absl::StatusOr<DeviceBuffer> b =
        engine.Allocate(0, DeviceBufferSpec{.shape = c.shape});
    EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument)
        << c.shape << ": " << b.status();
    EXPECT_THAT(b.status().message(), HasSubstr(c.error)) << c.shape;
  }
  EXPECT_EQ(rig->device(0).MemoryInUse(), 0u);
  EXPECT_EQ(engine.GetMemoryUse()[0].buffers, 0u);
  EXPECT_EQ(engine.GetMemoryUse()[0].peak_padded_bytes, 0u);
}

TEST(ShapedBufferTest, RunningOutAddsXlasReport) {
  auto rig = MakeRig({.device_url = "sim://?hbm=16M"});
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  absl::StatusOr<DeviceBuffer> weights = engine.Allocate(
      0, DeviceBufferSpec{.shape = "f32[1024,1024]",
                          .label = "weights",
                          .op_metadata = "op_name=\"dense/kernel\""});
  ASSERT_TRUE(weights.ok());
  absl::StatusOr<DeviceBuffer> blob = engine.Allocate(0, 3 << 20);
  ASSERT_TRUE(blob.ok());
  // 100000 x 10 s32: 12.5x padded to 100000 x 128 = 48.83M.
  absl::StatusOr<DeviceBuffer> one_hot = engine.Allocate(
      0, DeviceBufferSpec{.shape = "s32[100000,10]", .label = "one_hot"});
  ASSERT_EQ(one_hot.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string m(one_hot.status().message());
  EXPECT_THAT(m, StartsWith("Error allocating device buffer: Attempting to "
                            "allocate 48.83M. That was not possible. There "
                            "are 9.00M free.; (0x0x0_HBM0)\n"));
  EXPECT_THAT(m, HasSubstr("Ran out of memory in memory space hbm. Used "
                           "55.83M of 16.00M hbm. Exceeded hbm capacity by "
                           "39.83M.\n"));
  EXPECT_THAT(m, HasSubstr("    device buffers 55.83M (19.4% utilization: "
                           "Unpadded (10.81M) Padded (55.83M), 0.0% "
                           "fragmentation (0B))\n"));
  EXPECT_THAT(m, HasSubstr("Largest program allocations in hbm:\n\n"
                           "  1. Size: 48.83M\n"
                           "     Shape: s32[100000,10]{1,0:T(8,128)}\n"
                           "     Unpadded size: 3.81M\n"
                           "     Extra memory due to padding: 45.01M (12.8x "
                           "expansion)\n"
                           "     XLA label: one_hot\n"
                           "     Allocation type: failed request\n"
                           "     ==========================\n"));
  EXPECT_THAT(m, HasSubstr("  2. Size: 4.00M\n"
                           "     Operator: op_name=\"dense/kernel\"\n"
                           "     Shape: f32[1024,1024]{1,0:T(8,128)}\n"
                           "     Unpadded size: 4.00M\n"
                           "     XLA label: weights\n"
                           "     Allocation type: live buffer\n"));
  EXPECT_THAT(m, HasSubstr("  3. Size: 3.00M\n"
                           "     Unpadded size: 3.00M\n"
                           "     XLA label: (none)\n"));
  EXPECT_THAT(m, HasSubstr("Where the padding comes from:\n  1. "
                           "s32[100000,10]{1,0:T(8,128)}: dimension 1 (10) is "
                           "padded to 128"));
  // Nothing changed.
  EXPECT_EQ(engine.GetMemoryUse()[0].buffers, 2u);
  EXPECT_EQ(rig->device(0).MemoryInUse(), (4u << 20) + (3u << 20));
}

// Every element type and a spread of layouts, ranks and odd sizes: the
// image the device holds is the plan's, the dense array comes back bit
// for bit, padding is zero on the device.
std::vector<std::string> RoundTripShapes() {
  std::vector<std::string> shapes;
  for (const char* type :
       {"pred", "s4",       "u4",     "s8",  "u8",   "s16",     "u16", "s32",
        "u32",  "s64",      "u64",    "f16", "bf16", "f32",     "f64", "c64",
        "c128", "f8e4m3fn", "f8e5m2", "s2",  "u1",   "f4e2m1fn"}) {
    shapes.push_back(absl::StrCat(type, "[37,301]"));
    shapes.push_back(absl::StrCat(type, "[3,5,130]"));
    shapes.push_back(absl::StrCat(type, "[1000]"));
    shapes.push_back(absl::StrCat(type, "[]"));
  }
  shapes.push_back("f32[4,9,130]{0,2,1:T(8,128)}");
  shapes.push_back("f32[100,3]{0,1:T(8,128)}");
  shapes.push_back("bf16[17,260]{1,0:T(8,128)(2,1)}");
  shapes.push_back("s8[40,300]{1,0:T(8,128)(4,1)}");
  shapes.push_back("f32[2,3,1004]{2,1,0:T(2,*,128)}");
  shapes.push_back("f32[33,65]{1,0:T(4,8)L(1024)}");
  shapes.push_back("pred[10]{0:T(256)E(32)}");
  return shapes;
}

void RoundTrip(TransferEngine& engine, const std::string& text, uint64_t seed) {
  SCOPED_TRACE(text);
  absl::StatusOr<ArrayShape> shape = ParseArrayShape(text);
  ASSERT_TRUE(shape.ok()) << shape.status();
  absl::StatusOr<RelayoutPlan> plan = RelayoutPlan::Create(*shape);
  ASSERT_TRUE(plan.ok());
  absl::StatusOr<DeviceBuffer> b =
      engine.Allocate(0, DeviceBufferSpec{.shape = text, .label = "t"});
  ASSERT_TRUE(b.ok()) << b.status();
  // Dirty device memory first: padding must be written as zero.
  std::vector<uint8_t> junk(b->size(), 0xa5);
  ASSERT_TRUE(engine.TransferToDevice(junk.data(), *b, 0, junk.size())
                  .value()
                  .Await()
                  .ok());
  const std::vector<uint8_t> host = RandomArray(*shape, seed);
  absl::StatusOr<Event> up = engine.TransferArrayToDevice(host.data(), *b);
  ASSERT_TRUE(up.ok()) << up.status();
  ASSERT_TRUE(up->Await().ok());
  // The device holds the tiled image (read back as bytes).
  std::vector<uint8_t> image(b->size());
  ASSERT_TRUE(engine.TransferFromDevice(*b, 0, image.data(), image.size())
                  .value()
                  .Await()
                  .ok());
  // (Past the image, up to a whole device block, zero.)
  std::vector<uint8_t> expected(b->size(), 0);
  ASSERT_GE(b->size(), plan->device_bytes());
  ASSERT_TRUE(
      plan->Pack(host.data(), 0, plan->device_bytes(), expected.data()).ok());
  EXPECT_TRUE(image == expected) << "the device image differs";
  std::vector<uint8_t> back(host.size(), 0x5a);
  absl::StatusOr<Event> down = engine.TransferArrayFromDevice(*b, back.data());
  ASSERT_TRUE(down.ok()) << down.status();
  ASSERT_TRUE(down->Await().ok());
  EXPECT_TRUE(back == host) << "the array came back different";
  ASSERT_TRUE(engine.Deallocate(*b).value().Await().ok());
}

struct Route {
  const char* name;
  TransferRig::Params params;
};

class ShapedRoundTripTest : public ::testing::TestWithParam<Route> {};

TEST_P(ShapedRoundTripTest, EveryTypeAndLayoutIsBitExact) {
  auto rig = MakeRig(GetParam().params);
  ASSERT_NE(rig, nullptr);
  uint64_t seed = 1;
  for (const std::string& s : RoundTripShapes()) {
    RoundTrip(rig->engine(), s, seed++);
  }
  const TransferEngine::Stats stats = rig->engine().GetStats();
  const int staged = static_cast<int>(TransferPath::kStaged);
  const int pinned = static_cast<int>(TransferPath::kPinned);
  // The array transfers were staged (the byte ones here too, unless the
  // threshold pinned them) ...
  EXPECT_GE(stats.host[0][staged].transfers, RoundTripShapes().size());
  EXPECT_GE(stats.host[1][staged].transfers, RoundTripShapes().size());
  if (GetParam().params.region_bytes == 0) {
    // ... through the bounce pool with the region off, arrays and bytes
    // alike: nothing pinned.
    EXPECT_EQ(stats.host[0][pinned].transfers, 0u);
    EXPECT_EQ(stats.host[1][pinned].transfers, 0u);
    EXPECT_GE(stats.staged_bounce, 4 * RoundTripShapes().size());
  }
  EXPECT_EQ(rig->TearDownAndReport(), "");
}

TEST_P(ShapedRoundTripTest, FourThreadsAtOnce) {
  auto rig = MakeRig(GetParam().params);
  ASSERT_NE(rig, nullptr);
  const std::vector<std::string> shapes = RoundTripShapes();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = t; i < shapes.size(); i += 4) {
        RoundTrip(rig->engine(), shapes[i], 100 + i);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(rig->TearDownAndReport(), "");
}

INSTANTIATE_TEST_SUITE_P(
    Routes, ShapedRoundTripTest,
    ::testing::Values(
        // Staged in 64 KiB chunks: images split mid-tile and mid-element.
        Route{"Staged",
              {.region_bytes = 8 << 20,
               .engine = {.chunk_bytes = 64 << 10,
                          .from_device_chunk_bytes = 48 << 10}}},
        // A threshold far below the images: array transfers stage anyway.
        Route{"ThresholdBelowTheArrays",
              {.region_bytes = 8 << 20, .threshold = 4096}},
        // Region off: through the bounce pool, laid out chunk by chunk.
        Route{"RegionOff", {.region_bytes = 0}},
        // A device that moves whole 512-byte blocks (NVMe): buffers are
        // rounded up, the rest of the last block is zero.
        Route{"WholeBlocks", {.region_bytes = 8 << 20, .block_bytes = 512}},
        Route{"WholeBlocksRegionOff", {.region_bytes = 0, .block_bytes = 512}}),
    [](const ::testing::TestParamInfo<Route>& p) {
      return std::string(p.param.name);
    });

// No staging room in time (the application's buffers fill the region):
// the array goes through a heap image on the pinned path instead, and is
// counted as a staging timeout.
TEST(ShapedBufferTest, NoStagingRoomTakesTheHeapImage) {
  TransferEngine::Config config;
  config.staging_wait = absl::Milliseconds(5);
  auto rig = MakeRig({.region_bytes = 2 << 20, .engine = config});
  ASSERT_NE(rig, nullptr);
  PremappedRegion& region = *rig->region();
  absl::StatusOr<void*> hog = region.allocator().Allocate(region.size());
  ASSERT_TRUE(hog.ok()) << hog.status();
  RoundTrip(rig->engine(), "bf16[37,301]", 7);
  const TransferEngine::Stats s = rig->engine().GetStats();
  EXPECT_GE(s.pinned_staging_timeout, 2u);
  EXPECT_EQ(s.host[0][static_cast<int>(TransferPath::kStaged)].transfers, 0u);
  ASSERT_TRUE(region.allocator().Free(*hog).ok());
  EXPECT_EQ(rig->TearDownAndReport(), "");
}

TEST(ShapedBufferTest, ArrayTransfersOfAByteBufferMoveItsBytes) {
  auto rig = MakeRig({});
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  absl::StatusOr<DeviceBuffer> b = engine.Allocate(0, 1000);
  ASSERT_TRUE(b.ok());
  std::vector<uint8_t> host(1000), back(1000);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<uint8_t>(i);
  ASSERT_TRUE(
      engine.TransferArrayToDevice(host.data(), *b).value().Await().ok());
  ASSERT_TRUE(
      engine.TransferArrayFromDevice(*b, back.data()).value().Await().ok());
  EXPECT_EQ(back, host);
}

TEST(ShapedBufferTest, ArrayTransferErrorsAreNamed) {
  auto rig = MakeRig({});
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  absl::StatusOr<DeviceBuffer> b =
      engine.Allocate(0, DeviceBufferSpec{.shape = "f32[8,8]"});
  ASSERT_TRUE(b.ok());
  absl::StatusOr<Event> e = engine.TransferArrayToDevice(nullptr, *b);
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(e.status().message(),
              HasSubstr("TransferArrayToDevice: the host array of "
                        "f32[8,8]{1,0:T(8,128)} (256 bytes) is null"));
  std::vector<float> host(64);
  e = engine.TransferArrayToDevice(host.data(), DeviceBuffer());
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(engine.Deallocate(*b).value().Await().ok());
  e = engine.TransferArrayFromDevice(*b, host.data());
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(e.status().message(), HasSubstr("has been deallocated"));
}

}  // namespace
}  // namespace tpushim
