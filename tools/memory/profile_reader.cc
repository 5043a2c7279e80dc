#include "tools/memory/profile_reader.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "nlohmann/json.hpp"

namespace tpushim::tools {
namespace {

using Json = nlohmann::json;

absl::Status LineError(size_t line, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("line ", line, ": ", what));
}

// The unsigned integer `key` of `j`, or an error naming it.
absl::StatusOr<uint64_t> Unsigned(const Json& j, const char* key, size_t line) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_unsigned()) {
    if (it != j.end() && it->is_number_integer() && it->get<int64_t>() >= 0) {
      return it->get<uint64_t>();
    }
    return LineError(line,
                     absl::StrCat("\"", key, "\" is missing or not a count"));
  }
  return it->get<uint64_t>();
}

std::string Text(const Json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>()
                                          : std::string();
}

// A buffer's fields of an `alloc` or `failed` record.
absl::StatusOr<ProfiledBuffer> BufferOf(const Json& j, double t, size_t line,
                                        bool with_id) {
  ProfiledBuffer b;
  b.t = t;
  if (with_id) {
    absl::StatusOr<uint64_t> id = Unsigned(j, "id", line);
    if (!id.ok()) return id.status();
    b.id = *id;
  }
  for (auto [key, field] : {std::pair{"device_bytes", &b.device_bytes},
                            std::pair{"padded_bytes", &b.padded_bytes},
                            std::pair{"unpadded_bytes", &b.unpadded_bytes}}) {
    absl::StatusOr<uint64_t> v = Unsigned(j, key, line);
    if (!v.ok()) return v.status();
    *field = *v;
  }
  b.shape = Text(j, "shape");
  b.label = Text(j, "label");
  b.op_metadata = Text(j, "op");
  return b;
}

// An allocation or a free, by the index of its buffer in `allocated`.
struct Event {
  int device = 0;
  bool alloc = false;
  size_t buffer = 0;
};

bool LargerFirst(const ProfiledBuffer& a, const ProfiledBuffer& b) {
  if (a.padded_bytes != b.padded_bytes) return a.padded_bytes > b.padded_bytes;
  return a.id < b.id;
}

}  // namespace

absl::StatusOr<ProfileSummary> ReadMemoryProfile(absl::string_view text) {
  ProfileSummary s;
  std::vector<absl::string_view> lines = absl::StrSplit(text, '\n');
  // Lines as written on another system end in "\r\n"; blank lines (a file
  // ending in '\n' splits into a last empty piece) carry nothing.
  for (absl::string_view& line : lines) absl::ConsumeSuffix(&line, "\r");
  while (!lines.empty() && absl::StripAsciiWhitespace(lines.back()).empty()) {
    lines.pop_back();
  }
  if (lines.empty()) {
    return absl::InvalidArgumentError(
        "the file is empty; TPUSHIM_MEMORY_PROFILE writes a header line "
        "when the runtime starts");
  }
  const bool ends_in_newline = !text.empty() && text.back() == '\n';

  const Json header = Json::parse(lines[0], nullptr, false);
  if (header.is_discarded() || !header.is_object() ||
      !header.contains("tpushim_memory_profile")) {
    return absl::InvalidArgumentError(
        "line 1: not a tpushim memory profile (its first line is not the "
        "header TPUSHIM_MEMORY_PROFILE writes)");
  }
  if (header["tpushim_memory_profile"] != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "line 1: profile format ", header["tpushim_memory_profile"].dump(),
        "; this tool reads format 1"));
  }
  if (header.contains("pid") && header["pid"].is_number_integer()) {
    s.pid = header["pid"].get<int64_t>();
  }
  s.started = Text(header, "started");
  if (!header.contains("devices") || !header["devices"].is_array() ||
      header["devices"].empty()) {
    return LineError(1, "the header lists no devices");
  }
  for (const Json& d : header["devices"]) {
    DeviceMemoryProfile dev;
    if (!d.is_object()) return LineError(1, "a device entry is not an object");
    dev.name = Text(d, "name");
    absl::StatusOr<uint64_t> hbm = Unsigned(d, "hbm_bytes", 1);
    if (!hbm.ok()) return hbm.status();
    dev.hbm_bytes = *hbm;
    absl::StatusOr<uint64_t> granule = Unsigned(d, "granule", 1);
    dev.granule = granule.ok() ? std::max<uint64_t>(1, *granule) : 1;
    s.devices.push_back(std::move(dev));
  }

  // Pass 1: the records, the samples and each device's peak.
  std::vector<ProfiledBuffer> allocated;
  std::vector<std::map<uint64_t, size_t>> live(s.devices.size());  // id ->
  std::vector<Event> events;
  std::vector<size_t> peak_event(s.devices.size(), SIZE_MAX);
  for (size_t i = 1; i < lines.size(); ++i) {
    const size_t line = i + 1;
    const bool last = i + 1 == lines.size();
    if (absl::StripAsciiWhitespace(lines[i]).empty()) continue;
    const Json j = Json::parse(lines[i], nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      if (last && !ends_in_newline) {
        s.cut_short = true;  // the process ended in the middle of the line
        break;
      }
      return LineError(line, "not a JSON object");
    }
    if (s.complete) return LineError(line, "a record after the end record");
    ++s.records;
    if (!j.contains("t") || !j["t"].is_number() ||
        !std::isfinite(j["t"].get<double>()) || j["t"].get<double>() < 0) {
      return LineError(line, "\"t\" is missing or not a time");
    }
    const double t = j["t"].get<double>();
    if (t < s.duration) {
      return LineError(line, "time goes backwards");
    }
    s.duration = t;
    const std::string event = Text(j, "event");
    if (event == "end") {
      s.complete = true;
      continue;
    }
    if (event != "alloc" && event != "free" && event != "failed") {
      return LineError(line, absl::StrCat("unknown event \"", event, "\""));
    }
    if (!j.contains("device") || !j["device"].is_number_integer() ||
        j["device"].get<int64_t>() < 0 ||
        j["device"].get<int64_t>() >= static_cast<int64_t>(s.devices.size())) {
      return LineError(
          line, absl::StrCat("\"device\" is not one of the ", s.devices.size(),
                             " devices the header lists"));
    }
    const int d = j["device"].get<int>();
    DeviceMemoryProfile& dev = s.devices[d];
    MemorySample now =
        dev.samples.empty() ? MemorySample{} : dev.samples.back();
    now.t = t;
    if (event == "failed") {
      absl::StatusOr<ProfiledBuffer> b = BufferOf(j, t, line, false);
      if (!b.ok()) return b.status();
      dev.failed.push_back(*std::move(b));
      continue;
    }
    if (event == "alloc") {
      absl::StatusOr<ProfiledBuffer> b = BufferOf(j, t, line, true);
      if (!b.ok()) return b.status();
      const uint64_t id = b->id;
      if (b->padded_bytes > UINT64_MAX - now.padded_bytes ||
          b->unpadded_bytes > UINT64_MAX - now.unpadded_bytes) {
        return LineError(line, "the bytes in use would pass 2^64");
      }
      now.padded_bytes += b->padded_bytes;
      now.unpadded_bytes += b->unpadded_bytes;
      ++now.buffers;
      if (!live[d].emplace(id, allocated.size()).second) {
        return LineError(line, absl::StrCat("id ", id, " is allocated twice"));
      }
      allocated.push_back(*std::move(b));
      ++dev.allocations;
      events.push_back(
          {.device = d, .alloc = true, .buffer = allocated.size() - 1});
    } else {
      absl::StatusOr<uint64_t> id = Unsigned(j, "id", line);
      if (!id.ok()) return id.status();
      auto it = live[d].find(*id);
      if (it == live[d].end()) {
        return LineError(line, absl::StrCat("free of id ", *id,
                                            ", which no allocation before it "
                                            "on that device has"));
      }
      const ProfiledBuffer& b = allocated[it->second];
      now.padded_bytes -= b.padded_bytes;
      now.unpadded_bytes -= b.unpadded_bytes;
      --now.buffers;
      events.push_back({.device = d, .alloc = false, .buffer = it->second});
      live[d].erase(it);
      ++dev.frees;
    }
    dev.samples.push_back(now);
    dev.max_unpadded_bytes =
        std::max(dev.max_unpadded_bytes, now.unpadded_bytes);
    if (now.padded_bytes > dev.peak_padded_bytes) {
      dev.peak_padded_bytes = now.padded_bytes;
      dev.peak_unpadded_bytes = now.unpadded_bytes;
      dev.peak_t = t;
      peak_event[d] = events.size() - 1;
    }
  }
  for (DeviceMemoryProfile& dev : s.devices) {
    if (!dev.samples.empty()) dev.end = dev.samples.back();
    dev.end.t = s.duration;
  }

  // Pass 2: replay to each device's peak for what it held then.
  std::vector<std::map<uint64_t, size_t>> replay(s.devices.size());
  for (size_t e = 0; e < events.size(); ++e) {
    const Event& ev = events[e];
    const uint64_t id = allocated[ev.buffer].id;
    if (ev.alloc) {
      replay[ev.device][id] = ev.buffer;
    } else {
      replay[ev.device].erase(id);
    }
    if (peak_event[ev.device] == e) {
      DeviceMemoryProfile& dev = s.devices[ev.device];
      for (const auto& [unused, index] : replay[ev.device]) {
        dev.at_peak.push_back(allocated[index]);
      }
      std::sort(dev.at_peak.begin(), dev.at_peak.end(), LargerFirst);
    }
  }
  return s;
}

}  // namespace tpushim::tools
