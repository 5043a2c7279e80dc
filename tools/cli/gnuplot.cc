#include "tools/cli/gnuplot.h"

#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/subprocess.h"

namespace tpushim::tools {
namespace {

std::string EnvOr(const char* name, const char* fallback) {
  const char* v = getenv(name);
  return v == nullptr ? fallback : v;
}

// The last `lines` lines of `text`.
std::string LastLines(absl::string_view text, int lines) {
  while (!text.empty() && text.back() == '\n') text.remove_suffix(1);
  size_t start = text.size();
  for (int i = 0; i < lines && start > 0; ++i) {
    const size_t newline = text.rfind('\n', start - 1);
    if (newline == absl::string_view::npos) {
      start = 0;
      break;
    }
    start = newline;
  }
  if (start < text.size() && text[start] == '\n') ++start;
  return std::string(text.substr(start));
}

}  // namespace

std::optional<std::string> FindGnuplot() {
  const std::string path = EnvOr("PATH", "/usr/bin:/bin");
  for (absl::string_view dir : absl::StrSplit(path, ':', absl::SkipEmpty())) {
    std::string candidate = absl::StrCat(dir, "/gnuplot");
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return std::nullopt;
}

absl::StatusOr<std::string> GnuplotForPlot(const std::string& file) {
  if (!absl::EndsWith(file, ".svg") && !absl::EndsWith(file, ".png")) {
    return absl::InvalidArgumentError(
        absl::StrCat("--plot=", file, ": the file must end in .svg or .png"));
  }
  std::optional<std::string> gnuplot = FindGnuplot();
  if (!gnuplot) {
    return absl::FailedPreconditionError(
        "--plot needs gnuplot, which is not installed (not found on PATH); "
        "install it with `apt-get install gnuplot-nox` (scripts/setup.sh "
        "does) or drop --plot");
  }
  return *gnuplot;
}

std::string GnuplotString(absl::string_view text) {
  std::string out = "'";
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '\'') {
      out += "''";
    } else if (u < 0x20 || u == 0x7f) {
      out += '?';
    } else {
      out += c;
    }
  }
  out += "'";
  return out;
}

absl::Status WriteWholeFile(const std::string& path, const std::string& text) {
  errno = 0;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) {
    return absl::ErrnoToStatus(errno == 0 ? EIO : errno,
                               absl::StrCat("cannot write ", path));
  }
  return absl::OkStatus();
}

absl::Status RenderPlot(
    const std::string& gnuplot, const std::string& file, PlotSize size,
    const std::vector<std::pair<std::string, std::string>>& data,
    absl::FunctionRef<std::string(const std::string& dir)> script) {
  std::string dir_template =
      absl::StrCat(EnvOr("TMPDIR", "/tmp"), "/tpushim-plot.XXXXXX");
  if (mkdtemp(dir_template.data()) == nullptr) {
    return absl::ErrnoToStatus(errno,
                               absl::StrCat("mkdtemp(", dir_template, ")"));
  }
  const std::string dir = dir_template;
  const bool png = absl::EndsWith(file, ".png");
  const std::string image = dir + (png ? "/plot.png" : "/plot.svg");
  const std::string script_file = dir + "/plot.gp";
  std::vector<std::string> written;

  std::ostringstream gp;
  gp << (png ? absl::StrCat("set terminal pngcairo size ", size.width, ",",
                            size.height, " font 'sans,10'\n")
             : absl::StrCat("set terminal svg size ", size.width, ",",
                            size.height,
                            " dynamic font 'sans,11' background '#ffffff'\n"))
     << "set output " << GnuplotString(image) << "\n"
     << "set termoption noenhanced\n"
     << script(dir);

  absl::Status status;
  for (const auto& [name, contents] : data) {
    const std::string path = absl::StrCat(dir, "/", name);
    status = WriteWholeFile(path, contents);
    written.push_back(path);
    if (!status.ok()) break;
  }
  if (status.ok()) {
    status = WriteWholeFile(script_file, gp.str());
    written.push_back(script_file);
  }
  if (status.ok()) {
    absl::StatusOr<SubprocessResult> r = RunSubprocess(
        gnuplot, {script_file}, {absl::StrCat("PATH=", EnvOr("PATH", ""))},
        absl::Seconds(60));
    if (!r.ok()) {
      status = r.status();
    } else if (r->exit_code != 0) {
      status = absl::InternalError(absl::StrCat(
          "gnuplot failed (exit ", r->exit_code, "): ", LastLines(r->err, 5)));
    }
  }
  if (status.ok()) {
    std::ifstream in(image, std::ios::binary);
    std::ostringstream contents;
    contents << in.rdbuf();
    if (!in || contents.str().empty()) {
      status = absl::InternalError(
          absl::StrCat("gnuplot wrote no image (", image, ")"));
    } else {
      status = WriteWholeFile(file, contents.str());
    }
  }
  written.push_back(image);
  for (const std::string& f : written) unlink(f.c_str());
  rmdir(dir.c_str());
  return status;
}

}  // namespace tpushim::tools
