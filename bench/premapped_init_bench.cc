// Premapped region start-up against the machine's own references, all for
// the same size, measured side by side in one run.
//
// On a VM, the first touch of memory the host has reclaimed costs far more
// than touching memory it still backs, and what one method frees the next
// one reuses, so running each method's iterations back to back favours
// whichever runs later. BM_StartupSideBySide therefore runs R rounds, each
// timing every method once in a rotated order, and reports the min and the
// median of each:
//
//   tpushim     PremappedRegion::Create with the environment's settings
//               (defaults: huge pages if available, pre-fault threads =
//               CPUs, mlock), teardown not timed
//   kernel_best the kernel's own best way to populate the same size: a
//               2 MiB-aligned mapping advised MADV_HUGEPAGE, populated by
//               N threads (N = tpushim's pre-fault threads) each calling
//               MADV_POPULATE_WRITE once on its slice; no NUMA binding and
//               no mlock
//   naive       mmap + one thread writing one byte per 4 KiB page
//   populate    mmap(MAP_POPULATE) from one thread
//   memset      warm single-thread memset over min(size, 1 GiB), as time
//               for `size` bytes
//
// One warm-up round runs first and is not counted. The figures are minima:
// the host's noise only ever adds time (medians of the same runs swing by
// several times here), so the minimum is the best estimate of what each
// method costs. `startup_over_kernel_best` = min(tpushim) /
// min(kernel_best) is the start-up goal (<= 1.1, binding and locking
// included in tpushim's time); `startup_over_memset` is kept for
// comparison with earlier runs.
//
// In one process, what one method frees the next may get back (and on a
// VM the host may still back it), which does not happen to a program that
// starts. BM_StartupFreshProcesses therefore times tpushim and kernel_best
// again, each in a fresh process of this binary (--time-one=METHOD), A B
// then B A over R rounds after one warm-up pair, and reports their minima
// and medians, `fresh_startup_over_kernel_best` (min over min) and the
// median of the per-round ratios (`fresh_pair_ratio_median`). Each round
// also times `background` in a fresh process: the region created with
// TPUSHIM_PREMAP=background, timed until Create returns
// (`background_create_min_s`/`_max_s`) and until the whole region is
// premapped behind it (`background_ready_min_s`, and over tpushim's
// foreground start-up: `background_ready_over_foreground`).
//
// Flags: --size=<bytes|64M|4G> (default 4G), --rounds=N (default 5). CI
// runs --size=64M --rounds=2.

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "allocator/premapped_region.h"
#include "benchmark/benchmark.h"
#include "common/status_macros.h"
#include "common/subprocess.h"
#include "env/device_url.h"

namespace tpushim {
namespace {

uint64_t g_size = uint64_t{4} << 30;

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// The environment of the benchmark process, with the size from --size.
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

// Seconds for one start-up, teardown excluded.
absl::StatusOr<double> TimeStartup(PageKind* kind) {
  const Options options = RegionOptions();
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::unique_ptr<PremappedRegion>> region =
      PremappedRegion::Create(options, Os::Default(), nullptr);
  const double seconds = Seconds(std::chrono::steady_clock::now() - start);
  if (!region.ok()) return region.status();
  *kind = (*region)->GetStats().page_kind;
  return seconds;
}

// Seconds until a background region's Create returned and until it was
// whole, teardown excluded.
absl::StatusOr<std::pair<double, double>> TimeBackgroundStartup() {
  Options options = RegionOptions();
  options.premap.value = PremapMode::kBackground;
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::unique_ptr<PremappedRegion>> region =
      PremappedRegion::Create(options, Os::Default(), nullptr);
  const double created = Seconds(std::chrono::steady_clock::now() - start);
  if (!region.ok()) return region.status();
  (*region)->StartPremapping({});
  TPUSHIM_RETURN_IF_ERROR((*region)->WaitUntilPremapped());
  const double ready = Seconds(std::chrono::steady_clock::now() - start);
  return std::make_pair(created, ready);
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

// The kernel's best: THP-advised, populated by `threads` threads at once.
absl::StatusOr<double> TimeKernelBest(int threads) {
  constexpr uint64_t kHuge = uint64_t{2} << 20;
  const uint64_t length = (g_size + kHuge - 1) / kHuge * kHuge;
  const auto start = std::chrono::steady_clock::now();
  void* raw = mmap(nullptr, length + kHuge, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return absl::ResourceExhaustedError("mmap failed");
  char* base = reinterpret_cast<char*>(
      (reinterpret_cast<uintptr_t>(raw) + kHuge - 1) / kHuge * kHuge);
  madvise(base, length, MADV_HUGEPAGE);
  const uint64_t slice = (length / threads + kHuge - 1) / kHuge * kHuge;
  std::vector<std::thread> workers;
  std::atomic<bool> failed{false};
  for (int t = 0; t < threads; ++t) {
    const uint64_t begin = std::min(length, slice * t);
    const uint64_t end = std::min(length, begin + slice);
    if (begin == end) break;
    workers.emplace_back([&, begin, end] {
      if (madvise(base + begin, end - begin, MADV_POPULATE_WRITE) != 0) {
        failed = true;
      }
    });
  }
  for (std::thread& w : workers) w.join();
  const double seconds = Seconds(std::chrono::steady_clock::now() - start);
  munmap(raw, length + kHuge);
  if (failed) {
    return absl::UnavailableError(
        "MADV_POPULATE_WRITE failed (a kernel before 5.14?)");
  }
  return seconds;
}

absl::StatusOr<double> TimeMapping(bool populate) {
  const auto start = std::chrono::steady_clock::now();
  void* p =
      mmap(nullptr, g_size, PROT_READ | PROT_WRITE,
           MAP_PRIVATE | MAP_ANONYMOUS | (populate ? MAP_POPULATE : 0), -1, 0);
  if (p == MAP_FAILED) return absl::ResourceExhaustedError("mmap failed");
  if (!populate) {
    for (uint64_t off = 0; off < g_size; off += 4096) {
      static_cast<volatile char*>(p)[off] = 1;
    }
  }
  const double seconds = Seconds(std::chrono::steady_clock::now() - start);
  munmap(p, g_size);
  return seconds;
}

// Time a warm single-thread memset would take for `g_size` bytes, from the
// best of three passes over min(size, 1 GiB) of faulted memory.
absl::StatusOr<double> TimeWarmMemset() {
  const uint64_t bytes = std::min<uint64_t>(g_size, uint64_t{1} << 30);
  std::vector<char> buffer(bytes, 1);
  double best = 0;
  for (int pass = 0; pass < 3; ++pass) {
    const auto start = std::chrono::steady_clock::now();
    std::memset(buffer.data(), pass + 2, bytes);
    benchmark::ClobberMemory();
    best =
        std::max(best, double(bytes) /
                           Seconds(std::chrono::steady_clock::now() - start));
  }
  return double(g_size) / best;
}

int g_rounds = 5;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double Min(const std::vector<double>& v) {
  return *std::min_element(v.begin(), v.end());
}

void BM_StartupSideBySide(benchmark::State& state) {
  constexpr int kMethods = 5;
  const char* const kNames[kMethods] = {"tpushim", "kernel_best", "naive",
                                        "populate", "memset"};
  const int threads =
      RegionOptions().EffectivePrefaultThreads(Os::Default()->OnlineCpuCount());
  std::vector<double> times[kMethods];
  PageKind kind = PageKind::k4K;
  for (auto _ : state) {
    // Round -1 warms up (faults the host's backing in, loads code) and is
    // not counted.
    for (int round = -1; round < g_rounds; ++round) {
      for (int k = 0; k < kMethods; ++k) {
        const int method = (round + 1 + k) % kMethods;
        absl::StatusOr<double> t =
            method == 0   ? TimeStartup(&kind)
            : method == 1 ? TimeKernelBest(threads)
            : method == 2 ? TimeMapping(/*populate=*/false)
            : method == 3 ? TimeMapping(/*populate=*/true)
                          : TimeWarmMemset();
        if (!t.ok()) {
          state.SkipWithError(t.status().ToString().c_str());
          return;
        }
        if (round >= 0) times[method].push_back(*t);
      }
    }
    state.SetIterationTime(Min(times[0]));
  }
  for (int m = 0; m < kMethods; ++m) {
    state.counters[absl::StrCat(kNames[m], "_median_s")] = Median(times[m]);
    state.counters[absl::StrCat(kNames[m], "_min_s")] = Min(times[m]);
  }
  state.counters["prefault_threads"] = threads;
  state.counters["memset_GBps"] = double(g_size) / Min(times[4]) / 1e9;
  state.counters["startup_over_kernel_best"] = Min(times[0]) / Min(times[1]);
  state.counters["startup_over_memset"] = Min(times[0]) / Min(times[4]);
  state.counters["naive_over_tpushim"] = Min(times[2]) / Min(times[0]);
  state.SetLabel(std::string(PageKindName(kind)));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * g_size));
}

// ---- In fresh processes -----------------------------------------------------

// --time-one=METHOD: times one start-up of `method` in this process and
// prints its seconds (the child side of BM_StartupFreshProcesses);
// `background` prints the seconds to Create's return and to the whole
// region.
int TimeOne(absl::string_view method) {
  if (method == "background") {
    absl::StatusOr<std::pair<double, double>> t = TimeBackgroundStartup();
    if (!t.ok()) {
      fprintf(stderr, "premapped_init_bench: %s\n",
              t.status().ToString().c_str());
      return 1;
    }
    printf("%.9f %.9f\n", t->first, t->second);
    return 0;
  }
  PageKind kind = PageKind::k4K;
  const int threads =
      RegionOptions().EffectivePrefaultThreads(Os::Default()->OnlineCpuCount());
  absl::StatusOr<double> t =
      method == "tpushim" ? TimeStartup(&kind)
      : method == "kernel_best"
          ? TimeKernelBest(threads)
          : absl::InvalidArgumentError(
                "--time-one takes tpushim, kernel_best or background");
  if (!t.ok()) {
    fprintf(stderr, "premapped_init_bench: %s\n",
            t.status().ToString().c_str());
    return 1;
  }
  printf("%.9f\n", *t);
  return 0;
}

// The numbers the child printed.
absl::StatusOr<std::vector<double>> TimeInFreshProcess(
    const std::string& method) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  TPUSHIM_ASSIGN_OR_RETURN(SubprocessResult r,
                           RunSubprocess("/proc/self/exe",
                                         {absl::StrCat("--size=", g_size),
                                          absl::StrCat("--time-one=", method)},
                                         env, absl::Seconds(600)));
  std::vector<double> seconds;
  for (absl::string_view word :
       absl::StrSplit(absl::StripAsciiWhitespace(r.out), ' ')) {
    double s = 0;
    if (!absl::SimpleAtod(word, &s)) break;
    seconds.push_back(s);
  }
  if (r.exit_code != 0 || seconds.empty()) {
    return absl::InternalError(absl::StrCat(
        method, " in a fresh process: exit ", r.exit_code, ": ", r.err));
  }
  return seconds;
}

void BM_StartupFreshProcesses(benchmark::State& state) {
  std::vector<double> tpushim, kernel, ratios, created, ready;
  const char* const kMethods[] = {"tpushim", "kernel_best", "background"};
  for (auto _ : state) {
    for (int round = -1; round < g_rounds; ++round) {
      std::vector<double> t[3];
      for (int k = 0; k < 3; ++k) {
        const int method = (round + k + 3) % 3;  // rotated each round
        absl::StatusOr<std::vector<double>> s =
            TimeInFreshProcess(kMethods[method]);
        if (!s.ok()) {
          state.SkipWithError(s.status().ToString().c_str());
          return;
        }
        t[method] = *s;
      }
      if (round < 0) continue;  // the warm-up round
      tpushim.push_back(t[0][0]);
      kernel.push_back(t[1][0]);
      ratios.push_back(t[0][0] / t[1][0]);
      created.push_back(t[2][0]);
      ready.push_back(t[2].size() > 1 ? t[2][1] : 0);
    }
    state.SetIterationTime(Min(tpushim));
  }
  state.counters["tpushim_fresh_min_s"] = Min(tpushim);
  state.counters["tpushim_fresh_median_s"] = Median(tpushim);
  state.counters["kernel_best_fresh_min_s"] = Min(kernel);
  state.counters["kernel_best_fresh_median_s"] = Median(kernel);
  state.counters["fresh_startup_over_kernel_best"] = Min(tpushim) / Min(kernel);
  state.counters["fresh_pair_ratio_median"] = Median(ratios);
  state.counters["background_create_min_s"] = Min(created);
  state.counters["background_create_max_s"] =
      *std::max_element(created.begin(), created.end());
  state.counters["background_ready_min_s"] = Min(ready);
  state.counters["background_ready_over_foreground"] =
      Min(ready) / Min(tpushim);
}

}  // namespace
}  // namespace tpushim

int main(int argc, char** argv) {
  // Take --size=... out before Google Benchmark sees the flags.
  std::vector<char*> args;
  const char* time_one = nullptr;
  for (int i = 0; i < argc; ++i) {
    if (absl::StartsWith(argv[i], "--rounds=")) {
      if (!absl::SimpleAtoi(argv[i] + 9, &tpushim::g_rounds) ||
          tpushim::g_rounds < 1) {
        fprintf(stderr, "premapped_init_bench: --rounds must be >= 1\n");
        return 2;
      }
    } else if (absl::StartsWith(argv[i], "--time-one=")) {
      time_one = argv[i] + 11;
    } else if (absl::StartsWith(argv[i], "--size=")) {
      absl::StatusOr<uint64_t> size =
          tpushim::ParseByteSize(argv[i] + 7, "--size");
      if (!size.ok() || *size == 0 || *size % 4096 != 0) {
        fprintf(stderr,
                "premapped_init_bench: --size must be a multiple of "
                "4096 bytes, e.g. 64M or 4G\n");
        return 2;
      }
      tpushim::g_size = *size;
    } else {
      args.push_back(argv[i]);
    }
  }
  if (time_one != nullptr) return tpushim::TimeOne(time_one);
  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  benchmark::RegisterBenchmark(
      ("BM_StartupSideBySide/" + std::to_string(tpushim::g_size)).c_str(),
      tpushim::BM_StartupSideBySide)
      ->UseManualTime()
      ->Iterations(1)
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark(
      ("BM_StartupFreshProcesses/" + std::to_string(tpushim::g_size)).c_str(),
      tpushim::BM_StartupFreshProcesses)
      ->UseManualTime()
      ->Iterations(1)
      ->Unit(benchmark::kMillisecond);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
