#include "tools/bench/bench.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <ostream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/human_bytes.h"
#include "common/status_macros.h"
#include "env/device_url.h"
#include "env/options.h"
#include "logging/log.h"
#include "nlohmann/json.hpp"
#include "tools/cli/flags.h"
#include "tools/cli/interrupt.h"
#include "tools/cli/progress.h"
#include "tools/cli/text_table.h"
#include "tpushim/system.h"
#include "tpushim/transfer.h"

namespace tpushim::tools {
namespace {

using Json = nlohmann::ordered_json;

constexpr char kBenchDescription[] =
    "Measure transfer throughput and latency per direction, path and size "
    "against this machine's memcpy";

constexpr char kBenchFooter[] = R"footer(
Brings the runtime up from the environment exactly as a framework would
(TPU_PREMAPPED_BUFFER_SIZE, TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES,
TPUSHIM_DEVICE, ...) and times transfers one at a time (submit, await) for
--seconds per cell: h2d and d2h on each path, and d2d, at each size. The
reference is one thread's memcpy between warm buffers of the largest size
(at most 256M), measured in the same run.

Paths: zero_copy = a pinned host buffer from the premapped region (size <=
threshold); staged = pageable memory, size <= threshold (with the region
off: size <= 1M, through the runtime's bounce pool); pinned = pageable
memory, size > threshold (region off: size > 1M). A cell the configuration cannot
measure (other side of the threshold, region off, region or HBM too small)
is skipped with a reason, not an error. d2d has no path: null in JSON, "-"
in tables and CSV.

Figures: gbps = bytes / median submit-to-ready time (1 GB = 1e9 bytes);
p50_us, p99_us = submit-to-ready percentiles; vs_memcpy = gbps /
memcpy_gbps.

--json: {"memcpy_gbps", "memcpy_bytes",
         "config": {"premapped_bytes", "threshold_bytes", "device",
                    "device_index", "hbm_bytes", "seconds_per_cell"},
         "rows": [{"direction": "h2d"|"d2h"|"d2d",
                   "path": "zero_copy"|"staged"|"pinned", null for d2d,
                   "bytes", "gbps", "p50_us", "p99_us", "vs_memcpy",
                   "iterations"}],
         "skipped": [{"direction", "path", "bytes", "reason"}],
         "partial": false, "interrupted_by": null}
--csv: direction,path,bytes,gbps,vs_memcpy,p50_us,p99_us,iterations,
       skipped_reason (a skipped cell has its reason there and no figures)
SIGINT or SIGTERM stops at the cell being measured: the cells measured so
far are printed, the others skipped with the reason "interrupted" (JSON
"partial": true, "interrupted_by"), and the exit status is 130 or 143.
A progress bar goes to stderr only when it is a terminal.

Exit status: 0 when every cell was measured or skipped; 1 when a transfer
failed or the runtime cannot start; 2 for a bad command line or an invalid
configuration.

Examples:
  tpushim bench
  tpushim bench --sizes 4K,1M --directions h2d --seconds 1
  TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES=1048576 tpushim bench
  TPU_PREMAPPED_BUFFER_SIZE=0 tpushim bench --paths staged,pinned  # region off
  tpushim bench --json | jq '.rows[] | select(.path == "staged")'
  tpushim bench --csv > transfers.csv)footer";

constexpr char kDefaultSizes[] = "4K,64K,1M,16M,256M";
constexpr char kDefaultDirections[] = "h2d,d2h,d2d";
constexpr char kDefaultPaths[] = "zero_copy,staged,pinned";
constexpr double kDefaultSeconds = 0.2;
constexpr uint64_t kMaxSize = uint64_t{4} << 30;
constexpr uint64_t kMaxMemcpyBytes = uint64_t{256} << 20;
constexpr int kMinIterations = 3;
// Keeps the latency vector bounded for tiny transfers and long --seconds.
constexpr size_t kMaxIterations = size_t{4} << 20;
constexpr size_t kPinnedAlignment = 4096;
constexpr char kCsvHeader[] =
    "direction,path,bytes,gbps,vs_memcpy,p50_us,p99_us,iterations,"
    "skipped_reason";

constexpr DmaDirection kDirections[] = {DmaDirection::kHostToDevice,
                                        DmaDirection::kDeviceToHost,
                                        DmaDirection::kDeviceToDevice};
constexpr TransferPath kPaths[] = {
    TransferPath::kZeroCopy, TransferPath::kStaged, TransferPath::kPinned};

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// ---- Flags
// -------------------------------------------------------------------

struct BenchFlags {
  std::string sizes = kDefaultSizes;
  std::string directions = kDefaultDirections;
  std::string paths = kDefaultPaths;
  double seconds = kDefaultSeconds;
  int device = 0;
  bool json = false;
  bool csv = false;
};

// Sizes ascending, without duplicates.
absl::StatusOr<std::vector<uint64_t>> ParseSizes(absl::string_view text) {
  std::vector<uint64_t> sizes;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    absl::StatusOr<uint64_t> bytes = ParseByteSize(item, "--sizes");
    if (!bytes.ok()) return bytes.status();
    if (*bytes == 0 || *bytes > kMaxSize) {
      return absl::InvalidArgumentError(
          absl::StrCat("--sizes=\"", item, "\" is out of range [1, 4G]"));
    }
    sizes.push_back(*bytes);
  }
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  return sizes;
}

// The names in `text` (comma-separated) as indices into `names`, in the
// order of `names`.
template <typename T, size_t N>
absl::StatusOr<std::vector<T>> ParseNames(absl::string_view text,
                                          absl::string_view flag,
                                          const T (&all)[N],
                                          absl::string_view (*name)(T)) {
  std::vector<bool> chosen(N, false);
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    bool found = false;
    for (size_t i = 0; i < N; ++i) {
      if (item == name(all[i])) {
        chosen[i] = true;
        found = true;
      }
    }
    if (!found) {
      std::vector<std::string> valid;
      for (const T& t : all) valid.emplace_back(name(t));
      return absl::InvalidArgumentError(
          absl::StrCat(flag, "=\"", text, "\": unknown name \"", item,
                       "\" (valid: ", absl::StrJoin(valid, ","), ")"));
    }
  }
  std::vector<T> out;
  for (size_t i = 0; i < N; ++i) {
    if (chosen[i]) out.push_back(all[i]);
  }
  return out;
}

absl::StatusOr<std::vector<DmaDirection>> ParseDirections(
    absl::string_view text) {
  return ParseNames(text, "--directions", kDirections, &DmaDirectionName);
}
absl::StatusOr<std::vector<TransferPath>> ParsePaths(absl::string_view text) {
  return ParseNames(text, "--paths", kPaths, &TransferPathName);
}

// ---- Results
// -----------------------------------------------------------------

struct Cell {
  DmaDirection direction = DmaDirection::kHostToDevice;
  std::optional<TransferPath> path;  // nullopt for d2d
  uint64_t bytes = 0;

  auto Key() const {
    return std::make_tuple(static_cast<int>(direction),
                           path.has_value() ? static_cast<int>(*path) : -1,
                           bytes);
  }
  std::string Name() const {
    return absl::StrCat(DmaDirectionName(direction), " ",
                        path.has_value() ? TransferPathName(*path) : "",
                        path.has_value() ? " " : "", SizeName(bytes));
  }
};

struct Row {
  Cell cell;
  double gbps = 0;
  double p50_us = 0;
  double p99_us = 0;
  uint64_t iterations = 0;
};

struct Skip {
  Cell cell;
  std::string reason;
};

struct Results {
  double memcpy_gbps = 0;
  uint64_t memcpy_bytes = 0;
  uint64_t premapped_bytes = 0;
  uint64_t threshold_bytes = 0;
  std::string device_url;
  int device_index = 0;
  std::string device_name;
  uint64_t hbm_bytes = 0;
  double link_gbps = 0;
  double seconds = 0;
  std::vector<Row> rows;
  std::vector<Skip> skipped;
  int interrupted_by = 0;  // SIGINT or SIGTERM stopped the run, else 0

  double VsMemcpy(const Row& row) const {
    return memcpy_gbps > 0 ? row.gbps / memcpy_gbps : 0.0;
  }
};

// Nearest-rank percentile of sorted `v` (not empty).
double Percentile(const std::vector<double>& sorted, double p) {
  const size_t rank =
      static_cast<size_t>(std::ceil(p * static_cast<double>(sorted.size())));
  return sorted[std::clamp<size_t>(rank, 1, sorted.size()) - 1];
}

// ---- Measuring
// -----------------------------------------------------------------

// Host memory that is not from the region, with every page touched,
// 64-byte aligned as frameworks' allocators hand it over (PyTorch's CPU
// allocator, NumPy's). A plain new[] of a large size sits 16 bytes past a
// page boundary, off the cache-line phase of the device's memory, and on
// some CPUs that alone halves the simulated device's copy into it
// (docs/performance.md#pinned-transfers).
struct HeapBuffer {
  struct Delete {
    void operator()(char* p) const {
      ::operator delete[](p, std::align_val_t{kHostAlignment});
    }
  };
  static constexpr size_t kHostAlignment = 64;
  std::unique_ptr<char[], Delete> data;
  uint64_t size = 0;

  static std::optional<HeapBuffer> Make(uint64_t n, char fill) {
    HeapBuffer b;
    b.data.reset(static_cast<char*>(
        ::operator new[](n, std::align_val_t{kHostAlignment}, std::nothrow)));
    if (b.data == nullptr) return std::nullopt;
    std::memset(b.data.get(), fill, n);
    b.size = n;
    return b;
  }
};

// Keeps the compiler from dropping a copy into memory nobody reads.
inline void Clobber(void* p) { asm volatile("" : : "r"(p) : "memory"); }

// Samples (GB/s) of one-thread memcpy of `n` bytes between warm buffers,
// for about `seconds` and at least kMinIterations.
absl::StatusOr<std::vector<double>> MemcpySamples(uint64_t n, double seconds) {
  std::optional<HeapBuffer> a = HeapBuffer::Make(n, 1);
  std::optional<HeapBuffer> b = HeapBuffer::Make(n, 2);
  if (!a.has_value() || !b.has_value()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot allocate two host buffers of ", n, " bytes for memcpy"));
  }
  std::memcpy(b->data.get(), a->data.get(), n);  // warm-up
  Clobber(b->data.get());
  std::vector<double> gbps;
  const Clock::time_point start = Clock::now();
  while (static_cast<int>(gbps.size()) < kMinIterations ||
         SecondsSince(start) < seconds) {
    const Clock::time_point t0 = Clock::now();
    std::memcpy(b->data.get(), a->data.get(), n);
    Clobber(b->data.get());
    gbps.push_back(static_cast<double>(n) / SecondsSince(t0) / 1e9);
  }
  return gbps;
}

// Times `submit` + Await repeatedly (one untimed first).
absl::StatusOr<Row> Measure(
    const Cell& cell, double seconds,
    const std::function<absl::StatusOr<Event>()>& submit) {
  auto once = [&submit]() -> absl::Status {
    absl::StatusOr<Event> event = submit();
    if (!event.ok()) return event.status();
    return event->Await();
  };
  if (absl::Status s = once(); !s.ok()) return s;
  std::vector<double> us;
  const Clock::time_point start = Clock::now();
  while ((static_cast<int>(us.size()) < kMinIterations ||
          SecondsSince(start) < seconds) &&
         us.size() < kMaxIterations) {
    if (InterruptSignal() != 0) return absl::CancelledError("interrupted");
    const Clock::time_point t0 = Clock::now();
    if (absl::Status s = once(); !s.ok()) return s;
    us.push_back(SecondsSince(t0) * 1e6);
  }
  std::sort(us.begin(), us.end());
  Row row;
  row.cell = cell;
  row.iterations = us.size();
  row.p50_us = Percentile(us, 0.5);
  row.p99_us = Percentile(us, 0.99);
  row.gbps = row.p50_us > 0
                 ? static_cast<double>(cell.bytes) / (row.p50_us * 1e-6) / 1e9
                 : 0.0;
  return row;
}

// Why `path` cannot carry a host transfer of `n` bytes in this
// configuration, or nullopt when it can.
std::optional<std::string> WhyNot(TransferPath path, uint64_t n,
                                  uint64_t region, uint64_t threshold) {
  const std::string t =
      absl::StrCat("the transfer threshold (", SizeName(threshold), ")");
  switch (path) {
    case TransferPath::kZeroCopy:
      if (region == 0) {
        return "the premapped region is off (TPU_PREMAPPED_BUFFER_SIZE=0): "
               "no pinned host buffers";
      }
      if (n > threshold) {
        return absl::StrCat("above ", t,
                            ": pinned host buffers are limited to it");
      }
      return std::nullopt;
    case TransferPath::kStaged:
      if (region == 0 && n > kBounceMaxBytes) {
        return absl::StrCat(
            "the premapped region is off (TPU_PREMAPPED_BUFFER_SIZE=0) and it "
            "is above the bounce pool's ",
            SizeName(kBounceMaxBytes),
            ": pageable memory takes the pinned path");
      }
      if (region == 0) return std::nullopt;  // through the bounce pool
      if (n > threshold) {
        return absl::StrCat("above ", t,
                            ": pageable memory takes the pinned path");
      }
      return std::nullopt;
    case TransferPath::kPinned:
      if (region == 0 && n <= kBounceMaxBytes) {
        return absl::StrCat(
            "the premapped region is off (TPU_PREMAPPED_BUFFER_SIZE=0) and it "
            "is at or below ",
            SizeName(kBounceMaxBytes),
            ": pageable memory is staged through the bounce pool");
      }
      if (region != 0 && n <= threshold) {
        return absl::StrCat("at or below ", t,
                            ": pageable memory takes the staged path");
      }
      return std::nullopt;
  }
  return std::nullopt;
}

class Bench {
 public:
  Bench(System& system, int device, double seconds,
        const std::vector<uint64_t>& sizes,
        const std::vector<DmaDirection>& directions,
        const std::vector<TransferPath>& paths, Results& results,
        ProgressBar& progress)
      : system_(system),
        device_(device),
        seconds_(seconds),
        sizes_(sizes),
        directions_(directions),
        paths_(paths),
        results_(results),
        progress_(progress) {}

  static int CellsPerSize(const std::vector<DmaDirection>& directions,
                          const std::vector<TransferPath>& paths) {
    int cells = 0;
    for (DmaDirection d : directions) {
      cells += d == DmaDirection::kDeviceToDevice
                   ? 1
                   : static_cast<int>(paths.size());
    }
    return cells;
  }

  // Measures every cell; an error is a failed transfer.
  absl::Status Run() {
    for (uint64_t n : sizes_) TPUSHIM_RETURN_IF_ERROR(RunSize(n));
    return absl::OkStatus();
  }

 private:
  std::vector<Cell> CellsOf(uint64_t n) const {
    std::vector<Cell> cells;
    for (DmaDirection d : directions_) {
      if (d == DmaDirection::kDeviceToDevice) {
        cells.push_back({d, std::nullopt, n});
        continue;
      }
      for (TransferPath p : paths_) cells.push_back({d, p, n});
    }
    return cells;
  }

  void Done(const Cell& cell) { progress_.Show(++done_, cell.Name()); }
  void SkipCell(const Cell& cell, std::string reason) {
    results_.skipped.push_back({cell, std::move(reason)});
    Done(cell);
  }

  absl::Status Record(const Cell& cell,
                      const std::function<absl::StatusOr<Event>()>& submit) {
    absl::StatusOr<Row> row = Measure(cell, seconds_, submit);
    if (absl::IsCancelled(row.status()) && InterruptSignal() != 0) {
      SkipCell(cell, "interrupted");
      return absl::OkStatus();
    }
    if (!row.ok()) {
      return absl::Status(
          row.status().code(),
          absl::StrCat(cell.Name(), ": ", row.status().message()));
    }
    results_.rows.push_back(*row);
    Done(cell);
    return absl::OkStatus();
  }

  // A device buffer of `n` bytes, written once so its pages exist.
  absl::StatusOr<DeviceBuffer> WarmDeviceBuffer(uint64_t n,
                                                const HeapBuffer& host) {
    TPUSHIM_ASSIGN_OR_RETURN(DeviceBuffer buffer,
                             system_.AllocateDevice(device_, n));
    absl::StatusOr<Event> up =
        system_.TransferToDevice(host.data.get(), buffer, 0, n);
    absl::Status status = up.ok() ? up->Await() : up.status();
    if (!status.ok()) {
      Free(buffer);
      return absl::Status(status.code(), absl::StrCat("warming device memory: ",
                                                      status.message()));
    }
    return buffer;
  }

  void Free(const DeviceBuffer& buffer) {
    if (!buffer.valid()) return;
    absl::StatusOr<Event> freed = system_.Deallocate(buffer);
    if (freed.ok()) (void)freed->Await();
  }

  absl::Status RunSize(uint64_t n) {
    const std::vector<Cell> cells = CellsOf(n);
    if (cells.empty()) return absl::OkStatus();
    if (InterruptSignal() != 0) {
      for (const Cell& c : cells) SkipCell(c, "interrupted");
      return absl::OkStatus();
    }
    const uint64_t region = system_.premapped_bytes();
    const uint64_t threshold = system_.transfer_threshold_bytes();

    // Host memory that is not from the region: the source of the warm-up
    // and of the staged and pinned cells.
    std::optional<HeapBuffer> heap = HeapBuffer::Make(n, 3);
    if (!heap.has_value()) {
      for (const Cell& c : cells) {
        SkipCell(c, "the host cannot allocate pageable memory of this size");
      }
      return absl::OkStatus();
    }
    absl::StatusOr<DeviceBuffer> dev = WarmDeviceBuffer(n, *heap);
    if (!dev.ok()) {
      if (!absl::IsResourceExhausted(dev.status())) return dev.status();
      for (const Cell& c : cells) {
        SkipCell(c, absl::StrCat("device ", device_,
                                 " cannot hold a buffer of this size: ",
                                 dev.status().message()));
      }
      return absl::OkStatus();
    }
    absl::Status status = RunCells(cells, n, region, threshold, *heap, *dev);
    Free(*dev);
    return status;
  }

  absl::Status RunCells(const std::vector<Cell>& cells, uint64_t n,
                        uint64_t region, uint64_t threshold, HeapBuffer& heap,
                        const DeviceBuffer& dev) {
    PinnedHostBuffer pinned;
    std::string pinned_error;  // why there is no pinned host buffer
    bool pinned_tried = false;
    for (const Cell& cell : cells) {
      if (InterruptSignal() != 0) {
        SkipCell(cell, "interrupted");
        continue;
      }
      if (!cell.path.has_value()) {
        TPUSHIM_RETURN_IF_ERROR(RunDeviceToDevice(cell, n, heap, dev));
        continue;
      }
      if (std::optional<std::string> why =
              WhyNot(*cell.path, n, region, threshold)) {
        SkipCell(cell, *why);
        continue;
      }
      void* host = heap.data.get();
      if (*cell.path == TransferPath::kZeroCopy) {
        if (!pinned_tried) {
          pinned_tried = true;
          absl::StatusOr<PinnedHostBuffer> p =
              system_.AllocatePinnedHost(n, kPinnedAlignment);
          if (p.ok()) {
            pinned = *std::move(p);
            std::memset(pinned.data(), 4, n);
          } else {
            pinned_error = absl::StrCat(
                "the premapped region cannot hold a pinned host buffer of "
                "this size: ",
                p.status().message());
          }
        }
        if (!pinned) {
          SkipCell(cell, pinned_error);
          continue;
        }
        host = pinned.data();
      }
      const TransferPath actual = system_.PathFor(host, n);
      if (actual != *cell.path) {
        SkipCell(cell, absl::StrCat("the runtime would take the ",
                                    TransferPathName(actual), " path"));
        continue;
      }
      if (cell.direction == DmaDirection::kHostToDevice) {
        TPUSHIM_RETURN_IF_ERROR(Record(
            cell, [&] { return system_.TransferToDevice(host, dev, 0, n); }));
      } else {
        TPUSHIM_RETURN_IF_ERROR(Record(
            cell, [&] { return system_.TransferFromDevice(dev, 0, host, n); }));
      }
    }
    return absl::OkStatus();
  }

  absl::Status RunDeviceToDevice(const Cell& cell, uint64_t n,
                                 const HeapBuffer& heap,
                                 const DeviceBuffer& src) {
    absl::StatusOr<DeviceBuffer> dst = WarmDeviceBuffer(n, heap);
    if (!dst.ok()) {
      if (!absl::IsResourceExhausted(dst.status())) return dst.status();
      SkipCell(cell, absl::StrCat("device ", device_,
                                  " cannot hold two buffers of this size: ",
                                  dst.status().message()));
      return absl::OkStatus();
    }
    absl::Status status = Record(cell, [&] {
      return system_.TransferDeviceToDevice(src, 0, *dst, 0, n);
    });
    Free(*dst);
    return status;
  }

  System& system_;
  const int device_;
  const double seconds_;
  const std::vector<uint64_t>& sizes_;
  const std::vector<DmaDirection>& directions_;
  const std::vector<TransferPath>& paths_;
  Results& results_;
  ProgressBar& progress_;
  int done_ = 0;
};

// ---- Output
// ----------------------------------------------------------------------

Json PathJson(const Cell& cell) {
  return cell.path.has_value() ? Json(TransferPathName(*cell.path))
                               : Json(nullptr);
}

Json ResultsJson(const Results& r) {
  Json rows = Json::array();
  for (const Row& row : r.rows) {
    rows.push_back({{"direction", DmaDirectionName(row.cell.direction)},
                    {"path", PathJson(row.cell)},
                    {"bytes", row.cell.bytes},
                    {"gbps", row.gbps},
                    {"p50_us", row.p50_us},
                    {"p99_us", row.p99_us},
                    {"vs_memcpy", r.VsMemcpy(row)},
                    {"iterations", row.iterations}});
  }
  Json skipped = Json::array();
  for (const Skip& s : r.skipped) {
    skipped.push_back({{"direction", DmaDirectionName(s.cell.direction)},
                       {"path", PathJson(s.cell)},
                       {"bytes", s.cell.bytes},
                       {"reason", s.reason}});
  }
  return {
      {"memcpy_gbps", r.memcpy_gbps},
      {"memcpy_bytes", r.memcpy_bytes},
      {"config",
       {{"premapped_bytes", r.premapped_bytes},
        {"threshold_bytes", r.threshold_bytes},
        {"device", r.device_url},
        {"device_index", r.device_index},
        {"hbm_bytes", r.hbm_bytes},
        {"seconds_per_cell", r.seconds}}},
      {"rows", std::move(rows)},
      {"skipped", std::move(skipped)},
      {"partial", r.interrupted_by != 0},
      {"interrupted_by", r.interrupted_by != 0
                             ? Json(InterruptSignalName(r.interrupted_by))
                             : Json(nullptr)},
  };
}

// `text` as one CSV field: quoted (with quotes doubled) when it holds a
// comma, a quote or a line break.
std::string CsvField(absl::string_view text) {
  if (text.find_first_of(",\"\n\r") == absl::string_view::npos) {
    return std::string(text);
  }
  return absl::StrCat("\"", absl::StrReplaceAll(text, {{"\"", "\"\""}}), "\"");
}

void PrintCsv(const Results& r, std::ostream& out) {
  out << kCsvHeader << "\n";
  for (const Row& row : r.rows) {
    out << absl::StrFormat(
        "%s,%s,%d,%.4f,%.4f,%.2f,%.2f,%d,\n",
        DmaDirectionName(row.cell.direction),
        row.cell.path.has_value() ? TransferPathName(*row.cell.path) : "-",
        row.cell.bytes, row.gbps, r.VsMemcpy(row), row.p50_us, row.p99_us,
        row.iterations);
  }
  for (const Skip& skip : r.skipped) {
    out << absl::StrFormat(
        "%s,%s,%d,,,,,,%s\n", DmaDirectionName(skip.cell.direction),
        skip.cell.path.has_value() ? TransferPathName(*skip.cell.path) : "-",
        skip.cell.bytes, CsvField(skip.reason));
  }
}

std::string Latency(double us) {
  if (us >= 10000) return absl::StrFormat("%.1f ms", us / 1000);
  if (us >= 1000) return absl::StrFormat("%.2f ms", us / 1000);
  return absl::StrFormat("%.1f us", us);
}

void PrintTable(const Results& r, std::ostream& out) {
  out << "tpushim bench: device " << r.device_index << " (" << r.device_name
      << ", " << HumanReadableBytes(r.hbm_bytes) << " HBM, "
      << (r.link_gbps > 0 ? absl::StrFormat("%g Gb/s link", r.link_gbps)
                          : std::string("unthrottled link"))
      << ") of " << r.device_url << "\n";
  if (r.premapped_bytes == 0) {
    out << "premapped region: off (TPU_PREMAPPED_BUFFER_SIZE=0)";
  } else {
    out << "premapped region: " << BytesWithHumanReadable(r.premapped_bytes)
        << ", transfer threshold " << BytesWithHumanReadable(r.threshold_bytes);
  }
  out << "; " << absl::StrFormat("%g", r.seconds)
      << " s per cell, one transfer at a time\n";
  out << absl::StrFormat("memcpy (one thread, %s, warm buffers): %.2f GB/s\n\n",
                         SizeName(r.memcpy_bytes), r.memcpy_gbps);

  TextTable table(
      {"DIRECTION", "PATH", "SIZE", "GB/s", "vs-memcpy", "p50", "p99"});
  for (const Row& row : r.rows) {
    table.AddRow({std::string(DmaDirectionName(row.cell.direction)),
                  row.cell.path.has_value()
                      ? std::string(TransferPathName(*row.cell.path))
                      : "-",
                  SizeName(row.cell.bytes), absl::StrFormat("%.2f", row.gbps),
                  absl::StrFormat("%.2f", r.VsMemcpy(row)), Latency(row.p50_us),
                  Latency(row.p99_us)});
  }
  if (r.rows.empty()) {
    out << "  (no cell could be measured)\n";
  } else {
    table.Print(out);
  }

  if (!r.skipped.empty()) {
    // One line per direction, path and reason, listing the sizes.
    out << "\nSkipped:\n";
    std::vector<std::pair<std::string, std::vector<std::string>>> groups;
    for (const Skip& s : r.skipped) {
      const std::string head = absl::StrCat(
          DmaDirectionName(s.cell.direction), " ",
          s.cell.path.has_value() ? TransferPathName(*s.cell.path) : "-");
      const std::string key = absl::StrCat(head, "\t", s.reason);
      auto it = std::find_if(groups.begin(), groups.end(),
                             [&](const auto& g) { return g.first == key; });
      if (it == groups.end()) {
        groups.emplace_back(key, std::vector<std::string>{});
        it = groups.end() - 1;
      }
      it->second.push_back(SizeName(s.cell.bytes));
    }
    for (const auto& [key, sizes] : groups) {
      const size_t tab = key.find('\t');
      out << "  " << key.substr(0, tab) << " " << absl::StrJoin(sizes, ",")
          << ": " << key.substr(tab + 1) << "\n";
    }
  }
  if (r.interrupted_by != 0) {
    out << "\nInterrupted by " << InterruptSignalName(r.interrupted_by)
        << ": the cells above are the ones measured before it; the rest are "
           "skipped.\n";
  }
  out << "\nGB/s = bytes / median submit-to-ready time (1 GB = 1e9 bytes); "
         "vs-memcpy = GB/s / memcpy GB/s.\n";
}

// ---- The command
// -------------------------------------------------------------------

void RunBench(const BenchFlags& flags, CommandContext& context) {
  // Validated by the options' checks.
  const std::vector<uint64_t> sizes = *ParseSizes(flags.sizes);
  const std::vector<DmaDirection> directions =
      *ParseDirections(flags.directions);
  const std::vector<TransferPath> paths = *ParsePaths(flags.paths);

  absl::StatusOr<Options> options = ResolveOptions(*context.os);
  if (!options.ok()) {
    ReportError(options.status(), "invalid configuration", flags.json,
                kExitUsage, context);
    return;
  }
  if (flags.device >= options->device.value.devices) {
    ReportError(absl::InvalidArgumentError(absl::StrCat(
                    "--device=", flags.device,
                    " but TPUSHIM_DEVICE=", options->device.value.text, " has ",
                    options->device.value.devices, " device(s)")),
                "invalid command line", flags.json, kExitUsage, context);
    return;
  }

  auto display =
      std::make_shared<StartupProgressDisplay>(*context.err, "bench");
  // Until premapping ends: with TPUSHIM_PREMAP=background the display goes
  // on while the bench waits for the region below.
  absl::StatusOr<std::unique_ptr<System>> system = System::Create(
      {}, [display](const StartupProgress& p) { (*display)(p); },
      StartupProgressUntil::kPremapped);
  if (!system.ok()) {
    ReportStartupError(system.status(), flags.json, context);
    return;
  }
  System& s = **system;
  // TPUSHIM_PREMAP=background: measure the region premapped, not while
  // premapping competes with the cells (and staged cells find no staging
  // yet). The display's last call has returned when this does, so the
  // bench's own bar below has stderr to itself.
  if (absl::Status premapped = s.AwaitPremapped(); !premapped.ok()) {
    LOG(WARNING) << "tpushim bench: premapping the region stopped short ("
                 << premapped << "); measuring with the part it serves";
  }

  Results results;
  results.seconds = flags.seconds;
  results.premapped_bytes = s.premapped_bytes();
  results.threshold_bytes = s.transfer_threshold_bytes();
  results.device_url = options->device.value.text;
  results.device_index = flags.device;
  const DeviceDescription& d = s.device(flags.device);
  results.device_name = d.name;
  results.hbm_bytes = d.hbm_bytes;
  results.link_gbps = d.link_gbps;
  results.memcpy_bytes = std::min(sizes.back(), kMaxMemcpyBytes);

  LOG(INFO) << "tpushim bench: sizes " << flags.sizes << ", directions "
            << flags.directions << ", paths " << flags.paths << ", "
            << flags.seconds << " s per cell on device " << flags.device;

  const int total =
      Bench::CellsPerSize(directions, paths) * static_cast<int>(sizes.size()) +
      2;  // the two memcpy phases
  ProgressBar progress(*context.err, "bench", total);
  auto fail = [&](const absl::Status& status, absl::string_view what) {
    progress.Clear();
    LOG(ERROR) << "tpushim bench: " << what << ": " << status;
    ReportError(status, what, flags.json, kExitFailure, context);
  };

  // memcpy half before and half after the cells: its median spans the run.
  std::vector<double> memcpy_gbps;
  progress.Show(0, "memcpy");
  absl::StatusOr<std::vector<double>> before =
      MemcpySamples(results.memcpy_bytes, flags.seconds / 2);
  if (!before.ok()) return fail(before.status(), "memcpy reference");
  memcpy_gbps = *before;

  Bench bench(s, flags.device, flags.seconds, sizes, directions, paths, results,
              progress);
  if (absl::Status status = bench.Run(); !status.ok()) {
    return fail(status, "transfer failed");
  }

  results.interrupted_by = InterruptSignal();
  if (results.interrupted_by == 0) {
    progress.Show(total - 1, "memcpy");
    absl::StatusOr<std::vector<double>> after =
        MemcpySamples(results.memcpy_bytes, flags.seconds / 2);
    if (!after.ok()) return fail(after.status(), "memcpy reference");
    memcpy_gbps.insert(memcpy_gbps.end(), after->begin(), after->end());
  }
  std::sort(memcpy_gbps.begin(), memcpy_gbps.end());
  results.memcpy_gbps = Percentile(memcpy_gbps, 0.5);
  progress.Clear();

  auto by_cell = [](const auto& a, const auto& b) {
    return a.cell.Key() < b.cell.Key();
  };
  std::stable_sort(results.rows.begin(), results.rows.end(), by_cell);
  std::stable_sort(results.skipped.begin(), results.skipped.end(), by_cell);
  LOG(INFO) << "tpushim bench: done: " << results.rows.size()
            << " cells measured, " << results.skipped.size()
            << " skipped; memcpy " << results.memcpy_gbps << " GB/s";
  system->reset();

  if (flags.json) {
    WriteJson(ResultsJson(results), *context.out);
  } else if (flags.csv) {
    PrintCsv(results, *context.out);
  } else {
    PrintTable(results, *context.out);
  }
  context.exit_code = kExitOk;
}

}  // namespace

void RegisterBenchCommand(CLI::App& app, CommandContext& context) {
  CLI::App* bench = app.add_subcommand("bench", kBenchDescription);
  bench->footer(kBenchFooter);
  auto flags = std::make_shared<BenchFlags>();
  bench
      ->add_option("--sizes", flags->sizes,
                   "Transfer sizes, comma-separated, K/M/G suffixes "
                   "(each in [1, 4G])")
      ->default_val(kDefaultSizes)
      ->check(ParsingValidator(&ParseSizes, "SIZES"));
  bench
      ->add_option("--directions", flags->directions,
                   "Directions to measure: h2d, d2h, d2d, comma-separated")
      ->default_val(kDefaultDirections)
      ->check(ParsingValidator(&ParseDirections, "DIRECTIONS"));
  bench
      ->add_option("--paths", flags->paths,
                   "Host paths to measure: zero_copy, staged, pinned, "
                   "comma-separated (d2d has none)")
      ->default_val(kDefaultPaths)
      ->check(ParsingValidator(&ParsePaths, "PATHS"));
  AddDecimalFlag(bench, "--seconds", &flags->seconds,
                 {.unit = "seconds", .min = 0, .max = 600},
                 "Measuring time per cell (at least 3 transfers each)");
  AddWholeFlag(bench, "--device", &flags->device,
               {.unit = "", .min = 0, .max = 1023}, "The device to measure");
  CLI::Option* json = bench->add_flag(
      "--json", flags->json, "Print one JSON object instead of tables");
  CLI::Option* csv = bench->add_flag("--csv", flags->csv,
                                     "Print CSV (a header, one line per row)");
  json->excludes(csv);
  bench->callback([flags, &context] { RunBench(*flags, context); });
}

}  // namespace tpushim::tools
