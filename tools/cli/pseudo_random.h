// FillPseudoRandom: test data for the tools' workloads (demo, stress),
// cheap to produce and different for every seed and offset, so that a
// misplaced or stale byte never hashes like the right one.

#ifndef TPUSHIM_TOOLS_CLI_PSEUDO_RANDOM_H_
#define TPUSHIM_TOOLS_CLI_PSEUDO_RANDOM_H_

#include <cstdint>
#include <cstring>

namespace tpushim::tools {

// Fills `n` bytes with splitmix64 of a counter started from `seed`.
inline void FillPseudoRandom(uint8_t* p, uint64_t n, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  auto next = [&x] {
    x += 0x9E3779B97F4A7C15ull;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  const uint64_t words = n / 8;
  for (uint64_t i = 0; i < words; ++i) {
    const uint64_t z = next();
    std::memcpy(p + i * 8, &z, 8);
  }
  if (n % 8 != 0) {
    const uint64_t z = next();
    std::memcpy(p + words * 8, &z, n % 8);
  }
}

}  // namespace tpushim::tools

#endif  // TPUSHIM_TOOLS_CLI_PSEUDO_RANDOM_H_
