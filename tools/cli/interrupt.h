// SIGINT and SIGTERM for the `tpushim` subcommands. A long subcommand
// (demo, bench, tune, stress) stops at its next step when one arrives: it
// stops its child processes, tears the runtime down (which unpins and
// unmaps everything), prints what it gathered so far marked as partial
// ("partial": true in JSON, cells not measured written with the reason
// `interrupted` in CSV), and the process exits 128 + the signal (130 for
// SIGINT, 143 for SIGTERM). A second signal ends the process at once.
//
//   InstallInterruptHandling();          // first thing, before any thread
//   ...
//   for (cell : cells) {
//     if (InterruptSignal() != 0) break;
//     ...
//   }
//   RunSubprocess(path, args, env, timeout, InterruptFd());  // cancellable
//
// Signals are blocked in every thread and taken by one thread of this
// module (sigwait), so no code of the runtime ever runs in a signal
// handler. Without InstallInterruptHandling (in-process tests)
// InterruptSignal() stays 0 and InterruptFd() is -1.
//
// Thread-safety: every function may be called from any thread.

#ifndef TPUSHIM_TOOLS_CLI_INTERRUPT_H_
#define TPUSHIM_TOOLS_CLI_INTERRUPT_H_

#include <string>

#include "absl/time/time.h"

namespace tpushim::tools {

// Blocks SIGINT and SIGTERM in the calling thread, and so in every thread
// started after it, and starts the thread that waits for them. Call once,
// before any other thread starts. Idempotent.
void InstallInterruptHandling();

// The first SIGINT or SIGTERM received, 0 while none.
int InterruptSignal();

// Readable once a signal was received (for poll, or RunSubprocess's
// cancel_fd); -1 without InstallInterruptHandling.
int InterruptFd();

// Sleeps up to `timeout`, returning early (true) when a signal arrives.
bool WaitForInterrupt(absl::Duration timeout);

// "SIGINT", "SIGTERM".
std::string InterruptSignalName(int signal);

// For tests: acts as if `signal` had been received (0 clears it).
void SimulateInterruptForTesting(int signal);

}  // namespace tpushim::tools

#endif  // TPUSHIM_TOOLS_CLI_INTERRUPT_H_
