#!/usr/bin/env bash
# Builds tpushim and runs its tests: the jobs CI runs (README's test command
# is `bash scripts/setup.sh && bash scripts/test.sh`), or some of them.
#
#   bash scripts/test.sh                 every job below, in this order
#   bash scripts/test.sh release         one job (several may be named)
#   bash scripts/test.sh asan tsan
#
# Jobs (docs/testing.md says what each covers):
#   release  GCC, Release, -Werror: every test, the benchmarks' CI mode,
#            the install test, the examples (the Python ones too), the
#            pytest suite of the Python package (ctest python_pytest; a
#            build without the package fails the job) and the VM tests
#            (label `vm`: vfio:// on QEMU's NVMe behind a virtual
#            IOMMU).                                              -> build/
#   asan     clang, ASan + UBSan (LeakSanitizer on) and -Wthread-safety
#            as errors over all the code: every test, plus each libFuzzer
#            target for a fixed number of runs over its seed corpus
#            (label `fuzz`); the Python tests through
#            scripts/asan_python.sh (leak checks off there). -> build-asan/
#   tsan     GCC, ThreadSanitizer: the concurrency suites (label
#            `concurrency`, tests/CMakeLists.txt), the stress tool's
#            short runs included.                                -> build-tsan/
#
# Before any job, scripts/check_layers.sh checks that no folder includes a
# layer above its own (docs/architecture.md).
#
# Each job reuses its build directory when it exists. The first failing
# job stops the script with its status; a summary of job times is printed
# at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

jobs=("$@")
if ((${#jobs[@]} == 0)); then
  jobs=(release asan tsan)
fi

# Two cores: two compile jobs and two test processes at a time.
parallel=2
summary=()

sanitizer_env() {
  export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
  # die_after_fork=0: tests fork real children (fork() with a System
  # alive), and one builds systems in the child to watch for a deadlock.
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:die_after_fork=0:suppressions=$PWD/tests/tsan.supp"
}

# The release job must run the Python suite: a configure that left the
# package out (no pybind11 or NumPy found: scripts/setup.sh not run) is a
# failure here, not a suite quietly skipped.
require_python_suite() {
  local dir=$1
  if ! ctest --test-dir "$dir" -N -R '^python_pytest$' | grep -q 'Total Tests: 1$'; then
    echo "scripts/test.sh: $dir has no python_pytest test: CMake left the" \
      "Python package out (its message 'the Python package is skipped'" \
      "says what was missing; scripts/setup.sh installs python3-dev," \
      "pybind11-dev, python3-numpy, python3-pytest and python3-torch)" >&2
    return 1
  fi
}

run_release() {
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DTPUSHIM_BUILD_PYTHON=ON
  require_python_suite build
  cmake --build build -j"$parallel"
  ctest --test-dir build --output-on-failure -j"$parallel"
}

run_asan() {
  # C programs (the C example, the install test's) link the C++ half of
  # UBSan's runtime too: libtpushim.so's vptr checks need it when dlopened.
  local flags="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
  # The Python package is built and tested with scripts/asan_python.sh:
  # Debian's python3 with the ASan runtime preloaded (the interpreter is
  # not instrumented; the extension is).
  CC=clang CXX=clang++ cmake -S . -B build-asan \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DTPUSHIM_BUILD_PYTHON=ON -DPython3_EXECUTABLE="$PWD/scripts/asan_python.sh" \
    -DTPUSHIM_BUILD_BENCHMARKS=OFF -DTPUSHIM_FUZZ=ON -DTPUSHIM_VM_TESTS=OFF \
    -DCMAKE_C_FLAGS="$flags" \
    -DCMAKE_CXX_FLAGS="$flags -Wthread-safety" \
    -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined -fsanitize-link-c++-runtime -lstdc++" \
    -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined"
  require_python_suite build-asan
  cmake --build build-asan -j"$parallel"
  sanitizer_env
  ctest --test-dir build-asan --output-on-failure -j"$parallel"
}

run_tsan() {
  # GCC warns that TSan ignores atomic_thread_fence (the ring overflow uses
  # one between atomics), and with TSan's instrumentation its
  # -Wnull-dereference misfires inside CLI11's std::string moves and its
  # -Wmaybe-uninitialized inside std::optional<Event>'s move (stress
  # worker): warnings, not errors, in this job (the release job keeps them
  # errors for the same code).
  cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DTPUSHIM_BUILD_BENCHMARKS=OFF -DTPUSHIM_BUILD_EXAMPLES=OFF \
    -DTPUSHIM_VM_TESTS=OFF \
    -DCMAKE_CXX_FLAGS="-fsanitize=thread -Wno-error=tsan -Wno-error=null-dereference -Wno-error=maybe-uninitialized" \
    -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=thread" \
    -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=thread"
  # Only what the concurrency suites need (the stress suite runs the tool).
  local targets
  targets=$(sed -n '/^set(TPUSHIM_CONCURRENCY_TESTS/,/)/p' tests/CMakeLists.txt |
    sed -e 's/set(TPUSHIM_CONCURRENCY_TESTS//' -e 's/)//' | tr -s ' \n' ' ')
  # shellcheck disable=SC2086  # the target list splits on purpose
  cmake --build build-tsan -j"$parallel" --target tpushim $targets
  sanitizer_env
  ctest --test-dir build-tsan --output-on-failure -j"$parallel" -L concurrency
}

for job in "${jobs[@]}"; do
  case "$job" in
    release | asan | tsan) ;;
    *)
      echo "scripts/test.sh: unknown job \"$job\" (jobs: release asan tsan)" >&2
      exit 2
      ;;
  esac
done

echo "=== scripts/test.sh: layering ==="
bash scripts/check_layers.sh

for job in "${jobs[@]}"; do
  echo "=== scripts/test.sh: job $job ==="
  start=$SECONDS
  "run_$job"
  summary+=("$job $((SECONDS - start)) s")
done

(IFS=';' && echo "=== scripts/test.sh: all jobs passed:${summary[*]/#/ } ===")
