// Assertions for the fuzz targets: a property that does not hold prints
// what was expected and aborts, which libFuzzer reports as a crash and
// saves the input that caused it (crash-<sha1>). Unlike assert(), the
// checks stay on in every build type, and they need neither GoogleTest nor
// tpushim's logging (which the C-ABI target sets up for the library).
//
//   TPUSHIM_FUZZ_CHECK(size % 4096 == 0) << "size " << size;
//
// Thread-safe: callbacks running on the library's threads may check too.

#ifndef TPUSHIM_FUZZ_FUZZ_CHECK_H_
#define TPUSHIM_FUZZ_FUZZ_CHECK_H_

#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace tpushim::fuzz {

// Collects the message of a failed check; its destructor prints it to
// stderr and aborts.
class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* condition) {
    stream_ << file << ":" << line << ": check failed: " << condition << " ";
  }
  CheckFailure(const CheckFailure&) = delete;
  CheckFailure& operator=(const CheckFailure&) = delete;
  [[noreturn]] ~CheckFailure() {
    std::fprintf(stderr, "%s\n", stream_.str().c_str());
    std::fflush(stderr);
    std::abort();
  }

  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};

}  // namespace tpushim::fuzz

// Aborts with the streamed message when `condition` is false.
#define TPUSHIM_FUZZ_CHECK(condition) \
  while (!(condition))                \
  ::tpushim::fuzz::CheckFailure(__FILE__, __LINE__, #condition).stream()

#endif  // TPUSHIM_FUZZ_FUZZ_CHECK_H_
