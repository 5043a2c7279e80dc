// XLA's HBM report as tpushim prints it: the figures, the order of the
// list, the lines a byte buffer leaves out, and the case XLA never has (a
// request that fits the capacity but no free block).

#include "device/hbm_report.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpushim {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

HbmBuffer Shaped(const std::string& text, std::string label,
                 bool failed = false) {
  HbmBuffer b;
  b.shape = ParseArrayShape(text).value();
  const ShapeSizes sizes = ComputeSizes(*b.shape).value();
  b.padded_bytes = sizes.padded_bytes;
  b.unpadded_bytes = sizes.unpadded_bytes;
  b.held_bytes = sizes.padded_bytes;
  b.label = std::move(label);
  b.failed_request = failed;
  return b;
}

HbmBuffer Bytes(uint64_t n, uint64_t held) {
  HbmBuffer b;
  b.padded_bytes = n;
  b.unpadded_bytes = n;
  b.held_bytes = held;
  return b;
}

TEST(HbmReportTest, XlasOneHotExample) {
  HbmBuffer one_hot = Shaped("s32[29360128,10]", "%iota.2", true);
  one_hot.op_metadata = "op_type=\"OneHot\" op_name=\"model/loss/one_hot\"";
  const std::string r = FormatHbmReport(
      uint64_t{16} << 30,
      {Bytes(uint64_t{3} << 30, (uint64_t{3} << 30) + 4096), one_hot});
  EXPECT_THAT(r, HasSubstr("Ran out of memory in memory space hbm. Used "
                           "17.00G of 16.00G hbm. Exceeded hbm capacity by "
                           "1.00G.\n"));
  // Unpadded 1.09G + 3G of 17G padded; 4 KiB the allocator adds.
  EXPECT_THAT(r, HasSubstr("    device buffers 17.00G (24.1% utilization: "
                           "Unpadded (4.09G) Padded (17.00G), 0.0% "
                           "fragmentation (4.0K))\n"));
  EXPECT_THAT(r, HasSubstr("Largest program allocations in hbm:\n\n"
                           "  1. Size: 14.00G\n"
                           "     Operator: op_type=\"OneHot\" "
                           "op_name=\"model/loss/one_hot\"\n"
                           "     Shape: s32[29360128,10]{1,0:T(8,128)}\n"
                           "     Unpadded size: 1.09G\n"
                           "     Extra memory due to padding: 12.91G (12.8x "
                           "expansion)\n"
                           "     XLA label: %iota.2\n"
                           "     Allocation type: failed request\n"
                           "     ==========================\n\n"
                           "  2. Size: 3.00G\n"
                           "     Unpadded size: 3.00G\n"
                           // As XLA: no padding, no "Extra memory" line.
                           "     XLA label: (none)\n"));
  EXPECT_THAT(r, HasSubstr("\nWhere the padding comes from:\n  1. "
                           "s32[29360128,10]{1,0:T(8,128)}: dimension 1 (10) "
                           "is padded to 128"));
}

TEST(HbmReportTest, FitsButFragmented) {
  const std::string r = FormatHbmReport(
      uint64_t{16} << 20, {Bytes(4 << 20, 4 << 20), Bytes(4 << 20, 4 << 20),
                           Shaped("f32[1024,1024]", "x", /*failed=*/true)});
  EXPECT_THAT(r, HasSubstr("Used 12.00M of 16.00M hbm. Within hbm capacity, "
                           "but no free block of 4.00M is left: the free "
                           "memory is fragmented.\n"));
  EXPECT_THAT(r, Not(HasSubstr("Exceeded")));
  EXPECT_THAT(r, Not(HasSubstr("Where the padding comes from")));
}

TEST(HbmReportTest, ListsTheLargestAndAlwaysTheRequest) {
  std::vector<HbmBuffer> buffers;
  for (int i = 1; i <= 12; ++i) {
    buffers.push_back(Bytes(uint64_t(i) << 20, uint64_t(i) << 20));
  }
  buffers.push_back(Shaped("u8[1024]", "small", /*failed=*/true));
  const std::string r = FormatHbmReport(uint64_t{64} << 20, buffers, 3);
  EXPECT_THAT(r, HasSubstr("  1. Size: 12.00M\n"));
  EXPECT_THAT(r, HasSubstr("  2. Size: 11.00M\n"));
  // The third place goes to the request, smaller than every live buffer.
  EXPECT_THAT(r, HasSubstr("  3. Size: 1.0K\n"));
  EXPECT_THAT(r, Not(HasSubstr("  4. ")));
  EXPECT_THAT(r, HasSubstr("Allocation type: failed request"));
}

// A "negative" size through the C ABI is 2^64 - n: the sums stop at the
// top, so the report says the request exceeds the capacity instead of
// wrapping to a small Used and blaming fragmentation.
TEST(HbmReportTest, AHugeRequestSaturatesInsteadOfWrapping) {
  HbmBuffer request = Bytes(UINT64_MAX, UINT64_MAX);
  request.failed_request = true;
  const std::string report =
      FormatHbmReport(uint64_t{1} << 30,
                      {Bytes(uint64_t{1} << 30, uint64_t{1} << 30), request});
  EXPECT_THAT(report, HasSubstr("Used 16.00E of 1.00G hbm. Exceeded hbm "
                                "capacity by 16.00E."));
  EXPECT_THAT(report, Not(HasSubstr("Within hbm capacity")));
  EXPECT_THAT(report, HasSubstr("0.0% fragmentation (0B)"));
}

}  // namespace
}  // namespace tpushim
