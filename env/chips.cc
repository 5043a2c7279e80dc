#include "env/chips.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/human_bytes.h"
#include "common/status_macros.h"
#include "env/fork_guard.h"

namespace tpushim {
namespace {

HostChip ChipOf(const DeviceUrl& url, int index) {
  if (url.scheme == DeviceUrl::Scheme::kVfio) {
    const std::string address = url.pci_address.ToString();
    return HostChip{.index = 0,
                    .name = absl::StrCat("vfio chip ", address),
                    .key = absl::StrCat("vfio-", address)};
  }
  return HostChip{.index = index,
                  .name = absl::StrCat("sim chip ", index),
                  .key = absl::StrCat("sim-", index)};
}

std::string LockFileOf(const std::string& run_dir, const HostChip& chip) {
  return absl::StrCat(run_dir, "/", chip.key, ".lock");
}

// The holder record: `name=value` lines, the command line last.
std::string FormatRecord(const ChipHolder& h) {
  return absl::StrCat("pid=", h.pid, "\nuser=", h.user,
                      "\nsince_us=", absl::ToUnixMicros(h.since),
                      "\npinned_bytes=", h.pinned_bytes,
                      "\ncommand_line=", h.command_line, "\n");
}

std::optional<ChipHolder> ParseRecord(absl::string_view text) {
  ChipHolder h;
  bool has_pid = false;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    const size_t eq = line.find('=');
    if (eq == line.npos) continue;
    const absl::string_view name = line.substr(0, eq);
    const absl::string_view value = line.substr(eq + 1);
    if (name == "pid") {
      has_pid = absl::SimpleAtoi(value, &h.pid);
    } else if (name == "user") {
      h.user = std::string(value);
    } else if (name == "since_us") {
      int64_t us = 0;
      if (absl::SimpleAtoi(value, &us)) h.since = absl::FromUnixMicros(us);
    } else if (name == "pinned_bytes") {
      (void)absl::SimpleAtoi(value, &h.pinned_bytes);
    } else if (name == "command_line") {
      h.command_line = std::string(value);
    }
  }
  if (!has_pid) return std::nullopt;
  return h;
}

std::string CommandLineOfSelf(Os& os) {
  absl::StatusOr<std::string> raw = os.ReadFile("/proc/self/cmdline");
  if (!raw.ok()) return "";
  std::string line = *std::move(raw);
  std::replace(line.begin(), line.end(), '\0', ' ');
  std::replace(line.begin(), line.end(), '\n', ' ');
  return std::string(absl::StripTrailingAsciiWhitespace(line));
}

// Creates the run directory when missing: world-writable and sticky.
absl::Status EnsureRunDirectory(Os& os, const std::string& run_dir) {
  absl::StatusOr<FileInfo> info = os.Lstat(run_dir);
  if (!info.ok() && absl::IsNotFound(info.status())) {
    absl::Status made = os.MakeDirectory(run_dir, 0777);
    if (made.ok()) {
      (void)os.ChangeMode(run_dir, 01777);
    } else if (!absl::IsAlreadyExists(made)) {
      return absl::Status(
          made.code(),
          absl::StrCat("Cannot create the run directory of the chip locks \"",
                       run_dir, "\" (TPUSHIM_RUN_DIR): ", made.message(),
                       "; set TPUSHIM_RUN_DIR to a directory every process "
                       "sharing these chips can write"));
    }
    info = os.Lstat(run_dir);
  }
  if (!info.ok()) {
    return absl::Status(
        info.status().code(),
        absl::StrCat("The run directory of the chip locks \"", run_dir,
                     "\" (TPUSHIM_RUN_DIR): ", info.status().message()));
  }
  if (info->type != FileInfo::Type::kDirectory) {
    return absl::FailedPreconditionError(absl::StrCat(
        "The run directory of the chip locks \"", run_dir,
        "\" (TPUSHIM_RUN_DIR) is not a directory",
        info->type == FileInfo::Type::kSymlink ? " (a symbolic link)" : "",
        "; remove it or set TPUSHIM_RUN_DIR to another directory"));
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<HostChip> HostChips(const Options& options) {
  std::vector<HostChip> chips;
  for (int i = 0; i < options.host_chip_count(); ++i) {
    chips.push_back(ChipOf(options.device.value, i));
  }
  return chips;
}

std::vector<HostChip> ProcessHostChips(const Options& options) {
  std::vector<HostChip> chips;
  for (int i : options.ProcessChips()) {
    chips.push_back(ChipOf(options.device.value, i));
  }
  return chips;
}

std::string ChipHolder::Describe(absl::Time now) const {
  const absl::Duration held = absl::Seconds(absl::ToInt64Seconds(now - since));
  return absl::StrCat(
      "pid ", pid, ", user ", user.empty() ? "?" : user, ", command line \"",
      command_line, "\", since ",
      absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", since, absl::UTCTimeZone()),
      " (",
      held < absl::Seconds(1) ? std::string("0s") : absl::FormatDuration(held),
      " ago)");
}

ChipOwnership::ChipOwnership(ChipOwnership&& other) noexcept
    : os_(other.os_), fds_(std::exchange(other.fds_, {})) {}

ChipOwnership& ChipOwnership::operator=(ChipOwnership&& other) noexcept {
  if (this != &other) {
    Release();
    os_ = other.os_;
    fds_ = std::exchange(other.fds_, {});
  }
  return *this;
}

ChipOwnership::~ChipOwnership() { Release(); }

void ChipOwnership::Release() {
  // A fork() child never has these descriptors (CloseInForkChild), so this
  // runs only in the owner.
  for (int fd : fds_) {
    ForgetCloseInForkChild(fd);
    (void)os_->Close(fd);
  }
  fds_.clear();
}

absl::StatusOr<ChipOwnership> ChipOwnership::Acquire(
    Os& os, const std::string& run_dir, const std::vector<HostChip>& chips,
    uint64_t pinned_bytes) {
  ChipOwnership owned;
  owned.os_ = &os;
  if (chips.empty()) return owned;
  TPUSHIM_RETURN_IF_ERROR(EnsureRunDirectory(os, run_dir));
  const ChipHolder me{.pid = os.ProcessId(),
                      .user = os.UserName(),
                      .command_line = CommandLineOfSelf(os),
                      .since = os.Now(),
                      .pinned_bytes = pinned_bytes};
  const std::string record = FormatRecord(me);
  for (const HostChip& chip : chips) {
    const std::string path = LockFileOf(run_dir, chip);
    absl::StatusOr<int> fd = os.OpenLockFile(path, /*create=*/true);
    if (!fd.ok()) {
      return absl::Status(
          fd.status().code(),
          absl::StrCat("Cannot open the lock file of ", chip.name, " \"", path,
                       "\": ", fd.status().message(),
                       "; every process sharing the chips must be able to "
                       "write it (or set TPUSHIM_RUN_DIR elsewhere)"));
    }
    // `owned` closes it from here on, whatever happens.
    owned.fds_.push_back(*fd);
    CloseInForkChild(*fd);
    absl::StatusOr<bool> locked = os.TryLockFile(*fd);
    if (!locked.ok()) {
      return absl::Status(locked.status().code(),
                          absl::StrCat("Cannot lock ", chip.name, " (\"", path,
                                       "\"): ", locked.status().message()));
    }
    if (!*locked) {
      absl::StatusOr<std::string> text = os.ReadFile(path);
      const std::optional<ChipHolder> holder =
          text.ok() ? ParseRecord(*text) : std::nullopt;
      return absl::UnavailableError(absl::StrCat(
          chip.name, " is held by another tpushim System: ",
          holder.has_value()
              ? holder->Describe(os.Now())
              : std::string("its holder has not written its record yet"),
          holder.has_value() && holder->pid == me.pid ? " (this process)" : "",
          ". Run `tpushim info` to see every chip's holder; wait for it to "
          "end, or choose other chips with TPU_VISIBLE_CHIPS"));
    }
    // The record is a courtesy to whoever is refused: a failed write
    // leaves the chip owned, its holder unnamed.
    if (os.Truncate(*fd, 0).ok()) {
      (void)os.PwriteAll(*fd, record.data(), record.size(), 0);
    }
  }
  return owned;
}

absl::StatusOr<std::vector<ChipState>> QueryChips(
    Os& os, const std::string& run_dir, const std::vector<HostChip>& chips) {
  auto state_of = [&](const HostChip& chip) -> absl::StatusOr<ChipState> {
    ChipState state;
    state.chip = chip;
    state.lock_file = LockFileOf(run_dir, chip);
    absl::StatusOr<int> fd = os.OpenLockFile(state.lock_file, false);
    if (!fd.ok()) {
      if (absl::IsNotFound(fd.status())) return state;
      return fd.status();
    }
    absl::StatusOr<bool> held = os.FileLockedByOther(*fd);
    (void)os.Close(*fd);
    TPUSHIM_RETURN_IF_ERROR(held.status());
    state.held = *held;
    if (state.held) {
      absl::StatusOr<std::string> text = os.ReadFile(state.lock_file);
      if (text.ok()) state.holder = ParseRecord(*text);
    }
    return state;
  };
  std::vector<ChipState> states;
  for (const HostChip& chip : chips) {
    TPUSHIM_ASSIGN_OR_RETURN(ChipState s, state_of(chip));
    states.push_back(std::move(s));
  }
  // Held chips beyond `chips`: a process on a larger host.
  absl::StatusOr<std::vector<std::string>> names = os.ListDirectory(run_dir);
  if (!names.ok()) return states;
  std::sort(names->begin(), names->end());
  for (absl::string_view name : *names) {
    if (!absl::ConsumeSuffix(&name, ".lock")) continue;
    const bool known =
        std::any_of(chips.begin(), chips.end(),
                    [&](const HostChip& c) { return c.key == name; });
    if (known) continue;
    HostChip chip;
    chip.key = std::string(name);
    absl::string_view rest = name;
    if (absl::ConsumePrefix(&rest, "sim-") &&
        absl::SimpleAtoi(rest, &chip.index)) {
      chip.name = absl::StrCat("sim chip ", chip.index);
    } else if (absl::ConsumePrefix(&rest, "vfio-")) {
      chip.name = absl::StrCat("vfio chip ", rest);
    } else {
      continue;
    }
    absl::StatusOr<ChipState> s = state_of(chip);
    if (s.ok() && s->held) states.push_back(*std::move(s));
  }
  return states;
}

void AddOtherTpushimProcesses(Os& os, const std::string& run_dir,
                              HostFacts& facts) {
  absl::StatusOr<std::vector<ChipState>> states = QueryChips(os, run_dir, {});
  if (!states.ok()) return;
  const int64_t self = os.ProcessId();
  std::vector<int64_t> seen;
  for (const ChipState& s : *states) {
    if (!s.holder.has_value() || s.holder->pid == self) continue;
    if (std::find(seen.begin(), seen.end(), s.holder->pid) != seen.end()) {
      continue;
    }
    seen.push_back(s.holder->pid);
    uint64_t locked = 0;
    absl::StatusOr<std::string> status =
        os.ReadFile(absl::StrCat("/proc/", s.holder->pid, "/status"));
    if (!status.ok()) continue;
    for (absl::string_view line : absl::StrSplit(*status, '\n')) {
      if (absl::ConsumePrefix(&line, "VmLck:")) {
        line = absl::StripAsciiWhitespace(line);
        absl::ConsumeSuffix(&line, " kB");
        uint64_t kb = 0;
        if (absl::SimpleAtoi(line, &kb)) locked = kb * 1024;
      }
    }
    const uint64_t planned = s.holder->pinned_bytes;
    if (planned > locked) facts.other_tpushim_pending_bytes += planned - locked;
    facts.other_tpushim.push_back(absl::StrCat(
        "pid ", s.holder->pid, " pins ", HumanReadableBytes(locked), " of ",
        HumanReadableBytes(planned)));
  }
}

std::vector<std::string> ProcessesHolding(Os& os, const std::string& path) {
  std::vector<std::string> holders;
  absl::StatusOr<std::vector<std::string>> pids = os.ListDirectory("/proc");
  if (!pids.ok()) return holders;
  std::sort(pids->begin(), pids->end());
  for (const std::string& pid : *pids) {
    int64_t n = 0;
    if (!absl::SimpleAtoi(pid, &n)) continue;
    const std::string fd_dir = absl::StrCat("/proc/", pid, "/fd");
    absl::StatusOr<std::vector<std::string>> fds = os.ListDirectory(fd_dir);
    if (!fds.ok()) continue;
    for (const std::string& fd : *fds) {
      absl::StatusOr<std::string> target =
          os.ReadLink(absl::StrCat(fd_dir, "/", fd));
      if (!target.ok() || *target != path) continue;
      absl::StatusOr<std::string> cmdline =
          os.ReadFile(absl::StrCat("/proc/", pid, "/cmdline"));
      std::string line = cmdline.ok() ? *cmdline : "";
      std::replace(line.begin(), line.end(), '\0', ' ');
      holders.push_back(absl::StrCat(
          "pid ", pid, " (", absl::StripTrailingAsciiWhitespace(line), ")"));
      break;
    }
  }
  return holders;
}

std::optional<absl::Duration> LibtpuLockfileAge(Os& os) {
  absl::StatusOr<FileInfo> info = os.Lstat(kLibtpuLockfile);
  if (!info.ok()) return std::nullopt;
  return std::max(os.Now() - info->modified, absl::ZeroDuration());
}

}  // namespace tpushim
