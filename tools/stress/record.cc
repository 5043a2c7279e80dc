#include "tools/stress/record.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "env/device_url.h"
#include "env/fault_injection.h"
#include "nlohmann/json.hpp"

namespace tpushim::tools::stress_internal {
namespace {

using Json = nlohmann::ordered_json;

constexpr char kFormat[] = "tpushim-stress-record";
constexpr size_t kWriteChunk = size_t{1} << 20;
constexpr std::array<const char*, 2> kSemanticsNames = {"until_completes",
                                                        "during_call"};
constexpr std::array<const char*, 3> kAwaitModeNames = {"blocking", "timed",
                                                        "callback"};

// How many calls of an operation of kind `op` produce events.
int EventCalls(Op op) {
  switch (op) {
    case Op::kFreeDevice:
    case Op::kH2D:
    case Op::kD2H:
    case Op::kD2D:
      return 1;
    case Op::kChain:
      return kMaxCallsPerOp;
    default:
      return 0;
  }
}

// The operations `op` names by its arguments — its buffers, host buffers
// and an await's event — by seq; its "wait_for" aside.
std::vector<uint64_t> NamedOperations(const RecordedOp& op) {
  std::vector<uint64_t> seqs;
  if (op.skipped()) return seqs;
  auto host = [&seqs](const HostMemory& h) {
    if (h.pinned.has_value()) seqs.push_back(*h.pinned);
  };
  switch (op.op) {
    case Op::kFreePinned:
    case Op::kFreeDevice:
      seqs.push_back(op.buffer);
      break;
    case Op::kH2D:
    case Op::kD2H:
      seqs.push_back(op.buffer);
      host(op.host);
      break;
    case Op::kD2D:
      seqs.push_back(op.buffer);
      seqs.push_back(op.dst_buffer);
      break;
    case Op::kChain:
      host(op.host);
      host(op.dst_host);
      break;
    case Op::kAwait:
      seqs.push_back(op.event.seq);
      break;
    case Op::kAllocPinned:
    case Op::kAllocDevice:
      break;
  }
  return seqs;
}

// ---- Writing ---------------------------------------------------------------

Json EventJson(const EventRef& e) { return Json::array({e.seq, e.call}); }

Json EventsJson(const std::vector<EventRef>& events) {
  Json j = Json::array();
  for (const EventRef& e : events) j.push_back(EventJson(e));
  return j;
}

Json HostJson(const HostMemory& h) {
  if (!h.pinned.has_value()) return "pageable";
  return Json::object({{"pinned", *h.pinned}});
}

const char* SemanticsName(Semantics s) {
  return kSemanticsNames[static_cast<int>(s)];
}

Json OpJson(const RecordedOp& op) {
  Json j = {{"seq", op.seq},
            {"thread", op.thread},
            {"index", op.index},
            {"op", kOpNames[static_cast<int>(op.op)]}};
  if (!op.skipped()) {
    switch (op.op) {
      case Op::kAllocPinned:
        j["size"] = op.size;
        j["alignment"] = op.alignment;
        break;
      case Op::kFreePinned:
        j["pinned"] = op.buffer;
        break;
      case Op::kAllocDevice:
        j["device"] = op.device;
        j["size"] = op.size;
        break;
      case Op::kFreeDevice:
        j["buffer"] = op.buffer;
        j["wait_for"] = EventsJson(op.wait_for);
        break;
      case Op::kH2D:
      case Op::kD2H:
        j["buffer"] = op.buffer;
        j["offset"] = op.offset;
        j["size"] = op.size;
        j["host"] = HostJson(op.host);
        j["semantics"] = SemanticsName(op.semantics);
        if (op.op == Op::kH2D) j["fill_seed"] = op.fill_seed;
        j["wait_for"] = EventsJson(op.wait_for);
        break;
      case Op::kD2D:
        j["src"] = op.buffer;
        j["src_offset"] = op.offset;
        j["dst"] = op.dst_buffer;
        j["dst_offset"] = op.dst_offset;
        j["size"] = op.size;
        j["wait_for"] = EventsJson(op.wait_for);
        break;
      case Op::kChain:
        j["size"] = op.size;
        j["devices"] = Json::array({op.device, op.dst_device});
        j["slack"] = Json::array({op.slack, op.dst_slack});
        j["offsets"] = Json::array({op.offset, op.dst_offset});
        j["hosts"] = Json::array({HostJson(op.host), HostJson(op.dst_host)});
        j["semantics"] = Json::array(
            {SemanticsName(op.semantics), SemanticsName(op.dst_semantics)});
        j["fill_seed"] = op.fill_seed;
        break;
      case Op::kAwait:
        j["event"] = EventJson(op.event);
        j["mode"] = kAwaitModeNames[static_cast<int>(op.mode)];
        if (op.mode == AwaitMode::kTimed) j["timeout_us"] = op.timeout_us;
        break;
    }
  }
  j["result"] =
      op.result == kNoResult ? Json(nullptr) : Json(CodeName(op.result));
  return j;
}

Json HeaderJson(const StressRecord& r, uint64_t lines) {
  const StressConfig& c = r.config;
  auto optional = [](const auto& v) { return v ? Json(*v) : Json(nullptr); };
  return {{"format", kFormat},
          {"version", kStressRecordVersion},
          {"tpushim", r.tpushim_version},
          {"config",
           {{"seed", c.seed},
            {"threads", c.threads},
            {"ops", optional(c.ops)},
            {"seconds", optional(c.seconds)},
            {"faults", c.faults},
            {"device", c.device},
            {"region_bytes", c.region_bytes},
            {"threshold_bytes", c.threshold_bytes}}},
          {"lines", lines}};
}

// ---- Parsing ---------------------------------------------------------------

// Reads the fields of one JSON object; every error names the line.
class Fields {
 public:
  Fields(const Json& json, size_t line) : json_(json), line_(line) {}

  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("line ", line_, ": ", what));
  }

  // The value of `key`; an error when it is missing.
  absl::StatusOr<const Json*> Get(absl::string_view key) const {
    const auto it = json_.find(std::string(key));
    if (it == json_.end()) {
      return Error(absl::StrCat("\"", key, "\" is missing"));
    }
    return &*it;
  }

  absl::StatusOr<uint64_t> Unsigned(
      absl::string_view key, uint64_t min = 0,
      uint64_t max = std::numeric_limits<uint64_t>::max()) const {
    TPUSHIM_ASSIGN_OR_RETURN(const Json* v, Get(key));
    return UnsignedValue(*v, key, min, max);
  }
  absl::StatusOr<uint64_t> UnsignedValue(const Json& v, absl::string_view key,
                                         uint64_t min, uint64_t max) const {
    if (!v.is_number_unsigned() || v.get<uint64_t>() < min ||
        v.get<uint64_t>() > max) {
      return Error(absl::StrCat("\"", key, "\" must be an integer in [", min,
                                ", ", max, "], not ", v.dump()));
    }
    return v.get<uint64_t>();
  }

  absl::StatusOr<std::string> String(absl::string_view key) const {
    TPUSHIM_ASSIGN_OR_RETURN(const Json* v, Get(key));
    if (!v->is_string()) {
      return Error(
          absl::StrCat("\"", key, "\" must be a string, not ", v->dump()));
    }
    return v->get<std::string>();
  }

  // The index of the value of `key` in `names`.
  template <size_t N>
  absl::StatusOr<int> Name(absl::string_view key,
                           const std::array<const char*, N>& names) const {
    TPUSHIM_ASSIGN_OR_RETURN(const Json* v, Get(key));
    return NameValue(*v, key, names);
  }
  template <size_t N>
  absl::StatusOr<int> NameValue(const Json& v, absl::string_view key,
                                const std::array<const char*, N>& names) const {
    for (size_t i = 0; v.is_string() && i < N; ++i) {
      if (v.get<std::string>() == names[i]) return static_cast<int>(i);
    }
    std::string expected;
    for (const char* name : names) {
      absl::StrAppend(&expected, expected.empty() ? "" : ", ", name);
    }
    return Error(absl::StrCat("\"", key, "\" must be one of ", expected,
                              "; not ", v.dump()));
  }

  // The two elements of the array at `key`.
  absl::StatusOr<std::pair<const Json*, const Json*>> Pair(
      absl::string_view key) const {
    TPUSHIM_ASSIGN_OR_RETURN(const Json* v, Get(key));
    if (!v->is_array() || v->size() != 2) {
      return Error(absl::StrCat("\"", key, "\" must be an array of two, not ",
                                v->dump()));
    }
    return std::make_pair(&(*v)[0], &(*v)[1]);
  }

 private:
  const Json& json_;
  const size_t line_;
};

// Checks each line against what the lines before it made.
class Checker {
 public:
  Checker(StressRecord& record, int devices)
      : record_(record), devices_(devices) {
    const uint64_t t = record.config.threshold_bytes;
    max_device_alloc_ = std::max(kMaxSmallDeviceAlloc, 2 * t);
    max_chain_ = std::max(kMaxSmallDeviceAlloc, t + t / 2);
  }

  absl::Status Line(const Json& json, size_t line);

 private:
  // The earlier operation `seq` of `thread`, or null.
  const RecordedOp* Find(int thread, uint64_t seq) const {
    const std::vector<RecordedOp>& ops = record_.threads[thread].ops;
    const auto it = std::lower_bound(
        ops.begin(), ops.end(), seq,
        [](const RecordedOp& op, uint64_t s) { return op.seq < s; });
    return it != ops.end() && it->seq == seq ? &*it : nullptr;
  }
  // The size of the buffer that operation `seq` of `thread` allocated with
  // an operation of kind `alloc`.
  absl::StatusOr<uint64_t> BufferSize(const Fields& f, absl::string_view key,
                                      int thread, uint64_t seq,
                                      Op alloc) const {
    const RecordedOp* op = Find(thread, seq);
    if (op == nullptr || op->op != alloc || op->skipped()) {
      return f.Error(absl::StrCat("\"", key, "\": ", seq, " is not an ",
                                  kOpNames[static_cast<int>(alloc)],
                                  " of thread ", thread, " before it"));
    }
    return op->size;
  }
  absl::StatusOr<EventRef> EventAt(const Fields& f, const Json& v,
                                   absl::string_view key, int thread) const;
  absl::StatusOr<std::vector<EventRef>> WaitFor(const Fields& f,
                                                int thread) const;
  // Host memory for `size` bytes.
  absl::StatusOr<HostMemory> Host(const Fields& f, const Json& v,
                                  absl::string_view key, int thread,
                                  uint64_t size) const;
  absl::StatusOr<int> Device(const Fields& f, const Json& v,
                             absl::string_view key) const {
    TPUSHIM_ASSIGN_OR_RETURN(
        uint64_t d,
        f.UnsignedValue(v, key, 0, static_cast<uint64_t>(devices_) - 1));
    return static_cast<int>(d);
  }
  // Offset and size of a transfer into a buffer of `capacity` bytes.
  absl::Status Range(const Fields& f, absl::string_view what, uint64_t capacity,
                     uint64_t offset, uint64_t size) const {
    if (size > capacity || offset > capacity - size) {
      return f.Error(absl::StrCat(what, " [", offset, ", +", size,
                                  ") does not fit its buffer of ", capacity,
                                  " bytes"));
    }
    return absl::OkStatus();
  }
  absl::Status Parameters(const Fields& f, RecordedOp& op) const;

  StressRecord& record_;
  const int devices_;
  uint64_t max_device_alloc_ = 0;
  uint64_t max_chain_ = 0;
  std::optional<uint64_t> last_seq_;
};

absl::StatusOr<EventRef> Checker::EventAt(const Fields& f, const Json& v,
                                          absl::string_view key,
                                          int thread) const {
  if (!v.is_array() || v.size() != 2 || !v[0].is_number_unsigned() ||
      !v[1].is_number_unsigned()) {
    return f.Error(
        absl::StrCat("\"", key, "\": an event is [seq, call], not ", v.dump()));
  }
  const EventRef e{v[0].get<uint64_t>(),
                   static_cast<int>(std::min<uint64_t>(v[1].get<uint64_t>(),
                                                       kMaxCallsPerOp))};
  const RecordedOp* op = Find(thread, e.seq);
  if (op == nullptr || op->skipped() || e.call >= EventCalls(op->op)) {
    return f.Error(absl::StrCat("\"", key, "\": ", v.dump(),
                                " is no event of an operation of thread ",
                                thread, " before it"));
  }
  return e;
}

absl::StatusOr<std::vector<EventRef>> Checker::WaitFor(const Fields& f,
                                                       int thread) const {
  TPUSHIM_ASSIGN_OR_RETURN(const Json* v, f.Get("wait_for"));
  if (!v->is_array()) {
    return f.Error(
        absl::StrCat("\"wait_for\" must be an array, not ", v->dump()));
  }
  std::vector<EventRef> events;
  for (const Json& e : *v) {
    TPUSHIM_ASSIGN_OR_RETURN(EventRef ref, EventAt(f, e, "wait_for", thread));
    events.push_back(ref);
  }
  return events;
}

absl::StatusOr<HostMemory> Checker::Host(const Fields& f, const Json& v,
                                         absl::string_view key, int thread,
                                         uint64_t size) const {
  if (v == "pageable") return HostMemory{};
  const auto pinned =
      v.is_object() && v.size() == 1 ? v.find("pinned") : v.end();
  if (pinned == v.end() || !pinned->is_number_unsigned()) {
    return f.Error(absl::StrCat("\"", key,
                                "\" must be \"pageable\" or {\"pinned\": seq}, "
                                "not ",
                                v.dump()));
  }
  const uint64_t seq = pinned->get<uint64_t>();
  TPUSHIM_ASSIGN_OR_RETURN(uint64_t capacity,
                           BufferSize(f, key, thread, seq, Op::kAllocPinned));
  if (capacity < size) {
    return f.Error(absl::StrCat("\"", key, "\": pinned buffer ", seq, " has ",
                                capacity, " bytes, the transfer ", size));
  }
  return HostMemory{seq};
}

absl::Status Checker::Parameters(const Fields& f, RecordedOp& op) const {
  const int t = op.thread;
  switch (op.op) {
    case Op::kAllocPinned: {
      TPUSHIM_ASSIGN_OR_RETURN(op.size, f.Unsigned("size", 1, kMaxPinnedAlloc));
      TPUSHIM_ASSIGN_OR_RETURN(
          op.alignment,
          f.Unsigned("alignment", kMinPinnedAlignment, kMaxPinnedAlignment));
      if ((op.alignment & (op.alignment - 1)) != 0) {
        return f.Error(absl::StrCat("\"alignment\" ", op.alignment,
                                    " is not a power of two"));
      }
      return absl::OkStatus();
    }
    case Op::kFreePinned: {
      TPUSHIM_ASSIGN_OR_RETURN(op.buffer, f.Unsigned("pinned"));
      return BufferSize(f, "pinned", t, op.buffer, Op::kAllocPinned).status();
    }
    case Op::kAllocDevice: {
      TPUSHIM_ASSIGN_OR_RETURN(const Json* device, f.Get("device"));
      TPUSHIM_ASSIGN_OR_RETURN(op.device, Device(f, *device, "device"));
      TPUSHIM_ASSIGN_OR_RETURN(op.size,
                               f.Unsigned("size", 1, max_device_alloc_));
      return absl::OkStatus();
    }
    case Op::kFreeDevice: {
      TPUSHIM_ASSIGN_OR_RETURN(op.buffer, f.Unsigned("buffer"));
      TPUSHIM_RETURN_IF_ERROR(
          BufferSize(f, "buffer", t, op.buffer, Op::kAllocDevice).status());
      TPUSHIM_ASSIGN_OR_RETURN(op.wait_for, WaitFor(f, t));
      return absl::OkStatus();
    }
    case Op::kH2D:
    case Op::kD2H: {
      TPUSHIM_ASSIGN_OR_RETURN(op.buffer, f.Unsigned("buffer"));
      TPUSHIM_ASSIGN_OR_RETURN(
          uint64_t capacity,
          BufferSize(f, "buffer", t, op.buffer, Op::kAllocDevice));
      TPUSHIM_ASSIGN_OR_RETURN(op.offset, f.Unsigned("offset"));
      TPUSHIM_ASSIGN_OR_RETURN(op.size, f.Unsigned("size", 1));
      TPUSHIM_RETURN_IF_ERROR(
          Range(f, "the transfer", capacity, op.offset, op.size));
      TPUSHIM_ASSIGN_OR_RETURN(const Json* host, f.Get("host"));
      TPUSHIM_ASSIGN_OR_RETURN(op.host, Host(f, *host, "host", t, op.size));
      TPUSHIM_ASSIGN_OR_RETURN(int semantics,
                               f.Name("semantics", kSemanticsNames));
      op.semantics = static_cast<Semantics>(semantics);
      if (op.op == Op::kH2D) {
        TPUSHIM_ASSIGN_OR_RETURN(op.fill_seed, f.Unsigned("fill_seed"));
      }
      TPUSHIM_ASSIGN_OR_RETURN(op.wait_for, WaitFor(f, t));
      return absl::OkStatus();
    }
    case Op::kD2D: {
      TPUSHIM_ASSIGN_OR_RETURN(op.buffer, f.Unsigned("src"));
      TPUSHIM_ASSIGN_OR_RETURN(
          uint64_t src_capacity,
          BufferSize(f, "src", t, op.buffer, Op::kAllocDevice));
      TPUSHIM_ASSIGN_OR_RETURN(op.dst_buffer, f.Unsigned("dst"));
      TPUSHIM_ASSIGN_OR_RETURN(
          uint64_t dst_capacity,
          BufferSize(f, "dst", t, op.dst_buffer, Op::kAllocDevice));
      if (op.buffer == op.dst_buffer) {
        return f.Error("\"src\" and \"dst\" are the same buffer");
      }
      TPUSHIM_ASSIGN_OR_RETURN(op.offset, f.Unsigned("src_offset"));
      TPUSHIM_ASSIGN_OR_RETURN(op.dst_offset, f.Unsigned("dst_offset"));
      TPUSHIM_ASSIGN_OR_RETURN(op.size, f.Unsigned("size", 1));
      TPUSHIM_RETURN_IF_ERROR(
          Range(f, "the source", src_capacity, op.offset, op.size));
      TPUSHIM_RETURN_IF_ERROR(
          Range(f, "the destination", dst_capacity, op.dst_offset, op.size));
      TPUSHIM_ASSIGN_OR_RETURN(op.wait_for, WaitFor(f, t));
      return absl::OkStatus();
    }
    case Op::kChain: {
      TPUSHIM_ASSIGN_OR_RETURN(op.size, f.Unsigned("size", 1, max_chain_));
      TPUSHIM_ASSIGN_OR_RETURN(auto devices, f.Pair("devices"));
      TPUSHIM_ASSIGN_OR_RETURN(op.device, Device(f, *devices.first, "devices"));
      TPUSHIM_ASSIGN_OR_RETURN(op.dst_device,
                               Device(f, *devices.second, "devices"));
      TPUSHIM_ASSIGN_OR_RETURN(auto slack, f.Pair("slack"));
      TPUSHIM_ASSIGN_OR_RETURN(
          op.slack, f.UnsignedValue(*slack.first, "slack", 0, kMaxChainSlack));
      TPUSHIM_ASSIGN_OR_RETURN(
          op.dst_slack,
          f.UnsignedValue(*slack.second, "slack", 0, kMaxChainSlack));
      TPUSHIM_ASSIGN_OR_RETURN(auto offsets, f.Pair("offsets"));
      TPUSHIM_ASSIGN_OR_RETURN(
          op.offset, f.UnsignedValue(*offsets.first, "offsets", 0, op.slack));
      TPUSHIM_ASSIGN_OR_RETURN(
          op.dst_offset,
          f.UnsignedValue(*offsets.second, "offsets", 0, op.dst_slack));
      TPUSHIM_ASSIGN_OR_RETURN(auto hosts, f.Pair("hosts"));
      TPUSHIM_ASSIGN_OR_RETURN(op.host,
                               Host(f, *hosts.first, "hosts", t, op.size));
      TPUSHIM_ASSIGN_OR_RETURN(op.dst_host,
                               Host(f, *hosts.second, "hosts", t, op.size));
      if (op.host.pinned.has_value() && op.host == op.dst_host) {
        return f.Error("\"hosts\": source and destination are the same buffer");
      }
      TPUSHIM_ASSIGN_OR_RETURN(auto semantics, f.Pair("semantics"));
      TPUSHIM_ASSIGN_OR_RETURN(
          int up, f.NameValue(*semantics.first, "semantics", kSemanticsNames));
      TPUSHIM_ASSIGN_OR_RETURN(
          int down,
          f.NameValue(*semantics.second, "semantics", kSemanticsNames));
      op.semantics = static_cast<Semantics>(up);
      op.dst_semantics = static_cast<Semantics>(down);
      TPUSHIM_ASSIGN_OR_RETURN(op.fill_seed, f.Unsigned("fill_seed"));
      return absl::OkStatus();
    }
    case Op::kAwait: {
      TPUSHIM_ASSIGN_OR_RETURN(const Json* event, f.Get("event"));
      TPUSHIM_ASSIGN_OR_RETURN(op.event, EventAt(f, *event, "event", t));
      TPUSHIM_ASSIGN_OR_RETURN(int mode, f.Name("mode", kAwaitModeNames));
      op.mode = static_cast<AwaitMode>(mode);
      if (op.mode == AwaitMode::kTimed) {
        TPUSHIM_ASSIGN_OR_RETURN(
            op.timeout_us, f.Unsigned("timeout_us", 0, kMaxTimedAwaitMicros));
      }
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

absl::Status Checker::Line(const Json& json, size_t line) {
  Fields f(json, line);
  if (!json.is_object()) return f.Error("not a JSON object");
  RecordedOp op;
  TPUSHIM_ASSIGN_OR_RETURN(op.seq, f.Unsigned("seq"));
  if (last_seq_.has_value() && op.seq <= *last_seq_) {
    return f.Error(absl::StrCat("\"seq\" ", op.seq,
                                " does not follow the previous line's ",
                                *last_seq_));
  }
  last_seq_ = op.seq;
  TPUSHIM_ASSIGN_OR_RETURN(
      uint64_t thread,
      f.Unsigned("thread", 0,
                 static_cast<uint64_t>(record_.config.threads) - 1));
  op.thread = static_cast<int>(thread);
  ThreadRecord& t = record_.threads[thread];
  if (t.teardown_seq.has_value()) {
    return f.Error(absl::StrCat("thread ", thread, " already tore down"));
  }
  TPUSHIM_ASSIGN_OR_RETURN(op.index, f.Unsigned("index"));
  if (op.index != t.ops.size()) {
    return f.Error(absl::StrCat("\"index\" ", op.index, " of thread ", thread,
                                " should be ", t.ops.size()));
  }
  TPUSHIM_ASSIGN_OR_RETURN(const Json* kind, f.Get("op"));
  if (*kind == "teardown") {
    t.teardown_seq = op.seq;
    return absl::OkStatus();
  }
  TPUSHIM_ASSIGN_OR_RETURN(int op_kind, f.NameValue(*kind, "op", kOpNames));
  op.op = static_cast<Op>(op_kind);

  TPUSHIM_ASSIGN_OR_RETURN(const Json* result, f.Get("result"));
  if (!result->is_null()) {
    for (int c = 0; c < kCodeSlots && op.result == kNoResult; ++c) {
      if (*result == CodeName(c)) op.result = c;
    }
    if (op.result == kNoResult) {
      return f.Error(absl::StrCat(
          "\"result\" must be null or a status code name, SKIPPED or "
          "NOT_READY, not ",
          result->dump()));
    }
  }
  if (!op.skipped()) {
    TPUSHIM_RETURN_IF_ERROR(Parameters(f, op));
  }
  t.ops.push_back(std::move(op));
  return absl::OkStatus();
}

absl::Status ParseConfig(const Fields& f, StressConfig& c, int& devices) {
  TPUSHIM_ASSIGN_OR_RETURN(c.seed, f.Unsigned("seed"));
  TPUSHIM_ASSIGN_OR_RETURN(uint64_t threads,
                           f.Unsigned("threads", 1, kMaxThreads));
  c.threads = static_cast<int>(threads);
  TPUSHIM_ASSIGN_OR_RETURN(const Json* ops, f.Get("ops"));
  if (!ops->is_null()) {
    TPUSHIM_ASSIGN_OR_RETURN(c.ops, f.Unsigned("ops", 1));
  }
  TPUSHIM_ASSIGN_OR_RETURN(const Json* seconds, f.Get("seconds"));
  if (!seconds->is_null()) {
    if (!seconds->is_number() || seconds->get<double>() <= 0) {
      return f.Error(absl::StrCat("\"seconds\" must be a positive number, not ",
                                  seconds->dump()));
    }
    c.seconds = seconds->get<double>();
  }
  if (c.ops.has_value() == c.seconds.has_value()) {
    return f.Error("exactly one of \"ops\" and \"seconds\" must be given");
  }
  TPUSHIM_ASSIGN_OR_RETURN(c.faults, f.String("faults"));
  absl::StatusOr<FaultSpec> faults = ParseFaultSpec(c.faults);
  if (!faults.ok()) {
    return f.Error(absl::StrCat("\"faults\": ", faults.status().message()));
  }
  TPUSHIM_ASSIGN_OR_RETURN(c.device, f.String("device"));
  absl::StatusOr<DeviceUrl> url = ParseDeviceUrl(c.device);
  if (!url.ok()) {
    return f.Error(absl::StrCat("\"device\": ", url.status().message()));
  }
  devices = url->devices;
  TPUSHIM_ASSIGN_OR_RETURN(c.region_bytes, f.Unsigned("region_bytes"));
  TPUSHIM_ASSIGN_OR_RETURN(c.threshold_bytes,
                           f.Unsigned("threshold_bytes", 0, c.region_bytes));
  return absl::OkStatus();
}

}  // namespace

std::string CodeName(int code) {
  if (code == kSkipped) return "SKIPPED";
  if (code == kNotReady) return "NOT_READY";
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

absl::Status WriteStressRecord(
    const StressRecord& record,
    absl::FunctionRef<absl::Status(absl::string_view)> write) {
  // Every thread's operations and teardown, merged by seq.
  struct Line {
    uint64_t seq;
    int thread;
    const RecordedOp* op;  // null: the teardown
  };
  std::vector<Line> lines;
  for (size_t t = 0; t < record.threads.size(); ++t) {
    const ThreadRecord& thread = record.threads[t];
    for (const RecordedOp& op : thread.ops) {
      lines.push_back({op.seq, static_cast<int>(t), &op});
    }
    if (thread.teardown_seq.has_value()) {
      lines.push_back({*thread.teardown_seq, static_cast<int>(t), nullptr});
    }
  }
  std::sort(lines.begin(), lines.end(),
            [](const Line& a, const Line& b) { return a.seq < b.seq; });

  std::string chunk = HeaderJson(record, lines.size()).dump();
  chunk += '\n';
  for (const Line& line : lines) {
    if (line.op != nullptr) {
      chunk += OpJson(*line.op).dump();
    } else {
      chunk += Json({{"seq", line.seq},
                     {"thread", line.thread},
                     {"index", record.threads[line.thread].ops.size()},
                     {"op", "teardown"}})
                   .dump();
    }
    chunk += '\n';
    if (chunk.size() >= kWriteChunk) {
      TPUSHIM_RETURN_IF_ERROR(write(chunk));
      chunk.clear();
    }
  }
  return chunk.empty() ? absl::OkStatus() : write(chunk);
}

absl::StatusOr<StressRecord> ParseStressRecord(absl::string_view text) {
  if (text.empty()) return absl::InvalidArgumentError("the record is empty");
  // Every line the writer writes ends in a newline: a last line without one
  // was cut off.
  if (text.back() != '\n') {
    return absl::InvalidArgumentError(
        "the record is truncated: its last line is cut off");
  }
  text.remove_suffix(1);
  const std::vector<absl::string_view> lines = absl::StrSplit(text, '\n');

  const Json header = Json::parse(lines[0].begin(), lines[0].end(), nullptr,
                                  /*allow_exceptions=*/false);
  if (!header.is_object() || !header.contains("format") ||
      header["format"] != kFormat) {
    return absl::InvalidArgumentError(absl::StrCat(
        "not a tpushim stress record: line 1 is not a header with \"format\": "
        "\"",
        kFormat, "\""));
  }
  const Fields f(header, 1);
  TPUSHIM_ASSIGN_OR_RETURN(const Json* version, f.Get("version"));
  if (*version != kStressRecordVersion) {
    return absl::UnimplementedError(
        absl::StrCat("record format version ", version->dump(),
                     " is not supported: this tpushim reads version ",
                     kStressRecordVersion));
  }
  StressRecord record;
  TPUSHIM_ASSIGN_OR_RETURN(record.tpushim_version, f.String("tpushim"));
  TPUSHIM_ASSIGN_OR_RETURN(const Json* config, f.Get("config"));
  if (!config->is_object()) return f.Error("\"config\" must be an object");
  int devices = 1;
  TPUSHIM_RETURN_IF_ERROR(
      ParseConfig(Fields(*config, 1), record.config, devices));
  TPUSHIM_ASSIGN_OR_RETURN(uint64_t count, f.Unsigned("lines"));
  if (lines.size() - 1 != count) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the record is truncated or padded: its header announces ", count,
        " lines after it, the file has ", lines.size() - 1));
  }

  record.threads.resize(static_cast<size_t>(record.config.threads));
  Checker checker(record, devices);
  for (size_t i = 1; i < lines.size(); ++i) {
    const Json json = Json::parse(lines[i].begin(), lines[i].end(), nullptr,
                                  /*allow_exceptions=*/false);
    if (json.is_discarded()) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", i + 1, ": not valid JSON"));
    }
    TPUSHIM_RETURN_IF_ERROR(checker.Line(json, i + 1));
  }
  // A run that started ends every thread with its teardown; one whose
  // start-up failed has no lines at all.
  const bool started = std::any_of(
      record.threads.begin(), record.threads.end(), [](const ThreadRecord& t) {
        return t.teardown_seq.has_value() || !t.ops.empty();
      });
  for (size_t t = 0; started && t < record.threads.size(); ++t) {
    if (!record.threads[t].teardown_seq.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("thread ", t, " has no teardown line"));
    }
  }
  return record;
}

// ---- Parts of a record -----------------------------------------------------

std::vector<uint64_t> OperationSeqs(const StressRecord& record, bool skipped) {
  std::vector<uint64_t> seqs;
  for (const ThreadRecord& thread : record.threads) {
    for (const RecordedOp& op : thread.ops) {
      if (skipped || !op.skipped()) seqs.push_back(op.seq);
    }
  }
  std::sort(seqs.begin(), seqs.end());
  return seqs;
}

StressRecord SubsetRecord(const StressRecord& record,
                          const std::vector<uint64_t>& keep) {
  StressRecord part;
  part.tpushim_version = record.tpushim_version;
  part.config = record.config;
  part.threads.resize(record.threads.size());
  for (size_t t = 0; t < record.threads.size(); ++t) {
    const ThreadRecord& all = record.threads[t];
    ThreadRecord& kept = part.threads[t];
    kept.teardown_seq = all.teardown_seq;
    // Names only ever point back within the thread, so one pass in order
    // sees every operation an operation names before it.
    std::unordered_set<uint64_t> there;
    for (const RecordedOp& op : all.ops) {
      if (!std::binary_search(keep.begin(), keep.end(), op.seq)) continue;
      const std::vector<uint64_t> named = NamedOperations(op);
      if (!std::all_of(named.begin(), named.end(),
                       [&there](uint64_t s) { return there.contains(s); })) {
        continue;
      }
      RecordedOp copy = op;
      copy.index = kept.ops.size();
      std::erase_if(copy.wait_for, [&there](const EventRef& e) {
        return !there.contains(e.seq);
      });
      there.insert(op.seq);
      kept.ops.push_back(std::move(copy));
    }
  }
  return part;
}

std::vector<uint64_t> DependencySlice(const StressRecord& record,
                                      uint64_t seq) {
  const std::vector<RecordedOp>* ops = nullptr;
  const RecordedOp* target = nullptr;
  auto find = [&ops](uint64_t s) -> const RecordedOp* {
    const auto it = std::lower_bound(
        ops->begin(), ops->end(), s,
        [](const RecordedOp& op, uint64_t x) { return op.seq < x; });
    return it != ops->end() && it->seq == s ? &*it : nullptr;
  };
  for (const ThreadRecord& thread : record.threads) {
    ops = &thread.ops;
    target = find(seq);
    if (target != nullptr) break;
  }
  if (target == nullptr) return {};
  // The last operation before index `before` that wrote device buffer
  // `buffer`; null when none did since its allocation.
  auto last_write = [ops](uint64_t buffer, uint64_t before) {
    for (uint64_t i = before; i-- > 0;) {
      const RecordedOp& w = (*ops)[i];
      if (w.seq == buffer) break;
      if (w.skipped()) continue;
      if ((w.op == Op::kH2D && w.buffer == buffer) ||
          (w.op == Op::kD2D && w.dst_buffer == buffer)) {
        return &w;
      }
    }
    return static_cast<const RecordedOp*>(nullptr);
  };
  std::set<uint64_t> slice;
  std::vector<const RecordedOp*> work = {target};
  while (!work.empty()) {
    const RecordedOp* op = work.back();
    work.pop_back();
    if (!slice.insert(op->seq).second) continue;
    for (uint64_t s : NamedOperations(*op)) {
      if (const RecordedOp* named = find(s)) work.push_back(named);
    }
    if (!op->skipped() && (op->op == Op::kD2H || op->op == Op::kD2D)) {
      if (const RecordedOp* w = last_write(op->buffer, op->index)) {
        work.push_back(w);
      }
    }
  }
  return std::vector<uint64_t>(slice.begin(), slice.end());
}

}  // namespace tpushim::tools::stress_internal
