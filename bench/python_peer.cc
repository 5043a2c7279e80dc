// The C++ side of bench/python_bench.py: the same transfers the Python
// benchmark times, made through the C++ API, on request, so that the
// script can alternate Python and C++ rounds within one run (memory
// bandwidth on a shared VM drifts by tens of percent within seconds; a
// ratio is only fair within a round).
//
//   python_peer [--region=<bytes|512M>] [--device=<url>]
//
// It brings a System up (options as the Python side gives its own), prints
// "ready", then answers one command per line on stdin with one line of
// per-round times in nanoseconds:
//
//   put <xla shape> <rounds>  what tpushim.device_put does for a pinned
//                             host array: a buffer of the shape in device
//                             0's memory (AllocateInMemory) and the array's
//                             transfer from a PinnedHostBuffer
//                             (TransferArrayToDeviceWithEvents), ready
//                             awaited; the buffer is freed after each
//                             round, untimed (as `del` of the DeviceArray)
//   putp <xla shape> <rounds> the same from a pageable host array
//   rt <xla shape> <rounds>   round trip of a pageable host array: the
//                             same put, then TransferArrayFromDevice into
//                             another pageable array, both awaited
//   quit
//
// An array whose device image is its dense bytes goes by byte transfers
// (TransferToDeviceWithEvents / TransferFromDevice), others by array
// transfers, as device_put and device_get choose.
//
// Errors: a line "error: <status>" (and exit 1 for a start-up failure).

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "tpushim/system.h"

namespace {

using Clock = std::chrono::steady_clock;

int64_t Ns(Clock::duration d) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
}

bool ParseBytes(absl::string_view s, uint64_t* out) {
  uint64_t unit = 1;
  if (absl::ConsumeSuffix(&s, "G")) {
    unit = uint64_t{1} << 30;
  } else if (absl::ConsumeSuffix(&s, "M")) {
    unit = uint64_t{1} << 20;
  } else if (absl::ConsumeSuffix(&s, "K")) {
    unit = uint64_t{1} << 10;
  }
  uint64_t n = 0;
  if (!absl::SimpleAtoi(s, &n)) return false;
  *out = n * unit;
  return true;
}

// Whether `buffer`'s device image is its dense row-major array (no
// padding, row-major, one tile whose minor dimensions match the array's
// exactly and whose leading one divides it): device_put then sends the
// bytes as they are (a byte transfer) instead of an array transfer, and so
// does the peer. The rule of python/src/arrays.cc, DenseIsDeviceImage.
bool DenseIsDeviceImage(const tpushim::MemoryBuffer& buffer,
                        const std::vector<int64_t>& dims) {
  if (buffer.size() != buffer.host_size() ||
      buffer.unpadded_size() != buffer.host_size()) {
    return false;
  }
  const std::string text = buffer.shape();
  const size_t open = text.find('{');
  const size_t colon = text.find(':', open);
  const size_t close = text.find('}', open);
  if (open == std::string::npos || close != text.size() - 1) return false;
  std::string order;
  for (size_t i = dims.size(); i-- > 0;) {
    absl::StrAppend(&order, order.empty() ? "" : ",", i);
  }
  const size_t order_end = colon == std::string::npos ? close : colon;
  if (text.substr(open + 1, order_end - open - 1) != order) return false;
  if (colon == std::string::npos) return true;
  const std::string tiles = text.substr(colon + 1, close - colon - 1);
  if (tiles.size() < 4 || tiles.compare(0, 2, "T(") != 0 ||
      tiles.back() != ')' || tiles.find('(', 2) != std::string::npos) {
    return false;
  }
  std::vector<int64_t> tile;
  for (absl::string_view part : absl::StrSplit(
           absl::string_view(tiles).substr(2, tiles.size() - 3), ',')) {
    int64_t t = 0;
    if (!absl::SimpleAtoi(part, &t) || t <= 0) return false;
    tile.push_back(t);
  }
  if (tile.size() > dims.size()) return false;
  const size_t first = dims.size() - tile.size();
  for (size_t i = 0; i < tile.size(); ++i) {
    const int64_t dim = dims[first + i];
    if (i == 0 ? dim % tile[i] != 0 : dim != tile[i]) return false;
  }
  return true;
}

// The dimensions of an XLA shape string without a layout ("f32[64,128]").
std::vector<int64_t> DimsOf(const std::string& shape) {
  std::vector<int64_t> dims;
  const size_t open = shape.find('[');
  const size_t close = shape.find(']', open);
  if (open == std::string::npos || close == std::string::npos) return dims;
  for (absl::string_view part : absl::StrSplit(
           absl::string_view(shape).substr(open + 1, close - open - 1), ',',
           absl::SkipEmpty())) {
    int64_t d = 0;
    if (absl::SimpleAtoi(part, &d)) dims.push_back(d);
  }
  return dims;
}

// One round of `put` or `rt`: returns the time, or an error status.
absl::StatusOr<int64_t> Round(tpushim::System& system, const std::string& shape,
                              const void* src, void* back) {
  tpushim::DeviceBufferSpec spec;
  spec.shape = shape;
  const int memory =
      system.memory_of_kind(tpushim::MemoryKind::kDevice, /*device=*/0);
  const Clock::time_point start = Clock::now();
  absl::StatusOr<tpushim::MemoryBuffer> buffer =
      system.AllocateInMemory(memory, spec);
  if (!buffer.ok()) return buffer.status();
  const bool dense = DenseIsDeviceImage(*buffer, DimsOf(shape));
  absl::StatusOr<tpushim::TransferEvents> up =
      dense ? system.TransferToDeviceWithEvents(src, buffer->device_buffer(), 0,
                                                buffer->host_size())
            : system.TransferArrayToDeviceWithEvents(src,
                                                     buffer->device_buffer());
  absl::Status status = up.ok() ? up->ready.Await() : up.status();
  if (status.ok() && back != nullptr) {
    absl::StatusOr<tpushim::Event> down =
        dense ? system.TransferFromDevice(buffer->device_buffer(), 0, back,
                                          buffer->host_size())
              : system.TransferArrayFromDevice(buffer->device_buffer(), back);
    status = down.ok() ? down->Await() : down.status();
  }
  const int64_t ns = Ns(Clock::now() - start);
  absl::StatusOr<tpushim::Event> freed = system.Free(*buffer);
  if (freed.ok()) freed->Await().IgnoreError();
  if (!status.ok()) return status;
  return ns;
}

}  // namespace

int main(int argc, char** argv) {
  tpushim::OptionOverrides overrides;
  uint64_t region = uint64_t{512} << 20;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg(argv[i]);
    if (absl::ConsumePrefix(&arg, "--region=")) {
      if (!ParseBytes(arg, &region)) {
        std::fprintf(stderr, "python_peer: bad --region=%s\n", argv[i] + 9);
        return 2;
      }
    } else if (absl::ConsumePrefix(&arg, "--device=")) {
      overrides.device = std::string(arg);
    } else {
      std::fprintf(stderr, "python_peer: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  overrides.premapped_buffer_size = region;
  absl::StatusOr<std::unique_ptr<tpushim::System>> system =
      tpushim::System::Create(overrides);
  if (!system.ok()) {
    std::printf("error: %s\n", system.status().ToString().c_str());
    return 1;
  }
  std::printf("ready\n");
  std::fflush(stdout);

  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string command, shape;
    int rounds = 0;
    in >> command;
    if (command == "quit") break;
    in >> shape >> rounds;
    if ((command != "put" && command != "putp" && command != "rt") ||
        shape.empty() || rounds < 1) {
      std::printf("error: expected put|putp|rt <shape> <rounds>, got \"%s\"\n",
                  line.c_str());
      std::fflush(stdout);
      continue;
    }
    // The host array's bytes: from a buffer of the shape's dense size.
    tpushim::DeviceBufferSpec spec;
    spec.shape = shape;
    absl::StatusOr<tpushim::DeviceBuffer> probe =
        (*system)->AllocateDevice(0, spec);
    if (!probe.ok()) {
      std::printf("error: %s\n", probe.status().ToString().c_str());
      std::fflush(stdout);
      continue;
    }
    const uint64_t host_bytes = probe->host_size();
    (*system)->Deallocate(*probe)->Await().IgnoreError();

    tpushim::PinnedHostBuffer pinned;
    std::vector<char> pageable, back;
    const void* src = nullptr;
    if (command == "put") {
      absl::StatusOr<tpushim::PinnedHostBuffer> p =
          (*system)->AllocatePinnedHost(host_bytes);
      if (!p.ok()) {
        std::printf("error: %s\n", p.status().ToString().c_str());
        std::fflush(stdout);
        continue;
      }
      pinned = std::move(*p);
      std::memset(pinned.data(), 1, host_bytes);
      src = pinned.data();
    } else {
      pageable.assign(host_bytes, 1);
      if (command == "rt") back.assign(host_bytes, 0);
      src = pageable.data();
    }
    std::string out;
    for (int r = 0; r < rounds; ++r) {
      absl::StatusOr<int64_t> ns =
          Round(**system, shape, src, back.empty() ? nullptr : back.data());
      if (!ns.ok()) {
        out = "error: " + ns.status().ToString();
        break;
      }
      out += (r ? " " : "") + std::to_string(*ns);
    }
    std::printf("%s\n", out.c_str());
    std::fflush(stdout);
  }
  return 0;
}
