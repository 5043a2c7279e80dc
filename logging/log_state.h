// One logging configuration at work: the spdlog writer thread and queue,
// the asynchronous logger and its sinks (one GlogFileSink per severity that
// has files, the StderrSink, and a control sink that completes flush
// barriers and reports queue overruns), as InitLogging builds it.
//
// Messages go through an async_logger with the overrun_oldest policy, so
// Post never blocks; flush barriers go through a second async_logger on the
// same queue with the block policy. The single writer thread handles
// messages in queue order, so when it reaches a barrier everything posted
// before it has been written (or dropped).
//
// Thread-safety: Post must not race with Stop (log.cc posts only while the
// state is installed, under its lock, and stops it only after removing it);
// Flush, the counters and the accessors are thread-safe at any time.
//
//   auto state = std::make_shared<LoggingState>(config, os, "/tmp/tpu_logs");
//   state->Post(msg);
//   state->Flush(absl::Seconds(10));
//   state->Stop();

#ifndef TPUSHIM_LOGGING_LOG_STATE_H_
#define TPUSHIM_LOGGING_LOG_STATE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "env/os.h"
#include "logging/glog_file_sink.h"
#include "logging/log.h"
#include "spdlog/async_logger.h"
#include "spdlog/details/log_msg.h"
#include "spdlog/details/thread_pool.h"

namespace tpushim::logging::internal {

// Completion of numbered flush barriers: barrier n is done once the writer
// has reached barrier n or a later one.
class FlushBarriers {
 public:
  // Marks barriers up to `seq` done and wakes their waiters.
  void Complete(uint64_t seq) ABSL_LOCKS_EXCLUDED(mu_);
  // Marks every barrier, past and future, done (the writer has stopped).
  void CompleteAll() ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until barrier `seq` is done (true) or `deadline` passes (false).
  bool WaitUntilDone(uint64_t seq, absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  Mutex mu_;
  CondVar done_;
  uint64_t completed_ ABSL_GUARDED_BY(mu_) = 0;
};

class LoggingState {
 public:
  // While a flush waits, how often it checks whether its barrier may have
  // been overrun by newer messages (and posts another one if so).
  static constexpr absl::Duration kBarrierRecheckInterval =
      absl::Milliseconds(100);

  // Builds the sinks and starts the writer thread; files go to `directory`
  // ("" = none). `os` (not owned) must outlive the state. Reads host, user
  // and pid from `os`. Throws what spdlog or std::thread throw when the
  // thread cannot start (InitLogging catches it).
  // REQUIRES: config validated by InitLogging.
  LoggingState(const LogConfig& config, Os* os, std::string directory);
  LoggingState(const LoggingState&) = delete;
  LoggingState& operator=(const LoggingState&) = delete;
  // Stop()s.
  ~LoggingState();

  // Queues `msg` for the files and stderr unless it is below the minimum
  // level. Never blocks on I/O: a full queue drops its oldest message.
  // REQUIRES: Stop() has not started.
  void Post(const spdlog::details::log_msg& msg);

  // Waits until everything posted before the call is written, or `timeout`
  // passes (false). True at once after Stop.
  bool Flush(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(post_mu_);

  // Writes everything queued, joins the writer thread and closes the files.
  // Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(post_mu_);

  // Messages the queue dropped (overrun) since construction.
  uint64_t DroppedMessageCount() ABSL_LOCKS_EXCLUDED(post_mu_);
  // Lines the file sinks could not write.
  uint64_t FileWriteErrorCount() const;

  Os& os() const { return *os_; }
  // Where files go; "" when there are none.
  const std::string& directory() const { return directory_; }

  // True on the writer thread of any LoggingState.
  static bool OnWriterThread();

 private:
  // Posts a new barrier; returns its number and the queue's overrun count
  // just before it, or 0 when stopped.
  uint64_t PostBarrier(uint64_t* overruns_before) ABSL_LOCKS_EXCLUDED(post_mu_);

  // Constant after construction.
  Os* const os_;
  const std::string directory_;
  FlushBarriers barriers_;
  std::atomic<uint64_t> lost_lines_{0};
  std::atomic<uint64_t> next_barrier_{0};
  std::vector<std::shared_ptr<GlogFileSink>> file_sinks_;
  std::shared_ptr<spdlog::async_logger> logger_;
  std::shared_ptr<spdlog::async_logger> barrier_logger_;

  // Held shared while posting a barrier or reading the queue, exclusively
  // to retire the queue.
  SharedMutex post_mu_;
  // The queue and writer thread; null once Stop has begun.
  std::shared_ptr<spdlog::details::thread_pool> pool_ ABSL_GUARDED_BY(post_mu_);
  // DroppedMessageCount at Stop.
  uint64_t dropped_at_stop_ ABSL_GUARDED_BY(post_mu_) = 0;
};

}  // namespace tpushim::logging::internal

#endif  // TPUSHIM_LOGGING_LOG_STATE_H_
