// A one-line progress bar for the `tpushim` subcommands:
//
//   bench [=======>                      ] 7/25 h2d staged 1M
//
// drawn on stderr in place (carriage return, erase line), and only when
// stderr is a terminal, so that pipes, files and CI logs get none. Erased
// by Clear() and on destruction, so results printed afterwards start on a
// clean line.
//
// Thread-compatible: one thread draws.

#ifndef TPUSHIM_TOOLS_PROGRESS_H_
#define TPUSHIM_TOOLS_PROGRESS_H_

#include <ostream>
#include <string>

#include "absl/strings/string_view.h"

namespace tpushim::tools {

class ProgressBar {
 public:
  // `label` leads the line ("bench"); `total` is the number of steps.
  ProgressBar(std::ostream& err, std::string label, int total);
  ~ProgressBar() { Clear(); }
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // Redraws the bar at `done` of `total` steps, followed by `what`.
  void Show(int done, absl::string_view what);
  // Erases the bar (if drawn).
  void Clear();

 private:
  std::ostream& err_;
  const std::string label_;
  const int total_;
  const bool enabled_;
  bool shown_ = false;
};

}  // namespace tpushim::tools

#endif  // TPUSHIM_TOOLS_PROGRESS_H_
