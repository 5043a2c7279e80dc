#include "tools/progress.h"

#include <unistd.h>

#include <string>
#include <utility>

namespace tpushim::tools {

ProgressBar::ProgressBar(std::ostream& err, std::string label, int total)
    : err_(err),
      label_(std::move(label)),
      total_(total),
      enabled_(::isatty(STDERR_FILENO) == 1) {}

void ProgressBar::Show(int done, absl::string_view what) {
  if (!enabled_) return;
  constexpr int kWidth = 30;
  const int filled = total_ > 0 ? done * kWidth / total_ : kWidth;
  std::string bar(kWidth, ' ');
  for (int i = 0; i < filled && i < kWidth; ++i) bar[i] = '=';
  if (filled >= 0 && filled < kWidth) bar[filled] = '>';
  err_ << "\r\033[K" << label_ << " [" << bar << "] " << done << "/" << total_
       << " " << what << std::flush;
  shown_ = true;
}

void ProgressBar::Clear() {
  if (!enabled_ || !shown_) return;
  err_ << "\r\033[K" << std::flush;
  shown_ = false;
}

}  // namespace tpushim::tools
