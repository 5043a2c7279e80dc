// Unsigned arithmetic that stops at the top instead of wrapping, for sums
// of sizes a caller chose (a "negative" size passed through the C ABI is
// 2^64 - n): a report of such a sum says "too much", never a small number.
//
//   SaturatingAdd(UINT64_MAX - 1, 5) == UINT64_MAX
//   RoundUpSaturating(10, 64)        == 64

#ifndef TPUSHIM_COMMON_SATURATING_H_
#define TPUSHIM_COMMON_SATURATING_H_

#include <cstdint>
#include <limits>

namespace tpushim {

inline uint64_t SaturatingAdd(uint64_t a, uint64_t b) {
  return a > std::numeric_limits<uint64_t>::max() - b
             ? std::numeric_limits<uint64_t>::max()
             : a + b;
}

// `n` rounded up to a multiple of `granule` (> 0), or UINT64_MAX when that
// does not fit.
inline uint64_t RoundUpSaturating(uint64_t n, uint64_t granule) {
  const uint64_t rest = n % granule;
  return rest == 0 ? n : SaturatingAdd(n, granule - rest);
}

}  // namespace tpushim

#endif  // TPUSHIM_COMMON_SATURATING_H_
