// The progress displays of tools/cli/progress.h, drawn into a string.

#include "tools/cli/progress.h"

#include <cstdint>
#include <sstream>
#include <string>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpushim::tools {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

constexpr uint64_t kGiB = uint64_t{1} << 30;

StartupProgress At(
    double seconds, uint64_t done, uint64_t total = 4 * kGiB,
    StartupProgress::Phase phase = StartupProgress::Phase::kPremapping) {
  return {.phase = phase,
          .done_bytes = done,
          .total_bytes = total,
          .elapsed = absl::Seconds(seconds)};
}

TEST(StartupProgressDisplayTest, TerminalGetsABarWithRateAndTimeLeft) {
  std::ostringstream err;
  StartupProgressDisplay display(err, "demo", /*terminal=*/true);
  display(At(0, 0));
  display(At(1, 1 * kGiB));  // 1 GiB/s: 3 GiB, 3 s left
  EXPECT_THAT(err.str(), HasSubstr("\r\033[Kdemo start-up [=======>"));
  EXPECT_THAT(err.str(), HasSubstr("] 1.00G of 4.00G, 1.07 GB/s, 3 s left"));
  display(At(4, 4 * kGiB, 4 * kGiB, StartupProgress::Phase::kDone));
  EXPECT_TRUE(err.str().ends_with("\r\033[K")) << "the bar is not erased";
}

TEST(StartupProgressDisplayTest, PipeGetsPlainLinesOnlyForALongStartup) {
  std::ostringstream err;
  StartupProgressDisplay display(err, "demo", /*terminal=*/false);
  display(At(0, 0));
  display(At(1, kGiB / 2));
  EXPECT_THAT(err.str(), IsEmpty()) << "a line before 2 s";
  display(At(2.5, kGiB));
  display(At(4, 2 * kGiB));  // within 5 s of the last line: none
  display(At(8, 3 * kGiB));
  display(At(9, 4 * kGiB, 4 * kGiB, StartupProgress::Phase::kDone));
  EXPECT_EQ(err.str(),
            "tpushim demo: premapping 1.00G of 4.00G (25%), 0.43 GB/s, about "
            "8 s left\n"
            "tpushim demo: premapping 3.00G of 4.00G (75%), 0.40 GB/s, about "
            "3 s left\n"
            "tpushim demo: premapped 4.00G in 9.0 s\n");
  EXPECT_EQ(err.str().find('\r'), std::string::npos);
}

TEST(StartupProgressDisplayTest, PremappingBehindTheRunSaysSo) {
  std::ostringstream err;
  StartupProgressDisplay display(err, "demo", /*terminal=*/false);
  display(At(0, 0));
  display.CreateReturned();
  display(At(2.5, kGiB));
  display(At(9, 4 * kGiB, 4 * kGiB, StartupProgress::Phase::kDone));
  EXPECT_EQ(err.str(),
            "tpushim demo: premapping 1.00G of 4.00G (25%) behind the run, "
            "0.43 GB/s, about 8 s left\n"
            "tpushim demo: premapped 4.00G in 9.0 s, behind the run\n");

  std::ostringstream bar;
  StartupProgressDisplay terminal(bar, "demo", /*terminal=*/true);
  terminal.CreateReturned();
  terminal(At(1, kGiB));
  EXPECT_THAT(bar.str(), HasSubstr("] behind the run: 1.00G of 4.00G"));
}

TEST(StartupProgressDisplayTest, PremappingStoppedShortSaysWhere) {
  std::ostringstream err;
  StartupProgressDisplay display(err, "demo", /*terminal=*/false);
  display.CreateReturned();
  display(At(2.5, kGiB));
  display(At(3.7, 2 * kGiB, 4 * kGiB, StartupProgress::Phase::kDone));
  EXPECT_THAT(err.str(),
              HasSubstr("tpushim demo: premapping stopped at 2.00G of 4.00G "
                        "after 3.7 s (the run ended first)\n"));
  EXPECT_THAT(err.str(), Not(HasSubstr("premapped 2.00G")));
}

TEST(StartupProgressDisplayTest, PipeGetsNothingForAShortStartup) {
  std::ostringstream err;
  StartupProgressDisplay display(err, "bench", /*terminal=*/false);
  display(At(0, 0));
  display(At(0.5, 4 * kGiB));
  display(At(0.6, 4 * kGiB, 4 * kGiB, StartupProgress::Phase::kDone));
  EXPECT_THAT(err.str(), IsEmpty());
}

TEST(StartupProgressDisplayTest, RegionOffDrawsNothing) {
  std::ostringstream err;
  StartupProgressDisplay display(err, "demo", /*terminal=*/true);
  display(At(0, 0, 0));
  display(At(0.1, 0, 0, StartupProgress::Phase::kDone));
  EXPECT_THAT(err.str(), IsEmpty());
}

}  // namespace
}  // namespace tpushim::tools
