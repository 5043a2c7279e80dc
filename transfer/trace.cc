#include "transfer/trace.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace tpushim {
namespace {

// A direction's queue track is tid 1..3 (direction + 1) and its submit
// track 11..13; their further lanes add 100 per lane.
constexpr int kSubmitTidBase = 11;
constexpr int kLaneTidStride = 100;

int QueueTid(int direction, int lane) {
  return direction + 1 + kLaneTidStride * lane;
}
int SubmitTid(int direction, int lane) {
  return direction + kSubmitTidBase + kLaneTidStride * lane;
}
// "h2d queue", "h2d queue 2", ...
std::string LaneName(const char* track, int lane) {
  return lane == 0 ? std::string(track) : absl::StrCat(track, " ", lane + 1);
}
constexpr const char* kQueueTrackNames[] = {"h2d queue", "d2h queue",
                                            "d2d queue"};
constexpr const char* kSubmitTrackNames[] = {"h2d submit", "d2h submit",
                                             "d2d submit"};

// Microseconds since the origin, as Chrome traces want them.
double Micros(int64_t ns, int64_t origin) {
  return static_cast<double>(ns - origin) / 1000.0;
}

std::string Quoted(absl::string_view s) {
  return nlohmann::json(std::string(s)).dump();
}

}  // namespace

TraceRecorder::TraceRecorder(std::string path, Os* os, int64_t origin_ns,
                             size_t max_records)
    : path_(std::move(path)),
      os_(os),
      origin_ns_(origin_ns),
      max_records_(max_records) {}

void TraceRecorder::NameDevice(int device, const std::string& name) {
  MutexLock lock(&mu_);
  if (device_names_.size() <= static_cast<size_t>(device)) {
    device_names_.resize(device + 1);
  }
  device_names_[device] = name;
}

bool TraceRecorder::Add(const Record& r) {
  MutexLock lock(&mu_);
  if (records_.size() >= max_records_) {
    ++dropped_;
    return false;
  }
  records_.push_back(r);
  return true;
}

void TraceRecorder::Descriptor(int device, int direction, const char* path,
                               const char* direction_name, uint64_t transfer,
                               uint32_t chunk, uint64_t bytes,
                               int64_t submit_ns, int64_t start_ns,
                               int64_t end_ns, bool failed) {
  Record r{};
  r.kind = Record::Kind::kDescriptor;
  r.failed = failed;
  r.direction = static_cast<int8_t>(direction);
  r.device = device;
  r.chunk = chunk;
  r.path = path;
  r.direction_name = direction_name;
  r.transfer = transfer;
  r.bytes = bytes;
  r.submit_ns = submit_ns;
  r.start_ns = start_ns;
  r.end_ns = end_ns;
  Add(r);
}

void TraceRecorder::StagingBytes(int64_t ns, uint64_t bytes) {
  Record r{};
  r.kind = Record::Kind::kCounter;
  r.bytes = bytes;
  r.start_ns = ns;
  Add(r);
}

uint64_t TraceRecorder::recorded() const {
  MutexLock lock(&mu_);
  return records_.size();
}

uint64_t TraceRecorder::dropped() const {
  MutexLock lock(&mu_);
  return dropped_;
}

absl::Status TraceRecorder::Write() {
  std::vector<Record> records;
  std::vector<std::string> names;
  uint64_t dropped;
  {
    MutexLock lock(&mu_);
    records = records_;
    names = device_names_;
    dropped = dropped_;
  }
  const std::string tmp = absl::StrCat(path_, ".tmp.", os_->ProcessId());
  TPUSHIM_ASSIGN_OR_RETURN(int fd, os_->CreateOutputFile(tmp));
  std::string out;
  absl::Status status;
  auto flush = [&](bool force) {
    if (status.ok() && (force || out.size() >= (1 << 20))) {
      status = os_->WriteAll(fd, out.data(), out.size());
      out.clear();
    }
  };
  bool first = true;
  auto item = [&](const std::string& json) {
    absl::StrAppend(&out, first ? "\n" : ",\n", json);
    first = false;
    flush(false);
  };

  absl::StrAppend(&out, "{\"displayTimeUnit\":\"ns\",\"otherData\":{",
                  "\"generator\":\"tpushim\",\"dropped_records\":", dropped,
                  "},\"traceEvents\":[");
  item(R"({"ph":"M","name":"process_name","pid":0,"args":{"name":"host"}})");
  item(
      R"({"ph":"M","name":"process_sort_index","pid":0,"args":{"sort_index":-1}})");
  // Slices of one track must not overlap, and no two may start at the same
  // timestamp: trace viewers nest overlapping slices wrongly, and Chrome
  // DevTools binds a flow event only to the first slice with its pid, tid,
  // timestamp and category. Descriptors that run at once (several DMA
  // engines, or an NVMe queue) go to further lanes of their queue's track:
  // each slice takes the first lane whose last slice ended by its start and
  // started before it. Submit slices are laid out the same way.
  struct Lanes {
    std::vector<std::pair<int64_t, int64_t>> last;  // per lane: start, end
    int Place(int64_t start, int64_t end) {
      for (size_t i = 0; i < last.size(); ++i) {
        if (last[i].second <= start && last[i].first < start) {
          last[i] = {start, end};
          return static_cast<int>(i);
        }
      }
      last.emplace_back(start, end);
      return static_cast<int>(last.size() - 1);
    }
  };
  struct Placed {
    const Record* record;
    int queue_lane;
    int submit_lane;
    int64_t submit_ns;
  };
  // A flow from a submit to a descriptor that starts at the very same
  // nanosecond would be one point, which DevTools does not draw: such a
  // submit is shown 1 ns earlier.
  auto submit_of = [](const Record* r) {
    return std::min(r->submit_ns, r->start_ns - 1);
  };
  std::vector<const Record*> descriptors;
  for (const Record& r : records) {
    if (r.kind == Record::Kind::kDescriptor) descriptors.push_back(&r);
  }
  std::vector<Placed> placed;
  placed.reserve(descriptors.size());
  {
    std::map<std::pair<int, int>, Lanes> queue_lanes, submit_lanes;
    std::vector<const Record*> by_start = descriptors;
    std::stable_sort(by_start.begin(), by_start.end(),
                     [](const Record* a, const Record* b) {
                       return a->start_ns < b->start_ns;
                     });
    std::map<const Record*, int> queue_lane;
    for (const Record* r : by_start) {
      queue_lane[r] = queue_lanes[{r->device, r->direction}].Place(
          r->start_ns, std::max(r->end_ns, r->start_ns));
    }
    std::vector<const Record*> by_submit = descriptors;
    std::stable_sort(by_submit.begin(), by_submit.end(),
                     [&](const Record* a, const Record* b) {
                       return submit_of(a) < submit_of(b);
                     });
    for (const Record* r : by_submit) {
      const int64_t submit = submit_of(r);
      const int lane =
          submit_lanes[{r->device, r->direction}].Place(submit, submit + 1);
      placed.push_back(Placed{r, queue_lane[r], lane, submit});
    }
  }
  std::map<std::pair<int, int>, std::string> track_names;
  for (const Placed& p : placed) {
    const int d = p.record->direction;
    const int queue_tid = QueueTid(d, p.queue_lane);
    const int submit_tid = SubmitTid(d, p.submit_lane);
    track_names[{p.record->device, queue_tid}] =
        LaneName(kQueueTrackNames[d], p.queue_lane);
    track_names[{p.record->device, submit_tid}] =
        LaneName(kSubmitTrackNames[d], p.submit_lane);
  }
  for (size_t d = 0; d < names.size(); ++d) {
    if (names[d].empty()) continue;
    item(absl::StrFormat(
        R"({"ph":"M","name":"process_name","pid":%d,"args":{"name":%s}})",
        d + 1, Quoted(names[d])));
  }
  for (const auto& [key, name] : track_names) {
    const auto& [device, tid] = key;
    item(absl::StrFormat(
        R"({"ph":"M","name":"thread_name","pid":%d,"tid":%d,"args":{"name":%s}})",
        device + 1, tid, Quoted(name)));
    item(absl::StrFormat(
        R"({"ph":"M","name":"thread_sort_index","pid":%d,"tid":%d,"args":{"sort_index":%d}})",
        device + 1, tid, tid));
  }
  for (const Record& r : records) {
    if (r.kind != Record::Kind::kCounter) continue;
    item(absl::StrFormat(
        R"({"ph":"C","name":"staging bytes in flight","pid":0,"ts":%.3f,"args":{"bytes":%d}})",
        Micros(r.start_ns, origin_ns_), r.bytes));
  }
  // Every flow's start binds to its submit slice and its end to its
  // descriptor slice: same pid, tid, timestamp and category ("dma"), which
  // both Chrome DevTools and Perfetto need.
  uint64_t flow_id = 0;
  for (const Placed& p : placed) {
    const Record& r = *p.record;
    const int pid = r.device + 1;
    const int queue_tid = QueueTid(r.direction, p.queue_lane);
    const int submit_tid = SubmitTid(r.direction, p.submit_lane);
    ++flow_id;
    const double submit = Micros(p.submit_ns, origin_ns_);
    const double start = Micros(r.start_ns, origin_ns_);
    const double dur =
        static_cast<double>(std::max<int64_t>(r.end_ns - r.start_ns, 0)) /
        1000.0;
    item(absl::StrFormat(
        R"({"ph":"X","name":"submit","cat":"dma","pid":%d,"tid":%d,"ts":%.3f,"dur":0.001,"args":{"transfer":%d,"chunk":%d}})",
        pid, submit_tid, submit, r.transfer, r.chunk));
    item(absl::StrFormat(
        R"({"ph":"s","name":"descriptor","cat":"dma","id":%d,"pid":%d,"tid":%d,"ts":%.3f})",
        flow_id, pid, submit_tid, submit));
    item(absl::StrFormat(
        R"({"ph":"X","name":"%s %s%s","cat":"dma","pid":%d,"tid":%d,"ts":%.3f,"dur":%.3f,"args":{"bytes":%d,"path":"%s","chunk":%d,"transfer":%d,"failed":%s}})",
        r.path, r.direction_name, r.failed ? " (failed)" : "", pid, queue_tid,
        start, dur, r.bytes, r.path, r.chunk, r.transfer,
        r.failed ? "true" : "false"));
    item(absl::StrFormat(
        R"({"ph":"f","bp":"e","name":"descriptor","cat":"dma","id":%d,"pid":%d,"tid":%d,"ts":%.3f})",
        flow_id, pid, queue_tid, start));
  }
  absl::StrAppend(&out, "\n]}\n");
  flush(true);
  absl::Status closed = os_->Close(fd);
  if (status.ok()) status = closed;
  if (status.ok()) status = os_->Rename(tmp, path_);
  if (!status.ok()) (void)os_->Unlink(tmp);
  return status;
}

}  // namespace tpushim
