// The C ABI's shaped device memory (API 1.3): shaped device buffers, array
// transfers and per-device memory stats, over tpushim::System, as the
// functions of driver/c_api.cc are (check the args and handles, call C++,
// convert the status).

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "driver/c_api_support.h"

namespace tpushim::capi_internal {

TpuShim_Error* DeviceBufferAllocateShaped(
    TpuShim_DeviceBuffer_AllocateShaped_Args* args) {
  return Guard([&]() -> absl::Status {
    constexpr absl::string_view kFunction = "DeviceBuffer_AllocateShaped";
    TPUSHIM_CHECK_ARGS(args, kFunction,
                       TPUSHIM_DEVICEBUFFER_ALLOCATESHAPED_ARGS_STRUCT_SIZE);
    if (args->shape == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(kFunction, ": args->shape is NULL"));
    }
    if (args->layout == nullptr && args->layout_capacity != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(kFunction,
                       ": args->layout is NULL and "
                       "layout_capacity is ",
                       args->layout_capacity));
    }
    TPUSHIM_ASSIGN_OR_RETURN(SystemCall call, SystemCall::Enter(args->system));
    DeviceBufferSpec spec;
    spec.shape = args->shape;
    if (args->label != nullptr) spec.label = args->label;
    if (args->op_metadata != nullptr) spec.op_metadata = args->op_metadata;
    TPUSHIM_ASSIGN_OR_RETURN(DeviceBuffer buffer,
                             call.system().AllocateDevice(args->device, spec));
    absl::StatusOr<uint64_t> id =
        tables().device_buffers.Insert(DeviceBufferEntry{call.id(), buffer});
    if (!id.ok()) {
      (void)call.system().Deallocate(buffer);
      return id.status();
    }
    const std::string layout = buffer.shape();
    if (args->layout != nullptr && args->layout_capacity > 0) {
      const size_t n = std::min(layout.size(), args->layout_capacity - 1);
      std::memcpy(args->layout, layout.data(), n);
      args->layout[n] = '\0';
    }
    args->layout_length = layout.size();
    args->buffer.id = *id;
    args->size = buffer.size();
    args->unpadded_bytes = buffer.unpadded_size();
    args->host_bytes = buffer.host_size();
    return absl::OkStatus();
  });
}

TpuShim_Error* TransferArrayToDevice(
    TpuShim_Transfer_ArrayToDevice_Args* args) {
  return Guard([&]() -> absl::Status {
    constexpr absl::string_view kFunction = "Transfer_ArrayToDevice";
    TPUSHIM_CHECK_ARGS(args, kFunction,
                       TPUSHIM_TRANSFER_ARRAYTODEVICE_ARGS_STRUCT_SIZE);
    if (args->src == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(kFunction, ": args->src is NULL"));
    }
    TPUSHIM_ASSIGN_OR_RETURN(HostBufferSemantics semantics,
                             ToSemantics(args->semantics, kFunction));
    TPUSHIM_ASSIGN_OR_RETURN(SystemCall call, SystemCall::Enter(args->system));
    TPUSHIM_ASSIGN_OR_RETURN(DeviceBuffer dst,
                             GetDeviceBuffer(call, args->dst));
    TPUSHIM_ASSIGN_OR_RETURN(
        std::vector<Event> wait_for,
        GetWaitFor(call, kFunction, args->wait_for, args->num_wait_for));
    if (args->struct_size >=
        TPUSHIM_STRUCT_SIZE(TpuShim_Transfer_ArrayToDevice_Args,
                            host_released)) {
      return SubmitWithEvents(
          call.id(), &args->event, &args->host_released, [&] {
            return call.system().TransferArrayToDeviceWithEvents(
                args->src, dst, wait_for, semantics);
          });
    }
    return SubmitWithEvent(call.id(), &args->event, [&] {
      return call.system().TransferArrayToDevice(args->src, dst, wait_for,
                                                 semantics);
    });
  });
}

TpuShim_Error* TransferArrayFromDevice(
    TpuShim_Transfer_ArrayFromDevice_Args* args) {
  return Guard([&]() -> absl::Status {
    constexpr absl::string_view kFunction = "Transfer_ArrayFromDevice";
    TPUSHIM_CHECK_ARGS(args, kFunction,
                       TPUSHIM_TRANSFER_ARRAYFROMDEVICE_ARGS_STRUCT_SIZE);
    if (args->dst == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(kFunction, ": args->dst is NULL"));
    }
    TPUSHIM_ASSIGN_OR_RETURN(HostBufferSemantics semantics,
                             ToSemantics(args->semantics, kFunction));
    TPUSHIM_ASSIGN_OR_RETURN(SystemCall call, SystemCall::Enter(args->system));
    TPUSHIM_ASSIGN_OR_RETURN(DeviceBuffer src,
                             GetDeviceBuffer(call, args->src));
    TPUSHIM_ASSIGN_OR_RETURN(
        std::vector<Event> wait_for,
        GetWaitFor(call, kFunction, args->wait_for, args->num_wait_for));
    return SubmitWithEvent(call.id(), &args->event, [&] {
      return call.system().TransferArrayFromDevice(src, args->dst, wait_for,
                                                   semantics);
    });
  });
}

TpuShim_Error* SystemGetDeviceMemoryStats(
    TpuShim_System_GetDeviceMemoryStats_Args* args) {
  return Guard([&]() -> absl::Status {
    constexpr absl::string_view kFunction = "System_GetDeviceMemoryStats";
    TPUSHIM_CHECK_ARGS(args, kFunction,
                       TPUSHIM_SYSTEM_GETDEVICEMEMORYSTATS_ARGS_STRUCT_SIZE);
    TPUSHIM_ASSIGN_OR_RETURN(SystemCall call, SystemCall::Enter(args->system));
    const int count = call.system().device_count();
    if (args->device < 0 || args->device >= count) {
      return absl::InvalidArgumentError(
          absl::StrCat(kFunction, ": device ", args->device,
                       " does not exist (devices 0..", count - 1, ")"));
    }
    const SystemStats stats = call.system().GetStats();
    const DeviceStats& d = stats.devices[args->device];
    args->hbm_bytes = d.hbm_bytes;
    args->hbm_in_use = d.hbm_in_use;
    args->hbm_free = d.hbm_free;
    args->largest_free_block = d.largest_free_block;
    args->buffers_live = d.buffers_live;
    args->padded_bytes_in_use = d.padded_bytes_in_use;
    args->unpadded_bytes_in_use = d.unpadded_bytes_in_use;
    args->peak_padded_bytes = d.peak_padded_bytes;
    args->peak_unpadded_bytes = d.peak_unpadded_bytes;
    // 1.4 fields, when the caller's struct has them.
    if (args->struct_size >= TPUSHIM_STRUCT_SIZE(
                                 TpuShim_System_GetDeviceMemoryStats_Args,
                                 largest_alloc_size)) {
      args->num_allocs = d.num_allocs;
      args->largest_alloc_size = d.largest_alloc_size;
    }
    return absl::OkStatus();
  });
}

}  // namespace tpushim::capi_internal
