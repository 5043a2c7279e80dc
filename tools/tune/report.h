// What `tpushim tune` (tools/tune/tune.cc) prints: a point as JSON, the CSV
// rows, the human table with the recommendation, and the --plot picture
// drawn with gnuplot. Internal to the tool.

#ifndef TPUSHIM_TOOLS_TUNE_REPORT_H_
#define TPUSHIM_TOOLS_TUNE_REPORT_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "tools/tune/sweep.h"
#include "tools/tune/workload.h"

namespace tpushim::tools::tune_internal {

// A point as the "points" array of --json shows it.
Json PointJson(const Point& p);
// --csv: a header and one row per point.
void PrintCsv(const std::vector<Point>& points, std::ostream& out);
// The human output: the workload, a table of the points (GB/s the median,
// RANGE the slowest and fastest run), the recommendation marked "(within
// noise)" when it is, or "none" and why, and where the plot went (when
// `plot` is not empty).
void PrintTable(const std::vector<Point>& points, const Workload& w,
                const std::string& device, int repeats, int dropped,
                const Recommendation& recommendation, const std::string& plot,
                std::ostream& out);
// Draws the sweep into `file` (SVG or PNG by its extension) with `gnuplot`.
absl::Status Plot(const std::vector<Point>& points, const Workload& w,
                  const std::string& device, const std::string& gnuplot,
                  const std::string& file);

}  // namespace tpushim::tools::tune_internal

#endif  // TPUSHIM_TOOLS_TUNE_REPORT_H_
