#include "common/stream_copy.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace tpushim {

void StreamingCopy(void* dst, const void* src, size_t n) {
#if defined(__x86_64__)
  // Below a few cache lines the fence and the alignment prologue cost more
  // than the cache traffic they save.
  constexpr size_t kMinStreamed = 256;
  if (n < kMinStreamed) {
    std::memcpy(dst, src, n);
    return;
  }
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  // Non-temporal stores need a 16-byte aligned destination: copy the bytes
  // before the first such address normally.
  const size_t head = (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15;
  std::memcpy(d, s, head);
  d += head;
  s += head;
  n -= head;
  // 64 bytes (a cache line) per step: four unaligned loads, four streamed
  // stores, so each destination line is written whole by write-combining.
  for (; n >= 64; n -= 64, d += 64, s += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 48), e);
  }
  std::memcpy(d, s, n);
  // Streamed stores are weakly ordered: make them visible before whatever
  // the caller publishes next.
  _mm_sfence();
#else
  std::memcpy(dst, src, n);
#endif
}

}  // namespace tpushim
