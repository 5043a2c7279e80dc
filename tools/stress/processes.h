// `tpushim stress --processes N`: N `tpushim stress` processes at once, on
// disjoint chips of one sim:// host (process i uses host chip i through
// TPU_VISIBLE_CHIPS), each hash-verifying its own transfers. Some are
// killed with SIGKILL at random moments; each killed process's chip must
// be free again within 100 ms (the kernel drops its lock as the process
// dies), the survivors must end without an error or violation, and no
// chip may stay held at the end. The children die with this process, even
// when it is killed with SIGKILL; SIGINT or SIGTERM is passed on to them as
// SIGTERM (each prints its partial report and frees its chip), and the
// report is marked partial.
//
// Thread-safety: runs on the caller's thread.

#ifndef TPUSHIM_TOOLS_STRESS_PROCESSES_H_
#define TPUSHIM_TOOLS_STRESS_PROCESSES_H_

#include <cstdint>
#include <string>

#include "tools/cli/command.h"

namespace tpushim::tools {

struct StressProcessesFlags {
  int processes = 0;
  int kills = -1;  // -1: processes / 2
  double seconds = 3;
  int threads = 2;
  uint64_t seed = 0;
  bool json = false;
};

// How long a killed holder's chip may stay held.
inline constexpr int64_t kChipFreedWithinMs = 100;

void RunStressProcesses(const StressProcessesFlags& flags,
                        CommandContext& context);

}  // namespace tpushim::tools

#endif  // TPUSHIM_TOOLS_STRESS_PROCESSES_H_
