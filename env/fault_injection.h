// Fault injection: the `TPUSHIM_FAULTS` spec, the injector
// that decides which call fails, an OS layer that fails those calls exactly
// as the kernel would and tracks what stays mapped, locked, pinned or open,
// and the counted-failure helpers (seastar's with_allocation_failures): one
// that fails the n-th call across points until a run is clean, and a sweep
// that fails every call of every point in turn.
//
// Spec grammar: `<point>:<rule>[;<point>:<rule>...]` where
//   point = mmap | madvise | mlock | numa | alloc | dma | pin | log_open
//           | vfio | iommu
//   rule  = nth=<k> | every=<k> | rate=<p>,seed=<s>     (k >= 1, 0 <= p <= 1)
//           optionally followed by `,code=<absl code name>`
// e.g. `mmap:nth=1;dma:rate=0.01,seed=7,code=UNAVAILABLE`.
//
// Calls are counted per point from 1. `nth=k` fails call k only, `every=k`
// fails calls k, 2k, 3k..., `rate=p,seed=s` fails each call independently
// with probability p, decided by a hash of (seed, call number) so a run is
// reproducible whatever the thread interleaving.
//
// Thread-safety: FaultInjector::Check and the FaultInjectingOs calls are
// thread-safe and lock-free on the no-fault path; rules are fixed at
// construction, except through Arm*/Reset, which must not race with Check.
//
//   TPUSHIM_ASSIGN_OR_RETURN(FaultSpec spec, ParseFaultSpec("mlock:nth=1"));
//   FaultInjector faults(spec);
//   FaultInjectingOs os(Os::Default(), &faults);
//   ... start-up with &os fails at its first mlock, like a real EPERM/ENOMEM.
//   EXPECT_EQ(os.mapped_bytes(), 0);

#ifndef TPUSHIM_ENV_FAULT_INJECTION_H_
#define TPUSHIM_ENV_FAULT_INJECTION_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/mutex.h"
#include "env/os.h"

namespace tpushim {

enum class FaultPoint : int {
  kMmap = 0,
  kMadvise,
  kMlock,
  kNuma,
  kAlloc,
  kDma,
  kPin,
  kLogOpen,
  // Every VFIO ioctl (Os::Ioctl): the container, group and device set-up,
  // IOMMU mappings, interrupts and resets of vfio:// devices.
  kVfio,
  // Checked once per DMA command by vfio:// devices: a firing call points
  // the command at an IOVA nothing is mapped at, so the IOMMU blocks the
  // device's DMA for real and the command fails.
  kIommu,
};
inline constexpr int kFaultPointCount = 10;

// "mmap", "madvise", ... as written in specs.
absl::string_view FaultPointName(FaultPoint point);
// All points, in enum order.
const std::array<FaultPoint, kFaultPointCount>& AllFaultPoints();

struct FaultRule {
  enum class Kind { kNth, kEvery, kRate };
  FaultPoint point = FaultPoint::kMmap;
  Kind kind = Kind::kNth;
  uint64_t k = 0;                        // kNth, kEvery
  double rate = 0.0;                     // kRate
  uint64_t seed = 0;                     // kRate
  std::optional<absl::StatusCode> code;  // replaces the real failure's code
  std::string text;  // the rule as written, e.g. "mmap:nth=3"
};

struct FaultSpec {
  std::vector<FaultRule> rules;
  std::string text;  // the whole spec as given
  bool empty() const { return rules.empty(); }
};

// Parses a spec. "" is the empty spec. Anything malformed (unknown point or
// rule, k of 0, p outside [0, 1], a rate without a seed, an unknown code
// name, trailing garbage, duplicated keys) is INVALID_ARGUMENT naming the
// offending entry and what was expected.
absl::StatusOr<FaultSpec> ParseFaultSpec(absl::string_view spec);

// Parses an absl status code name as written by absl::StatusCodeToString
// ("UNAVAILABLE", "RESOURCE_EXHAUSTED"; case-insensitive). OK is rejected.
std::optional<absl::StatusCode> ParseStatusCodeName(absl::string_view name);

// A set of fault points.
class FaultPointSet {
 public:
  FaultPointSet() = default;
  FaultPointSet(std::initializer_list<FaultPoint> points);
  static FaultPointSet All();
  bool contains(FaultPoint p) const { return bits_ & Bit(p); }
  void insert(FaultPoint p) { bits_ |= Bit(p); }

 private:
  static uint32_t Bit(FaultPoint p) { return 1u << static_cast<int>(p); }
  uint32_t bits_ = 0;
};

// Decides, call by call, whether an injectable point fails.
class FaultInjector {
 public:
  // Injects nothing until armed.
  FaultInjector() = default;
  explicit FaultInjector(FaultSpec spec);
  FaultInjector(const FaultInjector&) = delete;
  FaultInjector& operator=(const FaultInjector&) = delete;

  // Counts a call at `point`. Returns OK when no rule fires. When one does,
  // returns `real_failure()` — the status the real failure would give — with
  // its code replaced if the rule names a `code=`, and
  // " [injected: <rule>]" appended to its message.
  absl::Status Check(FaultPoint point,
                     absl::FunctionRef<absl::Status()> real_failure);

  // Counted mode: besides the spec's rules, the `n`-th call counted across
  // all points in `points` fails (n >= 1). Resets all counters.
  void ArmNthAcross(FaultPointSet points, uint64_t n);
  // Clears counted mode and all counters; keeps the spec's rules.
  void Reset();

  // Calls seen and faults injected at `point` since construction or Reset.
  uint64_t calls(FaultPoint point) const;
  uint64_t injected(FaultPoint point) const;
  uint64_t total_calls() const;
  uint64_t total_injected() const;
  // True when the counted-mode failure has fired since it was armed.
  bool counted_fault_fired() const;

  const FaultSpec& spec() const { return spec_; }

 private:
  // The first spec rule that fails call number `call` at `point`, or null.
  const FaultRule* FiringRule(FaultPoint point, uint64_t call) const;

  FaultSpec spec_;
  std::array<std::atomic<uint64_t>, kFaultPointCount> calls_{};
  std::array<std::atomic<uint64_t>, kFaultPointCount> injected_{};
  FaultPointSet counted_points_;
  uint64_t counted_n_ = 0;  // 0: counted mode off
  std::atomic<uint64_t> counted_calls_{0};
  std::atomic<bool> counted_fired_{false};
  std::string counted_text_;
};

// An Os that consults a FaultInjector before the calls of the points mmap
// (Mmap), madvise (Madvise), mlock (Mlock), numa (NumaBindMemory,
// NumaRunOnNode), pin (PinRange) and log_open (CreateLogFile), and fails
// them with the status the real call gives for ENOMEM (mmap, madvise, mlock,
// pin), EINVAL (numa) or EACCES (log_open), unless the rule names a code.
//
// It also tracks, through every call that succeeds, the bytes mapped,
// locked and pinned and the descriptors open, so a test can assert that a
// failed start-up left nothing behind. Munmap/Munlock/UnpinRange of part of
// a range subtract just that part.
class FaultInjectingOs : public OsWrapper {
 public:
  // `target` and `faults` must outlive this object. `faults` may be null:
  // then it only tracks.
  FaultInjectingOs(Os* target, FaultInjector* faults);

  absl::StatusOr<void*> Mmap(void* addr, size_t length, int prot, int flags,
                             int fd, off_t offset) override;
  absl::Status Munmap(void* addr, size_t length) override;
  absl::Status Madvise(void* addr, size_t length, int advice) override;
  absl::Status Mlock(const void* addr, size_t length, LockWhen when) override;
  absl::Status Munlock(const void* addr, size_t length) override;
  absl::Status PinRange(const void* addr, size_t length) override;
  absl::Status UnpinRange(const void* addr, size_t length) override;
  absl::Status NumaBindMemory(void* addr, size_t length, int node) override;
  absl::Status NumaRunOnNode(int node) override;
  absl::StatusOr<int> CreateLogFile(const std::string& path) override;
  absl::StatusOr<int> CreateOutputFile(const std::string& path) override;
  absl::Status Close(int fd) override;
  absl::StatusOr<int> OpenLockFile(const std::string& path,
                                   bool create) override;
  absl::StatusOr<bool> TryLockFile(int fd) override;
  absl::StatusOr<int> OpenDevice(const std::string& path, int flags) override;
  absl::StatusOr<int> Ioctl(int fd, unsigned long request, void* arg,
                            const char* name) override;
  absl::StatusOr<int> CreateEventFd() override;

  uint64_t mapped_bytes() const;
  uint64_t locked_bytes() const;
  uint64_t pinned_bytes() const;
  size_t open_files() const;

 private:
  // Disjoint [begin, end) intervals keyed by begin.
  using Intervals = std::map<uintptr_t, uintptr_t>;
  static void Add(Intervals& set, const void* addr, size_t length);
  static void Subtract(Intervals& set, const void* addr, size_t length);
  static uint64_t Total(const Intervals& set);

  FaultInjector* const faults_;
  mutable Mutex mu_;
  Intervals mapped_ ABSL_GUARDED_BY(mu_);
  Intervals locked_ ABSL_GUARDED_BY(mu_);
  // Pins may nest (two transfers over one page), so they are counted by
  // exact (addr, length) rather than merged.
  std::multiset<std::pair<uintptr_t, size_t>> pinned_ ABSL_GUARDED_BY(mu_);
  std::set<int> open_fds_ ABSL_GUARDED_BY(mu_);
};

// Runs `scenario` again and again with the n-th call across `points`
// failing, for n = 1, 2, 3, ..., until a run in which no counted fault
// fired (the scenario then ran to completion with every call reached).
// `scenario` receives n and must be self-contained: set up, run, tear down
// and check its own invariants (with gtest EXPECTs, typically) each time.
// Returns the number of runs, including the final clean one, or
// DEADLINE_EXCEEDED when `max_runs` runs all saw a fault.
absl::StatusOr<uint64_t> RunWithCountedFailures(
    FaultInjector& injector, FaultPointSet points,
    const std::function<void(uint64_t n)>& scenario,
    uint64_t max_runs = 100000);

// ---- Fault sweeps -----------------------------------------------------------
//
// SweepEveryCall runs a scenario once to count the calls it makes at each
// point within a window it opens and closes itself, then once more for
// every one of those calls, with exactly that call failing: every point,
// every call. Unlike RunWithCountedFailures, which counts across points,
// it counts each point on its own, so the n-th call of a point is the same
// call in every run even where threads interleave the calls of different
// points — as long as the scenario makes the same calls at each point
// every time, which an armed call that does not fire disproves.
//
//   absl::StatusOr<FaultSweepReport> report = SweepEveryCall(
//       injector, FaultPointSet::All(), [&](FaultSweepRun& run) {
//         SetUp();
//         run.Arm();
//         absl::Status s = DoTheThing();
//         run.Disarm();
//         EXPECT_TRUE(s.ok() || run.point().has_value());
//         ... no leak, nothing left mapped ...
//       });
//   std::cout << report->ToString();  // "3 points, 7 runs (mmap 4, ...)"

// What a sweep covered.
struct FaultSweepReport {
  // Calls within the counting run's window, per point (0 for points not
  // swept): each was failed in a run of its own.
  std::array<uint64_t, kFaultPointCount> calls{};

  // Points with at least one call.
  int points() const;
  // Runs that failed a call (the sum of `calls`); one more ran to count.
  uint64_t failing_runs() const;
  // "3 points, 7 runs (mmap 4, madvise 1, log_open 2)": points reached and
  // failing runs, then the calls per point ("1 point, 1 run (pin 1)").
  std::string ToString() const;
};

// One run of a sweep, as its scenario sees it: the counting run, or the
// run that fails call `call()` of point `point()`.
class FaultSweepRun {
 public:
  FaultSweepRun(const FaultSweepRun&) = delete;
  FaultSweepRun& operator=(const FaultSweepRun&) = delete;

  // Opens the window: the injector's counters restart, and in a failing
  // run its call is armed. Calls before the window are neither counted nor
  // failed. REQUIRES: no FaultInjector::Check runs concurrently (the
  // scenario's threads are idle), as for FaultInjector::ArmNthAcross.
  void Arm();
  // Closes the window (the end of the scenario closes it otherwise): later
  // calls are neither counted nor failed. Same REQUIRES as Arm.
  void Disarm();
  // Ends the sweep after this run (a scenario that found a violation);
  // SweepEveryCall then returns ABORTED.
  void StopSweep() { stop_ = true; }

  // The point and call (from 1) this run fails; nullopt and 0 in the
  // counting run.
  std::optional<FaultPoint> point() const { return point_; }
  uint64_t call() const { return call_; }
  // What an injected failure of this run carries in its message:
  // "[injected: counted failure at call <n>]" (see FaultInjector::Check).
  std::string InjectedTag() const;
  // "counting run" or "<point> call <n>", for test traces.
  std::string Name() const;

 private:
  friend absl::StatusOr<FaultSweepReport> SweepEveryCall(
      FaultInjector&, FaultPointSet,
      const std::function<void(FaultSweepRun&)>&);
  FaultSweepRun(FaultInjector& injector, FaultPointSet points,
                std::optional<FaultPoint> point, uint64_t call)
      : injector_(injector), points_(points), point_(point), call_(call) {}

  FaultInjector& injector_;
  const FaultPointSet points_;
  const std::optional<FaultPoint> point_;
  const uint64_t call_;
  bool open_ = false;
  bool fired_ = false;  // the armed call failed (set when the window closes)
  bool stop_ = false;
  // Calls per point within the window (set when the window closes).
  std::array<uint64_t, kFaultPointCount> calls_{};
};

// Runs `scenario` once to count the calls at each point in `points` within
// its window (FaultSweepRun::Arm .. Disarm), then, for each such point p
// and n = 1 .. calls(p), once with the n-th call of p in the window
// failing (FaultInjector::ArmNthAcross({p}, n)). The scenario must be
// self-contained — set up, run, tear down and check its own invariants
// each time. Leaves the injector Reset.
//
// Errors: FAILED_PRECONDITION, naming the run, when an armed call did not
// fail (the run made fewer calls at that point than the counting run);
// ABORTED when the scenario called StopSweep.
absl::StatusOr<FaultSweepReport> SweepEveryCall(
    FaultInjector& injector, FaultPointSet points,
    const std::function<void(FaultSweepRun&)>& scenario);

}  // namespace tpushim

#endif  // TPUSHIM_ENV_FAULT_INJECTION_H_
