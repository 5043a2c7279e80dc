// End-to-end tests of `tpushim shape`: the built tool runs as a subprocess
// in an empty environment; its tables, JSON, exit statuses and the HBM
// report of --hbm are checked against hand-computed sizes.

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"

namespace tpushim {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using testutil::RunSubprocess;
using testutil::SubprocessResult;

using Json = nlohmann::ordered_json;

SubprocessResult Shape(const std::vector<std::string>& args) {
  std::vector<std::string> full = {"shape"};
  full.insert(full.end(), args.begin(), args.end());
  absl::StatusOr<SubprocessResult> r =
      RunSubprocess(TPUSHIM_TOOL_PATH, full, {}, absl::Seconds(60));
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : SubprocessResult{};
}

TEST(ShapeTest, PrintsXlasLinesWithTheLayoutUsed) {
  const SubprocessResult r = Shape({"s32[29360128,10]=one_hot"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out,
            "s32[29360128,10]{1,0:T(8,128)}  (one_hot)  [TPU's default "
            "layout]\n"
            "  Size: 14.00G\n"
            "  Unpadded size: 1.09G\n"
            "  Extra memory due to padding: 12.91G (12.8x expansion)\n"
            "  Padding: dimension 1 (10) is padded to 128 by the tile "
            "T(8,128); use 128, or reshape\n");
  EXPECT_THAT(r.err, IsEmpty());
}

TEST(ShapeTest, JsonHasEveryShapeInOrder) {
  const SubprocessResult r =
      Shape({"--json", "s32[29360128,10]", "f32[8,128]{1,0:T(8,128)}=w",
             "(f32[2], s8[3,5])"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Json j = Json::parse(r.out);
  ASSERT_EQ(j["shapes"].size(), 3u);
  const Json& a = j["shapes"][0];
  EXPECT_EQ(a["shape"], "s32[29360128,10]");
  EXPECT_EQ(a["label"], nullptr);
  EXPECT_EQ(a["layout"], "s32[29360128,10]{1,0:T(8,128)}");
  EXPECT_EQ(a["layout_given"], false);
  EXPECT_EQ(a["size_bytes"], 15032385536u);
  EXPECT_EQ(a["unpadded_bytes"], 1174405120u);
  EXPECT_EQ(a["padding_bytes"], 15032385536u - 1174405120u);
  EXPECT_NEAR(a["expansion"].get<double>(), 12.8, 1e-9);
  ASSERT_EQ(a["padded_dimensions"].size(), 1u);
  EXPECT_EQ(a["padded_dimensions"][0]["dimensions"], Json::array({1}));
  EXPECT_EQ(a["padded_dimensions"][0]["padded_size"], 128);
  const Json& b = j["shapes"][1];
  EXPECT_EQ(b["label"], "w");
  EXPECT_EQ(b["layout_given"], true);
  EXPECT_EQ(b["size_bytes"], 4096u);
  EXPECT_EQ(b["padding"], "no padding");
  const Json& t = j["shapes"][2];
  EXPECT_EQ(t["layout"], "(f32[2]{0:T(256)}, s8[3,5]{1,0:T(4,128)(4,1)})");
  ASSERT_EQ(t["elements"].size(), 2u);
  // f32[2] fills a 256-element tile: 1 KiB; s8[3,5]: 4 x 128 bytes.
  EXPECT_EQ(t["elements"][0]["size_bytes"], 1024u);
  EXPECT_EQ(t["elements"][1]["size_bytes"], 512u);
  EXPECT_EQ(t["size_bytes"], 1536u);
  EXPECT_EQ(t["unpadded_bytes"], 8u + 15u);
  EXPECT_FALSE(j.contains("hbm"));
}

TEST(ShapeTest, MalformedShapeIsAUsageErrorPointingAtTheColumn) {
  const SubprocessResult r = Shape({"f32[2]", "f32[128,256"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("f32[128,256: expected ',' or ']' at column "
                               "12"));
  EXPECT_THAT(r.out, IsEmpty());
  const SubprocessResult j = Shape({"--json", "f33[2]"});
  EXPECT_EQ(j.exit_code, 2);
  EXPECT_EQ(Json::parse(j.out)["error"]["code"], "INVALID_ARGUMENT");
}

// Each array fits 64 bits, their tuple does not; an array of no elements
// parses but no device buffer can hold it. Both are bad input, not a
// crash and not "does not fit".
TEST(ShapeTest, ATupleTooLargeOrAnEmptyArrayIsAUsageError) {
  const SubprocessResult r =
      Shape({"(f32[2305843009213693952],f32[2305843009213693952])"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("tpushim: bad shape: INVALID_ARGUMENT"));
  const SubprocessResult e = Shape({"--hbm", "16G", "f32[0,10]"});
  EXPECT_EQ(e.exit_code, 2) << e.err << e.out;
  EXPECT_THAT(e.err, HasSubstr("has no elements"));
}

TEST(ShapeTest, NoShapeOrABadHbmIsAUsageError) {
  EXPECT_EQ(Shape({}).exit_code, 2);
  const SubprocessResult r = Shape({"--hbm", "lots", "f32[2]"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--hbm must be a byte size"));
}

// --hbm takes what a simulated device takes (1M to 1T): below that is a
// usage error before anything runs, not a device that fails to start.
TEST(ShapeTest, HbmOutsideTheSimulatedDevicesRangeIsAUsageError) {
  for (const char* hbm : {"512K", "4K", "1048575", "2T"}) {
    const SubprocessResult r = Shape({"--hbm", hbm, "f32[2]"});
    EXPECT_EQ(r.exit_code, 2) << hbm << ": " << r.err;
    EXPECT_THAT(r.err, HasSubstr("--hbm")) << hbm;
    EXPECT_THAT(r.err, HasSubstr("from 1M to 1T")) << hbm;
    EXPECT_THAT(r.err, Not(HasSubstr("did not start"))) << hbm;
    EXPECT_THAT(r.out, IsEmpty()) << hbm;
  }
  const SubprocessResult low = Shape({"--hbm", "1M", "f32[2]"});
  EXPECT_EQ(low.exit_code, 0) << low.err;
  EXPECT_THAT(low.out, HasSubstr("All 1 arrays fit in 1.00M hbm"));
}

// An element type in upper case gets the did-you-mean the subcommands
// give, with the reason.
TEST(ShapeTest, AnUpperCaseElementTypeGetsTheLowerCaseHint) {
  const SubprocessResult r = Shape({"F32[2]"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("unknown element type 'F32' at column 1; did "
                               "you mean f32? (element types are lower "
                               "case)"));
}

TEST(ShapeTest, HbmThatHoldsThemSaysSo) {
  const SubprocessResult r =
      Shape({"--hbm", "64M", "f32[1024,1024]=a", "(f32[2], s8[3,5])=t"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\nAll 3 arrays fit in 64.00M hbm: 4.00M "
                               "used.\n"));
  const Json j = Json::parse(
      Shape({"--json", "--hbm", "64M", "f32[1024,1024]=a"}).out)["hbm"];
  EXPECT_EQ(j["capacity_bytes"], 64u << 20);
  EXPECT_EQ(j["fits"], true);
  EXPECT_EQ(j["allocated"], 1);
  EXPECT_EQ(j["used_bytes"], 4u << 20);
  EXPECT_EQ(j["error"], nullptr);
}

TEST(ShapeTest, HbmThatDoesNotHoldThemPrintsTheRuntimesReport) {
  const SubprocessResult r = Shape(
      {"--hbm", "16M", "f32[1024,1024]=weights", "s32[100000,10]=one_hot"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out,
              HasSubstr("\nRESOURCE_EXHAUSTED: Error allocating device "
                        "buffer: Attempting to allocate 48.83M. That was not "
                        "possible. There are 12.00M free.; (0x0x0_HBM0)\n"
                        "Ran out of memory in memory space hbm. Used 52.83M "
                        "of 16.00M hbm. Exceeded hbm capacity by 36.83M.\n"));
  EXPECT_THAT(r.out, HasSubstr("     XLA label: one_hot\n"
                               "     Allocation type: failed request\n"));
  EXPECT_THAT(r.out, HasSubstr("     XLA label: weights\n"
                               "     Allocation type: live buffer\n"));
  // The runtime's own ERROR log line stays out of the way.
  EXPECT_THAT(r.err, Not(HasSubstr("region_allocator")));
  const Json j =
      Json::parse(Shape({"--json", "--hbm", "16M", "f32[1024,1024]=weights",
                         "s32[100000,10]=one_hot"})
                      .out)["hbm"];
  EXPECT_EQ(j["fits"], false);
  EXPECT_EQ(j["allocated"], 1);
  EXPECT_THAT(j["error"].get<std::string>(),
              HasSubstr("Largest program allocations in hbm:"));
}

}  // namespace
}  // namespace tpushim
