// StreamingCopy: a memcpy whose stores bypass the CPU caches (non-temporal
// stores), for large copies whose destination nothing reads soon — the
// simulated device's DMA into its HBM, or into a caller's buffer that it
// hands back whole.
//
// Why not memcpy: glibc's memcpy streams only copies above its
// non-temporal threshold (about 3/4 of the last-level cache it detects:
// 0.75 MiB on some machines, 192 MiB on the project's VM). A DMA engine
// copies in descriptors of a few hundred KiB, each below that threshold,
// so memcpy writes them through the cache: every destination line is read
// first (read for ownership) and written back later, a third more memory
// traffic than one large streamed memcpy of the same bytes, and on the
// project's VM 0.6 of its speed (docs/performance.md).
//
// Thread-safety: none needed; the stores are fenced (sfence) before it
// returns, so a release store after it (a completion) publishes the bytes.
//
//   StreamingCopy(hbm + address, host, length);

#ifndef TPUSHIM_COMMON_STREAM_COPY_H_
#define TPUSHIM_COMMON_STREAM_COPY_H_

#include <cstddef>

namespace tpushim {

// Copies `n` bytes from `src` to `dst` with non-temporal stores where the
// CPU has them (x86-64: AVX2 where the CPU has it, else SSE2; any
// alignment of either pointer), memcpy elsewhere and for copies too short
// to gain from it. REQUIRES: the ranges do not overlap.
void StreamingCopy(void* dst, const void* src, size_t n);

#if defined(__x86_64__)
namespace stream_copy_internal {
// Whether the CPU has AVX2 (asked once).
bool HasAvx2();
// StreamingCopy with the variant chosen: for tests, which run both.
// REQUIRES: as StreamingCopy; `avx2` only where HasAvx2().
void Copy(void* dst, const void* src, size_t n, bool avx2);
}  // namespace stream_copy_internal
#endif

}  // namespace tpushim

#endif  // TPUSHIM_COMMON_STREAM_COPY_H_
