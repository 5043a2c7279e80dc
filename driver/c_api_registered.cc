// The C ABI's registered host memory (API 1.4): HostMemory_Register and
// HostMemory_Unregister over System::RegisterHostMemory, as the functions
// of driver/c_api.cc are (check the args and handles, call C++, convert
// the status).

#include <memory>
#include <utility>

#include "driver/c_api_support.h"

namespace tpushim::capi_internal {

TpuShim_Error* HostMemoryRegister(TpuShim_HostMemory_Register_Args* args) {
  return Guard([&]() -> absl::Status {
    TPUSHIM_CHECK_ARGS(args, "HostMemory_Register",
                       TPUSHIM_HOSTMEMORY_REGISTER_ARGS_STRUCT_SIZE);
    TPUSHIM_ASSIGN_OR_RETURN(SystemCall call, SystemCall::Enter(args->system));
    // The handle first: a full table refuses the call before anything is
    // pinned or mapped.
    TPUSHIM_ASSIGN_OR_RETURN(auto reservation,
                             tables().host_registrations.Reserve());
    TPUSHIM_ASSIGN_OR_RETURN(
        HostRegistration registration,
        call.system().RegisterHostMemory(args->data, args->size));
    auto entry = std::make_shared<HostRegistrationEntry>();
    entry->system_id = call.id();
    entry->registration = std::move(registration);
    args->registration.id = std::move(reservation).Fill(std::move(entry));
    return absl::OkStatus();
  });
}

TpuShim_Error* HostMemoryUnregister(TpuShim_HostMemory_Unregister_Args* args) {
  return Guard([&]() -> absl::Status {
    TPUSHIM_CHECK_ARGS(args, "HostMemory_Unregister",
                       TPUSHIM_HOSTMEMORY_UNREGISTER_ARGS_STRUCT_SIZE);
    TPUSHIM_ASSIGN_OR_RETURN(SystemCall call, SystemCall::Enter(args->system));
    TPUSHIM_ASSIGN_OR_RETURN(
        std::shared_ptr<HostRegistrationEntry> entry,
        tables().host_registrations.Take(
            args->registration.id,
            [&](const std::shared_ptr<HostRegistrationEntry>& e) {
              return e->system_id == call.id()
                         ? absl::OkStatus()
                         : Foreign(Kind::kHostRegistration,
                                   args->registration.id);
            }));
    // Outside the table's lock: it waits for the transfers inside it.
    return entry->registration.Unregister();
  });
}

}  // namespace tpushim::capi_internal
