// The C ABI's memory kinds (API 1.4): the memories of a system, buffers in
// any of them, copies between them and per-memory statistics, over
// tpushim::System, as the functions of driver/c_api.cc are (check the args
// and handles, call C++, convert the status).

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "device/xla_shape.h"
#include "driver/c_api_support.h"

namespace tpushim::capi_internal {
namespace {

int32_t ToC(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kDevice:
      return TPUSHIM_MEMORY_DEVICE;
    case MemoryKind::kPinnedHost:
      return TPUSHIM_MEMORY_PINNED_HOST;
    case MemoryKind::kUnpinnedHost:
      return TPUSHIM_MEMORY_UNPINNED_HOST;
  }
  return -1;
}

absl::StatusOr<MemoryBufferEntry> GetEntry(const SystemCall& call,
                                           TpuShim_MemoryBuffer handle) {
  TPUSHIM_ASSIGN_OR_RETURN(MemoryBufferEntry entry,
                           tables().memory_buffers.Get(handle.id));
  if (entry.system_id != call.id()) {
    return Foreign(Kind::kMemoryBuffer, handle.id);
  }
  return entry;
}

absl::StatusOr<MemoryBuffer> GetMemoryBuffer(const SystemCall& call,
                                             TpuShim_MemoryBuffer handle) {
  TPUSHIM_ASSIGN_OR_RETURN(MemoryBufferEntry entry, GetEntry(call, handle));
  return std::move(entry.buffer);
}

// The handles a new buffer gets, reserved before it is made (a full table
// refuses the call first): its TpuShim_MemoryBuffer and, in device memory,
// the borrowed TpuShim_DeviceBuffer (MemoryBuffer_GetInfo).
struct BufferSlots {
  HandleTable<MemoryBufferEntry>::Reservation buffer;
  std::optional<HandleTable<DeviceBufferEntry>::Reservation> device;
};

absl::StatusOr<BufferSlots> ReserveBuffer(const SystemCall& call, int memory) {
  TPUSHIM_ASSIGN_OR_RETURN(auto buffer, tables().memory_buffers.Reserve());
  BufferSlots slots{std::move(buffer), std::nullopt};
  if (memory >= 0 && memory < call.system().device_count()) {
    TPUSHIM_ASSIGN_OR_RETURN(auto device, tables().device_buffers.Reserve());
    slots.device.emplace(std::move(device));
  }
  return slots;
}

// Fills the slots with `buffer` and returns its TpuShim_MemoryBuffer id.
uint64_t FillBuffer(BufferSlots slots, const SystemCall& call,
                    const MemoryBuffer& buffer) {
  uint64_t device_handle = 0;
  if (buffer.kind() == MemoryKind::kDevice && slots.device.has_value()) {
    device_handle =
        std::move(*slots.device)
            .Fill(DeviceBufferEntry{call.id(), buffer.device_buffer(),
                                    /*borrowed=*/true});
  }
  return std::move(slots.buffer)
      .Fill(MemoryBufferEntry{call.id(), buffer, device_handle});
}

}  // namespace

TpuShim_Error* SystemGetMemories(TpuShim_System_GetMemories_Args* args) {
  return Guard([&]() -> absl::Status {
    constexpr absl::string_view kFunction = "System_GetMemories";
    TPUSHIM_CHECK_ARGS(args, kFunction,
                       TPUSHIM_SYSTEM_GETMEMORIES_ARGS_STRUCT_SIZE);
    if (args->memories == nullptr && args->capacity != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(kFunction, ": args->memories is NULL and capacity is ",
                       args->capacity));
    }
    TPUSHIM_ASSIGN_OR_RETURN(SystemCall call, SystemCall::Enter(args->system));
    const std::vector<MemoryDescription> list = call.system().memories();
    const size_t n = std::min(args->capacity, list.size());
    for (size_t i = 0; i < n; ++i) {
      const MemoryDescription& m = list[i];
      TpuShim_MemoryInfo& out = args->memories[i];
      out.id = m.id;
      out.kind = ToC(m.kind);
      // Static strings: MemoryKindName returns literals.
      out.kind_name = MemoryKindName(m.kind).data();
      out.device = m.kind == MemoryKind::kDevice ? m.devices.front() : -1;
      out.capacity_bytes = m.capacity_bytes;
    }
    args->num_memories = list.size();
    return absl::OkStatus();
  });
}

TpuShim_Error* SystemGetDefaultMemory(
    TpuShim_System_GetDefaultMemory_Args* args) {
  return Guard([&]() -> absl::Status {
    TPUSHIM_CHECK_ARGS(args, "System_GetDefaultMemory",
                       TPUSHIM_SYSTEM_GETDEFAULTMEMORY_ARGS_STRUCT_SIZE);
    TPUSHIM_ASSIGN_OR_RETURN(SystemCall call, SystemCall::Enter(args->system));
    TPUSHIM_ASSIGN_OR_RETURN(args->memory,
                             call.system().DefaultMemory(args->device));
    return absl::OkStatus();
  });
}

TpuShim_Error* MemoryBufferAllocate(TpuShim_MemoryBuffer_Allocate_Args* args) {
  return Guard([&]() -> absl::Status {
    TPUSHIM_CHECK_ARGS(args, "MemoryBuffer_Allocate",
                       TPUSHIM_MEMORYBUFFER_ALLOCATE_ARGS_STRUCT_SIZE);
    TPUSHIM_ASSIGN_OR_RETURN(SystemCall call, SystemCall::Enter(args->system));
    TPUSHIM_ASSIGN_OR_RETURN(BufferSlots slots,
                             ReserveBuffer(call, args->memory));
    absl::StatusOr<MemoryBuffer> buffer;
    if (args->shape == nullptr) {
      buffer = call.system().AllocateInMemory(args->memory, args->size);
    } else {
      DeviceBufferSpec spec;
      spec.shape = args->shape;
      if (args->label != nullptr) spec.label = args->label;
      if (args->op_metadata != nullptr) spec.op_metadata = args->op_metadata;
      buffer = call.system().AllocateInMemory(args->memory, spec);
    }
    if (!buffer.ok()) return buffer.status();
    args->buffer.id = FillBuffer(std::move(slots), call, *buffer);
    return absl::OkStatus();
  });
}

TpuShim_Error* MemoryBufferFromHost(TpuShim_MemoryBuffer_FromHost_Args* args) {
  return Guard([&]() -> absl::Status {
    constexpr absl::string_view kFunction = "MemoryBuffer_FromHost";
    TPUSHIM_CHECK_ARGS(args, kFunction,
                       TPUSHIM_MEMORYBUFFER_FROMHOST_ARGS_STRUCT_SIZE);
    if (args->data == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(kFunction, ": args->data is NULL"));
    }
    const bool has_released =
        args->struct_size >=
        TPUSHIM_STRUCT_SIZE(TpuShim_MemoryBuffer_FromHost_Args, host_released);
    const char* const shape =
        args->struct_size >=
                TPUSHIM_STRUCT_SIZE(TpuShim_MemoryBuffer_FromHost_Args, shape)
            ? args->shape
            : nullptr;
    const char* const label =
        args->struct_size >=
                TPUSHIM_STRUCT_SIZE(TpuShim_MemoryBuffer_FromHost_Args, label)
            ? args->label
            : nullptr;
    TPUSHIM_ASSIGN_OR_RETURN(HostBufferSemantics semantics,
                             ToSemantics(args->semantics, kFunction));
    DeviceBufferSpec spec;
    if (shape != nullptr) {
      // `size` is the dense array's length: checked before anything is made.
      absl::StatusOr<ArrayShape> array = ParseArrayShape(shape);
      if (!array.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            kFunction, ": args->shape: ", array.status().message()));
      }
      if (HostBytes(*array) != args->size) {
        return absl::InvalidArgumentError(absl::StrCat(
            kFunction, ": args->size is ", args->size, " but the dense array ",
            shape, " is ", HostBytes(*array), " bytes"));
      }
      spec.shape = shape;
      if (label != nullptr) spec.label = label;
    }
    TPUSHIM_ASSIGN_OR_RETURN(SystemCall call, SystemCall::Enter(args->system));
    // Every handle first, so that a full table refuses before the buffer.
    TPUSHIM_ASSIGN_OR_RETURN(EventReservation ready, tables().events.Reserve());
    std::optional<EventReservation> released;
    if (has_released) {
      TPUSHIM_ASSIGN_OR_RETURN(EventReservation slot,
                               tables().events.Reserve());
      released.emplace(std::move(slot));
    }
    TPUSHIM_ASSIGN_OR_RETURN(BufferSlots slots,
                             ReserveBuffer(call, args->memory));
    TPUSHIM_ASSIGN_OR_RETURN(
        MemoryCopy made,
        shape == nullptr ? call.system().CreateMemoryBuffer(
                               args->data, args->size, args->memory, semantics)
                         : call.system().CreateMemoryBuffer(
                               args->data, args->memory, spec, semantics));
    args->aliased = made.buffer.aliases_caller_memory() ? 1 : 0;
    args->buffer.id = FillBuffer(std::move(slots), call, made.buffer);
    args->event.id =
        std::move(ready).Fill(EventEntry{call.id(), std::move(made.event)});
    if (released.has_value()) {
      args->host_released.id = std::move(*released).Fill(
          EventEntry{call.id(), std::move(made.host_released)});
    }
    return absl::OkStatus();
  });
}

TpuShim_Error* MemoryBufferCopyToMemory(
    TpuShim_MemoryBuffer_CopyToMemory_Args* args) {
  return Guard([&]() -> absl::Status {
    constexpr absl::string_view kFunction = "MemoryBuffer_CopyToMemory";
    TPUSHIM_CHECK_ARGS(args, kFunction,
                       TPUSHIM_MEMORYBUFFER_COPYTOMEMORY_ARGS_STRUCT_SIZE);
    TPUSHIM_ASSIGN_OR_RETURN(SystemCall call, SystemCall::Enter(args->system));
    TPUSHIM_ASSIGN_OR_RETURN(MemoryBuffer src,
                             GetMemoryBuffer(call, args->src));
    TPUSHIM_ASSIGN_OR_RETURN(
        std::vector<Event> wait_for,
        GetWaitFor(call, kFunction, args->wait_for, args->num_wait_for));
    // Both handles first, so that a full table refuses before the copy.
    TPUSHIM_ASSIGN_OR_RETURN(EventReservation slot, tables().events.Reserve());
    TPUSHIM_ASSIGN_OR_RETURN(BufferSlots buffer_slots,
                             ReserveBuffer(call, args->memory));
    TPUSHIM_ASSIGN_OR_RETURN(MemoryCopy made, call.system().CopyToMemory(
                                                  src, args->memory, wait_for));
    args->buffer.id = FillBuffer(std::move(buffer_slots), call, made.buffer);
    args->event.id = std::move(slot).Fill(EventEntry{call.id(), made.event});
    return absl::OkStatus();
  });
}

TpuShim_Error* MemoryBufferGetInfo(TpuShim_MemoryBuffer_GetInfo_Args* args) {
  return Guard([&]() -> absl::Status {
    TPUSHIM_CHECK_ARGS(args, "MemoryBuffer_GetInfo",
                       TPUSHIM_MEMORYBUFFER_GETINFO_ARGS_STRUCT_SIZE);
    TPUSHIM_ASSIGN_OR_RETURN(SystemCall call, SystemCall::Enter(args->system));
    TPUSHIM_ASSIGN_OR_RETURN(MemoryBufferEntry entry,
                             GetEntry(call, args->buffer));
    const MemoryBuffer& b = entry.buffer;
    if (args->struct_size >=
        TPUSHIM_STRUCT_SIZE(TpuShim_MemoryBuffer_GetInfo_Args, device_buffer)) {
      args->device_buffer.id = entry.device_handle;
    }
    args->memory = b.memory();
    args->kind = ToC(b.kind());
    args->size = b.size();
    args->data = b.data();
    args->aliased = b.aliases_caller_memory() ? 1 : 0;
    return absl::OkStatus();
  });
}

TpuShim_Error* MemoryBufferFree(TpuShim_MemoryBuffer_Free_Args* args) {
  return Guard([&]() -> absl::Status {
    constexpr absl::string_view kFunction = "MemoryBuffer_Free";
    TPUSHIM_CHECK_ARGS(args, kFunction,
                       TPUSHIM_MEMORYBUFFER_FREE_ARGS_STRUCT_SIZE);
    TPUSHIM_ASSIGN_OR_RETURN(SystemCall call, SystemCall::Enter(args->system));
    TPUSHIM_ASSIGN_OR_RETURN(MemoryBuffer b,
                             GetMemoryBuffer(call, args->buffer));
    TPUSHIM_ASSIGN_OR_RETURN(
        std::vector<Event> wait_for,
        GetWaitFor(call, kFunction, args->wait_for, args->num_wait_for));
    TPUSHIM_ASSIGN_OR_RETURN(EventReservation slot, tables().events.Reserve());
    TPUSHIM_ASSIGN_OR_RETURN(
        MemoryBufferEntry taken,
        tables().memory_buffers.Take(
            args->buffer.id, [&](const MemoryBufferEntry&) {
              return absl::OkStatus();  // checked by GetMemoryBuffer
            }));
    // Its borrowed TpuShim_DeviceBuffer goes stale with it.
    if (taken.device_handle != 0) {
      (void)tables().device_buffers.Take(
          taken.device_handle,
          [](const DeviceBufferEntry&) { return absl::OkStatus(); });
    }
    absl::StatusOr<Event> freed = call.system().Free(taken.buffer, wait_for);
    if (!freed.ok()) return freed.status();  // the handle is gone all the same
    args->event.id = std::move(slot).Fill(EventEntry{call.id(), *freed});
    return absl::OkStatus();
  });
}

TpuShim_Error* SystemGetMemoryStats(TpuShim_System_GetMemoryStats_Args* args) {
  return Guard([&]() -> absl::Status {
    TPUSHIM_CHECK_ARGS(args, "System_GetMemoryStats",
                       TPUSHIM_SYSTEM_GETMEMORYSTATS_ARGS_STRUCT_SIZE);
    TPUSHIM_ASSIGN_OR_RETURN(SystemCall call, SystemCall::Enter(args->system));
    TPUSHIM_ASSIGN_OR_RETURN(MemoryStats m,
                             call.system().GetMemoryStats(args->memory));
    args->kind = ToC(m.kind);
    args->bytes_in_use = m.bytes_in_use;
    args->peak_bytes_in_use = m.peak_bytes_in_use;
    args->num_allocs = m.num_allocs;
    args->largest_alloc_size = m.largest_alloc_size;
    args->has_bytes_limit = m.has_bytes_limit ? 1 : 0;
    args->bytes_limit = m.bytes_limit;
    args->largest_free_block_bytes = m.largest_free_block_bytes;
    args->buffers_live = m.buffers_live;
    return absl::OkStatus();
  });
}

TpuShim_Error* MemoryBufferReadyEvent(
    TpuShim_MemoryBuffer_ReadyEvent_Args* args) {
  return Guard([&]() -> absl::Status {
    TPUSHIM_CHECK_ARGS(args, "MemoryBuffer_ReadyEvent",
                       TPUSHIM_MEMORYBUFFER_READYEVENT_ARGS_STRUCT_SIZE);
    TPUSHIM_ASSIGN_OR_RETURN(SystemCall call, SystemCall::Enter(args->system));
    TPUSHIM_ASSIGN_OR_RETURN(MemoryBuffer b,
                             GetMemoryBuffer(call, args->buffer));
    return SubmitWithEvent(call.id(), &args->event,
                           [&] { return call.system().BufferReadyEvent(b); });
  });
}

}  // namespace tpushim::capi_internal
