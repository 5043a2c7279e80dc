#include "tools/stress/report.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/human_bytes.h"
#include "tools/cli/interrupt.h"
#include "tools/cli/text_table.h"
#include "tools/stress/record.h"
#include "tpushim/stats.h"
#include "tpushim/transfer.h"

namespace tpushim::tools::stress_internal {

// ---- Teardown checks -------------------------------------------------------

std::vector<std::string> StatsFailures(const SystemStats& s) {
  std::vector<std::string> f;
  auto check = [&f](bool ok, std::string what) {
    if (!ok) f.push_back(std::move(what));
  };
  if (s.region.enabled) {
    check(s.region.bytes_in_use == 0,
          absl::StrCat("region bytes_in_use = ", s.region.bytes_in_use));
    check(
        s.region.live_allocations == 0,
        absl::StrCat("region live_allocations = ", s.region.live_allocations));
  }
  const TransferStats& t = s.transfers;
  check(t.events_pending == 0,
        absl::StrCat("transfers.events_pending = ", t.events_pending));
  check(t.pinned_bytes_now == 0,
        absl::StrCat("transfers.pinned_bytes_now = ", t.pinned_bytes_now));
  check(t.staging_bytes_in_flight == 0,
        absl::StrCat("transfers.staging_bytes_in_flight = ",
                     t.staging_bytes_in_flight));
  check(
      t.device_buffers_live == 0,
      absl::StrCat("transfers.device_buffers_live = ", t.device_buffers_live));
  check(t.device_bytes_live == 0,
        absl::StrCat("transfers.device_bytes_live = ", t.device_bytes_live));
  for (const QueueStats& q : t.queues) {
    const std::string name =
        absl::StrCat("queue ", q.device, "/", DmaDirectionName(q.direction));
    check(q.pending == 0, absl::StrCat(name, " pending = ", q.pending));
    check(q.in_flight == 0, absl::StrCat(name, " in_flight = ", q.in_flight));
    check(q.submitted == q.completed + q.failed + q.cancelled,
          absl::StrCat(name, " submitted ", q.submitted, " != completed ",
                       q.completed, " + failed ", q.failed, " + cancelled ",
                       q.cancelled));
  }
  for (const DeviceStats& d : s.devices) {
    check(d.hbm_in_use == 0,
          absl::StrCat("device ", d.id, " hbm_in_use = ", d.hbm_in_use));
  }
  return f;
}

std::vector<std::string> OsFailures(const FaultInjectingOs& os) {
  std::vector<std::string> f;
  if (os.mapped_bytes() != 0) {
    f.push_back(absl::StrCat("bytes still mapped: ", os.mapped_bytes()));
  }
  if (os.locked_bytes() != 0) {
    f.push_back(absl::StrCat("bytes still locked: ", os.locked_bytes()));
  }
  if (os.pinned_bytes() != 0) {
    f.push_back(absl::StrCat("bytes still pinned: ", os.pinned_bytes()));
  }
  return f;
}

std::string ResultName(int code) {
  return code == kNoResult ? "none" : CodeName(code);
}

std::string DivergenceText(const Divergence& d) {
  return absl::StrCat("seq ", d.seq, " (thread ", d.thread, " op ", d.op_index,
                      ", ", OpName(d.op), "): recorded ",
                      ResultName(d.recorded), ", replayed ",
                      ResultName(d.replayed));
}

Json RecordJson(const RecordReport& r) {
  Json first = nullptr;
  if (r.first_divergence.has_value()) {
    const Divergence& d = *r.first_divergence;
    auto code = [](int c) {
      return c == kNoResult ? Json(nullptr) : Json(CodeName(c));
    };
    first = {{"seq", d.seq},
             {"thread", d.thread},
             {"op_index", d.op_index},
             {"op", OpName(d.op)},
             {"recorded", code(d.recorded)},
             {"replayed", code(d.replayed)}};
  }
  return {{"mode", r.replay ? "replay" : "record"},
          {"file", r.file},
          {"lines", r.lines},
          {"tpushim", r.tpushim_version},
          {"replay", r.command},
          {"diverged", r.diverged},
          {"first_divergence", first},
          {"error", r.error.empty() ? Json(nullptr) : Json(r.error)},
          {"shrink",
           r.shrink_command.empty() ? Json(nullptr) : Json(r.shrink_command)}};
}

Json ReportJson(const Report& r) {
  Json by_op = Json::object();
  for (int i = 0; i < kOpCount; ++i) {
    Json codes = Json::object();
    for (int c = 0; c < kCodeSlots; ++c) {
      if (r.counters.by_op[i].codes[c] > 0) {
        codes[CodeName(c)] = r.counters.by_op[i].codes[c];
      }
    }
    by_op[kOpNames[i]] = {{"count", r.counters.by_op[i].count},
                          {"codes", codes}};
  }
  Json by_code = Json::object();
  for (int c = 0; c < kAbslCodes; ++c) {
    if (r.counters.by_code[c] > 0) by_code[CodeName(c)] = r.counters.by_code[c];
  }
  Json violations = Json::array();
  for (const Violation& v : r.counters.violations) {
    violations.push_back({{"thread", v.thread},
                          {"op_index", v.op_index},
                          {"op", v.op},
                          {"message", v.message}});
  }
  for (const std::string& f : r.teardown_failures) {
    violations.push_back({{"thread", nullptr},
                          {"op_index", nullptr},
                          {"op", "teardown"},
                          {"message", f}});
  }
  Json paths = Json::object();
  for (int d = 0; d < 2; ++d) {
    Json p = Json::object();
    for (int k = 0; k < kTransferPathCount; ++k) {
      p[std::string(TransferPathName(static_cast<TransferPath>(k)))] =
          r.paths[d][k];
    }
    paths[std::string(DmaDirectionName(static_cast<DmaDirection>(d)))] = p;
  }
  paths["d2d"] = r.d2d_transfers;
  return {
      {"seed", r.seed},
      {"ops", r.counters.ops},
      {"threads", r.threads},
      {"seconds", r.seconds},
      {"ops_per_second",
       r.seconds > 0 ? static_cast<double>(r.counters.ops) / r.seconds : 0.0},
      {"faults", r.faults},
      {"device", r.device},
      {"region_bytes", r.region_bytes},
      {"threshold_bytes", r.threshold_bytes},
      {"startup",
       {{"ok", r.startup.ok()},
        {"code", absl::StatusCodeToString(r.startup.code())},
        {"message", std::string(r.startup.message())}}},
      {"by_op", by_op},
      {"by_code", by_code},
      {"bytes_verified", r.counters.bytes_verified},
      {"transfers_verified", r.counters.transfers_verified},
      {"callbacks", {{"added", r.callbacks_added}, {"run", r.callbacks_run}}},
      {"paths", paths},
      {"teardown",
       {{"checked", r.teardown_checked}, {"failures", r.teardown_failures}}},
      {"violations", violations},
      {"reproduce", r.reproduce},
      {"partial", r.interrupted_by != 0},
      {"interrupted_by", r.interrupted_by != 0
                             ? Json(InterruptSignalName(r.interrupted_by))
                             : Json(nullptr)},
      {"record", r.record.has_value() ? RecordJson(*r.record) : Json(nullptr)},
  };
}

void WriteCsv(const Report& r, std::ostream& out) {
  out << "section,name,code,count\n";
  for (int i = 0; i < kOpCount; ++i) {
    out << "by_op," << kOpNames[i] << ",count," << r.counters.by_op[i].count
        << "\n";
    for (int c = 0; c < kCodeSlots; ++c) {
      if (r.counters.by_op[i].codes[c] > 0) {
        out << "by_op," << kOpNames[i] << "," << CodeName(c) << ","
            << r.counters.by_op[i].codes[c] << "\n";
      }
    }
  }
  for (int c = 0; c < kAbslCodes; ++c) {
    if (r.counters.by_code[c] > 0) {
      out << "by_code,," << CodeName(c) << "," << r.counters.by_code[c] << "\n";
    }
  }
  out << "summary,seed,," << r.seed << "\n";
  out << "summary,ops,," << r.counters.ops << "\n";
  out << "summary,threads,," << r.threads << "\n";
  out << "summary,bytes_verified,," << r.counters.bytes_verified << "\n";
  out << "summary,transfers_verified,," << r.counters.transfers_verified
      << "\n";
  out << "summary,violations,," << r.violations() << "\n";
  if (r.interrupted_by != 0) {
    out << "summary,interrupted,," << InterruptSignalName(r.interrupted_by)
        << "\n";
  }
  if (r.record.has_value() && r.record->replay) {
    out << "summary,diverged,," << r.record->diverged << "\n";
  }
}

void PrintHuman(const Report& r, std::ostream& out) {
  if (r.interrupted_by != 0) {
    out << "tpushim stress: interrupted by "
        << InterruptSignalName(r.interrupted_by)
        << "; the counts are of the operations issued before it (checked and "
           "torn down as usual)\n";
  }
  out << "tpushim stress: seed " << r.seed << ", " << r.counters.ops
      << " ops on " << r.threads << " threads in "
      << absl::StrFormat("%.2f s (%.0f ops/s)", r.seconds,
                         r.seconds > 0
                             ? static_cast<double>(r.counters.ops) / r.seconds
                             : 0.0)
      << "\n";
  TextTable setup;
  setup.AddRow({"device", r.device});
  setup.AddRow({"premapped region",
                absl::StrCat(HumanReadableBytes(r.region_bytes), ", threshold ",
                             HumanReadableBytes(r.threshold_bytes))});
  setup.AddRow({"faults", r.faults.empty() ? "none" : r.faults});
  if (r.record.has_value()) {
    const RecordReport& rec = *r.record;
    if (rec.replay) {
      setup.AddRow(
          {"replay",
           absl::StrCat(
               rec.file, ": ", rec.lines, " lines recorded by tpushim ",
               rec.tpushim_version, "; ",
               rec.diverged == 0
                   ? std::string("every operation ended as recorded")
                   : absl::StrCat(rec.diverged, " ended differently, first ",
                                  DivergenceText(*rec.first_divergence)))});
    } else {
      setup.AddRow(
          {"record",
           rec.error.empty()
               ? absl::StrCat(rec.file, ": ", rec.lines, " lines")
               : absl::StrCat(rec.file, ": NOT WRITTEN: ", rec.error)});
    }
  }
  setup.AddRow({"start-up", r.startup.ok()
                                ? std::string("OK")
                                : absl::StrCat("failed as expected: ",
                                               r.startup.ToString())});
  setup.Print(out);

  if (r.startup.ok()) {
    // Columns: the codes that occur in by_op.
    std::vector<int> cols;
    for (int c = 0; c < kCodeSlots; ++c) {
      for (int i = 0; i < kOpCount; ++i) {
        if (r.counters.by_op[i].codes[c] > 0) {
          cols.push_back(c);
          break;
        }
      }
    }
    out << "\nOperations by result\n";
    std::vector<std::string> header = {"OP", "COUNT"};
    for (int c : cols) header.push_back(CodeName(c));
    TextTable ops(header);
    for (int i = 0; i < kOpCount; ++i) {
      std::vector<std::string> row = {kOpNames[i],
                                      absl::StrCat(r.counters.by_op[i].count)};
      for (int c : cols) {
        row.push_back(absl::StrCat(r.counters.by_op[i].codes[c]));
      }
      ops.AddRow(row);
    }
    ops.Print(out);

    out << "\nStatuses returned or carried by events\n";
    TextTable codes({"CODE", "COUNT"});
    for (int c = 0; c < kAbslCodes; ++c) {
      if (r.counters.by_code[c] > 0) {
        codes.AddRow({CodeName(c), absl::StrCat(r.counters.by_code[c])});
      }
    }
    codes.Print(out);

    out << "\nChecks\n";
    TextTable checks;
    checks.AddRow(
        {"bytes verified",
         absl::StrCat(BytesWithHumanReadable(r.counters.bytes_verified), " in ",
                      r.counters.transfers_verified, " transfers")});
    auto path_row = [&r](int d) {
      return absl::StrCat(r.paths[d][0], " zero-copy, ", r.paths[d][1],
                          " staged, ", r.paths[d][2], " pinned");
    };
    checks.AddRow({"h2d transfers", path_row(0)});
    checks.AddRow({"d2h transfers", path_row(1)});
    checks.AddRow({"d2d transfers", absl::StrCat(r.d2d_transfers)});
    checks.AddRow({"callbacks", absl::StrCat(r.callbacks_run, " of ",
                                             r.callbacks_added, " ran")});
    checks.AddRow({"teardown", !r.teardown_checked ? std::string("not checked")
                               : r.teardown_failures.empty()
                                   ? std::string("stats reconcile to zero, "
                                                 "nothing left mapped/pinned")
                                   : absl::StrCat(r.teardown_failures.size(),
                                                  " failures")});
    checks.Print(out);
  }
  const uint64_t v = r.violations();
  if (v > 0) {
    out << "\nViolations\n";
    for (const Violation& x : r.counters.violations) {
      out << "  thread " << x.thread << " op " << x.op_index << " (" << x.op
          << "): " << x.message << "\n";
    }
    if (r.counters.violation_count > r.counters.violations.size()) {
      out << "  ... "
          << r.counters.violation_count - r.counters.violations.size()
          << " more\n";
    }
    for (const std::string& f : r.teardown_failures) {
      out << "  teardown: " << f << "\n";
    }
  }
  out << "\nviolations = " << v << "\n";
  out << "seed = " << r.seed << "\n";
  out << "reproduce: " << r.reproduce << "\n";
  if (r.record.has_value() && r.record->error.empty()) {
    out << "replay: " << r.record->command << "\n";
    if (!r.record->shrink_command.empty()) {
      out << "shrink: " << r.record->shrink_command << "\n";
    }
  }
}

// ---- Shrinking -------------------------------------------------------------

std::string ViolationKind(absl::string_view message) {
  constexpr absl::string_view kUnexpected = "unexpected status ";
  absl::string_view head = message;
  const size_t unexpected = message.find(kUnexpected);
  if (unexpected != absl::string_view::npos) {
    size_t end = unexpected + kUnexpected.size();
    while (end < message.size() &&
           (absl::ascii_isupper(message[end]) || message[end] == '_')) {
      ++end;
    }
    head = message.substr(0, end);
  } else {
    head = message.substr(0, message.find(':'));
  }
  std::string kind;
  for (size_t i = 0; i < head.size();) {
    // A number stands alone: no letter or digit right before it.
    if (!absl::ascii_isdigit(head[i]) ||
        (i > 0 && absl::ascii_isalnum(head[i - 1]))) {
      kind += head[i++];
      continue;
    }
    size_t j = i;
    if (absl::StartsWith(head.substr(i), "0x")) {
      j += 2;
      while (j < head.size() && absl::ascii_isxdigit(head[j])) ++j;
    } else {
      while (j < head.size() && absl::ascii_isdigit(head[j])) ++j;
    }
    kind += '#';
    i = j;
  }
  return std::string(absl::StripAsciiWhitespace(kind));
}

namespace {

// As in ReportJson: a teardown failure names no thread or operation.
Json ViolationJson(const Violation& v) {
  const bool teardown = v.op == "teardown";
  return {{"thread", teardown ? Json(nullptr) : Json(v.thread)},
          {"op_index", teardown ? Json(nullptr) : Json(v.op_index)},
          {"op", v.op},
          {"message", v.message}};
}

std::string ViolationText(const Violation& v) {
  if (v.op == "teardown") return absl::StrCat("teardown: ", v.message);
  return absl::StrCat("thread ", v.thread, " op ", v.op_index, " (", v.op,
                      "): ", v.message);
}

}  // namespace

Json ShrinkJson(const ShrinkReport& r) {
  Json other = Json::array();
  for (const Violation& v : r.other) other.push_back(ViolationJson(v));
  return {
      {"shrink",
       {{"from", r.from},
        {"file", r.file},
        {"violation", ViolationJson(r.violation)},
        {"same", {{"op", r.violation.op}, {"kind", r.kind}}},
        {"ops_before", r.ops_before},
        {"ops_after", r.ops_after},
        {"replays", r.replays},
        {"seconds", r.seconds},
        {"budget_seconds", r.budget_seconds},
        {"budget_exhausted", r.budget_exhausted},
        {"minimal", r.minimal},
        {"error", r.error.empty() ? Json(nullptr) : Json(r.error)},
        {"check",
         {{"checked", r.checked},
          {"reproduced", r.reproduced.has_value()},
          {"violation", r.reproduced.has_value() ? ViolationJson(*r.reproduced)
                                                 : Json(nullptr)},
          {"other_violations", other},
          {"diverged", r.diverged}}},
        {"replay", r.command}}}};
}

void PrintShrink(const ShrinkReport& r, std::ostream& out) {
  out << "tpushim stress: shrinking " << r.from << "\n";
  TextTable t;
  t.AddRow({"violation", ViolationText(r.violation)});
  t.AddRow(
      {"same when", absl::StrCat("a violation of a ", r.violation.op,
                                 " operation of the kind \"", r.kind, "\"")});
  std::string shrunk =
      absl::StrFormat("%d -> %d operations in %d replays, %.1f s", r.ops_before,
                      r.ops_after, r.replays, r.seconds);
  if (r.budget_exhausted) {
    absl::StrAppend(&shrunk, "; stopped by the time budget of ",
                    absl::StrFormat("%g", r.budget_seconds),
                    " s (--shrink-seconds): not minimal, a longer budget "
                    "may remove more");
  } else if (r.minimal) {
    absl::StrAppend(&shrunk,
                    "; minimal: without any one of them the violation goes");
  }
  t.AddRow({"shrunk", shrunk});
  t.AddRow({"wrote", r.error.empty()
                         ? r.file
                         : absl::StrCat(r.file, ": NOT WRITTEN: ", r.error)});
  if (r.checked) {
    t.AddRow({"check", r.reproduced.has_value()
                           ? absl::StrCat("replaying it reproduces the "
                                          "violation: ",
                                          ViolationText(*r.reproduced))
                           : std::string("replaying it does NOT reproduce "
                                         "the violation")});
    for (const Violation& v : r.other) {
      t.AddRow({"", absl::StrCat("also: ", ViolationText(v))});
    }
  }
  t.Print(out);
  if (r.error.empty()) out << "\nreplay: " << r.command << "\n";
}

}  // namespace tpushim::tools::stress_internal
