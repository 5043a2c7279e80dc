// Human-readable byte counts in TSL's style
// (tsl::strings::HumanReadableNumBytes).
//
//   HumanReadableBytes(123)        == "123B"
//   HumanReadableBytes(852'000)    == "832.0K"
//   HumanReadableBytes(8 << 20)    == "8.00M"
//   HumanReadableBytes(4ull << 30) == "4.00G"
//
// 1024 base; below 1024 whole bytes, one decimal for K, two for M and above.
// The value is truncated to whole units of the next-lower unit before the
// last division, exactly as TSL does, so messages match libtpu's digit for
// digit. Pure function; thread-safe.

#ifndef TPUSHIM_COMMON_HUMAN_BYTES_H_
#define TPUSHIM_COMMON_HUMAN_BYTES_H_

#include <cstdint>
#include <string>

namespace tpushim {

std::string HumanReadableBytes(uint64_t bytes);

// A byte count written both ways, raw then human-readable:
// "4294967296 (4.00G)", "123 (123B)". For messages and tables.
std::string BytesWithHumanReadable(uint64_t bytes);

}  // namespace tpushim

#endif  // TPUSHIM_COMMON_HUMAN_BYTES_H_
