#include "env/fault_injection.h"

#include <sys/mman.h>

#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace tpushim {
namespace {

using ::testing::HasSubstr;

absl::Status RealEnomem() {
  return absl::ErrnoToStatus(ENOMEM, "mmap(4096 bytes)");
}

FaultInjector MakeInjector(absl::string_view spec) {
  absl::StatusOr<FaultSpec> parsed = ParseFaultSpec(spec);
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  return FaultInjector(*std::move(parsed));
}

// Which of the first `calls` calls at `point` fail.
std::vector<uint64_t> FailingCalls(FaultInjector& injector, FaultPoint point,
                                   uint64_t calls) {
  std::vector<uint64_t> failing;
  for (uint64_t i = 1; i <= calls; ++i) {
    if (!injector.Check(point, RealEnomem).ok()) failing.push_back(i);
  }
  return failing;
}

TEST(FaultSpecTest, EmptySpecHasNoRules) {
  absl::StatusOr<FaultSpec> spec = ParseFaultSpec("");
  ASSERT_TRUE(spec.ok());
  EXPECT_TRUE(spec->empty());
}

TEST(FaultSpecTest, ParsesEveryRuleKindAndCode) {
  absl::StatusOr<FaultSpec> spec = ParseFaultSpec(
      "mmap:nth=3;dma:every=10,code=UNAVAILABLE;pin:rate=0.25,seed=7;"
      "log_open:nth=1,code=data_loss");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->rules.size(), 4u);
  EXPECT_EQ(spec->rules[0].point, FaultPoint::kMmap);
  EXPECT_EQ(spec->rules[0].kind, FaultRule::Kind::kNth);
  EXPECT_EQ(spec->rules[0].k, 3u);
  EXPECT_FALSE(spec->rules[0].code.has_value());
  EXPECT_EQ(spec->rules[0].text, "mmap:nth=3");
  EXPECT_EQ(spec->rules[1].point, FaultPoint::kDma);
  EXPECT_EQ(spec->rules[1].kind, FaultRule::Kind::kEvery);
  EXPECT_EQ(spec->rules[1].code, absl::StatusCode::kUnavailable);
  EXPECT_EQ(spec->rules[2].kind, FaultRule::Kind::kRate);
  EXPECT_DOUBLE_EQ(spec->rules[2].rate, 0.25);
  EXPECT_EQ(spec->rules[2].seed, 7u);
  EXPECT_EQ(spec->rules[3].point, FaultPoint::kLogOpen);
  EXPECT_EQ(spec->rules[3].code, absl::StatusCode::kDataLoss);
}

TEST(FaultSpecTest, AcceptsEveryPointName) {
  for (FaultPoint p : AllFaultPoints()) {
    const std::string spec = std::string(FaultPointName(p)) + ":nth=1";
    absl::StatusOr<FaultSpec> parsed = ParseFaultSpec(spec);
    ASSERT_TRUE(parsed.ok()) << spec;
    EXPECT_EQ(parsed->rules[0].point, p);
  }
}

class MalformedFaultSpecTest : public ::testing::TestWithParam<const char*> {};

TEST_P(MalformedFaultSpecTest, IsInvalidArgument) {
  absl::StatusOr<FaultSpec> spec = ParseFaultSpec(GetParam());
  ASSERT_FALSE(spec.ok()) << GetParam();
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(spec.status().message().empty());
}

INSTANTIATE_TEST_SUITE_P(
    Table, MalformedFaultSpecTest,
    ::testing::Values(
        "mmap", "mmap:", "disk:nth=1", "MMAP:nth=1", "mmap:nth=0",
        "mmap:nth=-1", "mmap:nth=x", "mmap:nth=1x", "mmap:nth=", "mmap:every=0",
        "mmap:rate=0.5", "mmap:seed=1", "mmap:rate=1.5,seed=1",
        "mmap:rate=-0.1,seed=1", "mmap:rate=1e-3,seed=1",
        "mmap:rate=nan,seed=1", "mmap:rate=0.1.2,seed=1", "mmap:nth=1,every=2",
        "mmap:nth=1,nth=2", "mmap:nth=1,code=OK", "mmap:nth=1,code=BOGUS",
        "mmap:nth=1,code=", "mmap:nth=1,color=red", "mmap:nth=1;",
        ";mmap:nth=1", "mmap:nth=1;;dma:nth=1", "mmap:nth=1 ", " mmap:nth=1",
        "mmap:nth 1", "mmap:nth=99999999999999999999999"));

TEST(FaultSpecTest, ErrorNamesTheEntryAndTheProblem) {
  absl::StatusOr<FaultSpec> spec = ParseFaultSpec("mmap:nth=1;dma:evry=2");
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()),
              HasSubstr("\"dma:evry=2\""));
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("evry"));
}

TEST(FaultSpecTest, StatusCodeNamesRoundTrip) {
  for (int c = 1; c <= 16; ++c) {
    const auto code = static_cast<absl::StatusCode>(c);
    EXPECT_EQ(ParseStatusCodeName(absl::StatusCodeToString(code)), code);
  }
  EXPECT_EQ(ParseStatusCodeName("resource_exhausted"),
            absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(ParseStatusCodeName("OK").has_value());
  EXPECT_FALSE(ParseStatusCodeName("").has_value());
}

TEST(FaultInjectorTest, EmptyInjectorNeverFails) {
  FaultInjector injector;
  EXPECT_TRUE(FailingCalls(injector, FaultPoint::kMmap, 100).empty());
  EXPECT_EQ(injector.calls(FaultPoint::kMmap), 100u);
  EXPECT_EQ(injector.total_injected(), 0u);
}

TEST(FaultInjectorTest, NthFailsOnlyThatCall) {
  FaultInjector injector = MakeInjector("mmap:nth=3");
  EXPECT_EQ(FailingCalls(injector, FaultPoint::kMmap, 10),
            std::vector<uint64_t>{3});
  EXPECT_TRUE(FailingCalls(injector, FaultPoint::kMlock, 10).empty());
  EXPECT_EQ(injector.injected(FaultPoint::kMmap), 1u);
}

TEST(FaultInjectorTest, EveryFailsEachMultiple) {
  FaultInjector injector = MakeInjector("dma:every=4");
  EXPECT_EQ(FailingCalls(injector, FaultPoint::kDma, 13),
            (std::vector<uint64_t>{4, 8, 12}));
}

TEST(FaultInjectorTest, RateIsReproducibleForASeed) {
  FaultInjector a = MakeInjector("alloc:rate=0.1,seed=42");
  FaultInjector b = MakeInjector("alloc:rate=0.1,seed=42");
  FaultInjector c = MakeInjector("alloc:rate=0.1,seed=43");
  const auto fa = FailingCalls(a, FaultPoint::kAlloc, 20000);
  EXPECT_EQ(fa, FailingCalls(b, FaultPoint::kAlloc, 20000));
  EXPECT_NE(fa, FailingCalls(c, FaultPoint::kAlloc, 20000));
  // Deterministic for this seed; a fair hash lands near 10 %.
  EXPECT_GT(fa.size(), 1800u);
  EXPECT_LT(fa.size(), 2200u);
}

TEST(FaultInjectorTest, RateZeroNeverAndOneAlways) {
  FaultInjector never = MakeInjector("pin:rate=0,seed=1");
  FaultInjector always = MakeInjector("pin:rate=1,seed=1");
  EXPECT_TRUE(FailingCalls(never, FaultPoint::kPin, 1000).empty());
  EXPECT_EQ(FailingCalls(always, FaultPoint::kPin, 1000).size(), 1000u);
}

TEST(FaultInjectorTest, InjectedStatusIsTheRealOneWithAMarker) {
  FaultInjector injector = MakeInjector("mmap:nth=1");
  const absl::Status s = injector.Check(FaultPoint::kMmap, RealEnomem);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StartsWith(s.message(), RealEnomem().message()))
      << s.message();
  EXPECT_THAT(std::string(s.message()), HasSubstr("[injected: mmap:nth=1]"));
}

TEST(FaultInjectorTest, CodeReplacesTheRealCode) {
  FaultInjector injector = MakeInjector("dma:nth=1,code=DATA_LOSS");
  const absl::Status s = injector.Check(FaultPoint::kDma, RealEnomem);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StartsWith(s.message(), RealEnomem().message()));
}

TEST(FaultInjectorTest, RealFailureIsOnlyBuiltWhenAFaultFires) {
  FaultInjector injector = MakeInjector("mmap:nth=2");
  int built = 0;
  auto real = [&] {
    ++built;
    return RealEnomem();
  };
  EXPECT_TRUE(injector.Check(FaultPoint::kMmap, real).ok());
  EXPECT_FALSE(injector.Check(FaultPoint::kMmap, real).ok());
  EXPECT_EQ(built, 1);
}

TEST(FaultInjectorTest, CountedModeFailsTheNthCallAcrossPoints) {
  FaultInjector injector;
  injector.ArmNthAcross({FaultPoint::kMmap, FaultPoint::kMlock}, 3);
  EXPECT_TRUE(injector.Check(FaultPoint::kMmap, RealEnomem).ok());
  EXPECT_TRUE(injector.Check(FaultPoint::kDma, RealEnomem).ok());  // not in set
  EXPECT_TRUE(injector.Check(FaultPoint::kMlock, RealEnomem).ok());
  EXPECT_FALSE(injector.counted_fault_fired());
  const absl::Status s = injector.Check(FaultPoint::kMlock, RealEnomem);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("counted failure at call 3"));
  EXPECT_TRUE(injector.counted_fault_fired());
  EXPECT_TRUE(injector.Check(FaultPoint::kMmap, RealEnomem).ok());
  injector.Reset();
  EXPECT_FALSE(injector.counted_fault_fired());
  EXPECT_EQ(injector.total_calls(), 0u);
}

TEST(FaultInjectorTest, CountsAreExactUnderConcurrency) {
  FaultInjector injector = MakeInjector("dma:every=10");
  constexpr int kThreads = 4;
  constexpr int kCallsPerThread = 25000;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kCallsPerThread; ++i) {
        if (!injector.Check(FaultPoint::kDma, RealEnomem).ok()) ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(injector.calls(FaultPoint::kDma),
            uint64_t{kThreads} * kCallsPerThread);
  EXPECT_EQ(failures.load(), kThreads * kCallsPerThread / 10);
  EXPECT_EQ(injector.injected(FaultPoint::kDma), uint64_t(failures.load()));
}

// ---- FaultInjectingOs -------------------------------------------------------

constexpr size_t kPage = 4096;

absl::StatusOr<void*> MapAnon(Os& os, size_t length) {
  return os.Mmap(nullptr, length, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
}

TEST(FaultInjectingOsTest, InjectedMmapFailsLikeEnomemAndMapsNothing) {
  FaultInjector injector = MakeInjector("mmap:nth=1");
  FaultInjectingOs os(Os::Default(), &injector);
  absl::StatusOr<void*> p = MapAnon(os, 4 * kPage);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("mmap("));
  EXPECT_EQ(os.mapped_bytes(), 0u);
  absl::StatusOr<void*> q = MapAnon(os, 4 * kPage);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(os.mapped_bytes(), 4 * kPage);
  ASSERT_TRUE(os.Munmap(*q, 4 * kPage).ok());
  EXPECT_EQ(os.mapped_bytes(), 0u);
}

TEST(FaultInjectingOsTest, TracksPartialUnmapsAndLocks) {
  FaultInjectingOs os(Os::Default(), nullptr);
  absl::StatusOr<void*> p = MapAnon(os, 8 * kPage);
  ASSERT_TRUE(p.ok());
  char* base = static_cast<char*>(*p);
  ASSERT_TRUE(os.Mlock(base + 2 * kPage, 4 * kPage, Os::LockWhen::kNow).ok());
  EXPECT_EQ(os.locked_bytes(), 4 * kPage);
  ASSERT_TRUE(os.Munlock(base + 2 * kPage, kPage).ok());
  EXPECT_EQ(os.locked_bytes(), 3 * kPage);
  // Trim head and tail, as an aligning mmap would.
  ASSERT_TRUE(os.Munmap(base, kPage).ok());
  ASSERT_TRUE(os.Munmap(base + 7 * kPage, kPage).ok());
  EXPECT_EQ(os.mapped_bytes(), 6 * kPage);
  // Unmapping locked pages drops their lock too.
  ASSERT_TRUE(os.Munmap(base + kPage, 6 * kPage).ok());
  EXPECT_EQ(os.mapped_bytes(), 0u);
  EXPECT_EQ(os.locked_bytes(), 0u);
}

TEST(FaultInjectingOsTest, InjectedMlockAndPinLockNothing) {
  FaultInjector injector =
      MakeInjector("mlock:nth=1;pin:nth=1,code=UNAVAILABLE");
  FaultInjectingOs os(Os::Default(), &injector);
  absl::StatusOr<void*> p = MapAnon(os, 2 * kPage);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(os.Mlock(*p, kPage, Os::LockWhen::kOnFault).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(os.locked_bytes(), 0u);
  EXPECT_EQ(os.PinRange(*p, 100).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(os.pinned_bytes(), 0u);
  ASSERT_TRUE(os.PinRange(static_cast<char*>(*p) + 10, 100).ok());
  ASSERT_TRUE(os.PinRange(static_cast<char*>(*p) + 10, 100).ok());
  EXPECT_EQ(os.pinned_bytes(), 200u);
  ASSERT_TRUE(os.UnpinRange(static_cast<char*>(*p) + 10, 100).ok());
  ASSERT_TRUE(os.UnpinRange(static_cast<char*>(*p) + 10, 100).ok());
  EXPECT_EQ(os.pinned_bytes(), 0u);
  ASSERT_TRUE(os.Munmap(*p, 2 * kPage).ok());
}

TEST(FaultInjectingOsTest, InjectedLogOpenIsPermissionDenied) {
  FaultInjector injector = MakeInjector("log_open:nth=1");
  FaultInjectingOs os(Os::Default(), &injector);
  testutil::TempDir dir;
  const std::string path = dir.Join("f");
  absl::StatusOr<int> fd = os.CreateLogFile(path);
  EXPECT_EQ(fd.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(os.open_files(), 0u);
  fd = os.CreateLogFile(path);
  ASSERT_TRUE(fd.ok()) << fd.status();
  EXPECT_EQ(os.open_files(), 1u);
  ASSERT_TRUE(os.Close(*fd).ok());
  EXPECT_EQ(os.open_files(), 0u);
}

TEST(FaultInjectingOsTest, NumaPointCoversBindAndRunOnNode) {
  FaultInjector injector = MakeInjector("numa:every=1");
  FaultInjectingOs os(Os::Default(), &injector);
  absl::StatusOr<void*> p = MapAnon(os, kPage);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(os.NumaBindMemory(*p, kPage, 0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(os.NumaRunOnNode(0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(injector.injected(FaultPoint::kNuma), 2u);
  ASSERT_TRUE(os.Munmap(*p, kPage).ok());
}

// A scenario in the shape of a start-up: map, advise, lock; unwind on error.
absl::Status MiniStartup(Os& os) {
  absl::StatusOr<void*> p = MapAnon(os, 4 * kPage);
  if (!p.ok()) return p.status();
  absl::Status s = os.Madvise(*p, 4 * kPage, MADV_NORMAL);
  if (s.ok()) s = os.Mlock(*p, 4 * kPage, Os::LockWhen::kNow);
  if (s.ok()) s = os.Munlock(*p, 4 * kPage);
  const absl::Status unmap = os.Munmap(*p, 4 * kPage);
  return s.ok() ? unmap : s;
}

TEST(CountedFailuresTest, FailsEachCallInTurnThenRunsClean) {
  FaultInjector injector;
  FaultInjectingOs os(Os::Default(), &injector);
  std::vector<absl::StatusCode> codes;
  absl::StatusOr<uint64_t> runs =
      RunWithCountedFailures(injector, FaultPointSet::All(), [&](uint64_t) {
        codes.push_back(MiniStartup(os).code());
        EXPECT_EQ(os.mapped_bytes(), 0u);
        EXPECT_EQ(os.locked_bytes(), 0u);
      });
  ASSERT_TRUE(runs.ok());
  // Three injectable calls (mmap, madvise, mlock), then one clean run.
  EXPECT_EQ(*runs, 4u);
  EXPECT_EQ(codes,
            (std::vector<absl::StatusCode>{absl::StatusCode::kResourceExhausted,
                                           absl::StatusCode::kResourceExhausted,
                                           absl::StatusCode::kResourceExhausted,
                                           absl::StatusCode::kOk}));
}

TEST(CountedFailuresTest, OnlyTheChosenPointsAreCounted) {
  FaultInjector injector;
  FaultInjectingOs os(Os::Default(), &injector);
  absl::StatusOr<uint64_t> runs = RunWithCountedFailures(
      injector, {FaultPoint::kMlock}, [&](uint64_t) { (void)MiniStartup(os); });
  ASSERT_TRUE(runs.ok());
  EXPECT_EQ(*runs, 2u);
}

TEST(CountedFailuresTest, GivesUpAfterMaxRuns) {
  FaultInjector injector;
  absl::StatusOr<uint64_t> runs = RunWithCountedFailures(
      injector, FaultPointSet::All(),
      [&](uint64_t) {
        for (int i = 0; i < 100; ++i) {
          (void)injector.Check(FaultPoint::kAlloc, RealEnomem);
        }
      },
      /*max_runs=*/5);
  EXPECT_EQ(runs.status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(SweepEveryCallTest, FailsEveryCallOfEveryPointInsideTheWindowOnce) {
  FaultInjector injector;
  FaultInjectingOs os(Os::Default(), &injector);
  // Per run: which point and call failed, and what start-up returned.
  std::vector<std::string> runs;
  absl::StatusOr<FaultSweepReport> report = SweepEveryCall(
      injector, FaultPointSet::All(), [&](FaultSweepRun& run) {
        // Outside the window: neither counted nor failed.
        ASSERT_TRUE(MiniStartup(os).ok());
        run.Arm();
        const absl::Status inside = MiniStartup(os);
        // Twice, so that mmap's second call comes after the first madvise.
        const absl::Status again = MiniStartup(os);
        run.Disarm();
        ASSERT_TRUE(MiniStartup(os).ok());
        const absl::Status& failed = inside.ok() ? again : inside;
        runs.push_back(absl::StrCat(run.Name(), ": ",
                                    absl::StatusCodeToString(failed.code())));
        if (run.point()) {
          EXPECT_THAT(failed.message(), HasSubstr(run.InjectedTag()));
        }
        EXPECT_EQ(os.mapped_bytes(), 0u);
      });
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->calls[static_cast<int>(FaultPoint::kMmap)], 2u);
  EXPECT_EQ(report->calls[static_cast<int>(FaultPoint::kMadvise)], 2u);
  EXPECT_EQ(report->calls[static_cast<int>(FaultPoint::kMlock)], 2u);
  EXPECT_EQ(report->points(), 3);
  EXPECT_EQ(report->failing_runs(), 6u);
  EXPECT_EQ(report->ToString(), "3 points, 6 runs (mmap 2, madvise 2, mlock 2)");
  EXPECT_EQ(runs, (std::vector<std::string>{
                      "counting run: OK",
                      "mmap call 1: RESOURCE_EXHAUSTED",
                      "mmap call 2: RESOURCE_EXHAUSTED",
                      "madvise call 1: RESOURCE_EXHAUSTED",
                      "madvise call 2: RESOURCE_EXHAUSTED",
                      "mlock call 1: RESOURCE_EXHAUSTED",
                      "mlock call 2: RESOURCE_EXHAUSTED"}));
  EXPECT_EQ(injector.total_calls(), 0u) << "the injector is left Reset";
}

TEST(SweepEveryCallTest, OnlyTheChosenPointsAreSwept) {
  FaultInjector injector;
  FaultInjectingOs os(Os::Default(), &injector);
  int scenario_runs = 0;
  absl::StatusOr<FaultSweepReport> report = SweepEveryCall(
      injector, {FaultPoint::kMlock}, [&](FaultSweepRun& run) {
        ++scenario_runs;
        run.Arm();
        (void)MiniStartup(os);
      });
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->ToString(), "1 point, 1 run (mlock 1)");
  EXPECT_EQ(scenario_runs, 2);
}

TEST(SweepEveryCallTest, ACallThatComesOnlyWhenCountedIsAnError) {
  FaultInjector injector;
  int run_number = 0;
  absl::StatusOr<FaultSweepReport> report = SweepEveryCall(
      injector, FaultPointSet::All(), [&](FaultSweepRun& run) {
        run.Arm();
        // Two alloc calls in the counting run, one afterwards.
        const int calls = ++run_number == 1 ? 2 : 1;
        for (int i = 0; i < calls; ++i) {
          (void)injector.Check(FaultPoint::kAlloc, RealEnomem);
        }
      });
  EXPECT_EQ(report.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(report.status().message(), HasSubstr("alloc call 2"));
}

TEST(SweepEveryCallTest, ScenarioCanStopTheSweep) {
  FaultInjector injector;
  int scenario_runs = 0;
  absl::StatusOr<FaultSweepReport> report = SweepEveryCall(
      injector, FaultPointSet::All(), [&](FaultSweepRun& run) {
        ++scenario_runs;
        run.Arm();
        for (int i = 0; i < 5; ++i) {
          (void)injector.Check(FaultPoint::kDma, RealEnomem);
        }
        if (run.call() == 2) run.StopSweep();
      });
  EXPECT_EQ(report.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(report.status().message(), HasSubstr("dma call 2"));
  EXPECT_EQ(scenario_runs, 3);
}

}  // namespace
}  // namespace tpushim
