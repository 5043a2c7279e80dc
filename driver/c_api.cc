// The C ABI (include/tpushim/c_api.h) over tpushim::System. Each function
// does the same three things: check the args struct and the handles, call
// the C++ API, convert the Status into a TpuShim_Error*.
//
// Handles are ids into process-wide tables, one per kind:
//
//   bits 63..56  kind tag ('S' system, 'H' host buffer, 'D' device buffer,
//                'E' event) — a handle of the wrong kind is recognized
//   bits 55..32  slot index
//   bits 31..0   the slot's generation (never 0), bumped when the slot is
//                freed — a stale or doubly-freed handle is recognized; a
//                slot freed at the last generation retires instead of
//                wrapping, so no id is ever issued twice
//
// so every id the caller can make up is either live or INVALID_ARGUMENT.
// Entries hold the C++ objects (shared handles) and the id of the system
// they belong to; calls copy what they need out under the table's lock and
// call C++ without it.
//
// A system entry counts the calls running on it. System_Destroy takes the
// system out of its table, marks it closing (new calls on it fail as
// stale), stops premapping behind the caller (so that a HostBuffer_Allocate
// waiting for it returns), waits for the running calls to return, frees its
// host buffers,
// drops its device buffers and destroys the System (which cancels what
// has not started and runs the pending callbacks — those that call back
// into the system find it closing instead of deadlocking). A callback
// cannot destroy any system (FAILED_PRECONDITION): the destroy's wait for
// that system's callbacks could close a cycle of waits.
//
// Versioning: 1.0 is the first version, so every field of every args
// struct lies within the 1.0 size that CheckArgs requires. A field
// appended in 1.x must be read (or written) only when
// `args->struct_size >= TPUSHIM_STRUCT_SIZE(<type>, <field>)`, and take its
// default otherwise.
//
// Thread-safety: every function is thread-safe; no table or system lock is
// held while calling into the C++ API or a user callback.

#include "tpushim/c_api.h"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "common/status_macros.h"
#include "driver/c_api_internal.h"
#include "driver/c_api_support.h"
#include "driver/system_internal.h"
#include "env/options.h"
#include "tpushim/chips.h"
#include "tpushim/system.h"

namespace tpushim {
namespace {

using namespace capi_internal;  // NOLINT: the ABI's shared pieces

// ---- Errors (the table) -----------------------------------------------------

void ErrorDestroy(TpuShim_Error* error) {
  if (error != kOutOfMemoryError) delete error;
}

int ErrorCode(const TpuShim_Error* error) {
  return error == nullptr ? TPUSHIM_CODE_OK
                          : static_cast<int>(error->status.code());
}

const char* ErrorMessage(const TpuShim_Error* error) {
  return error == nullptr ? "" : error->message.c_str();
}

// ---- System -----------------------------------------------------------------

TpuShim_Error* SystemCreate(TpuShim_System_Create_Args* args) {
  return Guard([&]() -> absl::Status {
    TPUSHIM_CHECK_ARGS(args, "System_Create",
                       TPUSHIM_SYSTEM_CREATE_ARGS_STRUCT_SIZE);
    if (args->options == nullptr && args->num_options > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "System_Create: args->options is NULL and num_options is ",
          args->num_options));
    }
    OptionOverrides overrides;
    for (size_t i = 0; i < args->num_options; ++i) {
      const TpuShim_Option& option = args->options[i];
      if (option.name == nullptr || option.value == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            "System_Create: options[", i, "].",
            option.name == nullptr ? "name" : "value", " is NULL",
            option.name == nullptr ? ""
                                   : absl::StrCat(" (", option.name, ")")));
      }
      TPUSHIM_RETURN_IF_ERROR(
          SetOptionOverride(overrides, option.name, option.value));
    }
    // 1.1: the progress callback, when the caller's struct has it.
    StartupProgressCallback progress = nullptr;
    if (args->struct_size >= TPUSHIM_STRUCT_SIZE(TpuShim_System_Create_Args,
                                                 progress_user_data) &&
        args->progress != nullptr) {
      progress = [fn = args->progress, user_data = args->progress_user_data](
                     const StartupProgress& p) {
        TpuShim_StartupProgress c{};
        c.struct_size = sizeof(c);
        c.phase = p.phase == StartupProgress::Phase::kDone ? 1 : 0;
        c.done_bytes = p.done_bytes;
        c.total_bytes = p.total_bytes;
        c.elapsed_seconds = absl::ToDoubleSeconds(p.elapsed);
        fn(&c, user_data);
      };
    }
    // 1.4: calls after System_Create returns only when asked for; an older
    // caller's struct ends before the field and keeps 1.1's promise (calls
    // during System_Create only).
    const StartupProgressUntil until =
        args->struct_size >= TPUSHIM_STRUCT_SIZE(TpuShim_System_Create_Args,
                                                 progress_after_create) &&
                args->progress_after_create != 0
            ? StartupProgressUntil::kPremapped
            : StartupProgressUntil::kCreateReturns;
    Os* os = test_os.load(std::memory_order_acquire);
    TPUSHIM_ASSIGN_OR_RETURN(
        std::unique_ptr<System> system,
        SystemFactory::Create(overrides, os != nullptr ? os : Os::Default(),
                              nullptr, std::move(progress), until));
    auto entry = std::make_shared<SystemEntry>(std::move(system));
    TPUSHIM_ASSIGN_OR_RETURN(args->system.id,
                             tables().systems.Insert(std::move(entry)));
    return absl::OkStatus();
  });
}

TpuShim_Error* SystemDestroy(TpuShim_System_Destroy_Args* args) {
  return Guard([&]() -> absl::Status {
    TPUSHIM_CHECK_ARGS(args, "System_Destroy",
                       TPUSHIM_SYSTEM_DESTROY_ARGS_STRUCT_SIZE);
    const uint64_t id = args->system.id;
    // Destroying a system waits for its callbacks to finish. From its own
    // callback that waits for itself; from another system's, it can wait
    // forever too: two systems destroying each other from their callbacks
    // each wait for the other's callback. So no callback destroys a
    // system, whichever.
    if (tls_callback_system != 0) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "System_Destroy: called from a callback running on the callback "
          "thread of %s (TpuShim_System 0x%016x); destroying a system waits "
          "for its callbacks to finish, so %s. Nothing was destroyed: "
          "destroy systems from a thread that is not a callback thread "
          "(for example one the callback signals)",
          tls_callback_system == id ? "this very system" : "another system",
          tls_callback_system,
          tls_callback_system == id
              ? "it would wait for this callback, which waits for it"
              : "two systems destroying each other from their callbacks "
                "would wait for each other forever"));
    }
    TPUSHIM_ASSIGN_OR_RETURN(
        std::shared_ptr<SystemEntry> entry,
        tables().systems.Take(id, [](const std::shared_ptr<SystemEntry>&) {
          return absl::OkStatus();
        }));
    {
      MutexLock lock(&entry->mu);
      entry->closing = true;
    }
    // Premapping behind the caller stops first: a HostBuffer_Allocate
    // waiting for it returns (CANCELLED) instead of holding this up.
    SystemFactory::StopPremapping(*entry->system);
    if (!ForkedChildOf(entry->pid)) {
      MutexLock lock(&entry->mu);
      while (entry->active > 0) entry->idle.Wait(&entry->mu);
    }
    // Host buffers first: their memory is part of the region.
    for (const auto& host : tables().host_buffers.TakeAll(
             [id](const std::shared_ptr<HostBufferEntry>& e) {
               return e->system_id == id;
             })) {
      host->buffer.Reset();
    }
    (void)tables().device_buffers.TakeAll(
        [id](const DeviceBufferEntry& e) { return e.system_id == id; });
    (void)tables().memory_buffers.TakeAll(
        [id](const MemoryBufferEntry& e) { return e.system_id == id; });
    // Host memory registrations left: the system releases them (one
    // WARNING); their handles go stale.
    std::vector<std::shared_ptr<HostRegistrationEntry>> registrations =
        tables().host_registrations.TakeAll(
            [id](const std::shared_ptr<HostRegistrationEntry>& e) {
              return e->system_id == id;
            });
    entry->system.reset();
    registrations.clear();
    return absl::OkStatus();
  });
}

TpuShim_Error* SystemGetDeviceCount(TpuShim_System_GetDeviceCount_Args* args) {
  return Guard([&]() -> absl::Status {
    TPUSHIM_CHECK_ARGS(args, "System_GetDeviceCount",
                       TPUSHIM_SYSTEM_GETDEVICECOUNT_ARGS_STRUCT_SIZE);
    TPUSHIM_ASSIGN_OR_RETURN(SystemCall call, SystemCall::Enter(args->system));
    args->device_count = call.system().device_count();
    return absl::OkStatus();
  });
}

TpuShim_Error* SystemGetDeviceInfo(TpuShim_System_GetDeviceInfo_Args* args) {
  return Guard([&]() -> absl::Status {
    TPUSHIM_CHECK_ARGS(args, "System_GetDeviceInfo",
                       TPUSHIM_SYSTEM_GETDEVICEINFO_ARGS_STRUCT_SIZE);
    TPUSHIM_ASSIGN_OR_RETURN(SystemCall call, SystemCall::Enter(args->system));
    const int count = call.system().device_count();
    if (args->device < 0 || args->device >= count) {
      return absl::InvalidArgumentError(
          absl::StrCat("System_GetDeviceInfo: device ", args->device,
                       " does not exist (devices 0..", count - 1, ")"));
    }
    // The System keeps its descriptions until it is destroyed.
    const DeviceDescription& d = call.system().device(args->device);
    args->name = d.name.c_str();
    args->backend = d.backend.c_str();
    args->hbm_bytes = d.hbm_bytes;
    args->dma_engines = d.dma_engines;
    args->numa_node = d.numa_node.value_or(-1);
    args->link_gbps = d.link_gbps;
    args->latency_us = d.latency_us;
    return absl::OkStatus();
  });
}

TpuShim_Error* SystemGetStats(TpuShim_System_GetStats_Args* args) {
  return Guard([&]() -> absl::Status {
    TPUSHIM_CHECK_ARGS(args, "System_GetStats",
                       TPUSHIM_SYSTEM_GETSTATS_ARGS_STRUCT_SIZE);
    TpuShim_Stats* out = args->stats;
    if (out == nullptr) {
      return absl::InvalidArgumentError("System_GetStats: args->stats is NULL");
    }
    if (out->struct_size < TPUSHIM_STATS_STRUCT_SIZE) {
      return absl::InvalidArgumentError(absl::StrCat(
          "System_GetStats: stats->struct_size is ", out->struct_size,
          ", smaller than the API 1.0 size ", TPUSHIM_STATS_STRUCT_SIZE,
          " (TPUSHIM_STATS_STRUCT_SIZE)"));
    }
    TPUSHIM_ASSIGN_OR_RETURN(SystemCall call, SystemCall::Enter(args->system));
    const SystemStats s = call.system().GetStats();
    const RegionStats& r = s.region;
    out->region_enabled = r.enabled ? 1 : 0;
    out->region_locked = r.locked ? 1 : 0;
    out->region_capacity_bytes = r.capacity_bytes;
    out->region_threshold_bytes = r.threshold_bytes;
    out->region_bytes_in_use = r.bytes_in_use;
    out->region_peak_bytes_in_use = r.peak_bytes_in_use;
    out->region_free_bytes = r.free_bytes;
    out->region_largest_free_block = r.largest_free_block;
    out->region_live_allocations = r.live_allocations;
    out->region_allocations = r.allocations;
    out->region_frees = r.frees;
    out->region_failures = r.failures;
    const TransferStats& t = s.transfers;
    static_assert(TPUSHIM_HOST_DIRECTION_COUNT == 2 &&
                  TPUSHIM_TRANSFER_PATH_COUNT == kTransferPathCount);
    for (int dir = 0; dir < TPUSHIM_HOST_DIRECTION_COUNT; ++dir) {
      for (int path = 0; path < TPUSHIM_TRANSFER_PATH_COUNT; ++path) {
        out->transfers[dir][path] = t.host[dir][path].transfers;
        out->transfer_bytes[dir][path] = t.host[dir][path].bytes;
        out->transfer_failures[dir][path] = t.host[dir][path].failed;
      }
    }
    out->device_to_device_transfers = t.device_to_device.transfers;
    out->device_to_device_bytes = t.device_to_device.bytes;
    out->device_to_device_failures = t.device_to_device.failed;
    out->staging_waits = t.staging_waits;
    out->staging_wait_ns = t.staging_wait_ns;
    out->staging_bytes_in_flight = t.staging_bytes_in_flight;
    out->peak_staging_bytes = t.peak_staging_bytes;
    out->pinned_over_threshold = t.pinned_over_threshold;
    out->pinned_region_off = t.pinned_region_off;
    out->pinned_staging_timeout = t.pinned_staging_timeout;
    out->pinned_bytes_now = t.pinned_bytes_now;
    out->device_buffers_live = t.device_buffers_live;
    out->device_bytes_live = t.device_bytes_live;
    out->events_pending = t.events_pending;
    out->callbacks_run = t.callbacks_run;
    if (out->struct_size >=
        TPUSHIM_STRUCT_SIZE(TpuShim_Stats, staged_misaligned)) {
      out->staged_misaligned = t.staged_misaligned;
    }
    if (out->struct_size >=
        TPUSHIM_STRUCT_SIZE(TpuShim_Stats, bounce_pool_bytes)) {
      out->staged_bounce = t.staged_bounce;
      out->bounce_pool_bytes = t.bounce_pool_bytes;
    }
    if (out->struct_size >=
        TPUSHIM_STRUCT_SIZE(TpuShim_Stats, registered_bytes)) {
      for (int d = 0; d < TPUSHIM_HOST_DIRECTION_COUNT; ++d) {
        out->zero_copy_registered_transfers[d] =
            t.zero_copy_registered_transfers[d];
        out->zero_copy_registered_bytes[d] = t.zero_copy_registered_bytes[d];
      }
      out->registrations_live = t.registrations_live;
      out->registered_bytes = t.registered_bytes;
    }
    return absl::OkStatus();
  });
}

// ---- Host buffers -----------------------------------------------------------

TpuShim_Error* HostBufferAllocate(TpuShim_HostBuffer_Allocate_Args* args) {
  return Guard([&]() -> absl::Status {
    TPUSHIM_CHECK_ARGS(args, "HostBuffer_Allocate",
                       TPUSHIM_HOSTBUFFER_ALLOCATE_ARGS_STRUCT_SIZE);
    // 1.4: flags, when the caller's struct has them.
    uint32_t flags = 0;
    if (args->struct_size >=
        TPUSHIM_STRUCT_SIZE(TpuShim_HostBuffer_Allocate_Args, flags)) {
      flags = args->flags;
    }
    if ((flags & ~uint32_t{TPUSHIM_HOSTBUFFER_NO_WAIT}) != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "HostBuffer_Allocate: args->flags is 0x%x; the known flags are "
          "TPUSHIM_HOSTBUFFER_NO_WAIT (0x%x)",
          flags, TPUSHIM_HOSTBUFFER_NO_WAIT));
    }
    TPUSHIM_ASSIGN_OR_RETURN(SystemCall call, SystemCall::Enter(args->system));
    TPUSHIM_ASSIGN_OR_RETURN(
        PinnedHostBuffer buffer,
        call.system().AllocatePinnedHost(
            args->size, args->alignment == 0 ? 64 : args->alignment,
            (flags & TPUSHIM_HOSTBUFFER_NO_WAIT) != 0 ? PremapWait::kNoWait
                                                      : PremapWait::kWait));
    void* const data = buffer.data();
    auto entry = std::make_shared<HostBufferEntry>();
    entry->system_id = call.id();
    entry->buffer = std::move(buffer);
    TPUSHIM_ASSIGN_OR_RETURN(const uint64_t id,
                             tables().host_buffers.Insert(std::move(entry)));
    args->buffer.id = id;
    args->data = data;
    return absl::OkStatus();
  });
}

TpuShim_Error* HostBufferFree(TpuShim_HostBuffer_Free_Args* args) {
  return Guard([&]() -> absl::Status {
    TPUSHIM_CHECK_ARGS(args, "HostBuffer_Free",
                       TPUSHIM_HOSTBUFFER_FREE_ARGS_STRUCT_SIZE);
    TPUSHIM_ASSIGN_OR_RETURN(SystemCall call, SystemCall::Enter(args->system));
    TPUSHIM_ASSIGN_OR_RETURN(
        std::shared_ptr<HostBufferEntry> entry,
        tables().host_buffers.Take(
            args->buffer.id, [&](const std::shared_ptr<HostBufferEntry>& e) {
              return e->system_id == call.id()
                         ? absl::OkStatus()
                         : Foreign(Kind::kHostBuffer, args->buffer.id);
            }));
    entry->buffer.Reset();  // outside the table's lock
    return absl::OkStatus();
  });
}

// ---- Device buffers ---------------------------------------------------------

TpuShim_Error* DeviceBufferAllocate(TpuShim_DeviceBuffer_Allocate_Args* args) {
  return Guard([&]() -> absl::Status {
    TPUSHIM_CHECK_ARGS(args, "DeviceBuffer_Allocate",
                       TPUSHIM_DEVICEBUFFER_ALLOCATE_ARGS_STRUCT_SIZE);
    TPUSHIM_ASSIGN_OR_RETURN(SystemCall call, SystemCall::Enter(args->system));
    TPUSHIM_ASSIGN_OR_RETURN(
        DeviceBuffer buffer,
        call.system().AllocateDevice(args->device, args->size));
    absl::StatusOr<uint64_t> id =
        tables().device_buffers.Insert(DeviceBufferEntry{call.id(), buffer});
    if (!id.ok()) {
      (void)call.system().Deallocate(buffer);
      return id.status();
    }
    args->buffer.id = *id;
    return absl::OkStatus();
  });
}

TpuShim_Error* DeviceBufferDeallocate(
    TpuShim_DeviceBuffer_Deallocate_Args* args) {
  return Guard([&]() -> absl::Status {
    TPUSHIM_CHECK_ARGS(args, "DeviceBuffer_Deallocate",
                       TPUSHIM_DEVICEBUFFER_DEALLOCATE_ARGS_STRUCT_SIZE);
    TPUSHIM_ASSIGN_OR_RETURN(SystemCall call, SystemCall::Enter(args->system));
    TPUSHIM_ASSIGN_OR_RETURN(std::vector<Event> wait_for,
                             GetWaitFor(call, "DeviceBuffer_Deallocate",
                                        args->wait_for, args->num_wait_for));
    // The event's handle first (a full table leaves the buffer as it
    // was), then claim the buffer's (a concurrent second Deallocate finds
    // it stale), then free. The C++ call cannot fail for a live buffer of
    // a live system; if it did, the handle is gone all the same.
    return SubmitWithEvent(
        call.id(), &args->event, [&]() -> absl::StatusOr<Event> {
          TPUSHIM_ASSIGN_OR_RETURN(
              DeviceBufferEntry entry,
              tables().device_buffers.Take(
                  args->buffer.id, [&](const DeviceBufferEntry& e) {
                    if (e.system_id != call.id()) {
                      return Foreign(Kind::kDeviceBuffer, args->buffer.id);
                    }
                    if (e.borrowed) {
                      return InvalidHandle(
                          Kind::kDeviceBuffer, args->buffer.id,
                          "it is borrowed from a TpuShim_MemoryBuffer "
                          "(MemoryBuffer_GetInfo); free that with "
                          "MemoryBuffer_Free (DeviceBuffer_Deallocate)");
                    }
                    return absl::OkStatus();
                  }));
          return call.system().Deallocate(entry.buffer, wait_for);
        });
  });
}

// ---- Transfers --------------------------------------------------------------

TpuShim_Error* TransferToDevice(TpuShim_Transfer_ToDevice_Args* args) {
  return Guard([&]() -> absl::Status {
    constexpr absl::string_view kFunction = "Transfer_ToDevice";
    TPUSHIM_CHECK_ARGS(args, kFunction,
                       TPUSHIM_TRANSFER_TODEVICE_ARGS_STRUCT_SIZE);
    TPUSHIM_ASSIGN_OR_RETURN(ToDeviceCall t, EnterToDevice(*args, kFunction));
    // host_released only when the caller's struct has room for it.
    const bool has_released =
        args->struct_size >=
        TPUSHIM_STRUCT_SIZE(TpuShim_Transfer_ToDevice_Args, host_released);
    return SubmitWithEvents(t.call.id(), &args->event,
                            has_released ? &args->host_released : nullptr, [&] {
                              return t.call.system().TransferToDeviceWithEvents(
                                  args->src, t.dst, args->dst_offset,
                                  args->size, t.wait_for, t.semantics);
                            });
  });
}

TpuShim_Error* TransferFromDevice(TpuShim_Transfer_FromDevice_Args* args) {
  return Guard([&]() -> absl::Status {
    constexpr absl::string_view kFunction = "Transfer_FromDevice";
    TPUSHIM_CHECK_ARGS(args, kFunction,
                       TPUSHIM_TRANSFER_FROMDEVICE_ARGS_STRUCT_SIZE);
    if (args->dst == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(kFunction, ": args->dst is NULL"));
    }
    TPUSHIM_RETURN_IF_ERROR(CheckTransferSize(args->size, kFunction));
    TPUSHIM_ASSIGN_OR_RETURN(HostBufferSemantics semantics,
                             ToSemantics(args->semantics, kFunction));
    TPUSHIM_ASSIGN_OR_RETURN(SystemCall call, SystemCall::Enter(args->system));
    TPUSHIM_ASSIGN_OR_RETURN(DeviceBuffer src,
                             GetDeviceBuffer(call, args->src));
    TPUSHIM_ASSIGN_OR_RETURN(
        std::vector<Event> wait_for,
        GetWaitFor(call, kFunction, args->wait_for, args->num_wait_for));
    return SubmitWithEvent(call.id(), &args->event, [&] {
      return call.system().TransferFromDevice(src, args->src_offset, args->dst,
                                              args->size, wait_for, semantics);
    });
  });
}

TpuShim_Error* TransferDeviceToDevice(
    TpuShim_Transfer_DeviceToDevice_Args* args) {
  return Guard([&]() -> absl::Status {
    constexpr absl::string_view kFunction = "Transfer_DeviceToDevice";
    TPUSHIM_CHECK_ARGS(args, kFunction,
                       TPUSHIM_TRANSFER_DEVICETODEVICE_ARGS_STRUCT_SIZE);
    TPUSHIM_RETURN_IF_ERROR(CheckTransferSize(args->size, kFunction));
    TPUSHIM_ASSIGN_OR_RETURN(SystemCall call, SystemCall::Enter(args->system));
    TPUSHIM_ASSIGN_OR_RETURN(DeviceBuffer src,
                             GetDeviceBuffer(call, args->src));
    TPUSHIM_ASSIGN_OR_RETURN(DeviceBuffer dst,
                             GetDeviceBuffer(call, args->dst));
    TPUSHIM_ASSIGN_OR_RETURN(
        std::vector<Event> wait_for,
        GetWaitFor(call, kFunction, args->wait_for, args->num_wait_for));
    return SubmitWithEvent(call.id(), &args->event, [&] {
      return call.system().TransferDeviceToDevice(
          src, args->src_offset, dst, args->dst_offset, args->size, wait_for);
    });
  });
}

// ---- Events -----------------------------------------------------------------

TpuShim_Error* EventIsReady(TpuShim_Event_IsReady_Args* args) {
  return Guard([&]() -> absl::Status {
    TPUSHIM_CHECK_ARGS(args, "Event_IsReady",
                       TPUSHIM_EVENT_ISREADY_ARGS_STRUCT_SIZE);
    TPUSHIM_ASSIGN_OR_RETURN(EventEntry entry,
                             tables().events.Get(args->event.id));
    args->is_ready = entry.event.IsReady();
    return absl::OkStatus();
  });
}

TpuShim_Error* EventAwait(TpuShim_Event_Await_Args* args) {
  return Guard([&]() -> absl::Status {
    TPUSHIM_CHECK_ARGS(args, "Event_Await",
                       TPUSHIM_EVENT_AWAIT_ARGS_STRUCT_SIZE);
    TPUSHIM_ASSIGN_OR_RETURN(EventEntry entry,
                             tables().events.Get(args->event.id));
    return entry.event.Await();
  });
}

TpuShim_Error* EventAwaitWithTimeout(
    TpuShim_Event_AwaitWithTimeout_Args* args) {
  return Guard([&]() -> absl::Status {
    TPUSHIM_CHECK_ARGS(args, "Event_AwaitWithTimeout",
                       TPUSHIM_EVENT_AWAITWITHTIMEOUT_ARGS_STRUCT_SIZE);
    TPUSHIM_ASSIGN_OR_RETURN(EventEntry entry,
                             tables().events.Get(args->event.id));
    const absl::Duration timeout = args->timeout_ns <= 0
                                       ? absl::ZeroDuration()
                                       : absl::Nanoseconds(args->timeout_ns);
    std::optional<absl::Status> status = entry.event.AwaitWithTimeout(timeout);
    args->ready = status.has_value();
    return status.value_or(absl::OkStatus());
  });
}

TpuShim_Error* EventAddCallback(TpuShim_Event_AddCallback_Args* args) {
  return Guard([&]() -> absl::Status {
    TPUSHIM_CHECK_ARGS(args, "Event_AddCallback",
                       TPUSHIM_EVENT_ADDCALLBACK_ARGS_STRUCT_SIZE);
    if (args->callback == nullptr) {
      return absl::InvalidArgumentError(
          "Event_AddCallback: args->callback is NULL");
    }
    TPUSHIM_ASSIGN_OR_RETURN(EventEntry entry,
                             tables().events.Get(args->event.id));
    const TpuShim_EventCallback callback = args->callback;
    void* const user_arg = args->user_arg;
    const uint64_t system_id = entry.system_id;
    ++tls_adding_callback;
    struct Done {
      ~Done() { --tls_adding_callback; }
    } done;
    entry.event.AddCallback(
        [callback, user_arg, system_id](absl::Status status) noexcept {
          // Inline (the event was ready): the caller's thread, whatever it
          // is. Otherwise: the system's callback thread.
          const bool on_callback_thread = tls_adding_callback == 0;
          const uint64_t saved = tls_callback_system;
          if (on_callback_thread) tls_callback_system = system_id;
          callback(ToError(std::move(status)), user_arg);
          tls_callback_system = saved;
        });
    return absl::OkStatus();
  });
}

TpuShim_Error* EventDestroy(TpuShim_Event_Destroy_Args* args) {
  return Guard([&]() -> absl::Status {
    TPUSHIM_CHECK_ARGS(args, "Event_Destroy",
                       TPUSHIM_EVENT_DESTROY_ARGS_STRUCT_SIZE);
    TPUSHIM_ASSIGN_OR_RETURN(
        EventEntry entry,
        tables().events.Take(args->event.id, [](const EventEntry&) {
          return absl::OkStatus();
        }));
    return absl::OkStatus();  // `entry` goes here, outside the table's lock
  });
}

// ---- Chips ------------------------------------------------------------------

void CopyCut(const std::string& from, char* to, size_t size) {
  const size_t n = std::min(from.size(), size - 1);
  std::memcpy(to, from.data(), n);
  to[n] = '\0';
}

TpuShim_Error* ChipsList(TpuShim_Chips_List_Args* args) {
  return Guard([&]() -> absl::Status {
    TPUSHIM_CHECK_ARGS(args, "Chips_List", TPUSHIM_CHIPS_LIST_ARGS_STRUCT_SIZE);
    if ((args->options == nullptr && args->num_options > 0) ||
        (args->chips == nullptr && args->capacity > 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Chips_List: args->",
          args->chips == nullptr && args->capacity > 0 ? "chips" : "options",
          " is NULL and its count is not 0"));
    }
    OptionOverrides overrides;
    for (size_t i = 0; i < args->num_options; ++i) {
      const TpuShim_Option& option = args->options[i];
      if (option.name == nullptr || option.value == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            "Chips_List: options[", i, "].",
            option.name == nullptr ? "name" : "value", " is NULL"));
      }
      TPUSHIM_RETURN_IF_ERROR(
          SetOptionOverride(overrides, option.name, option.value));
    }
    TPUSHIM_ASSIGN_OR_RETURN(const std::vector<ChipInfo> chips,
                             ListChips(overrides));
    for (size_t i = 0; i < chips.size() && i < args->capacity; ++i) {
      const ChipInfo& c = chips[i];
      TpuShim_ChipInfo& out = args->chips[i];
      out = TpuShim_ChipInfo{};
      out.host_chip = c.host_chip;
      out.held = c.held ? 1 : 0;
      CopyCut(c.name, out.name, sizeof(out.name));
      if (c.holder.has_value()) {
        out.pid = c.holder->pid;
        out.since_unix_us = absl::ToUnixMicros(c.holder->since);
        CopyCut(c.holder->user, out.user, sizeof(out.user));
        CopyCut(c.holder->command_line, out.command_line,
                sizeof(out.command_line));
      }
    }
    args->num_chips = chips.size();
    return absl::OkStatus();
  });
}

constexpr TpuShim_Api kApi = {
    .struct_size = sizeof(TpuShim_Api),
    .api_major = TPUSHIM_API_MAJOR,
    .api_minor = TPUSHIM_API_MINOR,
    .Error_Destroy = ErrorDestroy,
    .Error_Code = ErrorCode,
    .Error_Message = ErrorMessage,
    .System_Create = SystemCreate,
    .System_Destroy = SystemDestroy,
    .System_GetDeviceCount = SystemGetDeviceCount,
    .System_GetDeviceInfo = SystemGetDeviceInfo,
    .System_GetStats = SystemGetStats,
    .HostBuffer_Allocate = HostBufferAllocate,
    .HostBuffer_Free = HostBufferFree,
    .DeviceBuffer_Allocate = DeviceBufferAllocate,
    .DeviceBuffer_Deallocate = DeviceBufferDeallocate,
    .Transfer_ToDevice = TransferToDevice,
    .Transfer_FromDevice = TransferFromDevice,
    .Transfer_DeviceToDevice = TransferDeviceToDevice,
    .Event_IsReady = EventIsReady,
    .Event_Await = EventAwait,
    .Event_AwaitWithTimeout = EventAwaitWithTimeout,
    .Event_AddCallback = EventAddCallback,
    .Event_Destroy = EventDestroy,
    .DeviceBuffer_AllocateShaped = DeviceBufferAllocateShaped,
    .Transfer_ArrayToDevice = TransferArrayToDevice,
    .Transfer_ArrayFromDevice = TransferArrayFromDevice,
    .System_GetDeviceMemoryStats = SystemGetDeviceMemoryStats,
    // 1.4: memory kinds
    .System_GetMemories = SystemGetMemories,
    .System_GetDefaultMemory = SystemGetDefaultMemory,
    .MemoryBuffer_Allocate = MemoryBufferAllocate,
    .MemoryBuffer_FromHost = MemoryBufferFromHost,
    .MemoryBuffer_CopyToMemory = MemoryBufferCopyToMemory,
    .MemoryBuffer_GetInfo = MemoryBufferGetInfo,
    .MemoryBuffer_Free = MemoryBufferFree,
    .System_GetMemoryStats = SystemGetMemoryStats,
    .Event_Create = EventCreate,
    .Event_Set = EventSet,
    .DeviceBuffer_ReadyEvent = DeviceBufferReadyEvent,
    .Transfer_BeginChunked = TransferBeginChunked,
    .Transfer_Chunk = TransferChunk,
    .HostMemory_Register = HostMemoryRegister,
    .HostMemory_Unregister = HostMemoryUnregister,
    .Chips_List = ChipsList,
    .MemoryBuffer_ReadyEvent = MemoryBufferReadyEvent,
    .Transfer_AbortChunked = TransferAbortChunked,
};

}  // namespace

namespace capi_internal {

void SetOsForTesting(Os* os) { test_os.store(os, std::memory_order_release); }

void LimitEventHandlesForTesting(uint64_t more) {
  tables().events.TEST_SetCapacity(tables().events.TEST_InUse() + more);
}

void RestoreEventHandlesForTesting() { tables().events.TEST_SetCapacity(0); }

bool SetEventSlotGenerationForTesting(uint64_t destroyed, uint64_t generation) {
  return tables().events.TEST_SetGeneration(destroyed, generation);
}

}  // namespace capi_internal
}  // namespace tpushim

extern "C" const TpuShim_Api* TpuShim_GetApi(void) { return &tpushim::kApi; }
