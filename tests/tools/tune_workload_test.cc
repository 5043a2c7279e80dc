// In-process tests of the workload file's "directions" key
// (tools/tune/workload.h): the JSON array and the command line's
// comma-separated form are the same workload; anything else is refused
// naming the key.

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tools/tune/workload.h"

namespace tpushim::tools {
namespace {

using Json = nlohmann::ordered_json;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

absl::StatusOr<Workload> Parse(const char* text) {
  return WorkloadFromJson(Json::parse(text), Workload::Default());
}

TEST(TuneWorkloadJsonTest, DirectionsTakeTheCommandLineForm) {
  absl::StatusOr<Workload> w = Parse(R"({"directions": "h2d,d2h"})");
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_THAT(w->directions, ElementsAre(DmaDirection::kHostToDevice,
                                         DmaDirection::kDeviceToHost));
  w = Parse(R"({"directions": "d2d"})");
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_THAT(w->directions, ElementsAre(DmaDirection::kDeviceToDevice));
}

TEST(TuneWorkloadJsonTest, DirectionsTakeAnArray) {
  absl::StatusOr<Workload> w = Parse(R"({"directions": ["d2d", "h2d"]})");
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_THAT(w->directions, ElementsAre(DmaDirection::kHostToDevice,
                                         DmaDirection::kDeviceToDevice));
}

TEST(TuneWorkloadJsonTest, BadDirectionsAreRefusedNamingTheKey) {
  for (const char* text : {R"({"directions": ""})", R"({"directions": []})",
                           R"({"directions": 3})", R"({"directions": [1]})"}) {
    absl::StatusOr<Workload> w = Parse(text);
    EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(w.status().message(), HasSubstr("workload \"directions\""))
        << text;
  }
  absl::StatusOr<Workload> w = Parse(R"({"directions": "h2d,h2x"})");
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(w.status().message(),
              AllOf(HasSubstr("workload \"directions\""),
                    HasSubstr("unknown direction \"h2x\"")));
}

}  // namespace
}  // namespace tpushim::tools
