#!/usr/bin/env bash
# Runs the commands README.md, docs/ and examples/*/README.md show, as
# listed in doc_commands.txt (its header gives the format), and checks
# their exit status and key lines, so that a document cannot drift from
# what the tool does. A `doc-out:` line must appear both in the document
# and in the output: changing either side alone fails the test.
#
# Usage: doc_commands_test.sh TPUSHIM_TOOL SOURCE_DIR [LIST] [ENTRY...]
# Optional environment: C_BACKEND, TPUSHIM_SHARED and CPP_BACKEND (the
# examples and libtpushim.so), TPUSHIM_PYTHON and TPUSHIM_PYTHON_DIR (the
# interpreter and the build's Python package); entries that need them are
# skipped without.
#
# Each command runs under bash (with pipefail, so a documented command
# piped into jq still has its own exit status) in a clean environment (env -i) in a fresh
# temporary directory ($WORK), with the tool as `tpushim` on PATH, logs in
# $WORK/logs and a 64 MiB premapped region unless the command sets one;
# only the sanitizers' *_OPTIONS pass through from the caller. The chip
# locks live in a run directory of the test's own (TPUSHIM_RUN_DIR), so
# that tests running beside it never hold its chips.
set -u

tool=${1:?usage: doc_commands_test.sh TPUSHIM_TOOL SOURCE_DIR [LIST] [ENTRY...]}
src=${2:?usage: doc_commands_test.sh TPUSHIM_TOOL SOURCE_DIR [LIST] [ENTRY...]}
list=${3:-$(dirname "$0")/doc_commands.txt}
shift $(($# < 3 ? $# : 3))
only=("$@")

[[ -x $tool ]] || { echo "FAIL: no tool at $tool"; exit 1; }
src=$(cd "$src" && pwd)  # absolute: commands run elsewhere (SOURCE_DIR)
[[ -r $list ]] || { echo "FAIL: cannot read $list"; exit 1; }

top=$(mktemp -d /tmp/doc_commands.XXXXXX)
trap 'rm -rf "$top"' EXIT
mkdir -p "$top/bin" "$top/run"
ln -s "$(readlink -f "$tool")" "$top/bin/tpushim"

failures=0
ran=0
skipped=0
started=$SECONDS

# The fields of the entry being read.
name="" doc="" skip="" needs="" exit_want=0 file=""
runs=() shows=() outs=() doc_outs=()

fail() {
  echo "FAIL [$name] $*"
  failures=$((failures + 1))
}

# The first ```json block of $1 (a document), without its fence lines and
# their indentation.
json_block() {
  awk '/^ *```json *$/ && !done {inside = 1; next}
       inside && /^ *```/ {inside = 0; done = 1; next}
       inside {sub(/^  /, ""); print}' "$1"
}

run_entry() {
  [[ -z $name ]] && return
  if ((${#only[@]} > 0)); then
    local o hit=0
    for o in "${only[@]}"; do [[ $o == "$name" ]] && hit=1; done
    ((hit)) || return
  fi
  local path="$src/$doc"
  if [[ -n $skip ]]; then
    echo "SKIP [$name] $skip"
    skipped=$((skipped + 1))
    return
  fi
  if [[ -n $needs && ! -e ${!needs:-/nonexistent} ]]; then
    echo "SKIP [$name] needs $needs (not built here)"
    skipped=$((skipped + 1))
    return
  fi
  ran=$((ran + 1))
  if ((${#runs[@]} == 0)); then
    fail "has no run: line"
    return
  fi
  if [[ ! -r $path ]]; then
    fail "no document $doc"
    return
  fi
  local s
  for s in "${shows[@]}"; do
    grep -qF -- "$s" "$path" || fail "$doc no longer shows: $s"
  done
  for s in "${doc_outs[@]}"; do
    grep -qF -- "$s" "$path" || fail "$doc no longer says: $s"
  done
  local work="$top/$name"
  mkdir -p "$work/logs"
  if [[ -n $file ]]; then
    json_block "$path" >"$work/$file"
    [[ -s $work/$file ]] || fail "$doc has no \`\`\`json block for $file"
  fi
  local out="$work/output" i rc=0 t0=$SECONDS
  : >"$out"
  for i in "${!runs[@]}"; do
    (cd "$work" && env -i PATH="$top/bin:/usr/local/bin:/usr/bin:/bin" \
      HOME="$work" WORK="$work" LANG=C.UTF-8 TPU_LOG_DIR="$work/logs" \
      TPU_PREMAPPED_BUFFER_SIZE=67108864 \
      C_BACKEND="${C_BACKEND:-}" TPUSHIM_SHARED="${TPUSHIM_SHARED:-}" \
      CPP_BACKEND="${CPP_BACKEND:-}" ASAN_OPTIONS="${ASAN_OPTIONS:-}" \
      TPUSHIM_PYTHON="${TPUSHIM_PYTHON:-}" PYTHONPATH="${TPUSHIM_PYTHON_DIR:-}" \
      SOURCE_DIR="$src" \
      UBSAN_OPTIONS="${UBSAN_OPTIONS:-}" LSAN_OPTIONS="${LSAN_OPTIONS:-}" \
      TSAN_OPTIONS="${TSAN_OPTIONS:-}" TPUSHIM_RUN_DIR="$top/run" \
      timeout 60 bash -o pipefail -c "${runs[$i]}") >>"$out" 2>&1
    rc=$?
    if ((i < ${#runs[@]} - 1 && rc != 0)); then
      fail "exit status $rc from: ${runs[$i]}"
    fi
  done
  ((rc == exit_want)) ||
    fail "exit status $rc, the document says $exit_want: ${runs[-1]}"
  for s in "${outs[@]}" "${doc_outs[@]}"; do
    grep -qF -- "$s" "$out" || fail "the output lacks: $s"
  done
  echo "ran  [$name] $((SECONDS - t0)) s"
}

flush() {
  local before=$failures
  run_entry
  if ((failures > before)); then
    echo "---- output of [$name] ----"
    sed -n '1,60p' "$top/$name/output" 2>/dev/null
    echo "----"
  fi
  name="" doc="" skip="" needs="" exit_want=0 file=""
  runs=() shows=() outs=() doc_outs=()
}

while IFS= read -r line || [[ -n $line ]]; do
  [[ $line =~ ^[[:space:]]*(#|$) ]] && continue
  value=${line#*: }
  case $line in
    "== "*) flush; name=${line#== } ;;
    doc:*) doc=$value ;;
    shows:*) shows+=("$value") ;;
    run:*) runs+=("$value") ;;
    exit:*) exit_want=$value ;;
    out:*) outs+=("$value") ;;
    doc-out:*) doc_outs+=("$value") ;;
    file:*) file=$value ;;
    needs:*) needs=$value ;;
    skip:*) skip=$value ;;
    *) echo "FAIL: $list: cannot read line: $line"; exit 1 ;;
  esac
done <"$list"
flush

echo "$ran entries run, $skipped skipped, $failures failures in" \
  "$((SECONDS - started)) s"
((ran > 0)) || { echo "FAIL: nothing ran"; exit 1; }
((failures == 0))
