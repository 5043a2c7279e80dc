#include "tools/shape/shape.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/human_bytes.h"
#include "device/hbm_report.h"
#include "device/xla_shape.h"
#include "env/device_url.h"
#include "nlohmann/json.hpp"
#include "tools/cli/flags.h"
#include "tpushim/options.h"
#include "tpushim/system.h"

namespace tpushim::tools {
namespace {

using Json = nlohmann::ordered_json;

constexpr char kShapeDescription[] =
    "Show what XLA shapes take in TPU device memory, padding included";

constexpr char kShapeFooter[] = R"footer(
SHAPE is XLA's shape string of an array or a tuple, e.g. f32[1024,1000],
bf16[8,128]{1,0:T(8,128)(2,1)} or (s32[2], f32[3,4]); =LABEL names it in
reports. Without a layout a shape gets TPU's default: row-major, with the
two most minor dimensions tiled by (8,128) for 32-bit types (docs/shapes.md
has the table). Quote shapes: the shell treats [ ] { } ( ) specially.

For each shape it prints the layout used, XLA's Size:, Unpadded size: and
Extra memory due to padding: lines, and which dimension causes the padding
with the nearest sizes that avoid it. With --hbm the arrays are allocated
in order on one simulated device of that capacity, as the runtime would;
if they do not all fit, the runtime's error with XLA's HBM report follows.

Exit status: 0 when every shape parsed (and fits in --hbm); 2 for a
malformed shape or flag; 1 when the shapes do not fit in --hbm.

Examples:
  tpushim shape 's32[29360128,10]=one_hot'
  tpushim shape 'bf16[4096,4100]' 'bf16[4096,4096]'
  tpushim shape --json 'f32[1000,1000]' | jq '.shapes[0].size_bytes'
  tpushim shape --hbm 16G 'f32[32768,32768]=weights' 's32[29360128,10]=one_hot')footer";

// What --hbm takes: what the simulated device it starts takes (hbm= of
// sim://), so that every value the flag accepts starts one.
constexpr ByteRange kHbmRange{.min = kSimMinHbmBytes, .max = kSimMaxHbmBytes};

struct ShapeFlags {
  std::vector<std::string> shapes;
  std::string hbm;
  bool json = false;
};

struct Given {
  std::string text;  // as given, label aside
  std::optional<std::string> label;
  Shape shape;
};

// The arrays of a shape in order (a tuple's, flattened).
void Arrays(const Shape& shape, std::vector<const ArrayShape*>& out) {
  if (!shape.is_tuple) {
    out.push_back(&shape.array);
    return;
  }
  for (const Shape& element : shape.tuple) Arrays(element, out);
}

Json ArrayJson(const ArrayShape& a) {
  const ShapeSizes sizes = ComputeSizes(a).value();  // parsed: sizes fit
  const PaddingHint hint = ExplainPadding(a);
  Json dims = Json::array();
  for (const DimensionPadding& d : hint.dims) {
    dims.push_back({{"dimensions", d.dims},
                    {"size", d.size},
                    {"padded_size", d.padded_size},
                    {"granule", d.granule},
                    {"smaller", d.smaller},
                    {"larger", d.larger}});
  }
  return Json{
      {"layout", ToString(a)},
      {"layout_given", a.layout_given},
      {"size_bytes", sizes.padded_bytes},
      {"unpadded_bytes", sizes.unpadded_bytes},
      {"padding_bytes", sizes.padded_bytes - sizes.unpadded_bytes},
      {"expansion", sizes.unpadded_bytes == 0
                        ? Json(nullptr)
                        : Json(static_cast<double>(sizes.padded_bytes) /
                               static_cast<double>(sizes.unpadded_bytes))},
      {"padding", hint.text},
      {"padded_dimensions", dims}};
}

Json GivenJson(const Given& g) {
  Json j = {{"shape", g.text},
            {"label", g.label.has_value() ? Json(*g.label) : Json(nullptr)}};
  if (!g.shape.is_tuple) {
    j.update(ArrayJson(g.shape.array));
    return j;
  }
  const ShapeSizes sizes = ComputeSizes(g.shape).value();
  std::vector<const ArrayShape*> arrays;
  Arrays(g.shape, arrays);
  Json elements = Json::array();
  for (const ArrayShape* a : arrays) elements.push_back(ArrayJson(*a));
  j["layout"] = ToString(g.shape);
  j["layout_given"] = nullptr;
  j["size_bytes"] = sizes.padded_bytes;
  j["unpadded_bytes"] = sizes.unpadded_bytes;
  j["padding_bytes"] = sizes.padded_bytes - sizes.unpadded_bytes;
  j["expansion"] = sizes.unpadded_bytes == 0
                       ? Json(nullptr)
                       : Json(static_cast<double>(sizes.padded_bytes) /
                              static_cast<double>(sizes.unpadded_bytes));
  j["elements"] = elements;
  return j;
}

HbmBuffer BufferOf(const ArrayShape& a) {
  const ShapeSizes sizes = ComputeSizes(a).value();
  HbmBuffer b;
  b.padded_bytes = sizes.padded_bytes;
  b.unpadded_bytes = sizes.unpadded_bytes;
  b.held_bytes = sizes.padded_bytes;
  b.shape = a;
  return b;
}

// "  Size: ...\n  Unpadded size: ...\n  Extra memory ...\n  <hint>\n" for
// one array, each line after `indent`.
void PrintArray(const ArrayShape& a, const std::string& indent,
                std::ostream& out) {
  HbmBuffer b = BufferOf(a);
  b.shape.reset();  // the layout is on the line above
  out << indent << FormatHbmBufferLines(b, indent) << "\n";
  out << indent << "Padding: " << ExplainPadding(a).text << "\n";
}

void PrintGiven(const Given& g, std::ostream& out) {
  out << ToString(g.shape);
  if (g.label.has_value()) out << "  (" << *g.label << ")";
  if (!g.shape.is_tuple && !g.shape.array.layout_given) {
    out << "  [TPU's default layout]";
  }
  out << "\n";
  if (!g.shape.is_tuple) {
    PrintArray(g.shape.array, "  ", out);
    return;
  }
  const ShapeSizes sizes = ComputeSizes(g.shape).value();
  out << "  Size: " << HumanReadableBytes(sizes.padded_bytes) << "\n"
      << "  Unpadded size: " << HumanReadableBytes(sizes.unpadded_bytes) << "\n"
      << "  Extra memory due to padding: "
      << FormatPaddingExtra(sizes.padded_bytes, sizes.unpadded_bytes) << "\n";
  std::vector<const ArrayShape*> arrays;
  Arrays(g.shape, arrays);
  for (size_t i = 0; i < arrays.size(); ++i) {
    out << "  element " << i << ": " << ToString(*arrays[i]) << "\n";
    PrintArray(*arrays[i], "    ", out);
  }
}

// Allocates every array of `given` in order on one simulated device of
// `capacity` bytes. Fills `hbm` (the JSON "hbm" object); returns the
// failed allocation's status, OK when all fit.
absl::Status AllocateAll(const std::vector<Given>& given, uint64_t capacity,
                         Json& hbm) {
  OptionOverrides overrides;
  overrides.device = absl::StrCat("sim://?devices=1&hbm=", capacity);
  overrides.premapped_buffer_size = 0;
  overrides.log_dir = "disabled";
  overrides.stderr_log_level = 3;  // the error is printed here, once
  absl::StatusOr<std::unique_ptr<System>> system = System::Create(overrides);
  if (!system.ok()) return system.status();
  hbm["capacity_bytes"] = capacity;
  int allocated = 0;
  absl::Status status;
  for (const Given& g : given) {
    std::vector<const ArrayShape*> arrays;
    Arrays(g.shape, arrays);
    for (size_t i = 0; i < arrays.size() && status.ok(); ++i) {
      DeviceBufferSpec spec;
      spec.shape = ToString(*arrays[i]);
      spec.label = g.label.value_or(g.text);
      if (g.shape.is_tuple) absl::StrAppend(&spec.label, "{", i, "}");
      absl::StatusOr<DeviceBuffer> b = (*system)->AllocateDevice(0, spec);
      if (b.ok()) {
        ++allocated;
      } else {
        status = b.status();
      }
    }
    if (!status.ok()) break;
  }
  hbm["fits"] = status.ok();
  hbm["used_bytes"] = (*system)->GetStats().devices[0].hbm_in_use;
  hbm["allocated"] = allocated;
  hbm["error"] =
      status.ok() ? Json(nullptr) : Json(std::string(status.message()));
  return status;
}

void RunShape(const ShapeFlags& flags, CommandContext& context) {
  std::ostream& out = *context.out;
  std::vector<Given> given;
  for (const std::string& arg : flags.shapes) {
    Given g;
    const size_t eq = arg.find('=');
    g.text = arg.substr(0, eq);
    if (eq != std::string::npos) g.label = arg.substr(eq + 1);
    absl::StatusOr<Shape> shape = ParseShape(g.text);
    // Each array's size fits 64 bits once parsed; a tuple's total may not.
    absl::Status sized =
        shape.ok() ? ComputeSizes(*shape).status() : shape.status();
    if (!sized.ok()) {
      ReportError(sized, "bad shape", flags.json, kExitUsage, context);
      return;
    }
    g.shape = *std::move(shape);
    given.push_back(std::move(g));
  }
  Json hbm;
  absl::Status fits;
  if (!flags.hbm.empty()) {
    const uint64_t capacity = ParseByteFlag("--hbm", flags.hbm, kHbmRange)
                                  .value();  // the flag's parser accepted it
    fits = AllocateAll(given, capacity, hbm);
    if (!fits.ok() && !hbm.contains("fits")) {
      ReportError(fits, "the simulated device did not start", flags.json,
                  kExitFailure, context);
      return;
    }
    if (absl::IsInvalidArgument(fits)) {
      // Parsed, but no device buffer can hold it (an array of no elements).
      ReportError(fits, "bad shape", flags.json, kExitUsage, context);
      return;
    }
  }
  if (flags.json) {
    Json shapes = Json::array();
    for (const Given& g : given) shapes.push_back(GivenJson(g));
    Json j = {{"shapes", shapes}};
    if (!hbm.is_null()) j["hbm"] = hbm;
    WriteJson(j, out);
  } else {
    for (size_t i = 0; i < given.size(); ++i) {
      if (i > 0) out << "\n";
      PrintGiven(given[i], out);
    }
    if (!hbm.is_null()) {
      out << "\n";
      if (fits.ok()) {
        out << "All " << hbm["allocated"].get<int>() << " arrays fit in "
            << HumanReadableBytes(hbm["capacity_bytes"].get<uint64_t>())
            << " hbm: " << HumanReadableBytes(hbm["used_bytes"].get<uint64_t>())
            << " used.\n";
      } else {
        out << absl::StatusCodeToString(fits.code()) << ": " << fits.message()
            << "\n";
      }
    }
  }
  context.exit_code = fits.ok() ? kExitOk : kExitFailure;
}

}  // namespace

void RegisterShapeCommand(CLI::App& app, CommandContext& context) {
  CLI::App* shape = app.add_subcommand("shape", kShapeDescription);
  shape->footer(kShapeFooter);
  auto flags = std::make_shared<ShapeFlags>();
  shape
      ->add_option("SHAPE", flags->shapes,
                   "XLA shape strings, each optionally =LABEL")
      ->required();
  AddByteFlag(shape, "--hbm", &flags->hbm, kHbmRange,
              "Allocate the shapes on one simulated device of this capacity "
              "(K/M/G/T suffixes) and show XLA's report if they do not fit");
  shape->add_flag("--json", flags->json, "Print one JSON object");
  shape->callback([flags, &context] { RunShape(*flags, context); });
}

}  // namespace tpushim::tools
