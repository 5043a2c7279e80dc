// Drawing a picture with gnuplot, for the subcommands' --plot.
//
//   std::optional<std::string> gnuplot = FindGnuplot();
//   absl::Status s = RenderPlot(*gnuplot, "out.png", {1000, 800},
//       {{"points.dat", data}},
//       [](const std::string& dir) { return "plot '" + dir +
//                                           "/points.dat' using 1:2\n"; });
//
// The data files and gnuplot's image live in a fresh temporary directory
// that is removed afterwards; the image is then copied to the user's file
// with every write checked (gnuplot does not report a failed write, and the
// user's path never has to be quoted in a script). .png gives a PNG
// (pngcairo), anything else an SVG.

#ifndef TPUSHIM_TOOLS_CLI_GNUPLOT_H_
#define TPUSHIM_TOOLS_CLI_GNUPLOT_H_

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tpushim::tools {

// gnuplot's path on PATH, if it is installed.
std::optional<std::string> FindGnuplot();

// Checks --plot's file name (.svg or .png) and finds gnuplot: its path, or
// INVALID_ARGUMENT / FAILED_PRECONDITION saying what to change.
absl::StatusOr<std::string> GnuplotForPlot(const std::string& file);

struct PlotSize {
  int width = 1000;
  int height = 800;
};

// Writes the `data` files (name, contents) into a temporary directory,
// runs the script `script(dir)` returns after the terminal and output
// lines, and copies the image to `file`. The error names what failed
// (gnuplot's exit and the end of its stderr, or the write).
absl::Status RenderPlot(
    const std::string& gnuplot, const std::string& file, PlotSize size,
    const std::vector<std::pair<std::string, std::string>>& data,
    absl::FunctionRef<std::string(const std::string& dir)> script);

// `text` as a gnuplot string literal: in single quotes (which gnuplot
// takes as they are, no escapes), a quote doubled, and any control
// character (a newline would end the command and start another) replaced
// by '?'. Every text from outside (file names, device names) goes into a
// script through it.
std::string GnuplotString(absl::string_view text);

// Writes `text` to `path`, checking the write and the close.
absl::Status WriteWholeFile(const std::string& path, const std::string& text);

}  // namespace tpushim::tools

#endif  // TPUSHIM_TOOLS_CLI_GNUPLOT_H_
