// End-to-end tests of TPUSHIM_MEMORY_PROFILE, `tpushim memory` and
// `tpushim demo --shapes`: the built tool runs as a subprocess; profiles
// are written by hand (for exact figures) and by the runtime.

#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace tpushim {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;
using testutil::RunSubprocess;
using testutil::SubprocessResult;

using Json = nlohmann::ordered_json;

SubprocessResult Tool(const std::vector<std::string>& args,
                      const std::vector<std::string>& env = {
                          "PATH=/usr/bin:/bin"}) {
  absl::StatusOr<SubprocessResult> r =
      RunSubprocess(TPUSHIM_TOOL_PATH, args, env, absl::Seconds(120));
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : SubprocessResult{};
}

void Write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// One device of 1 MiB: a one-hot tensor (512000 padded, 40000 unpadded)
// and a byte buffer are live at the peak; a 4 MiB request fails; the
// one-hot tensor is freed, then the byte buffer at shut-down.
constexpr char kProfile[] =
    R"({"tpushim_memory_profile":1,"pid":77,"started":"2026-11-26T10:00:00+00:00","devices":[{"name":"sim:0","hbm_bytes":1048576,"granule":64},{"name":"sim:1","hbm_bytes":1048576,"granule":64}]}
{"t":0.100000,"event":"alloc","device":0,"id":1,"device_bytes":512000,"padded_bytes":512000,"unpadded_bytes":40000,"shape":"s32[1000,10]{1,0:T(8,128)}","label":"one_hot","op":"op_type=\"OneHot\""}
{"t":0.200000,"event":"alloc","device":0,"id":2,"device_bytes":1000,"padded_bytes":1000,"unpadded_bytes":1000}
{"t":0.300000,"event":"failed","device":0,"device_bytes":4194304,"padded_bytes":4194304,"unpadded_bytes":4194304,"shape":"f32[1024,1024]{1,0:T(8,128)}","label":"big"}
{"t":0.400000,"event":"free","device":0,"id":1}
{"t":0.500000,"event":"free","device":0,"id":2}
{"t":0.500100,"event":"end"}
)";

TEST(MemoryTest, PrintsThePeakItsBuffersAndTheFailedRequests) {
  testutil::TempDir dir;
  const std::string path = dir.Join("p.jsonl");
  Write(path, kProfile);
  const SubprocessResult r = Tool({"memory", path});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, StartsWith(absl::StrCat(
                         "Memory profile ", path,
                         ": pid 77, started 2026-11-26T10:00:00+00:00, 0.500 "
                         "s, 2 devices.\n")));
  EXPECT_THAT(r.out, Not(HasSubstr("no end record")));
  EXPECT_THAT(r.out,
              HasSubstr("sim:0 (1.00M hbm): 2 allocations, 2 frees, 1 failed "
                        "request\n"
                        "  Peak: 501.0K padded, 40.0K unpadded (8.0% "
                        "utilization) in 2 buffers at 0.200 s; 48.9% of the "
                        "hbm\n"));
  EXPECT_THAT(r.out, HasSubstr("  1. Size: 500.0K\n"
                               "     Operator: op_type=\"OneHot\"\n"
                               "     Shape: s32[1000,10]{1,0:T(8,128)}\n"
                               "     Unpadded size: 39.1K\n"));
  EXPECT_THAT(r.out, HasSubstr("  2. Size: 1000B\n"));
  EXPECT_THAT(r.out, HasSubstr("Where the padding comes from:\n  1. "
                               "s32[1000,10]{1,0:T(8,128)}: dimension 1 (10) "
                               "is padded to 128"));
  EXPECT_THAT(r.out, HasSubstr("  Failed requests:\n    at 0.300 s: 4.00M "
                               "f32[1024,1024]{1,0:T(8,128)} (big)\n"
                               "  At the end: 0 buffers.\n"));
  EXPECT_THAT(r.out, HasSubstr("sim:1 (1.00M hbm): no allocations.\n"));
}

TEST(MemoryTest, JsonGivesTheSameFigures) {
  testutil::TempDir dir;
  const std::string path = dir.Join("p.jsonl");
  Write(path, kProfile);
  const SubprocessResult r = Tool({"memory", "--json", path});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Json j = Json::parse(r.out);
  EXPECT_EQ(j["complete"], true);
  EXPECT_EQ(j["cut_short"], false);
  EXPECT_EQ(j["plot"], nullptr);
  const Json& d = j["devices"][0];
  EXPECT_EQ(d["allocations"], 2);
  EXPECT_EQ(d["peak"]["padded_bytes"], 513000);
  EXPECT_EQ(d["peak"]["unpadded_bytes"], 41000);
  EXPECT_EQ(d["peak"]["buffers"], 2);
  EXPECT_DOUBLE_EQ(d["peak"]["t"].get<double>(), 0.2);
  EXPECT_EQ(d["peak"]["largest"][0]["label"], "one_hot");
  EXPECT_EQ(d["peak"]["largest"][1]["shape"], nullptr);
  EXPECT_EQ(d["failed_requests"][0]["size_bytes"], 4194304);
  EXPECT_EQ(d["end"]["buffers"], 0);
  EXPECT_EQ(j["devices"][1]["peak"], nullptr);
}

TEST(MemoryTest, PlotsPngAndSvg) {
  testutil::TempDir dir;
  const std::string path = dir.Join("p.jsonl");
  Write(path, kProfile);
  for (const char* name : {"mem.png", "mem.svg"}) {
    const std::string plot = dir.Join(name);
    const SubprocessResult r = Tool({"memory", path, "--plot", plot});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_THAT(r.out, HasSubstr(absl::StrCat("Plot: ", plot, "\n")));
    const std::string image = testutil::ReadFileOrEmpty(plot);
    if (absl::EndsWith(name, ".png")) {
      EXPECT_THAT(image, StartsWith("\x89PNG"));
    } else {
      EXPECT_THAT(image, HasSubstr("<svg"));
      // The panel of the device that allocated, with its peak and the
      // capacity line; the idle device gets no panel.
      EXPECT_THAT(image, HasSubstr("sim:0: peak 501.0K padded"));
      EXPECT_THAT(image, HasSubstr("hbm 1.00M"));
      EXPECT_THAT(image, HasSubstr("failed request"));
      EXPECT_THAT(image, Not(HasSubstr("sim:1: peak")));
    }
  }
}

TEST(MemoryTest, MalformedProfilesAreNamedByLine) {
  testutil::TempDir dir;
  const std::string header =
      R"({"tpushim_memory_profile":1,"devices":[{"name":"sim:0","hbm_bytes":1048576}]})"
      "\n";
  struct Case {
    std::string text;
    std::string error;
  };
  const std::vector<Case> cases = {
      {"", "the file is empty"},
      {"{\"hello\":1}\n", "line 1: not a tpushim memory profile"},
      {"{\"tpushim_memory_profile\":2,\"devices\":[]}\n",
       "line 1: profile format 2"},
      {header + R"({"t":0.1,"event":"free","device":0,"id":7})"
                "\n",
       "line 2: free of id 7"},
      {header + R"({"t":0.1,"event":"alloc","device":3,"id":7})"
                "\n",
       "line 2: \"device\" is not one of the 1 devices"},
      {header + R"({"t":0.1,"event":"alloc","device":0,"id":7})"
                "\n",
       "line 2: \"device_bytes\" is missing"},
      {header +
           "{\"t\":0.2,\"event\":\"end\"}\n{\"t\":0.1,\"event\":\"end\"}\n",
       "line 3: a record after the end record"},
      {header + "not json\n{\"t\":0.1,\"event\":\"end\"}\n",
       "line 2: not a JSON object"},
      {header + "{\"t\":1e400,\"event\":\"end\"}\n",
       "line 2: not a JSON object"},  // a number beyond double's range
      {header + "{\"t\":\"soon\",\"event\":\"end\"}\n",
       "line 2: \"t\" is missing or not a time"},
      {header +
           R"({"t":0.1,"event":"alloc","device":0,"id":1,"device_bytes":1,"padded_bytes":18446744073709551615,"unpadded_bytes":1})"
           "\n"
           R"({"t":0.2,"event":"alloc","device":0,"id":2,"device_bytes":1,"padded_bytes":2,"unpadded_bytes":1})"
           "\n",
       "line 3: the bytes in use would pass 2^64"},
      {"\n\n", "the file is empty"},
  };
  for (const Case& c : cases) {
    const std::string path = dir.Join("bad.jsonl");
    Write(path, c.text);
    const SubprocessResult r = Tool({"memory", path});
    EXPECT_EQ(r.exit_code, 2) << c.text << r.err;
    EXPECT_THAT(r.err, HasSubstr(c.error)) << c.text;
    EXPECT_THAT(r.out, testing::IsEmpty());
  }
  const SubprocessResult missing = Tool({"memory", dir.Join("none.jsonl")});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_THAT(missing.err, HasSubstr("cannot read the profile"));
  const SubprocessResult bad_plot =
      Tool({"memory", dir.Join("none.jsonl"), "--plot", "x.jpg"});
  EXPECT_EQ(bad_plot.exit_code, 2);
  EXPECT_THAT(bad_plot.err, HasSubstr("must end in .svg or .png"));
}

// Written on another system (CRLF) and with blank lines at the end: read
// as the same profile.
TEST(MemoryTest, CrlfAndTrailingBlankLinesReadTheSame) {
  testutil::TempDir dir;
  const std::string path = dir.Join("p.jsonl");
  Write(path, absl::StrReplaceAll(kProfile, {{"\n", "\r\n"}}) + "\r\n\n");
  const SubprocessResult r = Tool({"memory", "--json", path});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Json j = Json::parse(r.out);
  EXPECT_EQ(j["complete"], true);
  EXPECT_EQ(j["devices"][0]["peak"]["padded_bytes"], 513000);
}

// A device name is the file's text: what it holds never reaches gnuplot
// as a command (a newline would start one; gnuplot has `system`).
TEST(MemoryTest, NamesFromTheFileCannotRunGnuplotCommands) {
  testutil::TempDir dir;
  const std::string path = dir.Join("p.jsonl");
  const std::string pwned = dir.Join("pwned");
  std::string text = kProfile;
  const std::string evil =
      absl::StrCat("sim:0'\\nsystem 'touch ", pwned, "'\\n#");
  text.replace(text.find("\"sim:0\""), 7, absl::StrCat("\"", evil, "\""));
  Write(path, text);
  const SubprocessResult r =
      Tool({"memory", path, "--plot", dir.Join("mem.svg")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(testutil::ReadFileOrEmpty(pwned).empty());
  EXPECT_NE(access(pwned.c_str(), F_OK), 0) << "gnuplot ran the name";
  EXPECT_THAT(testutil::ReadFileOrEmpty(dir.Join("mem.svg")),
              HasSubstr("sim:0"));
}

// A process that died: no end record, and a last line cut in the middle.
TEST(MemoryTest, AProfileCutShortIsReadUpToItsLastWholeRecord) {
  testutil::TempDir dir;
  const std::string path = dir.Join("p.jsonl");
  std::string text = kProfile;
  text = text.substr(0, text.find("{\"t\":0.400000"));
  text += R"({"t":0.400000,"event":"fr)";
  Write(path, text);
  const SubprocessResult r = Tool({"memory", path});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("Its last line is incomplete and was skipped"));
  EXPECT_THAT(r.out, HasSubstr("It has no end record"));
  EXPECT_THAT(r.out, HasSubstr("  At the end: 2 buffers, 501.0K padded, "
                               "40.0K unpadded.\n"));
}

// The runtime writes the profile; `tpushim memory` reads it back.
TEST(MemoryTest, ReadsWhatTheRuntimeRecorded) {
  testutil::TempDir dir;
  const std::string profile = dir.Join("mem.jsonl");
  const SubprocessResult shape = Tool(
      {"shape", "--hbm", "1M", "s32[1000,10]=one_hot", "f32[1024,1024]=big"},
      {"PATH=/usr/bin:/bin", "TPUSHIM_MEMORY_PROFILE=" + profile});
  EXPECT_EQ(shape.exit_code, 1) << shape.err;
  const SubprocessResult r = Tool({"memory", "--json", profile});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Json j = Json::parse(r.out);
  EXPECT_EQ(j["complete"], true);
  const Json& d = j["devices"][0];
  EXPECT_EQ(d["allocations"], 1);
  EXPECT_EQ(d["frees"], 1);
  EXPECT_EQ(d["peak"]["padded_bytes"], 512000);
  EXPECT_EQ(d["peak"]["largest"][0]["shape"], "s32[1000,10]{1,0:T(8,128)}");
  EXPECT_EQ(d["failed_requests"][0]["label"], "big");
}

// On a 1 MiB device even the smallest model does not fit: the demo says so
// with the runtime's report and counts it, instead of running.
TEST(MemoryTest, DemoShapesOnATinyDeviceReportsTheHbmReport) {
  testutil::TempDir dir;
  const SubprocessResult demo = Tool(
      {"demo", "--shapes", "--steps", "3", "--batch-bytes", "4K", "--json"},
      {"PATH=/usr/bin:/bin", "TPU_LOG_DIR=" + dir.Join("logs"),
       "TPU_PREMAPPED_BUFFER_SIZE=16777216",
       "TPUSHIM_DEVICE=sim://?devices=1&hbm=1M"});
  EXPECT_EQ(demo.exit_code, 1) << demo.err << demo.out;
  const Json j = Json::parse(demo.out);
  EXPECT_EQ(j["errors"], 1);
  EXPECT_EQ(j["error_detail"]["failed_allocations"], 1);
  EXPECT_EQ(j["shapes"]["divisor"], 1024);
  EXPECT_THAT(j["shapes"]["error"].get<std::string>(),
              HasSubstr("Ran out of memory in memory space hbm."));
  EXPECT_EQ(j["steps"], 0);
}

TEST(MemoryTest, DemoShapesHoldsAModelAndRecordsIt) {
  testutil::TempDir dir;
  const std::string profile = dir.Join("mem.jsonl");
  const SubprocessResult demo =
      Tool({"demo", "--shapes", "--steps", "5", "--batch-bytes", "1M",
            "--step-ms", "1", "--json"},
           {"PATH=/usr/bin:/bin", "TPU_LOG_DIR=" + dir.Join("logs"),
            "TPU_PREMAPPED_BUFFER_SIZE=16777216",
            "TPUSHIM_DEVICE=sim://?devices=2&hbm=256M",
            "TPUSHIM_MEMORY_PROFILE=" + profile});
  ASSERT_EQ(demo.exit_code, 0) << demo.err << demo.out;
  const Json j = Json::parse(demo.out);
  const Json& s = j["shapes"];
  EXPECT_EQ(s["arrays"], 6);
  // The full model takes about 270M a device: scaled to a quarter of 256M.
  EXPECT_GE(s["divisor"].get<int>(), 2);
  EXPECT_EQ(s["worst_padded"]["label"], "loss/one_hot");
  EXPECT_THAT(s["worst_padded"]["shape"].get<std::string>(),
              HasSubstr(",10]{1,0:T(8,128)}"));
  EXPECT_NEAR(s["worst_padded"]["expansion"].get<double>(), 12.8, 0.01);
  EXPECT_EQ(s["array_transfers"], 6);
  EXPECT_EQ(s["round_trips_exact"], true);
  ASSERT_EQ(s["devices"].size(), 2u);
  for (const Json& d : s["devices"]) {
    EXPECT_GT(d["peak_padded_bytes"], d["peak_unpadded_bytes"]);
    EXPECT_LE(d["peak_padded_bytes"].get<uint64_t>(), uint64_t{256} << 20);
  }
  EXPECT_EQ(j["errors"], 0);

  const SubprocessResult r = Tool({"memory", "--json", profile});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Json m = Json::parse(r.out);
  EXPECT_EQ(m["complete"], true);
  for (const Json& d : m["devices"]) {
    // 6 arrays, the pipeline's 4 buffers, 5 steps' activations, a
    // gradient at step 3; every one freed.
    EXPECT_EQ(d["allocations"], 6 + 4 + 5 + 1);
    EXPECT_EQ(d["frees"], d["allocations"]);
    EXPECT_EQ(d["end"]["buffers"], 0);
  }
}

}  // namespace
}  // namespace tpushim
