// The C ABI's memory kinds (API 1.4): the memories of a system, buffers in
// any of them, copies between them and per-memory statistics, over
// tpushim::System, as the functions of driver/c_api.cc are (check the args
// and handles, call C++, convert the status).

#include <algorithm>
#include <utility>
#include <vector>

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

absl::StatusOr<MemoryBuffer> GetMemoryBuffer(const SystemCall& call,
                                             TpuShim_MemoryBuffer handle) {
  TPUSHIM_ASSIGN_OR_RETURN(MemoryBufferEntry entry,
                           tables().memory_buffers.Get(handle.id));
  if (entry.system_id != call.id()) {
    return Foreign(Kind::kMemoryBuffer, handle.id);
  }
  return std::move(entry.buffer);
}

// A handle for `buffer`; on a full table the buffer is freed again.
absl::StatusOr<uint64_t> InsertBuffer(const SystemCall& call,
                                      const MemoryBuffer& buffer) {
  absl::StatusOr<uint64_t> id =
      tables().memory_buffers.Insert(MemoryBufferEntry{call.id(), buffer});
  if (!id.ok()) (void)call.system().Free(buffer);
  return id;
}

// A buffer with its event: both handles, or neither.
absl::Status OutBufferAndEvent(const SystemCall& call, const MemoryCopy& made,
                               TpuShim_MemoryBuffer* buffer,
                               TpuShim_Event* event) {
  TPUSHIM_ASSIGN_OR_RETURN(EventReservation slot, tables().events.Reserve());
  TPUSHIM_ASSIGN_OR_RETURN(uint64_t id, InsertBuffer(call, made.buffer));
  buffer->id = id;
  event->id = std::move(slot).Fill(EventEntry{call.id(), made.event});
  return absl::OkStatus();
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
    TPUSHIM_ASSIGN_OR_RETURN(args->buffer.id, InsertBuffer(call, *buffer));
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
    TPUSHIM_ASSIGN_OR_RETURN(HostBufferSemantics semantics,
                             ToSemantics(args->semantics, kFunction));
    TPUSHIM_ASSIGN_OR_RETURN(SystemCall call, SystemCall::Enter(args->system));
    TPUSHIM_ASSIGN_OR_RETURN(
        MemoryCopy made, call.system().CreateMemoryBuffer(
                             args->data, args->size, args->memory, semantics));
    absl::Status out =
        OutBufferAndEvent(call, made, &args->buffer, &args->event);
    if (!out.ok()) {
      (void)made.event.Await();
      (void)call.system().Free(made.buffer);
      return out;
    }
    args->aliased = made.buffer.aliases_caller_memory() ? 1 : 0;
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
    TPUSHIM_ASSIGN_OR_RETURN(auto buffer_slot,
                             tables().memory_buffers.Reserve());
    TPUSHIM_ASSIGN_OR_RETURN(MemoryCopy made, call.system().CopyToMemory(
                                                  src, args->memory, wait_for));
    args->buffer.id =
        std::move(buffer_slot).Fill(MemoryBufferEntry{call.id(), made.buffer});
    args->event.id = std::move(slot).Fill(EventEntry{call.id(), made.event});
    return absl::OkStatus();
  });
}

TpuShim_Error* MemoryBufferGetInfo(TpuShim_MemoryBuffer_GetInfo_Args* args) {
  return Guard([&]() -> absl::Status {
    TPUSHIM_CHECK_ARGS(args, "MemoryBuffer_GetInfo",
                       TPUSHIM_MEMORYBUFFER_GETINFO_ARGS_STRUCT_SIZE);
    TPUSHIM_ASSIGN_OR_RETURN(SystemCall call, SystemCall::Enter(args->system));
    TPUSHIM_ASSIGN_OR_RETURN(MemoryBuffer b,
                             GetMemoryBuffer(call, args->buffer));
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

}  // namespace tpushim::capi_internal
