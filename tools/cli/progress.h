// A one-line progress bar for the `tpushim` subcommands:
//
//   bench [=======>                      ] 7/25 h2d staged 1M
//
// drawn on stderr in place (carriage return, erase line), and only when
// stderr is a terminal, so that pipes, files and CI logs get none. Erased
// by Clear() and on destruction, so results printed afterwards start on a
// clean line.
//
// StartupProgressDisplay shows System start-up (premapping a large region
// can take seconds) with that bar, its rate and the time left:
//
//   demo start-up [=========>                    ] 1.00G of 4.00G, 2.10 GB/s, 2
//   s left
//
// and, when stderr is not a terminal, as plain lines once start-up has
// taken 2 s, at most one every 5 s, and a last line saying how long it
// took:
//
//   tpushim demo: premapping 1.00G of 4.00G (25%), 2.10 GB/s, about 2 s left
//   tpushim demo: premapped 4.00G in 3.1 s
//
// Thread-compatible: one thread draws (the display is called from the
// runtime's start-up thread while the caller waits in System::Create).

#ifndef TPUSHIM_TOOLS_CLI_PROGRESS_H_
#define TPUSHIM_TOOLS_CLI_PROGRESS_H_

#include <atomic>
#include <ostream>
#include <string>

#include "absl/strings/string_view.h"
#include "tpushim/system.h"

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
  // Redraws the bar filled to `fraction` (0..1), followed by `what`, with
  // no step count.
  void ShowFraction(double fraction, absl::string_view what);
  // Erases the bar (if drawn).
  void Clear();

 private:
  // Draws `filled` of kWidth cells.
  void Draw(int filled, absl::string_view text);

  std::ostream& err_;
  const std::string label_;
  const int total_;
  const bool enabled_;
  bool shown_ = false;

  friend class StartupProgressDisplay;
  ProgressBar(std::ostream& err, std::string label, int total, bool enabled);
};

class StartupProgressDisplay {
 public:
  // `tool` names the subcommand ("demo"); `terminal`: whether `err` is a
  // terminal (the bar) or not (plain lines).
  StartupProgressDisplay(std::ostream& err, std::string tool, bool terminal);
  // The same, asking isatty(stderr).
  StartupProgressDisplay(std::ostream& err, std::string tool);

  void operator()(const StartupProgress& progress);
  // System::Create has returned: what is still reported is premapping
  // behind the run (TPUSHIM_PREMAP=background), and the lines say so:
  //
  //   tpushim demo: premapping 1.00G of 4.00G (25%) behind the run, ...
  //   tpushim demo: premapped 4.00G in 3.1 s, behind the run
  //
  // Thread-safe against the calls above (which then come from the
  // premapping thread).
  void CreateReturned() { behind_.store(true, std::memory_order_relaxed); }

 private:
  std::ostream& err_;
  const std::string tool_;
  const bool terminal_;
  std::atomic<bool> behind_{false};
  ProgressBar bar_;
  absl::Duration last_line_ = absl::ZeroDuration();
  bool printed_line_ = false;
};

}  // namespace tpushim::tools

#endif  // TPUSHIM_TOOLS_CLI_PROGRESS_H_
