// Relayout kernels against the machine's own memcpy, side by side in one
// run.
//
//   BM_SideBySide/<shape>   R rounds (--rounds, default 15); each round times,
//                           in a rotated order, on one thread:
//     memcpy        the device image's bytes, host buffer -> image buffer
//     pack          RelayoutPlan::Pack of the whole image (host -> device)
//     unpack        RelayoutPlan::Unpack of the whole image (device -> host)
//     memcpy_chunk_h2d  the same bytes in 512 KiB pieces into one reused
//                   512 KiB staging buffer (as the staged transfer path does)
//     pack_chunk    Pack of each 512 KiB range into that staging buffer
//     memcpy_chunk_d2h  the staging buffer into each 512 KiB piece of an
//                   image-sized buffer
//     unpack_chunk  Unpack of each 512 KiB range from that staging buffer
//   The ratio memcpy time / relayout time is taken within each round (the
//   whole-image ones against memcpy, each chunked one against the memcpy
//   of its direction) and reported as median [min, max] over the rounds.
//
//   BM_Transfer/<shape>     whole transfers through tpushim::System on
//                           sim:// (a 256 MiB region, everything staged),
//                           R rounds, rotated:
//     memcpy        the dense host array into another host buffer (one
//                   thread): the reference for every row below
//     array_h2d     TransferArrayToDevice, awaited: the relayout is the copy
//                   into each staging chunk, overlapped with the DMA
//     array_d2h     TransferArrayFromDevice, awaited
//     bytes_h2d     TransferToDevice of the device image's bytes as they are
//     bytes_d2h     TransferFromDevice of them
//   The ratio is the method's bandwidth in bytes of the host array (for
//   bytes_*, of the image) over memcpy's, within each round.
//
//   BM_RegionOff            the region off: array transfers against byte
//                           transfers of the same size, side by side
//                           (4 KiB round trips, --run-ms each per round;
//                           32 MiB up and down); goals: an array's round
//                           trip <= 2x the bytes', 32 MiB >= 0.8x.
//
// Shapes: f32[N,N]{1,0:T(8,128)} (no padding) and f32[N,N+4]{1,0:T(8,128)}
// (the minor dimension padded from N+4 to N+128), N = --n (default 4096).
// Goals: >= 0.8 without padding, >= 0.5 with it.
//
// CI runs --n=512 --rounds=2.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "benchmark/benchmark.h"
#include "device/xla_shape.h"
#include "tpushim/options.h"
#include "tpushim/system.h"
#include "transfer/relayout.h"

namespace tpushim {
namespace {

int64_t g_n = 4096;
int g_rounds = 15;
constexpr uint64_t kChunk = 512 << 10;

void Die(const absl::Status& s, const char* what) {
  fprintf(stderr, "relayout_bench: %s: %s\n", what, s.ToString().c_str());
  exit(2);
}

struct Ratio {
  double median = 0, min = 0, max = 0;
};
Ratio Summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v.front(), v.back()};
}

struct Row {
  std::string shape, method;
  Ratio ratio;
  double gbps = 0;  // median device-image bytes per second of the method
};
std::vector<Row> g_rows;

void BM_SideBySide(benchmark::State& state, const std::string& text) {
  absl::StatusOr<ArrayShape> shape = ParseArrayShape(text);
  if (!shape.ok()) Die(shape.status(), "shape");
  absl::StatusOr<RelayoutPlan> plan = RelayoutPlan::Create(*shape);
  if (!plan.ok()) Die(plan.status(), "plan");
  const uint64_t dev_bytes = plan->device_bytes();
  // Warm (touched) buffers.
  std::vector<char> host(plan->host_bytes(), 1), host2(plan->host_bytes(), 2);
  std::vector<char> image(dev_bytes, 3), src(dev_bytes, 4), staging(kChunk, 5);
  // memcpy's source and destination, image-sized.
  std::vector<char> host_src(dev_bytes, 6), host_dst(dev_bytes, 7);
  auto check = [](const absl::Status& s) {
    if (!s.ok()) Die(s, "relayout");
  };
  auto chunks = [&](const std::function<void(uint64_t, uint64_t)>& f) {
    for (uint64_t off = 0; off < dev_bytes; off += kChunk) {
      f(off, std::min(kChunk, dev_bytes - off));
    }
  };
  struct Method {
    const char* name;
    std::function<void()> run;
    int reference;  // index of the memcpy it is compared with
  };
  std::vector<Method> methods = {
      {"memcpy", [&] { std::memcpy(image.data(), host_src.data(), dev_bytes); },
       0},
      {"pack",
       [&] { check(plan->Pack(host.data(), 0, dev_bytes, image.data())); }, 0},
      {"unpack",
       [&] { check(plan->Unpack(src.data(), 0, dev_bytes, host2.data())); }, 0},
      {"memcpy_chunk_h2d",
       [&] {
         chunks([&](uint64_t off, uint64_t n) {
           std::memcpy(staging.data(), host_src.data() + off, n);
           benchmark::ClobberMemory();
         });
       },
       3},
      {"pack_chunk",
       [&] {
         chunks([&](uint64_t off, uint64_t n) {
           check(plan->Pack(host.data(), off, n, staging.data()));
           benchmark::ClobberMemory();
         });
       },
       3},
      {"memcpy_chunk_d2h",
       [&] {
         chunks([&](uint64_t off, uint64_t n) {
           std::memcpy(host_dst.data() + off, staging.data(), n);
         });
       },
       5},
      {"unpack_chunk",
       [&] {
         chunks([&](uint64_t off, uint64_t n) {
           check(plan->Unpack(staging.data(), off, n, host2.data()));
         });
       },
       5},
  };
  std::vector<std::vector<double>> ratios(methods.size()),
      rates(methods.size());
  for (auto _ : state) {
    for (const Method& m : methods) m.run();  // warm-up round
    for (int round = 0; round < g_rounds; ++round) {
      std::vector<double> seconds(methods.size());
      for (size_t k = 0; k < methods.size(); ++k) {
        const size_t m = (k + size_t(round)) % methods.size();
        const auto t0 = std::chrono::steady_clock::now();
        methods[m].run();
        benchmark::ClobberMemory();
        seconds[m] =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
                .count();
      }
      for (size_t m = 0; m < methods.size(); ++m) {
        ratios[m].push_back(seconds[methods[m].reference] / seconds[m]);
        rates[m].push_back(double(dev_bytes) / seconds[m] / 1e9);
      }
    }
  }
  for (size_t m = 0; m < methods.size(); ++m) {
    const Ratio r = Summarize(ratios[m]);
    const double gbps = Summarize(rates[m]).median;
    state.counters[absl::StrCat(methods[m].name, "_GBps")] = gbps;
    if (methods[m].reference != int(m)) {
      state.counters[absl::StrCat(methods[m].name, "_ratio")] = r.median;
    }
    g_rows.push_back({ToString(*shape), methods[m].name, r, gbps});
  }
}

void BM_Transfer(benchmark::State& state, const std::string& text) {
  OptionOverrides overrides;
  overrides.premapped_buffer_size = uint64_t{256} << 20;
  overrides.premapped_buffer_transfer_threshold_bytes = uint64_t{256} << 20;
  overrides.device = "sim://?hbm=1G";
  overrides.log_dir = "disabled";
  absl::StatusOr<std::unique_ptr<System>> system = System::Create(overrides);
  if (!system.ok()) Die(system.status(), "system");
  System& sys = **system;
  absl::StatusOr<DeviceBuffer> buffer =
      sys.AllocateDevice(0, DeviceBufferSpec{.shape = text});
  if (!buffer.ok()) Die(buffer.status(), "allocate");
  const uint64_t host_bytes = buffer->host_size();
  const uint64_t dev_bytes = buffer->size();
  std::vector<char> host(host_bytes, 1), host2(host_bytes, 2);
  std::vector<char> image(dev_bytes, 3), image2(dev_bytes, 4);
  auto wait = [](absl::StatusOr<Event> e) {
    if (!e.ok()) Die(e.status(), "submit");
    absl::Status s = e->Await();
    if (!s.ok()) Die(s, "transfer");
  };
  struct Method {
    const char* name;
    std::function<void()> run;
    uint64_t bytes;
  };
  std::vector<Method> methods = {
      {"memcpy", [&] { std::memcpy(host2.data(), host.data(), host_bytes); },
       host_bytes},
      {"array_h2d",
       [&] { wait(sys.TransferArrayToDevice(host.data(), *buffer)); },
       host_bytes},
      {"array_d2h",
       [&] { wait(sys.TransferArrayFromDevice(*buffer, host2.data())); },
       host_bytes},
      {"bytes_h2d",
       [&] { wait(sys.TransferToDevice(image.data(), *buffer, 0, dev_bytes)); },
       dev_bytes},
      {"bytes_d2h",
       [&] {
         wait(sys.TransferFromDevice(*buffer, 0, image2.data(), dev_bytes));
       },
       dev_bytes},
  };
  std::vector<std::vector<double>> ratios(methods.size()),
      rates(methods.size());
  for (auto _ : state) {
    for (const Method& m : methods) m.run();  // warm-up round
    for (int round = 0; round < g_rounds; ++round) {
      std::vector<double> seconds(methods.size());
      double memcpy_seconds = 0;
      for (size_t k = 0; k < methods.size(); ++k) {
        const size_t m = (k + size_t(round)) % methods.size();
        const auto t0 = std::chrono::steady_clock::now();
        methods[m].run();
        benchmark::ClobberMemory();
        const double t =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
                .count();
        seconds[m] = t;
        if (m == 0) memcpy_seconds = t;
      }
      const double memcpy_rate = double(host_bytes) / memcpy_seconds;
      for (size_t m = 0; m < methods.size(); ++m) {
        const double rate = double(methods[m].bytes) / seconds[m];
        ratios[m].push_back(rate / memcpy_rate);
        rates[m].push_back(rate / 1e9);
      }
    }
  }
  for (size_t m = 0; m < methods.size(); ++m) {
    const Ratio r = Summarize(ratios[m]);
    const double gbps = Summarize(rates[m]).median;
    state.counters[absl::StrCat(methods[m].name, "_GBps")] = gbps;
    if (m != 0) {
      state.counters[absl::StrCat(methods[m].name, "_ratio")] = r.median;
    }
    g_rows.push_back(
        {buffer->shape(), absl::StrCat("transfer:", methods[m].name), r, gbps});
  }
}

// The region off (TPU_PREMAPPED_BUFFER_SIZE=0): array transfers against
// byte transfers of the same size, side by side, R rounds rotated.
//   round trips: synchronous host→device→host of 4 KiB: the bytes; an
//     array whose device image is its bytes (f32[1024]); an array laid out
//     with padding (f32[32,32], image 16 KiB). Median over the rounds of
//     each round's p50 latency over --run-ms.
//   32 MiB: an array laid out without padding (f32[8192,1024] tiled
//     T(8,128)) up and down, against the byte transfer of its 32 MiB
//     (pinned, above the bounce pool's 1 MiB): bandwidth ratio per round.
double g_run_ms = 200;

void BM_RegionOff(benchmark::State& state) {
  OptionOverrides overrides;
  overrides.premapped_buffer_size = 0;
  overrides.device = "sim://?hbm=1G";
  overrides.log_dir = "disabled";
  absl::StatusOr<std::unique_ptr<System>> system = System::Create(overrides);
  if (!system.ok()) Die(system.status(), "system");
  System& sys = **system;
  auto wait = [](absl::StatusOr<Event> e) {
    if (!e.ok()) Die(e.status(), "submit");
    absl::Status s = e->Await();
    if (!s.ok()) Die(s, "transfer");
  };
  auto allocate = [&](const std::string& shape) {
    absl::StatusOr<DeviceBuffer> b =
        sys.AllocateDevice(0, DeviceBufferSpec{.shape = shape});
    if (!b.ok()) Die(b.status(), "allocate");
    return *b;
  };
  // Round trips of 4 KiB.
  const DeviceBuffer bytes4k = [&] {
    absl::StatusOr<DeviceBuffer> b = sys.AllocateDevice(0, 4096);
    if (!b.ok()) Die(b.status(), "allocate");
    return *b;
  }();
  const DeviceBuffer dense4k = allocate("f32[1024]");
  const DeviceBuffer padded4k = allocate("f32[32,32]");
  std::vector<char> src(4096, 1), dst(4096, 2);
  struct Trip {
    const char* name;
    std::function<void()> run;
    std::vector<double> p50;
  };
  std::vector<Trip> trips = {
      {"bytes",
       [&] {
         wait(sys.TransferToDevice(src.data(), bytes4k, 0, 4096));
         wait(sys.TransferFromDevice(bytes4k, 0, dst.data(), 4096));
       },
       {}},
      {"array_dense",
       [&] {
         wait(sys.TransferArrayToDevice(src.data(), dense4k));
         wait(sys.TransferArrayFromDevice(dense4k, dst.data()));
       },
       {}},
      {"array_padded",
       [&] {
         wait(sys.TransferArrayToDevice(src.data(), padded4k));
         wait(sys.TransferArrayFromDevice(padded4k, dst.data()));
       },
       {}},
  };
  // 32 MiB.
  const std::string big_shape = "f32[8192,1024]{1,0:T(8,128)}";
  const DeviceBuffer big = allocate(big_shape);
  const uint64_t n = big.host_size();
  std::vector<char> host(n, 3), host2(n, 4);
  struct Method {
    const char* name;
    std::function<void()> run;
    std::vector<double> rate;
  };
  std::vector<Method> methods = {
      {"bytes_h2d",
       [&] { wait(sys.TransferToDevice(host.data(), big, 0, n)); },
       {}},
      {"array_h2d",
       [&] { wait(sys.TransferArrayToDevice(host.data(), big)); },
       {}},
      {"bytes_d2h",
       [&] { wait(sys.TransferFromDevice(big, 0, host2.data(), n)); },
       {}},
      {"array_d2h",
       [&] { wait(sys.TransferArrayFromDevice(big, host2.data())); },
       {}},
  };
  for (auto _ : state) {
    for (Trip& t : trips) t.run();
    for (Method& m : methods) m.run();
    for (int round = 0; round < g_rounds; ++round) {
      for (size_t k = 0; k < trips.size(); ++k) {
        Trip& t = trips[(k + size_t(round)) % trips.size()];
        std::vector<double> lat;
        const auto until = std::chrono::steady_clock::now() +
                           std::chrono::duration<double, std::milli>(g_run_ms);
        while (std::chrono::steady_clock::now() < until) {
          const auto t0 = std::chrono::steady_clock::now();
          t.run();
          lat.push_back(std::chrono::duration<double, std::micro>(
                            std::chrono::steady_clock::now() - t0)
                            .count());
        }
        std::nth_element(lat.begin(), lat.begin() + lat.size() / 2, lat.end());
        t.p50.push_back(lat[lat.size() / 2]);
      }
      for (size_t k = 0; k < methods.size(); ++k) {
        Method& m = methods[(k + size_t(round)) % methods.size()];
        const auto t0 = std::chrono::steady_clock::now();
        m.run();
        m.rate.push_back(
            double(n) / 1e9 /
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
                .count());
      }
    }
  }
  printf("\nRegion off, %d rounds side by side (median [min, max]):\n",
         g_rounds);
  std::vector<double> p50_ratio[2];
  for (int round = 0; round < g_rounds; ++round) {
    p50_ratio[0].push_back(trips[1].p50[round] / trips[0].p50[round]);
    p50_ratio[1].push_back(trips[2].p50[round] / trips[0].p50[round]);
  }
  for (size_t t = 0; t < trips.size(); ++t) {
    const Ratio p = Summarize(trips[t].p50);
    state.counters[absl::StrCat("rt4k_", trips[t].name, "_p50_us")] = p.median;
    printf("  4 KiB round trip %-13s p50 %7.1f us [%.1f, %.1f]", trips[t].name,
           p.median, p.min, p.max);
    if (t > 0) {
      const Ratio r = Summarize(p50_ratio[t - 1]);
      state.counters[absl::StrCat("rt4k_", trips[t].name, "_over_bytes")] =
          r.median;
      printf("  %.2f [%.2f, %.2f] of the bytes' (goal <= 2)", r.median, r.min,
             r.max);
    }
    printf("\n");
  }
  for (size_t m = 0; m < methods.size(); ++m) {
    const Ratio r = Summarize(methods[m].rate);
    state.counters[absl::StrCat("32m_", methods[m].name, "_GBps")] = r.median;
    printf("  32 MiB %-10s %6.2f GB/s [%.2f, %.2f]", methods[m].name, r.median,
           r.min, r.max);
    if (m % 2 == 1) {
      std::vector<double> ratio;
      for (int round = 0; round < g_rounds; ++round) {
        ratio.push_back(methods[m].rate[round] / methods[m - 1].rate[round]);
      }
      const Ratio q = Summarize(ratio);
      state.counters[absl::StrCat("32m_", methods[m].name, "_over_bytes")] =
          q.median;
      printf("  %.2f [%.2f, %.2f] of the bytes' (goal >= 0.8)", q.median, q.min,
             q.max);
    }
    printf("\n");
  }
  for (const DeviceBuffer& b : {bytes4k, dense4k, padded4k, big}) {
    (void)sys.Deallocate(b);
  }
}

void PrintSummary() {
  printf(
      "\nAgainst one-thread memcpy, %d rounds side by side (median [min, "
      "max]); kernels: memcpy time / relayout time; transfer:* rows: "
      "bandwidth / memcpy's:\n",
      g_rounds);
  printf("  %-30s %-17s %6s %18s %6s %4s\n", "shape", "method", "GB/s",
         "ratio [min, max]", "goal", "met");
  for (const Row& r : g_rows) {
    const bool reference = r.method.rfind("memcpy", 0) == 0 ||
                           r.method == "transfer:memcpy" ||
                           r.method.rfind("transfer:bytes", 0) == 0;
    const bool padded =
        r.shape.find(absl::StrCat(",", g_n, "]")) == std::string::npos;
    const double goal = padded ? 0.5 : 0.8;
    printf("  %-30s %-17s %6.2f %18s %6s %4s\n", r.shape.c_str(),
           r.method.c_str(), r.gbps,
           r.method == "transfer:memcpy" || r.method.rfind("memcpy", 0) == 0
               ? "-"
               : absl::StrFormat("%.2f [%.2f, %.2f]", r.ratio.median,
                                 r.ratio.min, r.ratio.max)
                     .c_str(),
           reference ? "" : absl::StrFormat(">=%.1f", goal).c_str(),
           reference ? "" : (r.ratio.median >= goal ? "yes" : "NO"));
  }
}

}  // namespace
}  // namespace tpushim

int main(int argc, char** argv) {
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    absl::string_view arg(argv[i]);
    if (absl::ConsumePrefix(&arg, "--n=")) {
      tpushim::g_n = std::max(128, std::atoi(std::string(arg).c_str()));
    } else if (absl::ConsumePrefix(&arg, "--run-ms=")) {
      tpushim::g_run_ms = std::max(1, std::atoi(std::string(arg).c_str()));
    } else if (absl::ConsumePrefix(&arg, "--rounds=")) {
      tpushim::g_rounds = std::max(1, std::atoi(std::string(arg).c_str()));
    } else {
      rest.push_back(argv[i]);
    }
  }
  int rest_argc = static_cast<int>(rest.size());
  benchmark::Initialize(&rest_argc, rest.data());
  for (int64_t minor : {tpushim::g_n, tpushim::g_n + 4}) {
    const std::string text =
        absl::StrCat("f32[", tpushim::g_n, ",", minor, "]{1,0:T(8,128)}");
    benchmark::RegisterBenchmark(
        absl::StrCat("BM_SideBySide/", text).c_str(),
        [text](benchmark::State& st) { tpushim::BM_SideBySide(st, text); })
        ->Iterations(1)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  for (int64_t minor : {tpushim::g_n, tpushim::g_n + 4}) {
    const std::string text =
        absl::StrCat("f32[", tpushim::g_n, ",", minor, "]{1,0:T(8,128)}");
    benchmark::RegisterBenchmark(
        absl::StrCat("BM_Transfer/", text).c_str(),
        [text](benchmark::State& st) { tpushim::BM_Transfer(st, text); })
        ->Iterations(1)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  benchmark::RegisterBenchmark("BM_RegionOff", tpushim::BM_RegionOff)
      ->Iterations(1)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
  benchmark::RunSpecifiedBenchmarks();
  tpushim::PrintSummary();
  benchmark::Shutdown();
  return 0;
}
