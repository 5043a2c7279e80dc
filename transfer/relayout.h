// Relayout kernels: between a host's dense row-major array and the tiled
// image the device holds, one byte range of the device image at a time.
//
// A shaped transfer moves through staging chunks; the copy into (out of)
// each chunk is the relayout, one pass over the data and no extra buffer.
// So a RelayoutPlan, built once per (shape, layout), converts any byte
// range [device_offset, device_offset + n) of the device image:
//
//   Pack:   host dense array  ->  device bytes of the range (padding zero)
//   Unpack: device bytes of the range  ->  host dense array (padding skipped)
//
// The host array holds the elements in C order of the dimensions as written
// (dimension 0 most major), each in ElementHostBytes bytes. The device image
// is the layout's tiled order (device/xla_shape.h says how tiles, `*`, E(n)
// and L(n) work); it is ComputeSizes(shape).padded_bytes long.
//
// Any split of the image into ranges gives the same bytes as one call over
// the whole: ranges may start and end mid-row, mid-tile, and mid-element
// (an element split between two chunks is written in two parts). Packed
// sub-byte elements (E(4) on s4, ...) never straddle a byte, so their ranges
// are whole elements; Pack takes the low bits of each host byte, Unpack
// writes the value into the low bits and zero above.
//
// Speed: a layout whose element positions are affine in the tiled
// coordinates (every layout except a `*` that merges dimensions the host
// does not hold next to each other, or merges parts of an earlier tile)
// runs as strided copies over panels of the two most minor tiled
// dimensions: with `{1,0:T(8,128)}` and 32-bit elements each 128-element
// tile row is one 512-byte memcpy, Pack prefetching the host rows ahead;
// sub-tiles such as (2,1) or (4,1) interleave host rows in registers;
// transposing layouts copy one host run at a time. Unpack writes host
// arrays of 16 MiB and more with non-temporal stores (and fences before
// returning). Packed sub-byte elements pass through a small buffer. Other
// layouts map element by element (correct, much slower).
//
// Thread-safety: a plan is immutable; Pack and Unpack may run concurrently
// on one plan (disjoint output ranges for concurrent writers). Copying a
// plan is cheap (the tables are shared).
//
//   TPUSHIM_ASSIGN_OR_RETURN(ArrayShape shape,
//                            ParseArrayShape("f32[4096,4100]"));
//   TPUSHIM_ASSIGN_OR_RETURN(RelayoutPlan plan, RelayoutPlan::Create(shape));
//   for (uint64_t off = 0; off < plan.device_bytes(); off += chunk) {
//     const uint64_t n = std::min(chunk, plan.device_bytes() - off);
//     TPUSHIM_RETURN_IF_ERROR(plan.Pack(host, off, n, staging));
//     ... DMA staging -> device + off ...
//   }

#ifndef TPUSHIM_TRANSFER_RELAYOUT_H_
#define TPUSHIM_TRANSFER_RELAYOUT_H_

#include <cstdint>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "device/xla_shape.h"

namespace tpushim {

class RelayoutPlan {
 public:
  // How the plan copies (for tests and benchmarks).
  enum class Kernel {
    kIdentity,    // the device image is the host array: one memcpy
    kStrided,     // affine layout: strided row copies
    kPerElement,  // element by element
  };

  // Plans the relayout of `shape` (its layout as given or defaulted).
  // INVALID_ARGUMENT when ValidateShape rejects the shape or its device
  // image has more than INT64_MAX elements.
  static absl::StatusOr<RelayoutPlan> Create(const ArrayShape& shape);

  const ArrayShape& shape() const;
  // Length of the device image (the padded size) and of the host array.
  uint64_t device_bytes() const;
  uint64_t host_bytes() const;
  Kernel kernel() const;

  // Writes device image bytes [device_offset, device_offset + n) to
  // dst[0, n), reading the elements they hold from `host_dense` (the whole
  // host array, host_bytes() long); padding bytes are written as zero.
  // INVALID_ARGUMENT (nothing written) when the range passes the end of the
  // image. REQUIRES: dst does not overlap host_dense.
  absl::Status Pack(const void* host_dense, uint64_t device_offset, uint64_t n,
                    void* dst) const;

  // The inverse for that range: reads device image bytes [device_offset,
  // device_offset + n) from src[0, n) and stores the elements (or the parts
  // of elements) they hold into `host_dense`; padding is ignored and host
  // bytes of other ranges are left alone. INVALID_ARGUMENT (nothing
  // written) when the range passes the end of the image. REQUIRES: src
  // does not overlap host_dense.
  absl::Status Unpack(const void* src, uint64_t device_offset, uint64_t n,
                      void* host_dense) const;

  struct Impl;  // defined in relayout.cc

 private:
  explicit RelayoutPlan(std::shared_ptr<const Impl> impl)
      : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace tpushim

#endif  // TPUSHIM_TRANSFER_RELAYOUT_H_
