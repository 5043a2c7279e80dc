// tpushim._tpushim._System: creating and closing a tpushim::System, its
// devices and memories, start-up progress and statistics as plain dicts.
// tpushim/_system.py's System subclasses it and turns keyword options
// into the normalized dict the constructor takes.

#include "python/src/system.h"

#include <Python.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "python/src/common.h"
#include "python/src/events.h"
#include "tpushim/memory.h"
#include "tpushim/options.h"
#include "tpushim/stats.h"

namespace tpushim_py {
namespace {

template <typename T>
T Take(const py::handle& value, const std::string& key) {
  try {
    return value.cast<T>();
  } catch (const py::cast_error&) {
    throw py::type_error(absl::StrCat("System(", key, "=",
                                      py::repr(value).cast<std::string>(),
                                      "): not a ", py::type_id<T>()));
  }
}

template <typename Enum>
Enum Word(const py::handle& value, const std::string& key,
          std::initializer_list<std::pair<const char*, Enum>> words) {
  const std::string word = Take<std::string>(value, key);
  std::string accepted;
  for (const auto& [name, e] : words) {
    if (word == name) return e;
    absl::StrAppend(&accepted, accepted.empty() ? "" : ", ", "'", name, "'");
  }
  throw py::value_error(absl::StrCat("System(", key, "='", word,
                                     "'): accepted values are ", accepted));
}

// The options dict tpushim/_system.py made from the keywords: every key
// an OptionOverrides field, every value of the field's type.
tpushim::OptionOverrides Overrides(const py::dict& options) {
  tpushim::OptionOverrides o;
  for (const auto& [k, v] : options) {
    const std::string key = py::str(k).cast<std::string>();
    if (v.is_none() && key != "numa_node") continue;
    if (key == "premapped_buffer_size") {
      o.premapped_buffer_size = Take<uint64_t>(v, key);
    } else if (key == "premapped_buffer_transfer_threshold_bytes") {
      o.premapped_buffer_transfer_threshold_bytes = Take<uint64_t>(v, key);
    } else if (key == "log_dir") {
      o.log_dir = Take<std::string>(v, key);
    } else if (key == "min_log_level") {
      o.min_log_level = Take<int>(v, key);
    } else if (key == "stderr_log_level") {
      o.stderr_log_level = Take<int>(v, key);
    } else if (key == "vmodule") {
      o.vmodule = Take<std::string>(v, key);
    } else if (key == "max_log_size_mb") {
      o.max_log_size_mb = Take<uint64_t>(v, key);
    } else if (key == "log_keep") {
      o.log_keep = Take<int>(v, key);
    } else if (key == "device") {
      o.device = Take<std::string>(v, key);
    } else if (key == "hugepages") {
      o.hugepages = Word<tpushim::HugePagesMode>(
          v, key,
          {{"auto", tpushim::HugePagesMode::kAuto},
           {"hugetlb", tpushim::HugePagesMode::kHugetlb},
           {"thp", tpushim::HugePagesMode::kThp},
           {"off", tpushim::HugePagesMode::kOff}});
    } else if (key == "prefault_threads") {
      o.prefault_threads = Take<int>(v, key);
    } else if (key == "numa_node") {
      o.numa_node = v.is_none() ? std::optional<int>()
                                : std::optional<int>(Take<int>(v, key));
    } else if (key == "mlock") {
      o.mlock =
          Word<tpushim::MlockMode>(v, key,
                                   {{"on", tpushim::MlockMode::kOn},
                                    {"required", tpushim::MlockMode::kRequired},
                                    {"off", tpushim::MlockMode::kOff}});
    } else if (key == "faults") {
      o.faults = Take<std::string>(v, key);
    } else if (key == "trace_file") {
      o.trace_file = Take<std::string>(v, key);
    } else if (key == "premap") {
      o.premap = Word<tpushim::PremapMode>(
          v, key,
          {{"foreground", tpushim::PremapMode::kForeground},
           {"background", tpushim::PremapMode::kBackground}});
    } else if (key == "dump_on_oom") {
      o.dump_on_oom = Take<bool>(v, key);
    } else if (key == "memory_profile") {
      o.memory_profile = Take<std::string>(v, key);
    } else if (key == "visible_chips") {
      o.visible_chips = Take<std::vector<int>>(v, key);
    } else if (key == "chips_per_process_bounds") {
      o.chips_per_process_bounds = Take<std::vector<int>>(v, key);
    } else if (key == "process_bounds") {
      o.process_bounds = Take<std::vector<int>>(v, key);
    } else if (key == "run_dir") {
      o.run_dir = Take<std::string>(v, key);
    } else {
      throw py::type_error(absl::StrCat(
          "System() got an unexpected keyword argument '", key, "'"));
    }
  }
  return o;
}

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

py::dict PathDict(const tpushim::PathStats& p) {
  py::dict d;
  d["transfers"] = p.transfers;
  d["bytes"] = p.bytes;
  d["failed"] = p.failed;
  d["busy_ns"] = p.busy_ns;
  d["active_ns"] = p.active_ns;
  return d;
}

py::dict StatsDict(const tpushim::SystemStats& s) {
  py::dict region;
  const tpushim::RegionStats& r = s.region;
  region["enabled"] = r.enabled;
  region["capacity_bytes"] = r.capacity_bytes;
  region["threshold_bytes"] = r.threshold_bytes;
  region["bytes_in_use"] = r.bytes_in_use;
  region["peak_bytes_in_use"] = r.peak_bytes_in_use;
  region["free_bytes"] = r.free_bytes;
  region["largest_free_block"] = r.largest_free_block;
  region["fragmentation"] = r.fragmentation;
  region["allocations"] = r.allocations;
  region["frees"] = r.frees;
  region["failures"] = r.failures;
  region["live_allocations"] = r.live_allocations;
  region["page_kind"] = r.page_kind;
  region["page_bytes"] = r.page_bytes;
  region["huge_page_bytes"] = r.huge_page_bytes;
  region["page_kind_asked"] = r.page_kind_asked;
  region["page_description"] = r.page_description;
  region["numa_node"] = r.numa_node;
  region["numa_policy"] = r.numa_policy;
  region["prefault_threads"] = r.prefault_threads;
  region["locked"] = r.locked;
  region["locked_bytes"] = r.locked_bytes;
  region["lock_error"] = r.lock_error;
  region["startup_time_s"] = Seconds(r.startup_time);
  region["background"] = r.background;
  region["ready_bytes"] = r.ready_bytes;
  region["premapped"] = r.premapped;
  region["premap_error"] = r.premap_error;
  region["ready_waits"] = r.ready_waits;
  region["ready_wait_time_s"] = Seconds(r.ready_wait_time);

  const tpushim::TransferStats& t = s.transfers;
  py::dict transfers;
  for (int dir = 0; dir < 2; ++dir) {
    py::dict paths;
    for (int path = 0; path < tpushim::kTransferPathCount; ++path) {
      paths[py::str(std::string(tpushim::TransferPathName(
          static_cast<tpushim::TransferPath>(path))))] =
          PathDict(t.host[dir][path]);
    }
    transfers[py::str(std::string(tpushim::DmaDirectionName(
        static_cast<tpushim::DmaDirection>(dir))))] = paths;
  }
  transfers["d2d"] = PathDict(t.device_to_device);
  transfers["staging_bytes_in_flight"] = t.staging_bytes_in_flight;
  transfers["peak_staging_bytes"] = t.peak_staging_bytes;
  transfers["max_staging_bytes"] = t.max_staging_bytes;
  transfers["staging_waits"] = t.staging_waits;
  transfers["staging_wait_ns"] = t.staging_wait_ns;
  transfers["pinned_over_threshold"] = t.pinned_over_threshold;
  transfers["pinned_region_off"] = t.pinned_region_off;
  transfers["pinned_staging_timeout"] = t.pinned_staging_timeout;
  transfers["pinned_not_premapped"] = t.pinned_not_premapped;
  transfers["staged_misaligned"] = t.staged_misaligned;
  transfers["staged_bounce"] = t.staged_bounce;
  transfers["bounce_pool_bytes"] = t.bounce_pool_bytes;
  transfers["bounce_pool_locked"] = t.bounce_pool_locked;
  transfers["pinned_bytes_now"] = t.pinned_bytes_now;
  transfers["device_buffers_live"] = t.device_buffers_live;
  transfers["device_bytes_live"] = t.device_bytes_live;
  transfers["events_pending"] = t.events_pending;
  transfers["callbacks_run"] = t.callbacks_run;
  transfers["zero_copy_registered_transfers"] = py::make_tuple(
      t.zero_copy_registered_transfers[0], t.zero_copy_registered_transfers[1]);
  transfers["zero_copy_registered_bytes"] = py::make_tuple(
      t.zero_copy_registered_bytes[0], t.zero_copy_registered_bytes[1]);
  transfers["registrations_live"] = t.registrations_live;
  transfers["registered_bytes"] = t.registered_bytes;
  py::list queues;
  for (const tpushim::QueueStats& q : t.queues) {
    py::dict d;
    d["device"] = q.device;
    d["direction"] = std::string(tpushim::DmaDirectionName(q.direction));
    d["submitted"] = q.submitted;
    d["completed"] = q.completed;
    d["failed"] = q.failed;
    d["cancelled"] = q.cancelled;
    d["descriptors"] = q.descriptors;
    d["ring_full"] = q.ring_full;
    d["pending"] = q.pending;
    d["in_flight"] = q.in_flight;
    queues.append(d);
  }
  transfers["queues"] = queues;

  py::list devices;
  for (const tpushim::DeviceStats& ds : s.devices) {
    py::dict d;
    d["id"] = ds.id;
    d["name"] = ds.name;
    d["hbm_bytes"] = ds.hbm_bytes;
    d["hbm_in_use"] = ds.hbm_in_use;
    d["buffers_live"] = ds.buffers_live;
    d["padded_bytes_in_use"] = ds.padded_bytes_in_use;
    d["unpadded_bytes_in_use"] = ds.unpadded_bytes_in_use;
    d["peak_padded_bytes"] = ds.peak_padded_bytes;
    d["peak_unpadded_bytes"] = ds.peak_unpadded_bytes;
    d["hbm_free"] = ds.hbm_free;
    d["largest_free_block"] = ds.largest_free_block;
    d["fragmentation"] = ds.fragmentation;
    d["num_allocs"] = ds.num_allocs;
    d["largest_alloc_size"] = ds.largest_alloc_size;
    devices.append(d);
  }
  py::dict out;
  out["region"] = region;
  out["transfers"] = transfers;
  out["devices"] = devices;
  return out;
}

py::dict MemoryStatsDict(const tpushim::MemoryStats& m) {
  py::dict d;
  d["memory"] = m.memory;
  d["kind"] = std::string(tpushim::MemoryKindName(m.kind));
  d["bytes_in_use"] = m.bytes_in_use;
  d["peak_bytes_in_use"] = m.peak_bytes_in_use;
  d["num_allocs"] = m.num_allocs;
  d["largest_alloc_size"] = m.largest_alloc_size;
  d["bytes_limit"] =
      m.has_bytes_limit ? py::object(py::int_(m.bytes_limit)) : py::none();
  d["largest_free_block_bytes"] = m.largest_free_block_bytes;
  d["buffers_live"] = m.buffers_live;
  return d;
}

py::dict ProgressDict(const tpushim::StartupProgress& p) {
  py::dict d;
  d["phase"] =
      p.phase == tpushim::StartupProgress::Phase::kDone ? "done" : "premapping";
  d["done_bytes"] = p.done_bytes;
  d["total_bytes"] = p.total_bytes;
  d["elapsed_s"] = Seconds(p.elapsed);
  d["complete"] = p.complete();
  return d;
}

}  // namespace

void RegisterSystem(py::module_& m) {
  py::class_<PySystem>(m, "_System", py::dynamic_attr())
      .def(py::init([](const py::dict& options) {
             tpushim::OptionOverrides overrides = Overrides(options);
             absl::StatusOr<std::unique_ptr<tpushim::System>> system;
             {
               GilRelease release;
               system = tpushim::System::Create(overrides);
             }
             ThrowIfError(system.status());
             return PySystem{std::make_shared<Runtime>(*std::move(system))};
           }),
           py::arg("options"))
      .def(
          "close",
          [](PySystem& self) {
            std::shared_ptr<tpushim::System> system = self.runtime->Close();
            GilRelease release;
            system.reset();  // destroys it unless pinned arrays hold it
          },
          "Closes the runtime (idempotent): see tpushim.System.close.")
      .def_property_readonly(
          "closed", [](const PySystem& s) { return s.runtime->closed(); })
      .def("_devices",
           [](const PySystem& self) {
             std::shared_ptr<tpushim::System> s = self.runtime->Use("devices");
             py::list out;
             for (int i = 0; i < s->device_count(); ++i) {
               const tpushim::DeviceDescription& d = s->device(i);
               py::dict e;
               e["id"] = d.id;
               e["name"] = d.name;
               e["kind"] = d.backend;
               e["host_chip"] = d.host_chip;
               e["hbm_bytes"] = d.hbm_bytes;
               e["dma_engines"] = d.dma_engines;
               e["numa_node"] = d.numa_node.has_value()
                                    ? py::object(py::int_(*d.numa_node))
                                    : py::none();
               e["link_gbps"] = d.link_gbps;
               e["latency_us"] = d.latency_us;
               e["block_bytes"] = d.block_bytes;
               out.append(e);
             }
             return out;
           })
      .def("_memories",
           [](const PySystem& self) {
             std::shared_ptr<tpushim::System> s = self.runtime->Use("memories");
             py::list out;
             for (const tpushim::MemoryDescription& md : s->memories()) {
               py::dict e;
               e["id"] = md.id;
               e["kind"] = md.kind_name;
               e["description"] = md.description;
               e["devices"] = md.devices;
               e["capacity_bytes"] = md.capacity_bytes;
               out.append(e);
             }
             return out;
           })
      .def(
          "startup_progress",
          [](const PySystem& self) {
            return ProgressDict(
                self.runtime->Use("startup_progress")->premap_progress());
          },
          "How far premapping the region has come, as a dict: phase "
          "('premapping' or 'done'), done_bytes, total_bytes, elapsed_s, "
          "complete.")
      .def(
          "await_premapped",
          [](const PySystem& self) {
            std::shared_ptr<tpushim::System> s =
                self.runtime->Use("await_premapped");
            absl::Status status;
            {
              GilRelease release;
              status = s->AwaitPremapped();
            }
            ThrowIfError(status);
          },
          "Blocks until the region is premapped (premap='background'); "
          "raises why premapping stopped short.")
      .def_property_readonly("premapped_buffer_size",
                             [](const PySystem& self) {
                               return self.runtime->Use("premapped_buffer_size")
                                   ->premapped_bytes();
                             })
      .def_property_readonly(
          "premapped_buffer_transfer_threshold_bytes",
          [](const PySystem& self) {
            return self.runtime
                ->Use("premapped_buffer_transfer_threshold_bytes")
                ->transfer_threshold_bytes();
          })
      .def_property_readonly(
          "log_directory",
          [](const PySystem& self) {
            return self.runtime->Use("log_directory")->log_directory();
          })
      .def_property_readonly(
          "init_time_s",
          [](const PySystem& self) {
            return Seconds(self.runtime->Use("init_time_s")->init_time());
          })
      .def(
          "stats",
          [](const PySystem& self) {
            std::shared_ptr<tpushim::System> s = self.runtime->Use("stats");
            tpushim::SystemStats stats;
            {
              GilRelease release;
              stats = s->GetStats();
            }
            return StatsDict(stats);
          },
          "A snapshot of the statistics as a dict: region, transfers "
          "(h2d/d2h by path, staging, queues, ...) and devices.")
      .def("_memory_stats",
           [](const PySystem& self, int memory) {
             return MemoryStatsDict(ValueOrThrow(
                 self.runtime->Use("memory_stats")->GetMemoryStats(memory)));
           })
      .def(
          "create_event",
          [](const PySystem& self) {
            return PyCallerEvent{
                std::make_unique<tpushim::CallerEvent>(ValueOrThrow(
                    self.runtime->Use("create_event")->CreateEvent()))};
          },
          "A CallerEvent the program sets itself.");
}

}  // namespace tpushim_py
