// Premapped region start-up against the machine's own references, all for
// the same size in the same run:
//
//   BM_TpushimStartup    PremappedRegion::Create with the defaults (huge
//                        pages if available, pre-fault threads = CPUs,
//                        mlock) and its teardown excluded
//   BM_NaiveTouchLoop    mmap + one thread writing one byte per 4 KiB page
//   BM_MapPopulate       mmap(MAP_POPULATE) from one thread
//   BM_WarmMemset        memset over an already faulted buffer (bandwidth)
//   BM_StartupVsMemset   both sides at once: start-up time divided by
//                        size / warm memset bandwidth (goal <= 1.25 at 4G)
//
// Size: --size=<bytes|64M|4G> (default 4G). CI runs --size=64M.

#include <sys/mman.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "allocator/premapped_region.h"
#include "benchmark/benchmark.h"
#include "env/device_url.h"

namespace tpushim {
namespace {

uint64_t g_size = uint64_t{4} << 30;

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// The environment of the benchmark process, but the region size from --size.
Options RegionOptions() {
  OptionOverrides overrides;
  overrides.premapped_buffer_size = g_size;
  absl::StatusOr<Options> options = ResolveOptions(*Os::Default(), overrides);
  if (!options.ok()) {
    fprintf(stderr, "premapped_init_bench: %s\n",
            options.status().ToString().c_str());
    exit(2);
  }
  return *options;
}

// Seconds for one start-up, or a negative value on error.
double TimeStartup(benchmark::State& state, PageKind* kind) {
  const Options options = RegionOptions();
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::unique_ptr<PremappedRegion>> region =
      PremappedRegion::Create(options, Os::Default(), nullptr);
  const double seconds = Seconds(std::chrono::steady_clock::now() - start);
  if (!region.ok()) {
    state.SkipWithError(region.status().ToString().c_str());
    return -1;
  }
  if (kind != nullptr) *kind = (*region)->GetStats().page_kind;
  return seconds;  // teardown runs here, outside the timed part
}

void SetBytes(benchmark::State& state) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * g_size));
}

void BM_TpushimStartup(benchmark::State& state) {
  PageKind kind = PageKind::k4K;
  for (auto _ : state) {
    const double s = TimeStartup(state, &kind);
    if (s < 0) return;
    state.SetIterationTime(s);
  }
  state.SetLabel(std::string(PageKindName(kind)));
  SetBytes(state);
}

void BM_NaiveTouchLoop(benchmark::State& state) {
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    void* p = mmap(nullptr, g_size, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      state.SkipWithError("mmap failed");
      return;
    }
    madvise(p, g_size, MADV_NOHUGEPAGE);
    for (uint64_t off = 0; off < g_size; off += 4096) {
      static_cast<volatile char*>(p)[off] = 1;
    }
    state.SetIterationTime(Seconds(std::chrono::steady_clock::now() - start));
    munmap(p, g_size);
  }
  SetBytes(state);
}

void BM_MapPopulate(benchmark::State& state) {
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    void* p = mmap(nullptr, g_size, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) {
      state.SkipWithError("mmap failed");
      return;
    }
    state.SetIterationTime(Seconds(std::chrono::steady_clock::now() - start));
    munmap(p, g_size);
  }
  SetBytes(state);
}

// Warm single-thread memset bandwidth in bytes/s over a buffer of
// min(size, 1 GiB), faulted in first.
double WarmMemsetBandwidth() {
  const uint64_t bytes = std::min<uint64_t>(g_size, uint64_t{1} << 30);
  std::vector<char> buffer(bytes, 1);
  double best = 0;
  for (int round = 0; round < 3; ++round) {
    const int passes = static_cast<int>(
        std::max<uint64_t>(1, (uint64_t{2} << 30) / bytes));
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < passes; ++i) {
      std::memset(buffer.data(), i + round, bytes);
      benchmark::ClobberMemory();
    }
    const double s = Seconds(std::chrono::steady_clock::now() - start);
    best = std::max(best, double(bytes) * passes / s);
  }
  return best;
}

void BM_WarmMemset(benchmark::State& state) {
  double bandwidth = 0;
  for (auto _ : state) {
    bandwidth = WarmMemsetBandwidth();
    state.SetIterationTime(double(g_size) / bandwidth);
  }
  state.counters["memset_GBps"] = bandwidth / 1e9;
  SetBytes(state);
}

void BM_StartupVsMemset(benchmark::State& state) {
  double ratio = 0, startup = 0, bandwidth = 0;
  PageKind kind = PageKind::k4K;
  for (auto _ : state) {
    bandwidth = WarmMemsetBandwidth();
    startup = TimeStartup(state, &kind);
    if (startup < 0) return;
    ratio = startup / (double(g_size) / bandwidth);
    state.SetIterationTime(startup);
  }
  state.counters["startup_s"] = startup;
  state.counters["memset_GBps"] = bandwidth / 1e9;
  state.counters["startup_over_memset"] = ratio;
  state.SetLabel(std::string(PageKindName(kind)));
}

void Register() {
  const std::string size = std::to_string(g_size);
  benchmark::RegisterBenchmark(("BM_TpushimStartup/" + size).c_str(),
                               BM_TpushimStartup)
      ->UseManualTime()->Iterations(3)->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark(("BM_NaiveTouchLoop/" + size).c_str(),
                               BM_NaiveTouchLoop)
      ->UseManualTime()->Iterations(3)->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark(("BM_MapPopulate/" + size).c_str(),
                               BM_MapPopulate)
      ->UseManualTime()->Iterations(3)->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark(("BM_WarmMemset/" + size).c_str(),
                               BM_WarmMemset)
      ->UseManualTime()->Iterations(1)->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark(("BM_StartupVsMemset/" + size).c_str(),
                               BM_StartupVsMemset)
      ->UseManualTime()->Iterations(3)->Unit(benchmark::kMillisecond);
}

}  // namespace
}  // namespace tpushim

int main(int argc, char** argv) {
  // Take --size=... out before Google Benchmark sees the flags.
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (absl::StartsWith(argv[i], "--size=")) {
      absl::StatusOr<uint64_t> size =
          tpushim::ParseByteSize(argv[i] + 7, "--size");
      if (!size.ok() || *size == 0 || *size % 4096 != 0) {
        fprintf(stderr, "premapped_init_bench: --size must be a multiple of "
                        "4096 bytes, e.g. 64M or 4G\n");
        return 2;
      }
      tpushim::g_size = *size;
    } else {
      args.push_back(argv[i]);
    }
  }
  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  tpushim::Register();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
