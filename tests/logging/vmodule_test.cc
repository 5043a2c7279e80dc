// TPU_VMODULE: glob matching, level lookup, the per-site cache and VLOG
// end to end.

#include "logging/vmodule.h"

#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "logging/log.h"
#include "tests/logging/log_test_util.h"

namespace tpushim::logging {
namespace {

using internal::GlobMatch;
using internal::VmoduleLevel;
using log_test::BodyLines;
using log_test::ListDirWithPrefix;
using log_test::Messages;
using log_test::TempDir;
using log_test::TestConfig;
using log_test::TestOs;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;

TEST(GlobMatchTest, MatchesLikeGlogVmodule) {
  struct Case {
    const char* pattern;
    const char* text;
    bool match;
  };
  const Case cases[] = {
      {"", "", true},
      {"", "a", false},
      {"abc", "abc", true},
      {"abc", "abcd", false},
      {"abc", "ab", false},
      {"*", "", true},
      {"*", "anything", true},
      {"**", "", true},
      {"a*", "a", true},
      {"a*", "abc", true},
      {"a*", "ba", false},
      {"*c", "abc", true},
      {"*c", "abcd", false},
      {"a*c", "ac", true},
      {"a*c", "abbbc", true},
      {"a*c", "abcb", false},
      {"a**c", "abc", true},
      {"a*b*c", "axxbyyc", true},
      {"a*b*c", "axxbyy", false},
      {"*ab", "aab", true},
      {"*aab", "aaab", true},
      {"?", "", false},
      {"?", "a", true},
      {"?", "ab", false},
      {"a?c", "abc", true},
      {"a?c", "ac", false},
      {"??*", "ab", true},
      {"??*", "a", false},
      {"*?", "", false},
      {"premapped_*", "premapped_region", true},
      {"premapped_*", "region_premapped", false},
      {"A*", "abc", false},  // case-sensitive
  };
  for (const Case& c : cases) {
    EXPECT_EQ(GlobMatch(c.pattern, c.text), c.match)
        << "pattern \"" << c.pattern << "\" text \"" << c.text << "\"";
  }
}

// Found by fuzz/vmodule_fuzzer: a '*' in the text was taken as the literal
// match of the pattern's '*', which then could not stretch any further.
TEST(GlobMatchTest, StarMatchesTextContainingAStar) {
  EXPECT_TRUE(GlobMatch("*", "*x"));
  EXPECT_TRUE(GlobMatch("a*", "a*b"));
  EXPECT_TRUE(GlobMatch("*b", "*ab"));
  EXPECT_FALSE(GlobMatch("*b", "*a"));
  EXPECT_TRUE(GlobMatch("premapped_*", "premapped_*=2,*=1"));
  EXPECT_EQ(VmoduleLevel({{"premapped_*", 2}}, "dir/premapped_*x.cc"), 2);
}

TEST(VmoduleLevelTest, FirstEntryMatchingTheBaseNameWins) {
  struct Case {
    const char* name;
    std::vector<VmoduleEntry> vmodule;
    const char* file;
    int level;
  };
  const Case cases[] = {
      {"no entries", {}, "allocator/region.cc", -1},
      {"exact stem", {{"region", 2}}, "allocator/region.cc", 2},
      {"with extension", {{"region.cc", 3}}, "allocator/region.cc", 3},
      {"extension mismatch", {{"region.h", 3}}, "allocator/region.cc", -1},
      {"star", {{"reg*", 1}}, "/abs/path/region.cc", 1},
      {"question mark", {{"regio?", 4}}, "region.cc", 4},
      {"question mark too short", {{"regi?", 4}}, "region.cc", -1},
      {"directory is not matched",
       {{"allocator*", 1}},
       "allocator/region.cc",
       -1},
      {"stem ends at first dot", {{"service", 2}}, "proto/service.pb.cc", 2},
      {"first match wins", {{"reg*", 1}, {"region", 5}}, "region.cc", 1},
      {"later entry when first misses",
       {{"queue", 1}, {"*", 5}},
       "region.cc",
       5},
      {"level zero", {{"region", 0}}, "region.cc", 0},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(VmoduleLevel(c.vmodule, c.file), c.level) << c.name;
  }
}

class VlogTest : public ::testing::Test {
 protected:
  void TearDown() override { ShutdownLogging(); }

  void Init(std::vector<VmoduleEntry> vmodule,
            Severity min_level = Severity::kInfo) {
    LogConfig config = TestConfig(dir_.path());
    config.vmodule = std::move(vmodule);
    config.min_level = min_level;
    ASSERT_TRUE(InitLogging(config, &os_).ok());
  }

  // The messages of the INFO file, none when there is no file.
  std::vector<std::string> InfoMessages() {
    EXPECT_TRUE(FlushLogs());
    const std::vector<std::string> files = ListDirWithPrefix(
        dir_.path(), log_test::FilePrefix(os_, Severity::kInfo));
    if (files.empty()) return {};
    return Messages(BodyLines(dir_.Join(files.back())));
  }

  TempDir dir_;
  TestOs os_;
};

// One call site, so the per-site cache is exercised across configurations.
bool SiteIsOn(int level) { return VLOG_IS_ON(level); }

void LogVlogLevels() {
  VLOG(0) << "vlog 0";
  VLOG(1) << "vlog 1";
  VLOG(2) << "vlog 2";
  VLOG(3) << "vlog 3";
}

TEST_F(VlogTest, EnabledLevelsFollowTheVmoduleEntryForThisFile) {
  struct Case {
    const char* name;
    std::vector<VmoduleEntry> vmodule;
    Severity min_level;
    std::vector<std::string> expected;
  };
  const Case cases[] = {
      {"no vmodule", {}, Severity::kInfo, {}},
      {"stem", {{"vmodule_test", 1}}, Severity::kInfo, {"vlog 0", "vlog 1"}},
      {"with extension",
       {{"vmodule_test.cc", 2}},
       Severity::kInfo,
       {"vlog 0", "vlog 1", "vlog 2"}},
      {"star", {{"vmod*", 0}}, Severity::kInfo, {"vlog 0"}},
      {"question marks",
       {{"vmodule_tes?", 3}},
       Severity::kInfo,
       {"vlog 0", "vlog 1", "vlog 2", "vlog 3"}},
      {"other file", {{"region", 3}}, Severity::kInfo, {}},
      {"first match wins",
       {{"*_test", 1}, {"vmodule_test", 3}},
       Severity::kInfo,
       {"vlog 0", "vlog 1"}},
      {"VLOG is INFO: off below the min level",
       {{"*", 3}},
       Severity::kWarning,
       {}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Init(c.vmodule, c.min_level);
    LogVlogLevels();
    EXPECT_THAT(InfoMessages(), ElementsAreArray(c.expected));
    ShutdownLogging();
    for (const std::string& name : log_test::ListDir(dir_.path())) {
      std::filesystem::remove(dir_.Join(name));
    }
  }
}

TEST_F(VlogTest, VlogLinesAreInfoWithThisFileAndLine) {
  Init({{"vmodule_test", 1}});
  const int line = __LINE__ + 1;
  VLOG(1) << "verbose";
  ASSERT_TRUE(FlushLogs());
  const std::vector<std::string> lines =
      BodyLines(log_test::OnlyLogFile(dir_.path(), os_, Severity::kInfo));
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0][0], 'I');
  EXPECT_THAT(lines[0], ::testing::EndsWith(absl::StrCat(
                            " vmodule_test.cc:", line, "] verbose")));
}

TEST_F(VlogTest, SiteCacheFollowsReinitAndShutdown) {
  EXPECT_FALSE(SiteIsOn(0));  // not initialized
  Init({{"vmodule_test", 1}});
  EXPECT_TRUE(SiteIsOn(1));
  EXPECT_FALSE(SiteIsOn(2));
  Init({{"vmodule_test", 2}});
  EXPECT_TRUE(SiteIsOn(2));
  Init({});
  EXPECT_FALSE(SiteIsOn(0));
  Init({{"*", 5}});
  EXPECT_TRUE(SiteIsOn(5));
  ShutdownLogging();
  EXPECT_FALSE(SiteIsOn(0));
}

TEST_F(VlogTest, VlogIsOnAnswersForAnyFile) {
  Init({{"premapped_*", 2}, {"queue.cc", 1}});
  EXPECT_TRUE(VlogIsOn(2, "allocator/premapped_region.cc"));
  EXPECT_FALSE(VlogIsOn(3, "allocator/premapped_region.cc"));
  EXPECT_TRUE(VlogIsOn(1, "transfer/queue.cc"));
  EXPECT_FALSE(VlogIsOn(1, "transfer/queue.h"));
  EXPECT_FALSE(VlogIsOn(0, "transfer/event.cc"));
  ShutdownLogging();
  EXPECT_FALSE(VlogIsOn(0, "allocator/premapped_region.cc"));
}

TEST_F(VlogTest, DisabledVlogDoesNotEvaluateItsArguments) {
  Init({{"vmodule_test", 1}});
  int evaluations = 0;
  auto count = [&] { return ++evaluations; };
  VLOG(2) << count();
  EXPECT_EQ(evaluations, 0);
  VLOG(1) << count();
  EXPECT_EQ(evaluations, 1);
  EXPECT_THAT(InfoMessages(), ElementsAre("1"));
}

}  // namespace
}  // namespace tpushim::logging
