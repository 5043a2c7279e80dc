// Test seam of the C ABI adapter (driver/c_api.cc). Not part of the public
// API.
//
// Thread-safety: SetOsForTesting may be called at any time; systems created
// before the call keep the Os they were created with. The event handle
// limit and a slot's generation apply to calls that start after they are
// set.

#ifndef TPUSHIM_DRIVER_C_API_INTERNAL_H_
#define TPUSHIM_DRIVER_C_API_INTERNAL_H_

#include <cstdint>

#include "env/os.h"

namespace tpushim::capi_internal {

// Systems that System_Create brings up from now on make every OS call
// (environment included) through `os`, as SystemFactory::Create does;
// nullptr restores Os::Default(). `os` must outlive those systems. Lets a
// test run the C API with an empty environment.
void SetOsForTesting(Os* os);

// The event handle table (process-wide) takes at most `more` handles
// beyond those live now, until RestoreEventHandlesForTesting: lets a test
// fill it (2^24 handles otherwise) and see a full table refuse a call.
void LimitEventHandlesForTesting(uint64_t more);
void RestoreEventHandlesForTesting();

// The slot of `destroyed` (the id of an event handle destroyed since, its
// slot not reused yet) issues its next id with generation `generation`
// (2^32 - 1 at most, not below the slot's own): lets a test reach a
// slot's last generation without 2^32 reuses. False, changing nothing,
// otherwise.
bool SetEventSlotGenerationForTesting(uint64_t destroyed, uint64_t generation);

}  // namespace tpushim::capi_internal

#endif  // TPUSHIM_DRIVER_C_API_INTERNAL_H_
