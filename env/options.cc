#include "env/options.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "common/closest_match.h"
#include "common/status_macros.h"

namespace tpushim {
namespace {

constexpr absl::string_view kInitArgsVariable = "LIBTPU_INIT_ARGS";
constexpr absl::string_view kSizeVariable = "TPU_PREMAPPED_BUFFER_SIZE";
constexpr int kMaxDefaultPrefaultThreads = 16;
constexpr uint64_t kMaxNumaNode = 1023;

// ---- Words ------------------------------------------------------------------

template <typename T>
struct Word {
  absl::string_view text;
  T value;
};

constexpr Word<HugePagesMode> kHugePagesWords[] = {
    {"auto", HugePagesMode::kAuto},
    {"hugetlb", HugePagesMode::kHugetlb},
    {"thp", HugePagesMode::kThp},
    {"off", HugePagesMode::kOff},
};
constexpr Word<MlockMode> kMlockWords[] = {
    {"on", MlockMode::kOn},
    {"required", MlockMode::kRequired},
    {"off", MlockMode::kOff},
};
constexpr Word<PremapMode> kPremapWords[] = {
    {"foreground", PremapMode::kForeground},
    {"background", PremapMode::kBackground},
};
constexpr Word<bool> kDumpOnOomWords[] = {{"0", false}, {"1", true}};

// The value type of a word table.
template <const auto& kWords>
using WordValue = std::remove_cvref_t<decltype(kWords[0].value)>;

template <const auto& kWords>
absl::string_view WordOf(WordValue<kWords> value) {
  for (const auto& word : kWords) {
    if (word.value == value) return word.text;
  }
  return "unknown";
}

// ---- Parsers and formatters -------------------------------------------------
//
// A parser turns the text of one setting into its value. `name` names the
// value in messages (`TPU_LOG_DIR`, `LIBTPU_INIT_ARGS flag --...`,
// `API option log_dir`); errors read `<name>="<text>" <problem>`.

struct ParseContext {
  std::string name;
  // The settings before this one in kSettings, already resolved.
  const Options& resolved;
  // Where this value's warnings go.
  std::vector<std::string>* warnings;
  // Parsed on its own (SetOptionOverride): checks that relate the value to
  // other settings wait for ResolveOptions.
  bool standalone;
};

template <typename T>
using Parser = absl::StatusOr<T> (*)(absl::string_view text,
                                     const ParseContext& context);
template <typename T>
using Formatter = std::string (*)(const T& value);

template <typename T, uint64_t kMin, uint64_t kMax>
absl::StatusOr<T> ParseNumber(absl::string_view text,
                              const ParseContext& context) {
  static_assert(kMax <= static_cast<uint64_t>(std::numeric_limits<T>::max()));
  TPUSHIM_ASSIGN_OR_RETURN(const uint64_t value,
                           ParseDecimal(text, context.name, kMin, kMax));
  return static_cast<T>(value);
}

template <typename T>
std::string FormatNumber(const T& value) {
  return absl::StrCat(value);
}

template <const auto& kWords>
absl::StatusOr<WordValue<kWords>> ParseWord(absl::string_view text,
                                            const ParseContext& context) {
  for (const auto& word : kWords) {
    if (absl::EqualsIgnoreCase(text, word.text)) return word.value;
  }
  return InvalidValueError(
      context.name, text,
      absl::StrCat(
          "is not one of ",
          absl::StrJoin(kWords, ", ", [](std::string* out, const auto& word) {
            absl::StrAppend(out, word.text);
          })));
}

template <const auto& kWords>
std::string FormatWord(const WordValue<kWords>& value) {
  return std::string(WordOf<kWords>(value));
}

absl::StatusOr<std::string> ParseString(absl::string_view text,
                                        const ParseContext&) {
  return std::string(text);
}

absl::StatusOr<std::string> ParseLogDir(absl::string_view text,
                                        const ParseContext& context) {
  if (text.empty()) {
    return InvalidValueError(
        context.name, text,
        "is empty; name a directory, or \"disabled\" for no log files");
  }
  return std::string(text);
}

std::string FormatString(const std::string& value) { return value; }

absl::StatusOr<uint64_t> ParsePremappedBufferSize(absl::string_view text,
                                                  const ParseContext& context) {
  absl::StatusOr<uint64_t> parsed = ParseDecimal(text, context.name);
  if (!parsed.ok()) {
    // "4G": a byte size as the tools' flags take it. Say what it is in
    // bytes, and that this variable takes bytes only.
    if (absl::StatusOr<uint64_t> bytes = ParseByteSize(text, context.name);
        bytes.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          parsed.status().message(), "; ", text, " is ", *bytes,
          " bytes: write that (", context.name,
          " takes decimal bytes without a unit, unlike the tools' byte flags "
          "such as --region-bytes, which take K/M/G/T suffixes)"));
    }
    return parsed.status();
  }
  const uint64_t size = *parsed;
  const uint64_t floor = size - size % kPremappedSizeMultiple;
  if (floor == size) return size;
  std::string nearest;
  if (floor > std::numeric_limits<uint64_t>::max() - kPremappedSizeMultiple) {
    nearest = absl::StrCat("the nearest valid value is ", floor);
  } else {
    nearest = absl::StrCat(
        "the nearest valid values are ",
        floor == 0 ? "0 (turns the region off)" : absl::StrCat(floor), " and ",
        floor + kPremappedSizeMultiple);
  }
  return InvalidValueError(
      context.name, text,
      absl::StrCat("is not a multiple of ", kPremappedSizeMultiple,
                   " (whole 4 KiB pages); ", nearest));
}

// Checks the threshold against the size resolved before it. With the region
// off the value only has to be a decimal: ResolveOptions then sets it to 0.
absl::StatusOr<uint64_t> ParseTransferThreshold(absl::string_view text,
                                                const ParseContext& context) {
  TPUSHIM_ASSIGN_OR_RETURN(const uint64_t threshold,
                           ParseDecimal(text, context.name));
  const uint64_t size = context.resolved.premapped_buffer_size.value;
  if (size == 0) return threshold;
  if (threshold == 0) {
    return InvalidValueError(
        context.name, text,
        "must be greater than 0 (it is the largest single allocation from "
        "the premapped region)");
  }
  if (threshold > size) {
    context.warnings->push_back(
        absl::StrCat(context.name, "=\"", text, "\" is larger than ",
                     kSizeVariable, "=", size, "; using ", size));
    return size;
  }
  return threshold;
}

absl::StatusOr<std::vector<VmoduleEntry>> ParseVmoduleSetting(
    absl::string_view text, const ParseContext& context) {
  return ParseVmodule(text, context.warnings);
}

std::string FormatVmodule(const std::vector<VmoduleEntry>& entries) {
  return absl::StrJoin(entries, ",",
                       [](std::string* out, const VmoduleEntry& entry) {
                         absl::StrAppend(out, entry.glob, "=", entry.level);
                       });
}

absl::StatusOr<std::optional<int>> ParseNumaNode(absl::string_view text,
                                                 const ParseContext& context) {
  if (absl::EqualsIgnoreCase(text, "auto")) return std::optional<int>();
  const absl::StatusOr<uint64_t> node =
      ParseDecimal(text, context.name, 0, kMaxNumaNode);
  if (!node.ok()) {
    return InvalidValueError(
        context.name, text,
        absl::StrCat("is neither auto nor a NUMA node number in [0, ",
                     kMaxNumaNode, "]"));
  }
  return std::optional<int>(static_cast<int>(*node));
}

std::string FormatNumaNode(const std::optional<int>& node) {
  return node.has_value() ? absl::StrCat(*node) : "auto";
}

// Adapts a parser whose messages name the offending part of a value but not
// the setting (ParseDeviceUrl, ParseFaultSpec): its errors gain a
// `<name>="<text>": ` prefix.
template <auto kParse>
auto ParseWhole(absl::string_view text, const ParseContext& context)
    -> decltype(kParse(text)) {
  auto parsed = kParse(text);
  if (!parsed.ok()) {
    return absl::Status(parsed.status().code(),
                        absl::StrCat(context.name, "=\"", text,
                                     "\": ", parsed.status().message()));
  }
  return parsed;
}

// TPU_VISIBLE_CHIPS: "" (every chip) or a comma list of distinct host chip
// indices of the device URL's host (resolved before it).
absl::StatusOr<std::vector<int>> ParseVisibleChips(
    absl::string_view text, const ParseContext& context) {
  std::vector<int> chips;
  if (text.empty()) return chips;
  const int host_chips = context.resolved.host_chip_count();
  for (absl::string_view entry : absl::StrSplit(text, ',')) {
    const absl::StatusOr<uint64_t> chip = ParseDecimal(entry, "chip", 0, 1023);
    if (!chip.ok()) {
      return InvalidValueError(
          context.name, text,
          absl::StrCat("is not a comma list of chip indices (\"", entry,
                       "\" is not a decimal number), e.g. 0,1"));
    }
    if (!context.standalone && *chip >= static_cast<uint64_t>(host_chips)) {
      return InvalidValueError(
          context.name, text,
          absl::StrCat("names chip ", *chip, ", but the host has chips 0..",
                       host_chips - 1, " (TPUSHIM_DEVICE=",
                       context.resolved.device.value.text, ")"));
    }
    if (std::find(chips.begin(), chips.end(), static_cast<int>(*chip)) !=
        chips.end()) {
      return InvalidValueError(context.name, text,
                               absl::StrCat("names chip ", *chip, " twice"));
    }
    chips.push_back(static_cast<int>(*chip));
  }
  return chips;
}

std::string FormatChipList(const std::vector<int>& chips) {
  return absl::StrJoin(chips, ",");
}

// "x,y,z" of positive integers; "" = not given.
absl::StatusOr<std::vector<int>> ParseBoundsText(absl::string_view text,
                                                 const ParseContext& context) {
  std::vector<int> bounds;
  if (text.empty()) return bounds;
  const std::vector<absl::string_view> parts = absl::StrSplit(text, ',');
  for (absl::string_view part : parts) {
    const absl::StatusOr<uint64_t> v = ParseDecimal(part, "bound", 1, 1024);
    if (parts.size() != 3 || !v.ok()) {
      return InvalidValueError(
          context.name, text,
          "is not three positive integers x,y,z (each 1..1024), e.g. 2,2,1");
    }
    bounds.push_back(static_cast<int>(*v));
  }
  return bounds;
}

absl::StatusOr<std::vector<int>> ParseProcessBounds(
    absl::string_view text, const ParseContext& context) {
  return ParseBoundsText(text, context);
}

// The chips-per-process bounds: their product is the number of chips the
// process uses (TPU_VISIBLE_CHIPS, resolved before them).
absl::StatusOr<std::vector<int>> ParseChipsPerProcessBounds(
    absl::string_view text, const ParseContext& context) {
  TPUSHIM_ASSIGN_OR_RETURN(std::vector<int> bounds,
                           ParseBoundsText(text, context));
  if (bounds.empty() || context.standalone) return bounds;
  const int product = bounds[0] * bounds[1] * bounds[2];
  const int chips = static_cast<int>(context.resolved.ProcessChips().size());
  if (product != chips) {
    const Option<std::vector<int>>& visible = context.resolved.visible_chips;
    return InvalidValueError(
        context.name, text,
        absl::StrCat("has ", product, " chips (", bounds[0], "x", bounds[1],
                     "x", bounds[2], "), but this process uses ", chips,
                     " chip", chips == 1 ? "" : "s",
                     visible.value.empty()
                         ? absl::StrCat(" (every chip of TPUSHIM_DEVICE=",
                                        context.resolved.device.value.text, ")")
                         : absl::StrCat(" (TPU_VISIBLE_CHIPS=",
                                        FormatChipList(visible.value), ")")));
  }
  return bounds;
}

absl::StatusOr<std::string> ParseRunDir(absl::string_view text,
                                        const ParseContext& context) {
  if (text.empty() || text[0] != '/') {
    return InvalidValueError(context.name, text,
                             "is not an absolute directory path");
  }
  return std::string(text);
}

std::string FormatDevice(const DeviceUrl& url) { return url.text; }
std::string FormatFaults(const FaultSpec& spec) { return spec.text; }

// ---- The settings -----------------------------------------------------------

// One setting: where its text comes from, how it is parsed and shown, and
// where its value goes. `A` is the type of its API override: either `T`
// itself, or std::string for settings given as text (device, faults, ...).
template <typename T, typename A>
struct Setting {
  absl::string_view variable;
  absl::string_view flag;  // "" when LIBTPU_INIT_ARGS has no flag for it
  absl::string_view api_field;
  Option<T> Options::*option;
  std::optional<A> OptionOverrides::*api;
  std::type_identity_t<Parser<T>> parse;
  std::type_identity_t<Formatter<T>> format;
};

// Spelled out for compilers without aggregate deduction (clang < 17).
template <typename T, typename A>
Setting(absl::string_view, absl::string_view, absl::string_view,
        Option<T> Options::*, std::optional<A> OptionOverrides::*,
        std::type_identity_t<Parser<T>>, std::type_identity_t<Formatter<T>>)
    -> Setting<T, A>;

// In the order of docs/configuration.md's table. The size precedes the
// threshold, whose parser reads it.
constexpr std::tuple kSettings{
    Setting{"TPU_PREMAPPED_BUFFER_SIZE", "tpu_premapped_buffer_size",
            "premapped_buffer_size", &Options::premapped_buffer_size,
            &OptionOverrides::premapped_buffer_size, ParsePremappedBufferSize,
            FormatNumber<uint64_t>},
    Setting{"TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES",
            "tpu_premapped_buffer_transfer_threshold_bytes",
            "premapped_buffer_transfer_threshold_bytes",
            &Options::premapped_buffer_transfer_threshold_bytes,
            &OptionOverrides::premapped_buffer_transfer_threshold_bytes,
            ParseTransferThreshold, FormatNumber<uint64_t>},
    Setting{"TPU_LOG_DIR", "", "log_dir", &Options::log_dir,
            &OptionOverrides::log_dir, ParseLogDir, FormatString},
    Setting{"TPU_MIN_LOG_LEVEL", "", "min_log_level", &Options::min_log_level,
            &OptionOverrides::min_log_level, ParseNumber<int, 0, 3>,
            FormatNumber<int>},
    Setting{"TPU_STDERR_LOG_LEVEL", "", "stderr_log_level",
            &Options::stderr_log_level, &OptionOverrides::stderr_log_level,
            ParseNumber<int, 0, 3>, FormatNumber<int>},
    Setting{"TPU_VMODULE", "", "vmodule", &Options::vmodule,
            &OptionOverrides::vmodule, ParseVmoduleSetting, FormatVmodule},
    Setting{"TPU_MAX_LOG_SIZE_MB", "", "max_log_size_mb",
            &Options::max_log_size_mb, &OptionOverrides::max_log_size_mb,
            ParseNumber<uint64_t, 1, 1048576>, FormatNumber<uint64_t>},
    Setting{"TPUSHIM_LOG_KEEP", "", "log_keep", &Options::log_keep,
            &OptionOverrides::log_keep, ParseNumber<int, 0, 1000000>,
            FormatNumber<int>},
    Setting{"TPUSHIM_DEVICE", "", "device", &Options::device,
            &OptionOverrides::device, ParseWhole<ParseDeviceUrl>, FormatDevice},
    Setting{"TPUSHIM_HUGEPAGES", "", "hugepages", &Options::hugepages,
            &OptionOverrides::hugepages, ParseWord<kHugePagesWords>,
            FormatWord<kHugePagesWords>},
    Setting{"TPUSHIM_PREFAULT_THREADS", "", "prefault_threads",
            &Options::prefault_threads, &OptionOverrides::prefault_threads,
            ParseNumber<int, 0, 1024>, FormatNumber<int>},
    Setting{"TPUSHIM_NUMA_NODE", "", "numa_node", &Options::numa_node,
            &OptionOverrides::numa_node, ParseNumaNode, FormatNumaNode},
    Setting{"TPUSHIM_MLOCK", "", "mlock", &Options::mlock,
            &OptionOverrides::mlock, ParseWord<kMlockWords>,
            FormatWord<kMlockWords>},
    Setting{"TPUSHIM_FAULTS", "", "faults", &Options::faults,
            &OptionOverrides::faults, ParseWhole<ParseFaultSpec>, FormatFaults},
    Setting{"TPUSHIM_TRACE_FILE", "", "trace_file", &Options::trace_file,
            &OptionOverrides::trace_file, ParseString, FormatString},
    Setting{"TPUSHIM_PREMAP", "", "premap", &Options::premap,
            &OptionOverrides::premap, ParseWord<kPremapWords>,
            FormatWord<kPremapWords>},
    Setting{"TPUSHIM_MEMORY_PROFILE", "", "memory_profile",
            &Options::memory_profile, &OptionOverrides::memory_profile,
            ParseString, FormatString},
    Setting{"TPU_VISIBLE_CHIPS", "", "visible_chips", &Options::visible_chips,
            &OptionOverrides::visible_chips, ParseVisibleChips, FormatChipList},
    Setting{"TPU_CHIPS_PER_PROCESS_BOUNDS", "", "chips_per_process_bounds",
            &Options::chips_per_process_bounds,
            &OptionOverrides::chips_per_process_bounds,
            ParseChipsPerProcessBounds, FormatChipList},
    Setting{"TPU_PROCESS_BOUNDS", "", "process_bounds",
            &Options::process_bounds, &OptionOverrides::process_bounds,
            ParseProcessBounds, FormatChipList},
    Setting{"TPUSHIM_DUMP_ON_OOM", "", "dump_on_oom", &Options::dump_on_oom,
            &OptionOverrides::dump_on_oom, ParseWord<kDumpOnOomWords>,
            FormatWord<kDumpOnOomWords>},
    Setting{"TPUSHIM_RUN_DIR", "", "run_dir", &Options::run_dir,
            &OptionOverrides::run_dir, ParseRunDir, FormatString},
};

// Variables that mean the same as a setting's own; both set to different
// text is an error.
constexpr std::pair<absl::string_view, absl::string_view> kAliases[] = {
    {"TPU_VISIBLE_CHIPS", "TPU_VISIBLE_DEVICES"},
    {"TPU_CHIPS_PER_PROCESS_BOUNDS", "TPU_CHIPS_PER_HOST_BOUNDS"},
    {"TPU_PROCESS_BOUNDS", "TPU_HOST_BOUNDS"},
};

absl::string_view AliasOf(absl::string_view variable) {
  for (const auto& [name, alias] : kAliases) {
    if (name == variable) return alias;
  }
  return "";
}

// Calls `f` on each setting in table order until one returns an error,
// which it returns.
template <typename F>
absl::Status ForEachSetting(F&& f) {
  absl::Status status;
  std::apply(
      [&](const auto&... setting) {
        (void)(... && (status = f(setting)).ok());
      },
      kSettings);
  return status;
}

bool IsOurFlag(absl::string_view name) {
  return std::apply(
      [&](const auto&... setting) {
        return (... || (!setting.flag.empty() && setting.flag == name));
      },
      kSettings);
}

// ---- Resolution -------------------------------------------------------------

// Our LIBTPU_INIT_ARGS flags: name -> value, the last one given.
using InitArgs = std::map<absl::string_view, absl::string_view>;

absl::StatusOr<InitArgs> ParseInitArgs(absl::string_view args) {
  const std::vector<absl::string_view> words =
      absl::StrSplit(args, absl::ByAnyChar(" \t\n\v\f\r"), absl::SkipEmpty());
  InitArgs ours;
  for (size_t i = 0; i < words.size(); ++i) {
    absl::string_view word = words[i];
    if (word == "--") break;
    if (!absl::ConsumePrefix(&word, "-")) continue;  // not a flag
    absl::ConsumePrefix(&word, "-");
    const size_t equals = word.find('=');
    const absl::string_view name = word.substr(0, equals);
    if (!IsOurFlag(name)) continue;  // another part of libtpu's
    if (equals != word.npos) {
      ours[name] = word.substr(equals + 1);
    } else if (i + 1 < words.size()) {
      ours[name] = words[++i];  // `--name value`
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(kInitArgsVariable, " flag --", name,
                       " has no value; expected --", name, "=<bytes>"));
    }
  }
  return ours;
}

struct Inputs {
  Os& os;
  const InitArgs& flags;
  const OptionOverrides& api;
};

// An API value as text, for the setting's parser.
template <typename T, typename A>
std::string ApiText(const Setting<T, A>& setting, const A& value) {
  if constexpr (std::is_same_v<A, std::string>) {
    return value;
  } else {
    static_assert(std::is_same_v<A, T>);
    return setting.format(value);
  }
}

// Parses every source that gives the setting, lowest precedence first, so
// the highest one given wins and every one is validated.
template <typename T, typename A>
absl::Status Resolve(const Setting<T, A>& setting, const Inputs& inputs,
                     Options& options) {
  struct Given {
    OptionSource source;
    std::string name;
    std::string text;
  };
  std::vector<Given> given;
  std::optional<std::string> env =
      inputs.os.GetEnv(std::string(setting.variable));
  std::string env_name(setting.variable);
  if (const absl::string_view alias = AliasOf(setting.variable);
      !alias.empty()) {
    if (std::optional<std::string> other =
            inputs.os.GetEnv(std::string(alias))) {
      if (env.has_value() && *env != *other) {
        return absl::InvalidArgumentError(absl::StrCat(
            setting.variable, "=\"", *env, "\" and ", alias, "=\"", *other,
            "\" are both set and differ; they mean the same, set one"));
      }
      if (!env.has_value()) {
        env = std::move(other);
        env_name = std::string(alias);
      }
    }
  }
  if (env.has_value()) {
    given.push_back({OptionSource::kEnv, std::move(env_name), *std::move(env)});
  }
  if (const auto flag = inputs.flags.find(setting.flag);
      flag != inputs.flags.end()) {
    given.push_back({OptionSource::kFlag,
                     absl::StrCat(kInitArgsVariable, " flag --", setting.flag),
                     std::string(flag->second)});
  }
  if (const std::optional<A>& api = inputs.api.*setting.api) {
    given.push_back({OptionSource::kApi,
                     absl::StrCat("API option ", setting.api_field),
                     ApiText(setting, *api)});
  }
  Option<T>& option = options.*setting.option;
  std::vector<std::string> warnings;
  for (Given& value : given) {
    warnings.clear();
    TPUSHIM_ASSIGN_OR_RETURN(
        option.value,
        setting.parse(value.text,
                      ParseContext{std::move(value.name), options, &warnings,
                                   /*standalone=*/false}));
    option.source = value.source;
    option.raw =
        value.source == OptionSource::kApi ? "" : std::move(value.text);
  }
  options.warnings.insert(options.warnings.end(), warnings.begin(),
                          warnings.end());
  return absl::OkStatus();
}

}  // namespace

absl::string_view OptionSourceName(OptionSource source) {
  switch (source) {
    case OptionSource::kDefault:
      return "default";
    case OptionSource::kEnv:
      return "env";
    case OptionSource::kFlag:
      return kInitArgsVariable;
    case OptionSource::kApi:
      return "api";
  }
  return "unknown";
}

absl::string_view HugePagesModeName(HugePagesMode mode) {
  return WordOf<kHugePagesWords>(mode);
}

absl::string_view MlockModeName(MlockMode mode) {
  return WordOf<kMlockWords>(mode);
}

absl::string_view PremapModeName(PremapMode mode) {
  return WordOf<kPremapWords>(mode);
}

std::vector<VmoduleEntry> ParseVmodule(absl::string_view text,
                                       std::vector<std::string>* warnings) {
  constexpr uint64_t kMaxLevel = std::numeric_limits<int>::max();
  std::vector<VmoduleEntry> entries;
  for (absl::string_view entry : absl::StrSplit(text, ',')) {
    entry = absl::StripAsciiWhitespace(entry);
    if (entry.empty()) continue;
    const size_t equals = entry.find('=');
    const absl::string_view glob =
        absl::StripAsciiWhitespace(entry.substr(0, equals));
    const absl::string_view level_text =
        equals == entry.npos
            ? absl::string_view()
            : absl::StripAsciiWhitespace(entry.substr(equals + 1));
    const absl::StatusOr<uint64_t> level =
        ParseDecimal(level_text, "level", 0, kMaxLevel);
    std::string problem;
    if (equals == entry.npos) {
      problem = "expected <glob>=<level>, e.g. premapped_region=2";
    } else if (glob.empty()) {
      problem = "the file glob before '=' is empty";
    } else if (!level.ok()) {
      problem =
          absl::StrCat("the level \"", level_text,
                       "\" is not a decimal number in [0, ", kMaxLevel, "]");
    } else {
      entries.push_back({std::string(glob), static_cast<int>(*level)});
      continue;
    }
    if (warnings != nullptr) {
      warnings->push_back(
          absl::StrCat("TPU_VMODULE entry \"", entry, "\" ignored: ", problem));
    }
  }
  return entries;
}

int Options::host_chip_count() const {
  return device.value.scheme == DeviceUrl::Scheme::kSim ? device.value.devices
                                                        : 1;
}

std::vector<int> Options::ProcessChips() const {
  if (!visible_chips.value.empty()) return visible_chips.value;
  std::vector<int> chips(host_chip_count());
  for (int i = 0; i < host_chip_count(); ++i) chips[i] = i;
  return chips;
}

int Options::EffectivePrefaultThreads(int online_cpus) const {
  if (prefault_threads.value > 0) return prefault_threads.value;
  return std::clamp(online_cpus, 1, kMaxDefaultPrefaultThreads);
}

// A TPU_* or TPUSHIM_* variable a letter or two away from one this
// runtime reads is most likely a typo, which would otherwise be ignored
// without a word. Names that are not close to any setting are left alone:
// libtpu and cloud images set TPU_* variables of their own.
void WarnAboutMisspelledVariables(Os& os, std::vector<std::string>& warnings) {
  std::vector<std::string> known = {std::string(kInitArgsVariable)};
  for (const auto& [name, alias] : kAliases) known.emplace_back(alias);
  (void)ForEachSetting([&](const auto& setting) {
    known.emplace_back(setting.variable);
    return absl::OkStatus();
  });
  std::vector<std::string> names = os.EnvironmentNames();
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    if (!absl::StartsWith(name, "TPU_") && !absl::StartsWith(name, "TPUSHIM_")) {
      continue;
    }
    if (std::find(known.begin(), known.end(), name) != known.end()) continue;
    const std::vector<std::string> close = ClosestMatches(name, known);
    if (close.empty()) continue;
    warnings.push_back(absl::StrCat(
        name, " is set, but tpushim reads no such variable and ignores it; "
        "did you mean ", absl::StrJoin(close, " or "), "?"));
  }
}

absl::StatusOr<Options> ResolveOptions(Os& os, const OptionOverrides& api) {
  const std::string init_args =
      os.GetEnv(std::string(kInitArgsVariable)).value_or("");
  TPUSHIM_ASSIGN_OR_RETURN(const InitArgs flags, ParseInitArgs(init_args));
  const Inputs inputs{os, flags, api};
  Options options;
  TPUSHIM_RETURN_IF_ERROR(ForEachSetting(
      [&](const auto& setting) { return Resolve(setting, inputs, options); }));
  WarnAboutMisspelledVariables(os, options.warnings);
  // The threshold defaults to the size; with the region off it is 0 and a
  // value given for it is ignored.
  Option<uint64_t>& threshold =
      options.premapped_buffer_transfer_threshold_bytes;
  if (threshold.source == OptionSource::kDefault ||
      !options.premapped_region_enabled()) {
    threshold = Option<uint64_t>{options.premapped_buffer_size.value};
  }
  return options;
}

absl::Status SetOptionOverride(OptionOverrides& overrides,
                               absl::string_view variable,
                               absl::string_view text) {
  bool found = false;
  TPUSHIM_RETURN_IF_ERROR(ForEachSetting([&](const auto& setting)
                                             -> absl::Status {
    if (found || setting.variable != variable) return absl::OkStatus();
    found = true;
    // The setting's own parser, named as its variable. With the region
    // "off" in `resolved`, the threshold's parser checks only that it is a
    // decimal: ResolveOptions checks it against the size once that is known.
    Options resolved;
    resolved.premapped_buffer_size.value = 0;
    std::vector<std::string> warnings;  // ResolveOptions reports them
    TPUSHIM_ASSIGN_OR_RETURN(
        auto value,
        setting.parse(text,
                      ParseContext{std::string(setting.variable), resolved,
                                   &warnings, /*standalone=*/true}));
    auto& field = overrides.*setting.api;
    using ApiType = typename std::remove_cvref_t<decltype(field)>::value_type;
    if constexpr (std::is_same_v<ApiType, decltype(value)>) {
      field = std::move(value);
    } else {
      // Settings given to the API as text (device, faults, vmodule).
      static_assert(std::is_same_v<ApiType, std::string>);
      field = std::string(text);
    }
    return absl::OkStatus();
  }));
  if (!found) {
    std::vector<absl::string_view> known;
    (void)ForEachSetting([&](const auto& setting) {
      known.push_back(setting.variable);
      return absl::OkStatus();
    });
    return absl::InvalidArgumentError(
        absl::StrCat("unknown option \"", variable,
                     "\"; options are named by their environment variable: ",
                     absl::StrJoin(known, ", ")));
  }
  return absl::OkStatus();
}

std::vector<OptionRow> DescribeOptions(const Options& options) {
  std::vector<OptionRow> rows;
  (void)ForEachSetting([&](const auto& setting) {
    const auto& option = options.*setting.option;
    std::string value = setting.format(option.value);
    rows.push_back({std::string(setting.variable),
                    value.empty() ? "\"\"" : std::move(value), option.source});
    return absl::OkStatus();
  });
  return rows;
}

}  // namespace tpushim
