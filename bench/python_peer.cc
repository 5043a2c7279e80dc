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
//                             round, untimed and not awaited (as `del` of
//                             the DeviceArray)
//   putp <xla shape> <rounds> the same from a pageable host array
//   rt <xla shape> <rounds>   round trip of a pageable host array: the
//                             same put, then TransferArrayFromDevice into
//                             another pageable array, both awaited
//   quit
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
  absl::StatusOr<tpushim::TransferEvents> up =
      system.TransferArrayToDeviceWithEvents(src, buffer->device_buffer());
  absl::Status status = up.ok() ? up->ready.Await() : up.status();
  if (status.ok() && back != nullptr) {
    absl::StatusOr<tpushim::Event> down =
        system.TransferArrayFromDevice(buffer->device_buffer(), back);
    status = down.ok() ? down->Await() : down.status();
  }
  const int64_t ns = Ns(Clock::now() - start);
  // Freed as `del` of the DeviceArray frees it: untimed and not awaited,
  // so its work overlaps the next round on both sides alike (awaiting it
  // here made the C++ rounds quieter than the Python ones).
  system.Free(*buffer).IgnoreError();
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
