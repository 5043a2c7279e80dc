#include "transfer/relayout.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "device/xla_shape.h"

namespace tpushim {

using xla_shape_internal::TileNode;
using xla_shape_internal::TileTree;

// The plan's tables. The device image holds `elements` elements in tiled
// order (then tail padding up to `padded_elements`).
//
// Strided plans see the tiled shape as `extent` (major to minor, size-1
// dimensions dropped, neighbours merged where both sides are contiguous):
// an element at coordinates c is at host byte sum(c[k] * host[k]) and is
// data (not padding) when every constraint sum(c[k] * coef[j][k]) < bound[j]
// holds. Per-element plans walk the tile tree backwards instead.
struct RelayoutPlan::Impl {
  ArrayShape shape;
  Kernel kernel = Kernel::kPerElement;
  uint64_t device_bytes = 0;
  uint64_t host_bytes = 0;
  uint64_t elements = 0;
  uint64_t padded_elements = 0;
  int dev_bits = 0;          // bits of one device element
  int64_t dev_bytes = 0;     // bytes of one device element (0 when packed)
  int64_t host_elem = 0;     // bytes of one host element
  bool empty = false;        // a dimension is 0: the image is all padding
  bool stream_host = false;  // Unpack writes rows with non-temporal stores

  // Strided.
  std::vector<int64_t> extent, host;
  std::vector<std::vector<int64_t>> coef;  // [constraint][dim]
  std::vector<int64_t> bound;

  // Per element.
  std::vector<TileNode> nodes;
  std::vector<int> final_dims;
  std::vector<int64_t> logical_stride;  // host bytes per step of each dim
};

namespace {

using Impl = RelayoutPlan::Impl;

// A run of device elements, consecutive in the device image from element
// `dev_elem`: `planes` planes of `rows` rows of `cols` elements. Element
// (q, r, v) is at host byte
//   host_off + q * plane_stride + r * row_stride + v * col_stride;
// elements v >= valid of a row are padding (valid == cols whenever
// planes > 1 or rows > 1).
struct Segment {
  uint64_t dev_elem;
  int64_t planes, rows, cols;
  int64_t host_off, plane_stride, row_stride, col_stride;
  int64_t valid;
};

// Calls visit(Segment) for the elements [e0, e1) of a strided plan, in
// device order. The two most minor dimensions form a panel; whole panels
// that are all data come as planes along the third most minor dimension,
// the rest row by row. REQUIRES: e1 <= elements, extent.size() >= 3.
template <typename Visit>
void ForEachStrided(const Impl& p, uint64_t e0, uint64_t e1, Visit&& visit) {
  const size_t m = p.extent.size(), nc = p.bound.size();
  const size_t pi = m - 3, ri = m - 2, ci = m - 1;
  const int64_t rows = p.extent[ri], cols = p.extent[ci];
  const uint64_t panel = uint64_t(rows * cols);
  // Coordinates of e0; bases of host offset and constraint values over the
  // dimensions outside the panel; each constraint's rise across a panel.
  std::vector<int64_t> coord(m), cbase(nc, 0), corner(nc);
  uint64_t rest = e0;
  for (size_t k = m; k-- > 0;) {
    coord[k] = int64_t(rest % uint64_t(p.extent[k]));
    rest /= uint64_t(p.extent[k]);
  }
  int64_t hbase = 0;
  for (size_t k = 0; k < ri; ++k) {
    hbase += coord[k] * p.host[k];
    for (size_t j = 0; j < nc; ++j) cbase[j] += coord[k] * p.coef[j][k];
  }
  for (size_t j = 0; j < nc; ++j) {
    corner[j] = p.coef[j][ri] * (rows - 1) + p.coef[j][ci] * (cols - 1);
  }
  // Moves `steps` panels along dimension pi, carrying into the ones above.
  auto advance = [&](int64_t steps) {
    size_t k = pi;
    coord[k] += steps;
    hbase += steps * p.host[k];
    for (size_t j = 0; j < nc; ++j) cbase[j] += steps * p.coef[j][k];
    while (coord[k] == p.extent[k] && k > 0) {
      hbase -= p.host[k] * p.extent[k];
      for (size_t j = 0; j < nc; ++j) cbase[j] -= p.coef[j][k] * p.extent[k];
      coord[k] = 0;
      --k;
      ++coord[k];
      hbase += p.host[k];
      for (size_t j = 0; j < nc; ++j) cbase[j] += p.coef[j][k];
    }
  };
  int64_t i = coord[ri], v = coord[ci];
  uint64_t e = e0;
  while (e < e1) {
    if (i == 0 && v == 0 && e1 - e >= panel) {
      // Whole panels from here along pi: as many as are all data (the
      // constraints only grow along pi, so those are a prefix).
      int64_t n = std::min<int64_t>(p.extent[pi] - coord[pi],
                                    int64_t((e1 - e) / panel));
      for (size_t j = 0; j < nc && n > 0; ++j) {
        const int64_t slack = p.bound[j] - 1 - cbase[j] - corner[j];
        if (slack < 0) {
          n = 0;
        } else if (p.coef[j][pi] > 0) {
          n = std::min(n, slack / p.coef[j][pi] + 1);
        }
      }
      if (n > 0) {
        visit(Segment{e, n, rows, cols, hbase, p.host[pi], p.host[ri],
                      p.host[ci], cols});
        e += uint64_t(n) * panel;
        advance(n);
        continue;
      }
    }
    // One panel (or what of it is in range), row by row.
    bool panel_valid = true;
    for (size_t j = 0; j < nc && panel_valid; ++j) {
      panel_valid = cbase[j] + corner[j] < p.bound[j];
    }
    while (i < rows && e < e1) {
      const int64_t host_off = hbase + i * p.host[ri] + v * p.host[ci];
      if (panel_valid && v == 0 && e1 - e >= uint64_t(cols)) {
        const int64_t n = std::min<int64_t>(rows - i, int64_t((e1 - e) / cols));
        visit(
            Segment{e, 1, n, cols, host_off, 0, p.host[ri], p.host[ci], cols});
        e += uint64_t(n * cols);
        i += n;
        continue;
      }
      const int64_t n = std::min<int64_t>(cols - v, int64_t(e1 - e));
      int64_t valid = n;
      for (size_t j = 0; j < nc && !panel_valid; ++j) {
        const int64_t value = cbase[j] + p.coef[j][ri] * i + p.coef[j][ci] * v;
        const int64_t a = p.coef[j][ci];
        if (value >= p.bound[j]) {
          valid = 0;
        } else if (a > 0) {
          valid = std::min(valid, (p.bound[j] - value + a - 1) / a);
        }
      }
      visit(Segment{e, 1, 1, n, host_off, 0, 0, p.host[ci], valid});
      e += uint64_t(n);
      v += n;
      if (v == cols) {
        v = 0;
        ++i;
      }
    }
    if (i == rows) {
      i = 0;
      advance(1);
    }
  }
}

// Host byte of device element `e` of a per-element plan, or nullopt for
// padding: the tile tree walked backwards from the tiled coordinates.
std::optional<int64_t> HostOffsetOf(const Impl& p, uint64_t e,
                                    std::vector<int64_t>& value) {
  value.assign(p.nodes.size(), -1);
  for (size_t k = p.final_dims.size(); k-- > 0;) {
    const int64_t ext = p.nodes[p.final_dims[k]].extent;
    value[p.final_dims[k]] = int64_t(e % uint64_t(ext));
    e /= uint64_t(ext);
  }
  int64_t host = 0;
  for (size_t n = p.nodes.size(); n-- > 0;) {
    const TileNode& node = p.nodes[n];
    if (node.split_count >= 0) {
      value[n] = p.nodes[node.split_within].extent * value[node.split_count] +
                 value[node.split_within];
    } else if (node.combined_into >= 0) {
      const TileNode& c = p.nodes[node.combined_into];
      const int64_t minor = p.nodes[c.minor].extent;
      value[n] = int(n) == c.major ? value[node.combined_into] / minor
                                   : value[node.combined_into] % minor;
    }
    if (value[n] >= node.extent) return std::nullopt;
    if (node.kind == TileNode::Kind::kLogical) {
      host += value[n] * p.logical_stride[node.logical_dim];
    }
  }
  return host;
}

template <typename Visit>
void ForEachElement(const Impl& p, uint64_t e0, uint64_t e1, Visit&& visit) {
  std::vector<int64_t> scratch;
  for (uint64_t e = e0; e < e1; ++e) {
    std::optional<int64_t> h = HostOffsetOf(p, e, scratch);
    visit(Segment{e, 1, 1, 1, h.value_or(0), 0, 0, 0, h.has_value() ? 1 : 0});
  }
}

template <typename Visit>
void ForEachSegment(const Impl& p, uint64_t e0, uint64_t e1, Visit&& visit) {
  if (p.kernel == RelayoutPlan::Kernel::kPerElement) {
    ForEachElement(p, e0, e1, visit);
  } else {
    ForEachStrided(p, e0, e1, visit);
  }
}

// --- Copy kernels
// -------------------------------------------------------------
//
// Each moves elements between the device image (`dev`) and the host array
// (`host`); kPack says which way: true from host to device.

template <bool kPack>
inline void Move(char* dev, char* host, size_t n) {
  if constexpr (kPack) {
    std::memcpy(dev, host, n);
  } else {
    std::memcpy(host, dev, n);
  }
}

// A panel: `rows` x `cols` elements of S bytes (S 0: `size` bytes) in a
// row on the device, element (r, v) at host byte r * rs + v * cs. When the
// host holds each column as a run (rs == S), a small constant K == cols
// interleaves the runs in registers (sub-tiles such as (2,1) packing rows)
// and other widths go one run at a time (a transposing layout), keeping
// the host side sequential.
template <bool kPack, int S, int K>
void Panel(char* dev, char* host, int64_t rows, int64_t cols, int64_t rs,
           int64_t cs, int64_t size) {
  const int64_t s = S != 0 ? S : size;
  if constexpr (K != 0) {  // REQUIRES: rs == S, cols == K
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t v = 0; v < K; ++v) {
        Move<kPack>(dev + (r * K + v) * S, host + v * cs + r * S, S);
      }
    }
  } else if (rows > 1 && rs == s) {
    for (int64_t v = 0; v < cols; ++v) {
      for (int64_t r = 0; r < rows; ++r) {
        Move<kPack>(dev + (r * cols + v) * s, host + v * cs + r * s, size_t(s));
      }
    }
  } else {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t v = 0; v < cols; ++v) {
        Move<kPack>(dev + (r * cols + v) * s, host + r * rs + v * cs,
                    size_t(s));
      }
    }
  }
}

using PanelFn = void (*)(char*, char*, int64_t, int64_t, int64_t, int64_t,
                         int64_t);
template <bool kPack, int S>
PanelFn PickK(int64_t cols, bool runs) {
  if (runs && cols == 2) return Panel<kPack, S, 2>;
  if (runs && cols == 4) return Panel<kPack, S, 4>;
  if (runs && cols == 8) return Panel<kPack, S, 8>;
  return Panel<kPack, S, 0>;
}
// The kernel for panels of `cols` columns, `rs` host bytes between rows.
template <bool kPack>
PanelFn PickPanel(int64_t size, int64_t cols, int64_t rs) {
  const bool runs = rs == size;
  if (size == 1) return PickK<kPack, 1>(cols, runs);
  if (size == 2) return PickK<kPack, 2>(cols, runs);
  if (size == 4) return PickK<kPack, 4>(cols, runs);
  if (size == 8) return PickK<kPack, 8>(cols, runs);
  if (size == 16) return PickK<kPack, 16>(cols, runs);
  return Panel<kPack, 0, 0>;
}

// How many planes ahead Pack prefetches the host rows it reads: a panel's
// rows are several streams through host memory (8 with T(8,128)), more
// than the hardware prefetcher follows well across pages.
constexpr int64_t kPrefetchPlanes = 2;

// Host arrays at least this large are written by Unpack with
// non-temporal stores: they do not stay in cache for their reader anyway,
// and skipping the read-for-ownership is what lets Unpack keep up with a
// large memcpy.
constexpr uint64_t kStreamHostBytes = uint64_t{16} << 20;

// memcpy with non-temporal stores where the CPU has them.
void StreamCopy(char* out, const char* in, size_t n) {
#if defined(__SSE2__)
  const size_t head = (16 - (reinterpret_cast<uintptr_t>(out) & 15)) & 15;
  if (n < head + 64) {
    std::memcpy(out, in, n);
    return;
  }
  std::memcpy(out, in, head);
  out += head;
  in += head;
  n -= head;
  for (; n >= 64; n -= 64, out += 64, in += 64) {
    const __m128i* i = reinterpret_cast<const __m128i*>(in);
    __m128i* o = reinterpret_cast<__m128i*>(out);
    const __m128i a = _mm_loadu_si128(i), b = _mm_loadu_si128(i + 1);
    const __m128i c = _mm_loadu_si128(i + 2), d = _mm_loadu_si128(i + 3);
    _mm_stream_si128(o, a);
    _mm_stream_si128(o + 1, b);
    _mm_stream_si128(o + 2, c);
    _mm_stream_si128(o + 3, d);
  }
#endif
  std::memcpy(out, in, n);
}

// Whole device elements [e0, e1), all below p.elements; `image` holds
// element e0. Device and host elements of the same size.
template <bool kPack>
void RunSameSize(const Impl& p, char* image, char* host, uint64_t e0,
                 uint64_t e1) {
  const int64_t b = p.host_elem;
  ForEachSegment(p, e0, e1, [&](const Segment& s) {
    const bool rows_contiguous = s.col_stride == b;
    const PanelFn panel =
        rows_contiguous ? nullptr : PickPanel<kPack>(b, s.valid, s.row_stride);
    for (int64_t q = 0; q < s.planes; ++q) {
      char* d = image + (s.dev_elem - e0 + uint64_t(q * s.rows * s.cols)) * b;
      char* h = host + s.host_off + q * s.plane_stride;
      if (!rows_contiguous) {
        panel(d, h, s.rows, s.valid, s.row_stride, s.col_stride, b);
      } else {
        for (int64_t r = 0; r < s.rows; ++r) {
          char* dr = d + r * s.cols * b;
          char* hr = h + r * s.row_stride;
          const size_t n = size_t(s.valid * b);
          if constexpr (kPack) {
            if (s.plane_stride != 0) {
              const char* ahead = hr + kPrefetchPlanes * s.plane_stride;
              for (size_t i = 0; i < n; i += 64) __builtin_prefetch(ahead + i);
            }
            std::memcpy(dr, hr, n);
          } else if (p.stream_host) {
            StreamCopy(hr, dr, n);
          } else {
            std::memcpy(hr, dr, n);
          }
        }
      }
      if (kPack && s.valid < s.cols) {  // rows == 1: padding after the data
        std::memset(d + s.valid * b, 0, size_t((s.cols - s.valid) * b));
      }
    }
  });
}

// As RunSameSize, with device elements wider than the host's: the value in
// the low-addressed bytes, zero above.
template <bool kPack>
void RunWider(const Impl& p, char* image, char* host, uint64_t e0,
              uint64_t e1) {
  const int64_t db = p.dev_bytes, hb = p.host_elem;
  if (kPack) std::memset(image, 0, size_t((e1 - e0) * uint64_t(db)));
  ForEachSegment(p, e0, e1, [&](const Segment& s) {
    for (int64_t q = 0; q < s.planes; ++q) {
      for (int64_t r = 0; r < s.rows; ++r) {
        const uint64_t x =
            s.dev_elem - e0 + uint64_t((q * s.rows + r) * s.cols);
        char* h = host + s.host_off + q * s.plane_stride + r * s.row_stride;
        for (int64_t v = 0; v < s.valid; ++v) {
          Move<kPack>(image + (x + uint64_t(v)) * db, h + v * s.col_stride,
                      size_t(hb));
        }
      }
    }
  });
}

// Packed sub-byte elements in device bytes [off, off + n), `image` holding
// byte off: element x sits in byte x / per_byte, the first of a byte in
// its most significant bits. Elements go through `tmp`, one byte each, so
// that the panel kernels do the gathering.
template <bool kPack, int kBits>
void RunBitsOf(const Impl& p, char* image, char* host, uint64_t off,
               uint64_t n) {
  constexpr int bits = kBits, per_byte = 8 / kBits;
  constexpr int log = per_byte == 2 ? 1 : per_byte == 4 ? 2 : 3;
  constexpr unsigned mask = (1u << kBits) - 1;
  const uint64_t e0 = off * uint64_t(per_byte);
  const uint64_t e1 = std::min((off + n) * uint64_t(per_byte), p.elements);
  if (kPack) std::memset(image, 0, n);
  if (e0 >= e1) return;
  constexpr int64_t kTmp = 4096;
  char tmp[kTmp];
  auto BitsOne = [&](uint64_t x, int64_t i) {  // element x <-> tmp[i]
    char& byte = image[(x >> log) - off];
    const unsigned shift = unsigned(8 - bits * int((x & (per_byte - 1)) + 1));
    if constexpr (kPack) {
      byte =
          char(uint8_t(byte) | ((unsigned(uint8_t(tmp[i])) & mask) << shift));
    } else {
      tmp[i] = char((unsigned(uint8_t(byte)) >> shift) & mask);
    }
  };
  auto bits_of = [&](uint64_t x, int64_t count) {  // tmp <-> image
    int64_t i = 0;
    for (; i < count && (x & (per_byte - 1)) != 0; ++i, ++x) BitsOne(x, i);
    // Whole bytes: the first element in the most significant bits.
    for (; i + per_byte <= count; i += per_byte, x += uint64_t(per_byte)) {
      char& byte = image[(x >> log) - off];
      unsigned v = kPack ? 0 : unsigned(uint8_t(byte));
      for (int j = 0; j < per_byte; ++j) {
        if constexpr (kPack) {
          v = (v << bits) | (unsigned(uint8_t(tmp[i + j])) & mask);
        } else {
          tmp[i + j] = char((v >> (8 - bits * (j + 1))) & mask);
        }
      }
      if (kPack) byte = char(v);
    }
    for (; i < count; ++i, ++x) BitsOne(x, i);
  };
  ForEachSegment(p, e0, e1, [&](const Segment& s) {
    // As many whole rows at a time as fit, else pieces of one row.
    const int64_t rows_per =
        std::max<int64_t>(1, std::min(s.rows, kTmp / s.cols));
    for (int64_t q = 0; q < s.planes; ++q) {
      for (int64_t r = 0; r < s.rows; r += rows_per) {
        const int64_t rows = std::min(rows_per, s.rows - r);
        for (int64_t v = 0; v < s.valid; v += kTmp) {
          const int64_t cols = rows > 1 ? s.cols : std::min(kTmp, s.valid - v);
          const uint64_t x =
              s.dev_elem + uint64_t((q * s.rows + r) * s.cols + v);
          char* h = host + s.host_off + q * s.plane_stride + r * s.row_stride +
                    v * s.col_stride;
          const PanelFn panel = PickPanel<kPack>(1, cols, s.row_stride);
          if constexpr (kPack) {
            panel(tmp, h, rows, cols, s.row_stride, s.col_stride, 1);
            bits_of(x, rows * cols);
          } else {
            bits_of(x, rows * cols);
            panel(tmp, h, rows, cols, s.row_stride, s.col_stride, 1);
          }
        }
      }
    }
  });
}

template <bool kPack>
void RunBits(const Impl& p, char* image, char* host, uint64_t off, uint64_t n) {
  if (p.dev_bits == 1) return RunBitsOf<kPack, 1>(p, image, host, off, n);
  if (p.dev_bits == 2) return RunBitsOf<kPack, 2>(p, image, host, off, n);
  return RunBitsOf<kPack, 4>(p, image, host, off, n);
}

// --- Building a plan ---------------------------------------------------------

// Host bytes per unit of a node's value when the value is affine in its
// parts: the logical stride, or for a merge whose parts the host holds next
// to each other, the minor part's. nullopt: any stride fits (the value is
// always 0); *affine cleared when no stride fits.
std::optional<int64_t> StrideOf(const Impl& p, int n, bool* affine) {
  const TileNode& node = p.nodes[n];
  if (node.extent <= 1 || node.kind == TileNode::Kind::kMissing)
    return std::nullopt;
  if (node.kind == TileNode::Kind::kLogical)
    return p.logical_stride[node.logical_dim];
  if (node.kind != TileNode::Kind::kCombined) {  // a tile part merged again
    *affine = false;
    return std::nullopt;
  }
  std::optional<int64_t> a = StrideOf(p, node.major, affine);
  std::optional<int64_t> b = StrideOf(p, node.minor, affine);
  if (!b.has_value()) return a;
  if (a.has_value() && *a != p.nodes[node.minor].extent * *b) *affine = false;
  return b;
}

// Fills the strided tables; false when the layout is not affine.
bool BuildStrided(Impl& p) {
  const size_t m = p.final_dims.size();
  const size_t count = p.nodes.size();
  // Each node's value as a linear form over the tiled coordinates.
  std::vector<std::vector<int64_t>> form(count);
  std::vector<bool> is_final(count, false);
  for (size_t k = 0; k < m; ++k) {
    is_final[p.final_dims[k]] = true;
    form[p.final_dims[k]].assign(m, 0);
    form[p.final_dims[k]][k] = 1;
  }
  for (size_t n = count; n-- > 0;) {
    const TileNode& node = p.nodes[n];
    if (node.split_count < 0) continue;
    if (form[node.split_count].empty() || form[node.split_within].empty()) {
      return false;  // a part was merged again: not affine
    }
    const int64_t tile = p.nodes[node.split_within].extent;
    form[n].assign(m, 0);
    for (size_t k = 0; k < m; ++k) {
      form[n][k] =
          tile * form[node.split_count][k] + form[node.split_within][k];
    }
  }
  bool affine = true;
  p.host.assign(m, 0);
  for (size_t n = 0; n < count; ++n) {
    const TileNode& node = p.nodes[n];
    if (node.combined_into >= 0 || form[n].empty()) continue;
    // The host offset sums over the roots: dimensions and merges.
    if (node.kind != TileNode::Kind::kCount &&
        node.kind != TileNode::Kind::kWithin) {
      std::optional<int64_t> stride = StrideOf(p, int(n), &affine);
      for (size_t k = 0; k < m && stride.has_value(); ++k) {
        p.host[k] += *stride * form[n][k];
      }
    }
    if (is_final[n]) continue;  // bounded by its extent already
    int64_t max = 0;
    for (size_t k = 0; k < m; ++k) {
      max += form[n][k] * (p.nodes[p.final_dims[k]].extent - 1);
    }
    if (max >= node.extent) {
      p.coef.push_back(form[n]);
      p.bound.push_back(node.extent);
    }
  }
  if (!affine) return false;
  p.extent.clear();
  for (int n : p.final_dims) p.extent.push_back(p.nodes[n].extent);
  // Drop size-1 dimensions; merge neighbours contiguous on both sides.
  std::vector<int64_t> ext, host;
  std::vector<std::vector<int64_t>> coef(p.coef.size());
  for (size_t k = 0; k < m; ++k) {
    if (p.extent[k] == 1) continue;
    bool merge = !ext.empty() && host.back() == p.extent[k] * p.host[k];
    for (size_t j = 0; j < coef.size() && merge; ++j) {
      merge = coef[j].back() == p.extent[k] * p.coef[j][k];
    }
    if (merge) {
      ext.back() *= p.extent[k];
      host.back() = p.host[k];
      for (size_t j = 0; j < coef.size(); ++j) coef[j].back() = p.coef[j][k];
      continue;
    }
    ext.push_back(p.extent[k]);
    host.push_back(p.host[k]);
    for (size_t j = 0; j < coef.size(); ++j) coef[j].push_back(p.coef[j][k]);
  }
  if (ext.size() < 3) {  // the kernels want 3 dimensions: size-1 in front
    auto prepend = [pad = 3 - ext.size()](std::vector<int64_t>& v, int64_t x) {
      std::vector<int64_t> grown(pad, x);
      grown.insert(grown.end(), v.begin(), v.end());
      v = std::move(grown);
    };
    prepend(ext, 1);
    prepend(host, 0);
    for (auto& c : coef) prepend(c, 0);
  }
  p.extent = std::move(ext);
  p.host = std::move(host);
  p.coef = std::move(coef);
  return true;
}

}  // namespace

absl::StatusOr<RelayoutPlan> RelayoutPlan::Create(const ArrayShape& shape) {
  TPUSHIM_RETURN_IF_ERROR(ValidateShape(Shape{false, shape, {}}));
  TPUSHIM_ASSIGN_OR_RETURN(ShapeSizes sizes, ComputeSizes(shape));
  TPUSHIM_ASSIGN_OR_RETURN(TileTree tree,
                           xla_shape_internal::BuildTileTree(shape));
  if (tree.padded_elements > uint64_t{INT64_MAX}) {
    return absl::InvalidArgumentError(
        absl::StrCat("shape ", ToString(shape), ": too large to relayout"));
  }
  auto p = std::make_shared<Impl>();
  p->shape = shape;
  p->device_bytes = sizes.padded_bytes;
  p->host_bytes = HostBytes(shape);
  p->elements = tree.elements;
  p->padded_elements = tree.padded_elements;
  p->dev_bits = DeviceElementBits(shape);
  p->dev_bytes = p->dev_bits % 8 == 0 ? p->dev_bits / 8 : 0;
  p->host_elem = ElementHostBytes(shape.type);
  p->nodes = std::move(tree.nodes);
  p->final_dims = std::move(tree.final_dims);
  p->logical_stride.assign(shape.dims.size(), 0);
  int64_t stride = p->host_elem;
  for (size_t d = shape.dims.size(); d-- > 0;) {
    p->logical_stride[d] = stride;
    stride *= shape.dims[d];
    p->empty |= shape.dims[d] == 0;
  }
  if (p->empty) p->elements = 0;
  p->stream_host = p->host_bytes >= kStreamHostBytes;
  if (BuildStrided(*p)) {
    const bool one_run = p->extent[0] == 1 && p->extent[1] == 1 &&
                         p->coef.empty() && p->host[2] == p->host_elem &&
                         p->dev_bytes == p->host_elem;
    p->kernel = one_run ? Kernel::kIdentity : Kernel::kStrided;
  } else {
    p->kernel = Kernel::kPerElement;
  }
  return RelayoutPlan(std::move(p));
}

const ArrayShape& RelayoutPlan::shape() const { return impl_->shape; }
uint64_t RelayoutPlan::device_bytes() const { return impl_->device_bytes; }
uint64_t RelayoutPlan::host_bytes() const { return impl_->host_bytes; }
RelayoutPlan::Kernel RelayoutPlan::kernel() const { return impl_->kernel; }

namespace {

absl::Status CheckRange(const Impl& p, uint64_t off, uint64_t n) {
  if (off > p.device_bytes || n > p.device_bytes - off) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bytes [", off, ", ", off, " + ", n, ") pass the end of the ",
        p.device_bytes, "-byte device image of ", ToString(p.shape)));
  }
  return absl::OkStatus();
}

// Device bytes [off, off + n) of a plan, `image` holding byte off.
template <bool kPack>
void Run(const Impl& p, char* image, char* host, uint64_t off, uint64_t n) {
  if (n == 0) return;
  if (p.dev_bytes == 0) {
    RunBits<kPack>(p, image, host, off, n);
    return;
  }
  const uint64_t db = uint64_t(p.dev_bytes), end = off + n;
  // Bytes [b0, b1) of element e, which the range holds only part of.
  auto part = [&](uint64_t e, uint64_t b0, uint64_t b1) {
    char* at = image + (e * db + b0 - off);
    std::optional<int64_t> h;
    if (e < p.elements) {
      ForEachSegment(p, e, e + 1, [&](const Segment& s) {
        if (s.valid > 0) h = s.host_off;
      });
    }
    const uint64_t hb = uint64_t(p.host_elem);
    if constexpr (kPack) {
      char element[16] = {};
      if (h.has_value()) std::memcpy(element, host + *h, hb);
      std::memcpy(at, element + b0, b1 - b0);
    } else if (h.has_value() && b0 < hb) {
      std::memcpy(host + *h + b0, at, std::min(b1, hb) - b0);
    }
  };
  if (off / db == (end - 1) / db && (off % db != 0 || end % db != 0)) {
    part(off / db, off % db, off % db + n);  // inside one element
    return;
  }
  if (off % db != 0) part(off / db, off % db, db);
  const uint64_t e0 = (off + db - 1) / db, e1 = end / db;  // whole elements
  const uint64_t data_end = std::max(e0, std::min(e1, p.elements));
  char* whole = image + (e0 * db - off);
  if (e0 < data_end) {
    if (p.dev_bytes == p.host_elem) {
      RunSameSize<kPack>(p, whole, host, e0, data_end);
    } else {
      RunWider<kPack>(p, whole, host, e0, data_end);
    }
  }
  if (kPack && data_end < e1) {  // tail padding
    std::memset(whole + (data_end - e0) * db, 0, (e1 - data_end) * db);
  }
  if (end % db != 0) part(e1, 0, end % db);
#if defined(__SSE2__)
  if (!kPack && p.stream_host) _mm_sfence();  // order the streamed stores
#endif
}

}  // namespace

absl::Status RelayoutPlan::Pack(const void* host_dense, uint64_t device_offset,
                                uint64_t n, void* dst) const {
  TPUSHIM_RETURN_IF_ERROR(CheckRange(*impl_, device_offset, n));
  // Run<true> only reads the host side.
  Run<true>(*impl_, static_cast<char*>(dst),
            const_cast<char*>(static_cast<const char*>(host_dense)),
            device_offset, n);
  return absl::OkStatus();
}

absl::Status RelayoutPlan::Unpack(const void* src, uint64_t device_offset,
                                  uint64_t n, void* host_dense) const {
  TPUSHIM_RETURN_IF_ERROR(CheckRange(*impl_, device_offset, n));
  // Run<false> only reads the device side.
  Run<false>(*impl_, const_cast<char*>(static_cast<const char*>(src)),
             static_cast<char*>(host_dense), device_offset, n);
  return absl::OkStatus();
}

}  // namespace tpushim
