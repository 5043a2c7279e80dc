#include "common/stream_copy.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace tpushim {
namespace {

// Every combination of source and destination phase (off a 64-byte line)
// and lengths around the function's steps (the short-copy cut-off, the
// 16-byte alignment prologue, the 64-byte loop and its tail): the bytes
// arrive exactly, and nothing before or after the destination changes.
void CheckEveryPhaseAndLength(const char* name,
                              void (*copy)(void*, const void*, size_t)) {
  const std::vector<size_t> lengths = {0,   1,   15,   16,   17,   63,  64,
                                       65,  255, 256,  257,  320,  333, 383,
                                       511, 999, 4096, 4109, 65543};
  constexpr size_t kGuard = 64;
  constexpr uint8_t kUntouched = 0xA5;
  for (size_t len : lengths) {
    std::vector<uint8_t> src(len + 64);
    for (size_t i = 0; i < src.size(); ++i) {
      src[i] = static_cast<uint8_t>(i * 7 + len);
    }
    // 64 bytes of slack so that every phase below starts inside the
    // buffer at the same offset from a 64-byte line.
    std::vector<uint8_t> dst(len + 2 * kGuard + 128);
    const std::vector<uint8_t> guard(kGuard, kUntouched);
    for (size_t src_phase = 0; src_phase < 20; ++src_phase) {
      for (size_t dst_phase = 0; dst_phase < 20; ++dst_phase) {
        std::fill(dst.begin(), dst.end(), kUntouched);
        uint8_t* const line = reinterpret_cast<uint8_t*>(
            (reinterpret_cast<uintptr_t>(dst.data()) + kGuard + 63) &
            ~uintptr_t{63});
        uint8_t* const to = line + dst_phase;
        const uint8_t* const from = src.data() + src_phase;
        copy(to, from, len);
        const std::string where =
            absl::StrCat(name, ": length ", len, ", source phase ", src_phase,
                         ", destination phase ", dst_phase);
        ASSERT_EQ(std::memcmp(to, from, len), 0) << where;
        ASSERT_EQ(std::memcmp(to - kGuard, guard.data(), kGuard), 0)
            << "written before the destination: " << where;
        ASSERT_EQ(std::memcmp(to + len, guard.data(), kGuard), 0)
            << "written past the destination: " << where;
      }
    }
  }
}

TEST(StreamingCopyTest, CopiesEveryPhaseAndLengthExactly) {
  CheckEveryPhaseAndLength("StreamingCopy", &StreamingCopy);
}

#if defined(__x86_64__)
// Both x86-64 variants, whichever the machine picks.
TEST(StreamingCopyTest, Sse2CopiesEveryPhaseAndLengthExactly) {
  CheckEveryPhaseAndLength("SSE2", [](void* d, const void* s, size_t n) {
    stream_copy_internal::Copy(d, s, n, /*avx2=*/false);
  });
}

TEST(StreamingCopyTest, Avx2CopiesEveryPhaseAndLengthExactly) {
  if (!stream_copy_internal::HasAvx2()) GTEST_SKIP() << "no AVX2 here";
  CheckEveryPhaseAndLength("AVX2", [](void* d, const void* s, size_t n) {
    stream_copy_internal::Copy(d, s, n, /*avx2=*/true);
  });
}
#endif

}  // namespace
}  // namespace tpushim
