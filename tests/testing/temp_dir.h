// Test helper: a fresh directory under /tmp, removed with everything in it
// when the object goes away.
//
//   TempDir dir;
//   WriteSomething(dir.Join("file"));

#ifndef TPUSHIM_TESTS_TESTING_TEMP_DIR_H_
#define TPUSHIM_TESTS_TESTING_TEMP_DIR_H_

#include <string>

#include "absl/strings/string_view.h"

namespace tpushim::testutil {

class TempDir {
 public:
  // A failing mkdtemp is a test failure (ADD_FAILURE) and leaves path()
  // empty.
  TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir();

  const std::string& path() const { return path_; }
  // path() + "/" + name.
  std::string Join(absl::string_view name) const;

 private:
  std::string path_;
};

// The whole contents of `path`, or "" when it cannot be read.
std::string ReadFileOrEmpty(const std::string& path);

}  // namespace tpushim::testutil

#endif  // TPUSHIM_TESTS_TESTING_TEMP_DIR_H_
