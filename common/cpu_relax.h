// Short polling loops that keep a hot queue or event from paying a futex
// wake-up: CpuRelax(), the processor's spin-wait hint, and SpinFor(), which
// polls a condition for a bounded time.

#ifndef TPUSHIM_COMMON_CPU_RELAX_H_
#define TPUSHIM_COMMON_CPU_RELAX_H_

#include <chrono>
#include <cstdint>

namespace tpushim {

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#else
  asm volatile("" ::: "memory");
#endif
}

// Polls `ready()` for up to `ns` nanoseconds (steady clock, checked every 16
// polls); returns its last value. `ready` must be cheap (an atomic load).
template <typename Pred>
bool SpinFor(int64_t ns, Pred&& ready) {
  if (ready()) return true;
  if (ns <= 0) return false;
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::nanoseconds(ns);
  do {
    for (int i = 0; i < 16; ++i) {
      CpuRelax();
      if (ready()) return true;
    }
  } while (std::chrono::steady_clock::now() < until);
  return ready();
}

}  // namespace tpushim

#endif  // TPUSHIM_COMMON_CPU_RELAX_H_
