// Test helper: what this process writes to its stderr (fd 2) while the
// object lives — logging's own diagnostics go there whatever the levels.
//
//   StderrCapture captured;
//   DoSomethingThatWarns();
//   EXPECT_THAT(captured.Contents(), HasSubstr("Could not create"));
//
// Thread-safety: the object belongs to one thread; anything may write to
// fd 2 meanwhile.

#ifndef TPUSHIM_TESTS_TESTING_STDERR_CAPTURE_H_
#define TPUSHIM_TESTS_TESTING_STDERR_CAPTURE_H_

#include <string>
#include <vector>

namespace tpushim::testutil {

// Points fd 2 at a temporary file for its lifetime (dup/dup2), restoring
// the original stderr on destruction. A failing mkstemp is a test failure
// and leaves stderr as it is.
class StderrCapture {
 public:
  StderrCapture();
  StderrCapture(const StderrCapture&) = delete;
  StderrCapture& operator=(const StderrCapture&) = delete;
  ~StderrCapture();

  // Everything written to fd 2 so far.
  std::string Contents() const;
  // Contents() split into lines (empty lines left out).
  std::vector<std::string> Lines() const;

 private:
  int saved_fd_ = -1;
  std::string path_;
};

}  // namespace tpushim::testutil

#endif  // TPUSHIM_TESTS_TESTING_STDERR_CAPTURE_H_
