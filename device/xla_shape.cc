#include "device/xla_shape.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"

namespace tpushim {
namespace {

struct TypeInfo {
  ElementType type;
  absl::string_view name;
  int bits;
};

// clang-format off
constexpr std::array<TypeInfo, 30> kTypes = {{
    {ElementType::kPred, "pred", 1}, {ElementType::kS1, "s1", 1},
    {ElementType::kS2, "s2", 2},     {ElementType::kS4, "s4", 4},
    {ElementType::kS8, "s8", 8},     {ElementType::kS16, "s16", 16},
    {ElementType::kS32, "s32", 32},  {ElementType::kS64, "s64", 64},
    {ElementType::kU1, "u1", 1},     {ElementType::kU2, "u2", 2},
    {ElementType::kU4, "u4", 4},     {ElementType::kU8, "u8", 8},
    {ElementType::kU16, "u16", 16},  {ElementType::kU32, "u32", 32},
    {ElementType::kU64, "u64", 64},  {ElementType::kF16, "f16", 16},
    {ElementType::kBF16, "bf16", 16}, {ElementType::kF32, "f32", 32},
    {ElementType::kF64, "f64", 64},  {ElementType::kF8E5M2, "f8e5m2", 8},
    {ElementType::kF8E4M3, "f8e4m3", 8},
    {ElementType::kF8E4M3FN, "f8e4m3fn", 8},
    {ElementType::kF8E4M3B11FNUZ, "f8e4m3b11fnuz", 8},
    {ElementType::kF8E3M4, "f8e3m4", 8},
    {ElementType::kF8E5M2FNUZ, "f8e5m2fnuz", 8},
    {ElementType::kF8E4M3FNUZ, "f8e4m3fnuz", 8},
    {ElementType::kF8E8M0FNU, "f8e8m0fnu", 8},
    {ElementType::kF4E2M1FN, "f4e2m1fn", 4},
    {ElementType::kC64, "c64", 64},  {ElementType::kC128, "c128", 128},
}};
// clang-format on

const TypeInfo& Info(ElementType type) {
  return kTypes[static_cast<size_t>(type)];
}

bool MulOverflows(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}

// Bytes of `elements` elements of `bits` bits each, or nullopt on overflow.
std::optional<uint64_t> BytesOf(uint64_t elements, int bits) {
  if (bits % 8 == 0) {
    uint64_t bytes;
    if (MulOverflows(elements, uint64_t(bits / 8), &bytes)) return std::nullopt;
    return bytes;
  }
  const uint64_t per_byte = 8 / bits;  // bits is 1, 2 or 4
  return elements / per_byte + (elements % per_byte != 0 ? 1 : 0);
}

}  // namespace

// --- Element types -----------------------------------------------------------

absl::string_view ElementTypeName(ElementType type) { return Info(type).name; }

std::optional<ElementType> ElementTypeFromName(absl::string_view name) {
  for (const TypeInfo& t : kTypes) {
    if (t.name == name) return t.type;
  }
  return std::nullopt;
}

int ElementBitWidth(ElementType type) { return Info(type).bits; }
int ElementHostBytes(ElementType type) { return (Info(type).bits + 7) / 8; }

// --- Defaults ----------------------------------------------------------------

Layout DefaultLayout(ElementType type, absl::Span<const int64_t> dims) {
  Layout layout;
  const int64_t rank = int64_t(dims.size());
  for (int64_t d = rank - 1; d >= 0; --d) layout.minor_to_major.push_back(d);
  const int bits = ElementBitWidth(type);
  const bool pred = type == ElementType::kPred;
  // Elements of this type that a 32-bit word packs (along the second most
  // minor dimension, by the sub-tile (pack,1)).
  const int64_t pack = pred ? 4 : (bits >= 32 ? 1 : 32 / bits);
  // Rows of the major tile: 8 (more when the sub-tile needs more), fewer
  // for a short second most minor dimension.
  const int64_t second_minor = rank >= 2 ? dims[rank - 2] : 0;
  int64_t rows = std::max<int64_t>(8, pack);
  if (pack <= 4 && second_minor <= 4) rows = 4;
  if (pack <= 2 && second_minor <= 2) rows = 2;
  const int64_t vector = std::max<int64_t>(256, 128 * pack);
  if (rank == 0) {
    layout.tiles.push_back(Tile{{vector}});
  } else if (rank == 1) {
    layout.tiles.push_back(Tile{{vector}});
    if (pack > 1) {
      layout.tiles.push_back(Tile{{128}});
      layout.tiles.push_back(Tile{{pack, 1}});
    }
  } else {
    layout.tiles.push_back(Tile{{rows, 128}});
    if (pack > 1) layout.tiles.push_back(Tile{{pack, 1}});
  }
  if (bits < 8 && !pred) layout.element_size_in_bits = bits;
  return layout;
}

// --- Printing ----------------------------------------------------------------

std::string TilesToString(absl::Span<const Tile> tiles) {
  std::string out = tiles.empty() ? "" : "T";
  for (const Tile& t : tiles) {
    for (size_t i = 0; i < t.dims.size(); ++i) {
      absl::StrAppend(
          &out, i == 0 ? "(" : ",",
          t.dims[i] == Tile::kCombine ? "*" : absl::StrCat(t.dims[i]));
    }
    absl::StrAppend(&out, t.dims.empty() ? "()" : ")");
  }
  return out;
}

std::string LayoutToString(const Layout& layout) {
  std::string suffix = TilesToString(layout.tiles);
  if (layout.tail_padding_alignment != 1) {
    absl::StrAppend(&suffix, "L(", layout.tail_padding_alignment, ")");
  }
  if (layout.element_size_in_bits != 0) {
    absl::StrAppend(&suffix, "E(", layout.element_size_in_bits, ")");
  }
  return absl::StrCat("{", absl::StrJoin(layout.minor_to_major, ","),
                      suffix.empty() ? "" : ":", suffix, "}");
}

std::string ToString(const ArrayShape& shape) {
  return absl::StrCat(ElementTypeName(shape.type), "[",
                      absl::StrJoin(shape.dims, ","), "]",
                      LayoutToString(shape.layout));
}

std::string ToString(const Shape& shape) {
  if (!shape.is_tuple) return ToString(shape.array);
  return absl::StrCat("(",
                      absl::StrJoin(shape.tuple, ", ",
                                    [](std::string* o, const Shape& s) {
                                      o->append(ToString(s));
                                    }),
                      ")");
}

// --- The tile tree and sizes -------------------------------------------------

namespace xla_shape_internal {

absl::StatusOr<TileTree> BuildTileTree(const ArrayShape& shape) {
  auto overflow = [&] {
    return absl::InvalidArgumentError(absl::StrCat(
        "shape ", ToString(shape), ": its size does not fit in 64 bits"));
  };
  TileTree tree;
  std::vector<TileNode>& nodes = tree.nodes;
  auto add = [&](TileNode::Kind kind, int64_t extent) {
    nodes.push_back(TileNode{.kind = kind, .extent = extent});
    return int(nodes.size() - 1);
  };
  std::vector<int> cur;  // the current shape, major to minor
  const size_t rank = shape.dims.size();
  for (size_t j = 0; j < rank; ++j) {
    const int64_t dim = shape.layout.minor_to_major[rank - 1 - j];
    cur.push_back(add(TileNode::Kind::kLogical, shape.dims[dim]));
    nodes.back().logical_dim = dim;
  }
  for (const Tile& tile : shape.layout.tiles) {
    const size_t k = tile.dims.size();
    if (cur.size() < k) {  // size-1 dimensions in front
      std::vector<int> grown(k - cur.size());
      for (int& g : grown) g = add(TileNode::Kind::kMissing, 1);
      grown.insert(grown.end(), cur.begin(), cur.end());
      cur = std::move(grown);
    }
    const size_t s = cur.size() - k;
    std::vector<int> next(cur.begin(), cur.begin() + s), within;
    int carry = -1;  // a dimension `*` merges into the next one
    for (size_t j = 0; j < k; ++j) {
      int node = cur[s + j];
      if (carry >= 0) {
        uint64_t e;
        if (MulOverflows(uint64_t(nodes[carry].extent),
                         uint64_t(nodes[node].extent), &e) ||
            e > uint64_t{INT64_MAX}) {
          return overflow();
        }
        const int c = add(TileNode::Kind::kCombined, int64_t(e));
        nodes[c].major = carry;
        nodes[c].minor = node;
        nodes[carry].combined_into = nodes[node].combined_into = c;
        node = c;
      }
      carry = tile.dims[j] == Tile::kCombine ? node : -1;
      if (carry >= 0) continue;
      const int64_t t = tile.dims[j], n = nodes[node].extent;
      const int count = add(TileNode::Kind::kCount, n / t + (n % t != 0));
      const int in = add(TileNode::Kind::kWithin, t);
      for (int child : {count, in}) {
        nodes[child].parent = node;
        nodes[child].tile = t;
      }
      nodes[node].split_count = count;
      nodes[node].split_within = in;
      next.push_back(count);
      within.push_back(in);
    }
    next.insert(next.end(), within.begin(), within.end());
    cur = std::move(next);
  }
  tree.final_dims = cur;
  uint64_t elements = 1;
  for (int n : cur) {
    if (MulOverflows(elements, uint64_t(nodes[n].extent), &elements)) {
      return overflow();
    }
  }
  tree.elements = elements;
  const uint64_t align = uint64_t(shape.layout.tail_padding_alignment);
  if (elements % align != 0 &&
      __builtin_add_overflow(elements, align - elements % align, &elements)) {
    return overflow();
  }
  tree.padded_elements = elements;
  return tree;
}

}  // namespace xla_shape_internal

int DeviceElementBits(const ArrayShape& shape) {
  return shape.layout.element_size_in_bits != 0
             ? int(shape.layout.element_size_in_bits)
             : 8 * ElementHostBytes(shape.type);
}

uint64_t HostBytes(const ArrayShape& shape) {
  uint64_t n = uint64_t(ElementHostBytes(shape.type));
  for (int64_t d : shape.dims) n *= uint64_t(d);
  return n;
}

absl::StatusOr<ShapeSizes> ComputeSizes(const ArrayShape& shape) {
  std::string e = xla_shape_internal::CheckArray(shape);
  if (!e.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("shape ", ToString(shape), ": ", e));
  }
  TPUSHIM_ASSIGN_OR_RETURN(xla_shape_internal::TileTree tree,
                           xla_shape_internal::BuildTileTree(shape));
  // The host copy must be addressable too.
  uint64_t elements = uint64_t(ElementHostBytes(shape.type)), host = 1;
  bool overflow = false;
  for (int64_t d : shape.dims) {
    overflow |= MulOverflows(elements, uint64_t(d), &elements);
    overflow |= MulOverflows(host, uint64_t(d), &host);
  }
  const int bits = DeviceElementBits(shape);
  std::optional<uint64_t> padded = BytesOf(tree.padded_elements, bits);
  std::optional<uint64_t> unpadded = BytesOf(host, bits);
  if (overflow || !padded.has_value() || !unpadded.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shape ", ToString(shape), ": its size does not fit in 64 bits"));
  }
  return ShapeSizes{*padded, *unpadded};
}

absl::StatusOr<ShapeSizes> ComputeSizes(const Shape& shape) {
  if (!shape.is_tuple) return ComputeSizes(shape.array);
  ShapeSizes sum;
  for (const Shape& s : shape.tuple) {
    TPUSHIM_ASSIGN_OR_RETURN(ShapeSizes one, ComputeSizes(s));
    if (__builtin_add_overflow(sum.padded_bytes, one.padded_bytes,
                               &sum.padded_bytes) ||
        __builtin_add_overflow(sum.unpadded_bytes, one.unpadded_bytes,
                               &sum.unpadded_bytes)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shape ", ToString(shape), ": its size does not fit in 64 bits"));
    }
  }
  return sum;
}

// --- The padding hint --------------------------------------------------------

namespace {

using xla_shape_internal::TileNode;

// Elements the subtree of `n` ends up with (its padded size); a node
// merged into another counts as its extent (the merge carries its padding).
uint64_t PaddedOf(const std::vector<TileNode>& nodes, int n) {
  const TileNode& node = nodes[n];
  if (node.split_count < 0) return uint64_t(node.extent);
  uint64_t r;
  return MulOverflows(PaddedOf(nodes, node.split_count),
                      PaddedOf(nodes, node.split_within), &r)
             ? UINT64_MAX
             : r;
}

// Sizes of `n` that are multiples of this are not padded; 0 if none: a
// split by t pads nothing when the size is a multiple of t, its tile-index
// part is not padded in turn, and its within-tile part is not padded at all.
int64_t GranuleOf(const std::vector<TileNode>& nodes, int n) {
  const TileNode& node = nodes[n];
  if (node.split_count < 0) return 1;
  const int64_t t = nodes[node.split_within].extent;
  if (PaddedOf(nodes, node.split_within) != uint64_t(t)) return 0;
  const int64_t g = GranuleOf(nodes, node.split_count);
  uint64_t r;
  if (g == 0 || MulOverflows(uint64_t(g), uint64_t(t), &r) ||
      r > uint64_t{INT64_MAX}) {
    return 0;
  }
  return int64_t(r);
}

void LogicalDimsUnder(const std::vector<TileNode>& nodes, int n,
                      std::vector<int64_t>* out) {
  const TileNode& node = nodes[n];
  if (node.kind == TileNode::Kind::kLogical) out->push_back(node.logical_dim);
  for (int up : {node.major, node.minor, node.parent}) {
    if (up >= 0) LogicalDimsUnder(nodes, up, out);
  }
}

}  // namespace

PaddingHint ExplainPadding(const ArrayShape& shape) {
  PaddingHint hint;
  absl::StatusOr<xla_shape_internal::TileTree> tree =
      xla_shape_internal::BuildTileTree(shape);
  if (!tree.ok()) {
    hint.text = std::string(tree.status().message());
    return hint;
  }
  const std::vector<TileNode>& nodes = tree->nodes;
  const std::string by =
      absl::StrCat(shape.layout.tiles.size() == 1 ? "the tile " : "the tiles ",
                   TilesToString(shape.layout.tiles));
  std::vector<std::string> parts;
  for (size_t n = 0; n < nodes.size(); ++n) {
    const TileNode& node = nodes[n];
    // The roots: dimensions and merges, not merged any further.
    if (node.combined_into >= 0 || node.kind == TileNode::Kind::kCount ||
        node.kind == TileNode::Kind::kWithin) {
      continue;
    }
    const uint64_t padded = PaddedOf(nodes, int(n));
    if (padded <= uint64_t(node.extent)) continue;
    DimensionPadding d;
    LogicalDimsUnder(nodes, int(n), &d.dims);
    std::sort(d.dims.begin(), d.dims.end());
    d.dims.erase(std::unique(d.dims.begin(), d.dims.end()), d.dims.end());
    d.size = node.extent;
    d.padded_size = int64_t(std::min<uint64_t>(padded, INT64_MAX));
    std::string text;
    if (d.dims.empty()) {
      text = shape.dims.empty()
                 ? absl::StrCat("a scalar fills ", d.padded_size,
                                " elements of ", by)
                 : absl::StrCat("a size-1 dimension that ", by,
                                " adds in front is padded to ", d.padded_size);
    } else {
      d.granule = GranuleOf(nodes, int(n));
      text = absl::StrCat(
          d.dims.size() == 1 ? "dimension " : "dimensions ",
          absl::StrJoin(absl::MakeSpan(d.dims).subspan(0, d.dims.size() - 1),
                        ", "),
          d.dims.size() == 1 ? "" : " and ", d.dims.back(),
          d.dims.size() == 1 ? "" : " merged", " (", d.size, ") is padded to ",
          d.padded_size, " by ", by);
      if (d.granule > 0) {
        d.smaller = d.size > 0 ? (d.size - 1) / d.granule * d.granule : 0;
        d.larger = (d.size / d.granule + 1) * d.granule;
        absl::StrAppend(&text, "; use ",
                        d.smaller > 0
                            ? absl::StrCat(d.smaller, " or ", d.larger)
                            : absl::StrCat(d.larger, ", or reshape"));
      } else {
        absl::StrAppend(&text,
                        "; no size avoids it: reshape or change the layout");
      }
    }
    parts.push_back(std::move(text));
    hint.dims.push_back(std::move(d));
  }
  hint.tail_padding_elements = int64_t(tree->padded_elements - tree->elements);
  if (hint.tail_padding_elements > 0) {
    parts.push_back(absl::StrCat("the tail alignment L(",
                                 shape.layout.tail_padding_alignment, ") adds ",
                                 hint.tail_padding_elements, " elements"));
  }
  hint.text = parts.empty() ? "no padding" : absl::StrJoin(parts, "; ");
  return hint;
}

}  // namespace tpushim
