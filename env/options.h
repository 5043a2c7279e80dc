// tpushim's configuration: one options struct, resolved once at system
// creation from (highest first) API overrides, `LIBTPU_INIT_ARGS` flags,
// environment variables and defaults.
//
// Every resolved value remembers where it came from and the text it was
// parsed from, so `tpushim info` and the start-up log can say "4294967296
// (default)" or "8589934592 (env TPU_PREMAPPED_BUFFER_SIZE)".
//
// Resolution reads variables only through the Os layer (tests pass an Os
// whose GetEnv returns what they want; nothing calls setenv). It allocates,
// pins and starts nothing: a malformed value is INVALID_ARGUMENT naming the
// variable (or flag) and the value, and no Options come back.
//
// Thread-safety: ResolveOptions is a pure function of its inputs; Options
// is a plain value.
//
//   OptionOverrides api;
//   api.premapped_buffer_size = 1 << 30;
//   TPUSHIM_ASSIGN_OR_RETURN(Options options, ResolveOptions(*os, api));
//   for (const std::string& w : options.warnings) LOG(WARNING) << w;

#ifndef TPUSHIM_ENV_OPTIONS_H_
#define TPUSHIM_ENV_OPTIONS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "env/device_url.h"
#include "env/fault_injection.h"
#include "env/os.h"
#include "tpushim/options.h"

namespace tpushim {

// Where a resolved value came from, lowest precedence first.
enum class OptionSource { kDefault, kEnv, kFlag, kApi };

// "default", "env", "LIBTPU_INIT_ARGS", "api".
absl::string_view OptionSourceName(OptionSource source);

template <typename T>
struct Option {
  T value{};
  OptionSource source = OptionSource::kDefault;
  // The text the value was parsed from; empty for defaults and for values
  // passed through the API. (The `{}` lets `Option<T>{value}` compile
  // under -Wmissing-field-initializers.)
  std::string raw{};
};

absl::string_view HugePagesModeName(HugePagesMode mode);  // "auto", ...
absl::string_view MlockModeName(MlockMode mode);          // "on", ...
absl::string_view PremapModeName(PremapMode mode);        // "foreground", ...

// One `glob=N` entry of TPU_VMODULE.
struct VmoduleEntry {
  std::string glob;
  int level = 0;
  bool operator==(const VmoduleEntry&) const = default;
};

// Parses TPU_VMODULE. Well-formed entries come back; each malformed one
// (no '=', empty glob, level not a non-negative decimal int) is skipped and
// described in `warnings` — the one exception to a malformed setting being
// INVALID_ARGUMENT.
// Whitespace around entries, globs and levels is trimmed; empty entries
// ("", "a=1,", "a=1,,b=2") are no entries and draw no warning. `warnings`
// may be null.
std::vector<VmoduleEntry> ParseVmodule(absl::string_view text,
                                       std::vector<std::string>* warnings);

inline constexpr uint64_t kDefaultPremappedBufferSize = uint64_t{4} << 30;
inline constexpr uint64_t kPremappedSizeMultiple = 4096;
// With the region off (TPU_PREMAPPED_BUFFER_SIZE=0) the transfer engine
// pins a bounce pool of this size at start-up, counted against
// RLIMIT_MEMLOCK, and stages host transfers of up to kBounceMaxBytes
// through it instead of pinning the caller's pages per call.
inline constexpr uint64_t kBouncePoolBytes = uint64_t{4} << 20;
inline constexpr uint64_t kBounceMaxBytes = uint64_t{1} << 20;
// TPUSHIM_RUN_DIR's default: host-wide, so that every process (of every
// user) meets the others' chip locks there.
inline constexpr std::string_view kDefaultRunDirectory = "/tmp/tpushim-run";

struct Options {
  // TPU_PREMAPPED_BUFFER_SIZE: bytes, 0 = no region, else a multiple of
  // 4096.
  Option<uint64_t> premapped_buffer_size{kDefaultPremappedBufferSize};
  // TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES: > 0; defaults to the
  // size; clamped to the size (one warning; source and raw stay those of
  // the value given). When the region is off it is 0 with source kDefault:
  // a value given for it is still checked to be a decimal but otherwise
  // ignored (0 included, so `SIZE=0 THRESHOLD=0` is fine), with no warning.
  Option<uint64_t> premapped_buffer_transfer_threshold_bytes{
      kDefaultPremappedBufferSize};
  // TPU_LOG_DIR: a directory; "disabled" turns log files off.
  Option<std::string> log_dir{"/tmp/tpu_logs"};
  // TPU_MIN_LOG_LEVEL: 0 INFO .. 3 FATAL.
  Option<int> min_log_level{0};
  // TPU_STDERR_LOG_LEVEL: 0 INFO .. 3 FATAL.
  Option<int> stderr_log_level{2};
  // TPU_VMODULE, parsed.
  Option<std::vector<VmoduleEntry>> vmodule;
  // TPU_MAX_LOG_SIZE_MB: 1 .. 1048576.
  Option<uint64_t> max_log_size_mb{1024};
  // TPUSHIM_LOG_KEEP: rotated files kept per severity, 0 .. 1000000.
  Option<int> log_keep{5};
  // TPUSHIM_DEVICE.
  Option<DeviceUrl> device{DeviceUrl::Default()};
  // TPUSHIM_HUGEPAGES.
  Option<HugePagesMode> hugepages{HugePagesMode::kAuto};
  // TPUSHIM_PREFAULT_THREADS: 0 = online CPUs, at most 16; else 1 .. 1024.
  Option<int> prefault_threads{0};
  // TPUSHIM_NUMA_NODE: nullopt = auto, else a node number 0 .. 1023.
  Option<std::optional<int>> numa_node;
  // TPUSHIM_MLOCK.
  Option<MlockMode> mlock{MlockMode::kOn};
  // TPUSHIM_FAULTS.
  Option<FaultSpec> faults;
  // TPUSHIM_TRACE_FILE: empty = no trace.
  Option<std::string> trace_file;
  // TPUSHIM_PREMAP.
  Option<PremapMode> premap{PremapMode::kForeground};
  // TPUSHIM_DUMP_ON_OOM: "0" or "1".
  Option<bool> dump_on_oom{false};
  // TPUSHIM_MEMORY_PROFILE: empty = no profile.
  Option<std::string> memory_profile;
  // TPU_VISIBLE_CHIPS (alias TPU_VISIBLE_DEVICES): distinct host chip
  // indices, each below host_chip_count(); empty = every chip of the host.
  Option<std::vector<int>> visible_chips;
  // TPU_CHIPS_PER_PROCESS_BOUNDS (alias TPU_CHIPS_PER_HOST_BOUNDS): empty,
  // or three positive integers whose product is the number of chips this
  // process uses.
  Option<std::vector<int>> chips_per_process_bounds;
  // TPU_PROCESS_BOUNDS (alias TPU_HOST_BOUNDS): empty, or three positive
  // integers (recorded and shown; tpushim runs one host).
  Option<std::vector<int>> process_bounds;
  // TPUSHIM_RUN_DIR: where the chips' lock files live (env/chips.h).
  Option<std::string> run_dir{std::string(kDefaultRunDirectory)};

  // WARNINGs produced while resolving (threshold clamped, malformed
  // TPU_VMODULE entries), to be logged once logging is up.
  std::vector<std::string> warnings;

  bool premapped_region_enabled() const {
    return premapped_buffer_size.value != 0;
  }
  bool log_files_disabled() const { return log_dir.value == "disabled"; }
  // TPUSHIM_PREFAULT_THREADS resolved against the online CPU count.
  int EffectivePrefaultThreads(int online_cpus) const;
  // The chips of the host the device URL names: sim://'s devices=N, one
  // for a vfio:// function.
  int host_chip_count() const;
  // The host chips this process uses, in device order: visible_chips, or
  // 0 .. host_chip_count()-1 when it is empty.
  std::vector<int> ProcessChips() const;
};

// OptionOverrides (values given through the API) is declared in the
// public header tpushim/options.h.

// Resolves the options.
//
// `LIBTPU_INIT_ARGS` holds whitespace-separated flags as absl parses them
// (`--name=value`, `-name=value`, `--name value`; a bare `--` ends the
// flags). Only `--tpu_premapped_buffer_size` and
// `--tpu_premapped_buffer_transfer_threshold_bytes` are tpushim's; every
// other flag and word belongs to the rest of libtpu and is ignored. A flag
// given twice: the last one wins.
//
// Numbers are strict decimals (ParseDecimal); words (auto, on, ...) match
// case-insensitively. Every value that is given is validated, including
// one that a higher-precedence source overrides: a malformed
// TPU_PREMAPPED_BUFFER_SIZE is an error even when the API sets the size.
// Only the winning value's warnings are kept.
//
// Three settings have a second variable that means the same
// (TPU_VISIBLE_DEVICES for TPU_VISIBLE_CHIPS, TPU_CHIPS_PER_HOST_BOUNDS for
// TPU_CHIPS_PER_PROCESS_BOUNDS, TPU_HOST_BOUNDS for TPU_PROCESS_BOUNDS):
// either may be set; both set to different text is INVALID_ARGUMENT naming
// both. Visible chips are checked against the host's chips (duplicates,
// out of range) and the chips-per-process bounds against their number.
//
// Errors: INVALID_ARGUMENT whose message names the variable (or
// `LIBTPU_INIT_ARGS flag --<flag>`, or `API option <field>`) and the
// offending value, quoted, e.g.
//   TPU_PREMAPPED_BUFFER_SIZE="5000" is not a multiple of 4096 (whole 4 KiB
//   pages); the nearest valid values are 4096 and 8192
//   TPUSHIM_FAULTS="mmap:nth=0": <what ParseFaultSpec says>
absl::StatusOr<Options> ResolveOptions(Os& os, const OptionOverrides& api = {});

// Sets the field of `overrides` for the setting whose environment variable
// is `variable` (e.g. "TPU_PREMAPPED_BUFFER_SIZE", case-sensitive) from
// `text`, parsed by the same parser as that variable's environment value
// (for the C API's name/value options). Overwrites a field already set.
//
// Errors (and `overrides` is left unchanged): INVALID_ARGUMENT for an
// unknown variable (the message names it and lists the known ones) or a
// malformed value, with the message an environment value would get, e.g.
//   TPU_PREMAPPED_BUFFER_SIZE="5000" is not a multiple of 4096 ...
// Checks that relate one setting to another (the threshold against the
// size) need the other one resolved, so they happen in ResolveOptions,
// whose message names `API option <field>`.
absl::Status SetOptionOverride(OptionOverrides& overrides,
                               absl::string_view variable,
                               absl::string_view text);

// One row per setting, for `tpushim info` and the start-up INFO line, in
// the order of docs/configuration.md's table. Values are canonical text:
// enums as their words, the NUMA node as `auto` or its number, TPU_VMODULE
// as `glob=N,...`, the device and faults as given, and an empty value as
// `""`.
struct OptionRow {
  std::string name;   // the environment variable, e.g. "TPU_LOG_DIR"
  std::string value;  // resolved value as text, e.g. "4294967296"
  OptionSource source = OptionSource::kDefault;
};
std::vector<OptionRow> DescribeOptions(const Options& options);

}  // namespace tpushim

#endif  // TPUSHIM_ENV_OPTIONS_H_
