// RegionAllocator throughput and utilisation.
//
//   BM_AllocFreePair      allocate+free of one block, sizes log-uniform in
//                         4 KiB..4 MiB, 1, 2 and 8 threads on one allocator
//                         (goal: median <= 100 ns single-threaded)
//   BM_ChurnUtilisation   keeps allocating random sizes and freeing random
//                         live blocks until the first failure; reports the
//                         share of the region in use then (goal >= 90 %)
//
// The allocator never touches the region, so the region is an address
// range reserved with PROT_NONE: no memory is committed. The churn case
// fails allocations on purpose, each of which the allocator logs at ERROR:
// it runs with logging to no file and nothing below FATAL on stderr, so
// the benchmark's own output stays readable.

#include <sys/mman.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "allocator/region_allocator.h"
#include "benchmark/benchmark.h"
#include "logging/log.h"

namespace tpushim {
namespace {

constexpr uint64_t kRegionBytes = uint64_t{1} << 30;

void* ReserveAddressRange(uint64_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

std::vector<uint64_t> LogUniformSizes(size_t count, uint64_t lo, uint64_t hi,
                                      uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> exponent(std::log2(double(lo)),
                                                  std::log2(double(hi)));
  std::vector<uint64_t> sizes(count);
  for (uint64_t& s : sizes) s = static_cast<uint64_t>(std::exp2(exponent(rng)));
  return sizes;
}

// Logging that keeps the ERROR lines of failures made on purpose off
// stderr (and out of files) for the length of a scope.
class QuietLogging {
 public:
  QuietLogging() {
    logging::LogConfig config;
    config.log_dir = "";
    config.stderr_level = logging::Severity::kFatal;
    (void)logging::InitLogging(config);
  }
  QuietLogging(const QuietLogging&) = delete;
  QuietLogging& operator=(const QuietLogging&) = delete;
  ~QuietLogging() { logging::ShutdownLogging(); }
};

RegionAllocator* shared_allocator = nullptr;

void BM_AllocFreePair(benchmark::State& state) {
  static void* region = ReserveAddressRange(kRegionBytes);
  if (state.thread_index() == 0) {
    shared_allocator = new RegionAllocator(region, kRegionBytes, {});
  }
  const std::vector<uint64_t> sizes =
      LogUniformSizes(4096, 4096, 4 << 20, 1 + state.thread_index());
  size_t i = 0;
  for (auto _ : state) {
    absl::StatusOr<void*> p = shared_allocator->Allocate(sizes[i++ & 4095]);
    benchmark::DoNotOptimize(p);
    if (!p.ok() || !shared_allocator->Free(*p).ok()) {
      state.SkipWithError("allocation failed");
      break;
    }
  }
  state.SetItemsProcessed(state.iterations());
  if (state.thread_index() == 0) {
    delete shared_allocator;
    shared_allocator = nullptr;
  }
}
BENCHMARK(BM_AllocFreePair)
    ->Threads(1)
    ->Threads(2)
    ->Threads(8)
    ->Repetitions(5)
    ->ReportAggregatesOnly(true)
    ->UseRealTime();

void BM_ChurnUtilisation(benchmark::State& state) {
  static void* region = ReserveAddressRange(kRegionBytes);
  QuietLogging quiet;  // every round ends in a failed allocation
  const uint64_t capacity = uint64_t{256} << 20;
  double utilisation_sum = 0;
  int64_t rounds = 0;
  for (auto _ : state) {
    RegionAllocator allocator(region, capacity, {});
    std::mt19937_64 rng(1000 + rounds);
    const std::vector<uint64_t> sizes =
        LogUniformSizes(1 << 16, 4096, 4 << 20, 7 + rounds);
    std::vector<void*> live;
    size_t next = 0;
    for (;;) {
      if (live.empty() || rng() % 10 < 6) {
        absl::StatusOr<void*> p = allocator.Allocate(sizes[next++ & 0xffff]);
        if (!p.ok()) break;
        live.push_back(*p);
      } else {
        const size_t k = rng() % live.size();
        (void)allocator.Free(live[k]);
        live[k] = live.back();
        live.pop_back();
      }
    }
    utilisation_sum += static_cast<double>(allocator.GetStats().bytes_in_use) /
                       static_cast<double>(capacity);
    ++rounds;
  }
  state.counters["utilisation_at_first_failure"] = utilisation_sum / rounds;
}
BENCHMARK(BM_ChurnUtilisation)->Iterations(20)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace tpushim

BENCHMARK_MAIN();
