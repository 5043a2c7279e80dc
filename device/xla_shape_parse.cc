#include "device/xla_shape.h"

#include <algorithm>
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
#include "common/closest_match.h"
#include "common/status_macros.h"

// The parser of XLA shape strings and the checks it shares with the size
// computation (device/xla_shape.cc).

namespace tpushim {
namespace xla_shape_internal {

// The checks shared by the parser (which adds a column) and ValidateShape
// (which names the shape). Each returns "" when all is well.
std::string CheckElementSize(ElementType type, int64_t n) {
  const int bits = ElementBitWidth(type);
  const int host_bits = 8 * ElementHostBytes(type);
  if (n == bits) return "";
  if (n >= host_bits && n <= 128 && n % 8 == 0 && (n & (n - 1)) == 0) {
    return "";
  }
  return absl::StrCat(
      "element size E(", n, ") does not suit ", ElementTypeName(type), ": use ",
      bits, bits < 8 ? " (packed) or " : " or ",
      "a power-of-two number of bytes of at least ", host_bits / 8);
}

std::string CheckTile(const Tile& tile) {
  if (tile.dims.size() > size_t(kMaxTileRank)) {
    return absl::StrCat("a tile has more than ", kMaxTileRank, " dimensions");
  }
  for (size_t i = 0; i < tile.dims.size(); ++i) {
    const int64_t t = tile.dims[i];
    if (t == Tile::kCombine) {
      if (i + 1 == tile.dims.size()) {
        return "'*' cannot be a tile's last dimension: nothing more minor to "
               "merge it into";
      }
    } else if (t <= 0) {
      return absl::StrCat("tile dimension ", t, " must be positive");
    }
  }
  return "";
}

std::string CheckMinorToMajor(absl::Span<const int64_t> m2m, size_t rank,
                              size_t* bad) {
  std::vector<bool> seen(rank, false);
  for (size_t i = 0; i < m2m.size(); ++i) {
    const int64_t d = m2m[i];
    if (bad != nullptr) *bad = i;
    if (d < 0 || size_t(d) >= rank) {
      return absl::StrCat("minor_to_major entry ", d,
                          " is not a dimension of a rank-", rank, " shape");
    }
    if (seen[d]) {
      return absl::StrCat("dimension ", d, " appears twice in minor_to_major");
    }
    seen[d] = true;
  }
  if (bad != nullptr) *bad = m2m.size();
  if (m2m.size() != rank) {
    return absl::StrCat("minor_to_major has ", m2m.size(),
                        " entries for a rank-", rank, " shape");
  }
  return "";
}

std::string CheckArray(const ArrayShape& a) {
  if (a.dims.size() > size_t(kMaxShapeRank)) {
    return absl::StrCat("rank ", a.dims.size(), " is above the limit of ",
                        kMaxShapeRank);
  }
  for (int64_t d : a.dims) {
    if (d < 0) return absl::StrCat("dimension size ", d, " is negative");
  }
  std::string e = CheckMinorToMajor(a.layout.minor_to_major, a.dims.size());
  if (!e.empty()) return e;
  if (a.layout.tiles.size() > size_t(kMaxTiles)) {
    return absl::StrCat("more than ", kMaxTiles, " tiles");
  }
  for (const Tile& t : a.layout.tiles) {
    e = CheckTile(t);
    if (!e.empty()) return e;
  }
  if (a.layout.element_size_in_bits != 0) {
    e = CheckElementSize(a.type, a.layout.element_size_in_bits);
    if (!e.empty()) return e;
  }
  if (a.layout.tail_padding_alignment <= 0) {
    return absl::StrCat("tail padding alignment L(",
                        a.layout.tail_padding_alignment, ") must be positive");
  }
  return "";
}

}  // namespace xla_shape_internal

namespace {

// "; did you mean f32?" for a mistyped element type, with a word on case
// when case is all that is wrong ("F32"); "" when nothing is close.
std::string ElementTypeHint(absl::string_view name) {
  std::vector<std::string> names;
  for (int t = 0; t <= static_cast<int>(ElementType::kC128); ++t) {
    names.emplace_back(ElementTypeName(static_cast<ElementType>(t)));
  }
  const std::vector<std::string> close = ClosestMatches(name, names);
  if (close.empty()) return "";
  std::string hint =
      absl::StrCat("; did you mean ", absl::StrJoin(close, " or "), "?");
  if (close.size() == 1 && absl::EqualsIgnoreCase(close[0], name)) {
    absl::StrAppend(&hint, " (element types are lower case)");
  }
  return hint;
}

using xla_shape_internal::CheckElementSize;
using xla_shape_internal::CheckMinorToMajor;
using xla_shape_internal::CheckTile;

// --- The parser ------------------------------------------------------------

class Parser {
 public:
  explicit Parser(absl::string_view text) : text_(text) {}

  absl::StatusOr<Shape> Parse() {
    SkipSpace();
    if (AtEnd()) return absl::InvalidArgumentError("empty shape string");
    TPUSHIM_ASSIGN_OR_RETURN(Shape shape, ParseShapeAt(0));
    SkipSpace();
    if (!AtEnd()) {
      return Error(absl::StrCat("unexpected '", text_.substr(pos_, 1),
                                "' after the shape"));
    }
    return shape;
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return ErrorAt(what, pos_);
  }
  absl::Status ErrorAt(absl::string_view what, size_t pos) const {
    return absl::InvalidArgumentError(
        absl::StrCat(text_, ": ", what, " at column ", pos + 1));
  }
  bool AtEnd() const { return pos_ >= text_.size(); }
  char Peek() const { return AtEnd() ? '\0' : text_[pos_]; }
  bool IsDigit() const {
    return absl::ascii_isdigit(static_cast<unsigned char>(Peek()));
  }
  void SkipSpace() {
    while (absl::ascii_isspace(static_cast<unsigned char>(Peek()))) ++pos_;
  }
  // Skips spaces and consumes `c` if it is next.
  bool Take(char c) {
    SkipSpace();
    if (Peek() != c) return false;
    ++pos_;
    return true;
  }
  absl::Status Expect(char c, absl::string_view what) {
    return Take(c) ? absl::OkStatus() : Error(absl::StrCat("expected ", what));
  }

  // Items separated by ',' up to `close` (the opening character is
  // consumed already); `item` parses one.
  template <typename Item>
  absl::Status ParseList(char close, absl::string_view where, Item item) {
    if (Take(close)) return absl::OkStatus();
    while (true) {
      TPUSHIM_RETURN_IF_ERROR(item());
      if (Take(close)) return absl::OkStatus();
      if (!Take(',')) {
        return Error(absl::StrCat("expected ',' or '", std::string(1, close),
                                  "'", where));
      }
    }
  }

  // A non-negative decimal integer; `what` names it in errors.
  absl::StatusOr<int64_t> ParseInt(absl::string_view what) {
    SkipSpace();
    if (Peek() == '-') return Error(absl::StrCat("negative ", what));
    if (!IsDigit()) return Error(absl::StrCat("expected ", what));
    const size_t start = pos_;
    uint64_t v = 0;
    for (; IsDigit(); ++pos_) {
      const uint64_t digit = uint64_t(Peek() - '0');
      if (v > (uint64_t{INT64_MAX} - digit) / 10) {
        while (IsDigit()) ++pos_;
        return ErrorAt(
            absl::StrCat(what, " ", text_.substr(start, pos_ - start),
                         " does not fit in 64 bits"),
            start);
      }
      v = v * 10 + digit;
    }
    return int64_t(v);
  }

  absl::StatusOr<Shape> ParseShapeAt(int depth) {
    SkipSpace();
    Shape shape;
    if (Peek() == ')' && depth == 0) return Error("unbalanced ')'");
    if (Peek() != '(') {
      TPUSHIM_ASSIGN_OR_RETURN(shape.array, ParseArray());
      return shape;
    }
    if (depth >= kMaxTupleDepth) {
      return Error(absl::StrCat("tuples nested deeper than ", kMaxTupleDepth));
    }
    ++pos_;
    shape.is_tuple = true;
    TPUSHIM_RETURN_IF_ERROR(ParseList(')', "", [&]() -> absl::Status {
      TPUSHIM_ASSIGN_OR_RETURN(Shape element, ParseShapeAt(depth + 1));
      shape.tuple.push_back(std::move(element));
      return absl::OkStatus();
    }));
    return shape;
  }

  absl::StatusOr<ArrayShape> ParseArray() {
    const size_t start = pos_;
    while (absl::ascii_isalnum(static_cast<unsigned char>(Peek()))) ++pos_;
    const absl::string_view name = text_.substr(start, pos_ - start);
    if (name.empty()) return Error("expected an element type or '('");
    std::optional<ElementType> type = ElementTypeFromName(name);
    if (!type.has_value()) {
      if (name == "token" || name == "opaque") {
        return ErrorAt(
            absl::StrCat("element type '", name, "' holds no array data"),
            start);
      }
      const absl::Status unknown =
          ErrorAt(absl::StrCat("unknown element type '", name, "'"), start);
      return absl::InvalidArgumentError(
          absl::StrCat(unknown.message(), ElementTypeHint(name)));
    }
    ArrayShape a;
    a.type = *type;
    TPUSHIM_RETURN_IF_ERROR(Expect('[', "'[' after the element type"));
    TPUSHIM_RETURN_IF_ERROR(ParseList(']', "", [&]() -> absl::Status {
      SkipSpace();
      if (Peek() == '<' || Peek() == '?') {
        return Error("dynamic dimensions are not supported");
      }
      if (a.dims.size() == size_t(kMaxShapeRank)) {
        return Error(absl::StrCat("more than ", kMaxShapeRank, " dimensions"));
      }
      TPUSHIM_ASSIGN_OR_RETURN(int64_t d, ParseInt("dimension size"));
      a.dims.push_back(d);
      return absl::OkStatus();
    }));
    if (Take('{')) {
      TPUSHIM_RETURN_IF_ERROR(ParseLayout(&a));
      a.layout_given = true;
    } else {
      a.layout = DefaultLayout(a.type, a.dims);
    }
    // Sizes must fit in 64 bits (the error names the shape).
    TPUSHIM_RETURN_IF_ERROR(ComputeSizes(a).status());
    return a;
  }

  // After the '{'.
  absl::Status ParseLayout(ArrayShape* a) {
    const size_t open = pos_ - 1;
    Layout& layout = a->layout;
    std::vector<size_t> at;  // column of each minor_to_major entry
    SkipSpace();
    while (Peek() != ':' && Peek() != '}') {
      at.push_back(pos_);
      TPUSHIM_ASSIGN_OR_RETURN(int64_t d, ParseInt("dimension number"));
      layout.minor_to_major.push_back(d);
      if (!Take(',') && Peek() != ':' && Peek() != '}') {
        return Error("expected ',', ':' or '}'");
      }
      SkipSpace();
    }
    at.push_back(pos_);
    size_t bad = 0;
    std::string e =
        CheckMinorToMajor(layout.minor_to_major, a->dims.size(), &bad);
    if (!e.empty()) return ErrorAt(e, at[bad]);
    if (Take(':')) TPUSHIM_RETURN_IF_ERROR(ParseSuffixes(a));
    SkipSpace();
    if (AtEnd()) {
      return Error(
          absl::StrCat("unclosed '{' (opened at column ", open + 1, ")"));
    }
    return Expect('}', "'}'");
  }

  absl::Status ParseSuffixes(ArrayShape* a) {
    Layout& layout = a->layout;
    std::string seen;  // suffix letters given so far
    while (true) {
      SkipSpace();
      const size_t at = pos_;
      const char c = Peek();
      if (c == '}' || AtEnd()) return absl::OkStatus();
      if (c != 'T' && c != 'E' && c != 'L') {
        return ErrorAt(RejectedSuffix(text_.substr(pos_)), at);
      }
      if (seen.find(c) != std::string::npos) {
        return ErrorAt(absl::StrCat(std::string(1, c), "(...) given twice"),
                       at);
      }
      seen.push_back(c);
      ++pos_;
      if (c == 'T') {
        if (!Take('(')) return Error("expected '(' after 'T'");
        do {
          if (layout.tiles.size() == size_t(kMaxTiles)) {
            return ErrorAt(absl::StrCat("more than ", kMaxTiles, " tiles"),
                           pos_ - 1);
          }
          TPUSHIM_ASSIGN_OR_RETURN(Tile tile, ParseTile());
          layout.tiles.push_back(std::move(tile));
        } while (Take('('));
        continue;
      }
      TPUSHIM_RETURN_IF_ERROR(Expect('(', "'('"));
      SkipSpace();
      const size_t value_at = pos_;
      TPUSHIM_ASSIGN_OR_RETURN(int64_t n, ParseInt("number"));
      std::string e = c == 'E' ? CheckElementSize(a->type, n)
                      : n == 0 ? "tail alignment L(0) must be positive"
                               : "";
      if (!e.empty()) return ErrorAt(e, value_at);
      (c == 'E' ? layout.element_size_in_bits : layout.tail_padding_alignment) =
          n;
      TPUSHIM_RETURN_IF_ERROR(Expect(')', "')'"));
    }
  }

  // What XLA means by a suffix tpushim does not implement.
  static std::string RejectedSuffix(absl::string_view rest) {
    static constexpr std::pair<absl::string_view, absl::string_view> kKnown[] =
        {
            {"SC", "split configurations SC(...) are not supported"},
            {"S",
             "memory space S(...) is not supported: device buffers live in "
             "the default memory space"},
            {"D", "sparse dimension types D(...) are not supported"},
            {"#", "sparse index type #(...) is not supported"},
            {"*", "sparse pointer type *(...) is not supported"},
            {"P", "physical shape P(...) is not supported"},
            {"M", "dynamic shape metadata M(...) is not supported"},
        };
    for (const auto& [prefix, message] : kKnown) {
      if (absl::StartsWith(rest, prefix)) return std::string(message);
    }
    return absl::StrCat("unknown layout suffix '", rest.substr(0, 1), "'");
  }

  // After the '('.
  absl::StatusOr<Tile> ParseTile() {
    Tile tile;
    size_t at = pos_;
    TPUSHIM_RETURN_IF_ERROR(ParseList(')', " in a tile", [&]() -> absl::Status {
      SkipSpace();
      at = pos_;
      if (tile.dims.size() == size_t(kMaxTileRank)) {
        return Error(
            absl::StrCat("a tile has more than ", kMaxTileRank, " dimensions"));
      }
      if (Take('*')) {
        tile.dims.push_back(Tile::kCombine);
        return absl::OkStatus();
      }
      TPUSHIM_ASSIGN_OR_RETURN(int64_t t, ParseInt("tile dimension"));
      if (t == 0) return ErrorAt("tile dimension 0 must be positive", at);
      tile.dims.push_back(t);
      return absl::OkStatus();
    }));
    std::string e = CheckTile(tile);
    if (!e.empty()) return ErrorAt(e, at);
    return tile;
  }

  absl::string_view text_;
  size_t pos_ = 0;
};

}  // namespace

absl::StatusOr<Shape> ParseShape(absl::string_view text) {
  return Parser(text).Parse();
}

absl::StatusOr<ArrayShape> ParseArrayShape(absl::string_view text) {
  TPUSHIM_ASSIGN_OR_RETURN(Shape shape, ParseShape(text));
  if (shape.is_tuple) {
    return absl::InvalidArgumentError(
        absl::StrCat(text, ": expected an array shape, not a tuple"));
  }
  return std::move(shape.array);
}

absl::Status ValidateShape(const Shape& shape) {
  return ComputeSizes(shape).status();  // checks every array first
}

}  // namespace tpushim
