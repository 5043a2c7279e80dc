#include "logging/log.h"

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "common/mutex.h"
#include "logging/glog_format.h"
#include "logging/log_directory.h"
#include "logging/log_state.h"
#include "logging/vmodule.h"

namespace tpushim::logging {
namespace {

using internal::LoggingState;

// How long LOG(FATAL) waits for the earlier messages to be written.
constexpr absl::Duration kFatalFlushTimeout = absl::Seconds(10);
// How long the atexit() handler waits for queued messages.
constexpr absl::Duration kExitFlushTimeout = absl::Seconds(5);

// Before InitLogging and after ShutdownLogging.
constexpr Severity kUninitializedMinLevel = Severity::kError;

// Read on every LOG/VLOG without a lock; written under Globals::mu
// (min level) and Globals::vlog_mu (generation).
ABSL_CONST_INIT std::atomic<int> min_level{
    static_cast<int>(kUninitializedMinLevel)};
ABSL_CONST_INIT std::atomic<uint64_t> vlog_generation{0};

struct Globals {
  // Serializes InitLogging and ShutdownLogging.
  Mutex init_mu;

  // Held shared by LOG for as long as it takes to queue a message, and
  // exclusively to install or remove a configuration.
  SharedMutex mu ABSL_ACQUIRED_AFTER(init_mu);
  std::shared_ptr<LoggingState> state ABSL_GUARDED_BY(mu);

  // What VLOG levels are computed from. Never held together with `mu`.
  SharedMutex vlog_mu ABSL_ACQUIRED_AFTER(init_mu);
  std::vector<VmoduleEntry> vmodule ABSL_GUARDED_BY(vlog_mu);
  bool info_enabled ABSL_GUARDED_BY(vlog_mu) = false;
};

// Never destroyed, so LOG is safe during and after static destruction.
Globals& GetGlobals() {
  static Globals* const globals = new Globals();
  return *globals;
}

int VlogLevelLocked(Globals& g, absl::string_view file)
    ABSL_SHARED_LOCKS_REQUIRED(g.vlog_mu) {
  return g.info_enabled ? internal::VmoduleLevel(g.vmodule, file) : -1;
}

// Makes `state` (null: none) the process-wide configuration, with
// `config`'s levels; returns the one it replaces.
std::shared_ptr<LoggingState> Install(std::shared_ptr<LoggingState> state,
                                      const LogConfig* config) {
  Globals& g = GetGlobals();
  {
    WriterMutexLock lock(&g.mu);
    std::swap(g.state, state);
    min_level.store(
        static_cast<int>(config != nullptr ? config->min_level
                                           : kUninitializedMinLevel),
        std::memory_order_relaxed);
  }
  {
    WriterMutexLock lock(&g.vlog_mu);
    g.vmodule =
        config != nullptr ? config->vmodule : std::vector<VmoduleEntry>();
    g.info_enabled = config != nullptr && config->min_level <= Severity::kInfo;
    vlog_generation.fetch_add(1, std::memory_order_relaxed);
  }
  return state;
}

absl::Status ValidateConfig(const LogConfig& config) {
  auto valid_level = [](Severity s) {
    return s >= Severity::kInfo && s <= Severity::kFatal;
  };
  if (config.queue_size == 0) {
    return absl::InvalidArgumentError("LogConfig.queue_size must be > 0");
  }
  if (config.max_file_bytes == 0) {
    return absl::InvalidArgumentError("LogConfig.max_file_bytes must be > 0");
  }
  if (config.keep < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("LogConfig.keep must be >= 0, got ", config.keep));
  }
  if (!valid_level(config.min_level) || !valid_level(config.stderr_level)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "LogConfig levels must be INFO..FATAL (0..3), got min_level ",
        static_cast<int>(config.min_level), " and stderr_level ",
        static_cast<int>(config.stderr_level)));
  }
  return absl::OkStatus();
}

void FlushAtExit() { (void)FlushLogs(kExitFlushTimeout); }

spdlog::details::log_msg MakeMessage(const char* file, int line,
                                     const char* tag, Severity severity,
                                     absl::string_view text) {
  return spdlog::details::log_msg(
      spdlog::source_loc(file, line, tag), /*logger_name=*/"",
      internal::ToSpdlogLevel(severity),
      spdlog::string_view_t(text.data(), text.size()));
}

}  // namespace

absl::string_view SeverityName(Severity severity) {
  switch (severity) {
    case Severity::kInfo:
      return "INFO";
    case Severity::kWarning:
      return "WARNING";
    case Severity::kError:
      return "ERROR";
    case Severity::kFatal:
      return "FATAL";
  }
  return "UNKNOWN";
}

LogConfig LogConfig::FromOptions(const Options& options) {
  auto to_severity = [](int level) {
    return static_cast<Severity>(std::clamp(level, 0, 3));
  };
  LogConfig config;
  config.log_dir = options.log_files_disabled() ? "" : options.log_dir.value;
  config.min_level = to_severity(options.min_log_level.value);
  config.stderr_level = to_severity(options.stderr_log_level.value);
  config.vmodule = options.vmodule.value;
  config.max_file_bytes = options.max_log_size_mb.value << 20;
  config.keep = options.log_keep.value;
  return config;
}

absl::Status InitLogging(const LogConfig& config, Os* os) {
  if (os == nullptr) return absl::InvalidArgumentError("InitLogging: null Os");
  if (absl::Status status = ValidateConfig(config); !status.ok()) {
    return status;
  }
  Globals& g = GetGlobals();
  MutexLock init_lock(&g.init_mu);

  const internal::LogDirectoryChoice choice =
      internal::ChooseLogDirectory(*os, config.log_dir);
  std::shared_ptr<LoggingState> state;
  try {
    state = std::make_shared<LoggingState>(config, os, choice.directory);
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("Cannot start the log writer thread: ", e.what()));
  }
  if (!choice.warning.empty()) {
    // Once on stderr, whatever the stderr level, and in the files.
    const spdlog::details::log_msg warning =
        MakeMessage(__FILE__, __LINE__, internal::kNotOnStderrTag,
                    Severity::kWarning, choice.warning);
    internal::WriteToStderr(*os, warning);
    state->Post(warning);
  }

  std::shared_ptr<LoggingState> previous = Install(std::move(state), &config);
  if (previous != nullptr) previous->Stop();

  static std::once_flag at_exit;
  std::call_once(at_exit, [] { std::atexit(&FlushAtExit); });
  return absl::OkStatus();
}

void ShutdownLogging() {
  Globals& g = GetGlobals();
  MutexLock init_lock(&g.init_mu);
  std::shared_ptr<LoggingState> previous = Install(nullptr, nullptr);
  if (previous != nullptr) previous->Stop();
}

bool FlushLogs(absl::Duration timeout) {
  Globals& g = GetGlobals();
  std::shared_ptr<LoggingState> state;
  {
    ReaderMutexLock lock(&g.mu);
    state = g.state;
  }
  return state == nullptr || state->Flush(timeout);
}

bool LoggingInitialized() {
  Globals& g = GetGlobals();
  ReaderMutexLock lock(&g.mu);
  return g.state != nullptr;
}

std::string ActiveLogDirectory() {
  Globals& g = GetGlobals();
  ReaderMutexLock lock(&g.mu);
  return g.state != nullptr ? g.state->directory() : std::string();
}

uint64_t DroppedMessageCount() {
  Globals& g = GetGlobals();
  ReaderMutexLock lock(&g.mu);
  return g.state != nullptr ? g.state->DroppedMessageCount() : 0;
}

uint64_t FileWriteErrorCount() {
  Globals& g = GetGlobals();
  ReaderMutexLock lock(&g.mu);
  return g.state != nullptr ? g.state->FileWriteErrorCount() : 0;
}

bool VlogIsOn(int level, const char* file) {
  Globals& g = GetGlobals();
  ReaderMutexLock lock(&g.vlog_mu);
  return level <= VlogLevelLocked(g, file);
}

namespace internal {

LogMessage::LogMessage(const char* file, int line, Severity severity)
    : file_(file), line_(line), severity_(severity) {}

LogMessage::~LogMessage() {
  const std::string text = std::move(stream_).str();
  if (severity_ == Severity::kFatal) LogFatalAndAbort(file_, line_, text);
  const spdlog::details::log_msg msg =
      MakeMessage(file_, line_, nullptr, severity_, text);
  {
    Globals& g = GetGlobals();
    ReaderMutexLock lock(&g.mu);
    if (g.state != nullptr) {
      g.state->Post(msg);
      return;
    }
  }
  if (severity_ >= kUninitializedMinLevel) WriteToStderr(*Os::Default(), msg);
}

LogMessageFatal::LogMessageFatal(const char* file, int line)
    : LogMessage(file, line, Severity::kFatal) {}

LogMessageFatal::~LogMessageFatal() {
  LogFatalAndAbort(file_, line_, std::move(stream_).str());
}

void LogFatalAndAbort(const char* file, int line, absl::string_view message) {
  const spdlog::details::log_msg msg =
      MakeMessage(file, line, nullptr, Severity::kFatal, message);
  std::shared_ptr<LoggingState> state;
  {
    Globals& g = GetGlobals();
    ReaderMutexLock lock(&g.mu);
    state = g.state;
    if (state != nullptr) state->Post(msg);
  }
  Os* os = Os::Default();
  if (state != nullptr) {
    os = &state->os();
    // The writer thread cannot wait for itself.
    if (!LoggingState::OnWriterThread()) {
      (void)state->Flush(kFatalFlushTimeout);
    }
  }
  WriteToStderr(*os, msg);
  std::abort();
}

bool SeverityEnabled(Severity severity) {
  return static_cast<int>(severity) >=
         min_level.load(std::memory_order_relaxed);
}

bool VlogSiteIsOn(VlogSite& site, int level, const char* file) {
  const uint64_t generation = vlog_generation.load(std::memory_order_relaxed);
  if (site.generation.load(std::memory_order_acquire) != generation) {
    // Recomputed under vlog_mu, so that the last writer of a site always
    // stores the level of the newest configuration with its generation.
    Globals& g = GetGlobals();
    WriterMutexLock lock(&g.vlog_mu);
    site.level.store(VlogLevelLocked(g, file), std::memory_order_relaxed);
    site.generation.store(vlog_generation.load(std::memory_order_relaxed),
                          std::memory_order_release);
  }
  return level <= site.level.load(std::memory_order_relaxed);
}

}  // namespace internal
}  // namespace tpushim::logging
