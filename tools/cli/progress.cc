#include "tools/cli/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "common/human_bytes.h"

namespace tpushim::tools {

namespace {

constexpr int kWidth = 30;

// "1.00G", "512.00M": two decimals of the largest binary unit.
std::string Bytes(uint64_t bytes) { return HumanReadableBytes(bytes); }

}  // namespace

ProgressBar::ProgressBar(std::ostream& err, std::string label, int total)
    : ProgressBar(err, std::move(label), total, ::isatty(STDERR_FILENO) == 1) {}

ProgressBar::ProgressBar(std::ostream& err, std::string label, int total,
                         bool enabled)
    : err_(err), label_(std::move(label)), total_(total), enabled_(enabled) {}

void ProgressBar::Draw(int filled, absl::string_view text) {
  std::string bar(kWidth, ' ');
  for (int i = 0; i < filled && i < kWidth; ++i) bar[i] = '=';
  if (filled >= 0 && filled < kWidth) bar[filled] = '>';
  err_ << "\r\033[K" << label_ << " [" << bar << "] " << text << std::flush;
  shown_ = true;
}

void ProgressBar::Show(int done, absl::string_view what) {
  if (!enabled_) return;
  const int filled = total_ > 0 ? done * kWidth / total_ : kWidth;
  Draw(filled, absl::StrCat(done, "/", total_, " ", what));
}

void ProgressBar::ShowFraction(double fraction, absl::string_view what) {
  if (!enabled_) return;
  Draw(static_cast<int>(std::clamp(fraction, 0.0, 1.0) * kWidth), what);
}

void ProgressBar::Clear() {
  if (!enabled_ || !shown_) return;
  err_ << "\r\033[K" << std::flush;
  shown_ = false;
}

StartupProgressDisplay::StartupProgressDisplay(std::ostream& err,
                                               std::string tool, bool terminal)
    : err_(err),
      tool_(std::move(tool)),
      terminal_(terminal),
      bar_(err, absl::StrCat(tool_, " start-up"), 0, terminal) {}

StartupProgressDisplay::StartupProgressDisplay(std::ostream& err,
                                               std::string tool)
    : StartupProgressDisplay(err, std::move(tool),
                             ::isatty(STDERR_FILENO) == 1) {}

void StartupProgressDisplay::operator()(const StartupProgress& p) {
  const double seconds = absl::ToDoubleSeconds(p.elapsed);
  const bool behind = behind_.load(std::memory_order_relaxed);
  if (p.phase == StartupProgress::Phase::kDone) {
    bar_.Clear();
    if (!terminal_ && printed_line_) {
      if (p.done_bytes < p.total_bytes) {
        // Stopped: the system went (behind the run: the run ended first).
        err_ << "tpushim " << tool_ << ": premapping stopped at "
             << Bytes(p.done_bytes) << " of " << Bytes(p.total_bytes)
             << absl::StrFormat(" after %.1f s", seconds)
             << (behind ? " (the run ended first)" : "") << "\n"
             << std::flush;
        return;
      }
      err_ << "tpushim " << tool_ << ": premapped " << Bytes(p.done_bytes)
           << absl::StrFormat(" in %.1f s", seconds)
           << (behind ? ", behind the run" : "") << "\n"
           << std::flush;
    }
    return;
  }
  if (p.total_bytes == 0) return;
  const double rate = seconds > 0 ? static_cast<double>(p.done_bytes) / seconds
                                  : 0.0;  // bytes per second
  std::string left = "";
  if (rate > 0) {
    left = absl::StrFormat(
        "%.0f s left",
        std::ceil(static_cast<double>(p.total_bytes - p.done_bytes) / rate));
  }
  const double fraction =
      static_cast<double>(p.done_bytes) / static_cast<double>(p.total_bytes);
  if (terminal_) {
    bar_.ShowFraction(
        fraction,
        absl::StrCat(behind ? "behind the run: " : "", Bytes(p.done_bytes),
                     " of ", Bytes(p.total_bytes),
                     rate > 0 ? absl::StrFormat(", %.2f GB/s", rate / 1e9) : "",
                     left.empty() ? "" : ", ", left));
    return;
  }
  // Plain lines only for a start-up that takes a while, not too often.
  if (p.elapsed < absl::Seconds(2) ||
      (printed_line_ && p.elapsed - last_line_ < absl::Seconds(5))) {
    return;
  }
  last_line_ = p.elapsed;
  printed_line_ = true;
  err_ << "tpushim " << tool_ << ": premapping " << Bytes(p.done_bytes)
       << " of " << Bytes(p.total_bytes)
       << absl::StrFormat(" (%.0f%%)", fraction * 100)
       << (behind ? " behind the run" : "")
       << (rate > 0 ? absl::StrFormat(", %.2f GB/s", rate / 1e9) : "")
       << (left.empty() ? "" : ", about ") << left << "\n"
       << std::flush;
}

}  // namespace tpushim::tools
