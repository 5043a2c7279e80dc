// Access to a device's memory-mapped registers (a PCI BAR mapped through
// VFIO) and the barriers around DMA memory, with the guarantees a driver
// needs and Linux's readl/writel/dma_rmb give:
//
//  * every register access happens exactly once, whole (an aligned 32-bit
//    load or store) and in program order with the other register accesses
//    (volatile): the compiler may neither merge, split, drop nor reorder
//    them;
//  * a register write comes after every earlier store to memory the device
//    reads by DMA: a submission queue entry is visible to the device before
//    the doorbell write that tells it to fetch it;
//  * a register read comes before every later load of memory the device
//    writes by DMA;
//  * DmaReadBarrier() orders the load that saw a completion entry's phase
//    bit flip before the loads of the rest of that entry.
//
// On x86-64 stores are not reordered with older stores and loads not with
// older loads, uncached MMIO included, so the barriers only stop the
// compiler; on AArch64 they are the outer-shareable dmb that Linux uses.
//
//   const Mmio regs(bar.base, bar.size);
//   sq[tail] = entry;                         // plain stores to DMA memory
//   regs.Write32(doorbell, new_tail);         // ordered after them
//   if ((cq[head].status & 1) == phase) {     // the device wrote an entry
//     DmaReadBarrier();
//     uint16_t cid = cq[head].command_id;     // ... read after the bit
//   }
//
// Thread-safety: Mmio is a value; concurrent accesses to different
// registers are fine, to one register they race as the device allows.

#ifndef TPUSHIM_DEVICE_MMIO_H_
#define TPUSHIM_DEVICE_MMIO_H_

#include <cstdint>

// ThreadSanitizer sees no ordering in volatile accesses and barriers, so
// under it the register accesses below are acquire loads and release
// stores (on x86-64 the same instructions), which tell it what the
// barriers tell the hardware: a fake device on another thread then checks
// the real protocol.
#if defined(__SANITIZE_THREAD__)
#define TPUSHIM_MMIO_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TPUSHIM_MMIO_TSAN 1
#endif
#endif

namespace tpushim {

// Between stores to DMA memory and the register write that publishes them.
inline void DmaWriteBarrier() {
#if defined(__aarch64__)
  asm volatile("dmb oshst" ::: "memory");
#elif defined(__x86_64__) || defined(__i386__)
  asm volatile("" ::: "memory");
#else
  __sync_synchronize();
#endif
}

// Between a load that saw the device's DMA write and later loads of it.
inline void DmaReadBarrier() {
#if defined(__aarch64__)
  asm volatile("dmb oshld" ::: "memory");
#elif defined(__x86_64__) || defined(__i386__)
  asm volatile("" ::: "memory");
#else
  __sync_synchronize();
#endif
}

// Loads a 16-bit field the device writes by DMA, such as a completion
// entry's status with its phase bit: one whole load each time it is
// called. Follow it with DmaReadBarrier() before reading the rest of the
// entry.
inline uint16_t LoadDmaField(const volatile uint16_t* field) {
#if defined(TPUSHIM_MMIO_TSAN)
  return __atomic_load_n(field, __ATOMIC_ACQUIRE);
#else
  return *field;
#endif
}

class Mmio {
 public:
  Mmio() = default;
  Mmio(volatile uint8_t* base, uint64_t size) : base_(base), size_(size) {}

  volatile uint8_t* base() const { return base_; }
  uint64_t size() const { return size_; }

  // REQUIRES: offset + 4 <= size(), offset % 4 == 0.
  uint32_t Read32(uint32_t offset) const {
#if defined(TPUSHIM_MMIO_TSAN)
    const uint32_t value = __atomic_load_n(Register(offset), __ATOMIC_ACQUIRE);
#else
    const uint32_t value = *Register(offset);
#endif
    DmaReadBarrier();
    return value;
  }
  void Write32(uint32_t offset, uint32_t value) const {
    DmaWriteBarrier();
#if defined(TPUSHIM_MMIO_TSAN)
    __atomic_store_n(Register(offset), value, __ATOMIC_RELEASE);
#else
    *Register(offset) = value;
#endif
  }
  // 64-bit registers as two 32-bit halves, low first (NVMe allows it, and
  // not every platform has an atomic 64-bit MMIO access).
  uint64_t Read64(uint32_t offset) const {
    const uint64_t low = Read32(offset);
    return low | (uint64_t{Read32(offset + 4)} << 32);
  }
  void Write64(uint32_t offset, uint64_t value) const {
    Write32(offset, static_cast<uint32_t>(value));
    Write32(offset + 4, static_cast<uint32_t>(value >> 32));
  }

 private:
  volatile uint32_t* Register(uint32_t offset) const {
    return reinterpret_cast<volatile uint32_t*>(base_ + offset);
  }

  volatile uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace tpushim

#endif  // TPUSHIM_DEVICE_MMIO_H_
