#!/usr/bin/env bash
# Runs a guest plan in a QEMU VM (TCG, no KVM) with an emulated Intel IOMMU
# and an emulated NVMe controller that the guest binds to vfio-pci, and
# judges the plan by the result lines it prints (tests/vm/README.md).
#
# Usage: tests/vm/run_vm.sh --plan PLAN.sh [options]
#   --plan FILE            guest plan, run as /plan.sh under busybox sh
#   --bin FILE...          programs, copied to /bin (ELF: with the shared
#                          libraries ldd finds, at the same paths)
#   --file SRC[:DEST]...   other files, at DEST (default: SRC's absolute
#                          path); ELF files bring their libraries too
#   --env NAME=VALUE...    set in the plan's environment
#   --expect NAME...       tests that must PASS (vfio_bind is the binding)
#   --timeout S            VM wall-clock limit (170)
#   --nvme-size BYTES      the NVMe namespace's size, truncate(1) syntax (1G)
#   --memory M             guest memory, QEMU -m syntax (1G)
#   --smp N                guest CPUs (1; env TPUSHIM_VM_SMP)
#   --log FILE             serial console log (default: in the work dir)
#   --workdir DIR          kept work dir (default: a temporary one, removed)
#   --cache DIR            guest cache (env TPUSHIM_VM_CACHE, else
#                          ~/.cache/tpushim-vm); fetch_guest.sh fills it
#   --verbose              also stream the console to stdout
# Environment: TPUSHIM_VM_CACHE, TPUSHIM_VM_SMP (above), TPUSHIM_VM_QEMU (the
# QEMU binary, default qemu-system-x86_64).
# Exits 0 only when the guest printed `TPUSHIM-VM: DONE status=0`, no FAIL
# line and a PASS line for each --expect name; otherwise 1, with a summary
# and the console's last lines. A host where QEMU cannot run fails too
# ("tests/vm: QEMU cannot run here: ..."): this never skips.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
QEMU=${TPUSHIM_VM_QEMU:-qemu-system-x86_64}
# no_timer_check: under TCG on a loaded host the kernel's check that the
# timer works through the interrupt-remapped IO-APIC can time out and
# panic the boot (seen here while CI ran beside it).
KERNEL_ARGS="console=ttyS0 intel_iommu=on panic=-1 quiet no_timer_check"
TAIL_LINES=40

plan="" timeout_s=170 nvme_size=1G memory=1G smp=${TPUSHIM_VM_SMP:-1}
log="" workdir="" cache="" verbose=0
bins=() files=() envs=() expects=()

say() { echo "tests/vm: $*"; }
die() {
  echo "tests/vm: error: $*" >&2
  exit 1
}
cannot_run() {
  echo "tests/vm: QEMU cannot run here: $*" >&2
  exit 1
}

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
}

# need_value OPTION COUNT: fails unless OPTION got a value.
need_value() { (($2 >= 2)) || die "$1 needs a value"; }

parse_args() {
  local opt list
  while (($# > 0)); do
    opt=$1
    case "$opt" in
      --bin | --file | --env | --expect)
        shift
        list=()
        while (($# > 0)) && [[ "$1" != --* ]]; do
          list+=("$1")
          shift
        done
        ((${#list[@]} > 0)) || die "$opt needs at least one value"
        case "$opt" in
          --bin) bins+=("${list[@]}") ;;
          --file) files+=("${list[@]}") ;;
          --env) envs+=("${list[@]}") ;;
          --expect) expects+=("${list[@]}") ;;
        esac
        continue
        ;;
      --plan | --timeout | --nvme-size | --memory | --smp | --log | --workdir | --cache)
        need_value "$opt" $#
        case "$opt" in
          --plan) plan=$2 ;;
          --timeout) timeout_s=$2 ;;
          --nvme-size) nvme_size=$2 ;;
          --memory) memory=$2 ;;
          --smp) smp=$2 ;;
          --log) log=$2 ;;
          --workdir) workdir=$2 ;;
          --cache) cache=$2 ;;
        esac
        shift 2
        ;;
      --verbose) verbose=1 && shift ;;
      -h | --help) usage && exit 0 ;;
      *) die "unknown argument \"$opt\" (--help lists the options)" ;;
    esac
  done
  [[ -n "$plan" ]] || die "--plan is required"
  [[ -f "$plan" ]] || die "plan $plan not found"
  [[ "$timeout_s" =~ ^[0-9]+$ ]] || die "--timeout $timeout_s: not a number of seconds"
  [[ "$smp" =~ ^[1-9][0-9]*$ ]] || die "--smp $smp: not a CPU count"
  local f
  for f in "${bins[@]}"; do
    [[ -f "$f" ]] || die "--bin $f not found"
  done
  for f in "${files[@]}"; do
    [[ -e "${f%%:*}" ]] || die "--file ${f%%:*} not found"
  done
  for f in "${envs[@]}"; do
    [[ "$f" =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || die "--env $f: not NAME=VALUE"
  done
  for f in "${expects[@]}"; do
    [[ "$f" =~ ^[A-Za-z0-9._:-]+$ ]] || die "--expect $f: not a test name"
  done
}

check_qemu() {
  command -v "$QEMU" >/dev/null 2>&1 ||
    cannot_run "$QEMU not found (Debian package qemu-system-x86; scripts/setup.sh installs it)"
  command -v timeout >/dev/null 2>&1 || die "timeout (coreutils) not found"
}

# qemu_path PATH: PATH with commas doubled, for QEMU's option syntax.
qemu_path() { echo "${1//,/,,}"; }

# setup_workdir: the work dir, the console log and result file paths.
setup_workdir() {
  if [[ -z "$workdir" ]]; then
    workdir=$(mktemp -d "${TMPDIR:-/tmp}/tpushim-vm.XXXXXX")
    trap 'rm -rf "$workdir"' EXIT
  else
    mkdir -p "$workdir" || die "cannot create work dir $workdir"
    workdir=$(cd "$workdir" && pwd)
    trap 'rm -f "$workdir/nvme.img"' EXIT
  fi
  log=${log:-$workdir/console.log}
  mkdir -p "$(dirname "$log")" || die "cannot create the directory of $log"
  results=$workdir/results.log
  rm -f "$log" "$results"
}

# fetch_guest: runs fetch_guest.sh; sets guest (its directory).
fetch_guest() {
  guest=$(bash "$HERE/fetch_guest.sh" ${cache:+"$cache"}) ||
    die "fetching the guest (tests/vm/fetch_guest.sh) failed"
  [[ -f "$guest/guest.env" ]] || die "fetch_guest.sh gave no guest ($guest)"
  guest_kver=$(sed -n 's/^KERNEL_VERSION=//p' "$guest/guest.env")
  guest_boot=$(sed -n 's/^BOOT=//p' "$guest/guest.env")
}

# is_elf FILE: whether FILE starts with the ELF magic.
is_elf() { [[ "$(head -c 4 "$1" | od -An -tx1 | tr -d ' \n')" == "7f454c46" ]]; }

# copy_into ROOT SRC DEST: copies SRC (following links) to ROOT/DEST.
copy_into() {
  local root=$1 src=$2 dest=$3
  mkdir -p "$root$(dirname "$dest")"
  cp -L --remove-destination "$src" "$root$dest" || die "copying $src into the initramfs failed"
}

# add_libraries ROOT ELF: copies the shared libraries ELF needs (ldd) and
# the dynamic loader to the same absolute paths under ROOT.
add_libraries() {
  local root=$1 elf=$2 out lib
  if ! out=$(ldd "$elf" 2>&1); then
    [[ "$out" == *"not a dynamic executable"* ]] && return 0
    die "ldd $elf failed: $out"
  fi
  [[ "$out" == *"statically linked"* ]] && return 0
  if [[ "$out" == *"not found"* ]]; then
    die "$elf needs libraries ldd cannot find: $(grep 'not found' <<<"$out" | tr -s ' \t\n' ' ')"
  fi
  while read -r lib; do
    [[ -e "$root$lib" ]] || copy_into "$root" "$lib" "$lib"
  done < <(awk '$2 == "=>" && $3 ~ /^\// { print $3; next } $1 ~ /^\// { print $1 }' <<<"$out")
  lib=/lib64/ld-linux-x86-64.so.2
  if [[ -e "$lib" && ! -e "$root$lib" ]]; then
    copy_into "$root" "$lib" "$lib"
  fi
}

# add_file ROOT SRC DEST: copies SRC to DEST, with its libraries if ELF.
add_file() {
  copy_into "$1" "$2" "$3"
  if is_elf "$2"; then
    add_libraries "$1" "$2"
  fi
}

# link_applets ROOT: busybox's applet links (existing files win).
link_applets() {
  local root=$1 applet
  while read -r applet; do
    [[ -e "$root/$applet" || -L "$root/$applet" ]] || ln -s /bin/busybox "$root/$applet"
  done < <("$root/bin/busybox" --list-full)
}

# build_initramfs: the guest's root file system as a newc cpio archive.
build_initramfs() {
  local root=$workdir/initramfs.d f src dest cpio
  rm -rf "$root"
  mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,dev,proc,sys,tmp,etc,lib/modules/tpushim-vm}
  cp "$guest/busybox" "$root/bin/busybox"
  link_applets "$root"
  cp "$guest/modules/"*.ko "$guest/modules/order" "$root/lib/modules/tpushim-vm/"
  install -m 755 "$HERE/guest/init.sh" "$root/init"
  install -m 644 "$HERE/guest/vmlib.sh" "$root/vmlib.sh"
  install -m 644 "$plan" "$root/plan.sh"
  for f in "${bins[@]}"; do
    add_file "$root" "$f" "/bin/$(basename "$f")"
  done
  for f in "${files[@]}"; do
    src=${f%%:*}
    dest=${f#*:}
    [[ "$f" == *:* ]] || dest=$(realpath "$src")
    [[ "$dest" == /* ]] || die "--file $f: DEST must be an absolute path"
    add_file "$root" "$src" "$dest"
  done
  : >"$root/plan.env"
  local value q="'"
  for f in "${envs[@]}"; do
    # Single-quoted for sh: each ' becomes '\''.
    value=${f#*=}
    printf "%s='%s'\n" "${f%%=*}" "${value//$q/$q\\$q$q}" >>"$root/plan.env"
  done
  cpio=$(command -v cpio || echo "$guest/cpio")
  initramfs=$workdir/initramfs.cpio
  (cd "$root" && find . -mindepth 1 -print0 | LC_ALL=C sort -z |
    "$cpio" --null -o -H newc -R 0:0 --quiet) >"$initramfs" ||
    die "packing the initramfs with $cpio failed"
}

# run_qemu: boots the VM; sets qemu_rc and wall (seconds).
run_qemu() {
  local disk=$workdir/nvme.img console start
  rm -f "$disk"
  truncate -s "$nvme_size" "$disk" || die "cannot create the NVMe image $disk ($nvme_size)"
  if ((verbose)); then
    console="stdio,id=con,signal=off,logfile=$(qemu_path "$log")"
  else
    console="file,id=con,path=$(qemu_path "$log")"
  fi
  local cmd=("$QEMU" -machine "q35,accel=tcg" -cpu max -smp "$smp" -m "$memory"
    -nodefaults -no-user-config -display none -no-reboot
    -device "intel-iommu,intremap=on"
    -device "pcie-root-port,id=rp0,chassis=1"
    -drive "if=none,id=nv0,file=$(qemu_path "$disk"),format=raw"
    -device "nvme,serial=tpushim0,id=nvme0,bus=rp0"
    -device "nvme-ns,drive=nv0,bus=nvme0,nsid=1"
    -chardev "$console" -serial chardev:con
    -chardev "file,id=res,path=$(qemu_path "$results")" -serial chardev:res
    -kernel "$guest/kernel" -initrd "$initramfs" -append "$KERNEL_ARGS")
  printf '%q ' "${cmd[@]}" >"$workdir/qemu.cmd"
  say "booting $guest_kver ($guest_boot), -smp $smp -m $memory, limit ${timeout_s} s; console: $log"
  start=$EPOCHREALTIME
  set +e
  if ((verbose)); then
    timeout -k 10 "$timeout_s" "${cmd[@]}" </dev/null 2>"$workdir/qemu.stderr"
  else
    timeout -k 10 "$timeout_s" "${cmd[@]}" </dev/null >/dev/null 2>"$workdir/qemu.stderr"
  fi
  qemu_rc=$?
  set -e
  wall=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
  touch "$log" "$results"
}

# check_qemu_started: fails loudly when QEMU itself could not run.
check_qemu_started() {
  ((qemu_rc == 0 || qemu_rc == 124)) && return 0
  if [[ ! -s "$log" ]]; then
    cannot_run "$QEMU exited with status $qemu_rc before the guest printed anything: $(tail -n 5 "$workdir/qemu.stderr" | tr '\n' ' ')"
  fi
}

# markers: the result lines, from the results port and the console (a
# console line may be garbled by kernel messages; the port's cannot).
markers() {
  {
    tr -d '\r' <"$results"
    tr -d '\r' <"$log" | grep -a '^TPUSHIM-VM: ' || true
  } | grep -aE '^TPUSHIM-VM: (PASS|FAIL|DONE) ' | awk '!seen[$0]++'
}

# report: parses the markers, prints the summary; returns 0 on success.
report() {
  local line kind name passes=() fails=() failed=() problems=()
  local done_status="" done_uptime=""
  while read -r line; do
    read -r _ kind name _ <<<"$line"
    case "$kind" in
      PASS) [[ " ${passes[*]} " == *" $name "* ]] || passes+=("$name") ;;
      FAIL)
        # Once per name: the port's line comes first, a console copy after.
        if [[ " ${failed[*]} " != *" $name "* ]]; then
          failed+=("$name")
          fails+=("${line#TPUSHIM-VM: FAIL }")
        fi
        ;;
      DONE)
        done_status=$(sed -nE 's/.*DONE status=([0-9]+).*/\1/p' <<<"$line")
        done_uptime=$(sed -nE 's/.*uptime=([0-9.]+).*/\1/p' <<<"$line")
        ;;
    esac
  done < <(markers)
  for name in "${passes[@]}"; do
    say "PASS $name"
  done
  for line in "${fails[@]}"; do
    say "FAIL $line"
    problems+=("FAIL ${line%% *}")
  done
  for name in "${expects[@]}"; do
    if [[ " ${passes[*]} " != *" $name "* ]]; then
      say "MISSING $name (expected, no PASS line)"
      problems+=("missing $name")
    fi
  done
  if ((qemu_rc == 124)); then
    problems+=("VM timed out after $timeout_s s")
  elif ((qemu_rc != 0)); then
    problems+=("QEMU exited with status $qemu_rc: $(tail -n 3 "$workdir/qemu.stderr" | tr '\n' ' ')")
  fi
  if grep -aq 'Kernel panic' "$log"; then
    problems+=("guest kernel panic")
  fi
  if [[ -z "$done_status" ]]; then
    problems+=("no DONE line (guest did not finish)")
  elif [[ "$done_status" != 0 ]]; then
    problems+=("DONE status=$done_status (plan failed, or /init's set-up)")
  fi
  say "${#passes[@]} passed, ${#fails[@]} failed; DONE status=${done_status:-none}; VM wall time $wall s${done_uptime:+ (guest uptime at DONE $done_uptime s)}"
  if ((${#problems[@]} == 0)); then
    say "OK"
    return 0
  fi
  (IFS=';' && say "FAILED:${problems[*]/#/ }")
  echo "--- last $TAIL_LINES lines of the serial console ($log) ---"
  tail -n "$TAIL_LINES" "$log" | tr -d '\r'
  echo "--- end of serial console ---"
  return 1
}

main() {
  parse_args "$@"
  check_qemu
  setup_workdir
  fetch_guest
  build_initramfs
  run_qemu
  check_qemu_started
  report
}

main "$@"
