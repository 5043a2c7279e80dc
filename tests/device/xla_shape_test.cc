// XLA shape strings: parsing every type and layout form, the errors with
// their columns, sizes checked against hand-computed values (several taken
// from TPU memory reports), the TPU default layouts and the padding hint.

#include "device/xla_shape.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpushim {
namespace {

using ::testing::HasSubstr;

ShapeSizes SizesOf(const std::string& text) {
  absl::StatusOr<Shape> shape = ParseShape(text);
  EXPECT_TRUE(shape.ok()) << text << ": " << shape.status();
  if (!shape.ok()) return {};
  absl::StatusOr<ShapeSizes> sizes = ComputeSizes(*shape);
  EXPECT_TRUE(sizes.ok()) << sizes.status();
  return sizes.ok() ? *sizes : ShapeSizes{};
}

std::string Repeat(const std::string& s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

std::string Canonical(const std::string& text) {
  absl::StatusOr<Shape> shape = ParseShape(text);
  return shape.ok() ? ToString(*shape) : shape.status().ToString();
}

TEST(XlaShapeTest, ParsesEveryElementType) {
  const std::vector<std::pair<std::string, int>> types = {
      {"pred", 1},
      {"s1", 1},
      {"s2", 2},
      {"s4", 4},
      {"s8", 8},
      {"s16", 16},
      {"s32", 32},
      {"s64", 64},
      {"u1", 1},
      {"u2", 2},
      {"u4", 4},
      {"u8", 8},
      {"u16", 16},
      {"u32", 32},
      {"u64", 64},
      {"f16", 16},
      {"bf16", 16},
      {"f32", 32},
      {"f64", 64},
      {"f8e5m2", 8},
      {"f8e4m3", 8},
      {"f8e4m3fn", 8},
      {"f8e4m3b11fnuz", 8},
      {"f8e3m4", 8},
      {"f8e5m2fnuz", 8},
      {"f8e4m3fnuz", 8},
      {"f8e8m0fnu", 8},
      {"f4e2m1fn", 4},
      {"c64", 64},
      {"c128", 128},
  };
  for (const auto& [name, bits] : types) {
    absl::StatusOr<ArrayShape> a = ParseArrayShape(name + "[2,3]{1,0}");
    ASSERT_TRUE(a.ok()) << name << ": " << a.status();
    EXPECT_EQ(ElementTypeName(a->type), name);
    EXPECT_EQ(ElementBitWidth(a->type), bits) << name;
    EXPECT_EQ(ElementHostBytes(a->type), (bits + 7) / 8) << name;
    EXPECT_EQ(ToString(*a), name + "[2,3]{1,0}");
    // Untiled: 6 elements of whole bytes.
    EXPECT_EQ(SizesOf(name + "[2,3]{1,0}").padded_bytes,
              uint64_t(6 * ((bits + 7) / 8)));
  }
  EXPECT_FALSE(ElementTypeFromName("F32").has_value());
}

TEST(XlaShapeTest, OneHotReportFromTpuV3) {
  // The published TPU v3 out-of-memory report: 14.00G for 1.09G of data.
  absl::StatusOr<Shape> shape = ParseShape("s32[29360128,10]");
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(ToString(*shape), "s32[29360128,10]{1,0:T(8,128)}");
  EXPECT_FALSE(shape->array.layout_given);
  absl::StatusOr<ShapeSizes> sizes = ComputeSizes(*shape);
  ASSERT_TRUE(sizes.ok());
  EXPECT_EQ(sizes->padded_bytes, 15032385536u);
  EXPECT_EQ(sizes->unpadded_bytes, 1174405120u);
  EXPECT_EQ(SizesOf("s32[29360128,10]{1,0:T(8,128)}").padded_bytes,
            15032385536u);
}

TEST(XlaShapeTest, SizesOfEveryRankAgainstHandValues) {
  struct Case {
    const char* text;
    uint64_t padded, unpadded;
  };
  const Case cases[] = {
      // Rank 0: a scalar fills its tile; untiled it is one element.
      {"f32[]", 1024, 4},
      {"f32[]{}", 4, 4},
      {"pred[]{:T(256)E(32)}", 1024, 4},
      // Rank 1: f32[18]{0:T(256)} from a TPU report; bf16 vectors.
      {"f32[18]", 1024, 72},
      {"bf16[300]", 1024, 600},
      {"f32[5]{0:T(8,128)}", 4096, 20},  // the tile adds a row of 1 -> 8
      {"f32[10]{0:L(16)}", 64, 40},
      // Rank 2.
      {"f32[100,10]{1,0:T(8,128)}", 104 * 128 * 4, 4000},
      {"f32[10,100]{0,1:T(8,128)}", 104 * 128 * 4, 4000},
      {"f32[3,5]{1,0:T(2,2)}", 24 * 4, 60},  // the tiled-layout figure
      {"c128[2,2]", 2 * 128 * 16, 64},
      {"s4[10,10]", 16 * 128 / 2, 50},
      {"s4[10,10]{1,0:T(8,128)}", 16 * 128, 100},  // no E: a byte each
      // Rank 3: s32[8388608,8,4] from a TPU report (32.00G for 1.00G), and
      // its transposed copy; f32[29184,1,2560]{2,1,0:T(2,128)} (570M for
      // 285M) from another.
      {"s32[8388608,8,4]{2,1,0:T(8,128)}", 34359738368u, 1073741824u},
      {"s32[8388608,8,4]{0,2,1:T(4,128)}", 1073741824u, 1073741824u},
      {"f32[29184,1,2560]{2,1,0:T(2,128)}", 597688320u, 298844160u},
      {"bf16[2,3,1004]{2,1,0:T(2,*,128)}", 2 * 3072 * 2, 12048},
      // Rank 4: bf16[4,512,512,64]{3,0,2,1:T(4,128)(2,1)} (256M for 128M).
      {"bf16[4,512,512,64]{3,0,2,1:T(4,128)(2,1)}", 268435456u, 134217728u},
      {"bf16[24,256]{1,0:T(8,128)(2,1,1,1)}", 32 * 256 * 2, 24 * 256 * 2},
      {"bf16[32,256]{1,0:T(8,128)(2,1,1,1)}", 32 * 256 * 2, 32 * 256 * 2},
      // Rank 5: f32[4,128,128,9,18]{4,3,0,2,1:T(8,128)} (512M for 40.5M),
      // and the tiled-layout document's merged example.
      {"f32[4,128,128,9,18]{4,3,0,2,1:T(8,128)}", 536870912u, 42467328u},
      {"f32[2,7,8,11,10]{4,3,2,1,0:T(*,*,2,*,3)}", 56 * 37 * 6 * 4, 49280},
      // Zero-size arrays allocate nothing.
      {"f32[0,7]", 0, 0},
      // A sub-tile that does not divide its tile pads inside every tile.
      {"f32[8,128]{1,0:T(8,128)(3,1)}", 9 * 128 * 4, 8 * 128 * 4},
  };
  for (const Case& c : cases) {
    ShapeSizes s = SizesOf(c.text);
    EXPECT_EQ(s.padded_bytes, c.padded) << c.text;
    EXPECT_EQ(s.unpadded_bytes, c.unpadded) << c.text;
  }
}

TEST(XlaShapeTest, DefaultLayoutsFollowTheTpuTable) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"f32[]", "f32[]{:T(256)}"},
      {"bf16[]", "bf16[]{:T(256)}"},
      {"pred[]", "pred[]{:T(512)}"},
      {"s4[]", "s4[]{:T(1024)E(4)}"},
      {"f32[18]", "f32[18]{0:T(256)}"},
      {"bf16[128]", "bf16[128]{0:T(256)(128)(2,1)}"},
      {"s8[7]", "s8[7]{0:T(512)(128)(4,1)}"},
      {"u4[7]", "u4[7]{0:T(1024)(128)(8,1)E(4)}"},
      {"s2[7]", "s2[7]{0:T(2048)(128)(16,1)E(2)}"},
      {"u1[7]", "u1[7]{0:T(4096)(128)(32,1)E(1)}"},
      {"f32[9,300]", "f32[9,300]{1,0:T(8,128)}"},
      {"f32[4,300]", "f32[4,300]{1,0:T(4,128)}"},
      {"f32[29184,1,2560]", "f32[29184,1,2560]{2,1,0:T(2,128)}"},
      {"s64[8,8]", "s64[8,8]{1,0:T(8,128)}"},
      {"c64[3,3]", "c64[3,3]{1,0:T(4,128)}"},
      {"bf16[32,6144]", "bf16[32,6144]{1,0:T(8,128)(2,1)}"},
      {"bf16[8,4,300]", "bf16[8,4,300]{2,1,0:T(4,128)(2,1)}"},
      {"bf16[1,6144]", "bf16[1,6144]{1,0:T(2,128)(2,1)}"},
      {"pred[32,6144]", "pred[32,6144]{1,0:T(8,128)(4,1)}"},
      {"pred[1,1]", "pred[1,1]{1,0:T(4,128)(4,1)}"},
      {"f8e4m3fn[2,256]", "f8e4m3fn[2,256]{1,0:T(4,128)(4,1)}"},
      {"s4[2,256]", "s4[2,256]{1,0:T(8,128)(8,1)E(4)}"},
      {"u2[64,64]", "u2[64,64]{1,0:T(16,128)(16,1)E(2)}"},
      {"s1[64,64]", "s1[64,64]{1,0:T(32,128)(32,1)E(1)}"},
  };
  for (const auto& [in, out] : cases) EXPECT_EQ(Canonical(in), out) << in;
}

TEST(XlaShapeTest, ParsesLayoutForms) {
  EXPECT_EQ(Canonical("f32[3,5]{0,1}"), "f32[3,5]{0,1}");
  EXPECT_EQ(Canonical("f32[3,5]{1,0:T(2,2)}"), "f32[3,5]{1,0:T(2,2)}");
  EXPECT_EQ(Canonical(" f32 [ 3 , 5 ] { 1 , 0 : T ( 8 , 128 ) ( 2 , 1 ) } "),
            "f32[3,5]{1,0:T(8,128)(2,1)}");
  EXPECT_EQ(Canonical("bf16[2,3,1004]{2,1,0:T(2,*,128)}"),
            "bf16[2,3,1004]{2,1,0:T(2,*,128)}");
  EXPECT_EQ(Canonical("s4[8,256]{1,0:E(4)T(8,128)(8,1)}"),
            "s4[8,256]{1,0:T(8,128)(8,1)E(4)}");
  EXPECT_EQ(Canonical("f32[10]{0:L(16)T(8)}"), "f32[10]{0:T(8)L(16)}");
  EXPECT_EQ(Canonical("f32[]{:T()}"), "f32[]{:T()}");
  EXPECT_EQ(Canonical("f32[1,2]{1,0:T(1,1,1,1)(2)(3)(4)}"),
            "f32[1,2]{1,0:T(1,1,1,1)(2)(3)(4)}");
  absl::StatusOr<ArrayShape> a = ParseArrayShape("f32[2,3]{0,1:T(8,128)(2,1)}");
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(a->layout_given);
  EXPECT_EQ(a->dims, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a->layout.minor_to_major, (std::vector<int64_t>{0, 1}));
  ASSERT_EQ(a->layout.tiles.size(), 2u);
  EXPECT_EQ(a->layout.tiles[1].dims, (std::vector<int64_t>{2, 1}));
}

TEST(XlaShapeTest, ParsesTuplesNestedAndEmpty) {
  absl::StatusOr<Shape> t = ParseShape("(s32[2], f32[3,4]{0,1})");
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE(t->is_tuple);
  ASSERT_EQ(t->tuple.size(), 2u);
  EXPECT_EQ(ToString(*t), "(s32[2]{0:T(256)}, f32[3,4]{0,1})");
  absl::StatusOr<ShapeSizes> s = ComputeSizes(*t);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->padded_bytes, 1024u + 48u);
  EXPECT_EQ(s->unpadded_bytes, 8u + 48u);

  EXPECT_EQ(Canonical("((pred[]{}), (), bf16[2]{0})"),
            "((pred[]{}), (), bf16[2]{0})");
  EXPECT_EQ(SizesOf("()").padded_bytes, 0u);
  absl::StatusOr<ArrayShape> not_array = ParseArrayShape("(f32[2])");
  EXPECT_EQ(not_array.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(not_array.status().message(), HasSubstr("not a tuple"));
}

TEST(XlaShapeTest, PrintedShapesParseBackToThemselves) {
  for (const char* text :
       {"s32[29360128,10]", "bf16[3]", "pred[]", "(f32[2], (s4[9,9], u8[]))",
        "f32[2,7,8,11,10]{4,3,2,1,0:T(*,*,2,*,3)}", "f32[]{}",
        "pred[4]{0:T(256)E(32)}", "f32[9]{0:L(4)}"}) {
    absl::StatusOr<Shape> a = ParseShape(text);
    ASSERT_TRUE(a.ok()) << text;
    absl::StatusOr<Shape> b = ParseShape(ToString(*a));
    ASSERT_TRUE(b.ok()) << ToString(*a);
    EXPECT_EQ(ToString(*b), ToString(*a));
    EXPECT_EQ(ComputeSizes(*b)->padded_bytes, ComputeSizes(*a)->padded_bytes);
  }
}

TEST(XlaShapeTest, EveryMalformedFormNamesItsColumn) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"f32[128,256", "f32[128,256: expected ',' or ']' at column 12"},
      {"f33[2]", "unknown element type 'f33' at column 1; did you mean f32?"},
      {"F32[2]",
       "unknown element type 'F32' at column 1; did you mean f32? (element "
       "types are lower case)"},
      {"BF16[2]", "did you mean bf16? (element types are lower case)"},
      {"  f33[2]", "unknown element type 'f33' at column 3"},
      {"token[]", "element type 'token' holds no array data at column 1"},
      {"f32", "expected '[' after the element type at column 4"},
      {"f32[-1]", "negative dimension size at column 5"},
      {"f32[a]", "expected dimension size at column 5"},
      {"f32[2,]", "expected dimension size at column 7"},
      {"f32[<=4]", "dynamic dimensions are not supported at column 5"},
      {"f32[?]", "dynamic dimensions are not supported at column 5"},
      {"f32[99999999999999999999]",
       "dimension size 99999999999999999999 does not fit in 64 bits at column "
       "5"},
      {"f32[2,3]{0}",
       "minor_to_major has 1 entries for a rank-2 shape at column 11"},
      {"f32[2,3]{0,2}",
       "minor_to_major entry 2 is not a dimension of a rank-2 shape at column "
       "12"},
      {"f32[2,3]{0,0}",
       "dimension 0 appears twice in minor_to_major at column 12"},
      {"f32[2,3]{1,-0}", "negative dimension number at column 12"},
      {"f32[2]{0", "expected ',', ':' or '}' at column 9"},
      {"f32[2]{0:T(2)", "unclosed '{' (opened at column 7) at column 14"},
      {"f32[2]{0:T(2)T(2)}", "T(...) given twice at column 14"},
      {"f32[2,3]{1,0:T(0,128)}",
       "tile dimension 0 must be positive at column 16"},
      {"f32[2,3]{1,0:T(8,*)}", "'*' cannot be a tile's last dimension"},
      {"f32[2,3]{1,0:T(8,-1)}", "negative tile dimension at column 18"},
      {"f32[2,3]{1,0:T(8 128)}", "expected ',' or ')' in a tile at column 18"},
      {"f32[2,3]{1,0:T}", "expected '(' after 'T' at column 15"},
      {"f32[2,3]{1,0:T(1)(1)(1)(1)(1)}", "more than 4 tiles at column 27"},
      {"s4[2]{0:E(3)}",
       "element size E(3) does not suit s4: use 4 (packed) or a "
       "power-of-two number of bytes of at least 1 at column 11"},
      {"f32[2]{0:E(16)}", "element size E(16) does not suit f32"},
      {"f32[2]{0:L(0)}", "tail alignment L(0) must be positive at column 12"},
      {"f32[2]{0:X(1)}", "unknown layout suffix 'X' at column 10"},
      {"f32[2]{0:S(1)}", "memory space S(...) is not supported"},
      {"f32[2]{0:D(D)}", "sparse dimension types D(...) are not supported"},
      {"f32[2]{0:#(u32)}", "sparse index type #(...) is not supported"},
      {"f32[2]{0:*(u32)}", "sparse pointer type *(...) is not supported"},
      {"f32[2]{0:SC(0:1)}", "split configurations SC(...) are not supported"},
      {"f32[2]{0:P(f32[2])}", "physical shape P(...) is not supported"},
      {"f32[2]{0:M(8)}", "dynamic shape metadata M(...) is not supported"},
      {"f32[2]x", "unexpected 'x' after the shape at column 7"},
      {"f32[2])", "unexpected ')' after the shape at column 7"},
      {")", "unbalanced ')' at column 1"},
      {"(f32[2], s32[3]", "expected ',' or ')' at column 16"},
      {"(f32[2],)", "expected an element type or '(' at column 9"},
      {"[2]", "expected an element type or '(' at column 1"},
      {std::string(33, '(') + "f32[]" + std::string(33, ')'),
       "tuples nested deeper than 32 at column 33"},
      {"f32[" + Repeat("1,", 32) + "1]", "more than 32 dimensions"},
      {"s32[9223372036854775807,2]",
       "shape s32[9223372036854775807,2]{1,0:T(8,128)}: its size does not fit "
       "in 64 bits"},
  };
  for (const auto& [text, message] : cases) {
    absl::StatusOr<Shape> s = ParseShape(text);
    ASSERT_FALSE(s.ok()) << text;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(std::string(s.status().message()), HasSubstr(message)) << text;
  }
  absl::StatusOr<Shape> empty = ParseShape("  ");
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(empty.status().message(), "empty shape string");
}

TEST(XlaShapeTest, ValidateShapeChecksShapesBuiltInCode) {
  Shape s;
  s.array.type = ElementType::kF32;
  s.array.dims = {2, 3};
  s.array.layout.minor_to_major = {0, 0};
  absl::Status v = ValidateShape(s);
  EXPECT_EQ(v.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(v.message(),
              HasSubstr("shape f32[2,3]{0,0}: dimension 0 appears twice"));
  s.array.layout.minor_to_major = {1, 0};
  s.array.layout.tiles = {Tile{{8, Tile::kCombine}}};
  EXPECT_THAT(ValidateShape(s).message(), HasSubstr("tile's last dimension"));
  s.array.layout.tiles = {Tile{{8, 128}}};
  s.array.layout.tail_padding_alignment = 0;
  EXPECT_THAT(ValidateShape(s).message(), HasSubstr("L(0)"));
  s.array.layout.tail_padding_alignment = 1;
  EXPECT_TRUE(ValidateShape(s).ok());
  s.array.dims = {-2, 3};
  EXPECT_THAT(ValidateShape(s).message(), HasSubstr("negative"));
}

TEST(XlaShapeTest, PaddingHintNamesTheDimensionAndTheSizesThatAvoidIt) {
  PaddingHint h = ExplainPadding(*ParseArrayShape("s32[29360128,10]"));
  ASSERT_EQ(h.dims.size(), 1u);
  EXPECT_EQ(h.dims[0].dims, (std::vector<int64_t>{1}));
  EXPECT_EQ(h.dims[0].size, 10);
  EXPECT_EQ(h.dims[0].padded_size, 128);
  EXPECT_EQ(h.dims[0].granule, 128);
  EXPECT_EQ(h.dims[0].smaller, 0);
  EXPECT_EQ(h.dims[0].larger, 128);
  EXPECT_EQ(h.text,
            "dimension 1 (10) is padded to 128 by the tile T(8,128); use 128, "
            "or reshape");

  h = ExplainPadding(*ParseArrayShape("f32[100,130]{1,0:T(8,128)}"));
  EXPECT_EQ(h.text,
            "dimension 0 (100) is padded to 104 by the tile T(8,128); use 96 "
            "or 104; dimension 1 (130) is padded to 256 by the tile T(8,128); "
            "use 128 or 256");

  // The first tile's rows in pairs of tiles: dimension 0 by 16.
  h = ExplainPadding(*ParseArrayShape("bf16[24,256]{1,0:T(8,128)(2,1,1,1)}"));
  ASSERT_EQ(h.dims.size(), 1u);
  EXPECT_EQ(h.dims[0].granule, 16);
  EXPECT_EQ(h.dims[0].padded_size, 32);

  h = ExplainPadding(*ParseArrayShape("bf16[2,3,1004]{2,1,0:T(2,*,128)}"));
  ASSERT_EQ(h.dims.size(), 1u);
  EXPECT_EQ(h.dims[0].dims, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(h.text,
            "dimensions 1 and 2 merged (3012) is padded to 3072 by the tile "
            "T(2,*,128); use 2944 or 3072");

  h = ExplainPadding(*ParseArrayShape("f32[8,128]{1,0:T(8,128)(3,1)}"));
  ASSERT_EQ(h.dims.size(), 1u);
  EXPECT_EQ(h.dims[0].granule, 0);
  EXPECT_THAT(h.text, HasSubstr("no size avoids it"));

  h = ExplainPadding(*ParseArrayShape("f32[]"));
  EXPECT_EQ(h.text, "a scalar fills 256 elements of the tile T(256)");

  h = ExplainPadding(*ParseArrayShape("f32[10]{0:L(16)}"));
  EXPECT_EQ(h.tail_padding_elements, 6);
  EXPECT_EQ(h.text, "the tail alignment L(16) adds 6 elements");

  EXPECT_EQ(ExplainPadding(*ParseArrayShape("f32[8,256]")).text, "no padding");
}

}  // namespace
}  // namespace tpushim
