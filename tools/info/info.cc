#include "tools/info/info.h"

#include <unistd.h>

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/human_bytes.h"
#include "device/vfio/host_use.h"
#include "env/chips.h"
#include "env/host_facts.h"
#include "env/options.h"
#include "logging/log_directory.h"
#include "nlohmann/json.hpp"
#include "tools/cli/text_table.h"

namespace tpushim::tools {
namespace {

using Json = nlohmann::ordered_json;

constexpr char kInfoDescription[] =
    "Show the configuration, the host facts and where they clash";

constexpr char kInfoFooter[] = R"footer(
Prints every setting with its resolved value and where it came from
(LIBTPU_INIT_ARGS flags, then environment variables, then defaults), the
every chip of the host with the process holding it (pid, user, command
line, since when) or "free", and which of them this process would use
(TPU_VISIBLE_CHIPS), the host facts that decide whether the premapped
region can be mapped and pinned (memory, cgroup limit, memlock limit, huge
pages, NUMA, CPUs), and the checks of one against the other. Nothing is
allocated, pinned, locked or logged.

Exit status: 0 whenever the configuration is valid, even when the checks
report WARNING or ERROR clashes (info only informs); 2 for an invalid
configuration or command line; 1 when the host facts cannot be read.

Examples:
  tpushim info
  TPU_PREMAPPED_BUFFER_SIZE=17179869184 tpushim info
  LIBTPU_INIT_ARGS=--tpu_premapped_buffer_size=8589934592 tpushim info
  tpushim info --json | jq .host.memlock
  tpushim info --json | jq '.chips.chips[] | select(.state == "free") | .chip'
  TPUSHIM_DEVICE='sim://?devices=4' TPU_VISIBLE_CHIPS=2,3 tpushim info
  tpushim info --json | jq -r '.checks[] | "\(.level): \(.message)"')footer";

// The byte-valued settings, by variable name, with their resolved values.
std::optional<uint64_t> ByteValueOf(const OptionRow& row,
                                    const Options& options) {
  if (row.name == "TPU_PREMAPPED_BUFFER_SIZE") {
    return options.premapped_buffer_size.value;
  }
  if (row.name == "TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES") {
    return options.premapped_buffer_transfer_threshold_bytes.value;
  }
  return std::nullopt;
}

// "error" / "warning": the JSON level, upper-cased in tables.
absl::string_view LevelName(HostClash::Level level) {
  return level == HostClash::Level::kError ? "error" : "warning";
}

// A limit where ResourceLimit::kUnlimited means none.
std::string LimitText(uint64_t limit) {
  return limit == ResourceLimit::kUnlimited ? "unlimited"
                                            : BytesWithHumanReadable(limit);
}
Json LimitJson(uint64_t limit) {
  return limit == ResourceLimit::kUnlimited ? Json(nullptr) : Json(limit);
}

Json OptionalJson(const std::optional<uint64_t>& value) {
  return value.has_value() ? Json(*value) : Json(nullptr);
}

// ---- Human output ----------------------------------------------------------

void PrintConfiguration(const Options& options, std::ostream& out) {
  out << "Configuration\n";
  TextTable table({"VARIABLE", "VALUE", "SIZE", "SOURCE"});
  for (const OptionRow& row : DescribeOptions(options)) {
    const std::optional<uint64_t> bytes = ByteValueOf(row, options);
    table.AddRow({row.name, row.value,
                  bytes.has_value() ? HumanReadableBytes(*bytes) : "",
                  std::string(OptionSourceName(row.source))});
  }
  table.Print(out);
  for (const std::string& warning : options.warnings) {
    out << "  WARNING: " << warning << "\n";
  }
}

void PrintHost(const HostFacts& facts, std::ostream& out) {
  out << "\nHost\n";
  TextTable table;
  table.AddRow({"MemTotal", BytesWithHumanReadable(facts.mem_total_bytes)});
  table.AddRow(
      {"MemAvailable", BytesWithHumanReadable(facts.mem_available_bytes)});
  if (facts.cgroup_version == 0) {
    table.AddRow({"cgroup", "none (no memory controller found)"});
  } else {
    table.AddRow({"cgroup", absl::StrCat("v", facts.cgroup_version, " ",
                                         facts.cgroup_path)});
    table.AddRow({"cgroup memory limit",
                  facts.cgroup_memory_limit_bytes.has_value()
                      ? BytesWithHumanReadable(*facts.cgroup_memory_limit_bytes)
                      : "unlimited"});
    table.AddRow({"cgroup memory usage",
                  facts.cgroup_memory_usage_bytes.has_value()
                      ? BytesWithHumanReadable(*facts.cgroup_memory_usage_bytes)
                      : "unknown"});
  }
  table.AddRow({"usable by this process",
                BytesWithHumanReadable(facts.UsableMemoryBytes())});
  table.AddRow({"RLIMIT_MEMLOCK soft", LimitText(facts.memlock.soft)});
  table.AddRow({"RLIMIT_MEMLOCK hard", LimitText(facts.memlock.hard)});
  table.AddRow({"CAP_IPC_LOCK", facts.has_cap_ipc_lock ? "yes" : "no"});
  table.AddRow({"THP enabled",
                facts.thp_enabled.empty() ? "unavailable" : facts.thp_enabled});
  table.AddRow({"THP defrag",
                facts.thp_defrag.empty() ? "unavailable" : facts.thp_defrag});
  if (facts.hugepage_pools.empty()) table.AddRow({"hugepages", "none"});
  for (const HostFacts::HugePagePool& pool : facts.hugepage_pools) {
    table.AddRow(
        {absl::StrCat("hugepages ", HumanReadableBytes(pool.page_bytes)),
         absl::StrCat("total ", pool.total_pages, ", free ", pool.free_pages,
                      ", reserved ", pool.reserved_pages)});
  }
  for (const HostFacts::NumaNode& node : facts.numa_nodes) {
    table.AddRow(
        {absl::StrCat("NUMA node ", node.node),
         absl::StrCat("total ", BytesWithHumanReadable(node.total_bytes),
                      ", free ", BytesWithHumanReadable(node.free_bytes))});
  }
  table.AddRow(
      {"other tpushim processes",
       facts.other_tpushim.empty()
           ? "none"
           : absl::StrCat(absl::StrJoin(facts.other_tpushim, ", "), " (",
                          HumanReadableBytes(facts.other_tpushim_pending_bytes),
                          " still to be pinned)")});
  table.AddRow({"online CPUs", absl::StrCat(facts.online_cpus)});
  table.AddRow({"page size", BytesWithHumanReadable(facts.page_size)});
  table.Print(out);
}

// The host memory start-up pins: the region, or with the region off the
// transfer engine's bounce pool.
struct PinnedPlan {
  uint64_t region_bytes = 0;
  uint64_t bounce_pool_bytes = 0;
  uint64_t bounce_max_bytes = 0;
  uint64_t memlock_needed_bytes() const {
    return region_bytes + bounce_pool_bytes;
  }
};

PinnedPlan PlanPinned(const Options& options) {
  PinnedPlan plan;
  plan.region_bytes = options.premapped_buffer_size.value;
  if (plan.region_bytes == 0) {
    plan.bounce_pool_bytes = kBouncePoolBytes;
    plan.bounce_max_bytes = kBounceMaxBytes;
  }
  return plan;
}

void PrintPinned(const Options& options, std::ostream& out) {
  const PinnedPlan plan = PlanPinned(options);
  out << "\nPinned host memory\n";
  TextTable table;
  table.AddRow(
      {"premapped region", plan.region_bytes > 0
                               ? BytesWithHumanReadable(plan.region_bytes)
                               : "off (TPU_PREMAPPED_BUFFER_SIZE=0)"});
  table.AddRow(
      {"bounce pool",
       plan.bounce_pool_bytes > 0
           ? absl::StrCat(BytesWithHumanReadable(plan.bounce_pool_bytes),
                          ", pinned at start-up; transfers up to ",
                          HumanReadableBytes(plan.bounce_max_bytes),
                          " are staged through it")
           : "none (the region stages transfers)"});
  table.AddRow({"memlock needed",
                options.mlock.value == MlockMode::kOff
                    ? "none (TPUSHIM_MLOCK=off)"
                    : BytesWithHumanReadable(plan.memlock_needed_bytes())});
  table.AddRow({"fork() children",
                "do not inherit it (MADV_DONTFORK): no copy-on-write"});
  table.Print(out);
}

Json PinnedJson(const Options& options) {
  const PinnedPlan plan = PlanPinned(options);
  return {{"region_bytes", plan.region_bytes},
          {"bounce_pool_bytes", plan.bounce_pool_bytes},
          {"bounce_max_bytes", plan.bounce_max_bytes},
          {"memlock_needed_bytes", options.mlock.value == MlockMode::kOff
                                       ? 0
                                       : plan.memlock_needed_bytes()},
          {"inherited_by_fork", false}};
}

void PrintChecks(const std::vector<HostClash>& clashes, std::ostream& out) {
  out << "\nChecks\n";
  if (clashes.empty()) out << "  OK: the configuration fits this host\n";
  // An error is shown as the status start-up would return.
  for (const HostClash& clash : clashes) {
    out << "  " << absl::AsciiStrToUpper(LevelName(clash.level)) << ": "
        << (clash.level == HostClash::Level::kError
                ? clash.ToStatus().ToString()
                : clash.message)
        << "\n";
  }
}

// Every chip of the host with its holder, and this process's devices.
struct ChipsView {
  std::vector<ChipState> chips;
  std::vector<std::string> process_chips;  // chip key of device 0, 1, ...
  std::optional<absl::Duration> libtpu_lockfile_age;
  absl::Time now;
  std::string error;  // why the holders could not be read, "" when they were
};

ChipsView ReadChips(const Options& options, Os& os) {
  ChipsView view;
  view.now = os.Now();
  for (const HostChip& chip : ProcessHostChips(options)) {
    view.process_chips.push_back(chip.key);
  }
  view.libtpu_lockfile_age = LibtpuLockfileAge(os);
  absl::StatusOr<std::vector<ChipState>> chips =
      QueryChips(os, options.run_dir.value, HostChips(options));
  if (chips.ok()) {
    view.chips = *std::move(chips);
  } else {
    view.error = chips.status().ToString();
  }
  return view;
}

std::string DeviceOfChip(const ChipsView& view, const ChipState& chip) {
  for (size_t d = 0; d < view.process_chips.size(); ++d) {
    if (view.process_chips[d] == chip.chip.key) return absl::StrCat(d);
  }
  return "";
}

std::string HolderText(const ChipsView& view, const ChipState& chip) {
  if (!chip.held) return "free";
  if (!chip.holder.has_value()) return "held (holder record not written yet)";
  return chip.holder->Describe(view.now);
}

void PrintChips(const Options& options, const ChipsView& view,
                std::ostream& out) {
  out << "\nChips (lock files in " << options.run_dir.value << ")\n";
  if (!view.error.empty()) {
    out << "  cannot read the holders: " << view.error << "\n";
  }
  TextTable table({"CHIP", "NAME", "THIS PROCESS", "HOLDER"});
  for (const ChipState& chip : view.chips) {
    const std::string device = DeviceOfChip(view, chip);
    table.AddRow({absl::StrCat(chip.chip.index), chip.chip.name,
                  device.empty() ? "-" : absl::StrCat("device ", device),
                  HolderText(view, chip)});
  }
  table.Print(out);
  if (view.libtpu_lockfile_age.has_value()) {
    out << "  " << kLibtpuLockfile << " exists (last written "
        << absl::FormatDuration(
               absl::Seconds(absl::ToInt64Seconds(*view.libtpu_lockfile_age)))
        << " ago); tpushim ignores it: the chip locks above are the "
           "kernel's and end with their holders\n";
  }
}

Json ChipsJson(const Options& options, const ChipsView& view) {
  Json chips = Json::array();
  for (const ChipState& chip : view.chips) {
    Json holder = nullptr;
    if (chip.held && chip.holder.has_value()) {
      holder = {
          {"pid", chip.holder->pid},
          {"user", chip.holder->user},
          {"command_line", chip.holder->command_line},
          {"since", absl::FormatTime(absl::RFC3339_sec, chip.holder->since,
                                     absl::UTCTimeZone())},
          {"held_seconds",
           absl::ToInt64Seconds(view.now - chip.holder->since)}};
    }
    const std::string device = DeviceOfChip(view, chip);
    chips.push_back(
        {{"chip", chip.chip.index},
         {"name", chip.chip.name},
         {"lock_file", chip.lock_file},
         {"state", chip.held ? "held" : "free"},
         {"holder", holder},
         {"device", device.empty() ? Json(nullptr) : Json(std::stoi(device))}});
  }
  Json lockfile = nullptr;
  if (view.libtpu_lockfile_age.has_value()) {
    lockfile = {
        {"path", kLibtpuLockfile},
        {"age_seconds", absl::ToInt64Seconds(*view.libtpu_lockfile_age)},
        {"honoured", false}};
  }
  return {{"run_dir", options.run_dir.value},
          {"chips", chips},
          {"error", view.error.empty() ? Json(nullptr) : Json(view.error)},
          {"libtpu_lockfile", lockfile}};
}

// ---- JSON output -----------------------------------------------------------

Json ConfigJson(const Options& options) {
  Json rows = Json::array();
  for (const OptionRow& row : DescribeOptions(options)) {
    // The table shows an empty value as "" so that it can be seen; JSON
    // has empty strings of its own.
    rows.push_back({{"name", row.name},
                    {"value", row.value == "\"\"" ? "" : row.value},
                    {"source", std::string(OptionSourceName(row.source))}});
  }
  return rows;
}

Json HostJson(const HostFacts& facts) {
  Json pools = Json::array();
  for (const HostFacts::HugePagePool& pool : facts.hugepage_pools) {
    pools.push_back({{"page_bytes", pool.page_bytes},
                     {"total", pool.total_pages},
                     {"free", pool.free_pages},
                     {"reserved", pool.reserved_pages}});
  }
  Json nodes = Json::array();
  for (const HostFacts::NumaNode& node : facts.numa_nodes) {
    nodes.push_back({{"node", node.node},
                     {"total_bytes", node.total_bytes},
                     {"free_bytes", node.free_bytes}});
  }
  return {
      {"mem_total_bytes", facts.mem_total_bytes},
      {"mem_available_bytes", facts.mem_available_bytes},
      {"usable_memory_bytes", facts.UsableMemoryBytes()},
      {"cgroup",
       {{"version", facts.cgroup_version},
        {"path", facts.cgroup_path},
        {"memory_limit_bytes", OptionalJson(facts.cgroup_memory_limit_bytes)},
        {"memory_usage_bytes", OptionalJson(facts.cgroup_memory_usage_bytes)}}},
      {"memlock",
       {{"soft", LimitJson(facts.memlock.soft)},
        {"hard", LimitJson(facts.memlock.hard)}}},
      {"cap_ipc_lock", facts.has_cap_ipc_lock},
      {"thp", {{"enabled", facts.thp_enabled}, {"defrag", facts.thp_defrag}}},
      {"hugepage_pools", pools},
      {"numa_nodes", nodes},
      {"other_tpushim",
       {{"processes", facts.other_tpushim},
        {"pending_pin_bytes", facts.other_tpushim_pending_bytes}}},
      {"online_cpus", facts.online_cpus},
      {"page_size", facts.page_size},
  };
}

Json ChecksJson(const std::vector<HostClash>& clashes) {
  Json checks = Json::array();
  for (const HostClash& clash : clashes) {
    // "code": the status start-up would return, for errors; null for
    // warnings, which start-up only logs.
    Json code = nullptr;
    if (clash.level == HostClash::Level::kError) {
      code = absl::StatusCodeToString(clash.ToStatus().code());
    }
    checks.push_back({{"level", std::string(LevelName(clash.level))},
                      {"code", code},
                      {"message", clash.message}});
  }
  return checks;
}

// ---- The command -----------------------------------------------------------

// A TPU_LOG_DIR start-up could not log to, checked without creating
// anything: something other than a directory there, or a directory this
// user cannot write. (A missing directory is fine: start-up creates it.)
std::optional<HostClash> LogDirectoryClash(const Options& options, Os& os) {
  if (options.log_files_disabled() || options.log_dir.value.empty()) {
    return std::nullopt;
  }
  const std::string& dir = options.log_dir.value;
  absl::StatusOr<FileInfo> info = os.Stat(dir);
  if (!info.ok()) return std::nullopt;
  std::string problem;
  if (info->type != FileInfo::Type::kDirectory) {
    problem = info->type == FileInfo::Type::kRegular
                  ? "is a regular file, not a directory"
                  : "is not a directory";
  } else if (!os.Access(dir, W_OK | X_OK).ok()) {
    problem = "is a directory you cannot write to";
  } else {
    return std::nullopt;
  }
  HostClash clash;
  clash.level = HostClash::Level::kWarning;
  clash.check = HostClash::Check::kLogDirectory;
  clash.message = absl::StrCat(
      "TPU_LOG_DIR=", dir, " ", problem, "; start-up would log to ",
      logging::internal::FallbackLogDirectory(os),
      " instead (set TPU_LOG_DIR to a directory you can write, or "
      "TPU_LOG_DIR=disabled for no log files)");
  return clash;
}

// For a vfio:// device, the verdict start-up would give on its PCI
// function — not bound to vfio-pci (with the commands to bind it only when
// the host uses nothing behind it), no IOMMU group — plus what start-up
// learns only from the kernel: other members of the IOMMU group that keep
// it from being usable.
std::optional<HostClash> VfioDeviceClash(const Options& options, Os& os) {
  const DeviceUrl& device = options.device.value;
  if (device.scheme != DeviceUrl::Scheme::kVfio) return std::nullopt;
  const absl::Status verdict =
      CheckVfioHost(os, device.pci_address.ToString(),
                    VfioHostCheck{.check_group = true}, nullptr);
  if (verdict.ok()) return std::nullopt;
  HostClash clash;
  clash.level = HostClash::Level::kError;
  clash.check = absl::IsNotFound(verdict) ? HostClash::Check::kVfioDeviceMissing
                                          : HostClash::Check::kVfioDevice;
  clash.message = std::string(verdict.message());
  return clash;
}

void RunInfo(bool json, CommandContext& context) {
  absl::StatusOr<Options> options = ResolveOptions(*context.os);
  if (!options.ok()) {
    ReportError(options.status(), "invalid configuration", json, kExitUsage,
                context);
    return;
  }
  absl::StatusOr<HostFacts> facts = ReadHostFacts(*context.os);
  if (!facts.ok()) {
    ReportError(facts.status(), "cannot read the host facts", json,
                kExitFailure, context);
    return;
  }
  AddOtherTpushimProcesses(*context.os, options->run_dir.value, *facts);
  std::vector<HostClash> clashes = CheckOptionsAgainstHost(*options, *facts);
  if (std::optional<HostClash> logs =
          LogDirectoryClash(*options, *context.os)) {
    clashes.push_back(*std::move(logs));
  }
  if (std::optional<HostClash> device =
          VfioDeviceClash(*options, *context.os)) {
    clashes.push_back(*std::move(device));
  }
  const ChipsView chips = ReadChips(*options, *context.os);
  std::ostream& out = *context.out;
  if (json) {
    WriteJson({{"config", ConfigJson(*options)},
               {"warnings", options->warnings},
               {"chips", ChipsJson(*options, chips)},
               {"pinned", PinnedJson(*options)},
               {"host", HostJson(*facts)},
               {"checks", ChecksJson(clashes)}},
              out);
  } else {
    PrintConfiguration(*options, out);
    PrintChips(*options, chips, out);
    PrintPinned(*options, out);
    PrintHost(*facts, out);
    PrintChecks(clashes, out);
  }
  context.exit_code = kExitOk;
}

}  // namespace

void RegisterInfoCommand(CLI::App& app, CommandContext& context) {
  CLI::App* info = app.add_subcommand("info", kInfoDescription);
  info->footer(kInfoFooter);
  // Owned by the callback, which CLI11 keeps as long as `app`.
  auto json = std::make_shared<bool>(false);
  info->add_flag("--json", *json,
                 "Print one JSON object (config, warnings, chips, pinned, "
                 "host, checks) "
                 "instead of tables");
  info->callback([json, &context] { RunInfo(*json, context); });
}

}  // namespace tpushim::tools
