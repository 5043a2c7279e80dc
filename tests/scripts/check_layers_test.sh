#!/usr/bin/env bash
# scripts/check_layers.sh: passes on the checkout, and fails, naming the
# file, the line and the layers, on a tree with includes that run upwards.
set -euo pipefail
script=$1
checkout=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

bash "$script" "$checkout"

mkdir -p "$work"/{common,device,transfer,driver,tools,bench,tests,include/tpushim,python/src}
mkdir -p "$work"/tools/{cli,main,demo,stress}
cat >"$work/device/sim.cc" <<'SRC'
#include "common/mutex.h"
#include "device/device.h"
#include "tpushim/transfer.h"
#include "transfer/transfer_engine.h"
#include <vector>
#include "absl/status/status.h"
SRC
cat >"$work/transfer/engine.h" <<'SRC'
#include "tpushim/system.h"
SRC
cat >"$work/common/x.h" <<'SRC'
#include "tests/testing/temp_dir.h"
SRC
cat >"$work/tools/t.cc" <<'SRC'
#include "driver/system_internal.h"
#include "bench/x.h"
SRC
cat >"$work/tools/stress/worker.cc" <<'SRC'
#include "tools/stress/record.h"
#include "tools/cli/interrupt.h"
#include "tools/demo/pipeline.h"
#include "tools/main/cli.h"
SRC
cat >"$work/tools/cli/flags.cc" <<'SRC'
#include "tools/cli/text_table.h"
#include "tools/stress/stress.h"
SRC
cat >"$work/tools/main/cli.cc" <<'SRC'
#include "tools/cli/command.h"
#include "tools/demo/demo.h"
#include "tools/stress/stress.h"
SRC
cat >"$work/python/src/m.cc" <<'SRC'
#include "tpushim/system.h"
#include "driver/system_internal.h"
#include "tools/cli/flags.h"
SRC
cat >"$work/include/tpushim/stats.h" <<'SRC'
#include "tpushim/transfer.h"
#include "tpushim/c_api.h"
SRC

if out=$(bash "$script" "$work" 2>&1); then
  echo "FAIL: check_layers.sh passed a tree with upward includes" >&2
  exit 1
fi
expect=(
  'device/sim.cc:4: includes "transfer/transfer_engine.h", a layer above its own (transfer is above device)'
  'transfer/engine.h:1: includes "tpushim/system.h", a layer above its own'
  'common/x.h:1: includes "tests/testing/temp_dir.h": tests/ is not a layer of the library'
  'tools/t.cc:2: includes "bench/x.h": the top folders tools and bench do not include each other'
  'include/tpushim/stats.h:2: includes "tpushim/c_api.h", a layer above its own'
  'tools/stress/worker.cc:3: includes "tools/demo/pipeline.h": tools/stress may include only its own folder and tools/cli'
  'tools/stress/worker.cc:4: includes "tools/main/cli.h": tools/stress may include only its own folder and tools/cli'
  'tools/cli/flags.cc:2: includes "tools/stress/stress.h": tools/cli is the plumbing under every subcommand and includes only itself'
  'python/src/m.cc:3: includes "tools/cli/flags.h": the top folders python and tools do not include each other'
)
for line in "${expect[@]}"; do
  if ! grep -qF "$line" <<<"$out"; then
    printf 'FAIL: expected the line\n  %s\nin\n%s\n' "$line" "$out" >&2
    exit 1
  fi
done
if [[ $(grep -c ': includes ' <<<"$out") -ne ${#expect[@]} ]]; then
  printf 'FAIL: allowed includes reported:\n%s\n' "$out" >&2
  exit 1
fi
echo "PASS"
