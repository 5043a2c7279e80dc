// The C ABI's events (API 1.4): caller events, buffer ready events and
// chunked host→device transfers, over tpushim::System, as the functions of
// driver/c_api.cc are (check the args and handles, call C++, convert the
// status). Transfer_ToDevice's and Transfer_ArrayToDevice's host_released
// out fields are filled in driver/c_api.cc and driver/c_api_shaped.cc.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "driver/c_api_support.h"

namespace tpushim::capi_internal {

TpuShim_Error* EventCreate(TpuShim_Event_Create_Args* args) {
  return Guard([&]() -> absl::Status {
    constexpr absl::string_view kFunction = "Event_Create";
    TPUSHIM_CHECK_ARGS(args, kFunction, TPUSHIM_EVENT_CREATE_ARGS_STRUCT_SIZE);
    TPUSHIM_ASSIGN_OR_RETURN(SystemCall call, SystemCall::Enter(args->system));
    TPUSHIM_ASSIGN_OR_RETURN(EventReservation slot, tables().events.Reserve());
    TPUSHIM_ASSIGN_OR_RETURN(CallerEvent event, call.system().CreateEvent());
    auto setter = std::make_shared<CallerEvent>(std::move(event));
    Event waitable = setter->event();
    args->event.id = std::move(slot).Fill(
        EventEntry{call.id(), std::move(waitable), std::move(setter)});
    return absl::OkStatus();
  });
}

TpuShim_Error* EventSet(TpuShim_Event_Set_Args* args) {
  return Guard([&]() -> absl::Status {
    constexpr absl::string_view kFunction = "Event_Set";
    TPUSHIM_CHECK_ARGS(args, kFunction, TPUSHIM_EVENT_SET_ARGS_STRUCT_SIZE);
    if (args->code < 0 || args->code > 16) {
      return absl::InvalidArgumentError(
          absl::StrCat(kFunction, ": args->code ", args->code,
                       " is not a TpuShim_ErrorCode (0 to 16)"));
    }
    TPUSHIM_ASSIGN_OR_RETURN(EventEntry entry,
                             tables().events.Get(args->event.id));
    if (entry.setter == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          kFunction,
          ": the TpuShim_Event was not made by Event_Create (only those can "
          "be set; a transfer's event is set by the transfer)"));
    }
    const absl::Status status =
        args->code == 0
            ? absl::OkStatus()
            : absl::Status(static_cast<absl::StatusCode>(args->code),
                           args->message == nullptr ? "" : args->message);
    absl::Status set = entry.setter->Set(status);
    if (!set.ok()) {
      return absl::Status(set.code(),
                          absl::StrCat(kFunction, ": ", set.message()));
    }
    return absl::OkStatus();
  });
}

TpuShim_Error* DeviceBufferReadyEvent(
    TpuShim_DeviceBuffer_ReadyEvent_Args* args) {
  return Guard([&]() -> absl::Status {
    constexpr absl::string_view kFunction = "DeviceBuffer_ReadyEvent";
    TPUSHIM_CHECK_ARGS(args, kFunction,
                       TPUSHIM_DEVICEBUFFER_READYEVENT_ARGS_STRUCT_SIZE);
    TPUSHIM_ASSIGN_OR_RETURN(SystemCall call, SystemCall::Enter(args->system));
    TPUSHIM_ASSIGN_OR_RETURN(DeviceBuffer buffer,
                             GetDeviceBuffer(call, args->buffer));
    return SubmitWithEvent(call.id(), &args->event, [&] {
      return call.system().BufferReadyEvent(buffer);
    });
  });
}

TpuShim_Error* TransferBeginChunked(TpuShim_Transfer_BeginChunked_Args* args) {
  return Guard([&]() -> absl::Status {
    constexpr absl::string_view kFunction = "Transfer_BeginChunked";
    TPUSHIM_CHECK_ARGS(args, kFunction,
                       TPUSHIM_TRANSFER_BEGINCHUNKED_ARGS_STRUCT_SIZE);
    TPUSHIM_ASSIGN_OR_RETURN(SystemCall call, SystemCall::Enter(args->system));
    TPUSHIM_ASSIGN_OR_RETURN(DeviceBuffer buffer,
                             GetDeviceBuffer(call, args->buffer));
    return call.system().BeginChunkedTransfer(buffer);
  });
}

TpuShim_Error* TransferChunk(TpuShim_Transfer_Chunk_Args* args) {
  return Guard([&]() -> absl::Status {
    constexpr absl::string_view kFunction = "Transfer_Chunk";
    TPUSHIM_CHECK_ARGS(args, kFunction,
                       TPUSHIM_TRANSFER_CHUNK_ARGS_STRUCT_SIZE);
    TPUSHIM_ASSIGN_OR_RETURN(ToDeviceCall t, EnterToDevice(*args, kFunction));
    return SubmitWithEvents(
        t.call.id(), &args->event, &args->host_released, [&] {
          return t.call.system().TransferChunk(
              args->src, t.dst, args->dst_offset, args->size,
              args->is_last != 0, t.wait_for, t.semantics);
        });
  });
}

TpuShim_Error* TransferAbortChunked(TpuShim_Transfer_AbortChunked_Args* args) {
  return Guard([&]() -> absl::Status {
    constexpr absl::string_view kFunction = "Transfer_AbortChunked";
    TPUSHIM_CHECK_ARGS(args, kFunction,
                       TPUSHIM_TRANSFER_ABORTCHUNKED_ARGS_STRUCT_SIZE);
    if (args->code < 1 || args->code > 16) {
      return absl::InvalidArgumentError(absl::StrCat(
          kFunction, ": args->code ", args->code,
          " is not an error code (1 to 16; TPUSHIM_CODE_ABORTED is ",
          TPUSHIM_CODE_ABORTED, ")"));
    }
    TPUSHIM_ASSIGN_OR_RETURN(SystemCall call, SystemCall::Enter(args->system));
    TPUSHIM_ASSIGN_OR_RETURN(DeviceBuffer buffer,
                             GetDeviceBuffer(call, args->buffer));
    absl::Status aborted = call.system().AbortChunkedTransfer(
        buffer, absl::Status(static_cast<absl::StatusCode>(args->code),
                             args->message == nullptr ? "" : args->message));
    if (!aborted.ok()) {
      return absl::Status(aborted.code(),
                          absl::StrCat(kFunction, ": ", aborted.message()));
    }
    return absl::OkStatus();
  });
}

}  // namespace tpushim::capi_internal
