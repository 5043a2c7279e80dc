// The spdlog sink that copies messages at or above TPU_STDERR_LOG_LEVEL to
// stderr, in the same glog line format and without a header.
//
// It skips FATAL (the LOG(FATAL) caller writes that line itself, after the
// files are drained) and messages tagged kNotOnStderrTag (already written).
// Its threshold is spdlog's sink level.
//
// Thread-safety: spdlog calls it under base_sink's mutex.
//
//   auto sink = std::make_shared<StderrSink>(os);
//   sink->set_level(ToSpdlogLevel(config.stderr_level));

#ifndef TPUSHIM_LOGGING_STDERR_SINK_H_
#define TPUSHIM_LOGGING_STDERR_SINK_H_

#include <mutex>

#include "env/os.h"
#include "spdlog/details/log_msg.h"
#include "spdlog/sinks/base_sink.h"

namespace tpushim::logging::internal {

class StderrSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  // `os` (not owned) must outlive the sink; lines go to its WriteAll on
  // STDERR_FILENO, and a failed write is ignored.
  explicit StderrSink(Os* os);

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override;
  void flush_() override {}

 private:
  Os* const os_;
};

}  // namespace tpushim::logging::internal

#endif  // TPUSHIM_LOGGING_STDERR_SINK_H_
