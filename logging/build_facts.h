// What this build of tpushim says about itself in the "Binary:" lines of
// every log file's header, as libtpu's files do:
//
//   Binary: Built on Jun 22 2023 10:37:55 (1687430275)
//   Binary: Built at bob@builder:/home/bob/tpushim
//   Binary: Built for gcc-12.2.0 x86_64-linux-gnu
//
// CMake records the facts when it configures the build (logging/
// CMakeLists.txt): the time (SOURCE_DATE_EPOCH instead, when set), the user
// and host that configured it, the source directory, and the compiler and
// the machine it compiles for. Tests put their own in LogConfig::build.
//
// Thread-safety: ThisBuild() is thread-safe; a BuildFacts is a plain value.
//
//   LogConfig config;  // config.build is ThisBuild()
//   config.build.user = "test";

#ifndef TPUSHIM_LOGGING_BUILD_FACTS_H_
#define TPUSHIM_LOGGING_BUILD_FACTS_H_

#include <string>

#include "absl/time/time.h"

namespace tpushim::logging {

struct BuildFacts {
  // When the build was made ("Built on"; shown in UTC, to the second).
  absl::Time built = absl::UnixEpoch();
  // Who made it, on which machine, from which source directory ("Built at
  // <user>@<host>:<path>").
  std::string user;
  std::string host;
  std::string path;
  // The compiler and the target triple it compiled for, e.g.
  // "gcc-12.2.0 x86_64-linux-gnu" ("Built for").
  std::string target;
};

// The facts of the build this code was compiled in.
BuildFacts ThisBuild();

}  // namespace tpushim::logging

#endif  // TPUSHIM_LOGGING_BUILD_FACTS_H_
