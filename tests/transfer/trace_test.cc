// The transfer trace (TPUSHIM_TRACE_FILE): TraceRecorder's Chrome
// trace-event JSON, checked by parsing it, and the engine writing it at
// shutdown for transfers on each path.

#include "transfer/trace.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "env/fault_injection.h"
#include "env/os.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/temp_dir.h"
#include "tests/testing/trace_check.h"
#include "tests/testing/transfer_rig.h"
#include "transfer/transfer_engine.h"

namespace tpushim {
namespace {

using json = nlohmann::json;
using testutil::ReadFileOrEmpty;
using testutil::TempDir;
using testutil::TransferRig;

constexpr int kH2d = static_cast<int>(DmaDirection::kHostToDevice);
constexpr int kD2h = static_cast<int>(DmaDirection::kDeviceToHost);
constexpr int kD2d = static_cast<int>(DmaDirection::kDeviceToDevice);

bool FileExists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

// Names in `dir`, sorted.
std::vector<std::string> ListDir(const std::string& dir) {
  auto names = Os::Default()->ListDirectory(dir);
  EXPECT_TRUE(names.ok()) << names.status();
  if (!names.ok()) return {};
  std::sort(names->begin(), names->end());
  return *names;
}

// Parses the trace at `path`; a null json (with a test failure) when it
// is missing or not JSON.
json ParseTrace(const std::string& path) {
  const std::string text = ReadFileOrEmpty(path);
  if (text.empty()) {
    ADD_FAILURE() << "no trace at " << path;
    return json();
  }
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    ADD_FAILURE() << "not JSON: " << text.substr(0, 2000);
    return json();
  }
  return j;
}

std::vector<json> Events(const json& root, const std::string& ph) {
  std::vector<json> out;
  for (const json& e : root["traceEvents"]) {
    if (e.value("ph", "") == ph) out.push_back(e);
  }
  return out;
}

// The descriptor slices, as opposed to the submit slices.
std::vector<json> DmaSlices(const json& root) {
  std::vector<json> out;
  for (const json& e : Events(root, "X")) {
    if (e.value("name", "") != "submit") out.push_back(e);
  }
  return out;
}

// A track's name: the lane's track name, "h2d queue", "h2d queue 2", ...
std::string LaneName(const char* track, int tid) {
  const int lane = tid / 100;
  return lane == 0 ? std::string(track) : absl::StrCat(track, " ", lane + 1);
}

// (pid, tid) -> thread name; pid -> process name.
std::map<std::pair<int, int>, std::string> ThreadNames(const json& root) {
  std::map<std::pair<int, int>, std::string> out;
  for (const json& e : Events(root, "M")) {
    if (e["name"] == "thread_name") {
      out[{e["pid"].get<int>(), e["tid"].get<int>()}] =
          e["args"]["name"].get<std::string>();
    }
  }
  return out;
}
std::map<int, std::string> ProcessNames(const json& root) {
  std::map<int, std::string> out;
  for (const json& e : Events(root, "M")) {
    if (e["name"] == "process_name") {
      out[e["pid"].get<int>()] = e["args"]["name"].get<std::string>();
    }
  }
  return out;
}

// Checks the structure every trace must have, whatever was recorded:
// a top-level object with a traceEvents array; a named process for every
// slice's pid and a named track for every slice's tid (the queue of its
// direction); one "s" and one "f" flow event per descriptor slice, with a
// matching id, binding ("bp":"e") to the slice and starting at a submit
// slice no later than it.
void CheckStructure(const json& root) {
  ASSERT_TRUE(root.is_object());
  ASSERT_TRUE(root.contains("traceEvents"));
  ASSERT_TRUE(root["traceEvents"].is_array());
  ASSERT_TRUE(root.contains("otherData"));
  EXPECT_TRUE(root["otherData"]["dropped_records"].is_number_integer());
  for (const json& e : root["traceEvents"]) {
    ASSERT_TRUE(e.is_object()) << e;
    ASSERT_TRUE(e.contains("ph")) << e;
    ASSERT_TRUE(e.contains("pid")) << e;
  }
  const auto processes = ProcessNames(root);
  EXPECT_EQ(processes.count(0), 1u);
  if (processes.count(0)) {
    EXPECT_EQ(processes.at(0), "host");
  }
  const auto threads = ThreadNames(root);

  const std::vector<json> slices = DmaSlices(root);
  std::set<std::tuple<int, int, double>> slice_at;  // pid, tid, ts
  static const char* kQueues[] = {"h2d queue", "d2h queue", "d2d queue"};
  static const char* kSubmits[] = {"h2d submit", "d2h submit", "d2d submit"};
  for (const json& x : slices) {
    const int pid = x["pid"], tid = x["tid"];
    EXPECT_EQ(x["cat"], "dma") << x;
    ASSERT_GE(tid % 100, 1) << x;
    ASSERT_LE(tid % 100, 3) << x;
    EXPECT_EQ(processes.count(pid), 1u) << "no process_name for " << x;
    auto q = threads.find({pid, tid});
    ASSERT_NE(q, threads.end()) << "no thread_name for " << x;
    EXPECT_EQ(q->second, LaneName(kQueues[tid % 100 - 1], tid));
    const json& args = x["args"];
    EXPECT_TRUE(args["bytes"].is_number_unsigned()) << x;
    EXPECT_TRUE(args["path"].is_string()) << x;
    EXPECT_TRUE(args["chunk"].is_number_unsigned()) << x;
    EXPECT_TRUE(args["transfer"].is_number_unsigned()) << x;
    EXPECT_GE(x["dur"].get<double>(), 0.0) << x;
    // The name says the path and the direction.
    EXPECT_TRUE(absl::StartsWith(
        x["name"].get<std::string>(),
        absl::StrCat(args["path"].get<std::string>(), " ",
                     std::string(kQueues[tid % 100 - 1]).substr(0, 3))))
        << x;
    slice_at.emplace(pid, tid, x["ts"].get<double>());
  }
  std::set<std::tuple<int, int, double>> submit_at;
  for (const json& x : Events(root, "X")) {
    if (x.value("name", "") != "submit") continue;
    const int pid = x["pid"], tid = x["tid"];
    EXPECT_EQ(x["cat"], "dma") << x;
    ASSERT_GE(tid % 100, 11) << x;
    ASSERT_LE(tid % 100, 13) << x;
    auto t = threads.find({pid, tid});
    ASSERT_NE(t, threads.end()) << "no thread_name for " << x;
    EXPECT_EQ(t->second, LaneName(kSubmits[tid % 100 - 11], tid));
    submit_at.emplace(pid, tid, x["ts"].get<double>());
  }

  // Every flow is drawn by Chrome DevTools and Perfetto, and no two slices
  // of a track overlap.
  const testutil::TraceViewCheck view = testutil::CheckTraceView(root);
  EXPECT_EQ(view.flows, slices.size());
  EXPECT_EQ(view.flows_drawn_devtools, view.flows);
  EXPECT_EQ(view.flows_drawn_perfetto, view.flows);
  EXPECT_THAT(view.problems, ::testing::IsEmpty());

  std::map<uint64_t, json> starts, finishes;
  for (const json& s : Events(root, "s")) {
    EXPECT_TRUE(starts.emplace(s["id"].get<uint64_t>(), s).second)
        << "duplicate flow start id " << s;
  }
  for (const json& f : Events(root, "f")) {
    EXPECT_TRUE(finishes.emplace(f["id"].get<uint64_t>(), f).second)
        << "duplicate flow end id " << f;
  }
  EXPECT_EQ(starts.size(), slices.size());
  EXPECT_EQ(finishes.size(), slices.size());
  for (const auto& [id, s] : starts) {
    auto it = finishes.find(id);
    ASSERT_NE(it, finishes.end()) << "flow " << id << " has no end";
    const json& f = it->second;
    EXPECT_EQ(f.value("bp", ""), "e") << f;
    EXPECT_EQ(s["name"], f["name"]);
    EXPECT_EQ(s["cat"], f["cat"]);
    EXPECT_EQ(s["cat"], "dma");
    EXPECT_LE(s["ts"].get<double>(), f["ts"].get<double>()) << s << f;
    EXPECT_EQ(s["pid"], f["pid"]);
    // The start sits on a submit slice, the end on a descriptor slice.
    EXPECT_EQ(submit_at.count({s["pid"].get<int>(), s["tid"].get<int>(),
                               s["ts"].get<double>()}),
              1u)
        << s;
    EXPECT_EQ(slice_at.count({f["pid"].get<int>(), f["tid"].get<int>(),
                              f["ts"].get<double>()}),
              1u)
        << f;
  }
  for (const json& c : Events(root, "C")) {
    EXPECT_EQ(c["name"], "staging bytes in flight") << c;
    EXPECT_EQ(c["pid"], 0) << c;
    EXPECT_TRUE(c["args"]["bytes"].is_number_unsigned()) << c;
  }
}

// ---- TraceRecorder ---------------------------------------------------------

class TraceRecorderTest : public ::testing::Test {
 protected:
  TraceRecorderTest() : os_(Os::Default(), nullptr) {}
  void TearDown() override { EXPECT_EQ(os_.open_files(), 0u); }

  TempDir dir_;
  FaultInjectingOs os_;
};

constexpr int64_t kOrigin = 5'000'000'000;

TEST_F(TraceRecorderTest, WritesDescriptorsCountersAndMetadata) {
  const std::string path = dir_.Join("trace.json");
  TraceRecorder rec(path, &os_, kOrigin);
  EXPECT_EQ(rec.path(), path);
  rec.NameDevice(0, "sim:0");
  rec.NameDevice(1, "sim:1");
  // Transfer 7: three h2d chunks on device 0.
  for (uint32_t c = 0; c < 3; ++c) {
    const int64_t t = kOrigin + 1'000'000 + c * 100'000;
    rec.Descriptor(0, kH2d, "staged", "h2d", 7, c, 1 << 20, t, t + 10'000,
                   t + 60'000, false);
  }
  // Transfer 8: one d2h chunk on device 0; transfer 9: a failed d2d copy
  // on device 1.
  rec.Descriptor(0, kD2h, "zero_copy", "d2h", 8, 0, 4096, kOrigin + 2'000'000,
                 kOrigin + 2'000'500, kOrigin + 2'001'500, false);
  rec.Descriptor(1, kD2d, "copy", "d2d", 9, 0, 123, kOrigin + 3'000'000,
                 kOrigin + 3'000'000, kOrigin + 3'000'000, true);
  rec.StagingBytes(kOrigin + 900'000, 1 << 20);
  rec.StagingBytes(kOrigin + 950'000, 2 << 20);
  rec.StagingBytes(kOrigin + 1'500'000, 0);
  EXPECT_EQ(rec.recorded(), 8u);
  EXPECT_EQ(rec.dropped(), 0u);

  ASSERT_TRUE(rec.Write().ok());
  json root = ParseTrace(path);
  ASSERT_FALSE(root.is_null());
  CheckStructure(root);
  if (HasFatalFailure()) return;
  EXPECT_EQ(root["otherData"]["dropped_records"], 0);

  const auto processes = ProcessNames(root);
  EXPECT_EQ(processes, (std::map<int, std::string>{
                           {0, "host"}, {1, "sim:0"}, {2, "sim:1"}}));
  const auto threads = ThreadNames(root);
  EXPECT_EQ(threads, (std::map<std::pair<int, int>, std::string>{
                         {{1, 1}, "h2d queue"},
                         {{1, 11}, "h2d submit"},
                         {{1, 2}, "d2h queue"},
                         {{1, 12}, "d2h submit"},
                         {{2, 3}, "d2d queue"},
                         {{2, 13}, "d2d submit"}}));

  const std::vector<json> slices = DmaSlices(root);
  ASSERT_EQ(slices.size(), 5u);
  std::vector<uint32_t> chunks;
  for (const json& x : slices) {
    const json& args = x["args"];
    if (args["transfer"] == 7) {
      EXPECT_EQ(x["name"], "staged h2d");
      EXPECT_EQ(x["pid"], 1);
      EXPECT_EQ(x["tid"], 1);
      EXPECT_EQ(args["path"], "staged");
      EXPECT_EQ(args["bytes"], 1 << 20);
      EXPECT_EQ(args["failed"], false);
      const uint32_t c = args["chunk"];
      chunks.push_back(c);
      // Microseconds since the origin; duration = end - start.
      EXPECT_DOUBLE_EQ(x["ts"].get<double>(), 1000.0 + c * 100.0 + 10.0);
      EXPECT_DOUBLE_EQ(x["dur"].get<double>(), 50.0);
    } else if (args["transfer"] == 8) {
      EXPECT_EQ(x["name"], "zero_copy d2h");
      EXPECT_EQ(x["tid"], 2);
      EXPECT_EQ(args["path"], "zero_copy");
      EXPECT_EQ(args["bytes"], 4096);
      EXPECT_DOUBLE_EQ(x["ts"].get<double>(), 2000.5);
      EXPECT_DOUBLE_EQ(x["dur"].get<double>(), 1.0);
    } else {
      EXPECT_EQ(args["transfer"], 9);
      EXPECT_EQ(x["pid"], 2);
      EXPECT_EQ(x["tid"], 3);
      EXPECT_EQ(args["path"], "copy");
      EXPECT_EQ(args["bytes"], 123);
      EXPECT_EQ(args["failed"], true);
      EXPECT_TRUE(absl::StrContains(x["name"].get<std::string>(), "failed"));
    }
  }
  std::sort(chunks.begin(), chunks.end());
  EXPECT_EQ(chunks, (std::vector<uint32_t>{0, 1, 2}));

  // The flows: one per descriptor, from its submit time to its start.
  std::map<double, double> flow;  // s ts -> f ts
  const auto starts = Events(root, "s");
  const auto ends = Events(root, "f");
  ASSERT_EQ(starts.size(), 5u);
  ASSERT_EQ(ends.size(), 5u);
  for (const json& s : starts) {
    for (const json& f : ends) {
      if (f["id"] == s["id"]) flow[s["ts"]] = f["ts"];
    }
  }
  EXPECT_EQ(flow, (std::map<double, double>{{1000.0, 1010.0},
                                            {1100.0, 1110.0},
                                            {1200.0, 1210.0},
                                            {2000.0, 2000.5},
                                            // Started as it was submitted:
                                            // the submit shows 1 ns before.
                                            {2999.999, 3000.0}}));

  const auto counters = Events(root, "C");
  ASSERT_EQ(counters.size(), 3u);
  std::vector<std::pair<double, uint64_t>> values;
  for (const json& c : counters) {
    values.emplace_back(c["ts"], c["args"]["bytes"]);
  }
  EXPECT_EQ(values, (std::vector<std::pair<double, uint64_t>>{
                        {900.0, 1 << 20}, {950.0, 2 << 20}, {1500.0, 0}}));

  // Only the trace is left in the directory: no "<path>.tmp.<pid>".
  EXPECT_EQ(ListDir(dir_.path()), std::vector<std::string>{"trace.json"});
}

TEST_F(TraceRecorderTest, ConcurrentDescriptorsGoToLanesAndEveryFlowBinds) {
  // Four descriptors of one queue in flight at once, two of them starting
  // at the same nanosecond and two submitted at the same nanosecond (an
  // NVMe queue, or several DMA engines): each one's slice and flow must
  // still be drawn.
  const std::string path = dir_.Join("lanes.json");
  TraceRecorder rec(path, &os_, kOrigin);
  rec.NameDevice(0, "vfio:0");
  const int64_t t = kOrigin + 1'000'000;
  rec.Descriptor(0, kH2d, "zero_copy", "h2d", 1, 0, 4096, t, t + 100,
                 t + 5'000, false);
  rec.Descriptor(0, kH2d, "zero_copy", "h2d", 1, 1, 4096, t, t + 100,
                 t + 6'000, false);
  rec.Descriptor(0, kH2d, "zero_copy", "h2d", 1, 2, 4096, t + 10, t + 200,
                 t + 4'000, false);
  rec.Descriptor(0, kH2d, "zero_copy", "h2d", 2, 0, 4096, t + 20, t + 5'000,
                 t + 9'000, false);
  ASSERT_TRUE(rec.Write().ok());
  json root = ParseTrace(path);
  ASSERT_FALSE(root.is_null());
  CheckStructure(root);
  const auto threads = ThreadNames(root);
  EXPECT_EQ(threads.at({1, 1}), "h2d queue");
  EXPECT_EQ(threads.at({1, 101}), "h2d queue 2");
  EXPECT_EQ(threads.at({1, 201}), "h2d queue 3");
  EXPECT_EQ(threads.count({1, 301}), 0u);  // the fourth reuses lane 1
  EXPECT_EQ(threads.at({1, 11}), "h2d submit");
  EXPECT_EQ(threads.at({1, 111}), "h2d submit 2");
  const testutil::TraceViewCheck view = testutil::CheckTraceView(root);
  EXPECT_EQ(view.flows_drawn_devtools, 4u);
  EXPECT_EQ(view.flows_drawn_perfetto, 4u);
}

TEST(TraceViewCheckTest, FindsFlowsTheViewersDoNotDraw) {
  // The check itself: a flow start whose slice has another category (the
  // bug DevTools showed as 0 flows), an end without "bp":"e" and outside
  // any slice, and two overlapping slices of one track.
  const json root = json::parse(R"({"traceEvents":[
    {"ph":"X","name":"submit","cat":"submit","pid":1,"tid":11,"ts":1.0,"dur":0.001},
    {"ph":"s","name":"d","cat":"dma","id":1,"pid":1,"tid":11,"ts":1.0},
    {"ph":"X","name":"staged h2d","cat":"dma","pid":1,"tid":1,"ts":2.0,"dur":5.0},
    {"ph":"f","bp":"e","name":"d","cat":"dma","id":1,"pid":1,"tid":1,"ts":2.0},
    {"ph":"X","name":"submit","cat":"dma","pid":1,"tid":11,"ts":3.0,"dur":0.001},
    {"ph":"s","name":"d","cat":"dma","id":2,"pid":1,"tid":11,"ts":3.0},
    {"ph":"f","name":"d","cat":"dma","id":2,"pid":1,"tid":1,"ts":9.0},
    {"ph":"X","name":"staged h2d","cat":"dma","pid":1,"tid":1,"ts":4.0,"dur":5.0}
  ]})");
  const testutil::TraceViewCheck view = testutil::CheckTraceView(root);
  EXPECT_EQ(view.slices, 4u);
  EXPECT_EQ(view.flows, 2u);
  EXPECT_EQ(view.flows_drawn_devtools, 0u);
  EXPECT_EQ(view.flows_drawn_perfetto, 1u);
  ASSERT_EQ(view.problems.size(), 3u);
  EXPECT_THAT(view.problems[0], ::testing::HasSubstr("overlaps"));
  EXPECT_THAT(view.problems[1], ::testing::HasSubstr("not drawn by DevTools:"));
  EXPECT_THAT(view.problems[2],
              ::testing::HasSubstr("not drawn by DevTools and Perfetto"));
}

TEST_F(TraceRecorderTest, EmptyTraceIsValid) {
  const std::string path = dir_.Join("empty.json");
  TraceRecorder rec(path, &os_, kOrigin);
  ASSERT_TRUE(rec.Write().ok());
  json root = ParseTrace(path);
  ASSERT_FALSE(root.is_null());
  CheckStructure(root);
  EXPECT_TRUE(DmaSlices(root).empty());
  EXPECT_TRUE(Events(root, "C").empty());
}

TEST_F(TraceRecorderTest, DeviceNamesAreEscaped) {
  const std::string path = dir_.Join("names.json");
  TraceRecorder rec(path, &os_, kOrigin);
  const std::string odd = "sim \"0\" \\ \n\t\x01 é";
  rec.NameDevice(0, odd);
  rec.NameDevice(2, "sim:2");  // device 1 unnamed
  rec.Descriptor(0, kH2d, "staged", "h2d", 1, 0, 10, kOrigin, kOrigin,
                 kOrigin + 1, false);
  ASSERT_TRUE(rec.Write().ok());
  json root = ParseTrace(path);
  ASSERT_FALSE(root.is_null());
  CheckStructure(root);
  const auto processes = ProcessNames(root);
  ASSERT_EQ(processes.count(1), 1u);
  EXPECT_EQ(processes.at(1), odd);
  EXPECT_EQ(processes.count(2), 0u);
  EXPECT_EQ(processes.at(3), "sim:2");
}

TEST_F(TraceRecorderTest, MaxRecordsCapsAndCountsDropped) {
  const std::string path = dir_.Join("capped.json");
  TraceRecorder rec(path, &os_, kOrigin, /*max_records=*/4);
  rec.NameDevice(0, "sim:0");
  for (uint32_t c = 0; c < 6; ++c) {
    rec.Descriptor(0, kH2d, "staged", "h2d", 1, c, 100, kOrigin + c * 10,
                   kOrigin + c * 10 + 1, kOrigin + c * 10 + 2, false);
  }
  rec.StagingBytes(kOrigin + 100, 0);
  rec.StagingBytes(kOrigin + 200, 0);
  EXPECT_EQ(rec.recorded(), 4u);
  EXPECT_EQ(rec.dropped(), 4u);
  ASSERT_TRUE(rec.Write().ok());
  json root = ParseTrace(path);
  ASSERT_FALSE(root.is_null());
  CheckStructure(root);
  EXPECT_EQ(root["otherData"]["dropped_records"], 4);
  // The first four were kept.
  const auto slices = DmaSlices(root);
  ASSERT_EQ(slices.size(), 4u);
  for (size_t i = 0; i < slices.size(); ++i) {
    EXPECT_EQ(slices[i]["args"]["chunk"], i);
  }
  EXPECT_TRUE(Events(root, "C").empty());
}

TEST_F(TraceRecorderTest, LargeTraceWrittenInPieces) {
  // Several MiB of JSON: written in more than one WriteAll.
  class CountingOs : public OsWrapper {
   public:
    using OsWrapper::OsWrapper;
    absl::Status WriteAll(int fd, const void* data, size_t size) override {
      ++writes;
      return OsWrapper::WriteAll(fd, data, size);
    }
    int writes = 0;
  } counting(&os_);
  const std::string path = dir_.Join("large.json");
  TraceRecorder rec(path, &counting, kOrigin);
  rec.NameDevice(0, "sim:0");
  constexpr int kDescriptors = 12'000;
  for (int i = 0; i < kDescriptors; ++i) {
    const int64_t t = kOrigin + int64_t{i} * 1000;
    static const char* kNames[] = {"h2d", "d2h", "d2d"};
    rec.Descriptor(0, i % 3, i % 3 == 2 ? "copy" : "staged", kNames[i % 3],
                   i / 4,
                   i % 4, 1 << 20, t, t + 100, t + 900, false);
    if (i % 10 == 0) rec.StagingBytes(t, (i % 7) << 20);
  }
  ASSERT_TRUE(rec.Write().ok());
  EXPECT_GT(counting.writes, 1);
  json root = ParseTrace(path);
  ASSERT_FALSE(root.is_null());
  CheckStructure(root);
  EXPECT_EQ(DmaSlices(root).size(), static_cast<size_t>(kDescriptors));
  EXPECT_EQ(Events(root, "C").size(), static_cast<size_t>(kDescriptors / 10));
}

TEST_F(TraceRecorderTest, RewritingReplacesTheFile) {
  const std::string path = dir_.Join("trace.json");
  {
    TraceRecorder rec(path, &os_, kOrigin);
    rec.NameDevice(0, "old");
    for (int i = 0; i < 50; ++i) {
      rec.Descriptor(0, kH2d, "staged", "h2d", i, 0, 1, kOrigin, kOrigin,
                     kOrigin, false);
    }
    ASSERT_TRUE(rec.Write().ok());
  }
  TraceRecorder rec(path, &os_, kOrigin);
  rec.NameDevice(0, "sim:0");
  rec.Descriptor(0, kH2d, "pinned", "h2d", 1, 0, 1, kOrigin, kOrigin,
                 kOrigin, false);
  ASSERT_TRUE(rec.Write().ok());
  json root = ParseTrace(path);
  ASSERT_FALSE(root.is_null());
  CheckStructure(root);
  ASSERT_EQ(DmaSlices(root).size(), 1u);
  EXPECT_EQ(DmaSlices(root)[0]["args"]["path"], "pinned");
  EXPECT_EQ(ProcessNames(root).at(1), "sim:0");
  EXPECT_EQ(ListDir(dir_.path()), std::vector<std::string>{"trace.json"});
}

TEST_F(TraceRecorderTest, UnwritablePathIsAnErrorAndLeavesNothingOpen) {
  const std::string path = dir_.Join("no/such/dir/trace.json");
  TraceRecorder rec(path, &os_, kOrigin);
  rec.Descriptor(0, kH2d, "staged", "h2d", 1, 0, 1, kOrigin, kOrigin, kOrigin,
                 false);
  absl::Status s = rec.Write();
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_EQ(os_.open_files(), 0u);
  EXPECT_FALSE(FileExists(path));
  EXPECT_TRUE(ListDir(dir_.path()).empty());
}

TEST_F(TraceRecorderTest, PathThatIsADirectoryFailsAtRenameAndCleansUp) {
  const std::string path = dir_.Join("a_directory");
  ASSERT_TRUE(Os::Default()->MakeDirectory(path, 0755).ok());
  ASSERT_TRUE(Os::Default()->MakeDirectory(path + "/child", 0755).ok());
  TraceRecorder rec(path, &os_, kOrigin);
  rec.Descriptor(0, kH2d, "staged", "h2d", 1, 0, 1, kOrigin, kOrigin, kOrigin,
                 false);
  EXPECT_FALSE(rec.Write().ok());
  EXPECT_EQ(os_.open_files(), 0u);
  // No temporary left next to it.
  EXPECT_EQ(ListDir(dir_.path()), std::vector<std::string>{"a_directory"});
}

TEST_F(TraceRecorderTest, WriteErrorClosesAndRemovesTheTemporary) {
  class FailingWriteOs : public OsWrapper {
   public:
    using OsWrapper::OsWrapper;
    absl::Status WriteAll(int, const void*, size_t) override {
      return absl::ResourceExhaustedError("write: no space left on device");
    }
  } failing(&os_);
  const std::string path = dir_.Join("trace.json");
  TraceRecorder rec(path, &failing, kOrigin);
  rec.Descriptor(0, kH2d, "staged", "h2d", 1, 0, 1, kOrigin, kOrigin, kOrigin,
                 false);
  absl::Status s = rec.Write();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(os_.open_files(), 0u);
  EXPECT_FALSE(FileExists(path));
  EXPECT_TRUE(ListDir(dir_.path()).empty());
}

// ---- The engine's trace ------------------------------------------------------

std::vector<char> Pattern(size_t n, int seed) {
  std::vector<char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<char>(i * 13 + seed);
  return v;
}

TEST(EngineTraceTest, WrittenAtShutdownWithEveryPath) {
  TempDir dir;
  const std::string path = dir.Join("transfers.json");
  TransferRig::Params params;
  params.engine.trace_file = path;
  params.engine.chunk_bytes = uint64_t{1} << 20;
  params.engine.from_device_chunk_bytes = uint64_t{1} << 20;
  params.engine.descriptor_bytes = uint64_t{1} << 20;
  auto rig = TransferRig::Create(params);
  ASSERT_TRUE(rig.ok()) << rig.status();
  TransferEngine& engine = (*rig)->engine();

  // Staged round trip of 5 MiB: five 1 MiB chunks each way.
  const uint64_t n = uint64_t{5} << 20;
  std::vector<char> src = Pattern(n, 1), dst(n);
  ASSERT_EQ(engine.PathFor(src.data(), n), TransferPath::kStaged);
  auto a = engine.Allocate(0, n);
  auto b = engine.Allocate(0, n);
  ASSERT_TRUE(a.ok() && b.ok());
  auto up = engine.TransferToDevice(src.data(), *a, 0, n);
  ASSERT_TRUE(up.ok()) << up.status();
  auto down = engine.TransferFromDevice(*a, 0, dst.data(), n, {*up});
  ASSERT_TRUE(down.ok()) << down.status();
  ASSERT_TRUE(down->Await().ok()) << down->Await();
  ASSERT_EQ(src, dst);

  // Zero-copy: from the premapped region.
  const uint64_t zn = 300'000;
  auto region_mem = (*rig)->region()->allocator().Allocate(zn);
  ASSERT_TRUE(region_mem.ok()) << region_mem.status();
  std::memcpy(*region_mem, src.data(), zn);
  ASSERT_EQ(engine.PathFor(*region_mem, zn), TransferPath::kZeroCopy);
  auto zc = engine.TransferToDevice(*region_mem, *b, 0, zn);
  ASSERT_TRUE(zc.ok()) << zc.status();
  ASSERT_TRUE(zc->Await().ok());

  // Device to device.
  auto copy = engine.TransferDeviceToDevice(*a, 0, *b, 0, n);
  ASSERT_TRUE(copy.ok()) << copy.status();
  ASSERT_TRUE(copy->Await().ok());
  ASSERT_TRUE((*rig)->region()->allocator().Free(*region_mem).ok());
  const auto stats = engine.GetStats();
  EXPECT_EQ(stats.host[kH2d][static_cast<int>(TransferPath::kStaged)].transfers,
            1u);
  EXPECT_EQ(
      stats.host[kH2d][static_cast<int>(TransferPath::kZeroCopy)].transfers,
      1u);

  // Nothing is written before shutdown.
  EXPECT_FALSE(FileExists(path));
  EXPECT_EQ((*rig)->TearDownAndReport(), "");
  ASSERT_TRUE(FileExists(path));
  EXPECT_EQ(ListDir(dir.path()), std::vector<std::string>{"transfers.json"});

  json root = ParseTrace(path);
  ASSERT_FALSE(root.is_null());
  CheckStructure(root);
  if (HasFatalFailure()) return;
  EXPECT_EQ(root["otherData"]["dropped_records"], 0);
  EXPECT_EQ(ProcessNames(root).size(), 2u);  // host and the one device

  // Slices by (path, direction track) -> transfer -> chunks.
  std::map<std::pair<std::string, int>,
           std::map<uint64_t, std::vector<uint32_t>>>
      by_path;
  uint64_t copy_bytes = 0, zero_copy_bytes = 0;
  for (const json& x : DmaSlices(root)) {
    const json& args = x["args"];
    EXPECT_EQ(args["failed"], false) << x;
    const std::string p = args["path"];
    by_path[{p, x["tid"].get<int>()}][args["transfer"].get<uint64_t>()]
        .push_back(args["chunk"].get<uint32_t>());
    if (p == "copy") copy_bytes += args["bytes"].get<uint64_t>();
    if (p == "zero_copy") zero_copy_bytes += args["bytes"].get<uint64_t>();
    if (p == "staged") {
      EXPECT_EQ(args["bytes"], uint64_t{1} << 20) << x;
    }
  }
  const auto chunks_of = [&](const std::string& p, int direction) {
    const auto& transfers = by_path[{p, direction + 1}];
    EXPECT_EQ(transfers.size(), 1u) << p << " on track " << direction + 1;
    std::vector<uint32_t> chunks =
        transfers.empty() ? std::vector<uint32_t>{} : transfers.begin()->second;
    std::sort(chunks.begin(), chunks.end());
    return chunks;
  };
  const std::vector<uint32_t> five = {0, 1, 2, 3, 4};
  EXPECT_EQ(chunks_of("staged", kH2d), five);
  EXPECT_EQ(chunks_of("staged", kD2h), five);
  EXPECT_FALSE(chunks_of("zero_copy", kH2d).empty());
  EXPECT_FALSE(chunks_of("copy", kD2d).empty());
  EXPECT_EQ(zero_copy_bytes, zn);
  EXPECT_EQ(copy_bytes, n);
  // Nothing else was traced.
  EXPECT_EQ(by_path.size(), 4u);
  // One flow per descriptor (CheckStructure matched them up).
  EXPECT_EQ(Events(root, "s").size(), DmaSlices(root).size());

  // The staging counter: present, never above the bound, and back to 0.
  std::vector<std::pair<double, uint64_t>> counter;
  for (const json& c : Events(root, "C")) {
    counter.emplace_back(c["ts"].get<double>(), c["args"]["bytes"]);
  }
  ASSERT_FALSE(counter.empty());
  std::stable_sort(counter.begin(), counter.end(),
                   [](const auto& x, const auto& y) { return x.first < y.first; });
  uint64_t peak = 0;
  for (const auto& [ts, bytes] : counter) peak = std::max(peak, bytes);
  EXPECT_GE(peak, uint64_t{1} << 20);
  EXPECT_LE(peak, stats.max_staging_bytes);
  EXPECT_EQ(counter.back().second, 0u) << "the last staging value";
}

TEST(EngineTraceTest, UnwritableTraceFileDoesNotBreakShutdown) {
  TempDir dir;
  TransferRig::Params params;
  params.engine.trace_file = dir.Join("missing/transfers.json");
  auto rig = TransferRig::Create(params);
  ASSERT_TRUE(rig.ok()) << rig.status();
  TransferEngine& engine = (*rig)->engine();
  std::vector<char> src = Pattern(4096, 3), dst(4096);
  auto a = engine.Allocate(0, 4096);
  ASSERT_TRUE(a.ok());
  auto up = engine.TransferToDevice(src.data(), *a, 0, 4096);
  ASSERT_TRUE(up.ok());
  auto down = engine.TransferFromDevice(*a, 0, dst.data(), 4096, {*up});
  ASSERT_TRUE(down.ok());
  ASSERT_TRUE(down->Await().ok());
  // No descriptor stays open, nothing else is left behind.
  EXPECT_EQ((*rig)->TearDownAndReport(), "");
  EXPECT_TRUE(ListDir(dir.path()).empty());
}

}  // namespace
}  // namespace tpushim
