// Registered host memory (System::RegisterHostMemory) side by side with
// what it replaces, interleaved in one run (the order rotates each round;
// memory bandwidth on a shared VM drifts by tens of percent within
// seconds, so each ratio is taken within its round and the figure is the
// median of the rounds' ratios, with their spread):
//
//   transfer   a --size (256 MiB) host→device and device→host transfer of
//              a registered caller buffer, against a one-thread memcpy of
//              the same size between warm buffers; goal >= 0.9x memcpy.
//              The same transfers from an unregistered buffer (the pinned
//              path they take without registering) for reference.
//   register   RegisterHostMemory of a --reg-size (1 GiB) populated range
//              against mlock() of the same range; goal <= 1.2x mlock. On
//              huge pages and on 4 KiB pages: mlock's cost is per mapped
//              page, so one 2 MiB page costs it what one 4 KiB page does,
//              while the kernel's long-term pin that registering takes
//              costs per 4 KiB page either way. Also the whole
//              cycle, register + unregister against mlock + munlock, and
//              the long-term pin alone (io_uring, as registering takes it)
//              against mlock: the floor of registering.
//
//              Also on fresh mappings (nothing populated yet), where both
//              fault the range in.
//
//   registered_bench [--size=256M] [--reg-size=1G] [--rounds=9]
//
// The region (4 x --size) holds buffers for its own zero-copy path, shown
// beside the registered one; the registered buffers lie outside it. One
// simulated device, link unthrottled.

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "env/device_url.h"
#include "env/os.h"
#include "env/posix/io_uring_pins.h"
#include "tpushim/system.h"

namespace {

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "registered_bench: %s\n", what.c_str());
  std::exit(1);
}

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  const size_t i = static_cast<size_t>(p * (v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

// Populated anonymous memory: huge pages where the kernel gives them (as
// NumPy asks for its large arrays), or 4 KiB pages (as the kernel hands
// out memory nobody advised, in THP's `madvise` mode).
char* Populated(uint64_t n, int value, bool huge_pages = true) {
  void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) Die("mmap");
  (void)madvise(p, n, huge_pages ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  std::memset(p, value, n);
  return static_cast<char*>(p);
}

double Seconds(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
      .count();
}

void Row(const char* what, const std::vector<double>& ratios,
         const char* goal) {
  std::printf("%-46s median %.3f  (min %.3f, max %.3f, %zu rounds)  %s\n", what,
              Percentile(ratios, 0.5), Percentile(ratios, 0.0),
              Percentile(ratios, 1.0), ratios.size(), goal);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tpushim;
  uint64_t size = uint64_t{256} << 20;
  uint64_t reg_size = uint64_t{1} << 30;
  int rounds = 9;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg(argv[i]);
    if (absl::ConsumePrefix(&arg, "--size=")) {
      absl::StatusOr<uint64_t> v = ParseByteSize(arg, "--size");
      if (!v.ok() || *v < 4096) Die("--size takes bytes or 256M, at least 4K");
      size = *v;
    } else if (absl::ConsumePrefix(&arg, "--reg-size=")) {
      absl::StatusOr<uint64_t> v = ParseByteSize(arg, "--reg-size");
      if (!v.ok() || *v < 4096)
        Die("--reg-size takes bytes or 1G, at least 4K");
      reg_size = *v;
    } else if (absl::ConsumePrefix(&arg, "--rounds=")) {
      if (!absl::SimpleAtoi(arg, &rounds) || rounds < 1) {
        Die("--rounds takes a positive integer");
      }
    } else {
      Die("unknown argument " + std::string(arg) +
          " (flags: --size=<bytes|256M>, --reg-size=<bytes|1G>, --rounds=N)");
    }
  }
  size = (size + 4095) / 4096 * 4096;
  reg_size = (reg_size + 4095) / 4096 * 4096;

  // A region holding two transfers' buffers, for the region's zero-copy
  // path beside the registered one.
  OptionOverrides o;
  o.premapped_buffer_size = 4 * size;
  o.premapped_buffer_transfer_threshold_bytes = size;
  o.device = absl::StrCat("sim://?hbm=", size * 2);
  o.log_dir = "disabled";
  absl::StatusOr<std::unique_ptr<System>> created = System::Create(o);
  if (!created.ok()) Die(created.status().ToString());
  System& system = **created;
  absl::StatusOr<DeviceBuffer> dev = system.AllocateDevice(0, size);
  if (!dev.ok()) Die(dev.status().ToString());

  char* const src = Populated(size, 1);    // registered: host→device
  char* const dst = Populated(size, 2);    // registered: device→host
  char* const plain = Populated(size, 3);  // memcpy target; unregistered
  absl::StatusOr<HostRegistration> src_reg =
      system.RegisterHostMemory(src, size);
  absl::StatusOr<HostRegistration> dst_reg =
      system.RegisterHostMemory(dst, size);
  if (!src_reg.ok()) Die(src_reg.status().ToString());
  if (!dst_reg.ok()) Die(dst_reg.status().ToString());
  if (system.PathFor(src, size) != TransferPath::kZeroCopy) {
    Die("the registered buffer does not take the zero-copy path");
  }
  absl::StatusOr<PinnedHostBuffer> region_src = system.AllocatePinnedHost(size);
  absl::StatusOr<PinnedHostBuffer> region_dst = system.AllocatePinnedHost(size);
  if (!region_src.ok()) Die(region_src.status().ToString());
  if (!region_dst.ok()) Die(region_dst.status().ToString());
  std::memset(region_src->data(), 5, size);
  std::memset(region_dst->data(), 6, size);
  const auto transfer = [&](bool h2d, char* host) {
    absl::StatusOr<Event> e =
        h2d ? system.TransferToDevice(host, *dev, 0, size)
            : system.TransferFromDevice(*dev, 0, host, size);
    absl::Status s = e.ok() ? e->Await() : e.status();
    if (!s.ok()) Die(absl::StrCat("transfer failed: ", s.ToString()));
  };
  struct Method {
    const char* name;
    std::function<void()> run;
  };
  std::vector<Method> methods = {
      {"memcpy", [&] { std::memcpy(plain, src, size); }},
      {"h2d registered", [&] { transfer(true, src); }},
      {"d2h registered", [&] { transfer(false, dst); }},
      {"h2d region (zero-copy)",
       [&] { transfer(true, static_cast<char*>(region_src->data())); }},
      {"d2h region (zero-copy)",
       [&] { transfer(false, static_cast<char*>(region_dst->data())); }},
      {"h2d unregistered (pinned)", [&] { transfer(true, plain); }},
      {"d2h unregistered (pinned)", [&] { transfer(false, plain); }},
  };
  for (const Method& m : methods) m.run();  // warm
  std::vector<std::vector<double>> over_memcpy(methods.size());
  std::vector<double> memcpy_gbps;
  for (int round = 0; round < rounds; ++round) {
    std::vector<double> s(methods.size());
    for (size_t k = 0; k < methods.size(); ++k) {
      const size_t m = (k + round) % methods.size();
      s[m] = Seconds(methods[m].run);
    }
    for (size_t m = 1; m < methods.size(); ++m) {
      over_memcpy[m].push_back(s[0] / s[m]);
    }
    memcpy_gbps.push_back(double(size) / s[0] / 1e9);
  }
  (void)src_reg->Unregister();
  (void)dst_reg->Unregister();
  munmap(src, size);
  munmap(dst, size);
  munmap(plain, size);

  // Registering against mlock of one populated range, alternated, on huge
  // pages and on 4 KiB pages.
  struct Rows {
    std::vector<double> reg_over_mlock, cycle_over_mlock, reg_ms, mlock_ms;
  };
  const auto register_vs_mlock = [&](char* range) {
    Rows rows;
    for (int round = 0; round < rounds; ++round) {
      double t_reg = 0, t_unreg = 0, t_lock = 0, t_unlock = 0;
      const auto by_registering = [&] {
        absl::StatusOr<HostRegistration> r;
        t_reg =
            Seconds([&] { r = system.RegisterHostMemory(range, reg_size); });
        if (!r.ok()) Die(r.status().ToString());
        t_unreg = Seconds([&] {
          if (!r->Unregister().ok()) Die("unregister");
        });
      };
      const auto by_locking = [&] {
        t_lock = Seconds([&] {
          if (mlock(range, reg_size) != 0) Die("mlock");
        });
        t_unlock = Seconds([&] { munlock(range, reg_size); });
      };
      if (round % 2 == 0) {
        by_registering();
        by_locking();
      } else {
        by_locking();
        by_registering();
      }
      rows.reg_over_mlock.push_back(t_reg / t_lock);
      rows.cycle_over_mlock.push_back((t_reg + t_unreg) / (t_lock + t_unlock));
      rows.reg_ms.push_back(t_reg * 1e3);
      rows.mlock_ms.push_back(t_lock * 1e3);
    }
    return rows;
  };
  char* range = Populated(reg_size, 4);
  const Rows huge = register_vs_mlock(range);
  // The kernel's long-term pin alone, as registering takes it (io_uring,
  // the runtime's slot table), against mlock of the same huge pages: the
  // floor of what registering costs here.
  std::vector<double> pin_over_mlock, pin_ms;
  std::string no_pin;
  {
    std::unique_ptr<IoUringPins> pins =
        IoUringPins::Open(Os::Default(), &no_pin);
    for (int round = 0; pins != nullptr && round < rounds; ++round) {
      double t_pin = 0, t_lock = 0;
      const auto by_pinning = [&] {
        absl::StatusOr<uint32_t> slot;
        t_pin = Seconds([&] { slot = pins->Pin(range, reg_size); });
        if (!slot.ok()) Die(slot.status().ToString());
        if (!pins->Unpin(*slot).ok()) Die("io_uring unpin");
      };
      const auto by_locking = [&] {
        t_lock = Seconds([&] {
          if (mlock(range, reg_size) != 0) Die("mlock");
        });
        munlock(range, reg_size);
      };
      if (round % 2 == 0) {
        by_pinning();
        by_locking();
      } else {
        by_locking();
        by_pinning();
      }
      pin_over_mlock.push_back(t_pin / t_lock);
      pin_ms.push_back(t_pin * 1e3);
    }
  }
  munmap(range, reg_size);
  range = Populated(reg_size, 4, /*huge_pages=*/false);
  const Rows small = register_vs_mlock(range);
  munmap(range, reg_size);

  // The same on fresh mappings (nothing populated: both fault the range
  // in), each side its own.
  std::vector<double> fresh_over_mlock;
  for (int round = 0; round < rounds; ++round) {
    double t_reg = 0, t_lock = 0;
    const auto fresh = [&]() -> char* {
      void* p = mmap(nullptr, reg_size, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) Die("mmap");
      (void)madvise(p, reg_size, MADV_HUGEPAGE);
      return static_cast<char*>(p);
    };
    char* a = fresh();
    char* b = fresh();
    absl::StatusOr<HostRegistration> r;
    const auto by_registering = [&] {
      t_reg = Seconds([&] { r = system.RegisterHostMemory(a, reg_size); });
      if (!r.ok()) Die(r.status().ToString());
    };
    const auto by_locking = [&] {
      t_lock = Seconds([&] {
        if (mlock(b, reg_size) != 0) Die("mlock");
      });
    };
    if (round % 2 == 0) {
      by_registering();
      by_locking();
    } else {
      by_locking();
      by_registering();
    }
    fresh_over_mlock.push_back(t_reg / t_lock);
    (void)r->Unregister();
    munlock(b, reg_size);
    munmap(a, reg_size);
    munmap(b, reg_size);
  }
  region_src->Reset();
  region_dst->Reset();

  std::printf(
      "registered_bench: %llu-byte transfers, %llu-byte "
      "registration, %d rounds, sim:// unthrottled\n",
      static_cast<unsigned long long>(size),
      static_cast<unsigned long long>(reg_size), rounds);
  std::printf("%-46s median %.2f  (min %.2f, max %.2f)\n",
              "memcpy GB/s (one thread)", Percentile(memcpy_gbps, 0.5),
              Percentile(memcpy_gbps, 0.0), Percentile(memcpy_gbps, 1.0));
  for (size_t m = 1; m < methods.size(); ++m) {
    Row(absl::StrCat(methods[m].name, " / memcpy (speed)").c_str(),
        over_memcpy[m], m <= 2 ? "goal >= 0.9" : "");
  }
  const auto ms_row = [](const char* what, const std::vector<double>& ms) {
    std::printf("%-46s median %.1f ms  (min %.1f, max %.1f)\n", what,
                Percentile(ms, 0.5), Percentile(ms, 0.0), Percentile(ms, 1.0));
  };
  ms_row("RegisterHostMemory, huge pages", huge.reg_ms);
  ms_row("mlock, huge pages", huge.mlock_ms);
  Row("register / mlock, huge pages (time)", huge.reg_over_mlock,
      "goal <= 1.2");
  Row("register+unregister / mlock+munlock, huge", huge.cycle_over_mlock, "");
  if (pin_over_mlock.empty()) {
    std::printf("%-46s (no io_uring long-term pin here: %s)\n",
                "long-term pin alone / mlock, huge pages", no_pin.c_str());
  } else {
    ms_row("long-term pin alone, huge pages", pin_ms);
    Row("long-term pin alone / mlock, huge pages", pin_over_mlock, "");
  }
  ms_row("RegisterHostMemory, 4 KiB pages", small.reg_ms);
  ms_row("mlock, 4 KiB pages", small.mlock_ms);
  Row("register / mlock, 4 KiB pages (time)", small.reg_over_mlock,
      "goal <= 1.2");
  Row("register+unregister / mlock+munlock, 4 KiB", small.cycle_over_mlock, "");
  Row("register / mlock, fresh memory (time)", fresh_over_mlock, "");
  return 0;
}
