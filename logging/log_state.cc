#include "logging/log_state.h"

#include <pthread.h>

#include <algorithm>
#include <limits>
#include <mutex>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "logging/glog_format.h"
#include "logging/stderr_sink.h"
#include "spdlog/sinks/base_sink.h"

namespace tpushim::logging::internal {
namespace {

thread_local bool on_writer_thread = false;

// Last sink of the main logger and only sink of the barrier logger, so it
// sees every message in queue order. It completes flush barriers, and once
// the queue has drained after overruns it writes one WARNING saying how
// many messages were dropped to the output sinks (unless WARNING is below
// the minimum level).
class ControlSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  // `pool` and `barriers` (not owned) outlive every call: the sink is only
  // called by `pool`'s writer thread.
  ControlSink(spdlog::details::thread_pool* pool, FlushBarriers* barriers,
              size_t queue_size, spdlog::level::level_enum min_level,
              std::vector<spdlog::sink_ptr> outputs)
      : pool_(pool),
        barriers_(barriers),
        queue_size_(queue_size),
        report_drops_(min_level <= spdlog::level::warn),
        outputs_(std::move(outputs)) {}

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    ReportDropsIfDrained();
    if (msg.source.funcname == kFlushBarrierTag) {
      uint64_t seq = 0;
      if (absl::SimpleAtoi(
              absl::string_view(msg.payload.data(), msg.payload.size()),
              &seq)) {
        barriers_->Complete(seq);
      }
    }
  }
  void flush_() override {}

 private:
  void ReportDropsIfDrained() {
    const size_t overruns = pool_->overrun_counter();
    if (overruns == reported_overruns_ || pool_->queue_size() != 0) return;
    if (!report_drops_) {
      reported_overruns_ = overruns;
      return;
    }
    const std::string text =
        absl::StrCat("Dropped ", overruns - reported_overruns_,
                     " log messages because the log queue (", queue_size_,
                     " messages) was full");
    const spdlog::details::log_msg warning(
        spdlog::source_loc(__FILE__, __LINE__, nullptr), "",
        spdlog::level::warn, text);
    for (const spdlog::sink_ptr& output : outputs_) {
      if (output->should_log(warning.level)) output->log(warning);
    }
    reported_overruns_ = overruns;
  }

  // Constant after construction.
  spdlog::details::thread_pool* const pool_;
  FlushBarriers* const barriers_;
  const size_t queue_size_;
  const bool report_drops_;
  const std::vector<spdlog::sink_ptr> outputs_;

  // Protected by base_sink::mutex_.
  size_t reported_overruns_ = 0;
};

}  // namespace

void FlushBarriers::Complete(uint64_t seq) {
  MutexLock lock(&mu_);
  completed_ = std::max(completed_, seq);
  done_.SignalAll();
}

void FlushBarriers::CompleteAll() {
  Complete(std::numeric_limits<uint64_t>::max());
}

bool FlushBarriers::WaitUntilDone(uint64_t seq, absl::Time deadline) {
  MutexLock lock(&mu_);
  while (completed_ < seq) {
    if (done_.WaitWithDeadline(&mu_, deadline)) return completed_ >= seq;
  }
  return true;
}

LoggingState::LoggingState(const LogConfig& config, Os* os,
                           std::string directory)
    : os_(os), directory_(std::move(directory)) {
  pool_ = std::make_shared<spdlog::details::thread_pool>(
      config.queue_size, /*threads_n=*/1, [] {
        on_writer_thread = true;
        pthread_setname_np(pthread_self(), "tpushim_log");
      });

  std::vector<spdlog::sink_ptr> outputs;
  if (!directory_.empty()) {
    LogFileSettings settings;
    settings.os = os;
    settings.directory = directory_;
    settings.host = os->HostName();
    settings.user = os->UserName();
    settings.pid = os->ProcessId();
    settings.build = config.build;
    settings.max_file_bytes = config.max_file_bytes;
    settings.keep = config.keep;
    for (Severity severity :
         {Severity::kInfo, Severity::kWarning, Severity::kError}) {
      auto sink =
          std::make_shared<GlogFileSink>(severity, settings, &lost_lines_);
      sink->set_level(ToSpdlogLevel(severity));
      file_sinks_.push_back(sink);
      outputs.push_back(std::move(sink));
    }
  }
  auto stderr_sink = std::make_shared<StderrSink>(os);
  stderr_sink->set_level(ToSpdlogLevel(config.stderr_level));
  outputs.push_back(std::move(stderr_sink));

  auto control =
      std::make_shared<ControlSink>(pool_.get(), &barriers_, config.queue_size,
                                    ToSpdlogLevel(config.min_level), outputs);
  std::vector<spdlog::sink_ptr> sinks = outputs;
  sinks.push_back(control);

  // Sinks do not throw; this catches what spdlog itself might (bad_alloc).
  auto on_error = [os, reported = std::make_shared<std::once_flag>()](
                      const std::string& error) {
    std::call_once(*reported, [&] {
      WriteDiagnosticToStderr(*os, Severity::kWarning,
                              absl::StrCat("Log writer error: ", error),
                              __FILE__, __LINE__);
    });
  };
  logger_ = std::make_shared<spdlog::async_logger>(
      "tpushim", sinks.begin(), sinks.end(), pool_,
      spdlog::async_overflow_policy::overrun_oldest);
  logger_->set_level(ToSpdlogLevel(config.min_level));
  logger_->set_error_handler(on_error);
  barrier_logger_ = std::make_shared<spdlog::async_logger>(
      "tpushim-flush", std::move(control), pool_,
      spdlog::async_overflow_policy::block);
  barrier_logger_->set_error_handler(on_error);
}

LoggingState::~LoggingState() { Stop(); }

void LoggingState::Post(const spdlog::details::log_msg& msg) {
  logger_->log(msg.time, msg.source, msg.level, msg.payload);
}

uint64_t LoggingState::PostBarrier(uint64_t* overruns_before) {
  ReaderMutexLock lock(&post_mu_);
  if (pool_ == nullptr) return 0;
  const uint64_t seq = next_barrier_.fetch_add(1) + 1;
  *overruns_before = pool_->overrun_counter();
  const std::string text = absl::StrCat(seq);
  // Blocks while the queue is full; the writer is emptying it meanwhile.
  barrier_logger_->log(spdlog::source_loc(__FILE__, __LINE__, kFlushBarrierTag),
                       spdlog::level::info,
                       spdlog::string_view_t(text.data(), text.size()));
  return seq;
}

bool LoggingState::Flush(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  uint64_t overruns = 0;
  const uint64_t target = PostBarrier(&overruns);
  if (target == 0) return true;
  for (;;) {
    const absl::Time recheck =
        std::min(deadline, absl::Now() + kBarrierRecheckInterval);
    if (barriers_.WaitUntilDone(target, recheck)) return true;
    if (absl::Now() >= deadline) return false;
    uint64_t overruns_now = 0;
    {
      ReaderMutexLock lock(&post_mu_);
      // Stopping: Stop completes every barrier once the queue is drained.
      if (pool_ == nullptr) continue;
      overruns_now = pool_->overrun_counter();
    }
    // The barrier may have been overrun; a later one completes `target` too.
    if (overruns_now != overruns && PostBarrier(&overruns) == 0) return true;
  }
}

void LoggingState::Stop() {
  std::shared_ptr<spdlog::details::thread_pool> pool;
  {
    WriterMutexLock lock(&post_mu_);
    if (pool_ == nullptr) return;
    dropped_at_stop_ = pool_->overrun_counter();
    pool = std::move(pool_);
  }
  // The pool's destructor queues a terminate message behind everything
  // else and joins the writer thread.
  // Nothing else holds it: Post is not called any more, and barriers are
  // posted only while pool_ is set.
  pool.reset();
  for (const std::shared_ptr<GlogFileSink>& sink : file_sinks_) sink->Close();
  barriers_.CompleteAll();
}

uint64_t LoggingState::DroppedMessageCount() {
  ReaderMutexLock lock(&post_mu_);
  return pool_ != nullptr ? pool_->overrun_counter() : dropped_at_stop_;
}

uint64_t LoggingState::FileWriteErrorCount() const {
  return lost_lines_.load(std::memory_order_relaxed);
}

bool LoggingState::OnWriterThread() { return on_writer_thread; }

}  // namespace tpushim::logging::internal
