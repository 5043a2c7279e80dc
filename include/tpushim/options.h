// Settings a program gives tpushim directly: each one that
// is set wins over LIBTPU_INIT_ARGS flags and environment variables, and is
// validated by the same rules as its variable (errors name
// `API option <field>`).
//
//   tpushim::OptionOverrides o;
//   o.premapped_buffer_size = uint64_t{8} << 30;
//   o.device = "sim://?devices=4";
//   auto system = tpushim::System::Create(o);

#ifndef TPUSHIM_OPTIONS_H_
#define TPUSHIM_OPTIONS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tpushim {

// TPUSHIM_HUGEPAGES, TPUSHIM_MLOCK and TPUSHIM_PREMAP.
enum class HugePagesMode { kAuto, kHugetlb, kThp, kOff };
enum class MlockMode { kOn, kRequired, kOff };
// kForeground: System creation returns once the region is premapped (what
// libtpu does); kBackground: it returns once the region is reserved, and
// the region is populated and locked behind the caller.
enum class PremapMode { kForeground, kBackground };

// One field per setting; unset fields leave the setting to the flags, the
// environment and the defaults (docs/configuration.md).
struct OptionOverrides {
  std::optional<uint64_t> premapped_buffer_size;  // TPU_PREMAPPED_BUFFER_SIZE
  // TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES
  std::optional<uint64_t> premapped_buffer_transfer_threshold_bytes;
  std::optional<std::string> log_dir;       // TPU_LOG_DIR ("disabled")
  std::optional<int> min_log_level;         // TPU_MIN_LOG_LEVEL
  std::optional<int> stderr_log_level;      // TPU_STDERR_LOG_LEVEL
  std::optional<std::string> vmodule;       // TPU_VMODULE
  std::optional<uint64_t> max_log_size_mb;  // TPU_MAX_LOG_SIZE_MB
  std::optional<int> log_keep;              // TPUSHIM_LOG_KEEP
  std::optional<std::string> device;        // TPUSHIM_DEVICE
  std::optional<HugePagesMode> hugepages;   // TPUSHIM_HUGEPAGES
  std::optional<int> prefault_threads;      // TPUSHIM_PREFAULT_THREADS
  // TPUSHIM_NUMA_NODE: nullopt inside = auto.
  std::optional<std::optional<int>> numa_node;
  std::optional<MlockMode> mlock;             // TPUSHIM_MLOCK
  std::optional<std::string> faults;          // TPUSHIM_FAULTS
  std::optional<std::string> trace_file;      // TPUSHIM_TRACE_FILE
  std::optional<PremapMode> premap;           // TPUSHIM_PREMAP
  std::optional<bool> dump_on_oom;            // TPUSHIM_DUMP_ON_OOM
  std::optional<std::string> memory_profile;  // TPUSHIM_MEMORY_PROFILE
  // TPU_VISIBLE_CHIPS (or TPU_VISIBLE_DEVICES): the host chips this
  // process uses, seen as devices 0..k-1 in this order; empty = all.
  std::optional<std::vector<int>> visible_chips;
  // TPU_CHIPS_PER_PROCESS_BOUNDS (or TPU_CHIPS_PER_HOST_BOUNDS): {x, y, z},
  // whose product is the number of visible chips; empty = not given.
  std::optional<std::vector<int>> chips_per_process_bounds;
  // TPU_PROCESS_BOUNDS (or TPU_HOST_BOUNDS): {x, y, z}; empty = not given.
  std::optional<std::vector<int>> process_bounds;
  // TPUSHIM_RUN_DIR: the directory of the chips' lock files, shared by
  // every process of the host that should see the same chips.
  std::optional<std::string> run_dir;
};

}  // namespace tpushim

#endif  // TPUSHIM_OPTIONS_H_
