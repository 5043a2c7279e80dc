#include <utility>

#include "common/status_macros.h"
#include "env/chips.h"
#include "env/options.h"
#include "tpushim/chips.h"

namespace tpushim {

absl::StatusOr<std::vector<ChipInfo>> ListChips(
    const OptionOverrides& overrides) {
  Os& os = *Os::Default();
  TPUSHIM_ASSIGN_OR_RETURN(const Options options,
                           ResolveOptions(os, overrides));
  TPUSHIM_ASSIGN_OR_RETURN(
      const std::vector<ChipState> states,
      QueryChips(os, options.run_dir.value, HostChips(options)));
  std::vector<ChipInfo> chips;
  for (const ChipState& s : states) {
    ChipInfo c;
    c.host_chip = s.chip.index;
    c.name = s.chip.name;
    c.lock_file = s.lock_file;
    c.held = s.held;
    if (s.held && s.holder.has_value()) {
      c.holder = ChipHolderInfo{.pid = s.holder->pid,
                                .user = s.holder->user,
                                .command_line = s.holder->command_line,
                                .since = s.holder->since};
    }
    chips.push_back(std::move(c));
  }
  return chips;
}

}  // namespace tpushim
