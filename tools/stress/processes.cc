#include "tools/stress/processes.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "env/chips.h"
#include "env/options.h"
#include "nlohmann/json.hpp"
#include "tools/cli/interrupt.h"
#include "tools/cli/text_table.h"

extern char** environ;

namespace tpushim::tools {
namespace {

using Json = nlohmann::ordered_json;

struct Child {
  int chip = 0;
  pid_t pid = -1;
  std::string out_path;
  std::string err_path;
  bool to_kill = false;
  absl::Duration kill_at;
  bool killed = false;
  int64_t freed_after_us = -1;  // kill() to the chip seen free
  int exit_code = -1;
  int term_signal = 0;
  uint64_t ops = 0;
  uint64_t transfers_verified = 0;
  int violations = 0;
  std::string problem;  // "" when it did what it should
};

absl::StatusOr<std::string> SelfPath() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n < 0) return absl::ErrnoToStatus(errno, "readlink(/proc/self/exe)");
  return std::string(buf, static_cast<size_t>(n));
}

std::string TempFile(const std::string& what) {
  std::string path =
      absl::StrCat("/tmp/tpushim-stress-", getpid(), "-", what, ".XXXXXX");
  const int fd = mkstemp(path.data());
  if (fd >= 0) close(fd);
  return path;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The environment of the child on `chip`: this process's, with the host,
// the chip and the region set.
std::vector<std::string> ChildEnvironment(int processes, int chip) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const absl::string_view kv(*e);
    if (absl::StartsWith(kv, "TPUSHIM_DEVICE=") ||
        absl::StartsWith(kv, "TPU_VISIBLE_CHIPS=") ||
        absl::StartsWith(kv, "TPU_VISIBLE_DEVICES=") ||
        absl::StartsWith(kv, "TPU_CHIPS_PER_PROCESS_BOUNDS=") ||
        absl::StartsWith(kv, "TPU_CHIPS_PER_HOST_BOUNDS=")) {
      continue;
    }
    env.emplace_back(kv);
  }
  env.push_back(
      absl::StrCat("TPUSHIM_DEVICE=sim://?devices=", processes, "&hbm=256M"));
  env.push_back(absl::StrCat("TPU_VISIBLE_CHIPS=", chip));
  return env;
}

absl::Status Spawn(const std::string& self, const StressProcessesFlags& flags,
                   int processes, Child& c) {
  c.out_path = TempFile("out");
  c.err_path = TempFile("err");
  const std::vector<std::string> args = {
      self,
      "stress",
      "--seconds",
      absl::StrFormat("%g", flags.seconds),
      "--threads",
      absl::StrCat(flags.threads),
      "--seed",
      absl::StrCat(flags.seed + static_cast<uint64_t>(c.chip)),
      "--region-bytes",
      "16M",
      "--threshold",
      "1M",
      "--no-progress",
      "--json"};
  const std::vector<std::string> env = ChildEnvironment(processes, c.chip);
  std::vector<char*> argv, envp;
  for (const std::string& a : args)
    argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const std::string& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  // fork + exec rather than posix_spawn: the child must die with this
  // process even when it is killed with SIGKILL (PR_SET_PDEATHSIG, which
  // only the child can ask for), or it would hold its chip and pinned
  // memory. Everything the child needs is built above; between fork and
  // exec it makes only async-signal-safe calls.
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return absl::ErrnoToStatus(errno, "fork");
  if (pid == 0) {
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) {
      _exit(127);
    }
    const int in = open("/dev/null", O_RDONLY);
    const int out = open(c.out_path.c_str(), O_WRONLY | O_TRUNC);
    const int err = open(c.err_path.c_str(), O_WRONLY | O_TRUNC);
    if (in < 0 || out < 0 || err < 0 || dup2(in, 0) < 0 || dup2(out, 1) < 0 ||
        dup2(err, 2) < 0) {
      _exit(127);
    }
    // This tool blocks SIGINT and SIGTERM in every thread (it takes them
    // with sigwait); the child starts with them at their defaults.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    execve(self.c_str(), argv.data(), envp.data());
    _exit(127);
  }
  c.pid = pid;
  return absl::OkStatus();
}

// Whether chip `chip` of the host is held, read as `tpushim info` reads it.
bool ChipHeld(Os& os, const Options& options, int chip) {
  absl::StatusOr<std::vector<ChipState>> states =
      QueryChips(os, options.run_dir.value, HostChips(options));
  if (!states.ok()) return true;
  for (const ChipState& s : *states) {
    if (s.chip.index == chip && s.chip.key == absl::StrCat("sim-", chip)) {
      return s.held;
    }
  }
  return false;
}

// `interrupted`: the signal passed on to the children (0 if none); a child
// it ended, with its partial report, did what it should.
void ReadResult(Child& c, int interrupted) {
  const std::string out = ReadAll(c.out_path);
  const std::string err = ReadAll(c.err_path);
  unlink(c.out_path.c_str());
  unlink(c.err_path.c_str());
  if (c.killed) {
    if (c.freed_after_us < 0 || c.freed_after_us > kChipFreedWithinMs * 1000) {
      c.problem = absl::StrCat(
          "its chip was still held ", kChipFreedWithinMs, " ms after SIGKILL",
          c.freed_after_us < 0 ? ""
                               : absl::StrFormat(" (free after %.1f ms)",
                                                 c.freed_after_us / 1e3));
    }
    return;
  }
  const Json report = Json::parse(out, nullptr, /*allow_exceptions=*/false);
  if (report.is_object()) {
    c.ops = report.value("ops", uint64_t{0});
    c.transfers_verified = report.value("transfers_verified", uint64_t{0});
    if (report.contains("violations") && report["violations"].is_array()) {
      c.violations = static_cast<int>(report["violations"].size());
    }
  }
  const bool stopped = interrupted != 0 &&
                       (c.exit_code == 128 + SIGTERM ||
                        c.term_signal == SIGTERM || c.term_signal == SIGKILL);
  if ((c.exit_code != 0 && !stopped) || c.violations > 0 ||
      (!report.is_object() && c.term_signal == 0)) {
    std::string tail = err.substr(err.size() > 400 ? err.size() - 400 : 0);
    c.problem = absl::StrCat(
        c.term_signal != 0 ? absl::StrCat("killed by signal ", c.term_signal)
                           : absl::StrCat("exited with ", c.exit_code),
        ", ", c.violations, " violations", tail.empty() ? "" : ": ", tail);
  }
}

}  // namespace

void RunStressProcesses(const StressProcessesFlags& flags,
                        CommandContext& context) {
  absl::StatusOr<std::string> self = SelfPath();
  if (!self.ok()) {
    return ReportError(self.status(), "cannot find the tpushim executable",
                       flags.json, kExitFailure, context);
  }
  const int n = flags.processes;
  const int kills = std::min(n, flags.kills < 0 ? n / 2 : flags.kills);
  // The host the children share, as they will see it.
  FixedEnvironmentOs env_os(
      context.os,
      {{"TPUSHIM_DEVICE", absl::StrCat("sim://?devices=", n, "&hbm=256M")}});
  absl::StatusOr<Options> options = ResolveOptions(env_os);
  if (!options.ok()) {
    return ReportError(options.status(), "invalid configuration", flags.json,
                       kExitUsage, context);
  }
  for (int chip = 0; chip < n; ++chip) {
    if (ChipHeld(env_os, *options, chip)) {
      return ReportError(absl::UnavailableError(absl::StrCat(
                             "sim chip ", chip,
                             " is held already; `tpushim info` with "
                             "TPUSHIM_DEVICE=sim://?devices=",
                             n, " shows by whom")),
                         "cannot start", flags.json, kExitFailure, context);
    }
  }
  std::mt19937_64 rng(flags.seed);
  std::vector<Child> children(n);
  std::vector<int> order(n);
  for (int i = 0; i < n; ++i) order[i] = children[i].chip = i;
  std::shuffle(order.begin(), order.end(), rng);
  std::uniform_real_distribution<double> when(0.2, 0.8);
  for (int k = 0; k < kills; ++k) {
    children[order[k]].to_kill = true;
    children[order[k]].kill_at = absl::Seconds(flags.seconds * when(rng));
  }
  const absl::Time start = absl::Now();
  for (Child& c : children) {
    if (absl::Status s = Spawn(*self, flags, n, c); !s.ok()) {
      for (Child& o : children) {
        if (o.pid > 0) {
          kill(o.pid, SIGKILL);
          waitpid(o.pid, nullptr, 0);
        }
      }
      return ReportError(s, "cannot start a process", flags.json, kExitFailure,
                         context);
    }
  }
  // Kill the victims when their time comes (each only once it holds its
  // chip: a process killed before it took it frees nothing), then wait.
  // SIGINT or SIGTERM: pass SIGTERM on to the children (each stops, frees
  // its chip and prints its partial report), give them a few seconds, then
  // SIGKILL whatever is left.
  int running = n;
  const absl::Time deadline = start + absl::Seconds(flags.seconds + 120);
  int interrupted = 0;
  absl::Time stop_by = absl::InfiniteFuture();
  while (running > 0) {
    if (interrupted == 0 && InterruptSignal() != 0) {
      interrupted = InterruptSignal();
      for (Child& c : children) {
        if (c.pid > 0) kill(c.pid, SIGTERM);
      }
      stop_by = absl::Now() + absl::Seconds(10);
    }
    if (absl::Now() > stop_by) {
      for (Child& c : children) {
        if (c.pid > 0) kill(c.pid, SIGKILL);
      }
      stop_by = absl::InfiniteFuture();
    }
    for (Child& c : children) {
      if (c.pid <= 0) continue;
      if (interrupted == 0 && c.to_kill && !c.killed &&
          absl::Now() - start >= c.kill_at &&
          ChipHeld(env_os, *options, c.chip)) {
        kill(c.pid, SIGKILL);
        const absl::Time killed = absl::Now();
        c.killed = true;
        while (absl::Now() - killed < absl::Seconds(5)) {
          if (!ChipHeld(env_os, *options, c.chip)) {
            c.freed_after_us = absl::ToInt64Microseconds(absl::Now() - killed);
            break;
          }
        }
      }
      int status = 0;
      const pid_t done = waitpid(c.pid, &status, WNOHANG);
      if (done == c.pid) {
        c.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        c.term_signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
        c.pid = 0;
        --running;
      }
    }
    if (absl::Now() > deadline) {
      for (Child& c : children) {
        if (c.pid > 0) {
          kill(c.pid, SIGKILL);
          waitpid(c.pid, nullptr, 0);
          c.pid = 0;
          c.problem = "did not finish in time";
        }
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  int problems = 0;
  std::vector<int64_t> freed;
  for (Child& c : children) {
    if (c.problem.empty()) ReadResult(c, interrupted);
    if (!c.problem.empty()) ++problems;
    if (c.killed && c.freed_after_us >= 0) freed.push_back(c.freed_after_us);
  }
  std::string left_held;
  for (int chip = 0; chip < n; ++chip) {
    if (ChipHeld(env_os, *options, chip)) {
      absl::StrAppend(&left_held, left_held.empty() ? "" : ", ", chip);
      ++problems;
    }
  }
  const int killed =
      static_cast<int>(std::count_if(children.begin(), children.end(),
                                     [](const Child& c) { return c.killed; }));
  std::sort(freed.begin(), freed.end());
  const double median_ms = freed.empty() ? 0 : freed[freed.size() / 2] / 1e3;
  const double max_ms = freed.empty() ? 0 : freed.back() / 1e3;
  std::ostream& out = *context.out;
  if (flags.json) {
    Json rows = Json::array();
    for (const Child& c : children) {
      rows.push_back(
          {{"chip", c.chip},
           {"killed", c.killed},
           {"killed_at_seconds",
            c.killed ? Json(absl::ToDoubleSeconds(c.kill_at)) : Json(nullptr)},
           {"chip_freed_after_ms", c.freed_after_us >= 0
                                       ? Json(c.freed_after_us / 1e3)
                                       : Json(nullptr)},
           {"exit_code", c.exit_code},
           {"ops", c.ops},
           {"transfers_verified", c.transfers_verified},
           {"violations", c.violations},
           {"problem", c.problem.empty() ? Json(nullptr) : Json(c.problem)}});
    }
    WriteJson(
        {{"processes", n},
         {"partial", interrupted != 0},
         {"killed", killed},
         {"seconds", flags.seconds},
         {"seed", flags.seed},
         {"chip_freed_within_ms", kChipFreedWithinMs},
         {"chip_freed_after_ms", {{"median", median_ms}, {"max", max_ms}}},
         {"chips_left_held", left_held},
         {"problems", problems},
         {"children", rows}},
        out);
  } else {
    TextTable table({"CHIP", "OUTCOME", "OPS", "VERIFIED", "FREED AFTER"});
    for (const Child& c : children) {
      table.AddRow({absl::StrCat(c.chip),
                    c.killed ? absl::StrFormat("SIGKILL at %.2fs",
                                               absl::ToDoubleSeconds(c.kill_at))
                             : (c.problem.empty() ? "ok" : "FAILED"),
                    c.killed ? "-" : absl::StrCat(c.ops),
                    c.killed ? "-" : absl::StrCat(c.transfers_verified),
                    c.freed_after_us >= 0
                        ? absl::StrFormat("%.2f ms", c.freed_after_us / 1e3)
                        : "-"});
    }
    out << n << " processes on disjoint chips of sim://?devices=" << n << ", "
        << killed << " killed with SIGKILL, seed " << flags.seed
        << (interrupted != 0 ? absl::StrCat(" (partial: interrupted by ",
                                            InterruptSignalName(interrupted),
                                            ", passed on to the processes)")
                             : "")
        << "\n";
    table.Print(out);
    if (!freed.empty()) {
      out << absl::StrFormat(
          "chip free after SIGKILL: median %.2f ms, max %.2f ms (limit %d "
          "ms)\n",
          median_ms, max_ms, kChipFreedWithinMs);
    }
    for (const Child& c : children) {
      if (!c.problem.empty()) {
        out << "  chip " << c.chip << ": " << c.problem << "\n";
      }
    }
    if (!left_held.empty()) {
      out << "  chips still held at the end: " << left_held << "\n";
    }
  }
  context.exit_code = problems == 0 ? kExitOk : kExitFailure;
}

}  // namespace tpushim::tools
