// What `tpushim stress` (tools/stress/stress.cc) reports: the checks made once
// a run is torn down, the progress bar, and the report in its three forms
// (human tables, --json, --csv). Internal to the tool.

#ifndef TPUSHIM_TOOLS_STRESS_REPORT_H_
#define TPUSHIM_TOOLS_STRESS_REPORT_H_

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/string_view.h"
#include "env/fault_injection.h"
#include "nlohmann/json.hpp"
#include "tools/stress/worker.h"
#include "tpushim/stats.h"

namespace tpushim::tools::stress_internal {

using Json = nlohmann::ordered_json;

// Teardown checks: what must be back at zero once every buffer is freed
// (StatsFailures) and once the system is destroyed (OsFailures). Each
// failure is one line naming the counter and its value.
std::vector<std::string> StatsFailures(const SystemStats& s);
std::vector<std::string> OsFailures(const FaultInjectingOs& os);

// ---- Progress --------------------------------------------------------------

class Progress {
 public:
  Progress(bool enabled, const Shared& shared, uint64_t total_ops,
           std::optional<absl::Time> deadline, absl::Time start)
      : shared_(shared), total_(total_ops), deadline_(deadline), start_(start) {
    if (enabled) thread_ = std::thread([this] { Loop(); });
  }
  ~Progress() { Stop(); }
  void Stop() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
    std::fputs("\r\033[K", stderr);
    std::fflush(stderr);
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!done_) {
      Draw();
      cv_.wait_for(lock, std::chrono::milliseconds(200));
    }
  }
  void Draw() {
    const uint64_t done = shared_.ops_done.load(std::memory_order_relaxed);
    const double elapsed = absl::ToDoubleSeconds(absl::Now() - start_);
    double frac;
    if (deadline_.has_value()) {
      frac =
          elapsed / std::max(1e-9, absl::ToDoubleSeconds(*deadline_ - start_));
    } else {
      frac = total_ > 0
                 ? static_cast<double>(done) / static_cast<double>(total_)
                 : 1.0;
    }
    frac = std::clamp(frac, 0.0, 1.0);
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(frac * kWidth);
    std::string bar(static_cast<size_t>(filled), '#');
    bar.append(static_cast<size_t>(kWidth - filled), '.');
    std::fprintf(stderr, "\r\033[Kstress [%s] %3.0f%% %llu ops, %.0f ops/s",
                 bar.c_str(), frac * 100, static_cast<unsigned long long>(done),
                 elapsed > 0 ? static_cast<double>(done) / elapsed : 0.0);
    std::fflush(stderr);
  }

  const Shared& shared_;
  const uint64_t total_;
  const std::optional<absl::Time> deadline_;
  const absl::Time start_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

// ---- Output ----------------------------------------------------------------

// Replay: an operation that ended differently than recorded.
struct Divergence {
  uint64_t seq = 0;
  int thread = 0;
  uint64_t op_index = 0;
  Op op = Op::kAwait;
  int recorded = kNoResult;  // code slots
  int replayed = kNoResult;
};

// What --record wrote or --replay read.
struct RecordReport {
  bool replay = false;
  std::string file;
  uint64_t lines = 0;           // after the header
  std::string tpushim_version;  // of the tpushim that recorded it
  std::string command;          // tpushim stress --replay FILE
  // Replay: operations that ended differently than recorded.
  uint64_t diverged = 0;
  std::optional<Divergence> first_divergence;  // the first issued
  std::string error;  // recording: why the file could not be written
  // After a violation, the command that shrinks the record (--shrink).
  std::string shrink_command;
};

struct Report {
  int interrupted_by = 0;  // SIGINT or SIGTERM stopped the run, else 0
  uint64_t seed = 0;
  int threads = 0;
  double seconds = 0;
  std::string faults;
  std::string device;
  uint64_t region_bytes = 0;
  uint64_t threshold_bytes = 0;
  // A failed start-up here is a clean, injected one (any other is an error,
  // not a report).
  absl::Status startup;
  Counters counters;
  uint64_t callbacks_added = 0;
  uint64_t callbacks_run = 0;
  // Transfers per direction and path, from the system's stats.
  std::array<std::array<uint64_t, kTransferPathCount>, 2> paths{};
  uint64_t d2d_transfers = 0;
  bool teardown_checked = false;
  std::vector<std::string> teardown_failures;
  std::string reproduce;
  std::optional<RecordReport> record;  // with --record or --replay

  uint64_t violations() const {
    return counters.violation_count + teardown_failures.size();
  }
};

// ---- Shrinking -------------------------------------------------------------

// What --shrink calls the same violation: one of the same operation kind
// (Violation::op; "teardown" for a teardown failure) whose message is of
// the same kind, ViolationKind. E.g. every hash mismatch is one kind,
// "hash mismatch", and "h2d event: unexpected status INTERNAL: ..." is of
// kind "h2d event: unexpected status INTERNAL".
//
// The kind of a message: its text up to the first ':' — or, when it says
// "unexpected status <CODE>", up to and including the code — with every
// number (decimal, or hexadecimal after 0x) that stands alone replaced by
// '#': "event not ready within # s (hang)", "region bytes_in_use = #".
std::string ViolationKind(absl::string_view message);

// What --shrink did.
struct ShrinkReport {
  std::string from;         // the record shrunk
  std::string file;         // the shrunk record
  std::string command;      // the command that replays it
  Violation violation;      // the first violation replaying `from` found
  std::string kind;         // ViolationKind of its message
  uint64_t ops_before = 0;  // operations of `from`
  uint64_t ops_after = 0;   // operations of `file`
  uint64_t replays = 0;     // of candidates, the first and the check aside
  double seconds = 0;       // the whole shrink, check included
  double budget_seconds = 0;
  bool budget_exhausted = false;  // the search stopped at the budget
  bool minimal = false;           // no single operation can go
  std::string error;              // why `file` could not be written
  // The check: replaying `file` (as read back) once more.
  bool checked = false;
  std::optional<Violation> reproduced;  // the same violation, when found
  std::vector<Violation> other;         // the others it found
  uint64_t diverged = 0;                // operations that ended differently

  bool ok() const { return error.empty() && reproduced.has_value(); }
};

Json ShrinkJson(const ShrinkReport& r);
void PrintShrink(const ShrinkReport& r, std::ostream& out);

std::string DivergenceText(const Divergence& d);
Json ReportJson(const Report& r);
void WriteCsv(const Report& r, std::ostream& out);
void PrintHuman(const Report& r, std::ostream& out);

}  // namespace tpushim::tools::stress_internal

#endif  // TPUSHIM_TOOLS_STRESS_REPORT_H_
