#include "tools/tune/workload.h"

#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "common/status_macros.h"
#include "env/device_url.h"
#include "logging/log.h"
#include "tpushim/stats.h"
#include "tpushim/system.h"

namespace tpushim::tools {
namespace {

using Json = nlohmann::ordered_json;

constexpr size_t kPinnedAlignment = 4096;

absl::StatusOr<uint64_t> ParseTransferSize(absl::string_view text,
                                           absl::string_view what) {
  absl::StatusOr<uint64_t> bytes = ParseByteSize(text, what);
  if (!bytes.ok()) return bytes.status();
  if (*bytes == 0 || *bytes > kMaxTransferBytes) {
    return InvalidValueError(what, text, "is out of range [1, 4G]");
  }
  return *bytes;
}

// "A-B" with A <= B.
absl::StatusOr<std::pair<uint64_t, uint64_t>> ParseSizeRange(
    absl::string_view text, absl::string_view what) {
  const std::vector<absl::string_view> ends = absl::StrSplit(text, '-');
  if (ends.size() != 2) {
    return InvalidValueError(what, text, "is not a range MIN-MAX");
  }
  absl::StatusOr<uint64_t> lo = ParseTransferSize(ends[0], what);
  if (!lo.ok()) return lo.status();
  absl::StatusOr<uint64_t> hi = ParseTransferSize(ends[1], what);
  if (!hi.ok()) return hi.status();
  if (*lo > *hi) return InvalidValueError(what, text, "has MIN > MAX");
  return std::make_pair(*lo, *hi);
}

}  // namespace

// ---- Size distributions
// ---------------------------------------------------------

absl::StatusOr<SizeDistribution> SizeDistribution::Parse(
    absl::string_view text, absl::string_view what) {
  SizeDistribution d;
  d.text_ = std::string(text);
  const size_t colon = text.find(':');
  if (colon == absl::string_view::npos) {
    absl::StatusOr<uint64_t> bytes = ParseTransferSize(text, what);
    if (!bytes.ok()) return bytes.status();
    d.kind_ = Kind::kFixed;
    d.min_ = d.max_ = *bytes;
    return d;
  }
  const absl::string_view kind = text.substr(0, colon);
  const absl::string_view rest = text.substr(colon + 1);
  if (kind == "uniform" || kind == "loguniform") {
    absl::StatusOr<std::pair<uint64_t, uint64_t>> range =
        ParseSizeRange(rest, what);
    if (!range.ok()) return range.status();
    d.kind_ = kind == "uniform" ? Kind::kUniform : Kind::kLogUniform;
    d.min_ = range->first;
    d.max_ = range->second;
    return d;
  }
  if (kind == "histogram") {
    for (absl::string_view item : absl::StrSplit(rest, ',')) {
      const std::vector<absl::string_view> kv = absl::StrSplit(item, '=');
      if (kv.size() != 2) {
        return InvalidValueError(
            what, text, "has a histogram entry that is not SIZE=WEIGHT");
      }
      absl::StatusOr<uint64_t> bytes = ParseTransferSize(kv[0], what);
      if (!bytes.ok()) return bytes.status();
      absl::StatusOr<uint64_t> weight =
          ParseDecimal(kv[1], absl::StrCat(what, " weight"), 1, 1000000);
      if (!weight.ok()) return weight.status();
      d.histogram_.emplace_back(*bytes, static_cast<double>(*weight));
    }
    d.kind_ = Kind::kHistogram;
    d.min_ = d.max_ = d.histogram_.front().first;
    for (const auto& [bytes, weight] : d.histogram_) {
      d.min_ = std::min(d.min_, bytes);
      d.max_ = std::max(d.max_, bytes);
    }
    return d;
  }
  return InvalidValueError(what, text,
                           "is not a size distribution (SIZE, uniform:MIN-MAX, "
                           "loguniform:MIN-MAX or histogram:SIZE=WEIGHT,...)");
}

uint64_t SizeDistribution::Draw(std::mt19937_64& rng) const {
  switch (kind_) {
    case Kind::kFixed:
      return min_;
    case Kind::kUniform:
      return std::uniform_int_distribution<uint64_t>(min_, max_)(rng);
    case Kind::kLogUniform: {
      const double lo = std::log2(static_cast<double>(min_));
      const double hi = std::log2(static_cast<double>(max_));
      const double x = std::uniform_real_distribution<double>(lo, hi)(rng);
      return std::clamp<uint64_t>(
          static_cast<uint64_t>(std::llround(std::exp2(x))), min_, max_);
    }
    case Kind::kHistogram: {
      std::vector<double> weights;
      for (const auto& entry : histogram_) weights.push_back(entry.second);
      std::discrete_distribution<size_t> pick(weights.begin(), weights.end());
      return histogram_[pick(rng)].first;
    }
  }
  return min_;
}

double SizeDistribution::Mean() const {
  const double lo = static_cast<double>(min_);
  const double hi = static_cast<double>(max_);
  switch (kind_) {
    case Kind::kFixed:
      return lo;
    case Kind::kUniform:
      return (lo + hi) / 2;
    case Kind::kLogUniform:
      // E[2^X], X uniform in [log2 lo, log2 hi].
      return hi == lo ? lo : (hi - lo) / std::log(hi / lo);
    case Kind::kHistogram: {
      double sum = 0;
      double total = 0;
      for (const auto& [bytes, weight] : histogram_) {
        sum += static_cast<double>(bytes) * weight;
        total += weight;
      }
      return sum / total;
    }
  }
  return lo;
}

// ---- Workloads
// --------------------------------------------------------------------

Workload Workload::Default() {
  Workload w;
  w.transfer_sizes =
      *SizeDistribution::Parse("loguniform:64K-64M", "transfer_sizes");
  w.directions = {DmaDirection::kHostToDevice, DmaDirection::kDeviceToHost};
  return w;
}

absl::StatusOr<std::vector<DmaDirection>> ParseDirectionList(
    absl::string_view text, absl::string_view what) {
  bool chosen[3] = {false, false, false};
  constexpr DmaDirection kAll[] = {DmaDirection::kHostToDevice,
                                   DmaDirection::kDeviceToHost,
                                   DmaDirection::kDeviceToDevice};
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    bool found = false;
    for (int i = 0; i < 3; ++i) {
      if (item == DmaDirectionName(kAll[i])) chosen[i] = found = true;
    }
    if (!found) {
      return InvalidValueError(what, text,
                               absl::StrCat("has unknown direction \"", item,
                                            "\" (valid: h2d, d2h, d2d)"));
    }
  }
  std::vector<DmaDirection> out;
  for (int i = 0; i < 3; ++i) {
    if (chosen[i]) out.push_back(kAll[i]);
  }
  return out;
}

namespace {

absl::Status KeyError(absl::string_view key, absl::string_view problem) {
  return absl::InvalidArgumentError(
      absl::StrCat("workload \"", key, "\" ", problem));
}

// A byte count given as a number or as a string with a suffix ("64M").
absl::StatusOr<uint64_t> JsonBytes(const Json& value, absl::string_view key) {
  if (value.is_number_unsigned()) return value.get<uint64_t>();
  if (value.is_string()) {
    return ParseByteSize(value.get<std::string>(),
                         absl::StrCat("workload \"", key, "\""));
  }
  return KeyError(key,
                  "must be a byte count (a number, or a string like \"64M\")");
}

absl::StatusOr<int64_t> JsonInt(const Json& value, absl::string_view key,
                                int64_t min, int64_t max) {
  if (!value.is_number_integer()) return KeyError(key, "must be an integer");
  const int64_t v = value.is_number_unsigned()
                        ? static_cast<int64_t>(std::min<uint64_t>(
                              value.get<uint64_t>(), uint64_t{1} << 62))
                        : value.get<int64_t>();
  if (v < min || v > max) {
    return KeyError(
        key, absl::StrCat("is ", v, ", out of range [", min, ", ", max, "]"));
  }
  return v;
}

absl::StatusOr<double> JsonDouble(const Json& value, absl::string_view key,
                                  double min, double max) {
  if (!value.is_number()) return KeyError(key, "must be a number");
  const double v = value.get<double>();
  if (!(v >= min && v <= max)) {
    return KeyError(
        key, absl::StrCat("is ", v, ", out of range [", min, ", ", max, "]"));
  }
  return v;
}

}  // namespace

absl::StatusOr<Workload> WorkloadFromJson(const Json& json, Workload w) {
  if (!json.is_object()) {
    return absl::InvalidArgumentError("a workload must be a JSON object");
  }
  for (const auto& [key, value] : json.items()) {
    if (key == "transfer_sizes") {
      if (!value.is_string()) return KeyError(key, "must be a string");
      absl::StatusOr<SizeDistribution> d = SizeDistribution::Parse(
          value.get<std::string>(), "workload \"transfer_sizes\"");
      if (!d.ok()) return d.status();
      w.transfer_sizes = *std::move(d);
    } else if (key == "directions") {
      // An array (["h2d", "d2h"]) or the command line's form ("h2d,d2h").
      std::vector<std::string> names;
      if (value.is_string() && !value.get<std::string>().empty()) {
        names.push_back(value.get<std::string>());
      } else if (value.is_array() && !value.empty()) {
        for (const Json& v : value) {
          if (!v.is_string()) return KeyError(key, "must hold strings");
          names.push_back(v.get<std::string>());
        }
      } else {
        return KeyError(key,
                        "must be a non-empty array of \"h2d\", \"d2h\", "
                        "\"d2d\" or a string like \"h2d,d2h\"");
      }
      absl::StatusOr<std::vector<DmaDirection>> d = ParseDirectionList(
          absl::StrJoin(names, ","), "workload \"directions\"");
      if (!d.ok()) return d.status();
      w.directions = *std::move(d);
    } else if (key == "streams") {
      absl::StatusOr<int64_t> v = JsonInt(value, key, 1, kMaxStreams);
      if (!v.ok()) return v.status();
      w.streams = static_cast<int>(*v);
    } else if (key == "devices") {
      if (value.is_null()) {
        w.devices.reset();
        continue;
      }
      absl::StatusOr<int64_t> v = JsonInt(value, key, 1, 64);
      if (!v.ok()) return v.status();
      w.devices = static_cast<int>(*v);
    } else if (key == "link_gbps" || key == "latency_us") {
      std::optional<double>& field =
          key == "link_gbps" ? w.link_gbps : w.latency_us;
      if (value.is_null()) {
        field.reset();
        continue;
      }
      absl::StatusOr<double> v = JsonDouble(value, key, 0, 1e6);
      if (!v.ok()) return v.status();
      field = *v;
    } else if (key == "pinned_buffers") {
      absl::StatusOr<int64_t> v = JsonInt(value, key, 0, kMaxPinnedBuffers);
      if (!v.ok()) return v.status();
      w.pinned_buffers = static_cast<int>(*v);
    } else if (key == "pinned_bytes") {
      absl::StatusOr<uint64_t> v = JsonBytes(value, key);
      if (!v.ok()) return v.status();
      if (*v > kMaxTransferBytes) return KeyError(key, "is above 4G");
      w.pinned_bytes = *v;
    } else if (key == "zero_copy_share") {
      absl::StatusOr<double> v = JsonDouble(value, key, 0, 1);
      if (!v.ok()) return v.status();
      w.zero_copy_share = *v;
    } else if (key == "seconds") {
      absl::StatusOr<double> v = JsonDouble(value, key, 0, 86400);
      if (!v.ok()) return v.status();
      w.seconds = *v;
    } else if (key == "count") {
      absl::StatusOr<int64_t> v = JsonInt(value, key, 0, int64_t{1} << 40);
      if (!v.ok()) return v.status();
      w.count = static_cast<uint64_t>(*v);
    } else if (key == "step_ms") {
      absl::StatusOr<double> v = JsonDouble(value, key, 0, 3.6e6);
      if (!v.ok()) return v.status();
      w.step_ms = *v;
    } else if (key == "step_bytes") {
      absl::StatusOr<uint64_t> v = JsonBytes(value, key);
      if (!v.ok()) return v.status();
      if (*v == 0) return KeyError(key, "must be > 0");
      w.step_bytes = *v;
    } else if (key == "seed") {
      absl::StatusOr<int64_t> v =
          JsonInt(value, key, 0, std::numeric_limits<int64_t>::max());
      if (!v.ok()) return v.status();
      w.seed = static_cast<uint64_t>(*v);
    } else {
      return KeyError(key,
                      "is not a workload key (transfer_sizes, directions, "
                      "streams, devices, link_gbps, latency_us, "
                      "pinned_buffers, pinned_bytes, zero_copy_share, "
                      "seconds, count, step_ms, step_bytes, seed)");
    }
  }
  if (w.pinned_buffers > 0 && w.pinned_bytes == 0) {
    return KeyError("pinned_bytes", "must be > 0 when pinned_buffers > 0");
  }
  if (w.seconds <= 0 && w.count == 0) {
    return KeyError("seconds", "must be > 0 unless count is set");
  }
  return w;
}

Json WorkloadToJson(const Workload& w) {
  Json directions = Json::array();
  for (DmaDirection d : w.directions) directions.push_back(DmaDirectionName(d));
  auto optional = [](const auto& v) { return v ? Json(*v) : Json(nullptr); };
  return {{"transfer_sizes", w.transfer_sizes.text()},
          {"directions", std::move(directions)},
          {"streams", w.streams},
          {"devices", optional(w.devices)},
          {"link_gbps", optional(w.link_gbps)},
          {"latency_us", optional(w.latency_us)},
          {"pinned_buffers", w.pinned_buffers},
          {"pinned_bytes", w.pinned_bytes},
          {"zero_copy_share", w.zero_copy_share},
          {"seconds", w.seconds},
          {"count", w.count},
          {"step_ms", w.step_ms},
          {"step_bytes", w.step_bytes},
          {"seed", w.seed}};
}

// ---- tune-point: the child
// ------------------------------------------------------------

namespace {

// What the streams tally, under one lock (a transfer takes microseconds at
// least; the lock is not the bottleneck).
struct Tally {
  Mutex mu;
  uint64_t transfers ABSL_GUARDED_BY(mu) = 0;
  uint64_t bytes ABSL_GUARDED_BY(mu) = 0;
  uint64_t failed ABSL_GUARDED_BY(mu) = 0;
  uint64_t resource_exhausted ABSL_GUARDED_BY(mu) = 0;
  std::map<std::string, uint64_t> codes ABSL_GUARDED_BY(mu);
  std::string first_error ABSL_GUARDED_BY(mu);

  void Add(const absl::Status& status, uint64_t n) {
    MutexLock lock(&mu);
    ++transfers;
    if (status.ok()) {
      bytes += n;
      return;
    }
    ++failed;
    if (absl::IsResourceExhausted(status)) ++resource_exhausted;
    ++codes[absl::StatusCodeToString(status.code())];
    if (first_error.empty()) first_error = status.ToString();
  }
};

// Host memory outside the region, every page touched.
std::unique_ptr<char[]> TouchedHeap(uint64_t n, char fill) {
  std::unique_ptr<char[]> p(new (std::nothrow) char[n]);
  if (p != nullptr) std::memset(p.get(), fill, n);
  return p;
}

struct Stream {
  int index = 0;
  int device = 0;
  std::unique_ptr<char[]> host;
  DeviceBuffer src;
  DeviceBuffer dst;        // on the next device, for d2d
  void* pinned = nullptr;  // the stream's pinned buffer, if any
};

class PointRun {
 public:
  PointRun(System& system, const Workload& w) : system_(system), w_(w) {}

  // Allocates the application's pinned buffers and the streams' memory.
  absl::Status Prepare(Json& out) {
    uint64_t failures = 0;
    for (int i = 0; i < w_.pinned_buffers; ++i) {
      absl::StatusOr<PinnedHostBuffer> b =
          system_.AllocatePinnedHost(w_.pinned_bytes, kPinnedAlignment);
      if (b.ok()) {
        std::memset(b->data(), 0x5a, b->size());
        pinned_.push_back(*std::move(b));
      } else if (absl::IsResourceExhausted(b.status()) ||
                 absl::IsFailedPrecondition(b.status())) {
        // The region is full (or off): the application would fall back to
        // pageable memory; counted, as users see it, as RESOURCE_EXHAUSTED.
        ++failures;
      } else {
        return b.status();
      }
    }
    out["pinned_buffers_allocated"] = pinned_.size();
    out["pinned_alloc_failures"] = failures;
    pinned_failures_ = failures;

    const int devices = system_.device_count();
    // Transfers of whole device blocks (NVMe devices move whole logical
    // blocks; 1 byte on sim://).
    for (int d = 0; d < devices; ++d) {
      block_ = std::max<uint64_t>(block_, system_.device(d).block_bytes);
    }
    const uint64_t n = WholeBlocks(w_.transfer_sizes.max());
    for (int i = 0; i < w_.streams; ++i) {
      Stream s;
      s.index = i;
      s.device = i % devices;
      s.host = TouchedHeap(n, static_cast<char>(i));
      if (s.host == nullptr) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "cannot allocate ", n, " bytes of host memory for stream ", i));
      }
      absl::StatusOr<DeviceBuffer> src = system_.AllocateDevice(s.device, n);
      if (!src.ok()) return src.status();
      s.src = *src;
      absl::StatusOr<DeviceBuffer> dst =
          system_.AllocateDevice((s.device + 1) % devices, n);
      if (!dst.ok()) return dst.status();
      s.dst = *dst;
      // Simulated HBM is backed lazily: write it once so that reads measure
      // transfers, not first-touch page faults.
      absl::StatusOr<Event> warm =
          system_.TransferToDevice(s.host.get(), s.src, 0, n);
      if (!warm.ok()) return warm.status();
      TPUSHIM_RETURN_IF_ERROR(warm->Await());
      warm = system_.TransferToDevice(s.host.get(), s.dst, 0, n);
      if (!warm.ok()) return warm.status();
      TPUSHIM_RETURN_IF_ERROR(warm->Await());
      if (static_cast<size_t>(i) < pinned_.size()) s.pinned = pinned_[i].data();
      streams_.push_back(std::move(s));
    }
    return absl::OkStatus();
  }

  void Run(Json& out) {
    const SystemStats before = system_.GetStats();
    std::atomic<bool> sampling{true};
    uint64_t peak_call_pinned = 0;
    uint64_t peak_region = 0;
    std::thread sampler([&] {
      while (sampling.load(std::memory_order_relaxed)) {
        const SystemStats s = system_.GetStats();
        peak_call_pinned =
            std::max(peak_call_pinned, s.transfers.pinned_bytes_now);
        peak_region = std::max(peak_region, s.region.bytes_in_use);
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    });

    const absl::Time start = absl::Now();
    const absl::Time deadline = start + absl::Seconds(w_.seconds);
    std::vector<std::thread> threads;
    for (Stream& s : streams_) {
      threads.emplace_back([this, &s, deadline] { StreamLoop(s, deadline); });
    }
    for (std::thread& t : threads) t.join();
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    sampling.store(false);
    sampler.join();

    for (Stream& s : streams_) {
      for (const DeviceBuffer& b : {s.src, s.dst}) {
        absl::StatusOr<Event> freed = system_.Deallocate(b);
        if (freed.ok()) freed->Await().IgnoreError();
      }
    }
    const SystemStats after = system_.GetStats();
    auto delta = [&](int d, TransferPath p) {
      const int k = static_cast<int>(p);
      return after.transfers.host[d][k].transfers -
             before.transfers.host[d][k].transfers;
    };
    uint64_t zero_copy = 0, staged = 0, pinned = 0;
    for (int d = 0; d < 2; ++d) {
      zero_copy += delta(d, TransferPath::kZeroCopy);
      staged += delta(d, TransferPath::kStaged);
      pinned += delta(d, TransferPath::kPinned);
    }

    MutexLock lock(&tally_.mu);
    out["seconds"] = seconds;
    out["transfers"] = tally_.transfers;
    out["bytes"] = tally_.bytes;
    out["gbps"] =
        seconds > 0 ? static_cast<double>(tally_.bytes) / seconds / 1e9 : 0.0;
    out["paths"] = {{"zero_copy", zero_copy},
                    {"staged", staged},
                    {"pinned", pinned},
                    {"d2d", after.transfers.device_to_device.transfers -
                                before.transfers.device_to_device.transfers}};
    out["staging_waits"] =
        after.transfers.staging_waits - before.transfers.staging_waits;
    out["staging_wait_seconds"] =
        static_cast<double>(after.transfers.staging_wait_ns -
                            before.transfers.staging_wait_ns) *
        1e-9;
    out["fallbacks"] = after.transfers.pinned_staging_timeout -
                       before.transfers.pinned_staging_timeout;
    out["over_threshold"] = after.transfers.pinned_over_threshold -
                            before.transfers.pinned_over_threshold;
    out["resource_exhausted"] = tally_.resource_exhausted + pinned_failures_;
    out["failed_transfers"] = tally_.failed;
    out["codes"] = tally_.codes;
    out["first_error"] =
        tally_.first_error.empty() ? Json(nullptr) : Json(tally_.first_error);
    out["peak_call_pinned_bytes"] = peak_call_pinned;
    out["peak_region_bytes_in_use"] = peak_region;
  }

  // The application's buffers go back to the region before the system is
  // destroyed (System's REQUIRES).
  void ReleasePinned() { pinned_.clear(); }

 private:
  void StreamLoop(Stream& s, absl::Time deadline) {
    std::mt19937_64 rng(w_.seed * 1000003 + static_cast<uint64_t>(s.index));
    std::uniform_int_distribution<size_t> pick_direction(
        0, w_.directions.size() - 1);
    std::uniform_real_distribution<double> unit(0, 1);
    const uint64_t threshold = system_.transfer_threshold_bytes();
    while (true) {
      if (w_.count > 0) {
        if (started_.fetch_add(1, std::memory_order_relaxed) >= w_.count)
          return;
      } else if (absl::Now() >= deadline) {
        return;
      }
      const uint64_t n = WholeBlocks(w_.transfer_sizes.Draw(rng));
      const DmaDirection direction = w_.directions[pick_direction(rng)];
      const bool zero_copy = unit(rng) < w_.zero_copy_share;
      void* host = s.host.get();
      if (zero_copy && s.pinned != nullptr && n <= w_.pinned_bytes &&
          n <= threshold) {
        host = s.pinned;
      }
      absl::StatusOr<Event> event;
      switch (direction) {
        case DmaDirection::kHostToDevice:
          event = system_.TransferToDevice(host, s.src, 0, n);
          break;
        case DmaDirection::kDeviceToHost:
          event = system_.TransferFromDevice(s.src, 0, host, n);
          break;
        case DmaDirection::kDeviceToDevice:
          event = system_.TransferDeviceToDevice(s.src, 0, s.dst, 0, n);
          break;
      }
      tally_.Add(event.ok() ? event->Await() : event.status(), n);
    }
  }

  uint64_t WholeBlocks(uint64_t n) const {
    return (n + block_ - 1) / block_ * block_;
  }

  System& system_;
  const Workload& w_;
  uint64_t block_ = 1;  // the largest block_bytes of the devices
  std::vector<PinnedHostBuffer> pinned_;
  uint64_t pinned_failures_ = 0;
  std::vector<Stream> streams_;
  std::atomic<uint64_t> started_{0};
  Tally tally_;
};

Json ErrorJson(const absl::Status& status) {
  return {{"code", absl::StatusCodeToString(status.code())},
          {"message", std::string(status.message())}};
}

void RunTunePoint(const std::string& workload_text, CommandContext& context) {
  const Json parsed =
      Json::parse(workload_text, nullptr, /*allow_exceptions=*/false);
  absl::StatusOr<Workload> w =
      parsed.is_discarded()
          ? absl::InvalidArgumentError("--workload is not valid JSON")
          : WorkloadFromJson(parsed, Workload::Default());
  Json out;
  if (!w.ok()) {
    out = {{"status", "invalid"}, {"error", ErrorJson(w.status())}};
    WriteJson(out, *context.out);
    context.exit_code = kExitUsage;
    return;
  }

  const absl::Time t0 = absl::Now();
  absl::StatusOr<std::unique_ptr<System>> system = System::Create();
  const double startup = absl::ToDoubleSeconds(absl::Now() - t0);
  if (!system.ok()) {
    const bool invalid = absl::IsInvalidArgument(system.status());
    out = {{"status", invalid ? "invalid" : "failed"},
           {"error", ErrorJson(system.status())},
           {"startup_seconds", startup}};
    WriteJson(out, *context.out);
    context.exit_code = invalid ? kExitUsage : kExitFailure;
    return;
  }
  System& s = **system;
  const SystemStats stats = s.GetStats();
  out["status"] = "ok";
  out["startup_seconds"] = startup;
  out["init_seconds"] = absl::ToDoubleSeconds(s.init_time());
  out["region"] = {{"enabled", stats.region.enabled},
                   {"capacity_bytes", stats.region.capacity_bytes},
                   {"threshold_bytes", stats.region.threshold_bytes},
                   {"locked", stats.region.locked},
                   {"page_kind", stats.region.page_kind}};
  // With the region off, the pinned memory the runtime holds is its bounce
  // pool.
  out["bounce_pool_bytes"] = stats.transfers.bounce_pool_locked
                                 ? stats.transfers.bounce_pool_bytes
                                 : 0;
  out["devices"] = s.device_count();

  PointRun run(s, *w);
  if (absl::Status prepared = run.Prepare(out); !prepared.ok()) {
    run.ReleasePinned();
    out["status"] = "failed";
    // Not the setting's fault: the streams' buffers do not fit the device
    // or the host. Say so, keeping the runtime's code and text.
    out["error"] = ErrorJson(absl::Status(
        prepared.code(), absl::StrCat("setting up the workload's streams: ",
                                      prepared.message())));
    WriteJson(out, *context.out);
    context.exit_code = kExitFailure;
    return;
  }
  LOG(INFO) << "tpushim tune-point: running " << WorkloadToJson(*w).dump();
  run.Run(out);
  run.ReleasePinned();
  system->reset();
  WriteJson(out, *context.out);
  context.exit_code = kExitOk;
}

}  // namespace

void RegisterTunePointCommand(CLI::App& app, CommandContext& context) {
  CLI::App* point = app.add_subcommand(
      "tune-point", "One point of a `tpushim tune` sweep (internal)");
  point->group("");  // hidden from `tpushim --help`
  auto workload = std::make_shared<std::string>();
  point->add_option("--workload", *workload, "The workload, as JSON")
      ->required();
  point->callback([workload, &context] {
    // A point dies with the sweep that started it, even one killed with
    // SIGKILL, which cannot stop its children: it holds pinned memory.
    // The sweep waits for it, so a parent already gone is init.
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() == 1) {
      context.exit_code = kExitFailure;
      return;
    }
    RunTunePoint(*workload, context);
  });
}

}  // namespace tpushim::tools
