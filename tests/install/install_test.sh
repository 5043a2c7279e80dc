#!/usr/bin/env bash
# Installs the build into a temporary prefix and uses it the two ways a
# program would: builds examples/c_backend and examples/cpp_backend against
# the CMake package (find_package(tpushim CONFIG), shared and static) and
# against tpushim.pc (gcc/g++ directly), runs each, and checks the
# installed files, the SONAME and libtpushim.so's exported symbols.
# Any missing piece fails the test; nothing is skipped.
#
# Environment (set by tests/install/CMakeLists.txt): BUILD_DIR, SOURCE_DIR,
# CMAKE, CC, CXX, CFLAGS, CXXFLAGS, LDFLAGS, LIBDIR, VERSION, SOVERSION;
# PYTHON and PYTHON_DIR (the package's directory under the prefix) when the
# build has the Python package, which is then imported from the prefix.

set -euo pipefail

for v in BUILD_DIR SOURCE_DIR CMAKE CC CXX LIBDIR VERSION SOVERSION; do
  if [[ -z "${!v:-}" ]]; then
    echo "install_test: $v is not set" >&2
    exit 1
  fi
done
CFLAGS="${CFLAGS:-}"
CXXFLAGS="${CXXFLAGS:-}"
LDFLAGS="${LDFLAGS:-}"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/tpushim_install_test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
prefix="$tmp/prefix"
libdir="$prefix/$LIBDIR"
log="$tmp/step.log"
start=$SECONDS

fail() {
  echo "install_test: FAILED: $*" >&2
  exit 1
}
step() { echo "--- [$((SECONDS - start))s] $*"; }
# Runs a command quietly; on failure shows its output and fails.
run() {
  local rc=0
  "$@" >"$log" 2>&1 || rc=$?
  if ((rc != 0)); then
    cat "$log" >&2
    fail "$* exited with status $rc"
  fi
}
# Runs an example; checks exit status 0 and its "<name>: OK" line.
run_example() {
  local name=$1
  shift
  local out="$tmp/$name.out" rc=0
  "$@" >"$out" 2>&1 || rc=$?
  if ((rc != 0)); then
    cat "$out" >&2
    fail "$* exited with status $rc"
  fi
  grep -q "^$name: OK" "$out" || { cat "$out" >&2; fail "$*: no '$name: OK' line"; }
  grep "^$name: OK" "$out"
}

step "cmake --install $BUILD_DIR --prefix $prefix"
run "$CMAKE" --install "$BUILD_DIR" --prefix "$prefix"

step "installed files"
for f in include/tpushim/system.h include/tpushim/transfer.h \
         include/tpushim/options.h include/tpushim/stats.h \
         include/tpushim/export.h include/tpushim/c_api.h \
         include/tpushim/version.h include/tpushim/memory.h \
         include/tpushim/c_api_memory.h include/tpushim/c_api_events.h \
         include/tpushim/chips.h \
         "$LIBDIR/libtpushim.so.$VERSION" "$LIBDIR/libtpushim.a" \
         "$LIBDIR/cmake/tpushim/tpushimConfig.cmake" \
         "$LIBDIR/cmake/tpushim/tpushimConfigVersion.cmake" \
         "$LIBDIR/cmake/tpushim/tpushimTargets.cmake" \
         "$LIBDIR/pkgconfig/tpushim.pc" bin/tpushim; do
  [[ -f "$prefix/$f" ]] || fail "not installed: $f"
done
[[ "$(readlink "$libdir/libtpushim.so.$SOVERSION")" == "libtpushim.so.$VERSION" ]] ||
  fail "$LIBDIR/libtpushim.so.$SOVERSION is not a link to libtpushim.so.$VERSION"
[[ "$(readlink "$libdir/libtpushim.so")" == "libtpushim.so.$SOVERSION" ]] ||
  fail "$LIBDIR/libtpushim.so is not a link to libtpushim.so.$SOVERSION"
run "$prefix/bin/tpushim" --help

step "SONAME and exported symbols"
lib="$libdir/libtpushim.so.$VERSION"
# (Outputs are captured before grep -q: with pipefail, grep -q quitting
# early would fail the pipeline.)
dynamic=$(readelf -d "$lib")
grep -q "Library soname: \[libtpushim.so.$SOVERSION\]" <<<"$dynamic" ||
  fail "SONAME of $lib is not libtpushim.so.$SOVERSION: $(grep SONAME <<<"$dynamic")"
nm -D --defined-only "$lib" | awk '{ print $3 }' | c++filt >"$tmp/symbols"
if grep -v -E '^(tpushim::|TpuShim_GetApi$)' "$tmp/symbols" >"$tmp/foreign"; then
  cat "$tmp/foreign" >&2
  fail "libtpushim.so exports symbols outside the tpushim API (above)"
fi
for s in 'TpuShim_GetApi' 'tpushim::System::Create(' 'tpushim::Event::Await(' \
         'tpushim::DeviceBuffer::size(' 'tpushim::PinnedHostBuffer::Reset(' \
         'tpushim::TransferPathName('; do
  grep -qF "$s" "$tmp/symbols" || fail "libtpushim.so does not export $s"
done
echo "$(wc -l <"$tmp/symbols") symbols exported, all tpushim API"

export TPU_LOG_DIR="$tmp/logs"
unset TPUSHIM_DEVICE
# For ASan builds: GCC 12's LeakSanitizer crashes scanning the dynamic TLS
# of a dlopen()ed library (c_backend's case) on Debian 12's glibc.
export LSAN_OPTIONS="${LSAN_OPTIONS:+$LSAN_OPTIONS:}use_tls=0"

step "CMake package: configure and build the examples"
cmake_args=(-DCMAKE_BUILD_TYPE=Release "-DCMAKE_PREFIX_PATH=$prefix"
  "-Dtpushim_DIR=$libdir/cmake/tpushim"
  "-DCMAKE_C_COMPILER=$CC" "-DCMAKE_CXX_COMPILER=$CXX"
  "-DCMAKE_C_FLAGS=$CFLAGS -Wall -Wextra -Werror"
  "-DCMAKE_CXX_FLAGS=$CXXFLAGS -Wall -Wextra -Werror"
  "-DCMAKE_EXE_LINKER_FLAGS=$LDFLAGS")
run "$CMAKE" -S "$SOURCE_DIR/examples/c_backend" -B "$tmp/cmake-c" "${cmake_args[@]}"
run "$CMAKE" --build "$tmp/cmake-c"
run "$CMAKE" -S "$SOURCE_DIR/examples/cpp_backend" -B "$tmp/cmake-cpp" "${cmake_args[@]}"
run "$CMAKE" --build "$tmp/cmake-cpp"
run "$CMAKE" -S "$SOURCE_DIR/examples/cpp_backend" -B "$tmp/cmake-cpp-static" \
  "${cmake_args[@]}" -DCPP_BACKEND_STATIC=ON
run "$CMAKE" --build "$tmp/cmake-cpp-static"

libs=$(ldd "$tmp/cmake-cpp/cpp_backend")
grep -q "libtpushim.so.$SOVERSION => $libdir/" <<<"$libs" ||
  fail "cpp_backend (CMake) does not load the installed libtpushim.so: $(grep tpushim <<<"$libs")"
libs=$(ldd "$tmp/cmake-cpp-static/cpp_backend")
if grep -q libtpushim <<<"$libs"; then
  fail "cpp_backend (CMake, static) still needs libtpushim.so"
fi

step "CMake package: run the examples"
# c_backend finds libtpushim.so.<major> through LD_LIBRARY_PATH.
run_example c_backend env "LD_LIBRARY_PATH=$libdir" "$tmp/cmake-c/c_backend"
run_example cpp_backend env "LD_LIBRARY_PATH=$libdir" "$tmp/cmake-cpp/cpp_backend"
run_example cpp_backend "$tmp/cmake-cpp-static/cpp_backend"

step "pkg-config: build the examples with $CC / $CXX"
export PKG_CONFIG_PATH="$libdir/pkgconfig"
[[ "$(pkg-config --modversion tpushim)" == "$VERSION" ]] ||
  fail "pkg-config --modversion tpushim is not $VERSION"
[[ "$(pkg-config --variable=soname tpushim)" == "libtpushim.so.$SOVERSION" ]] ||
  fail "pkg-config --variable=soname tpushim is not libtpushim.so.$SOVERSION"
read -r -a pc_cflags <<<"$(pkg-config --cflags tpushim)"
read -r -a pc_libs <<<"$(pkg-config --cflags --libs tpushim)"
read -r -a cflags <<<"$CFLAGS"
read -r -a cxxflags <<<"$CXXFLAGS"
read -r -a ldflags <<<"$LDFLAGS"
run "$CC" -std=c11 -O2 -Wall -Wextra -Werror "${cflags[@]}" \
  "$SOURCE_DIR/examples/c_backend/main.c" "${pc_cflags[@]}" "${ldflags[@]}" \
  -ldl -o "$tmp/pc-c_backend"
run "$CXX" -std=c++17 -O2 -Wall -Wextra -Werror "${cxxflags[@]}" \
  "$SOURCE_DIR/examples/cpp_backend/main.cc" \
  "$SOURCE_DIR/examples/cpp_backend/pjrt_backend.cc" \
  "$SOURCE_DIR/examples/cpp_backend/flows.cc" "${pc_libs[@]}" "${ldflags[@]}" \
  -o "$tmp/pc-cpp_backend"

step "pkg-config: run the examples"
# This c_backend is given the library's path instead.
run_example c_backend env -u LD_LIBRARY_PATH "$tmp/pc-c_backend" \
  "$libdir/libtpushim.so.$SOVERSION"
run_example cpp_backend env "LD_LIBRARY_PATH=$libdir" "$tmp/pc-cpp_backend"

# The Python package, when the build has it (PYTHON and PYTHON_DIR set).
if [[ -n "${PYTHON_DIR:-}" ]]; then
  step "python: import tpushim from $prefix/$PYTHON_DIR"
  [[ -f "$prefix/$PYTHON_DIR/tpushim/__init__.py" ]] ||
    fail "the tpushim package is not installed in $prefix/$PYTHON_DIR"
  mkdir -p "$tmp/run"
  run_example python_tpushim env -u PYTHONPATH \
    "PYTHONPATH=$prefix/$PYTHON_DIR" "TPUSHIM_RUN_DIR=$tmp/run" \
    TPU_LOG_DIR=disabled "$PYTHON" -c '
import numpy as np, tpushim
assert tpushim.__file__.startswith("'"$prefix"'"), tpushim.__file__
with tpushim.System(premapped_buffer_size="16M") as system:
    host = tpushim.pinned_empty(1000, np.int32)
    host[:] = np.arange(1000)
    assert (np.asarray(tpushim.device_put(host)) == host).all()
print("python_tpushim: OK")'
fi

step "passed"
