#include "common/human_bytes.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace tpushim {
namespace {

struct Case {
  uint64_t bytes;
  const char* text;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.bytes; }

class HumanReadableBytesTest : public ::testing::TestWithParam<Case> {};

TEST_P(HumanReadableBytesTest, MatchesTslFormatting) {
  EXPECT_EQ(HumanReadableBytes(GetParam().bytes), GetParam().text);
}

INSTANTIATE_TEST_SUITE_P(
    Table, HumanReadableBytesTest,
    ::testing::Values(
        Case{0, "0B"}, Case{1, "1B"}, Case{123, "123B"}, Case{1023, "1023B"},
        Case{1024, "1.0K"}, Case{852'000, "832.0K"},
        Case{(uint64_t{1} << 20) - 1, "1024.0K"},
        Case{uint64_t{1} << 20, "1.00M"}, Case{uint64_t{8} << 20, "8.00M"},
        // libtpu's "There are 6.43M free.": 6584 KiB truncates to 6.43M.
        Case{6584 * uint64_t{1024} + 1000, "6.43M"},
        Case{uint64_t{4} << 30, "4.00G"}, Case{uint64_t{16} << 30, "16.00G"},
        Case{uint64_t{1} << 40, "1.00T"}, Case{uint64_t{1} << 50, "1.00P"},
        Case{uint64_t{1} << 60, "1.00E"}, Case{~uint64_t{0}, "16.00E"}));

}  // namespace
}  // namespace tpushim
