// Chips of the host and who owns them.
//
// A host has chips: sim://'s `devices=N` chips, shared by every process of
// the host, or the PCI function of a vfio:// URL. A System owns the chips
// it uses from its creation to its destruction through one lock file per
// chip in the run directory (TPUSHIM_RUN_DIR, default /tmp/tpushim-run):
// `<run dir>/sim-<i>.lock` or `<run dir>/vfio-<pci address>.lock`. The lock
// is an open file description lock (fcntl F_OFD_SETLK) on that file, which
// the kernel drops when the holder closes it, exits or is killed: a lock
// is never stale, and the file's existence means nothing. While it holds
// the lock, the holder keeps its record in the file (pid, user, command
// line, since when), for the error a refused process gets and for
// `tpushim info`.
//
// The run directory is created world-writable with the sticky bit (like
// /tmp) and each lock file readable and writable by everyone, so that
// processes of every user, root included, meet each other's locks there.
//
// Thread-safety: the functions are thread-safe; a ChipOwnership is owned
// by one System.
//
//   TPUSHIM_ASSIGN_OR_RETURN(
//       ChipOwnership owned,
//       ChipOwnership::Acquire(*os, options.run_dir.value,
//                              ProcessHostChips(options)));
//   ... until `owned` is destroyed, no other System can have these chips.

#ifndef TPUSHIM_ENV_CHIPS_H_
#define TPUSHIM_ENV_CHIPS_H_

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "env/host_facts.h"
#include "env/options.h"
#include "env/os.h"

namespace tpushim {

// One chip of the host.
struct HostChip {
  int index = 0;     // the host chip index (0 for a vfio:// function)
  std::string name;  // "sim chip 2", "vfio chip 0000:01:00.0"
  std::string key;   // its lock file's name without ".lock": "sim-2"
};

// Every chip of the host `options.device` names, in index order.
std::vector<HostChip> HostChips(const Options& options);
// The chips this process uses (TPU_VISIBLE_CHIPS), in device order.
std::vector<HostChip> ProcessHostChips(const Options& options);

// Who holds a chip, as its holder recorded it.
struct ChipHolder {
  int64_t pid = 0;
  std::string user;
  std::string command_line;  // arguments joined by spaces
  absl::Time since = absl::UnixEpoch();
  // The host memory it pins (its region, or its bounce pool).
  uint64_t pinned_bytes = 0;

  // "pid 1234, user alice, command line \"python train.py\", since
  // 2026-11-27 09:40:01 UTC (12s ago)".
  std::string Describe(absl::Time now) const;
};

struct ChipState {
  HostChip chip;
  std::string lock_file;
  bool held = false;
  // The holder's record; nullopt when the chip is free, or held by a
  // process that has not written (or cannot have read) its record yet.
  std::optional<ChipHolder> holder;
};

// The chips a System owns; the locks are let go when it is destroyed.
class ChipOwnership {
 public:
  ChipOwnership() = default;
  ChipOwnership(ChipOwnership&& other) noexcept;
  ChipOwnership& operator=(ChipOwnership&& other) noexcept;
  ChipOwnership(const ChipOwnership&) = delete;
  ChipOwnership& operator=(const ChipOwnership&) = delete;
  ~ChipOwnership();

  // Takes the lock of every chip of `chips` in `run_dir` (created when
  // missing), all or none, and writes this process's holder record into
  // each. Nothing waits: a chip another System holds (in this process or
  // another) is UNAVAILABLE naming the chip, its holder's pid, user,
  // command line and since when, and `tpushim info`. A run directory or
  // lock file that cannot be made, opened or locked is an error naming it
  // and TPUSHIM_RUN_DIR, with the code of the failing call. On any error
  // no lock is left held. `os` must outlive the ownership.
  // `pinned_bytes` goes into the record: what this process pins, for the
  // host checks of the processes that start after it.
  static absl::StatusOr<ChipOwnership> Acquire(
      Os& os, const std::string& run_dir, const std::vector<HostChip>& chips,
      uint64_t pinned_bytes = 0);

  int size() const { return static_cast<int>(fds_.size()); }

 private:
  void Release();
  Os* os_ = nullptr;
  std::vector<int> fds_;
};

// The state of each of `chips`, then of every other chip whose lock file
// in `run_dir` is held (a process using a larger sim:// host), by key.
// A missing run directory or lock file is a free chip. Takes no lock.
absl::StatusOr<std::vector<ChipState>> QueryChips(
    Os& os, const std::string& run_dir, const std::vector<HostChip>& chips);

// Adds to `facts` the other tpushim processes holding chips in `run_dir`:
// each with what it pins now (VmLck) of what it said it would pin, and the
// sum of what they have yet to pin (HostFacts::other_tpushim*). Unreadable
// records and processes are skipped.
void AddOtherTpushimProcesses(Os& os, const std::string& run_dir,
                              HostFacts& facts);

// The processes with `path` open (/proc/<pid>/fd), as "pid 123 (qemu
// -m 4G ...)", for an EBUSY that should name who holds a device node.
// Processes this user cannot look into are not seen.
std::vector<std::string> ProcessesHolding(Os& os, const std::string& path);

// libtpu's own lock file, which outlives its processes and which tpushim
// never honours.
inline constexpr char kLibtpuLockfile[] = "/tmp/libtpu_lockfile";
// Its age when it exists.
std::optional<absl::Duration> LibtpuLockfileAge(Os& os);

}  // namespace tpushim

#endif  // TPUSHIM_ENV_CHIPS_H_
