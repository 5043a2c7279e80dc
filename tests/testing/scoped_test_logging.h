// Test helper: process-wide logging into a fresh directory for the length
// of a scope, with nothing on stderr below FATAL, and the contents of its
// files once everything queued is written.
//
//   ScopedTestLogging logs;
//   DoSomethingThatLogs();
//   EXPECT_THAT(logs.File("ERROR"), HasSubstr("..."));
//
// Users link tpushim_logging.

#ifndef TPUSHIM_TESTS_TESTING_SCOPED_TEST_LOGGING_H_
#define TPUSHIM_TESTS_TESTING_SCOPED_TEST_LOGGING_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"
#include "logging/log.h"
#include "tests/testing/temp_dir.h"

namespace tpushim::testutil {

class ScopedTestLogging {
 public:
  // `vmodule` turns VLOG on, e.g. {{"engine_queues", 1}}.
  explicit ScopedTestLogging(std::vector<VmoduleEntry> vmodule = {}) {
    logging::LogConfig config;
    config.log_dir = dir_.path();
    config.vmodule = std::move(vmodule);
    config.stderr_level = logging::Severity::kFatal;
    EXPECT_TRUE(logging::InitLogging(config).ok());
  }
  ScopedTestLogging(const ScopedTestLogging&) = delete;
  ScopedTestLogging& operator=(const ScopedTestLogging&) = delete;
  ~ScopedTestLogging() { logging::ShutdownLogging(); }

  // The contents of tpu_driver.<severity> ("INFO", "WARNING", "ERROR").
  std::string File(absl::string_view severity) {
    EXPECT_TRUE(logging::FlushLogs());
    return ReadFileOrEmpty(dir_.Join(absl::StrCat("tpu_driver.", severity)));
  }

 private:
  TempDir dir_;
};

}  // namespace tpushim::testutil

#endif  // TPUSHIM_TESTS_TESTING_SCOPED_TEST_LOGGING_H_
