#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "fuzz/capi_sequence_internal.h"
#include "fuzz/fuzz_check.h"
#include "tpushim/c_api.h"

namespace tpushim::fuzz::capi_sequence_internal {
namespace {

constexpr size_t kMaxLiveSystems = 2;
// Chips per System at most; live System i owns host chips from
// i * kChipsPerSlot.
constexpr int kChipsPerSlot = 3;

}  // namespace

// ---- Systems and buffers ----

void Program::CreateSystem() {
  static constexpr uint64_t kRegions[] = {0, kMiB, 2 * kMiB, 4 * kMiB};
  static constexpr uint64_t kThresholds[] = {0, 16 * kKiB, 64 * kKiB, 8 * kMiB};
  static constexpr uint64_t kHbm[] = {kMiB, 2 * kMiB, 4 * kMiB, 8 * kMiB};
  static constexpr const char* kLinks[] = {"", "&link_gbps=8", "&latency_us=20",
                                           "&dma_engines=2"};
  SystemModel model;
  model.region = kRegions[in_.Below(4)];
  const uint64_t threshold = kThresholds[in_.Below(4)];
  const uint8_t devices = in_.Byte();
  model.devices = 1 + devices % 3;
  model.hbm = kHbm[devices / 3 % 4];
  const char* link = kLinks[in_.Below(4)];
  const uint8_t fault = in_.Byte();
  std::string faults;
  if (fault % 16 >= 8) {
    const unsigned p = in_.Byte();
    const std::string specs[] = {
        absl::StrCat("dma:rate=0.25,seed=", p),
        absl::StrCat("dma:nth=", 1 + p % 8, ",code=UNAVAILABLE"),
        absl::StrCat("pin:every=", 1 + p % 3),
        absl::StrCat("alloc:rate=0.3,seed=", p),
        absl::StrCat("alloc:nth=", 1 + p % 4, ",code=INTERNAL"),
        absl::StrCat("mmap:nth=", 1 + p % 3),
        "mlock:nth=1;madvise:every=2",
        "numa:nth=1",
    };
    faults = specs[fault % 8];
  }
  const uint8_t bad = in_.Byte();
  if (systems_alive_ >= kMaxLiveSystems) return;

  model.threshold = model.region == 0 ? 0
                    : threshold == 0  ? model.region
                                      : std::min(threshold, model.region);
  model.faults = !faults.empty();
  // The first chip slot no live System owns.
  for (int slot = 0; slot < static_cast<int>(kMaxLiveSystems); ++slot) {
    bool taken = false;
    for (const auto& [other, m] : systems_) {
      if (IsLive(other, Kind::kSystem) && m.chip_slot == slot) taken = true;
    }
    if (!taken) {
      model.chip_slot = slot;
      break;
    }
  }
  std::vector<std::string> chip_list;
  for (int d = 0; d < model.devices; ++d) {
    chip_list.push_back(absl::StrCat(model.chip_slot * kChipsPerSlot + d));
  }
  const std::string chips = absl::StrJoin(chip_list, ",");
  const std::string device =
      absl::StrCat("sim://?devices=", kMaxLiveSystems * kChipsPerSlot,
                   "&hbm=", model.hbm / kMiB, "M", link);
  std::vector<std::pair<std::string, const char*>> options;
  const std::string region = absl::StrCat(model.region);
  const std::string threshold_text = absl::StrCat(threshold);
  options.emplace_back("TPU_PREMAPPED_BUFFER_SIZE", region.c_str());
  if (threshold != 0) {
    options.emplace_back("TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES",
                         threshold_text.c_str());
  }
  options.emplace_back("TPUSHIM_DEVICE", device.c_str());
  options.emplace_back("TPU_VISIBLE_CHIPS", chips.c_str());
  options.emplace_back("TPUSHIM_PREFAULT_THREADS", "1");
  options.emplace_back("TPUSHIM_HUGEPAGES", "off");
  if (!faults.empty()) options.emplace_back("TPUSHIM_FAULTS", faults.c_str());
  // A malformed option, named in the error.
  std::string bad_name;
  if (bad % 8 == 6) {
    bad_name = "TPU_LOG_DIR";
    options.emplace_back(bad_name, nullptr);
  } else if (bad % 8 == 7) {
    static constexpr std::pair<const char*, const char*> kBad[] = {
        {"TPU_PREMAPPED_BUFFER_SIZE", "4097"},
        {"TPUSHIM_DEVICE", "sim://?devices=0"},
        {"TPUSHIM_NO_SUCH_OPTION", "1"},
    };
    const auto& [name, value] = kBad[bad / 8 % 3];
    bad_name = name;
    options.emplace_back(bad_name, value);
  }
  std::vector<TpuShim_Option> c_options;
  for (const auto& [name, value] : options) {
    c_options.push_back(TpuShim_Option{name.c_str(), value});
  }
  TpuShim_System_Create_Args args = {};
  args.struct_size = TPUSHIM_SYSTEM_CREATE_ARGS_STRUCT_SIZE;
  args.options = c_options.data();
  args.num_options = c_options.size();
  const Result r = Take(api->System_Create(&args));
  if (!bad_name.empty()) {
    TPUSHIM_FUZZ_CHECK(r.code == TPUSHIM_CODE_INVALID_ARGUMENT &&
                       absl::StrContains(r.message, bad_name))
        << "System_Create with a bad " << bad_name << ": " << r;
    return;
  }
  if (!model.faults) {
    TPUSHIM_FUZZ_CHECK(r.ok()) << "System_Create " << device << ": " << r;
  }
  if (!r.ok()) return;
  const uint64_t id = args.system.id;
  AddHandle(id, Kind::kSystem, id);
  systems_[id] = model;
  ++systems_alive_;
  CheckDevices(id, model);
}

// The devices are the ones the URL asked for.
void Program::CheckDevices(uint64_t id, const SystemModel& model) {
  TpuShim_System_GetDeviceCount_Args count = {};
  count.struct_size = TPUSHIM_SYSTEM_GETDEVICECOUNT_ARGS_STRUCT_SIZE;
  count.system.id = id;
  const Result r = Take(api->System_GetDeviceCount(&count));
  TPUSHIM_FUZZ_CHECK(r.ok() && count.device_count == model.devices)
      << r << ", " << count.device_count << " devices";
  for (int d = 0; d < model.devices; ++d) {
    TpuShim_System_GetDeviceInfo_Args info = {};
    info.struct_size = TPUSHIM_SYSTEM_GETDEVICEINFO_ARGS_STRUCT_SIZE;
    info.system.id = id;
    info.device = d;
    const Result i = Take(api->System_GetDeviceInfo(&info));
    TPUSHIM_FUZZ_CHECK(i.ok() && info.hbm_bytes == model.hbm &&
                       info.name != nullptr && info.backend != nullptr)
        << i;
  }
}

void Program::DestroySystem(uint64_t id) {
  const bool valid = IsLive(id, Kind::kSystem);
  if (valid) {
    // Other systems' transfers from or to this one's host buffers: their
    // memory goes with it, so they must be done (a caller's duty).
    for (auto& [buffer_id, buffer] : host_buffers_) {
      if (buffer.system != id) continue;
      const std::vector<Operation*> users = buffer.users;
      for (Operation* op : users) {
        if (op->system != id) Settle(op);
      }
    }
    for (const auto& op : operations_) {
      if (op->system == id && !op->done.HasBeenNotified()) {
        op->cut_short = true;
      }
    }
  }
  TpuShim_System_Destroy_Args args = {};
  args.struct_size = TPUSHIM_SYSTEM_DESTROY_ARGS_STRUCT_SIZE;
  args.system.id = id;
  const Result r = Take(api->System_Destroy(&args));
  if (!valid) return CheckRejected("System_Destroy", r, {.bad_handle = true});
  TPUSHIM_FUZZ_CHECK(r.ok()) << "System_Destroy: " << r;
  --systems_alive_;
  // Every operation and callback of the system has finished.
  for (const auto& op : operations_) {
    if (op->system != id) continue;
    TPUSHIM_FUZZ_CHECK(op->done.HasBeenNotified())
        << "event 0x" << std::hex << op->event
        << " not done when System_Destroy returned";
  }
  for (const auto& record : callbacks_) {
    if (record->added && record->system == id) {
      TPUSHIM_FUZZ_CHECK(record->runs.load() == 1)
          << "a callback ran " << record->runs.load()
          << " times by the end of System_Destroy";
    }
  }
  // Its buffers' handles are stale; its host buffers' memory is gone.
  for (auto& [handle_id, handle] : handles_) {
    if (handle.system == id && handle.kind != Kind::kEvent) {
      handle.live = false;
    }
  }
  for (auto it = host_buffers_.begin(); it != host_buffers_.end();) {
    if (it->second.system != id) {
      ++it;
      continue;
    }
    for (Operation* op : it->second.users) op->host_gone = true;
    it = host_buffers_.erase(it);
  }
  for (auto it = device_buffers_.begin(); it != device_buffers_.end();) {
    it = it->second.system == id ? device_buffers_.erase(it) : std::next(it);
  }
  ReapDone();
}

void Program::AllocateHost() {
  static constexpr uint64_t kSizes[] = {
      0, 1, 64, 1000, 4 * kKiB, 64 * kKiB + 3, 512 * kKiB, 8 * kMiB};
  static constexpr size_t kAlignments[] = {0, 1, 2, 64, 4096, 8192, 3, 48};
  const uint64_t system_id = PickHandle(Kind::kSystem);
  const uint64_t size = kSizes[in_.Below(8)];
  const size_t alignment = kAlignments[in_.Below(8)];
  TpuShim_HostBuffer_Allocate_Args args = {};
  args.struct_size = TPUSHIM_HOSTBUFFER_ALLOCATE_ARGS_STRUCT_SIZE;
  args.system.id = system_id;
  args.size = size;
  args.alignment = alignment;
  const Result r = Take(api->HostBuffer_Allocate(&args));
  const SystemModel* system = LiveSystem(system_id);
  if (system == nullptr) {
    return CheckRejected("HostBuffer_Allocate", r, {.bad_handle = true});
  }
  if (system->region == 0) {
    TPUSHIM_FUZZ_CHECK(r.code == TPUSHIM_CODE_FAILED_PRECONDITION) << r;
    return;
  }
  const bool bad_alignment =
      alignment != 0 &&
      ((alignment & (alignment - 1)) != 0 || alignment > 4096);
  if (size == 0 || bad_alignment) {
    return CheckRejected("HostBuffer_Allocate", r, {.bad_argument = true});
  }
  if (size > system->threshold) {
    TPUSHIM_FUZZ_CHECK(
        r.code == TPUSHIM_CODE_RESOURCE_EXHAUSTED &&
        absl::StrContains(r.message,
                          "TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES"))
        << r;
    return;
  }
  uint64_t in_use = 0;
  for (const auto& [id, buffer] : host_buffers_) {
    if (buffer.system == system_id) in_use += buffer.size;
  }
  if (!r.ok()) {
    if (system->faults) return;
    TPUSHIM_FUZZ_CHECK(r.code == TPUSHIM_CODE_RESOURCE_EXHAUSTED &&
                       absl::StrContains(r.message,
                                         "That was not possible. "
                                         "There are "))
        << r;
    return;
  }
  TPUSHIM_FUZZ_CHECK(in_use + size <= system->region)
      << "a region of " << system->region << " bytes gave " << size
      << " more with " << in_use << " in use";
  const uintptr_t address = reinterpret_cast<uintptr_t>(args.data);
  TPUSHIM_FUZZ_CHECK(args.data != nullptr &&
                     address % std::max<size_t>(alignment, 64) == 0)
      << args.data << " for alignment " << alignment;
  for (const auto& [id, buffer] : host_buffers_) {
    if (buffer.system != system_id) continue;
    TPUSHIM_FUZZ_CHECK(!Overlap(
        address, size, reinterpret_cast<uintptr_t>(buffer.data), buffer.size))
        << "two live host buffers overlap";
  }
  // All of it is the caller's.
  std::memset(args.data, 0, size);
  AddHandle(args.buffer.id, Kind::kHostBuffer, system_id);
  host_buffers_[args.buffer.id] =
      HostBufferModel{system_id, static_cast<uint8_t*>(args.data), size, {}};
}

void Program::FreeHost() {
  const uint64_t system_id = PickHandle(Kind::kSystem);
  const uint64_t id = PickHandle(Kind::kHostBuffer);
  const Verdict verdict{.bad_handle =
                            !IsLive(system_id, Kind::kSystem) ||
                            !IsLiveIn(id, Kind::kHostBuffer, system_id)};
  // No transfer may still use the memory (HostBuffer_Free's REQUIRES).
  if (!verdict.invalid()) SettleHostBuffer(id);
  TpuShim_HostBuffer_Free_Args args = {};
  args.struct_size = TPUSHIM_HOSTBUFFER_FREE_ARGS_STRUCT_SIZE;
  args.system.id = system_id;
  args.buffer.id = id;
  const Result r = Take(api->HostBuffer_Free(&args));
  if (verdict.invalid()) return CheckRejected("HostBuffer_Free", r, verdict);
  TPUSHIM_FUZZ_CHECK(r.ok()) << "HostBuffer_Free: " << r;
  handles_.at(id).live = false;
  host_buffers_.erase(id);
}

void Program::AllocateDevice() {
  static constexpr uint64_t kSizes[] = {
      0, 1, 100, 4 * kKiB, 64 * kKiB + 7, 256 * kKiB, kMiB, kHuge};
  const uint64_t system_id = PickHandle(Kind::kSystem);
  const int device = static_cast<int>(in_.Below(4)) - 1;  // -1 .. 2
  uint64_t size = kSizes[in_.Below(8)];
  const SystemModel* system = LiveSystem(system_id);
  // The last size is one byte more than the device has.
  if (size == kHuge && system != nullptr) size = system->hbm + 1;
  TpuShim_DeviceBuffer_Allocate_Args args = {};
  args.struct_size = TPUSHIM_DEVICEBUFFER_ALLOCATE_ARGS_STRUCT_SIZE;
  args.system.id = system_id;
  args.device = device;
  args.size = size;
  const Result r = Take(api->DeviceBuffer_Allocate(&args));
  if (system == nullptr) {
    return CheckRejected("DeviceBuffer_Allocate", r, {.bad_handle = true});
  }
  if (device < 0 || device >= system->devices || size == 0) {
    return CheckRejected("DeviceBuffer_Allocate", r, {.bad_argument = true});
  }
  uint64_t in_use = 0;
  for (const auto& [id, buffer] : device_buffers_) {
    if (buffer.system == system_id && buffer.device == device) {
      in_use += buffer.size;
    }
  }
  if (!r.ok()) {
    // XLA's line, then XLA's HBM report naming the request.
    const absl::string_view message = r.message;
    const size_t newline = message.find('\n');
    const absl::string_view first = message.substr(0, newline);
    TPUSHIM_FUZZ_CHECK(
        r.code == TPUSHIM_CODE_RESOURCE_EXHAUSTED &&
        absl::StartsWith(first,
                         "Error allocating device buffer: Attempting to "
                         "allocate ") &&
        absl::StrContains(first, "That was not possible. There are ") &&
        absl::EndsWith(first, "_HBM0)") && newline != absl::string_view::npos &&
        absl::StartsWith(message.substr(newline + 1),
                         "Ran out of memory in memory space hbm. ") &&
        absl::StrContains(message, "Allocation type: failed request"))
        << r;
    return;
  }
  TPUSHIM_FUZZ_CHECK(in_use + size <= system->hbm)
      << "device memory overcommitted: " << in_use << " + " << size
      << " bytes on a device of " << system->hbm;
  AddHandle(args.buffer.id, Kind::kDeviceBuffer, system_id);
  DeviceBufferModel& model = device_buffers_[args.buffer.id];
  model.system = system_id;
  model.device = device;
  model.size = size;
  model.bytes.resize(size);
  model.known.resize(size, false);
}

void Program::Deallocate() {
  const uint64_t system_id = PickHandle(Kind::kSystem);
  const uint64_t id = PickHandle(Kind::kDeviceBuffer);
  const bool system_ok = IsLive(system_id, Kind::kSystem);
  const WaitList wait = PickWaitList(system_id);
  const Verdict verdict{
      .bad_handle = !system_ok ||
                    !IsLiveIn(id, Kind::kDeviceBuffer, system_id) ||
                    wait.bad_handle,
      .bad_argument = wait.null_pointer};
  TpuShim_DeviceBuffer_Deallocate_Args args = {};
  args.struct_size = TPUSHIM_DEVICEBUFFER_DEALLOCATE_ARGS_STRUCT_SIZE;
  args.system.id = system_id;
  args.buffer.id = id;
  args.wait_for = wait.data();
  args.num_wait_for = wait.events.size();
  const Result r = Take(api->DeviceBuffer_Deallocate(&args));
  if (verdict.invalid()) {
    return CheckRejected("DeviceBuffer_Deallocate", r, verdict);
  }
  TPUSHIM_FUZZ_CHECK(r.ok()) << "DeviceBuffer_Deallocate: " << r;
  handles_.at(id).live = false;
  device_buffers_.erase(id);
  auto op = std::make_unique<Operation>();
  op->kind = OpKind::kDeallocate;
  op->system = system_id;
  op->deps = wait.deps;
  Track(std::move(op), args.event.id);
}

// ---- Queries ----

void Program::Query() {
  const uint64_t system_id = PickHandle(Kind::kSystem);
  const int device = static_cast<int>(in_.Below(4)) - 1;  // -1 .. 2
  const uint8_t stats_choice = in_.Byte() % 4;
  SystemModel* system = LiveSystem(system_id);

  TpuShim_System_GetDeviceInfo_Args info = {};
  info.struct_size = TPUSHIM_SYSTEM_GETDEVICEINFO_ARGS_STRUCT_SIZE;
  info.system.id = system_id;
  info.device = device;
  const Result i = Take(api->System_GetDeviceInfo(&info));
  if (system == nullptr) {
    CheckRejected("System_GetDeviceInfo", i, {.bad_handle = true});
  } else if (device < 0 || device >= system->devices) {
    CheckRejected("System_GetDeviceInfo", i, {.bad_argument = true});
  } else {
    TPUSHIM_FUZZ_CHECK(i.ok() && info.hbm_bytes == system->hbm) << i;
  }

  TpuShim_Stats stats = {};
  // The last choice is a stats struct older than API 1.0 allows.
  stats.struct_size = TPUSHIM_STATS_STRUCT_SIZE - (stats_choice == 3 ? 1 : 0);
  TpuShim_System_GetStats_Args args = {};
  args.struct_size = TPUSHIM_SYSTEM_GETSTATS_ARGS_STRUCT_SIZE;
  args.system.id = system_id;
  args.stats = &stats;
  const Result r = Take(api->System_GetStats(&args));
  const Verdict verdict{.bad_handle = system == nullptr,
                        .bad_argument = stats_choice == 3};
  if (verdict.invalid()) return CheckRejected("System_GetStats", r, verdict);
  TPUSHIM_FUZZ_CHECK(r.ok()) << "System_GetStats: " << r;
  CheckStats(system_id, *system, stats);
}

void Program::CheckStats(uint64_t id, SystemModel& system,
                         const TpuShim_Stats& s) {
  TPUSHIM_FUZZ_CHECK(s.region_enabled == (system.region != 0 ? 1 : 0));
  if (system.region != 0) {
    TPUSHIM_FUZZ_CHECK(s.region_capacity_bytes == system.region &&
                       s.region_threshold_bytes == system.threshold)
        << s.region_capacity_bytes << " " << s.region_threshold_bytes;
  }
  TPUSHIM_FUZZ_CHECK(s.region_bytes_in_use <= s.region_capacity_bytes &&
                     s.region_free_bytes <= s.region_capacity_bytes &&
                     s.region_largest_free_block <= s.region_free_bytes &&
                     s.region_peak_bytes_in_use >= s.region_bytes_in_use);
  uint64_t host_buffers = 0, host_bytes = 0;
  for (const auto& [buffer_id, buffer] : host_buffers_) {
    if (buffer.system != id) continue;
    ++host_buffers;
    host_bytes += buffer.size;
  }
  TPUSHIM_FUZZ_CHECK(s.region_live_allocations >= host_buffers &&
                     s.region_bytes_in_use >= host_bytes)
      << s.region_live_allocations << " allocations of "
      << s.region_bytes_in_use << " bytes for " << host_buffers
      << " host buffers of " << host_bytes;
  uint64_t device_buffers = 0, device_bytes = 0;
  for (const auto& [buffer_id, buffer] : device_buffers_) {
    if (buffer.system != id) continue;
    ++device_buffers;
    device_bytes += buffer.size;
  }
  TPUSHIM_FUZZ_CHECK(s.device_buffers_live >= device_buffers &&
                     s.device_bytes_live >= device_bytes)
      << s.device_buffers_live << " device buffers of " << s.device_bytes_live
      << " bytes for " << device_buffers << " of " << device_bytes;
  TPUSHIM_FUZZ_CHECK(s.callbacks_run >= system.last_callbacks_run);
  system.last_callbacks_run = s.callbacks_run;
}

}  // namespace tpushim::fuzz::capi_sequence_internal
