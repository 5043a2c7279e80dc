#include "transfer/trace.h"

#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace tpushim {
namespace {

// Queue tracks are tid 1..3 (direction + 1); submit tracks 11..13.
constexpr int kSubmitTidBase = 11;
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
  item(R"({"ph":"M","name":"process_sort_index","pid":0,"args":{"sort_index":-1}})");
  std::set<std::pair<int, int>> tracks;
  for (const Record& r : records) {
    if (r.kind == Record::Kind::kDescriptor) {
      tracks.emplace(r.device, r.direction);
    }
  }
  for (size_t d = 0; d < names.size(); ++d) {
    if (names[d].empty()) continue;
    item(absl::StrFormat(
        R"({"ph":"M","name":"process_name","pid":%d,"args":{"name":%s}})",
        d + 1, Quoted(names[d])));
  }
  for (const auto& [device, direction] : tracks) {
    item(absl::StrFormat(
        R"({"ph":"M","name":"thread_name","pid":%d,"tid":%d,"args":{"name":"%s"}})",
        device + 1, direction + 1, kQueueTrackNames[direction]));
    item(absl::StrFormat(
        R"({"ph":"M","name":"thread_name","pid":%d,"tid":%d,"args":{"name":"%s"}})",
        device + 1, direction + kSubmitTidBase,
        kSubmitTrackNames[direction]));
  }
  uint64_t flow_id = 0;
  for (const Record& r : records) {
    if (r.kind == Record::Kind::kCounter) {
      item(absl::StrFormat(
          R"({"ph":"C","name":"staging bytes in flight","pid":0,"ts":%.3f,"args":{"bytes":%d}})",
          Micros(r.start_ns, origin_ns_), r.bytes));
      continue;
    }
    const int pid = r.device + 1;
    const int queue_tid = r.direction + 1;
    const int submit_tid = r.direction + kSubmitTidBase;
    ++flow_id;
    const double submit = Micros(r.submit_ns, origin_ns_);
    const double start = Micros(r.start_ns, origin_ns_);
    const double dur =
        static_cast<double>(std::max<int64_t>(r.end_ns - r.start_ns, 0)) /
        1000.0;
    item(absl::StrFormat(
        R"({"ph":"X","name":"submit","cat":"submit","pid":%d,"tid":%d,"ts":%.3f,"dur":0.001,"args":{"transfer":%d,"chunk":%d}})",
        pid, submit_tid, submit, r.transfer, r.chunk));
    item(absl::StrFormat(
        R"({"ph":"s","name":"descriptor","cat":"dma","id":%d,"pid":%d,"tid":%d,"ts":%.3f})",
        flow_id, pid, submit_tid, submit));
    item(absl::StrFormat(
        R"({"ph":"X","name":"%s %s%s","cat":"dma","pid":%d,"tid":%d,"ts":%.3f,"dur":%.3f,"args":{"bytes":%d,"path":"%s","chunk":%d,"transfer":%d,"failed":%s}})",
        r.path, r.direction_name, r.failed ? " (failed)" : "", pid,
        queue_tid, start, dur, r.bytes, r.path, r.chunk, r.transfer,
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
