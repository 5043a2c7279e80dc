#!/usr/bin/env bash
# Fetches the guest the VM tests boot (tests/vm/run_vm.sh): the newest Debian
# 12 kernel package linux-image-6.1.0-N-amd64 (highest ABI number N that apt
# knows; not cloud, not rt), busybox-static and cpio, downloaded with
# `apt-get download` and unpacked into the cache (nothing is installed on
# the host): busybox-static and cpio with `dpkg -x`, of the kernel package
# only boot/ and the VFIO modules (`dpkg-deb --fsys-tarfile | tar`; modules
# decompressed if packaged compressed). The kernel's XZ payload is
# extracted as an ELF `vmlinux` that QEMU boots through PVH (about 2.5 s
# faster under TCG than the bzImage, which stays as the fallback).
#
# Idempotent: a cache holding a complete guest (its stamp file) is used as
# it is, offline; --refresh fetches the newest kernel again. Safe to run
# concurrently (flock on the cache).
#
# Usage: tests/vm/fetch_guest.sh [--refresh] [<cache-dir>]
#   <cache-dir> defaults to ${TPUSHIM_VM_CACHE:-$HOME/.cache/tpushim-vm}.
# Prints the guest directory on stdout (its files: guest.env, kernel,
# modules/order, modules/*.ko, busybox, cpio); progress goes to stderr.
set -euo pipefail

# The VFIO modules, in load order (each needs the ones before it; the
# package has no modules.dep). Changing this list: bump LAYOUT.
VFIO_MODULES=(irqbypass vfio vfio_virqfd vfio_iommu_type1 vfio-pci-core vfio-pci)
# Version of the guest directory's layout; a stamp with another one is stale.
LAYOUT=1
KERNEL_RE='^linux-image-6\.1\.0-[0-9]+-amd64(-unsigned)?$'

log() { echo "fetch_guest: $*" >&2; }
die() {
  echo "fetch_guest: error: $*" >&2
  exit 1
}

# stamp_get FILE KEY: the value of KEY=... in FILE.
stamp_get() { sed -n "s/^$2=//p" "$1" | head -n 1; }

# guest_complete DIR: whether DIR holds a complete guest of this layout.
guest_complete() {
  local dir=$1 m
  [[ -f "$dir/guest.env" ]] || return 1
  [[ "$(stamp_get "$dir/guest.env" LAYOUT)" == "$LAYOUT" ]] || return 1
  [[ -s "$dir/kernel" && -x "$dir/busybox" && -x "$dir/cpio" ]] || return 1
  for m in "${VFIO_MODULES[@]}"; do
    [[ -s "$dir/modules/$m.ko" ]] || return 1
  done
}

apt_updated=0
# apt_update_once: refreshes apt's lists once per run (root only).
apt_update_once() {
  ((apt_updated == 0)) || return 1
  apt_updated=1
  if [[ "$(id -u)" -ne 0 ]]; then
    log "apt's lists may be stale; not root, so not running apt-get update"
    return 1
  fi
  log "running apt-get update"
  apt-get update -qq >&2 || die "apt-get update failed"
}

# newest_kernel_package: the linux-image-6.1.0-N-amd64 package (signed,
# else -unsigned) with the highest N that has an installable candidate.
newest_kernel_package() {
  local names name policy
  # Sorted by N (the 4th field split on '-'), then the signed (shorter) name.
  mapfile -t names < <(apt-cache pkgnames linux-image-6.1.0- 2>/dev/null |
    grep -E "$KERNEL_RE" | awk -F- '{ print $4, length($0), $0 }' |
    sort -k1,1nr -k2,2n | cut -d' ' -f3)
  for name in "${names[@]}"; do
    policy=$(apt-cache policy "$name" 2>/dev/null)
    if [[ "$policy" =~ Candidate:\ [^\(] ]]; then
      echo "$name"
      return 0
    fi
  done
}

# pick_kernel_package: newest_kernel_package, refreshing apt's lists once if
# apt knows none.
pick_kernel_package() {
  local pkg
  pkg=$(newest_kernel_package)
  if [[ -z "$pkg" ]] && apt_update_once; then
    pkg=$(newest_kernel_package)
  fi
  [[ -n "$pkg" ]] ||
    die "apt knows no linux-image-6.1.0-*-amd64 package (run apt-get update; is this Debian 12?)"
  echo "$pkg"
}

# apt_download DIR PKG...: `apt-get download PKG...` into DIR.
apt_download() {
  local dir=$1 opts=()
  shift
  # As root apt drops to the _apt user, which cannot write to a private
  # directory; the download is done as root instead (without a warning).
  if [[ "$(id -u)" -eq 0 ]]; then
    opts=(-o APT::Sandbox::User=root)
  fi
  (cd "$dir" && apt-get download -q=2 "${opts[@]}" "$@" >&2)
}

# download DIR PKG...: the packages' .debs into DIR. On a failure apt's
# lists are refreshed once (a stale list names a file the mirror no longer
# has) and each package is fetched alone, to name the one that fails.
download() {
  local dir=$1 pkg
  shift
  log "downloading $*"
  apt_download "$dir" "$@" && return 0
  apt_update_once || true
  for pkg in "$@"; do
    if [[ -z "$(find "$dir" -maxdepth 1 -name "${pkg}_*.deb")" ]]; then
      apt_download "$dir" "$pkg" ||
        die "apt-get download $pkg failed (package $pkg; network or apt lists?)"
    fi
  done
}

# deb_of DIR PKG: the downloaded .deb of PKG in DIR.
deb_of() {
  local deb
  deb=$(find "$1" -maxdepth 1 -name "${2}_*.deb" | head -n 1)
  [[ -n "$deb" ]] || die "apt-get download $2 left no ${2}_*.deb in $1"
  echo "$deb"
}

# unpack DIR PKG ROOT: dpkg -x the downloaded .deb of PKG into ROOT.
unpack() {
  local deb
  deb=$(deb_of "$1" "$2")
  dpkg -x "$deb" "$3" || die "dpkg -x $deb failed (package $2)"
  rm -f "$deb"
}

# unpack_kernel DIR PKG ROOT: of the kernel package, only boot/ and the VFIO
# modules (dpkg -x of it all writes ~400 MB and takes seconds longer).
unpack_kernel() {
  local deb m patterns=('./boot/*')
  deb=$(deb_of "$1" "$2")
  for m in "${VFIO_MODULES[@]}"; do
    patterns+=("./lib/modules/*/$m.ko*")
  done
  dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$3" --wildcards "${patterns[@]}" ||
    die "unpacking boot/ and the VFIO modules from $deb failed (package $2)"
  rm -f "$deb"
}

# extract_vmlinux BZIMAGE OUT: the uncompressed kernel inside an XZ
# bzImage, found by the XZ magic FD 37 7A 58 5A 00. Fails unless OUT is an
# ELF with a PVH entry note (XEN_ELFNOTE_PHYS32_ENTRY, type 0x12).
extract_vmlinux() {
  local bzimage=$1 out=$2 offset notes
  offset=$(LC_ALL=C grep -m 1 -obUaP '\xfd7zXZ\x00' "$bzimage" | cut -d: -f1)
  [[ -n "$offset" ]] || return 1
  # --single-stream ignores what follows the payload (the bzImage's tail).
  # (xz stops reading early: a pipeline's SIGPIPE would fail under pipefail.)
  xz -dc --single-stream <(tail -c +"$((offset + 1))" "$bzimage") >"$out" 2>/dev/null ||
    return 1
  [[ "$(head -c 4 "$out" | od -An -tx1 | tr -d ' \n')" == "7f454c46" ]] || return 1
  if command -v readelf >/dev/null 2>&1; then
    notes=$(readelf -n "$out" 2>/dev/null) || return 1
    [[ "$notes" == *"note type: (0x00000012)"* ]] || return 1
  fi
}

# install_modules ROOT KVER OUT: the VFIO modules of ROOT's kernel KVER as
# OUT/<name>.ko (decompressed) plus OUT/order.
install_modules() {
  local root=$1 kver=$2 out=$3 m src
  mkdir -p "$out"
  for m in "${VFIO_MODULES[@]}"; do
    src=$(find "$root/lib/modules/$kver" -name "$m.ko" -o -name "$m.ko.*" | head -n 1)
    [[ -n "$src" ]] || die "module $m not in $kver's package"
    case "$src" in
      *.ko) cp "$src" "$out/$m.ko" ;;
      *.ko.xz) xz -dc "$src" >"$out/$m.ko" ;;
      *.ko.zst) zstd -dcq "$src" >"$out/$m.ko" ;;
      *.ko.gz) gzip -dc "$src" >"$out/$m.ko" ;;
      *) die "module $src: unknown compression" ;;
    esac || die "decompressing $src failed"
    echo "$m" >>"$out/order"
  done
}

# fetch_into DIR: downloads and unpacks a complete guest into DIR.
fetch_into() {
  local dir=$1 pkg kver root=$1/root pkgver
  pkg=$(pick_kernel_package)
  kver=${pkg#linux-image-}
  kver=${kver%-unsigned}
  log "kernel package $pkg"
  mkdir -p "$root"
  download "$dir" "$pkg" busybox-static cpio
  pkgver=$(deb_of "$dir" "$pkg" | sed -E 's/.*_(.*)_amd64\.deb$/\1/')
  unpack_kernel "$dir" "$pkg" "$root"
  unpack "$dir" busybox-static "$root"
  unpack "$dir" cpio "$root"
  local vmlinuz=$root/boot/vmlinuz-$kver boot=pvh
  [[ -f "$vmlinuz" ]] || die "$pkg has no boot/vmlinuz-$kver"
  if extract_vmlinux "$vmlinuz" "$dir/vmlinux"; then
    ln -s vmlinux "$dir/kernel"
  else
    log "no PVH vmlinux in $vmlinuz; booting the bzImage (slower under TCG)"
    rm -f "$dir/vmlinux"
    ln -s "root/boot/vmlinuz-$kver" "$dir/kernel"
    boot=bzimage
  fi
  install_modules "$root" "$kver" "$dir/modules"
  [[ -x "$root/bin/busybox" ]] || die "busybox-static has no bin/busybox"
  [[ -x "$root/bin/cpio" ]] || die "cpio has no bin/cpio"
  ln -s root/bin/busybox "$dir/busybox"
  ln -s root/bin/cpio "$dir/cpio"
  # The stamp, written last: its presence means the guest is complete.
  printf '%s\n' "KERNEL_VERSION=$kver" "KERNEL_PACKAGE=$pkg $pkgver" \
    "BOOT=$boot" "LAYOUT=$LAYOUT" >"$dir/guest.env.tmp"
  mv "$dir/guest.env.tmp" "$dir/guest.env"
}

# home_dir: $HOME, or the passwd entry's when HOME is unset.
home_dir() {
  if [[ -n "${HOME:-}" ]]; then
    echo "$HOME"
  else
    getent passwd "$(id -u)" | cut -d: -f6
  fi
}

main() {
  local refresh=0 cache=""
  while (($# > 0)); do
    case "$1" in
      --refresh) refresh=1 ;;
      -h | --help)
        sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
        exit 0
        ;;
      -*) die "unknown option $1" ;;
      *) cache=$1 ;;
    esac
    shift
  done
  cache=${cache:-${TPUSHIM_VM_CACHE:-$(home_dir)/.cache/tpushim-vm}}
  mkdir -p "$cache" || die "cannot create cache directory $cache"
  cache=$(cd "$cache" && pwd)

  exec 9>"$cache/.lock"
  flock 9 || die "cannot lock $cache/.lock"

  local current=$cache/guest
  if ((refresh == 0)) && guest_complete "$current"; then
    echo "$current"
    return 0
  fi
  local start=$SECONDS staging
  staging=$(mktemp -d "$cache/staging.XXXXXX")
  # shellcheck disable=SC2064  # expand now: the trap outlives this scope
  trap "rm -rf '$staging'" EXIT
  fetch_into "$staging"
  guest_complete "$staging" || die "fetched guest in $staging is incomplete"
  rm -rf "$current"
  mv "$staging" "$current"
  trap - EXIT
  log "guest $(stamp_get "$current/guest.env" KERNEL_VERSION) ready in $current ($((SECONDS - start)) s)"
  echo "$current"
}

main "$@"
