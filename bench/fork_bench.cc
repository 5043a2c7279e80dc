// The parent's cost of writing its pinned host memory while a fork() child
// lives, against the same write with no child, side by side in one run.
//
// Two kinds of memory, both mapped, populated and locked the same way:
//
//   region   pinned host buffers from a tpushim premapped region, which
//            the runtime excludes from fork() (MADV_DONTFORK)
//   plain    an anonymous mapping with nothing said about fork() (huge
//            pages advised, as the region's): what the region was before,
//            and what any pinned pool without the advice is — after fork()
//            every first write to one of its pages copies the page, and
//            even once the child is gone each page faults once more
//
// Each round times, for each kind, one full write with no child and one
// with a child alive (forked just before, blocked on a pipe, reaped after),
// in a rotated order. Reported per kind: the median over rounds of the
// write time alone and with a child, and the median of the per-round
// ratio with / alone with its range. Goal for the region: <= 1.5.
//
//   fork_bench [--size=512M] [--rounds=7]
//
// CI runs --size=16M --rounds=2.

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "env/device_url.h"
#include "tpushim/system.h"

namespace tpushim {
namespace {

[[noreturn]] void Die(const std::string& what) {
  fprintf(stderr, "fork_bench: %s\n", what.c_str());
  exit(2);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Seconds to write every byte of [p, p + n) once.
double TimeWrite(char* p, uint64_t n, char value) {
  const auto t0 = std::chrono::steady_clock::now();
  std::memset(p, value, n);
  asm volatile("" : : "r"(p) : "memory");
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
      .count();
}

// The write of [p, p + n) with a fork() child alive throughout.
double TimeWriteWithChild(char* p, uint64_t n, char value) {
  int release[2];
  if (pipe(release) != 0) Die("pipe");
  const pid_t child = fork();
  if (child < 0) Die("fork");
  if (child == 0) {
    char c;
    close(release[1]);
    (void)!read(release[0], &c, 1);
    _exit(0);
  }
  close(release[0]);
  const double seconds = TimeWrite(p, n, value);
  close(release[1]);
  int status = 0;
  waitpid(child, &status, 0);
  return seconds;
}

}  // namespace
}  // namespace tpushim

int main(int argc, char** argv) {
  using namespace tpushim;
  uint64_t size = uint64_t{512} << 20;
  int rounds = 7;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg(argv[i]);
    if (absl::ConsumePrefix(&arg, "--size=")) {
      absl::StatusOr<uint64_t> v = ParseByteSize(arg, "--size");
      if (!v.ok() || *v < 4096) Die("--size takes bytes or 512M, at least 4K");
      size = *v;
    } else if (absl::ConsumePrefix(&arg, "--rounds=")) {
      if (!absl::SimpleAtoi(arg, &rounds) || rounds < 1) {
        Die("--rounds takes a positive integer");
      }
    } else {
      Die("unknown argument " + std::string(arg) +
          " (flags: --size=<bytes|512M>, --rounds=N)");
    }
  }
  size = (size + 4095) / 4096 * 4096;

  OptionOverrides o;
  o.premapped_buffer_size = size;
  o.device = "sim://?hbm=64M";
  o.log_dir = "disabled";
  absl::StatusOr<std::unique_ptr<System>> system = System::Create(o);
  if (!system.ok()) Die(system.status().ToString());
  absl::StatusOr<PinnedHostBuffer> region = (*system)->AllocatePinnedHost(size);
  if (!region.ok()) Die(region.status().ToString());

  // Backed as the region is by default (transparent huge pages where the
  // kernel gives them), populated and locked.
  void* mapped = mmap(nullptr, size, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapped == MAP_FAILED) Die("mmap");
  (void)madvise(mapped, size, MADV_HUGEPAGE);
  std::memset(mapped, 0, size);
  const bool plain_locked = mlock(mapped, size) == 0;

  struct Kind {
    const char* name;
    char* p;
    std::vector<double> alone, with_child, ratio;
  };
  Kind kinds[] = {{"region", static_cast<char*>(region->data()), {}, {}, {}},
                  {"plain", static_cast<char*>(mapped), {}, {}, {}}};
  for (Kind& k : kinds) TimeWrite(k.p, size, 1);  // warm

  for (int round = 0; round < rounds; ++round) {
    for (int step = 0; step < 4; ++step) {
      const int s = (step + round) % 4;
      Kind& k = kinds[s / 2];
      const char value = static_cast<char>(round * 4 + step + 2);
      if (s % 2 == 0) {
        k.alone.push_back(TimeWrite(k.p, size, value));
      } else {
        k.with_child.push_back(TimeWriteWithChild(k.p, size, value));
      }
    }
    for (Kind& k : kinds) {
      k.ratio.push_back(k.with_child.back() / k.alone.back());
    }
  }
  printf("Writing %llu bytes of pinned host memory, %d rounds side by side "
         "(plain mapping %s):\n",
         static_cast<unsigned long long>(size), rounds,
         plain_locked ? "locked" : "not locked: mlock failed");
  printf("  %-8s %12s %14s %16s %s\n", "memory", "alone ms", "child ms",
         "child/alone", "range");
  for (Kind& k : kinds) {
    printf("  %-8s %12.2f %14.2f %16.2f %.2f-%.2f%s\n", k.name,
           Median(k.alone) * 1e3, Median(k.with_child) * 1e3, Median(k.ratio),
           *std::min_element(k.ratio.begin(), k.ratio.end()),
           *std::max_element(k.ratio.begin(), k.ratio.end()),
           absl::string_view(k.name) == "region" ? "   (goal <= 1.5)" : "");
  }
  munmap(mapped, size);
  return 0;
}
