// `tpushim info` listing every chip with its holder, and `tpushim stress
// --processes`, run as subprocesses (each inherits the test's chip run
// directory, tests/testing/private_run_dir.cc).

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/chip_holder_process.h"
#include "tests/testing/subprocess.h"

namespace tpushim {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using Json = nlohmann::json;
using testutil::Holder;
using testutil::RunSubprocess;
using testutil::SubprocessResult;

SubprocessResult RunTool(const std::vector<std::string>& args,
                         const std::vector<std::string>& env) {
  absl::StatusOr<SubprocessResult> r =
      RunSubprocess(TPUSHIM_TOOL_PATH, args, env);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : SubprocessResult{};
}

TEST(InfoChipsTest, ListsEveryChipWithItsHolderOrFree) {
  Holder holder(CHIP_HOLDER_PATH, "sim://?devices=3", "1");
  ASSERT_EQ(holder.ReadLine(), absl::StrCat("ready ", holder.pid()));
  const std::vector<std::string> env = {"TPUSHIM_DEVICE=sim://?devices=3",
                                        "TPU_VISIBLE_CHIPS=2"};
  SubprocessResult r = RunTool({"info", "--json"}, env);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Json info = Json::parse(r.out);
  const Json& chips = info["chips"]["chips"];
  ASSERT_EQ(chips.size(), 3u) << r.out;
  EXPECT_EQ(chips[0]["state"], "free");
  EXPECT_TRUE(chips[0]["holder"].is_null());
  EXPECT_EQ(chips[1]["state"], "held");
  EXPECT_EQ(chips[1]["holder"]["pid"], holder.pid());
  EXPECT_THAT(chips[1]["holder"]["command_line"].get<std::string>(),
              HasSubstr("chip_holder sim://?devices=3 1"));
  EXPECT_TRUE(chips[1]["device"].is_null());
  EXPECT_EQ(chips[2]["device"], 0);  // TPU_VISIBLE_CHIPS=2
  // The holder's region-off bounce pool counts among other processes'.
  EXPECT_EQ(info["host"]["other_tpushim"]["processes"].size(), 1u);

  r = RunTool({"info"}, env);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, AllOf(HasSubstr("sim chip 0"), HasSubstr("free"),
                           HasSubstr(absl::StrCat("pid ", holder.pid())),
                           HasSubstr("device 0")));
  EXPECT_EQ(holder.Finish(), 0);
  r = RunTool({"info", "--json"}, env);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Json::parse(r.out)["chips"]["chips"][1]["state"], "free");
}

TEST(InfoChipsTest, MalformedVisibleChipsExitsTwoNamingTheVariable) {
  const SubprocessResult r = RunTool(
      {"info"}, {"TPUSHIM_DEVICE=sim://?devices=2", "TPU_VISIBLE_CHIPS=2"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, AllOf(HasSubstr("TPU_VISIBLE_CHIPS=\"2\""),
                           HasSubstr("the host has chips 0..1")));
}

// A sanitizer build's killed process takes longer to tear down (its shadow
// memory goes with it; 115 ms was seen under ASan), so there the 100 ms
// bound on freeing its chip is not held against the tool; everything else
// is checked in every build.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

TEST(StressProcessesTest, KilledProcessesFreeTheirChipsAndSurvivorsAreClean) {
  const SubprocessResult r =
      RunTool({"stress", "--processes", "3", "--kills", "1", "--seconds", "1",
               "--seed", "7", "--json"},
              {"TPU_LOG_DIR=disabled"});
  const Json j = Json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(j.is_object()) << r.out << r.err;
  if (kSanitized) {
    ASSERT_TRUE(r.exit_code == 0 || r.exit_code == 1) << r.out << r.err;
    for (const Json& c : j["children"]) {
      if (!c["problem"].is_null()) {
        EXPECT_THAT(c["problem"].get<std::string>(),
                    HasSubstr("still held 100 ms after SIGKILL"))
            << r.out;
      }
    }
  } else {
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_EQ(j["problems"], 0);
  }
  EXPECT_EQ(j["processes"], 3);
  EXPECT_EQ(j["killed"], 1);
  EXPECT_EQ(j["chips_left_held"], "");
  int killed = 0;
  for (const Json& c : j["children"]) {
    if (c["killed"].get<bool>()) {
      ++killed;
      EXPECT_FALSE(c["chip_freed_after_ms"].is_null());
    } else {
      EXPECT_EQ(c["exit_code"], 0);
      EXPECT_EQ(c["violations"], 0);
      EXPECT_GT(c["transfers_verified"].get<uint64_t>(), 0u);
    }
  }
  EXPECT_EQ(killed, 1);
}

}  // namespace
}  // namespace tpushim
