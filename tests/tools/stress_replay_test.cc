// In-process tests of `tpushim stress` against the library the tool links:
// a corruption planted through the test hook (tools/stress/internal.h) is
// caught, named and caught again by replaying the run's record; --record /
// --replay of clean and faulty runs; records that must be refused.
//
// Every run uses one Os with a fixed environment (log files off): the tool
// wraps the first Os it sees for the life of the process, as logging does.

#include <cstdint>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/mutex.h"
#include "env/os.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/temp_dir.h"
#include "tests/tools/stress_in_process.h"
#include "tools/cli/command.h"
#include "tools/stress/internal.h"
#include "tools/stress/stress.h"

namespace tpushim::tools {
namespace {

using stress_internal::ArrivedBytes;
using stress_internal::SetArrivedBytesHookForTesting;
using ::testing::HasSubstr;
using testutil::ReadFileOrEmpty;
using testutil::TempDir;

using Json = nlohmann::ordered_json;

using Outcome = StressOutcome;

// Runs `tpushim stress <args>` in this process.
Outcome Stress(std::vector<std::string> args) {
  return RunStressInProcess(std::move(args));
}

Json ParseJson(const std::string& text) { return ParseStressJson(text); }

std::vector<uint64_t> CountsByOp(const Json& report) {
  std::vector<uint64_t> counts;
  for (const auto& [op, v] : report["by_op"].items()) {
    counts.push_back(v["count"].get<uint64_t>());
  }
  return counts;
}

// Plants a one-byte corruption in the arrived bytes of one transfer — the
// `nth` checked, or the one of a given thread and operation — and
// remembers which transfer it was.
class Planter {
 public:
  struct Transfer {
    int thread = 0;
    uint64_t op_index = 0;
    std::string op;
  };

  explicit Planter(int nth) : nth_(nth) {}
  explicit Planter(const Transfer& target) : target_(target) {}

  void OnArrival(const ArrivedBytes& a) {
    MutexLock lock(&mu_);
    if (planted_.has_value()) return;
    const bool hit =
        nth_ > 0 ? ++seen_ == nth_
                 : a.thread == target_.thread && a.op_index == target_.op_index;
    if (!hit) return;
    a.data[a.size / 2] ^= 0x40;
    planted_ = Transfer{a.thread, a.op_index, std::string(a.op)};
  }

  // The transfer corrupted, if any yet.
  std::optional<Transfer> planted() {
    MutexLock lock(&mu_);
    return planted_;
  }

 private:
  const int nth_ = 0;
  const Transfer target_;
  Mutex mu_;
  int seen_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<Transfer> planted_ ABSL_GUARDED_BY(mu_);
};

// Installs `planter` as the hook for the scope.
class ScopedPlanter {
 public:
  explicit ScopedPlanter(Planter& planter) {
    SetArrivedBytesHookForTesting(
        [&planter](const ArrivedBytes& a) { planter.OnArrival(a); });
  }
  ScopedPlanter(const ScopedPlanter&) = delete;
  ScopedPlanter& operator=(const ScopedPlanter&) = delete;
  ~ScopedPlanter() { SetArrivedBytesHookForTesting(nullptr); }
};

TEST(StressReplayTest, PlantedCorruptionIsCaughtAndCaughtAgainOnReplay) {
  TempDir dir;
  const std::string file = dir.Join("run.jsonl");
  Planter planter(/*nth=*/5);
  Outcome run;
  {
    ScopedPlanter hook(planter);
    run = Stress(
        {"--ops", "400", "--threads", "2", "--seed", "21", "--record", file});
  }
  ASSERT_TRUE(planter.planted().has_value()) << run.out;
  const Planter::Transfer planted = *planter.planted();
  EXPECT_EQ(run.exit_code, kExitFailure) << run.out << run.err;
  // Exactly that transfer is named, with the seed and both ways to rerun.
  const std::string named =
      absl::StrCat("thread ", planted.thread, " op ", planted.op_index, " (",
                   planted.op, "): hash mismatch: ");
  EXPECT_THAT(run.out, HasSubstr(named));
  EXPECT_THAT(run.out, HasSubstr("\nviolations = 1\n"));
  EXPECT_THAT(run.out, HasSubstr("\nseed = 21\n"));
  const std::string reproduce =
      absl::StrCat("tpushim stress --seed 21 --ops ",
                   (planted.op_index + 1) * 2, " --threads 2");
  const std::string replay =
      absl::StrCat("tpushim stress --replay '", file, "'");
  EXPECT_THAT(run.out,
              HasSubstr(absl::StrCat("\nreproduce: ", reproduce, "\n")));
  EXPECT_THAT(run.out, HasSubstr(absl::StrCat("\nreplay: ", replay, "\n")));
  const std::string shrink =
      absl::StrCat(replay, " --shrink '", dir.Join("run.small.jsonl"), "'");
  EXPECT_THAT(run.out, HasSubstr(absl::StrCat("\nshrink: ", shrink, "\n")));
  EXPECT_EQ(run.err, absl::StrCat("tpushim stress: 1 invariant violations; "
                                  "seed 21; reproduce with: ",
                                  reproduce, "; or replay the run: ", replay,
                                  "; shrink it with: ", shrink, "\n"));

  // Replayed with the same corruption, the record fails at the same
  // operation, and nothing else ended differently.
  Planter again(planted);
  Outcome replayed;
  {
    ScopedPlanter hook(again);
    replayed = Stress({"--replay", file, "--json"});
  }
  ASSERT_TRUE(again.planted().has_value());
  EXPECT_EQ(replayed.exit_code, kExitFailure) << replayed.out;
  const Json j = ParseJson(replayed.out);
  EXPECT_EQ(j["seed"], 21);
  ASSERT_EQ(j["violations"].size(), 1u) << j["violations"].dump();
  const Json& v = j["violations"][0];
  EXPECT_EQ(v["thread"], planted.thread);
  EXPECT_EQ(v["op_index"], planted.op_index);
  EXPECT_EQ(v["op"], planted.op);
  EXPECT_THAT(v["message"].get<std::string>(), HasSubstr("hash mismatch"));
  EXPECT_EQ(j["reproduce"], absl::StrCat(reproduce,
                                         " --region-bytes 67108864 "
                                         "--threshold 4194304"));
  EXPECT_EQ(j["record"]["mode"], "replay");
  EXPECT_EQ(j["record"]["replay"], replay);
  EXPECT_EQ(j["record"]["diverged"], 0) << j["record"].dump();
  EXPECT_EQ(
      j["record"]["shrink"],
      absl::StrCat(replay, " --shrink '", dir.Join("run.small.jsonl"), "'"));
}

TEST(StressReplayTest, CleanRunRecordsAndReplaysTheSameOperations) {
  TempDir dir;
  const std::string file = dir.Join("clean.jsonl");
  const Outcome recorded = Stress({"--ops", "600", "--threads", "3", "--seed",
                                   "5", "--record", file, "--json"});
  ASSERT_EQ(recorded.exit_code, kExitOk) << recorded.out << recorded.err;
  const Json a = ParseJson(recorded.out);
  EXPECT_TRUE(a["violations"].empty());
  EXPECT_EQ(a["record"]["mode"], "record");
  EXPECT_EQ(a["record"]["lines"], 603);  // 600 operations, 3 teardowns
  EXPECT_EQ(a["record"]["error"], nullptr);
  EXPECT_EQ(a["record"]["shrink"], nullptr);  // no violation, nothing to shrink

  // The header, then one line per operation in strictly increasing seq.
  const std::string text = ReadFileOrEmpty(file);
  const std::vector<std::string> lines =
      absl::StrSplit(text, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 604u);
  const Json header = ParseJson(lines[0]);
  EXPECT_EQ(header["format"], "tpushim-stress-record");
  EXPECT_EQ(header["version"], 1);
  EXPECT_EQ(header["config"].dump(),
            R"({"seed":5,"threads":3,"ops":600,"seconds":null,"faults":"",)"
            R"("device":"sim://?devices=2&hbm=256M","region_bytes":67108864,)"
            R"("threshold_bytes":4194304})");
  EXPECT_EQ(header["lines"], 603);
  int64_t last_seq = -1;
  int teardowns = 0;
  for (size_t i = 1; i < lines.size(); ++i) {
    const Json line = ParseJson(lines[i]);
    EXPECT_GT(line["seq"].get<int64_t>(), last_seq) << lines[i];
    last_seq = line["seq"].get<int64_t>();
    EXPECT_LT(line["thread"].get<int>(), 3);
    if (line["op"] == "teardown") ++teardowns;
  }
  EXPECT_EQ(teardowns, 3);

  const Outcome replayed = Stress({"--replay", file, "--json"});
  ASSERT_EQ(replayed.exit_code, kExitOk) << replayed.out << replayed.err;
  const Json b = ParseJson(replayed.out);
  EXPECT_TRUE(b["violations"].empty()) << b["violations"].dump();
  EXPECT_EQ(b["ops"], 600);
  EXPECT_EQ(b["threads"], 3);
  EXPECT_EQ(b["seed"], 5);
  EXPECT_EQ(CountsByOp(b), CountsByOp(a));
  EXPECT_EQ(b["bytes_verified"], a["bytes_verified"]);
  EXPECT_EQ(b["record"]["diverged"], 0) << b["record"].dump();
  EXPECT_TRUE(b["teardown"]["failures"].empty());
}

TEST(StressReplayTest, ReplayUnderOnePercentFaultsChecksTheSameInvariants) {
  TempDir dir;
  const std::string file = dir.Join("faults.jsonl");
  const Outcome recorded =
      Stress({"--ops", "1500", "--threads", "2", "--seed", "9", "--faults",
              "dma:rate=0.01,seed=4;alloc:rate=0.01,seed=5", "--record", file,
              "--json"});
  ASSERT_EQ(recorded.exit_code, kExitOk) << recorded.out << recorded.err;
  const Json a = ParseJson(recorded.out);
  EXPECT_GT(a["by_code"].value("INTERNAL", 0u), 0u) << a["by_code"].dump();

  // Which DMA descriptor a rate rule hits depends on timing, so results may
  // diverge; the operations issued, and the verdict, may not.
  const Outcome replayed = Stress({"--replay", file, "--json"});
  EXPECT_EQ(replayed.exit_code, kExitOk) << replayed.out << replayed.err;
  const Json b = ParseJson(replayed.out);
  EXPECT_TRUE(b["violations"].empty()) << b["violations"].dump();
  EXPECT_EQ(b["faults"], a["faults"]);
  EXPECT_EQ(CountsByOp(b), CountsByOp(a));
}

// ---- Refused records -------------------------------------------------------

class StressReplayRefusalTest : public ::testing::Test {
 protected:
  // A small clean record, as lines, that holds an issued operation of every
  // kind the cases below edit. Whether an await finds an event still pending
  // depends on how fast the DMA threads ran, so a run may skip them all; the
  // next seed is tried then (at most 20).
  static void SetUpTestSuite() {
    TempDir dir;
    for (int seed = 3; seed < 3 + kMaxRecordAttempts; ++seed) {
      const Outcome o =
          Stress({"--ops", "60", "--threads", "2", "--seed",
                  absl::StrCat(seed), "--record", dir.Join("r.jsonl")});
      ASSERT_EQ(o.exit_code, kExitOk) << o.out << o.err;
      *lines_ = absl::StrSplit(ReadFileOrEmpty(dir.Join("r.jsonl")), '\n',
                               absl::SkipEmpty());
      if (HoldsEveryEditedOp()) return;
    }
    FAIL() << "no record of " << kMaxRecordAttempts
           << " seeds issued every operation the cases edit";
  }
  static constexpr int kMaxRecordAttempts = 20;
  static constexpr const char* kEditedOps[] = {
      "alloc_pinned", "alloc_device", "h2d", "d2h", "chain", "await"};

  static bool Issued(const Json& line, const std::string& op) {
    const bool skipped = line.contains("result") && line["result"] == "SKIPPED";
    return line.value("op", "") == op && !skipped;
  }
  static bool HoldsEveryEditedOp() {
    for (const char* op : kEditedOps) {
      bool found = false;
      for (size_t i = 1; i < lines_->size() && !found; ++i) {
        found = Issued(Json::parse((*lines_)[i]), op);
      }
      if (!found) return false;
    }
    return true;
  }

  // Replays `text` with --json; expects exit 2 and returns the error.
  Json Refuse(const std::string& text) {
    const std::string file = dir_.Join("bad.jsonl");
    std::ofstream(file, std::ios::binary | std::ios::trunc) << text;
    const Outcome o = Stress({"--replay", file, "--json"});
    EXPECT_EQ(o.exit_code, kExitUsage) << o.out << o.err;
    const Json j = ParseJson(o.out);
    EXPECT_THAT(j["error"]["message"].get<std::string>(), HasSubstr(file));
    return j["error"];
  }
  static std::string Join(const std::vector<std::string>& lines) {
    return absl::StrCat(absl::StrJoin(lines, "\n"), "\n");
  }
  // The index of the first line whose op is `op` and that has parameters.
  static size_t FirstOf(const std::string& op) {
    for (size_t i = 1; i < lines_->size(); ++i) {
      if (Issued(Json::parse((*lines_)[i]), op)) return i;
    }
    ADD_FAILURE() << "no " << op << " in the record";
    return 0;
  }

  static std::vector<std::string>* lines_;
  TempDir dir_;
};
std::vector<std::string>* StressReplayRefusalTest::lines_ =
    new std::vector<std::string>();

TEST_F(StressReplayRefusalTest, MissingOrEmptyOrNotARecord) {
  const Outcome o = Stress({"--replay", dir_.Join("none.jsonl")});
  EXPECT_EQ(o.exit_code, kExitUsage);
  EXPECT_THAT(o.err, HasSubstr("tpushim: cannot replay: NOT_FOUND: open("));

  Json e = Refuse("");
  EXPECT_EQ(e["code"], "INVALID_ARGUMENT");
  EXPECT_THAT(e["message"].get<std::string>(),
              HasSubstr("the record is empty"));
  e = Refuse("{\"seed\": 1}\n");
  EXPECT_THAT(e["message"].get<std::string>(),
              HasSubstr("not a tpushim stress record"));
}

TEST_F(StressReplayRefusalTest, OtherFormatVersion) {
  std::vector<std::string> lines = *lines_;
  Json header = Json::parse(lines[0]);
  header["version"] = 2;
  lines[0] = header.dump();
  const Json e = Refuse(Join(lines));
  EXPECT_EQ(e["code"], "UNIMPLEMENTED");
  EXPECT_THAT(e["message"].get<std::string>(),
              HasSubstr("record format version 2 is not supported: this "
                        "tpushim reads version 1"));
}

TEST_F(StressReplayRefusalTest, Truncated) {
  // Whole lines missing.
  std::vector<std::string> lines = *lines_;
  lines.resize(lines.size() - 5);
  Json e = Refuse(Join(lines));
  EXPECT_EQ(e["code"], "INVALID_ARGUMENT");
  EXPECT_THAT(e["message"].get<std::string>(),
              HasSubstr(absl::StrCat("the record is truncated or padded: its "
                                     "header announces ",
                                     lines_->size() - 1,
                                     " lines after it, "
                                     "the file has ",
                                     lines.size() - 1)));
  // Cut in the middle of the last line (a teardown's, of some 50 bytes).
  const std::string whole = Join(*lines_);
  e = Refuse(whole.substr(0, whole.size() - 10));
  EXPECT_THAT(e["message"].get<std::string>(),
              HasSubstr("the record is truncated: its last line is cut off"));
}

TEST_F(StressReplayRefusalTest, MalformedLines) {
  struct Case {
    std::string op;  // the first line of this kind is changed
    std::string key;
    Json value;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"h2d", "buffer", 999999,
       "\"buffer\": 999999 is not an alloc_device of thread"},
      {"h2d", "size", 0, "\"size\" must be an integer in [1, "},
      {"d2h", "offset", uint64_t{1} << 40, "does not fit its buffer"},
      {"alloc_pinned", "size", uint64_t{1} << 40,
       "\"size\" must be an integer in [1, 2097152]"},
      {"alloc_pinned", "alignment", 96,
       "\"alignment\" 96 is not a power of two"},
      {"alloc_device", "device", 2, "\"device\" must be an integer in [0, 1]"},
      {"chain", "devices", Json::array({0}),
       "\"devices\" must be an array of two"},
      {"await", "event", Json::array({0, 7}), "is no event of an operation"},
      {"await", "mode", "sometimes",
       "\"mode\" must be one of blocking, timed, "
       "callback"},
      {"h2d", "op", "h3d", "\"op\" must be one of alloc_pinned"},
      {"teardown", "seq", 0, "does not follow the previous line's"},
      {"h2d", "index", 12345, "\"index\" 12345 of thread"},
      {"h2d", "result", "MAYBE", "\"result\" must be null or a status code"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.op + "." + c.key);
    std::vector<std::string> lines = *lines_;
    const size_t i = FirstOf(c.op);
    Json line = Json::parse(lines[i]);
    line[c.key] = c.value;
    lines[i] = line.dump();
    const Json e = Refuse(Join(lines));
    EXPECT_EQ(e["code"], "INVALID_ARGUMENT");
    EXPECT_THAT(e["message"].get<std::string>(),
                HasSubstr(absl::StrCat("line ", i + 1, ": ")));
    EXPECT_THAT(e["message"].get<std::string>(), HasSubstr(c.message));
  }
  // Not JSON at all.
  std::vector<std::string> lines = *lines_;
  lines[3] = "{\"seq\": 3, ";
  const Json e = Refuse(Join(lines));
  EXPECT_THAT(e["message"].get<std::string>(),
              HasSubstr("line 4: not valid JSON"));
}

TEST_F(StressReplayRefusalTest, ReplayExcludesTheOptionsThatDefineARun) {
  for (const std::vector<std::string>& extra :
       std::vector<std::vector<std::string>>{{"--seed", "1"},
                                             {"--ops", "10"},
                                             {"--seconds", "1"},
                                             {"--threads", "2"},
                                             {"--faults", "dma:nth=1"},
                                             {"--region-bytes", "64M"},
                                             {"--threshold", "1M"},
                                             {"--record", "x.jsonl"}}) {
    std::vector<std::string> args = {"--replay", "r.jsonl"};
    args.insert(args.end(), extra.begin(), extra.end());
    const Outcome o = Stress(args);
    EXPECT_EQ(o.exit_code, kExitUsage) << extra[0];
    EXPECT_THAT(o.err, HasSubstr("excludes")) << extra[0];
  }
  const Outcome o =
      Stress({"--ops", "10", "--record", dir_.Join("no/such/dir/r.jsonl")});
  EXPECT_EQ(o.exit_code, kExitUsage);
  EXPECT_THAT(o.err,
              HasSubstr("tpushim: cannot create the record: NOT_FOUND: open("));
}

}  // namespace
}  // namespace tpushim::tools
