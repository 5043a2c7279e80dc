// Shrinking for `tpushim stress --replay FILE --shrink SMALL`
// (tools/stress/stress.cc): the search for the fewest operations of a record
// that still produce its first violation. Internal to the tool.
//
// SearchSmallest replays subsets of the record (SubsetRecord,
// tools/stress/record.h), each through a callable that runs it in a fresh
// system, and keeps one when its replay finds the same violation: one of
// the same operation kind whose message is of the same kind (ViolationKind,
// tools/stress/report.h). It tries likely small subsets first — what the
// violating operation needs by its arguments (DependencySlice), else the
// operations up to it, else every operation that calls the runtime — and
// from the first that still fails runs DeltaDebug.
//
// DeltaDebug is the ddmin algorithm of Zeller and Hildebrandt
// ("Simplifying and Isolating Failure-Inducing Input", IEEE TSE 28(2),
// 2002) over a set of items — the sequence numbers of a record's
// operations — with a deadline.
//
// `test(candidate)` replays a candidate (a sorted subset of the current
// set) and returns the set it actually ran when that still fails, else
// nullopt. The set it ran may be smaller than the candidate: a record drops
// the operations whose buffers or events are gone with the operations that
// made them (SubsetRecord, tools/stress/record.h), and ddmin goes on from
// what really failed.
//
// From a failing set, ddmin splits it into n parts (n = 2 at first) and
// tries each part alone, then (n > 2) each complement; the first that still
// fails becomes the set (n back to 2 after a part, n - 1 after a
// complement). When none fails it doubles n, and when n reached the size
// of the set the set is 1-minimal: removing any one item loses the failure
// (given that the empty set passes, which the caller checks). Tests are
// made one at a time; before each the deadline is checked, and when it has
// passed the search stops with the smallest failing set found so far.
//
// Thread-safety: pure functions of their arguments; the callables are
// called from the calling thread only.
//
//   DeltaDebugResult r = DeltaDebug(all_seqs, [&](const auto& candidate) {
//     return StillFails(candidate) ? std::optional(candidate) : std::nullopt;
//   }, absl::Now() + absl::Seconds(60));

#ifndef TPUSHIM_TOOLS_STRESS_SHRINK_H_
#define TPUSHIM_TOOLS_STRESS_SHRINK_H_

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tools/stress/record.h"
#include "tools/stress/worker.h"

namespace tpushim::tools::stress_internal {

struct DeltaDebugResult {
  std::vector<uint64_t> items;   // the smallest failing set found, sorted
  uint64_t tests = 0;            // calls of `test`
  bool deadline_passed = false;  // stopped by the deadline
  bool minimal = false;          // 1-minimal (see above)
};

// `failing` must fail (it is not tested again) and be sorted.
template <typename Test>
DeltaDebugResult DeltaDebug(std::vector<uint64_t> failing, Test&& test,
                            absl::Time deadline) {
  DeltaDebugResult r;
  r.items = std::move(failing);
  // Tries `candidate`; true when it failed (and became the set).
  auto attempt = [&](const std::vector<uint64_t>& candidate) {
    ++r.tests;
    std::optional<std::vector<uint64_t>> ran = test(candidate);
    if (!ran.has_value()) return false;
    r.items = *std::move(ran);
    return true;
  };
  size_t n = 2;
  while (r.items.size() >= 2) {
    const std::vector<uint64_t> c = r.items;
    n = std::min(n, c.size());
    // Part i is [bounds[i], bounds[i + 1]).
    std::vector<size_t> bounds;
    for (size_t i = 0; i <= n; ++i) bounds.push_back(i * c.size() / n);
    bool reduced = false;
    for (size_t i = 0; i < n && !reduced; ++i) {
      if (absl::Now() >= deadline) {
        r.deadline_passed = true;
        return r;
      }
      const std::vector<uint64_t> part(c.begin() + bounds[i],
                                       c.begin() + bounds[i + 1]);
      if (attempt(part)) {
        n = 2;
        reduced = true;
      }
    }
    // With two parts each complement is the other part, tried already.
    for (size_t i = 0; i < n && n > 2 && !reduced; ++i) {
      if (absl::Now() >= deadline) {
        r.deadline_passed = true;
        return r;
      }
      std::vector<uint64_t> complement(c.begin(), c.begin() + bounds[i]);
      complement.insert(complement.end(), c.begin() + bounds[i + 1], c.end());
      if (attempt(complement)) {
        n = std::max<size_t>(n - 1, 2);
        reduced = true;
      }
    }
    if (reduced) continue;
    if (n >= c.size()) break;
    n = std::min(c.size(), 2 * n);
  }
  r.minimal = true;
  return r;
}

// ---- The search over a record -----------------------------------------------

// A violation a replay found, and the seq of its operation when it names an
// operation of the record.
struct Found {
  Violation violation;  // op "teardown" for a teardown failure
  std::string kind;     // ViolationKind of its message
  std::optional<uint64_t> seq;
};

// A record replayed in a fresh system.
struct Replayed {
  absl::Status cannot_start;  // not OK: start-up failed, not by injection
  std::vector<ThreadRecord> threads;  // as replayed, with its results
  // Its violations: those of operations in the order they were issued,
  // then the teardown failures.
  std::vector<Found> found;
  uint64_t diverged = 0;  // operations that ended differently
};

// The violation of `r` that is the same as `target`, or null.
inline const Found* FindSame(const Found& target, const Replayed& r) {
  for (const Found& f : r.found) {
    if (f.violation.op == target.violation.op && f.kind == target.kind) {
      return &f;
    }
  }
  return nullptr;
}

struct ShrinkSearch {
  std::vector<uint64_t> items;        // the seqs of the operations kept
  std::vector<ThreadRecord> threads;  // their replay, results included
  uint64_t replays = 0;               // subsets replayed
  bool budget_exhausted = false;      // stopped by the deadline
  bool minimal = false;               // no single operation can go
};

// Searches for the smallest subset of `record` whose replay finds the same
// violation as `target`, the first violation of `whole`, the replay of all
// of `record`. `replay(StressRecord)` returns a Replayed; `progress(smallest
// so far, replays)` is called after each replay. No replay starts after
// `deadline`.
template <typename Replay>
ShrinkSearch SearchSmallest(
    const StressRecord& record, const Found& target,
    std::vector<ThreadRecord> whole, Replay&& replay, absl::Time deadline,
    absl::FunctionRef<void(size_t, uint64_t)> progress) {
  ShrinkSearch search;
  const std::vector<uint64_t> all = OperationSeqs(record, /*skipped=*/true);
  // Every set of operations replayed (as SubsetRecord kept it), with its
  // replay when that found the violation.
  std::map<std::vector<uint64_t>, std::optional<std::vector<ThreadRecord>>>
      tried;
  tried[all] = std::move(whole);
  size_t smallest = all.size();
  auto test = [&](const std::vector<uint64_t>& candidate)
      -> std::optional<std::vector<uint64_t>> {
    StressRecord part = SubsetRecord(record, candidate);
    std::vector<uint64_t> ran = OperationSeqs(part, /*skipped=*/true);
    const auto [it, fresh] = tried.try_emplace(ran);
    if (fresh) {
      ++search.replays;
      Replayed r = replay(std::move(part));
      if (r.cannot_start.ok() && FindSame(target, r) != nullptr) {
        it->second = std::move(r.threads);
        smallest = std::min(smallest, ran.size());
      }
      progress(smallest, search.replays);
    }
    if (!it->second.has_value()) return std::nullopt;
    return ran;
  };

  std::vector<std::vector<uint64_t>> hints;
  if (!target.seq.has_value()) {
    hints.push_back({});  // a teardown failure may need no operation
  } else {
    hints.push_back(DependencySlice(record, *target.seq));
    std::vector<uint64_t> prefix = OperationSeqs(record, /*skipped=*/false);
    std::erase_if(prefix, [&target](uint64_t s) { return s > *target.seq; });
    hints.push_back(std::move(prefix));
  }
  hints.push_back(OperationSeqs(record, /*skipped=*/false));
  std::vector<uint64_t> from = all;
  bool out_of_time = false;
  for (const std::vector<uint64_t>& hint : hints) {
    if (absl::Now() >= deadline) {
      out_of_time = true;
      break;
    }
    if (std::optional<std::vector<uint64_t>> ran = test(hint)) {
      from = *std::move(ran);
      break;
    }
  }
  DeltaDebugResult dd;
  dd.items = from;
  if (!out_of_time) dd = DeltaDebug(std::move(from), test, deadline);
  search.budget_exhausted = out_of_time || dd.deadline_passed;
  search.minimal = !search.budget_exhausted && dd.minimal;
  search.threads = *std::move(tried[dd.items]);
  search.items = std::move(dd.items);
  return search;
}

}  // namespace tpushim::tools::stress_internal

#endif  // TPUSHIM_TOOLS_STRESS_SHRINK_H_
