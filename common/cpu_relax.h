// CpuRelax(): the processor's spin-wait hint, for the short polling loops
// that keep a hot queue or event from paying a futex wake-up.

#ifndef TPUSHIM_COMMON_CPU_RELAX_H_
#define TPUSHIM_COMMON_CPU_RELAX_H_

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

}  // namespace tpushim

#endif  // TPUSHIM_COMMON_CPU_RELAX_H_
