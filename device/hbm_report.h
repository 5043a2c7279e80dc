// What holds a device's memory when an allocation does not fit, in the
// words of XLA's out-of-memory report for TPU HBM:
//
//   Ran out of memory in memory space hbm. Used 19.46G of 15.48G hbm. Exceeded
//   hbm capacity by 3.98G.
//       device buffers 19.46G (33.1% utilization: Unpadded (6.40G) Padded
//       (19.32G), 0.7% fragmentation (147.91M))
//   Largest program allocations in hbm:
//
//     1. Size: 14.00G
//        Operator: op_type="OneHot" op_name="model/loss/one_hot"
//        Shape: s32[29360128,10]{1,0:T(8,128)}
//        Unpadded size: 1.09G
//        Extra memory due to padding: 12.91G (12.8x expansion)
//        XLA label: one_hot
//        Allocation type: live buffer
//        ==========================
//
// The figures count the live buffers and the request that failed:
//   Used        what the device's allocator holds for them (each buffer's
//               padded size rounded up to the allocator's granule), so
//               Used = Padded + fragmentation;
//   Unpadded    the bytes of their data (a byte buffer's size);
//   Padded      their sizes in their layouts;
//   utilization Unpadded / Padded; fragmentation (Used - Padded) / Used.
// When Used fits in the capacity the allocation failed because no free
// block is large enough; the first line says so in place of "Exceeded".
//
// The list holds the largest buffers, largest first (ties: the request
// first, then the older buffer), and always the request. As in XLA's
// report, `Operator:` is printed only when the caller gave op metadata,
// and `Extra memory due to padding:` only when the buffer is padded;
// `Shape:` only for a shaped buffer (a byte buffer is its own unpadded
// size); a buffer without a label is "XLA label: (none)". After the list,
// one line per listed shaped buffer that is padded says which dimension
// causes it and the nearest sizes that avoid it (ExplainPadding,
// device/xla_shape.h).
//
// Sizes are TSL's (common/human_bytes.h). Pure functions; thread-safe.

#ifndef TPUSHIM_DEVICE_HBM_REPORT_H_
#define TPUSHIM_DEVICE_HBM_REPORT_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "device/xla_shape.h"

namespace tpushim {

struct HbmBuffer {
  uint64_t padded_bytes = 0;    // its size in its layout (a byte buffer's size)
  uint64_t unpadded_bytes = 0;  // its data
  uint64_t held_bytes = 0;      // what the allocator holds for it (>= padded)
  std::optional<ArrayShape> shape;  // absent for a byte buffer
  std::string label;
  std::string op_metadata;
  bool failed_request = false;
};

// Buffers listed by name in the report.
inline constexpr int kHbmReportListed = 10;

// The report for `buffers` (the live buffers of one device and the request
// that failed) on a device of `capacity_bytes`. Lines end with '\n'.
std::string FormatHbmReport(uint64_t capacity_bytes,
                            absl::Span<const HbmBuffer> buffers,
                            int listed = kHbmReportListed);

// The same report for another memory space: `space` where the HBM report
// says "hbm" ("Ran out of memory in memory space pinned_host. Used ... of
// ... pinned_host. ...", "Largest program allocations in pinned_host:") and
// `what` where it says "device buffers" on its second line.
std::string FormatMemorySpaceReport(absl::string_view space,
                                    absl::string_view what,
                                    uint64_t capacity_bytes,
                                    absl::Span<const HbmBuffer> buffers,
                                    int listed = kHbmReportListed);

// The numbered list of the report, blank line first: `buffers[shown[0]]`
// as "  1. Size: ...", and so on, then "Where the padding comes from:"
// for those of them that are padded. For `tpushim memory`, which lists
// what a device held at its peak the same way.
std::string FormatHbmBufferList(absl::Span<const HbmBuffer> buffers,
                                absl::Span<const size_t> shown);

// The lines of one buffer as the list prints them, without the number:
// "Size: 14.00G\n     Shape: ...\n ...". `indent` goes before each line
// after the first. For `tpushim shape`, which prints them alone.
std::string FormatHbmBufferLines(const HbmBuffer& buffer,
                                 absl::string_view indent);

// "12.91G (12.8x expansion)": the padding of a buffer.
std::string FormatPaddingExtra(uint64_t padded_bytes, uint64_t unpadded_bytes);

}  // namespace tpushim

#endif  // TPUSHIM_DEVICE_HBM_REPORT_H_
