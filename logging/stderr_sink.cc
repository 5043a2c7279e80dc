#include "logging/stderr_sink.h"

#include <unistd.h>

#include <memory>

#include "logging/glog_format.h"

namespace tpushim::logging::internal {

StderrSink::StderrSink(Os* os)
    : spdlog::sinks::base_sink<std::mutex>(std::make_unique<GlogFormatter>()),
      os_(os) {}

void StderrSink::sink_it_(const spdlog::details::log_msg& msg) {
  if (msg.level == spdlog::level::critical ||
      msg.source.funcname == kNotOnStderrTag) {
    return;
  }
  spdlog::memory_buf_t line;
  formatter_->format(msg, line);
  (void)os_->WriteAll(STDERR_FILENO, line.data(), line.size());
}

}  // namespace tpushim::logging::internal
