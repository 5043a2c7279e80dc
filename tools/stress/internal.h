// Test seam of `tpushim stress` (tools/stress/stress.cc): a hook that sees the
// bytes of every transfer from the device before they are hash-checked, so
// that a test can plant a corruption and check that the run catches it.
// Not part of the tool's interface: no flag or variable reaches it.
//
// Thread-safety: set the hook only while no stress run is in progress; the
// hook itself is called from the run's worker threads, concurrently.
//
//   SetArrivedBytesHookForTesting([&](const ArrivedBytes& a) {
//     if (++seen == 5) a.data[0] ^= 1;   // the 5th checked transfer
//   });
//   ... run `tpushim stress` in-process: it must report a hash mismatch ...
//   SetArrivedBytesHookForTesting(nullptr);

#ifndef TPUSHIM_TOOLS_STRESS_INTERNAL_H_
#define TPUSHIM_TOOLS_STRESS_INTERNAL_H_

#include <cstdint>
#include <functional>

#include "absl/strings/string_view.h"

namespace tpushim::tools::stress_internal {

// A transfer whose bytes arrived and are about to be checked.
struct ArrivedBytes {
  int thread = 0;         // the worker that issued it
  uint64_t op_index = 0;  // its operation, within the worker
  absl::string_view op;   // "d2h", or "chain" for a chain's last leg
  uint8_t* data = nullptr;
  uint64_t size = 0;
};

using ArrivedBytesHook = std::function<void(const ArrivedBytes&)>;

// Calls `hook` on every device→host transfer that completed OK and whose
// bytes the run knows, before they are hashed; it may change them. Null (an
// empty function) removes it.
void SetArrivedBytesHookForTesting(ArrivedBytesHook hook);

}  // namespace tpushim::tools::stress_internal

#endif  // TPUSHIM_TOOLS_STRESS_INTERNAL_H_
