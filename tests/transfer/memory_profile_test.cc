// TPUSHIM_MEMORY_PROFILE: what the transfer engine records about device
// memory, in what order, and what happens when the file cannot be written.

#include <signal.h>
#include <sys/resource.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/temp_dir.h"
#include "tests/testing/transfer_rig.h"
#include "transfer/transfer_engine.h"

namespace tpushim {
namespace {

using ::testing::HasSubstr;
using testutil::TransferRig;
using Json = nlohmann::json;

std::vector<Json> ReadLines(const std::string& path) {
  std::istringstream in(testutil::ReadFileOrEmpty(path));
  std::vector<Json> lines;
  for (std::string line; std::getline(in, line);) {
    lines.push_back(Json::parse(line, nullptr, false));
    EXPECT_FALSE(lines.back().is_discarded()) << line;
  }
  return lines;
}

std::unique_ptr<TransferRig> MakeRig(const std::string& profile,
                                     const std::string& url = "sim://?hbm=1M") {
  TransferRig::Params params{.device_url = url};
  params.memory_profile = profile;
  absl::StatusOr<std::unique_ptr<TransferRig>> rig =
      TransferRig::Create(params);
  EXPECT_TRUE(rig.ok()) << rig.status();
  return rig.ok() ? *std::move(rig) : nullptr;
}

TEST(MemoryProfileTest, RecordsAllocationsFreesAndFailedRequestsInOrder) {
  testutil::TempDir dir;
  const std::string path = dir.Join("profile.jsonl");
  auto rig = MakeRig(path);
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  absl::StatusOr<DeviceBuffer> one_hot =
      engine.Allocate(0, DeviceBufferSpec{.shape = "s32[1000,10]",
                                          .label = "one_hot",
                                          .op_metadata = "op_type=\"OneHot\""});
  ASSERT_TRUE(one_hot.ok()) << one_hot.status();
  absl::StatusOr<DeviceBuffer> bytes = engine.Allocate(0, 1000);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  absl::StatusOr<Event> freed = engine.Deallocate(*one_hot);
  ASSERT_TRUE(freed.ok()) << freed.status();
  ASSERT_TRUE(freed->Await().ok());
  EXPECT_FALSE(
      engine.Allocate(0, DeviceBufferSpec{.shape = "f32[1024,1024]"}).ok());
  // `bytes` is still live: shut-down frees it and records that.
  EXPECT_EQ(rig->TearDownAndReport(), "");

  const std::vector<Json> lines = ReadLines(path);
  ASSERT_EQ(lines.size(), 7u);
  EXPECT_EQ(lines[0]["tpushim_memory_profile"], 1);
  ASSERT_EQ(lines[0]["devices"].size(), 1u);
  EXPECT_EQ(lines[0]["devices"][0]["name"], "sim:0");
  EXPECT_EQ(lines[0]["devices"][0]["hbm_bytes"], 1 << 20);
  EXPECT_EQ(lines[0]["devices"][0]["granule"], 64);

  const Json& a = lines[1];
  EXPECT_EQ(a["event"], "alloc");
  EXPECT_EQ(a["device"], 0);
  EXPECT_EQ(a["shape"], "s32[1000,10]{1,0:T(8,128)}");
  EXPECT_EQ(a["label"], "one_hot");
  EXPECT_EQ(a["op"], "op_type=\"OneHot\"");
  EXPECT_EQ(a["padded_bytes"], 1000 * 128 * 4);
  EXPECT_EQ(a["unpadded_bytes"], 1000 * 10 * 4);
  EXPECT_EQ(a["device_bytes"], 1000 * 128 * 4);
  const Json& b = lines[2];
  EXPECT_EQ(b["event"], "alloc");
  EXPECT_EQ(b["padded_bytes"], 1000);
  EXPECT_EQ(b["unpadded_bytes"], 1000);
  EXPECT_FALSE(b.contains("shape"));
  EXPECT_FALSE(b.contains("label"));
  EXPECT_NE(a["id"], b["id"]);
  EXPECT_EQ(lines[3]["event"], "free");
  EXPECT_EQ(lines[3]["id"], a["id"]);
  EXPECT_EQ(lines[4]["event"], "failed");
  EXPECT_EQ(lines[4]["padded_bytes"], 4 << 20);
  EXPECT_EQ(lines[4]["shape"], "f32[1024,1024]{1,0:T(8,128)}");
  EXPECT_FALSE(lines[4].contains("id"));
  EXPECT_EQ(lines[5]["event"], "free");
  EXPECT_EQ(lines[5]["id"], b["id"]);
  EXPECT_EQ(lines[6]["event"], "end");
  for (size_t i = 2; i < lines.size(); ++i) {
    EXPECT_GE(lines[i]["t"].get<double>(), lines[i - 1]["t"].get<double>());
  }
}

TEST(MemoryProfileTest, AFileThatCannotBeCreatedFailsTheStartByName) {
  TransferRig::Params params;
  params.memory_profile = "/nonexistent-tpushim-dir/profile.jsonl";
  absl::StatusOr<std::unique_ptr<TransferRig>> rig =
      TransferRig::Create(params);
  ASSERT_FALSE(rig.ok());
  EXPECT_TRUE(absl::IsNotFound(rig.status())) << rig.status();
  EXPECT_THAT(rig.status().message(),
              HasSubstr("TPUSHIM_MEMORY_PROFILE=/nonexistent-tpushim-dir/"
                        "profile.jsonl: cannot create the file"));
}

TEST(MemoryProfileTest, AFullDiskFailsTheStartByName) {
  TransferRig::Params params;
  params.memory_profile = "/dev/full";
  absl::StatusOr<std::unique_ptr<TransferRig>> rig =
      TransferRig::Create(params);
  ASSERT_FALSE(rig.ok());
  EXPECT_THAT(rig.status().message(),
              HasSubstr("TPUSHIM_MEMORY_PROFILE=/dev/full: cannot write"));
}

// A write that fails part-way (here the file-size limit, as a full disk
// would) ends the recording with one ERROR; the runtime goes on, and the
// file keeps the whole records written before.
TEST(MemoryProfileTest, AFailedWriteEndsTheRecordingNotTheRuntime) {
  testutil::TempDir dir;
  const std::string path = dir.Join("profile.jsonl");
  auto rig = MakeRig(path);
  ASSERT_NE(rig, nullptr);
  struct rlimit old_limit;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  struct rlimit limit = old_limit;
  limit.rlim_cur = 100 << 10;  // the header and the first 64 KiB fit
  void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN);
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &limit), 0);
  // About 150 bytes a record: 2,000 pairs are 600 KiB, several flushes.
  int allocated = 0;
  for (int i = 0; i < 2000; ++i) {
    absl::StatusOr<DeviceBuffer> b = rig->engine().Allocate(0, 4096);
    if (!b.ok()) continue;
    ++allocated;
    ASSERT_TRUE(rig->engine().Deallocate(*b).value().Await().ok());
  }
  EXPECT_EQ(allocated, 2000);
  EXPECT_EQ(rig->TearDownAndReport(), "");
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &old_limit), 0);
  signal(SIGXFSZ, old_handler);

  const std::string text = testutil::ReadFileOrEmpty(path);
  EXPECT_LE(text.size(), size_t{100} << 10);
  EXPECT_GE(text.size(), size_t{64} << 10);
  // Whole lines up to the last newline, then at most a cut-off one.
  std::istringstream in(text.substr(0, text.rfind('\n') + 1));
  int lines = 0;
  for (std::string line; std::getline(in, line); ++lines) {
    EXPECT_FALSE(Json::parse(line, nullptr, false).is_discarded()) << line;
  }
  EXPECT_GT(lines, 300);
  EXPECT_EQ(text.find("\"end\""), std::string::npos);
}

// Two engines of one process given the same file: the second writes
// "<path>.2" instead of truncating and interleaving the first's; the path
// is free again once its profile is closed.
TEST(MemoryProfileTest, ASecondSystemWithTheSamePathWritesPathDot2) {
  testutil::TempDir dir;
  const std::string path = dir.Join("profile.jsonl");
  auto first = MakeRig(path);
  // The same file by another name.
  auto second = MakeRig(
      dir.Join("./../" + std::filesystem::path(dir.path()).filename().string() +
               "/profile.jsonl"));
  ASSERT_NE(first, nullptr);
  ASSERT_NE(second, nullptr);
  ASSERT_TRUE(first->engine().Allocate(0, 100).ok());
  ASSERT_TRUE(second->engine().Allocate(0, 200).ok());
  ASSERT_TRUE(second->engine().Allocate(0, 300).ok());
  EXPECT_EQ(first->TearDownAndReport(), "");
  EXPECT_EQ(second->TearDownAndReport(), "");
  const std::vector<Json> one = ReadLines(path);
  const std::vector<Json> two = ReadLines(path + ".2");
  // header, alloc, free, end; header, 2 x alloc, 2 x free, end
  ASSERT_EQ(one.size(), 4u);
  ASSERT_EQ(two.size(), 6u);
  EXPECT_EQ(one[1]["padded_bytes"], 100);
  EXPECT_EQ(two[1]["padded_bytes"], 200);
  EXPECT_EQ(one.back()["event"], "end");
  EXPECT_EQ(two.back()["event"], "end");
  auto third = MakeRig(path);
  ASSERT_NE(third, nullptr);
  EXPECT_EQ(third->TearDownAndReport(), "");
  EXPECT_EQ(ReadLines(path).size(), 2u);  // truncated and rewritten
}

// Labels are the caller's bytes: invalid UTF-8 is recorded as U+FFFD,
// never thrown out of Allocate.
TEST(MemoryProfileTest, ALabelThatIsNotUtf8IsRecordedNotThrown) {
  testutil::TempDir dir;
  const std::string path = dir.Join("profile.jsonl");
  auto rig = MakeRig(path);
  ASSERT_NE(rig, nullptr);
  absl::StatusOr<DeviceBuffer> b = rig->engine().Allocate(
      0, DeviceBufferSpec{.shape = "f32[8]", .label = "caf\xe9 \xff"});
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_FALSE(rig->engine()
                   .Allocate(0, DeviceBufferSpec{.shape = "f32[1024,1024]",
                                                 .op_metadata = "\xc3"})
                   .ok());
  EXPECT_EQ(rig->TearDownAndReport(), "");
  const std::vector<Json> lines = ReadLines(path);
  ASSERT_EQ(lines.size(), 5u);  // header, alloc, failed, free, end
  EXPECT_EQ(lines[1]["label"], "caf\xef\xbf\xbd \xef\xbf\xbd");
  EXPECT_EQ(lines[2]["op"], "\xef\xbf\xbd");
}

// More records than one buffer holds, from several threads, some of them
// failed requests (four f32[100,600] take 1.02M of the 1M device): every
// record reaches the file, each free after its alloc, and the bytes in use
// that the file adds up never exceed the device nor end above zero.
TEST(MemoryProfileTest, ThreadsRecordEveryEventInAConsistentOrder) {
  testutil::TempDir dir;
  const std::string path = dir.Join("profile.jsonl");
  auto rig = MakeRig(path, "sim://?hbm=1M");
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  constexpr int kThreads = 4;
  constexpr int kRounds = 400;
  std::vector<std::thread> threads;
  std::atomic<int> allocated{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&engine, &allocated, t] {
      for (int i = 0; i < kRounds; ++i) {
        absl::StatusOr<DeviceBuffer> b = engine.Allocate(
            0, DeviceBufferSpec{
                   .shape = (t % 2 == 0) ? "f32[100,600]" : "bf16[8,8]",
                   .label = "t"});
        if (!b.ok()) continue;
        allocated.fetch_add(1);
        absl::StatusOr<Event> e = engine.Deallocate(*b);
        if (e.ok()) (void)e->Await();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(rig->TearDownAndReport(), "");

  const std::vector<Json> lines = ReadLines(path);
  ASSERT_GE(lines.size(), 2u);
  EXPECT_EQ(lines.back()["event"], "end");
  std::map<uint64_t, uint64_t> live;  // id -> padded bytes
  int64_t in_use = 0;
  int allocs = 0;
  int frees = 0;
  for (size_t i = 1; i + 1 < lines.size(); ++i) {
    const Json& j = lines[i];
    if (j["event"] == "alloc") {
      ++allocs;
      ASSERT_TRUE(live.emplace(j["id"], j["padded_bytes"]).second) << j;
      in_use += j["padded_bytes"].get<int64_t>();
      EXPECT_LE(in_use, 1 << 20) << "line " << i;
    } else if (j["event"] == "free") {
      ++frees;
      auto it = live.find(j["id"]);
      ASSERT_NE(it, live.end()) << "free before its alloc, line " << i;
      in_use -= static_cast<int64_t>(it->second);
      live.erase(it);
    }
  }
  EXPECT_EQ(allocs, allocated.load());
  EXPECT_EQ(frees, allocs);
  EXPECT_EQ(in_use, 0);
  // A few hundred records take more than one 64 KiB flush.
  EXPECT_GT(testutil::ReadFileOrEmpty(path).size(), size_t{64} << 10);
}

}  // namespace
}  // namespace tpushim
