#include "device/hbm_report.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/human_bytes.h"
#include "common/saturating.h"

namespace tpushim {
namespace {

double Percent(uint64_t part, uint64_t whole) {
  return whole == 0
             ? 0.0
             : 100.0 * static_cast<double>(part) / static_cast<double>(whole);
}

}  // namespace

std::string FormatPaddingExtra(uint64_t padded_bytes, uint64_t unpadded_bytes) {
  const uint64_t extra =
      padded_bytes > unpadded_bytes ? padded_bytes - unpadded_bytes : 0;
  if (unpadded_bytes == 0) {
    return absl::StrCat(HumanReadableBytes(extra), " (no data)");
  }
  return absl::StrFormat(
      "%s (%.1fx expansion)", HumanReadableBytes(extra),
      static_cast<double>(padded_bytes) / static_cast<double>(unpadded_bytes));
}

std::string FormatHbmBufferLines(const HbmBuffer& b, absl::string_view indent) {
  std::string out = absl::StrCat("Size: ", HumanReadableBytes(b.padded_bytes));
  if (!b.op_metadata.empty()) {
    absl::StrAppend(&out, "\n", indent, "Operator: ", b.op_metadata);
  }
  if (b.shape.has_value()) {
    absl::StrAppend(&out, "\n", indent, "Shape: ", ToString(*b.shape));
  }
  absl::StrAppend(&out, "\n", indent,
                  "Unpadded size: ", HumanReadableBytes(b.unpadded_bytes));
  // As XLA: no line when there is no padding.
  if (b.padded_bytes > b.unpadded_bytes) {
    absl::StrAppend(&out, "\n", indent, "Extra memory due to padding: ",
                    FormatPaddingExtra(b.padded_bytes, b.unpadded_bytes));
  }
  return out;
}

std::string FormatHbmReport(uint64_t capacity_bytes,
                            absl::Span<const HbmBuffer> buffers, int listed) {
  return FormatMemorySpaceReport("hbm", "device buffers", capacity_bytes,
                                 buffers, listed);
}

std::string FormatMemorySpaceReport(absl::string_view space,
                                    absl::string_view what,
                                    uint64_t capacity_bytes,
                                    absl::Span<const HbmBuffer> buffers,
                                    int listed) {
  uint64_t used = 0;
  uint64_t padded = 0;
  uint64_t unpadded = 0;
  for (const HbmBuffer& b : buffers) {
    used = SaturatingAdd(used, std::max(b.held_bytes, b.padded_bytes));
    padded = SaturatingAdd(padded, b.padded_bytes);
    unpadded = SaturatingAdd(unpadded, b.unpadded_bytes);
  }
  const uint64_t fragmentation = used > padded ? used - padded : 0;
  std::string out =
      absl::StrCat("Ran out of memory in memory space ", space, ". Used ",
                   HumanReadableBytes(used), " of ",
                   HumanReadableBytes(capacity_bytes), " ", space, ". ");
  const HbmBuffer* request = nullptr;
  for (const HbmBuffer& b : buffers) {
    if (b.failed_request) request = &b;
  }
  if (used > capacity_bytes) {
    absl::StrAppend(&out, "Exceeded ", space, " capacity by ",
                    HumanReadableBytes(used - capacity_bytes), ".\n");
  } else {
    absl::StrAppend(
        &out, "Within ", space, " capacity, but no free block of ",
        HumanReadableBytes(request != nullptr ? std::max(request->held_bytes,
                                                         request->padded_bytes)
                                              : 0),
        " is left: the free memory is fragmented.\n");
  }
  absl::StrAppendFormat(
      &out,
      "    %s %s (%.1f%% utilization: Unpadded (%s) Padded (%s), "
      "%.1f%% fragmentation (%s))\n",
      what, HumanReadableBytes(used), Percent(unpadded, padded),
      HumanReadableBytes(unpadded), HumanReadableBytes(padded),
      Percent(fragmentation, used), HumanReadableBytes(fragmentation));

  // Largest first; the request before a live buffer of its size, then the
  // older buffer (the order given).
  std::vector<size_t> order(buffers.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (buffers[a].padded_bytes != buffers[b].padded_bytes) {
      return buffers[a].padded_bytes > buffers[b].padded_bytes;
    }
    return buffers[a].failed_request && !buffers[b].failed_request;
  });
  std::vector<size_t> shown(
      order.begin(),
      order.begin() + std::min<size_t>(order.size(), std::max(listed, 1)));
  if (request != nullptr) {
    const size_t r = static_cast<size_t>(request - buffers.data());
    if (std::find(shown.begin(), shown.end(), r) == shown.end()) {
      shown.back() = r;
    }
  }
  absl::StrAppend(&out, "Largest program allocations in ", space, ":\n",
                  FormatHbmBufferList(buffers, shown));
  return out;
}

std::string FormatHbmBufferList(absl::Span<const HbmBuffer> buffers,
                                absl::Span<const size_t> shown) {
  std::string out;
  std::vector<std::string> hints;
  for (size_t i = 0; i < shown.size(); ++i) {
    const HbmBuffer& b = buffers[shown[i]];
    const std::string number = absl::StrCat(i + 1, ". ");
    const std::string indent(2 + number.size(), ' ');
    absl::StrAppend(&out, "\n  ", number, FormatHbmBufferLines(b, indent),
                    "\n");
    absl::StrAppend(&out, indent,
                    "XLA label: ", b.label.empty() ? "(none)" : b.label, "\n");
    absl::StrAppend(&out, indent, "Allocation type: ",
                    b.failed_request ? "failed request" : "live buffer", "\n");
    absl::StrAppend(&out, indent, "==========================\n");
    if (b.shape.has_value() && b.padded_bytes > b.unpadded_bytes) {
      const PaddingHint hint = ExplainPadding(*b.shape);
      hints.push_back(absl::StrCat("  ", i + 1, ". ", ToString(*b.shape), ": ",
                                   hint.text, "\n"));
    }
  }
  if (!hints.empty()) {
    absl::StrAppend(&out, "\nWhere the padding comes from:\n");
    for (const std::string& h : hints) absl::StrAppend(&out, h);
  }
  return out;
}

}  // namespace tpushim
