// `tpushim info` on a vfio:// device gives the verdict start-up would give
// on its PCI function, refusing advice the same way when the host uses the
// function. The command runs in-process on an Os whose sysfs and procfs
// are made up (tests/testing/fake_tree.h); everything else is the host's.

#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/fake_tree.h"
#include "tools/main/cli.h"

namespace tpushim {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using Json = nlohmann::json;

constexpr char kFunction[] = "0000:00:02.0";

// The made-up sysfs and procfs, and an environment of exactly `env`.
class InfoOs : public FakeTreeOs {
 public:
  InfoOs(FakeTree tree, std::map<std::string, std::string> env)
      : FakeTreeOs(std::move(tree),
                   {"/sys/bus/pci", "/sys/class", "/sys/kernel/iommu_groups",
                    "/sys/bus/usb", "/proc/self/mountinfo", "/proc/swaps",
                    "/proc/net"}),
        env_(std::move(env)) {}

  std::optional<std::string> GetEnv(const std::string& name) override {
    if (auto it = env_.find(name); it != env_.end()) return it->second;
    return std::nullopt;
  }
  std::vector<std::string> EnvironmentNames() override {
    std::vector<std::string> names;
    for (const auto& [name, value] : env_) names.push_back(name);
    return names;
  }

 private:
  std::map<std::string, std::string> env_;
};

// A host whose function kFunction is bound to `driver`, with the root file
// system on its disk when `root_disk`.
FakeTree Host(const std::string& driver, bool root_disk) {
  FakeTree tree = FakeTree::QuietHost();
  const std::string sysfs = absl::StrCat("/sys/bus/pci/devices/", kFunction);
  tree.File(sysfs + "/class", "0x010000\n")
      .Link(sysfs + "/driver", "../../../bus/pci/drivers/" + driver)
      .Link(sysfs + "/iommu_group", "../../../kernel/iommu_groups/5")
      .Dir(absl::StrCat("/sys/kernel/iommu_groups/5/devices/", kFunction));
  if (root_disk) {
    tree.Link("/sys/class/block/vda",
              "../../devices/pci0000:00/0000:00:02.0/virtio1/block/vda")
        .File("/sys/class/block/vda/dev", "254:0\n")
        .File("/proc/self/mountinfo",
              "22 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n");
  }
  return tree;
}

struct InfoRun {
  int exit_code = -1;
  std::string out;
  std::string err;
};

InfoRun RunInfo(FakeTree tree, bool json) {
  InfoOs os(
      std::move(tree),
      {{"TPUSHIM_DEVICE", absl::StrCat("vfio://", kFunction, "?engine=nvme")},
       {"TPU_PREMAPPED_BUFFER_SIZE", "0"},
       {"TPU_LOG_DIR", "disabled"}});
  std::ostringstream out;
  std::ostringstream err;
  tools::CommandContext context{.os = &os, .out = &out, .err = &err};
  std::vector<std::string> args = {"tpushim", "info"};
  if (json) args.push_back("--json");
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  InfoRun run;
  run.exit_code = tools::RunCommandLine(static_cast<int>(argv.size()),
                                        argv.data(), context);
  run.out = out.str();
  run.err = err.str();
  return run;
}

TEST(InfoVfioTest, RootDiskControllerIsAnErrorWithNoCommands) {
  const InfoRun run = RunInfo(Host("virtio-pci", true), /*json=*/false);
  EXPECT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.out,
              AllOf(HasSubstr("ERROR: FAILED_PRECONDITION: PCI function "
                              "0000:00:02.0 is bound to virtio-pci"),
                    HasSubstr("0000:00:02.0 is a storage controller; its disk "
                              "vda holds / — not suggesting to unbind it")));
  EXPECT_THAT(run.out, Not(HasSubstr("OK: the configuration fits")));
  EXPECT_THAT(run.out, Not(HasSubstr("echo ")));
}

TEST(InfoVfioTest, JsonCarriesTheSameVerdict) {
  const InfoRun run = RunInfo(Host("virtio-pci", true), /*json=*/true);
  EXPECT_EQ(run.exit_code, 0) << run.err;
  Json info = Json::parse(run.out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(info.is_discarded()) << run.out;
  bool found = false;
  for (Json& check : info["checks"]) {
    const std::string message = check["message"].get<std::string>();
    if (message.find("vda holds /") == std::string::npos) continue;
    found = true;
    EXPECT_EQ(check["level"], "error");
    EXPECT_EQ(check["code"], "FAILED_PRECONDITION");
    EXPECT_THAT(message, Not(HasSubstr("echo ")));
  }
  EXPECT_TRUE(found) << run.out;
}

TEST(InfoVfioTest, FreeFunctionGetsTheBindCommands) {
  const InfoRun run = RunInfo(Host("nvme", false), /*json=*/false);
  EXPECT_THAT(run.out, AllOf(HasSubstr("ERROR: FAILED_PRECONDITION"),
                             HasSubstr("the host uses nothing behind it"),
                             HasSubstr("echo vfio-pci > /sys/bus/pci/devices/"
                                       "0000:00:02.0/driver_override")));
}

TEST(InfoVfioTest, FunctionOnVfioPciFits) {
  const InfoRun run = RunInfo(Host("vfio-pci", false), /*json=*/false);
  EXPECT_THAT(run.out, HasSubstr("OK: the configuration fits this host"));
}

// What start-up learns only from the kernel, info reads from sysfs: a
// member of the group on a driver that keeps the group from being viable.
TEST(InfoVfioTest, GroupMemberOnAnotherDriverIsAnError) {
  FakeTree tree = Host("vfio-pci", false);
  tree.File("/sys/bus/pci/devices/0000:00:02.1/class", "0x040300\n")
      .Link("/sys/bus/pci/devices/0000:00:02.1/driver",
            "../../../bus/pci/drivers/snd_hda_intel")
      .Dir("/sys/kernel/iommu_groups/5/devices/0000:00:02.1");
  const InfoRun run = RunInfo(tree, /*json=*/false);
  EXPECT_THAT(run.out,
              AllOf(HasSubstr("ERROR: FAILED_PRECONDITION: IOMMU group 5 of "
                              "0000:00:02.0 is not viable"),
                    HasSubstr("0000:00:02.1 (bound to snd_hda_intel) is not")));
}

TEST(InfoVfioTest, MissingFunctionIsNotFound) {
  FakeTree tree = FakeTree::QuietHost();
  const InfoRun run = RunInfo(tree, /*json=*/false);
  EXPECT_THAT(run.out, HasSubstr("ERROR: NOT_FOUND: no PCI function "
                                 "0000:00:02.0 on this host"))
      << run.err;
}

}  // namespace
}  // namespace tpushim
