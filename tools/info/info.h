// `tpushim info`: the resolved configuration (every setting, its value and
// where it came from), the host facts that decide whether the premapped
// region can be mapped and pinned, and where the two clash.
//
//   tpushim info            tables
//   tpushim info --json     one JSON object (see RegisterInfoCommand)
//
// Informational: it allocates, pins and starts nothing, and neither
// initialises logging nor creates log files. Thread-safety: single-threaded.

#ifndef TPUSHIM_TOOLS_INFO_INFO_H_
#define TPUSHIM_TOOLS_INFO_INFO_H_

#include "CLI/CLI.hpp"
#include "tools/cli/command.h"

namespace tpushim::tools {

// Adds the `info` subcommand to `app`. When it runs, it resolves the
// options from `context.os` (environment and LIBTPU_INIT_ARGS), reads the
// host facts and prints both plus CheckOptionsAgainstHost's clashes to
// `context.out`. `context` must outlive the parse of `app`.
//
// Exit status (in context.exit_code): kExitOk whenever the configuration is
// valid, clashes included; kExitUsage for an invalid configuration
// ("tpushim: invalid configuration: <message>" on stderr, or with --json a
// {"error": {"code": "INVALID_ARGUMENT", "message": ...}} object on
// stdout); kExitFailure when /proc/meminfo cannot be read.
//
// The --json object:
//   {"config": [{"name", "value", "source"}...],
//    "warnings": [string...],
//    "host": {"mem_total_bytes", "mem_available_bytes",
//             "cgroup": {"version", "path", "memory_limit_bytes",
//                        "memory_usage_bytes"},   // null: none/unknown
//             "memlock": {"soft", "hard"},        // null: unlimited
//             "cap_ipc_lock", "thp": {"enabled", "defrag"},
//             "hugepage_pools": [{"page_bytes", "total", "free",
//                                 "reserved"}...],
//             "numa_nodes": [{"node", "total_bytes", "free_bytes"}...],
//             "online_cpus", "page_size"},
//    "checks": [{"level": "warning"|"error", "message"}...]}
void RegisterInfoCommand(CLI::App& app, CommandContext& context);

}  // namespace tpushim::tools

#endif  // TPUSHIM_TOOLS_INFO_INFO_H_
