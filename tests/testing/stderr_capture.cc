#include "tests/testing/stderr_capture.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace tpushim::testutil {

StderrCapture::StderrCapture() {
  char pattern[] = "/tmp/tpushim_stderr_XXXXXX";
  const int fd = mkstemp(pattern);
  if (fd < 0) {
    ADD_FAILURE() << "mkstemp: " << strerror(errno);
    return;
  }
  path_ = pattern;
  fflush(stderr);
  saved_fd_ = dup(STDERR_FILENO);
  dup2(fd, STDERR_FILENO);
  close(fd);
}

StderrCapture::~StderrCapture() {
  if (saved_fd_ >= 0) {
    fflush(stderr);
    dup2(saved_fd_, STDERR_FILENO);
    close(saved_fd_);
  }
  if (!path_.empty()) unlink(path_.c_str());
}

std::string StderrCapture::Contents() const {
  fflush(stderr);
  return ReadFileOrEmpty(path_);
}

std::vector<std::string> StderrCapture::Lines() const {
  std::vector<std::string> lines =
      absl::StrSplit(Contents(), '\n', absl::SkipEmpty());
  return lines;
}

}  // namespace tpushim::testutil
