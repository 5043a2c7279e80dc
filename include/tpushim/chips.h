// The chips of the host and who holds them: what `tpushim info` shows,
// for a launcher that waits for a chip instead of deleting lock files.
//
// A System owns the chips it uses (TPU_VISIBLE_CHIPS, else every chip of
// its TPUSHIM_DEVICE) from its creation to its destruction; the kernel lets
// go of them when the owning process exits or is killed. ListChips reads
// every chip's state without taking any.
//
// Thread-safety: thread-safe.
//
//   tpushim::OptionOverrides o;
//   o.device = "sim://?devices=4";
//   absl::StatusOr<std::vector<tpushim::ChipInfo>> chips =
//   tpushim::ListChips(o); for (const tpushim::ChipInfo& c : *chips)
//     if (!c.held) std::cout << "chip " << c.host_chip << " is free\n";

#ifndef TPUSHIM_CHIPS_H_
#define TPUSHIM_CHIPS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tpushim/export.h"
#include "tpushim/options.h"

namespace tpushim {

// The process holding a chip, as it recorded itself.
struct ChipHolderInfo {
  int64_t pid = 0;
  std::string user;
  std::string command_line;  // its arguments joined by spaces
  absl::Time since = absl::UnixEpoch();
};

struct ChipInfo {
  int host_chip = 0;      // the host's index for it (0 for a vfio:// function)
  std::string name;       // "sim chip 2", "vfio chip 0000:01:00.0"
  std::string lock_file;  // its lock file in the run directory
  bool held = false;
  // The holder; nullopt when free, or held by a process that has not
  // written its record yet.
  std::optional<ChipHolderInfo> holder;
};

// Every chip of the host that the options' TPUSHIM_DEVICE names (then any
// other chip held in the same run directory), in index order, resolved as
// System::Create resolves them (API > LIBTPU_INIT_ARGS > environment >
// defaults). Takes no chip and starts nothing.
//
// Errors: INVALID_ARGUMENT for a malformed setting (as System::Create); the
// failing call's status when a lock file cannot be read.
TPUSHIM_EXPORT absl::StatusOr<std::vector<ChipInfo>> ListChips(
    const OptionOverrides& overrides = {});

}  // namespace tpushim

#endif  // TPUSHIM_CHIPS_H_
