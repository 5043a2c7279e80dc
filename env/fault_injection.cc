#include "env/fault_injection.h"

#include <linux/vfio.h>

#include <errno.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace tpushim {
namespace {

constexpr std::array<absl::string_view, kFaultPointCount> kPointNames = {
    "mmap", "madvise", "mlock",    "numa", "alloc",
    "dma",  "pin",     "log_open", "vfio", "iommu"};

// SplitMix64: a well-mixed 64-bit value from (seed, call number), so the
// decision for call n does not depend on the calls that came before it.
uint64_t Mix(uint64_t seed, uint64_t n) {
  uint64_t z = seed + n * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

absl::Status SpecError(absl::string_view entry, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("fault spec entry \"", entry, "\": ", why,
                   " (expected <point>:nth=<k> | every=<k> | "
                   "rate=<p>,seed=<s>, optionally ,code=<name>; points: ",
                   absl::StrJoin(kPointNames, ", "), ")"));
}

bool ParseDecimal(absl::string_view text, uint64_t* out) {
  if (text.empty() || text.size() > 20) return false;
  for (char c : text) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  return absl::SimpleAtoi(text, out);
}

// A probability written as plain decimal: "0", "1", "0.01", ".5", "1.0".
bool ParseProbability(absl::string_view text, double* out) {
  if (text.empty()) return false;
  int dots = 0;
  int digits = 0;
  for (char c : text) {
    if (c == '.') {
      ++dots;
    } else if (absl::ascii_isdigit(static_cast<unsigned char>(c))) {
      ++digits;
    } else {
      return false;
    }
  }
  if (dots > 1 || digits == 0) return false;
  if (!absl::SimpleAtod(text, out)) return false;
  return *out >= 0.0 && *out <= 1.0;
}

absl::StatusOr<FaultRule> ParseEntry(absl::string_view entry) {
  const size_t colon = entry.find(':');
  if (colon == absl::string_view::npos) {
    return SpecError(entry, "missing ':' between point and rule");
  }
  const absl::string_view point_name = entry.substr(0, colon);
  FaultRule rule;
  rule.text = std::string(entry);
  bool found = false;
  for (FaultPoint p : AllFaultPoints()) {
    if (FaultPointName(p) == point_name) {
      rule.point = p;
      found = true;
    }
  }
  if (!found) {
    return SpecError(entry, absl::StrCat("unknown point \"", point_name, "\""));
  }

  std::optional<uint64_t> nth, every, seed;
  std::optional<double> rate;
  for (absl::string_view kv : absl::StrSplit(entry.substr(colon + 1), ',')) {
    const size_t eq = kv.find('=');
    if (eq == absl::string_view::npos) {
      return SpecError(entry, absl::StrCat("\"", kv, "\" is not key=value"));
    }
    const absl::string_view key = kv.substr(0, eq);
    const absl::string_view value = kv.substr(eq + 1);
    auto duplicate = [&] {
      return SpecError(entry, absl::StrCat("\"", key, "\" given twice"));
    };
    if (key == "nth" || key == "every" || key == "seed") {
      std::optional<uint64_t>& slot =
          key == "nth" ? nth : (key == "every" ? every : seed);
      if (slot) return duplicate();
      uint64_t v = 0;
      if (!ParseDecimal(value, &v)) {
        return SpecError(entry, absl::StrCat(key, "=\"", value,
                                             "\" is not a decimal number"));
      }
      if (key != "seed" && v == 0) {
        return SpecError(entry, absl::StrCat(key, " counts calls from 1"));
      }
      slot = v;
    } else if (key == "rate") {
      if (rate) return duplicate();
      double p = 0;
      if (!ParseProbability(value, &p)) {
        return SpecError(entry, absl::StrCat("rate=\"", value,
                                             "\" is not a probability in "
                                             "[0, 1]"));
      }
      rate = p;
    } else if (key == "code") {
      if (rule.code) return duplicate();
      rule.code = ParseStatusCodeName(value);
      if (!rule.code) {
        return SpecError(entry, absl::StrCat("code=\"", value,
                                             "\" is not an absl status code "
                                             "name other than OK"));
      }
    } else {
      return SpecError(entry, absl::StrCat("unknown key \"", key, "\""));
    }
  }

  const int kinds = (nth ? 1 : 0) + (every ? 1 : 0) + (rate ? 1 : 0);
  if (kinds != 1) {
    return SpecError(entry, "needs exactly one of nth=, every=, rate=");
  }
  if (rate.has_value() != seed.has_value()) {
    return SpecError(entry,
                     rate ? "rate= needs seed=" : "seed= goes with rate=");
  }
  if (nth) {
    rule.kind = FaultRule::Kind::kNth;
    rule.k = *nth;
  } else if (every) {
    rule.kind = FaultRule::Kind::kEvery;
    rule.k = *every;
  } else {
    rule.kind = FaultRule::Kind::kRate;
    rule.rate = *rate;
    rule.seed = *seed;
  }
  return rule;
}

// The status a real failure at each OS point gives.
absl::Status RealOsFailure(int err, absl::string_view call) {
  return absl::ErrnoToStatus(err, call);
}

}  // namespace

absl::string_view FaultPointName(FaultPoint point) {
  return kPointNames[static_cast<int>(point)];
}

const std::array<FaultPoint, kFaultPointCount>& AllFaultPoints() {
  static constexpr std::array<FaultPoint, kFaultPointCount> kAll = {
      FaultPoint::kMmap, FaultPoint::kMadvise, FaultPoint::kMlock,
      FaultPoint::kNuma, FaultPoint::kAlloc,   FaultPoint::kDma,
      FaultPoint::kPin,  FaultPoint::kLogOpen, FaultPoint::kVfio,
      FaultPoint::kIommu};
  return kAll;
}

std::optional<absl::StatusCode> ParseStatusCodeName(absl::string_view name) {
  const std::string upper = absl::AsciiStrToUpper(name);
  for (int c = 1; c <= 16; ++c) {
    const auto code = static_cast<absl::StatusCode>(c);
    if (absl::StatusCodeToString(code) == upper) return code;
  }
  return std::nullopt;
}

absl::StatusOr<FaultSpec> ParseFaultSpec(absl::string_view spec) {
  FaultSpec result;
  result.text = std::string(spec);
  if (spec.empty()) return result;
  for (absl::string_view entry : absl::StrSplit(spec, ';')) {
    if (entry.empty()) {
      return absl::InvalidArgumentError(
          "fault spec has an empty entry (stray ';')");
    }
    absl::StatusOr<FaultRule> rule = ParseEntry(entry);
    if (!rule.ok()) return rule.status();
    result.rules.push_back(*std::move(rule));
  }
  return result;
}

FaultPointSet::FaultPointSet(std::initializer_list<FaultPoint> points) {
  for (FaultPoint p : points) insert(p);
}

FaultPointSet FaultPointSet::All() {
  FaultPointSet set;
  for (FaultPoint p : AllFaultPoints()) set.insert(p);
  return set;
}

FaultInjector::FaultInjector(FaultSpec spec) : spec_(std::move(spec)) {}

const FaultRule* FaultInjector::FiringRule(FaultPoint point,
                                           uint64_t call) const {
  for (const FaultRule& rule : spec_.rules) {
    if (rule.point != point) continue;
    switch (rule.kind) {
      case FaultRule::Kind::kNth:
        if (call == rule.k) return &rule;
        break;
      case FaultRule::Kind::kEvery:
        if (call % rule.k == 0) return &rule;
        break;
      case FaultRule::Kind::kRate: {
        // Compare the top 53 bits as a uniform double in [0, 1).
        const double u =
            static_cast<double>(Mix(rule.seed, call) >> 11) * 0x1.0p-53;
        if (u < rule.rate) return &rule;
        break;
      }
    }
  }
  return nullptr;
}

absl::Status FaultInjector::Check(
    FaultPoint point, absl::FunctionRef<absl::Status()> real_failure) {
  const int index = static_cast<int>(point);
  const uint64_t call =
      calls_[index].fetch_add(1, std::memory_order_relaxed) + 1;

  std::optional<absl::StatusCode> code;
  absl::string_view text;
  bool fire = false;
  if (const FaultRule* rule = FiringRule(point, call)) {
    fire = true;
    code = rule->code;
    text = rule->text;
  }
  if (counted_n_ != 0 && counted_points_.contains(point)) {
    const uint64_t n =
        counted_calls_.fetch_add(1, std::memory_order_relaxed) + 1;
    if (n == counted_n_) {
      counted_fired_.store(true, std::memory_order_relaxed);
      if (!fire) {
        fire = true;
        text = counted_text_;
      }
    }
  }
  if (!fire) return absl::OkStatus();

  injected_[index].fetch_add(1, std::memory_order_relaxed);
  const absl::Status real = real_failure();
  return absl::Status(code.value_or(real.code()),
                      absl::StrCat(real.message(), " [injected: ", text, "]"));
}

void FaultInjector::ArmNthAcross(FaultPointSet points, uint64_t n) {
  Reset();
  counted_points_ = points;
  counted_n_ = n;
  counted_text_ = absl::StrCat("counted failure at call ", n);
}

void FaultInjector::Reset() {
  for (auto& c : calls_) c.store(0, std::memory_order_relaxed);
  for (auto& c : injected_) c.store(0, std::memory_order_relaxed);
  counted_points_ = FaultPointSet();
  counted_n_ = 0;
  counted_calls_.store(0, std::memory_order_relaxed);
  counted_fired_.store(false, std::memory_order_relaxed);
}

uint64_t FaultInjector::calls(FaultPoint point) const {
  return calls_[static_cast<int>(point)].load(std::memory_order_relaxed);
}

uint64_t FaultInjector::injected(FaultPoint point) const {
  return injected_[static_cast<int>(point)].load(std::memory_order_relaxed);
}

uint64_t FaultInjector::total_calls() const {
  uint64_t total = 0;
  for (const auto& c : calls_) total += c.load(std::memory_order_relaxed);
  return total;
}

uint64_t FaultInjector::total_injected() const {
  uint64_t total = 0;
  for (const auto& c : injected_) total += c.load(std::memory_order_relaxed);
  return total;
}

bool FaultInjector::counted_fault_fired() const {
  return counted_fired_.load(std::memory_order_relaxed);
}

// ---- FaultInjectingOs -----------------------------------------------------

FaultInjectingOs::FaultInjectingOs(Os* target, FaultInjector* faults)
    : OsWrapper(target), faults_(faults) {}

void FaultInjectingOs::Add(Intervals& set, const void* addr, size_t length) {
  uintptr_t begin = reinterpret_cast<uintptr_t>(addr);
  uintptr_t end = begin + length;
  if (length == 0) return;
  // Merge with every interval that overlaps or touches [begin, end).
  auto it = set.upper_bound(begin);
  if (it != set.begin()) {
    auto prev = std::prev(it);
    if (prev->second >= begin) it = prev;
  }
  while (it != set.end() && it->first <= end) {
    begin = std::min(begin, it->first);
    end = std::max(end, it->second);
    it = set.erase(it);
  }
  set.emplace(begin, end);
}

void FaultInjectingOs::Subtract(Intervals& set, const void* addr,
                                size_t length) {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(addr);
  const uintptr_t end = begin + length;
  if (length == 0) return;
  auto it = set.upper_bound(begin);
  if (it != set.begin()) --it;
  while (it != set.end() && it->first < end) {
    const uintptr_t a = it->first;
    const uintptr_t b = it->second;
    if (b <= begin) {
      ++it;
      continue;
    }
    it = set.erase(it);
    if (a < begin) set.emplace(a, begin);
    if (b > end) it = set.emplace(end, b).first;
  }
}

uint64_t FaultInjectingOs::Total(const Intervals& set) {
  uint64_t total = 0;
  for (const auto& [begin, end] : set) total += end - begin;
  return total;
}

absl::StatusOr<void*> FaultInjectingOs::Mmap(void* addr, size_t length,
                                             int prot, int flags, int fd,
                                             off_t offset) {
  if (faults_ != nullptr) {
    absl::Status injected = faults_->Check(FaultPoint::kMmap, [&] {
      return RealOsFailure(ENOMEM, absl::StrCat("mmap(", length, " bytes)"));
    });
    if (!injected.ok()) return injected;
  }
  absl::StatusOr<void*> p =
      OsWrapper::Mmap(addr, length, prot, flags, fd, offset);
  if (p.ok()) {
    MutexLock lock(&mu_);
    Add(mapped_, *p, length);
  }
  return p;
}

absl::Status FaultInjectingOs::Munmap(void* addr, size_t length) {
  absl::Status status = OsWrapper::Munmap(addr, length);
  if (status.ok()) {
    MutexLock lock(&mu_);
    Subtract(mapped_, addr, length);
    // Unmapping also drops any lock on those pages.
    Subtract(locked_, addr, length);
  }
  return status;
}

absl::Status FaultInjectingOs::Madvise(void* addr, size_t length, int advice) {
  if (faults_ != nullptr) {
    absl::Status injected = faults_->Check(
        FaultPoint::kMadvise, [&] { return RealOsFailure(ENOMEM, "madvise"); });
    if (!injected.ok()) return injected;
  }
  return OsWrapper::Madvise(addr, length, advice);
}

absl::Status FaultInjectingOs::Mlock(const void* addr, size_t length,
                                     LockWhen when) {
  if (faults_ != nullptr) {
    absl::Status injected = faults_->Check(
        FaultPoint::kMlock, [&] { return RealOsFailure(ENOMEM, "mlock"); });
    if (!injected.ok()) return injected;
  }
  absl::Status status = OsWrapper::Mlock(addr, length, when);
  if (status.ok()) {
    MutexLock lock(&mu_);
    Add(locked_, addr, length);
  }
  return status;
}

absl::Status FaultInjectingOs::Munlock(const void* addr, size_t length) {
  absl::Status status = OsWrapper::Munlock(addr, length);
  if (status.ok()) {
    MutexLock lock(&mu_);
    Subtract(locked_, addr, length);
  }
  return status;
}

absl::Status FaultInjectingOs::PinRange(const void* addr, size_t length) {
  if (faults_ != nullptr) {
    absl::Status injected = faults_->Check(FaultPoint::kPin, [&] {
      return RealOsFailure(ENOMEM, "mlock to pin a transfer buffer");
    });
    if (!injected.ok()) return injected;
  }
  absl::Status status = OsWrapper::PinRange(addr, length);
  if (status.ok()) {
    MutexLock lock(&mu_);
    pinned_.emplace(reinterpret_cast<uintptr_t>(addr), length);
  }
  return status;
}

absl::Status FaultInjectingOs::UnpinRange(const void* addr, size_t length) {
  absl::Status status = OsWrapper::UnpinRange(addr, length);
  if (status.ok()) {
    MutexLock lock(&mu_);
    auto it = pinned_.find({reinterpret_cast<uintptr_t>(addr), length});
    if (it != pinned_.end()) pinned_.erase(it);
  }
  return status;
}

absl::Status FaultInjectingOs::NumaBindMemory(void* addr, size_t length,
                                              int node) {
  if (faults_ != nullptr) {
    absl::Status injected = faults_->Check(
        FaultPoint::kNuma, [&] { return RealOsFailure(EINVAL, "mbind"); });
    if (!injected.ok()) return injected;
  }
  return OsWrapper::NumaBindMemory(addr, length, node);
}

absl::Status FaultInjectingOs::NumaRunOnNode(int node) {
  if (faults_ != nullptr) {
    absl::Status injected = faults_->Check(FaultPoint::kNuma, [&] {
      return RealOsFailure(EINVAL, "numa_run_on_node");
    });
    if (!injected.ok()) return injected;
  }
  return OsWrapper::NumaRunOnNode(node);
}

absl::StatusOr<int> FaultInjectingOs::CreateLogFile(const std::string& path) {
  if (faults_ != nullptr) {
    absl::Status injected = faults_->Check(FaultPoint::kLogOpen, [&] {
      return RealOsFailure(EACCES, absl::StrCat("open(", path, ")"));
    });
    if (!injected.ok()) return injected;
  }
  absl::StatusOr<int> fd = OsWrapper::CreateLogFile(path);
  if (fd.ok()) {
    MutexLock lock(&mu_);
    open_fds_.insert(*fd);
  }
  return fd;
}

absl::StatusOr<int> FaultInjectingOs::CreateOutputFile(
    const std::string& path) {
  absl::StatusOr<int> fd = OsWrapper::CreateOutputFile(path);
  if (fd.ok()) {
    MutexLock lock(&mu_);
    open_fds_.insert(*fd);
  }
  return fd;
}

// Tracked like every descriptor; no fault point covers the chip lock files
// (the points of TPUSHIM_FAULTS are fixed): tests fail them through an
// OsWrapper of their own.
absl::StatusOr<int> FaultInjectingOs::OpenLockFile(const std::string& path,
                                                   bool create) {
  absl::StatusOr<int> fd = OsWrapper::OpenLockFile(path, create);
  if (fd.ok()) {
    MutexLock lock(&mu_);
    open_fds_.insert(*fd);
  }
  return fd;
}

absl::StatusOr<bool> FaultInjectingOs::TryLockFile(int fd) {
  return OsWrapper::TryLockFile(fd);
}

absl::StatusOr<int> FaultInjectingOs::OpenDevice(const std::string& path,
                                                 int flags) {
  absl::StatusOr<int> fd = OsWrapper::OpenDevice(path, flags);
  if (fd.ok()) {
    MutexLock lock(&mu_);
    open_fds_.insert(*fd);
  }
  return fd;
}

absl::StatusOr<int> FaultInjectingOs::Ioctl(int fd, unsigned long request,
                                            void* arg, const char* name) {
  if (faults_ != nullptr) {
    absl::Status injected = faults_->Check(FaultPoint::kVfio, [&] {
      return RealOsFailure(EIO, absl::StrCat("ioctl(", name, ")"));
    });
    if (!injected.ok()) return injected;
  }
  absl::StatusOr<int> r = OsWrapper::Ioctl(fd, request, arg, name);
  // VFIO_GROUP_GET_DEVICE_FD returns a descriptor the caller must close.
  if (r.ok() && request == VFIO_GROUP_GET_DEVICE_FD) {
    MutexLock lock(&mu_);
    open_fds_.insert(*r);
  }
  return r;
}

absl::StatusOr<int> FaultInjectingOs::CreateEventFd() {
  absl::StatusOr<int> fd = OsWrapper::CreateEventFd();
  if (fd.ok()) {
    MutexLock lock(&mu_);
    open_fds_.insert(*fd);
  }
  return fd;
}

absl::Status FaultInjectingOs::Close(int fd) {
  absl::Status status = OsWrapper::Close(fd);
  MutexLock lock(&mu_);
  // close() releases the descriptor even when it reports an error.
  open_fds_.erase(fd);
  return status;
}

uint64_t FaultInjectingOs::mapped_bytes() const {
  MutexLock lock(&mu_);
  return Total(mapped_);
}

uint64_t FaultInjectingOs::locked_bytes() const {
  MutexLock lock(&mu_);
  return Total(locked_);
}

uint64_t FaultInjectingOs::pinned_bytes() const {
  MutexLock lock(&mu_);
  uint64_t total = 0;
  for (const auto& [addr, length] : pinned_) total += length;
  return total;
}

size_t FaultInjectingOs::open_files() const {
  MutexLock lock(&mu_);
  return open_fds_.size();
}

// ---- Counted failures -----------------------------------------------------

absl::StatusOr<uint64_t> RunWithCountedFailures(
    FaultInjector& injector, FaultPointSet points,
    const std::function<void(uint64_t n)>& scenario, uint64_t max_runs) {
  for (uint64_t n = 1; n <= max_runs; ++n) {
    injector.ArmNthAcross(points, n);
    scenario(n);
    if (!injector.counted_fault_fired()) {
      injector.Reset();
      return n;
    }
  }
  injector.Reset();
  return absl::DeadlineExceededError(absl::StrCat(
      "scenario still reached an injected failure after ", max_runs, " runs"));
}

// ---- Fault sweeps -----------------------------------------------------------

int FaultSweepReport::points() const {
  return static_cast<int>(
      std::count_if(calls.begin(), calls.end(), [](uint64_t c) { return c; }));
}

uint64_t FaultSweepReport::failing_runs() const {
  uint64_t runs = 0;
  for (uint64_t c : calls) runs += c;
  return runs;
}

std::string FaultSweepReport::ToString() const {
  std::vector<std::string> per_point;
  for (FaultPoint p : AllFaultPoints()) {
    const uint64_t c = calls[static_cast<int>(p)];
    if (c > 0) per_point.push_back(absl::StrCat(FaultPointName(p), " ", c));
  }
  const int n_points = points();
  const uint64_t runs = failing_runs();
  return absl::StrCat(n_points, n_points == 1 ? " point, " : " points, ", runs,
                      runs == 1 ? " run (" : " runs (",
                      absl::StrJoin(per_point, ", "), ")");
}

void FaultSweepRun::Arm() {
  if (point_) {
    injector_.ArmNthAcross(FaultPointSet{*point_}, call_);
  } else {
    injector_.Reset();
  }
  open_ = true;
}

void FaultSweepRun::Disarm() {
  if (!open_) return;
  open_ = false;
  fired_ = injector_.counted_fault_fired();
  for (FaultPoint p : AllFaultPoints()) {
    calls_[static_cast<int>(p)] = points_.contains(p) ? injector_.calls(p) : 0;
  }
  injector_.Reset();
}

std::string FaultSweepRun::InjectedTag() const {
  return absl::StrCat("[injected: counted failure at call ", call_, "]");
}

std::string FaultSweepRun::Name() const {
  if (!point_) return "counting run";
  return absl::StrCat(FaultPointName(*point_), " call ", call_);
}

absl::StatusOr<FaultSweepReport> SweepEveryCall(
    FaultInjector& injector, FaultPointSet points,
    const std::function<void(FaultSweepRun&)>& scenario) {
  // Runs one run; false when the sweep must end after it.
  auto run_one = [&](FaultSweepRun& run) {
    injector.Reset();
    scenario(run);
    run.Disarm();
    injector.Reset();  // calls after the window, too
    return !run.stop_;
  };
  FaultSweepReport report;
  FaultSweepRun counting(injector, points, std::nullopt, 0);
  if (!run_one(counting)) {
    return absl::AbortedError(
        "the scenario stopped the sweep in its counting run");
  }
  report.calls = counting.calls_;
  for (FaultPoint p : AllFaultPoints()) {
    for (uint64_t n = 1; n <= report.calls[static_cast<int>(p)]; ++n) {
      FaultSweepRun run(injector, points, p, n);
      if (!run_one(run)) {
        return absl::AbortedError(
            absl::StrCat("the scenario stopped the sweep at ", run.Name()));
      }
      if (!run.fired_) {
        return absl::FailedPreconditionError(absl::StrCat(
            "the run failing ", run.Name(),
            " never made that call, although the counting run made ",
            report.calls[static_cast<int>(p)], " ", FaultPointName(p),
            " calls: the scenario's calls vary from run to run"));
      }
    }
  }
  return report;
}

}  // namespace tpushim
