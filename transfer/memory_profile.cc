#include "transfer/memory_profile.h"

#include <filesystem>
#include <set>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "logging/log.h"
#include "nlohmann/json.hpp"

namespace tpushim {
namespace {

constexpr size_t kFlushBytes = size_t{64} << 10;

// The paths the profiles of this process have open.
Mutex& OpenPathsMutex() {
  static Mutex* mu = new Mutex;
  return *mu;
}
std::set<std::string>& OpenPaths() {
  static auto* paths = new std::set<std::string>;
  return *paths;
}

// One name per file: "p", "./p" and "dir/../p" are the same file.
std::string FileKey(const std::string& path) {
  std::error_code error;
  std::filesystem::path p = std::filesystem::absolute(path, error);
  if (error) return path;
  std::filesystem::path canonical = std::filesystem::weakly_canonical(p, error);
  return error ? p.lexically_normal().string() : canonical.string();
}

// `path`, or the first free "<path>.N", now taken.
std::string TakePath(const std::string& path) {
  MutexLock lock(&OpenPathsMutex());
  std::string taken = path;
  for (int n = 2; OpenPaths().count(FileKey(taken)) > 0; ++n) {
    taken = absl::StrCat(path, ".", n);
  }
  OpenPaths().insert(FileKey(taken));
  return taken;
}

void ReleasePath(const std::string& path) {
  MutexLock lock(&OpenPathsMutex());
  OpenPaths().erase(FileKey(path));
}

using Json = nlohmann::ordered_json;

Json BufferJson(const MemoryProfile::Buffer& b, const char* event) {
  Json j = {{"event", event}, {"device", b.device}};
  if (b.id != 0) j["id"] = b.id;
  j["device_bytes"] = b.device_bytes;
  j["padded_bytes"] = b.padded_bytes;
  j["unpadded_bytes"] = b.unpadded_bytes;
  if (!b.shape.empty()) j["shape"] = b.shape;
  if (!b.label.empty()) j["label"] = b.label;
  if (!b.op_metadata.empty()) j["op"] = b.op_metadata;
  return j;
}

}  // namespace

absl::StatusOr<std::unique_ptr<MemoryProfile>> MemoryProfile::Create(
    const std::string& given, Os* os, int64_t origin_ns,
    const std::vector<DeviceEntry>& devices) {
  const std::string path = TakePath(given);
  if (path != given) {
    LOG(WARNING) << "TPUSHIM_MEMORY_PROFILE=" << given
                 << " is being written by another system of this process; "
                    "this one's profile goes to "
                 << path;
  }
  absl::StatusOr<int> fd = os->CreateOutputFile(path);
  if (!fd.ok()) {
    ReleasePath(path);
    return absl::Status(
        fd.status().code(),
        absl::StrCat("TPUSHIM_MEMORY_PROFILE=", path,
                     ": cannot create the file: ", fd.status().message()));
  }
  Json header = {{"tpushim_memory_profile", 1},
                 {"pid", os->ProcessId()},
                 {"started", absl::FormatTime(absl::RFC3339_sec, os->Now(),
                                              absl::UTCTimeZone())}};
  Json& list = header["devices"] = Json::array();
  for (const DeviceEntry& d : devices) {
    list.push_back(
        {{"name", d.name}, {"hbm_bytes", d.hbm_bytes}, {"granule", d.granule}});
  }
  const std::string line =
      header.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
  absl::Status written = os->WriteAll(*fd, line.data(), line.size());
  if (!written.ok()) {
    (void)os->Close(*fd);
    ReleasePath(path);
    return absl::Status(
        written.code(),
        absl::StrCat("TPUSHIM_MEMORY_PROFILE=", path,
                     ": cannot write the file: ", written.message()));
  }
  return std::unique_ptr<MemoryProfile>(
      new MemoryProfile(path, os, origin_ns, *fd));
}

absl::StatusOr<std::unique_ptr<MemoryProfile>> MemoryProfile::ForDevices(
    const std::string& path, Os* os, absl::Span<Device* const> devices) {
  std::vector<DeviceEntry> entries;
  for (const Device* dev : devices) {
    entries.push_back({.name = dev->info().name,
                       .hbm_bytes = dev->info().hbm_bytes,
                       .granule = dev->GetMemoryStats().granule});
  }
  return Create(path, os, os->MonotonicNanos(), entries);
}

MemoryProfile::MemoryProfile(std::string path, Os* os, int64_t origin_ns,
                             int fd)
    : path_(std::move(path)), os_(os), origin_ns_(origin_ns), fd_(fd) {}

MemoryProfile::~MemoryProfile() { (void)Close(); }

bool MemoryProfile::Append(const Json& record, bool urgent, bool last) {
  // Labels and shapes come from the caller and may be any bytes: invalid
  // UTF-8 is written as U+FFFD rather than thrown.
  const std::string line =
      record.dump(-1, ' ', false, Json::error_handler_t::replace);
  MutexLock lock(&mu_);
  if (closed_) return false;
  closed_ = last;
  // Stamped here, under the lock, so that the file is in time order.
  const double t =
      static_cast<double>(os_->MonotonicNanos() - origin_ns_) / 1e9;
  absl::StrAppend(&pending_, "{\"t\":", absl::StrFormat("%.6f", t), ",",
                  absl::string_view(line).substr(1), "\n");
  ++records_;
  return urgent || pending_.size() >= kFlushBytes;
}

bool MemoryProfile::Allocated(const Buffer& b) {
  return Append(BufferJson(b, "alloc"), false, false);
}

bool MemoryProfile::Freed(int device, uint64_t id) {
  return Append(Json{{"event", "free"}, {"device", device}, {"id", id}}, false,
                false);
}

bool MemoryProfile::Failed(const Buffer& b) {
  Buffer request = b;
  request.id = 0;
  return Append(BufferJson(request, "failed"), true, false);
}

void MemoryProfile::Flush() {
  MutexLock write_lock(&write_mu_);
  std::string out;
  {
    MutexLock lock(&mu_);
    out.swap(pending_);
  }
  if (out.empty() || fd_ < 0 || !write_error_.ok()) return;
  absl::Status s = os_->WriteAll(fd_, out.data(), out.size());
  if (!s.ok()) {
    write_error_ = s;
    LOG(ERROR) << "Writing the memory profile to " << path_
               << " failed; no more records are written: " << s;
  }
}

absl::Status MemoryProfile::Close() {
  // `end` and closing in one step: no record can follow it.
  (void)Append(Json{{"event", "end"}}, true, /*last=*/true);
  Flush();
  MutexLock write_lock(&write_mu_);
  if (fd_ >= 0) {
    absl::Status s = os_->Close(fd_);
    fd_ = -1;
    if (!s.ok() && write_error_.ok()) {
      write_error_ = s;
      LOG(ERROR) << "Closing the memory profile " << path_ << " failed: " << s;
    }
    ReleasePath(path_);
  }
  return write_error_;
}

uint64_t MemoryProfile::records() const {
  MutexLock lock(&mu_);
  return records_;
}

}  // namespace tpushim
