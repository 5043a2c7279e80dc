// Fork safety of the memory devices DMA to and from.
//
// A fork() child shares every private page of its parent copy-on-write, so
// after a fork each first write by the parent to such a page copies it —
// the premapped region would turn copy-on-write for as long as a child
// lives (a DataLoader worker, a `subprocess` of a training script), and a
// page the kernel holds pinned for DMA is copied into the child at fork()
// itself. The runtime's DMA memory (the premapped region, DMA arenas,
// bounce pools, simulated device memory) is therefore excluded from fork:
// ExcludeFromFork() marks it MADV_DONTFORK, and the child gets, at the same
// addresses, a reservation with no access (PROT_NONE, nothing committed).
// A child that touches memory of its parent's runtime gets SIGSEGV at
// once: the address can never be reused for one of the child's own
// allocations, so a stale pointer cannot silently read or corrupt them.
//
// Objects of the runtime inherited by a child (a System, its buffers and
// handles) belong to the parent: ForkedChildOf() lets them refuse calls
// with FAILED_PRECONDITION and skip their teardown in the child before
// they take any lock (a lock held by another parent thread at fork() stays
// held in the child forever). A child that only calls exec or _exit
// touches none of them.
//
// Thread-safety: all functions are thread-safe and lock-free; the child
// side runs from a pthread_atfork handler, before fork() returns there.
//
//   TPUSHIM_RETURN_IF_ERROR(ExcludeFromFork(*os, base, size, "the region"));
//   ...
//   ForgetForkExclusion(base);
//   (void)os->Munmap(base, size);

#ifndef TPUSHIM_ENV_FORK_GUARD_H_
#define TPUSHIM_ENV_FORK_GUARD_H_

#include <sys/types.h>

#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "env/os.h"

namespace tpushim {

// Marks [addr, addr + length) MADV_DONTFORK through `os` (fault point
// `madvise`) and records it, so that a fork() child gets a no-access
// reservation there. `what` names the memory in the error ("the premapped
// region"). On failure nothing is recorded and the status names `what`.
// REQUIRES: the range is a whole mapping made with mmap, page-aligned.
absl::Status ExcludeFromFork(Os& os, void* addr, size_t length,
                             absl::string_view what);

// Forgets the range starting at `addr` (before it is unmapped). Ranges
// never recorded are ignored.
void ForgetForkExclusion(const void* addr);

// Whether the range starting at `addr` is recorded as excluded from fork.
bool IsExcludedFromFork(const void* addr);

// Records `fd` to be closed in every fork() child (up to 256 at once;
// more are left open in children): a descriptor whose open file
// description carries a lock the parent owns (a chip lock) would otherwise
// keep it held for as long as a child lives, after the parent let go.
void CloseInForkChild(int fd);
// Forgets `fd` (before the parent closes it). Unrecorded ones are ignored.
void ForgetCloseInForkChild(int fd);

// This process's id, kept current across fork() without a system call.
pid_t CurrentProcessId();

// True in a fork() child of the process `owner` (a CurrentProcessId()
// taken when the object was made).
inline bool ForkedChildOf(pid_t owner) { return CurrentProcessId() != owner; }

// FAILED_PRECONDITION for a call on `what` ("this System") made in a fork()
// child of `owner`, naming both processes.
absl::Status ForkedChildError(absl::string_view what, pid_t owner);

}  // namespace tpushim

#endif  // TPUSHIM_ENV_FORK_GUARD_H_
