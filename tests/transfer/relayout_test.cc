// Relayout kernels against a slow reference written straight from XLA's
// tiled-layout definition (pad, reshape, transpose per tile; `*` merges a
// dimension into the next more minor one), on the document's own examples
// and on a few hundred random shapes, layouts and element types, with
// random chunk splits; and several threads packing one image.

#include "transfer/relayout.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "device/xla_shape.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpushim {
namespace {

using ::testing::HasSubstr;

// The reference: the position of element `idx` (indices as written) in the
// tiled order, and the tiled dimensions. From the definition: start from
// the physical dimensions (major to minor); per tile, put size-1
// dimensions in front while the tile is longer, merge each `*` dimension
// into the next, then replace the covered dimensions d by (ceil(d/t)) in
// front of (t), indices e by (e/t) and (e%t).
uint64_t ReferencePosition(const ArrayShape& s, const std::vector<int64_t>& idx,
                           std::vector<int64_t>* tiled_dims) {
  const size_t r = s.dims.size();
  std::vector<int64_t> d, e;
  for (size_t j = 0; j < r; ++j) {
    const int64_t dim = s.layout.minor_to_major[r - 1 - j];
    d.push_back(s.dims[dim]);
    e.push_back(idx[dim]);
  }
  for (const Tile& tile : s.layout.tiles) {
    const size_t k = tile.dims.size();
    if (d.size() < k) {  // size-1 dimensions in front
      std::vector<int64_t> d1(k - d.size(), 1), e0(k - d.size(), 0);
      d1.insert(d1.end(), d.begin(), d.end());
      e0.insert(e0.end(), e.begin(), e.end());
      d = std::move(d1);
      e = std::move(e0);
    }
    const size_t start = d.size() - k;
    std::vector<int64_t> td, te, tt;
    bool carry = false;
    int64_t cd = 0, ce = 0;
    for (size_t j = 0; j < k; ++j) {
      int64_t dj = d[start + j], ej = e[start + j];
      if (carry) {
        ej = ce * dj + ej;
        dj = cd * dj;
      }
      carry = tile.dims[j] == Tile::kCombine;
      if (carry) {
        cd = dj;
        ce = ej;
        continue;
      }
      td.push_back(dj);
      te.push_back(ej);
      tt.push_back(tile.dims[j]);
    }
    d.resize(start);
    e.resize(start);
    for (size_t j = 0; j < td.size(); ++j) {
      d.push_back((td[j] + tt[j] - 1) / tt[j]);
      e.push_back(te[j] / tt[j]);
    }
    for (size_t j = 0; j < td.size(); ++j) {
      d.push_back(tt[j]);
      e.push_back(te[j] % tt[j]);
    }
  }
  uint64_t linear = 0;
  for (size_t j = 0; j < d.size(); ++j) linear = linear * d[j] + e[j];
  if (tiled_dims != nullptr) *tiled_dims = d;
  return linear;
}

// Calls f(index vector, host element number) for every element.
template <typename F>
void ForEachIndex(const std::vector<int64_t>& dims, F f) {
  uint64_t total = 1;
  for (int64_t d : dims) total *= uint64_t(d);
  std::vector<int64_t> idx(dims.size(), 0);
  for (uint64_t n = 0; n < total; ++n) {
    uint64_t rest = n;
    for (size_t k = dims.size(); k-- > 0;) {
      idx[k] = int64_t(rest % uint64_t(dims[k]));
      rest /= uint64_t(dims[k]);
    }
    f(idx, n);
  }
}

// The device image the reference gives for `host`, and which bits of it
// hold data (the rest is padding).
struct Image {
  std::vector<uint8_t> bytes, data_mask;
};
Image ReferenceImage(const ArrayShape& s, const std::vector<uint8_t>& host,
                     uint64_t device_bytes) {
  Image img{std::vector<uint8_t>(device_bytes, 0),
            std::vector<uint8_t>(device_bytes, 0)};
  const int bits = DeviceElementBits(s);
  const int hb = ElementHostBytes(s.type);
  ForEachIndex(s.dims, [&](const std::vector<int64_t>& idx, uint64_t n) {
    const uint64_t pos = ReferencePosition(s, idx, nullptr);
    if (bits < 8) {
      const uint64_t per = uint64_t(8 / bits);
      const int shift = 8 - bits * int(pos % per + 1);
      const uint8_t mask = uint8_t((1u << bits) - 1);
      img.bytes[pos / per] |= uint8_t((host[n * hb] & mask) << shift);
      img.data_mask[pos / per] |= uint8_t(mask << shift);
    } else {
      const uint64_t db = uint64_t(bits / 8);
      std::memcpy(&img.bytes[pos * db], &host[n * hb], size_t(hb));
      std::memset(&img.data_mask[pos * db], 0xff, size_t(hb));
    }
  });
  return img;
}

// Random cut points of [0, n): 0 = c0 < c1 < ... < ck = n.
std::vector<uint64_t> RandomCuts(uint64_t n, std::mt19937_64& rng) {
  std::vector<uint64_t> cuts = {0, n};
  const int k = int(rng() % 6);
  for (int i = 0; i < k && n > 1; ++i) cuts.push_back(1 + rng() % (n - 1));
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  return cuts;
}

std::vector<uint8_t> RandomHost(const ArrayShape& s, std::mt19937_64& rng) {
  std::vector<uint8_t> host(HostBytes(s));
  const int bits = DeviceElementBits(s);
  for (uint8_t& b : host) b = uint8_t(rng());
  if (bits < 8) {  // packed: only the low bits travel
    for (uint8_t& b : host) b &= uint8_t((1u << bits) - 1);
  }
  return host;
}

// Packs and unpacks `s` whole and in random chunks, checking the reference.
void CheckRoundTrip(const ArrayShape& s, std::mt19937_64& rng) {
  SCOPED_TRACE(ToString(s));
  absl::StatusOr<RelayoutPlan> plan = RelayoutPlan::Create(s);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->device_bytes(), ComputeSizes(s)->padded_bytes);
  const std::vector<uint8_t> host = RandomHost(s, rng);
  const uint64_t n = plan->device_bytes();
  const Image want = ReferenceImage(s, host, n);

  std::vector<uint8_t> whole(n, 0xcd);
  ASSERT_TRUE(plan->Pack(host.data(), 0, n, whole.data()).ok());
  ASSERT_EQ(whole, want.bytes) << "whole-image Pack differs from the reference";

  std::vector<uint8_t> chunked(n, 0xcd);
  const std::vector<uint64_t> cuts = RandomCuts(n, rng);
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    ASSERT_TRUE(plan->Pack(host.data(), cuts[i], cuts[i + 1] - cuts[i],
                           chunked.data() + cuts[i])
                    .ok());
  }
  ASSERT_EQ(chunked, want.bytes) << "chunked Pack differs";

  // Unpack from an image whose padding is garbage, in other chunks.
  std::vector<uint8_t> src = want.bytes;
  for (uint64_t i = 0; i < n; ++i) src[i] |= uint8_t(~want.data_mask[i] & 0xa5);
  std::vector<uint8_t> back(host.size(), 0);
  const std::vector<uint64_t> cuts2 = RandomCuts(n, rng);
  for (size_t i = 0; i + 1 < cuts2.size(); ++i) {
    ASSERT_TRUE(plan->Unpack(src.data() + cuts2[i], cuts2[i],
                             cuts2[i + 1] - cuts2[i], back.data())
                    .ok());
  }
  ASSERT_EQ(back, host) << "round trip is not bit-exact";
}

ArrayShape Parse(const std::string& text) {
  absl::StatusOr<ArrayShape> s = ParseArrayShape(text);
  EXPECT_TRUE(s.ok()) << text << ": " << s.status();
  return s.ok() ? *s : ArrayShape{};
}

TEST(RelayoutTest, TiledLayoutDocumentExamples) {
  // F32[3,5]{1,0:T(2,2)}: element (2,3) is at 17.
  ArrayShape s = Parse("f32[3,5]{1,0:T(2,2)}");
  std::vector<int64_t> tiled;
  EXPECT_EQ(ReferencePosition(s, {2, 3}, &tiled), 17u);
  EXPECT_EQ(tiled, (std::vector<int64_t>{2, 3, 2, 2}));
  std::vector<float> host(15);
  for (int i = 0; i < 15; ++i) host[i] = float(i + 1);
  RelayoutPlan plan = *RelayoutPlan::Create(s);
  std::vector<float> dev(24, -1);
  ASSERT_TRUE(plan.Pack(host.data(), 0, 96, dev.data()).ok());
  EXPECT_EQ(dev[17], host[2 * 5 + 3]);
  EXPECT_EQ(dev[5], host[3]);  // (0,3): second tile, second element
  EXPECT_EQ(dev[9], 0.0f);     // (0,5) of the padded 4x6: padding
  // An 8x8 array by (2,4)(2,1,1,1): element (6,5) is at 51.
  EXPECT_EQ(ReferencePosition(Parse("f32[8,8]{1,0:T(2,4)(2,1,1,1)}"), {6, 5},
                              nullptr),
            51u);
  std::mt19937_64 rng(1);
  for (const char* text :
       {"f32[3,5]{1,0:T(2,2)}", "f32[8,8]{1,0:T(2,4)(2,1,1,1)}",
        "bf16[32,256]{1,0:T(8,128)(2,1,1,1)}", "f32[4,8]{1,0:T(2,4)(2,1)}",
        "f32[2,7,8,11,10]{4,3,2,1,0:T(*,*,2,*,3)}",
        "bf16[2,3,1004]{2,1,0:T(2,*,128)}"}) {
    CheckRoundTrip(Parse(text), rng);
  }
}

TEST(RelayoutTest, PicksTheKernelTheLayoutAllows) {
  EXPECT_EQ(RelayoutPlan::Create(Parse("f32[64,300]"))->kernel(),
            RelayoutPlan::Kernel::kStrided);
  EXPECT_EQ(RelayoutPlan::Create(Parse("f32[64,300]{1,0}"))->kernel(),
            RelayoutPlan::Kernel::kIdentity);
  EXPECT_EQ(RelayoutPlan::Create(Parse("f32[8,128]{1,0:T(8,128)}"))->kernel(),
            RelayoutPlan::Kernel::kIdentity);
  EXPECT_EQ(
      RelayoutPlan::Create(Parse("f32[2,7,8,11,10]{4,3,2,1,0:T(*,*,2,*,3)}"))
          ->kernel(),
      RelayoutPlan::Kernel::kStrided);
  // `*` over dimensions the host does not hold next to each other.
  ArrayShape odd = Parse("f32[3,4,5]{0,1,2:T(*,8)}");
  EXPECT_EQ(RelayoutPlan::Create(odd)->kernel(),
            RelayoutPlan::Kernel::kPerElement);
  std::mt19937_64 rng(2);
  CheckRoundTrip(odd, rng);
  // A `*` in a second tile merges parts of the first: per element too.
  ArrayShape later = Parse("f32[6,20]{1,0:T(2,8)(*,3,2)}");
  EXPECT_EQ(RelayoutPlan::Create(later)->kernel(),
            RelayoutPlan::Kernel::kPerElement);
  CheckRoundTrip(later, rng);
}

TEST(RelayoutTest, RejectsRangesPastTheImage) {
  RelayoutPlan plan = *RelayoutPlan::Create(Parse("f32[8,10]"));
  ASSERT_EQ(plan.device_bytes(), 4096u);
  std::vector<char> host(plan.host_bytes()), dev(8192);
  absl::Status s = plan.Pack(host.data(), 4000, 97, dev.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("4096-byte device image of f32[8,10]{1,0:T(8,128)}"));
  EXPECT_EQ(plan.Unpack(dev.data(), UINT64_MAX, 2, host.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(plan.Pack(host.data(), 4096, 0, dev.data()).ok());
  ArrayShape invalid;
  invalid.dims = {2};  // and no minor_to_major
  absl::StatusOr<RelayoutPlan> bad = RelayoutPlan::Create(invalid);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(),
              HasSubstr("minor_to_major has 0 entries"));
}

TEST(RelayoutTest, ElementsSplitAcrossChunksArriveWhole) {
  // f64 elements cut at every byte offset; c128 and widened pred too.
  std::mt19937_64 rng(3);
  for (const char* text : {"f64[3,5]", "c128[2,3]{1,0:T(2,2)}",
                           "pred[5,3]{1,0:T(4,2)E(32)}", "bf16[9]"}) {
    ArrayShape s = Parse(text);
    RelayoutPlan plan = *RelayoutPlan::Create(s);
    const std::vector<uint8_t> host = RandomHost(s, rng);
    const Image want = ReferenceImage(s, host, plan.device_bytes());
    for (uint64_t cut = 1; cut < plan.device_bytes(); cut += 3) {
      std::vector<uint8_t> dev(plan.device_bytes());
      ASSERT_TRUE(plan.Pack(host.data(), 0, cut, dev.data()).ok());
      ASSERT_TRUE(
          plan.Pack(host.data(), cut, dev.size() - cut, dev.data() + cut).ok());
      ASSERT_EQ(dev, want.bytes) << text << " cut at " << cut;
      std::vector<uint8_t> back(host.size(), 0);
      ASSERT_TRUE(plan.Unpack(dev.data(), 0, cut, back.data()).ok());
      ASSERT_TRUE(
          plan.Unpack(dev.data() + cut, cut, dev.size() - cut, back.data())
              .ok());
      ASSERT_EQ(back, host) << text << " cut at " << cut;
    }
  }
}

TEST(RelayoutTest, LargeArraysRoundTripThroughUnalignedHostBuffers) {
  // Past 16 MiB of host array Unpack streams its stores; the host array
  // here starts 3 bytes into its buffer, so rows are never 16-aligned.
  ArrayShape s = Parse("f32[2056,2052]");
  RelayoutPlan plan = *RelayoutPlan::Create(s);
  ASSERT_GE(plan.host_bytes(), uint64_t{16} << 20);
  std::vector<uint32_t> values(plan.host_bytes() / 4);
  for (size_t i = 0; i < values.size(); ++i)
    values[i] = uint32_t(i * 2654435761u);
  std::vector<char> host(plan.host_bytes() + 3), back(plan.host_bytes() + 3, 0);
  std::memcpy(host.data() + 3, values.data(), plan.host_bytes());
  std::vector<uint32_t> dev(plan.device_bytes() / 4);
  char* image = reinterpret_cast<char*>(dev.data());
  const uint64_t chunk = 512 << 10;
  for (uint64_t off = 0; off < plan.device_bytes(); off += chunk) {
    const uint64_t n = std::min<uint64_t>(chunk, plan.device_bytes() - off);
    ASSERT_TRUE(plan.Pack(host.data() + 3, off, n, image + off).ok());
  }
  // Element (2055, 2051): row tile 256, column tile 16 of 17, (7, 3) in it.
  EXPECT_EQ(dev[(257 * 17 - 1) * 1024 + 7 * 128 + 3], values.back());
  ASSERT_TRUE(plan.Unpack(image, 0, plan.device_bytes(), back.data() + 3).ok());
  EXPECT_TRUE(std::equal(host.begin(), host.end(), back.begin()));
}

// A random array shape with a random layout, small enough to check fast.
ArrayShape RandomShape(std::mt19937_64& rng) {
  while (true) {
    ArrayShape s;
    s.type = static_cast<ElementType>(rng() % 30);
    const int rank = int(rng() % 6);
    for (int i = 0; i < rank; ++i) {
      s.dims.push_back(
          rng() % 25 == 0 ? 0 : int64_t(1 + rng() % (rank > 3 ? 6 : 13)));
    }
    if (rng() % 4 == 0) {
      s.layout = DefaultLayout(s.type, s.dims);
    } else {
      for (int i = 0; i < rank; ++i) s.layout.minor_to_major.push_back(i);
      std::shuffle(s.layout.minor_to_major.begin(),
                   s.layout.minor_to_major.end(), rng);
      const int tiles = int(rng() % 4);
      int covered = rank;
      for (int t = 0; t < tiles; ++t) {
        Tile tile;
        const int k = 1 + int(rng() % (std::min(covered, 3) + 1));
        for (int j = 0; j < k; ++j) {
          const bool star = j + 1 < k && rng() % 6 == 0;
          tile.dims.push_back(star ? Tile::kCombine : int64_t(1 + rng() % 5));
        }
        covered = std::max(covered, k) + k;
        s.layout.tiles.push_back(tile);
      }
      const int bits = ElementBitWidth(s.type);
      if (bits < 8 && rng() % 2 == 0) s.layout.element_size_in_bits = bits;
      if (rng() % 8 == 0) {
        s.layout.element_size_in_bits =
            std::min(128, 16 * ElementHostBytes(s.type));
      }
      if (rng() % 5 == 0)
        s.layout.tail_padding_alignment = int64_t(1 + rng() % 7);
    }
    absl::StatusOr<ShapeSizes> sizes = ComputeSizes(s);
    if (sizes.ok() && sizes->padded_bytes <= (64 << 10)) return s;
  }
}

TEST(RelayoutTest, RandomShapesRoundTripAndMatchTheReference) {
  std::mt19937_64 rng(20240611);
  int strided = 0, per_element = 0;
  for (int i = 0; i < 600; ++i) {
    ArrayShape s = RandomShape(rng);
    absl::StatusOr<RelayoutPlan> plan = RelayoutPlan::Create(s);
    ASSERT_TRUE(plan.ok()) << ToString(s) << ": " << plan.status();
    (plan->kernel() == RelayoutPlan::Kernel::kPerElement ? per_element
                                                         : strided)++;
    CheckRoundTrip(s, rng);
    if (HasFatalFailure()) return;
  }
  EXPECT_GT(strided, 450);
  EXPECT_GT(per_element, 0);
}

TEST(RelayoutTest, ThreadsPackingDisjointRangesOfOneImage) {
  ArrayShape s = Parse("f32[100,300]");
  RelayoutPlan plan = *RelayoutPlan::Create(s);
  std::mt19937_64 rng(4);
  const std::vector<uint8_t> host = RandomHost(s, rng);
  const Image want = ReferenceImage(s, host, plan.device_bytes());
  std::vector<uint64_t> cuts = {0};
  while (cuts.back() < plan.device_bytes()) {
    cuts.push_back(std::min<uint64_t>(cuts.back() + 1 + rng() % 7000,
                                      plan.device_bytes()));
  }
  constexpr int kThreads = 4;
  std::vector<uint8_t> dev(plan.device_bytes(), 0xcd), back(host.size(), 0);
  auto run = [&](bool pack) {
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (size_t i = size_t(t); i + 1 < cuts.size(); i += kThreads) {
          const uint64_t off = cuts[i], n = cuts[i + 1] - cuts[i];
          absl::Status st =
              pack ? plan.Pack(host.data(), off, n, dev.data() + off)
                   : plan.Unpack(dev.data() + off, off, n, back.data());
          EXPECT_TRUE(st.ok()) << st;
        }
      });
    }
    for (std::thread& th : threads) th.join();
  };
  run(true);
  EXPECT_EQ(dev, want.bytes);
  run(false);
  EXPECT_EQ(back, host);
}

}  // namespace
}  // namespace tpushim
