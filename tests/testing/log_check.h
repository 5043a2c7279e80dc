// Test helper: checks what tpushim leaves in a log directory against
// libtpu's logging — every log file whole (libtpu's header, then only
// complete lines in the glog line format; nothing torn by a failure), every
// `tpu_driver.<SEVERITY>` symlink leading to one of them — and that an INFO
// log holds the start-up lines in libtpu's order.
//
//   EXPECT_EQ(LogDirectoryProblems(dir), "");
//   EXPECT_EQ(StartupLinesProblems(ReadFileOrEmpty(dir + "/tpu_driver.INFO"),
//                                  {.region_bytes = 8 << 20, .devices = 2}),
//             "");
//
// Thread-safety: thread-compatible (reads files only).

#ifndef TPUSHIM_TESTS_TESTING_LOG_CHECK_H_
#define TPUSHIM_TESTS_TESTING_LOG_CHECK_H_

#include <cstdint>
#include <string>

namespace tpushim::testutil {

// "" when every `tpu_driver.*` file and symlink in `dir` is intact, else
// one line per problem naming the file (a few per file at most). A file is
// intact when it is empty (created when nothing could be written any more)
// or holds libtpu's six header lines ("Log file created at: ", "Running on
// machine: ", "Binary: Built on ", "... at ", "... for ", then the "Log
// line format: " line) and then only whole glog lines, the last one ended
// by its newline. A symlink is intact when it names a log file in `dir`
// that exists. A missing directory holds no problem.
std::string LogDirectoryProblems(const std::string& dir);

// The start-up of a System with a premapped region, as its INFO log shows
// it.
struct StartupExpectation {
  uint64_t region_bytes = 0;
  uint64_t threshold_bytes = 0;  // 0: equal to region_bytes
  int devices = 1;
  // Whether the region was pinned: the "mlock()-ed <bytes> bytes for
  // premapped region, using <n> syscalls." line is there, or must not be.
  bool locked = true;
  // TPUSHIM_PREMAP=background: the lines from "mlock()-ed" to "Done
  // allocating premapped memory" come after the CreateTpuSystemState ones.
  bool background = false;
};

// "" when the glog lines of `info` (an INFO log's text) hold libtpu's
// start-up lines for `expected`, in that order, each a whole line
// with its exact wording (the time with nine decimals); else what is
// missing or should not be there, and the messages that were found.
std::string StartupLinesProblems(const std::string& info,
                                 const StartupExpectation& expected);

}  // namespace tpushim::testutil

#endif  // TPUSHIM_TESTS_TESTING_LOG_CHECK_H_
