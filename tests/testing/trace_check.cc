#include "tests/testing/trace_check.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tpushim::testutil {
namespace {

using json = nlohmann::json;

struct Slice {
  double ts = 0;
  double end = 0;
  size_t order = 0;  // position in the file
};

// pid and tid as the viewers key them (numbers or strings).
std::string Key(const json& v) { return v.is_null() ? "" : v.dump(); }

}  // namespace

TraceViewCheck CheckTraceView(const json& root) {
  TraceViewCheck out;
  size_t problems = 0;
  auto problem = [&](std::string text) {
    if (++problems <= 20) out.problems.push_back(std::move(text));
  };
  if (!root.is_object() || !root.contains("traceEvents") ||
      !root["traceEvents"].is_array()) {
    problem("not a trace: no traceEvents array");
    return out;
  }
  const json& events = root["traceEvents"];

  // Slices by (pid, tid); DevTools' binding keys (ts, pid, tid, cat) of
  // the first slice in timestamp order, the file's order breaking ties.
  using Track = std::pair<std::string, std::string>;
  std::map<Track, std::vector<Slice>> tracks;
  std::vector<std::pair<double, size_t>> by_ts;
  for (size_t i = 0; i < events.size(); ++i) {
    const json& e = events[i];
    if (e.value("ph", "") != "X") continue;
    const double ts = e.value("ts", 0.0);
    const double dur = e.value("dur", 0.0);
    tracks[{Key(e["pid"]), Key(e["tid"])}].push_back(
        Slice{ts, ts + dur, i});
    by_ts.emplace_back(ts, i);
    ++out.slices;
  }
  std::stable_sort(by_ts.begin(), by_ts.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::set<std::tuple<double, std::string, std::string, std::string>> bindable;
  for (const auto& [ts, i] : by_ts) {
    const json& e = events[i];
    bindable.emplace(ts, Key(e["pid"]), Key(e["tid"]), e.value("cat", ""));
  }

  // Slices of a track nest or stay apart.
  for (auto& [track, slices] : tracks) {
    std::sort(slices.begin(), slices.end(), [](const Slice& a, const Slice& b) {
      return a.ts != b.ts ? a.ts < b.ts : a.end > b.end;
    });
    std::vector<const Slice*> open;
    for (const Slice& s : slices) {
      while (!open.empty() && open.back()->end <= s.ts) open.pop_back();
      if (!open.empty() && s.end > open.back()->end) {
        problem(absl::StrCat("pid ", track.first, " tid ", track.second,
                             ": the slice at ", s.ts,
                             " overlaps the one at ", open.back()->ts,
                             " without nesting in it"));
      }
      open.push_back(&s);
    }
  }
  auto enclosed = [&](const json& e) {
    auto it = tracks.find({Key(e["pid"]), Key(e["tid"])});
    if (it == tracks.end()) return false;
    const double ts = e.value("ts", 0.0);
    for (const Slice& s : it->second) {
      if (s.ts <= ts && ts <= s.end) return true;
    }
    return false;
  };

  // Flows by id (the name and category must agree along a flow).
  struct Flow {
    const json* start = nullptr;
    const json* end = nullptr;
  };
  std::map<std::string, Flow> flows;
  for (const json& e : events) {
    const std::string ph = e.value("ph", "");
    if (ph != "s" && ph != "f") continue;
    const std::string id = absl::StrCat(e.value("cat", ""), "/",
                                        e.value("name", ""), "/", Key(e["id"]));
    Flow& f = flows[id];
    (ph == "s" ? f.start : f.end) = &e;
  }
  for (const auto& [id, f] : flows) {
    if (f.start == nullptr) continue;
    ++out.flows;
    auto binds = [&](const json& e) {
      return bindable.count({e.value("ts", 0.0), Key(e["pid"]), Key(e["tid"]),
                             e.value("cat", "")}) > 0;
    };
    const bool devtools = f.end != nullptr && binds(*f.start) &&
                          binds(*f.end) &&
                          f.start->value("ts", 0.0) != f.end->value("ts", 0.0);
    const bool perfetto = f.end != nullptr && enclosed(*f.start) &&
                          f.end->value("bp", "") == "e" && enclosed(*f.end);
    out.flows_drawn_devtools += devtools;
    out.flows_drawn_perfetto += perfetto;
    if (!devtools || !perfetto) {
      problem(absl::StrCat("flow ", id, " is not drawn by",
                           devtools ? "" : " DevTools",
                           !devtools && !perfetto ? " and" : "",
                           perfetto ? "" : " Perfetto", ": start ",
                           f.start->dump(),
                           f.end ? absl::StrCat(", end ", f.end->dump())
                                 : std::string(", no end")));
    }
  }
  if (problems > 20) {
    out.problems.push_back(absl::StrCat("... and ", problems - 20, " more"));
  }
  return out;
}

}  // namespace tpushim::testutil
