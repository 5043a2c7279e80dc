// Fuzz target for tpushim's configuration: ResolveOptions
// over an environment and API options, SetOptionOverride (the C API's
// name/value options) and the parsers they share: device URLs
// (ParseDeviceUrl), fault specs (ParseFaultSpec, and the FaultInjector a
// spec builds), decimals and byte sizes.
//
// Input: text lines separated by '\n', each one of
//   NAME=value       an environment variable of any name (a later line with
//                    the same name wins), e.g. TPU_PREMAPPED_BUFFER_SIZE=8192
//                    or LIBTPU_INIT_ARGS=--tpu_premapped_buffer_size 4096
//   api:NAME=value   an API option, given to SetOptionOverride in order
// Other lines are ignored. config_fuzzer.dict lists the names and words
// the parsers know.
//
// Asserted, beyond "no crash, leak or undefined behaviour":
//  * ResolveOptions is deterministic: the same input twice gives the same
//    options, sources and warnings, or the same error.
//  * Resolved options keep the documented constraints: the size a multiple
//    of 4096; the threshold in [1, size] — the value given, or the size
//    with exactly one warning when the value given is larger — or 0 with
//    the region off; every number in its range; device URL parameters in
//    range; fault rules well formed; TPU_VMODULE entries trimmed, non-empty.
//    Each setting comes from the highest source given (API >
//    LIBTPU_INIT_ARGS > environment > default), and its canonical text
//    (DescribeOptions), given back as the environment, resolves to the same
//    values.
//  * A rejected configuration is INVALID_ARGUMENT whose message begins with
//    the culprit: `<VARIABLE>="<its value>"`, `LIBTPU_INIT_ARGS flag
//    --<ours>` or `API option <field>`.
//  * For each variable's value alone, SetOptionOverride accepts it exactly
//    when the environment does, with the same message when it does not; a
//    rejected API option leaves the overrides unchanged, and an unknown name
//    is INVALID_ARGUMENT naming it.
//  * A device URL or fault spec that parses keeps its text (and each rule
//    its entry's text), and its fields, written back canonically, parse to
//    the same fields; a FaultInjector built from a spec fails exactly the
//    calls its nth=/every= rules (and rates 0 and 1) say, with the rule's
//    code and " [injected: <rule>]" appended to the real failure's message.

#include <array>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <system_error>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "env/device_url.h"
#include "env/fault_injection.h"
#include "env/options.h"
#include "env/os.h"
#include "fuzz/fuzz_check.h"
#include "tpushim/options.h"

namespace tpushim {
namespace {

// The settings in the order of docs/configuration.md's table, which
// DescribeOptions keeps.
constexpr std::array<absl::string_view, 22> kVariables = {
    "TPU_PREMAPPED_BUFFER_SIZE",
    "TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES",
    "TPU_LOG_DIR",
    "TPU_MIN_LOG_LEVEL",
    "TPU_STDERR_LOG_LEVEL",
    "TPU_VMODULE",
    "TPU_MAX_LOG_SIZE_MB",
    "TPUSHIM_LOG_KEEP",
    "TPUSHIM_DEVICE",
    "TPUSHIM_HUGEPAGES",
    "TPUSHIM_PREFAULT_THREADS",
    "TPUSHIM_NUMA_NODE",
    "TPUSHIM_MLOCK",
    "TPUSHIM_FAULTS",
    "TPUSHIM_TRACE_FILE",
    "TPUSHIM_PREMAP",
    "TPUSHIM_MEMORY_PROFILE",
    "TPU_VISIBLE_CHIPS",
    "TPU_CHIPS_PER_PROCESS_BOUNDS",
    "TPU_PROCESS_BOUNDS",
    "TPUSHIM_DUMP_ON_OOM",
    "TPUSHIM_RUN_DIR",
};
// Variables that mean the same as a setting's own (its row is named after
// the setting's).
constexpr std::array<std::pair<absl::string_view, absl::string_view>, 3>
    kAliases = {{
        {"TPU_VISIBLE_CHIPS", "TPU_VISIBLE_DEVICES"},
        {"TPU_CHIPS_PER_PROCESS_BOUNDS", "TPU_CHIPS_PER_HOST_BOUNDS"},
        {"TPU_PROCESS_BOUNDS", "TPU_HOST_BOUNDS"},
    }};
// Settings whose validity depends on others (the chips a process uses
// depend on the device URL): alone, their API form checks only the text.
bool DependsOnOtherSettings(absl::string_view variable) {
  return variable == "TPU_VISIBLE_CHIPS" ||
         variable == "TPU_CHIPS_PER_PROCESS_BOUNDS";
}
constexpr absl::string_view kSizeVariable = kVariables[0];
constexpr absl::string_view kThresholdVariable = kVariables[1];
constexpr absl::string_view kInitArgsVariable = "LIBTPU_INIT_ARGS";
// What the threshold's clamping warning says (options.cc).
constexpr absl::string_view kClampWarning =
    "is larger than TPU_PREMAPPED_BUFFER_SIZE=";

bool IsVariable(absl::string_view name) {
  for (absl::string_view variable : kVariables) {
    if (variable == name) return true;
  }
  return false;
}

using Environment = std::map<std::string, std::string>;

struct Input {
  Environment env;
  // API options, in input order.
  std::vector<std::pair<std::string, std::string>> api;
};

Input ParseInput(absl::string_view data) {
  Input input;
  for (absl::string_view line : absl::StrSplit(data, '\n')) {
    const bool api = absl::ConsumePrefix(&line, "api:");
    const size_t equals = line.find('=');
    if (equals == line.npos) continue;
    std::string name(line.substr(0, equals));
    std::string value(line.substr(equals + 1));
    if (api) {
      input.api.emplace_back(std::move(name), std::move(value));
    } else {
      input.env[std::move(name)] = std::move(value);
    }
  }
  return input;
}

absl::StatusOr<Options> Resolve(const Environment& env,
                                const OptionOverrides& api = {}) {
  FixedEnvironmentOs os(Os::Default(), env);
  return ResolveOptions(os, api);
}

// Every field, for comparing two OptionOverrides.
auto Fields(const OptionOverrides& o) {
  return std::tie(
      o.premapped_buffer_size, o.premapped_buffer_transfer_threshold_bytes,
      o.log_dir, o.min_log_level, o.stderr_log_level, o.vmodule,
      o.max_log_size_mb, o.log_keep, o.device, o.hugepages, o.prefault_threads,
      o.numa_node, o.mlock, o.faults, o.trace_file, o.dump_on_oom,
      o.memory_profile, o.premap, o.visible_chips, o.chips_per_process_bounds,
      o.process_bounds, o.run_dir);
}

// The whole outcome of a resolution as text, for comparing two of them.
std::string Describe(const absl::StatusOr<Options>& options) {
  if (!options.ok()) return options.status().ToString();
  std::string text;
  for (const OptionRow& row : DescribeOptions(*options)) {
    absl::StrAppend(&text, row.name, "=", row.value, " (",
                    OptionSourceName(row.source), ")\n");
  }
  for (const std::string& warning : options->warnings) {
    absl::StrAppend(&text, "warning: ", warning, "\n");
  }
  return text;
}

// The shortest fixed-notation text of `value` that parses back to it
// exactly: what the device URL and fault spec grammars accept (no exponent).
std::string FixedText(double value) {
  // Enough for any finite double in fixed notation (about 330 characters
  // for the smallest subnormal).
  char buffer[400];
  const std::to_chars_result result = std::to_chars(
      buffer, buffer + sizeof(buffer), value, std::chars_format::fixed);
  TPUSHIM_FUZZ_CHECK(result.ec == std::errc()) << value;
  return std::string(buffer, result.ptr);
}

// ---- Device URLs --------------------------------------------------------

void CheckDeviceRanges(const DeviceUrl& url) {
  TPUSHIM_FUZZ_CHECK(url.devices >= 1 && url.devices <= 64) << url.text;
  TPUSHIM_FUZZ_CHECK(url.hbm_bytes >= (uint64_t{1} << 20) &&
                     url.hbm_bytes <= (uint64_t{1} << 40))
      << url.text;
  TPUSHIM_FUZZ_CHECK(url.dma_engines >= 1 && url.dma_engines <= 64) << url.text;
  TPUSHIM_FUZZ_CHECK(std::isfinite(url.link_gbps) && url.link_gbps >= 0)
      << url.text;
  TPUSHIM_FUZZ_CHECK(std::isfinite(url.latency_us) && url.latency_us >= 0)
      << url.text;
}

void CheckDeviceUrl(absl::string_view text) {
  const absl::StatusOr<DeviceUrl> url = ParseDeviceUrl(text);
  if (!url.ok()) {
    TPUSHIM_FUZZ_CHECK(absl::IsInvalidArgument(url.status())) << url.status();
    TPUSHIM_FUZZ_CHECK(!url.status().message().empty());
    return;
  }
  TPUSHIM_FUZZ_CHECK(url->text == text) << url->text;
  CheckDeviceRanges(*url);
  if (url->scheme == DeviceUrl::Scheme::kVfio) {
    TPUSHIM_FUZZ_CHECK(url->queue_depth >= 2 && url->queue_depth <= 4096)
        << url->text;
    // Every parameter spelled out, the address in its long form.
    static constexpr const char* kD2d[] = {"auto", "copy", "bounce"};
    static constexpr const char* kIrq[] = {"msix", "poll"};
    const std::string canonical =
        absl::StrCat("vfio://", url->pci_address.ToString(),
                     "?engine=nvme&d2d=", kD2d[static_cast<int>(url->d2d)],
                     "&irq=", kIrq[static_cast<int>(url->irq)],
                     "&queue_depth=", url->queue_depth);
    const absl::StatusOr<DeviceUrl> again = ParseDeviceUrl(canonical);
    TPUSHIM_FUZZ_CHECK(again.ok()) << canonical << ": " << again.status();
    TPUSHIM_FUZZ_CHECK(again->pci_address.ToString() ==
                           url->pci_address.ToString() &&
                       again->d2d == url->d2d && again->irq == url->irq &&
                       again->queue_depth == url->queue_depth)
        << text << " vs " << canonical;
    return;
  }
  // Every parameter spelled out, the byte size in bytes.
  const std::string canonical =
      absl::StrCat("sim://?devices=", url->devices, "&hbm=", url->hbm_bytes,
                   "&link_gbps=", FixedText(url->link_gbps),
                   "&latency_us=", FixedText(url->latency_us),
                   "&dma_engines=", url->dma_engines);
  const absl::StatusOr<DeviceUrl> again = ParseDeviceUrl(canonical);
  TPUSHIM_FUZZ_CHECK(again.ok()) << canonical << ": " << again.status();
  TPUSHIM_FUZZ_CHECK(again->devices == url->devices &&
                     again->hbm_bytes == url->hbm_bytes &&
                     again->link_gbps == url->link_gbps &&
                     again->latency_us == url->latency_us &&
                     again->dma_engines == url->dma_engines)
      << text << " vs " << canonical;
}

// ---- Fault specs --------------------------------------------------------

void CheckFaultRules(const FaultSpec& spec) {
  for (const FaultRule& rule : spec.rules) {
    switch (rule.kind) {
      case FaultRule::Kind::kNth:
      case FaultRule::Kind::kEvery:
        TPUSHIM_FUZZ_CHECK(rule.k >= 1) << rule.text;
        break;
      case FaultRule::Kind::kRate:
        TPUSHIM_FUZZ_CHECK(rule.rate >= 0 && rule.rate <= 1) << rule.text;
        break;
    }
    TPUSHIM_FUZZ_CHECK(!rule.code.has_value() ||
                       *rule.code != absl::StatusCode::kOk)
        << rule.text;
    TPUSHIM_FUZZ_CHECK(absl::StartsWith(
        rule.text, absl::StrCat(FaultPointName(rule.point), ":")))
        << rule.text;
  }
}

std::string CanonicalRule(const FaultRule& rule) {
  std::string text = absl::StrCat(FaultPointName(rule.point), ":");
  switch (rule.kind) {
    case FaultRule::Kind::kNth:
      absl::StrAppend(&text, "nth=", rule.k);
      break;
    case FaultRule::Kind::kEvery:
      absl::StrAppend(&text, "every=", rule.k);
      break;
    case FaultRule::Kind::kRate:
      absl::StrAppend(&text, "rate=", FixedText(rule.rate),
                      ",seed=", rule.seed);
      break;
  }
  if (rule.code) {
    absl::StrAppend(&text, ",code=", absl::StatusCodeToString(*rule.code));
  }
  return text;
}

// The rule that must fail call `call` at `point`: the first one of that
// point that fires. Null when none does; nullopt when a rate strictly
// between 0 and 1 comes first, whose decision only the injector's hash
// knows.
std::optional<const FaultRule*> ExpectedFiringRule(const FaultSpec& spec,
                                                   FaultPoint point,
                                                   uint64_t call) {
  for (const FaultRule& rule : spec.rules) {
    if (rule.point != point) continue;
    switch (rule.kind) {
      case FaultRule::Kind::kNth:
        if (call == rule.k) return &rule;
        break;
      case FaultRule::Kind::kEvery:
        if (call % rule.k == 0) return &rule;
        break;
      case FaultRule::Kind::kRate:
        if (rule.rate == 1) return &rule;
        if (rule.rate != 0) return std::nullopt;
        break;
    }
  }
  return nullptr;
}

// Calls a FaultInjector of `spec` at every point and checks which fail.
void CheckInjection(const FaultSpec& spec) {
  constexpr uint64_t kCalls = 24;
  constexpr absl::string_view kRealMessage = "real failure";
  FaultInjector injector(spec);
  for (const FaultPoint point : AllFaultPoints()) {
    uint64_t failed = 0;
    for (uint64_t call = 1; call <= kCalls; ++call) {
      const absl::Status status = injector.Check(
          point, [&] { return absl::ResourceExhaustedError(kRealMessage); });
      if (!status.ok()) ++failed;
      const std::optional<const FaultRule*> rule =
          ExpectedFiringRule(spec, point, call);
      if (!rule.has_value()) continue;
      if (*rule == nullptr) {
        TPUSHIM_FUZZ_CHECK(status.ok())
            << spec.text << ": " << FaultPointName(point) << " call " << call
            << " failed: " << status;
        continue;
      }
      const FaultRule& fired = **rule;
      TPUSHIM_FUZZ_CHECK(
          status.code() ==
          fired.code.value_or(absl::StatusCode::kResourceExhausted))
          << spec.text << ": call " << call << ": " << status;
      TPUSHIM_FUZZ_CHECK(
          status.message() ==
          absl::StrCat(kRealMessage, " [injected: ", fired.text, "]"))
          << spec.text << ": call " << call << ": " << status;
    }
    TPUSHIM_FUZZ_CHECK(injector.calls(point) == kCalls);
    TPUSHIM_FUZZ_CHECK(injector.injected(point) == failed);
  }
}

void CheckFaultSpec(absl::string_view text) {
  const absl::StatusOr<FaultSpec> spec = ParseFaultSpec(text);
  if (!spec.ok()) {
    TPUSHIM_FUZZ_CHECK(absl::IsInvalidArgument(spec.status())) << spec.status();
    TPUSHIM_FUZZ_CHECK(!spec.status().message().empty());
    return;
  }
  TPUSHIM_FUZZ_CHECK(spec->text == text) << spec->text;
  CheckFaultRules(*spec);
  // The entries, as written, are the rules' texts.
  TPUSHIM_FUZZ_CHECK(absl::StrJoin(spec->rules, ";",
                                   [](std::string* out, const FaultRule& rule) {
                                     out->append(rule.text);
                                   }) == text)
      << text;
  const std::string canonical =
      absl::StrJoin(spec->rules, ";", [](std::string* out, const FaultRule& r) {
        out->append(CanonicalRule(r));
      });
  const absl::StatusOr<FaultSpec> again = ParseFaultSpec(canonical);
  TPUSHIM_FUZZ_CHECK(again.ok()) << canonical << ": " << again.status();
  TPUSHIM_FUZZ_CHECK(again->rules.size() == spec->rules.size()) << canonical;
  for (size_t i = 0; i < spec->rules.size(); ++i) {
    const FaultRule& a = spec->rules[i];
    const FaultRule& b = again->rules[i];
    TPUSHIM_FUZZ_CHECK(a.point == b.point && a.kind == b.kind && a.k == b.k &&
                       a.rate == b.rate && a.seed == b.seed && a.code == b.code)
        << text << " vs " << canonical;
  }
  CheckInjection(*spec);
}

// ---- One variable alone -------------------------------------------------

// The environment and the API parse `value` of `variable` alike.
void CheckApiMatchesEnvironment(absl::string_view variable,
                                absl::string_view value) {
  OptionOverrides overrides;
  const absl::Status api = SetOptionOverride(overrides, variable, value);
  Environment env = {{std::string(variable), std::string(value)}};
  // SetOptionOverride checks the threshold as a decimal only (its relation
  // to the size is ResolveOptions' business): so does the environment with
  // the region off.
  if (variable == kThresholdVariable) env[std::string(kSizeVariable)] = "0";
  const absl::StatusOr<Options> resolved = Resolve(env);
  TPUSHIM_FUZZ_CHECK(api.ok() == resolved.ok())
      << variable << "=\"" << value << "\": API " << api << ", environment "
      << resolved.status();
  if (api.ok()) return;
  TPUSHIM_FUZZ_CHECK(absl::IsInvalidArgument(api)) << api;
  TPUSHIM_FUZZ_CHECK(api.message() == resolved.status().message())
      << api << " vs " << resolved.status();
  TPUSHIM_FUZZ_CHECK(absl::StartsWith(
      api.message(), absl::StrCat(variable, "=\"", value, "\"")))
      << api;
}

// ---- The whole configuration --------------------------------------------

// Applies the input's API options in order. Returns the overrides and,
// per variable, the text of the option that was accepted last.
std::pair<OptionOverrides, std::map<std::string, std::string>> ApplyApi(
    const Input& input) {
  OptionOverrides overrides;
  std::map<std::string, std::string> accepted;
  for (const auto& [name, value] : input.api) {
    const OptionOverrides before = overrides;
    const absl::Status status = SetOptionOverride(overrides, name, value);
    if (status.ok()) {
      TPUSHIM_FUZZ_CHECK(IsVariable(name)) << name;
      accepted[name] = value;
      continue;
    }
    TPUSHIM_FUZZ_CHECK(absl::IsInvalidArgument(status)) << status;
    TPUSHIM_FUZZ_CHECK(Fields(before) == Fields(overrides))
        << "rejected " << name << "=\"" << value << "\" changed the overrides";
    if (IsVariable(name)) {
      TPUSHIM_FUZZ_CHECK(absl::StartsWith(
          status.message(), absl::StrCat(name, "=\"", value, "\"")))
          << status;
    } else {
      TPUSHIM_FUZZ_CHECK(absl::StrContains(
          status.message(), absl::StrCat("unknown option \"", name, "\"")))
          << status;
    }
  }
  return {std::move(overrides), std::move(accepted)};
}

void CheckRanges(const Options& o) {
  TPUSHIM_FUZZ_CHECK(o.min_log_level.value >= 0 && o.min_log_level.value <= 3);
  TPUSHIM_FUZZ_CHECK(o.stderr_log_level.value >= 0 &&
                     o.stderr_log_level.value <= 3);
  TPUSHIM_FUZZ_CHECK(o.max_log_size_mb.value >= 1 &&
                     o.max_log_size_mb.value <= 1048576);
  TPUSHIM_FUZZ_CHECK(o.log_keep.value >= 0 && o.log_keep.value <= 1000000);
  TPUSHIM_FUZZ_CHECK(o.prefault_threads.value >= 0 &&
                     o.prefault_threads.value <= 1024);
  TPUSHIM_FUZZ_CHECK(!o.numa_node.value.has_value() ||
                     (*o.numa_node.value >= 0 && *o.numa_node.value <= 1023));
  TPUSHIM_FUZZ_CHECK(!o.log_dir.value.empty());
  CheckDeviceRanges(o.device.value);
  CheckFaultRules(o.faults.value);
  for (const VmoduleEntry& entry : o.vmodule.value) {
    TPUSHIM_FUZZ_CHECK(!entry.glob.empty() && entry.level >= 0);
    TPUSHIM_FUZZ_CHECK(absl::StripAsciiWhitespace(entry.glob) == entry.glob)
        << "\"" << entry.glob << "\"";
    TPUSHIM_FUZZ_CHECK(entry.glob.find_first_of(",=") == entry.glob.npos)
        << entry.glob;
  }
}

// The size and the threshold: the size a multiple of 4096; with it 0 (region
// off) the threshold 0, else the size by default, and a value given above
// the size clamped to it with exactly one warning.
void CheckRegionSettings(const Options& o,
                         const std::map<std::string, std::string>& api) {
  const uint64_t size = o.premapped_buffer_size.value;
  const Option<uint64_t>& threshold =
      o.premapped_buffer_transfer_threshold_bytes;
  TPUSHIM_FUZZ_CHECK(size % kPremappedSizeMultiple == 0) << size;
  // Warnings are the clamp's, about TPU_VMODULE entries (which may quote
  // anything), or a "did you mean" for a variable close to a known one.
  size_t clamp_warnings = 0;
  for (const std::string& warning : o.warnings) {
    if (absl::StartsWith(warning, "TPU_VMODULE entry \"")) continue;
    if (absl::StrContains(warning,
                          " is set, but tpushim reads no such "
                          "variable and ignores it")) {
      continue;
    }
    TPUSHIM_FUZZ_CHECK(absl::EndsWith(
        warning, absl::StrCat(kClampWarning, size, "; using ", size)))
        << warning;
    ++clamp_warnings;
  }
  if (size == 0) {
    TPUSHIM_FUZZ_CHECK(threshold.value == 0 &&
                       threshold.source == OptionSource::kDefault)
        << threshold.value;
    TPUSHIM_FUZZ_CHECK(clamp_warnings == 0);
    return;
  }
  if (threshold.source == OptionSource::kDefault) {
    TPUSHIM_FUZZ_CHECK(threshold.value == size) << threshold.value;
    TPUSHIM_FUZZ_CHECK(clamp_warnings == 0);
    return;
  }
  // The value the winning source gave.
  const std::string given = threshold.source == OptionSource::kApi
                                ? api.at(std::string(kThresholdVariable))
                                : threshold.raw;
  const absl::StatusOr<uint64_t> value = ParseDecimal(given, "threshold");
  TPUSHIM_FUZZ_CHECK(value.ok()) << value.status();
  TPUSHIM_FUZZ_CHECK(*value >= 1) << given;
  if (*value > size) {
    TPUSHIM_FUZZ_CHECK(threshold.value == size) << threshold.value;
    TPUSHIM_FUZZ_CHECK(clamp_warnings == 1) << clamp_warnings;
  } else {
    TPUSHIM_FUZZ_CHECK(threshold.value == *value) << threshold.value;
    TPUSHIM_FUZZ_CHECK(clamp_warnings == 0) << clamp_warnings;
  }
}

// Each setting comes from the highest source given.
void CheckSources(const Input& input, const std::vector<OptionRow>& rows,
                  const Options& o,
                  const std::map<std::string, std::string>& api) {
  TPUSHIM_FUZZ_CHECK(rows.size() == kVariables.size()) << rows.size();
  const bool region_off = !o.premapped_region_enabled();
  for (size_t i = 0; i < rows.size(); ++i) {
    const OptionRow& row = rows[i];
    TPUSHIM_FUZZ_CHECK(row.name == kVariables[i]) << row.name;
    const bool from_api = api.count(row.name) > 0;
    bool from_env = input.env.count(row.name) > 0;
    for (const auto& [variable, alias] : kAliases) {
      if (row.name == variable)
        from_env |= input.env.count(std::string(alias)) > 0;
    }
    const bool has_flag =
        row.name == kSizeVariable || row.name == kThresholdVariable;
    if (row.name == kThresholdVariable && region_off) {
      // Given or not, it is 0 from nowhere.
      TPUSHIM_FUZZ_CHECK(row.source == OptionSource::kDefault);
      continue;
    }
    switch (row.source) {
      case OptionSource::kApi:
        TPUSHIM_FUZZ_CHECK(from_api) << row.name;
        break;
      case OptionSource::kFlag:
        TPUSHIM_FUZZ_CHECK(has_flag && !from_api &&
                           input.env.count(std::string(kInitArgsVariable)))
            << row.name;
        break;
      case OptionSource::kEnv:
        TPUSHIM_FUZZ_CHECK(from_env && !from_api) << row.name;
        break;
      case OptionSource::kDefault:
        TPUSHIM_FUZZ_CHECK(!from_env && !from_api) << row.name;
        break;
    }
  }
  // What the size was parsed from.
  const Option<uint64_t>& size = o.premapped_buffer_size;
  switch (size.source) {
    case OptionSource::kEnv:
      TPUSHIM_FUZZ_CHECK(size.raw == input.env.at(std::string(kSizeVariable)));
      break;
    case OptionSource::kFlag:
      TPUSHIM_FUZZ_CHECK(
          !size.raw.empty() &&
          absl::StrContains(input.env.at(std::string(kInitArgsVariable)),
                            size.raw))
          << size.raw;
      break;
    case OptionSource::kApi:
    case OptionSource::kDefault:
      TPUSHIM_FUZZ_CHECK(size.raw.empty()) << size.raw;
      break;
  }
}

// The canonical text of every setting given, as the environment, resolves
// to the same values.
void CheckCanonicalRoundTrip(const std::vector<OptionRow>& rows) {
  Environment env;
  for (const OptionRow& row : rows) {
    // `""` stands for an empty value (and for a literal `""`).
    if (row.source != OptionSource::kDefault && row.value != "\"\"") {
      env[row.name] = row.value;
    }
  }
  const absl::StatusOr<Options> again = Resolve(env);
  TPUSHIM_FUZZ_CHECK(again.ok()) << again.status();
  const std::vector<OptionRow> again_rows = DescribeOptions(*again);
  for (size_t i = 0; i < rows.size(); ++i) {
    if (env.count(rows[i].name) == 0) continue;
    TPUSHIM_FUZZ_CHECK(again_rows[i].value == rows[i].value)
        << rows[i].name << ": " << rows[i].value << " became "
        << again_rows[i].value;
  }
}

void CheckRejected(const Input& input, const absl::Status& status) {
  TPUSHIM_FUZZ_CHECK(absl::IsInvalidArgument(status)) << status;
  const absl::string_view message = status.message();
  bool names_culprit = false;
  std::vector<absl::string_view> names(kVariables.begin(), kVariables.end());
  for (const auto& alias : kAliases) names.push_back(alias.second);
  for (absl::string_view variable : names) {
    const auto it = input.env.find(std::string(variable));
    if (it != input.env.end() &&
        absl::StartsWith(message,
                         absl::StrCat(variable, "=\"", it->second, "\""))) {
      names_culprit = true;
    }
  }
  if (input.env.count(std::string(kInitArgsVariable)) &&
      absl::StartsWith(
          message, absl::StrCat(kInitArgsVariable, " flag --tpu_premapped_"))) {
    names_culprit = true;
  }
  if (!input.api.empty() && absl::StartsWith(message, "API option ")) {
    names_culprit = true;
  }
  TPUSHIM_FUZZ_CHECK(names_culprit) << status;
}

void CheckConfiguration(const Input& input) {
  const auto [overrides, api] = ApplyApi(input);
  const absl::StatusOr<Options> options = Resolve(input.env, overrides);
  TPUSHIM_FUZZ_CHECK(Describe(options) ==
                     Describe(Resolve(input.env, overrides)))
      << "ResolveOptions is not deterministic";
  if (!options.ok()) {
    CheckRejected(input, options.status());
    return;
  }
  const std::vector<OptionRow> rows = DescribeOptions(*options);
  CheckRanges(*options);
  CheckRegionSettings(*options, api);
  CheckSources(input, rows, *options, api);
  CheckCanonicalRoundTrip(rows);
}

void FuzzOneInput(absl::string_view data) {
  const Input input = ParseInput(data);
  CheckConfiguration(input);
  // Each value on its own, through every parser that reads it.
  std::vector<std::pair<std::string, std::string>> values = input.api;
  values.insert(values.end(), input.env.begin(), input.env.end());
  for (const auto& [name, value] : values) {
    if (!IsVariable(name)) continue;
    if (!DependsOnOtherSettings(name)) CheckApiMatchesEnvironment(name, value);
    if (name == "TPUSHIM_DEVICE") CheckDeviceUrl(value);
    if (name == "TPUSHIM_FAULTS") CheckFaultSpec(value);
  }
}

}  // namespace
}  // namespace tpushim

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tpushim::FuzzOneInput(
      absl::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
