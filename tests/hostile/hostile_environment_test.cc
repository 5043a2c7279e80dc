// Hostile environments (the reliability issue's part 5): the real
// `tpushim demo` (small: 2 steps of 256 KiB on two simulated devices, a
// 16 MiB region) runs where things are against it, and must end with an
// error that names the cause, or the documented fallback — never a crash, a
// hang or an OOM kill:
//  * a 64 KiB RLIMIT_MEMLOCK as nobody, without CAP_IPC_LOCK: the region
//    stays unpinned with a WARNING (TPUSHIM_MLOCK=on), start-up fails by
//    name under TPUSHIM_MLOCK=required, pinned transfers fail by name;
//  * a region larger than MemAvailable: RESOURCE_EXHAUSTED naming both
//    numbers, before any page is touched;
//  * /tmp/tpu_logs a planted symlink, or another user's directory, and the
//    fallback planted too: the logging fallback with its one WARNING;
//  * a full disk for the logs (a 16 KiB tmpfs): lines dropped with one
//    WARNING per file, no torn line, the run completes.
//
// All but the MemAvailable one need root, to give the tool a private
// mount namespace whose /tmp is this test's directory (tests/hostile/
// hostile_launcher.cc) — so that nothing touches the machine's
// /tmp/tpu_logs — and to become nobody. Without root they fail, saying
// so: CI runs as root, and a skipped test would hide a machine that cannot
// host them.

#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/log_check.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace tpushim {
namespace {

using ::testing::AllOf;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::SizeIs;
using ::testing::StartsWith;
using testutil::LogDirectoryProblems;
using testutil::ReadFileOrEmpty;
using testutil::RunSubprocess;
using testutil::StartupLinesProblems;
using testutil::SubprocessResult;
using testutil::TempDir;
using Json = nlohmann::json;

constexpr uint64_t kRegionBytes = uint64_t{16} << 20;
const std::vector<std::string> kSmallSystem = {
    absl::StrCat("TPU_PREMAPPED_BUFFER_SIZE=", kRegionBytes),
    "TPUSHIM_DEVICE=sim://?devices=2&hbm=64M"};
const std::vector<std::string> kDemo = {
    "demo", "--steps",   "2", "--batch-bytes",
    "256K", "--step-ms", "1", "--json"};

// Every run ends well within this (about a second each); past it the run
// is a hang, killed and reported.
constexpr absl::Duration kRunBound = absl::Seconds(60);

// nobody:nogroup on Debian.
constexpr uid_t kNobody = 65534;

constexpr char kNeedsRoot[] =
    "the hostile-environment tests need root: they give the tool a private "
    "mount namespace (so that the machine's /tmp/tpu_logs is never touched) "
    "and run it as nobody. Run them as root (CI does), or leave them out "
    "with `ctest -LE hostile`.";

// The status of launcher step failures (hostile_launcher.cc).
constexpr int kLauncherSetupFailed = 125;

// The sanitizer runtimes of ASan and TSan intercept mlock() and return
// success without locking anything ("ignores mlock/mlockall/munlock/
// munlockall"), so in such a build of the tool no memlock limit can make a
// pin fail.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitizerFakesMlock = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitizerFakesMlock = true;
#else
constexpr bool kSanitizerFakesMlock = false;
#endif
#else
constexpr bool kSanitizerFakesMlock = false;
#endif

std::vector<std::string> Concat(std::vector<std::string> a,
                                const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// What no run may do, whatever its environment: hang (it would be killed
// at kRunBound), die by a signal (a crash, or SIGKILL from the OOM
// killer), or not get going (the launcher could not set up). Returns the
// result when none of these happened.
std::optional<SubprocessResult> Finished(
    const absl::StatusOr<SubprocessResult>& result) {
  if (!result.ok()) {
    ADD_FAILURE() << "hung or could not run: " << result.status();
    return std::nullopt;
  }
  if (result->term_signal != 0) {
    ADD_FAILURE() << "ended by signal " << result->term_signal
                  << " (a crash, or the OOM killer's SIGKILL); stderr:\n"
                  << result->err;
    return std::nullopt;
  }
  if (result->exit_code == kLauncherSetupFailed &&
      absl::StrContains(result->err, "hostile_launcher:")) {
    ADD_FAILURE() << "this machine cannot host the test: " << result->err;
    return std::nullopt;
  }
  return *result;
}

Json ParseJson(const std::string& text) {
  Json json = Json::parse(text, /*cb=*/nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(json.is_discarded()) << "not one JSON value:\n" << text;
  return json;
}

// The lines of `text` that contain `needle`.
std::vector<std::string> LinesWith(const std::string& text,
                                   absl::string_view needle) {
  std::vector<std::string> lines;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StrContains(line, needle)) lines.emplace_back(line);
  }
  return lines;
}

// Names in `dir`; none when it is not a directory.
std::vector<std::string> List(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code error;
  for (const auto& e : std::filesystem::directory_iterator(dir, error)) {
    names.push_back(e.path().filename().string());
  }
  return names;
}

// What `path` is, to tell whether a run changed it: a symlink's target, a
// file's contents, a directory's names, or "missing".
std::string Describe(const std::string& path) {
  std::error_code error;
  const std::filesystem::file_status st =
      std::filesystem::symlink_status(path, error);
  if (std::filesystem::is_symlink(st)) {
    return "symlink to " + std::filesystem::read_symlink(path, error).string();
  }
  if (std::filesystem::is_regular_file(st)) {
    return "file holding " + ReadFileOrEmpty(path);
  }
  if (std::filesystem::is_directory(st)) {
    return "directory holding " + absl::StrJoin(List(path), ",");
  }
  return "missing";
}

// Planting, as root, what another user could have left.
void MakeDirectory(const std::string& path, uid_t owner, mode_t mode) {
  ASSERT_EQ(mkdir(path.c_str(), mode), 0) << path;
  ASSERT_EQ(chown(path.c_str(), owner, owner), 0) << path;
  ASSERT_EQ(chmod(path.c_str(), mode), 0) << path;  // past the umask
}
void MakeSymlink(const std::string& target, const std::string& link,
                 uid_t owner) {
  ASSERT_EQ(symlink(target.c_str(), link.c_str()), 0) << link;
  ASSERT_EQ(lchown(link.c_str(), owner, owner), 0) << link;
}

class HostileEnvironmentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(geteuid(), 0u) << kNeedsRoot;
    // The tool's /tmp: world-writable and sticky, like the real one.
    ASSERT_EQ(chmod(tmp_.path().c_str(), 01777), 0);
    // A copy of the tool that any user may run: the build tree may sit in
    // a home directory that nobody cannot enter.
    std::error_code error;
    std::filesystem::copy_file(TPUSHIM_TOOL_PATH, tmp_.Join("tpushim"), error);
    ASSERT_FALSE(error) << "copying " << TPUSHIM_TOOL_PATH << ": "
                        << error.message();
    ASSERT_EQ(chmod(tmp_.Join("tpushim").c_str(), 0755), 0);
  }

  // `tpushim demo` (small, --json) with exactly `env`, in a private mount
  // namespace whose /tmp is tmp_, after the launcher's `steps`.
  std::optional<SubprocessResult> RunDemo(const std::vector<std::string>& steps,
                                          const std::vector<std::string>& env) {
    std::vector<std::string> args = {"--private-tmp=" + tmp_.path()};
    args = Concat(args, steps);
    args = Concat(args, {"--", "/tmp/tpushim"});
    return Finished(RunSubprocess(HOSTILE_LAUNCHER_PATH, Concat(args, kDemo),
                                  env, kRunBound));
  }

  // A path under the tool's /tmp, as this process sees it.
  std::string Tmp(absl::string_view name) const { return tmp_.Join(name); }

  TempDir tmp_;
};

// ---- A tiny RLIMIT_MEMLOCK, as nobody ---------------------------------------

// The launcher steps: 64 KiB of memlock, then nobody, whose capabilities
// (CAP_IPC_LOCK among them) go with root.
const std::vector<std::string> kTinyMemlockAsNobody = {
    "--memlock=65536", absl::StrCat("--user=", kNobody, ":", kNobody)};

constexpr char kMemlockWarning[] =
    "The RLIMIT_MEMLOCK soft limit of 65536 (64.0K) is below "
    "TPU_PREMAPPED_BUFFER_SIZE=16777216 (16.00M) and the process lacks "
    "CAP_IPC_LOCK, so ";

TEST_F(HostileEnvironmentTest,
       TinyMemlockAsNobodyRunsWithTheRegionUnpinnedAndSaysWhy) {
  // /tmp/tpu_logs as root's runs leave it: root's, not writable by others.
  MakeDirectory(Tmp("tpu_logs"), 0, 0755);
  const std::optional<SubprocessResult> r =
      RunDemo(kTinyMemlockAsNobody, kSmallSystem);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->exit_code, 0) << r->err;
  const Json json = ParseJson(r->out);
  EXPECT_EQ(json["errors"], 0) << r->out;
  EXPECT_EQ(json["logs"]["directory"], "/tmp/tpu_logs_nobody");
  // The summary says why the region is not locked, and how to fix it.
  EXPECT_EQ(json["region"]["locked"], false);
  EXPECT_THAT(
      json["region"]["not_locked_reason"].get<std::string>(),
      AllOf(HasSubstr(kMemlockWarning), HasSubstr("ulimit -l unlimited")));

  // The logging fallback, with its one WARNING on stderr.
  EXPECT_THAT(LinesWith(r->err, "Log directory"),
              ElementsAre(AllOf(
                  StartsWith("W"),
                  HasSubstr("] Log directory /tmp/tpu_logs is not writable ("),
                  EndsWith("); logging to /tmp/tpu_logs_nobody instead"))));
  EXPECT_THAT(List(Tmp("tpu_logs")), IsEmpty());

  // The region unpinned (a failed mlock is only a WARNING under
  // TPUSHIM_MLOCK=on), that WARNING saying why and what to do, and no
  // "mlock()-ed" line.
  const std::string logs = Tmp("tpu_logs_nobody");
  EXPECT_EQ(LogDirectoryProblems(logs), "");
  const std::string info = ReadFileOrEmpty(logs + "/tpu_driver.INFO");
  EXPECT_EQ(
      StartupLinesProblems(
          info, {.region_bytes = kRegionBytes, .devices = 2, .locked = false}),
      "");
  EXPECT_THAT(ReadFileOrEmpty(logs + "/tpu_driver.WARNING"),
              HasSubstr(absl::StrCat(
                  kMemlockWarning,
                  "the region would stay unpinned (slower transfers); raise "
                  "the limit with")));
  // Written by nobody: the privileges were dropped.
  struct stat st;
  ASSERT_EQ(stat((logs + "/tpu_driver.INFO").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, kNobody);
}

TEST_F(HostileEnvironmentTest, TinyMemlockAsNobodyFailsPinnedTransfersByName) {
  if (kSanitizerFakesMlock) {
    GTEST_SKIP() << "this sanitizer build's mlock() always succeeds, so "
                    "RLIMIT_MEMLOCK cannot fail a pin; the Release build "
                    "(CI) runs this test";
  }
  MakeDirectory(Tmp("logs"), kNobody, 0755);
  // 128 KiB shards are over a 64 KiB threshold: the caller's pages are
  // pinned for each transfer, which the limit does not allow.
  const std::optional<SubprocessResult> r =
      RunDemo(kTinyMemlockAsNobody,
              Concat(kSmallSystem,
                     {"TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES=65536",
                      "TPU_LOG_DIR=/tmp/logs"}));
  ASSERT_TRUE(r.has_value());
  // The demo ran to its summary and counts the failures (exit status 1).
  EXPECT_EQ(r->exit_code, 1) << r->err;
  const Json json = ParseJson(r->out);
  const Json& errors = json["error_detail"];
  EXPECT_GT(errors["failed_transfers"].get<uint64_t>(), 0u) << r->out;
  EXPECT_EQ(json["errors"], errors["failed_transfers"]);
  EXPECT_EQ(errors["hash_mismatches"], 0);
  EXPECT_EQ(json["transfers"]["h2d"]["pinned"]["failed"],
            json["transfers"]["h2d"]["pinned"]["transfers"]);
  const std::string first = errors["first_error"].get<std::string>();
  EXPECT_THAT(first, HasSubstr("RESOURCE_EXHAUSTED: Pinning 128.0K of caller "
                               "memory for a "));
  EXPECT_THAT(first, HasSubstr("Raise the memlock limit (ulimit -l) or "
                               "allocate the buffer from the premapped "
                               "region."));
  EXPECT_EQ(LogDirectoryProblems(Tmp("logs")), "");
}

TEST_F(HostileEnvironmentTest,
       TinyMemlockAsNobodyWithMlockRequiredFailsStartupByName) {
  MakeDirectory(Tmp("logs"), kNobody, 0755);
  const std::optional<SubprocessResult> r = RunDemo(
      kTinyMemlockAsNobody, Concat(kSmallSystem, {"TPUSHIM_MLOCK=required",
                                                  "TPU_LOG_DIR=/tmp/logs"}));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->exit_code, 1) << r->err;  // "cannot start the runtime"
  const Json json = ParseJson(r->out);
  EXPECT_EQ(json["error"]["code"], "RESOURCE_EXHAUSTED") << r->out;
  EXPECT_THAT(json["error"]["message"].get<std::string>(),
              HasSubstr(absl::StrCat(kMemlockWarning,
                                     "start-up would fail because "
                                     "TPUSHIM_MLOCK=required")));
  EXPECT_EQ(LogDirectoryProblems(Tmp("logs")), "");
}

// ---- A region larger than MemAvailable --------------------------------------

// MemAvailable from /proc/meminfo, in bytes; 0 when unreadable.
uint64_t MemAvailableBytes() {
  std::istringstream meminfo(ReadFileOrEmpty("/proc/meminfo"));
  std::string line;
  while (std::getline(meminfo, line)) {
    std::vector<std::string> fields =
        absl::StrSplit(line, ' ', absl::SkipEmpty());
    uint64_t kb = 0;
    if (fields.size() >= 2 && fields[0] == "MemAvailable:" &&
        absl::SimpleAtoi(fields[1], &kb)) {
      return kb * 1024;
    }
  }
  return 0;
}

// Needs no root: the check comes before anything is mapped.
TEST(RegionLargerThanMemAvailableTest,
     IsResourceExhaustedNamingBothNumbersBeforeTouchingMemory) {
  const uint64_t available = MemAvailableBytes();
  ASSERT_GT(available, 0u) << "no MemAvailable in /proc/meminfo";
  // 1 GiB more than is available, in whole pages.
  const uint64_t size = (available + (uint64_t{1} << 30)) / 4096 * 4096;
  TempDir logs;
  const std::optional<SubprocessResult> r =
      Finished(RunSubprocess(TPUSHIM_TOOL_PATH, kDemo,
                             {absl::StrCat("TPU_PREMAPPED_BUFFER_SIZE=", size),
                              "TPUSHIM_DEVICE=sim://?devices=2&hbm=64M",
                              absl::StrCat("TPU_LOG_DIR=", logs.path())},
                             kRunBound));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->exit_code, 1) << r->err;  // "cannot start the runtime"
  const Json json = ParseJson(r->out);
  EXPECT_EQ(json["error"]["code"], "RESOURCE_EXHAUSTED") << r->out;
  const std::string message = json["error"]["message"].get<std::string>();
  EXPECT_THAT(message,
              HasSubstr(absl::StrCat(
                  "Cannot premap TPU_PREMAPPED_BUFFER_SIZE=", size, " (")));
  EXPECT_THAT(message, HasSubstr(": MemAvailable is "));
  EXPECT_THAT(message, HasSubstr("set TPU_PREMAPPED_BUFFER_SIZE to at most "));
  // Nothing was touched: the tool's peak resident set is a small fraction
  // of the region (a sanitizer build's own overhead included).
  EXPECT_LT(r->max_rss_bytes, uint64_t{512} << 20);
  EXPECT_LT(r->max_rss_bytes, size / 8);
  EXPECT_EQ(LogDirectoryProblems(logs.path()), "");
}

// ---- Planted log directories ------------------------------------------------

// What is planted, and what the logging fallback must say about it.
struct PlantedCase {
  const char* name;
  // Plants into the tool's /tmp (given as this process sees it).
  void (*plant)(const TempDir& tmp);
  // The WARNING's text after "] ".
  const char* warning;
  // Where the log files go: "/tmp/tpu_logs_root", or "" (stderr only).
  const char* directory;
};

std::ostream& operator<<(std::ostream& os, const PlantedCase& c) {
  return os << c.name;
}

// A file someone wants clobbered.
constexpr char kVictimText[] = "precious\n";

void PlantVictim(const TempDir& tmp) {
  std::ofstream(tmp.Join("victim")) << kVictimText;
}

const PlantedCase kPlantedCases[] = {
    {"SymlinkToAFile",
     [](const TempDir& tmp) {
       PlantVictim(tmp);
       MakeSymlink("/tmp/victim", tmp.Join("tpu_logs"), 0);
     },
     "Log directory /tmp/tpu_logs is a symlink to something that is not a "
     "directory; logging to /tmp/tpu_logs_root instead",
     "/tmp/tpu_logs_root"},
    {"SymlinkPlantedByAnotherUser",
     [](const TempDir& tmp) {
       // Their directory, and their symlink to it.
       MakeDirectory(tmp.Join("theirs"), kNobody, 0777);
       MakeSymlink("/tmp/theirs", tmp.Join("tpu_logs"), kNobody);
     },
     "Log directory /tmp/tpu_logs is a symlink owned by uid 65534, not by "
     "you (uid 0) or root; logging to /tmp/tpu_logs_root instead",
     "/tmp/tpu_logs_root"},
    {"OwnedByAnotherUser",
     [](const TempDir& tmp) {
       MakeDirectory(tmp.Join("tpu_logs"), kNobody, 0777);
     },
     "Log directory /tmp/tpu_logs is owned by uid 65534, not by you (uid 0); "
     "logging to /tmp/tpu_logs_root instead",
     "/tmp/tpu_logs_root"},
    {"FallbackPlantedToo",
     [](const TempDir& tmp) {
       MakeDirectory(tmp.Join("tpu_logs"), kNobody, 0777);
       PlantVictim(tmp);
       MakeSymlink("/tmp/victim", tmp.Join("tpu_logs_root"), kNobody);
     },
     "Log directory /tmp/tpu_logs is owned by uid 65534, not by you (uid 0); "
     "fallback log directory /tmp/tpu_logs_root is a symlink owned by uid "
     "65534, not by you (uid 0) or root; logging to stderr only",
     ""},
};

class PlantedLogDirectoryTest
    : public HostileEnvironmentTest,
      public ::testing::WithParamInterface<PlantedCase> {};

TEST_P(PlantedLogDirectoryTest, FallsBackWithOneWarningAndTouchesNothing) {
  const PlantedCase& c = GetParam();
  c.plant(tmp_);
  ASSERT_FALSE(HasFatalFailure());
  // Everything planted; the fallback only when it was.
  const std::vector<std::string> planted = {"tpu_logs", "victim", "theirs"};
  std::vector<std::string> before;
  for (const std::string& p : planted) before.push_back(Describe(Tmp(p)));
  const std::string fallback_before = Describe(Tmp("tpu_logs_root"));
  const std::optional<SubprocessResult> r = RunDemo({}, kSmallSystem);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->exit_code, 0) << r->err;
  const Json json = ParseJson(r->out);
  EXPECT_EQ(json["errors"], 0) << r->out;

  // One WARNING, on stderr, in the glog format.
  const std::vector<std::string> warnings = LinesWith(r->err, "Log directory");
  ASSERT_THAT(warnings, SizeIs(1)) << r->err;
  EXPECT_EQ(warnings[0][0], 'W') << warnings[0];
  EXPECT_THAT(warnings[0], EndsWith(absl::StrCat("] ", c.warning)));

  // Nothing planted was written to, followed or replaced.
  for (size_t i = 0; i < planted.size(); ++i) {
    EXPECT_EQ(Describe(Tmp(planted[i])), before[i]) << planted[i];
  }
  if (c.directory[0] == '\0') {
    EXPECT_EQ(Describe(Tmp("tpu_logs_root")), fallback_before);
    EXPECT_TRUE(json["logs"]["directory"].is_null());
    return;
  }
  EXPECT_EQ(json["logs"]["directory"], c.directory);
  const std::string logs = Tmp(std::string(c.directory).substr(5));
  EXPECT_EQ(LogDirectoryProblems(logs), "");
  EXPECT_EQ(StartupLinesProblems(ReadFileOrEmpty(logs + "/tpu_driver.INFO"),
                                 {.region_bytes = kRegionBytes, .devices = 2}),
            "");
  // The fallback is created private to its user.
  struct stat st;
  ASSERT_EQ(stat(logs.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
}

INSTANTIATE_TEST_SUITE_P(
    Planted, PlantedLogDirectoryTest, ::testing::ValuesIn(kPlantedCases),
    [](const ::testing::TestParamInfo<PlantedCase>& param) {
      return std::string(param.param.name);
    });

// ---- A full disk for the logs -----------------------------------------------

TEST_F(HostileEnvironmentTest,
       FullLogDiskDropsWholeLinesWithWarningsAndTheRunCompletes) {
  ASSERT_EQ(mkdir(Tmp("full").c_str(), 0755), 0);
  // The runtime logs little by itself (one VLOG site in the tree), so the
  // volume comes from malformed TPU_VMODULE entries: one WARNING each (the
  // entry ignored), ~150 bytes in the INFO and the WARNING file, 200 of
  // them more than a 16 KiB tmpfs holds.
  std::vector<std::string> entries;
  for (int i = 0; i < 200; ++i) entries.push_back(absl::StrCat("module", i));
  const std::optional<SubprocessResult> r = RunDemo(
      {"--tmpfs=/tmp/full:16384", "--copy-back=/tmp/full:/tmp/full-copy"},
      Concat(kSmallSystem, {"TPU_LOG_DIR=/tmp/full",
                            "TPU_VMODULE=" + absl::StrJoin(entries, ",")}));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->exit_code, 0) << r->err;
  const Json json = ParseJson(r->out);
  EXPECT_EQ(json["errors"], 0) << r->out;
  EXPECT_EQ(json["logs"]["directory"], "/tmp/full");

  // Each run of failed writes to a file starts with one WARNING on stderr
  // naming the file and the error (a shorter line that still fits the last
  // page ends a run): a few in all, not one per lost line (~300 here).
  const std::vector<std::string> warnings =
      LinesWith(r->err, "Could not write to log file /tmp/full/tpu_driver.");
  EXPECT_THAT(warnings, AllOf(Not(IsEmpty()), SizeIs(testing::Le(10u))))
      << r->err;
  std::set<std::string> files;
  for (const std::string& w : warnings) {
    EXPECT_EQ(w[0], 'W') << w;
    EXPECT_THAT(w, HasSubstr("No space left on device"));
    EXPECT_THAT(w, EndsWith("; dropping log lines until writes succeed again"));
    const size_t path = w.find("/tmp/full/");
    files.insert(w.substr(path + 10, w.find(": ", path) - path - 10));
  }

  // What did reach the disk is whole: headers, then whole lines; the line
  // that did not fit is not left half-written.
  const std::string copy = Tmp("full-copy");
  for (const std::string& file : files) {
    EXPECT_THAT(List(copy), Contains(file));
  }
  EXPECT_EQ(LogDirectoryProblems(copy), "");
}

}  // namespace
}  // namespace tpushim
