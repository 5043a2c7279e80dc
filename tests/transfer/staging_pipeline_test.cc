// The staged path is a pipeline: while the device moves chunk k, the host
// already copies chunk k+1 (host→device) or the device already moves
// chunk k+1 while the host copies chunk k out (device→host). Shown from
// the engine's own trace on a slowed simulated device: chunk k+1 is
// submitted — its copy done — before chunk k's DMA has ended. With a
// single staging buffer that can never happen, which the second test
// checks so that the first cannot pass for the wrong reason.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/temp_dir.h"
#include "tests/testing/transfer_rig.h"

namespace tpushim {
namespace {

using json = nlohmann::json;
using testutil::TempDir;
using testutil::TransferRig;

constexpr uint64_t kChunk = 512 << 10;
constexpr uint64_t kBytes = 8 * kChunk;

struct ChunkTimes {
  double submit_us = -1;
  double start_us = -1;
  double end_us = -1;
};

// Per chunk of the one transfer in `direction` ("h2d", "d2h"): when it was
// submitted and when its DMA ran, from the trace's submit and descriptor
// slices.
std::map<uint32_t, ChunkTimes> Chunks(const json& root,
                                      const std::string& direction) {
  std::map<uint64_t, std::map<uint32_t, ChunkTimes>> by_transfer;
  // The descriptor slices name their direction; submit slices do not, so
  // collect both by transfer and keep the transfer whose slices match.
  std::map<uint64_t, bool> matches;
  for (const json& e : root["traceEvents"]) {
    if (e.value("ph", "") != "X") continue;
    const uint64_t transfer = e["args"]["transfer"];
    const uint32_t chunk = e["args"]["chunk"];
    ChunkTimes& t = by_transfer[transfer][chunk];
    if (e["name"] == "submit") {
      t.submit_us = e["ts"];
    } else {
      t.start_us = e["ts"];
      t.end_us = e["ts"].get<double>() + e["dur"].get<double>();
      matches[transfer] = e["name"] == "staged " + direction;
    }
  }
  for (const auto& [transfer, chunks] : by_transfer) {
    if (matches[transfer]) return chunks;
  }
  return {};
}

// How many chunks k+1 were submitted before chunk k's DMA ended.
int Overlaps(const std::map<uint32_t, ChunkTimes>& chunks) {
  int n = 0;
  for (uint32_t k = 0; k + 1 < chunks.size(); ++k) {
    if (chunks.at(k + 1).submit_us < chunks.at(k).end_us) ++n;
  }
  return n;
}

// One staged transfer each way on a device whose link runs at 1 Gbit/s
// (a 512 KiB chunk's DMA takes about 4 ms, its copy tens of
// microseconds); returns the trace.
json RunAndTrace(int staging_depth, const TempDir& dir) {
  const std::string trace = dir.Join("trace.json");
  TransferRig::Params params;
  params.region_bytes = 32 << 20;
  params.device_url = "sim://?hbm=64M&link_gbps=1";
  params.engine.chunk_bytes = kChunk;
  params.engine.from_device_chunk_bytes = kChunk;
  params.engine.staging_depth = staging_depth;
  params.engine.trace_file = trace;
  auto rig = TransferRig::Create(params);
  EXPECT_TRUE(rig.ok()) << rig.status();
  if (!rig.ok()) return json();
  TransferEngine& engine = (*rig)->engine();
  std::vector<char> src(kBytes, 7), dst(kBytes);
  auto buffer = engine.Allocate(0, kBytes);
  EXPECT_TRUE(buffer.ok()) << buffer.status();
  if (!buffer.ok()) return json();
  EXPECT_EQ(engine.PathFor(src.data(), kBytes), TransferPath::kStaged);
  auto up = engine.TransferToDevice(src.data(), *buffer, 0, kBytes);
  EXPECT_TRUE(up.ok() && up->Await().ok());
  auto down = engine.TransferFromDevice(*buffer, 0, dst.data(), kBytes);
  EXPECT_TRUE(down.ok() && down->Await().ok());
  EXPECT_EQ(src, dst);
  EXPECT_EQ((*rig)->TearDownAndReport(), "");  // writes the trace
  return json::parse(testutil::ReadFileOrEmpty(trace), nullptr, false);
}

TEST(StagingPipelineTest, NextChunkIsCopiedWhileTheDeviceMovesThisOne) {
  TempDir dir;
  const json root = RunAndTrace(/*staging_depth=*/8, dir);
  ASSERT_TRUE(root.is_object());
  for (const char* direction : {"h2d", "d2h"}) {
    const auto chunks = Chunks(root, direction);
    ASSERT_EQ(chunks.size(), kBytes / kChunk) << direction;
    EXPECT_GE(Overlaps(chunks), 1) << direction;
  }
}

TEST(StagingPipelineTest, WithOneStagingBufferNothingOverlaps) {
  TempDir dir;
  const json root = RunAndTrace(/*staging_depth=*/1, dir);
  ASSERT_TRUE(root.is_object());
  for (const char* direction : {"h2d", "d2h"}) {
    const auto chunks = Chunks(root, direction);
    ASSERT_EQ(chunks.size(), kBytes / kChunk) << direction;
    EXPECT_EQ(Overlaps(chunks), 0) << direction;
  }
}

}  // namespace
}  // namespace tpushim
