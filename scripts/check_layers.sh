#!/usr/bin/env bash
# Fails when a source file includes a header of a layer above its own.
#
#   bash scripts/check_layers.sh [ROOT]     (ROOT defaults to the checkout)
#
# The layers, bottom to top (docs/architecture.md says what each owns):
#
#   0  vocabulary  include/tpushim/{options,stats,transfer,export}.h
#   1  common
#   2  env         (env/posix/ with it)
#   3  logging
#   4  allocator
#   5  device      (device/sim/, device/vfio/, device/nvme/)
#   6  transfer
#   7  driver      with its public face include/tpushim/{system,memory,c_api,version}.h
#   8  tools, bench, fuzz, examples, python (the Python package's extension)
#
# A file may include its own layer and the ones below; the top folders may
# not include each other. Inside tools/, the subcommands' folders
# (tools/demo/, tools/stress/, ...) may include their own folder and
# tools/cli/ (the plumbing they share) but not each other; tools/cli/ includes
# only itself; tools/main/, the app that holds every subcommand, may include
# any of them. Only includes written `#include "<folder>/…"`
# with <folder> a folder of the checkout (or `tpushim/` for the public
# headers) are checked; tests/ is exempt and is not checked. Prints one
# line per offending include and exits 1 when there is any, 0 otherwise.
set -euo pipefail
root=${1:-"$(cd "$(dirname "$0")/.." && pwd)"}
cd "$root"

files=$(find common env logging allocator device transfer driver tools bench \
  fuzz examples python include -type f \( -name '*.h' -o -name '*.cc' -o -name '*.c' \) \
  2>/dev/null | sort || true)
folders=$(find . -mindepth 1 -maxdepth 1 -type d -printf '%f\n' | tr '\n' ' ')

# grep prints file:line:text for every quoted include; awk judges each.
# shellcheck disable=SC2086  # the file list splits on purpose
grep -Hn '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' $files /dev/null |
  awk -v folders="$folders" '
    BEGIN {
      split("common env logging allocator device transfer driver", lower, " ")
      for (i = 1; i <= 7; ++i) layer[lower[i]] = i
      split("tools bench fuzz examples python", top, " ")
      for (i in top) layer[top[i]] = 8
      split(folders, f, " ")
      for (i in f) is_folder[f[i]] = 1
      split("options.h stats.h transfer.h export.h", vocab, " ")
      for (i in vocab) is_vocab[vocab[i]] = 1
      bad = 0
    }
    function public_layer(name) { return (name in is_vocab) ? 0 : 7 }
    function first(path) { sub(/\/.*/, "", path); return path }
    # The folder of tools/ that `path` lies in ("stress" for
    # tools/stress/worker.h); "" for a file directly in tools/.
    function tools_room(path) {
      if (path !~ /^tools\/[^\/]+\//) return ""
      sub(/^tools\//, "", path); return first(path)
    }
    {
      file = $0; sub(/:.*/, "", file)
      rest = substr($0, length(file) + 2)
      line = rest; sub(/:.*/, "", line)
      target = rest; sub(/^[^"]*"/, "", target); sub(/".*/, "", target)
      if (file ~ /^include\/tpushim\//) {
        name = file; sub(/^include\/tpushim\//, "", name)
        own = public_layer(name); own_top = "include"
      } else {
        own_top = first(file); own = layer[own_top]
      }
      head = first(target)
      if (head == "tpushim") {
        name = target; sub(/^tpushim\//, "", name)
        theirs = public_layer(name); their_top = "include"
      } else if ((head in is_folder) && target ~ /\//) {
        if (!(head in layer)) {
          printf "%s:%s: includes \"%s\": %s/ is not a layer of the library\n", file, line, target, head
          bad = 1; next
        }
        theirs = layer[head]; their_top = head
      } else {
        next  # a system or third-party header
      }
      if (theirs > own) {
        printf "%s:%s: includes \"%s\", a layer above its own (%s is above %s)\n", file, line, target, (head == "tpushim" ? "the public " target : head), own_top
        bad = 1
      } else if (theirs == 8 && own == 8 && their_top != own_top) {
        printf "%s:%s: includes \"%s\": the top folders %s and %s do not include each other\n", file, line, target, own_top, their_top
        bad = 1
      } else if (own_top == "tools" && their_top == "tools") {
        mine = tools_room(file); other = tools_room(target)
        if (mine == "cli" && other != "cli") {
          printf "%s:%s: includes \"%s\": tools/cli is the plumbing under every subcommand and includes only itself\n", file, line, target
          bad = 1
        } else if (mine != "" && mine != "main" && mine != "cli" && other != mine && other != "cli") {
          printf "%s:%s: includes \"%s\": tools/%s may include only its own folder and tools/cli (what two subcommands share belongs in tools/cli)\n", file, line, target, mine
          bad = 1
        }
      }
    }
    END { exit bad }
  ' && exit 0

echo "check_layers: layers only point down: the include/tpushim vocabulary → common → env → logging → allocator → device → transfer → driver (with include/tpushim/system.h, c_api.h, version.h) → tools, bench, fuzz, examples, python; inside tools/, a subcommand's folder includes only itself and tools/cli" >&2
exit 1
