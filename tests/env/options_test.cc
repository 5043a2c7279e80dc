#include "env/options.h"

#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "env/os.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpushim {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::SizeIs;

constexpr uint64_t k4G = uint64_t{4} << 30;

// An environment with nothing set: not even the test process's run
// directory, which FixedEnvironmentOs would otherwise pass through.
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

// Resolves what must resolve; on failure the test fails with the status.
Options MustResolve(std::map<std::string, std::string> env,
                    const OptionOverrides& api = {}) {
  absl::StatusOr<Options> options = Resolve(std::move(env), api);
  EXPECT_TRUE(options.ok()) << options.status();
  return options.ok() ? *std::move(options) : Options();
}

std::string MessageOf(const absl::StatusOr<Options>& options) {
  return std::string(options.status().message());
}

// ---- Defaults ---------------------------------------------------------------

TEST(OptionsTest, DefaultsWhenNothingIsSet) {
  const Options options = MustResolve({});
  EXPECT_EQ(options.premapped_buffer_size.value, k4G);
  EXPECT_EQ(options.premapped_buffer_transfer_threshold_bytes.value, k4G);
  EXPECT_EQ(options.log_dir.value, "/tmp/tpu_logs");
  EXPECT_EQ(options.min_log_level.value, 0);
  EXPECT_EQ(options.stderr_log_level.value, 2);
  EXPECT_THAT(options.vmodule.value, IsEmpty());
  EXPECT_EQ(options.max_log_size_mb.value, 1024u);
  EXPECT_EQ(options.log_keep.value, 5);
  EXPECT_EQ(options.device.value.text, "sim://");
  EXPECT_EQ(options.device.value.devices, 1);
  EXPECT_EQ(options.hugepages.value, HugePagesMode::kAuto);
  EXPECT_EQ(options.prefault_threads.value, 0);
  EXPECT_EQ(options.numa_node.value, std::nullopt);
  EXPECT_EQ(options.mlock.value, MlockMode::kOn);
  EXPECT_TRUE(options.faults.value.empty());
  EXPECT_EQ(options.trace_file.value, "");
  EXPECT_EQ(options.premap.value, PremapMode::kForeground);
  EXPECT_FALSE(options.dump_on_oom.value);
  EXPECT_THAT(options.warnings, IsEmpty());
  EXPECT_TRUE(options.premapped_region_enabled());
  EXPECT_FALSE(options.log_files_disabled());
  for (const OptionRow& row : DescribeOptions(options)) {
    EXPECT_EQ(row.source, OptionSource::kDefault) << row.name;
  }
  EXPECT_EQ(options.premapped_buffer_size.raw, "");
}

// ---- Valid values -----------------------------------------------------------

TEST(OptionsTest, ReadsEveryVariable) {
  const Options options = MustResolve({
      {"TPU_PREMAPPED_BUFFER_SIZE", "17179869184"},
      {"TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES", "1048576"},
      {"TPU_LOG_DIR", "disabled"},
      {"TPU_MIN_LOG_LEVEL", "1"},
      {"TPU_STDERR_LOG_LEVEL", "0"},
      {"TPU_VMODULE", "premapped_region=2,*transfer*=1"},
      {"TPU_MAX_LOG_SIZE_MB", "1048576"},
      {"TPUSHIM_LOG_KEEP", "0"},
      {"TPUSHIM_DEVICE", "sim://?devices=2&hbm=8G"},
      {"TPUSHIM_HUGEPAGES", "hugetlb"},
      {"TPUSHIM_PREFAULT_THREADS", "1024"},
      {"TPUSHIM_NUMA_NODE", "1023"},
      {"TPUSHIM_MLOCK", "required"},
      {"TPUSHIM_FAULTS", "mmap:nth=1;dma:rate=0.5,seed=7,code=UNAVAILABLE"},
      {"TPUSHIM_TRACE_FILE", "/tmp/trace.json"},
      {"TPUSHIM_PREMAP", "background"},
      {"TPUSHIM_MEMORY_PROFILE", "/tmp/mem.jsonl"},
      {"TPUSHIM_DUMP_ON_OOM", "1"},
      {"TPU_VISIBLE_CHIPS", "1,0"},
      {"TPU_CHIPS_PER_PROCESS_BOUNDS", "2,1,1"},
      {"TPU_PROCESS_BOUNDS", "1,1,1"},
      {"TPUSHIM_RUN_DIR", "/run/tpushim"},
  });
  EXPECT_EQ(options.premapped_buffer_size.value, uint64_t{1} << 34);
  EXPECT_EQ(options.premapped_buffer_size.source, OptionSource::kEnv);
  EXPECT_EQ(options.premapped_buffer_size.raw, "17179869184");
  EXPECT_EQ(options.premapped_buffer_transfer_threshold_bytes.value,
            uint64_t{1} << 20);
  EXPECT_EQ(options.log_dir.value, "disabled");
  EXPECT_TRUE(options.log_files_disabled());
  EXPECT_EQ(options.min_log_level.value, 1);
  EXPECT_EQ(options.stderr_log_level.value, 0);
  EXPECT_THAT(options.vmodule.value,
              ElementsAre(VmoduleEntry{"premapped_region", 2},
                          VmoduleEntry{"*transfer*", 1}));
  EXPECT_EQ(options.max_log_size_mb.value, 1048576u);
  EXPECT_EQ(options.log_keep.value, 0);
  EXPECT_EQ(options.device.value.devices, 2);
  EXPECT_EQ(options.device.value.hbm_bytes, uint64_t{8} << 30);
  EXPECT_EQ(options.hugepages.value, HugePagesMode::kHugetlb);
  EXPECT_EQ(options.prefault_threads.value, 1024);
  EXPECT_EQ(options.numa_node.value, 1023);
  EXPECT_EQ(options.mlock.value, MlockMode::kRequired);
  EXPECT_THAT(options.faults.value.rules, SizeIs(2));
  EXPECT_EQ(options.trace_file.value, "/tmp/trace.json");
  EXPECT_EQ(options.premap.value, PremapMode::kBackground);
  EXPECT_EQ(options.memory_profile.value, "/tmp/mem.jsonl");
  EXPECT_TRUE(options.dump_on_oom.value);
  EXPECT_THAT(options.visible_chips.value, ElementsAre(1, 0));
  EXPECT_THAT(options.chips_per_process_bounds.value, ElementsAre(2, 1, 1));
  EXPECT_THAT(options.process_bounds.value, ElementsAre(1, 1, 1));
  EXPECT_EQ(options.run_dir.value, "/run/tpushim");
  EXPECT_THAT(options.warnings, IsEmpty());
  for (const OptionRow& row : DescribeOptions(options)) {
    EXPECT_EQ(row.source, OptionSource::kEnv) << row.name;
  }
}

TEST(OptionsTest, AcceptsTheGuidesSizesAndLeadingZeros) {
  EXPECT_EQ(MustResolve({{"TPU_PREMAPPED_BUFFER_SIZE", "40000000000"}})
                .premapped_buffer_size.value,
            40000000000u);
  const Options padded =
      MustResolve({{"TPU_PREMAPPED_BUFFER_SIZE", "0008192"}});
  EXPECT_EQ(padded.premapped_buffer_size.value, 8192u);
  EXPECT_EQ(padded.premapped_buffer_size.raw, "0008192");
  EXPECT_EQ(MustResolve({{"TPU_PREMAPPED_BUFFER_SIZE", "4096"}})
                .premapped_buffer_size.value,
            4096u);
}

TEST(OptionsTest, MatchesWordsCaseInsensitively) {
  const Options options = MustResolve({{"TPUSHIM_HUGEPAGES", "THP"},
                                       {"TPUSHIM_MLOCK", "Off"},
                                       {"TPUSHIM_NUMA_NODE", "AUTO"}});
  EXPECT_EQ(options.hugepages.value, HugePagesMode::kThp);
  EXPECT_EQ(options.hugepages.raw, "THP");
  EXPECT_EQ(options.mlock.value, MlockMode::kOff);
  EXPECT_EQ(options.numa_node.value, std::nullopt);
  EXPECT_EQ(options.numa_node.source, OptionSource::kEnv);
}

TEST(OptionsTest, AcceptsEmptyWhereTheDefaultIsEmpty) {
  const Options options = MustResolve({{"TPU_VMODULE", ""},
                                       {"TPUSHIM_FAULTS", ""},
                                       {"TPUSHIM_TRACE_FILE", ""}});
  EXPECT_THAT(options.vmodule.value, IsEmpty());
  EXPECT_EQ(options.vmodule.source, OptionSource::kEnv);
  EXPECT_TRUE(options.faults.value.empty());
  EXPECT_EQ(options.faults.source, OptionSource::kEnv);
  EXPECT_EQ(options.trace_file.value, "");
  EXPECT_EQ(options.trace_file.source, OptionSource::kEnv);
  EXPECT_THAT(options.warnings, IsEmpty());
}

// ---- Malformed environment variables ----------------------------------------

struct BadEnv {
  std::string variable;
  std::string value;
};

void PrintTo(const BadEnv& bad, std::ostream* os) {
  *os << bad.variable << "=\"" << bad.value << "\"";
}

class RejectsMalformedEnvTest : public ::testing::TestWithParam<BadEnv> {};

TEST_P(RejectsMalformedEnvTest, WithInvalidArgumentNamingVariableAndValue) {
  const BadEnv& bad = GetParam();
  const absl::StatusOr<Options> options = Resolve({{bad.variable, bad.value}});
  ASSERT_FALSE(options.ok());
  EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(MessageOf(options),
              HasSubstr(bad.variable + "=\"" + bad.value + "\""));
}

const BadEnv kBadEnv[] = {
    // TPU_PREMAPPED_BUFFER_SIZE
    {"TPU_PREMAPPED_BUFFER_SIZE", ""},
    {"TPU_PREMAPPED_BUFFER_SIZE", "abc"},
    {"TPU_PREMAPPED_BUFFER_SIZE", "-4096"},
    {"TPU_PREMAPPED_BUFFER_SIZE", "+4096"},
    {"TPU_PREMAPPED_BUFFER_SIZE", "0x1000"},
    {"TPU_PREMAPPED_BUFFER_SIZE", "4G"},
    {"TPU_PREMAPPED_BUFFER_SIZE", "1e9"},
    {"TPU_PREMAPPED_BUFFER_SIZE", "4096.0"},
    {"TPU_PREMAPPED_BUFFER_SIZE", " 4096"},
    {"TPU_PREMAPPED_BUFFER_SIZE", "4096 "},
    {"TPU_PREMAPPED_BUFFER_SIZE", "4096abc"},
    {"TPU_PREMAPPED_BUFFER_SIZE", "4_096"},
    {"TPU_PREMAPPED_BUFFER_SIZE", "18446744073709551616"},
    {"TPU_PREMAPPED_BUFFER_SIZE", "99999999999999999999999"},
    {"TPU_PREMAPPED_BUFFER_SIZE", "5000"},
    {"TPU_PREMAPPED_BUFFER_SIZE", "100"},
    {"TPU_PREMAPPED_BUFFER_SIZE", "4097"},
    {"TPU_PREMAPPED_BUFFER_SIZE", "18446744073709551615"},
    // TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES
    {"TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES", ""},
    {"TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES", "0"},
    {"TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES", "000"},
    {"TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES", "-1"},
    {"TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES", "1M"},
    {"TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES", " 1024"},
    {"TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES", "18446744073709551616"},
    // TPU_LOG_DIR
    {"TPU_LOG_DIR", ""},
    // TPU_MIN_LOG_LEVEL, TPU_STDERR_LOG_LEVEL
    {"TPU_MIN_LOG_LEVEL", ""},
    {"TPU_MIN_LOG_LEVEL", "4"},
    {"TPU_MIN_LOG_LEVEL", "-1"},
    {"TPU_MIN_LOG_LEVEL", "INFO"},
    {"TPU_MIN_LOG_LEVEL", "1.0"},
    {"TPU_STDERR_LOG_LEVEL", "9"},
    {"TPU_STDERR_LOG_LEVEL", "two"},
    {"TPU_STDERR_LOG_LEVEL", "0 "},
    // TPU_MAX_LOG_SIZE_MB
    {"TPU_MAX_LOG_SIZE_MB", "0"},
    {"TPU_MAX_LOG_SIZE_MB", "1048577"},
    {"TPU_MAX_LOG_SIZE_MB", "1024MB"},
    {"TPU_MAX_LOG_SIZE_MB", ""},
    // TPUSHIM_LOG_KEEP
    {"TPUSHIM_LOG_KEEP", "1000001"},
    {"TPUSHIM_LOG_KEEP", "-5"},
    {"TPUSHIM_LOG_KEEP", "five"},
    {"TPUSHIM_LOG_KEEP", "18446744073709551616"},
    // TPUSHIM_DEVICE
    {"TPUSHIM_DEVICE", ""},
    {"TPUSHIM_DEVICE", "vfio://0000:00:04.0"},
    {"TPUSHIM_DEVICE", "sim"},
    {"TPUSHIM_DEVICE", "sim:"},
    {"TPUSHIM_DEVICE", "sim://host"},
    {"TPUSHIM_DEVICE", "sim://?devices=0"},
    {"TPUSHIM_DEVICE", "sim://?devices=65"},
    {"TPUSHIM_DEVICE", "sim://?hbm=16X"},
    {"TPUSHIM_DEVICE", "sim://?link_gbps=1e3"},
    {"TPUSHIM_DEVICE", "sim://?latency_us=-1"},
    {"TPUSHIM_DEVICE", "sim://?foo=1"},
    {"TPUSHIM_DEVICE", "sim://?devices=2&devices=3"},
    // TPUSHIM_HUGEPAGES
    {"TPUSHIM_HUGEPAGES", ""},
    {"TPUSHIM_HUGEPAGES", "yes"},
    {"TPUSHIM_HUGEPAGES", "huge"},
    {"TPUSHIM_HUGEPAGES", " thp"},
    // TPUSHIM_PREFAULT_THREADS
    {"TPUSHIM_PREFAULT_THREADS", "1025"},
    {"TPUSHIM_PREFAULT_THREADS", "-1"},
    {"TPUSHIM_PREFAULT_THREADS", "all"},
    {"TPUSHIM_PREFAULT_THREADS", ""},
    // TPUSHIM_NUMA_NODE
    {"TPUSHIM_NUMA_NODE", ""},
    {"TPUSHIM_NUMA_NODE", "1024"},
    {"TPUSHIM_NUMA_NODE", "-1"},
    {"TPUSHIM_NUMA_NODE", "any"},
    {"TPUSHIM_NUMA_NODE", "0x1"},
    // TPUSHIM_MLOCK
    {"TPUSHIM_MLOCK", ""},
    {"TPUSHIM_MLOCK", "yes"},
    {"TPUSHIM_MLOCK", "true"},
    // TPUSHIM_PREMAP
    {"TPUSHIM_PREMAP", ""},
    {"TPUSHIM_PREMAP", "lazy"},
    {"TPUSHIM_PREMAP", "1"},
    {"TPUSHIM_PREMAP", "background "},
    // TPUSHIM_FAULTS
    {"TPUSHIM_FAULTS", "mmap"},
    {"TPUSHIM_FAULTS", "bogus:nth=1"},
    {"TPUSHIM_FAULTS", "mmap:nth=0"},
    {"TPUSHIM_FAULTS", "mmap:rate=2,seed=1"},
    {"TPUSHIM_FAULTS", "mmap:nth=1;"},
    // TPUSHIM_DUMP_ON_OOM
    {"TPUSHIM_DUMP_ON_OOM", ""},
    {"TPUSHIM_DUMP_ON_OOM", "2"},
    {"TPUSHIM_DUMP_ON_OOM", "yes"},
    {"TPUSHIM_DUMP_ON_OOM", "true"},
};

INSTANTIATE_TEST_SUITE_P(AllVariables, RejectsMalformedEnvTest,
                         ::testing::ValuesIn(kBadEnv));

TEST(OptionsTest, PrefixesFaultSpecErrorsWithTheVariable) {
  const absl::StatusOr<Options> options =
      Resolve({{"TPUSHIM_FAULTS", "mmap:nth=0"}});
  ASSERT_FALSE(options.ok());
  EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(MessageOf(options),
              ::testing::StartsWith("TPUSHIM_FAULTS=\"mmap:nth=0\": "));
}

TEST(OptionsTest, ListsTheSupportedSchemesForAnUnknownOne) {
  const absl::StatusOr<Options> options =
      Resolve({{"TPUSHIM_DEVICE", "pcie://0000:00:04.0"}});
  ASSERT_FALSE(options.ok());
  EXPECT_THAT(MessageOf(options),
              ::testing::StartsWith(
                  "TPUSHIM_DEVICE=\"pcie://0000:00:04.0\": unsupported"));
  EXPECT_THAT(MessageOf(options),
              HasSubstr("supported schemes: sim://, vfio://"));
}

TEST(OptionsTest, ListsTheAcceptedWordsForAnUnknownOne) {
  EXPECT_EQ(MessageOf(Resolve({{"TPUSHIM_HUGEPAGES", "yes"}})),
            "TPUSHIM_HUGEPAGES=\"yes\" is not one of auto, hugetlb, thp, off");
  EXPECT_EQ(MessageOf(Resolve({{"TPUSHIM_MLOCK", "true"}})),
            "TPUSHIM_MLOCK=\"true\" is not one of on, required, off");
  EXPECT_EQ(MessageOf(Resolve({{"TPUSHIM_DUMP_ON_OOM", "yes"}})),
            "TPUSHIM_DUMP_ON_OOM=\"yes\" is not one of 0, 1");
  EXPECT_THAT(MessageOf(Resolve({{"TPUSHIM_NUMA_NODE", "any"}})),
              HasSubstr("auto"));
}

// ---- The size: nearest valid values -----------------------------------------

TEST(PremappedSizeTest, NamesTheTwoNearestValidValues) {
  EXPECT_EQ(MessageOf(Resolve({{"TPU_PREMAPPED_BUFFER_SIZE", "5000"}})),
            "TPU_PREMAPPED_BUFFER_SIZE=\"5000\" is not a multiple of 4096 "
            "(whole 4 KiB pages); the nearest valid values are 4096 and 8192");
}

TEST(PremappedSizeTest, SaysZeroTurnsTheRegionOffWhenItIsTheFloor) {
  EXPECT_EQ(MessageOf(Resolve({{"TPU_PREMAPPED_BUFFER_SIZE", "100"}})),
            "TPU_PREMAPPED_BUFFER_SIZE=\"100\" is not a multiple of 4096 "
            "(whole 4 KiB pages); the nearest valid values are 0 (turns the "
            "region off) and 4096");
}

TEST(PremappedSizeTest, NamesOnlyTheFloorWhenTheCeilingWouldOverflow) {
  const std::string message = MessageOf(
      Resolve({{"TPU_PREMAPPED_BUFFER_SIZE", "18446744073709551615"}}));
  EXPECT_THAT(message,
              HasSubstr("the nearest valid value is 18446744073709547520"));
  EXPECT_THAT(message, Not(HasSubstr(" and ")));
}

TEST(PremappedSizeTest, NamesBothJustBelowTheLastMultiple) {
  EXPECT_THAT(MessageOf(Resolve(
                  {{"TPU_PREMAPPED_BUFFER_SIZE", "18446744073709547519"}})),
              HasSubstr("the nearest valid values are 18446744073709543424 and "
                        "18446744073709547520"));
}

TEST(PremappedSizeTest, TheLargestMultipleIsValid) {
  EXPECT_EQ(MustResolve({{"TPU_PREMAPPED_BUFFER_SIZE", "18446744073709547520"}})
                .premapped_buffer_size.value,
            18446744073709547520u);
}

// ---- Precedence -------------------------------------------------------------

constexpr char kSize[] = "TPU_PREMAPPED_BUFFER_SIZE";
constexpr char kThreshold[] = "TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES";
constexpr char kInitArgs[] = "LIBTPU_INIT_ARGS";

TEST(PrecedenceTest, ApiBeatsFlagBeatsEnvBeatsDefaultForTheSize) {
  std::map<std::string, std::string> env;
  OptionOverrides api;
  auto size = [&] { return MustResolve(env, api).premapped_buffer_size; };

  EXPECT_EQ(size().source, OptionSource::kDefault);

  env[kSize] = "8192";
  EXPECT_EQ(size().value, 8192u);
  EXPECT_EQ(size().source, OptionSource::kEnv);
  EXPECT_EQ(size().raw, "8192");

  env[kInitArgs] = "--tpu_premapped_buffer_size=16384";
  EXPECT_EQ(size().value, 16384u);
  EXPECT_EQ(size().source, OptionSource::kFlag);
  EXPECT_EQ(size().raw, "16384");

  api.premapped_buffer_size = 32768;
  EXPECT_EQ(size().value, 32768u);
  EXPECT_EQ(size().source, OptionSource::kApi);
  EXPECT_EQ(size().raw, "");
}

TEST(PrecedenceTest, ApiBeatsFlagBeatsEnvBeatsDefaultForTheThreshold) {
  std::map<std::string, std::string> env = {{kSize, "1048576"}};
  OptionOverrides api;
  auto threshold = [&] {
    return MustResolve(env, api).premapped_buffer_transfer_threshold_bytes;
  };

  EXPECT_EQ(threshold().value, 1048576u);
  EXPECT_EQ(threshold().source, OptionSource::kDefault);

  env[kThreshold] = "1000";
  EXPECT_EQ(threshold().value, 1000u);
  EXPECT_EQ(threshold().source, OptionSource::kEnv);
  EXPECT_EQ(threshold().raw, "1000");

  env[kInitArgs] = "--tpu_premapped_buffer_transfer_threshold_bytes=2000";
  EXPECT_EQ(threshold().value, 2000u);
  EXPECT_EQ(threshold().source, OptionSource::kFlag);
  EXPECT_EQ(threshold().raw, "2000");

  api.premapped_buffer_transfer_threshold_bytes = 3000;
  EXPECT_EQ(threshold().value, 3000u);
  EXPECT_EQ(threshold().source, OptionSource::kApi);
  EXPECT_EQ(threshold().raw, "");
}

TEST(PrecedenceTest, ApiOverridesEverySetting) {
  OptionOverrides api;
  api.log_dir = "/var/log/tpu";
  api.min_log_level = 3;
  api.stderr_log_level = 1;
  api.vmodule = "a=1";
  api.max_log_size_mb = 7;
  api.log_keep = 9;
  api.device = "sim://?devices=3";
  api.hugepages = HugePagesMode::kOff;
  api.prefault_threads = 4;
  api.numa_node = std::optional<int>(2);
  api.mlock = MlockMode::kOff;
  api.faults = "alloc:every=2";
  api.trace_file = "/tmp/t.json";
  api.premap = PremapMode::kBackground;
  api.memory_profile = "/tmp/m.jsonl";
  api.dump_on_oom = true;
  api.visible_chips = std::vector<int>{2};
  api.chips_per_process_bounds = std::vector<int>{1, 1, 1};
  api.process_bounds = std::vector<int>{3, 1, 1};
  api.run_dir = "/run/x";
  const Options options = MustResolve({{"TPU_LOG_DIR", "/x"},
                                       {"TPUSHIM_HUGEPAGES", "thp"},
                                       {"TPUSHIM_NUMA_NODE", "1"}},
                                      api);
  EXPECT_EQ(options.log_dir.value, "/var/log/tpu");
  EXPECT_EQ(options.min_log_level.value, 3);
  EXPECT_EQ(options.stderr_log_level.value, 1);
  EXPECT_THAT(options.vmodule.value, ElementsAre(VmoduleEntry{"a", 1}));
  EXPECT_EQ(options.max_log_size_mb.value, 7u);
  EXPECT_EQ(options.log_keep.value, 9);
  EXPECT_EQ(options.device.value.devices, 3);
  EXPECT_EQ(options.hugepages.value, HugePagesMode::kOff);
  EXPECT_EQ(options.prefault_threads.value, 4);
  EXPECT_EQ(options.numa_node.value, 2);
  EXPECT_EQ(options.mlock.value, MlockMode::kOff);
  EXPECT_THAT(options.faults.value.rules, SizeIs(1));
  EXPECT_EQ(options.trace_file.value, "/tmp/t.json");
  EXPECT_EQ(options.premap.value, PremapMode::kBackground);
  EXPECT_EQ(options.memory_profile.value, "/tmp/m.jsonl");
  EXPECT_TRUE(options.dump_on_oom.value);
  for (const OptionRow& row : DescribeOptions(options)) {
    if (row.name.find("PREMAPPED") != std::string::npos) continue;
    EXPECT_EQ(row.source, OptionSource::kApi) << row.name;
  }
  EXPECT_EQ(options.hugepages.raw, "");
}

TEST(PrecedenceTest, ApiCanSetTheNumaNodeBackToAuto) {
  OptionOverrides api;
  api.numa_node = std::optional<int>();
  const Options options = MustResolve({{"TPUSHIM_NUMA_NODE", "1"}}, api);
  EXPECT_EQ(options.numa_node.value, std::nullopt);
  EXPECT_EQ(options.numa_node.source, OptionSource::kApi);
}

TEST(PrecedenceTest, AnOverriddenValueMustStillBeWellFormed) {
  OptionOverrides api;
  api.premapped_buffer_size = 8192;
  const absl::StatusOr<Options> options = Resolve({{kSize, "4G"}}, api);
  ASSERT_FALSE(options.ok());
  EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(MessageOf(options),
              HasSubstr("TPU_PREMAPPED_BUFFER_SIZE=\"4G\""));
}

// A size with a unit, as the tools' flags take it: the message gives the
// value in bytes and says this variable takes no unit.
TEST(PrecedenceTest, ASizeWithAUnitIsRefusedWithItsValueInBytes) {
  for (const auto& [text, bytes] :
       {std::pair<std::string, std::string>{"4G", "4294967296"},
        std::pair<std::string, std::string>{"512MiB", "536870912"}}) {
    const absl::StatusOr<Options> options = Resolve({{kSize, text}}, {});
    ASSERT_FALSE(options.ok()) << text;
    EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string message = MessageOf(options);
    EXPECT_THAT(message, HasSubstr(absl::StrCat("TPU_PREMAPPED_BUFFER_SIZE=\"",
                                                text, "\"")));
    EXPECT_THAT(message, HasSubstr(absl::StrCat(text, " is ", bytes,
                                                " bytes: write that")));
    EXPECT_THAT(message, HasSubstr("without a unit"));
    EXPECT_THAT(message, HasSubstr("take K/M/G/T suffixes"));
  }
  // Not a size at all: no such note.
  EXPECT_THAT(MessageOf(Resolve({{kSize, "lots"}}, {})),
              Not(HasSubstr("bytes: write that")));
}

TEST(PrecedenceTest, KeepsOnlyTheWinningValuesWarnings) {
  OptionOverrides api;
  api.vmodule = "good=1";
  const Options options = MustResolve({{"TPU_VMODULE", "3"}}, api);
  EXPECT_THAT(options.vmodule.value, ElementsAre(VmoduleEntry{"good", 1}));
  EXPECT_THAT(options.warnings, IsEmpty());
}

// ---- LIBTPU_INIT_ARGS -------------------------------------------------------

uint64_t SizeFromInitArgs(const std::string& args) {
  return MustResolve({{kInitArgs, args}}).premapped_buffer_size.value;
}

TEST(InitArgsTest, AcceptsEveryAbslFlagForm) {
  EXPECT_EQ(SizeFromInitArgs("--tpu_premapped_buffer_size=8192"), 8192u);
  EXPECT_EQ(SizeFromInitArgs("-tpu_premapped_buffer_size=8192"), 8192u);
  EXPECT_EQ(SizeFromInitArgs("--tpu_premapped_buffer_size 8192"), 8192u);
  EXPECT_EQ(SizeFromInitArgs("-tpu_premapped_buffer_size 8192"), 8192u);
  EXPECT_EQ(SizeFromInitArgs("\t--tpu_premapped_buffer_size\n8192\n"), 8192u);
}

TEST(InitArgsTest, IgnoresOtherFlagsAndWords) {
  const Options options = MustResolve(
      {{kInitArgs,
        "--xla_tpu_enable_async_collective_fusion=true --xla_foo 5 -v=2 "
        "--xla_jf_conv_input_fusion=-1 --notpu_bool positional "
        "--tpu_premapped_buffer_size=8192 --tpu_premapped_buffer_size_x=abc "
        "--xla_bar"}});
  EXPECT_EQ(options.premapped_buffer_size.value, 8192u);
  EXPECT_EQ(options.premapped_buffer_size.source, OptionSource::kFlag);
  EXPECT_EQ(options.premapped_buffer_transfer_threshold_bytes.source,
            OptionSource::kDefault);
}

TEST(InitArgsTest, EmptyOrOnlyForeignFlagsLeaveTheDefaults) {
  EXPECT_EQ(SizeFromInitArgs(""), k4G);
  EXPECT_EQ(SizeFromInitArgs("   "), k4G);
  EXPECT_EQ(SizeFromInitArgs("--xla_tpu_foo=1"), k4G);
}

TEST(InitArgsTest, TheLastOfADuplicatedFlagWins) {
  const Options options = MustResolve(
      {{kInitArgs,
        "--tpu_premapped_buffer_size=8192 --tpu_premapped_buffer_size 12288"}});
  EXPECT_EQ(options.premapped_buffer_size.value, 12288u);
  EXPECT_EQ(options.premapped_buffer_size.raw, "12288");
}

TEST(InitArgsTest, FlagsAfterADoubleDashAreNotFlags) {
  EXPECT_EQ(SizeFromInitArgs("-- --tpu_premapped_buffer_size=abc"), k4G);
}

TEST(InitArgsTest, OurFlagWithoutAValueIsAnError) {
  const absl::StatusOr<Options> options =
      Resolve({{kInitArgs, "--xla_foo=1 --tpu_premapped_buffer_size"}});
  ASSERT_FALSE(options.ok());
  EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(MessageOf(options),
              HasSubstr("LIBTPU_INIT_ARGS flag --tpu_premapped_buffer_size "
                        "has no value"));
}

TEST(InitArgsTest, LikeAbslTakesTheNextWordAsTheValue) {
  const absl::StatusOr<Options> options =
      Resolve({{kInitArgs,
                "--tpu_premapped_buffer_size "
                "--tpu_premapped_buffer_transfer_threshold_bytes=4096"}});
  ASSERT_FALSE(options.ok());
  EXPECT_THAT(MessageOf(options),
              HasSubstr("LIBTPU_INIT_ARGS flag --tpu_premapped_buffer_size=\""
                        "--tpu_premapped_buffer_transfer_threshold_bytes="
                        "4096\""));
}

struct BadFlag {
  std::string flag;
  std::string value;
  std::string init_args;
};

void PrintTo(const BadFlag& bad, std::ostream* os) { *os << bad.init_args; }

class RejectsMalformedFlagTest : public ::testing::TestWithParam<BadFlag> {};

TEST_P(RejectsMalformedFlagTest, WithInvalidArgumentNamingFlagAndValue) {
  const BadFlag& bad = GetParam();
  const absl::StatusOr<Options> options = Resolve({{kInitArgs, bad.init_args}});
  ASSERT_FALSE(options.ok());
  EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(MessageOf(options),
              HasSubstr("LIBTPU_INIT_ARGS flag --" + bad.flag + "=\"" +
                        bad.value + "\""));
}

constexpr char kSizeFlag[] = "tpu_premapped_buffer_size";
constexpr char kThresholdFlag[] =
    "tpu_premapped_buffer_transfer_threshold_bytes";

INSTANTIATE_TEST_SUITE_P(
    BothFlags, RejectsMalformedFlagTest,
    ::testing::Values(
        BadFlag{kSizeFlag, "abc", "--tpu_premapped_buffer_size=abc"},
        BadFlag{kSizeFlag, "", "--tpu_premapped_buffer_size="},
        BadFlag{kSizeFlag, "5000", "-tpu_premapped_buffer_size=5000"},
        BadFlag{kSizeFlag, "4G", "--tpu_premapped_buffer_size 4G"},
        BadFlag{kSizeFlag, "-4096", "--tpu_premapped_buffer_size=-4096"},
        BadFlag{kSizeFlag, "0x1000", "--tpu_premapped_buffer_size=0x1000"},
        BadFlag{kSizeFlag, "18446744073709551616",
                "--tpu_premapped_buffer_size=18446744073709551616"},
        BadFlag{kThresholdFlag, "0",
                "--tpu_premapped_buffer_transfer_threshold_bytes=0"},
        BadFlag{kThresholdFlag, "-1",
                "--tpu_premapped_buffer_transfer_threshold_bytes -1"},
        BadFlag{kThresholdFlag, "1e6",
                "--tpu_premapped_buffer_transfer_threshold_bytes=1e6"}));

// ---- Malformed API overrides ------------------------------------------------

struct BadApi {
  std::string mention;  // what the message must contain
  void (*set)(OptionOverrides& api);
};

void PrintTo(const BadApi& bad, std::ostream* os) { *os << bad.mention; }

class RejectsMalformedApiTest : public ::testing::TestWithParam<BadApi> {};

TEST_P(RejectsMalformedApiTest, WithInvalidArgumentNamingFieldAndValue) {
  OptionOverrides api;
  GetParam().set(api);
  const absl::StatusOr<Options> options = Resolve({}, api);
  ASSERT_FALSE(options.ok());
  EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(MessageOf(options), HasSubstr(GetParam().mention));
}

INSTANTIATE_TEST_SUITE_P(
    EveryField, RejectsMalformedApiTest,
    ::testing::Values(
        BadApi{"API option premapped_buffer_size=\"5000\" is not a multiple "
               "of 4096 (whole 4 KiB pages); the nearest valid values are "
               "4096 and 8192",
               [](OptionOverrides& api) { api.premapped_buffer_size = 5000; }},
        BadApi{"API option premapped_buffer_size=\"100\"",
               [](OptionOverrides& api) { api.premapped_buffer_size = 100; }},
        BadApi{"API option premapped_buffer_transfer_threshold_bytes=\"0\"",
               [](OptionOverrides& api) {
                 api.premapped_buffer_transfer_threshold_bytes = 0;
               }},
        BadApi{"API option log_dir=\"\"",
               [](OptionOverrides& api) { api.log_dir = ""; }},
        BadApi{"API option min_log_level=\"4\"",
               [](OptionOverrides& api) { api.min_log_level = 4; }},
        BadApi{"API option min_log_level=\"-1\"",
               [](OptionOverrides& api) { api.min_log_level = -1; }},
        BadApi{"API option stderr_log_level=\"7\"",
               [](OptionOverrides& api) { api.stderr_log_level = 7; }},
        BadApi{"API option max_log_size_mb=\"0\"",
               [](OptionOverrides& api) { api.max_log_size_mb = 0; }},
        BadApi{"API option max_log_size_mb=\"1048577\"",
               [](OptionOverrides& api) { api.max_log_size_mb = 1048577; }},
        BadApi{"API option log_keep=\"-1\"",
               [](OptionOverrides& api) { api.log_keep = -1; }},
        BadApi{
            "API option device=\"vfio://0000:00:04.0\": ",
            [](OptionOverrides& api) { api.device = "vfio://0000:00:04.0"; }},
        BadApi{"API option device=\"sim://?devices=0\": ",
               [](OptionOverrides& api) { api.device = "sim://?devices=0"; }},
        BadApi{"API option hugepages=\"unknown\"",
               [](OptionOverrides& api) {
                 api.hugepages = static_cast<HugePagesMode>(42);
               }},
        BadApi{"API option prefault_threads=\"1025\"",
               [](OptionOverrides& api) { api.prefault_threads = 1025; }},
        BadApi{"API option prefault_threads=\"-3\"",
               [](OptionOverrides& api) { api.prefault_threads = -3; }},
        BadApi{"API option numa_node=\"1024\"",
               [](OptionOverrides& api) {
                 api.numa_node = std::optional<int>(1024);
               }},
        BadApi{"API option numa_node=\"-1\"",
               [](OptionOverrides& api) {
                 api.numa_node = std::optional<int>(-1);
               }},
        BadApi{"API option mlock=\"unknown\"",
               [](OptionOverrides& api) {
                 api.mlock = static_cast<MlockMode>(9);
               }},
        BadApi{"API option faults=\"mmap:nth=0\": ",
               [](OptionOverrides& api) { api.faults = "mmap:nth=0"; }}));

// ---- The threshold ----------------------------------------------------------

TEST(ThresholdTest, DefaultsToTheSizeFromTheEnvironment) {
  const Options options = MustResolve({{kSize, "8192"}});
  EXPECT_EQ(options.premapped_buffer_transfer_threshold_bytes.value, 8192u);
  EXPECT_EQ(options.premapped_buffer_transfer_threshold_bytes.source,
            OptionSource::kDefault);
  EXPECT_EQ(options.premapped_buffer_transfer_threshold_bytes.raw, "");
}

TEST(ThresholdTest, DefaultsToTheSizeFromAFlag) {
  const Options options =
      MustResolve({{kInitArgs, "--tpu_premapped_buffer_size=12288"}});
  EXPECT_EQ(options.premapped_buffer_transfer_threshold_bytes.value, 12288u);
  EXPECT_EQ(options.premapped_buffer_transfer_threshold_bytes.source,
            OptionSource::kDefault);
}

TEST(ThresholdTest, DefaultsToTheSizeFromTheApi) {
  OptionOverrides api;
  api.premapped_buffer_size = 16384;
  EXPECT_EQ(
      MustResolve({}, api).premapped_buffer_transfer_threshold_bytes.value,
      16384u);
}

TEST(ThresholdTest, EqualToTheSizeIsKeptWithoutWarning) {
  const Options options = MustResolve({{kSize, "8192"}, {kThreshold, "8192"}});
  EXPECT_EQ(options.premapped_buffer_transfer_threshold_bytes.value, 8192u);
  EXPECT_EQ(options.premapped_buffer_transfer_threshold_bytes.source,
            OptionSource::kEnv);
  EXPECT_THAT(options.warnings, IsEmpty());
}

TEST(MisspelledVariableTest, OneWarningNamingTheClosestKnownVariable) {
  const Options options = MustResolve({{"TPU_PREMAPPED_BUFER_SIZE", "8192"},
                                       {"TPUSHIM_MLOK", "off"}});
  // Nothing was taken from the misspelled names.
  EXPECT_EQ(options.premapped_buffer_size.source, OptionSource::kDefault);
  EXPECT_EQ(options.mlock.source, OptionSource::kDefault);
  EXPECT_THAT(
      options.warnings,
      ElementsAre("TPUSHIM_MLOK is set, but tpushim reads no such variable "
                  "and ignores it; did you mean TPUSHIM_MLOCK?",
                  "TPU_PREMAPPED_BUFER_SIZE is set, but tpushim reads no such "
                  "variable and ignores it; did you mean "
                  "TPU_PREMAPPED_BUFFER_SIZE?"));
}

TEST(MisspelledVariableTest, OtherTpuVariablesAreNotOursToJudge) {
  // libtpu's and the cloud's own variables, and tpushim's test harness's.
  const Options options = MustResolve({{"TPU_NAME", "local"},
                                       {"TPU_WORKER_ID", "0"},
                                       {"TPU_ACCELERATOR_TYPE", "v4-8"},
                                       {"TPUSHIM_TEST_DEVICE", "sim://"},
                                       {"LIBTPU_INIT_ARGS", ""},
                                       {"PATH", "/bin"}});
  EXPECT_THAT(options.warnings, IsEmpty());
}

TEST(ThresholdTest, OneByteOverTheSizeIsClampedWithOneWarning) {
  const Options options = MustResolve({{kSize, "8192"}, {kThreshold, "8193"}});
  EXPECT_EQ(options.premapped_buffer_transfer_threshold_bytes.value, 8192u);
  EXPECT_EQ(options.premapped_buffer_transfer_threshold_bytes.source,
            OptionSource::kEnv);
  EXPECT_EQ(options.premapped_buffer_transfer_threshold_bytes.raw, "8193");
  EXPECT_THAT(
      options.warnings,
      ElementsAre("TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES=\"8193\" is "
                  "larger than TPU_PREMAPPED_BUFFER_SIZE=8192; using 8192"));
}

TEST(ThresholdTest, ClampsAgainstTheDefaultSize) {
  const Options options = MustResolve({{kThreshold, "8589934592"}});
  EXPECT_EQ(options.premapped_buffer_transfer_threshold_bytes.value, k4G);
  ASSERT_THAT(options.warnings, SizeIs(1));
  EXPECT_THAT(options.warnings[0], HasSubstr("\"8589934592\""));
  EXPECT_THAT(options.warnings[0], HasSubstr("=4294967296"));
}

TEST(ThresholdTest, ClampingAnApiValueNamesTheApiOption) {
  OptionOverrides api;
  api.premapped_buffer_transfer_threshold_bytes = 1 << 20;
  const Options options = MustResolve({{kSize, "8192"}}, api);
  EXPECT_EQ(options.premapped_buffer_transfer_threshold_bytes.value, 8192u);
  ASSERT_THAT(options.warnings, SizeIs(1));
  EXPECT_THAT(
      options.warnings[0],
      HasSubstr(
          "API option premapped_buffer_transfer_threshold_bytes=\"1048576\""));
}

TEST(ThresholdTest, AnOverriddenTooLargeValueDrawsNoWarning) {
  OptionOverrides api;
  api.premapped_buffer_transfer_threshold_bytes = 4096;
  const Options options =
      MustResolve({{kSize, "8192"}, {kThreshold, "999999"}}, api);
  EXPECT_EQ(options.premapped_buffer_transfer_threshold_bytes.value, 4096u);
  EXPECT_THAT(options.warnings, IsEmpty());
}

TEST(ThresholdTest, ZeroIsRejected) {
  const absl::StatusOr<Options> options = Resolve({{kThreshold, "0"}});
  ASSERT_FALSE(options.ok());
  EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      MessageOf(options),
      HasSubstr("TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES=\"0\" must be "
                "greater than 0"));
}

TEST(ThresholdTest, IsZeroAndIgnoredWhenTheRegionIsOff) {
  for (const char* threshold : {"8192", "0", "99999999999"}) {
    const Options options =
        MustResolve({{kSize, "0"}, {kThreshold, threshold}});
    EXPECT_FALSE(options.premapped_region_enabled());
    EXPECT_EQ(options.premapped_buffer_size.value, 0u);
    EXPECT_EQ(options.premapped_buffer_transfer_threshold_bytes.value, 0u);
    EXPECT_EQ(options.premapped_buffer_transfer_threshold_bytes.source,
              OptionSource::kDefault);
    EXPECT_THAT(options.warnings, IsEmpty()) << threshold;
  }
  EXPECT_EQ(MustResolve({{kSize, "0"}})
                .premapped_buffer_transfer_threshold_bytes.value,
            0u);
}

TEST(ThresholdTest, MustStillBeADecimalWhenTheRegionIsOff) {
  const absl::StatusOr<Options> options =
      Resolve({{kSize, "0"}, {kThreshold, "lots"}});
  ASSERT_FALSE(options.ok());
  EXPECT_THAT(MessageOf(options),
              HasSubstr("TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES="
                        "\"lots\""));
}

// ---- TPU_VMODULE ------------------------------------------------------------

TEST(VmoduleTest, ParsesEntriesAndTrimsWhitespace) {
  std::vector<std::string> warnings;
  EXPECT_THAT(ParseVmodule(" premapped_region=2 , *queue* = 1,a=0", &warnings),
              ElementsAre(VmoduleEntry{"premapped_region", 2},
                          VmoduleEntry{"*queue*", 1}, VmoduleEntry{"a", 0}));
  EXPECT_THAT(warnings, IsEmpty());
}

TEST(VmoduleTest, EmptyTextAndEmptyEntriesAreNoEntries) {
  std::vector<std::string> warnings;
  EXPECT_THAT(ParseVmodule("", &warnings), IsEmpty());
  EXPECT_THAT(ParseVmodule(" , ,", &warnings), IsEmpty());
  EXPECT_THAT(ParseVmodule("a=1,,b=2,", &warnings),
              ElementsAre(VmoduleEntry{"a", 1}, VmoduleEntry{"b", 2}));
  EXPECT_THAT(warnings, IsEmpty());
}

TEST(VmoduleTest, SkipsEachMalformedEntryWithOneWarning) {
  std::vector<std::string> warnings;
  EXPECT_THAT(
      ParseVmodule("3,good=1,=2,foo=,foo=x,foo=-1,foo=99999999999,also=3",
                   &warnings),
      ElementsAre(VmoduleEntry{"good", 1}, VmoduleEntry{"also", 3}));
  ASSERT_THAT(warnings, SizeIs(6));
  EXPECT_EQ(warnings[0],
            "TPU_VMODULE entry \"3\" ignored: expected <glob>=<level>, e.g. "
            "premapped_region=2");
  EXPECT_EQ(warnings[1],
            "TPU_VMODULE entry \"=2\" ignored: the file glob before '=' is "
            "empty");
  EXPECT_THAT(warnings[2], HasSubstr("\"foo=\" ignored: the level \"\""));
  EXPECT_THAT(warnings[3], HasSubstr("\"foo=x\" ignored: the level \"x\""));
  EXPECT_THAT(warnings[4], HasSubstr("\"foo=-1\" ignored"));
  EXPECT_THAT(warnings[5], HasSubstr("\"foo=99999999999\" ignored"));
}

TEST(VmoduleTest, AcceptsANullWarningsVector) {
  EXPECT_THAT(ParseVmodule("3,a=1", nullptr),
              ElementsAre(VmoduleEntry{"a", 1}));
}

TEST(VmoduleTest, MalformedEntriesAreWarningsNotErrors) {
  const Options options = MustResolve({{"TPU_VMODULE", "3,foo=2"}});
  EXPECT_THAT(options.vmodule.value, ElementsAre(VmoduleEntry{"foo", 2}));
  EXPECT_EQ(options.vmodule.raw, "3,foo=2");
  ASSERT_THAT(options.warnings, SizeIs(1));
  EXPECT_THAT(options.warnings[0], HasSubstr("TPU_VMODULE entry \"3\""));
}

// ---- DescribeOptions --------------------------------------------------------

std::vector<std::string> Column(const std::vector<OptionRow>& rows,
                                std::string OptionRow::*field) {
  std::vector<std::string> column;
  for (const OptionRow& row : rows) column.push_back(row.*field);
  return column;
}

TEST(DescribeOptionsTest, OneRowPerSettingInDocumentedOrderWithDefaults) {
  const std::vector<OptionRow> rows = DescribeOptions(MustResolve({}));
  EXPECT_THAT(
      Column(rows, &OptionRow::name),
      ElementsAre(
          "TPU_PREMAPPED_BUFFER_SIZE",
          "TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES", "TPU_LOG_DIR",
          "TPU_MIN_LOG_LEVEL", "TPU_STDERR_LOG_LEVEL", "TPU_VMODULE",
          "TPU_MAX_LOG_SIZE_MB", "TPUSHIM_LOG_KEEP", "TPUSHIM_DEVICE",
          "TPUSHIM_HUGEPAGES", "TPUSHIM_PREFAULT_THREADS", "TPUSHIM_NUMA_NODE",
          "TPUSHIM_MLOCK", "TPUSHIM_FAULTS", "TPUSHIM_TRACE_FILE",
          "TPUSHIM_PREMAP", "TPUSHIM_MEMORY_PROFILE", "TPU_VISIBLE_CHIPS",
          "TPU_CHIPS_PER_PROCESS_BOUNDS", "TPU_PROCESS_BOUNDS",
          "TPUSHIM_DUMP_ON_OOM", "TPUSHIM_RUN_DIR"));
  EXPECT_THAT(Column(rows, &OptionRow::value),
              ElementsAre("4294967296", "4294967296", "/tmp/tpu_logs", "0", "2",
                          "\"\"", "1024", "5", "sim://", "auto", "0", "auto",
                          "on", "\"\"", "\"\"", "foreground", "\"\"", "\"\"",
                          "\"\"", "\"\"", "0", "/tmp/tpushim-run"));
}

TEST(DescribeOptionsTest, ShowsCanonicalValuesAndSources) {
  OptionOverrides api;
  api.mlock = MlockMode::kRequired;
  const std::vector<OptionRow> rows = DescribeOptions(
      MustResolve({{kInitArgs, "--tpu_premapped_buffer_size=8192"},
                   {"TPU_VMODULE", " a=1 , b*=2 ,3"},
                   {"TPUSHIM_DEVICE", "sim://?devices=2"},
                   {"TPUSHIM_HUGEPAGES", "THP"},
                   {"TPUSHIM_NUMA_NODE", "01"},
                   {"TPUSHIM_FAULTS", "mmap:nth=1"},
                   {"TPUSHIM_PREMAP", "BACKGROUND"},
                   {"TPUSHIM_DUMP_ON_OOM", "1"}},
                  api));
  EXPECT_THAT(
      Column(rows, &OptionRow::value),
      ElementsAre("8192", "8192", "/tmp/tpu_logs", "0", "2", "a=1,b*=2", "1024",
                  "5", "sim://?devices=2", "thp", "0", "1", "required",
                  "mmap:nth=1", "\"\"", "background", "\"\"", "\"\"", "\"\"",
                  "\"\"", "1", "/tmp/tpushim-run"));
  std::vector<OptionSource> sources;
  for (const OptionRow& row : rows) sources.push_back(row.source);
  using S = OptionSource;
  EXPECT_THAT(
      sources,
      ElementsAre(S::kFlag, S::kDefault, S::kDefault, S::kDefault, S::kDefault,
                  S::kEnv, S::kDefault, S::kDefault, S::kEnv, S::kEnv,
                  S::kDefault, S::kEnv, S::kApi, S::kEnv, S::kDefault, S::kEnv,
                  S::kDefault, S::kDefault, S::kDefault, S::kDefault, S::kEnv,
                  S::kDefault));
}

// ---- Small helpers ----------------------------------------------------------

TEST(OptionsTest, EffectivePrefaultThreadsIsOnlineCpusCappedAt16) {
  Options options;
  EXPECT_EQ(options.EffectivePrefaultThreads(4), 4);
  EXPECT_EQ(options.EffectivePrefaultThreads(16), 16);
  EXPECT_EQ(options.EffectivePrefaultThreads(96), 16);
  EXPECT_EQ(options.EffectivePrefaultThreads(0), 1);
  options.prefault_threads.value = 40;
  EXPECT_EQ(options.EffectivePrefaultThreads(4), 40);
  EXPECT_EQ(options.EffectivePrefaultThreads(96), 40);
}

TEST(OptionsTest, NamesSourcesAndModes) {
  EXPECT_EQ(OptionSourceName(OptionSource::kDefault), "default");
  EXPECT_EQ(OptionSourceName(OptionSource::kEnv), "env");
  EXPECT_EQ(OptionSourceName(OptionSource::kFlag), "LIBTPU_INIT_ARGS");
  EXPECT_EQ(OptionSourceName(OptionSource::kApi), "api");
  EXPECT_EQ(HugePagesModeName(HugePagesMode::kAuto), "auto");
  EXPECT_EQ(HugePagesModeName(HugePagesMode::kHugetlb), "hugetlb");
  EXPECT_EQ(HugePagesModeName(HugePagesMode::kThp), "thp");
  EXPECT_EQ(HugePagesModeName(HugePagesMode::kOff), "off");
  EXPECT_EQ(MlockModeName(MlockMode::kOn), "on");
  EXPECT_EQ(MlockModeName(MlockMode::kRequired), "required");
  EXPECT_EQ(MlockModeName(MlockMode::kOff), "off");
}

// ---- SetOptionOverride (the C API's name/value options) ----------------------

TEST(SetOptionOverrideTest, SetsEveryFieldFromItsVariableText) {
  OptionOverrides o;
  const std::vector<std::pair<std::string, std::string>> settings = {
      {"TPU_PREMAPPED_BUFFER_SIZE", "8388608"},
      {"TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES", "1048576"},
      {"TPU_LOG_DIR", "disabled"},
      {"TPU_MIN_LOG_LEVEL", "1"},
      {"TPU_STDERR_LOG_LEVEL", "3"},
      {"TPU_VMODULE", "premapped_region=2"},
      {"TPU_MAX_LOG_SIZE_MB", "16"},
      {"TPUSHIM_LOG_KEEP", "2"},
      {"TPUSHIM_DEVICE", "sim://?devices=2"},
      {"TPUSHIM_HUGEPAGES", "THP"},
      {"TPUSHIM_PREFAULT_THREADS", "3"},
      {"TPUSHIM_NUMA_NODE", "auto"},
      {"TPUSHIM_MLOCK", "off"},
      {"TPUSHIM_FAULTS", "dma:nth=2"},
      {"TPUSHIM_TRACE_FILE", "/tmp/t.json"},
      {"TPUSHIM_PREMAP", "Background"},
      {"TPUSHIM_DUMP_ON_OOM", "1"},
  };
  for (const auto& [name, value] : settings) {
    EXPECT_TRUE(SetOptionOverride(o, name, value).ok()) << name;
  }
  EXPECT_EQ(o.premapped_buffer_size, uint64_t{8388608});
  EXPECT_EQ(o.premapped_buffer_transfer_threshold_bytes, uint64_t{1048576});
  EXPECT_EQ(o.log_dir, "disabled");
  EXPECT_EQ(o.min_log_level, 1);
  EXPECT_EQ(o.stderr_log_level, 3);
  EXPECT_EQ(o.vmodule, "premapped_region=2");
  EXPECT_EQ(o.max_log_size_mb, uint64_t{16});
  EXPECT_EQ(o.log_keep, 2);
  EXPECT_EQ(o.device, "sim://?devices=2");
  EXPECT_EQ(o.hugepages, HugePagesMode::kThp);
  EXPECT_EQ(o.prefault_threads, 3);
  ASSERT_TRUE(o.numa_node.has_value());
  EXPECT_EQ(*o.numa_node, std::nullopt);
  EXPECT_EQ(o.mlock, MlockMode::kOff);
  EXPECT_EQ(o.faults, "dma:nth=2");
  EXPECT_EQ(o.trace_file, "/tmp/t.json");
  EXPECT_EQ(o.premap, PremapMode::kBackground);
  EXPECT_EQ(o.dump_on_oom, true);

  // And they resolve as API values.
  const Options options = MustResolve({}, o);
  EXPECT_EQ(options.premapped_buffer_size.value, uint64_t{8388608});
  EXPECT_EQ(options.premapped_buffer_size.source, OptionSource::kApi);
  EXPECT_EQ(options.device.value.text, "sim://?devices=2");
  EXPECT_EQ(options.device.source, OptionSource::kApi);
}

TEST(SetOptionOverrideTest, MalformedValueIsTheEnvironmentError) {
  OptionOverrides o;
  const absl::Status s =
      SetOptionOverride(o, "TPU_PREMAPPED_BUFFER_SIZE", "5000");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  const absl::StatusOr<Options> env =
      Resolve({{"TPU_PREMAPPED_BUFFER_SIZE", "5000"}});
  EXPECT_EQ(std::string(s.message()), MessageOf(env));
  EXPECT_FALSE(o.premapped_buffer_size.has_value());

  for (const auto& [name, value] :
       std::vector<std::pair<std::string, std::string>>{
           {"TPUSHIM_DEVICE", "tcp://x"},
           {"TPUSHIM_MLOCK", "sometimes"},
           {"TPUSHIM_NUMA_NODE", "-1"},
           {"TPU_MIN_LOG_LEVEL", "4"},
           {"TPUSHIM_FAULTS", "dma:nth=0"},
           {"TPU_LOG_DIR", ""}}) {
    const absl::Status e = SetOptionOverride(o, name, value);
    EXPECT_EQ(e.code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_THAT(std::string(e.message()), HasSubstr(name));
  }
}

TEST(SetOptionOverrideTest, UnknownNameIsInvalidArgumentListingKnownOnes) {
  OptionOverrides o;
  const absl::Status s = SetOptionOverride(o, "TPU_PREMAPPED_SIZE", "4096");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("TPU_PREMAPPED_SIZE"));
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("TPU_PREMAPPED_BUFFER_SIZE, "));
  // Names are case-sensitive, like variables.
  EXPECT_FALSE(SetOptionOverride(o, "tpu_log_dir", "x").ok());
}

TEST(SetOptionOverrideTest, ThresholdIsCheckedAgainstTheSizeAtResolution) {
  OptionOverrides o;
  // 0 parses (the region may be off) ...
  ASSERT_TRUE(
      SetOptionOverride(o, "TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES", "0")
          .ok());
  // ... but not with a region.
  EXPECT_EQ(Resolve({}, o).status().code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(SetOptionOverride(o, "TPU_PREMAPPED_BUFFER_SIZE", "0").ok());
  EXPECT_TRUE(Resolve({}, o).ok());
  // Larger than the size: kept as given, clamped at resolution.
  ASSERT_TRUE(SetOptionOverride(o, "TPU_PREMAPPED_BUFFER_SIZE", "8192").ok());
  ASSERT_TRUE(
      SetOptionOverride(o, "TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES",
                        "1048576")
          .ok());
  EXPECT_EQ(o.premapped_buffer_transfer_threshold_bytes, uint64_t{1048576});
  const Options options = MustResolve({}, o);
  EXPECT_EQ(options.premapped_buffer_transfer_threshold_bytes.value, 8192u);
  EXPECT_THAT(options.warnings, SizeIs(1));
}

}  // namespace
}  // namespace tpushim
