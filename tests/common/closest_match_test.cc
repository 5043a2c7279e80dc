#include "common/closest_match.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tpushim {
namespace {

TEST(EditDistanceTest, CountsInsertionsDeletionsSubstitutionsAndSwaps) {
  EXPECT_EQ(EditDistance("", ""), 0u);
  EXPECT_EQ(EditDistance("abc", ""), 3u);
  EXPECT_EQ(EditDistance("", "abc"), 3u);
  EXPECT_EQ(EditDistance("kitten", "sitting"), 3u);
  EXPECT_EQ(EditDistance("--stepms", "--step-ms"), 1u);
  EXPECT_EQ(EditDistance("stpe", "step"), 1u);  // one swap
  EXPECT_EQ(EditDistance("TPU_LOG_DIR", "tpu_log_dir"), 0u);
}

using Words = std::vector<std::string>;

TEST(ClosestMatchesTest, FindsTheNearestKnownWord) {
  const Words flags = {"--steps", "--step-ms", "--batch-bytes", "--devices"};
  EXPECT_EQ(ClosestMatches("--devics", flags), Words{"--devices"});
  EXPECT_EQ(ClosestMatches("--batchbytes", flags), Words{"--batch-bytes"});
  const Words commands = {"info", "demo", "bench", "tune", "stress"};
  EXPECT_EQ(ClosestMatches("bnech", commands), Words{"bench"});
  EXPECT_EQ(ClosestMatches("strss", commands), Words{"stress"});
  EXPECT_EQ(ClosestMatches("DEMO", commands), Words{"demo"});
}

TEST(ClosestMatchesTest, EquallyCloseWordsAreAllReturnedInOrder) {
  EXPECT_EQ(ClosestMatches("--stepms", {"--steps", "--step-ms", "--seed"}),
            (Words{"--steps", "--step-ms"}));
}

TEST(ClosestMatchesTest, NothingWhenNoWordIsClose) {
  EXPECT_EQ(ClosestMatches("frobnicate", {"bench", "demo"}), Words{});
  EXPECT_EQ(ClosestMatches("x", {"bench"}), Words{});
  EXPECT_EQ(ClosestMatches("abc", {}), Words{});
  // The limit can be set.
  EXPECT_EQ(ClosestMatches("TPU_PREMAP_SIZE", {"TPU_PREMAPPED_BUFFER_SIZE"},
                           2),
            Words{});
  EXPECT_EQ(ClosestMatches("TPU_PREMAPPED_BUFER_SIZE",
                           {"TPU_PREMAPPED_BUFFER_SIZE"}),
            Words{"TPU_PREMAPPED_BUFFER_SIZE"});
}

}  // namespace
}  // namespace tpushim
