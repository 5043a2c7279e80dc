#!/usr/bin/env bash
# Installs every Debian 12 package tpushim needs to build, test and run.
# Idempotent; works as root or through sudo. Usage: bash scripts/setup.sh
set -euo pipefail

packages=(
  build-essential cmake pkg-config git
  libabsl-dev libspdlog-dev libfmt-dev libnuma-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev nlohmann-json3-dev libxxhash-dev
  # The sanitizer and fuzzing jobs of scripts/test.sh (clang, its sanitizer
  # and libFuzzer runtimes, llvm-symbolizer for readable reports).
  clang libclang-rt-14-dev llvm
  # `tpushim tune --plot`.
  gnuplot-nox
  # tests/logging/lnav_test.sh: lnav must read our log files as glog logs.
  lnav
  # The VM tests (tests/vm): QEMU boots a guest with an emulated IOMMU.
  qemu-system-x86
  # The Python package (python/, docs/python.md) and its pytest suite, run
  # against real NumPy and PyTorch (Debian's CPU build of torch).
  python3-dev pybind11-dev python3-numpy python3-pytest python3-torch
)

if [[ "$(id -u)" -eq 0 ]]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1; then
  as_root=(sudo)
else
  echo "setup.sh: needs root or sudo to install packages" >&2
  exit 1
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} > 0)); then
  echo "setup.sh: installing ${missing[*]}"
  "${as_root[@]}" apt-get update -qq
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup.sh: all packages present"
fi
