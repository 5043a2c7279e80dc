# shellcheck shell=sh
# Helpers for the tests/vm guest (busybox sh), sourced by /init and by guest
# plans (`. /vmlib.sh`). Result lines go to the console and to the results
# port /dev/ttyS1, which only they use, so kernel messages on the console
# can never garble what the host parses (run_vm.sh reads both).
#
#   vm_run NAME CMD [ARG...]  runs CMD, its output prefixed "  NAME| ", and
#                             prints `TPUSHIM-VM: PASS NAME` when it exits 0,
#                             else `TPUSHIM-VM: FAIL NAME <reason>`; returns
#                             CMD's status. VM_TEST_TIMEOUT=S (seconds, 0 =
#                             none) bounds each command.
#   vm_pass NAME / vm_fail NAME REASON...   the result lines by hand.
#   vm_dmar_faults            prints how many IOMMU (DMAR) faults the
#                             kernel has logged so far (dmesg).
#   vm_finish                 the plan's last command: exits 1 if any test
#                             failed, else 0.
# NAME: letters, digits and . _ : - only.

VM_FAILURES=${VM_FAILURES:-0}

# vm_mark TEXT...: prints "TPUSHIM-VM: TEXT" on the console and results port.
vm_mark() {
  echo "TPUSHIM-VM: $*"
  if [ -c /dev/ttyS1 ]; then
    echo "TPUSHIM-VM: $*" >/dev/ttyS1
  fi
}

# vm_uptime: seconds since boot, to the hundredth.
vm_uptime() {
  read -r vm_up _ </proc/uptime
  echo "$vm_up"
}

vm_pass() { vm_mark "PASS $1"; }

vm_fail() {
  vm_name=$1
  shift
  VM_FAILURES=$((VM_FAILURES + 1))
  vm_mark "FAIL $vm_name ${*:-failed}"
}

# vm_valid_name NAME: whether NAME can name a test.
vm_valid_name() {
  case "$1" in
    '' | *[!A-Za-z0-9._:-]*) return 1 ;;
  esac
}

vm_run() {
  vm_name=$1
  shift
  if ! vm_valid_name "$vm_name"; then
    vm_fail "bad_test_name" "vm_run: \"$vm_name\" (letters, digits, . _ : - only)"
    return 2
  fi
  vm_rcfile=/tmp/.vm_run.$$
  vm_start=$(vm_uptime)
  echo "TPUSHIM-VM: RUN $vm_name: $*"
  {
    if [ "${VM_TEST_TIMEOUT:-0}" -gt 0 ]; then
      timeout "$VM_TEST_TIMEOUT" "$@"
    else
      "$@"
    fi
    echo "$?" >"$vm_rcfile"
  } 2>&1 | sed "s/^/  $vm_name| /"
  vm_rc=$(cat "$vm_rcfile" 2>/dev/null || echo 255)
  rm -f "$vm_rcfile"
  vm_secs=$(awk -v a="$vm_start" -v b="$(vm_uptime)" 'BEGIN { printf "%.2f", b - a }')
  echo "TPUSHIM-VM: END $vm_name: exit $vm_rc after $vm_secs s"
  if [ "$vm_rc" -eq 0 ]; then
    vm_pass "$vm_name"
  elif [ "${VM_TEST_TIMEOUT:-0}" -gt 0 ] && [ "$vm_rc" -eq 143 ]; then
    vm_fail "$vm_name" "timed out after $VM_TEST_TIMEOUT s"
  elif [ "$vm_rc" -gt 128 ]; then
    vm_fail "$vm_name" "killed by signal $((vm_rc - 128))"
  else
    vm_fail "$vm_name" "exit status $vm_rc"
  fi
  return "$vm_rc"
}

vm_dmar_faults() {
  dmesg | grep -c 'DMAR: \[DMA' || true
}

vm_finish() {
  if [ "$VM_FAILURES" -gt 0 ]; then
    exit 1
  fi
  exit 0
}
