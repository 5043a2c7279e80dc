#include "tools/cli/flags.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <string>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "env/device_url.h"
#include "tools/cli/text_table.h"

namespace tpushim::tools {
namespace {

// "12" for whole values, else the shortest text that reads back the same.
std::string NumberText(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e15) {
    return absl::StrCat(static_cast<int64_t>(v));
  }
  return absl::StrFormat("%g", v);
}

std::string OfUnit(absl::string_view unit) {
  return unit.empty() ? "" : absl::StrCat(" of ", unit);
}

// "from A to B", or "≥ A" when B is the type's largest value.
template <typename T>
std::string Bounds(T min, T max, bool unbounded, std::string (*text)(T)) {
  return unbounded ? absl::StrCat("≥ ", text(min))
                   : absl::StrCat("from ", text(min), " to ", text(max));
}

absl::Status Rejected(absl::string_view flag, absl::string_view accepts,
                      absl::string_view text) {
  return absl::InvalidArgumentError(
      absl::StrCat(flag, " must be ", accepts, ", got \"", text, "\""));
}

// from_chars over the whole of `text`, with one leading '+' allowed.
template <typename T>
bool ParseAll(absl::string_view text, T& value) {
  if (absl::ConsumePrefix(&text, "+") &&
      (text.empty() || text.front() == '+' || text.front() == '-')) {
    return false;
  }
  if (text.empty()) return false;
  const std::from_chars_result r =
      std::from_chars(text.data(), text.data() + text.size(), value);
  return r.ec == std::errc() && r.ptr == text.data() + text.size();
}

// CLI11 calls these with the option's one value; a rejected value throws
// the error CLI11 reports as a bad command line.
void Throw(const absl::Status& status) {
  throw CLI::ValidationError(std::string(status.message()));
}

CLI::Option* Finish(CLI::Option* option, absl::string_view type,
                    std::string default_text) {
  option->type_name(std::string(type));
  option->default_str(std::move(default_text));
  return option;
}

template <typename Int>
CLI::Option* AddWhole(CLI::App* app, const std::string& name, Int* value,
                      const WholeRange& range, const std::string& help) {
  const std::string flag = name;
  CLI::Option* option = app->add_option_function<std::string>(
      name,
      [flag, value, range](const std::string& text) {
        absl::StatusOr<int64_t> v = ParseWholeFlag(flag, text, range);
        if (!v.ok()) Throw(v.status());
        *value = static_cast<Int>(*v);
      },
      help);
  return Finish(option, "WHOLE", absl::StrCat(*value));
}

}  // namespace

absl::StatusOr<double> ParseDecimalFlag(absl::string_view flag,
                                        absl::string_view text,
                                        const DecimalRange& range) {
  const std::string accepts = absl::StrCat(
      "a finite number", OfUnit(range.unit), " ",
      Bounds<double>(range.min, range.max, std::isinf(range.max), NumberText));
  double v = 0;
  if (!ParseAll(text, v) || !std::isfinite(v) || v < range.min ||
      v > range.max) {
    return Rejected(flag, accepts, text);
  }
  return v;
}

absl::StatusOr<int64_t> ParseWholeFlag(absl::string_view flag,
                                       absl::string_view text,
                                       const WholeRange& range) {
  const std::string accepts =
      absl::StrCat("a whole number", OfUnit(range.unit), " ",
                   Bounds<int64_t>(
                       range.min, range.max,
                       range.max == std::numeric_limits<int64_t>::max(),
                       +[](int64_t x) { return absl::StrCat(x); }));
  int64_t v = 0;
  if (!ParseAll(text, v) || v < range.min || v > range.max) {
    return Rejected(flag, accepts, text);
  }
  return v;
}

absl::StatusOr<uint64_t> ParseUnsignedFlag(absl::string_view flag,
                                           absl::string_view text,
                                           absl::string_view unit) {
  uint64_t v = 0;
  if (!ParseAll(text, v)) {
    return Rejected(flag,
                    absl::StrCat("a whole number", OfUnit(unit), " from 0 to ",
                                 std::numeric_limits<uint64_t>::max()),
                    text);
  }
  return v;
}

absl::StatusOr<uint64_t> ParseByteFlag(absl::string_view flag,
                                       absl::string_view text,
                                       const ByteRange& range) {
  const std::string accepts =
      absl::StrCat("a byte size ",
                   Bounds<uint64_t>(
                       range.min, range.max,
                       range.max == std::numeric_limits<uint64_t>::max(),
                       +[](uint64_t x) { return SizeName(x); }),
                   ", e.g. 4096, 512M or 16GiB");
  absl::StatusOr<uint64_t> v = ParseByteSize(text, flag);
  if (!v.ok() || *v < range.min || *v > range.max) {
    return Rejected(flag, accepts, text);
  }
  return v;
}

CLI::Option* AddDecimalFlag(CLI::App* app, const std::string& name,
                            double* value, const DecimalRange& range,
                            const std::string& help) {
  const std::string flag = name;
  CLI::Option* option = app->add_option_function<std::string>(
      name,
      [flag, value, range](const std::string& text) {
        absl::StatusOr<double> v = ParseDecimalFlag(flag, text, range);
        if (!v.ok()) Throw(v.status());
        *value = *v;
      },
      help);
  return Finish(option, "NUMBER", NumberText(*value));
}

CLI::Option* AddWholeFlag(CLI::App* app, const std::string& name, int* value,
                          const WholeRange& range, const std::string& help) {
  return AddWhole(app, name, value, range, help);
}
CLI::Option* AddWholeFlag(CLI::App* app, const std::string& name,
                          int64_t* value, const WholeRange& range,
                          const std::string& help) {
  return AddWhole(app, name, value, range, help);
}
CLI::Option* AddWholeFlag(CLI::App* app, const std::string& name,
                          uint64_t* value, const WholeRange& range,
                          const std::string& help) {
  return AddWhole(app, name, value, range, help);
}

CLI::Option* AddUnsignedFlag(CLI::App* app, const std::string& name,
                             uint64_t* value, absl::string_view unit,
                             const std::string& help) {
  const std::string flag = name;
  const std::string unit_text(unit);
  CLI::Option* option = app->add_option_function<std::string>(
      name,
      [flag, value, unit_text](const std::string& text) {
        absl::StatusOr<uint64_t> v = ParseUnsignedFlag(flag, text, unit_text);
        if (!v.ok()) Throw(v.status());
        *value = *v;
      },
      help);
  return Finish(option, "WHOLE", absl::StrCat(*value));
}

CLI::Option* AddByteFlag(CLI::App* app, const std::string& name,
                         std::string* text, const ByteRange& range,
                         const std::string& help) {
  const std::string flag = name;
  CLI::Option* option = app->add_option_function<std::string>(
      name,
      [flag, text, range](const std::string& given) {
        absl::StatusOr<uint64_t> v = ParseByteFlag(flag, given, range);
        if (!v.ok()) Throw(v.status());
        *text = given;
      },
      help);
  return Finish(option, "BYTES", *text);
}

}  // namespace tpushim::tools
