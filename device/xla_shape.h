// XLA shapes as a TPU lays them out: parsing, printing, device sizes and a
// padding hint.
//
// A shape string is XLA's: `<type>[<dims>]{<minor_to_major>:<suffixes>}`,
// e.g. `s32[29360128,10]{1,0:T(8,128)}`, or a tuple of shapes,
// `(s32[2], (f32[3,4]{0,1}, pred[]))`. Sizes follow XLA's tiled layout:
// the physical dimensions (major to minor, as minor_to_major lists them
// backwards) are tiled by the first tile, the resulting shape by the
// second, and so on. A tile covers the most-minor dimensions of the shape
// it is applied to; each covered dimension of size d and tile size t
// becomes ceil(d/t) tiles of t, which pads d up to a multiple of t; the
// tile-index dimensions stay in order, followed by the within-tile ones. A
// tile with more dimensions than the shape sees size-1 dimensions in front.
// A later tile may cover within-tile dimensions only (`(2,1)` after
// `(8,128)` packs pairs of rows) or reach into the tile-index dimensions
// too (`(2,1,1,1)` after `(8,128)` pairs whole tiles). A `*` in a tile
// merges that dimension into the next more minor one before tiling
// (`T(2,*,128)` on a [2,3,1004] shape tiles [2,3012] by (2,128)).
//
// Layout suffixes understood: `T(...)...` tiles, `E(n)` element size in
// bits, `L(n)` tail padding (the padded element count is rounded up to a
// multiple of n). Every other suffix XLA prints (`D`, `#`, `*`, `S`, `SC`,
// `P`, `M`) is rejected by name: tpushim does not implement its meaning.
//
// Element sizes. Host arrays hold every element in whole bytes:
// ceil(bits/8), so pred and the sub-byte types (s1/u1/s2/u2/s4/u4,
// f4e2m1fn) take one byte with the value in the low bits, as XLA's
// literals and ml_dtypes do. On the device an element takes E(n) bits when
// the layout says so, else the same whole bytes. E(n) must be the type's
// own bit width (packing: 8/n elements per byte, the first element in the
// most significant bits, as XLA's PackIntN does), or a whole number of
// bytes no smaller than the host element (`pred[]{:T(256)E(32)}` stores a
// pred in 4 bytes, the value in the lowest-addressed one, the rest zero).
//
// A shape written without a layout gets the layout a TPU gives it by
// default (DefaultLayout below); the parsed Shape always carries the
// layout used, and ToString prints it, so every size shown can be printed
// with its layout.
//
// Tuples: a tuple's size is the sum of its elements' sizes, each element
// being its own device buffer; the index table XLA keeps on the device for
// a tuple is not counted.
//
// Thread-safety: pure functions and plain value types; thread-compatible.
//
//   TPUSHIM_ASSIGN_OR_RETURN(Shape shape, ParseShape("s32[29360128,10]"));
//   TPUSHIM_ASSIGN_OR_RETURN(ShapeSizes sizes, ComputeSizes(shape));
//   // sizes.padded_bytes == 15032385536, sizes.unpadded_bytes == 1174405120
//   ToString(shape) == "s32[29360128,10]{1,0:T(8,128)}"
//   ExplainPadding(shape.array).text ==
//       "dimension 1 (10) is padded to 128 by the tile T(8,128); use 128, "
//       "or reshape"

#ifndef TPUSHIM_DEVICE_XLA_SHAPE_H_
#define TPUSHIM_DEVICE_XLA_SHAPE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace tpushim {

// XLA's array element types, named as XLA prints them.
enum class ElementType : uint8_t {
  kPred,
  kS1,
  kS2,
  kS4,
  kS8,
  kS16,
  kS32,
  kS64,
  kU1,
  kU2,
  kU4,
  kU8,
  kU16,
  kU32,
  kU64,
  kF16,
  kBF16,
  kF32,
  kF64,
  kF8E5M2,
  kF8E4M3,
  kF8E4M3FN,
  kF8E4M3B11FNUZ,
  kF8E3M4,
  kF8E5M2FNUZ,
  kF8E4M3FNUZ,
  kF8E8M0FNU,
  kF4E2M1FN,
  kC64,
  kC128,
};

// "f32", "bf16", "f8e4m3fn", ...
absl::string_view ElementTypeName(ElementType type);
// The type named `name` (exactly as XLA prints it), or nullopt.
std::optional<ElementType> ElementTypeFromName(absl::string_view name);
// XLA's bit width: 1 for pred and s1/u1, 4 for s4, 64 for c64, 128 for c128.
int ElementBitWidth(ElementType type);
// Bytes per element in a host (dense) array: ceil(bit width / 8).
int ElementHostBytes(ElementType type);

// One tile: sizes from its most major dimension to its most minor.
struct Tile {
  // A dimension written `*`: merged into the next more minor dimension.
  static constexpr int64_t kCombine = -1;
  std::vector<int64_t> dims;

  friend bool operator==(const Tile&, const Tile&) = default;
};

struct Layout {
  // Dimension numbers from the most minor to the most major.
  std::vector<int64_t> minor_to_major;
  // Applied in order: tiles[1] tiles the shape tiles[0] produced.
  std::vector<Tile> tiles;
  // E(n); 0 when the layout does not say (the host element size).
  int64_t element_size_in_bits = 0;
  // L(n); 1 when the layout does not say.
  int64_t tail_padding_alignment = 1;

  friend bool operator==(const Layout&, const Layout&) = default;
};

struct ArrayShape {
  ElementType type = ElementType::kF32;
  std::vector<int64_t> dims;  // as written, dimension 0 first
  Layout layout;              // the layout used (given or default)
  bool layout_given = false;  // false: `layout` is DefaultLayout's

  friend bool operator==(const ArrayShape&, const ArrayShape&) = default;
};

struct Shape {
  bool is_tuple = false;
  ArrayShape array;          // when !is_tuple
  std::vector<Shape> tuple;  // when is_tuple (may be empty: `()`)

  friend bool operator==(const Shape&, const Shape&) = default;
};

// Limits of what ParseShape accepts.
inline constexpr int kMaxShapeRank = 32;   // dimensions of one array
inline constexpr int kMaxTiles = 4;        // tiles in one layout
inline constexpr int kMaxTileRank = 32;    // dimensions of one tile
inline constexpr int kMaxTupleDepth = 32;  // nesting of tuples

// Parses a shape string. Whitespace is allowed between tokens. On success
// every array carries its layout (DefaultLayout's when none was written)
// and its sizes are known to fit in 64 bits. On failure returns
// INVALID_ARGUMENT "<text>: <what is wrong> at column <n>" (1-based; the
// column after the last character for a premature end), or naming the
// array whose size does not fit in 64 bits.
absl::StatusOr<Shape> ParseShape(absl::string_view text);
// As ParseShape, and fails with INVALID_ARGUMENT on a tuple.
absl::StatusOr<ArrayShape> ParseArrayShape(absl::string_view text);

// The layout a TPU gives an array of this type and these dimensions when
// none is written: row-major minor_to_major {n-1,...,0} and these tiles,
// s being the size of the second most minor dimension:
//
// clang-format off
//   bits         rank 0       rank 1                  rank >= 2
//   32, 64, c64, T(256)       T(256)                  T(8,128); T(4,128) if
//   c128                                              s is 3 or 4; T(2,128)
//                                                     if s <= 2
//   16           T(256)       T(256)(128)(2,1)        T(8,128)(2,1); with
//                                                     (4,128), (2,128) as
//                                                     for 32 bits
//   8, pred      T(512)       T(512)(128)(4,1)        T(8,128)(4,1);
//                                                     T(4,128)(4,1) if s <= 4
//   4            T(1024)E(4)  T(1024)(128)(8,1)E(4)   T(8,128)(8,1)E(4)
//   2            T(2048)E(2)  T(2048)(128)(16,1)E(2)  T(16,128)(16,1)E(2)
//   1 (s1, u1)   T(4096)E(1)  T(4096)(128)(32,1)E(1)  T(32,128)(32,1)E(1)
// clang-format on
//
// The 32-, 16- and 8-bit entries and the 4-bit one for rank >= 2 follow
// TPU memory reports and HLO dumps; the other sub-byte ones extend the same
// packing rule (a 32-bit word holds 32/bits rows of a column).
Layout DefaultLayout(ElementType type, absl::Span<const int64_t> dims);

// Checks a shape built in code as ParseShape checks a parsed one:
// minor_to_major a permutation, tiles and E/L valid, limits, sizes fit.
// OK or INVALID_ARGUMENT naming the shape and what is wrong.
absl::Status ValidateShape(const Shape& shape);

// Canonical strings, always with the layout: `s32[29360128,10]{1,0:T(8,128)}`,
// `f32[]{}` (an untiled scalar), `(s32[2]{0:T(256)}, f32[3]{0})`.
// ParseShape(ToString(s)) == s, except that layout_given becomes true.
std::string ToString(const ArrayShape& shape);
std::string ToString(const Shape& shape);
// `{1,0:T(8,128)(2,1)}`; `T(8,128)(2,1)` for TilesToString.
std::string LayoutToString(const Layout& layout);
std::string TilesToString(absl::Span<const Tile> tiles);

struct ShapeSizes {
  // What the device allocates: the tiled shape's element count (rounded up
  // to the tail alignment) times the device element size, in whole bytes.
  uint64_t padded_bytes = 0;
  // The data: product of the dimensions times the device element size.
  uint64_t unpadded_bytes = 0;
};
// Sizes of an array, or the sums over a tuple's elements. INVALID_ARGUMENT
// naming the shape when a size does not fit in 64 bits (ValidateShape's
// errors for a shape that is not valid).
absl::StatusOr<ShapeSizes> ComputeSizes(const Shape& shape);
absl::StatusOr<ShapeSizes> ComputeSizes(const ArrayShape& shape);

// Bytes of the array as the host holds it: product of dims times
// ElementHostBytes. REQUIRES: a valid shape (its sizes fit).
uint64_t HostBytes(const ArrayShape& shape);
// Bits of one element on the device: E(n) when the layout gives it, else
// 8 * ElementHostBytes (1, 2 or 4 for packed sub-byte elements).
int DeviceElementBits(const ArrayShape& shape);

// Where an array's padding comes from.
struct DimensionPadding {
  // The dimensions (as written) whose size is padded: one, or several that
  // the layout merges with `*`; empty for the size-1 dimensions a tile
  // adds in front of a lower-rank shape (a scalar filling a tile).
  std::vector<int64_t> dims;
  int64_t size = 0;         // their size (the product when merged)
  int64_t padded_size = 0;  // what the layout turns it into
  // Sizes that are multiples of `granule` are not padded; 0 when no size
  // avoids the padding (a sub-tile that does not divide its tile).
  int64_t granule = 0;
  int64_t smaller = 0;  // largest positive multiple of granule < size, or 0
  int64_t larger = 0;   // smallest multiple of granule > size, or 0
};
struct PaddingHint {
  std::vector<DimensionPadding> dims;  // empty: no dimension is padded
  int64_t tail_padding_elements = 0;   // added by L(n)
  // One line, e.g. "dimension 1 (10) is padded to 128 by the tile
  // T(8,128); use 128, or reshape"; "no padding" when there is none.
  std::string text;
};
// REQUIRES: a valid shape.
PaddingHint ExplainPadding(const ArrayShape& shape);

namespace xla_shape_internal {

// The dimensions of an array while its layout is applied, as a tree: the
// physical dimensions, the size-1 dimensions tiles add in front, the
// merges `*` makes, and the (tile index, within tile) pair each tiling
// splits a dimension into. For the size computation and the relayout
// kernels (transfer/relayout.h); not a stable API.
struct TileNode {
  enum class Kind : uint8_t { kLogical, kMissing, kCombined, kCount, kWithin };
  Kind kind = Kind::kLogical;
  int64_t extent = 0;
  int64_t logical_dim = -1;  // kLogical: the dimension as written
  int major = -1;            // kCombined: the node merged into `minor`
  int minor = -1;
  int parent = -1;   // kCount / kWithin: the node split
  int64_t tile = 0;  // kCount / kWithin: the tile size
  // Filled on the node itself once something consumes it:
  int split_count = -1;    // the kCount child
  int split_within = -1;   // the kWithin child
  int combined_into = -1;  // the kCombined node it became part of
};
struct TileTree {
  std::vector<TileNode> nodes;   // parents before children
  std::vector<int> final_dims;   // the tiled shape, major to minor
  uint64_t elements = 0;         // product of final extents
  uint64_t padded_elements = 0;  // rounded up to the tail alignment
};
// INVALID_ARGUMENT (naming the shape) when an extent or the element count
// overflows 64 bits. REQUIRES: the layout passes ValidateShape's checks.
absl::StatusOr<TileTree> BuildTileTree(const ArrayShape& shape);

// The checks the parser and the size computation share; each returns ""
// when all is well, else what is wrong. `*bad` (when given) receives the
// index of the offending minor_to_major entry.
std::string CheckElementSize(ElementType type, int64_t n);
std::string CheckTile(const Tile& tile);
std::string CheckMinorToMajor(absl::Span<const int64_t> m2m, size_t rank,
                              size_t* bad = nullptr);
std::string CheckArray(const ArrayShape& a);

}  // namespace xla_shape_internal
}  // namespace tpushim

#endif  // TPUSHIM_DEVICE_XLA_SHAPE_H_
