// TPU_VISIBLE_CHIPS / TPU_VISIBLE_DEVICES, the bounds variables and
// TPUSHIM_RUN_DIR: every malformed value refused by name, the aliases, the
// precedence of the API fields, and the chips a process ends up with.

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "env/options.h"
#include "env/os.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpushim {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

class EmptyEnvironmentOs : public OsWrapper {
 public:
  EmptyEnvironmentOs() : OsWrapper(Os::Default()) {}
  std::optional<std::string> GetEnv(const std::string&) override {
    return std::nullopt;
  }
};

absl::StatusOr<Options> Resolve(std::map<std::string, std::string> env,
                                const OptionOverrides& api = {}) {
  EmptyEnvironmentOs empty;
  FixedEnvironmentOs os(&empty, std::move(env));
  return ResolveOptions(os, api);
}

constexpr char kFour[] = "sim://?devices=4";

TEST(VisibleChipsTest, EveryChipOfTheHostByDefault) {
  absl::StatusOr<Options> o = Resolve({{"TPUSHIM_DEVICE", kFour}});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_THAT(o->visible_chips.value, IsEmpty());
  EXPECT_EQ(o->host_chip_count(), 4);
  EXPECT_THAT(o->ProcessChips(), ElementsAre(0, 1, 2, 3));
}

TEST(VisibleChipsTest, PicksChipsInTheGivenOrder) {
  absl::StatusOr<Options> o =
      Resolve({{"TPUSHIM_DEVICE", kFour}, {"TPU_VISIBLE_CHIPS", "3,1"}});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_THAT(o->ProcessChips(), ElementsAre(3, 1));
  EXPECT_EQ(o->visible_chips.source, OptionSource::kEnv);
}

TEST(VisibleChipsTest, VisibleDevicesMeansTheSame) {
  absl::StatusOr<Options> o =
      Resolve({{"TPUSHIM_DEVICE", kFour}, {"TPU_VISIBLE_DEVICES", "2"}});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_THAT(o->ProcessChips(), ElementsAre(2));
  o = Resolve({{"TPUSHIM_DEVICE", kFour},
               {"TPU_VISIBLE_DEVICES", "2"},
               {"TPU_VISIBLE_CHIPS", "2"}});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_THAT(o->ProcessChips(), ElementsAre(2));
}

TEST(VisibleChipsTest, BothVariablesSetAndDifferentIsRefused) {
  absl::StatusOr<Options> o = Resolve({{"TPUSHIM_DEVICE", kFour},
                                       {"TPU_VISIBLE_DEVICES", "2"},
                                       {"TPU_VISIBLE_CHIPS", "1"}});
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      o.status().message(),
      AllOf(HasSubstr("TPU_VISIBLE_CHIPS=\"1\""),
            HasSubstr("TPU_VISIBLE_DEVICES=\"2\""), HasSubstr("differ")));
}

struct Malformed {
  std::map<std::string, std::string> env;
  std::string variable_and_value;
  std::string problem;
};

class MalformedChipSettingTest : public ::testing::TestWithParam<Malformed> {};

TEST_P(MalformedChipSettingTest, IsInvalidArgumentNamingTheVariable) {
  std::map<std::string, std::string> env = GetParam().env;
  env.emplace("TPUSHIM_DEVICE", kFour);
  absl::StatusOr<Options> o = Resolve(env);
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(o.status().message(),
              AllOf(HasSubstr(GetParam().variable_and_value),
                    HasSubstr(GetParam().problem)));
}

INSTANTIATE_TEST_SUITE_P(
    Values, MalformedChipSettingTest,
    ::testing::Values(Malformed{{{"TPU_VISIBLE_CHIPS", "0,0"}},
                                "TPU_VISIBLE_CHIPS=\"0,0\"",
                                "names chip 0 twice"},
                      Malformed{{{"TPU_VISIBLE_CHIPS", "4"}},
                                "TPU_VISIBLE_CHIPS=\"4\"",
                                "the host has chips 0..3"},
                      Malformed{{{"TPU_VISIBLE_DEVICES", "1,9"}},
                                "TPU_VISIBLE_DEVICES=\"1,9\"",
                                "names chip 9"},
                      Malformed{{{"TPU_VISIBLE_CHIPS", "a"}},
                                "TPU_VISIBLE_CHIPS=\"a\"",
                                "not a comma list"},
                      Malformed{{{"TPU_VISIBLE_CHIPS", "-1"}},
                                "TPU_VISIBLE_CHIPS=\"-1\"",
                                "not a comma list"},
                      Malformed{{{"TPU_VISIBLE_CHIPS", "0,"}},
                                "TPU_VISIBLE_CHIPS=\"0,\"",
                                "not a comma list"},
                      Malformed{{{"TPU_VISIBLE_CHIPS", " 1"}},
                                "TPU_VISIBLE_CHIPS=\" 1\"",
                                "not a comma list"},
                      Malformed{{{"TPU_CHIPS_PER_PROCESS_BOUNDS", "2,2"}},
                                "TPU_CHIPS_PER_PROCESS_BOUNDS=\"2,2\"",
                                "three positive"},
                      Malformed{{{"TPU_CHIPS_PER_PROCESS_BOUNDS", "0,1,1"}},
                                "TPU_CHIPS_PER_PROCESS_BOUNDS=\"0,1,1\"",
                                "three positive"},
                      Malformed{{{"TPU_CHIPS_PER_PROCESS_BOUNDS", "2,1,1"}},
                                "TPU_CHIPS_PER_PROCESS_BOUNDS=\"2,1,1\"",
                                "this process uses 4 chips"},
                      Malformed{
                          {{"TPU_VISIBLE_CHIPS", "0,1"},
                           {"TPU_CHIPS_PER_HOST_BOUNDS", "1,1,1"}},
                          "TPU_CHIPS_PER_HOST_BOUNDS=\"1,1,1\"",
                          "this process uses 2 chips (TPU_VISIBLE_CHIPS=0,1)"},
                      Malformed{{{"TPU_PROCESS_BOUNDS", "1,1,x"}},
                                "TPU_PROCESS_BOUNDS=\"1,1,x\"",
                                "three positive"},
                      Malformed{{{"TPU_HOST_BOUNDS", "1,1,1,1"}},
                                "TPU_HOST_BOUNDS=\"1,1,1,1\"",
                                "three positive"},
                      Malformed{{{"TPU_PROCESS_BOUNDS", "1,1,1"},
                                 {"TPU_HOST_BOUNDS", "2,1,1"}},
                                "TPU_PROCESS_BOUNDS=\"1,1,1\"",
                                "differ"},
                      Malformed{{{"TPUSHIM_RUN_DIR", "relative"}},
                                "TPUSHIM_RUN_DIR=\"relative\"",
                                "absolute"}));

TEST(ChipBoundsTest, AProductEqualToTheVisibleChipsIsKept) {
  absl::StatusOr<Options> o =
      Resolve({{"TPUSHIM_DEVICE", kFour},
               {"TPU_VISIBLE_CHIPS", "0,1"},
               {"TPU_CHIPS_PER_PROCESS_BOUNDS", "1,2,1"},
               {"TPU_PROCESS_BOUNDS", "2,1,1"}});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_THAT(o->chips_per_process_bounds.value, ElementsAre(1, 2, 1));
  EXPECT_THAT(o->process_bounds.value, ElementsAre(2, 1, 1));
}

TEST(VisibleChipsTest, ApiWinsOverTheEnvironmentAndIsValidatedTheSame) {
  OptionOverrides api;
  api.visible_chips = std::vector<int>{1};
  absl::StatusOr<Options> o =
      Resolve({{"TPUSHIM_DEVICE", kFour}, {"TPU_VISIBLE_CHIPS", "2,3"}}, api);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_THAT(o->ProcessChips(), ElementsAre(1));
  EXPECT_EQ(o->visible_chips.source, OptionSource::kApi);
  api.visible_chips = std::vector<int>{7};
  o = Resolve({{"TPUSHIM_DEVICE", kFour}}, api);
  ASSERT_FALSE(o.ok());
  EXPECT_THAT(o.status().message(),
              HasSubstr("API option visible_chips=\"7\" names chip 7"));
  // The environment's value is validated even when the API overrides it.
  api.visible_chips = std::vector<int>{1};
  o = Resolve({{"TPUSHIM_DEVICE", kFour}, {"TPU_VISIBLE_CHIPS", "5"}}, api);
  ASSERT_FALSE(o.ok());
  EXPECT_THAT(o.status().message(), HasSubstr("TPU_VISIBLE_CHIPS=\"5\""));
}

TEST(VisibleChipsTest, AVfioFunctionIsOneChip) {
  absl::StatusOr<Options> o =
      Resolve({{"TPUSHIM_DEVICE", "vfio://0000:01:00.0?engine=nvme"},
               {"TPU_VISIBLE_CHIPS", "1"}});
  ASSERT_FALSE(o.ok());
  EXPECT_THAT(o.status().message(), HasSubstr("the host has chips 0..0"));
}

TEST(VisibleChipsTest, SetOptionOverrideParsesTheListAlone) {
  OptionOverrides o;
  ASSERT_TRUE(SetOptionOverride(o, "TPU_VISIBLE_CHIPS", "5,6").ok());
  EXPECT_THAT(*o.visible_chips, ElementsAre(5, 6));
  EXPECT_EQ(SetOptionOverride(o, "TPU_VISIBLE_CHIPS", "5,5").code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(SetOptionOverride(o, "TPUSHIM_RUN_DIR", "/tmp/x").ok());
  EXPECT_EQ(*o.run_dir, "/tmp/x");
}

}  // namespace
}  // namespace tpushim
