// The transfer engine against the machine's own memcpy, measured side by
// side in one run, on simulated devices.
//
//   BM_Memcpy/<bytes>            one-thread memcpy between warm buffers: the
//                                reference every path is compared with
//   BM_Transfer/<dir>/<path>/<bytes>
//                                one transfer at a time, submit to ready:
//                                dir h2d|d2h, path zero_copy|staged|pinned
//   BM_Latency4K/<dir>/threads:N 4 KiB staged transfers submitted and
//                                awaited by N threads: median and p99
//                                submit-to-ready latency, aggregate ops/s
//   BM_Aggregate1M/threads:N     1 MiB staged host→device transfers from N
//                                threads: aggregate bytes/s
//   BM_Link25/<bytes>            staged host→device on a device whose link
//                                is modelled at 25 Gbit/s
//   BM_HeadOfLine/region_on|off  p99 of 4 KiB device→host transfers on
//                                device 1, alone and while device 0 runs
//                                back-to-back pinned device→host transfers
//                                of the largest size (--hol-rounds rounds
//                                of each, alternated)
//   BM_HeadOfLine/cpu_only       the control: the same, loaded by the host
//                                work of those transfers without the
//                                runtime (mlock, fill, munlock)
//
//   BM_RoundTrip/<bytes>         synchronous host→device→host round trips
//                                from pageable memory: region on, region
//                                off through the bounce pool, region off
//                                pinned (no pool), alternated in rounds
//
//   BM_Depth64/<dir>/<bytes>     64 staged transfers in flight, each into
//                                its own range: transfers/s
//   BM_HostReleased              a staged host→device transfer of the
//                                largest size (threshold raised so it
//                                stages): time to host_released (the
//                                caller's buffer free) and to ready, side
//                                by side over --rounds repeats (medians)
//
//   BM_SideBySide                at the largest size, R rounds (--rounds,
//                                default 25) each timing memcpy and every
//                                direction and path once, rotated; the
//                                ratios are medians of per-round ratios
//
// After the run it prints the ratios the transfer-engine issue sets goals
// for, each measured in this run:
//   staged / memcpy at the largest size        >= 0.8
//   zero_copy / memcpy at the largest size     >= 0.9
//   4 KiB submit-to-ready median (1 thread)    <= 5 us
//   8 threads / 1 thread aggregate (1 MiB)     >= 0.9
//   link-modelled throughput / 25 Gbit/s       >= 0.95
//   4 KiB p99 next to large pinned d2h / alone <= 2
//   4 KiB round trip p99, region off / on      <= 2
//
// Flags (besides Google Benchmark's): --max-size=<bytes|256M> (default
// 256M), --region=<bytes|1G> (default 1G), and to try engine settings,
// --chunk=<bytes>, --d2h-chunk=<bytes>, --depth=N (staging chunk sizes and
// depth) and
// --descriptor=<bytes> (descriptor size of the other paths). CI runs
// --max-size=1M --region=64M with a short --benchmark_min_time.

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "benchmark/benchmark.h"
#include "common/mutex.h"
#include "device/devices.h"
#include "env/device_url.h"
#include "env/options.h"
#include "transfer/transfer_engine.h"

namespace tpushim {
namespace {

uint64_t g_max_size = uint64_t{256} << 20;
uint64_t g_region = uint64_t{1} << 30;
TransferEngine::Config g_config;

void Die(const absl::Status& s, const char* what) {
  fprintf(stderr, "transfer_bench: %s: %s\n", what, s.ToString().c_str());
  exit(2);
}

// A region (or none), devices from a URL and an engine over them.
struct Rig {
  FixedEnvironmentOs os{Os::Default()};
  std::unique_ptr<PremappedRegion> region;
  std::vector<std::unique_ptr<Device>> devices;
  std::unique_ptr<TransferEngine> engine;
  DeviceBuffer buffer;  // g_max_size bytes on device 0, written once

  Rig(uint64_t region_bytes, const std::string& url,
      std::optional<uint64_t> threshold = std::nullopt,
      const TransferEngine::Config& config = g_config) {
    OptionOverrides o;
    o.premapped_buffer_size = region_bytes;
    o.premapped_buffer_transfer_threshold_bytes = threshold;
    o.device = url;
    absl::StatusOr<Options> options = ResolveOptions(os, o);
    if (!options.ok()) Die(options.status(), "options");
    auto r = PremappedRegion::Create(*options, &os, nullptr);
    if (!r.ok()) Die(r.status(), "region");
    region = *std::move(r);
    auto d = OpenDevices(options->device.value, &os, nullptr);
    if (!d.ok()) Die(d.status(), "devices");
    devices = *std::move(d);
    std::vector<Device*> raw;
    for (auto& dev : devices) raw.push_back(dev.get());
    auto e = TransferEngine::Create(raw, region.get(), &os, config);
    if (!e.ok()) Die(e.status(), "engine");
    engine = *std::move(e);
    auto b = engine->Allocate(0, g_max_size);
    if (!b.ok()) Die(b.status(), "device buffer");
    buffer = *b;
    // Fault the simulated HBM in once: real device memory has no page
    // faults, and neither should the measurement.
    std::vector<char> warm(std::min<uint64_t>(g_max_size, 64 << 20), 1);
    for (uint64_t off = 0; off < g_max_size; off += warm.size()) {
      const uint64_t n = std::min<uint64_t>(warm.size(), g_max_size - off);
      auto ev = engine->TransferToDevice(warm.data(), buffer, off, n);
      if (!ev.ok() || !ev->Await().ok()) Die(ev.status(), "warm-up");
    }
  }
};

Rig& MainRig() {
  static Rig* rig =
      new Rig(g_region,
              "sim://?hbm=" +
                  std::to_string(std::max<uint64_t>(g_max_size, 64 << 20) * 2));
  return *rig;
}
// The region off and no bounce pool: every transfer pins (the pinned
// path's figures, and what region-off transfers cost before the pool).
Rig& RegionOffRig() {
  static Rig* rig = [] {
    TransferEngine::Config config = g_config;
    config.bounce_pool_bytes = 0;
    return new Rig(
        0,
        "sim://?hbm=" +
            std::to_string(std::max<uint64_t>(g_max_size, 64 << 20) * 2),
        std::nullopt, config);
  }();
  return *rig;
}
// The region off as users run it: small transfers through the bounce pool.
Rig& BounceRig() {
  static Rig* rig = new Rig(
      0, "sim://?hbm=" +
             std::to_string(std::max<uint64_t>(g_max_size, 64 << 20) * 2));
  return *rig;
}
Rig& LinkRig() {
  static Rig* rig =
      new Rig(g_region,
              "sim://?hbm=" +
                  std::to_string(std::max<uint64_t>(g_max_size, 64 << 20) * 2) +
                  "&link_gbps=25");
  return *rig;
}

// Everything up to the largest size is staged (threshold = --max-size).
Rig& StagedRig() {
  static Rig* rig =
      new Rig(g_region,
              "sim://?hbm=" +
                  std::to_string(std::max<uint64_t>(g_max_size, 64 << 20) * 2),
              g_max_size);
  return *rig;
}

// Warm heap memory (pages touched) of `n` bytes.
// Caller memory as frameworks hand it over: 64-byte aligned (PyTorch's CPU
// allocator, NumPy's). A plain std::vector of this size sits 16 bytes past
// a page boundary, off the cache-line phase of the device's memory, which
// on some CPUs halves the simulated device's copy into it
// (docs/performance.md#pinned-transfers).
template <typename T>
struct CacheAligned {
  using value_type = T;
  CacheAligned() = default;
  template <typename U>
  CacheAligned(const CacheAligned<U>&) {}
  T* allocate(size_t n) {
    return static_cast<T*>(
        ::operator new (n * sizeof(T), std::align_val_t{64}));
  }
  void deallocate(T* p, size_t) { ::operator delete (p, std::align_val_t{64}); }
  bool operator==(const CacheAligned&) const { return true; }
};
using HostBytes = std::vector<char, CacheAligned<char>>;

HostBytes Warm(uint64_t n, char v) { return HostBytes(n, v); }

void BM_Memcpy(benchmark::State& state, uint64_t n) {
  HostBytes a = Warm(n, 1), b = Warm(n, 2);
  for (auto _ : state) {
    std::memcpy(b.data(), a.data(), n);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * n);
}

void BM_Transfer(benchmark::State& state, bool h2d, TransferPath path,
                 uint64_t n) {
  Rig& rig = path == TransferPath::kPinned ? RegionOffRig() : MainRig();
  TransferEngine& engine = *rig.engine;
  char* host = nullptr;
  HostBytes heap;
  if (path == TransferPath::kZeroCopy) {
    auto p = rig.region->allocator().Allocate(n);
    if (!p.ok()) {
      state.SkipWithError(p.status().ToString().c_str());
      return;
    }
    host = static_cast<char*>(*p);
    std::memset(host, 3, n);
  } else {
    heap = Warm(n, 3);
    host = heap.data();
  }
  if (engine.PathFor(host, n) != path) {
    state.SkipWithError("the engine would choose another path");
    return;
  }
  for (auto _ : state) {
    auto ev = h2d ? engine.TransferToDevice(host, rig.buffer, 0, n)
                  : engine.TransferFromDevice(rig.buffer, 0, host, n);
    if (!ev.ok() || !ev->Await().ok()) {
      state.SkipWithError("transfer failed");
      break;
    }
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * n);
  if (path == TransferPath::kZeroCopy) {
    (void)rig.region->allocator().Free(host);
  }
}

double Percentile(std::vector<double>& v, double p) {
  if (v.empty()) return 0;
  const size_t k = std::min(v.size() - 1, size_t(p * double(v.size())));
  std::nth_element(v.begin(), v.begin() + k, v.end());
  return v[k];
}

// N threads, each submitting and awaiting `bytes`-sized staged transfers
// to its own part of the device buffer for about `seconds`. Returns per-op
// latencies (us) and the aggregate bytes/s.
struct MultiResult {
  std::vector<double> latencies_us;
  double bytes_per_second = 0;
  uint64_t ops = 0;
};
MultiResult RunThreads(Rig& rig, int threads, uint64_t bytes, bool h2d,
                       double seconds) {
  MultiResult result;
  Mutex mu;
  std::vector<std::thread> pool;
  const auto start = std::chrono::steady_clock::now();
  const auto until = start + std::chrono::duration<double>(seconds);
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      HostBytes host = Warm(bytes, char(t));
      std::vector<double> lat;
      lat.reserve(1 << 16);
      const uint64_t offset = (uint64_t(t) * bytes) % (g_max_size - bytes + 1);
      while (std::chrono::steady_clock::now() < until) {
        const auto t0 = std::chrono::steady_clock::now();
        auto ev = h2d ? rig.engine->TransferToDevice(host.data(), rig.buffer,
                                                     offset, bytes)
                      : rig.engine->TransferFromDevice(rig.buffer, offset,
                                                       host.data(), bytes);
        if (!ev.ok() || !ev->Await().ok()) Die(ev.status(), "transfer");
        lat.push_back(std::chrono::duration<double, std::micro>(
                          std::chrono::steady_clock::now() - t0)
                          .count());
      }
      MutexLock lock(&mu);
      result.latencies_us.insert(result.latencies_us.end(), lat.begin(),
                                 lat.end());
    });
  }
  for (auto& th : pool) th.join();
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  result.ops = result.latencies_us.size();
  result.bytes_per_second = double(result.ops) * double(bytes) / elapsed;
  return result;
}

double g_run_seconds = 1.0;

void BM_Latency4K(benchmark::State& state, bool h2d, int threads) {
  MultiResult r;
  for (auto _ : state) {
    r = RunThreads(MainRig(), threads, 4096, h2d, g_run_seconds);
  }
  state.counters["p50_us"] = Percentile(r.latencies_us, 0.5);
  state.counters["p99_us"] = Percentile(r.latencies_us, 0.99);
  state.counters["ops_per_s"] = double(r.ops) / g_run_seconds;
}

void BM_Aggregate1M(benchmark::State& state, int threads) {
  const uint64_t bytes = std::min<uint64_t>(1 << 20, g_max_size);
  MultiResult r;
  for (auto _ : state) {
    r = RunThreads(MainRig(), threads, bytes, true, g_run_seconds);
  }
  state.counters["GBps"] = r.bytes_per_second / 1e9;
}

void BM_Link25(benchmark::State& state, uint64_t n) {
  Rig& rig = LinkRig();
  HostBytes host = Warm(n, 5);
  for (auto _ : state) {
    auto ev = rig.engine->TransferToDevice(host.data(), rig.buffer, 0, n);
    if (!ev.ok() || !ev->Await().ok()) Die(ev.status(), "link transfer");
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * n);
  state.counters["link_fraction"] = benchmark::Counter(
      double(n) / (25e9 / 8), benchmark::Counter::kIsIterationInvariantRate);
}

int g_rounds = 25;

// Head-of-line blocking between devices: the latency of 4 KiB
// device→host transfers on device 1, alone and while device 0 runs
// back-to-back pinned device→host transfers of --max-size bytes (each
// pins, DMAs and unpins its whole buffer). Two set-ups: the region on with
// a threshold below --max-size (the 4 KiB transfers are staged), and the
// region off (they are pinned too, and unpin on the host side like the
// large ones). Rounds alternate alone and loaded, --hol-rounds of each;
// the counters are the medians over rounds of each round's p50/p99, and
// the p99 ratio loaded / alone with its range over rounds.
//
// A third set-up, cpu_only, is the control: the region on, but the load is
// the host work of those large transfers done without the runtime (one
// thread that locks, fills and unlocks the same buffer, back to back). On
// a machine with few cores the 4 KiB transfers then wait for a CPU, not
// for anything in the runtime: the runtime holds no lock and no queue of
// device 1 behind device 0 when its ratio is no worse than this one.
int g_hol_rounds = 5;

enum class HolSetup { kRegionOn, kRegionOff, kCpuOnly };

void BM_HeadOfLine(benchmark::State& state, HolSetup setup) {
  const bool region_on = setup != HolSetup::kRegionOff;
  const uint64_t big = g_max_size;
  const std::string url = "sim://?devices=2&hbm=" +
                          std::to_string(std::max<uint64_t>(big, 64 << 20) * 2);
  static Rig* rigs[2] = {nullptr, nullptr};
  Rig*& rig = rigs[region_on ? 1 : 0];
  if (rig == nullptr) {
    // Region off: the 4 KiB transfers go through the bounce pool, the
    // large ones stay pinned (the pool takes at most half of them).
    TransferEngine::Config off = g_config;
    off.bounce_max_bytes = std::min(off.bounce_max_bytes, big / 2);
    rig = region_on ? new Rig(g_region, url, std::min(g_region, big / 4))
                    : new Rig(0, url, std::nullopt, off);
  }
  TransferEngine& engine = *rig->engine;
  auto small = engine.Allocate(1, 4096);
  if (!small.ok()) Die(small.status(), "device 1 buffer");
  HostBytes host_small = Warm(4096, 1);
  // Page-aligned, untouched by the rig: mlock faults it in on first use.
  HostBytes host_big = Warm(big, 2);
  if (engine.PathFor(host_big.data(), big) != TransferPath::kPinned) {
    state.SkipWithError("the large transfers would not be pinned");
    return;
  }
  auto one_round = [&](bool loaded) {
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> large_done{0};
    std::thread background;
    if (loaded && setup == HolSetup::kCpuOnly) {
      HostBytes source = Warm(big, 3);
      background = std::thread([&, source = std::move(source)] {
        while (!stop.load(std::memory_order_relaxed)) {
          if (mlock(host_big.data(), big) != 0)
            Die(absl::ErrnoToStatus(errno, "mlock"), "cpu load");
          std::memcpy(host_big.data(), source.data(), big);
          munlock(host_big.data(), big);
          large_done.fetch_add(1, std::memory_order_relaxed);
        }
      });
      while (large_done.load() == 0) std::this_thread::yield();
    } else if (loaded) {
      background = std::thread([&] {
        while (!stop.load(std::memory_order_relaxed)) {
          auto ev =
              engine.TransferFromDevice(rig->buffer, 0, host_big.data(), big);
          if (!ev.ok() || !ev->Await().ok()) Die(ev.status(), "large d2h");
          large_done.fetch_add(1, std::memory_order_relaxed);
        }
      });
      // Let the first large transfer get going.
      while (large_done.load() == 0 &&
             engine.GetStats().pinned_bytes_now == 0) {
        std::this_thread::yield();
      }
    }
    std::vector<double> lat;
    const auto until = std::chrono::steady_clock::now() +
                       std::chrono::duration<double>(g_run_seconds);
    while (std::chrono::steady_clock::now() < until) {
      const auto t0 = std::chrono::steady_clock::now();
      auto ev = engine.TransferFromDevice(*small, 0, host_small.data(), 4096);
      if (!ev.ok() || !ev->Await().ok()) Die(ev.status(), "4 KiB d2h");
      lat.push_back(std::chrono::duration<double, std::micro>(
                        std::chrono::steady_clock::now() - t0)
                        .count());
    }
    stop = true;
    if (background.joinable()) background.join();
    return std::make_pair(Percentile(lat, 0.5), Percentile(lat, 0.99));
  };
  std::vector<double> p50[2], p99[2], ratio;
  for (auto _ : state) {
    for (int round = 0; round < g_hol_rounds; ++round) {
      const auto alone = one_round(false);
      const auto loaded = one_round(true);
      p50[0].push_back(alone.first);
      p99[0].push_back(alone.second);
      p50[1].push_back(loaded.first);
      p99[1].push_back(loaded.second);
      ratio.push_back(loaded.second / alone.second);
    }
  }
  state.counters["alone_p50_us"] = Percentile(p50[0], 0.5);
  state.counters["alone_p99_us"] = Percentile(p99[0], 0.5);
  state.counters["loaded_p50_us"] = Percentile(p50[1], 0.5);
  state.counters["loaded_p99_us"] = Percentile(p99[1], 0.5);
  state.counters["p99_ratio"] = Percentile(ratio, 0.5);
  state.counters["p99_ratio_min"] =
      *std::min_element(ratio.begin(), ratio.end());
  state.counters["p99_ratio_max"] =
      *std::max_element(ratio.begin(), ratio.end());
  auto freed = engine.Deallocate(*small);
  if (freed.ok()) (void)freed->Await();
}

// Synchronous round trips from pageable memory (host→device, await,
// device→host, await), as a test harness or a small host moves data: the
// region on (staged), the region off with the bounce pool, and the region
// off with no pool (every transfer pinned: what the region off cost before
// the pool). The three set-ups alternate in --hol-rounds rounds of
// --run-seconds / 3 each; the counters are medians over rounds of each
// round's p50/p99, and the p99 ratios to the region on, per round.
void BM_RoundTrip(benchmark::State& state, uint64_t n) {
  struct Setup {
    const char* name;
    Rig* rig;
    std::vector<double> p50, p99;
  };
  Setup setups[] = {{"region_on", &MainRig(), {}, {}},
                    {"bounce", &BounceRig(), {}, {}},
                    {"pinned", &RegionOffRig(), {}, {}}};
  HostBytes src = Warm(n, 4), dst = Warm(n, 5);
  std::vector<double> ratio[2];
  for (auto _ : state) {
    for (int round = 0; round < g_hol_rounds; ++round) {
      for (Setup& s : setups) {
        TransferEngine& engine = *s.rig->engine;
        std::vector<double> lat;
        const auto until = std::chrono::steady_clock::now() +
                           std::chrono::duration<double>(g_run_seconds / 3);
        while (std::chrono::steady_clock::now() < until) {
          const auto t0 = std::chrono::steady_clock::now();
          auto up = engine.TransferToDevice(src.data(), s.rig->buffer, 0, n);
          if (!up.ok() || !up->Await().ok()) Die(up.status(), "round trip");
          auto down =
              engine.TransferFromDevice(s.rig->buffer, 0, dst.data(), n);
          if (!down.ok() || !down->Await().ok()) {
            Die(down.status(), "round trip");
          }
          lat.push_back(std::chrono::duration<double, std::micro>(
                            std::chrono::steady_clock::now() - t0)
                            .count());
        }
        s.p50.push_back(Percentile(lat, 0.5));
        s.p99.push_back(Percentile(lat, 0.99));
      }
      ratio[0].push_back(setups[1].p99.back() / setups[0].p99.back());
      ratio[1].push_back(setups[2].p99.back() / setups[0].p99.back());
    }
  }
  for (Setup& s : setups) {
    state.counters[absl::StrCat(s.name, "_p50_us")] = Percentile(s.p50, 0.5);
    state.counters[absl::StrCat(s.name, "_p99_us")] = Percentile(s.p99, 0.5);
  }
  state.counters["bounce_p99_ratio"] = Percentile(ratio[0], 0.5);
  state.counters["bounce_p99_ratio_min"] =
      *std::min_element(ratio[0].begin(), ratio[0].end());
  state.counters["bounce_p99_ratio_max"] =
      *std::max_element(ratio[0].begin(), ratio[0].end());
  state.counters["pinned_p99_ratio"] = Percentile(ratio[1], 0.5);
}

// 64 transfers in flight, as a framework's input pipeline keeps them: each
// round submits 64 staged transfers of `bytes` from pageable memory, each
// into its own range of the device buffer, then awaits them all. Counters:
// transfers per second over the rounds of --run-seconds, the median of
// the rounds' rates and their range.
void BM_Depth64(benchmark::State& state, bool h2d, uint64_t bytes) {
  constexpr int kDepth = 64;
  Rig& rig = MainRig();
  TransferEngine& engine = *rig.engine;
  std::vector<HostBytes> host;
  for (int i = 0; i < kDepth; ++i) host.push_back(Warm(bytes, char(i)));
  std::vector<double> rates;
  uint64_t total = 0;
  double elapsed = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    const auto until = start + std::chrono::duration<double>(g_run_seconds);
    while (std::chrono::steady_clock::now() < until) {
      const auto t0 = std::chrono::steady_clock::now();
      std::vector<Event> events;
      events.reserve(kDepth);
      for (int i = 0; i < kDepth; ++i) {
        const uint64_t offset =
            (uint64_t(i) * bytes) % (g_max_size - bytes + 1);
        auto ev = h2d ? engine.TransferToDevice(host[i].data(), rig.buffer,
                                                offset, bytes)
                      : engine.TransferFromDevice(rig.buffer, offset,
                                                  host[i].data(), bytes);
        if (!ev.ok()) Die(ev.status(), "depth-64 transfer");
        events.push_back(*std::move(ev));
      }
      for (const Event& e : events) {
        if (!e.Await().ok()) Die(e.Await(), "depth-64 transfer");
      }
      const double s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
              .count();
      rates.push_back(kDepth / s);
      total += kDepth;
    }
    elapsed +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
  }
  state.counters["transfers_per_s"] = double(total) / elapsed;
  state.counters["round_median_per_s"] = Percentile(rates, 0.5);
  state.counters["round_min_per_s"] = Percentile(rates, 0.0);
  state.counters["round_max_per_s"] = Percentile(rates, 1.0);
}

// The largest size, side by side: each round times a memcpy and one
// transfer of every direction and path once, in a rotated order, and the
// figure per path is the median over rounds of memcpy time / transfer
// time. Memory bandwidth on a shared VM drifts by tens of percent within
// seconds; ratios taken within one round cancel the drift.
void BM_SideBySide(benchmark::State& state) {
  const uint64_t n = g_max_size;
  Rig& rig = MainRig();
  Rig& off = RegionOffRig();
  auto a = rig.region->allocator().Allocate(n);
  auto b = rig.region->allocator().Allocate(n);
  if (!a.ok() || !b.ok()) {
    state.SkipWithError("the region cannot hold two buffers of --max-size");
    return;
  }
  HostBytes heap = Warm(n, 7), heap2 = Warm(n, 8);
  std::memset(*a, 9, n);
  std::memset(*b, 9, n);
  struct Method {
    const char* name;
    std::function<void()> run;
  };
  auto transfer = [&](Rig& r, bool h2d, void* host) {
    auto ev = h2d ? r.engine->TransferToDevice(host, r.buffer, 0, n)
                  : r.engine->TransferFromDevice(r.buffer, 0, host, n);
    if (!ev.ok() || !ev->Await().ok()) Die(ev.status(), "side-by-side");
  };
  std::vector<Method> methods = {
      {"memcpy", [&] { std::memcpy(heap2.data(), heap.data(), n); }},
      {"h2d_staged", [&] { transfer(rig, true, heap.data()); }},
      {"h2d_zero_copy", [&] { transfer(rig, true, *a); }},
      {"h2d_pinned", [&] { transfer(off, true, heap.data()); }},
      {"d2h_staged", [&] { transfer(rig, false, heap2.data()); }},
      {"d2h_zero_copy", [&] { transfer(rig, false, *b); }},
      {"d2h_pinned", [&] { transfer(off, false, heap2.data()); }},
  };
  std::vector<std::vector<double>> ratios(methods.size());
  for (auto _ : state) {
    for (int round = 0; round < g_rounds; ++round) {
      std::vector<double> seconds(methods.size());
      for (size_t k = 0; k < methods.size(); ++k) {
        const size_t m = (k + round) % methods.size();
        const auto t0 = std::chrono::steady_clock::now();
        methods[m].run();
        seconds[m] =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
                .count();
      }
      for (size_t m = 0; m < methods.size(); ++m) {
        ratios[m].push_back(seconds[0] / seconds[m]);
      }
      state.counters["memcpy_GBps"] = double(n) / seconds[0] / 1e9;
    }
  }
  for (size_t m = 1; m < methods.size(); ++m) {
    state.counters[absl::StrCat(methods[m].name, "_over_memcpy")] =
        Percentile(ratios[m], 0.5);
  }
  (void)rig.region->allocator().Free(*a);
  (void)rig.region->allocator().Free(*b);
}

// One staged host→device transfer at a time; the caller's thread awaits
// host_released, then ready (never earlier than host_released).
void BM_HostReleased(benchmark::State& state) {
  const uint64_t n = g_max_size;
  Rig& rig = StagedRig();
  HostBytes src = Warm(n, 3);
  std::vector<double> released_ms, ready_ms, fraction;
  for (auto _ : state) {
    for (int round = 0; round < g_rounds; ++round) {
      const auto t0 = std::chrono::steady_clock::now();
      auto ev =
          rig.engine->TransferToDeviceWithEvents(src.data(), rig.buffer, 0, n);
      if (!ev.ok()) Die(ev.status(), "host_released");
      if (!ev->host_released.Await().ok()) Die(ev.status(), "host_released");
      const auto t1 = std::chrono::steady_clock::now();
      if (!ev->ready.Await().ok()) Die(ev.status(), "ready");
      const auto t2 = std::chrono::steady_clock::now();
      const double a =
          std::chrono::duration<double, std::milli>(t1 - t0).count();
      const double b =
          std::chrono::duration<double, std::milli>(t2 - t0).count();
      released_ms.push_back(a);
      ready_ms.push_back(b);
      fraction.push_back(a / b);
    }
  }
  state.counters["released_ms"] = Percentile(released_ms, 0.5);
  state.counters["ready_ms"] = Percentile(ready_ms, 0.5);
  state.counters["released_over_ready"] = Percentile(fraction, 0.5);
  state.counters["released_over_ready_max"] = Percentile(fraction, 1.0);
}

std::vector<int64_t> Sizes() {
  std::vector<int64_t> sizes;
  for (uint64_t s = 4096; s <= g_max_size; s *= 16) sizes.push_back(s);
  if (sizes.back() != static_cast<int64_t>(g_max_size)) {
    sizes.push_back(g_max_size);
  }
  return sizes;
}

void Register() {
  const std::vector<int64_t> sizes = Sizes();
  for (int64_t s : sizes) {
    benchmark::RegisterBenchmark(
        absl::StrCat("BM_Memcpy/", s).c_str(),
        [s](benchmark::State& st) { BM_Memcpy(st, s); })
        ->UseRealTime();
  }
  const char* paths[] = {"zero_copy", "staged", "pinned"};
  for (int dir = 0; dir < 2; ++dir) {
    for (int p = 0; p < 3; ++p) {
      for (int64_t s : sizes) {
        benchmark::RegisterBenchmark(
            absl::StrCat("BM_Transfer/", dir == 0 ? "h2d" : "d2h", "/",
                         paths[p], "/", s)
                .c_str(),
            [dir, p, s](benchmark::State& st) {
              BM_Transfer(st, dir == 0, static_cast<TransferPath>(p), s);
            })
            ->UseRealTime();
      }
    }
  }
  benchmark::RegisterBenchmark("BM_SideBySide", BM_SideBySide)
      ->Iterations(1)
      ->UseRealTime();
  for (const uint64_t bytes : {uint64_t{4096}, uint64_t{64} << 10}) {
    for (const bool h2d : {true, false}) {
      benchmark::RegisterBenchmark(
          absl::StrCat("BM_Depth64/", h2d ? "h2d" : "d2h", "/", bytes).c_str(),
          [h2d, bytes](benchmark::State& st) { BM_Depth64(st, h2d, bytes); })
          ->Iterations(1)
          ->UseRealTime();
    }
  }
  benchmark::RegisterBenchmark("BM_HostReleased", BM_HostReleased)
      ->Iterations(1)
      ->UseRealTime();
  for (int dir = 0; dir < 2; ++dir) {
    for (int t : {1, 2, 8}) {
      benchmark::RegisterBenchmark(
          absl::StrCat("BM_Latency4K/", dir == 0 ? "h2d" : "d2h",
                       "/threads:", t)
              .c_str(),
          [dir, t](benchmark::State& st) { BM_Latency4K(st, dir == 0, t); })
          ->Iterations(1)
          ->UseRealTime();
    }
  }
  for (int t : {1, 2, 8}) {
    benchmark::RegisterBenchmark(
        absl::StrCat("BM_Aggregate1M/threads:", t).c_str(),
        [t](benchmark::State& st) { BM_Aggregate1M(st, t); })
        ->Iterations(1)
        ->UseRealTime();
  }
  for (auto [name, setup] :
       {std::pair{"BM_HeadOfLine/region_on", HolSetup::kRegionOn},
        std::pair{"BM_HeadOfLine/region_off", HolSetup::kRegionOff},
        std::pair{"BM_HeadOfLine/cpu_only", HolSetup::kCpuOnly}}) {
    benchmark::RegisterBenchmark(
        name, [setup](benchmark::State& st) { BM_HeadOfLine(st, setup); })
        ->Iterations(1)
        ->UseRealTime();
  }
  for (uint64_t n : {uint64_t{4} << 10, uint64_t{64} << 10, uint64_t{256} << 10,
                     uint64_t{1} << 20}) {
    if (n > g_max_size) break;
    benchmark::RegisterBenchmark(
        absl::StrCat("BM_RoundTrip/", n).c_str(),
        [n](benchmark::State& st) { BM_RoundTrip(st, n); })
        ->Iterations(1)
        ->UseRealTime();
  }
  benchmark::RegisterBenchmark(
      absl::StrCat("BM_Link25/", g_max_size).c_str(),
      [](benchmark::State& st) { BM_Link25(st, g_max_size); })
      ->UseRealTime();
}

// Keeps every run's figures for the ratio summary, and prints as usual.
class SummaryReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs) {
      const std::string name = r.benchmark_name();
      auto bps = r.counters.find("bytes_per_second");
      if (bps != r.counters.end()) rate_[name] = bps->second.value;
      for (const auto& [k, v] : r.counters) counter_[name + ":" + k] = v.value;
    }
    ConsoleReporter::ReportRuns(runs);
  }

  void PrintSummary() const {
    const std::string big = std::to_string(g_max_size);
    auto rate = [&](const std::string& n) {
      auto it = rate_.find(n);
      return it == rate_.end() ? 0.0 : it->second;
    };
    auto counter = [&](const std::string& n) {
      auto it = counter_.find(n);
      return it == counter_.end() ? 0.0 : it->second;
    };
    printf(
        "\nRatios measured in this run (largest size %s, %d rounds "
        "side by side):\n",
        big.c_str(), g_rounds);
    printf("  %-44s %10s %8s\n", "figure", "measured", "goal");
    auto row = [](const std::string& what, double v, const char* goal) {
      printf("  %-44s %10.3f %8s\n", what.c_str(), v, goal);
    };
    const std::string sbs = "BM_SideBySide/iterations:1/real_time:";
    row("memcpy GB/s (one thread, last round)", counter(sbs + "memcpy_GBps"),
        "");
    for (const char* dir : {"h2d", "d2h"}) {
      for (const char* path : {"staged", "zero_copy", "pinned"}) {
        const char* goal = absl::string_view(path) == "staged"      ? ">=0.8"
                           : absl::string_view(path) == "zero_copy" ? ">=0.9"
                                                                    : "";
        row(absl::StrCat(dir, " ", path, " / memcpy (median)"),
            counter(absl::StrCat(sbs, dir, "_", path, "_over_memcpy")), goal);
      }
    }
    for (const char* dir : {"h2d", "d2h"}) {
      for (int t : {1, 2, 8}) {
        const std::string n = absl::StrCat("BM_Latency4K/", dir, "/threads:", t,
                                           "/iterations:1/real_time");
        row(absl::StrCat("4 KiB ", dir, " p50 us, ", t, " thread(s)"),
            counter(n + ":p50_us"), t == 1 ? "<=5" : "");
        row(absl::StrCat("4 KiB ", dir, " p99 us, ", t, " thread(s)"),
            counter(n + ":p99_us"), "");
      }
    }
    const double one =
        counter("BM_Aggregate1M/threads:1/iterations:1/real_time:GBps");
    const double eight =
        counter("BM_Aggregate1M/threads:8/iterations:1/real_time:GBps");
    row("1 MiB h2d aggregate, 8 threads / 1 thread", one > 0 ? eight / one : 0,
        ">=0.9");
    for (const char* setup : {"region_on", "region_off", "cpu_only"}) {
      const bool control = absl::string_view(setup) == "cpu_only";
      const std::string n =
          absl::StrCat("BM_HeadOfLine/", setup, "/iterations:1/real_time:");
      row(absl::StrCat("4 KiB d2h p99 us, device 1 alone (", setup, ")"),
          counter(n + "alone_p99_us"), "");
      row(control
              ? absl::StrCat("  ... while a thread locks, fills, unlocks ", big,
                             " bytes")
              : absl::StrCat("  ... while device 0 pins ", big, "-byte d2h"),
          counter(n + "loaded_p99_us"), "");
      row(absl::StrFormat("  loaded / alone p99 (range %.2f-%.2f)",
                          counter(n + "p99_ratio_min"),
                          counter(n + "p99_ratio_max")),
          counter(n + "p99_ratio"), control ? "" : "<=2");
    }
    for (const char* size : {"4096", "65536", "262144", "1048576"}) {
      const std::string n =
          absl::StrCat("BM_RoundTrip/", size, "/iterations:1/real_time:");
      if (counter(n + "region_on_p50_us") == 0) continue;
      for (const char* setup : {"region_on", "bounce", "pinned"}) {
        row(absl::StrCat(size, " B round trip p50/p99 us (", setup, ")"),
            counter(absl::StrCat(n, setup, "_p50_us")), "");
        row("", counter(absl::StrCat(n, setup, "_p99_us")), "");
      }
      row(absl::StrFormat("  region off / on p99, bounce (range %.2f-%.2f)",
                          counter(n + "bounce_p99_ratio_min"),
                          counter(n + "bounce_p99_ratio_max")),
          counter(n + "bounce_p99_ratio"),
          absl::string_view(size) == "4096" ? "<=2" : "");
      row("  region off / on p99, no pool (pinned)",
          counter(n + "pinned_p99_ratio"), "");
    }
    const std::string hr = "BM_HostReleased/iterations:1/real_time:";
    row("staged h2d: ms to host_released (median)", counter(hr + "released_ms"),
        "");
    row("staged h2d: ms to ready (median)", counter(hr + "ready_ms"), "");
    row("  host_released / ready (median; <1 = earlier)",
        counter(hr + "released_over_ready"), "<1");
    const double link = rate("BM_Link25/" + big + "/real_time");
    row("link_gbps=25 throughput / modelled link", link / (25e9 / 8), ">=0.95");
  }

 private:
  std::map<std::string, double> rate_;
  std::map<std::string, double> counter_;
};

}  // namespace
}  // namespace tpushim

int main(int argc, char** argv) {
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    absl::string_view arg(argv[i]);
    if (absl::ConsumePrefix(&arg, "--max-size=")) {
      auto v = tpushim::ParseByteSize(arg, "--max-size");
      if (!v.ok() || *v < 4096) tpushim::Die(v.status(), "--max-size");
      tpushim::g_max_size = *v;
    } else if (absl::ConsumePrefix(&arg, "--region=")) {
      auto v = tpushim::ParseByteSize(arg, "--region");
      if (!v.ok()) tpushim::Die(v.status(), "--region");
      tpushim::g_region = *v;
    } else if (absl::ConsumePrefix(&arg, "--chunk=")) {
      auto v = tpushim::ParseByteSize(arg, "--chunk");
      if (!v.ok()) tpushim::Die(v.status(), "--chunk");
      tpushim::g_config.chunk_bytes = *v;
    } else if (absl::ConsumePrefix(&arg, "--d2h-chunk=")) {
      auto v = tpushim::ParseByteSize(arg, "--d2h-chunk");
      if (!v.ok()) tpushim::Die(v.status(), "--d2h-chunk");
      tpushim::g_config.from_device_chunk_bytes = *v;
    } else if (absl::ConsumePrefix(&arg, "--descriptor=")) {
      auto v = tpushim::ParseByteSize(arg, "--descriptor");
      if (!v.ok()) tpushim::Die(v.status(), "--descriptor");
      tpushim::g_config.descriptor_bytes = *v;
    } else if (absl::ConsumePrefix(&arg, "--rounds=")) {
      tpushim::g_rounds = std::max(1, std::stoi(std::string(arg)));
    } else if (absl::ConsumePrefix(&arg, "--depth=")) {
      tpushim::g_config.staging_depth = std::stoi(std::string(arg));
    } else if (absl::ConsumePrefix(&arg, "--hol-rounds=")) {
      tpushim::g_hol_rounds = std::max(1, std::stoi(std::string(arg)));
    } else if (absl::ConsumePrefix(&arg, "--run-seconds=")) {
      tpushim::g_run_seconds = std::stod(std::string(arg));
    } else {
      rest.push_back(argv[i]);
    }
  }
  int rest_argc = static_cast<int>(rest.size());
  benchmark::Initialize(&rest_argc, rest.data());
  tpushim::Register();
  tpushim::SummaryReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  reporter.PrintSummary();
  benchmark::Shutdown();
  return 0;
}
